//! Stopping and watching jobs (`simjoin::Control`): a join that finds no pairs, a kNN
//! and a DBSCAN, on the CPU and on the GPU (lavapipe, validation on), stopped while
//! they run. Each must return `Cancelled` within 250 ms of the request, leave no thread
//! of it running (measured from the threads' CPU time, not assumed), and leave the
//! engine as fast as before. Progress must count a join's work and pairs exactly.

mod common;

use common::Rng;
use simjoin::{
    Algorithm, Backend, Control, Dataset, DbscanOptions, Engine, ErrorKind, JoinOptions,
    KnnOptions, OutputForm, Progress,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests measure the process's threads: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` uniform points in [0, 1)^d. In 32-D at eps 0.5 (and 16-D at 0.25) no two of a
/// few 100k are within eps (expected pairs ~1e-6), but boxes and cells that wide prune
/// nothing: the join compares nearly every pair, as the long joins users stop do.
fn uniform(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n * d).map(|_| rng.unit() as f32).collect()
}

/// The CPU ticks (utime + stime) of this process's threads named like the engine's or
/// lavapipe's workers.
fn worker_ticks() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ours = ["simjoin", "llvmpipe", "lavapipe"]
            .iter()
            .any(|p| comm.starts_with(p));
        if !ours {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is the 1st, utime the 12th, stime the 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// Asserts that no worker thread runs: their CPU time stays still over 300 ms (at most
/// 2 ticks of 10 ms, for the threads going to sleep).
fn assert_workers_idle(what: &str) {
    std::thread::sleep(Duration::from_millis(30));
    let before = worker_ticks();
    std::thread::sleep(Duration::from_millis(300));
    let used = worker_ticks() - before;
    assert!(
        used <= 2,
        "{what}: the job's threads used {used} ticks in the 300 ms after it returned"
    );
}

/// Runs `job` on another thread, cancels `control` after `after`, and returns the job's
/// outcome and how long the call took to return after the cancel.
fn stop_after<R: Send + 'static>(
    control: &Control,
    after: Duration,
    job: impl FnOnce() -> simjoin::Result<R> + Send + 'static,
) -> (simjoin::Result<R>, Duration) {
    common::stop_when(control, || std::thread::sleep(after), job)
}

/// As `stop_after`, stopping the job `after` past the moment it reached its batches
/// (stage "join").
#[cfg(feature = "gpu")]
fn stop_in_join<R: Send + 'static>(
    control: &Control,
    after: Duration,
    job: impl FnOnce() -> simjoin::Result<R> + Send + 'static,
) -> (simjoin::Result<R>, Duration) {
    stop_in_stage(control, "join", after, job)
}

/// As `stop_after`, stopping the job `after` past the moment it reached `stage`.
fn stop_in_stage<R: Send + 'static>(
    control: &Control,
    stage: &'static str,
    after: Duration,
    job: impl FnOnce() -> simjoin::Result<R> + Send + 'static,
) -> (simjoin::Result<R>, Duration) {
    let watched = control.clone();
    common::stop_when(
        control,
        move || common::wait_for_stage(&watched, stage, after),
        job,
    )
}

fn assert_cancelled<R>(what: &str, out: (simjoin::Result<R>, Duration)) {
    let (r, latency) = out;
    eprintln!("{what}: stopped {latency:?} after the request");
    match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Cancelled, "{what}: {e}"),
        Ok(_) => panic!("{what}: the job finished before it was stopped (make it longer)"),
    }
    assert!(
        latency < Duration::from_millis(250),
        "{what}: returned {latency:?} after the stop"
    );
    assert_workers_idle(what);
}

fn engine() -> Arc<Engine> {
    static E: std::sync::OnceLock<Arc<Engine>> = std::sync::OnceLock::new();
    E.get_or_init(|| Arc::new(Engine::new())).clone()
}

/// The seconds of a small join (the engine's "usual speed"), best of 3.
fn small_join_seconds(engine: &Engine, backend: Backend) -> f64 {
    let x = uniform(20_000, 3, 7);
    let data = Dataset::from_f32(&x, 3).unwrap();
    let mut o = JoinOptions::new(0.02);
    o.backend = backend;
    (0..3)
        .map(|_| {
            let t = Instant::now();
            engine.self_join(&data, &o).unwrap();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn assert_usual_speed(engine: &Engine, backend: Backend, before: f64) {
    let after = small_join_seconds(engine, backend);
    assert!(
        after < before * 2.0 + 0.02,
        "after a stop the next join took {after:.4} s against {before:.4} s before"
    );
}

/// Stops a no-pair 32-D self-join (every CPU algorithm, every output form) and A ⋈ B.
#[test]
fn cpu_joins_stop_within_250_ms() {
    let _one = serial();
    let e = engine();
    let before = small_join_seconds(&e, Backend::Cpu);
    let x = Arc::new(uniform(200_000, 32, 1));
    let y = Arc::new(uniform(200_000, 32, 2));
    let cases = [
        (Algorithm::Auto, OutputForm::Pairs, false, false),
        (Algorithm::Ego, OutputForm::Count, false, false),
        (Algorithm::Grid, OutputForm::Pairs, true, false),
        (Algorithm::Brute, OutputForm::Csr, false, false),
        (Algorithm::Auto, OutputForm::Pairs, false, true),
        (Algorithm::Ego, OutputForm::Csr, true, true),
    ];
    for (algorithm, output, sorted, ab) in cases {
        let control = Control::new();
        let mut o = JoinOptions::new(0.5);
        o.backend = Backend::Cpu;
        o.algorithm = algorithm;
        o.output = output;
        o.sorted = sorted;
        o.control = control.clone();
        let (e, x, y) = (e.clone(), x.clone(), y.clone());
        let what = format!("{algorithm} {output:?} sorted={sorted} A⋈B={ab}");
        let out = stop_after(&control, Duration::from_millis(300), move || {
            let a = Dataset::from_f32(&x, 32)?;
            let b = Dataset::from_f32(&y, 32)?;
            if ab {
                e.join(&a, &b, &o)
            } else {
                e.self_join(&a, &o)
            }
        });
        assert_cancelled(&what, out);
    }
    assert_usual_speed(&e, Backend::Cpu, before);
}

/// A streaming join stops too, and its sink is not called after the call returned.
#[test]
fn a_stream_stops_and_a_cancelled_control_stops_the_next_job_at_once() {
    let _one = serial();
    let e = engine();
    let x = Arc::new(uniform(200_000, 32, 3));
    let control = Control::new();
    let mut o = JoinOptions::new(0.5);
    o.backend = Backend::Cpu;
    o.control = control.clone();
    let (e2, x2, o2) = (e.clone(), x.clone(), o.clone());
    let out = stop_after(&control, Duration::from_millis(200), move || {
        let mut sink = simjoin::VecSink::default();
        e2.self_join_stream(&Dataset::from_f32(&x2, 32)?, &o2, &mut sink)
    });
    assert_cancelled("stream", out);
    // The control stays cancelled: the next job with it ends at once. (The dataset is made
    // before the clock starts: checking its 6.4 million coordinates is the caller's cost,
    // 20-40 ms on a loaded 2-core machine, and once took CI past the bound.)
    let data = Dataset::from_f32(&x, 32).unwrap();
    let t = Instant::now();
    let r = e.self_join(&data, &o);
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
    eprintln!("pre-cancelled job: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_millis(50));
}

#[test]
fn knn_and_dbscan_stop_within_250_ms() {
    let _one = serial();
    let e = engine();
    let before = small_join_seconds(&e, Backend::Cpu);
    let x = Arc::new(uniform(100_000, 32, 4));
    for algorithm in [Algorithm::KdTree, Algorithm::Brute] {
        let control = Control::new();
        let o = KnnOptions {
            backend: Backend::Cpu,
            algorithm,
            control: control.clone(),
            ..Default::default()
        };
        let (e, x) = (e.clone(), x.clone());
        let out = stop_after(&control, Duration::from_millis(300), move || {
            e.knn(&Dataset::from_f32(&x, 32)?, None, 10, &o)
        });
        assert_cancelled(&format!("knn {algorithm}"), out);
    }
    let low = Arc::new(uniform(2_000_000, 2, 5));
    let control = Control::new();
    let o = KnnOptions {
        backend: Backend::Cpu,
        algorithm: Algorithm::Grid,
        control: control.clone(),
        ..Default::default()
    };
    let (e2, low2) = (e.clone(), low.clone());
    let out = stop_after(&control, Duration::from_millis(300), move || {
        e2.knn(&Dataset::from_f32(&low2, 2)?, None, 30, &o)
    });
    assert_cancelled("knn grid", out);

    let control = Control::new();
    let mut o = DbscanOptions::new(0.5, 5);
    o.backend = Backend::Cpu;
    o.control = control.clone();
    let (e2, x2) = (e.clone(), x.clone());
    let out = stop_after(&control, Duration::from_millis(300), move || {
        simjoin::dbscan(&e2, &Dataset::from_f32(&x2, 32)?, &o)
    });
    assert_cancelled("dbscan", out);
    assert_usual_speed(&e, Backend::Cpu, before);
}

/// `n` rows of `d` coordinates around `centres` random directions (Gaussian centres plus
/// noise of `spread` per coordinate): data the grouped cosine index takes.
fn clustered_directions(n: usize, d: usize, centres: usize, spread: f64, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let cs: Vec<f64> = (0..centres * d).map(|_| rng.normal()).collect();
    let mut x: Vec<f32> = Vec::with_capacity(n * d);
    for _ in 0..n {
        let c = (rng.next() as usize) % centres;
        for t in 0..d {
            x.push((cs[c * d + t] + spread * rng.normal()) as f32);
        }
    }
    x
}

/// A cosine kNN (CPU) of `q` (None: `x` itself) against `x`, `d` wide, k neighbours,
/// stopped `after` into `stage`: it stops within 250 ms and leaves the engine as fast as
/// before.
fn cosine_knn_stops(
    what: &str,
    x: Vec<f32>,
    q: Option<Vec<f32>>,
    d: usize,
    k: usize,
    stage: &'static str,
    after: Duration,
) {
    let e = engine();
    let before = small_join_seconds(&e, Backend::Cpu);
    let control = Control::new();
    let o = KnnOptions {
        metric: simjoin::Metric::Cosine,
        backend: Backend::Cpu,
        control: control.clone(),
        ..Default::default()
    };
    let e2 = e.clone();
    let out = stop_in_stage(&control, stage, after, move || {
        let data = Dataset::from_f32(&x, d)?;
        let query = q.as_deref().map(|q| Dataset::from_f32(q, d)).transpose()?;
        e2.knn(&data, query.as_ref(), k, &o)
    });
    assert_cancelled(what, out);
    assert_usual_speed(&e, Backend::Cpu, before);
}

/// The cosine kNN through the grouped leaders' index (clustered directions) stops in its
/// search (stage "cosine kNN", which only that path enters).
#[test]
fn grouped_cosine_knn_stops_within_250_ms() {
    let _one = serial();
    let d = 32;
    let x = clustered_directions(200_000, d, 400, 0.05, 12);
    let stage = "cosine kNN";
    cosine_knn_stops(
        "grouped cosine knn",
        x,
        None,
        d,
        100,
        stage,
        Duration::from_millis(100),
    );
}

/// The cosine kNN of a few queries (under `cosine::SMALL_QUERIES`), which meets every row,
/// stops in that stage (its name is that path's alone).
#[test]
fn few_queries_cosine_knn_stops_within_250_ms() {
    let _one = serial();
    let d = 96;
    let (x, q) = (uniform(1_000_000, d, 14), uniform(255, d, 15));
    let stage = "cosine kNN: every query with every row";
    cosine_knn_stops(
        "few-queries cosine knn",
        x,
        Some(q),
        d,
        10,
        stage,
        Duration::from_millis(100),
    );
}

/// A cosine kNN that meets every row on clustered directions at 384-D (2,000 queries, 5,000
/// clusters: more leaders than half the queries) first bounds each query's k-th distance
/// from its rows nearest by their first coordinates (`cosine::seed_caps`): it stops in
/// that stage too.
#[test]
fn cosine_knn_bounds_stop_within_250_ms() {
    let _one = serial();
    let d = 384;
    let x = clustered_directions(200_000, d, 5_000, 0.01, 16);
    let q = clustered_directions(2_000, d, 5_000, 0.01, 16);
    let stage = "cosine kNN: bounds from the rows nearest by the first coordinates";
    cosine_knn_stops(
        "cosine knn's bounds",
        x,
        Some(q),
        d,
        10,
        stage,
        Duration::from_millis(10),
    );
}

/// A cosine join at eps 0.1 on `backend` and the control that stops it.
fn cosine_join(backend: Backend) -> (Control, JoinOptions) {
    let control = Control::new();
    let mut o = JoinOptions::new(0.1);
    o.metric = simjoin::Metric::Cosine;
    o.backend = backend;
    o.control = control.clone();
    (control, o)
}

/// The cosine join through the grouped leaders' index (clustered directions) stops while
/// it picks and assigns leaders, and while it joins the groups.
#[test]
fn grouped_cosine_join_stops_within_250_ms() {
    let _one = serial();
    let e = engine();
    let before = small_join_seconds(&e, Backend::Cpu);
    let d = 128;
    let x = Arc::new(clustered_directions(200_000, d, 4000, 0.1, 13));
    for after in [40, 150, 400] {
        let (control, o) = cosine_join(Backend::Cpu);
        let (e2, x2) = (e.clone(), x.clone());
        let out = stop_after(&control, Duration::from_millis(after), move || {
            e2.self_join(&Dataset::from_f32(&x2, d)?, &o)
        });
        assert_cancelled(&format!("grouped cosine join, stopped at {after} ms"), out);
    }
    // The leaders' assignment is a stage of its own, and stops within it.
    let (control, o) = cosine_join(Backend::Cpu);
    let e2 = e.clone();
    let out = stop_in_stage(
        &control,
        "cosine: grouping",
        Duration::from_millis(5),
        move || e2.self_join(&Dataset::from_f32(&x, d)?, &o),
    );
    assert_cancelled("grouped cosine join, stopped while grouping", out);
    assert_usual_speed(&e, Backend::Cpu, before);
}

/// Progress counts the join's work to the end and exactly its pairs; the callback comes
/// at the asked rate, and its `false` stops the job.
#[test]
fn progress_counts_work_and_pairs() {
    let _one = serial();
    let e = engine();
    let x = uniform(400_000, 2, 6);
    let data = Dataset::from_f32(&x, 2).unwrap();
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let log = seen.clone();
    let control = Control::with_progress(Duration::from_millis(1), move |p| {
        log.lock().unwrap().push(p.clone());
        true
    });
    for algorithm in [Algorithm::Grid, Algorithm::Ego] {
        seen.lock().unwrap().clear();
        let mut o = JoinOptions::new(0.004);
        o.backend = Backend::Cpu;
        o.algorithm = algorithm;
        o.output = OutputForm::Count;
        o.control = control.clone();
        let n = e.self_join(&data, &o).unwrap().count();
        assert!(n > 1_000_000, "{n}");
        let p = control.progress().unwrap();
        assert_eq!(p.stage, "join", "{algorithm}");
        assert_eq!(p.fraction, 1.0, "{algorithm}");
        assert_eq!(p.pairs, n, "{algorithm}: progress counted every pair");
        let calls = seen.lock().unwrap();
        assert!(!calls.is_empty(), "{algorithm}: the callback was called");
        let joins: Vec<&Progress> = calls.iter().filter(|p| p.stage == "join").collect();
        for w in joins.windows(2) {
            assert!(w[0].fraction <= w[1].fraction && w[0].pairs <= w[1].pairs);
        }
    }
    // A callback that answers false stops the job.
    let stop = Control::with_progress(Duration::from_millis(20), |p| p.elapsed < 0.2);
    let y = uniform(200_000, 32, 8);
    let mut o = JoinOptions::new(0.5);
    o.backend = Backend::Cpu;
    o.control = stop;
    let t = Instant::now();
    let r = e.self_join(&Dataset::from_f32(&y, 32).unwrap(), &o);
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );
}

/// The GPU path (lavapipe, validation on): a join, a count, a kNN and a DBSCAN stopped
/// while their batches run.
#[cfg(feature = "gpu")]
#[test]
fn gpu_jobs_stop_within_250_ms() {
    let _one = serial();
    common::gpu_test_setup();
    let e = engine();
    let before = small_join_seconds(&e, Backend::Gpu);
    let x = Arc::new(uniform(40_000, 16, 9));
    for (algorithm, output) in [
        (Algorithm::Grid, OutputForm::Pairs),
        (Algorithm::Brute, OutputForm::Count),
        (Algorithm::Lss, OutputForm::Pairs),
    ] {
        let control = Control::new();
        let mut o = JoinOptions::new(0.25);
        o.backend = Backend::Gpu;
        o.algorithm = algorithm;
        o.output = output;
        // Small batches: a stop waits for at most the few in flight.
        o.batch_points = Some(256);
        o.control = control.clone();
        let (e, x) = (e.clone(), x.clone());
        let out = stop_in_join(&control, Duration::from_millis(100), move || {
            e.self_join(&Dataset::from_f32(&x, 16)?, &o)
        });
        assert_cancelled(&format!("gpu {algorithm} {output:?}"), out);
    }
    // The grouped cosine join's tiles on the device (gpu/grouped.rs), stopped between
    // batches.
    let d = 64;
    let dirs = Arc::new(clustered_directions(60_000, d, 300, 0.1, 17));
    let (control, o) = cosine_join(Backend::Gpu);
    let (e2, dirs2) = (e.clone(), dirs.clone());
    let out = stop_in_join(&control, Duration::from_millis(100), move || {
        e2.self_join(&Dataset::from_f32(&dirs2, d)?, &o)
    });
    assert_cancelled("gpu grouped cosine join", out);
    // ... and while the device assigns the leaders (glsl/nearest_leaders.comp: dispatches
    // of many rows against a share of the leaders, the stop read between them).
    let (control, o) = cosine_join(Backend::Gpu);
    let (e2, dirs2) = (e.clone(), dirs.clone());
    let out = stop_in_stage(
        &control,
        "cosine: grouping",
        Duration::from_millis(5),
        move || e2.self_join(&Dataset::from_f32(&dirs2, d)?, &o),
    );
    assert_cancelled(
        "gpu grouped cosine join, stopped while assigning leaders",
        out,
    );
    let control = Control::new();
    let o = KnnOptions {
        backend: Backend::Gpu,
        algorithm: Algorithm::Brute,
        control: control.clone(),
        ..Default::default()
    };
    // On a hardware GPU ten times the points: the H200 finished 40k before the stop came
    // (2026-11-28).
    let xk = if common::on_lavapipe() {
        x.clone()
    } else {
        Arc::new(uniform(400_000, 16, 10))
    };
    let e2 = e.clone();
    let out = stop_in_stage(&control, "knn", Duration::from_millis(50), move || {
        e2.knn(&Dataset::from_f32(&xk, 16)?, None, 8, &o)
    });
    assert_cancelled("gpu knn", out);
    let control = Control::new();
    let mut o = DbscanOptions::new(0.25, 5);
    o.backend = Backend::Gpu;
    o.control = control.clone();
    let (e2, x2) = (e.clone(), x.clone());
    let out = stop_after(&control, Duration::from_millis(400), move || {
        simjoin::dbscan(&e2, &Dataset::from_f32(&x2, 16)?, &o)
    });
    assert_cancelled("gpu dbscan", out);
    assert_usual_speed(&e, Backend::Gpu, before);
    common::assert_no_validation_errors();
}
