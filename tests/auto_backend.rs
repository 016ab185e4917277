//! `backend = auto`'s cost model (src/auto.rs) choosing between the CPU and a GPU, on
//! lavapipe with validation on: lavapipe is made a candidate with
//! `SIMJOIN_AUTO_ALLOW_SOFTWARE=1` and the cost table is faked with `SIMJOIN_AUTO_COSTS`
//! so that each backend wins in turn. Environment variables are the process's: each case
//! runs in a child process of its own.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, run_in_child, Rng, CHILD_ENV};
use simjoin::{Backend, Dataset, Engine, ErrorKind, JoinOptions, OutputForm};

fn points(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n * d).map(|_| rng.unit() as f32).collect()
}

/// Every output form and A ⋈ B under `auto` equals the CPU backend's, bit for bit, and
/// ran where `want` ("vulkan" or "cpu") says, with the model's note in the report.
fn auto_runs_on(want: &str) {
    let engine = Engine::new();
    let (xa, xb) = (points(1500, 3, 1), points(900, 3, 2));
    let (a, b) = (
        Dataset::from_f32(&xa, 3).unwrap(),
        Dataset::from_f32(&xb, 3).unwrap(),
    );
    let label = if want == "vulkan" { "gpu" } else { "cpu" };
    for (output, sorted) in [
        (OutputForm::Pairs, true),
        (OutputForm::Pairs, false),
        (OutputForm::Csr, true),
        (OutputForm::Count, false),
    ] {
        let mut auto = JoinOptions::new(0.08);
        auto.output = output;
        auto.sorted = sorted;
        let mut cpu = auto.clone();
        cpu.backend = Backend::Cpu;
        for ab in [false, true] {
            let (got, expect) = if ab {
                (
                    engine.join(&a, &b, &auto).unwrap(),
                    engine.join(&a, &b, &cpu).unwrap(),
                )
            } else {
                (
                    engine.self_join(&a, &auto).unwrap(),
                    engine.self_join(&a, &cpu).unwrap(),
                )
            };
            let what = format!("{output:?} sorted={sorted} ab={ab}");
            assert_eq!(got.report.backend, want, "{what}: {:?}", got.report.notes);
            assert!(
                got.report
                    .notes
                    .iter()
                    .any(|n| n.starts_with(&format!("backend auto: {label} (predicted cpu "))),
                "{what}: {:?}",
                got.report.notes
            );
            assert_eq!(got.count(), expect.count(), "{what}");
            match output {
                OutputForm::Pairs if sorted => assert_eq!(got.pairs(), expect.pairs(), "{what}"),
                OutputForm::Pairs => {
                    let mut g = got.pairs().unwrap().to_vec();
                    g.sort_unstable();
                    let mut e = expect.pairs().unwrap().to_vec();
                    e.sort_unstable();
                    assert_eq!(g, e, "{what}");
                }
                OutputForm::Csr => assert_eq!(got.csr(), expect.csr(), "{what}"),
                OutputForm::Count => {}
            }
        }
    }
    assert_no_validation_errors();
}

/// True in the child process that runs `test` with lavapipe weighed by `auto` and the cost
/// table `costs`; false in the parent, once that child has passed.
fn in_child_with_costs(test: &str, costs: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    run_in_child(
        test,
        &[
            ("SIMJOIN_AUTO_ALLOW_SOFTWARE", "1"),
            ("SIMJOIN_AUTO_COSTS", costs),
        ],
    );
    false
}

#[test]
fn auto_picks_the_gpu_when_it_is_predicted_cheaper() {
    let test = "auto_picks_the_gpu_when_it_is_predicted_cheaper";
    if in_child_with_costs(test, "gpu_scale=0.000001,sink_parallel=0") {
        auto_runs_on("vulkan");
    }
}

#[test]
fn auto_picks_the_cpu_when_it_is_predicted_cheaper() {
    let test = "auto_picks_the_cpu_when_it_is_predicted_cheaper";
    if in_child_with_costs(test, "cpu_scale=0.000001,sink_parallel=0") {
        auto_runs_on("cpu");
    }
}

/// Without the test switch, a software device is never weighed: the CPU runs, and the
/// report has no model note (checked where lavapipe is the only device).
#[test]
fn auto_never_weighs_a_software_device() {
    if !common::on_lavapipe() {
        return;
    }
    if std::env::var_os(CHILD_ENV).is_none() {
        return run_in_child(
            "auto_never_weighs_a_software_device",
            &[("SIMJOIN_AUTO_COSTS", "gpu_scale=0.000001")],
        );
    }
    let x = points(500, 2, 3);
    let data = Dataset::from_f32(&x, 2).unwrap();
    let r = Engine::new()
        .self_join(&data, &JoinOptions::new(0.05))
        .unwrap();
    assert_eq!(r.report.backend, "cpu");
    assert!(
        !r.report
            .notes
            .iter()
            .any(|n| n.starts_with("backend auto:")),
        "{:?}",
        r.report.notes
    );
}

/// A malformed cost table is the caller's error, not a silent default.
#[test]
fn a_bad_cost_table_is_an_error() {
    if !in_child_with_costs("a_bad_cost_table_is_an_error", "gpu_scale=fast") {
        return;
    }
    let x = points(300, 2, 4);
    let data = Dataset::from_f32(&x, 2).unwrap();
    let e = Engine::new()
        .self_join(&data, &JoinOptions::new(0.05))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("SIMJOIN_AUTO_COSTS"), "{e}");
}
