//! `backend = auto`: which backend runs a join, CPU or GPU, by predicted seconds. The
//! prediction is a cost table (per query, per result pair, fixed) over the job's size,
//! dimensionality and a sampled estimate of its pairs; the report says what was predicted
//! and why. It only chooses: both backends return the same pairs.
//!
//! The table was fitted to one machine's measurements (NVIDIA H100 with 16 host cores,
//! bench/results/gpu/h100-2026-11-26, sorted pairs, f64); `SIMJOIN_AUTO_COSTS` replaces
//! entries (`key=value,...`, keys as in [`CostTable::set`]) to calibrate for another.

use crate::dataset::Dataset;
use crate::metric::{threshold, within};
use crate::options::{JoinOptions, OutputForm};

/// Dimensionalities the per-dimension costs are given at; between them the costs are
/// interpolated in log-log space, beyond the last scaled with d.
const ANCHORS: [f64; 3] = [2.0, 6.0, 16.0];

/// Seconds per unit of work, in two kinds: thread-seconds (divided by the CPU threads) and
/// seconds (serial, or the GPU's own).
#[derive(Clone, Debug, PartialEq)]
pub struct CostTable {
    /// CPU: seconds per join (planning, the pool's start).
    pub cpu_fixed: f64,
    /// CPU: thread-seconds per query (index build, search), at each anchor dimension.
    pub cpu_query: [f64; 3],
    /// CPU: thread-seconds per result pair (the candidates tested per pair found), at
    /// each anchor dimension.
    pub cpu_pair: [f64; 3],
    /// Seconds per pair a sink without parts takes, one worker at a time (the CLI's sorted
    /// output: 7.6 ns a pair on the H100's host, 2-D rows).
    pub sink_serial: f64,
    /// Thread-seconds per pair a sink with parts (or a large GPU batch bucketed by every
    /// thread) takes.
    pub sink_parallel: f64,
    /// GPU: seconds per join once the device is open and the engine keeps its buffers.
    pub gpu_fixed: f64,
    /// GPU: seconds to open the device and allocate the result slots (the first join).
    pub gpu_open: f64,
    /// GPU: seconds per query (planning, index, upload, search), at each anchor dimension.
    pub gpu_query: [f64; 3],
    /// GPU: seconds per result pair on the device and the link (8 bytes at 49 GB/s, the
    /// search's writes), at each anchor dimension.
    pub gpu_pair: [f64; 3],
}

impl Default for CostTable {
    /// Fitted to the H100 runs of 2026-11-26 (BENCHMARKS.md, "Second GPU session"), 16
    /// host threads, sorted pairs through the CLI. CPU (run 1): 2-D from the 2M rows at 10
    /// and 100 neighbours a point and the 10M rows, 6-D from the 2M rows, 16-D from the one
    /// 2M row at 10 neighbours (the EGO*-join, 20.8 s). GPU (run 2, the second join of a
    /// process: device open, result slots kept): 2-D from the 2M and 10M rows, 6-D from
    /// the 2M rows; 16-D from run 2's tiled filter (16.55 s with its dispatches paced, an
    /// upper bound: tiles are on there since); opening the device and allocating the
    /// slots took 0.3-0.4 s in run 1.
    fn default() -> Self {
        CostTable {
            cpu_fixed: 0.01,
            cpu_query: [3.0e-7, 5.0e-6, 1.66e-4],
            cpu_pair: [2.0e-9, 8.8e-7, 1.0e-6],
            sink_serial: 7.0e-9,
            sink_parallel: 1.6e-8,
            gpu_fixed: 0.03,
            gpu_open: 0.32,
            gpu_query: [4.0e-8, 1.06e-7, 8.3e-6],
            gpu_pair: [1.2e-9, 2.3e-9, 2.3e-9],
        }
    }
}

impl CostTable {
    /// The default table with `SIMJOIN_AUTO_COSTS` applied.
    pub fn from_env() -> Result<Self, String> {
        let mut t = CostTable::default();
        if let Ok(spec) = std::env::var("SIMJOIN_AUTO_COSTS") {
            t.apply(&spec)?;
        }
        Ok(t)
    }

    /// Applies `key=value,...` (see [`CostTable::set`]).
    pub fn apply(&mut self, spec: &str) -> Result<(), String> {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("SIMJOIN_AUTO_COSTS: '{item}' is not key=value"))?;
            let value: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("SIMJOIN_AUTO_COSTS: '{item}' needs a number >= 0"))?;
            self.set(key.trim(), value)?;
        }
        Ok(())
    }

    /// Sets one entry: `cpu_fixed`, `sink_serial`, `sink_parallel`, `gpu_fixed`,
    /// `gpu_open`, or a per-dimension cost `cpu_query@D`, `cpu_pair@D`, `gpu_query@D`,
    /// `gpu_pair@D` with D one of 2, 6, 16; `cpu_scale` and `gpu_scale` multiply every
    /// cost of that backend.
    pub fn set(&mut self, key: &str, value: f64) -> Result<(), String> {
        let anchored = |name: &str| -> Option<usize> {
            let d = key.strip_prefix(name)?.strip_prefix('@')?;
            ANCHORS.iter().position(|&a| d == format!("{a}"))
        };
        match key {
            "cpu_fixed" => self.cpu_fixed = value,
            "sink_serial" => self.sink_serial = value,
            "sink_parallel" => self.sink_parallel = value,
            "gpu_fixed" => self.gpu_fixed = value,
            "gpu_open" => self.gpu_open = value,
            "cpu_scale" => {
                self.cpu_fixed *= value;
                self.cpu_query.iter_mut().for_each(|c| *c *= value);
                self.cpu_pair.iter_mut().for_each(|c| *c *= value);
                self.sink_serial *= value;
            }
            "gpu_scale" => {
                self.gpu_fixed *= value;
                self.gpu_open *= value;
                self.gpu_query.iter_mut().for_each(|c| *c *= value);
                self.gpu_pair.iter_mut().for_each(|c| *c *= value);
            }
            _ => {
                let slot = if let Some(i) = anchored("cpu_query") {
                    &mut self.cpu_query[i]
                } else if let Some(i) = anchored("cpu_pair") {
                    &mut self.cpu_pair[i]
                } else if let Some(i) = anchored("gpu_query") {
                    &mut self.gpu_query[i]
                } else if let Some(i) = anchored("gpu_pair") {
                    &mut self.gpu_pair[i]
                } else {
                    return Err(format!("SIMJOIN_AUTO_COSTS: unknown key '{key}'"));
                };
                *slot = value;
            }
        }
        Ok(())
    }
}

/// A per-dimension cost at `d`: log-log interpolation between the anchors, the first
/// anchor's below them, scaled with d beyond the last (distance work grows with d).
fn at_dim(costs: &[f64; 3], d: usize) -> f64 {
    let d = (d.max(1)) as f64;
    if d <= ANCHORS[0] {
        return costs[0];
    }
    for i in 1..ANCHORS.len() {
        if d <= ANCHORS[i] {
            let (x0, x1) = (ANCHORS[i - 1].ln(), ANCHORS[i].ln());
            let (y0, y1) = (costs[i - 1].max(1e-30).ln(), costs[i].max(1e-30).ln());
            return (y0 + (y1 - y0) * (d.ln() - x0) / (x1 - x0)).exp();
        }
    }
    costs[ANCHORS.len() - 1] * d / ANCHORS[ANCHORS.len() - 1]
}

/// What a join looks like to the model.
#[derive(Clone, Copy, Debug)]
pub struct JobShape {
    /// Queries (A) and indexed points (B, or A again in a self-join).
    pub queries: usize,
    pub indexed: usize,
    pub dim: usize,
    /// Estimated result pairs.
    pub pairs: f64,
    pub output: OutputForm,
    /// Whether the sink takes pairs from every worker at once (it has parts).
    pub parallel_sink: bool,
}

/// What the model predicted and chose.
#[derive(Clone, Debug)]
pub struct Choice {
    pub gpu: bool,
    pub cpu_seconds: f64,
    pub gpu_seconds: f64,
    /// One line for the report.
    pub reason: String,
}

/// Predicted seconds on each backend and the choice. `threads`: the CPU backend's;
/// `gpu_open`: whether the engine's device is open with its buffers (else the GPU pays
/// [`CostTable::gpu_open`]).
pub fn choose(table: &CostTable, job: &JobShape, threads: usize, gpu_open: bool) -> Choice {
    let threads = threads.max(1) as f64;
    let d = job.dim;
    let nq = job.queries as f64;
    // Count-only outputs hand no pairs to a sink.
    let (pairs, sink_pairs) = match job.output {
        OutputForm::Count => (job.pairs, 0.0),
        _ => (job.pairs, job.pairs),
    };
    let cpu_sink = if job.parallel_sink {
        sink_pairs * table.sink_parallel / threads
    } else {
        sink_pairs * table.sink_serial
    };
    let cpu = table.cpu_fixed
        + (nq * at_dim(&table.cpu_query, d) + pairs * at_dim(&table.cpu_pair, d)) / threads
        + cpu_sink;
    // A GPU batch arrives as one large chunk, bucketed from every thread either way.
    let gpu = table.gpu_fixed
        + if gpu_open { 0.0 } else { table.gpu_open }
        + nq * at_dim(&table.gpu_query, d)
        + pairs * at_dim(&table.gpu_pair, d)
        + sink_pairs * table.sink_parallel / threads;
    let use_gpu = gpu < cpu;
    Choice {
        gpu: use_gpu,
        cpu_seconds: cpu,
        gpu_seconds: gpu,
        reason: format!(
            "backend auto: {} (predicted cpu {cpu:.3} s, gpu {gpu:.3} s: {d}-D, {} queries, \
             {:.3e} pairs estimated, {} output, {} CPU threads{}{})",
            if use_gpu { "gpu" } else { "cpu" },
            job.queries,
            job.pairs,
            job.output,
            threads as usize,
            if job.parallel_sink {
                ""
            } else {
                ", a sink taking one chunk at a time"
            },
            if gpu_open {
                ""
            } else {
                ", the device not yet open"
            },
        ),
    }
}

/// Result pairs of the join, estimated from a sample: up to 256 queries against up to a
/// budget of indexed points (about 4M coordinate differences in all, a few milliseconds),
/// scaled up. Self-joins count unordered pairs.
pub fn estimate_pairs(a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> f64 {
    let r = b.unwrap_or(a);
    let (na, nr, d) = (a.len(), r.len(), a.dim());
    if na == 0 || nr == 0 || d == 0 || r.dim() != d {
        return 0.0;
    }
    let sq = na.min(256);
    let sr = nr.min((4_000_000 / (sq * d)).max(64));
    // Strided samples with an odd offset, so that a self-join's two samples differ.
    let rows = |set: &Dataset, n: usize, k: usize, shift: usize| -> Vec<Vec<f64>> {
        let step = (n / k).max(1);
        (0..k)
            .map(|s| {
                let i = (s * step + shift % step) % n;
                (0..d).map(|j| set.get(i, j)).collect()
            })
            .collect()
    };
    let qs = rows(a, na, sq, 0);
    let rs = rows(r, nr, sr, 7);
    let thr: f64 = threshold(opts.metric, opts.eps);
    let hits = qs
        .iter()
        .map(|q| rs.iter().filter(|x| within(opts.metric, q, x, thr)).count())
        .sum::<usize>() as f64;
    let per_pair = hits / (sq as f64 * sr as f64);
    if b.is_some() {
        per_pair * na as f64 * nr as f64
    } else {
        per_pair * na as f64 * (na as f64 - 1.0) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: usize, n: usize, pairs: f64) -> JobShape {
        JobShape {
            queries: n,
            indexed: n,
            dim: d,
            pairs,
            output: OutputForm::Pairs,
            parallel_sink: false,
        }
    }

    /// The table reproduces the H100 rows it was fitted to: the CPU for 2-D at 10
    /// neighbours a point, the GPU for 6-D, 16-D and 2-D at 100 neighbours.
    #[test]
    fn default_table_picks_as_measured() {
        let t = CostTable::default();
        let pick = |d, n, pairs| choose(&t, &shape(d, n, pairs), 16, true).gpu;
        assert!(!pick(2, 2_000_000, 1.03e7));
        assert!(pick(2, 2_000_000, 1.02e8));
        assert!(pick(6, 2_000_000, 1.03e7));
        assert!(pick(6, 2_000_000, 1.01e8));
        assert!(pick(16, 2_000_000, 8.6e6));
    }

    /// More pairs favour the backend with the cheaper pair; the device's opening cost
    /// pushes small jobs to the CPU; a fake table flips every choice.
    #[test]
    fn crossover_and_overrides() {
        let t = CostTable::default();
        let small = choose(&t, &shape(2, 100_000, 1e5), 16, false);
        assert!(!small.gpu, "{}", small.reason);
        assert!(
            small.reason.contains("device not yet open"),
            "{}",
            small.reason
        );
        let by_pairs: Vec<bool> = [1e6, 1e7, 1e8, 1e9]
            .iter()
            .map(|&p| choose(&t, &shape(2, 2_000_000, p), 16, true).gpu)
            .collect();
        // Once the GPU wins, it keeps winning as pairs grow (cheaper pair cost there).
        let first = by_pairs
            .iter()
            .position(|&g| g)
            .expect("the GPU wins somewhere");
        assert!(by_pairs[first..].iter().all(|&g| g), "{by_pairs:?}");
        assert!(first > 0, "{by_pairs:?}");
        let mut cheap_gpu = t.clone();
        cheap_gpu.apply("gpu_scale=0.001, gpu_open=0").unwrap();
        assert!(choose(&cheap_gpu, &shape(2, 1000, 10.0), 2, false).gpu);
        let mut cheap_cpu = t.clone();
        cheap_cpu.apply("cpu_scale=0.0001").unwrap();
        assert!(!choose(&cheap_cpu, &shape(6, 2_000_000, 1e8), 16, true).gpu);
        assert!(t.clone().apply("nonsense=1").is_err());
        assert!(t.clone().apply("gpu_fixed=-1").is_err());
        let mut one = t.clone();
        one.apply("cpu_query@6=1.5").unwrap();
        assert_eq!(one.cpu_query[1], 1.5);
    }

    #[test]
    fn interpolation_between_and_beyond_anchors() {
        let c = [1.0, 9.0, 100.0];
        assert_eq!(at_dim(&c, 1), 1.0);
        assert_eq!(at_dim(&c, 2), 1.0);
        assert!((at_dim(&c, 6) - 9.0).abs() < 1e-9);
        let mid = at_dim(&c, 4);
        assert!(mid > 1.0 && mid < 9.0, "{mid}");
        assert!((at_dim(&c, 32) - 200.0).abs() < 1e-9);
    }

    /// The sampled estimate is within a factor of 2 of the exact count on uniform data.
    #[test]
    fn pair_estimate_is_close() {
        let n = 20_000;
        let mut s = 99u64;
        let x: Vec<f64> = (0..n * 2)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect();
        let data = Dataset::from_f64(&x, 2).unwrap();
        let opts = JoinOptions::new(0.02);
        let exact = crate::oracle::self_join(&data, opts.metric, opts.eps).len() as f64;
        let est = estimate_pairs(&data, None, &opts);
        assert!(est > exact / 2.0 && est < exact * 2.0, "{est} vs {exact}");
        let ab = estimate_pairs(&data, Some(&data), &opts);
        assert!(
            ab > exact && ab < exact * 4.0 + 2.0 * n as f64,
            "{ab} vs {exact}"
        );
    }
}
