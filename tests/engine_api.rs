//! The engine's contract, independent of backend: bad input gets a clear error of the right
//! kind, trivial inputs give exact (empty) answers, and output forms agree with each other.

use simjoin::{
    oracle, Backend, Dataset, Engine, ErrorKind, JoinOptions, JoinOutput, Metric, OutputForm,
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
