//! LSS on the GPU (eps-join) and the GPU kNN join (LSS and brute force), on lavapipe with
//! the validation layers on (a validation error fails the test). Pair sets are compared
//! exactly with the brute-force oracle; kNN answers exactly (indices and distances) with a
//! brute-force oracle written here from `metric::distance_acc`. Sizes are small: every
//! lavapipe dispatch costs milliseconds.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, Rng};
use simjoin::metric::distance_acc;
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, ErrorKind, JoinOptions, KnnDistances, KnnOptions,
    Metric, OutputForm, Pair,
};
use std::sync::OnceLock;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    common::gpu_test_setup();
    ENGINE.get_or_init(Engine::new)
}

const METRICS: [Metric; 3] = [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev];

fn uniform(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n * d).map(|_| r.unit()).collect()
}

fn clusters(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    let centres: Vec<f64> = (0..4 * d).map(|_| r.unit() * 10.0).collect();
    (0..n)
        .flat_map(|i| {
            let c = (i % 4) * d;
            (0..d)
                .map(|j| centres[c + j] + 0.3 * r.normal())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// An eps giving roughly `frac` of all pairs as matches (quantile of sampled distances).
fn eps_for(x: &[f64], d: usize, metric: Metric, frac: f64) -> f64 {
    let n = x.len() / d;
    let mut r = Rng(99);
    let mut dists: Vec<f64> = (0..2000)
        .map(|_| {
            let (i, j) = (
                (r.next() % n as u64) as usize,
                (r.next() % n as u64) as usize,
            );
            let diff = (0..d).map(|t| (x[i * d + t] - x[j * d + t]).abs());
            match metric {
                Metric::Euclidean => diff.map(|v| v * v).sum::<f64>().sqrt(),
                Metric::Manhattan => diff.sum(),
                Metric::Chebyshev => diff.fold(0.0, f64::max),
            }
        })
        .collect();
    dists.sort_by(f64::total_cmp);
    dists[(frac * dists.len() as f64) as usize].max(1e-6)
}

fn lss(eps: f64, metric: Metric, lists: Option<usize>) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Gpu;
    o.metric = metric;
    o.algorithm = Algorithm::Lss;
    o.lss_lists = lists;
    o.sorted = true;
    o
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// LSS self-join in f32 and f64 against the oracle; returns the pair count.
fn check_self(x: &[f64], d: usize, opts: &JoinOptions, what: &str) -> usize {
    let x32 = f32s(x);
    let mut count = 0;
    for data in [
        Dataset::from_f32(&x32, d).unwrap(),
        Dataset::from_f64(x, d).unwrap(),
    ] {
        let got = engine()
            .self_join(&data, opts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got.report.algorithm, Algorithm::Lss);
        let want = oracle::self_join(&data, opts.metric, opts.eps);
        assert_eq!(
            got.pairs().unwrap(),
            &want[..],
            "{what} {:?} ({:?})",
            data.precision(),
            got.report.notes
        );
        count = want.len();
    }
    assert_no_validation_errors();
    count
}

fn check_ab(a: &[f64], b: &[f64], d: usize, opts: &JoinOptions, what: &str) -> usize {
    let (a32, b32) = (f32s(a), f32s(b));
    let mut count = 0;
    for (da, db) in [
        (
            Dataset::from_f32(&a32, d).unwrap(),
            Dataset::from_f32(&b32, d).unwrap(),
        ),
        (
            Dataset::from_f64(a, d).unwrap(),
            Dataset::from_f64(b, d).unwrap(),
        ),
    ] {
        let got = engine()
            .join(&da, &db, opts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = oracle::join(&da, &db, opts.metric, opts.eps);
        assert_eq!(
            got.pairs().unwrap(),
            &want[..],
            "{what} {:?}",
            da.precision()
        );
        count = want.len();
    }
    assert_no_validation_errors();
    count
}

#[test]
fn lss_self_join_dims_and_metrics() {
    for (d, n) in [(1, 300), (2, 400), (3, 400), (8, 300), (16, 250), (64, 120)] {
        for (m, metric) in METRICS.into_iter().enumerate() {
            let x = if m == 1 {
                clusters(n, d, d as u64)
            } else {
                uniform(n, d, d as u64 + 7 * m as u64)
            };
            let eps = eps_for(&x, d, metric, 0.03);
            let pairs = check_self(&x, d, &lss(eps, metric, None), &format!("d={d} {metric}"));
            assert!(pairs > n / 4, "d={d} {metric}: only {pairs} pairs");
        }
    }
}
