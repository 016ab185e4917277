//! The GPU joins with every dispatch spread over a 2-D grid of workgroups, rows of 3 (with
//! surplus workgroups in the last row), as on a device whose maxComputeWorkGroupCount[0] a
//! batch exceeds. On lavapipe that limit (65535) is out of reach at test sizes, so the row
//! width is lowered through `SIMJOIN_GPU_DISPATCH_WIDTH`. A wrong linear thread index in
//! any join kernel loses or repeats queries here. A separate test binary: the switch is an
//! environment variable read when the process's GPU context is created.
#![cfg(feature = "gpu")]

mod common;

use common::assert_no_validation_errors;
use simjoin::{oracle, Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, OutputForm};

#[test]
fn joins_on_2d_dispatch_grids_match_the_oracle() {
    common::gpu_test_setup();
    std::env::set_var("SIMJOIN_GPU_DISPATCH_WIDTH", "3");
    let engine = Engine::new();
    let mut state = 777u64;
    let mut rnd = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    for (n, d, eps) in [(4000usize, 2usize, 0.015), (2500, 5, 0.17), (1400, 18, 1.0)] {
        let x: Vec<f32> = (0..n * d).map(|_| rnd()).collect();
        let y: Vec<f32> = (0..(n / 2) * d).map(|_| rnd()).collect();
        let a = Dataset::from_f32(&x, d).unwrap();
        let b = Dataset::from_f32(&y, d).unwrap();
        let want = oracle::self_join(&a, Metric::Euclidean, eps);
        let want_ab = oracle::join(&a, &b, Metric::Euclidean, eps);
        assert!(want.len() > n / 2, "d={d}: only {} pairs", want.len());
        for algorithm in [Algorithm::Grid, Algorithm::Brute] {
            let mut o = JoinOptions::new(eps);
            o.backend = Backend::Gpu;
            o.algorithm = algorithm;
            o.sorted = true;
            // One batch of all queries: many workgroups, so many rows of 3.
            o.batch_points = Some(n);
            let got = engine.self_join(&a, &o).unwrap();
            let got = got.pairs().unwrap();
            assert!(
                got == &want[..],
                "{algorithm} d={d}: {} pairs, want {}",
                got.len(),
                want.len()
            );
            let ab = engine.join(&a, &b, &o).unwrap();
            let ab = ab.pairs().unwrap();
            assert!(
                ab == &want_ab[..],
                "A⋈B {algorithm} d={d}: {} pairs, want {}",
                ab.len(),
                want_ab.len()
            );
            o.output = OutputForm::Count;
            assert_eq!(engine.self_join(&a, &o).unwrap().count(), want.len() as u64);
        }
    }
    assert_no_validation_errors();
}
