//! GPU join benchmark (run by hand, never as a test): synthetic data, one join per repeat,
//! per-phase times, batches, overlap, the median wall time against the transfer bound
//! (result bytes over the measured device -> host bandwidth); optionally the CPU backend
//! on the same data for a ratio measured in the same run.
//!
//! ```text
//! cargo run --release --example gpu_join_bench -- --n 20000 --d 3 --eps 0.01 --repeat 3
//! cargo run --release --example gpu_join_bench -- --n 5000 --d 64 --selectivity 20 --algorithm brute
//! cargo run --release --example gpu_join_bench -- --n 20000 --d 16 --algorithm lss --lists 9
//! cargo run --release --example gpu_join_bench -- --npy x.npy --metric cosine --eps 0.1 --algorithm auto --cpu
//! ```
//! With `--npy` the points are a 2-D float32/float64 .npy file's rows (their precision kept);
//! the repeats then time the join on an engine already open (device, kernels, pools warm),
//! as a program or a Python session that joins more than once sees it.
//! On lavapipe set `VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json`: it checks
//! correctness paths, its times say nothing about a real GPU.

use clap::Parser;
use simjoin::{Algorithm, Backend, Dataset, Engine, JoinOptions, Metric, OutputForm};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Read the points from this 2-D .npy file (float32 or float64) instead of generating
    /// them (--n, --d, --data and --f64 are then ignored; give --eps).
    #[arg(long)]
    npy: Option<std::path::PathBuf>,
    /// Points.
    #[arg(long, default_value_t = 20_000)]
    n: usize,
    /// Dimensions.
    #[arg(long, default_value_t = 3)]
    d: usize,
    /// Distance threshold; derived from --selectivity when absent.
    #[arg(long)]
    eps: Option<f64>,
    /// Wanted average neighbours per point (sets eps from a sample of distances).
    #[arg(long, default_value_t = 10.0)]
    selectivity: f64,
    /// grid | lss | brute | auto
    #[arg(long, default_value = "grid")]
    algorithm: Algorithm,
    /// euclidean | manhattan | chebyshev (cosine and haversine with --npy and --eps)
    #[arg(long, default_value = "euclidean")]
    metric: Metric,
    /// uniform | clusters | skewed (uniform, dimension j scaled by (j+1)/d: the variance
    /// grows along the dataset order, so REORDER's order is its reverse)
    #[arg(long, default_value = "uniform")]
    data: String,
    /// Use f64 coordinates.
    #[arg(long)]
    f64: bool,
    /// Only count pairs (no download of pairs).
    #[arg(long)]
    count: bool,
    /// Force the number of indexed dimensions.
    #[arg(long)]
    k: Option<usize>,
    /// Result buffer capacity in pairs.
    #[arg(long)]
    result_pairs: Option<usize>,
    /// Queries per batch.
    #[arg(long)]
    batch_points: Option<usize>,
    /// LSS: number of Z-order lists.
    #[arg(long)]
    lists: Option<usize>,
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Also time the CPU backend on the same data.
    #[arg(long)]
    cpu: bool,
}

fn points(args: &Args) -> Vec<f64> {
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    match args.data.as_str() {
        "clusters" => {
            let centres: Vec<f64> = (0..16 * args.d).map(|_| next()).collect();
            (0..args.n)
                .flat_map(|i| {
                    (0..args.d)
                        .map(|j| centres[(i % 16) * args.d + j] + 0.02 * (next() - 0.5))
                        .collect::<Vec<_>>()
                })
                .collect()
        }
        "skewed" => (0..args.n * args.d)
            .map(|t| next() * ((t % args.d) + 1) as f64 / args.d as f64)
            .collect(),
        _ => (0..args.n * args.d).map(|_| next()).collect(),
    }
}

/// eps such that a random pair matches with probability selectivity / n.
fn eps_for(x: &[f64], d: usize, metric: Metric, selectivity: f64) -> f64 {
    let n = x.len() / d;
    let mut dists = Vec::with_capacity(20_000);
    let mut state = 7u64;
    for _ in 0..20_000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (state >> 33) as usize % n;
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = (state >> 33) as usize % n;
        let diff = (0..d).map(|t| (x[i * d + t] - x[j * d + t]).abs());
        dists.push(match metric {
            Metric::Euclidean => diff.map(|v| v * v).sum::<f64>().sqrt(),
            Metric::Manhattan => diff.sum(),
            Metric::Chebyshev => diff.fold(0.0, f64::max),
            Metric::Cosine | Metric::Haversine => unreachable!("not a cosine or haversine test"),
        });
    }
    dists.sort_by(f64::total_cmp);
    let q = (selectivity / n as f64 * dists.len() as f64) as usize;
    dists[q.min(dists.len() - 1)].max(1e-9)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A run's phases (each names its clock: GPU timestamps or host; the overlap is a note) and
/// notes, indented under its line (bench/device/cosine.py reads them so).
fn print_phases_and_notes(r: &simjoin::JoinReport) {
    for (phase, secs) in &r.phases {
        println!("    {phase:<40} {secs:.4} s");
    }
    for note in &r.notes {
        println!("    note: {note}");
    }
}

/// Points as read or made: float32 or float64 rows.
enum Points {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// A 2-D .npy file's rows, float32 or float64 as stored, and their dimension.
fn read_npy(path: &std::path::Path) -> anyhow::Result<(Points, usize)> {
    let open = || -> anyhow::Result<_> {
        Ok(npyz::NpyFile::new(std::io::BufReader::new(
            std::fs::File::open(path)?,
        ))?)
    };
    let file = open()?;
    let shape = file.shape().to_vec();
    anyhow::ensure!(
        shape.len() == 2,
        "{path:?}: a 2-D array, got shape {shape:?}"
    );
    let points = match file.into_vec::<f32>() {
        Ok(x) => Points::F32(x),
        Err(_) => Points::F64(open()?.into_vec::<f64>()?),
    };
    Ok((points, shape[1] as usize))
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let points = if let Some(path) = &args.npy {
        let (points, d) = read_npy(path)?;
        args.d = d;
        args.data = path.display().to_string();
        args.f64 = matches!(points, Points::F64(_));
        points
    } else {
        let x = points(&args);
        args.eps
            .get_or_insert_with(|| eps_for(&x, args.d, args.metric, args.selectivity));
        if args.f64 {
            Points::F64(x)
        } else {
            Points::F32(x.iter().map(|&v| v as f32).collect())
        }
    };
    let data = match &points {
        Points::F32(x) => Dataset::from_f32(x, args.d)?,
        Points::F64(x) => Dataset::from_f64(x, args.d)?,
    };
    args.n = data.len();
    let eps = args
        .eps
        .ok_or_else(|| anyhow::anyhow!("--npy needs --eps"))?;
    let mut opts = JoinOptions::new(eps);
    opts.backend = Backend::Gpu;
    opts.algorithm = args.algorithm;
    opts.metric = args.metric;
    opts.output = if args.count {
        OutputForm::Count
    } else {
        OutputForm::Pairs
    };
    opts.indexed_dims = args.k;
    opts.result_buffer_pairs = args.result_pairs;
    opts.batch_points = args.batch_points;
    opts.lss_lists = args.lists;
    println!(
        "workload: {} n={} d={} eps={eps:.6} metric={} {} {}",
        args.data,
        args.n,
        args.d,
        args.metric,
        if args.f64 { "f64" } else { "f32" },
        if args.count { "count" } else { "pairs" }
    );
    let engine = Engine::new();
    let mut walls = Vec::new();
    let mut from_device = None;
    for rep in 0..args.repeat.max(1) {
        let t = Instant::now();
        let result = engine.self_join(&data, &opts)?;
        walls.push(t.elapsed().as_secs_f64());
        let r = &result.report;
        println!(
            "run {rep}: {:.4} s, {} pairs ({:.2} per point), device {}, {}, {} batches",
            walls[rep],
            r.pairs,
            2.0 * r.pairs as f64 / args.n as f64,
            r.device,
            r.algorithm,
            r.batches
        );
        println!(
            "    bytes to device {}, from device {}",
            r.bytes_to_device, r.bytes_from_device
        );
        from_device = Some(r.bytes_from_device);
        print_phases_and_notes(r);
    }
    let gpu = median(walls);
    println!(
        "gpu median wall: {gpu:.4} s over {} runs",
        args.repeat.max(1)
    );
    // The transfer bound: no join that returns its pairs beats its result bytes over the
    // measured device -> host bandwidth.
    if let Some(bytes) = from_device.filter(|&b| b > 0) {
        let ctx = simjoin::vk::Context::new(&Default::default())?;
        let bw = ctx.transfer_bandwidth(bytes.clamp(64 << 20, 1 << 30), 3)?;
        let bound = bytes as f64 / bw.download;
        println!(
            "transfer bound: {bytes} bytes from the device at {:.3} GB/s = {bound:.4} s; the join takes {:.3}x that",
            bw.download / 1e9,
            gpu / bound
        );
    }
    if args.cpu {
        opts.backend = Backend::Cpu;
        opts.algorithm = Algorithm::Auto;
        let mut walls = Vec::new();
        for rep in 0..args.repeat.max(1) {
            let t = Instant::now();
            let result = engine.self_join(&data, &opts)?;
            walls.push(t.elapsed().as_secs_f64());
            let r = &result.report;
            println!(
                "cpu run {rep}: {:.4} s, {} pairs, {}",
                walls[rep], r.pairs, r.algorithm
            );
            if rep + 1 == args.repeat.max(1) {
                print_phases_and_notes(r);
            }
        }
        let cpu = median(walls);
        println!("cpu median wall: {cpu:.4} s; gpu/cpu = {:.2}", gpu / cpu);
    }
    Ok(())
}
