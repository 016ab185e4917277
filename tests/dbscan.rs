//! DBSCAN (`simjoin::dbscan`) against a brute-force reference written here from the
//! definition in `src/dbscan.rs`: labels and core flags equal, on uniform, clustered,
//! duplicate-heavy and lattice data (distances of exactly eps, equally near core points),
//! 1-D to 64-D, every metric, f32 and f64, min_samples from 1 to 12; small and degenerate
//! inputs and the errors; a join of 2 * 10^8 pairs clustered in bounded memory (its pairs
//! would take 1.6 GB); and, with the `gpu` feature, the GPU backend on lavapipe (validation
//! on) giving the CPU's answer exactly.

mod common;

use common::Rng;
use simjoin::metric::distance_acc;
use simjoin::{
    dbscan, Algorithm, Backend, Coords, Dataset, DbscanOptions, DbscanResult, Engine, ErrorKind,
    Metric,
};

const METRICS: [Metric; 3] = [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev];

fn engine() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(Engine::new)
}

fn opts(eps: f64, min_samples: usize, metric: Metric, backend: Backend) -> DbscanOptions {
    DbscanOptions {
        eps,
        min_samples,
        metric,
        backend,
        algorithm: Algorithm::Auto,
        control: Default::default(),
        sphere_radius: simjoin::metric::EARTH_RADIUS_M,
    }
}

/// The reference: neighbour lists from the brute-force oracle join, core points by count,
/// clusters by a search over core-core edges, border points to the nearest core
/// neighbour (smaller index on ties), clusters numbered by smallest member.
fn reference(data: &Dataset, o: &DbscanOptions) -> (Vec<i64>, Vec<bool>) {
    reference_weighted(data, o, None)
}

/// [`reference`] with weights: core when the weights within eps, the point's own
/// included, sum to min_samples (the tests' weights are dyadic, so f64 sums are exact).
fn reference_weighted(
    data: &Dataset,
    o: &DbscanOptions,
    weight: Option<&[f64]>,
) -> (Vec<i64>, Vec<bool>) {
    let n = data.len();
    let mut adj = vec![Vec::new(); n];
    for [i, j] in simjoin::oracle::self_join(data, o.metric, o.eps) {
        adj[i as usize].push(j as usize);
        adj[j as usize].push(i as usize);
    }
    let w = |i: usize| weight.map_or(1.0, |w| w[i]);
    let core: Vec<bool> = (0..n)
        .map(|i| w(i) + adj[i].iter().map(|&j| w(j)).sum::<f64>() >= o.min_samples as f64)
        .collect();
    // Components of the core points (arbitrary ids first).
    let mut comp = vec![usize::MAX; n];
    for s in 0..n {
        if !core[s] || comp[s] != usize::MAX {
            continue;
        }
        comp[s] = s;
        let mut stack = vec![s];
        while let Some(p) = stack.pop() {
            for &q in &adj[p] {
                if core[q] && comp[q] == usize::MAX {
                    comp[q] = s;
                    stack.push(q);
                }
            }
        }
    }
    let acc = |i: usize, j: usize| -> f64 {
        let d = data.dim();
        match data.coords() {
            Coords::F32(x) => {
                distance_acc(o.metric, &x[i * d..(i + 1) * d], &x[j * d..(j + 1) * d]) as f64
            }
            Coords::F64(x) => {
                distance_acc(o.metric, &x[i * d..(i + 1) * d], &x[j * d..(j + 1) * d])
            }
        }
    };
    let mut owner = vec![usize::MAX; n];
    for i in 0..n {
        if core[i] {
            owner[i] = comp[i];
        } else if let Some(&c) = adj[i]
            .iter()
            .filter(|&&c| core[c])
            .min_by(|&&a, &&b| acc(i, a).partial_cmp(&acc(i, b)).unwrap().then(a.cmp(&b)))
        {
            owner[i] = comp[c];
        }
    }
    let mut number = std::collections::HashMap::new();
    let labels = owner
        .iter()
        .map(|&c| {
            if c == usize::MAX {
                -1
            } else {
                let next = number.len() as i64;
                *number.entry(c).or_insert(next)
            }
        })
        .collect();
    (labels, core)
}

fn check_counts(r: &DbscanResult) {
    let n = r.labels.len();
    assert_eq!(r.core.len(), n);
    assert_eq!(r.noise, r.labels.iter().filter(|&&l| l < 0).count());
    assert_eq!(r.core_points, r.core.iter().filter(|&&c| c).count());
    assert_eq!(
        r.clusters as i64,
        r.labels.iter().max().map_or(0, |&m| m + 1)
    );
    assert_eq!(r.core_indices().len(), r.core_points);
}

/// Checks `dbscan` against the reference, clustering in the input's order and in Z-order
/// (which `dbscan` chooses from 2^20 points on): the answer must not depend on it.
fn check(data: &Dataset, o: &DbscanOptions, what: &str) -> DbscanResult {
    let r = dbscan(engine(), data, o).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (labels, core) = reference(data, o);
    assert_eq!(r.core, core, "{what}: core points");
    assert_eq!(r.labels, labels, "{what}: labels");
    check_counts(&r);
    for reorder in [false, true] {
        let z = simjoin::dbscan::dbscan_reordered(engine(), data, o, reorder).unwrap();
        assert_eq!(z.core, core, "{what}: core points (reordered: {reorder})");
        assert_eq!(z.labels, labels, "{what}: labels (reordered: {reorder})");
        assert_eq!(z.report.pairs, r.report.pairs);
    }
    r
}

/// kind 0 uniform in [0,1)^d, 1 four Gaussian blobs, 2 every other point a duplicate of
/// one of 8 points, 3 a lattice of pitch eps (exact eps distances, equally near cores).
fn points(rng: &mut Rng, n: usize, dim: usize, kind: u8, eps: f64) -> Vec<f64> {
    let centers: Vec<f64> = (0..4 * dim).map(|_| rng.unit()).collect();
    let mut v = Vec::with_capacity(n * dim);
    for i in 0..n {
        for j in 0..dim {
            v.push(match kind {
                0 => rng.unit(),
                1 => centers[(i % 4) * dim + j] + rng.normal() * 0.05,
                2 if i % 2 == 0 => ((i / 2) % 8) as f64 * 0.37 + j as f64,
                2 => rng.unit() * 3.0,
                _ => (rng.unit() * 5.0).floor() * eps,
            });
        }
    }
    v
}

/// An eps giving a few neighbours per point on average in the unit cube.
fn eps_for(n: usize, dim: usize, metric: Metric, kind: u8) -> f64 {
    if kind == 3 {
        return 0.25;
    }
    let vol_per_point = 1.0 / n as f64;
    let mut e = (6.0 * vol_per_point).powf(1.0 / dim as f64);
    if metric == Metric::Chebyshev {
        e *= 0.5;
    } else if dim > 1 {
        e *= match metric {
            Metric::Manhattan => 0.4 * (dim as f64).sqrt(),
            _ => 0.6,
        };
    }
    e.max(1e-3)
}

#[test]
fn matches_the_reference() {
    let mut rng = Rng(15);
    let mut case = 0;
    for &dim in &[1usize, 2, 3, 5, 8, 16, 64] {
        for kind in 0..4u8 {
            for &metric in &METRICS {
                let n = [40, 200, 700][case % 3];
                let eps = eps_for(n, dim, metric, kind);
                let x = points(&mut rng, n, dim, kind, eps);
                let min_samples = [1, 2, 3, 5, 8, 12][case % 6];
                let o = opts(eps, min_samples, metric, Backend::Cpu);
                let what = format!("dim {dim} kind {kind} {metric} n {n} min {min_samples}");
                if case % 2 == 0 {
                    check(&Dataset::from_f64(&x, dim).unwrap(), &o, &what);
                } else {
                    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                    check(&Dataset::from_f32(&x32, dim).unwrap(), &o, &what);
                }
                case += 1;
            }
        }
    }
}

#[test]
fn every_min_samples_on_clustered_data() {
    let mut rng = Rng(7);
    let x = points(&mut rng, 600, 2, 1, 0.0);
    let data = Dataset::from_f64(&x, 2).unwrap();
    let mut seen_clusters = std::collections::BTreeSet::new();
    for m in 1..=30 {
        let r = check(
            &data,
            &opts(0.03, m, Metric::Euclidean, Backend::Cpu),
            "blobs",
        );
        seen_clusters.insert(r.clusters);
    }
    // The sweep went from one cluster per point group to mostly noise.
    assert!(seen_clusters.len() > 3, "{seen_clusters:?}");
}

/// Every CPU join algorithm gives the same clustering (the join is the same pair set).
#[test]
fn every_algorithm_agrees() {
    let mut rng = Rng(21);
    for &dim in &[2usize, 12] {
        let x = points(&mut rng, 900, dim, 1, 0.0);
        let data = Dataset::from_f64(&x, dim).unwrap();
        let eps = if dim == 2 { 0.02 } else { 0.15 };
        let want = check(
            &data,
            &opts(eps, 6, Metric::Euclidean, Backend::Cpu),
            "auto",
        );
        for algorithm in [Algorithm::Grid, Algorithm::Ego, Algorithm::Brute] {
            let mut o = opts(eps, 6, Metric::Euclidean, Backend::Cpu);
            o.algorithm = algorithm;
            let r = dbscan(engine(), &data, &o).unwrap();
            assert_eq!(r.report.algorithm, algorithm);
            assert_eq!(r.labels, want.labels, "{algorithm}");
            assert_eq!(r.core, want.core, "{algorithm}");
        }
        assert!(want.clusters > 1 && want.core_points > 0 && want.noise > 0);
    }
    let mut o = opts(0.1, 6, Metric::Euclidean, Backend::Cpu);
    o.algorithm = Algorithm::KdTree;
    let data = Dataset::from_f64(&[0.0, 1.0], 1).unwrap();
    let e = dbscan(engine(), &data, &o).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn hand_checked_cases() {
    // 1-D: a chain 0, 1, 2 (core with min_samples 2), a gap, a pair 10, 10.5, a loner 20.
    let x = [0.0f64, 1.0, 2.0, 10.0, 10.5, 20.0];
    let data = Dataset::from_f64(&x, 1).unwrap();
    let r = dbscan(
        engine(),
        &data,
        &opts(1.0, 2, Metric::Euclidean, Backend::Cpu),
    )
    .unwrap();
    assert_eq!(r.labels, vec![0, 0, 0, 1, 1, -1]);
    assert_eq!(r.core, vec![true, true, true, true, true, false]);
    assert_eq!((r.clusters, r.noise, r.core_points), (2, 1, 5));
    // min_samples 3: only 1 is core (0, 1, 2 within 1 of it); 0 and 2 are its border.
    let r = dbscan(
        engine(),
        &data,
        &opts(1.0, 3, Metric::Euclidean, Backend::Cpu),
    )
    .unwrap();
    assert_eq!(r.labels, vec![0, 0, 0, -1, -1, -1]);
    assert_eq!(r.core_indices(), vec![1]);
    // A border point between two clusters goes to the nearer core; at equal distance to
    // the smaller core index, even when that core's cluster has the larger number. eps 1.5,
    // min_samples 4: cores 3.0 (index 1: 3.25, 3.5, 1.5) and 0.0 (index 2: -0.25, -0.5,
    // 1.5); 1.5 (index 6) is exactly 1.5 from both, so it goes to index 1's cluster, which
    // is cluster 1 because -0.25 (index 0, a border of 0.0) makes the other cluster 0.
    let x = [-0.25f64, 3.0, 0.0, -0.5, 3.25, 3.5, 1.5];
    let data = Dataset::from_f64(&x, 1).unwrap();
    for m in METRICS {
        for reorder in [false, true] {
            // In Z-order 0.0 comes before 3.0: the tie must still go by original index.
            let o = opts(1.5, 4, m, Backend::Cpu);
            let r = simjoin::dbscan::dbscan_reordered(engine(), &data, &o, reorder).unwrap();
            assert_eq!(r.core_indices(), vec![1, 2], "{m}");
            assert_eq!(r.labels, vec![0, 1, 0, 0, 1, 1, 1], "{m}");
        }
    }
}

/// Sample weights (dyadic: 0, negative, fractional, one large enough to make a point core
/// by itself) against the reference, in input order and in Z-order, every metric; unit
/// weights give the unweighted answer; bad weights are refused.
#[test]
fn sample_weights_match_the_reference() {
    let mut rng = Rng(41);
    for &dim in &[1usize, 2, 3, 8] {
        for kind in 0..4u8 {
            for &metric in &METRICS {
                let n = 300;
                let eps = eps_for(n, dim, metric, kind);
                let x = points(&mut rng, n, dim, kind, eps);
                let data = Dataset::from_f64(&x, dim).unwrap();
                let choices = [0.0, 0.5, 1.0, 1.25, 2.0, -1.0, 3.5];
                let mut w: Vec<f64> = (0..n)
                    .map(|_| choices[(rng.next() % choices.len() as u64) as usize])
                    .collect();
                w[n / 2] = 64.0;
                for min_samples in [1, 4, 9] {
                    let o = opts(eps, min_samples, metric, Backend::Cpu);
                    let what = format!("dim {dim} kind {kind} {metric} min {min_samples}");
                    let (labels, core) = reference_weighted(&data, &o, Some(&w));
                    assert!(core[n / 2], "{what}");
                    for reorder in [false, true] {
                        let r = simjoin::dbscan::dbscan_reordered_weighted(
                            engine(),
                            &data,
                            &o,
                            reorder,
                            Some(&w),
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(r.core, core, "{what}: core (reordered: {reorder})");
                        assert_eq!(r.labels, labels, "{what}: labels (reordered: {reorder})");
                        check_counts(&r);
                    }
                    let unit =
                        simjoin::dbscan_weighted(engine(), &data, &o, Some(&vec![1.0; n])).unwrap();
                    let plain = dbscan(engine(), &data, &o).unwrap();
                    assert_eq!(unit.labels, plain.labels, "{what}: unit weights");
                    assert_eq!(unit.core, plain.core, "{what}: unit weights");
                }
            }
        }
    }
    let data = Dataset::from_f64(&[0.0, 1.0, 2.0], 1).unwrap();
    let o = opts(1.0, 2, Metric::Euclidean, Backend::Cpu);
    for bad in [
        vec![1.0, 1.0],
        vec![1.0, f64::NAN, 1.0],
        vec![1.0, f64::INFINITY, 1.0],
        vec![1e19, 1.0, 1.0],
    ] {
        let err = simjoin::dbscan_weighted(engine(), &data, &o, Some(&bad)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("sample_weight"), "{err}");
    }
    // Weights far apart in magnitude sum exactly, in any order: point 1's neighbourhood
    // sums to 2^60 + 1 - 2^60 = 1 (a float sum in this order gives 0), so it is core at
    // min_samples = 1; point 0's is 2^60 + 1, point 2's 1 - 2^60.
    let big = simjoin::dbscan_weighted(
        engine(),
        &data,
        &opts(1.0, 1, Metric::Euclidean, Backend::Cpu),
        Some(&[2f64.powi(60), 1.0, -(2f64.powi(60))]),
    )
    .unwrap();
    assert_eq!(big.core, vec![true, true, false]);
}

#[test]
fn tiny_inputs() {
    for backend in [Backend::Cpu, Backend::Auto] {
        let empty: [f64; 0] = [];
        let r = dbscan(
            engine(),
            &Dataset::from_f64(&empty, 3).unwrap(),
            &opts(1.0, 5, Metric::Euclidean, backend),
        )
        .unwrap();
        assert!(r.labels.is_empty() && r.core.is_empty());
        assert_eq!((r.clusters, r.noise, r.core_points), (0, 0, 0));
        let one = [1.0f32, 2.0];
        let data = Dataset::from_f32(&one, 2).unwrap();
        let r = dbscan(engine(), &data, &opts(1.0, 1, Metric::Euclidean, backend)).unwrap();
        assert_eq!((r.labels.clone(), r.core.clone()), (vec![0], vec![true]));
        let r = dbscan(engine(), &data, &opts(1.0, 2, Metric::Euclidean, backend)).unwrap();
        assert_eq!((r.labels.clone(), r.noise), (vec![-1], 1));
        let two = [0.0f32, 0.0, 0.5, 0.0];
        let data = Dataset::from_f32(&two, 2).unwrap();
        for (eps, m, labels) in [
            (1.0, 2, vec![0, 0]),
            (0.4, 2, vec![-1, -1]),
            (0.4, 1, vec![0, 1]),
            (1.0, 3, vec![-1, -1]),
        ] {
            let r = dbscan(engine(), &data, &opts(eps, m, Metric::Euclidean, backend)).unwrap();
            assert_eq!(r.labels, labels, "eps {eps} min_samples {m}");
        }
    }
}

#[test]
fn bad_input_is_refused() {
    let x = [0.0f64, 1.0, 2.0, 3.0];
    let data = Dataset::from_f64(&x, 2).unwrap();
    for o in [
        opts(0.0, 5, Metric::Euclidean, Backend::Cpu),
        opts(-1.0, 5, Metric::Euclidean, Backend::Cpu),
        opts(f64::NAN, 5, Metric::Euclidean, Backend::Cpu),
        opts(f64::INFINITY, 5, Metric::Euclidean, Backend::Cpu),
        opts(1.0, 0, Metric::Euclidean, Backend::Cpu),
    ] {
        let e = dbscan(engine(), &data, &o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{o:?}: {e}");
    }
    let e = Dataset::from_f64(&[0.0, f64::NAN], 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 20,000 points in a box much smaller than eps: every pair matches, 2.0e8 pairs per
/// pass over the join (1.6 GB as an array of pairs). The clustering is right and the process's peak
/// resident memory grows by far less than the pairs would take. In a child process of its
/// own so that no other test's memory counts.
#[test]
fn many_pairs_in_bounded_memory() {
    if !common::in_own_process("many_pairs_in_bounded_memory") {
        return;
    }
    let n = 20_000usize;
    let mut rng = Rng(3);
    let mut x: Vec<f32> = (0..2 * n).map(|_| rng.unit() as f32 * 0.01).collect();
    // Plus two far away points: a pair with min_samples 2 is its own cluster.
    x.extend_from_slice(&[50.0, 50.0, 50.0, 50.05]);
    let data = Dataset::from_f32(&x, 2).unwrap();
    let before = peak_rss_kib();
    // min_samples 2: every pair is linked at once; 10: pairs are kept until the counts are
    // final; 50: more than the budget would be kept, so a second pass over the join.
    for (m, far_labels) in [(2, [1, 1]), (10, [-1, -1]), (50, [-1, -1])] {
        let r = dbscan(
            engine(),
            &data,
            &opts(0.1, m, Metric::Euclidean, Backend::Cpu),
        )
        .unwrap();
        assert_eq!(r.report.pairs, (n as u64 * (n as u64 - 1)) / 2 + 1);
        assert_eq!(r.clusters, if m == 2 { 2 } else { 1 });
        assert_eq!(r.core_points, n + if m == 2 { 2 } else { 0 });
        assert!(r.labels[..n].iter().all(|&l| l == 0));
        assert_eq!(&r.labels[n..], &far_labels);
        let second = r.report.notes.iter().any(|s| s.contains("second pass"));
        assert_eq!(second, m == 50, "{:?}", r.report.notes);
    }
    let grown_mib = (peak_rss_kib() - before) / 1024;
    println!("peak resident memory grew by {grown_mib} MiB");
    assert!(
        grown_mib < 200,
        "peak resident memory grew by {grown_mib} MiB: were pairs collected?"
    );
}

#[cfg(feature = "gpu")]
mod gpu {
    use super::*;

    /// The report's note that contains `what`, if any.
    fn note<'r>(r: &'r DbscanResult, what: &str) -> Option<&'r String> {
        r.report.notes.iter().find(|n| n.contains(what))
    }

    fn gpu_engine() -> &'static Engine {
        static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
        common::gpu_test_setup();
        E.get_or_init(Engine::new)
    }

    /// The GPU backend (lavapipe, validation on) gives the CPU's labels and core flags
    /// exactly, on every kind of data, every metric, f32 and f64, 1-D to 64-D.
    #[test]
    fn gpu_equals_cpu() {
        let mut rng = Rng(99);
        let mut case = 0;
        for &dim in &[1usize, 2, 3, 8, 64] {
            for kind in 0..4u8 {
                for &metric in &METRICS {
                    let n = [60, 300][case % 2];
                    let eps = eps_for(n, dim, metric, kind);
                    let x = points(&mut rng, n, dim, kind, eps);
                    let min_samples = [2, 4, 7][case % 3];
                    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                    let data = if case % 2 == 0 {
                        Dataset::from_f64(&x, dim).unwrap()
                    } else {
                        Dataset::from_f32(&x32, dim).unwrap()
                    };
                    let what = format!("dim {dim} kind {kind} {metric} min {min_samples}");
                    let cpu = check(&data, &opts(eps, min_samples, metric, Backend::Cpu), &what);
                    let gpu = dbscan(
                        gpu_engine(),
                        &data,
                        &opts(eps, min_samples, metric, Backend::Gpu),
                    )
                    .unwrap_or_else(|e| panic!("{what} gpu: {e}"));
                    assert_eq!(gpu.report.backend, "vulkan", "{what}");
                    assert!(
                        note(&gpu, "neighbour counts on the device").is_some(),
                        "{what}: {:?}",
                        gpu.report.notes
                    );
                    assert!(
                        gpu.core_points == 0 || note(&gpu, "DBSCAN links on the device").is_some(),
                        "{what}: {:?}",
                        gpu.report.notes
                    );
                    assert_eq!(gpu.core, cpu.core, "{what}: core");
                    assert_eq!(gpu.labels, cpu.labels, "{what}: labels");
                    assert_eq!(gpu.report.pairs, cpu.report.pairs, "{what}: pairs");
                    // The Z-order copy (from 2^20 points) on the GPU too.
                    let z = simjoin::dbscan::dbscan_reordered(
                        gpu_engine(),
                        &data,
                        &opts(eps, min_samples, metric, Backend::Gpu),
                        true,
                    )
                    .unwrap();
                    assert_eq!(z.labels, cpu.labels, "{what}: labels (reordered)");
                    assert_eq!(z.core, cpu.core, "{what}: core (reordered)");
                    case += 1;
                }
            }
        }
        common::assert_no_validation_errors();
    }

    /// LSS has no count-only form: the GPU streams its pairs and the host counts them (the
    /// CPU backend's one pass), with the same clustering as the device's counts.
    #[test]
    fn gpu_lss_counts_streamed_pairs() {
        let mut rng = Rng(17);
        for &dim in &[2usize, 3] {
            let eps = eps_for(300, dim, Metric::Euclidean, 1);
            let x = points(&mut rng, 300, dim, 1, eps);
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let data = Dataset::from_f32(&x32, dim).unwrap();
            let cpu = check(&data, &opts(eps, 4, Metric::Euclidean, Backend::Cpu), "lss");
            let mut o = opts(eps, 4, Metric::Euclidean, Backend::Gpu);
            o.algorithm = Algorithm::Lss;
            let lss = dbscan(gpu_engine(), &data, &o).unwrap();
            assert!(
                note(&lss, "neighbour counts on the device").is_none(),
                "{:?}",
                lss.report.notes
            );
            assert_eq!(lss.labels, cpu.labels, "dim {dim}");
            assert_eq!(lss.core, cpu.core, "dim {dim}");
        }
        common::assert_no_validation_errors();
    }

    /// Denser clustered data (tens of thousands of pairs): still the CPU's clustering.
    #[test]
    fn gpu_many_pairs() {
        let mut rng = Rng(5);
        let x: Vec<f32> = points(&mut rng, 3000, 2, 1, 0.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let data = Dataset::from_f32(&x, 2).unwrap();
        let cpu = check(
            &data,
            &opts(0.02, 10, Metric::Euclidean, Backend::Cpu),
            "blobs",
        );
        let gpu = dbscan(
            gpu_engine(),
            &data,
            &opts(0.02, 10, Metric::Euclidean, Backend::Gpu),
        )
        .unwrap();
        assert!(cpu.report.pairs > 20_000, "{}", cpu.report.pairs);
        assert_eq!(gpu.labels, cpu.labels);
        assert_eq!(gpu.core, cpu.core);
        // Core-core pairs were linked on the device: far fewer pairs came back to the host
        // in the linking pass than the join has.
        let linked = note(&gpu, "DBSCAN links on the device")
            .unwrap_or_else(|| panic!("{:?}", gpu.report.notes));
        let read_back: u64 = linked
            .split(", ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{linked}"));
        assert!(
            read_back * 4 < cpu.report.pairs,
            "{read_back} of {} pairs read back",
            cpu.report.pairs
        );
        common::assert_no_validation_errors();
    }
}

/// Cosine DBSCAN (`Metric::Cosine`): clustered directions with random norms, duplicates
/// and scalar multiples, 3-D to 64-D, f32 and f64, on the CPU and (with the `gpu` feature)
/// the GPU: the reference's labels, its joins under cosine's rule.
#[test]
fn cosine_matches_the_reference() {
    let mut rng = Rng(77);
    for (dim, eps) in [(3usize, 0.002), (16, 0.02), (64, 0.05)] {
        let centres: Vec<f64> = (0..5 * dim).map(|_| rng.normal()).collect();
        let mut x = Vec::new();
        for i in 0..400 {
            if i % 9 == 8 {
                // A multiple of an earlier vector: the same direction.
                let j = (rng.next() as usize) % i;
                let row: Vec<f64> = x[j * dim..(j + 1) * dim].to_vec();
                x.extend(row.iter().map(|v| v * 4.0));
                continue;
            }
            let c = (rng.next() as usize) % 5;
            let spread = if i % 5 == 0 { 1.0 } else { 0.05 };
            let norm = 0.5 + rng.unit() * 3.0;
            x.extend((0..dim).map(|k| (centres[c * dim + k] + spread * rng.normal()) * norm));
        }
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        for data in [
            Dataset::from_f64(&x, dim).unwrap(),
            Dataset::from_f32(&x32, dim).unwrap(),
        ] {
            let mut backends = vec![Backend::Cpu];
            if cfg!(feature = "gpu") {
                common::gpu_test_setup();
                backends.push(Backend::Gpu);
            }
            for backend in backends {
                let o = opts(eps, 4, Metric::Cosine, backend);
                let r = check(&data, &o, &format!("cosine {dim}-D {backend}"));
                assert!(
                    r.clusters >= 2 && r.noise > 0,
                    "{} clusters, {} noise",
                    r.clusters,
                    r.noise
                );
            }
        }
    }
}
