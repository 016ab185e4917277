//! Several threads a query (`SIMJOIN_GPU_LANES`, GPU-JOIN's threads per point): each lane
//! scans its share of every cell, and together they find exactly one thread's pairs. On
//! lavapipe with validation on, 3 lanes (dividing nothing evenly) against the CPU: grid
//! and brute force, low and high dimensions (the dot-product filter, untiled and with its
//! tiles forced, where the estimation pass alone takes lanes), self-join and A ⋈ B, tiny
//! result buffers (every lane resuming), counts, per-point neighbour counts (the lanes'
//! counts summed) and DBSCAN's links on the device. A binary of its own: the switch is an
//! environment variable of the process.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, Rng};
use simjoin::{
    dbscan, Algorithm, Backend, Dataset, DbscanOptions, Engine, JoinOptions, JoinResult, Metric,
    OutputForm,
};

fn clustered(rng: &mut Rng, n: usize, d: usize) -> Vec<f64> {
    let centres: Vec<f64> = (0..4 * d).map(|_| rng.unit()).collect();
    (0..n)
        .flat_map(|i| {
            let c = i % 4;
            (0..d)
                .map(|t| centres[c * d + t] + 0.06 * rng.normal())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn join(e: &Engine, a: &Dataset, b: Option<&Dataset>, o: &JoinOptions) -> JoinResult {
    match b {
        Some(b) => e.join(a, b, o),
        None => e.self_join(a, o),
    }
    .unwrap_or_else(|err| panic!("{:?} {:?}: {err}", o.backend, o.algorithm))
}

fn lanes_noted(r: &JoinResult) -> bool {
    r.report
        .notes
        .iter()
        .any(|n| n.starts_with("3 threads a query"))
}

#[test]
fn lanes_find_exactly_one_threads_pairs() {
    common::gpu_test_setup();
    // SAFETY (of the environment): this binary's only test, set before any engine exists.
    std::env::set_var("SIMJOIN_GPU_LANES", "3");
    let e = Engine::new();
    let mut rng = Rng(23);
    for (dim, n, eps, tile) in [
        (2usize, 900usize, 0.03, None),
        (5, 700, 0.12, None),
        (16, 600, 0.3, None),
        (16, 600, 0.3, Some("1")),
        (33, 400, 0.45, None),
    ] {
        match tile {
            Some(t) => std::env::set_var("SIMJOIN_GPU_TILE", t),
            None => std::env::remove_var("SIMJOIN_GPU_TILE"),
        }
        // A and B from the same clusters.
        let all = clustered(&mut rng, n + n / 2, dim);
        let (x, y) = all.split_at(n * dim);
        let (a, b) = (
            Dataset::from_f64(x, dim).unwrap(),
            Dataset::from_f64(y, dim).unwrap(),
        );
        for algorithm in [Algorithm::Grid, Algorithm::Brute] {
            for self_join in [true, false] {
                let b = (!self_join).then_some(&b);
                let mut o = JoinOptions::new(eps);
                o.metric = Metric::Euclidean;
                o.algorithm = algorithm;
                o.sorted = true;
                o.backend = Backend::Cpu;
                let want = join(&e, &a, b, &o);
                assert!(want.count() > 50, "dim {dim}: {} pairs", want.count());
                o.backend = Backend::Gpu;
                // Tiny result buffers: every lane stops and resumes.
                o.result_buffer_pairs = Some(97);
                let got = join(&e, &a, b, &o);
                let what = format!("dim {dim} {algorithm} self {self_join} tile {tile:?}");
                assert!(got.output == want.output, "{what}: pairs differ");
                assert!(lanes_noted(&got), "{what}: {:?}", got.report.notes);
                o.output = OutputForm::Count;
                o.result_buffer_pairs = None;
                assert_eq!(join(&e, &a, b, &o).count(), want.count(), "{what}: count");
            }
        }
        // Per-point counts (each query's lanes summed) and DBSCAN's links on the device.
        let mut o = JoinOptions::new(eps);
        o.backend = Backend::Cpu;
        let (want, _) = e.neighbour_counts(&a, &o).unwrap();
        o.backend = Backend::Gpu;
        let (got, report) = e.neighbour_counts(&a, &o).unwrap();
        assert_eq!(got, want, "dim {dim}: neighbour counts");
        assert!(report.notes.iter().any(|n| n.contains("on the device")));
        let mut d = DbscanOptions::new(eps, 5);
        d.backend = Backend::Cpu;
        let want = dbscan(&e, &a, &d).unwrap();
        d.backend = Backend::Gpu;
        let got = dbscan(&e, &a, &d).unwrap();
        assert_eq!(got.labels, want.labels, "dim {dim}: DBSCAN labels");
        assert_eq!(got.core, want.core, "dim {dim}: DBSCAN core points");
    }
    assert_no_validation_errors();
}
