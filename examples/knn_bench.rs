//! GPU kNN benchmark (run by hand, never as a test): synthetic data, LSS and/or brute
//! force, per-phase times, the bound's tightness (candidates per query / k) and the
//! median wall time.
//!
//! ```text
//! cargo run --release --example knn_bench -- --n 20000 --d 16 --k 10 --algorithm lss
//! ```
//! On lavapipe set `VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json`: it checks
//! correctness paths, its times say nothing about a real GPU.

use clap::Parser;
use simjoin::{Algorithm, Backend, Dataset, Engine, KnnOptions, Metric};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 20_000)]
    n: usize,
    #[arg(long, default_value_t = 16)]
    d: usize,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// lss | brute | auto
    #[arg(long, default_value = "lss")]
    algorithm: Algorithm,
    #[arg(long, default_value = "euclidean")]
    metric: Metric,
    /// uniform | clusters
    #[arg(long, default_value = "uniform")]
    data: String,
    /// Queries of another set (this many points); default: self-kNN.
    #[arg(long)]
    queries: Option<usize>,
    #[arg(long)]
    lists: Option<usize>,
    #[arg(long)]
    f64: bool,
    #[arg(long, default_value_t = 1)]
    repeat: usize,
}

fn points(n: usize, d: usize, kind: &str, seed: u64) -> Vec<f64> {
    let mut state = 0x2545F4914F6CDD1Du64 ^ seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    if kind == "clusters" {
        let centres: Vec<f64> = (0..16 * d).map(|_| next()).collect();
        (0..n)
            .flat_map(|i| {
                (0..d)
                    .map(|j| centres[(i % 16) * d + j] + 0.02 * (next() - 0.5))
                    .collect::<Vec<_>>()
            })
            .collect()
    } else {
        (0..n * d).map(|_| next()).collect()
    }
}

fn main() -> simjoin::Result<()> {
    let args = Args::parse();
    let x = points(args.n, args.d, &args.data, 0);
    let q = args.queries.map(|m| points(m, args.d, &args.data, 1));
    let (x32, q32): (Vec<f32>, Option<Vec<f32>>) = (
        x.iter().map(|&v| v as f32).collect(),
        q.as_ref().map(|q| q.iter().map(|&v| v as f32).collect()),
    );
    let (data, queries) = if args.f64 {
        (
            Dataset::from_f64(&x, args.d)?,
            q.as_ref()
                .map(|q| Dataset::from_f64(q, args.d))
                .transpose()?,
        )
    } else {
        (
            Dataset::from_f32(&x32, args.d)?,
            q32.as_ref()
                .map(|q| Dataset::from_f32(q, args.d))
                .transpose()?,
        )
    };
    let opts = KnnOptions {
        metric: args.metric,
        backend: Backend::Gpu,
        algorithm: args.algorithm,
        lss_lists: args.lists,
        ..Default::default()
    };
    println!(
        "workload: {} n={} d={} k={} queries={:?} metric={} {}",
        args.data,
        args.n,
        args.d,
        args.k,
        args.queries,
        args.metric,
        if args.f64 { "f64" } else { "f32" }
    );
    let engine = Engine::new();
    let mut walls = Vec::new();
    for rep in 0..args.repeat.max(1) {
        let t = Instant::now();
        let r = engine.knn(&data, queries.as_ref(), args.k, &opts)?;
        walls.push(t.elapsed().as_secs_f64());
        println!(
            "run {rep}: {:.4} s, {} {}",
            walls[rep], r.report.device, r.report.algorithm
        );
        for (phase, secs) in &r.report.phases {
            println!("    {phase:<28} {secs:.4} s");
        }
        for note in &r.report.notes {
            println!("    note: {note}");
        }
    }
    walls.sort_by(f64::total_cmp);
    println!("median wall: {:.4} s", walls[walls.len() / 2]);
    Ok(())
}
