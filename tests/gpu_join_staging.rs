//! The GPU joins through the discrete-GPU path (results, counters and query states copied
//! into pinned read-back buffers) on lavapipe, whose memory is otherwise mapped directly.
//! A separate test binary: the switch is an environment variable of the process.
#![cfg(feature = "gpu")]

mod common;

use common::assert_no_validation_errors;
use simjoin::{oracle, Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, OutputForm};

#[test]
fn staged_results_match_the_oracle() {
    common::gpu_test_setup();
    std::env::set_var("SIMJOIN_GPU_STAGING", "1");
    let engine = Engine::new();
    let mut state = 12345u64;
    let x: Vec<f32> = (0..600 * 3)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    let data = Dataset::from_f32(&x, 3).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.12);
    assert!(want.len() > 500, "{}", want.len());
    for algorithm in [Algorithm::Grid, Algorithm::Brute] {
        let mut o = JoinOptions::new(0.12);
        o.backend = Backend::Gpu;
        o.algorithm = algorithm;
        o.sorted = true;
        // Small result buffers: many partial downloads and resumed batches.
        o.result_buffer_pairs = Some(150);
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.pairs().unwrap(), &want[..], "{algorithm}");
        o.output = OutputForm::Count;
        assert_eq!(
            engine.self_join(&data, &o).unwrap().count(),
            want.len() as u64,
            "{algorithm}"
        );
        let ab = engine.join(&data, &data, &o).unwrap();
        assert_eq!(ab.count(), 2 * want.len() as u64 + 600, "{algorithm}");
    }
    assert_no_validation_errors();
}

/// The engine keeps its result slots (device result buffers, pinned read-back buffers)
/// between joins: a repeated join reuses them, a join needing another size or kind
/// allocates anew, and every result stays exact through the reuse.
#[test]
fn result_slots_are_reused_between_joins() {
    common::gpu_test_setup();
    std::env::set_var("SIMJOIN_GPU_STAGING", "1");
    let engine = Engine::new();
    let mut rng = common::Rng(777);
    let mut points =
        |n: usize, dim: usize| -> Vec<f32> { (0..n * dim).map(|_| rng.unit() as f32).collect() };
    let (x2, x5) = (points(700, 2), points(400, 5));
    let small = Dataset::from_f32(&x2, 2).unwrap();
    let wide = Dataset::from_f32(&x5, 5).unwrap();
    let reused = |r: &simjoin::JoinReport| {
        let note = r
            .notes
            .iter()
            .find(|n| n.starts_with("result slots: "))
            .unwrap_or_else(|| panic!("no slots note: {:?}", r.notes));
        note.contains("kept from")
    };
    let opts = |buffer: Option<usize>, output: OutputForm| {
        let mut o = JoinOptions::new(0.07);
        o.backend = Backend::Gpu;
        o.algorithm = Algorithm::Grid;
        o.sorted = true;
        o.result_buffer_pairs = buffer;
        o.output = output;
        o
    };
    // (data, result buffer, output, expect reuse)
    let steps = [
        (&small, Some(200), OutputForm::Pairs, false),
        (&small, Some(200), OutputForm::Pairs, true),
        (&wide, Some(200), OutputForm::Pairs, true),
        (&small, Some(300), OutputForm::Pairs, false),
        (&small, Some(300), OutputForm::Count, false),
        (&small, Some(300), OutputForm::Pairs, false),
        (&small, None, OutputForm::Pairs, false),
        // Fewer queries than the kept slots hold: reused.
        (&wide, None, OutputForm::Pairs, true),
    ];
    for (k, (data, buffer, output, expect)) in steps.into_iter().enumerate() {
        let want = oracle::self_join(data, Metric::Euclidean, 0.07);
        let got = engine.self_join(data, &opts(buffer, output)).unwrap();
        match output {
            OutputForm::Count => assert_eq!(got.count(), want.len() as u64, "step {k}"),
            _ => assert_eq!(got.pairs().unwrap(), &want[..], "step {k}"),
        }
        assert_eq!(
            reused(&got.report),
            expect,
            "step {k}: {:?}",
            got.report.notes
        );
    }
    assert_no_validation_errors();
}

/// Dispatches paced by time (`batch::Pace`): with a target of 0.2 ms each thread's loop
/// budget shrinks until dispatches fit it, threads stop and resume many times, and no
/// pair is lost or repeated: 2-D, 6-D and 16-D (the dot-product filter, one thread per
/// query and in shared-memory tiles), self-join and A ⋈ B.
#[test]
fn dispatches_paced_by_time_lose_no_pair() {
    if std::env::var_os(common::CHILD_ENV).is_none() {
        for tile in ["0", "1"] {
            common::run_in_child(
                "dispatches_paced_by_time_lose_no_pair",
                &[
                    ("SIMJOIN_GPU_DISPATCH_MS", "0.2"),
                    ("SIMJOIN_GPU_TILE", tile),
                ],
            );
        }
        return;
    }
    std::env::set_var("SIMJOIN_GPU_STAGING", "1");
    let engine = Engine::new();
    let mut rng = common::Rng(4242);
    let mut resumed_in_all = 0;
    for (dim, n, eps) in [(2usize, 3000usize, 0.03), (6, 1500, 0.35), (16, 800, 1.1)] {
        let x: Vec<f32> = (0..n * dim).map(|_| rng.unit() as f32).collect();
        let data = Dataset::from_f32(&x, dim).unwrap();
        let (a, b) = (
            Dataset::from_f32(&x[..n / 2 * dim], dim).unwrap(),
            Dataset::from_f32(&x[n / 2 * dim..], dim).unwrap(),
        );
        let mut o = JoinOptions::new(eps);
        o.backend = Backend::Gpu;
        o.algorithm = Algorithm::Grid;
        o.sorted = true;
        let want = oracle::self_join(&data, Metric::Euclidean, eps);
        assert!(want.len() > n, "{dim}-D: {} pairs", want.len());
        let got = engine.self_join(&data, &o).unwrap();
        assert_eq!(got.pairs().unwrap(), &want[..], "{dim}-D");
        let resumed = got
            .report
            .notes
            .iter()
            .find_map(|n| {
                n.split(" resumed")
                    .next()?
                    .rsplit(", ")
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no dispatch note: {:?}", got.report.notes));
        resumed_in_all += resumed;
        let want_ab = oracle::join(&a, &b, Metric::Euclidean, eps);
        let got_ab = engine.join(&a, &b, &o).unwrap();
        assert_eq!(got_ab.pairs().unwrap(), &want_ab[..], "{dim}-D A join B");
    }
    // lavapipe's dispatches take milliseconds: some had to stop and resume. (A hardware
    // GPU may finish these small joins faster than the target.)
    if common::on_lavapipe() {
        assert!(resumed_in_all > 0);
    }
    assert_no_validation_errors();
}
