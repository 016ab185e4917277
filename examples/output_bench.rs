//! Times a CPU self-join per output form (pairs unsorted / sorted, CSR unsorted / sorted,
//! CSR with distances) on a .npy point array (n x d, f64), in one process, with each
//! run's phases: where the hand-over's time goes (`bench/RESULTS_BENCH.md`).
//!
//! usage: output_bench FILE.npy EPS [REPS=3] [FORM: only the forms whose name has it, or
//! =FORM: that form alone]

use simjoin::{Backend, Dataset, Engine, JoinOptions, OutputForm};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 3, "usage: output_bench FILE.npy EPS [REPS=3]");
    let eps: f64 = args[2].parse()?;
    let reps: usize = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let file = npyz::NpyFile::new(std::io::BufReader::new(std::fs::File::open(&args[1])?))?;
    let shape = file.shape().to_vec();
    anyhow::ensure!(shape.len() == 2, "expected an (n, d) array, got {shape:?}");
    let x: Vec<f64> = file.into_vec()?;
    let data = Dataset::from_f64(&x, shape[1] as usize)?;
    let engine = Engine::new();
    let forms = [
        ("pairs unsorted", OutputForm::Pairs, false, false),
        ("pairs sorted", OutputForm::Pairs, true, false),
        ("csr unsorted", OutputForm::Csr, false, false),
        ("csr sorted", OutputForm::Csr, true, false),
        ("csr sorted, distances", OutputForm::Csr, true, true),
    ];
    let only = args.get(4).map_or("", String::as_str);
    for (name, output, sorted, distances) in forms {
        // "=NAME" runs that form alone ("csr sorted" is also in "csr sorted, distances").
        let picked = match only.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.contains(only),
        };
        if !picked {
            continue;
        }
        let mut opts = JoinOptions::new(eps);
        opts.backend = Backend::Cpu;
        opts.output = output;
        opts.sorted = sorted;
        opts.distances = distances;
        for _ in 0..reps {
            let t = Instant::now();
            let r = engine.self_join(&data, &opts)?;
            let seconds = t.elapsed().as_secs_f64();
            let phases: Vec<String> = r
                .report
                .phases
                .iter()
                .map(|(k, v)| format!("{k} {:.1} ms", v * 1e3))
                .collect();
            println!("{name}: {:.1} ms [{}]", seconds * 1e3, phases.join(", "));
        }
    }
    Ok(())
}
