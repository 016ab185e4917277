//! Engines own their device: 100 engines created, used and freed in a loop leave no Vulkan
//! object behind (the validation layers report leaked objects at device and instance
//! destruction as errors) and no memory (resident set flat); two engines work from two
//! threads at once; the device is an engine option, honoured per engine. On lavapipe with
//! validation on.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, gpu_test_setup, Rng};
use simjoin::{
    oracle, Algorithm, Backend, Dataset, Engine, EngineOptions, ErrorKind, JoinOptions, Metric,
};

/// The tests of this file count live devices: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn points(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n * 3).map(|_| rng.unit() as f32).collect()
}

fn gpu(eps: f64, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Gpu;
    o.algorithm = algorithm;
    o.sorted = true;
    o
}

/// Resident set size in bytes (Linux).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[test]
fn hundred_engines_created_used_and_freed() {
    let _serial = serial();
    gpu_test_setup();
    let x = points(400, 1);
    let data = Dataset::from_f32(&x, 3).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 0.1);
    let before = simjoin::vk::live_contexts();
    let mut rss_at_10 = 0;
    for i in 0..100 {
        let engine = Engine::new();
        let alg = if i % 2 == 0 {
            Algorithm::Grid
        } else {
            Algorithm::Brute
        };
        let r = engine.self_join(&data, &gpu(0.1, alg)).unwrap();
        assert_eq!(r.report.backend, "vulkan");
        assert_eq!(r.pairs().unwrap(), &want[..], "engine {i}");
        assert_eq!(simjoin::vk::live_contexts(), before + 1);
        drop(engine);
        assert_eq!(
            simjoin::vk::live_contexts(),
            before,
            "engine {i} kept its device"
        );
        if i == 9 {
            rss_at_10 = rss();
        }
    }
    let growth = rss().saturating_sub(rss_at_10);
    // tests/asan.sh raises the budget: ASan keeps freed memory resident (its quarantine)
    // and pads every allocation, while LeakSanitizer checks leaks there exactly.
    let budget_mib: u64 = std::env::var("SIMJOIN_TEST_RSS_BUDGET_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    assert!(
        growth < budget_mib << 20,
        "resident set grew by {} MiB over 90 engines",
        growth >> 20
    );
    assert_no_validation_errors();
}

#[test]
fn two_engines_from_two_threads_at_once() {
    let _serial = serial();
    gpu_test_setup();
    let x = points(3000, 2);
    let data = Dataset::from_f32(&x, 3).unwrap();
    let want = oracle::self_join(&data, Metric::Manhattan, 0.08);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (data, want) = (&data, &want);
            s.spawn(move || {
                let engine = Engine::with_options(EngineOptions {
                    device: Some(common::test_device_name()),
                    threads: Some(1 + t),
                    validation: Some(true),
                })
                .unwrap();
                for round in 0..4 {
                    let mut o = gpu(0.08, Algorithm::Grid);
                    o.metric = Metric::Manhattan;
                    if round % 2 == 1 {
                        o.backend = Backend::Cpu;
                    }
                    let r = engine.self_join(data, &o).unwrap();
                    assert_eq!(r.pairs().unwrap(), &want[..], "thread {t} round {round}");
                }
            });
        }
    });
    assert_eq!(
        simjoin::vk::live_contexts(),
        0,
        "both engines released their devices"
    );
    assert_no_validation_errors();
}

#[test]
fn the_device_is_an_engine_option() {
    let _serial = serial();
    gpu_test_setup();
    let x = points(500, 3);
    let data = Dataset::from_f32(&x, 3).unwrap();
    let nowhere = Engine::with_options(EngineOptions {
        device: Some("no-such-device".into()),
        ..Default::default()
    })
    .unwrap();
    let e = nowhere
        .self_join(&data, &gpu(0.1, Algorithm::Grid))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoDevice, "{e}");
    assert!(e.to_string().contains("no-such-device"), "{e}");
    // The same process, another engine on another selector: works.
    let here = Engine::with_options(EngineOptions {
        device: Some("0".into()),
        ..Default::default()
    })
    .unwrap();
    let r = here.self_join(&data, &gpu(0.1, Algorithm::Grid)).unwrap();
    let name = common::test_device_name();
    assert!(r.report.device.contains(&name), "{}", r.report.device);
    // `auto` never picks a software device: the CPU runs it. On a hardware GPU the cost
    // model chooses, and the backend that ran is the one its note names.
    let mut auto = gpu(0.1, Algorithm::Auto);
    auto.backend = Backend::Auto;
    let report = here.self_join(&data, &auto).unwrap().report;
    if common::on_lavapipe() {
        assert_eq!(report.backend, "cpu");
    } else {
        let chose_gpu = report
            .notes
            .iter()
            .any(|n| n.starts_with("backend auto: gpu"));
        let want = if chose_gpu { "vulkan" } else { "cpu" };
        assert_eq!(report.backend, want, "{:?}", report.notes);
    }
    assert_eq!(
        Engine::with_options(EngineOptions {
            device: Some("  ".into()),
            ..Default::default()
        })
        .unwrap_err()
        .kind(),
        ErrorKind::InvalidArgument
    );
    assert_no_validation_errors();
}
