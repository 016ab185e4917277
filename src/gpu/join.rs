//! The GPU join driver: uploads the index (grid) or the raw points (brute force), runs the
//! estimation pass, then the batches over three streams, and streams pairs to the sink.
//!
//! Each of the three slots owns a stream (its own queue where the device has several), a
//! device result buffer, counters, per-query continuation states and, where device memory
//! is not host-mapped, pinned read-back buffers. A slot's batch goes: search (kernel) ->
//! read the counters -> copy exactly the pairs found to its pinned buffer -> hand them to
//! the sink -> search again if some query stopped early (result buffer full, or the loop
//! budget of a software device used up), resuming where it stopped. While the host
//! assembles one slot's pairs, the other two slots' kernels and copies run.

use super::index::{plan_grid, GridIndex};
use super::plan::{estimate_stride, plan_batches};
use crate::dataset::{Coords, Dataset};
use crate::backend::Job;
use crate::error::{Error, ErrorKind, Result};
use crate::metric::{reject_margin, threshold, Coord};
use crate::options::Algorithm;
use crate::result::{sink_error, JoinReport, Pair, PairSink};
use crate::vk::{
    shaders, Buffer, BufferRange, Context, GpuTimer, Kernel, KernelSpec, Memory, Stream, Ticket,
};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Workgroup size on real GPUs (software devices use their subgroup size, see `LOOP_BUDGET`).
const WORKGROUP: u32 = 64;
const BINDINGS: u32 = 11;
const FLAG_SELF: u32 = 1;
const FLAG_COUNT: u32 = 2;
const FLAG_SWAP: u32 = 4;
const FLAG_SORTIDU: u32 = 8;
const FLAG_REORDER: u32 = 16;
/// Streams (and pinned buffers) the batches rotate over.
const SLOTS: usize = 3;
/// Most queries in one batch (bounds the per-query counter buffer).
const MAX_BATCH_POINTS: usize = 1 << 20;
/// Default result buffer: 2^24 pairs (128 MiB), less where the binding limit is smaller.
const DEFAULT_RESULT_PAIRS: u64 = 1 << 24;
/// Smallest result buffer tried when device memory runs out.
const MIN_RESULT_PAIRS: u64 = 1 << 10;
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

/// Everything the kernel reads, on the device.
struct DeviceData {
    r_coords: Buffer,
    q_coords: Option<Buffer>,
    cell_keys: Buffer,
    cell_ranges: Buffer,
    r_ids: Buffer,
    q_ids: Option<Buffer>,
    q_cells: Option<Buffer>,
    meta: Buffer,
}

impl DeviceData {
    fn bindings<'a>(
        &'a self,
        results: &'a Buffer,
        counters: &'a Buffer,
        states: &'a Buffer,
    ) -> [BufferRange<'a>; BINDINGS as usize] {
        [
            self.r_coords.all(),
            self.q_coords.as_ref().unwrap_or(&self.r_coords).all(),
            self.cell_keys.all(),
            self.cell_ranges.all(),
            self.r_ids.all(),
            self.q_ids.as_ref().unwrap_or(&self.r_ids).all(),
            self.q_cells.as_ref().unwrap_or(&self.meta).all(),
            self.meta.all(),
            results.all(),
            counters.all(),
            states.all(),
        ]
    }
}

/// Uploads `data` (never empty: Vulkan bindings cannot be), checking the binding limit.
fn upload<T: bytemuck::Pod>(ctx: &Arc<Context>, data: &[T], name: &str) -> Result<Buffer> {
    let bytes = std::mem::size_of_val(data) as u64;
    let limit = ctx.limits().max_storage_buffer_range;
    if bytes > limit {
        return Err(Error::unsupported(format!(
            "{name} needs {bytes} bytes, more than this device binds at once ({limit}); \
             use the CPU backend or split the data"
        )));
    }
    if data.is_empty() {
        return ctx.upload(&[0u32], name);
    }
    ctx.upload(data, name)
}

/// One batch slot: a stream and its buffers.
struct Slot {
    stream: Stream,
    results: Buffer,
    /// [pairs written or attempted, some query stopped early].
    counters: Buffer,
    /// Continuation state per query of the batch (uvec4).
    states: Buffer,
    /// Pinned read-back buffers where device memory is not mapped.
    results_host: Option<Buffer>,
    counters_host: Option<Buffer>,
    states_host: Option<Buffer>,
    state: SlotState,
}

enum SlotState {
    Free,
    Searching {
        queries: Range<u32>,
        ticket: Ticket,
        submitted: Instant,
    },
    Downloading {
        queries: Range<u32>,
        pairs: usize,
        incomplete: bool,
        ticket: Ticket,
        submitted: Instant,
    },
}

/// Measured times (seconds) for the report.
#[derive(Default)]
struct Times {
    upload: f64,
    estimate: f64,
    wait_search: f64,
    download: f64,
    assemble: f64,
    loop_wall: f64,
    /// Sum over batches of submit-to-done seconds (observed on the host).
    busy: f64,
    /// Sum of the search dispatches' GPU time (timestamps), when the queue has them.
    gpu_search: Option<f64>,
}

/// What every dispatch of one join shares. Borrows the device data, which is declared
/// before the slots and so outlives them: dropping a slot's stream waits for its work.
struct Run<'a, T: Coord> {
    kernel: Kernel,
    /// Two timestamp slots per batch slot (around its search dispatch), where supported.
    timer: Option<&'a GpuTimer>,
    data: &'a DeviceData,
    /// Non-empty cells (grid) or indexed points (brute force).
    n_cells: u32,
    /// Iterations a binary search over the index may take.
    log_cells: u32,
    thr: T,
    window: T,
    thr_reject: T,
    base_flags: u32,
    capacity: u32,
    budget: u32,
}

impl<T: Coord> Run<'_, T> {
    /// The kernel's push-constant block (see `Params` in glsl/join_common.glsl).
    fn push_constants(
        &self,
        queries: &Range<u32>,
        q_count: u32,
        stride: u32,
        flags: u32,
    ) -> Vec<u8> {
        let header: [u32; 8] = [
            queries.start,
            q_count,
            stride,
            self.capacity,
            flags,
            self.n_cells,
            self.budget,
            self.log_cells,
        ];
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytemuck::bytes_of(&self.thr));
        bytes.extend_from_slice(bytemuck::bytes_of(&self.window));
        bytes.extend_from_slice(bytemuck::bytes_of(&self.thr_reject));
        bytes
    }
}

fn new_slot(
    ctx: &Arc<Context>,
    index: usize,
    capacity: u64,
    max_points: usize,
    counting: bool,
) -> Result<Slot> {
    let result_bytes = if counting { 8 } else { capacity * 8 };
    let state_bytes = max_points as u64 * 16;
    let results = Buffer::new(ctx, result_bytes, Memory::Device, "join results")?;
    let counters = Buffer::new(ctx, 8, Memory::Device, "join counters")?;
    let states = Buffer::new(ctx, state_bytes, Memory::Device, "join query states")?;
    // `SIMJOIN_GPU_STAGING=1` takes the discrete-GPU path (copies into pinned buffers) on
    // a unified-memory device too, so that tests on lavapipe cover it.
    let staging =
        !results.is_mapped() || std::env::var("SIMJOIN_GPU_STAGING").is_ok_and(|v| v == "1");
    let pinned = |bytes, name| -> Result<Option<Buffer>> {
        Ok(if !staging {
            None
        } else {
            Some(Buffer::new(ctx, bytes, Memory::Readback, name)?)
        })
    };
    Ok(Slot {
        stream: Stream::new(ctx, index)?,
        results_host: pinned(result_bytes, "pinned results")?,
        counters_host: pinned(8, "pinned counters")?,
        states_host: pinned(state_bytes, "pinned query states")?,
        results,
        counters,
        states,
        state: SlotState::Free,
    })
}

/// The three slots. Result-buffer capacity: the user's, else the default within the binding
/// limit. On device out-of-memory, the result buffers and the batch size (query states)
/// are halved, down to MIN_RESULT_PAIRS pairs and `min_points` queries, before giving up.
/// Returns the slots, the capacity and the most queries per batch.
fn make_slots(
    ctx: &Arc<Context>,
    requested: Option<usize>,
    mut max_points: usize,
    min_points: usize,
    counting: bool,
) -> Result<(Vec<Slot>, u32, usize)> {
    let limit_pairs = ctx.limits().max_storage_buffer_range / 8;
    let mut capacity = match requested {
        Some(c) => (c as u64).min(limit_pairs),
        None => DEFAULT_RESULT_PAIRS.min(limit_pairs),
    }
    .min(u32::MAX as u64 / 2)
    .max(1);
    loop {
        match (0..SLOTS)
            .map(|i| new_slot(ctx, i, capacity, max_points, counting))
            .collect::<Result<Vec<_>>>()
        {
            Ok(slots) => return Ok((slots, capacity as u32, max_points)),
            Err(e)
                if e.kind() == ErrorKind::OutOfDeviceMemory
                    && (capacity > MIN_RESULT_PAIRS || max_points > min_points) =>
            {
                capacity = (capacity / 2).max(MIN_RESULT_PAIRS.min(capacity));
                max_points = (max_points / 2).max(min_points);
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn run(
    ctx: &Arc<Context>,
    job: &Job,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    match (job.a.coords(), job.b.map(|b| b.coords())) {
        (Coords::F32(_), None) | (Coords::F32(_), Some(Coords::F32(_))) => {
            run_typed::<f32>(ctx, job, sink)
        }
        (Coords::F64(_), None) | (Coords::F64(_), Some(Coords::F64(_))) => {
            if !ctx.features().shader_float64 {
                return Err(Error::unsupported(format!(
                    "f64 coordinates need shaderFloat64, which {} lacks: convert to f32 or use the CPU backend",
                    ctx.device_name()
                )));
            }
            run_typed::<f64>(ctx, job, sink)
        }
        _ => Err(Error::invalid(
            "A and B must have the same coordinate precision",
        )),
    }
}

/// Row-major coordinates of `data` as `T` (the precision was checked by the caller).
fn coords_of<'a, T: Coord>(data: &Dataset<'a>) -> &'a [T] {
    match data.coords() {
        Coords::F32(x) => bytemuck::cast_slice(x),
        Coords::F64(x) => bytemuck::cast_slice(x),
    }
}

fn gather<T: Coord>(coords: &[T], dim: usize, order: &[u32]) -> Vec<T> {
    let mut out = Vec::with_capacity(order.len() * dim);
    for &i in order {
        out.extend_from_slice(&coords[i as usize * dim..(i as usize + 1) * dim]);
    }
    out
}

fn run_typed<T: Coord>(
    ctx: &Arc<Context>,
    job: &Job,
    mut sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    let opts = job.opts;
    let self_join = job.b.is_none();
    let (na, nb) = (job.a.len(), job.b.map_or(job.a.len(), |b| b.len()));
    let algorithm = match opts.algorithm {
        Algorithm::Auto if (na as u64) * (nb as u64) <= TINY_PAIRS => Algorithm::Brute,
        Algorithm::Auto | Algorithm::Grid => Algorithm::Grid,
        Algorithm::Brute => Algorithm::Brute,
        other => {
            return Err(Error::unsupported(format!(
                "the GPU backend has no '{other}' algorithm (use grid or brute, or the CPU backend)"
            )))
        }
    };
    let mut report = JoinReport {
        backend: "vulkan".into(),
        device: ctx.device_name().to_string(),
        algorithm,
        ..Default::default()
    };
    let dim = job.a.dim();
    if na == 0 || nb == 0 || (self_join && na < 2) {
        report
            .notes
            .push("nothing to join: fewer than two points".into());
        return Ok(report);
    }
    let t_start = Instant::now();
    let eps = opts.eps;
    let thr: T = threshold(opts.metric, eps);
    let window = T::from_f64(T::from_f64(eps).to_f64() * (1.0 + WINDOW_WIDEN));
    let mut times = Times::default();

    // Indexed set R and query set Q on the device.
    let Prepared {
        data,
        n_cells,
        nq,
        flags,
        k: k_spec,
        sort_dim,
    } = match algorithm {
        Algorithm::Grid => prepare_grid::<T>(ctx, job, &mut report, &mut times)?,
        _ => prepare_brute::<T>(ctx, job, &mut times)?,
    };
    let index_build = t_start.elapsed().as_secs_f64() - times.upload;

    let spirv = match (algorithm, std::mem::size_of::<T>()) {
        (Algorithm::Grid, 4) => shaders::GRID_JOIN_F32,
        (Algorithm::Grid, _) => shaders::GRID_JOIN_F64,
        (_, 4) => shaders::BRUTE_JOIN_F32,
        _ => shaders::BRUTE_JOIN_F64,
    };
    // Software devices: one subgroup per workgroup and a loop budget per thread.
    let (workgroup, budget) = if ctx.is_software() {
        let wg = ctx.limits().subgroup_size.clamp(1, 64);
        (wg, LOOP_BUDGET / wg)
    } else {
        (WORKGROUP, 0)
    };
    // Bound on one binary search: over the cells, a mask, or the points of one cell
    // (SORTIDU window): all at most the larger input.
    let log_cells = (usize::BITS - (na.max(nb) + 1).leading_zeros()) + 1;
    if budget != 0 {
        // The least a thread must do to make progress: load, masks, one probe, one candidate.
        let (d, k, l) = (dim as u32, k_spec, log_cells);
        let least = d + k * (3 * l + 2) + 2 * (k + 2 * l + 2) + 2 * d + 1;
        if least > budget {
            return Err(Error::unsupported(format!(
                "{} (a software device) cannot run this join: {d} dimensions with {k} indexed exceed                  its per-thread loop budget; use fewer indexed dims or the CPU backend",
                ctx.device_name()
            )));
        }
    }
    let push_bytes = 32 + 3 * std::mem::size_of::<T>() as u32;
    let spec = KernelSpec::new(workgroup)
        .bindings(BINDINGS)
        .push_bytes(push_bytes)
        .constant(1, dim as u32)
        .constant(2, k_spec)
        .constant(3, opts.metric as u32)
        .constant(4, sort_dim);
    let kernel = ctx.kernel(
        if algorithm == Algorithm::Grid {
            "grid_join"
        } else {
            "brute_join"
        },
        spirv,
        &spec,
    )?;

    let counting = sink.is_none();
    let stride = estimate_stride(nq);
    let n_samples = nq.div_ceil(stride);
    let max_points = MAX_BATCH_POINTS.max(n_samples).min(nq);
    // Declared before the slots: in-flight work (waited for when slots drop) writes it.
    let timer = GpuTimer::new(ctx, 2 * SLOTS as u32).ok();
    times.gpu_search = timer.as_ref().map(|_| 0.0);
    let (mut slots, capacity, max_points) = make_slots(
        ctx,
        opts.result_buffer_pairs,
        max_points,
        n_samples,
        counting,
    )?;
    let thr_reject = reject_threshold(thr, dim);
    let run = Run {
        kernel,
        timer: timer.as_ref(),
        data: &data,
        n_cells,
        log_cells,
        thr,
        window,
        thr_reject,
        base_flags: flags,
        capacity,
        budget,
    };
    let mut dispatches = 0usize;

    // Estimation pass: count-only over a strided sample of the queries (slot 0).
    let t_est = Instant::now();
    let sample_counts = {
        let slot = &mut slots[0];
        let push = run.push_constants(
            &(0..nq as u32),
            n_samples as u32,
            stride as u32,
            run.base_flags | FLAG_COUNT,
        );
        let mut fresh = true;
        loop {
            submit_search(&run, slot, 0, &push, n_samples, fresh, true)?.wait()?;
            dispatches += 1;
            fresh = false;
            if read_words(slot.counters_host.as_ref().unwrap_or(&slot.counters), 2)?[1] == 0 {
                break;
            }
        }
        read_matches(slot, n_samples)?
    };
    let plan = plan_batches(
        nq,
        stride,
        &sample_counts,
        capacity as usize,
        max_points,
        opts.batch_points,
    );
    times.estimate = t_est.elapsed().as_secs_f64();
    report.notes.push(format!(
        "estimate: {} pairs from {} sampled queries (stride {stride}); {} batches of <= {} queries; result buffers of {} pairs",
        plan.estimated_pairs,
        n_samples,
        plan.ranges.len(),
        plan.ranges.iter().map(|r| r.len()).max().unwrap_or(0),
        capacity
    ));
    let batches = plan.ranges.len();

    // The batches, three in flight; busy slots are completed oldest first.
    let t_loop = Instant::now();
    let mut queue: VecDeque<Range<u32>> = plan.ranges.into();
    let mut busy: VecDeque<usize> = VecDeque::new();
    let mut total: u64 = 0;
    let (mut resumed, mut overflowed) = (0usize, 0usize);
    let flags = run.base_flags | if counting { FLAG_COUNT } else { 0 };
    loop {
        for (s, slot) in slots.iter_mut().enumerate() {
            if matches!(slot.state, SlotState::Free) {
                if let Some(queries) = queue.pop_front() {
                    let push = run.push_constants(&queries, queries.len() as u32, 1, flags);
                    let ticket =
                        submit_search(&run, slot, s, &push, queries.len(), true, counting)?;
                    dispatches += 1;
                    slot.state = SlotState::Searching {
                        queries,
                        ticket,
                        submitted: Instant::now(),
                    };
                    busy.push_back(s);
                }
            }
        }
        let Some(s) = busy.pop_front() else { break };
        let slot = &mut slots[s];
        // What to do once this dispatch's pairs are delivered: resume it, or free the slot.
        let (queries, incomplete, submitted) =
            match std::mem::replace(&mut slot.state, SlotState::Free) {
                SlotState::Free => continue,
                SlotState::Searching {
                    queries,
                    ticket,
                    submitted,
                } => {
                    let t = Instant::now();
                    ticket.wait()?;
                    times.wait_search += t.elapsed().as_secs_f64();
                    if let (Some(timer), Some(gpu)) = (run.timer, times.gpu_search.as_mut()) {
                        *gpu += timer.seconds(2 * s as u32, 2 * s as u32 + 1)?;
                    }
                    let t = Instant::now();
                    let head =
                        read_words(slot.counters_host.as_ref().unwrap_or(&slot.counters), 2)?;
                    let (slots_taken, incomplete) = (head[0] as usize, head[1] != 0);
                    if slots_taken > capacity as usize {
                        overflowed += 1;
                    }
                    if counting {
                        if !incomplete {
                            total += read_matches(slot, queries.len())?
                                .iter()
                                .map(|&c| c as u64)
                                .sum::<u64>();
                        }
                        times.download += t.elapsed().as_secs_f64();
                        (queries, incomplete, submitted)
                    } else {
                        let pairs = slots_taken.min(capacity as usize);
                        if let (Some(host), true) = (&slot.results_host, pairs > 0) {
                            // Copy exactly the pairs found to the pinned buffer.
                            slot.stream.barrier()?;
                            slot.stream
                                .copy(&slot.results, 0, host, 0, pairs as u64 * 8)?;
                            let ticket = slot.stream.submit()?;
                            slot.state = SlotState::Downloading {
                                queries,
                                pairs,
                                incomplete,
                                ticket,
                                submitted,
                            };
                            busy.push_front(s);
                            times.download += t.elapsed().as_secs_f64();
                            continue;
                        }
                        times.download += t.elapsed().as_secs_f64();
                        deliver(slot, pairs, &mut sink, &mut total, &mut times)?;
                        (queries, incomplete, submitted)
                    }
                }
                SlotState::Downloading {
                    queries,
                    pairs,
                    incomplete,
                    ticket,
                    submitted,
                } => {
                    let t = Instant::now();
                    ticket.wait()?;
                    times.download += t.elapsed().as_secs_f64();
                    deliver(slot, pairs, &mut sink, &mut total, &mut times)?;
                    (queries, incomplete, submitted)
                }
            };
        times.busy += submitted.elapsed().as_secs_f64();
        if incomplete {
            // Some queries stopped early: run the batch again; finished queries return at once.
            let push = run.push_constants(&queries, queries.len() as u32, 1, flags);
            let ticket = submit_search(&run, slot, s, &push, queries.len(), false, counting)?;
            dispatches += 1;
            resumed += 1;
            slot.state = SlotState::Searching {
                queries,
                ticket,
                submitted: Instant::now(),
            };
            busy.push_back(s);
        }
    }
    times.loop_wall = t_loop.elapsed().as_secs_f64();

    report.pairs = total;
    report.batches = batches;
    report.phases = vec![
        ("index build".into(), index_build),
        ("upload".into(), times.upload),
        ("estimation".into(), times.estimate),
        (
            "search kernels (GPU timestamps)".into(),
            times.gpu_search.unwrap_or(f64::NAN),
        ),
        ("waiting on search (host)".into(), times.wait_search),
        ("result transfers".into(), times.download),
        ("assembly (sink)".into(), times.assemble),
    ];
    report.notes.push(format!(
        "{dispatches} dispatches: {batches} batches, {resumed} resumed ({overflowed} after a full result buffer){}",
        if budget != 0 { format!(", software device: workgroup {workgroup}, loop budget {budget} per thread") } else { String::new() }
    ));
    if times.loop_wall > 0.0 {
        // Overlap: how much of the batch loop the device spent searching (kernels of one
        // queue run one after another), and the host work done meanwhile.
        let busy = times.gpu_search.map_or("no timestamps".to_string(), |g| {
            format!("GPU searching {:.0}% of it", 100.0 * g / times.loop_wall)
        });
        report.notes.push(format!(
            "overlap: batch loop {:.4} s, {busy}; {:.2} batches in flight on average; host \
             transfers + assembly {:.4} s; {} compute queue(s)",
            times.loop_wall,
            times.busy / times.loop_wall,
            times.download + times.assemble,
            ctx.compute_queue_count()
        ));
    }

    Ok(report)
}

/// The device data of one join and the kernel parameters that come with it.
struct Prepared {
    data: DeviceData,
    /// Non-empty cells (grid) or indexed points (brute force).
    n_cells: u32,
    /// Query points.
    nq: usize,
    flags: u32,
    /// Indexed dimensions (spec constant K).
    k: u32,
    sort_dim: u32,
}

/// Grid: plans and builds the index over R (A ⋈ B indexes the smaller set; pairs are
/// swapped back), sorts the queries by cell, and uploads everything.
fn prepare_grid<T: Coord>(
    ctx: &Arc<Context>,
    job: &Job,
    report: &mut JoinReport,
    times: &mut Times,
) -> Result<Prepared> {
    let (opts, dim, eps, self_join) = (job.opts, job.a.dim(), job.opts.eps, job.b.is_none());
    let (r, q, swap) = match job.b {
        None => (job.a, job.a, false),
        Some(b) if b.len() <= job.a.len() => (b, job.a, false),
        Some(b) => (job.a, b, true),
    };
    let plan = plan_grid(&r, &q, self_join, eps, opts.indexed_dims)?;
    if let Some(k) = opts.indexed_dims {
        if k > plan.geom.k() {
            report
                .notes
                .push(format!("indexed_dims {k} reduced to {}", plan.geom.k()));
        }
    }
    report.notes.push(format!(
        "grid: k = {} indexed dims {:?}{}, SORTIDU on dim {:?}",
        plan.geom.k(),
        plan.geom.dims,
        if plan.costs.is_empty() {
            " (forced)"
        } else {
            " (cost model)"
        },
        plan.sort_dim
    ));
    if !plan.costs.is_empty() {
        let costs: Vec<String> = plan
            .costs
            .iter()
            .map(|c| {
                format!(
                    "k={}: {} cells, {:.3e} ops",
                    c.k,
                    c.nonempty_cells,
                    c.total()
                )
            })
            .collect();
        report.notes.push(format!(
            "cost model (search + compare memory ops): {}",
            costs.join("; ")
        ));
    }
    // REORDER in the distance test pays when the variance order is not the dataset's.
    let share = plan.top_quarter_share;
    let reorder = variance_order_helps(&plan.variance_order, share);
    let variance_order = plan.variance_order;
    let idx = GridIndex::build(&r, plan.geom, plan.sort_dim);
    report.notes.push(format!(
        "grid: {} non-empty cells over {} points",
        idx.cell_keys.len(),
        r.len()
    ));
    let r_sorted = gather(coords_of::<T>(&r), dim, &idx.order);
    let mut meta: Vec<u32> = idx.geom.cells.iter().map(|&c| c as u32).collect();
    meta.extend_from_slice(&idx.mask_offsets);
    meta.extend(variance_order.iter().map(|&j| j as u32));
    meta.extend_from_slice(&idx.mask_coords);
    let (q_order, q_cells) = if self_join {
        (None, idx.query_cells(&r, &idx.order))
    } else {
        // Queries sorted by cell too: neighbouring threads search the same cells.
        let mut order: Vec<u32> = (0..q.len() as u32).collect();
        let cells = idx.query_cells(&q, &order);
        let k = idx.k().max(1);
        // Linear ids of the query cells (the same row-major order as GridGeometry's).
        let keys: Vec<u64> = cells
            .chunks(k)
            .map(|c| {
                c.iter()
                    .zip(&idx.geom.cells)
                    .fold(0u64, |id, (&x, &n)| id * n + x as u64)
            })
            .collect();
        order.sort_unstable_by_key(|&p| (keys[p as usize], p));
        let sorted_cells: Vec<u32> = order
            .iter()
            .flat_map(|&p| &cells[p as usize * k..(p as usize + 1) * k])
            .copied()
            .collect();
        (Some(order), sorted_cells)
    };
    let t_up = Instant::now();
    let data = DeviceData {
        r_coords: upload(ctx, &r_sorted, "indexed points")?,
        q_coords: match &q_order {
            Some(o) => Some(upload(
                ctx,
                &gather(coords_of::<T>(&q), dim, o),
                "query points",
            )?),
            None => None,
        },
        cell_keys: upload(ctx, &idx.cell_keys, "cell ids (B)")?,
        cell_ranges: upload(ctx, &idx.cell_ranges, "cell ranges (G)")?,
        r_ids: upload(ctx, &idx.order, "point lookup (A)")?,
        q_ids: match &q_order {
            Some(o) => Some(upload(ctx, o, "query ids")?),
            None => None,
        },
        q_cells: Some(upload(ctx, &q_cells, "query cells")?),
        meta: upload(ctx, &meta, "grid masks (M)")?,
    };
    times.upload += t_up.elapsed().as_secs_f64();
    let mut flags = if self_join { FLAG_SELF } else { 0 } | FLAG_SORTIDU;
    if reorder {
        flags |= FLAG_REORDER;
        report
            .notes
            .push("REORDER: distance rejected in variance order first".into());
    } else {
        report.notes.push(format!(
            "REORDER: distance in dataset order (top quarter of dims holds {:.0}% of the variance)",
            100.0 * share
        ));
    }
    if swap {
        flags |= FLAG_SWAP;
    }
    Ok(Prepared {
        data,
        n_cells: idx.cell_keys.len() as u32,
        nq: q.len(),
        flags,
        k: idx.k() as u32,
        sort_dim: idx.sort_dim.unwrap_or(0) as u32,
    })
}

/// Brute force: R = B (or A), Q = A, in input order; ids are positions.
fn prepare_brute<T: Coord>(ctx: &Arc<Context>, job: &Job, times: &mut Times) -> Result<Prepared> {
    let r = job.b.unwrap_or(job.a);
    let t_up = Instant::now();
    let dummy = [0u32];
    let data = DeviceData {
        r_coords: upload(ctx, coords_of::<T>(&r), "points")?,
        q_coords: match job.b {
            Some(_) => Some(upload(ctx, coords_of::<T>(&job.a), "query points")?),
            None => None,
        },
        cell_keys: upload(ctx, &dummy, "unused")?,
        cell_ranges: upload(ctx, &dummy, "unused")?,
        r_ids: upload(ctx, &dummy, "unused")?,
        q_ids: None,
        q_cells: None,
        meta: upload(ctx, &dummy, "unused")?,
    };
    times.upload += t_up.elapsed().as_secs_f64();
    Ok(Prepared {
        data,
        n_cells: r.len() as u32,
        nq: job.a.len(),
        flags: if job.b.is_none() { FLAG_SELF } else { 0 },
        k: 1,
        sort_dim: 0,
    })
}

/// Whether rejecting in variance order first is worth a second (canonical) pass on the
/// survivors: when that order differs from the dataset's and a quarter of the dimensions
/// hold at least half of the variance (measured on lavapipe, d = 32, n = 10000: 1.5x
/// faster on such data, 1.5x slower on clusters with equal spread in every dimension).
/// `SIMJOIN_GPU_REORDER=0|1` forces it off or on (to measure what it brings).
fn variance_order_helps(order: &[usize], top_quarter_share: f64) -> bool {
    // Below 4 dimensions there is no "few of many" to reject on early.
    let differs = order.len() >= 4 && order.iter().enumerate().any(|(i, &j)| i != j);
    match std::env::var("SIMJOIN_GPU_REORDER").as_deref() {
        Ok("0") => false,
        Ok("1") => differs,
        _ => differs && top_quarter_share >= 0.5,
    }
}

/// `thr * (1 + metric::reject_margin)` rounded up into `T`: a partial distance in another
/// dimension order above it proves the canonical distance is above `thr`.
fn reject_threshold<T: Coord>(thr: T, dim: usize) -> T {
    let want = thr.to_f64() * (1.0 + reject_margin::<T>(dim));
    // Rounding to nearest loses at most one unit roundoff: aim that much higher.
    T::from_f64(want * (1.0 + 2.0 * T::UNIT_ROUNDOFF))
}

/// Hands the first `pairs` results of `slot` to the sink.
fn deliver(
    slot: &Slot,
    pairs: usize,
    sink: &mut Option<&mut dyn PairSink>,
    total: &mut u64,
    times: &mut Times,
) -> Result<()> {
    let t = Instant::now();
    let chunk: Vec<Pair> = slot
        .results_host
        .as_ref()
        .unwrap_or(&slot.results)
        .read_vec(0, pairs)?;
    times.download += t.elapsed().as_secs_f64();
    let t = Instant::now();
    *total += chunk.len() as u64;
    if let Some(sink) = sink.as_deref_mut() {
        sink.push(&chunk).map_err(sink_error)?;
    }
    times.assemble += t.elapsed().as_secs_f64();
    Ok(())
}

/// Records and submits one search dispatch: zero the counters (and, for a new batch, the
/// query states), dispatch, and copy counters (and states when counting) to the pinned
/// buffers where device memory is not mapped.
fn submit_search<T: Coord>(
    run: &Run<'_, T>,
    slot: &mut Slot,
    slot_index: usize,
    push: &[u8],
    threads: usize,
    fresh: bool,
    counting: bool,
) -> Result<Ticket> {
    slot.stream.fill(&slot.counters, 0, 8, 0)?;
    if fresh {
        slot.stream.fill(&slot.states, 0, threads as u64 * 16, 0)?;
    }
    slot.stream.barrier()?;
    let bindings = run
        .data
        .bindings(&slot.results, &slot.counters, &slot.states);
    let stamps = run.timer.map(|t| (t, 2 * slot_index as u32));
    if let Some((timer, first)) = stamps {
        slot.stream.timestamp(timer, first)?;
    }
    slot.stream
        .dispatch_threads(&run.kernel, threads as u64, &bindings, push)?;
    if let Some((timer, first)) = stamps {
        slot.stream.timestamp(timer, first + 1)?;
    }
    if let Some(host) = &slot.counters_host {
        slot.stream.barrier()?;
        slot.stream.copy(&slot.counters, 0, host, 0, 8)?;
        if counting {
            let states_host = slot.states_host.as_ref().expect("pinned with the counters");
            slot.stream
                .copy(&slot.states, 0, states_host, 0, threads as u64 * 16)?;
        }
    }
    slot.stream.submit()
}

fn read_words(buffer: &Buffer, words: usize) -> Result<Vec<u32>> {
    buffer.read_vec(0, words)
}

/// Matches per query of the last count-only batch (the states' fourth word).
fn read_matches(slot: &Slot, threads: usize) -> Result<Vec<u32>> {
    let states: Vec<[u32; 4]> = slot
        .states_host
        .as_ref()
        .unwrap_or(&slot.states)
        .read_vec(0, threads)?;
    Ok(states.iter().map(|s| s[3]).collect())
}
