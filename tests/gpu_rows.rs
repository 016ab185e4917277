//! Sorted pairs and the CSR made as rows sorted on the device (src/gpu/rows.rs), on
//! lavapipe with the validation layers on: every form equal to the CPU backend's, bit for
//! bit, for self-joins and A ⋈ B (either side the larger), 1-D to 64-D, on uniform,
//! clustered, duplicated and lattice data (many pairs exactly eps apart, on cell edges),
//! through many batches (small result buffers and batches), through mapped memory and
//! through pinned read-back buffers (a child process with `SIMJOIN_GPU_STAGING=1`); the
//! report says the rows were made on the device. A row longer than a result buffer falls
//! back to the host's sort, and `SIMJOIN_GPU_ROWS=0` is the host path, both exact.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, Rng, CHILD_ENV};
use simjoin::{Backend, Dataset, Engine, JoinOptions, JoinResult, Metric, OutputForm};

/// Points of `kind`: 0 uniform, 1 clustered, 2 with duplicates, 3 on a lattice of pitch
/// `pitch` (so pairs exactly one pitch apart, on cell edges).
fn points(rng: &mut Rng, n: usize, dim: usize, kind: u8, pitch: f64) -> Vec<f64> {
    let centres: Vec<f64> = (0..3 * dim).map(|_| rng.unit()).collect();
    let mut v: Vec<f64> = Vec::with_capacity(n * dim);
    for i in 0..n {
        for j in 0..dim {
            let x = match kind {
                0 => rng.unit(),
                1 => centres[(i % 3) * dim + j] + 0.05 * rng.normal(),
                2 if i % 3 == 1 => v[(i - 1) * dim + j],
                2 => rng.unit(),
                _ => (rng.unit() * 6.0).floor() * pitch,
            };
            v.push(x);
        }
    }
    v
}

/// An eps giving about `per_point` neighbours a point (from a sample of distances).
fn eps_for(x: &[f64], dim: usize, per_point: usize) -> f64 {
    let n = x.len() / dim;
    let mut d: Vec<f64> = Vec::new();
    for i in (0..n).step_by((n / 16).max(1)) {
        for j in 0..n {
            if i != j {
                let s: f64 = (0..dim)
                    .map(|t| (x[i * dim + t] - x[j * dim + t]).powi(2))
                    .sum();
                d.push(s.sqrt());
            }
        }
    }
    d.sort_by(f64::total_cmp);
    let k = (d.len() * per_point / n.max(1)).min(d.len() - 1);
    d[k].max(1e-3)
}

fn join(engine: &Engine, a: &Dataset, b: Option<&Dataset>, o: &JoinOptions) -> JoinResult {
    match b {
        Some(b) => engine.join(a, b, o),
        None => engine.self_join(a, o),
    }
    .unwrap_or_else(|e| panic!("{:?}: {e}", o.backend))
}

fn on_device(r: &JoinResult) -> bool {
    r.report
        .notes
        .iter()
        .any(|n| n.starts_with("sorted on the device"))
}

/// Every form of every case, GPU against CPU; returns how many GPU results were made as
/// device rows.
fn compare_forms(engine: &Engine, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut device_made = 0;
    let mut case = 0;
    for dim in [1usize, 2, 3, 5, 8, 16, 33, 64] {
        for kind in 0..4u8 {
            case += 1;
            let n = 150 + (rng.next() % 250) as usize;
            let x = points(&mut rng, n, dim, kind, 0.125);
            let eps = if kind == 3 {
                0.125
            } else {
                eps_for(&x, dim, 6)
            };
            let self_join = case % 3 != 0;
            let m = 100 + (rng.next() % 300) as usize;
            let y = points(&mut rng, m, dim, kind, 0.125);
            let f32_coords = case % 2 == 0;
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let y32: Vec<f32> = y.iter().map(|&v| v as f32).collect();
            let (a, b) = if f32_coords {
                (
                    Dataset::from_f32(&x32, dim).unwrap(),
                    Dataset::from_f32(&y32, dim).unwrap(),
                )
            } else {
                (
                    Dataset::from_f64(&x, dim).unwrap(),
                    Dataset::from_f64(&y, dim).unwrap(),
                )
            };
            let b = (!self_join).then_some(&b);
            let metric = match case % 5 {
                3 => Metric::Manhattan,
                4 => Metric::Chebyshev,
                _ => Metric::Euclidean,
            };
            for (output, include_self, sorted) in [
                (OutputForm::Pairs, false, true),
                (OutputForm::Csr, false, true),
                (OutputForm::Csr, true, true),
                (OutputForm::Csr, false, false),
            ] {
                let mut o = JoinOptions::new(eps);
                o.metric = metric;
                o.output = output;
                o.include_self = include_self;
                o.sorted = sorted;
                // (An unsorted CSR's distances follow its rows' order, which differs.)
                o.distances = case % 4 == 1 && sorted;
                // Many batches: small result buffers, and small batches in every other case.
                o.result_buffer_pairs = Some(64 + case * 37);
                o.batch_points = (case % 2 == 1).then_some(40);
                o.backend = Backend::Cpu;
                let mut want = join(engine, &a, b, &o);
                o.backend = Backend::Gpu;
                let got = join(engine, &a, b, &o);
                let what = format!(
                    "dim {dim} kind {kind} n {n} m {m} self {self_join} f32 {f32_coords} \
                     {metric:?} eps {eps} {output:?} include_self {include_self} sorted {sorted}"
                );
                if let (false, Some(csr)) = (sorted, want.csr()) {
                    // The CPU's unsorted rows in order, for the comparison (the device's are
                    // sorted, which an unsorted CSR allows).
                    let mut csr = csr.clone();
                    for r in 0..csr.offsets.len() - 1 {
                        let (s, e) = (csr.offsets[r] as usize, csr.offsets[r + 1] as usize);
                        csr.neighbors[s..e].sort_unstable();
                    }
                    want.output = simjoin::JoinOutput::Csr(csr);
                }
                assert!(got.output == want.output, "{what}: outputs differ");
                assert!(got.distances == want.distances, "{what}: distances differ");
                assert_eq!(got.count(), want.count(), "{what}");
                device_made += usize::from(on_device(&got));
            }
        }
    }
    device_made
}

fn engine() -> Engine {
    common::gpu_test_setup();
    Engine::new()
}

/// Device rows on (off by default: `rows::enabled`), unless the run sets the variable.
fn rows_on() {
    if std::env::var_os("SIMJOIN_GPU_ROWS").is_none() {
        std::env::set_var("SIMJOIN_GPU_ROWS", "1");
    }
}

#[test]
fn device_rows_match_the_cpu() {
    rows_on();
    let engine = engine();
    let made = compare_forms(&engine, 17);
    // Every GPU result but those with fewer than two points came from device rows.
    assert!(
        made >= 120,
        "only {made} of 128 results made as device rows"
    );
    assert_no_validation_errors();
}

/// The same through pinned read-back buffers (the discrete-GPU path): a child process,
/// the switch being an environment variable read when the result slots are made.
#[test]
fn device_rows_match_the_cpu_through_pinned_buffers() {
    if std::env::var_os(CHILD_ENV).is_none() {
        common::run_in_child(
            "device_rows_match_the_cpu_through_pinned_buffers",
            &[("SIMJOIN_GPU_STAGING", "1")],
        );
        return;
    }
    rows_on();
    let engine = engine();
    let made = compare_forms(&engine, 29);
    assert!(
        made >= 120,
        "only {made} of 128 results made as device rows"
    );
    assert_no_validation_errors();
}

/// A dense clump whose rows exceed a small result buffer: the host assembles instead,
/// exactly; with a buffer that holds them, the device makes the rows.
#[test]
fn rows_longer_than_a_buffer_take_the_host_path() {
    rows_on();
    let engine = engine();
    let mut rng = Rng(5);
    let mut x: Vec<f64> = (0..300 * 3).map(|_| rng.unit()).collect();
    // 80 points within 0.01 of each other: rows of 79 neighbours.
    for i in 0..80 {
        for t in 0..3 {
            x[i * 3 + t] = 0.5 + 0.001 * rng.unit();
        }
    }
    let a = Dataset::from_f64(&x, 3).unwrap();
    let mut o = JoinOptions::new(0.05);
    o.sorted = true;
    o.backend = Backend::Cpu;
    let want = engine.self_join(&a, &o).unwrap();
    o.backend = Backend::Gpu;
    o.result_buffer_pairs = Some(50);
    let got = engine.self_join(&a, &o).unwrap();
    assert_eq!(got.output, want.output);
    assert!(!on_device(&got), "{:?}", got.report.notes);
    o.result_buffer_pairs = Some(4096);
    let got = engine.self_join(&a, &o).unwrap();
    assert_eq!(got.output, want.output);
    assert!(on_device(&got), "{:?}", got.report.notes);
    assert_no_validation_errors();
}

/// By default (no `SIMJOIN_GPU_ROWS`): the host's sort at every dimension (measured faster
/// on an H200, `rows::enabled`), the same output.
#[test]
fn rows_off_by_default() {
    if std::env::var_os(CHILD_ENV).is_none() {
        common::run_in_child("rows_off_by_default", &[]);
        return;
    }
    std::env::remove_var("SIMJOIN_GPU_ROWS");
    let engine = engine();
    let mut rng = Rng(3);
    for dim in [2usize, 7, 8, 16] {
        let x: Vec<f64> = (0..300 * dim).map(|_| rng.unit()).collect();
        let a = Dataset::from_f64(&x, dim).unwrap();
        let mut o = JoinOptions::new(eps_for(&x, dim, 5));
        o.sorted = true;
        o.backend = Backend::Cpu;
        let want = engine.self_join(&a, &o).unwrap();
        o.backend = Backend::Gpu;
        let got = engine.self_join(&a, &o).unwrap();
        assert!(got.output == want.output, "dim {dim}");
        assert!(!on_device(&got), "dim {dim}: {:?}", got.report.notes);
    }
    assert_no_validation_errors();
}

#[test]
fn rows_off_is_the_host_path() {
    if std::env::var_os(CHILD_ENV).is_none() {
        common::run_in_child("rows_off_is_the_host_path", &[("SIMJOIN_GPU_ROWS", "0")]);
        return;
    }
    let engine = engine();
    let mut rng = Rng(9);
    let x: Vec<f64> = (0..400 * 2).map(|_| rng.unit()).collect();
    let a = Dataset::from_f64(&x, 2).unwrap();
    let mut o = JoinOptions::new(0.05);
    o.sorted = true;
    o.backend = Backend::Cpu;
    let want = engine.self_join(&a, &o).unwrap();
    o.backend = Backend::Gpu;
    let got = engine.self_join(&a, &o).unwrap();
    assert_eq!(got.output, want.output);
    assert!(!on_device(&got), "{:?}", got.report.notes);
    assert_no_validation_errors();
}
