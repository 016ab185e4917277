//! Times the CPU backend's self-join on a .npy point array (2-D, f32 or f64), the way
//! bench/cpu_vs_ckdtree.py times scipy: index build included, producing the array of
//! unique pairs. Prints one JSON line with every run's seconds.
//!
//! usage: cpu_bench FILE.npy EPS [ALGORITHM=auto] [REPS=5] [f32]

use simjoin::{Algorithm, Backend, Dataset, Engine, JoinOptions};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        anyhow::bail!("usage: cpu_bench FILE.npy EPS [ALGORITHM=auto] [REPS=5] [f32]");
    }
    let eps: f64 = args[2].parse()?;
    let algorithm: Algorithm = args.get(3).map_or(Ok(Algorithm::Auto), |s| s.parse())?;
    let reps: usize = args.get(4).map_or(Ok(5), |s| s.parse())?;
    let as_f32 = args.get(5).is_some_and(|s| s == "f32");
    let file = npyz::NpyFile::new(std::io::BufReader::new(std::fs::File::open(&args[1])?))?;
    let shape = file.shape().to_vec();
    anyhow::ensure!(
        shape.len() == 2,
        "expected a 2-D array (n, d), got shape {shape:?}"
    );
    let dim = shape[1] as usize;
    let x: Vec<f64> = file.into_vec()?;
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let data = if as_f32 {
        Dataset::from_f32(&x32, dim)?
    } else {
        Dataset::from_f64(&x, dim)?
    };
    let mut opts = JoinOptions::new(eps);
    opts.backend = Backend::Cpu;
    opts.algorithm = algorithm;
    let engine = Engine::new();
    let mut times = Vec::new();
    let mut pairs = 0;
    let mut report = None;
    for _ in 0..reps {
        let t = Instant::now();
        let r = engine.self_join(&data, &opts)?;
        times.push(t.elapsed().as_secs_f64());
        pairs = r.pairs().map_or(0, |p| p.len());
        report = Some(r.report);
    }
    let report = report.expect("at least one run");
    let phases: Vec<String> = report
        .phases
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v:.4}"))
        .collect();
    let notes: Vec<String> = report.notes.iter().map(|s| format!("{:?}", s)).collect();
    println!(
        "{{\"pairs\": {pairs}, \"times\": {times:?}, \"algorithm\": \"{}\", \"device\": \"{}\", \"phases\": {{{}}}, \"notes\": [{}]}}",
        report.algorithm,
        report.device,
        phases.join(", "),
        notes.join(", ")
    );
    Ok(())
}
