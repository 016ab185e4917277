//! High-dimensional Euclidean joins, where the CPU EGO*-join runs its leaves through the
//! f32 dot-product filter (src/cpu/dot_filter.rs): the filter may only reject pairs it
//! proves are out, so every case here is compared exactly with the brute-force oracle,
//! on data built to sit on the filter's edges: pairs within an ulp or two of eps, data far
//! from the origin, spreads far wider than eps, magnitudes beyond f32, duplicates, ragged
//! leaf and tile sizes. Each case also asserts whether the filter ran, so a change that
//! silently turns it off fails here. `portable_kernel_too` reruns everything without AVX2.

mod common;

use common::{each_precision, threshold_pairs, Rng};
use simjoin::{oracle, Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, Pair};

const FILTER_NOTE: &str = "dot-product filter (";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    Filter,
    NoFilter,
    /// Either (the data's f32 rounding decides).
    Any,
}

fn opts(eps: f64, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Cpu;
    o.algorithm = algorithm;
    o.metric = Metric::Euclidean;
    o
}

fn sorted(mut p: Vec<Pair>) -> Vec<Pair> {
    p.sort_unstable();
    p
}

/// Self-join (and, with `y`, A ⋈ B) with EGO and auto against the oracle.
fn check(data: &Dataset, other: Option<&Dataset>, eps: f64, expect: Expect, what: &str) {
    let want = match other {
        Some(b) => oracle::join(data, b, Metric::Euclidean, eps),
        None => oracle::self_join(data, Metric::Euclidean, eps),
    };
    for alg in [Algorithm::Ego, Algorithm::Auto] {
        let o = opts(eps, alg);
        let r = match other {
            Some(b) => Engine::new().join(data, b, &o),
            None => Engine::new().self_join(data, &o),
        }
        .unwrap();
        let notes = r.report.notes.join("; ");
        let got = sorted(r.pairs().unwrap().to_vec());
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
                "{what} {alg} {:?} d={} n={}: {} pairs, want {} ({missing} missing, {extra} extra); {notes}",
                data.precision(),
                data.dim(),
                data.len(),
                got.len(),
                want.len()
            );
        }
        if alg == Algorithm::Ego && data.dim() >= 8 && expect != Expect::Any {
            assert_eq!(
                notes.contains(FILTER_NOTE),
                expect == Expect::Filter,
                "{what}: filter use; {notes}"
            );
            if expect == Expect::Filter && std::env::var_os("SIMJOIN_NO_AVX2").is_some() {
                assert!(notes.contains("portable"), "{notes}");
            }
        }
    }
}

#[test]
fn pairs_an_ulp_from_eps() {
    for (d, n) in [(8, 700), (16, 500), (33, 400), (64, 300), (100, 200)] {
        let eps = 0.05 * (d as f64).sqrt();
        let x = threshold_pairs(n, d, eps, 1.0, 0.0, d as u64);
        each_precision(&x, d, |data| {
            check(data, None, eps, Expect::Filter, "ulp pairs");
            // eps nudged: boundary cases in the other rounding.
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
    // Offsets much larger than eps: centring must remove them before f32 products.
    for (d, offset, scale, eps) in [
        (16, 1000.0, 1.0, 0.4),
        (32, -5.0e4, 20.0, 9.0),
        (24, 1.0e6, 1e-3, 2e-4),
    ] {
        let x = threshold_pairs(300, d, eps, scale, offset, 11);
        check(
            &Dataset::from_f64(&x, d).unwrap(),
            None,
            eps,
            Expect::Filter,
            "offset f64",
        );
        // f32 keeps ~7 digits: at 1e6 the points collapse onto a coarse lattice.
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let expect = if offset > 1e5 {
            Expect::Any
        } else {
            Expect::Filter
        };
        check(
            &Dataset::from_f32(&x32, d).unwrap(),
            None,
            eps,
            expect,
            "offset f32",
        );
    }
}

#[test]
fn spread_far_wider_than_eps() {
    // Points 1e5 eps apart on average: the filter's error term would exceed eps^2, so it
    // must switch itself off (and the answer must not change).
    let d = 16;
    let mut r = Rng(3);
    let mut x: Vec<f64> = (0..800 * d).map(|_| 1e4 * r.unit()).collect();
    // A few genuine neighbours.
    for i in 0..50 {
        for j in 0..d {
            let v = x[i * d + j] + 0.01 * r.normal();
            x.push(v);
        }
    }
    each_precision(&x, d, |data| {
        check(data, None, 0.05, Expect::NoFilter, "wide spread")
    });
    // 50 eps wide: the filter runs and loses nothing.
    let mut y: Vec<f64> = (0..800 * d).map(|_| 5.0 * r.unit()).collect();
    for i in 0..100 {
        for j in 0..d {
            let v = y[i * d + j] + 0.02 * r.normal();
            y.push(v);
        }
    }
    each_precision(&y, d, |data| {
        check(data, None, 0.1, Expect::Filter, "50 eps spread")
    });
}

#[test]
fn magnitudes_beyond_f32_and_tiny_eps() {
    let d = 12;
    let mut r = Rng(5);
    // f64 values near 1e150 (infinite in f32): the filter must refuse the data.
    let mut base: Vec<f64> = (0..200 * d).map(|_| 1e150 * (1.0 + r.unit())).collect();
    for i in 0..40 * d {
        base.push(base[i] + 3e149 * r.normal());
    }
    let data = Dataset::from_f64(&base, d).unwrap();
    check(&data, None, 6e149, Expect::NoFilter, "1e150");
    // One outlier at 1e25 among unit data: still exact (the filter stands down).
    let mut x: Vec<f64> = (0..300 * d).map(|_| r.unit()).collect();
    x[5] = 1e25;
    let data = Dataset::from_f64(&x, d).unwrap();
    check(&data, None, 0.6, Expect::NoFilter, "outlier");
    // Data and eps around 1e-20: eps^2 underflows f32's normal range. In f64 (normal
    // there) the join is exact and the f32 filter stands down; f32 data would compare
    // with a subnormal threshold (which a GPU may flush to zero): an error.
    let tiny: Vec<f64> = (0..300 * d).map(|_| 1e-20 * r.unit()).collect();
    check(
        &Dataset::from_f64(&tiny, d).unwrap(),
        None,
        6e-21,
        Expect::NoFilter,
        "tiny",
    );
    let tiny32: Vec<f32> = tiny.iter().map(|&v| v as f32).collect();
    let o = opts(6e-21, Algorithm::Auto);
    let err = Engine::new()
        .self_join(&Dataset::from_f32(&tiny32, d).unwrap(), &o)
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn duplicates_ragged_sizes_and_a_join_b() {
    let d = 40;
    let mut r = Rng(9);
    let distinct: Vec<f64> = (0..5 * d).map(|_| r.unit()).collect();
    for n in [0usize, 1, 2, 3, 17, 129, 257, 1031] {
        let x: Vec<f64> = (0..n)
            .flat_map(|i| {
                let k = (i * 7 + i / 3) % 5;
                distinct[k * d..(k + 1) * d].to_vec()
            })
            .collect();
        let y: Vec<f64> = (0..n * d).map(|_| r.unit()).collect();
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
            let expect = if n == 0 {
                Expect::NoFilter
            } else {
                Expect::Filter
            };
            check(a, None, 0.05, expect, "duplicates");
            // Near-duplicate eps: the error term would exceed eps^2, so no filter (one
            // point is its own centre: no error term at all).
            let expect = if n == 1 {
                Expect::Any
            } else {
                Expect::NoFilter
            };
            check(a, None, 1e-4, expect, "duplicates, tiny eps");
            if n > 1 {
                check(b, None, 1.3, Expect::Filter, "uniform");
                check(a, Some(b), 1.4, Expect::Filter, "A⋈B");
                check(b, Some(a), 1.4, Expect::Filter, "B⋈A");
            }
        }
    }
}

#[test]
fn exponential_like_the_benchmark() {
    // GPU-JOIN's data: exponential (lambda = 40) in [0,1]^d, eps for ~1-100 neighbours.
    for (d, eps) in [(16, 0.05), (32, 0.1), (64, 0.18)] {
        let mut r = Rng(d as u64);
        let x: Vec<f64> = (0..2500 * d)
            .map(|_| (-(1.0 - r.unit()).ln() / 40.0).min(1.0))
            .collect();
        each_precision(&x, d, |data| {
            check(data, None, eps, Expect::Filter, "exponential")
        });
    }
}

/// Everything above once more with the portable (non-AVX2) kernel, in a child process
/// because the switch is read from the environment.
#[test]
fn portable_kernel_too() {
    if std::env::var_os("SIMJOIN_NO_AVX2").is_some() {
        return; // already the child
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .env("SIMJOIN_NO_AVX2", "1")
        .args(["--skip", "portable_kernel_too", "--test-threads", "2"])
        .status()
        .unwrap();
    assert!(status.success(), "the portable kernel failed a case");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Random high-dimensional inputs of several shapes: uniform, clustered, snapped to a
    /// lattice (exact ties), heavily duplicated, far from the origin; eps from a tiny share
    /// to about the spread; self-join and A ⋈ B, both precisions, against the oracle.
    #[test]
    fn random_high_dimensional_cases(
        d in 8usize..80,
        n in 0usize..300,
        m in 1usize..120,
        shape in 0usize..5,
        eps_share in 0.02f64..0.6,
        offset in proptest::prop_oneof![proptest::strategy::Just(0.0f64), proptest::strategy::Just(1e4), -1e3f64..1e3],
        seed in proptest::prelude::any::<u64>(),
    ) {
        let mut r = Rng(seed);
        let point = |r: &mut Rng, i: usize| -> Vec<f64> {
            match shape {
                0 => (0..d).map(|_| r.unit()).collect(),
                1 => (0..d).map(|j| ((i % 4) as f64 * 0.3 + j as f64 * 1e-3) + 0.05 * r.normal()).collect(),
                2 => (0..d).map(|_| (r.unit() * 8.0).round() / 8.0).collect(),
                3 => (0..d).map(|j| ((i % 3) * 7 + j) as f64 % 5.0 * 0.1).collect(),
                _ => (0..d).map(|_| -(1.0 - r.unit()).ln() / 40.0).collect(),
            }
        };
        let mut x = Vec::with_capacity(n * d);
        for i in 0..n {
            x.extend(point(&mut r, i).into_iter().map(|v| v + offset));
        }
        let mut y = Vec::with_capacity(m * d);
        for i in 0..m {
            y.extend(point(&mut r, i + 1).into_iter().map(|v| v + offset));
        }
        // Typical spread of a pair in these shapes is ~sqrt(d / 6).
        let eps = eps_share * (d as f64 / 6.0).sqrt();
        each_precision(&x, d, |a| check(a, None, eps, Expect::Any, "random"));
        let (x32, y32): (Vec<f32>, Vec<f32>) = (
            x.iter().map(|&v| v as f32).collect(),
            y.iter().map(|&v| v as f32).collect(),
        );
        let a = Dataset::from_f32(&x32, d).unwrap();
        let b = Dataset::from_f32(&y32, d).unwrap();
        check(&a, Some(&b), eps, Expect::Any, "random A⋈B f32");
        let a = Dataset::from_f64(&x, d).unwrap();
        let b = Dataset::from_f64(&y, d).unwrap();
        check(&a, Some(&b), eps, Expect::Any, "random A⋈B f64");
    }
}
