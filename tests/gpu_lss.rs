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
    oracle, Algorithm, Backend, Dataset, Distances, Engine, ErrorKind, JoinOptions, KnnOptions,
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
                Metric::Cosine | Metric::Haversine => {
                    unreachable!("not a cosine or haversine test")
                }
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

#[test]
fn lss_a_join_b_both_orders_and_metrics() {
    for metric in METRICS {
        for d in [2, 5, 16] {
            let a = uniform(250, d, 1 + d as u64);
            // B partly outside A's bounds: the quantisation spans both sets.
            let b: Vec<f64> = uniform(400, d, 2 + d as u64)
                .iter()
                .map(|v| v * 1.3 - 0.15)
                .collect();
            let eps = eps_for(&a, d, metric, 0.04);
            let o = lss(eps, metric, None);
            // A smaller: A is indexed and pairs are swapped back; then B indexed.
            let n1 = check_ab(&a, &b, d, &o, &format!("A⋈B {metric} d={d}"));
            let n2 = check_ab(&b, &a, d, &o, &format!("B⋈A {metric} d={d}"));
            assert_eq!(n1, n2);
            assert!(n1 > 100, "{metric} d={d}: {n1}");
        }
    }
}

#[test]
fn lss_lattice_exactly_eps_apart_and_duplicates() {
    // Integer lattice with eps = 1: neighbours exactly eps apart (a match), in 1-3 D, with
    // every point twice (duplicates: distance 0).
    for d in [1usize, 2, 3] {
        let side: usize = [60, 12, 6][d - 1];
        let mut x = Vec::new();
        for rep in 0..2 {
            for i in 0..side.pow(d as u32) {
                let mut rest = i;
                for _ in 0..d {
                    x.push((rest % side) as f64 + rep as f64 * 0.0);
                    rest /= side;
                }
            }
        }
        for metric in METRICS {
            for lists in [Some(1), Some(2), Some(d + 1), None] {
                let pairs = check_self(
                    &x,
                    d,
                    &lss(1.0, metric, lists),
                    &format!("lattice d={d} {metric} lists {lists:?}"),
                );
                let n = side.pow(d as u32);
                // At least: each duplicate pair, and both copies of each axis neighbour.
                assert!(pairs >= n + 4 * d * (side - 1) * side.pow(d as u32 - 1));
            }
        }
    }
    // 400 points on 5 distinct positions: every pair at one position matches.
    let x: Vec<f64> = (0..400)
        .flat_map(|i| [(i % 5) as f64 * 0.5, 1.0, -2.0])
        .collect();
    let pairs = check_self(&x, 3, &lss(0.1, Metric::Euclidean, None), "duplicates");
    assert_eq!(pairs, 5 * 80 * 79 / 2);
}

#[test]
fn lss_list_counts_and_high_dims() {
    for (d, n) in [(8, 250), (16, 200), (64, 100)] {
        let x = clusters(n, d, 40 + d as u64);
        let eps = eps_for(&x, d, Metric::Euclidean, 0.05);
        for lists in [1, 2, d + 1] {
            check_self(
                &x,
                d,
                &lss(eps, Metric::Euclidean, Some(lists.min(64))),
                &format!("d={d} lists={lists}"),
            );
        }
    }
}

#[test]
fn lss_chunked_output_with_a_tiny_result_buffer() {
    let d = 3;
    let x = clusters(500, d, 21);
    let eps = eps_for(&x, d, Metric::Euclidean, 0.03);
    for cap in [1usize, 7, 300] {
        let mut o = lss(eps, Metric::Euclidean, None);
        o.result_buffer_pairs = Some(cap);
        let pairs = check_self(&x, d, &o, &format!("chunks of {cap}"));
        assert!(pairs > 2000);
        let b: Vec<f64> = x.iter().map(|v| v + 0.01).collect();
        check_ab(&x[..200 * d], &b, d, &o, &format!("A⋈B chunks of {cap}"));
    }
    // One query with more matches than the buffer holds: 150 duplicates, buffer of 7.
    let x = vec![0.5; 150 * 4];
    let mut o = lss(0.1, Metric::Chebyshev, Some(2));
    o.result_buffer_pairs = Some(7);
    let pairs = check_self(&x, 4, &o, "one query over the buffer");
    assert_eq!(pairs, 150 * 149 / 2);
    let ab = engine()
        .join(
            &Dataset::from_f64(&x[..4], 4).unwrap(),
            &Dataset::from_f64(&x, 4).unwrap(),
            &o,
        )
        .unwrap();
    let all: Vec<Pair> = (0..150).map(|j| [0, j]).collect();
    assert_eq!(ab.pairs().unwrap(), &all[..]);
    assert!(ab.report.batches >= 150 / 7, "{:?}", ab.report.notes);
    assert_no_validation_errors();
}

#[test]
fn lss_tiny_inputs_count_and_csr() {
    let e = engine();
    let o = lss(0.5, Metric::Euclidean, None);
    let empty = Dataset::from_f32(&[], 2).unwrap();
    let one = Dataset::from_f32(&[1.0, 1.0], 2).unwrap();
    let two = Dataset::from_f32(&[1.0, 1.0, 1.5, 1.0], 2).unwrap();
    let two_far = Dataset::from_f32(&[1.0, 1.0, 1.5, 1.1], 2).unwrap();
    let none: &[Pair] = &[];
    assert_eq!(e.self_join(&empty, &o).unwrap().pairs().unwrap(), none);
    assert_eq!(e.self_join(&one, &o).unwrap().pairs().unwrap(), none);
    assert_eq!(e.self_join(&two, &o).unwrap().pairs().unwrap(), &[[0, 1]]);
    assert_eq!(e.self_join(&two_far, &o).unwrap().pairs().unwrap(), none);
    assert_eq!(e.join(&empty, &two, &o).unwrap().pairs().unwrap(), none);
    assert_eq!(e.join(&two, &empty, &o).unwrap().pairs().unwrap(), none);
    assert_eq!(
        e.join(&one, &two, &o).unwrap().pairs().unwrap(),
        &[[0, 0], [0, 1]]
    );
    assert_eq!(
        e.join(&two, &one, &o).unwrap().pairs().unwrap(),
        &[[0, 0], [1, 0]]
    );
    // Count only and CSR.
    let x = clusters(400, 4, 31);
    let eps = eps_for(&x, 4, Metric::Manhattan, 0.03);
    let data = Dataset::from_f64(&x, 4).unwrap();
    let want = oracle::self_join(&data, Metric::Manhattan, eps);
    let mut o = lss(eps, Metric::Manhattan, None);
    o.output = OutputForm::Count;
    assert_eq!(e.self_join(&data, &o).unwrap().count(), want.len() as u64);
    o.output = OutputForm::Csr;
    let csr = e.self_join(&data, &o).unwrap();
    assert_eq!(csr.csr().unwrap().neighbors.len(), 2 * want.len());
    let report = &csr.report;
    assert!(
        report.notes.iter().any(|n| n.contains("average interval")),
        "{:?}",
        report.notes
    );
    assert!(report.phases.iter().any(|(p, _)| p.contains("sort")));
    assert_no_validation_errors();
}

#[test]
fn lss_long_walks_resume_past_the_software_loop_limit() {
    // 1500 duplicates in 4-D: every query walks 1500 candidates (5 loop iterations each),
    // past a software device's per-dispatch budget; search, count and fill resume.
    let x = vec![0.25f32; 1500 * 4];
    let data = Dataset::from_f32(&x, 4).unwrap();
    let got = engine()
        .self_join(&data, &lss(0.1, Metric::Chebyshev, Some(3)))
        .unwrap();
    assert_eq!(got.count(), 1500 * 1499 / 2);
    assert_eq!(
        got.pairs().unwrap(),
        &oracle::self_join(&data, Metric::Chebyshev, 0.1)[..]
    );
    let note = got
        .report
        .notes
        .iter()
        .find(|n| n.contains("resubmissions"))
        .unwrap();
    // Only software devices have a loop budget (hardware GPUs have no such cut).
    if common::on_lavapipe() {
        assert!(!note.contains("(0 resubmissions"), "{note}");
    }
    assert_no_validation_errors();
}

// ---------------------------------------------------------------------------------------
// kNN

fn knn_opts(metric: Metric, algorithm: Algorithm, lists: Option<usize>) -> KnnOptions {
    KnnOptions {
        metric,
        backend: Backend::Gpu,
        algorithm,
        lss_lists: lists,
        ..Default::default()
    }
}

/// The k nearest of `data` to each query by (accumulator, index), self excluded by index
/// for a self-kNN; distances sqrt(acc) for Euclidean, in T.
fn knn_oracle<T: simjoin::metric::Coord + Into<f64>>(
    data: &[T],
    queries: Option<&[T]>,
    d: usize,
    k: usize,
    metric: Metric,
    sqrt: fn(T) -> T,
) -> (Vec<u32>, Vec<T>) {
    let q = queries.unwrap_or(data);
    let (mut idx, mut dist) = (Vec::new(), Vec::new());
    for (r, qp) in q.chunks_exact(d).enumerate() {
        let mut c: Vec<(T, u32)> = data
            .chunks_exact(d)
            .enumerate()
            .filter(|&(j, _)| queries.is_some() || j != r)
            .map(|(j, p)| (distance_acc(metric, qp, p), j as u32))
            .collect();
        c.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
        for &(acc, j) in &c[..k] {
            idx.push(j);
            dist.push(if metric == Metric::Euclidean {
                sqrt(acc)
            } else {
                acc
            });
        }
    }
    (idx, dist)
}

/// GPU kNN (self when `queries` is None) in f32 and f64 against the oracle, exactly.
fn check_knn(
    data: &[f64],
    queries: Option<&[f64]>,
    d: usize,
    k: usize,
    opts: &KnnOptions,
    what: &str,
) -> Vec<simjoin::KnnResult> {
    let e = engine();
    let mut out = Vec::new();
    // f32
    let (x32, q32) = (f32s(data), queries.map(f32s));
    let dd = Dataset::from_f32(&x32, d).unwrap();
    let qd = q32.as_ref().map(|q| Dataset::from_f32(q, d).unwrap());
    let got = e
        .knn(&dd, qd.as_ref(), k, opts)
        .unwrap_or_else(|err| panic!("{what} f32: {err}"));
    let (idx, dist) = knn_oracle(&x32, q32.as_deref(), d, k, opts.metric, f32::sqrt);
    assert_eq!(got.k, k);
    assert_eq!(got.rows, queries.unwrap_or(data).len() / d);
    assert_eq!(
        got.indices, idx,
        "{what} f32 indices ({:?})",
        got.report.notes
    );
    assert_eq!(got.distances, Distances::F32(dist), "{what} f32 distances");
    out.push(got);
    // f64
    let dd = Dataset::from_f64(data, d).unwrap();
    let qd = queries.map(|q| Dataset::from_f64(q, d).unwrap());
    let got = e
        .knn(&dd, qd.as_ref(), k, opts)
        .unwrap_or_else(|err| panic!("{what} f64: {err}"));
    let (idx, dist) = knn_oracle(data, queries, d, k, opts.metric, f64::sqrt);
    assert_eq!(
        got.indices, idx,
        "{what} f64 indices ({:?})",
        got.report.notes
    );
    assert_eq!(got.distances, Distances::F64(dist), "{what} f64 distances");
    out.push(got);
    assert_no_validation_errors();
    out
}

#[test]
fn knn_matches_the_oracle_dims_metrics_algorithms() {
    for (d, n) in [(1, 300), (2, 400), (3, 400), (8, 300), (16, 250)] {
        for (m, metric) in METRICS.into_iter().enumerate() {
            let x = if m == 1 {
                clusters(n, d, 3 + d as u64)
            } else {
                uniform(n, d, 5 + d as u64)
            };
            for algorithm in [Algorithm::Lss, Algorithm::Brute] {
                for k in [1, 7] {
                    let r = check_knn(
                        &x,
                        None,
                        d,
                        k,
                        &knn_opts(metric, algorithm, None),
                        &format!("d={d} {metric} {algorithm} k={k}"),
                    );
                    assert_eq!(r[0].report.algorithm, algorithm);
                }
            }
        }
    }
}

/// Integer lattice points (every point `copies` times): many exactly equal distances.
fn lattice(side: usize, d: usize, copies: usize) -> Vec<f64> {
    let mut x = Vec::new();
    for _ in 0..copies {
        for i in 0..side.pow(d as u32) {
            let mut rest = i;
            for _ in 0..d {
                x.push((rest % side) as f64);
                rest /= side;
            }
        }
    }
    x
}

#[test]
fn knn_ties_duplicates_and_extreme_k() {
    // Lattice with duplicates: ties at the k-th place everywhere, picked by smaller index.
    for (d, side) in [(1usize, 80usize), (2, 12), (3, 5)] {
        let x = lattice(side, d, 2);
        let n = x.len() / d;
        for metric in METRICS {
            for algorithm in [Algorithm::Lss, Algorithm::Brute] {
                for k in [1, 2, 5, 13] {
                    check_knn(
                        &x,
                        None,
                        d,
                        k,
                        &knn_opts(metric, algorithm, None),
                        &format!("lattice d={d} {metric} {algorithm} k={k}"),
                    );
                }
            }
        }
        // k = n - 1: every other point.
        for algorithm in [Algorithm::Lss, Algorithm::Brute] {
            check_knn(
                &x,
                None,
                d,
                n - 1,
                &knn_opts(Metric::Euclidean, algorithm, Some(2)),
                &format!("lattice d={d} {algorithm} k=n-1"),
            );
        }
    }
    // All points identical: every candidate ties at 0.
    let x = vec![0.5; 60 * 3];
    for algorithm in [Algorithm::Lss, Algorithm::Brute] {
        for k in [1, 10, 59] {
            check_knn(
                &x,
                None,
                3,
                k,
                &knn_opts(Metric::Manhattan, algorithm, None),
                &format!("identical {algorithm} k={k}"),
            );
        }
    }
}

#[test]
fn knn_large_k_and_a_to_b() {
    // k = 2000 on 3000 points (the bound's windows then span most lists).
    let d = 4;
    let x = clusters(3000, d, 77);
    for algorithm in [Algorithm::Lss, Algorithm::Brute] {
        let mut o = knn_opts(Metric::Euclidean, algorithm, Some(3));
        // Queries: 40 points of another set (A-to-B), partly outside the data's bounds.
        let q: Vec<f64> = uniform(40, d, 8).iter().map(|v| v * 14.0 - 2.0).collect();
        check_knn(
            &x,
            Some(&q),
            d,
            2000,
            &o,
            &format!("A-to-B k=2000 {algorithm}"),
        );
        o.metric = Metric::Chebyshev;
        check_knn(
            &x[..600 * d],
            None,
            d,
            550,
            &o,
            &format!("self k=550 {algorithm}"),
        );
    }
    // k = 10000: 20 queries against 10,500 points (with duplicates: ties at the k-th place).
    let mut big = uniform(7000, 2, 12);
    big.extend_from_within(..3500 * 2);
    let q = uniform(20, 2, 13);
    for algorithm in [Algorithm::Lss, Algorithm::Brute] {
        check_knn(
            &big,
            Some(&q),
            2,
            10_000,
            &knn_opts(Metric::Euclidean, algorithm, None),
            &format!("k=10000 {algorithm}"),
        );
    }
    // A-to-B in every metric, queries with exact duplicates of data points.
    for metric in METRICS {
        for d in [2, 6] {
            let data = uniform(500, d, 10 + d as u64);
            let mut q: Vec<f64> = uniform(120, d, 20 + d as u64)
                .iter()
                .map(|v| v * 1.2 - 0.1)
                .collect();
            q.extend_from_slice(&data[..10 * d]);
            for algorithm in [Algorithm::Lss, Algorithm::Brute] {
                check_knn(
                    &data,
                    Some(&q),
                    d,
                    9,
                    &knn_opts(metric, algorithm, None),
                    &format!("A-to-B {metric} d={d} {algorithm}"),
                );
            }
        }
    }
}

#[test]
fn knn_errors_and_edge_cases() {
    let e = engine();
    let x = vec![0.0f32, 1.0, 2.0, 3.0];
    let data = Dataset::from_f32(&x, 1).unwrap();
    for algorithm in [Algorithm::Lss, Algorithm::Brute, Algorithm::Auto] {
        let o = knn_opts(Metric::Euclidean, algorithm, None);
        // k > candidates (self-kNN excludes the point itself): an error.
        let err = e.knn(&data, None, 4, &o).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(
            e.knn(&data, None, 0, &o).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let all = e.knn(&data, Some(&data), 4, &o).unwrap();
        assert_eq!(all.row(0), &[0, 1, 2, 3]);
        assert_eq!(all.row(3), &[3, 2, 1, 0]);
        // Ties by smaller index: from 1.5 the points 1 and 2 are equally far.
        let q = Dataset::from_f32(&[1.5], 1).unwrap();
        let r = e.knn(&data, Some(&q), 3, &o).unwrap();
        assert_eq!(r.row(0), &[1, 2, 0]);
        assert_eq!(r.distance(0, 0), 0.5);
        // No queries: an empty answer.
        let none = Dataset::from_f32(&[], 1).unwrap();
        let r = e.knn(&data, Some(&none), 2, &o).unwrap();
        assert_eq!((r.rows, r.indices.len()), (0, 0));
        // One point against one.
        let one = Dataset::from_f32(&[7.0], 1).unwrap();
        let r = e.knn(&one, Some(&q), 1, &o).unwrap();
        assert_eq!(r.row(0), &[0]);
        assert_eq!(r.distance(0, 0), 5.5);
    }
    // Algorithms the GPU has not (the CPU's k-d tree and grid): unsupported, naming the
    // CPU backend; with backend auto they run there, with the CPU's answer.
    for algorithm in [Algorithm::KdTree, Algorithm::Grid] {
        let o = knn_opts(Metric::Euclidean, algorithm, None);
        let err = e.knn(&data, None, 1, &o).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("CPU backend"), "{err}");
        let auto = KnnOptions {
            backend: Backend::Auto,
            ..o.clone()
        };
        let cpu = KnnOptions {
            backend: Backend::Cpu,
            ..o
        };
        let x: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 * 0.25).collect();
        let pts = Dataset::from_f32(&x, 3).unwrap();
        let a = e.knn(&pts, None, 5, &auto).unwrap();
        let c = e.knn(&pts, None, 5, &cpu).unwrap();
        assert_eq!(
            (a.indices, a.report.backend),
            (c.indices, "cpu".to_string())
        );
    }
    assert_no_validation_errors();
}

#[test]
fn knn_chunked_output_and_heaps() {
    // Tiny result buffers (the SIMJOIN_GPU_KNN_ENTRIES knob): a query's candidates split
    // across chunks; brute-force heaps one query per chunk.
    if std::env::var_os(common::CHILD_ENV).is_none() {
        common::run_in_child(
            "knn_chunked_output_and_heaps",
            &[("SIMJOIN_GPU_KNN_ENTRIES", "37")],
        );
        return;
    }
    let d = 3;
    let x = clusters(400, d, 91);
    for algorithm in [Algorithm::Lss, Algorithm::Brute] {
        for k in [1, 20, 30] {
            let r = check_knn(
                &x,
                None,
                d,
                k,
                &knn_opts(Metric::Euclidean, algorithm, None),
                &format!("chunked {algorithm} k={k}"),
            );
            assert!(r[0].report.batches > 10, "{:?}", r[0].report.notes);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The Z-order sort kernel

/// Host reference: Z-order of rows shifted by `shift` (most significant differing bit
/// decides, earlier dimensions first at equal levels), ties by id.
fn z_order(rows: &[u32], d: usize, shift: u32, a: u32, b: u32) -> std::cmp::Ordering {
    let (ra, rb) = (
        &rows[a as usize * d..(a as usize + 1) * d],
        &rows[b as usize * d..(b as usize + 1) * d],
    );
    // Compare bit-interleaved keys, level by level from the top.
    for bit in (0..32).rev() {
        for t in 0..d {
            let (x, y) = ((ra[t] + shift) >> bit & 1, (rb[t] + shift) >> bit & 1);
            if x != y {
                return x.cmp(&y);
            }
        }
    }
    a.cmp(&b)
}

#[test]
fn zorder_sort_matches_a_host_morton_sort() {
    use simjoin::vk::{sort, Stream};
    let ctx = common::shared_context();
    let mut rng = Rng(4);
    for (n, d, lists, range) in [
        (1usize, 3usize, 2usize, 10u32),
        (2, 1, 1, 5),
        (37, 2, 3, 4),
        (300, 3, 5, 1 << 31),
        (513, 7, 2, 1000),
        (1000, 16, 4, 1 << 20),
    ] {
        let rows: Vec<u32> = (0..n * d)
            .map(|_| (rng.next() % range as u64) as u32)
            .collect();
        let shift = ((1u64 << 31) / (lists as u64 + 1)) as u32;
        for stages in [sort::SortStages::GlobalOnly, sort::SortStages::Tiles] {
            let row_buf = ctx.upload(&rows, "rows").unwrap();
            let init: Vec<u32> = (0..lists).flat_map(|_| (0..n as u32).rev()).collect();
            let ids = ctx.upload(&init, "ids").unwrap();
            let mut s = Stream::new(&ctx, 0).unwrap();
            sort::sort_zorder(&mut s, &ids, &row_buf, n, lists, d, shift, stages).unwrap();
            s.finish().unwrap();
            let got: Vec<u32> = ctx.download(&ids, 0, n * lists).unwrap();
            for l in 0..lists {
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by(|&a, &b| z_order(&rows, d, l as u32 * shift, a, b));
                assert_eq!(
                    &got[l * n..(l + 1) * n],
                    &want[..],
                    "n={n} d={d} list {l} {stages:?}"
                );
            }
        }
    }
    assert_no_validation_errors();
}

#[test]
fn query_blocks_of_64_positions() {
    // Queries processed in blocks (the SIMJOIN_GPU_LSS_BLOCK knob; 4M positions by
    // default): per-block slices of the query order, offsets and states.
    if std::env::var_os(common::CHILD_ENV).is_none() {
        common::run_in_child(
            "query_blocks_of_64_positions",
            &[("SIMJOIN_GPU_LSS_BLOCK", "64")],
        );
        return;
    }
    let d = 3;
    let x = clusters(300, d, 5);
    let eps = eps_for(&x, d, Metric::Euclidean, 0.03);
    let mut o = lss(eps, Metric::Euclidean, None);
    o.result_buffer_pairs = Some(100);
    check_self(&x, d, &o, "blocks self");
    check_ab(&x[..100 * d], &x, d, &o, "blocks A⋈B");
    check_ab(&x, &x[..150 * d], d, &o, "blocks B⋈A");
    for algorithm in [Algorithm::Lss, Algorithm::Brute] {
        let ko = knn_opts(Metric::Manhattan, algorithm, None);
        check_knn(&x, None, d, 6, &ko, &format!("blocks self-kNN {algorithm}"));
        check_knn(
            &x,
            Some(&x[..130 * d]),
            d,
            6,
            &ko,
            &format!("blocks kNN {algorithm}"),
        );
    }
}
