//! The GPU grid index built on the device (src/gpu/device_index.rs) against the host build
//! (src/gpu/index.rs): the index arrays equal element for element, and the pair sets equal
//! (and the oracle's), self-join and A ⋈ B, 1-D to 64-D, f32 and f64, duplicates, points on
//! cell edges, forced batching; on lavapipe with the validation layers on.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, in_own_process, Rng};
use simjoin::grid::CELL_WIDEN;
use simjoin::grid_index_check::{index_arrays, IndexArrays};
use simjoin::vk::Context;
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, IndexBuild, JoinOptions, Metric, OutputForm,
};
use std::sync::{Arc, OnceLock};

/// The engine and a context, both created before any test makes Vulkan calls (device
/// creation races other threads' calls inside the validation layer).
fn setup() -> (&'static Engine, Arc<Context>) {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    let ctx = common::shared_context();
    let engine = ENGINE.get_or_init(|| {
        let engine = Engine::new();
        // The engine opens its device on first use: here, while other tests wait.
        let x = [0.0f32, 1.0];
        engine
            .self_join(
                &Dataset::from_f32(&x, 1).unwrap(),
                &opts(0.5, IndexBuild::Host),
            )
            .unwrap();
        engine
    });
    (engine, ctx)
}

fn opts(eps: f64, build: IndexBuild) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Gpu;
    o.algorithm = Algorithm::Grid;
    o.sorted = true;
    o.index_build = build;
    o
}

fn uniform(rng: &mut Rng, n: usize, d: usize, scale: f64) -> Vec<f64> {
    (0..n * d).map(|_| rng.unit() * scale).collect()
}

fn clusters(rng: &mut Rng, n: usize, d: usize) -> Vec<f64> {
    let centres: Vec<f64> = (0..4 * d).map(|_| rng.unit() * 10.0).collect();
    (0..n * d)
        .map(|t| centres[(t / d % 4) * d + t % d] + 0.3 * rng.normal())
        .collect()
}

/// Every point appears `copies` times (in a shuffled order).
fn duplicated(rng: &mut Rng, n: usize, d: usize, copies: usize) -> Vec<f64> {
    let base = uniform(rng, n, d, 1.0);
    let mut ids: Vec<usize> = (0..n * copies).map(|i| i % n).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    ids.iter()
        .flat_map(|&i| base[i * d..(i + 1) * d].to_vec())
        .collect()
}

/// Points on the cell edges of a grid for `eps` whose origin is 0 (the lattice includes 0):
/// multiples of the cell width (as `GridGeometry` computes it) and of eps, and their f64
/// neighbours one ulp away, so that (x - origin) / width lands on and around integers;
/// also -0.0 beside 0.0 (SORTIDU orders them by total_cmp).
fn edges(rng: &mut Rng, n: usize, d: usize, eps: f64) -> Vec<f64> {
    let width = eps * (1.0 + CELL_WIDEN);
    let mut x: Vec<f64> = (0..n * d)
        .map(|_| {
            let m = (rng.next() % 12) as f64;
            let v = match rng.next() % 3 {
                0 => m * width,
                1 => m * eps,
                _ => m * 0.5 * eps,
            };
            match rng.next() % 3 {
                0 => f64::from_bits(v.to_bits() + 1),
                1 if v > 0.0 => f64::from_bits(v.to_bits() - 1),
                _ => v,
            }
        })
        .collect();
    // The grid's origin is the minimum of each dimension: pin it to 0 in every one.
    x[..d].fill(0.0);
    x[d..2 * d].fill(-0.0);
    x
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// Where two debug-printed arrays first differ (for failure messages).
fn first_difference<T: std::fmt::Debug>(h: &T, d: &T) -> String {
    let (h, d) = (format!("{h:?}"), format!("{d:?}"));
    let at = h.bytes().zip(d.bytes()).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(60);
    format!(
        "host ...{}..., device ...{}...",
        &h[from..(at + 60).min(h.len())],
        &d[from..(at + 60).min(d.len())]
    )
}

/// Host and device index arrays for one join, checked equal.
fn same_index(ctx: &Arc<Context>, a: &Dataset, b: Option<&Dataset>, o: &JoinOptions, what: &str) {
    let mut host = o.clone();
    host.index_build = IndexBuild::Host;
    let mut device = o.clone();
    device.index_build = IndexBuild::Device;
    let h: IndexArrays = index_arrays(ctx, a, b, &host).unwrap();
    let d: IndexArrays = index_arrays(ctx, a, b, &device).unwrap();
    assert_eq!(h.build, IndexBuild::Host);
    assert_eq!(d.build, IndexBuild::Device);
    assert!(h.n_cells > 0, "{what}");
    macro_rules! same {
        ($($f:ident),*) => {$(
            assert!(h.$f == d.$f, "{what}: {} differ: {}", stringify!($f), first_difference(&h.$f, &d.$f));
        )*};
    }
    same!(
        cell_keys,
        cell_ranges,
        r_ids,
        q_ids,
        q_cells,
        meta,
        r_coords,
        q_coords
    );
    assert_eq!(
        (h.n_cells, h.k, h.sort_dim),
        (d.n_cells, d.k, d.sort_dim),
        "{what}"
    );
}

/// Runs `check` on `x` as f32 and as f64 data.
fn each_precision(x: &[f64], d: usize, mut check: impl FnMut(&Dataset, &str)) {
    let x32 = f32s(x);
    check(&Dataset::from_f32(&x32, d).unwrap(), "f32");
    check(&Dataset::from_f64(x, d).unwrap(), "f64");
}

#[test]
fn device_and_host_index_arrays_are_equal() {
    let (_, ctx) = setup();
    let mut rng = Rng(11);
    for (d, k) in [
        (1, None),
        (2, None),
        (2, Some(2)),
        (3, Some(3)),
        (5, Some(2)),
        (8, None),
        (16, Some(4)),
        (32, None),
        (64, Some(3)),
    ] {
        let n = 700;
        let x = clusters(&mut rng, n, d);
        let y = clusters(&mut rng, 300, d);
        let eps = 0.15 * (d as f64).sqrt();
        let mut o = opts(eps, IndexBuild::Auto);
        o.indexed_dims = k;
        let x32 = f32s(&x);
        let y32 = f32s(&y);
        for (a, b, p) in [
            (
                Dataset::from_f32(&x32, d).unwrap(),
                Dataset::from_f32(&y32, d).unwrap(),
                "f32",
            ),
            (
                Dataset::from_f64(&x, d).unwrap(),
                Dataset::from_f64(&y, d).unwrap(),
                "f64",
            ),
        ] {
            same_index(&ctx, &a, None, &o, &format!("self {p} d={d} k={k:?}"));
            // B smaller: B is indexed; A smaller: A is indexed (pairs swapped back).
            same_index(&ctx, &a, Some(&b), &o, &format!("A x B {p} d={d} k={k:?}"));
            same_index(&ctx, &b, Some(&a), &o, &format!("B x A {p} d={d} k={k:?}"));
        }
    }
    assert_no_validation_errors();
}

#[test]
fn device_and_host_index_arrays_agree_on_edges_duplicates_and_wide_grids() {
    let (_, ctx) = setup();
    let mut rng = Rng(12);
    for d in [1, 2, 3, 6] {
        let eps = 0.1;
        let x = edges(&mut rng, 900, d, eps);
        let o = {
            let mut o = opts(eps, IndexBuild::Auto);
            o.indexed_dims = Some(d);
            o
        };
        each_precision(&x, d, |a, p| {
            same_index(&ctx, a, None, &o, &format!("edges {p} d={d}"));
        });
        let x = duplicated(&mut rng, 150, d, 5);
        each_precision(&x, d, |a, p| {
            same_index(&ctx, a, None, &o, &format!("duplicates {p} d={d}"));
        });
    }
    // 10^6 cells per dimension: cell ids past 32 bits (the two-sort path for f32 too).
    let x = uniform(&mut rng, 800, 2, 1000.0);
    let mut o = opts(1e-3, IndexBuild::Auto);
    o.indexed_dims = Some(2);
    each_precision(&x, 2, |a, p| {
        same_index(&ctx, a, None, &o, &format!("wide grid {p}"));
    });
    assert_no_validation_errors();
}

/// An eps matching about 2% of the pairs (a quantile of sampled distances).
fn eps_for(rng: &mut Rng, x: &[f64], d: usize, metric: Metric) -> f64 {
    let n = (x.len() / d) as u64;
    let mut dist: Vec<f64> = (0..2000)
        .map(|_| {
            let (i, j) = ((rng.next() % n) as usize, (rng.next() % n) as usize);
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
    dist.sort_by(f64::total_cmp);
    dist[40]
}

/// The pairs of one join, and the build the report names.
fn pairs(engine: &Engine, a: &Dataset, b: Option<&Dataset>, o: &JoinOptions) -> Vec<[u32; 2]> {
    let r = match b {
        None => engine.self_join(a, o),
        Some(b) => engine.join(a, b, o),
    }
    .unwrap();
    assert_eq!(r.report.index_build, Some(o.index_build));
    assert!(r.report.bytes_to_device > 0 && r.report.bytes_from_device > 0);
    r.pairs().unwrap().to_vec()
}

#[test]
fn device_and_host_builds_give_the_oracles_pairs() {
    let (engine, _) = setup();
    let mut rng = Rng(13);
    for (d, metric) in [
        (1, Metric::Euclidean),
        (2, Metric::Manhattan),
        (3, Metric::Euclidean),
        (6, Metric::Chebyshev),
        (16, Metric::Euclidean),
        (32, Metric::Euclidean),
        (64, Metric::Euclidean),
    ] {
        let x = clusters(&mut rng, 500, d);
        let y = clusters(&mut rng, 200, d);
        let eps = eps_for(&mut rng, &x, d, metric);
        each_precision(&x, d, |a, p| {
            let y32 = f32s(&y);
            let b = match p {
                "f32" => Dataset::from_f32(&y32, d).unwrap(),
                _ => Dataset::from_f64(&y, d).unwrap(),
            };
            let want_self = oracle::self_join(a, metric, eps);
            let want_ab = oracle::join(a, &b, metric, eps);
            assert!(want_self.len() > 100, "{p} d={d}: {}", want_self.len());
            for build in [IndexBuild::Host, IndexBuild::Device] {
                let mut o = opts(eps, build);
                o.metric = metric;
                assert_eq!(
                    pairs(engine, a, None, &o),
                    want_self,
                    "{build} self {p} d={d}"
                );
                assert_eq!(
                    pairs(engine, a, Some(&b), &o),
                    want_ab,
                    "{build} A x B {p} d={d}"
                );
                // Many batches and full result buffers.
                o.batch_points = Some(37);
                o.result_buffer_pairs = Some(64);
                assert_eq!(
                    pairs(engine, a, None, &o),
                    want_self,
                    "{build} batched {p} d={d}"
                );
                assert_eq!(
                    pairs(engine, &b, Some(a), &o),
                    oracle::join(&b, a, metric, eps),
                    "{build} batched B x A {p} d={d}"
                );
            }
        });
    }
    // Lattices: many pairs exactly eps apart, on cell edges; and duplicates.
    for d in [1, 2, 4] {
        let eps = 0.1;
        for x in [
            edges(&mut rng, 600, d, eps),
            duplicated(&mut rng, 120, d, 4),
        ] {
            each_precision(&x, d, |a, p| {
                let want = oracle::self_join(a, Metric::Euclidean, eps);
                for build in [IndexBuild::Host, IndexBuild::Device] {
                    let mut o = opts(eps, build);
                    o.indexed_dims = Some(d);
                    assert_eq!(
                        pairs(engine, a, None, &o),
                        want,
                        "{build} lattice {p} d={d}"
                    );
                }
            });
        }
    }
    assert_no_validation_errors();
}

#[test]
fn auto_builds_tiny_indexes_on_the_host_and_counts_bytes() {
    let (engine, _) = setup();
    let mut rng = Rng(14);
    let x = f32s(&uniform(&mut rng, 400, 3, 1.0));
    let a = Dataset::from_f32(&x, 3).unwrap();
    let mut o = opts(0.1, IndexBuild::Auto);
    o.output = OutputForm::Count;
    let r = engine.self_join(&a, &o).unwrap();
    // 400 points are few (and lavapipe is a software device): the host builds, on any device.
    assert_eq!(r.report.index_build, Some(IndexBuild::Host));
    // The points (f32) and the index arrays went up; counters and counts came back.
    assert!(r.report.bytes_to_device >= 400 * 3 * 4);
    assert!(r.report.bytes_from_device >= 8);
    assert!(
        r.report
            .notes
            .iter()
            .any(|n| n.contains("grid index built on the host")),
        "{:?}",
        r.report.notes
    );
    o.algorithm = Algorithm::Brute;
    assert_eq!(engine.self_join(&a, &o).unwrap().report.index_build, None);
    assert_no_validation_errors();
}

/// The discrete-GPU path on lavapipe: device memory unmapped, so every upload goes through
/// the staging pool on the transfer stream and the counts come back through a copy.
#[test]
fn device_build_through_staging_copies() {
    if !in_own_process("device_build_through_staging_copies") {
        return;
    }
    common::gpu_test_setup();
    let ctx = Context::new(&Default::default()).unwrap();
    ctx.set_zero_copy(false);
    let mut rng = Rng(15);
    let x = clusters(&mut rng, 600, 3);
    let y = clusters(&mut rng, 250, 3);
    each_precision(&x, 3, |a, p| {
        let y32 = f32s(&y);
        let b = match p {
            "f32" => Dataset::from_f32(&y32, 3).unwrap(),
            _ => Dataset::from_f64(&y, 3).unwrap(),
        };
        let o = opts(0.3, IndexBuild::Auto);
        same_index(&ctx, a, None, &o, &format!("staged self {p}"));
        same_index(&ctx, a, Some(&b), &o, &format!("staged A x B {p}"));
    });
    drop(ctx);
    assert_no_validation_errors();
}
