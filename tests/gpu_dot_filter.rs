//! The GPU grid join's dot-product filter (src/gpu/dot_filter.rs, the bound of
//! src/cpu/dot_filter.rs) on the cases of tests/cpu_high_dim.rs: pairs within an ulp of
//! eps, data far from the origin, spreads far wider than eps (the filter must stand down),
//! magnitudes beyond f32, duplicates, A ⋈ B both ways, f32 and f64, one batch and forced
//! batching with a tiny result buffer. Every pair set is compared exactly with the
//! oracle, on lavapipe with validation on. `without_the_filter` and `filter_forced_on`
//! rerun every case in a child process with SIMJOIN_GPU_DOT_FILTER=0 and =1, so the
//! unfiltered and the filtered GPU runs agree with each other as with the oracle;
//! `device_built_index` reruns them over the index built on the device, with the filter
//! in its other mode (shared-memory tiles where they are off by default, and the reverse).
//! `tiles_with_stops_everywhere` stops queries mid-tile and halts whole workgroups.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, each_precision, threshold_pairs, Rng, CHILD_ENV};
use simjoin::{oracle, Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, Pair};
use std::sync::OnceLock;

const FILTER_ON: &str = "GPU dot-product filter on";
const TILES_ON: &str = "GPU filter in shared-memory tiles";

/// Whether a filtered join with these notes ran in shared-memory tiles: where
/// SIMJOIN_GPU_TILE forces them on (1) or off (0), else on hardware GPUs only (on a
/// software device they cost more than they save) and only where cells hold a workgroup's
/// worth of queries (the rule is unit-tested in src/gpu/dot_filter.rs).
fn tiles_expected(notes: &str) -> bool {
    match std::env::var("SIMJOIN_GPU_TILE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !notes.contains("software device") && !notes.contains("queries per cell"),
    }
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    common::gpu_test_setup();
    ENGINE.get_or_init(Engine::new)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    Filter,
    NoFilter,
    /// Either (the data's f32 rounding decides).
    Any,
}

/// Whether this process runs with the filter forced (then expectations are not checked).
fn forced() -> bool {
    std::env::var_os("SIMJOIN_GPU_DOT_FILTER").is_some()
}

/// Runs the GPU grid join; returns the sorted pairs and the report's notes.
fn gpu_join(a: &Dataset, b: Option<&Dataset>, eps: f64, batched: bool) -> (Vec<Pair>, String) {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Gpu;
    o.algorithm = Algorithm::Grid;
    o.metric = Metric::Euclidean;
    o.sorted = true;
    if batched {
        o.batch_points = Some(37);
        o.result_buffer_pairs = Some(50);
    }
    let r = match b {
        Some(b) => engine().join(a, b, &o),
        None => engine().self_join(a, &o),
    }
    .unwrap_or_else(|e| panic!("GPU join failed: {e}"));
    let notes = r.report.notes.join("; ");
    (r.pairs().unwrap().to_vec(), notes)
}

/// The filter's counts from the report: (rejected, tested).
fn filter_counts(notes: &str) -> Option<(u64, u64)> {
    let rest = notes.split("GPU dot-product filter rejected ").nth(1)?;
    let mut words = rest.split_whitespace();
    let rejected = words.next()?.parse().ok()?;
    let tested = words.nth(1)?.parse().ok()?;
    Some((rejected, tested))
}

/// From the report: (dispatches resumed, of which after a full result buffer).
fn resumes(notes: &str) -> Option<(u64, u64)> {
    let rest = notes.split(" batches, ").nth(1)?;
    let mut words = rest.split_whitespace();
    let resumed = words.next()?.parse().ok()?;
    let overflowed = words.nth(1)?.trim_start_matches('(').parse().ok()?;
    Some((resumed, overflowed))
}

/// Self-join (or A ⋈ B) on the GPU, unbatched and batched, against the oracle; checks
/// whether the filter ran. Returns the unbatched run's notes.
fn check(a: &Dataset, b: Option<&Dataset>, eps: f64, expect: Expect, what: &str) -> String {
    let want = match b {
        Some(b) => oracle::join(a, b, Metric::Euclidean, eps),
        None => oracle::self_join(a, Metric::Euclidean, eps),
    };
    let mut first = String::new();
    for batched in [false, true] {
        let (got, notes) = gpu_join(a, b, eps, batched);
        if got != want {
            let missing = want
                .iter()
                .filter(|p| got.binary_search(p).is_err())
                .count();
            let extra = got
                .iter()
                .filter(|p| want.binary_search(p).is_err())
                .count();
            panic!(
                "{what} {:?} d={} n={} batched {batched}: {} pairs, want {} ({missing} missing, \
                 {extra} extra); {notes}",
                a.precision(),
                a.dim(),
                a.len(),
                got.len(),
                want.len()
            );
        }
        let ran = notes.contains(FILTER_ON);
        if !forced() && expect != Expect::Any {
            assert_eq!(ran, expect == Expect::Filter, "{what}: filter use; {notes}");
        }
        if ran {
            let (rejected, tested) = filter_counts(&notes).expect("the filter's counts");
            assert!(rejected <= tested, "{notes}");
            // (A software device's loop budget fits a tile up to 64-D.)
            assert_eq!(
                notes.contains(TILES_ON),
                tiles_expected(&notes),
                "{what}: tiles; {notes}"
            );
        }
        if !batched {
            first = notes;
        }
    }
    assert_no_validation_errors();
    first
}

#[test]
fn pairs_an_ulp_from_eps() {
    for (d, n) in [(8, 150), (16, 120), (33, 90), (64, 60)] {
        let eps = 0.05 * (d as f64).sqrt();
        let x = threshold_pairs(n, d, eps, 1.0, 0.0, d as u64);
        each_precision(&x, d, |data| {
            check(data, None, eps, Expect::Filter, "ulp pairs");
            check(
                data,
                None,
                eps * (1.0 + 1e-9),
                Expect::Filter,
                "ulp pairs eps+",
            );
        });
    }
}

#[test]
fn far_from_the_origin() {
    for (d, offset, scale, eps) in [
        (16, 1000.0, 1.0, 0.4),
        (32, -5.0e4, 20.0, 9.0),
        (24, 1.0e6, 1e-3, 2e-4),
    ] {
        let x = threshold_pairs(80, d, eps, scale, offset, 11);
        let data = Dataset::from_f64(&x, d).unwrap();
        check(&data, None, eps, Expect::Filter, "offset f64");
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let expect = if offset > 1e5 {
            Expect::Any
        } else {
            Expect::Filter
        };
        let data = Dataset::from_f32(&x32, d).unwrap();
        check(&data, None, eps, expect, "offset f32");
    }
}

#[test]
fn spread_far_wider_than_eps() {
    let d = 16;
    let mut r = Rng(3);
    let mut x: Vec<f64> = (0..200 * d).map(|_| 1e4 * r.unit()).collect();
    for i in 0..30 {
        for j in 0..d {
            let v = x[i * d + j] + 0.01 * r.normal();
            x.push(v);
        }
    }
    each_precision(&x, d, |data| {
        check(data, None, 0.05, Expect::NoFilter, "wide spread");
    });
    let mut y: Vec<f64> = (0..200 * d).map(|_| 5.0 * r.unit()).collect();
    for i in 0..40 {
        for j in 0..d {
            let v = y[i * d + j] + 0.02 * r.normal();
            y.push(v);
        }
    }
    each_precision(&y, d, |data| {
        check(data, None, 0.1, Expect::Filter, "50 eps spread");
    });
}

#[test]
fn magnitudes_beyond_f32_and_tiny_eps() {
    let d = 12;
    let mut r = Rng(5);
    let mut base: Vec<f64> = (0..100 * d).map(|_| 1e150 * (1.0 + r.unit())).collect();
    for i in 0..20 * d {
        base.push(base[i] + 3e149 * r.normal());
    }
    let data = Dataset::from_f64(&base, d).unwrap();
    check(&data, None, 6e149, Expect::NoFilter, "1e150");
    let mut x: Vec<f64> = (0..150 * d).map(|_| r.unit()).collect();
    x[5] = 1e25;
    let data = Dataset::from_f64(&x, d).unwrap();
    check(&data, None, 0.6, Expect::NoFilter, "outlier");
    // Data and eps around 1e-20: eps^2 underflows f32's normal range. In f64 (normal
    // there) the join is exact and the f32 filter stands down; f32 data would compare
    // with a subnormal threshold (which a GPU may flush to zero): an error.
    let tiny: Vec<f64> = (0..150 * d).map(|_| 1e-20 * r.unit()).collect();
    check(
        &Dataset::from_f64(&tiny, d).unwrap(),
        None,
        6e-21,
        Expect::NoFilter,
        "tiny",
    );
    let tiny32: Vec<f32> = tiny.iter().map(|&v| v as f32).collect();
    let mut o = JoinOptions::new(6e-21);
    o.backend = Backend::Gpu;
    let err = engine()
        .self_join(&Dataset::from_f32(&tiny32, d).unwrap(), &o)
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn duplicates_ragged_sizes_and_a_join_b() {
    let d = 40;
    let mut r = Rng(9);
    let distinct: Vec<f64> = (0..5 * d).map(|_| r.unit()).collect();
    for n in [2usize, 3, 17, 129] {
        let x: Vec<f64> = (0..n)
            .flat_map(|i| {
                let k = (i * 7 + i / 3) % 5;
                distinct[k * d..(k + 1) * d].to_vec()
            })
            .collect();
        let y: Vec<f64> = (0..(n + 5) * d).map(|_| r.unit()).collect();
        let (x32, y32): (Vec<f32>, Vec<f32>) = (
            x.iter().map(|&v| v as f32).collect(),
            y.iter().map(|&v| v as f32).collect(),
        );
        let sets = [
            (
                Dataset::from_f64(&x, d).unwrap(),
                Dataset::from_f64(&y, d).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, d).unwrap(),
                Dataset::from_f32(&y32, d).unwrap(),
            ),
        ];
        for (a, b) in &sets {
            check(a, None, 0.05, Expect::Filter, "duplicates");
            check(a, None, 1e-4, Expect::NoFilter, "duplicates, tiny eps");
            check(b, None, 1.3, Expect::Filter, "uniform");
            check(a, Some(b), 1.4, Expect::Filter, "A⋈B");
            check(b, Some(a), 1.4, Expect::Filter, "B⋈A");
        }
    }
}

/// GPU-JOIN's data (exponential, lambda = 40): the filter runs and rejects most candidates.
#[test]
fn exponential_like_the_benchmark_and_the_filter_rejects() {
    for (d, eps) in [(16, 0.05), (32, 0.1), (64, 0.18)] {
        let mut r = Rng(d as u64);
        let x: Vec<f64> = (0..400 * d)
            .map(|_| (-(1.0 - r.unit()).ln() / 40.0).min(1.0))
            .collect();
        each_precision(&x, d, |data| {
            let notes = check(data, None, eps, Expect::Filter, "exponential");
            if std::env::var("SIMJOIN_GPU_DOT_FILTER").as_deref() != Ok("0") {
                let (rejected, tested) = filter_counts(&notes).expect("the filter's counts");
                assert!(tested > 0 && rejected > tested / 4, "{notes}");
            }
        });
    }
}

/// Low dimensions: no filter unless forced (the forced-on child runs it here too).
#[test]
fn low_dimensions() {
    let d = 3;
    let mut r = Rng(17);
    let x: Vec<f64> = (0..500 * d).map(|_| r.unit()).collect();
    each_precision(&x, d, |data| {
        check(data, None, 0.05, Expect::NoFilter, "3-D");
    });
}

/// Embedding-sized rows (1,536-D, as OpenAI's; 2,048-D): on a software device a thread's
/// least work with the filter exceeds the loop budget, so the grid join runs without it
/// (it refused such joins before); on hardware the filter runs.
#[test]
fn embedding_dimensions() {
    for (d, n) in [(1536, 40), (2048, 30)] {
        let eps = 0.05 * (d as f64).sqrt();
        let x = threshold_pairs(n, d, eps, 1.0, 0.0, d as u64);
        each_precision(&x, d, |data| {
            let notes = check(data, None, eps, Expect::Any, "embedding dims");
            if !forced() {
                assert!(
                    notes.contains(FILTER_ON) || notes.contains("loop budget"),
                    "{notes}"
                );
            }
        });
    }
}

/// Every test above in a child process with `env` set.
fn rerun_with(env: &[(&str, &str)], me: &str) {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    common::gpu_test_setup();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD_ENV, "1")
        .args(["--skip", "without_the_filter", "--skip", "filter_forced_on"])
        .args([
            "--skip",
            "device_built_index",
            "--skip",
            "tiles_across_subgroups",
        ])
        .args(["--test-threads", "2"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("9 passed"),
        "{me} failed:\n{log}"
    );
}

/// A workgroup of queries from several cells, many queries per cell and a result buffer
/// of 64 pairs: members stop alone mid-tile (result buffer full) and whole workgroups halt
/// (loop budget), in self-joins, A ⋈ B and the count-only search of every adjacent cell
/// (neighbour counts), all exact.
#[test]
fn tiles_with_stops_everywhere() {
    let d = 24;
    let mut r = Rng(31);
    let centres: Vec<f64> = (0..6 * d).map(|_| r.unit()).collect();
    let x: Vec<f64> = (0..900)
        .flat_map(|i| {
            let c = &centres[(i % 6) * d..(i % 6 + 1) * d];
            let jitter = if i % 5 == 0 { 0.0 } else { 0.02 };
            c.iter()
                .map(|&v| v + jitter * r.normal())
                .collect::<Vec<_>>()
        })
        .collect();
    let y: Vec<f64> = x
        .iter()
        .map(|&v| v + 0.01 * r.normal())
        .take(470 * d)
        .collect();
    let eps = 0.09;
    let y32: Vec<f32> = y.iter().map(|&v| v as f32).collect();
    each_precision(&x, d, |a| {
        let b = match a.precision() {
            simjoin::Precision::F64 => Dataset::from_f64(&y, d).unwrap(),
            simjoin::Precision::F32 => Dataset::from_f32(&y32, d).unwrap(),
        };
        let mut o = JoinOptions::new(eps);
        o.backend = Backend::Gpu;
        o.algorithm = Algorithm::Grid;
        o.sorted = true;
        o.result_buffer_pairs = Some(64);
        o.batch_points = Some(301);
        let got = engine().self_join(a, &o).unwrap();
        let notes = got.report.notes.join("; ");
        assert_eq!(
            got.pairs().unwrap(),
            &oracle::self_join(a, Metric::Euclidean, eps)[..],
            "self-join; {notes}"
        );
        let (resumed, overflowed) = resumes(&notes).expect("the dispatch counts");
        assert!(overflowed > 0, "{notes}");
        if notes.contains(TILES_ON) && notes.contains("software device") {
            // Whole workgroups halted on the loop budget too.
            assert!(resumed > overflowed, "{notes}");
        }
        if !forced() {
            assert!(notes.contains(FILTER_ON), "{notes}");
            assert_eq!(notes.contains(TILES_ON), tiles_expected(&notes), "{notes}");
            // SIMJOIN_GPU_WORKGROUP sets a software device's workgroup only.
            if let (Ok(wg), true) = (
                std::env::var("SIMJOIN_GPU_WORKGROUP"),
                notes.contains("software device"),
            ) {
                assert!(notes.contains(&format!("workgroup {wg},")), "{notes}");
            }
        }
        let got = engine().join(a, &b, &o).unwrap();
        assert_eq!(
            got.pairs().unwrap(),
            &oracle::join(a, &b, Metric::Euclidean, eps)[..],
            "A⋈B; {}",
            got.report.notes.join("; ")
        );
        let (counts, _) = engine().neighbour_counts(a, &o).unwrap();
        let mut want = vec![1u32; a.len()];
        for p in oracle::self_join(a, Metric::Euclidean, eps) {
            want[p[0] as usize] += 1;
            want[p[1] as usize] += 1;
        }
        assert_eq!(counts, want, "neighbour counts");
        // DBSCAN: device counts, then links in the union-find from the tiles.
        let opts = |backend| simjoin::DbscanOptions {
            eps,
            min_samples: 6,
            metric: Metric::Euclidean,
            backend,
            algorithm: Algorithm::Auto,
            control: Default::default(),
            sphere_radius: simjoin::metric::EARTH_RADIUS_M,
        };
        let gpu = simjoin::dbscan(engine(), a, &opts(Backend::Gpu)).unwrap();
        let cpu = simjoin::dbscan(engine(), a, &opts(Backend::Cpu)).unwrap();
        assert!(
            cpu.clusters > 1 && cpu.noise > 0,
            "{} clusters",
            cpu.clusters
        );
        assert_eq!((&gpu.labels, &gpu.core), (&cpu.labels, &cpu.core), "DBSCAN");
    });
    assert_no_validation_errors();
}

/// The stop-everywhere case again with workgroups of 64 threads on lavapipe (8 of its
/// 8-lane subgroups, run as coroutines that meet at each barrier, as a hardware GPU's
/// subgroups do): with one subgroup per workgroup, a missing barrier goes unseen (checked:
/// without the one after the tile's staging this fails at 64 and passes at 8).
#[test]
fn tiles_across_subgroups() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    common::gpu_test_setup();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .env("SIMJOIN_GPU_WORKGROUP", "64")
        .env("SIMJOIN_GPU_TILE", "1")
        .args(["--exact", "tiles_with_stops_everywhere"])
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("1 passed"),
        "the 64-thread tiled run failed:\n{log}"
    );
}

#[test]
fn without_the_filter() {
    rerun_with(&[("SIMJOIN_GPU_DOT_FILTER", "0")], "the unfiltered run");
}

#[test]
fn filter_forced_on() {
    rerun_with(&[("SIMJOIN_GPU_DOT_FILTER", "1")], "the forced filter");
}

/// The filter reads its copies through the point lookup, whichever side built it; this
/// child also runs the filter in its other mode: tiled where tiles are off by default
/// (software devices, as here in CI), untiled where they are on (hardware GPUs).
#[test]
fn device_built_index() {
    let hardware = simjoin::devices()
        .unwrap_or_default()
        .iter()
        .any(|d| d.kind != "cpu");
    let tiles = if hardware { "0" } else { "1" };
    rerun_with(
        &[("SIMJOIN_GPU_INDEX", "device"), ("SIMJOIN_GPU_TILE", tiles)],
        "the device-built index, the filter's other mode",
    );
}
