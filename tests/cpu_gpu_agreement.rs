//! The CPU backend and the GPU backend (on lavapipe, validation on) must return the same
//! pair set, bit for bit, on random inputs: random sizes, dims, eps, metrics, precisions,
//! distributions (uniform, clustered, duplicated, snapped to a lattice of pitch eps so many
//! pairs sit exactly at distance eps), self-join and A ⋈ B.
#![cfg(feature = "gpu")]

mod common;

use proptest::prelude::*;
use simjoin::{Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, Pair};

fn engine() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    common::gpu_test_setup();
    E.get_or_init(Engine::new)
}

fn run(
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    backend: Backend,
    alg: Algorithm,
) -> Vec<Pair> {
    let mut o = opts.clone();
    o.backend = backend;
    o.algorithm = alg;
    o.sorted = true;
    let r = match b {
        Some(b) => engine().join(a, b, &o),
        None => engine().self_join(a, &o),
    }
    .unwrap_or_else(|e| panic!("{backend} {alg}: {e}"));
    r.pairs().unwrap().to_vec()
}

/// Points from a seed: kind 0 uniform, 1 clustered, 2 with duplicates, 3 on a lattice of
/// pitch eps (exact multiples, so distances of exactly eps occur), 4 far from the origin,
/// 5 a tiny cloud around zero.
fn points(seed: u64, n: usize, dim: usize, kind: u8, eps: f64) -> Vec<f64> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut v = Vec::with_capacity(n * dim);
    let centers: Vec<f64> = (0..4 * dim).map(|_| rnd()).collect();
    for i in 0..n {
        for j in 0..dim {
            let x = match kind {
                0 => rnd(),
                1 => centers[(i % 4) * dim + j] + (rnd() - 0.5) * 0.1,
                2 => {
                    if i % 3 == 0 && i > 0 {
                        v[(i - 1) * dim + j]
                    } else {
                        rnd()
                    }
                }
                3 => (rnd() * 8.0).floor() * eps,
                // Far from the origin: f32 rounding of coordinates and cell edges matter.
                4 => 1e5 + rnd() * 4.0 * eps,
                // Tiny scale around zero, negative coordinates included.
                _ => (rnd() - 0.5) * 4.0 * eps,
            };
            v.push(x);
        }
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn check(
    seed: u64,
    n: usize,
    m: usize,
    dim: usize,
    kind: u8,
    eps: f64,
    metric: Metric,
    f64_coords: bool,
    self_join: bool,
) {
    let xa = points(seed, n, dim, kind, eps);
    let xb = points(seed ^ 0xabcdef, m, dim, kind, eps);
    let (a32, b32): (Vec<f32>, Vec<f32>) = (
        xa.iter().map(|&x| x as f32).collect(),
        xb.iter().map(|&x| x as f32).collect(),
    );
    let (a, b) = if f64_coords {
        (
            Dataset::from_f64(&xa, dim).unwrap(),
            Dataset::from_f64(&xb, dim).unwrap(),
        )
    } else {
        (
            Dataset::from_f32(&a32, dim).unwrap(),
            Dataset::from_f32(&b32, dim).unwrap(),
        )
    };
    let mut opts = JoinOptions::new(eps);
    opts.metric = metric;
    let b = if self_join { None } else { Some(&b) };
    let cpu = run(&a, b, &opts, Backend::Cpu, Algorithm::Auto);
    let gpu = run(&a, b, &opts, Backend::Gpu, Algorithm::Grid);
    let want = match b {
        Some(b) => simjoin::oracle::join(&a, b, metric, eps),
        None => simjoin::oracle::self_join(&a, metric, eps),
    };
    assert_eq!(cpu, want, "CPU differs from the oracle");
    assert_eq!(
        cpu.len(),
        gpu.len(),
        "pair counts differ (cpu {}, gpu {})",
        cpu.len(),
        gpu.len()
    );
    assert_eq!(cpu, gpu);
    common::assert_no_validation_errors();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn cpu_and_gpu_agree(
        seed in any::<u64>(),
        n in 0usize..400,
        m in 0usize..300,
        dim in prop::sample::select(vec![1usize, 2, 3, 5, 8, 16, 33]),
        kind in 0u8..6,
        eps in prop::sample::select(vec![0.01f64, 0.05, 0.125, 0.3]),
        metric in prop::sample::select(vec![Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev]),
        f64_coords in any::<bool>(),
        self_join in any::<bool>(),
    ) {
        check(seed, n, m, dim, kind, eps, metric, f64_coords, self_join);
    }
}
