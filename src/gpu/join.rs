//! The GPU join: picks the algorithm (grid or brute force), prepares the device data
//! (`device_data`), builds the kernel, runs the estimation pass and the batches (`batch`),
//! and writes the report. The kernels are glsl/grid_join_*.comp (grid_tile_join_*.comp where
//! the filter runs in shared-memory tiles) and brute_join_*.comp;
//! their interface is `interface.rs`.

use super::batch::{
    estimate, make_slots, run_batches, wait_for, Counts, Out, Pace, Run, Times, SLOTS, TIMER_SLOTS,
};
use super::device_data::{prepare_brute, prepare_grid, Link, Prepared};
use super::dot_filter::{self, Tiling};
use super::interface::{binding, flags, JoinParams};
use super::plan::estimate_stride;
use super::Pools;
use crate::backend::{Job, RowsForm};
use crate::dataset::Coords;
use crate::error::{Error, Result};
use crate::metric::{reject_threshold, threshold, Coord};
use crate::options::Algorithm;
use crate::result::{JoinOutput, JoinReport, PairSink};
use crate::vk::{shaders, Context, GpuTimer, Kernel, KernelSpec, Uploads};
use std::sync::Arc;
use std::time::Instant;

/// Workgroup size on real GPUs (software devices use their subgroup size, see `LOOP_BUDGET`).
const WORKGROUP: u32 = 64;
/// Most queries in one batch (bounds the per-query counter buffer).
const MAX_BATCH_POINTS: usize = 1 << 20;
/// SORTIDU window = eps_T * (1 + this): wider than any |q_u - r_u| of a matching pair
/// (the rounding of the distance test is ~2^-23 relative at most).
const WINDOW_WIDEN: f64 = 1.0 / 1024.0;
/// Auto picks brute force below this many candidate pairs.
const TINY_PAIRS: u64 = 4096;
/// Loop iterations one workgroup may run on a software device: llvmpipe (lavapipe) silently
/// stops loops after 65535 iterations per workgroup invocation (measured: a brute-force
/// query lost its matches past that). With one subgroup per workgroup, each thread gets
/// this divided by the workgroup size, and stops and resumes in the next dispatch.
const LOOP_BUDGET: u32 = 56_000;

/// Runs `job` on `ctx`; uploads go through staging buffers from `pools`, whose result
/// slots the batches reuse.
pub(crate) fn run(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    by_precision(ctx, pools, job, sink, Extra::None)
}

/// `run_typed` in the jobs' coordinate type (f64 only where the device has shaderFloat64).
fn by_precision(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
    sink: Option<&mut dyn PairSink>,
    extra: Extra,
) -> Result<JoinReport> {
    match (job.a.coords(), job.b.map(|b| b.coords())) {
        (Coords::F32(_), None) | (Coords::F32(_), Some(Coords::F32(_))) => {
            run_typed::<f32>(ctx, pools, job, sink, extra)
        }
        (Coords::F64(_), None) | (Coords::F64(_), Some(Coords::F64(_))) => {
            if !ctx.features().shader_float64 {
                return Err(Error::unsupported(format!(
                    "f64 coordinates need shaderFloat64, which {} lacks: convert to f32 or use the CPU backend",
                    ctx.device_name()
                )));
            }
            run_typed::<f64>(ctx, pools, job, sink, extra)
        }
        _ => Err(Error::invalid(
            "A and B must have the same coordinate precision",
        )),
    }
}

/// Each point's number of neighbours within eps in the self-join `job`, the point itself
/// included (DBSCAN's count), counted on the device: the join kernel runs count-only over
/// every adjacent cell (not unicomp's half), so each query counts its whole neighbourhood
/// and no pair is read back, only one count per point. `Ok(None)` for LSS, which has no
/// count-only form.
pub(crate) fn neighbour_counts(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
) -> Result<Option<(Vec<u32>, JoinReport)>> {
    if job.b.is_some() {
        return Err(Error::invalid("neighbour counts are those of a self-join"));
    }
    if choose_algorithm(job)? == Algorithm::Lss {
        return Ok(None);
    }
    let mut counts = vec![0u32; job.a.len()];
    let report = by_precision(ctx, pools, job, None, Extra::Counts(&mut counts))?;
    Ok(Some((counts, report)))
}

/// DBSCAN's second pass on the device (FLAG_LINK): the self-join `job` with the core flags
/// by point id; a pair of two core points is linked in a union-find forest on the device
/// (the larger root under the smaller, as the host links), a pair of two non-core points
/// is dropped, and only core/non-core pairs (border candidates) and the few links the
/// device left undone go to `sink`. Returns the forest (each point's parent, never above
/// the point) for the host to finish. `Ok(None)` for LSS (no FLAG_LINK there).
pub(crate) fn link(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
    core: &[bool],
    sink: &mut dyn PairSink,
) -> Result<Option<(Vec<u32>, JoinReport)>> {
    if job.b.is_some() || core.len() != job.a.len() {
        return Err(Error::invalid(
            "links are those of a self-join, with one core flag per point",
        ));
    }
    if choose_algorithm(job)? == Algorithm::Lss {
        return Ok(None);
    }
    let mut parent: Vec<u32> = (0..job.a.len() as u32).collect();
    let extra = Extra::Link {
        core,
        parent: &mut parent,
    };
    let report = by_precision(ctx, pools, job, Some(sink), extra)?;
    Ok(Some((parent, report)))
}

/// The sorted pairs or the CSR of `job` as rows sorted on the device (`rows.rs`); `None`
/// where device rows do not run (`rows::enabled`, LSS, fewer than two points, a row
/// longer than a result buffer): the caller assembles streamed pairs instead.
pub(crate) fn rows(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
    form: RowsForm,
) -> Result<Option<(JoinOutput, JoinReport)>> {
    if !super::rows::enabled() || choose_algorithm(job)? == Algorithm::Lss {
        return Ok(None);
    }
    let mut out = None;
    let report = by_precision(ctx, pools, job, None, Extra::Rows(form, &mut out))?;
    Ok(out.map(|o| (o, report)))
}

/// What a run makes besides its pairs.
enum Extra<'a> {
    None,
    /// Device rows in this form (`rows.rs`), into the option (left `None` where they do
    /// not apply).
    Rows(RowsForm, &'a mut Option<JoinOutput>),
    /// Count only, every query over its whole neighbourhood (itself included): counts by
    /// point id.
    Counts(&'a mut Vec<u32>),
    /// FLAG_LINK: core flags by point id in, the union-find forest out.
    Link {
        core: &'a [bool],
        parent: &'a mut Vec<u32>,
    },
}

/// The GPU algorithm for `job`: grid, or brute force for tiny inputs under `auto`; LSS
/// (`lss.rs`) when asked for.
fn choose_algorithm(job: &Job) -> Result<Algorithm> {
    let (na, nb) = (job.a.len(), job.b.map_or(job.a.len(), |b| b.len()));
    Ok(match job.opts.algorithm {
        Algorithm::Auto if (na as u64) * (nb as u64) <= TINY_PAIRS => Algorithm::Brute,
        Algorithm::Auto | Algorithm::Grid => Algorithm::Grid,
        Algorithm::Brute => Algorithm::Brute,
        Algorithm::Lss => Algorithm::Lss,
        other => {
            return Err(Error::unsupported(format!(
                "the GPU backend has no '{other}' algorithm (use grid, lss or brute, or the CPU backend)"
            )))
        }
    })
}

/// Software devices: one subgroup per workgroup and a loop budget per thread (0: none).
/// `SIMJOIN_GPU_WORKGROUP=N` (N <= 64) sets a software device's workgroup instead, so that
/// tests run kernels whose barriers span several subgroups there, as on hardware.
pub(super) fn workgroup_and_budget(ctx: &Context) -> (u32, u32) {
    if ctx.is_software() {
        let forced = std::env::var("SIMJOIN_GPU_WORKGROUP").ok();
        let wg = forced
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(ctx.limits().subgroup_size)
            .clamp(1, 64);
        (wg, LOOP_BUDGET / wg)
    } else {
        (WORKGROUP, 0)
    }
}

/// Bound on one binary search of a thread: over the cells, a mask, or the points of one
/// cell (SORTIDU window), all at most `points` (the larger input).
pub(super) fn log_cells(points: usize) -> u32 {
    (usize::BITS - (points + 1).leading_zeros()) + 1
}

/// The least loop work a join thread must be allowed, to make progress: load its query,
/// masks, one probe of `k` indexed dims, one candidate (its dot-product filter, `filter`,
/// included). A software device's loop budget must cover it.
pub(super) fn least_work(dim: usize, k: u32, log_cells: u32, filter: bool) -> u32 {
    let (d, l) = (dim.min(u32::MAX as usize / 8) as u32, log_cells);
    let filter = if filter { 2 * d } else { 0 };
    d + k * (3 * l + 2) + 2 * (k + 2 * l + 2) + 2 * d + 1 + filter
}

/// The join kernel for `algorithm` and `T`, specialised for this job.
#[allow(clippy::too_many_arguments)]
fn join_kernel<T: Coord>(
    ctx: &Arc<Context>,
    algorithm: Algorithm,
    workgroup: u32,
    dim: usize,
    metric: u32,
    prepared: &Prepared,
    tiling: Option<Tiling>,
    control: &crate::control::Control,
) -> Result<Kernel> {
    let tiled = tiling.is_some();
    let (name, spirv) = match (algorithm, std::mem::size_of::<T>()) {
        (Algorithm::Grid, 4) if tiled => ("grid_tile_join", shaders::GRID_TILE_JOIN_F32),
        (Algorithm::Grid, _) if tiled => ("grid_tile_join", shaders::GRID_TILE_JOIN_F64),
        (Algorithm::Grid, 4) => ("grid_join", shaders::GRID_JOIN_F32),
        (Algorithm::Grid, _) => ("grid_join", shaders::GRID_JOIN_F64),
        (_, 4) => ("brute_join", shaders::BRUTE_JOIN_F32),
        _ => ("brute_join", shaders::BRUTE_JOIN_F64),
    };
    let spec = KernelSpec::new(workgroup)
        .bindings(binding::COUNT)
        .push_bytes(std::mem::size_of::<JoinParams<T>>() as u32)
        .constant(1, dim as u32)
        .constant(2, prepared.k)
        .constant(3, metric)
        .constant(4, prepared.sort_dim);
    let spec = match tiling {
        Some(t) => spec.constant(5, t.tile).constant(6, t.floats),
        None => spec,
    };
    // Compiling it can take a software device a good part of a second: a stop returns
    // during it.
    ctx.kernel_stoppable(name, spirv, &spec, || control.check())
}

/// The grid or brute-force join of `job` into `sink` (count only without one), and what
/// `extra` asks for (a self-join's per-point counts, or DBSCAN's links).
fn run_typed<T: Coord>(
    ctx: &Arc<Context>,
    pools: &Pools,
    job: &Job,
    sink: Option<&mut dyn PairSink>,
    extra: Extra,
) -> Result<JoinReport>
where
    JoinParams<T>: bytemuck::Pod,
{
    let opts = job.opts;
    let self_join = job.b.is_none();
    let (na, nb) = (job.a.len(), job.b.map_or(job.a.len(), |b| b.len()));
    let algorithm = choose_algorithm(job)?;
    if algorithm == Algorithm::Lss {
        return super::lss::run::<T>(ctx, job, sink);
    }
    let mut report = JoinReport {
        backend: "vulkan".into(),
        device: ctx.device_name().to_string(),
        algorithm,
        ..Default::default()
    };
    let dim = job.a.dim();
    let (mut per_point, link, mut rows) = match extra {
        Extra::None => (None, None, None),
        Extra::Counts(c) => (Some(c), None, None),
        Extra::Link { core, parent } => (None, Some((core, parent)), None),
        Extra::Rows(form, out) => (None, None, Some((form, out))),
    };
    if let Some(per_point) = &per_point {
        debug_assert!(self_join && sink.is_none() && per_point.len() == na);
    }
    if let Some((core, _)) = &link {
        debug_assert!(self_join && sink.is_some() && core.len() == na);
    }
    if na == 1 && (per_point.is_some() || link.is_some()) {
        // One point: its only neighbour is itself, and it has nothing to link.
        if let Some(p) = per_point.as_mut() {
            p[0] = 1;
        }
        return Ok(report);
    }
    if na == 0 || nb == 0 || (self_join && na < 2) {
        report
            .notes
            .push("nothing to join: fewer than two points".into());
        return Ok(report);
    }
    let t_start = Instant::now();
    let mut times = Times::default();

    // Indexed set R and query set Q on the device.
    let uploads = Uploads::new(ctx, &pools.staging)?;
    let mut prepared = match algorithm {
        // Rows are A's points: A ⋈ B keeps A as the queries.
        Algorithm::Grid => prepare_grid::<T>(
            ctx,
            uploads,
            job,
            rows.is_none(),
            &mut report,
            &mut times.upload,
        )?,
        _ => prepare_brute::<T>(uploads, job, &mut times.upload)?,
    };
    if let Some((core, _)) = &link {
        // Core flags and the forest (every point its own root), by point id, through the
        // job's uploads: the searches wait for the ticket that covers them too.
        let flags: Vec<u32> = core.iter().map(|&c| u32::from(c)).collect();
        let roots: Vec<u32> = (0..na as u32).collect();
        let t = Instant::now();
        prepared.data.link = Some(Link {
            core: prepared.uploads.upload(&flags, "DBSCAN core flags")?,
            parent: prepared.uploads.upload(&roots, "DBSCAN union-find")?,
        });
        prepared.ready = prepared.uploads.submit()?;
        times.upload += t.elapsed().as_secs_f64();
    }
    let index_build = t_start.elapsed().as_secs_f64() - times.upload;
    // A stop during the index build and uploads: their copies complete before the buffers
    // they write go (the caller drops them).
    if opts.control.is_cancelled() {
        prepared.ready.wait()?;
        return Err(crate::control::cancelled());
    }

    let (workgroup, budget) = workgroup_and_budget(ctx);
    let log_cells = log_cells(na.max(nb));
    let least = least_work(dim, prepared.k, log_cells, prepared.dot_cutoff.is_some());
    if budget != 0 && least > budget {
        return Err(Error::unsupported(format!(
            "{} (a software device) cannot run this join: {dim} dimensions with {} indexed \
                 exceed its per-thread loop budget; use fewer indexed dims or the CPU backend",
            ctx.device_name(),
            prepared.k
        )));
    }
    let tiling = match (algorithm, prepared.dot_cutoff) {
        (Algorithm::Grid, Some(_)) => dot_filter::tiling(
            ctx.is_software(),
            prepared.nq as f64 / prepared.n_cells.max(1) as f64,
            ctx.limits().max_compute_shared_memory_size,
            workgroup,
            budget,
            dim,
            prepared.k,
            log_cells,
            prepared.flags & flags::FLAG_REORDER != 0,
            &mut report.notes,
        ),
        _ => None,
    };
    if tiling.is_some() {
        prepared.flags |= flags::FLAG_TILE;
    }
    // A software device's budget is its loop limit, a hardware GPU has none; paced
    // (SIMJOIN_GPU_DISPATCH_MS), it bounds each dispatch's time (batch::Pace), never below
    // what one step of the kernel needs.
    let tiled = tiling.map_or(0, |t| {
        dot_filter::least_tiled_charge(
            &t,
            dim,
            prepared.k,
            log_cells,
            workgroup,
            prepared.flags & flags::FLAG_REORDER != 0,
        )
    });
    let pace = Pace::new(
        budget,
        u64::from(least).max(tiled).min(u64::from(u32::MAX / 8)) as u32,
        super::batch::dispatch_target(budget != 0),
    );
    let t_setup = Instant::now();
    let kernel = join_kernel::<T>(
        ctx,
        algorithm,
        workgroup,
        dim,
        opts.metric as u32,
        &prepared,
        tiling,
        &opts.control,
    );
    let kernel = match kernel {
        Ok(k) => k,
        Err(e) => {
            // The uploads complete before the buffers they write go.
            prepared.ready.wait()?;
            return Err(e);
        }
    };
    if rows.is_some() {
        // The rows' sort kernels too, before the batches (and a stop) begin.
        crate::vk::sort::prepare_u32(ctx)?;
    }
    if opts.control.is_cancelled() {
        prepared.ready.wait()?;
        return Err(crate::control::cancelled());
    }

    let counting = sink.is_none() && rows.is_none();
    let nq = prepared.nq;
    let stride = estimate_stride(nq);
    let n_samples = nq.div_ceil(stride);
    let max_points = MAX_BATCH_POINTS.max(n_samples).min(nq);
    let timer = GpuTimer::new(ctx, TIMER_SLOTS).ok();
    let gpu_clock = timer.as_ref().map(|_| 0.0);
    (times.gpu_search, times.gpu_estimate, times.gpu_copies) = (gpu_clock, gpu_clock, gpu_clock);
    let lanes = super::batch::lanes(ctx.is_software(), prepared.dot_cutoff.is_some());
    let (mut slots, capacity, max_points, reused) = make_slots(
        ctx,
        &pools.slots,
        opts.result_buffer_pairs,
        max_points,
        n_samples,
        lanes,
        counting,
    )?;
    times.setup = t_setup.elapsed().as_secs_f64();
    if lanes > 1 {
        report.notes.push(format!(
            "{lanes} threads a query, each scanning its share of every cell (the dispatches \
             with one query a thread{})",
            if tiling.is_some() {
                ": the estimation pass; the batches sweep in tiles"
            } else {
                ""
            }
        ));
    }
    report.notes.push(format!(
        "result slots: {SLOTS} of {capacity} pairs, {}",
        if reused {
            "kept from the engine's previous join"
        } else {
            "allocated for this join"
        }
    ));
    // The first searches start on the device once the uploads have landed.
    wait_for(&mut slots, &prepared.ready);
    let thr: T = threshold(opts.metric, opts.eps);
    // Per-point counts: the self-join's data with the A ⋈ B search (every adjacent cell,
    // the home cell whole), so each query meets every neighbour and itself.
    let search_flags = if per_point.is_some() {
        prepared.flags & !flags::FLAG_SELF
    } else if let Some((form, _)) = &rows {
        // Rows: the whole stencil too, each row's entries only.
        (prepared.flags & !flags::FLAG_SELF) | super::rows::filter(*form, self_join)
    } else if link.is_some() {
        prepared.flags | flags::FLAG_LINK
    } else {
        prepared.flags
    };
    let stop = super::batch::stop_word(ctx)?;
    let _watch = super::batch::StopWatch::start(&opts.control, &stop);
    let mut run = Run {
        pace,
        control: opts.control.clone(),
        kernel,
        timer,
        data: &prepared.data,
        params: JoinParams {
            q_begin: 0,
            q_count: 0,
            q_stride: 1,
            capacity,
            flags: search_flags,
            n_cells: prepared.n_cells,
            budget,
            log_cells,
            thr,
            window: T::from_f64(T::from_f64(opts.eps).to_f64() * (1.0 + WINDOW_WIDEN)),
            thr_reject: reject_threshold(thr, dim),
            dot_cutoff: T::from_f64(prepared.dot_cutoff.unwrap_or(0.0) as f64),
            lists: 0,
            shift: 0,
            radius: 0,
            rank_lo: 0,
            rank_hi: 0,
            k: 0,
            stop_lo: stop.device_address() as u32,
            stop_hi: (stop.device_address() >> 32) as u32,
            lanes,
            reserved: 0,
        },
        stop: Some(stop),
    };
    let mut counts = Counts {
        per_query: per_point.as_ref().map(|_| vec![0u32; nq]),
        ..Default::default()
    };
    if ctx.is_software() {
        // Its compile of the kernel, before the batches begin (`batch::warm_up`).
        super::batch::warm_up(&run, &mut slots[0]).inspect_err(|_| drop(run.raise_stop()))?;
        opts.control.check()?;
    }

    let batches = if let Some((form, out)) = rows.as_mut() {
        // The point id of each query position.
        let ids: Vec<u32> = match (algorithm, &prepared.data.q_ids) {
            (Algorithm::Grid, Some(q_ids)) => {
                counts.bytes_down += nq as u64 * 4;
                ctx.download(q_ids, 0, nq)?
            }
            (Algorithm::Grid, None) => {
                counts.bytes_down += nq as u64 * 4;
                ctx.download(&prepared.data.r_ids, 0, nq)?
            }
            _ => (0..nq as u32).collect(),
        };
        let made = super::rows::run(
            &mut run,
            &mut slots,
            &ids,
            self_join,
            max_points,
            opts.batch_points,
            *form,
            &mut times,
            &mut counts,
            &mut report.notes,
        )
        .inspect_err(|_| drop(run.raise_stop()))?;
        made.map_or(0, |(output, batches)| {
            **out = Some(output);
            batches
        })
    } else {
        let plan = if counting || !super::plan::estimate_wanted(prepared.dot_cutoff.is_some()) {
            // No pass to size the batches by their pairs: count-only batches write none, and
            // where the filter runs the pass costs about one batch (see `estimate_wanted`).
            // A batch that fills its buffer resumes where each query stopped.
            let plan = super::plan::plan_by_points(nq, max_points, opts.batch_points);
            report.notes.push(format!(
                "no estimation pass ({}): {} batches of <= {} queries; result buffers of {capacity} pairs",
                if counting {
                    "count only"
                } else {
                    "high-dimensional filter"
                },
                plan.ranges.len(),
                plan.ranges.iter().map(|r| r.len()).max().unwrap_or(0),
            ));
            plan
        } else {
            let t_est = Instant::now();
            let plan = estimate(
                &run,
                &mut slots[0],
                nq,
                stride,
                max_points,
                opts.batch_points,
                &mut counts,
                &mut times.gpu_estimate,
            )
            // Whatever failed, the dispatches in flight end early (the slots wait for them).
            .inspect_err(|_| drop(run.raise_stop()))?;
            times.estimate = t_est.elapsed().as_secs_f64();
            report.notes.push(format!(
                "estimate: {} pairs from {} sampled queries (stride {stride}); {} batches of <= {} queries; result buffers of {} pairs",
                plan.estimated_pairs,
                n_samples,
                plan.ranges.len(),
                plan.ranges.iter().map(|r| r.len()).max().unwrap_or(0),
                capacity
            ));
            plan
        };
        let batches = plan.ranges.len();
        run_batches(
            &run,
            &mut slots,
            plan.ranges,
            Out::pairs(sink),
            "join",
            &mut times,
            &mut counts,
        )
        .inspect_err(|_| drop(run.raise_stop()))?;
        batches
    };
    // Every batch has completed: the next join reuses the slots.
    pools
        .slots
        .give(slots, capacity, max_points, lanes, counting);

    if let Some(g) = prepared.dot_cutoff {
        report.notes.push(format!(
            "GPU dot-product filter rejected {} of {} candidates ({:.1}%), cutoff {g:e}",
            counts.dot_rejected,
            counts.dot_tested,
            100.0 * counts.dot_rejected as f64 / counts.dot_tested.max(1) as f64
        ));
    }
    report.pairs = counts.pairs;
    if let (Some(out), Some(per_query)) = (per_point, counts.per_query.take()) {
        // Query positions are the index's slots: their ids (positions themselves for
        // brute force, whose ids are direct).
        let ids: Vec<u32> = match algorithm {
            Algorithm::Grid => {
                counts.bytes_down += nq as u64 * 4;
                ctx.download(&prepared.data.r_ids, 0, nq)?
            }
            _ => (0..nq as u32).collect(),
        };
        for (&id, &c) in ids.iter().zip(&per_query) {
            out[id as usize] = c;
        }
        // Every pair was counted from both sides, and every point met itself.
        report.pairs = (counts.pairs - na as u64) / 2;
        report.notes.push(
            "neighbour counts on the device: count-only search of every adjacent cell, one count per point read back".into(),
        );
    }
    if let (Some((_, parent)), Some(l)) = (link, &prepared.data.link) {
        // Every batch has completed: the forest is final.
        counts.bytes_down += na as u64 * 4;
        *parent = ctx.download(&l.parent, 0, na)?;
        report.notes.push(format!(
            "DBSCAN links on the device: core-core pairs linked there, {} pairs (border candidates and links left to the host) read back",
            counts.pairs
        ));
    }
    report.batches = batches;
    report.index_build = prepared.index_build;
    report.bytes_to_device = prepared.uploads.bytes();
    report.bytes_from_device = prepared.bytes_down + counts.bytes_down;
    // Every upload has completed: the batches waited for them.
    let gpu_upload = prepared.uploads.gpu_seconds()?;
    report.phases = phases(
        &times,
        prepared.planning,
        index_build - prepared.planning,
        prepared.gpu_index_build,
        gpu_upload,
    );
    report.notes.push(format!(
        "{} dispatches: {batches} batches, {} resumed ({} after a full result buffer){}",
        counts.dispatches,
        counts.resumed,
        counts.overflowed,
        match (budget != 0, run.pace.target()) {
            (true, None) => {
                format!(", software device: workgroup {workgroup}, loop budget {budget} per thread")
            }
            (software, Some(target)) => format!(
                "{}, the longest search dispatch {:.1} ms (each thread's loop budget adapted to \
                 about {:.1} ms a dispatch, ended at {})",
                if software {
                    format!(", software device: workgroup {workgroup}, loop budget at most {budget} per thread")
                } else {
                    String::new()
                },
                1e3 * run.pace.longest(),
                1e3 * target,
                run.pace.budget()
            ),
            (false, None) => String::new(),
        }
    ));
    if times.loop_wall > 0.0 {
        report
            .notes
            .push(overlap_note(&times, ctx.compute_queue_count()));
    }
    Ok(report)
}

/// The report's phases, each labelled with the clock that measured it: the GPU's
/// (timestamps on the compute queues) where the device has them, else the host's.
fn phases(
    t: &Times,
    planning: f64,
    index_build: f64,
    gpu_index_build: Option<f64>,
    gpu_upload: Option<f64>,
) -> Vec<(String, f64)> {
    let clock = |gpu: Option<f64>, host: f64, what: &str| match gpu {
        Some(g) => (format!("{what} (GPU clock)"), g),
        None => (format!("{what} (host clock)"), host),
    };
    let mut p = vec![
        // Choosing the grid's dimensions (sampled variances, the cost model's cell counts).
        ("index planning (host clock)".into(), planning),
        // The host build or the device build's recording and waits, uploads' host side
        // excluded.
        ("index build (host clock)".into(), index_build),
    ];
    if let Some(g) = gpu_index_build {
        p.push(("index build kernels (GPU clock)".into(), g));
    }
    p.extend([
        ("upload: staging writes (host clock)".into(), t.upload),
        // The kernel's pipeline (the driver's compile, cached after the first), the
        // timer, and the result slots' device and pinned buffers.
        ("kernel and result buffers (host clock)".into(), t.setup),
    ]);
    if let Some(g) = gpu_upload {
        // 0 where the device maps its memory: the data was written in place.
        p.push(("upload copies (GPU clock)".into(), g));
    }
    p.extend([
        clock(t.gpu_estimate, t.estimate, "estimation"),
        clock(t.gpu_search, t.busy, "search, sum over batches"),
        clock(t.gpu_copies, t.download, "result copies"),
        ("waiting on search (host clock)".into(), t.wait_search),
        ("result reads (host clock)".into(), t.download),
        ("assembly (host clock)".into(), t.assemble),
        ("batch loop wall (host clock)".into(), t.loop_wall),
    ]);
    p
}

/// Overlap in the batch loop: the busy time of its phases (device search and copies on
/// the GPU clock, host reads and assembly) over its wall time; above 1 means they ran
/// at once.
fn overlap_note(t: &Times, queues: usize) -> String {
    let host = t.download + t.assemble;
    match (t.gpu_search, t.gpu_copies) {
        (Some(search), Some(copies)) => format!(
            "overlap: (GPU search {search:.4} s over {} dispatches + GPU copies {copies:.4} s + \
             host reads and assembly {host:.4} s) / batch loop {:.4} s = {:.2}; {:.2} batches \
             in flight on average; {queues} compute queue(s)",
            t.gpu_searches,
            t.loop_wall,
            (search + copies + host) / t.loop_wall,
            t.busy / t.loop_wall,
        ),
        _ => format!(
            "overlap (host clock, no GPU timestamps): batches in flight on average {:.2} \
             (submit-to-done over batch loop {:.4} s); host reads and assembly {host:.4} s; \
             {queues} compute queue(s)",
            t.busy / t.loop_wall,
            t.loop_wall,
        ),
    }
}
