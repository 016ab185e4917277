//! Cosine joins (`Metric::Cosine`, the rule in `src/metric.rs`) against the brute-force
//! oracle under that rule, exactly: clustered directions with random norms, exact
//! duplicates and scalar multiples (cosine 1), orthogonal pairs at eps 1 and pairs a hair
//! either side of it, opposite vectors, 2-D to 384-D, f32 and f64; every CPU algorithm and,
//! with the `gpu` feature, the GPU on lavapipe (validation on); pairs, counts, CSR with
//! distances, A ⋈ B, streams and neighbour counts; zero vectors refused. Cosine kNN
//! (self and A ⋈ B, ties by index) against the brute-force kNN under the rule, rows with
//! many exact duplicates and scalar multiples included (the rows the Euclidean pass cannot
//! certify).

mod common;

use common::Rng;
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, ErrorKind, JoinOptions, KnnOptions, Metric,
    OutputForm,
};

fn engine() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(Engine::new)
}

/// `n` vectors in `dim`-D around `centres` random directions (spread `spread`), each
/// scaled by a random norm in [0.1, 10); every 7th an exact duplicate of an earlier one
/// and every 11th a scalar multiple of one (cosine exactly 1 under the rule's arithmetic
/// for power-of-two factors).
fn directions(rng: &mut Rng, n: usize, dim: usize, centres: usize, spread: f64) -> Vec<f64> {
    let cs: Vec<f64> = (0..centres * dim).map(|_| rng.normal()).collect();
    let mut x = Vec::with_capacity(n * dim);
    for i in 0..n {
        if i > 0 && i % 7 == 0 {
            let j = (rng.next() as usize) % i;
            x.extend_from_within(j * dim..(j + 1) * dim);
            continue;
        }
        if i > 0 && i % 11 == 0 {
            let j = (rng.next() as usize) % i;
            let f = [0.5, 2.0, 4.0][(rng.next() % 3) as usize];
            for k in 0..dim {
                let v = x[j * dim + k] * f;
                x.push(v);
            }
            continue;
        }
        let c = (rng.next() as usize) % centres;
        let norm = 0.1 + 9.9 * rng.unit();
        let v: Vec<f64> = (0..dim)
            .map(|k| cs[c * dim + k] + spread * rng.normal())
            .collect();
        let len = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        x.extend(v.iter().map(|a| a / len * norm));
    }
    x
}

fn as_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// `x` and `y` (`dim` wide) as datasets in f64, then their f32 copies `x32`, `y32`.
fn in_both_precisions<'a>(
    x: &'a [f64],
    y: &'a [f64],
    x32: &'a [f32],
    y32: &'a [f32],
    dim: usize,
) -> [(Dataset<'a>, Dataset<'a>); 2] {
    let (f64s, f32s) = (|v| Dataset::from_f64(v, dim), |v| Dataset::from_f32(v, dim));
    [
        (f64s(x).unwrap(), f64s(y).unwrap()),
        (f32s(x32).unwrap(), f32s(y32).unwrap()),
    ]
}

fn cosine(eps: f64, backend: Backend, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.metric = Metric::Cosine;
    o.backend = backend;
    o.algorithm = algorithm;
    o.sorted = true;
    o
}

/// Every output form of the self-join and of A ⋈ B equals the oracle's.
fn check_all(data: &Dataset, other: &Dataset, eps: f64, backend: Backend, algorithm: Algorithm) {
    let what = format!(
        "{}-D {:?} eps {eps} {backend} {algorithm}",
        data.dim(),
        data.precision()
    );
    let want = oracle::self_join(data, Metric::Cosine, eps);
    let mut o = cosine(eps, backend, algorithm);
    let got = engine().self_join(data, &o).unwrap();
    assert_eq!(got.pairs().unwrap(), &want[..], "{what}");
    assert_eq!(got.report.pairs, want.len() as u64, "{what}");
    o.output = OutputForm::Count;
    assert_eq!(
        engine().self_join(data, &o).unwrap().count(),
        want.len() as u64,
        "{what}"
    );
    // The CSR with each entry's distance, 1 - cos under the rule, rounded to the input's type.
    o.output = OutputForm::Csr;
    o.distances = true;
    let csr = engine().self_join(data, &o).unwrap();
    let c = csr.csr().unwrap();
    assert_eq!(c.neighbors.len(), 2 * want.len(), "{what}");
    let d = csr.distances.as_ref().unwrap();
    for r in 0..data.len() {
        for e in c.offsets[r] as usize..c.offsets[r + 1] as usize {
            let n = c.neighbors[e] as usize;
            let (i, j) = (r.min(n) as u32, r.max(n) as u32);
            assert!(
                want.binary_search(&[i, j]).is_ok(),
                "{what}: CSR entry {r} {n}"
            );
            let expect =
                simjoin::metric::distance_acc(Metric::Cosine, &row(data, r), &row(data, n));
            let expect = match data.precision() {
                simjoin::Precision::F32 => expect as f32 as f64,
                simjoin::Precision::F64 => expect,
            };
            assert_eq!(d.get(e), expect, "{what}: distance of {r} {n}");
        }
    }
    // A ⋈ B.
    let want_ab = oracle::join(data, other, Metric::Cosine, eps);
    let o = cosine(eps, backend, algorithm);
    assert_eq!(
        engine().join(data, other, &o).unwrap().pairs().unwrap(),
        &want_ab[..],
        "{what} A⋈B"
    );
    // Streamed, unsorted.
    let mut sink = simjoin::VecSink::default();
    engine().self_join_stream(data, &o, &mut sink).unwrap();
    let mut streamed = sink.pairs;
    streamed.sort_unstable();
    assert_eq!(streamed, want, "{what} stream");
}

fn row(data: &Dataset, i: usize) -> Vec<f64> {
    let d = data.dim();
    match data.coords() {
        simjoin::Coords::F32(x) => x[i * d..(i + 1) * d].iter().map(|&v| v as f64).collect(),
        simjoin::Coords::F64(x) => x[i * d..(i + 1) * d].to_vec(),
    }
}

#[test]
fn cpu_matches_the_rule_on_clustered_directions() {
    let mut rng = Rng(40);
    for (dim, n, spread, eps) in [
        (2usize, 600usize, 0.05, 0.002),
        (3, 600, 0.1, 0.01),
        (8, 500, 0.2, 0.05),
        (64, 400, 0.3, 0.05),
        (384, 250, 0.5, 0.1),
    ] {
        let x = directions(&mut rng, n, dim, 6, spread);
        let y = directions(&mut rng, n / 2, dim, 6, spread);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        for (a, b) in in_both_precisions(&x, &y, &x32, &y32, dim) {
            assert!(!oracle::self_join(&a, Metric::Cosine, eps).is_empty());
            for algorithm in [
                Algorithm::Auto,
                Algorithm::Grid,
                Algorithm::Ego,
                Algorithm::Brute,
            ] {
                check_all(&a, &b, eps, Backend::Cpu, algorithm);
            }
        }
    }
}

/// Orthogonal vectors at eps 1 (dot exactly 0, a match), a hair inside and outside, opposite
/// vectors (distance 2), and eps past 2 (every pair).
#[test]
fn boundaries_are_exact() {
    let x: Vec<f64> = vec![
        1.0, 0.0, //
        0.0, 1.0, // orthogonal to 0: cos 0
        1.0, 1e-9, // cos with 1: > 0
        1.0, -1e-9, // cos with 1: < 0
        -3.0, 0.0, // opposite to 0
        0.0, -2.0, // opposite to 1
        5.0, 0.0, // parallel to 0: cos exactly 1
    ];
    let data = Dataset::from_f64(&x, 2).unwrap();
    let x32 = as_f32(&x);
    let data32 = Dataset::from_f32(&x32, 2).unwrap();
    for eps in [1.0, 1e-12, 0.5, 2.0, 2.5] {
        for d in [&data, &data32] {
            let want = oracle::self_join(d, Metric::Cosine, eps);
            for algorithm in [Algorithm::Grid, Algorithm::Brute, Algorithm::Ego] {
                let o = cosine(eps, Backend::Cpu, algorithm);
                assert_eq!(
                    engine().self_join(d, &o).unwrap().pairs().unwrap(),
                    &want[..],
                    "eps {eps}"
                );
            }
        }
    }
    // By hand: at eps 1, (0, 1) matches exactly and (1, 3) does not; (0, 6) at every eps.
    let at1 = oracle::self_join(&data, Metric::Cosine, 1.0);
    assert!(at1.contains(&[0, 1]) && at1.contains(&[1, 2]) && !at1.contains(&[1, 3]));
    assert!(oracle::self_join(&data, Metric::Cosine, 1e-12).contains(&[0, 6]));
    assert_eq!(oracle::self_join(&data, Metric::Cosine, 2.5).len(), 21);
}

#[test]
fn zero_vectors_and_knn_are_refused_clearly() {
    let x = [1.0f32, 0.0, 0.0, 0.0, 0.5, 0.5];
    let data = Dataset::from_f32(&x, 2).unwrap();
    let e = engine()
        .self_join(&data, &cosine(0.1, Backend::Cpu, Algorithm::Auto))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("row 1 is a zero vector"), "{e}");
    let tiny = [1e-170f64, 0.0, 1.0, 1.0];
    let e = engine()
        .self_join(
            &Dataset::from_f64(&tiny, 2).unwrap(),
            &cosine(0.1, Backend::Cpu, Algorithm::Auto),
        )
        .unwrap_err();
    assert!(e.to_string().contains("row 0"), "{e}");
    let o = KnnOptions {
        metric: Metric::Cosine,
        ..Default::default()
    };
    let e = engine().knn(&data, None, 1, &o).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("row 1 is a zero vector"), "{e}");
}

/// A cosine join whose candidates a Euclidean join confirms by the rule (`Confirm`, in the
/// CPU join's sink) never hangs with more threads than cores: 3,000 positive multiples of
/// one 64-D direction (every pair within eps 1e-9) among 3,000 random rows, 60 joins at 8
/// threads. Before the sink's work was kept to the thread in it, its parallel
/// confirmation let a waiting thread take up another task of the join, whose pairs then
/// waited for the sink: 5 of 100 such runs hung.
#[test]
fn confirmed_joins_with_many_threads_never_hang() {
    let mut rng = Rng(59);
    let dim = 64;
    let base: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
    let mut x = Vec::new();
    for i in 0..3000 {
        let f = 0.1 + i as f64 / 300.0;
        x.extend(base.iter().map(|v| (v * f) as f32));
    }
    x.extend((0..3000 * dim).map(|_| rng.normal() as f32));
    let (done, runs) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opts = simjoin::EngineOptions {
            threads: Some(8),
            ..Default::default()
        };
        let engine = Engine::with_options(opts).unwrap();
        let data = Dataset::from_f32(&x, dim).unwrap();
        let o = cosine(1e-9, Backend::Cpu, Algorithm::Auto);
        for _ in 0..60 {
            let got = engine.self_join(&data, &o).unwrap();
            let _ = done.send(got.report.pairs);
        }
    });
    for run in 0..60 {
        let pairs = runs
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("join {run} did not end within 60 s"));
        assert_eq!(pairs, 3000 * 2999 / 2, "join {run}");
    }
}

/// Checks the cosine kNN against the oracle exactly; returns the report's notes.
fn check_knn(data: &Dataset, query: Option<&Dataset>, k: usize, backend: Backend) -> String {
    let o = KnnOptions {
        metric: Metric::Cosine,
        backend,
        ..Default::default()
    };
    check_knn_with(data, query, k, &o).notes.join("; ")
}

/// [`check_knn`] under options `o` (metric cosine); returns the report.
fn check_knn_with(
    data: &Dataset,
    query: Option<&Dataset>,
    k: usize,
    o: &KnnOptions,
) -> simjoin::JoinReport {
    let got = engine().knn(data, query, k, o).unwrap();
    let (idx, dist) = oracle::knn(data, query, k, Metric::Cosine);
    let what = format!(
        "{:?} {:?} n={} dim={} k={k} ab={}",
        o.backend,
        o.algorithm,
        data.len(),
        data.dim(),
        query.is_some()
    );
    assert_eq!(got.indices, idx, "{what}: indices");
    let d: Vec<f64> = (0..got.rows)
        .flat_map(|r| (0..k).map(move |c| (r, c)))
        .map(|(r, c)| got.distance(r, c))
        .collect();
    assert_eq!(d, dist, "{what}: distances");
    got.report
}

#[test]
fn knn_ranks_by_the_rule() {
    let mut rng = Rng(41);
    for (n, dim, centres, spread) in [(600usize, 3usize, 4usize, 0.05), (500, 64, 8, 0.3)] {
        let x = directions(&mut rng, n, dim, centres, spread);
        // 70 queries meet every row (`cosine::SMALL_QUERIES`); 300 take the general path.
        let q = directions(&mut rng, 370, dim, centres, spread);
        let (q, few) = q.split_at(300 * dim);
        let x32 = as_f32(&x);
        let q32 = as_f32(q);
        for k in [1usize, 5, 40] {
            let d64 = Dataset::from_f64(&x, dim).unwrap();
            let dq64 = Dataset::from_f64(q, dim).unwrap();
            check_knn(&d64, None, k, Backend::Cpu);
            check_knn(&d64, Some(&dq64), k, Backend::Cpu);
            let d32 = Dataset::from_f32(&x32, dim).unwrap();
            let dq32 = Dataset::from_f32(&q32, dim).unwrap();
            check_knn(&d32, None, k, Backend::Cpu);
            check_knn(&d32, Some(&dq32), k, Backend::Cpu);
            let df = Dataset::from_f64(few, dim).unwrap();
            let notes = check_knn(&d64, Some(&df), k, Backend::Cpu);
            assert!(notes.contains("meet every one"), "{notes}");
        }
    }
}

/// Near-ties that rounding decides: around each of 150 directions q (coordinates equal in
/// pairs), 7 close rows and 6 variants of one farther row, its coordinate pairs swapped at
/// random. The variants' real cosines with q are equal; their computed ones differ in the
/// last bits, in an order the fast ranking's sum need not share. Other groups are far, so
/// the rows are certain and their ranks rest on the fast ranking's slack
/// (`metric::cosine_distance_slack`).
#[test]
fn knn_near_ties_follow_the_rule() {
    let mut rng = Rng(44);
    let dim = 64;
    let mut x = Vec::new();
    for _ in 0..150 {
        let q: Vec<f64> = (0..dim / 2)
            .flat_map(|_| {
                let v = rng.normal();
                [v, v]
            })
            .collect();
        x.extend(&q);
        for _ in 0..7 {
            x.extend(q.iter().map(|v| v + 0.01 * rng.normal()));
        }
        let far: Vec<f64> = q.iter().map(|v| v + 0.05 * rng.normal()).collect();
        for _ in 0..6 {
            let mut v = far.clone();
            for i in 0..dim / 2 {
                if rng.normal() > 0.0 {
                    v.swap(2 * i, 2 * i + 1);
                }
            }
            x.extend(v);
        }
    }
    let x32 = as_f32(&x);
    for data in [
        Dataset::from_f64(&x, dim).unwrap(),
        Dataset::from_f32(&x32, dim).unwrap(),
    ] {
        for k in [9usize, 10, 11] {
            check_knn(&data, None, k, Backend::Cpu);
        }
    }
}

/// Heavy near-duplicates: 150 scalar multiples of one direction (each factor once, so no
/// two rows are equal) among 400 rows, so a row's k' Euclidean candidates are all at
/// distance ~0 and its rank rests on the rule's ties by index: the uncertain rows' path
/// (each meets every row from its c_k).
#[test]
fn knn_with_many_duplicates_is_exact() {
    let mut rng = Rng(43);
    let dim = 8;
    let base: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
    let mut x = Vec::new();
    for i in 0..400 {
        if i % 8 < 3 {
            let f = 0.5 + i as f64 / 128.0;
            x.extend(base.iter().map(|v| v * f));
        } else {
            x.extend((0..dim).map(|_| rng.normal()));
        }
    }
    let data = Dataset::from_f64(&x, dim).unwrap();
    for k in [1usize, 20, 60] {
        check_knn(&data, None, k, Backend::Cpu);
        check_knn(&data, Some(&data), k, Backend::Cpu);
    }
    let got = engine()
        .knn(
            &data,
            None,
            20,
            &KnnOptions {
                metric: Metric::Cosine,
                backend: Backend::Cpu,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        got.report
            .notes
            .iter()
            .any(|n| n.contains("rows met every row from their k-th distance")),
        "the duplicates went through the uncertain rows' path: {:?}",
        got.report.notes
    );
}

/// Thousands of scalar multiples of one direction (2,400 of 3,000 rows, a third of them
/// negative; no two equal): any two on one side are at a rule distance of about 0 that
/// rounding decides, so each of them is uncertain after the Euclidean pass and meets
/// every row from its k-th distance (`cosine::knn`'s `Uncertain`; its unit test
/// `uncertain_rows_by_a_join_with_lists_cut_are_exact` takes the join on the same data).
#[test]
fn knn_of_thousands_of_collinear_rows_is_exact() {
    let mut rng = Rng(47);
    let dim = 6;
    let base: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
    let mut x = Vec::new();
    for i in 0..3000 {
        if i % 5 == 0 {
            x.extend((0..dim).map(|_| rng.normal()));
        } else {
            let f = (0.25 + i as f64 / 1000.0) * if i % 3 == 0 { -1.0 } else { 1.0 };
            x.extend(base.iter().map(|v| v * f));
        }
    }
    let x32 = as_f32(&x);
    let sets = [
        Dataset::from_f64(&x, dim).unwrap(),
        Dataset::from_f32(&x32, dim).unwrap(),
    ];
    for data in &sets {
        for k in [1usize, 10] {
            let notes = check_knn(data, None, k, Backend::Cpu);
            let at = notes.find(" rows met every row").expect(&notes);
            let joined: usize = notes[..at].rsplit(' ').next().unwrap().parse().unwrap();
            assert!(joined >= 2000, "{notes}");
        }
        check_knn(data, Some(data), 10, Backend::Cpu);
    }
}

/// `algorithm = Brute` for a cosine kNN on the CPU is the exact scan in which every query
/// meets every row (`knn_brute`), not the Euclidean pass's generic one: self and with
/// queries, f64 and f32, 50 rows copied twice for ties by index.
#[test]
fn named_brute_knn_meets_every_row() {
    let mut rng = Rng(53);
    let dim = 96;
    let mut x = directions(&mut rng, 900, dim, 12, 0.2);
    x.extend_from_within(..50 * dim);
    let q = directions(&mut rng, 300, dim, 12, 0.2);
    let (x32, q32) = (as_f32(&x), as_f32(&q));
    let o = KnnOptions {
        metric: Metric::Cosine,
        backend: Backend::Cpu,
        algorithm: Algorithm::Brute,
        ..Default::default()
    };
    for (data, query) in in_both_precisions(&x, &q, &x32, &q32, dim) {
        for (query, k) in [(None, 1usize), (None, 10), (Some(&query), 10)] {
            let report = check_knn_with(&data, query, k, &o);
            assert_eq!(report.algorithm, Algorithm::Brute);
            let notes = report.notes.join("; ");
            assert!(
                notes.contains("(algorithm brute) meet every one"),
                "{notes}"
            );
        }
    }
}

/// 600 rows and 80 queries of `knn_of_many_exact_copies_is_exact`'s data.
fn copies(rng: &mut Rng, dim: usize) -> (Vec<f64>, Vec<f64>) {
    let bases: Vec<Vec<f64>> = (0..3)
        .map(|_| (0..dim).map(|_| rng.normal()).collect())
        .collect();
    let (n, nq) = (600, 80);
    let mut x: Vec<f64> = Vec::with_capacity((n + nq) * dim);
    for i in 0..n + nq {
        let b = &bases[i % 3];
        let f = match i % 10 {
            0 | 3 => Some((&bases[0], 1.0)),
            1 => Some((&bases[0], 2.0)),
            4 => Some((b, if i % 20 == 4 { 0.5 } else { 4.0 })),
            _ => None,
        };
        match (f, i % 10) {
            (Some((b, f)), _) => x.extend(b.iter().map(|v| v * f)),
            (None, 5..=7) => x.extend(b.iter().map(|v| v + 0.05 * rng.normal())),
            _ => x.extend((0..dim).map(|_| rng.normal())),
        }
    }
    let q = x.split_off(n * dim);
    (x, q)
}

/// Exact copies: a class of 120 copies of one vector (more than `DISTINCT_CLASS`), one of
/// 60 of its double (another value at exactly the same rule distance from every row) and
/// smaller classes of other multiples, members interleaved by index, among noisy rows;
/// queries that copy data rows. The kNN of the distinct rows, expanded to their copies
/// (`cosine::knn_distinct`), equals the oracle's in indices and distance bits: self and
/// A ⋈ B, f32 and f64, k = 1 to 100; and where every row is the same vector.
#[test]
fn knn_of_many_exact_copies_is_exact() {
    let mut rng = Rng(59);
    for dim in [8usize, 40] {
        let (x, q) = copies(&mut rng, dim);
        common::each_precision_pair(&x, &q, dim, |data, query| {
            for k in [1usize, 10, 45, 100] {
                for query in [None, Some(query)] {
                    let notes = check_knn(data, query, k, Backend::Cpu);
                    assert!(notes.contains("distinct"), "{notes}");
                }
            }
        });
    }
    // One vector, 100 times: no other class to search.
    let one: Vec<f64> = (0..100).flat_map(|_| [0.3, -1.0, 2.5, 0.125]).collect();
    let data = Dataset::from_f64(&one, 4).unwrap();
    let query = Dataset::from_f64(&[0.3, -1.0, 2.5, 0.125, 1.0, 0.0, 0.0, 0.0], 4).unwrap();
    for k in [1, 10, 50] {
        let notes = check_knn(&data, None, k, Backend::Cpu);
        assert!(notes.contains("1 distinct"), "{notes}");
        check_knn(&data, Some(&query), k, Backend::Cpu);
    }
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_knn_ranks_by_the_rule() {
    common::gpu_test_setup();
    let mut rng = Rng(47);
    let dim = 16;
    let x = directions(&mut rng, 400, dim, 4, 0.2);
    let d = Dataset::from_f64(&x, dim).unwrap();
    let x32 = as_f32(&x);
    let d32 = Dataset::from_f32(&x32, dim).unwrap();
    for k in [1usize, 12] {
        check_knn(&d, None, k, Backend::Gpu);
        check_knn(&d32, None, k, Backend::Gpu);
    }
    // Large classes of exact copies: the distinct rows' kNN on the GPU, expanded.
    let (x, q) = copies(&mut rng, 12);
    let (d, dq) = (
        Dataset::from_f64(&x, 12).unwrap(),
        Dataset::from_f64(&q, 12).unwrap(),
    );
    for query in [None, Some(&dq)] {
        let notes = check_knn(&d, query, 10, Backend::Gpu);
        assert!(notes.contains("distinct"), "{notes}");
    }
    common::assert_no_validation_errors();
}

/// Neighbour counts (the point itself included) from the confirmed pairs.
#[test]
fn neighbour_counts_follow_the_rule() {
    let mut rng = Rng(41);
    let x = directions(&mut rng, 500, 16, 4, 0.3);
    let data = Dataset::from_f64(&x, 16).unwrap();
    let want = oracle::self_join(&data, Metric::Cosine, 0.05);
    let mut counts = vec![1u32; 500];
    for [i, j] in &want {
        counts[*i as usize] += 1;
        counts[*j as usize] += 1;
    }
    let (got, report) = engine()
        .neighbour_counts(&data, &cosine(0.05, Backend::Cpu, Algorithm::Auto))
        .unwrap();
    assert_eq!(got, counts);
    assert_eq!(report.pairs, want.len() as u64);
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_matches_the_rule() {
    common::gpu_test_setup();
    let mut rng = Rng(42);
    for (dim, n, spread, eps) in [(3usize, 500usize, 0.1, 0.01), (64, 300, 0.3, 0.05)] {
        let x = directions(&mut rng, n, dim, 5, spread);
        let y = directions(&mut rng, n / 2, dim, 5, spread);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        let a = Dataset::from_f32(&x32, dim).unwrap();
        let b = Dataset::from_f32(&y32, dim).unwrap();
        for algorithm in [Algorithm::Grid, Algorithm::Brute, Algorithm::Lss] {
            check_all(&a, &b, eps, Backend::Gpu, algorithm);
        }
        let a = Dataset::from_f64(&x, dim).unwrap();
        let b = Dataset::from_f64(&y, dim).unwrap();
        check_all(&a, &b, eps, Backend::Gpu, Algorithm::Grid);
    }
    common::assert_no_validation_errors();
}

/// Rows of thousands of dims (3,072-D, as OpenAI's large embeddings; 4,100-D) under
/// `auto` on the GPU: a software device's loop budget refuses the general join there, and
/// the brute force in the grouped join's tiles runs instead (the join was refused before).
/// Every output form, self-join and A ⋈ B, f32 and f64; copies and multiples give pairs
/// at distance 0, the rest are far apart.
#[cfg(feature = "gpu")]
#[test]
fn gpu_auto_joins_thousands_of_dims() {
    common::gpu_test_setup();
    let mut rng = Rng(53);
    for (dim, n) in [(3072usize, 120usize), (4100, 60)] {
        let x = directions(&mut rng, n, dim, 40, 1.0);
        let y = directions(&mut rng, n / 2, dim, 40, 1.0);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        let a = Dataset::from_f32(&x32, dim).unwrap();
        let b = Dataset::from_f32(&y32, dim).unwrap();
        check_all(&a, &b, 0.05, Backend::Gpu, Algorithm::Auto);
        let got = engine()
            .self_join(&a, &cosine(0.05, Backend::Gpu, Algorithm::Auto))
            .unwrap();
        assert!(got.report.pairs > 10, "{dim}-D: {} pairs", got.report.pairs);
        if got.report.device.contains("llvmpipe") {
            let notes = got.report.notes.join("; ");
            assert!(notes.contains("every pair compared in tiles"), "{notes}");
        }
        let a = Dataset::from_f64(&x, dim).unwrap();
        let b = Dataset::from_f64(&y, dim).unwrap();
        check_all(&a, &b, 0.05, Backend::Gpu, Algorithm::Auto);
    }
    common::assert_no_validation_errors();
}

/// A brute force asked of the GPU runs in the grouped join's tiles (`Plan::brute`,
/// lavapipe, validation on): the rule's set exactly, self-join and A ⋈ B, f32 and f64, in
/// 2-130 dimensions; n = 0, 1, 2; the boundary rows of `boundaries_are_exact` (orthogonal
/// at eps 1, parallel, opposite); blocks of 1024 rows with a ragged last one (2,100 rows);
/// a result buffer of one tile's pairs forcing parts to run again (none lost). The notes
/// prove the tiles ran on the device.
#[cfg(feature = "gpu")]
#[test]
fn gpu_brute_force_runs_in_tiles() {
    common::gpu_test_setup();
    let mut rng = Rng(49);
    let run = |a: &Dataset, b: &Dataset, eps: f64, capacity: Option<usize>| {
        let what = format!("{}-D {:?} n {} eps {eps}", a.dim(), a.precision(), a.len());
        let mut o = cosine(eps, Backend::Gpu, Algorithm::Brute);
        o.result_buffer_pairs = capacity;
        let got = engine().self_join(a, &o).unwrap();
        let notes = got.report.notes.join("; ");
        assert!(
            notes.contains("blocked brute force") && notes.contains("on the GPU: "),
            "{what}: {notes}"
        );
        assert_eq!(got.report.backend, "gpu", "{what}");
        let want = oracle::self_join(a, Metric::Cosine, eps);
        assert_eq!(got.pairs().unwrap(), &want[..], "{what} {capacity:?}");
        let ab = engine().join(a, b, &o).unwrap();
        let want_ab = oracle::join(a, b, Metric::Cosine, eps);
        assert_eq!(ab.pairs().unwrap(), &want_ab[..], "{what} A⋈B");
        (want.len(), notes)
    };
    for (dim, n, spread, eps) in [
        (2usize, 2100usize, 0.05, 0.002),
        (17, 700, 0.2, 0.05),
        (130, 400, 0.5, 0.1),
    ] {
        let x = directions(&mut rng, n, dim, 6, spread);
        let y = directions(&mut rng, n / 3, dim, 6, spread);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        let f64s = (
            Dataset::from_f64(&x, dim).unwrap(),
            Dataset::from_f64(&y, dim).unwrap(),
        );
        let f32s = (
            Dataset::from_f32(&x32, dim).unwrap(),
            Dataset::from_f32(&y32, dim).unwrap(),
        );
        for (a, b) in [&f64s, &f32s] {
            let (pairs, _) = run(a, b, eps, None);
            assert!(pairs > 100, "{dim}-D: {pairs} pairs");
        }
        // Candidates dense enough that one tile's pairs overflow the buffer.
        let (_, notes) = run(&f32s.0, &f32s.1, eps * 20.0, Some(1024));
        assert!(
            notes.contains("run again after a full result buffer"),
            "{dim}-D: {notes}"
        );
    }
    // n = 0, 1, 2 and the boundary rows.
    let x: Vec<f64> = vec![
        1.0, 0.0, 0.0, 1.0, 1.0, 1e-9, 1.0, -1e-9, -3.0, 0.0, 0.0, -2.0, 5.0, 0.0,
    ];
    let x32 = as_f32(&x);
    for rows in [0usize, 1, 2, 7] {
        let a = Dataset::from_f64(&x[..2 * rows], 2).unwrap();
        let a32 = Dataset::from_f32(&x32[..2 * rows], 2).unwrap();
        for eps in [1.0, 1e-12, 0.5, 2.0, 2.5] {
            run(&a, &a, eps, None);
            run(&a32, &a32, eps, None);
        }
    }
    common::assert_no_validation_errors();
}

/// From a grouped join's notes: the candidates passed on unconfirmed (their products
/// reached `cosine::sure_dot`) and the candidates in all.
fn sure_of(notes: &str) -> (u64, u64) {
    let n = |s: &str| {
        s.trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{s:?}: {notes}"))
    };
    let (head, rest) = notes
        .split_once(" candidates from the tiles' dot products: ")
        .unwrap_or_else(|| panic!("no candidates' note: {notes}"));
    let all = n(head.rsplit(' ').next().unwrap());
    let sure = n(rest.split(' ').next().unwrap());
    (sure, all)
}

/// Enough clustered vectors for the CPU's grouped join (`cpu/partition/`, from 4096
/// vectors and 16 dimensions): the rule's set exactly, self-join and A ⋈ B, f32 and f64,
/// pairs, counts and streams; uniform directions fall back to the general join.
#[test]
fn grouped_join_on_clustered_vectors_matches_the_rule() {
    let mut rng = Rng(43);
    for (dim, spread, eps, grouped) in [
        (64usize, 0.08, 0.02, true),
        (32, 0.15, 0.05, true),
        // Near-duplicates only: too few leaders at eps, groups of a wider radius.
        (64, 0.08, 0.0005, true),
        (24, 5.0, 0.3, false),
    ] {
        let x = directions(&mut rng, 5000, dim, 40, spread);
        let y = directions(&mut rng, 1500, dim, 40, spread);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        for (a, b) in in_both_precisions(&x, &y, &x32, &y32, dim) {
            let what = format!("{dim}-D {:?} eps {eps}", a.precision());
            let want = oracle::self_join(&a, Metric::Cosine, eps);
            assert!(want.len() > 100 || !grouped, "{what}: {} pairs", want.len());
            let o = cosine(eps, Backend::Cpu, Algorithm::Auto);
            let got = engine().self_join(&a, &o).unwrap();
            let notes = got.report.notes.join("; ");
            assert_eq!(
                notes.contains("groups around leaders"),
                grouped,
                "{what}: {notes}"
            );
            // At eps 0.0005 the leaders' radius is wider than eps.
            assert_eq!(
                notes.contains(&format!("(radius {:.4})", (2.0 * eps).sqrt())),
                grouped && eps > 0.001,
                "{what}: {notes}"
            );
            assert_eq!(got.pairs().unwrap(), &want[..], "{what}");
            if grouped {
                // Candidates passed unconfirmed (at eps 0.02 every one of them).
                let (sure, all) = sure_of(&notes);
                assert!(sure > 0 && sure <= all, "{what}: {notes}");
            }
            let mut count = o.clone();
            count.output = OutputForm::Count;
            assert_eq!(
                engine().self_join(&a, &count).unwrap().count(),
                want.len() as u64
            );
            let want_ab = oracle::join(&a, &b, Metric::Cosine, eps);
            let got_ab = engine().join(&a, &b, &o).unwrap();
            assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "{what} A⋈B");
        }
    }
}

/// 384-D clusters wider than half the leaders' radius, so that the screen proves no
/// vector's nearest leader (members 0.34-0.44 apart, leaders at radius 0.45): the join's
/// groups take any leader within the radius that the screen finds (`Within::Radius`; the
/// note says how many), the self-join and A ⋈ B (B's side grouped the same way, a few of
/// its clusters A lacks) give the rule's set exactly, f32 and f64.
#[test]
fn grouped_join_screened_within_the_radius_matches_the_rule() {
    let mut rng = Rng(71);
    let (dim, eps) = (384usize, 0.1);
    // Clusters whose members are all within eps of each other, and wider ones whose
    // members straddle it (about 0.44 apart).
    let mut both = |n: usize, centres: usize| {
        let mut v = directions(&mut rng, n * 3 / 5, dim, centres * 3 / 5, 0.24);
        v.extend(directions(&mut rng, n * 2 / 5, dim, centres * 2 / 5, 0.31));
        v
    };
    let x = both(5000, 200);
    let y = both(4500, 220);
    let (x32, y32) = (as_f32(&x), as_f32(&y));
    for (a, b) in in_both_precisions(&x, &y, &x32, &y32, dim) {
        let what = format!("{:?}", a.precision());
        let o = cosine(eps, Backend::Cpu, Algorithm::Auto);
        let want = oracle::self_join(&a, Metric::Cosine, eps);
        let got = engine().self_join(&a, &o).unwrap();
        let notes = got.report.notes.join("; ");
        assert!(notes.contains("groups around leaders"), "{what}: {notes}");
        // "...; P of N vectors placed by their first 48 coordinates".
        let placed = |notes: &str| -> usize {
            let part = notes.split("; ").find(|s| s.contains("vectors placed by"));
            let part = part.unwrap_or_else(|| panic!("no screen: {notes}"));
            part.split(' ').next().unwrap().parse().unwrap()
        };
        assert!(placed(&notes) >= 4500, "{what}: {notes}");
        assert!(want.len() > 20_000, "{what}: {} pairs", want.len());
        assert_eq!(got.pairs().unwrap(), &want[..], "{what}");
        let want_ab = oracle::join(&a, &b, Metric::Cosine, eps);
        let got_ab = engine().join(&a, &b, &o).unwrap();
        let notes = got_ab.report.notes.join("; ");
        assert!(placed(&notes) >= 8000, "{what} A⋈B: {notes}");
        assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "{what} A⋈B");
    }
}

/// The leaders' count in a grouped join's notes ("N groups around leaders"), None where
/// the general join ran.
fn groups_in(notes: &str) -> Option<usize> {
    let head = notes.split(" groups around leaders").next()?;
    if head.len() == notes.len() {
        return None;
    }
    head.rsplit(' ').next()?.parse().ok()
}

/// A ⋈ B of unequal sides that share clusters: the larger side's sample picks the leaders
/// whichever side it is (the same groups either way round), the smaller side's vectors in
/// a cluster the larger one lacks lead groups of their own (more groups than the larger
/// side's self-join has), and under 256 vectors on the smaller side (203 and 5, either side)
/// every pair is compared in blocks (`Plan::brute`, on the CPU, or in the device's tiles
/// with `backend = gpu`: lavapipe, validation on). The rule's set exactly every time, f32
/// and f64.
#[test]
fn grouped_join_of_unequal_sides_matches_the_rule() {
    let mut rng = Rng(57);
    const DIM: usize = 48;
    let (dim, eps) = (DIM, 0.02);
    let big = directions(&mut rng, 5000, dim, 40, 0.08);
    // The big side's rows nudged (its clusters, pairs across), then 300 of clusters of
    // their own.
    let mut small: Vec<f64> = big[..1200 * dim]
        .iter()
        .map(|&v| v * (1.0 + 0.02 * rng.normal()))
        .collect();
    small.extend(directions(&mut rng, 300, dim, 3, 0.08));
    // 203 queries (not a multiple of the four rows the CPU's blocked products take at a
    // time), and 5 (too few for them).
    let few = &small[1000 * dim..1203 * dim];
    let tiny = &small[1000 * dim..1005 * dim];
    let (big32, small32, few32) = (as_f32(&big), as_f32(&small), as_f32(few));
    let tiny32 = as_f32(tiny);
    fn f64s(x: &[f64]) -> Dataset<'_> {
        Dataset::from_f64(x, DIM).unwrap()
    }
    fn f32s(x: &[f32]) -> Dataset<'_> {
        Dataset::from_f32(x, DIM).unwrap()
    }
    for (a, b, few, tiny) in [
        (f64s(&big), f64s(&small), f64s(few), f64s(tiny)),
        (f32s(&big32), f32s(&small32), f32s(&few32), f32s(&tiny32)),
    ] {
        let what = format!("{:?}", a.precision());
        let o = cosine(eps, Backend::Cpu, Algorithm::Auto);
        let own = engine().self_join(&a, &o).unwrap().report.notes.join("; ");
        let own = groups_in(&own).unwrap_or_else(|| panic!("{what}: {own}"));
        let mut seen = Vec::new();
        for (x, y) in [(&a, &b), (&b, &a)] {
            let want = oracle::join(x, y, Metric::Cosine, eps);
            assert!(want.len() > 1000, "{what}: {} pairs", want.len());
            let got = engine().join(x, y, &o).unwrap();
            let notes = got.report.notes.join("; ");
            assert_eq!(got.pairs().unwrap(), &want[..], "{what}: {notes}");
            seen.push(groups_in(&notes).unwrap_or_else(|| panic!("{what}: {notes}")));
        }
        assert!(
            seen[0] == seen[1] && seen[0] > own,
            "{what}: {seen:?}, own {own}"
        );
        for (x, y) in [(&a, &few), (&few, &a), (&a, &tiny), (&tiny, &a)] {
            let got = engine().join(x, y, &o).unwrap();
            let notes = got.report.notes.join("; ");
            assert!(notes.contains("blocked brute force"), "{what}: {notes}");
            // A few queries on A's side meet B's rows copied a block at a time (no copy
            // of the whole of B).
            assert_eq!(
                notes.contains("made a block at a time"),
                x.len() < y.len(),
                "{what}: {notes}"
            );
            assert_eq!(got.report.algorithm, Algorithm::Brute, "{what}");
            let want = oracle::join(x, y, Metric::Cosine, eps);
            assert_eq!(got.pairs().unwrap(), &want[..], "{what}: {notes}");
            // With `backend = gpu`, the same plan in the device's tiles (lavapipe).
            #[cfg(feature = "gpu")]
            {
                common::gpu_test_setup();
                let gpu = cosine(eps, Backend::Gpu, Algorithm::Auto);
                let got = engine().join(x, y, &gpu).unwrap();
                let notes = got.report.notes.join("; ");
                assert!(
                    notes.contains("blocked brute force") && notes.contains("on the GPU: "),
                    "{what}: {notes}"
                );
                assert_eq!(got.pairs().unwrap(), &want[..], "{what} GPU: {notes}");
            }
        }
    }
    #[cfg(feature = "gpu")]
    common::assert_no_validation_errors();
}

/// The grouped join's assignment and comparisons on the GPU (`gpu/grouped.rs`, lavapipe,
/// validation on):
/// the rule's set exactly, self-join and A ⋈ B, f32 and f64, pairs, counts and streams; a
/// result buffer of one tile's pairs forces many batches and, where candidates are dense,
/// parts run again after it fills (none lost); the notes prove the device ran the tiles
/// and the reruns happened.
#[cfg(feature = "gpu")]
#[test]
fn gpu_grouped_join_matches_the_rule() {
    common::gpu_test_setup();
    let mut rng = Rng(48);
    // `dense`: enough candidates a batch that one tile's pairs overflow (the near-duplicate
    // case has about 4 a tile: its batches of 64 tiles fit).
    for (dim, spread, eps, dense) in [
        (64usize, 0.08, 0.02, true),
        (40, 0.15, 0.05, true),
        (64, 0.08, 0.0005, false),
    ] {
        let x = directions(&mut rng, 5000, dim, 40, spread);
        let y = directions(&mut rng, 1500, dim, 40, spread);
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        for (a, b) in in_both_precisions(&x, &y, &x32, &y32, dim) {
            let what = format!("{dim}-D {:?} eps {eps}", a.precision());
            let want = oracle::self_join(&a, Metric::Cosine, eps);
            assert!(want.len() > 1000, "{what}: {} pairs", want.len());
            let want_ab = oracle::join(&a, &b, Metric::Cosine, eps);
            for capacity in [None, Some(1024)] {
                let mut o = cosine(eps, Backend::Gpu, Algorithm::Auto);
                o.result_buffer_pairs = capacity;
                let got = engine().self_join(&a, &o).unwrap();
                let notes = got.report.notes.join("; ");
                assert!(notes.contains("on the GPU: "), "{what}: {notes}");
                // The matrix units ran the tiles where the device has them (the device kit
                // sets SIMJOIN_EXPECT_MATRIX=1 where `simjoin info` says "f16 tiles: yes"
                // and SIMJOIN_GPU_MATRIX is not 0), f32 tiles elsewhere (lavapipe).
                let matrix = std::env::var("SIMJOIN_EXPECT_MATRIX").as_deref() == Ok("1");
                assert!(
                    notes.contains(if matrix {
                        "on the matrix units"
                    } else {
                        "of f32 products"
                    }),
                    "{what}: {notes}"
                );
                assert!(
                    notes.contains("leaders assigned on the GPU"),
                    "{what}: {notes}"
                );
                assert_eq!(got.report.backend, "gpu", "{what}");
                assert_eq!(
                    notes.contains("run again after a full result buffer"),
                    capacity == Some(1024) && dense,
                    "{what}: {notes}"
                );
                assert_eq!(got.pairs().unwrap(), &want[..], "{what} {capacity:?}");
                // The device flagged the candidates that pass unconfirmed (on the matrix
                // units the f16 slack leaves none at eps 0.0005: their bound passes 1).
                let (sure, all) = sure_of(&notes);
                assert!(sure <= all && (sure > 0 || matrix), "{what}: {notes}");
                let mut count = o.clone();
                count.output = OutputForm::Count;
                assert_eq!(
                    engine().self_join(&a, &count).unwrap().count(),
                    want.len() as u64,
                    "{what}"
                );
                let got_ab = engine().join(&a, &b, &o).unwrap();
                let notes_ab = got_ab.report.notes.join("; ");
                // (At eps 0.0005 A and B share no pair: the plan may decline.)
                assert!(
                    notes_ab.contains("on the GPU: ") || eps < 0.001,
                    "{what}: {notes_ab}"
                );
                assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "{what} A⋈B");
                // The larger side second: its sample picks the leaders.
                let got_ba = engine().join(&b, &a, &o).unwrap();
                let want_ba = oracle::join(&b, &a, Metric::Cosine, eps);
                assert_eq!(got_ba.pairs().unwrap(), &want_ba[..], "{what} B⋈A");
                let mut sink = simjoin::VecSink::default();
                engine().self_join_stream(&a, &o, &mut sink).unwrap();
                let mut streamed = sink.pairs;
                streamed.sort_unstable();
                assert_eq!(streamed, want, "{what} stream");
            }
        }
    }
    common::assert_no_validation_errors();
}

/// The CPU's cosine kNN of `data` (self, or of `query`) at each k of `ks` (each at most
/// `kmax`) equals the oracle's in indices and distance bits; `grouped(k)` says where the
/// notes must show the grouped index ran. Returns each run's notes.
fn knn_matches_oracle(
    data: &Dataset,
    query: Option<&Dataset>,
    kmax: usize,
    ks: &[usize],
    grouped: impl Fn(usize) -> bool,
) -> Vec<String> {
    // The k nearest are the prefix of the kmax nearest (one total order).
    let (idx, dist) = oracle::knn(data, query, kmax, Metric::Cosine);
    let mut all = Vec::new();
    for &k in ks {
        let what = format!(
            "{}-D {:?} k={k} ab={}",
            data.dim(),
            data.precision(),
            query.is_some()
        );
        let o = KnnOptions {
            metric: Metric::Cosine,
            backend: Backend::Cpu,
            ..Default::default()
        };
        let got = engine().knn(data, query, k, &o).unwrap();
        let notes = got.report.notes.join("; ");
        if grouped(k) {
            assert!(notes.contains("grouped leaders index"), "{what}: {notes}");
        }
        let rows = got.rows;
        let want_idx: Vec<u32> = (0..rows)
            .flat_map(|r| idx[r * kmax..r * kmax + k].iter().copied())
            .collect();
        let want_dist: Vec<f64> = (0..rows)
            .flat_map(|r| dist[r * kmax..r * kmax + k].iter().copied())
            .collect();
        assert_eq!(got.indices, want_idx, "{what}: indices");
        let d: Vec<f64> = (0..rows)
            .flat_map(|r| (0..k).map(move |c| (r, c)))
            .map(|(r, c)| got.distance(r, c))
            .collect();
        assert_eq!(d, want_dist, "{what}: distances");
        all.push(notes);
    }
    all
}

/// The kNN through the grouped leaders' index (`cpu/partition/`, clustered rows, enough
/// of them for grouping) equals the brute-force kNN under the rule exactly: self and
/// A ⋈ B, f32 and f64, k = 1, 10 and k larger than a cluster; exact duplicates, scalar
/// multiples (cosine 1 under the rule) and near-duplicates (a relative nudge of 1e-9, a
/// tie in f32 copies) among the rows, so the ranking rests on the rule and ties by index.
/// The notes prove the grouped path ran; uniform directions decline it.
#[test]
fn grouped_knn_matches_the_rule() {
    let mut rng = Rng(47);
    let n = 5000;
    let mut paths = [0usize; 2];
    // 48-D: clusters of about 200 rows and k = 300 beyond them; 32-D: groups of about 90
    // and k = 100 beyond them; 128-D: loose clusters (noise 0.6 of a centre's length), in
    // which every query is in reach of most groups and the queries of A ⋈ B take their
    // products with every leader in blocks (a self-kNN's lists, and k = 100, may find the
    // brute force cheaper).
    let loose = (128usize, 20usize, 0.6, 100usize);
    for (dim, centres, spread, kmax) in
        [(48usize, 25usize, 0.1, 300usize), (32, 20, 0.2, 100), loose]
    {
        // The queries (the last 300 rows: more than `cosine::SMALL_QUERIES`, which meet
        // every row) around the same centres as the data.
        let mut x = directions(&mut rng, n + 300, dim, centres, spread);
        for i in (13..n + 300).step_by(13) {
            let j = (rng.next() as usize) % i;
            for c in 0..dim {
                x[i * dim + c] = x[j * dim + c] * (1.0 + 1e-9 * rng.normal());
            }
        }
        let q = x.split_off(n * dim);
        let (x32, q32) = (as_f32(&x), as_f32(&q));
        let ks = [1usize, 10, kmax];
        for (data, query) in [
            (
                Dataset::from_f64(&x, dim).unwrap(),
                Dataset::from_f64(&q, dim).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, dim).unwrap(),
                Dataset::from_f32(&q32, dim).unwrap(),
            ),
        ] {
            for query in [None, Some(&query)] {
                // k beyond a cluster in 48-D (300 of 5,000 rows): the probe may find the
                // brute force cheaper; the answer must be the same either way.
                let must = |k: usize| dim != 128 && (k <= 10 || dim == 32);
                let notes = knn_matches_oracle(&data, query, kmax, &ks, must);
                for n in notes.iter().filter(|n| n.contains("grouped leaders index")) {
                    // Queries' products with every leader taken in blocks, or one at a time.
                    paths[n.contains("every leader's in blocks") as usize] += 1;
                }
            }
        }
    }
    assert!(
        paths[0] > 0 && paths[1] > 0,
        "both ways to the leaders: {paths:?}"
    );
    // Uniform directions: no clusters, the grouped index declines (the Euclidean path runs).
    let x = directions(&mut rng, n, 24, 40, 5.0);
    let data = Dataset::from_f64(&x, 24).unwrap();
    let o = KnnOptions {
        metric: Metric::Cosine,
        backend: Backend::Cpu,
        ..Default::default()
    };
    let got = engine().knn(&data, None, 5, &o).unwrap();
    let notes = got.report.notes.join("; ");
    assert!(!notes.contains("grouped leaders index"), "{notes}");
    assert!(notes.contains("grouped leaders' index declined"), "{notes}");
    assert!(notes.contains("Euclidean kNN"), "{notes}");
}

/// Fewer queries than `cosine::SMALL_QUERIES` (256) meet every row (`knn_brute`) and get
/// the oracle's indices and distance bits: 200 queries against 5,000 clustered 384-D rows
/// (eight tasks of rows, which share each query's k-th distance and merge their nearest),
/// f32 and f64, k = 1, 10, 300 and every row, with exact copies, scalar multiples and
/// relative nudges of 1e-9 among the rows and queries (ties that the rule and the index
/// decide); a self-kNN of 200 rows. The notes prove that path ran. The same queries' join
/// with the rows, either side first (`Plan::brute`'s blocks met in parts that stay in the
/// cache), gives the oracle's pairs.
#[test]
fn few_queries_knn_meets_every_row() {
    let mut rng = Rng(53);
    let (n, m, dim) = (5000usize, 200usize, 384usize);
    let mut x = directions(&mut rng, n + m, dim, 25, 0.1);
    for i in (13..n + m).step_by(13) {
        let j = (rng.next() as usize) % i;
        for c in 0..dim {
            x[i * dim + c] = x[j * dim + c] * (1.0 + 1e-9 * rng.normal());
        }
    }
    // Every 5th query an exact copy of a row, every 9th a row's double.
    for r in (0..m).filter(|r| r % 5 == 0 || r % 9 == 0) {
        let j = (rng.next() as usize) % n;
        let f = if r % 5 == 0 { 1.0 } else { 2.0 };
        for c in 0..dim {
            x[(n + r) * dim + c] = x[j * dim + c] * f;
        }
    }
    let q = x.split_off(n * dim);
    let brute = |notes: Vec<String>| {
        for n in notes {
            assert!(n.contains("meet every one"), "{n}");
        }
    };
    common::each_precision_pair(&x, &q, dim, |data, query| {
        brute(knn_matches_oracle(
            data,
            Some(query),
            n,
            &[1, 10, 300, n],
            |_| false,
        ));
        let o = cosine(0.05, Backend::Cpu, Algorithm::Auto);
        for (a, b) in [(data, query), (query, data)] {
            let want = oracle::join(a, b, Metric::Cosine, 0.05);
            assert!(want.len() > 1000, "{} pairs", want.len());
            let got = engine().join(a, b, &o).unwrap();
            assert_eq!(got.report.algorithm, Algorithm::Brute);
            assert_eq!(got.pairs().unwrap(), &want[..]);
        }
    });
    let few = &x[..m * dim];
    common::each_precision_pair(few, few, dim, |data, _| {
        brute(knn_matches_oracle(
            data,
            None,
            m - 1,
            &[1, 10, m - 1],
            |_| false,
        ));
    });
}

/// The kNN that meets every row completes a block of products past its first quarter of
/// coordinates only where the norms of the rest leave a row within reach of the query's
/// k-th distance (`partition::Bounded`), known from the start from the rows nearest by
/// their first coordinates (`cosine::seed_caps`). Exact where both mislead: 8 queries in
/// no cluster, each with 30 decoys (its first coordinates, the rest pointing away: the
/// nearest by the seed's coordinates, far by the rule) and 8 hidden neighbours (zero first
/// coordinates, the query's rest: found only through the rest; each second one an exact
/// copy of the one before, a tie by index); the other queries in tight clusters, where most
/// blocks are never completed. A ⋈ B and a self-kNN, f32 and f64, k = 1 to 300.
#[test]
fn bounded_brute_knn_is_exact_where_first_coordinates_mislead() {
    let mut rng = Rng(61);
    let (dim, pre, n, m) = (384usize, 96usize, 4000usize, 120usize);
    let mut x = directions(&mut rng, n + m, dim, 40, 0.1);
    let mut q = x.split_off(n * dim);
    let mut at = 0;
    for r in (0..m).step_by(15) {
        let v: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
        q[r * dim..(r + 1) * dim].copy_from_slice(&v);
        for t in 0..38 {
            at += 1;
            if t >= 30 && t % 2 == 1 {
                // An exact copy of the hidden neighbour before it.
                x.copy_within((at - 2) * dim..(at - 1) * dim, (at - 1) * dim);
                continue;
            }
            let row = &mut x[(at - 1) * dim..at * dim];
            for c in 0..dim {
                let e = 0.02 * rng.normal();
                row[c] = match (t < 30, c < pre) {
                    (true, true) => v[c] * (1.0 + e),
                    (true, false) => -v[c] + e,
                    (false, true) => 0.0,
                    (false, false) => v[c] + e,
                };
            }
        }
    }
    let brute = |notes: &[String], pruned: bool| {
        for n in notes {
            assert!(n.contains("meet every one"), "{n}");
        }
        if pruned {
            // k = 10: "f32 products in blocks, P% of them completed past ...".
            let share: f64 = notes[1]
                .split("blocks, ")
                .nth(1)
                .and_then(|t| t.split('%').next())
                .and_then(|p| p.parse().ok())
                .expect("the share completed");
            assert!(
                share < 50.0,
                "{share}% of the blocks completed: {}",
                notes[1]
            );
        }
    };
    common::each_precision_pair(&x, &q, dim, |data, query| {
        let notes = knn_matches_oracle(data, Some(query), 300, &[1, 10, 30, 300], |_| false);
        brute(&notes, true);
    });
    let mut few = q.clone();
    few.extend_from_slice(&x[..130 * dim]);
    common::each_precision_pair(&few, &few, dim, |data, _| {
        let notes = knn_matches_oracle(data, None, 100, &[1, 10, 100], |_| false);
        brute(&notes, false);
    });
}

/// Queries beyond `SMALL_SIDE` but fewer than the leaders the collection's sample
/// picks (`partition::LEADERS_PER_QUERY`) meet every row too: 300 queries against 12,000
/// vectors in 2,000 tight clusters (a few thousand leaders) take the blocked brute force;
/// 300 queries against 12,000 in 40 clusters are grouped. The oracle's pairs either way.
/// The same queries' kNN likewise (`KNN_QUERIES_PER_LEADER`): every row met where the
/// sample's leaders number more than half of them, grouped where far fewer, the oracle's
/// neighbours and distances either way.
#[test]
fn queries_fewer_than_the_leaders_meet_every_row() {
    let mut rng = Rng(61);
    let (n, m, dim, eps) = (12_000usize, 300usize, 32usize, 0.05);
    for (centres, brute) in [(2000usize, true), (40, false)] {
        let mut x = directions(&mut rng, n + m, dim, centres, 0.01);
        let q = x.split_off(n * dim);
        let (data, query) = (
            Dataset::from_f64(&x, dim).unwrap(),
            Dataset::from_f64(&q, dim).unwrap(),
        );
        let want = oracle::join(&query, &data, Metric::Cosine, eps);
        let got = engine()
            .join(&query, &data, &cosine(eps, Backend::Cpu, Algorithm::Auto))
            .unwrap();
        let notes = got.report.notes.join("; ");
        assert_eq!(
            notes.contains("blocked brute force"),
            brute,
            "{centres} centres: {notes}"
        );
        assert_eq!(
            got.pairs().unwrap(),
            &want[..],
            "{centres} centres: {notes}"
        );
        let notes = knn_matches_oracle(&data, Some(&query), 10, &[1, 10], |_| !brute);
        for note in notes {
            assert_eq!(
                note.contains("of the rows' sample lead"),
                brute,
                "{centres} centres: {note}"
            );
        }
    }
}

/// Vectors with no clusters at a wide eps (uniform 64-D directions, cosine distance 0.6,
/// about a tenth of a percent of pairs within it): the sample still finds "leaders", but
/// their groups are within reach of each other and would compare nearly every pair
/// through groups of a few vectors (162 s against the general join's 5.5 at 97,500
/// vectors). The plan declines for the self-join and for 1,000 queries (`kept_share`,
/// `early_share`); both give the oracle's pairs.
#[test]
fn groups_that_cannot_prune_are_declined() {
    let mut rng = Rng(67);
    let (n, m, dim, eps) = (5000usize, 1000usize, 64usize, 0.6);
    let mut x = directions(&mut rng, n + m, dim, 1, 100.0);
    let q = x.split_off(n * dim);
    let (data, query) = (
        Dataset::from_f64(&x, dim).unwrap(),
        Dataset::from_f64(&q, dim).unwrap(),
    );
    let o = cosine(eps, Backend::Cpu, Algorithm::Auto);
    let want = oracle::self_join(&data, Metric::Cosine, eps);
    assert!(want.len() > n, "{} pairs", want.len());
    let got = engine().self_join(&data, &o).unwrap();
    let notes = got.report.notes.join("; ");
    assert!(!notes.contains("groups around leaders"), "{notes}");
    assert_eq!(got.pairs().unwrap(), &want[..], "{notes}");
    let want = oracle::join(&query, &data, Metric::Cosine, eps);
    let got = engine().join(&query, &data, &o).unwrap();
    let notes = got.report.notes.join("; ");
    assert!(!notes.contains("groups around leaders"), "{notes}");
    assert_eq!(got.pairs().unwrap(), &want[..], "{notes}");
}

/// The grouped join's batches on the GPU are sized so that the first ones cannot fill the
/// result buffer (a full tile's pairs each, before any batch came back) and the later ones
/// by the pairs a tile has found: on dense candidates with a buffer of 32 full tiles'
/// pairs (the smallest batch), nothing runs again. Sized by the candidates so far alone,
/// the first batches overflowed (the H200's 1M run of 2026-11-28 ran 6 parts again).
#[cfg(feature = "gpu")]
#[test]
fn gpu_grouped_batches_fit_their_result_buffer() {
    common::gpu_test_setup();
    let mut rng = Rng(48);
    let x = directions(&mut rng, 5000, 64, 40, 0.08);
    let a = Dataset::from_f64(&x, 64).unwrap();
    let mut o = cosine(0.02, Backend::Gpu, Algorithm::Auto);
    o.result_buffer_pairs = Some(32 * 1024);
    let got = engine().self_join(&a, &o).unwrap();
    let notes = got.report.notes.join("; ");
    eprintln!("{notes}");
    assert!(notes.contains("on the GPU: "), "{notes}");
    assert!(!notes.contains("run again"), "{notes}");
    assert_eq!(
        got.pairs().unwrap(),
        &oracle::self_join(&a, Metric::Cosine, 0.02)[..]
    );
}

/// The device's assignment of leaders (glsl/nearest_leaders.comp, in dispatches of many
/// rows against a share of the leaders, each keeping the earlier shares' best) picks the
/// leader the CPU's does where the data are tight clusters (every vector far nearer one
/// leader than any other): the GPU's plan is the CPU's, to the vector pair. 9,000 vectors
/// and about 1,400 leaders at 64-D make eleven shares of leaders and three of rows a
/// dispatch on lavapipe (4,096 rows against 128 leaders, tiles of 64 x 64), so a lost or
/// misplaced best shows as other groups. 40,000 vectors in 2,000 clusters: the leaders'
/// sample (every eighth vector) misses about a tenth of the clusters, and their vectors
/// get leaders of their own in a further round, assigned on the device too.
#[cfg(feature = "gpu")]
#[test]
fn gpu_assignment_of_leaders_is_the_cpus() {
    common::gpu_test_setup();
    let mut rng = Rng(49);
    for (n, dim, centres, least) in [(9000, 64, 1400, 8 * 128), (40_000, 32, 2000, 1990)] {
        let x = directions(&mut rng, n, dim, centres, 0.01);
        let a = Dataset::from_f64(&x, dim).unwrap();
        let plan_note = |backend| {
            let got = engine()
                .self_join(&a, &cosine(0.05, backend, Algorithm::Auto))
                .unwrap();
            let notes = got.report.notes.join("; ");
            // "cosine: K groups around leaders (radius R); P of T pairs of groups compared,
            // V vector pairs".
            let at = notes.find("cosine: ").zip(notes.find(" vector pairs"));
            let plan = match at {
                Some((from, to)) if notes[from..].contains("groups around leaders") => {
                    notes[from..to].to_string()
                }
                _ => panic!("no grouped plan: {notes}"),
            };
            (plan, notes, got.count())
        };
        let (cpu, _, n_cpu) = plan_note(Backend::Cpu);
        let (gpu, notes, n_gpu) = plan_note(Backend::Gpu);
        eprintln!("{n} x {dim}: {gpu}");
        assert!(notes.contains("leaders assigned on the GPU"), "{notes}");
        let leaders: usize = cpu.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(leaders >= least, "{cpu}");
        assert_eq!(gpu, cpu);
        assert_eq!(n_gpu, n_cpu);
    }
}

/// `n` vectors spanning only `rank` directions of `dim`-D (no noise), random norms, every
/// 7th a duplicate and every 13th a power-of-two multiple of an earlier one.
fn low_rank(rng: &mut Rng, n: usize, dim: usize, rank: usize) -> Vec<f64> {
    let w: Vec<f64> = (0..rank * dim).map(|_| rng.normal()).collect();
    let mut x = Vec::with_capacity(n * dim);
    for i in 0..n {
        if i > 0 && (i % 7 == 0 || i % 13 == 0) {
            let j = (rng.next() as usize) % i;
            let f = if i % 7 == 0 { 1.0 } else { 4.0 };
            for k in 0..dim {
                let v = x[j * dim + k] * f;
                x.push(v);
            }
            continue;
        }
        let g: Vec<f64> = (0..rank)
            .map(|_| rng.normal() * (0.1 + 3.0 * rng.unit()))
            .collect();
        x.extend((0..dim).map(|k| (0..rank).map(|r| g[r] * w[r * dim + k]).sum::<f64>()));
    }
    x
}

/// Vectors near a low-dimensional subspace go through the principal-directions filter
/// (`src/projection.rs`): the rule's set exactly in every output form, self-join and
/// A ⋈ B, f32 and f64, with eps set to pairs' exact distances (the bound is tight on
/// such data: without its margins, pairs at eps were lost); clustered data keep the
/// grouped index.
#[test]
fn projected_join_on_low_rank_vectors_matches_the_rule() {
    let mut rng = Rng(61);
    for (dim, rank) in [(48usize, 4usize), (96, 6)] {
        // A and B in the same subspace.
        let xy = low_rank(&mut rng, 7000, dim, rank);
        let (x, y) = xy.split_at(4500 * dim);
        let (x32, y32) = (as_f32(x), as_f32(y));
        for (a, b) in [
            (
                Dataset::from_f64(x, dim).unwrap(),
                Dataset::from_f64(y, dim).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, dim).unwrap(),
                Dataset::from_f32(&y32, dim).unwrap(),
            ),
        ] {
            // Eps at the exact distance of a row's nearest non-duplicate, for a few rows.
            let mut epss = vec![];
            for i in [1usize, 2] {
                let near = (0..a.len())
                    .filter(|&j| j != i)
                    .map(|j| {
                        simjoin::metric::distance_acc(Metric::Cosine, &row(&a, i), &row(&a, j))
                    })
                    .filter(|&d| d > 1e-6)
                    .fold(f64::INFINITY, f64::min);
                epss.push(near * 4.0);
                epss.push(near);
            }
            for eps in epss {
                let what = format!("{dim}-D rank {rank} {:?} eps {eps}", a.precision());
                let want = oracle::self_join(&a, Metric::Cosine, eps);
                let got = engine()
                    .self_join(&a, &cosine(eps, Backend::Cpu, Algorithm::Auto))
                    .unwrap();
                let notes = got.report.notes.join("; ");
                assert!(notes.contains("principal directions"), "{what}: {notes}");
                assert_eq!(got.pairs().unwrap(), &want[..], "{what}: {notes}");
                let want_ab = oracle::join(&a, &b, Metric::Cosine, eps);
                assert!(!want_ab.is_empty(), "{what}");
                let got_ab = engine()
                    .join(&a, &b, &cosine(eps, Backend::Cpu, Algorithm::Auto))
                    .unwrap();
                let notes = got_ab.report.notes.join("; ");
                assert!(notes.contains("principal directions"), "{what}: {notes}");
                assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "{what} A⋈B");
            }
            check_all(&a, &b, 0.002, Backend::Cpu, Algorithm::Auto);
        }
    }
}

/// Loose clusters (noise of 0.45 of a centre's length: in 96-D a member is about 0.55
/// from the rest of its cluster, other clusters about 1.4 away; the mean is about 0.4 from
/// its members): the grouped kNN index bounds around each group's mean, where a bound that
/// took the mean for a unit vector (|q - c|^2 read as 2 - 2 q.c) was wrong by about 0.2
/// and lost neighbours (this test found it). Self and A ⋈ B, f32 and f64, k = 1, 10 and beyond
/// a cluster; duplicates and multiples among the rows.
#[test]
fn grouped_knn_on_loose_clusters_is_exact() {
    let mut rng = Rng(53);
    let (n, dim, kmax) = (6000, 96, 150);
    let mut x = directions(&mut rng, n + 300, dim, 60, 0.45);
    let q = x.split_off(n * dim);
    common::each_precision_pair(&x, &q, dim, |data, query| {
        for query in [None, Some(query)] {
            knn_matches_oracle(data, query, kmax, &[1, 10, kmax], |k| k <= 10);
        }
    });
}

/// More clusters than the kNN's leaders could number before (16 sqrt(n): the index
/// declined, and 1M vectors around 30,000 centres ran the brute force for over 20 min):
/// here 40,000 48-D rows around 2,200 centres, and 300 rows in random directions of their
/// own (`partition`'s `many_clusters_lead_a_knn` covers the cap).
/// Over 2,048 groups, each group's list of nearest groups is cut short (`NearGroups`), so
/// a query walks its list and measures the pivots past it only where the list's end does
/// not rule them out (the scattered rows, whose own groups hold fewer than k others, and k
/// beyond a cluster); the notes prove both ran. Self-kNN against the oracle exactly, f32
/// and f64, k = 1, 10 and 40; duplicates and multiples among the rows.
#[test]
fn grouped_knn_with_more_clusters_than_its_lists_is_exact() {
    let mut rng = Rng(83);
    let (dim, kmax) = (48usize, 40usize);
    let mut x = directions(&mut rng, 40_000, dim, 2_200, 0.05);
    x.extend(directions(&mut rng, 300, dim, 300, 0.0));
    let (x32, n) = (as_f32(&x), x.len() / dim);
    let mut past = 0usize;
    for data in [
        Dataset::from_f64(&x, dim).unwrap(),
        Dataset::from_f32(&x32, dim).unwrap(),
    ] {
        let notes = knn_matches_oracle(&data, None, kmax, &[1, 10, kmax], |k| k <= 10);
        // (k = 40, past a cluster, reaches across the space: the probe may decline.)
        for notes in notes.iter().filter(|n| n.contains("grouped leaders index")) {
            let groups: usize = between(notes, "grouped leaders index, ", " groups");
            assert!(groups > 2048 && groups < n / 2, "{notes}");
            let each: usize = between(notes, "each group's nearest ", " groups");
            assert!(each < groups - 1, "lists cut short: {notes}");
            past += between::<usize>(notes, "first, ", " queries");
        }
    }
    assert!(
        past > 0,
        "some queries measured the pivots past their lists"
    );
}

/// The number in `s` between `before` and the next `after`.
fn between<T: std::str::FromStr>(s: &str, before: &str, after: &str) -> T {
    let rest = &s[s
        .find(before)
        .unwrap_or_else(|| panic!("{before:?} in {s}"))
        + before.len()..];
    let end = rest
        .find(after)
        .unwrap_or_else(|| panic!("{after:?} in {rest}"));
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("a number in {:?}", &rest[..end]))
}

/// `n` vectors shaped like sentence embeddings (`bench/embed_bench.py`'s `topics`): a
/// common mean direction, a decaying spectrum (the variance of coordinate i about 1/i),
/// `count` topics of `sub` subtopics each `spread` from its topic, and each vector's own
/// noise log-uniform over 4x; every 50th a near-duplicate of an earlier vector.
fn topics(rng: &mut Rng, n: usize, dim: usize, count: usize, sub: usize, spread: f64) -> Vec<f64> {
    let scale: Vec<f64> = (1..=dim).map(|i| 1.0 / (i as f64).sqrt()).collect();
    let draw = |rng: &mut Rng, s: f64| -> Vec<f64> {
        scale.iter().map(|&c| rng.normal() * s * c).collect()
    };
    let unit = |v: Vec<f64>| -> Vec<f64> {
        let len = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        v.into_iter().map(|a| a / len).collect()
    };
    let mean = unit(draw(rng, 1.0));
    let mut subtopics = Vec::with_capacity(count * sub);
    for _ in 0..count {
        let t = unit(draw(rng, 1.0));
        for _ in 0..sub {
            let d = draw(rng, spread);
            subtopics.push(unit(t.iter().zip(&d).map(|(a, b)| a + b).collect()));
        }
    }
    let mut x: Vec<f64> = Vec::with_capacity(n * dim);
    for i in 0..n {
        if i > 0 && i % 50 == 0 {
            let j = (rng.next() as usize) % i;
            let d = draw(rng, 0.01);
            for c in 0..dim {
                x.push(x[j * dim + c] + d[c]);
            }
            continue;
        }
        let st = &subtopics[(rng.next() as usize) % subtopics.len()];
        let sigma = (0.05f64.ln() + rng.unit() * 4f64.ln()).exp();
        let d = draw(rng, sigma);
        x.extend((0..dim).map(|c| 0.5 * mean[c] + st[c] + d[c]));
    }
    x
}

/// Topic-shaped vectors in more groups than subtopics (about 200 groups for 40 subtopics:
/// each subtopic cut into several): a query's nearest neighbours lie in the next groups,
/// near their bounds, so a bound that claims a little too much loses them. The kNN through
/// the grouped index equals the oracle's exactly: self and A ⋈ B, f32 and f64. Mutations
/// that the two tests above let pass fail here: the pivots' squared norms read as 1, and
/// every member's distance from its pivot (so each group's radius) shrunk by 20%.
#[test]
fn grouped_knn_with_neighbours_at_the_groups_bounds_is_exact() {
    let mut rng = Rng(71);
    let (n, dim, kmax) = (6000, 64, 40);
    let mut x = topics(&mut rng, n + 300, dim, 10, 4, 0.15);
    let q = x.split_off(n * dim);
    common::each_precision_pair(&x, &q, dim, |data, query| {
        for query in [None, Some(query)] {
            knn_matches_oracle(data, query, kmax, &[1, 10, kmax], |k| k <= 10);
        }
    });
}

/// The cosine kNN of vectors near a low-dimensional subspace takes its candidates from a
/// Euclidean kNN of their projections (`Projection::apart` bounds every other row): the
/// brute-force kNN under the rule exactly, self and A ⋈ B, f32 and f64, k = 1, 10 and 40,
/// with exact duplicates and multiples (distance-0 ties, decided by index) among the rows.
/// (Its 80-D f32 self-kNN found the last join's eps rounded down to f32 losing rows tied
/// at a k-th distance.)
#[test]
fn projected_knn_on_low_rank_vectors_matches_the_rule() {
    let mut rng = Rng(63);
    for (dim, rank) in [(48usize, 4usize), (80, 7)] {
        let xq = low_rank(&mut rng, 5300, dim, rank);
        let (x, q) = xq.split_at(5000 * dim);
        let (x32, q32) = (as_f32(x), as_f32(q));
        for (data, query) in [
            (
                Dataset::from_f64(x, dim).unwrap(),
                Dataset::from_f64(q, dim).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, dim).unwrap(),
                Dataset::from_f32(&q32, dim).unwrap(),
            ),
        ] {
            for query in [None, Some(&query)] {
                for k in [1usize, 10, 40] {
                    let notes = check_knn(&data, query, k, Backend::Cpu);
                    assert!(notes.contains("principal directions"), "k={k}: {notes}");
                }
            }
        }
    }
}

/// The same filter with the projections' Euclidean join on the GPU (lavapipe, validation
/// on): the rule's set, self-join and A ⋈ B.
#[cfg(feature = "gpu")]
#[test]
fn gpu_projected_join_matches_the_rule() {
    common::gpu_test_setup();
    let mut rng = Rng(62);
    let (dim, rank) = (64usize, 5usize);
    let xy = as_f32(&low_rank(&mut rng, 9200, dim, rank));
    let (x, y) = xy.split_at(5000 * dim);
    let (a, b) = (
        Dataset::from_f32(x, dim).unwrap(),
        Dataset::from_f32(y, dim).unwrap(),
    );
    for eps in [0.001, 0.005] {
        let o = cosine(eps, Backend::Gpu, Algorithm::Auto);
        let want = oracle::self_join(&a, Metric::Cosine, eps);
        assert!(want.len() > 1000, "eps {eps}: {} pairs", want.len());
        let got = engine().self_join(&a, &o).unwrap();
        let notes = got.report.notes.join("; ");
        assert!(notes.contains("principal directions"), "{notes}");
        assert_eq!(got.report.backend, "vulkan", "{notes}");
        assert_eq!(got.pairs().unwrap(), &want[..], "eps {eps}");
        let want_ab = oracle::join(&a, &b, Metric::Cosine, eps);
        let got_ab = engine().join(&a, &b, &o).unwrap();
        assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "eps {eps} A⋈B");
    }
}
