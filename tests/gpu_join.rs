//! The GPU joins (eps-grid and brute force) against the brute-force oracle, pair sets
//! compared exactly, on lavapipe with the validation layers on (a validation error fails
//! the test). Sizes are small: every lavapipe dispatch costs a few milliseconds.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, in_own_process};
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, ErrorKind, JoinOptions, Metric, OutputForm, Pair,
};
use std::sync::OnceLock;

/// Pins lavapipe and turns validation on before the first Vulkan call of the process.
fn setup() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    common::gpu_test_setup();
    ENGINE.get_or_init(Engine::new)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-300), self.next());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

fn uniform(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n * d).map(|_| r.next()).collect()
}

fn clusters(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    let centres: Vec<f64> = (0..5 * d).map(|_| r.next() * 10.0).collect();
    (0..n)
        .flat_map(|i| {
            (0..d)
                .map(|j| centres[(i % 5) * d + j] + 0.3 * r.gauss())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// An eps giving roughly `frac` of all pairs as matches (quantile of sampled distances).
fn eps_for(x: &[f64], d: usize, metric: Metric, frac: f64) -> f64 {
    let n = x.len() / d;
    let mut r = Rng(99);
    let mut dists: Vec<f64> = (0..3000)
        .map(|_| {
            let (i, j) = (
                (r.next() * n as f64) as usize,
                (r.next() * n as f64) as usize,
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

fn gpu(eps: f64, metric: Metric, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Gpu;
    o.metric = metric;
    o.algorithm = algorithm;
    o.sorted = true;
    o
}

/// Runs the self-join in f32 and f64 and compares with the oracle; returns the pair count.
fn check_self(x: &[f64], d: usize, opts: &JoinOptions, what: &str) -> usize {
    let engine = setup();
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let a32 = Dataset::from_f32(&x32, d).unwrap();
    let a64 = Dataset::from_f64(x, d).unwrap();
    let mut count = 0;
    for data in [a32, a64] {
        let got = engine
            .self_join(&data, opts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = oracle::self_join(&data, opts.metric, opts.eps);
        let pairs = got.pairs().unwrap().to_vec();
        assert_eq!(
            pairs.len(),
            want.len(),
            "{what} {:?}: pair count ({:?})",
            data.precision(),
            got.report.notes
        );
        assert_eq!(pairs, want, "{what} {:?}", data.precision());
        assert_eq!(got.report.backend, "vulkan");
        count = want.len();
    }
    assert_no_validation_errors();
    count
}

fn check_ab(a: &[f64], b: &[f64], d: usize, opts: &JoinOptions, what: &str) -> usize {
    let engine = setup();
    let (a32, b32): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|&v| v as f32).collect(),
        b.iter().map(|&v| v as f32).collect(),
    );
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
        let got = engine
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
fn uniform_dims_1_to_128() {
    for (d, n) in [
        (1, 400),
        (2, 600),
        (3, 600),
        (4, 500),
        (5, 500),
        (6, 500),
        (8, 400),
        (12, 400),
        (16, 300),
        (32, 300),
        (64, 250),
        (90, 200),
        (128, 200),
    ] {
        let x = uniform(n, d, d as u64);
        let eps = eps_for(&x, d, Metric::Euclidean, 0.02);
        let pairs = check_self(
            &x,
            d,
            &gpu(eps, Metric::Euclidean, Algorithm::Grid),
            &format!("uniform d={d}"),
        );
        assert!(pairs > n / 4, "d={d}: only {pairs} pairs, test too weak");
    }
}

#[test]
fn gaussian_clusters() {
    for d in [2, 3, 8, 20] {
        let x = clusters(700, d, 5 + d as u64);
        let eps = eps_for(&x, d, Metric::Euclidean, 0.01);
        let pairs = check_self(
            &x,
            d,
            &gpu(eps, Metric::Euclidean, Algorithm::Grid),
            &format!("clusters d={d}"),
        );
        assert!(pairs > 100);
    }
}

#[test]
fn many_duplicates() {
    // 300 points on 6 distinct positions: huge cells and every pair in one cell matches.
    let d = 3;
    let x: Vec<f64> = (0..300)
        .flat_map(|i| [(i % 6) as f64 * 0.01, 1.0, -2.0])
        .collect();
    let pairs = check_self(
        &x,
        d,
        &gpu(0.02, Metric::Euclidean, Algorithm::Grid),
        "duplicates",
    );
    assert!(pairs > 10_000);
}

#[test]
fn lattice_exactly_eps_apart_on_cell_edges() {
    // Points on a lattice with spacing exactly eps (0.25, exact in binary): neighbours sit
    // exactly eps apart (a match) and on cell boundaries.
    for d in [1, 2, 3] {
        let side: usize = [40, 12, 6][d - 1];
        let mut x = Vec::new();
        for i in 0..side.pow(d as u32) {
            let mut rest = i;
            for _ in 0..d {
                x.push((rest % side) as f64 * 0.25 - 1.0);
                rest /= side;
            }
        }
        for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            for algorithm in [Algorithm::Grid, Algorithm::Brute] {
                let pairs = check_self(
                    &x,
                    d,
                    &gpu(0.25, metric, algorithm),
                    &format!("lattice d={d} {metric} {algorithm}"),
                );
                assert!(
                    pairs >= d * (side - 1) * side.pow(d as u32 - 1),
                    "d={d} {metric}: {pairs}"
                );
            }
        }
    }
}

#[test]
fn every_metric_grid_and_brute() {
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        for d in [2, 5, 16] {
            let x = clusters(400, d, 11 + d as u64);
            let eps = eps_for(&x, d, metric, 0.02);
            for algorithm in [Algorithm::Grid, Algorithm::Brute] {
                check_self(
                    &x,
                    d,
                    &gpu(eps, metric, algorithm),
                    &format!("{metric} d={d} {algorithm}"),
                );
            }
        }
    }
}

#[test]
fn a_join_b_both_sizes_and_metrics() {
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        for d in [2, 7] {
            let a = uniform(300, d, 1);
            // B is partly outside A's bounds: its queries are clamped into A's grid.
            let b: Vec<f64> = uniform(500, d, 2).iter().map(|v| v * 1.3 - 0.15).collect();
            let eps = eps_for(&a, d, metric, 0.03);
            for algorithm in [Algorithm::Grid, Algorithm::Brute] {
                let o = gpu(eps, metric, algorithm);
                let n1 = check_ab(&a, &b, d, &o, &format!("A⋈B {metric} d={d} {algorithm}"));
                let n2 = check_ab(&b, &a, d, &o, &format!("B⋈A {metric} d={d} {algorithm}"));
                assert_eq!(n1, n2);
                assert!(n1 > 100);
            }
        }
    }
}

#[test]
fn tiny_inputs() {
    let engine = setup();
    for algorithm in [Algorithm::Grid, Algorithm::Brute, Algorithm::Auto] {
        let o = gpu(0.5, Metric::Euclidean, algorithm);
        let empty = Dataset::from_f32(&[], 2).unwrap();
        let one = Dataset::from_f32(&[1.0, 1.0], 2).unwrap();
        let two = Dataset::from_f32(&[1.0, 1.0, 1.5, 1.0], 2).unwrap();
        let two_far = Dataset::from_f32(&[1.0, 1.0, 1.5, 1.1], 2).unwrap();
        assert_eq!(
            engine.self_join(&empty, &o).unwrap().pairs().unwrap(),
            &[] as &[Pair]
        );
        assert_eq!(
            engine.self_join(&one, &o).unwrap().pairs().unwrap(),
            &[] as &[Pair]
        );
        assert_eq!(
            engine.self_join(&two, &o).unwrap().pairs().unwrap(),
            &[[0, 1]]
        );
        assert_eq!(
            engine.self_join(&two_far, &o).unwrap().pairs().unwrap(),
            &[] as &[Pair]
        );
        assert_eq!(
            engine.join(&empty, &two, &o).unwrap().pairs().unwrap(),
            &[] as &[Pair]
        );
        assert_eq!(
            engine.join(&two, &empty, &o).unwrap().pairs().unwrap(),
            &[] as &[Pair]
        );
        assert_eq!(
            engine.join(&one, &two, &o).unwrap().pairs().unwrap(),
            &[[0, 0], [0, 1]]
        );
        assert_eq!(
            engine.join(&two, &one, &o).unwrap().pairs().unwrap(),
            &[[0, 0], [1, 0]]
        );
    }
    assert_no_validation_errors();
}

#[test]
fn dozens_of_batches_with_a_tiny_result_buffer() {
    let engine = setup();
    let d = 3;
    let x = clusters(800, d, 21);
    let eps = eps_for(&x, d, Metric::Euclidean, 0.02);
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let data = Dataset::from_f32(&x32, d).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, eps);
    assert!(want.len() > 2000);
    for algorithm in [Algorithm::Grid, Algorithm::Brute] {
        // Batches sized by the user: 25 points each, 200-pair buffers (many overflow).
        let mut o = gpu(eps, Metric::Euclidean, algorithm);
        o.batch_points = Some(25);
        o.result_buffer_pairs = Some(200);
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.pairs().unwrap(), &want[..], "{algorithm}");
        assert!(
            got.report.batches >= 32,
            "{algorithm}: {} batches",
            got.report.batches
        );
        // Batches sized by the estimation pass for a 300-pair buffer (unsorted output: sorted
        // output's rows are planned from exact counts instead, tests/gpu_rows.rs).
        let mut o = gpu(eps, Metric::Euclidean, algorithm);
        o.result_buffer_pairs = Some(300);
        o.sorted = false;
        let got = engine.self_join(&data, &o).unwrap();
        let mut pairs = got.pairs().unwrap().to_vec();
        pairs.sort_unstable();
        assert_eq!(pairs, want, "{algorithm} estimated");
        assert!(
            got.report.batches >= 24,
            "{algorithm}: {} batches ({:?})",
            got.report.batches,
            got.report.notes
        );
    }
    assert_no_validation_errors();
}

#[test]
fn one_query_overflowing_the_buffer_is_resumed() {
    // 120 identical points: every point has 119 matches, the buffer holds 7.
    let engine = setup();
    let x = vec![0.5f32; 120 * 4];
    let data = Dataset::from_f32(&x, 4).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.1);
    for algorithm in [Algorithm::Grid, Algorithm::Brute] {
        let mut o = gpu(0.1, Metric::Euclidean, algorithm);
        o.result_buffer_pairs = Some(7);
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.pairs().unwrap(), &want[..]);
        assert!(
            got.report
                .notes
                .iter()
                .any(|n| n.contains("after a full result buffer")),
            "{:?}",
            got.report.notes
        );
        let ab = engine.join(&data, &data, &o).unwrap();
        let all: Vec<Pair> = (0..120)
            .flat_map(|i| (0..120).map(move |j| [i, j]))
            .collect();
        assert_eq!(ab.pairs().unwrap(), &all[..]);
    }
    assert_no_validation_errors();
}

#[test]
fn long_scans_resume_past_the_software_loop_limit() {
    // lavapipe cuts loops after ~65535 iterations per workgroup: a query that compares with
    // thousands of points must stop within its budget and resume, losing nothing.
    let engine = setup();
    // 1-D brute force: points far apart except 0, 4000 and 9999 (all at 0.0).
    let mut x: Vec<f32> = (0..10_000).map(|i| 10.0 + i as f32).collect();
    for i in [0, 4000, 9999] {
        x[i] = 0.0;
    }
    let data = Dataset::from_f32(&x, 1).unwrap();
    let got = engine
        .self_join(&data, &gpu(0.5, Metric::Euclidean, Algorithm::Brute))
        .unwrap();
    assert_eq!(got.pairs().unwrap(), &[[0, 4000], [0, 9999], [4000, 9999]]);
    // Grid: 1500 duplicates in one cell (5 loop iterations per candidate in 4-D).
    let x = vec![0.25f32; 1500 * 4];
    let data = Dataset::from_f32(&x, 4).unwrap();
    let o = gpu(0.1, Metric::Chebyshev, Algorithm::Grid);
    let got = engine.self_join(&data, &o).unwrap();
    assert_eq!(got.count(), 1500 * 1499 / 2);
    assert_eq!(
        got.pairs().unwrap(),
        &oracle::self_join(&data, Metric::Chebyshev, 0.1)[..]
    );
    assert_no_validation_errors();
}

#[test]
fn count_only_and_csr() {
    let engine = setup();
    let d = 4;
    let x = clusters(600, d, 31);
    let eps = eps_for(&x, d, Metric::Manhattan, 0.02);
    let data = Dataset::from_f64(&x, d).unwrap();
    let want = oracle::self_join(&data, Metric::Manhattan, eps);
    for algorithm in [Algorithm::Grid, Algorithm::Brute] {
        let mut o = gpu(eps, Metric::Manhattan, algorithm);
        o.output = OutputForm::Count;
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.count(), want.len() as u64);
        o.output = OutputForm::Csr;
        let csr = engine.self_join(&data, &o).unwrap();
        assert_eq!(csr.csr().unwrap().neighbors.len(), 2 * want.len());
    }
    assert_no_validation_errors();
}

/// The grid join's phases each name the clock that measured them (GPU timestamps or the
/// host's), none is negative, and the report gives the overlap.
#[test]
fn phases_name_their_clock() {
    let engine = setup();
    let d = 3;
    let x = uniform(2000, d, 77);
    let data = Dataset::from_f64(&x, d).unwrap();
    let mut o = gpu(0.05, Metric::Euclidean, Algorithm::Grid);
    o.batch_points = Some(500);
    let r = engine.self_join(&data, &o).unwrap().report;
    let clocked: Vec<&(String, f64)> = r
        .phases
        .iter()
        .filter(|(n, _)| n.ends_with("(GPU clock)") || n.ends_with("(host clock)"))
        .collect();
    for want in [
        "index build",
        "upload",
        "estimation",
        "search, sum over batches",
        "result copies",
        "assembly",
        "batch loop wall",
    ] {
        assert!(
            clocked.iter().any(|(n, _)| n.starts_with(want)),
            "{want}: {:?}",
            r.phases
        );
    }
    assert!(
        clocked.iter().all(|(_, s)| s.is_sign_positive()),
        "{:?}",
        r.phases
    );
    assert!(
        r.notes.iter().any(|n| n.starts_with("overlap")),
        "{:?}",
        r.notes
    );
    assert_no_validation_errors();
}

#[test]
fn forced_indexed_dims() {
    let d = 10;
    let x = clusters(500, d, 41);
    let eps = eps_for(&x, d, Metric::Euclidean, 0.02);
    for k in [1, 2, 3, 6, 10, 40] {
        let mut o = gpu(eps, Metric::Euclidean, Algorithm::Grid);
        o.indexed_dims = Some(k);
        check_self(&x, d, &o, &format!("k={k}"));
    }
}

#[test]
fn auto_is_grid_and_unsupported_algorithms_fail_cleanly() {
    let engine = setup();
    let x = uniform(500, 3, 8);
    let data = Dataset::from_f64(&x, 3).unwrap();
    let got = engine
        .self_join(&data, &gpu(0.05, Metric::Euclidean, Algorithm::Auto))
        .unwrap();
    assert_eq!(got.report.algorithm, Algorithm::Grid);
    assert!(got.report.batches >= 3);
    assert!(
        got.report.notes.iter().any(|n| n.contains("cost model")),
        "{:?}",
        got.report.notes
    );
    for algorithm in [Algorithm::Ego, Algorithm::KdTree] {
        let e = engine
            .self_join(&data, &gpu(0.05, Metric::Euclidean, algorithm))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    // LSS runs on the GPU (tests/gpu_lss.rs checks it).
    let lss = engine
        .self_join(&data, &gpu(0.05, Metric::Euclidean, Algorithm::Lss))
        .unwrap();
    assert_eq!(lss.report.algorithm, Algorithm::Lss);
    assert_eq!(lss.pairs(), got.pairs());
    assert_no_validation_errors();
}

#[test]
fn bad_device_and_failing_sink_give_clear_errors() {
    if !in_own_process("bad_device_and_failing_sink_give_clear_errors") {
        return; // ran in a child process: it creates and destroys Vulkan devices
    }
    let engine = setup();
    let x = uniform(300, 2, 4);
    let data = Dataset::from_f64(&x, 2).unwrap();
    let o = gpu(0.05, Metric::Euclidean, Algorithm::Grid);
    let elsewhere = Engine::with_options(simjoin::EngineOptions {
        device: Some("no-such-device-anywhere".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        elsewhere.self_join(&data, &o).unwrap_err().kind(),
        ErrorKind::NoDevice
    );
    // `auto` on an engine without a usable device runs on the CPU.
    let mut auto = o.clone();
    auto.backend = simjoin::Backend::Auto;
    assert_eq!(
        elsewhere.self_join(&data, &auto).unwrap().report.backend,
        "cpu"
    );
    // A sink that refuses the first chunk stops the join with Cancelled.
    let o = gpu(0.05, Metric::Euclidean, Algorithm::Grid);
    let mut refuse = |_: &[Pair]| -> anyhow::Result<()> { anyhow::bail!("disk full") };
    let e = engine.self_join_stream(&data, &o, &mut refuse).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    assert!(e.to_string().contains("disk full"), "{e}");
    // Streaming delivers exactly the oracle's pairs.
    let mut streamed: Vec<Pair> = Vec::new();
    let mut keep = |chunk: &[Pair]| -> anyhow::Result<()> {
        streamed.extend_from_slice(chunk);
        Ok(())
    };
    let report = engine.self_join_stream(&data, &o, &mut keep).unwrap();
    streamed.sort_unstable();
    assert_eq!(streamed, oracle::self_join(&data, Metric::Euclidean, 0.05));
    assert_eq!(report.pairs, streamed.len() as u64);
    assert_no_validation_errors();
}

#[test]
fn reorder_distance_pass_on_skewed_variance() {
    // Variance grows with the dimension number, so REORDER's order (reversed) rejects in
    // the first dimensions it visits; survivors are confirmed in dataset order.
    let engine = setup();
    for d in [6, 24] {
        let x: Vec<f64> = uniform(500, d, 50 + d as u64)
            .iter()
            .enumerate()
            .map(|(t, v)| v * (((t % d) + 1) as f64 / d as f64).powi(2))
            .collect();
        for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            let eps = eps_for(&x, d, metric, 0.02);
            let o = gpu(eps, metric, Algorithm::Grid);
            check_self(&x, d, &o, &format!("skewed d={d} {metric}"));
            let b: Vec<f64> = x.iter().map(|v| v * 1.01).collect();
            check_ab(
                &x[..200 * d],
                &b,
                d,
                &o,
                &format!("skewed A⋈B d={d} {metric}"),
            );
        }
        let data = Dataset::from_f64(&x, d).unwrap();
        let got = engine
            .self_join(&data, &gpu(0.1, Metric::Euclidean, Algorithm::Grid))
            .unwrap();
        assert!(
            got.report
                .notes
                .iter()
                .any(|n| n.contains("rejected in variance order")),
            "{:?}",
            got.report.notes
        );
    }
    // Lattice points exactly eps apart, most variance in the last dimension.
    let mut x = Vec::new();
    for i in 0..2 {
        for j in 0..2 {
            for k in 0..3 {
                for l in 0..30 {
                    x.extend_from_slice(&[
                        i as f64 * 0.5,
                        j as f64 * 0.5,
                        k as f64 * 0.5,
                        l as f64 * 0.5,
                    ]);
                }
            }
        }
    }
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        check_self(
            &x,
            4,
            &gpu(0.5, metric, Algorithm::Grid),
            &format!("skewed lattice {metric}"),
        );
    }
    let data = Dataset::from_f64(&x, 4).unwrap();
    let got = engine
        .self_join(&data, &gpu(0.5, Metric::Euclidean, Algorithm::Grid))
        .unwrap();
    assert!(
        got.report
            .notes
            .iter()
            .any(|n| n.contains("rejected in variance order")),
        "{:?}",
        got.report.notes
    );
}

#[test]
fn a_batch_wider_than_one_row_of_workgroups() {
    // 600k queries in one batch need a 2-D grid of workgroups (more than 65535 in x).
    // Pairs are known: every position appears twice, neighbours are 1 apart (eps 0.5).
    let engine = setup();
    let n = 600_000usize;
    let x: Vec<f32> = (0..n).map(|i| (i / 2) as f32).collect();
    let data = Dataset::from_f32(&x, 1).unwrap();
    let mut o = gpu(0.5, Metric::Euclidean, Algorithm::Grid);
    o.batch_points = Some(n);
    let got = engine.self_join(&data, &o).unwrap();
    let want: Vec<Pair> = (0..n as u32 / 2).map(|p| [2 * p, 2 * p + 1]).collect();
    assert_eq!(got.pairs().unwrap(), &want[..]);
    assert_eq!(got.report.batches, 1);
    assert_no_validation_errors();
}

/// `Engine::neighbour_counts` on the GPU counts on the device (a count-only search of every
/// adjacent cell, one count per point read back): the oracle's counts exactly (each point
/// itself included), grid with host- and device-built indexes and brute force, f32 and
/// f64, 1-D to 64-D, every metric, duplicates, a lattice exactly eps apart, dozens of
/// batches with resumed queries, n = 0, 1, 2; the CPU backend's counts the same.
#[test]
fn neighbour_counts_on_the_device() {
    use simjoin::IndexBuild;
    let engine = setup();
    let check = |data: &Dataset, o: &JoinOptions, what: &str| {
        let pairs = oracle::self_join(data, o.metric, o.eps);
        let mut want = vec![1u32; data.len()];
        for &[i, j] in &pairs {
            want[i as usize] += 1;
            want[j as usize] += 1;
        }
        let (got, report) = engine
            .neighbour_counts(data, o)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got, want, "{what}");
        assert_eq!(report.pairs, pairs.len() as u64, "{what}: pairs");
        assert_eq!(report.backend, "vulkan", "{what}");
        if data.len() > 1 {
            assert!(
                report
                    .notes
                    .iter()
                    .any(|n| n.contains("neighbour counts on the device")),
                "{what}: {:?}",
                report.notes
            );
        }
        let mut cpu = o.clone();
        cpu.backend = Backend::Cpu;
        assert_eq!(
            engine.neighbour_counts(data, &cpu).unwrap().0,
            want,
            "{what} (cpu)"
        );
    };
    let mut case = 0;
    for d in [1usize, 2, 3, 8, 64] {
        let x = uniform(300, d, 70 + d as u64);
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            let eps = eps_for(&x, d, metric, 0.02);
            let data = if case % 2 == 0 {
                Dataset::from_f64(&x, d).unwrap()
            } else {
                Dataset::from_f32(&x32, d).unwrap()
            };
            for algorithm in [Algorithm::Grid, Algorithm::Brute] {
                check(
                    &data,
                    &gpu(eps, metric, algorithm),
                    &format!("d={d} {metric} {algorithm}"),
                );
            }
            case += 1;
        }
    }
    // Duplicates: 200 points on 10 positions.
    let dup: Vec<f64> = (0..200).flat_map(|i| [(i % 10) as f64, 0.5]).collect();
    let data = Dataset::from_f64(&dup, 2).unwrap();
    check(
        &data,
        &gpu(0.25, Metric::Euclidean, Algorithm::Grid),
        "duplicates",
    );
    // A lattice with spacing exactly eps: the 4 (Euclidean, Manhattan) or 8 (Chebyshev)
    // lattice neighbours at distance exactly eps, on cell edges.
    let lattice: Vec<f32> = (0..144)
        .flat_map(|i| [(i % 12) as f32 * 0.5, (i / 12) as f32 * 0.5])
        .collect();
    let data = Dataset::from_f32(&lattice, 2).unwrap();
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        check(
            &data,
            &gpu(0.5, metric, Algorithm::Grid),
            &format!("lattice {metric}"),
        );
    }
    // Dozens of batches (and queries resumed past the software loop budget), with the
    // index built on the host and on the device.
    let x = clusters(800, 3, 21);
    let eps = eps_for(&x, 3, Metric::Euclidean, 0.02);
    let data = Dataset::from_f64(&x, 3).unwrap();
    for build in [IndexBuild::Host, IndexBuild::Device] {
        let mut o = gpu(eps, Metric::Euclidean, Algorithm::Grid);
        o.batch_points = Some(25);
        o.index_build = build;
        check(&data, &o, &format!("batches, {build:?} index"));
    }
    // n = 0, 1, 2.
    let two = [0.0f32, 0.0, 0.3, 0.0];
    for n in 0..=2 {
        let data = Dataset::from_f32(&two[..2 * n], 2).unwrap();
        check(
            &data,
            &gpu(0.5, Metric::Euclidean, Algorithm::Grid),
            &format!("n = {n}"),
        );
    }
    assert_no_validation_errors();
}

/// 2^s exactly (subnormals included).
fn pow2(s: i32) -> f64 {
    if s >= -1022 {
        f64::from_bits(((s + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (s + 1074))
    }
}

/// The lattice test of `tests/engine_api.rs` on the GPU: a 5 x 5 x 5 lattice of pitch
/// 2^s with eps = the pitch gives the pairs of the unit lattice at the edges of each
/// precision's range (every value exact), with the index built on the host and on the
/// device, and kNN ranks it as at scale 1; just past the range both are clear errors.
#[test]
fn extreme_magnitudes() {
    let engine = setup();
    let lattice = |h: f64| -> Vec<f64> {
        let c = |v: usize| (v as f64 - 2.0) * h;
        (0..125)
            .flat_map(|i| [c(i % 5), c(i / 5 % 5), c(i / 25)])
            .collect()
    };
    let unit = lattice(1.0);
    let unit_data = Dataset::from_f64(&unit, 3).unwrap();
    for metric in [Metric::Euclidean, Metric::Manhattan] {
        let want = oracle::self_join(&unit_data, metric, 1.0);
        let knn_opts = simjoin::KnnOptions {
            metric,
            backend: Backend::Gpu,
            ..Default::default()
        };
        let want_knn = engine.knn(&unit_data, None, 6, &knn_opts).unwrap().indices;
        let (ok64, ok32, bad64) = if metric == Metric::Euclidean {
            (vec![-511, 505], vec![-63, 60], vec![-512, 512])
        } else {
            (vec![-1022, 1018], vec![-126, 120], vec![-1023])
        };
        for algorithm in [Algorithm::Grid, Algorithm::Brute, Algorithm::Lss] {
            for build in [simjoin::IndexBuild::Host, simjoin::IndexBuild::Device] {
                let mut o = gpu(1.0, metric, algorithm);
                o.index_build = build;
                let cases = ok64
                    .iter()
                    .map(|&s| (s, true))
                    .chain(ok32.iter().map(|&s| (s, false)));
                for (s, wide) in cases {
                    o.eps = pow2(s);
                    let x = lattice(o.eps);
                    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                    let data = if wide {
                        Dataset::from_f64(&x, 3).unwrap()
                    } else {
                        Dataset::from_f32(&x32, 3).unwrap()
                    };
                    let what = format!(
                        "{metric} {algorithm} {build:?} 2^{s} {:?}",
                        data.precision()
                    );
                    let got = engine
                        .self_join(&data, &o)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(got.pairs().unwrap(), want, "{what}");
                    if algorithm == Algorithm::Grid {
                        assert_eq!(got.report.index_build, Some(build), "{what}");
                    }
                    if algorithm == Algorithm::Grid && build == simjoin::IndexBuild::Host {
                        let got = engine
                            .knn(&data, None, 6, &knn_opts)
                            .unwrap_or_else(|e| panic!("{what} kNN: {e}"));
                        assert_eq!(got.indices, want_knn, "{what} kNN");
                    }
                }
                for &s in &bad64 {
                    o.eps = pow2(s);
                    let x = lattice(o.eps);
                    let err = engine
                        .self_join(&Dataset::from_f64(&x, 3).unwrap(), &o)
                        .unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "2^{s}");
                    assert!(err.to_string().contains("out of range"), "{err}");
                }
            }
        }
    }
    assert_no_validation_errors();
}

/// The GPU backend splits a large batch of pairs across a sink's parts and pushes the
/// pieces from the engine's threads at once: every pair reaches the parts once, the
/// engine's sorted pairs and CSR (which have parts) are exact, and one thread uses `push`
/// alone. (Batches over 2^17 pairs are split; the test's are about 300k.)
#[test]
fn sink_parts_take_large_batches_from_several_threads() {
    if !in_own_process("sink_parts_take_large_batches_from_several_threads") {
        return; // ran in a child process: it creates Vulkan devices of its own
    }
    common::gpu_test_setup();
    let x = uniform(60_000, 2, 17);
    let data = Dataset::from_f64(&x, 2).unwrap();
    let eps = 0.013;
    let mut cpu = JoinOptions::new(eps);
    cpu.backend = Backend::Cpu;
    cpu.sorted = true;
    let want_engine = Engine::new();
    let want = want_engine.self_join(&data, &cpu).unwrap();
    let want = want.pairs().unwrap();
    assert!(want.len() > 800_000, "{} pairs", want.len());
    cpu.output = OutputForm::Csr;
    let want_csr = want_engine.self_join(&data, &cpu).unwrap();
    for threads in [1, 3] {
        let engine = Engine::with_options(simjoin::EngineOptions {
            threads: Some(threads),
            ..Default::default()
        })
        .unwrap();
        let o = gpu(eps, Metric::Euclidean, Algorithm::Grid);
        let mut sink = common::SplitSink::default();
        let report = engine.self_join_stream(&data, &o, &mut sink).unwrap();
        let in_parts: usize = sink.parts.iter().map(|p| p.0.len()).sum();
        if threads == 1 {
            assert!(sink.parts.is_empty());
        } else {
            assert!(
                in_parts > 0,
                "no batch went to the parts: {:?}",
                report.notes
            );
        }
        let mut got: Vec<Pair> = sink.own;
        got.extend(sink.parts.iter().flat_map(|p| p.0.iter().copied()));
        got.sort_unstable();
        assert_eq!(got, want, "{threads} threads");
        assert_eq!(report.pairs as usize, got.len());
        // The engine's own sinks with parts: sorted pairs and the CSR, exact.
        let sorted = engine.self_join(&data, &o).unwrap();
        assert_eq!(sorted.pairs().unwrap(), want, "{threads} threads, sorted");
        let mut oc = o.clone();
        oc.output = OutputForm::Csr;
        let csr = engine.self_join(&data, &oc).unwrap();
        let (g, w) = (csr.csr().unwrap(), want_csr.csr().unwrap());
        assert_eq!((&g.offsets, &g.neighbors), (&w.offsets, &w.neighbors));
    }
    assert_no_validation_errors();
}
