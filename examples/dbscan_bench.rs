//! Times DBSCAN (`simjoin::dbscan`; the CPU backend unless BACKEND says otherwise) on a
//! .npy point array (n x d, f64), for profiling: the fastest and the median run, each
//! phase's median, the last run's notes.
//!
//! usage: dbscan_bench FILE.npy EPS [MIN_SAMPLES=10] [REPS=10] [ALGORITHM=auto] [BACKEND=cpu]

use simjoin::{Algorithm, Backend, Dataset, DbscanOptions, Engine};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        anyhow::bail!(
            "usage: dbscan_bench FILE.npy EPS [MIN_SAMPLES=10] [REPS=10] [ALGORITHM=auto] [BACKEND=cpu]"
        );
    }
    let eps: f64 = args[2].parse()?;
    let min_samples: usize = args.get(3).map_or(Ok(10), |s| s.parse())?;
    let reps: usize = args.get(4).map_or(Ok(10), |s| s.parse())?;
    let algorithm: Algorithm = args.get(5).map_or(Ok(Algorithm::Auto), |s| s.parse())?;
    let file = npyz::NpyFile::new(std::io::BufReader::new(std::fs::File::open(&args[1])?))?;
    let shape = file.shape().to_vec();
    anyhow::ensure!(shape.len() == 2, "expected an (n, d) array, got {shape:?}");
    let x: Vec<f64> = file.into_vec()?;
    let data = Dataset::from_f64(&x, shape[1] as usize)?;
    let mut opts = DbscanOptions::new(eps, min_samples);
    opts.backend = args.get(6).map_or(Ok(Backend::Cpu), |s| s.parse())?;
    opts.algorithm = algorithm;
    let engine = Engine::new();
    let mut times = Vec::new();
    let mut last = None;
    // Each phase's times over the runs (phases come in the same order every run).
    let mut phases: Vec<(String, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let r = match std::env::var("DBSCAN_REORDER").ok().as_deref() {
            Some("1") => simjoin::dbscan::dbscan_reordered(&engine, &data, &opts, true)?,
            Some("0") => simjoin::dbscan::dbscan_reordered(&engine, &data, &opts, false)?,
            _ => simjoin::dbscan(&engine, &data, &opts)?,
        };
        times.push(t.elapsed().as_secs_f64());
        for (k, v) in &r.report.phases {
            // "link 1234 kept pairs" varies from run to run: one phase whatever the number.
            let k = &if k.starts_with("link ") && k.ends_with(" kept pairs") {
                k.replace(|c: char| c.is_ascii_digit(), "")
            } else {
                k.clone()
            };
            match phases.iter_mut().find(|(name, _)| name == k) {
                Some((_, vs)) => vs.push(*v),
                None => phases.push((k.clone(), vec![*v])),
            }
        }
        last = Some(r);
    }
    let r = last.expect("at least one run");
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "min {:.2} ms, median {:.2} ms ({} runs); {} pairs, {} clusters, {} core, {} noise",
        sorted[0] * 1e3,
        sorted[sorted.len() / 2] * 1e3,
        reps,
        r.report.pairs,
        r.clusters,
        r.core_points,
        r.noise
    );
    for (k, vs) in &mut phases {
        vs.sort_by(f64::total_cmp);
        println!("  {k}: median {:.2} ms", vs[vs.len() / 2] * 1e3);
    }
    for note in &r.report.notes {
        println!("  note: {note}");
    }
    Ok(())
}
