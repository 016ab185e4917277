//! The `simjoin` command: self-join and A ⋈ B of point files, device info, and a demo.

mod dbscan;
mod demo;
mod input;
mod output;
mod sort;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use input::{read_points, Points, Precision};
use simjoin::{
    Algorithm, Backend, Control, Dataset, Engine, EngineOptions, JoinOptions, JoinReport, Metric,
    OutputForm, Pair,
};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "simjoin",
    version,
    about = "Similarity (eps-distance) joins on a Vulkan GPU or the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// All pairs (i < j) of points of INPUT within distance eps.
    SelfJoin {
        /// Points: .npy (2-D f32/f64), .csv/.txt (comma or whitespace separated), .fvecs.
        input: PathBuf,
        #[command(flatten)]
        join: JoinArgs,
    },
    /// All pairs (i in A, j in B) within distance eps.
    Join {
        a: PathBuf,
        b: PathBuf,
        #[command(flatten)]
        join: JoinArgs,
    },
    /// The k nearest neighbours of every point of INPUT (itself excluded), or of every
    /// point of --query, among the points of INPUT: exact, nearest first, ties by index.
    Knn(KnnArgs),
    /// DBSCAN clustering of INPUT on the eps-join, in memory proportional to the points
    /// (the pairs are streamed, never kept): labels 0, 1, ... per cluster, -1 for noise.
    Dbscan(dbscan::DbscanArgs),
    /// Vulkan devices, their queues and limits, and the backend `auto` chooses.
    Info(InfoArgs),
    /// Generates seeded clustered data and runs a real join on it.
    Demo(DemoArgs),
}

/// What every computing command shares: the metric, where it runs, how input is read.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// euclidean, manhattan, chebyshev, cosine (1 - cos(a, b); joins and dbscan) or
    /// haversine (2 columns, latitude and longitude in degrees; eps and distances in metres,
    /// great circle on a sphere of 6,371,008.8 m unless --sphere-radius says otherwise).
    #[arg(long, default_value = "euclidean")]
    pub metric: Metric,
    /// haversine: the sphere's radius in metres (eps and distances are metres on it).
    #[arg(long, default_value_t = simjoin::metric::EARTH_RADIUS_M)]
    pub sphere_radius: f64,
    /// auto, gpu or cpu.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// Coordinate precision (default: as stored; text files are read as f64).
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// CPU worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Vulkan device index or name substring.
    #[arg(long)]
    pub device: Option<String>,
    /// The coordinate columns of the input files, comma-separated header names or 0-based
    /// indices, in that order (e.g. --columns lat,lon of a CSV or Parquet file with other
    /// columns); default: every column.
    #[arg(long)]
    pub columns: Option<String>,
}

impl RunArgs {
    /// The engine for a command: its device and CPU threads from the command line.
    pub fn engine(&self) -> Result<Engine> {
        Ok(Engine::with_options(EngineOptions {
            device: self.device.clone(),
            threads: self.threads,
            validation: None,
        })?)
    }
}

#[derive(Args)]
struct JoinArgs {
    /// Distance threshold (> 0): a pair matches when dist <= eps.
    #[arg(long, allow_negative_numbers = true)]
    eps: f64,
    #[command(flatten)]
    run: RunArgs,
    /// auto, grid, ego, brute or lss.
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    /// LSS: number of shifted Z-order lists (default: automatic).
    #[arg(long)]
    lss_lists: Option<usize>,
    /// Write the pairs to FILE (.npy: (m, 2) uint32; .csv: "i,j" lines; .parquet: columns
    /// i and j), sorted unless --unsorted. Without it, only the pair count is printed.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write the pairs in the order the join finds them: memory independent of the pair
    /// count (sorted output of a result over --sort-memory goes through temporary files).
    #[arg(long, requires = "output")]
    unsorted: bool,
    /// Add each pair's distance (.csv: a third column; .parquet: column distance).
    #[arg(long, requires = "output")]
    distances: bool,
    /// Memory for sorting pairs, e.g. 512M or 4G (default: half the physical memory); a
    /// larger result is sorted in runs spilled to $TMPDIR, else the output's directory.
    #[arg(long, value_parser = parse_size, requires = "output")]
    sort_memory: Option<u64>,
    /// Print one JSON object with the pair count, timings and what ran.
    #[arg(long)]
    stats: bool,
    /// Run the same join N times in this process and report the last: what a long-lived
    /// caller sees once the device is open and its buffers are kept.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
}

#[derive(Args)]
struct KnnArgs {
    /// Data points: .npy (2-D f32/f64), .csv/.txt, .fvecs.
    input: PathBuf,
    /// Neighbours per query point (>= 1).
    #[arg(long)]
    k: usize,
    /// Query points (default: INPUT itself, each point's own entry excluded).
    #[arg(long)]
    query: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
    /// auto, kdtree (CPU), grid (CPU), lss (GPU) or brute.
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    /// LSS: number of shifted Z-order lists (default: automatic).
    #[arg(long)]
    lss_lists: Option<usize>,
    /// Write the neighbours to FILE: .npz (arrays `indices` (m, k) uint32 and `distances`
    /// (m, k)) or .csv (lines "query,rank,neighbor,distance"). Without it, a summary.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Print one JSON object with timings and what ran.
    #[arg(long)]
    stats: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Number of points.
    #[arg(long, default_value_t = 200_000)]
    n: usize,
    /// Dimensions (2 or 3 make a nice picture; any >= 1 works).
    #[arg(long, default_value_t = 3)]
    dim: usize,
    /// Number of Gaussian clusters.
    #[arg(long, default_value_t = 100)]
    clusters: usize,
    /// Distance threshold.
    #[arg(long, default_value_t = 0.004)]
    eps: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// auto, gpu or cpu.
    #[arg(long, default_value = "auto")]
    backend: Backend,
    /// auto, grid, ego, brute or lss.
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    /// Also save the generated points as .npy (an input for `simjoin self-join`).
    #[arg(long)]
    save: Option<PathBuf>,
}

fn main() {
    // Behave like other Unix tools when the reader goes away (`simjoin info | head`): exit
    // quietly on SIGPIPE instead of panicking in println!.
    // SAFETY: restoring the default disposition of a signal, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    control();
    // SAFETY: installs a handler that only does async-signal-safe work (see on_sigint).
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let outcome = match cli.command {
        Command::SelfJoin { input, join } => run_join(&[input], &join),
        Command::Join { a, b, join } => run_join(&[a, b], &join),
        Command::Knn(args) => run_knn(&args),
        Command::Dbscan(args) => dbscan::run(&args),
        Command::Info(args) => info(&args),
        Command::Demo(args) => run_demo(&args),
    };
    if let Err(e) = outcome {
        if cancelled(&e) {
            let p = control().progress();
            eprintln!(
                "simjoin: interrupted after {:.2} s ({} pairs found by then); stopped cleanly",
                p.as_ref().map_or(0.0, |p| p.elapsed),
                p.map_or(0, |p| p.pairs)
            );
            std::process::exit(130);
        }
        // One line: the whole context chain, "outer: inner: cause".
        eprintln!("simjoin: error: {e:#}");
        std::process::exit(1);
    }
}

/// Where a job ran, said once: "cpu (2 threads)", or "NVIDIA H100 80GB HBM3 (vulkan)".
fn on(backend: &str, device: &str) -> String {
    if device.starts_with(backend) {
        device.to_string()
    } else {
        format!("{device} ({backend})")
    }
}

/// The process's stop flag: every job carries it, and SIGINT cancels it (the job then
/// ends within milliseconds, its threads stopped, and the command exits with status 130).
fn control() -> &'static Control {
    static CONTROL: OnceLock<Control> = OnceLock::new();
    CONTROL.get_or_init(Control::new)
}

extern "C" fn on_sigint(_: libc::c_int) {
    // Async-signal-safe: an atomic load (the control exists before the handler is set)
    // and an atomic store; then a second Ctrl-C ends the process at once.
    control().cancel();
    // SAFETY: signal() is async-signal-safe; restores the default disposition.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}

/// Whether `e` is a job stopped through the control (by SIGINT).
fn cancelled(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<simjoin::Error>()
            .is_some_and(|s| s.kind() == simjoin::ErrorKind::Cancelled)
    }) && control().is_cancelled()
}

/// A line on stderr while a job runs, only when stderr is a terminal: the stage, how far
/// it has come, pairs per second and an estimate of the time left.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    ticker: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Progress {
    fn start(what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        let (stop, stopped) = std::sync::mpsc::channel();
        let (shown, what) = (bar.clone(), what.to_string());
        let ticker = std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_millis(200))
            {
                if let Some(p) = control().progress() {
                    shown.set_message(progress_line(&what, &p));
                }
            }
        });
        Progress {
            bar: Some(bar),
            ticker: Some((stop, ticker)),
        }
    }
    fn finish(self) {
        if let Some((stop, ticker)) = self.ticker {
            let _ = stop.send(());
            let _ = ticker.join();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// "joining: join 45%, 12345678 pairs (2.1M/s), ~3 s left".
fn progress_line(what: &str, p: &simjoin::Progress) -> String {
    let rate = if p.elapsed > 0.0 {
        p.pairs as f64 / p.elapsed
    } else {
        0.0
    };
    let left = if p.fraction > 0.01 && p.fraction < 1.0 {
        format!(
            ", ~{:.0} s left",
            p.elapsed * (1.0 - p.fraction) / p.fraction
        )
    } else {
        String::new()
    };
    format!(
        "{what}: {} {:.0}%, {} pairs ({:.3}M/s){left}",
        p.stage,
        100.0 * p.fraction,
        p.pairs,
        rate / 1e6
    )
}

fn options(args: &JoinArgs) -> JoinOptions {
    let mut opts = JoinOptions::new(args.eps);
    opts.metric = args.run.metric;
    opts.sphere_radius = args.run.sphere_radius;
    opts.backend = args.run.backend;
    opts.algorithm = args.algorithm;
    opts.lss_lists = args.lss_lists;
    opts.control = control().clone();
    opts
}

/// Runs a self-join (one input) or A ⋈ B (two inputs), printing the count, the stats, or
/// writing the pairs.
fn run_join(inputs: &[PathBuf], args: &JoinArgs) -> Result<()> {
    let opts = options(args);
    // Check everything that needs no data first, so a typo fails fast.
    opts.validate()?;
    let engine = args.run.engine()?;
    if let Some(path) = &args.output {
        output::check_output_path(path, args.distances)?;
    }
    let read_start = Instant::now();
    let sets: Vec<Points> = inputs
        .iter()
        .map(|p| {
            read_points(p, args.run.columns.as_deref())
                .map(|x| x.with_precision(args.run.precision))
        })
        .collect::<Result<_>>()?;
    let datasets: Vec<Dataset> = sets
        .iter()
        .zip(inputs)
        .map(|(s, p)| s.dataset().with_context(|| p.display().to_string()))
        .collect::<Result<_>>()?;
    let read_seconds = read_start.elapsed().as_secs_f64();
    let (a, b) = (&datasets[0], datasets.get(1));

    for _ in 1..args.repeat {
        join_once(&engine, a, b, &opts, args)?;
    }
    let (report, written) = join_once(&engine, a, b, &opts, args)?;
    if args.stats {
        let write_seconds = written.as_ref().map_or(0.0, |w| w.seconds);
        let mut stats = stats_json(&report, &opts, &datasets, read_seconds, write_seconds);
        if let Some(w) = written {
            stats["output_bytes"] = w.bytes.into();
            stats["sort_runs"] = w.runs.into();
            stats["sort_seconds"] = w.sort_seconds.into();
        }
        println!("{stats}");
    } else if let (Some(path), Some(w)) = (&args.output, written) {
        // One line saying what was done, as a command should.
        println!(
            "wrote {} pairs to {} ({:.1} MB) in {:.3} s: join {:.3} s on {}, writing {:.3} s",
            report.pairs,
            path.display(),
            w.bytes as f64 / 1e6,
            report.seconds + w.seconds,
            report.seconds,
            on(&report.backend, &report.device),
            w.seconds
        );
    } else {
        println!("{}", report.pairs);
    }
    Ok(())
}

/// One join as `run_join` asks: into `--output`, else counted.
fn join_once(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    args: &JoinArgs,
) -> Result<(JoinReport, Option<Written>)> {
    let progress = Progress::start("joining");
    let (report, written) = match &args.output {
        Some(path) => {
            let written = write_join(engine, a, b, opts, args, path);
            progress.finish();
            if written.is_err() {
                // An incomplete file is no answer: leave none behind.
                let _ = std::fs::remove_file(path);
            }
            let (report, written) = written?;
            (report, Some(written))
        }
        None => {
            let mut count_opts = opts.clone();
            count_opts.output = OutputForm::Count;
            let result = match b {
                None => engine.self_join(a, &count_opts),
                Some(b) => engine.join(a, b, &count_opts),
            };
            progress.finish();
            (result?.report, None)
        }
    };
    Ok((report, written))
}

fn run_knn(args: &KnnArgs) -> Result<()> {
    let opts = simjoin::KnnOptions {
        metric: args.run.metric,
        sphere_radius: args.run.sphere_radius,
        backend: args.run.backend,
        algorithm: args.algorithm,
        lss_lists: args.lss_lists,
        control: control().clone(),
    };
    anyhow::ensure!(args.k >= 1, "--k must be at least 1");
    if let Some(path) = &args.output {
        output::check_knn_output_path(path)?;
    }
    let engine = args.run.engine()?;
    let read_start = Instant::now();
    let data =
        read_points(&args.input, args.run.columns.as_deref())?.with_precision(args.run.precision);
    let query = match &args.query {
        // Queries take the data's precision (the join needs one).
        Some(p) => Some(
            read_points(p, args.run.columns.as_deref())?.with_precision(Some(data.precision())),
        ),
        None => None,
    };
    let dset = data
        .dataset()
        .with_context(|| args.input.display().to_string())?;
    let qset = match (&query, &args.query) {
        (Some(q), Some(p)) => Some(q.dataset().with_context(|| p.display().to_string())?),
        _ => None,
    };
    let read_seconds = read_start.elapsed().as_secs_f64();
    let progress = Progress::start("searching");
    let result = engine.knn(&dset, qset.as_ref(), args.k, &opts);
    progress.finish();
    let result = result?;
    let t = Instant::now();
    if let Some(path) = &args.output {
        output::write_knn(path, &result)?;
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
            "rows": result.rows,
            "k": result.k,
            "seconds": r.seconds,
            "backend": r.backend,
            "device": r.device,
            "algorithm": r.algorithm.name(),
            "phases": phases,
            "notes": r.notes,
            "points": dset.len(),
            "queries": qset.map_or(dset.len(), |q| q.len()),
            "dim": dset.dim(),
            "metric": args.run.metric.name(),
            "read_seconds": read_seconds,
            "write_seconds": write_seconds,
        });
        println!("{stats}");
    } else {
        let mean_kth = if result.rows > 0 {
            (0..result.rows)
                .map(|row| result.distance(row, result.k - 1))
                .sum::<f64>()
                / result.rows as f64
        } else {
            0.0
        };
        println!(
            "{} query points x {} neighbours in {:.3} s on {}, algorithm {}; mean distance to the k-th neighbour {mean_kth:.6}{}",
            result.rows,
            result.k,
            r.seconds,
            on(&r.backend, &r.device),
            r.algorithm,
            args.output
                .as_ref()
                .map_or(String::new(), |p| format!("; written to {}", p.display()))
        );
    }
    Ok(())
}

fn stats_json(
    report: &JoinReport,
    opts: &JoinOptions,
    sets: &[Dataset],
    read_seconds: f64,
    write_seconds: f64,
) -> serde_json::Value {
    let phases: Vec<_> = report
        .phases
        .iter()
        .map(|(name, seconds)| serde_json::json!({ "name": name, "seconds": seconds }))
        .collect();
    serde_json::json!({
        "pairs": report.pairs,
        "seconds": report.seconds,
        "backend": report.backend,
        "device": report.device,
        "algorithm": report.algorithm.name(),
        "batches": report.batches,
        "index_build": report.index_build.map(|b| b.name()),
        "bytes_to_device": report.bytes_to_device,
        "bytes_from_device": report.bytes_from_device,
        "phases": phases,
        "notes": report.notes,
        "points": sets.iter().map(|s| s.len()).collect::<Vec<_>>(),
        "dim": sets[0].dim(),
        "eps": opts.eps,
        "metric": opts.metric.name(),
        "read_seconds": read_seconds,
        "write_seconds": write_seconds,
    })
}

/// What writing the pairs took.
struct Written {
    /// Seconds spent writing (and sorting): the join's own time is not counted.
    seconds: f64,
    bytes: u64,
    /// Sorted runs spilled to temporary files (0: sorted in memory, or unsorted).
    runs: usize,
    /// Seconds the in-memory sort took to finish after the join's last pair (0 unsorted or
    /// spilled): with the join's own seconds, the time to every pair in memory in order.
    sort_seconds: f64,
}

/// Runs the join into `--output`: straight to the file with --unsorted, else through the
/// external sort.
fn write_join(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    args: &JoinArgs,
    path: &std::path::Path,
) -> Result<(JoinReport, Written)> {
    let mut writer = output::PairWriter::create(path, args.distances.then(|| a.precision()))?;
    let mut seconds = 0.0;
    // Distances are computed per batch, in the order the pairs are written.
    let mut emit = |pairs: &[Pair]| -> Result<()> {
        let d = if args.distances {
            let b = b.unwrap_or(a);
            Some(simjoin::result::pair_distances(a, b, opts, pairs)?)
        } else {
            None
        };
        writer
            .write(pairs, d)
            .with_context(|| format!("cannot write {}", path.display()))
    };
    let mut sort_seconds = 0.0;
    let budget = args.sort_memory.unwrap_or_else(default_sort_memory);
    let in_memory = if args.unsorted {
        None
    } else {
        sorted_on_gpu(engine, a, b, opts, budget)?
    };
    let (report, runs) = if let Some(result) = in_memory {
        // Sorted in memory by the engine (on a GPU, rows sorted on the device): written
        // after the join, which already holds every pair in order.
        let t = Instant::now();
        let pairs = result.pairs().unwrap_or_default();
        pairs.chunks(PIECE_PAIRS).try_for_each(&mut emit)?;
        seconds += t.elapsed().as_secs_f64();
        (result.report, 0)
    } else if args.unsorted {
        let report = stream_join(
            engine,
            a,
            b,
            opts,
            |_| Ok(false),
            |chunk| {
                let t = Instant::now();
                emit(&chunk)?;
                seconds += t.elapsed().as_secs_f64();
                Ok(())
            },
        )?;
        (report, 0)
    } else {
        let spill_dir = match std::env::var_os("TMPDIR") {
            Some(dir) => PathBuf::from(dir),
            None => match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
        };
        let sort = std::sync::Mutex::new(sort::ExternalSort::new(
            budget,
            &spill_dir,
            a.len(),
            b.unwrap_or(a).len(),
        ));
        // A chunk at least this large (a GPU batch) goes into the sort from the join's own
        // thread, its pairs bucketed by every engine thread at once (through the queue one
        // thread bucketed a GPU's batches: 4.6 s of a 6.0 s join of 503M pairs on an H100's
        // 16-core host, 2026-11-26); smaller ones (the CPU backend's) through the queue, so
        // that sorting overlaps the join (pushed from the workers themselves, the CPU's
        // sorted output took twice as long there).
        const LARGE_CHUNK: usize = 1 << 20;
        let lock = || sort.lock().unwrap_or_else(|p| p.into_inner());
        let report = stream_join(
            engine,
            a,
            b,
            opts,
            |chunk| {
                let large = chunk.len() >= LARGE_CHUNK;
                if large {
                    lock().push(chunk)?;
                }
                Ok(large)
            },
            |piece| lock().push(&piece),
        )?;
        let sort = sort.into_inner().unwrap_or_else(|p| p.into_inner());
        let t = Instant::now();
        let runs = sort.runs();
        sort.finish(&mut emit, &mut sort_seconds)?;
        seconds += t.elapsed().as_secs_f64();
        (report, runs)
    };
    let t = Instant::now();
    let bytes = writer
        .finish()
        .with_context(|| format!("cannot write {}", path.display()))?;
    seconds += t.elapsed().as_secs_f64();
    Ok((
        report,
        Written {
            seconds,
            bytes,
            runs,
            sort_seconds,
        },
    ))
}

/// The sorted join collected by the engine, where it runs on a GPU and its pairs (as the
/// engine estimates them, with room for the estimate's error) fit a third of the sort's
/// memory `budget`: the GPU then sorts its rows on the device (`src/gpu/rows.rs`) instead
/// of the host bucketing every batch. `None`: the caller streams the pairs through its
/// external sort (the CPU backend's path, and results larger than memory).
fn sorted_on_gpu(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    budget: u64,
) -> Result<Option<simjoin::JoinResult>> {
    if engine.backend_for(a, b, opts)? != Backend::Gpu {
        return Ok(None);
    }
    let pairs = simjoin::auto::estimate_pairs(a, b, opts);
    if pairs * 8.0 * 3.0 > budget as f64 {
        return Ok(None);
    }
    let mut o = opts.clone();
    o.output = OutputForm::Pairs;
    o.sorted = true;
    o.distances = false;
    Ok(Some(match b {
        None => engine.self_join(a, &o)?,
        Some(b) => engine.join(a, b, &o)?,
    }))
}

/// Pieces of pairs the join may run ahead of the writer, and their size: the queue holds
/// at most 8 MiB, however large the chunks the backend delivers (a GPU's are a whole result
/// buffer).
const QUEUE_PIECES: usize = 16;
const PIECE_PAIRS: usize = 1 << 16;

/// Runs the join on a thread of its own and hands its chunks to `consume` on this one, so
/// that writing overlaps the join; except the chunks `direct` takes on the join's thread
/// (it answers whether it did). An error from either stops the join.
fn stream_join(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    mut direct: impl FnMut(&[Pair]) -> anyhow::Result<bool> + Send,
    mut consume: impl FnMut(Vec<Pair>) -> Result<()>,
) -> Result<JoinReport> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Pair>>(QUEUE_PIECES);
    std::thread::scope(|scope| {
        let join = scope.spawn(move || {
            let mut sink = |chunk: &[Pair]| {
                if direct(chunk)? {
                    return Ok(());
                }
                chunk.chunks(PIECE_PAIRS).try_for_each(|piece| {
                    tx.send(piece.to_vec())
                        .map_err(|_| anyhow::anyhow!("the output writer stopped"))
                })
            };
            match b {
                None => engine.self_join_stream(a, opts, &mut sink),
                Some(b) => engine.join_stream(a, b, opts, &mut sink),
            }
        });
        let consumed = rx.iter().try_for_each(&mut consume);
        // Dropping the receiver makes the join's next send fail, which stops it.
        drop(rx);
        let report = join
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        consumed?;
        Ok(report?)
    })
}

/// Half the physical memory (1 GiB where it cannot be read).
fn default_sort_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64 / 2
    } else {
        1 << 30
    }
}

/// A byte count with an optional K, M, G or T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((k, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown size suffix in '{s}' (K, M, G or T)")),
            };
            (&t[..k], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 512M)"))?;
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("'{s}' is not a usable size"))
}

#[derive(Args)]
struct InfoArgs {
    /// Also measure host <-> device copy bandwidth with buffers of this many MiB (the
    /// bound on a GPU join's transfers: bench/run.py gpu divides result bytes by it).
    #[arg(long, value_name = "MIB")]
    bandwidth: Option<u64>,
    /// The device to measure (index or name substring; default: SIMJOIN_DEVICE, else the
    /// best device).
    #[arg(long)]
    device: Option<String>,
}

fn info(args: &InfoArgs) -> Result<()> {
    println!("simjoin {}", env!("CARGO_PKG_VERSION"));
    let devices = simjoin::devices()?;
    if devices.is_empty() {
        println!("Vulkan devices: none found");
    } else {
        println!("Vulkan devices:");
        for d in &devices {
            println!(
                "  [{}] {} ({}), Vulkan {}, driver {}",
                d.index, d.name, d.kind, d.api_version, d.driver
            );
            for line in &d.details {
                println!("      {line}");
            }
        }
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("CPU: {threads} threads");
    // `--backend auto` weighs the CPU against a hardware GPU per join (its cost model);
    // a two-point join shows what it does with a tiny one, and whether a GPU is weighed.
    let probe = [0.0f32, 1.0];
    let result = Engine::new().self_join(&Dataset::from_f32(&probe, 1)?, &JoinOptions::new(1.0))?;
    let weighed = result
        .report
        .notes
        .iter()
        .any(|n| n.starts_with("backend auto:"));
    println!(
        "backend auto chooses: {} ({}) for a tiny join; {}",
        result.report.backend,
        result.report.device,
        if weighed {
            "a hardware GPU is weighed against the CPU per join"
        } else {
            "no hardware GPU: every join runs on the CPU"
        }
    );
    if let Some(mib) = args.bandwidth {
        bandwidth(mib, args.device.clone())?;
    }
    Ok(())
}

#[cfg(feature = "gpu")]
fn bandwidth(mib: u64, device: Option<String>) -> Result<()> {
    anyhow::ensure!(mib >= 1, "--bandwidth needs at least 1 MiB");
    let ctx = simjoin::vk::Context::new(&simjoin::vk::ContextOptions {
        device,
        validation: None,
    })?;
    let b = ctx.transfer_bandwidth(mib << 20, 3)?;
    // Two lines, parsed by bench/sjbench/runner.py: the link first (the transfer bound).
    println!(
        "bandwidth on {}: host->device {:.3} GB/s, device->host {:.3} GB/s ({} MiB, best of 3; \
         the link: pinned buffers, copies of up to 32 MiB in flight on every queue)",
        ctx.device_name(),
        b.link_up / 1e9,
        b.link_down / 1e9,
        mib
    );
    println!(
        "serial round trip on {}: host->device {:.3} GB/s, device->host {:.3} GB/s ({} MiB, \
         best of 3; one copy, a wait, one thread copying between the pinned buffer and an array)",
        ctx.device_name(),
        b.upload / 1e9,
        b.download / 1e9,
        mib
    );
    Ok(())
}

#[cfg(not(feature = "gpu"))]
fn bandwidth(_mib: u64, _device: Option<String>) -> Result<()> {
    anyhow::bail!("this simjoin was built without the gpu feature: no device to measure")
}

fn run_demo(args: &DemoArgs) -> Result<()> {
    anyhow::ensure!(args.dim >= 1, "--dim must be at least 1");
    let spread = 0.01;
    println!(
        "Generating {} points in {}-D: {} Gaussian clusters (sigma {spread}) + 10% uniform noise, seed {}",
        args.n, args.dim, args.clusters, args.seed
    );
    let points = demo::clustered(args.n, args.dim, args.clusters, spread, args.seed);
    if let Some(path) = &args.save {
        anyhow::ensure!(
            input::extension(path) == "npy",
            "--save needs a .npy file name"
        );
        save_npy(path, &points, args.dim)?;
        println!("Saved the points to {}", path.display());
    }
    let data = Dataset::from_f32(&points, args.dim)?;
    let mut opts = JoinOptions::new(args.eps);
    opts.backend = args.backend;
    opts.algorithm = args.algorithm;
    opts.sorted = true;
    opts.control = control().clone();
    println!("Self-join with Euclidean eps = {} ...", args.eps);
    let progress = Progress::start("joining");
    let result = Engine::new().self_join(&data, &opts);
    progress.finish();
    let result = result?;
    let r = &result.report;
    let pairs = result.pairs().unwrap_or(&[]);
    println!(
        "Found {} pairs in {:.3} s on {}, algorithm {}, {} batch(es)",
        r.pairs,
        r.seconds,
        on(&r.backend, &r.device),
        r.algorithm,
        r.batches
    );
    println!(
        "Selectivity: {:.2} neighbours per point on average",
        2.0 * r.pairs as f64 / args.n.max(1) as f64
    );
    for (name, seconds) in &r.phases {
        println!("  phase {name}: {seconds:.3} s");
    }
    println!("Example pairs (i, j, distance):");
    for &[i, j] in pairs.iter().take(5) {
        let (p, q) = (
            &points[i as usize * args.dim..][..args.dim],
            &points[j as usize * args.dim..][..args.dim],
        );
        let d2: f64 = p
            .iter()
            .zip(q)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum();
        println!("  ({i}, {j})  {:.6}", d2.sqrt());
    }
    println!("Neighbour-count histogram (neighbours: points):");
    for (label, count) in demo::degree_histogram(pairs, args.n) {
        println!("  {label:>9}: {count}");
    }
    Ok(())
}

fn save_npy(path: &std::path::Path, points: &[f32], dim: usize) -> Result<()> {
    use npyz::WriterBuilder;
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&[(points.len() / dim) as u64, dim as u64])
        .writer(std::io::BufWriter::new(file))
        .begin_nd()?;
    w.extend(points.iter().copied())?;
    w.finish()?;
    Ok(())
}
