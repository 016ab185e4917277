//! Sort and scan throughput on the Vulkan device next to the CPU (not a timed test).
//!
//!     cargo run --release --example kernel_bench -- [n] [repetitions]
//!
//! The device is the one `SIMJOIN_DEVICE` selects (default: the best present, which may be
//! lavapipe, a software rasterizer: its figures say nothing about GPUs). Times are medians of
//! the repetitions. "device" is wall time for recording, submission and completion of the
//! kernel work (inputs are restored by a copy outside the timed part); "on-GPU" is the
//! span between GPU timestamps around that work, without host overheads. CPU times cover
//! `sort_unstable` of the same pairs and a sequential scan. Every GPU result is checked
//! against the CPU's.

use simjoin::vk::sort::SortStages;
use simjoin::vk::{self, Buffer, Context, GpuTimer, Memory, Stream};
use std::sync::Arc;
use std::time::Instant;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `reps` runs of `work` after `reset`; returns the medians of wall time and of the
/// on-GPU time between timestamps, in seconds.
fn time_gpu(
    stream: &mut Stream,
    timer: &std::sync::Arc<GpuTimer>,
    reps: usize,
    mut reset: impl FnMut(&mut Stream) -> simjoin::Result<()>,
    mut work: impl FnMut(&mut Stream) -> simjoin::Result<()>,
) -> simjoin::Result<(f64, f64)> {
    let (mut wall, mut gpu) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        reset(stream)?;
        stream.finish()?;
        let t = Instant::now();
        stream.timestamp(timer, 0)?;
        work(stream)?;
        stream.timestamp(timer, 1)?;
        stream.finish()?;
        wall.push(t.elapsed().as_secs_f64());
        gpu.push(timer.seconds(0, 1)?);
    }
    Ok((median(wall), median(gpu)))
}

/// Times `reps` runs of `work` on a fresh `setup()` value each (setup not timed).
fn time_cpu<T>(reps: usize, mut setup: impl FnMut() -> T, mut work: impl FnMut(T)) -> f64 {
    median(
        (0..reps)
            .map(|_| {
                let input = setup();
                let t = Instant::now();
                work(input);
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn report(what: &str, n: usize, (wall, gpu): (f64, f64), cpu: f64, cpu_name: &str) {
    println!(
        "{what:<27} n={n:<9} device {:>9.3} ms (on-GPU {:>9.3} ms, {:>7.1} M/s)   {cpu_name} {:>8.3} ms ({:>7.1} M/s)   CPU/device time {:.3}",
        wall * 1e3,
        gpu * 1e3,
        n as f64 / gpu / 1e6,
        cpu * 1e3,
        n as f64 / cpu / 1e6,
        cpu / wall
    );
}

fn main() -> simjoin::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .get(1)
        .map(|s| s.parse().expect("n"))
        .unwrap_or(1 << 20);
    let reps: usize = args
        .get(2)
        .map(|s| s.parse().expect("repetitions"))
        .unwrap_or(5)
        .max(1);
    let ctx: Arc<Context> = Context::new(&Default::default())?;
    println!(
        "device: {} ({}), unified memory: {}, compute queues: {}, transfer queue: {}, validation: {}",
        ctx.device_name(),
        if ctx.is_software() { "software" } else { "hardware" },
        ctx.has_unified_memory(),
        ctx.compute_queue_count(),
        ctx.has_transfer_queue(),
        ctx.validation_enabled()
    );
    println!("{n} elements, median of {reps} runs");
    let mut stream = Stream::new(&ctx, 0)?;
    let timer = GpuTimer::new(&ctx, 2)?;
    let mut seed = 42u64;
    let keys64: Vec<u64> = (0..n).map(|_| splitmix(&mut seed)).collect();
    let keys32: Vec<u32> = keys64.iter().map(|&k| (k >> 32) as u32).collect();
    let values: Vec<u32> = (0..n as u32).collect();

    // Sorts: pristine inputs stay on the device and are copied in before each run.
    let pristine_values = ctx.upload(&values, "values (pristine)")?;
    let work_values = Buffer::new(&ctx, n as u64 * 4, Memory::Device, "values")?;
    for key64 in [false, true] {
        let key_bytes = if key64 { 8 } else { 4 };
        let pristine_keys = if key64 {
            ctx.upload(&keys64, "keys")?
        } else {
            ctx.upload(&keys32, "keys")?
        };
        let work_keys = Buffer::new(&ctx, n as u64 * key_bytes, Memory::Device, "keys")?;
        // The CPU reference, widened to u64 keys for both key types.
        let mut pairs: Vec<(u64, u32)> = if key64 {
            keys64.iter().copied().zip(values.iter().copied()).collect()
        } else {
            keys32
                .iter()
                .map(|&k| k as u64)
                .zip(values.iter().copied())
                .collect()
        };
        let cpu = if key64 {
            time_cpu(reps, || pairs.clone(), |mut p| p.sort_unstable())
        } else {
            let narrow: Vec<(u32, u32)> =
                keys32.iter().copied().zip(values.iter().copied()).collect();
            time_cpu(reps, || narrow.clone(), |mut p| p.sort_unstable())
        };
        pairs.sort_unstable();
        for stages in [SortStages::Tiles, SortStages::GlobalOnly] {
            let reset = |s: &mut Stream| {
                s.copy(&pristine_keys, 0, &work_keys, 0, n as u64 * key_bytes)?;
                s.copy(&pristine_values, 0, &work_values, 0, n as u64 * 4)
            };
            let gpu = time_gpu(&mut stream, &timer, reps, reset, |s| {
                vk::sort::sort_pairs_with(s, &work_keys, &work_values, n, key64, stages)
            })?;
            let got_keys: Vec<u64> = if key64 {
                ctx.download(&work_keys, 0, n)?
            } else {
                ctx.download::<u32>(&work_keys, 0, n)?
                    .into_iter()
                    .map(u64::from)
                    .collect()
            };
            let got_values: Vec<u32> = ctx.download(&work_values, 0, n)?;
            let ok =
                pairs.iter().map(|p| p.0).eq(got_keys) && pairs.iter().map(|p| p.1).eq(got_values);
            assert!(ok, "device sort differs from the CPU's");
            let what = format!(
                "sort {} key+u32 {:?}",
                if key64 { "u64" } else { "u32" },
                stages
            );
            report(&what, n, gpu, cpu, "CPU sort_unstable");
        }
    }

    // Scan: u32 counts -> u64 offsets.
    let counts: Vec<u32> = (0..n).map(|_| (splitmix(&mut seed) % 64) as u32).collect();
    let counts_buf = ctx.upload(&counts, "counts")?;
    let offsets_buf = Buffer::new(&ctx, (n as u64 + 1) * 8, Memory::Device, "offsets")?;
    let gpu = time_gpu(
        &mut stream,
        &timer,
        reps,
        |_| Ok(()),
        |s| vk::scan::exclusive_scan_u32_to_u64(s, &counts_buf, &offsets_buf, n),
    )?;
    let mut offsets = vec![0u64; n + 1];
    let cpu = time_cpu(
        reps,
        || (),
        |()| {
            let mut running = 0u64;
            for (o, &c) in offsets.iter_mut().zip(&counts) {
                *o = running;
                running += c as u64;
            }
            offsets[n] = running;
            std::hint::black_box(&offsets);
        },
    );
    let got: Vec<u64> = ctx.download(&offsets_buf, 0, n + 1)?;
    assert!(got == offsets, "device scan differs from the CPU's");
    report("exclusive scan u32 -> u64", n, gpu, cpu, "CPU sequential ");
    Ok(())
}
