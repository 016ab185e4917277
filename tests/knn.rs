//! The exact kNN join on the CPU backend against the brute-force oracle (`simjoin::oracle::knn`):
//! indices and distances equal, on uniform, clustered, duplicate and lattice data (ties at
//! the k-th place), 1-D to 64-D, every metric, f32 and f64, self and A-to-B, k from 1 to
//! n - 1; and the errors.

mod common;

use common::Rng;
use simjoin::{Algorithm, Backend, Dataset, Distances, Engine, ErrorKind, KnnOptions, Metric};

const METRICS: [Metric; 3] = [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev];

fn opts(metric: Metric, algorithm: Algorithm) -> KnnOptions {
    KnnOptions {
        metric,
        backend: Backend::Cpu,
        algorithm,
        ..Default::default()
    }
}

fn distances(r: &simjoin::KnnResult) -> Vec<f64> {
    match &r.distances {
        Distances::F32(d) => d.iter().map(|&x| x as f64).collect(),
        Distances::F64(d) => d.clone(),
    }
}

/// Runs every CPU algorithm on (data, query) and checks each against the oracle.
fn check(engine: &Engine, data: &Dataset, query: Option<&Dataset>, k: usize, what: &str) {
    for metric in METRICS {
        let (want_i, want_d) = simjoin::oracle::knn(data, query, k, metric);
        for algorithm in [
            Algorithm::Auto,
            Algorithm::KdTree,
            Algorithm::Grid,
            Algorithm::Brute,
        ] {
            let r = engine
                .knn(data, query, k, &opts(metric, algorithm))
                .unwrap_or_else(|e| panic!("{what} {metric} {algorithm}: {e}"));
            assert_eq!(r.rows, query.map_or(data.len(), |q| q.len()));
            assert_eq!(r.k, k);
            assert_eq!(r.indices, want_i, "{what} {metric} {algorithm}: indices");
            assert_eq!(
                distances(&r),
                want_d,
                "{what} {metric} {algorithm}: distances"
            );
        }
    }
}

fn uniform(rng: &mut Rng, n: usize, dim: usize) -> Vec<f64> {
    (0..n * dim).map(|_| rng.unit()).collect()
}

fn clustered(rng: &mut Rng, n: usize, dim: usize) -> Vec<f64> {
    let centers: Vec<f64> = (0..4 * dim).map(|_| rng.unit() * 10.0).collect();
    let mut v = Vec::with_capacity(n * dim);
    for i in 0..n {
        let c = i % 4;
        for d in 0..dim {
            v.push(centers[c * dim + d] + 0.05 * rng.normal());
        }
    }
    v
}

#[test]
fn uniform_and_clustered_1d_to_64d_both_precisions() {
    let engine = Engine::new();
    let mut rng = Rng(7);
    for dim in [1, 2, 3, 5, 8, 16, 33, 64] {
        let n = 300;
        for (name, pts) in [
            ("uniform", uniform(&mut rng, n, dim)),
            ("clustered", clustered(&mut rng, n, dim)),
        ] {
            let d64 = Dataset::from_f64(&pts, dim).unwrap();
            check(&engine, &d64, None, 7, &format!("{name} {dim}-D f64"));
            let p32: Vec<f32> = pts.iter().map(|&x| x as f32).collect();
            let d32 = Dataset::from_f32(&p32, dim).unwrap();
            check(&engine, &d32, None, 7, &format!("{name} {dim}-D f32"));
        }
    }
}

#[test]
fn lattice_ties_and_duplicates() {
    let engine = Engine::new();
    // A 2-D integer lattice: every inner point has 4 neighbours at exactly 1, 4 at sqrt 2:
    // k = 3 and 6 cut through groups of equal distances (ties by smaller index).
    let mut lattice = Vec::new();
    for x in 0..12 {
        for y in 0..12 {
            lattice.extend([x as f32, y as f32]);
        }
    }
    let d = Dataset::from_f32(&lattice, 2).unwrap();
    for k in [1, 3, 4, 6, 9, 143] {
        check(&engine, &d, None, k, &format!("lattice k={k}"));
    }
    // Heavy duplicates: 50 copies of 5 points, 3-D.
    let mut dup = Vec::new();
    for i in 0..250 {
        let p = i % 5;
        dup.extend([p as f64 * 0.25, 1.0, -(p as f64)]);
    }
    let d = Dataset::from_f64(&dup, 3).unwrap();
    for k in [1, 48, 49, 50, 120, 249] {
        check(&engine, &d, None, k, &format!("duplicates k={k}"));
    }
    // Every point identical.
    let same = vec![0.5f32; 40 * 4];
    let d = Dataset::from_f32(&same, 4).unwrap();
    check(&engine, &d, None, 39, "identical");
}

/// Large classes of exact copies (more than 64 rows: the kNN of the distinct rows,
/// expanded, `knn::Copies`): 100 copies of one point and 50 of each of two others at the
/// same distance from it, interleaved by index, among integer lattice points (ties at
/// every distance) and uniform ones; queries that copy data rows. Every metric and CPU
/// algorithm against the oracle, f32 and f64, self and A-to-B, k = 1 to 90, 2-D and 9-D.
#[test]
fn large_classes_of_copies() {
    let engine = Engine::new();
    let mut rng = Rng(29);
    for dim in [2usize, 9] {
        let (n, nq) = (500, 60);
        let mut x: Vec<f64> = Vec::with_capacity((n + nq) * dim);
        for i in 0..n + nq {
            let one = |c: usize| (0..dim).map(move |d| if d == c { 1.0 } else { 0.0 });
            match i % 5 {
                0 => x.extend(std::iter::repeat_n(0.0, dim)),
                1 => x.extend(one(i / 5 % 2)),
                2 => x.extend((0..dim).map(|_| (rng.unit() * 6.0).floor() - 3.0)),
                _ => x.extend((0..dim).map(|_| rng.unit() * 4.0 - 2.0)),
            }
        }
        let q = x.split_off(n * dim);
        common::each_precision_pair(&x, &q, dim, |data, query| {
            for k in [1usize, 5, 30, 90] {
                for query in [None, Some(query)] {
                    let what = format!("copies {dim}-D k={k} ab={}", query.is_some());
                    check(&engine, data, query, k, &what);
                    let r = engine
                        .knn(data, query, k, &opts(Metric::Euclidean, Algorithm::Auto))
                        .unwrap();
                    let notes = r.report.notes.join("; ");
                    assert!(notes.contains("distinct"), "{what}: {notes}");
                }
            }
        });
    }
}

#[test]
fn a_to_b_and_large_k() {
    let engine = Engine::new();
    let mut rng = Rng(11);
    for dim in [2, 3, 12] {
        let a = uniform(&mut rng, 700, dim);
        let b = clustered(&mut rng, 90, dim);
        let da = Dataset::from_f64(&a, dim).unwrap();
        let db = Dataset::from_f64(&b, dim).unwrap();
        check(&engine, &da, Some(&db), 5, &format!("A-to-B {dim}-D"));
        check(&engine, &da, Some(&db), 700, &format!("A-to-B {dim}-D k=n"));
        check(&engine, &db, Some(&da), 90, &format!("B-to-A {dim}-D k=n"));
    }
    // Large k: 3000 points, k = 2500.
    let pts = uniform(&mut rng, 3000, 3);
    let d = Dataset::from_f64(&pts, 3).unwrap();
    let (want, _) = simjoin::oracle::knn(&d, None, 2500, Metric::Euclidean);
    let r = engine
        .knn(&d, None, 2500, &opts(Metric::Euclidean, Algorithm::Auto))
        .unwrap();
    assert_eq!(r.indices, want);
}

#[test]
fn tiny_inputs_and_errors() {
    let engine = Engine::new();
    let o = opts(Metric::Euclidean, Algorithm::Auto);
    // n = 0: an empty answer.
    let empty = Dataset::from_f32(&[], 3).unwrap();
    let r = engine.knn(&empty, None, 1, &o).unwrap();
    assert_eq!((r.rows, r.indices.len()), (0, 0));
    // n = 1: a self-kNN has no candidate.
    let one = Dataset::from_f32(&[1.0, 2.0, 3.0], 3).unwrap();
    let e = engine.knn(&one, None, 1, &o).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("larger than"), "{e}");
    // n = 2: each is the other's neighbour.
    let two = Dataset::from_f32(&[0.0, 0.0, 0.0, 3.0, 4.0, 0.0], 3).unwrap();
    let r = engine.knn(&two, None, 1, &o).unwrap();
    assert_eq!(r.indices, vec![1, 0]);
    assert_eq!(distances(&r), vec![5.0, 5.0]);
    // k = 0, k > n, mismatched dimensions and precision, an eps-join algorithm.
    assert!(engine.knn(&two, None, 0, &o).is_err());
    assert!(engine.knn(&two, Some(&one), 3, &o).is_err());
    let q2 = Dataset::from_f32(&[0.0, 0.0], 2).unwrap();
    assert!(engine.knn(&two, Some(&q2), 1, &o).is_err());
    let q64 = Dataset::from_f64(&[0.0, 0.0, 0.0], 3).unwrap();
    assert!(engine.knn(&two, Some(&q64), 1, &o).is_err());
    let ego = opts(Metric::Euclidean, Algorithm::Ego);
    assert!(engine.knn(&two, None, 1, &ego).is_err());
    // Empty queries against data: an empty answer.
    let r = engine.knn(&two, Some(&empty), 2, &o).unwrap();
    assert_eq!(r.rows, 0);
}

#[test]
fn subnormal_differences_are_not_pruned() {
    // Differences whose squares underflow in f32: accumulators are exactly 0 for points
    // that differ, so ties at 0 must go by index, whatever the tree's bounds say.
    let engine = Engine::new();
    let mut pts = Vec::new();
    for i in 0..200 {
        pts.extend([1e-30f32 * (i % 7) as f32, 1e-30 * (i % 3) as f32]);
    }
    let d = Dataset::from_f32(&pts, 2).unwrap();
    check(&engine, &d, None, 30, "subnormal");
}

#[test]
fn high_dim_ties_duplicates_and_huge_norms() {
    // 12-D and 40-D small-integer points: many exact ties and duplicates, on the filtered
    // (dot-product) path; then coordinates too large for the f32 filter (plain k-d tree).
    let engine = Engine::new();
    let mut rng = Rng(5);
    for dim in [12, 40] {
        let pts: Vec<f32> = (0..500 * dim).map(|_| (rng.next() % 3) as f32).collect();
        let d = Dataset::from_f32(&pts, dim).unwrap();
        for k in [1, 10, 64] {
            check(&engine, &d, None, k, &format!("integer {dim}-D k={k}"));
        }
        let q: Vec<f32> = (0..50 * dim).map(|_| (rng.next() % 3) as f32).collect();
        let dq = Dataset::from_f32(&q, dim).unwrap();
        check(
            &engine,
            &d,
            Some(&dq),
            33,
            &format!("integer {dim}-D A-to-B"),
        );
    }
    let huge: Vec<f64> = (0..300 * 16).map(|_| (rng.unit() - 0.5) * 1e25).collect();
    let d = Dataset::from_f64(&huge, 16).unwrap();
    check(&engine, &d, None, 8, "huge norms");
}

#[test]
fn grid_edge_cases() {
    // The grid kNN (also run by `check` on every data set above) where its geometry is
    // stressed: queries far outside the data's box, lattices on cell edges far from the
    // origin (rounding of cell assignment), one axis much narrower than a cell, k = n - 1.
    let engine = Engine::new();
    let mut rng = Rng(23);
    for dim in [1, 2, 3, 4] {
        let data = uniform(&mut rng, 400, dim);
        let far: Vec<f64> = (0..60 * dim).map(|_| rng.unit() * 11.0 - 5.0).collect();
        let dd = Dataset::from_f64(&data, dim).unwrap();
        let dq = Dataset::from_f64(&far, dim).unwrap();
        for k in [1, 17, 400] {
            check(
                &engine,
                &dd,
                Some(&dq),
                k,
                &format!("far queries {dim}-D k={k}"),
            );
        }
        check(&engine, &dd, None, 399, &format!("{dim}-D k=n-1"));
    }
    // A lattice of step 1/8 around 1e6 (f64) and 1000 (f32): cell edges fall on points.
    let mut lat64 = Vec::new();
    let mut lat32 = Vec::new();
    for i in 0..20 {
        for j in 0..20 {
            lat64.extend([1e6 + i as f64 / 8.0, -1e6 + j as f64 / 8.0]);
            lat32.extend([1000.0 + i as f32 / 8.0, j as f32 / 8.0]);
        }
    }
    for k in [1, 4, 8, 12] {
        check(
            &engine,
            &Dataset::from_f64(&lat64, 2).unwrap(),
            None,
            k,
            "lattice 1e6",
        );
        check(
            &engine,
            &Dataset::from_f32(&lat32, 2).unwrap(),
            None,
            k,
            "lattice 1e3",
        );
    }
    // Flat data: the third axis spans 1e-9, far below any cell width.
    let flat: Vec<f64> = (0..500)
        .flat_map(|i| [rng.unit(), rng.unit(), 1e-9 * (i % 3) as f64])
        .collect();
    check(
        &engine,
        &Dataset::from_f64(&flat, 3).unwrap(),
        None,
        9,
        "flat 3-D",
    );
}

#[test]
fn filtered_blocks_8d_to_100d() {
    // The Euclidean search from 8-D (blocks of 96 queries x 128 points through the dot-product
    // filter): several blocks with ragged last ones, self and A-to-B, k = 1 to n - 1, f32
    // and f64, data far from the origin, and duplicated points (exact ties at the k-th place).
    let engine = Engine::new();
    let mut rng = Rng(31);
    for dim in [8, 9, 24, 64, 100] {
        let n = 333;
        let mut pts = uniform(&mut rng, n, dim);
        // Every fifth point repeats the one before: ties by smaller index.
        for i in (5..n).step_by(5) {
            let (a, b) = pts.split_at_mut(i * dim);
            b[..dim].copy_from_slice(&a[(i - 1) * dim..]);
        }
        let far: Vec<f64> = pts.iter().map(|&x| x * 0.01 + 3e4).collect();
        let q = clustered(&mut rng, 101, dim);
        for (name, p) in [("uniform", &pts), ("offset 3e4", &far)] {
            let d64 = Dataset::from_f64(p, dim).unwrap();
            let p32: Vec<f32> = p.iter().map(|&x| x as f32).collect();
            let d32 = Dataset::from_f32(&p32, dim).unwrap();
            for k in [1, 16, n - 1] {
                check(&engine, &d64, None, k, &format!("{name} {dim}-D f64 k={k}"));
                check(&engine, &d32, None, k, &format!("{name} {dim}-D f32 k={k}"));
            }
            let q64 = Dataset::from_f64(&q, dim).unwrap();
            check(
                &engine,
                &d64,
                Some(&q64),
                40,
                &format!("{name} {dim}-D A-to-B"),
            );
            check(
                &engine,
                &d64,
                Some(&q64),
                n,
                &format!("{name} {dim}-D A-to-B k=n"),
            );
        }
    }
    // Two clusters 1e12 apart (f64): centred norms so large that the filter's error term
    // exceeds every k-th distance; it keeps every pair and the exact confirmation decides.
    let two: Vec<f64> = (0..300 * 12)
        .map(|i| (i / 12 % 2) as f64 * 1e12 + rng.unit() * 1e-3)
        .collect();
    let d = Dataset::from_f64(&two, 12).unwrap();
    check(&engine, &d, None, 7, "clusters 1e12 apart");
}
