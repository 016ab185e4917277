//! CPU kNN benchmark (run by hand, never as a test; for profiling under `perf`): synthetic
//! data like bench/knn_bench.py's (uniform in the unit cube, exponential with lambda 40, or
//! 50 Gaussian clusters), self-kNN or A-to-B, per-phase times, notes and the median wall.
//!
//! ```text
//! cargo run --release --example cpu_knn_bench -- --n 50000 --d 64 --k 16 --repeat 3
//! ```

use clap::Parser;
use simjoin::{Algorithm, Backend, Dataset, Engine, KnnOptions, Metric};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 50_000)]
    n: usize,
    #[arg(long, default_value_t = 64)]
    d: usize,
    #[arg(long, default_value_t = 16)]
    k: usize,
    /// auto | kdtree | brute | grid
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    /// uniform | expo | clusters
    #[arg(long, default_value = "uniform")]
    data: String,
    /// Queries of another set (this many points); default: self-kNN.
    #[arg(long)]
    queries: Option<usize>,
    #[arg(long)]
    f64: bool,
    #[arg(long, default_value_t = 1)]
    repeat: usize,
}

fn points(n: usize, d: usize, kind: &str, seed: u64) -> Vec<f64> {
    let mut state = 0x2545F4914F6CDD1Du64 ^ seed.wrapping_mul(0x9E3779B97F4A7C15);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    match kind {
        "expo" => (0..n * d).map(|_| -next().ln() / 40.0).collect(),
        "clusters" => {
            let centres: Vec<f64> = (0..50 * d).map(|_| next()).collect();
            let mut v = Vec::with_capacity(n * d);
            for _ in 0..n {
                let c = (next() * 50.0) as usize;
                for j in 0..d {
                    // Box-Muller, sigma 0.02.
                    let g = (-2.0 * next().ln()).sqrt() * (std::f64::consts::TAU * next()).cos();
                    v.push(centres[c * d + j] + 0.02 * g);
                }
            }
            v
        }
        _ => (0..n * d).map(|_| next()).collect(),
    }
}

fn main() -> simjoin::Result<()> {
    let args = Args::parse();
    let x = points(args.n, args.d, &args.data, 0);
    let q = args.queries.map(|m| points(m, args.d, &args.data, 1));
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let q32: Option<Vec<f32>> = q.as_ref().map(|q| q.iter().map(|&v| v as f32).collect());
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
        metric: Metric::Euclidean,
        backend: Backend::Cpu,
        algorithm: args.algorithm,
        lss_lists: None,
        ..Default::default()
    };
    println!(
        "workload: {} n={} d={} k={} queries={:?} {}",
        args.data,
        args.n,
        args.d,
        args.k,
        args.queries,
        if args.f64 { "f64" } else { "f32" }
    );
    let engine = Engine::new();
    let mut walls = Vec::new();
    for rep in 0..args.repeat.max(1) {
        let t = Instant::now();
        let r = engine.knn(&data, queries.as_ref(), args.k, &opts)?;
        walls.push(t.elapsed().as_secs_f64());
        println!("run {rep}: {:.4} s, {}", walls[rep], r.report.algorithm);
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
