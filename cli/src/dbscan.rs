//! `simjoin dbscan`: DBSCAN clustering of a point file on the eps-join (`simjoin::dbscan`),
//! labels written as .npy (1-D int64) or .csv (header `label`, then line i + 2 holds point
//! i's label), or a one-line summary; `--stats` prints one JSON object.

use crate::input::read_points;
use anyhow::{bail, Context, Result};
use clap::Args;
use simjoin::{Algorithm, DbscanOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct DbscanArgs {
    /// Points: .npy (2-D f32/f64), .csv/.txt (comma or whitespace separated), .fvecs.
    input: PathBuf,
    /// Neighbourhood radius (> 0): points within eps (dist <= eps) are neighbours.
    #[arg(long, allow_negative_numbers = true)]
    eps: f64,
    /// Neighbours, the point itself included, that make a core point (>= 1).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
    min_samples: i64,
    #[command(flatten)]
    run: crate::RunArgs,
    /// The join's algorithm: auto, grid, ego, brute or lss (the labels are the same).
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    /// Write the labels to FILE: .npy (1-D int64, -1 for noise) or .csv (a header line
    /// `label`, then one label per line, in point order). Without it, a summary line.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Print one JSON object: clusters, noise points, core points, pairs, seconds, backend.
    #[arg(long)]
    stats: bool,
    /// One weight per point (scikit-learn's sample_weight): a 1-D .npy, or a .csv/.txt
    /// with one value per line. A point is core when the weights within eps, its own
    /// included, sum to at least --min-samples.
    #[arg(long, value_name = "FILE")]
    sample_weight: Option<PathBuf>,
}

fn check_output_path(path: &Path) -> Result<()> {
    match crate::input::extension(path).as_str() {
        "npy" | "csv" => Ok(()),
        other => bail!(
            "unknown labels format '.{other}' for {} (expected .npy or .csv)",
            path.display()
        ),
    }
}

fn write_labels(path: &Path, labels: &[i64]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let written: Result<()> = (|| {
        match crate::input::extension(path).as_str() {
            "npy" => {
                use npyz::WriterBuilder;
                let mut w = npyz::WriteOptions::<i64>::new()
                    .default_dtype()
                    .shape(&[labels.len() as u64])
                    .writer(&mut out)
                    .begin_nd()?;
                w.extend(labels.iter().copied())?;
                w.finish()?;
            }
            _ => {
                writeln!(out, "label")?;
                for l in labels {
                    writeln!(out, "{l}")?;
                }
            }
        }
        out.flush()?;
        Ok(())
    })();
    written.with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(args: &DbscanArgs) -> Result<()> {
    // Everything that needs no data is checked first, so that a typo fails fast.
    if args.min_samples < 1 {
        bail!(
            "--min-samples must be at least 1 (got {})",
            args.min_samples
        );
    }
    let opts = DbscanOptions {
        eps: args.eps,
        min_samples: usize::try_from(args.min_samples)?,
        metric: args.run.metric,
        sphere_radius: args.run.sphere_radius,
        backend: args.run.backend,
        algorithm: args.algorithm,
        control: crate::control().clone(),
    };
    opts.validate()?;
    if let Some(path) = &args.output {
        check_output_path(path)?;
    }
    let engine = args.run.engine()?;
    let read_start = Instant::now();
    let points =
        read_points(&args.input, args.run.columns.as_deref())?.with_precision(args.run.precision);
    let data = points
        .dataset()
        .with_context(|| args.input.display().to_string())?;
    let weights = args
        .sample_weight
        .as_deref()
        .map(crate::input::read_weights)
        .transpose()?;
    let read_seconds = read_start.elapsed().as_secs_f64();
    let progress = crate::Progress::start("clustering");
    let result = simjoin::dbscan_weighted(&engine, &data, &opts, weights.as_deref());
    progress.finish();
    let result = result?;
    let t = Instant::now();
    if let Some(path) = &args.output {
        write_labels(path, &result.labels)?;
    }
    let write_seconds = t.elapsed().as_secs_f64();
    let r = &result.report;
    if args.stats {
        let phases: Vec<_> = r
            .phases
            .iter()
            .map(|(name, seconds)| serde_json::json!({ "name": name, "seconds": seconds }))
            .collect();
        let stats = serde_json::json!({
            "clusters": result.clusters,
            "noise_points": result.noise,
            "core_points": result.core_points,
            "border_points": data.len() - result.noise - result.core_points,
            "points": data.len(),
            "dim": data.dim(),
            "eps": opts.eps,
            "min_samples": opts.min_samples,
            "metric": opts.metric.name(),
            "pairs": r.pairs,
            "seconds": r.seconds,
            "backend": r.backend,
            "device": r.device,
            "algorithm": r.algorithm.name(),
            "phases": phases,
            "read_seconds": read_seconds,
            "write_seconds": write_seconds,
        });
        println!("{stats}");
    } else {
        println!(
            "{} clusters, {} noise points, {} core points of {} in {:.3} s on {}{}",
            result.clusters,
            result.noise,
            result.core_points,
            data.len(),
            r.seconds,
            crate::on(&r.backend, &r.device),
            args.output.as_ref().map_or(String::new(), |p| format!(
                "; labels written to {}",
                p.display()
            ))
        );
    }
    Ok(())
}
