//! A stop ends the GPU dispatch in flight, not only the batches after it: the join
//! kernels read the job's stop word (glsl/join_common.glsl) while they run. On a hardware
//! GPU one dispatch of a high-dimensional join runs for seconds (H200, 2026-11-27: a stop
//! waited 484 ms for one); here lavapipe's dispatches are made as long by turning its
//! pacing off (`SIMJOIN_GPU_DISPATCH_MS=0`, read per join, hence a binary of its own) and
//! giving each batch 64k queries. Validation on; a validation error fails it.
#![cfg(feature = "gpu")]

mod common;

use common::Rng;
use simjoin::{Algorithm, Backend, Control, Dataset, Engine, ErrorKind, JoinOptions, OutputForm};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_stop_ends_the_dispatch_in_flight() {
    common::gpu_test_setup();
    // SAFETY (of the environment): this binary's only test, set before any engine exists.
    std::env::set_var("SIMJOIN_GPU_DISPATCH_MS", "0");
    let e = Arc::new(Engine::new());
    let mut rng = Rng(11);
    // 16-D uniform at eps 0.25: no pairs, every query compares with nearly every point.
    // On a hardware GPU ten times the points (a hundred times the work): the H200 finished
    // 120k before the stop came (2026-11-28).
    let n = if common::on_lavapipe() {
        120_000
    } else {
        1_200_000
    };
    let x: Arc<Vec<f32>> = Arc::new((0..n * 16).map(|_| rng.unit() as f32).collect());
    for (algorithm, output) in [
        (Algorithm::Grid, OutputForm::Pairs),
        (Algorithm::Brute, OutputForm::Count),
    ] {
        let mut o = JoinOptions::new(0.25);
        o.backend = Backend::Gpu;
        o.algorithm = algorithm;
        o.output = output;
        o.batch_points = Some(1 << 16);
        let control = Control::new();
        o.control = control.clone();
        let e = e.clone();
        let x = x.clone();
        let job = move || e.self_join(&Dataset::from_f32(&x, 16)?, &o).map(|_| ());
        // Into the batches (stage "join"), then well into a dispatch: the stop must find
        // one in flight, not the planning before it.
        let wait = || common::wait_for_stage(&control, "join", Duration::from_millis(300));
        let (r, latency) = common::stop_when(&control, wait, job);
        eprintln!("{algorithm} {output:?}: returned {latency:?} after the stop");
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
        assert!(
            latency < Duration::from_millis(250),
            "{algorithm} {output:?}: returned {latency:?} after the stop"
        );
    }
    common::assert_no_validation_errors();
}
