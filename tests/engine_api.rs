//! The engine's contract, independent of backend: bad input gets a clear error of the right
//! kind, trivial inputs give exact (empty) answers, and output forms agree with each other.

mod common;

use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, EngineOptions, ErrorKind, JoinOptions, JoinOutput,
    Metric, OutputForm,
};

fn cpu(eps: f64) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Cpu;
    o
}

#[test]
fn non_finite_coordinates_are_rejected() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let pts = [0.0, 1.0, bad, 2.0];
        let err = Dataset::from_f32(&pts, 2).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("point 1"), "{err}");
    }
    let err = Dataset::from_f64(&[f64::NAN], 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn bad_shapes_are_rejected() {
    assert_eq!(
        Dataset::from_f32(&[1.0, 2.0], 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        Dataset::from_f32(&[1.0, 2.0, 3.0], 2).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn bad_eps_is_rejected() {
    let pts = [0.0f32, 0.0, 1.0, 1.0];
    let d = Dataset::from_f32(&pts, 2).unwrap();
    for eps in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = Engine::new().self_join(&d, &cpu(eps)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "eps {eps}");
        assert!(err.to_string().contains("eps"), "{err}");
    }
}

#[test]
fn mismatched_sets_are_rejected() {
    let a = [0.0f32; 4];
    let b = [0.0f32; 6];
    let b64 = [0.0f64; 4];
    let da = Dataset::from_f32(&a, 2).unwrap();
    let db = Dataset::from_f32(&b, 3).unwrap();
    let err = Engine::new().join(&da, &db, &cpu(1.0)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("dimensions"), "{err}");
    let db64 = Dataset::from_f64(&b64, 2).unwrap();
    let err = Engine::new().join(&da, &db64, &cpu(1.0)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn tiny_inputs() {
    let engine = Engine::new();
    let empty: [f32; 0] = [];
    let one = [0.5f32, 0.5];
    let two = [0.0f32, 0.0, 1.0, 0.0];
    for (pts, expect) in [
        (&empty[..], vec![]),
        (&one[..], vec![]),
        (&two[..], vec![[0u32, 1u32]]),
    ] {
        let d = Dataset::from_f32(pts, 2).unwrap();
        let r = engine.self_join(&d, &cpu(1.0)).unwrap();
        assert_eq!(r.pairs().unwrap(), &expect[..]);
        assert_eq!(r.count(), expect.len() as u64);
    }
    // Exactly eps apart matches; a hair further does not.
    let d = Dataset::from_f32(&two, 2).unwrap();
    assert_eq!(engine.self_join(&d, &cpu(0.99999)).unwrap().count(), 0);
    // Empty A or B.
    let de = Dataset::from_f32(&empty, 2).unwrap();
    assert_eq!(engine.join(&de, &d, &cpu(1.0)).unwrap().count(), 0);
    assert_eq!(engine.join(&d, &de, &cpu(1.0)).unwrap().count(), 0);
}

#[test]
fn output_forms_agree() {
    // Small clustered set with duplicates.
    let mut pts = Vec::new();
    let mut s = 12345u64;
    let mut rnd = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 / (1u64 << 53) as f64) as f32
    };
    for i in 0..300 {
        let c = (i % 3) as f32;
        pts.extend([c + rnd() * 0.5, c + rnd() * 0.5, rnd()]);
    }
    pts.extend_from_within(0..30);
    let d = Dataset::from_f32(&pts, 3).unwrap();
    let engine = Engine::new();
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        let want = oracle::self_join(&d, metric, 0.2);
        let mut o = cpu(0.2);
        o.metric = metric;
        o.sorted = true;
        let r = engine.self_join(&d, &o).unwrap();
        assert_eq!(r.pairs().unwrap(), &want[..]);

        o.output = OutputForm::Count;
        assert_eq!(
            engine.self_join(&d, &o).unwrap().output,
            JoinOutput::Count(want.len() as u64)
        );

        o.output = OutputForm::Csr;
        let csr = engine.self_join(&d, &o).unwrap();
        let csr = csr.csr().unwrap();
        assert_eq!(csr.offsets.len(), d.len() + 1);
        let mut from_csr = Vec::new();
        for i in 0..d.len() {
            for &j in &csr.neighbors[csr.offsets[i] as usize..csr.offsets[i + 1] as usize] {
                assert_ne!(i as u32, j, "self excluded by default");
                if (i as u32) < j {
                    from_csr.push([i as u32, j]);
                }
            }
        }
        assert_eq!(from_csr, want);
        assert_eq!(csr.neighbors.len(), 2 * want.len());
    }
}

/// A sink with parts (`PairSink::parts`): the CPU workers push to the parts (never to the
/// sink itself), every pair once across them; with one worker, everything goes to `push`.
#[test]
fn sink_parts_receive_every_pair_once() {
    // 60k uniform 2-D points, about 32 neighbours each: ~950k pairs, many chunks a worker.
    let mut rng = common::Rng(99);
    let pts: Vec<f64> = (0..120_000).map(|_| rng.unit()).collect();
    let d = Dataset::from_f64(&pts, 2).unwrap();
    let eps = 0.013;
    for threads in [1, 3] {
        let engine = Engine::with_options(EngineOptions {
            threads: Some(threads),
            ..Default::default()
        })
        .unwrap();
        let mut sorted = cpu(eps);
        sorted.sorted = true;
        let want = engine.self_join(&d, &sorted).unwrap();
        let want = want.pairs().unwrap();
        assert!(want.len() > 500_000, "{} pairs", want.len());
        let mut sink = common::SplitSink::default();
        let report = engine.self_join_stream(&d, &cpu(eps), &mut sink).unwrap();
        let mut got = if threads == 1 {
            assert!(sink.parts.is_empty());
            std::mem::take(&mut sink.own)
        } else {
            assert!(sink.own.is_empty(), "a sink with parts got pairs itself");
            assert_eq!(sink.parts.len(), threads);
            sink.parts
                .iter()
                .flat_map(|p| p.0.iter().copied())
                .collect()
        };
        got.sort_unstable();
        assert_eq!(got, want, "{threads} threads");
        assert_eq!(report.pairs as usize, got.len());
    }
}

#[test]
fn sink_error_cancels_the_join() {
    let pts: Vec<f32> = (0..200).map(|i| (i % 7) as f32).collect();
    let d = Dataset::from_f32(&pts, 1).unwrap();
    let mut sink = |_: &[simjoin::Pair]| -> anyhow::Result<()> { anyhow::bail!("disk full") };
    let err = Engine::new()
        .self_join_stream(&d, &cpu(0.5), &mut sink)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(err.to_string().contains("disk full"), "{err}");
}

/// `Engine::neighbour_counts` on the CPU (counted from the streamed pairs): each point's
/// neighbours, itself included, as the oracle's pairs give them, on every metric, with
/// duplicates and points exactly eps apart; bad eps is an error; n = 0, 1.
#[test]
fn neighbour_counts_match_the_oracle() {
    let engine = Engine::new();
    // A 6 x 6 lattice of pitch 0.5 (exact eps distances) plus 8 duplicates of one corner.
    let mut pts: Vec<f64> = (0..36)
        .flat_map(|i| [(i % 6) as f64 * 0.5, (i / 6) as f64 * 0.5])
        .collect();
    pts.extend(std::iter::repeat_n([0.0, 0.0], 8).flatten());
    let data = Dataset::from_f64(&pts, 2).unwrap();
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        let mut o = cpu(0.5);
        o.metric = metric;
        let pairs = oracle::self_join(&data, metric, 0.5);
        let mut want = vec![1u32; data.len()];
        for &[i, j] in &pairs {
            want[i as usize] += 1;
            want[j as usize] += 1;
        }
        let (got, report) = engine.neighbour_counts(&data, &o).unwrap();
        assert_eq!(got, want, "{metric}");
        assert_eq!(report.pairs, pairs.len() as u64, "{metric}");
    }
    assert_eq!(
        engine
            .neighbour_counts(&data, &cpu(0.0))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    let one = Dataset::from_f64(&[1.0, 2.0], 2).unwrap();
    assert_eq!(engine.neighbour_counts(&one, &cpu(0.5)).unwrap().0, vec![1]);
    let none = Dataset::from_f64(&[], 2).unwrap();
    assert!(engine
        .neighbour_counts(&none, &cpu(0.5))
        .unwrap()
        .0
        .is_empty());
}

/// 2^s exactly, subnormals included (`powi` rounds on the way down there).
fn pow2(s: i32) -> f64 {
    if s >= -1022 {
        f64::from_bits(((s + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (s + 1074))
    }
}

/// A 5 x 5 x 5 lattice of pitch `h` (a power of two, so every coordinate, difference and
/// square is exact).
fn lattice(h: f64) -> Vec<f64> {
    (0..125)
        .flat_map(|i| {
            [
                (i % 5) as f64 * h,
                (i / 5 % 5) as f64 * h,
                (i / 25) as f64 * h,
            ]
        })
        .collect()
}

/// Extreme magnitudes: the same lattice scaled by 2^s with eps = the pitch gives the same
/// pairs wherever the threshold (eps² for Euclidean) is a normal number; beyond that range
/// (eps² infinite, zero or subnormal) it is a clear error, never the wrong pairs the
/// overflowed or underflowed comparison would give (every pair "within" eps).
#[test]
fn extreme_magnitudes_are_exact_or_rejected() {
    let engine = Engine::new();
    let unit = lattice(1.0);
    let unit_data = Dataset::from_f64(&unit, 3).unwrap();
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        let want = oracle::self_join(&unit_data, metric, 1.0);
        assert!(!want.is_empty());
        // (scale exponents that must work, that must fail) per precision.
        let (ok64, bad64): (Vec<i32>, Vec<i32>) = if metric == Metric::Euclidean {
            (vec![-511, -300, 0, 300, 510], vec![-512, -600, 512, 600])
        } else {
            (vec![-1022, -511, 0, 511, 1000], vec![-1023, -1074])
        };
        let (ok32, bad32): (Vec<i32>, Vec<i32>) = if metric == Metric::Euclidean {
            (vec![-63, 0, 62], vec![-64, -70, 64, 70])
        } else {
            (vec![-126, 0, 120], vec![-127, -140])
        };
        for algorithm in [
            Algorithm::Auto,
            Algorithm::Grid,
            Algorithm::Ego,
            Algorithm::Brute,
        ] {
            let mut o = cpu(1.0);
            o.metric = metric;
            o.algorithm = algorithm;
            o.sorted = true;
            for (s, ok) in ok64
                .iter()
                .map(|&s| (s, true))
                .chain(bad64.iter().map(|&s| (s, false)))
            {
                let h = pow2(s);
                let x = lattice(h);
                let data = Dataset::from_f64(&x, 3).unwrap();
                o.eps = h;
                let what = format!("{metric} {algorithm} f64 2^{s}");
                check_scaled(&engine, &data, &o, ok, &want, &what);
            }
            for (s, ok) in ok32
                .iter()
                .map(|&s| (s, true))
                .chain(bad32.iter().map(|&s| (s, false)))
            {
                let h = pow2(s);
                let x: Vec<f32> = lattice(h).iter().map(|&v| v as f32).collect();
                let data = Dataset::from_f32(&x, 3).unwrap();
                o.eps = h;
                let what = format!("{metric} {algorithm} f32 2^{s}");
                check_scaled(&engine, &data, &o, ok, &want, &what);
            }
        }
    }
}

fn check_scaled(
    engine: &Engine,
    data: &Dataset,
    o: &JoinOptions,
    ok: bool,
    want: &[simjoin::Pair],
    what: &str,
) {
    let got = engine.self_join(data, o);
    let counts = engine.neighbour_counts(data, o);
    let mut d = simjoin::DbscanOptions::new(o.eps, 3);
    d.metric = o.metric;
    d.backend = o.backend;
    let clusters = simjoin::dbscan(engine, data, &d);
    if ok {
        let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got.pairs().unwrap(), want, "{what}");
        assert_eq!(counts.unwrap().1.pairs, want.len() as u64, "{what}");
        assert_eq!(clusters.unwrap().clusters, 1, "{what}");
    } else {
        for err in [
            got.map(|_| ()).unwrap_err(),
            counts.map(|_| ()).unwrap_err(),
            clusters.map(|_| ()).unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}");
            assert!(err.to_string().contains("out of range"), "{what}: {err}");
        }
    }
}

/// kNN ranks distances in the input precision: points so far apart that a distance
/// overflows are an error; a lattice scaled to the edge of the range ranks as at scale 1.
#[test]
fn knn_extreme_magnitudes() {
    let engine = Engine::new();
    // Centred on 0 (coordinates -2h..2h): differences of 4h overflow before any
    // coordinate does, for Chebyshev too.
    let centred = |h: f64| -> Vec<f64> {
        let c = |v: usize| (v as f64 - 2.0) * h;
        (0..125)
            .flat_map(|i| [c(i % 5), c(i / 5 % 5), c(i / 25)])
            .collect()
    };
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        let o = simjoin::KnnOptions {
            metric,
            backend: Backend::Cpu,
            ..Default::default()
        };
        let unit = centred(1.0);
        let unit_data = Dataset::from_f64(&unit, 3).unwrap();
        let want = engine.knn(&unit_data, None, 6, &o).unwrap().indices;
        // Largest squared (Euclidean) distance of the lattice: 48 h^2 < 2^6 h^2.
        let (ok, bad) = if metric == Metric::Euclidean {
            (505, 512)
        } else {
            (1018, 1022)
        };
        let x = centred(pow2(ok));
        let got = engine
            .knn(&Dataset::from_f64(&x, 3).unwrap(), None, 6, &o)
            .unwrap_or_else(|e| panic!("{metric} 2^{ok}: {e}"));
        assert_eq!(got.indices, want, "{metric} 2^{ok}");
        let x = centred(pow2(bad));
        let err = engine
            .knn(&Dataset::from_f64(&x, 3).unwrap(), None, 6, &o)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{metric} 2^{bad}");
        assert!(err.to_string().contains("overflows"), "{err}");
    }
}
