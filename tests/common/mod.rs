//! Shared test helpers: setup for tests that touch Vulkan (pins lavapipe and turns
//! validation on before the first Vulkan call, checks that the validation layers reported
//! no error), and a small deterministic random generator.
#![allow(dead_code)]

use std::sync::Once;

static SETUP: Once = Once::new();

/// Lavapipe's ICD manifest on Debian/Ubuntu x86-64.
pub const LAVAPIPE_ICD: &str = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json";

/// Idempotent: sets `VK_DRIVER_FILES` to lavapipe when unset and `SIMJOIN_VALIDATION=1`.
/// Call it first in every GPU test.
pub fn gpu_test_setup() {
    SETUP.call_once(|| {
        // Safe enough: runs once, before any test in this binary has touched Vulkan.
        if std::env::var_os("VK_DRIVER_FILES").is_none()
            && std::env::var_os("VK_ICD_FILENAMES").is_none()
        {
            std::env::set_var("VK_DRIVER_FILES", LAVAPIPE_ICD);
        }
        std::env::set_var("SIMJOIN_VALIDATION", "1");
    });
}

/// Whether the GPU tests run on lavapipe (CI, and `VK_DRIVER_FILES` unset) rather than on
/// a hardware driver (a lent GPU machine: `bench/device/run.sh` points `VK_DRIVER_FILES` at
/// NVIDIA's). Software-only behaviour (loop budgets, `auto` declining the device, host
/// index builds) is asserted only there.
pub fn on_lavapipe() -> bool {
    gpu_test_setup();
    let files = std::env::var("VK_DRIVER_FILES")
        .or_else(|_| std::env::var("VK_ICD_FILENAMES"))
        .unwrap_or_default();
    files.contains("lvp_icd")
}

/// A name that selects the tests' device: "llvmpipe", else the first usable device's name.
#[cfg(feature = "gpu")]
pub fn test_device_name() -> String {
    if on_lavapipe() {
        return "llvmpipe".into();
    }
    simjoin::devices()
        .expect("the Vulkan devices")
        .into_iter()
        .find(|d| d.details.iter().any(|l| l == "usable by simjoin: yes"))
        .expect("a usable Vulkan device")
        .name
}

/// Fails the test when the validation layers have reported any error so far in this process
/// (messages are on stderr; run with `--nocapture` to see them).
#[cfg(feature = "gpu")]
pub fn assert_no_validation_errors() {
    let errors = simjoin::vk::validation_error_count();
    assert_eq!(
        errors, 0,
        "{errors} Vulkan validation error(s); rerun with --nocapture to see them"
    );
}

/// One shared context per test binary (contexts are expensive on lavapipe).
#[cfg(feature = "gpu")]
pub fn shared_context() -> std::sync::Arc<simjoin::vk::Context> {
    static CTX: std::sync::OnceLock<std::sync::Arc<simjoin::vk::Context>> =
        std::sync::OnceLock::new();
    gpu_test_setup();
    CTX.get_or_init(|| {
        let ctx = simjoin::vk::Context::new(&Default::default()).expect("a Vulkan context");
        assert!(
            ctx.validation_enabled(),
            "tests must run with validation on"
        );
        ctx
    })
    .clone()
}

/// splitmix64: a tiny deterministic generator, so every generated case is reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Set in the environment of a test run in a child process (see `run_in_child`).
pub const CHILD_ENV: &str = "SIMJOIN_TEST_CHILD";

/// Runs `test` (in this test binary) in a child process with `env` set and `CHILD_ENV=1`;
/// fails when the child fails or runs no test.
pub fn run_in_child(test: &str, env: &[(&str, &str)]) {
    gpu_test_setup();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture"])
        .env(CHILD_ENV, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{log}");
    assert!(log.contains("1 passed"), "child ran no test:\n{log}");
}

/// For a test that creates or destroys Vulkan instances or devices while the other tests of
/// its binary make Vulkan calls on theirs: true when it should run here (it is the child),
/// false after it ran in a child process of its own. The Khronos validation layer keeps
/// its per-instance and per-device state in one process-wide map (`layer_data_map`) that
/// instance and device creation and destruction edit without a lock while every other
/// call on any device reads it; creating devices in parallel with other threads' work
/// therefore races inside the layer, which only the tests enable.
pub fn in_own_process(test: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    run_in_child(test, &[]);
    false
}

/// High-dimensional threshold cases (tests/cpu_high_dim.rs, tests/gpu_dot_filter.rs).
/// Calls `f` with `x` as an f64 dataset and as an f32 one.
pub fn each_precision(x: &[f64], d: usize, mut f: impl FnMut(&simjoin::Dataset)) {
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    f(&simjoin::Dataset::from_f64(x, d).unwrap());
    f(&simjoin::Dataset::from_f32(&x32, d).unwrap());
}

/// Calls `f` with data `x` and queries `q` (`d` wide) as f64 datasets and as f32 ones.
pub fn each_precision_pair(
    x: &[f64],
    q: &[f64],
    d: usize,
    mut f: impl FnMut(&simjoin::Dataset, &simjoin::Dataset),
) {
    let (x32, q32): (Vec<f32>, Vec<f32>) = (
        x.iter().map(|&v| v as f32).collect(),
        q.iter().map(|&v| v as f32).collect(),
    );
    f(
        &simjoin::Dataset::from_f64(x, d).unwrap(),
        &simjoin::Dataset::from_f64(q, d).unwrap(),
    );
    f(
        &simjoin::Dataset::from_f32(&x32, d).unwrap(),
        &simjoin::Dataset::from_f32(&q32, d).unwrap(),
    );
}

/// Base points plus partners at distance eps * (1 + k * 2^-24) for k in -3..=3, along
/// random directions, so many pairs sit within an ulp or two of the threshold.
pub fn threshold_pairs(
    n: usize,
    d: usize,
    eps: f64,
    scale: f64,
    offset: f64,
    seed: u64,
) -> Vec<f64> {
    let mut r = Rng(seed);
    let mut x = Vec::with_capacity(2 * n * d);
    for i in 0..n {
        let base: Vec<f64> = (0..d).map(|_| offset + scale * r.unit()).collect();
        let dir: Vec<f64> = (0..d).map(|_| r.normal()).collect();
        let len = dir.iter().map(|v| v * v).sum::<f64>().sqrt();
        let k = (i % 7) as f64 - 3.0;
        let dist = eps * (1.0 + k * f32::EPSILON as f64 / 2.0);
        x.extend_from_slice(&base);
        x.extend(base.iter().zip(&dir).map(|(b, v)| b + v / len * dist));
    }
    x
}

/// A sink with parts (`PairSink::parts`): what reaches `push` goes to `own`, what reaches
/// each part to that part, so a test sees which path every pair took.
#[derive(Default)]
pub struct SplitSink {
    pub own: Vec<simjoin::Pair>,
    pub parts: Vec<PartSink>,
}

/// One part of a [`SplitSink`].
pub struct PartSink(pub Vec<simjoin::Pair>);

impl simjoin::PairSink for PartSink {
    fn push(&mut self, chunk: &[simjoin::Pair]) -> anyhow::Result<()> {
        self.0.extend_from_slice(chunk);
        Ok(())
    }
}

impl simjoin::PairSink for SplitSink {
    fn push(&mut self, chunk: &[simjoin::Pair]) -> anyhow::Result<()> {
        self.own.extend_from_slice(chunk);
        Ok(())
    }
    fn parts(&mut self, workers: usize) -> Vec<&mut dyn simjoin::PairSink> {
        while self.parts.len() < workers {
            self.parts.push(PartSink(Vec::new()));
        }
        self.parts
            .iter_mut()
            .map(|p| p as &mut dyn simjoin::PairSink)
            .collect()
    }
}

/// Runs `job` on a thread, cancels `control` once `wait` returns, and gives the job's
/// result with the time from the cancel to the job's end (its stop latency).
pub fn stop_when<R: Send + 'static>(
    control: &simjoin::Control,
    wait: impl FnOnce(),
    job: impl FnOnce() -> simjoin::Result<R> + Send + 'static,
) -> (simjoin::Result<R>, std::time::Duration) {
    use std::time::{Duration, Instant};
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let r = job();
        tx.send(Instant::now()).unwrap();
        r
    });
    wait();
    let asked = Instant::now();
    control.cancel();
    let ended = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the job ended");
    (
        worker.join().unwrap(),
        ended.saturating_duration_since(asked),
    )
}

/// Waits until `control`'s job reports stage `stage` (a minute at most), then `after`
/// more: a GPU job's stop should find its batches running, not its planning (a software
/// device compiles a kernel at its first dispatch, which nothing interrupts).
pub fn wait_for_stage(control: &simjoin::Control, stage: &str, after: std::time::Duration) {
    let reached = std::time::Instant::now();
    while control.progress().is_none_or(|p| p.stage != stage) {
        assert!(
            reached.elapsed() < std::time::Duration::from_secs(60),
            "the job never reached stage {stage:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    std::thread::sleep(after);
}
