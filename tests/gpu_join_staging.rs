//! The GPU joins through the discrete-GPU path (results, counters and query states copied
//! into pinned read-back buffers) on lavapipe, whose memory is otherwise mapped directly.
//! A separate test binary: the switch is an environment variable of the process.
#![cfg(feature = "gpu")]

mod common;

use common::assert_no_validation_errors;
use simjoin::{oracle, Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, OutputForm};

#[test]
fn staged_results_match_the_oracle() {
    common::gpu_test_setup();
    std::env::set_var("SIMJOIN_GPU_STAGING", "1");
    let engine = Engine::new();
    let mut state = 12345u64;
    let x: Vec<f32> = (0..600 * 3)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    let data = Dataset::from_f32(&x, 3).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.12);
    assert!(want.len() > 500, "{}", want.len());
    for algorithm in [Algorithm::Grid, Algorithm::Brute] {
        let mut o = JoinOptions::new(0.12);
        o.backend = Backend::Gpu;
        o.algorithm = algorithm;
        o.sorted = true;
        // Small result buffers: many partial downloads and resumed batches.
        o.result_buffer_pairs = Some(150);
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.pairs().unwrap(), &want[..], "{algorithm}");
        o.output = OutputForm::Count;
        assert_eq!(
            engine.self_join(&data, &o).unwrap().count(),
            want.len() as u64,
            "{algorithm}"
        );
        let ab = engine.join(&data, &data, &o).unwrap();
        assert_eq!(ab.count(), 2 * want.len() as u64 + 600, "{algorithm}");
    }
    assert_no_validation_errors();
}
