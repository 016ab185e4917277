//! CPU backend against the brute-force oracle: exact pair-set equality for every algorithm
//! (grid, ego, brute, auto) on uniform, clustered, duplicate and lattice/cell-edge data,
//! 1..128 dimensions, n = 0, 1, 2, self-join and A ⋈ B, each metric, f32 and f64, the
//! output forms through the Engine, streaming sinks (including a failing one), proptest.

mod common;

use common::{each_precision, Rng};
use proptest::prelude::*;
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, ErrorKind, JoinOptions, Metric, OutputForm, Pair,
};

const ALGOS: [Algorithm; 4] = [
    Algorithm::Grid,
    Algorithm::Ego,
    Algorithm::Brute,
    Algorithm::Auto,
];
const METRICS: [Metric; 3] = [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev];

fn uniform(n: usize, d: usize, scale: f64, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n * d).map(|_| r.unit() * scale).collect()
}

/// Gaussian clusters (sd 0.05) around 5 random centres in [0,1]^d.
fn clusters(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    let centres: Vec<f64> = (0..5 * d).map(|_| r.unit()).collect();
    let mut out = Vec::with_capacity(n * d);
    for _ in 0..n {
        let c = (r.next() % 5) as usize;
        for j in 0..d {
            out.push(centres[c * d + j] + 0.05 * r.normal());
        }
    }
    out
}

/// Few distinct points, each repeated many times.
fn duplicates(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let distinct = uniform(7, d, 1.0, seed);
    let mut r = Rng(seed ^ 1);
    (0..n)
        .flat_map(|_| distinct[(r.next() % 7) as usize * d..][..d].to_vec())
        .collect()
}

/// A lattice with spacing exactly eps (eps = 0.25 and 0.5 are exact): neighbours are
/// exactly eps apart and every point lies on a multiple of eps, next to a cell edge.
fn lattice(side: usize, d: usize, spacing: f64) -> Vec<f64> {
    let n = side.pow(d as u32);
    let mut out = Vec::with_capacity(n * d);
    for i in 0..n {
        let mut r = i;
        for _ in 0..d {
            out.push((r % side) as f64 * spacing);
            r /= side;
        }
    }
    out
}

fn opts(eps: f64, metric: Metric, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.metric = metric;
    o.algorithm = algorithm;
    o.backend = Backend::Cpu;
    o
}

fn sorted(mut p: Vec<Pair>) -> Vec<Pair> {
    p.sort_unstable();
    p
}

/// Runs the self-join in f64 and in f32 with every algorithm and compares with the oracle.
fn check_self(x: &[f64], d: usize, eps: f64, metric: Metric, algos: &[Algorithm]) {
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let a64 = Dataset::from_f64(x, d).unwrap();
    let a32 = Dataset::from_f32(&x32, d).unwrap();
    for data in [a64, a32] {
        let want = oracle::self_join(&data, metric, eps);
        for &alg in algos {
            let r = Engine::new()
                .self_join(&data, &opts(eps, metric, alg))
                .unwrap();
            let got = sorted(r.pairs().unwrap().to_vec());
            assert_eq!(
                got.len(),
                want.len(),
                "{alg} {metric} {:?} d={d} n={} eps={eps}: pair count differs ({})",
                data.precision(),
                data.len(),
                r.report.notes.join("; ")
            );
            assert!(
                got == want,
                "{alg} {metric} {:?} d={d}: pair sets differ",
                data.precision()
            );
            assert_eq!(r.report.pairs, want.len() as u64);
            assert_ne!(r.report.algorithm, Algorithm::Auto);
        }
    }
}

fn check_ab(x: &[f64], y: &[f64], d: usize, eps: f64, metric: Metric, algos: &[Algorithm]) {
    let (x32, y32): (Vec<f32>, Vec<f32>) = (
        x.iter().map(|&v| v as f32).collect(),
        y.iter().map(|&v| v as f32).collect(),
    );
    let sets = [
        (
            Dataset::from_f64(x, d).unwrap(),
            Dataset::from_f64(y, d).unwrap(),
        ),
        (
            Dataset::from_f32(&x32, d).unwrap(),
            Dataset::from_f32(&y32, d).unwrap(),
        ),
    ];
    for (a, b) in sets {
        let want = oracle::join(&a, &b, metric, eps);
        for &alg in algos {
            let r = Engine::new().join(&a, &b, &opts(eps, metric, alg)).unwrap();
            let got = sorted(r.pairs().unwrap().to_vec());
            assert!(
                got == want,
                "A⋈B {alg} {metric} {:?} d={d}: got {} pairs, want {}",
                a.precision(),
                got.len(),
                want.len()
            );
        }
    }
}

#[test]
fn uniform_every_metric_low_dims() {
    for d in 1..=6 {
        let n = 1500;
        // eps giving a few neighbours per point.
        let eps = 0.6 * (1.0 / n as f64).powf(1.0 / d as f64) * 1.5;
        for m in METRICS {
            check_self(&uniform(n, d, 1.0, d as u64), d, eps, m, &ALGOS);
        }
    }
}

#[test]
fn uniform_many_dims() {
    for d in [7, 8, 9, 12, 16, 24, 32, 48, 64, 90, 128] {
        let n = 600;
        let eps = 0.3 * (d as f64).sqrt();
        for m in METRICS {
            let e = match m {
                Metric::Euclidean => eps,
                Metric::Manhattan => eps * (d as f64).sqrt() * 0.8,
                Metric::Chebyshev => 0.35,
                Metric::Cosine | Metric::Haversine => {
                    unreachable!("not a cosine or haversine test")
                }
            };
            check_self(&uniform(n, d, 1.0, 100 + d as u64), d, e, m, &ALGOS);
        }
    }
}

#[test]
fn gaussian_clusters() {
    for d in [2, 3, 5, 8, 16, 32] {
        let eps = 0.02 * (d as f64).sqrt();
        for m in METRICS {
            check_self(&clusters(2000, d, 7 + d as u64), d, eps, m, &ALGOS);
        }
        check_ab(
            &clusters(700, d, 1),
            &clusters(1100, d, 2),
            d,
            eps,
            Metric::Euclidean,
            &ALGOS,
        );
    }
}

#[test]
fn many_duplicates() {
    for d in [1, 2, 3, 10, 20] {
        for m in METRICS {
            // eps small: only copies of the same point match; eps large: everything.
            for eps in [1e-6, 0.5, 10.0] {
                check_self(&duplicates(300, d, d as u64), d, eps, m, &ALGOS);
            }
        }
    }
}

#[test]
fn lattice_exactly_eps_apart_on_cell_edges() {
    for (d, side) in [(1, 200), (2, 30), (3, 10), (4, 6), (6, 4), (7, 3), (10, 2)] {
        for eps in [0.25, 0.5] {
            for m in METRICS {
                check_self(&lattice(side, d, eps), d, eps, m, &ALGOS);
            }
        }
    }
    // Shifted copies: B's points exactly eps from A's along one axis, and between cells.
    let a = lattice(20, 2, 0.5);
    let b: Vec<f64> = a
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % 2 == 0 { v + 0.5 } else { v + 0.25 })
        .collect();
    for m in METRICS {
        check_ab(&a, &b, 2, 0.5, m, &ALGOS);
    }
}

#[test]
fn tiny_inputs() {
    for d in [1, 3, 17] {
        for n in 0..=2 {
            let x = uniform(n, d, 0.1, 3);
            for m in METRICS {
                check_self(&x, d, 0.5, m, &ALGOS);
                check_ab(&x, &uniform(5, d, 0.1, 4), d, 0.5, m, &ALGOS);
                check_ab(&uniform(5, d, 0.1, 4), &x, d, 0.5, m, &ALGOS);
            }
        }
    }
}

#[test]
fn a_join_b_different_sizes_both_ways() {
    for d in [1, 2, 3, 4, 6, 10, 16, 40] {
        let eps = 0.12 * (d as f64).sqrt();
        let small = uniform(300, d, 1.0, 11);
        // B partly outside A's bounds: the grid must clamp, not lose pairs.
        let big = uniform(1700, d, 1.3, 12);
        for m in METRICS {
            check_ab(&small, &big, d, eps, m, &ALGOS);
            check_ab(&big, &small, d, eps, m, &ALGOS);
        }
    }
}

#[test]
fn output_forms_via_engine() {
    let d = 3;
    let x = clusters(3000, d, 5);
    let data = Dataset::from_f64(&x, d).unwrap();
    let eps = 0.03;
    let want = oracle::self_join(&data, Metric::Euclidean, eps);
    for alg in ALGOS {
        let mut o = opts(eps, Metric::Euclidean, alg);
        o.sorted = true;
        let r = Engine::new().self_join(&data, &o).unwrap();
        assert_eq!(r.pairs().unwrap(), &want[..], "sorted pairs {alg}");
        o.output = OutputForm::Count;
        let r = Engine::new().self_join(&data, &o).unwrap();
        assert_eq!(r.count(), want.len() as u64, "count {alg}");
        o.output = OutputForm::Csr;
        let c = Engine::new()
            .self_join(&data, &o)
            .unwrap()
            .csr()
            .unwrap()
            .clone();
        let expect =
            simjoin::result::build_csr(want.clone(), true, data.len(), false, true).unwrap();
        assert_eq!(c, expect, "csr {alg}");
    }
}

#[test]
fn streaming_sink_and_cancellation() {
    let d = 2;
    let x = uniform(20000, d, 1.0, 9);
    let data = Dataset::from_f64(&x, d).unwrap();
    let eps = 0.02;
    let want = oracle::self_join(&data, Metric::Euclidean, eps);
    for alg in ALGOS {
        let mut got: Vec<Pair> = Vec::new();
        let mut sink = |chunk: &[Pair]| -> anyhow::Result<()> {
            got.extend_from_slice(chunk);
            Ok(())
        };
        let rep = Engine::new()
            .self_join_stream(&data, &opts(eps, Metric::Euclidean, alg), &mut sink)
            .unwrap();
        assert_eq!(rep.pairs, want.len() as u64);
        assert_eq!(sorted(got), want, "stream {alg}");
        let mut calls = 0;
        let mut failing = |_: &[Pair]| -> anyhow::Result<()> {
            calls += 1;
            anyhow::bail!("disk full")
        };
        let err = Engine::new()
            .self_join_stream(&data, &opts(eps, Metric::Euclidean, alg), &mut failing)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{alg}: {err}");
        assert!(err.to_string().contains("disk full"));
        assert_eq!(
            calls, 1,
            "{alg}: the sink is not called again after it failed"
        );
    }
}

#[test]
fn auto_reports_its_choice() {
    let cases = [
        (2, 20000, 0.01, Algorithm::Grid),
        (2, 5000, 0.8, Algorithm::Brute),
        (16, 5000, 0.3, Algorithm::Ego),
        (3, 50, 0.1, Algorithm::Brute),
    ];
    for (d, n, eps, expect) in cases {
        let x = uniform(n, d, 1.0, 1);
        let data = Dataset::from_f64(&x, d).unwrap();
        let r = Engine::new()
            .self_join(&data, &opts(eps, Metric::Euclidean, Algorithm::Auto))
            .unwrap();
        assert_eq!(r.report.algorithm, expect, "{:?}", r.report.notes);
        assert!(
            r.report.notes.iter().any(|s| s.starts_with("auto:")),
            "{:?}",
            r.report.notes
        );
    }
}

#[test]
fn threads_option_and_lss_unsupported() {
    let x = uniform(3000, 3, 1.0, 2);
    let data = Dataset::from_f64(&x, 3).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.05);
    let mut o = opts(0.05, Metric::Euclidean, Algorithm::Grid);
    let one = Engine::with_options(simjoin::EngineOptions {
        threads: Some(1),
        ..Default::default()
    })
    .unwrap();
    let r = one.self_join(&data, &o).unwrap();
    assert_eq!(sorted(r.pairs().unwrap().to_vec()), want);
    assert!(r.report.device.contains("1 threads"));
    // The engine keeps its pool: a second join runs on the same single thread.
    let r = one.self_join(&data, &o).unwrap();
    assert!(r.report.device.contains("1 threads"));
    let zero = simjoin::EngineOptions {
        threads: Some(0),
        ..Default::default()
    };
    assert_eq!(
        Engine::with_options(zero).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    o.algorithm = Algorithm::Lss;
    assert_eq!(
        Engine::new().self_join(&data, &o).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

/// A grid whose cells are as wide as the data (32-D, eps past the side of the box): every
/// item's candidates are nearly the whole set, so its queries run in short runs with the
/// control read between them (`cpu/grid.rs` CHECK_WORK). Every pair is still found once,
/// self-join and A ⋈ B, each metric, f32 and f64, pairs and CSR.
#[test]
fn grid_items_over_the_whole_set_keep_every_pair() {
    let d = 32;
    let x = uniform(3000, d, 1.0, 31);
    let y = uniform(1200, d, 1.0, 32);
    for (m, eps) in [
        (Metric::Euclidean, 1.6),
        (Metric::Manhattan, 9.0),
        (Metric::Chebyshev, 0.7),
    ] {
        common::each_precision_pair(&x, &y, d, |a, b| {
            let want = oracle::self_join(a, m, eps);
            assert!(
                want.len() > 200,
                "{m:?}: too few pairs to test: {}",
                want.len()
            );
            let o = opts(eps, m, Algorithm::Grid);
            let r = Engine::new().self_join(a, &o).unwrap();
            assert_eq!(sorted(r.pairs().unwrap().to_vec()), want, "{m:?} self-join");
            let mut c = o.clone();
            c.output = OutputForm::Csr;
            c.sorted = true;
            let r = Engine::new().self_join(a, &c).unwrap();
            let expect = simjoin::result::build_csr(want, true, a.len(), false, true).unwrap();
            assert_eq!(r.csr().unwrap(), &expect, "{m:?} self-join CSR");
            let want = oracle::join(a, b, m, eps);
            assert!(!want.is_empty());
            let r = Engine::new().join(a, b, &o).unwrap();
            assert_eq!(sorted(r.pairs().unwrap().to_vec()), want, "{m:?} A x B");
        });
    }
}

#[test]
fn grid_indexed_dims_option() {
    let d = 6;
    let x = uniform(2000, d, 1.0, 21);
    let data = Dataset::from_f64(&x, d).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.3);
    for k in 1..=6 {
        let mut o = opts(0.3, Metric::Euclidean, Algorithm::Grid);
        o.indexed_dims = Some(k);
        let r = Engine::new().self_join(&data, &o).unwrap();
        assert_eq!(sorted(r.pairs().unwrap().to_vec()), want, "k={k}");
    }
}

#[test]
fn huge_extent_does_not_overflow_cells() {
    // Extents that would overflow linear cell ids with all dims indexed.
    let mut x = uniform(500, 4, 1.0, 5);
    x[0] = -1e30;
    x[5] = 1e30;
    x.extend_from_slice(&[0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.10001]);
    for m in METRICS {
        check_self(&x, 4, 0.05, m, &ALGOS);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_cases(
        d in 1usize..12,
        n in 0usize..160,
        m in 0usize..80,
        eps in 0.01f64..0.8,
        grid_step in prop_oneof![Just(0.0f64), Just(0.125), Just(0.1)],
        metric in 0usize..3,
        seed in any::<u64>(),
    ) {
        // Optionally snap coordinates to a lattice so exact-distance ties are common.
        let snap = |v: Vec<f64>| -> Vec<f64> {
            if grid_step == 0.0 { v } else { v.into_iter().map(|x| (x / grid_step).round() * grid_step).collect() }
        };
        let x = snap(uniform(n, d, 1.0, seed));
        let y = snap(uniform(m, d, 1.0, seed ^ 0xABCD));
        let metric = METRICS[metric];
        check_self(&x, d, eps, metric, &ALGOS);
        check_ab(&x, &y, d, eps, metric, &ALGOS);
    }
}

/// Each row of `c` sorted: for comparing an unsorted CSR with a sorted one.
fn rows_sorted(mut c: simjoin::result::Csr) -> simjoin::result::Csr {
    for r in 0..c.offsets.len() - 1 {
        c.neighbors[c.offsets[r] as usize..c.offsets[r + 1] as usize].sort_unstable();
    }
    c
}

/// The CSR of a grid join is built from whole rows (`cpu/rows.rs`) up to 2-D, from
/// bucketed pairs above: every row exactly the oracle's, sorted or not, with and without the diagonal, self-join and A ⋈ B, on data
/// with long rows (duplicates: rows past the 64 the rank sort takes), cell-edge lattices,
/// clusters, 1-8 dimensions, n = 0, 1, 2, each metric and precision.
#[test]
fn csr_from_whole_rows_matches_the_oracle() {
    let mut cases: Vec<(Vec<f64>, usize, f64)> = vec![
        (uniform(0, 2, 1.0, 1), 2, 0.1),
        (uniform(1, 2, 1.0, 1), 2, 0.1),
        (vec![0.0, 0.0, 0.1, 0.0], 2, 0.1),
        (duplicates(600, 2, 3), 2, 0.05),
        (lattice(24, 2, 0.25), 2, 0.25),
        (lattice(9, 3, 0.5), 3, 0.5),
        (clusters(3000, 3, 5), 3, 0.03),
    ];
    for d in [1, 2, 4, 6, 8] {
        cases.push((
            uniform(2500, d, 1.0, 40 + d as u64),
            d,
            0.15 * (d as f64).sqrt(),
        ));
    }
    for (x, d, eps) in &cases {
        each_precision(x, *d, |data| {
            for m in METRICS {
                let want = oracle::self_join(data, m, *eps);
                for include_self in [false, true] {
                    let expect = simjoin::result::build_csr(
                        want.clone(),
                        true,
                        data.len(),
                        include_self,
                        true,
                    )
                    .unwrap();
                    for sorted in [true, false] {
                        let mut o = opts(*eps, m, Algorithm::Grid);
                        o.output = OutputForm::Csr;
                        o.include_self = include_self;
                        o.sorted = sorted;
                        let r = Engine::new().self_join(data, &o).unwrap();
                        let what = format!(
                            "d {d} n {} {m:?} self {include_self} sorted {sorted}",
                            data.len()
                        );
                        // Whole rows up to 2-D (`cpu/mod.rs` ROWS_MAX_DIM), bucketed
                        // pairs above: both paths checked here.
                        let rows = r.report.notes.iter().any(|n| n.contains("whole row"));
                        assert_eq!(rows, *d <= 2, "{what}: {:?}", r.report.notes);
                        assert_eq!(r.report.pairs, want.len() as u64, "{what}");
                        let c = r.csr().unwrap().clone();
                        let c = if sorted { c } else { rows_sorted(c) };
                        assert_eq!(c, expect, "{what}");
                    }
                }
            }
        });
    }
    // A ⋈ B: rows of A, B partly outside A's bounds.
    for d in [1, 2, 3] {
        let a = uniform(700, d, 1.0, 21);
        let b = uniform(1500, d, 1.3, 22);
        let eps = 0.1 * (d as f64).sqrt();
        let (a, b) = (
            Dataset::from_f64(&a, d).unwrap(),
            Dataset::from_f64(&b, d).unwrap(),
        );
        for m in METRICS {
            let want = oracle::join(&a, &b, m, eps);
            let expect =
                simjoin::result::build_csr(want.clone(), false, a.len(), false, true).unwrap();
            for sorted in [true, false] {
                let mut o = opts(eps, m, Algorithm::Grid);
                o.output = OutputForm::Csr;
                o.sorted = sorted;
                let r = Engine::new().join(&a, &b, &o).unwrap();
                let rows = r.report.notes.iter().any(|n| n.contains("whole row"));
                assert_eq!(rows, d <= 2, "A x B d {d}");
                assert_eq!(r.report.pairs, want.len() as u64);
                let c = r.csr().unwrap().clone();
                let c = if sorted { c } else { rows_sorted(c) };
                assert_eq!(c, expect, "A x B d {d} {m:?} sorted {sorted}");
            }
        }
    }
}
