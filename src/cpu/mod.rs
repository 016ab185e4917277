//! The native CPU backend: multi-threaded grid join, EGO*-join and brute force. It is the
//! default without a GPU and the reference the GPU paths are tested against.
//!
//! Every algorithm decides pairs with the arithmetic of `metric.rs` (canonical order, or a
//! margin-safe rejection in another order confirmed canonically), so all of them, and the
//! GPU kernels, return the same pair set.

mod brute;
pub(crate) mod dot_filter;
mod ego;
mod emit;
pub(crate) use emit::{holding, in_sink};
mod grid;
mod knn;
pub(crate) mod partition;
mod plan;
mod rows;
mod store;
pub(crate) use store::{avx2_available, prefetch};

use crate::backend::{Job, JoinBackend};
use crate::dataset::Coords;
use crate::error::{Error, Result};
use crate::metric::{threshold, Coord};
use crate::options::{Algorithm, Metric};
use crate::result::{Csr, Distances, JoinReport, PairSink};
use emit::Collector;
use std::time::Instant;
use store::MetricKind;

/// The CPU backend: one rayon pool per engine, started on the first CPU join (an engine
/// that only ever runs on the GPU starts no worker threads) and reused by every join.
pub(crate) struct CpuBackend {
    threads: Option<usize>,
    pool: std::sync::OnceLock<rayon::ThreadPool>,
}

impl CpuBackend {
    /// `threads`: worker threads (`None`: one per core).
    pub fn new(threads: Option<usize>) -> Self {
        CpuBackend {
            threads,
            pool: std::sync::OnceLock::new(),
        }
    }

    /// Runs `f` on the engine's worker threads (its parallel iterators use them).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        Ok(self.pool()?.install(f))
    }

    fn pool(&self) -> Result<&rayon::ThreadPool> {
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads.unwrap_or(0))
            .thread_name(|i| format!("simjoin-cpu-{i}"))
            .build()
            .map_err(|e| Error::from(anyhow::anyhow!("cannot start CPU worker threads: {e}")))?;
        // Two threads may race to build it: one pool wins, the other is dropped unused.
        Ok(self.pool.get_or_init(|| pool))
    }
}

impl JoinBackend for CpuBackend {
    fn run(&self, job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport> {
        let pool = self.pool()?;
        let threads = pool.current_num_threads();
        let mut report = pool.install(|| match (job.a.coords(), job.b.map(|b| b.coords())) {
            (Coords::F32(a), None) => by_metric::<f32>(job, a, None, sink, threads),
            (Coords::F64(a), None) => by_metric::<f64>(job, a, None, sink, threads),
            (Coords::F32(a), Some(Coords::F32(b))) => {
                by_metric::<f32>(job, a, Some(b), sink, threads)
            }
            (Coords::F64(a), Some(Coords::F64(b))) => {
                by_metric::<f64>(job, a, Some(b), sink, threads)
            }
            _ => Err(Error::invalid(
                "A and B must have the same coordinate precision",
            )),
        })?;
        report.backend = "cpu".into();
        report.device = format!("cpu ({threads} threads)");
        report.batches = report.batches.max(1);
        Ok(report)
    }

    fn csr(&self, job: &Job) -> Result<Option<(Csr, Option<Distances>, JoinReport)>> {
        let pool = self.pool()?;
        let threads = pool.current_num_threads();
        let out = pool.install(|| match (job.a.coords(), job.b.map(|b| b.coords())) {
            (Coords::F32(a), None) => csr_by_metric::<f32>(job, a, None, threads),
            (Coords::F64(a), None) => csr_by_metric::<f64>(job, a, None, threads),
            (Coords::F32(a), Some(Coords::F32(b))) => {
                csr_by_metric::<f32>(job, a, Some(b), threads)
            }
            (Coords::F64(a), Some(Coords::F64(b))) => {
                csr_by_metric::<f64>(job, a, Some(b), threads)
            }
            _ => Err(Error::invalid(
                "A and B must have the same coordinate precision",
            )),
        })?;
        Ok(out.map(|(csr, distances, mut report)| {
            report.backend = "cpu".into();
            report.device = format!("cpu ({threads} threads)");
            report.batches = 1;
            (csr, distances, report)
        }))
    }

    fn knn(&self, job: &crate::knn::KnnJob) -> Result<crate::knn::KnnResult> {
        let pool = self.pool()?;
        let threads = pool.current_num_threads();
        pool.install(|| knn::run(job, threads))
    }
}

fn by_metric<T: Coord>(
    job: &Job,
    a: &[T],
    b: Option<&[T]>,
    sink: Option<&mut dyn PairSink>,
    threads: usize,
) -> Result<JoinReport> {
    match job.opts.metric {
        Metric::Euclidean => run::<T, store::Euclid>(job, a, b, sink, threads),
        Metric::Manhattan => run::<T, store::Manhattan>(job, a, b, sink, threads),
        Metric::Chebyshev => run::<T, store::Chebyshev>(job, a, b, sink, threads),
        Metric::Cosine => Err(cosine_reached()),
        Metric::Haversine => unreachable!("haversine joins run as Euclidean (src/geo.rs)"),
    }
}

fn csr_by_metric<T: knn::DistanceType + Default>(
    job: &Job,
    a: &[T],
    b: Option<&[T]>,
    threads: usize,
) -> Result<Option<(Csr, Option<Distances>, JoinReport)>> {
    match job.opts.metric {
        Metric::Euclidean => csr_rows::<T, store::Euclid>(job, a, b, threads),
        Metric::Manhattan => csr_rows::<T, store::Manhattan>(job, a, b, threads),
        Metric::Chebyshev => csr_rows::<T, store::Chebyshev>(job, a, b, threads),
        Metric::Cosine => Err(cosine_reached()),
        Metric::Haversine => unreachable!("haversine joins run as Euclidean (src/geo.rs)"),
    }
}

/// The engine runs cosine joins as Euclidean joins of normalised copies (`src/cosine/`):
/// a cosine job reaching a backend is a bug.
fn cosine_reached() -> Error {
    Error::new(
        crate::error::ErrorKind::Internal,
        "a cosine job reached the CPU backend (cosine joins run as Euclidean)",
    )
}

/// The grid index of B (A for a self-join) and, for A ⋈ B, of A's query points.
fn grid_indexes<T: Coord>(
    geom: &crate::grid::GridGeometry,
    a: &[T],
    b: Option<&[T]>,
    dim: usize,
) -> (grid::GridIndex<T>, Option<grid::GridIndex<T>>) {
    let idx = grid::GridIndex::build(b.unwrap_or(a), dim, geom);
    let qidx = b.map(|_| grid::GridIndex::build(a, dim, geom));
    (idx, qidx)
}

/// Data dimensions up to which a grid join's CSR is built from whole rows. Whole rows
/// search every adjacent cell, twice the half stencil's candidates: 3^d cells around a
/// ball, 2.9 candidates per neighbour in 2-D, 6.4 in 3-D. Measured on 1M uniform points
/// (`bench/RESULTS_BENCH.md`, 2026-11-25 evening): 2-D 25-30% faster than the bucketed
/// pairs (`radix::CsrSink`), 3-D the same, 6-D 1.8x slower.
const ROWS_MAX_DIM: usize = 2;

/// Whether a CSR of `dim`-dimensional points may come from whole rows: asked before the
/// join is checked and planned, so that a CSR which cannot (more dimensions) is not
/// planned twice (the plan's pass over the data: 3-4 ms of 1M 3-D points).
pub(crate) fn csr_rows_may_apply(dim: usize) -> bool {
    dim <= ROWS_MAX_DIM
}

/// The CSR from whole rows (`rows.rs`) where the plan is a grid join over every dimension
/// of at most `ROWS_MAX_DIM`; `None` otherwise.
fn csr_rows<T: knn::DistanceType + Default, M: MetricKind>(
    job: &Job,
    a: &[T],
    b: Option<&[T]>,
    threads: usize,
) -> Result<Option<(Csr, Option<Distances>, JoinReport)>> {
    let dim = job.a.dim();
    let thr: T = threshold(M::METRIC, job.opts.eps);
    let plan = plan::choose(&job.a, job.b.as_ref(), job.opts)?;
    let geom = match (&plan.algorithm, &plan.geometry) {
        (Algorithm::Grid, Some(g)) if csr_rows_may_apply(dim) && g.k() == dim => g,
        _ => return Ok(None),
    };
    let mut notes = plan.notes.clone();
    let t0 = Instant::now();
    let (idx, qidx) = grid_indexes(geom, a, b, dim);
    let mut phases = vec![("index build".to_string(), t0.elapsed().as_secs_f64())];
    notes.push(format!("{} non-empty cells", idx.cell_ids.len()));
    notes.push("CSR: each point's whole row from every adjacent cell".into());
    let t1 = Instant::now();
    let self_join = b.is_none();
    let n = job.a.len();
    let rows = rows::Rows::new(
        n,
        job.b.as_ref().map_or(n, |b| b.len()),
        self_join,
        job.opts.include_self,
        job.opts.sorted,
        job.opts.distances.then_some(&idx.store),
    )?
    .expect(16, threads);
    let writer = || rows.writer::<M>();
    job.opts.control.check()?;
    // Every adjacent cell for every query point, a self-join's too: its rows need both
    // directions of each pair.
    grid::join::<T, M, _>(
        geom,
        qidx.as_ref().unwrap_or(&idx),
        &idx,
        false,
        thr,
        &writer,
        threads,
        &job.opts.control,
    )?;
    job.opts.control.check()?;
    phases.push(("join".to_string(), t1.elapsed().as_secs_f64()));
    let t2 = Instant::now();
    let (csr, distances) = rows.finish(&qidx.as_ref().unwrap_or(&idx).store.ids)?;
    phases.push(("assemble output".to_string(), t2.elapsed().as_secs_f64()));
    if distances.is_some() {
        notes.push("distances: computed as each row was found".into());
    }
    let entries = csr.neighbors.len() as u64;
    let pairs = if self_join {
        // Each unordered pair is in two rows; the diagonal in one.
        (entries - if job.opts.include_self { n as u64 } else { 0 }) / 2
    } else {
        entries
    };
    Ok(Some((
        csr,
        distances.map(T::wrap),
        JoinReport {
            pairs,
            algorithm: plan.algorithm,
            batches: 1,
            phases,
            notes,
            ..Default::default()
        },
    )))
}

fn run<T: Coord, M: MetricKind>(
    job: &Job,
    a: &[T],
    b: Option<&[T]>,
    sink: Option<&mut dyn PairSink>,
    threads: usize,
) -> Result<JoinReport> {
    let dim = job.a.dim();
    let eps = job.opts.eps;
    let thr: T = threshold(M::METRIC, eps);
    let control = &job.opts.control;
    let plan = plan::choose(&job.a, job.b.as_ref(), job.opts)?;
    control.check()?;
    let out = Collector::new(sink, threads);
    let mut phases = Vec::new();
    let mut notes = plan.notes.clone();
    let t0 = Instant::now();
    match plan.algorithm {
        Algorithm::Grid => {
            let geom = plan.geometry.as_ref().expect("grid plan has a geometry");
            control.stage("index", 1);
            let (idx, qidx) = grid_indexes(geom, a, b, dim);
            phases.push(("index build".to_string(), t0.elapsed().as_secs_f64()));
            notes.push(format!("{} non-empty cells", idx.cell_ids.len()));
            control.check()?;
            let t1 = Instant::now();
            let emitter = || out.emitter();
            match &qidx {
                // The index holds B; queries are A's points, so pairs come out (A, B).
                Some(q) => {
                    grid::join::<T, M, _>(geom, q, &idx, false, thr, &emitter, threads, control)?
                }
                None => {
                    grid::join::<T, M, _>(geom, &idx, &idx, true, thr, &emitter, threads, control)?
                }
            }
            phases.push(("join".to_string(), t1.elapsed().as_secs_f64()));
        }
        Algorithm::Ego => {
            let geom = plan.geometry.as_ref().expect("ego plan has a geometry");
            control.stage("index", 1);
            let y = ego::EgoIndex::build(b.unwrap_or(a), dim, geom, control)?;
            let x = match b {
                Some(_) => Some(ego::EgoIndex::build(a, dim, geom, control)?),
                None => None,
            };
            phases.push(("EGO sort".to_string(), t0.elapsed().as_secs_f64()));
            control.check()?;
            let mut canon = vec![0usize; dim];
            for (c, &j) in geom.dims.iter().enumerate() {
                canon[j] = c;
            }
            let t1 = Instant::now();
            notes.extend(match &x {
                Some(x) => ego::join::<T, M>(
                    x,
                    &y,
                    (a, b.unwrap_or(a)),
                    false,
                    thr,
                    canon,
                    &out,
                    threads,
                    control,
                ),
                None => ego::join::<T, M>(&y, &y, (a, a), true, thr, canon, &out, threads, control),
            });
            phases.push(("join".to_string(), t1.elapsed().as_secs_f64()));
        }
        Algorithm::Brute => {
            brute::join::<T, M>(a, b, dim, thr, &out, control);
            phases.push(("join".to_string(), t0.elapsed().as_secs_f64()));
        }
        other => {
            return Err(Error::unsupported(format!(
                "the CPU backend has no '{other}' algorithm (use grid, ego, brute or auto)"
            )))
        }
    }
    let pairs = out.finish()?;
    // Workers that saw the stop left their work undone: the pairs are not the answer.
    control.check()?;
    Ok(JoinReport {
        pairs,
        algorithm: plan.algorithm,
        batches: 1,
        phases,
        notes,
        ..Default::default()
    })
}
