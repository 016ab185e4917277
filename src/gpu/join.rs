//! The GPU join driver: uploads the index (grid) or the raw points (brute force), runs the
//! estimation pass, then the batches over three streams, and streams pairs to the sink.
//!
//! Each of the three slots owns a stream (its own queue where the device has several), a
//! device result buffer, a counter buffer and, where device memory is not host-mapped,
//! pinned read-back buffers. A slot's batch goes: search (kernel) -> read the counter ->
//! copy exactly the pairs found to its pinned buffer -> hand them to the sink. While the
//! host assembles one slot's pairs, the other two slots' kernels and copies run.

use super::index::{plan_grid, GridIndex};
use super::plan::{estimate_stride, plan_batches, Work};
use crate::dataset::{Coords, Dataset};
use crate::engine::Job;
use crate::error::{Error, ErrorKind, Result};
use crate::metric::{threshold, Coord};
use crate::options::Algorithm;
use crate::result::{sink_error, JoinReport, Pair, PairSink};
use crate::vk::{
    shaders, Buffer, BufferRange, Context, Kernel, KernelSpec, Memory, Stream, Ticket,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

const WORKGROUP: u32 = 64;
const BINDINGS: u32 = 10;
const FLAG_SELF: u32 = 1;
const FLAG_COUNT: u32 = 2;
const FLAG_SWAP: u32 = 4;
const FLAG_SORTIDU: u32 = 8;
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
    counters: Buffer,
    /// Pinned read-back buffers where device memory is not mapped.
    results_host: Option<Buffer>,
    counters_host: Option<Buffer>,
    state: SlotState,
}

enum SlotState {
    Free,
    Searching {
        work: Work,
        ticket: Ticket,
        submitted: Instant,
    },
    Downloading {
        pairs: usize,
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
}

/// What every dispatch of one join shares.
struct Run<T: Coord> {
    kernel: Kernel,
    data: DeviceData,
    /// Non-empty cells (grid) or indexed points (brute force).
    n_cells: u32,
    thr: T,
    window: T,
    base_flags: u32,
    capacity: u32,
}

impl<T: Coord> Run<T> {
    /// The kernel's push-constant block (see `Params` in glsl/join_common.glsl).
    fn push_constants(&self, work: &Work, q_count: u32, stride: u32, flags: u32) -> Vec<u8> {
        let header: [u32; 8] = [
            work.queries.start,
            q_count,
            stride,
            self.capacity,
            work.skip,
            flags,
            self.n_cells,
            0,
        ];
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytemuck::bytes_of(&self.thr));
        bytes.extend_from_slice(bytemuck::bytes_of(&self.window));
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
    let counter_bytes = (2 + max_points as u64) * 4;
    let results = Buffer::new(ctx, result_bytes, Memory::Device, "join results")?;
    let counters = Buffer::new(ctx, counter_bytes, Memory::Device, "join counters")?;
    let (results_host, counters_host) = if results.is_mapped() && counters.is_mapped() {
        (None, None)
    } else {
        (
            Some(Buffer::new(
                ctx,
                result_bytes,
                Memory::Readback,
                "pinned results",
            )?),
            Some(Buffer::new(
                ctx,
                counter_bytes,
                Memory::Readback,
                "pinned counters",
            )?),
        )
    };
    Ok(Slot {
        stream: Stream::new(ctx, index)?,
        results,
        counters,
        results_host,
        counters_host,
        state: SlotState::Free,
    })
}

/// Result-buffer capacity: the user's, else the default within the binding limit; halved
/// on device out-of-memory down to MIN_RESULT_PAIRS.
fn make_slots(
    ctx: &Arc<Context>,
    requested: Option<usize>,
    max_points: usize,
    counting: bool,
) -> Result<(Vec<Slot>, u32)> {
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
            Ok(slots) => return Ok((slots, capacity as u32)),
            Err(e) if e.kind() == ErrorKind::OutOfDeviceMemory && capacity > MIN_RESULT_PAIRS => {
                capacity /= 2;
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

    // Indexed set R and query set Q. A ⋈ B indexes the smaller set (pairs swapped back).
    let (data, n_cells, nq, flags, k_spec, sort_dim) = match algorithm {
        Algorithm::Grid => {
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
            let idx = GridIndex::build(&r, plan.geom, plan.sort_dim);
            report.notes.push(format!(
                "grid: {} non-empty cells over {} points",
                idx.cell_keys.len(),
                r.len()
            ));
            let r_sorted = gather(coords_of::<T>(&r), dim, &idx.order);
            let mut meta: Vec<u32> = idx.geom.cells.iter().map(|&c| c as u32).collect();
            meta.extend_from_slice(&idx.mask_offsets);
            meta.extend_from_slice(&idx.mask_coords);
            let (q_order, q_cells) = if self_join {
                (None, idx.query_cells(&r, &idx.order))
            } else {
                // Queries sorted by cell too: neighbouring threads search the same cells.
                let mut order: Vec<u32> = (0..q.len() as u32).collect();
                let cells = idx.query_cells(&q, &order);
                let key = |p: u32| {
                    idx.geom.linear_id(
                        &cells[p as usize * idx.k()..(p as usize + 1) * idx.k()]
                            .iter()
                            .map(|&c| c as u64)
                            .collect::<Vec<_>>(),
                    )
                };
                let keys: Vec<u64> = order.iter().map(|&p| key(p)).collect();
                order.sort_by_key(|&p| (keys[p as usize], p));
                let sorted_cells = idx.query_cells(&q, &order);
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
            if swap {
                flags |= FLAG_SWAP;
            }
            (
                data,
                idx.cell_keys.len() as u32,
                q.len(),
                flags,
                idx.k() as u32,
                idx.sort_dim.unwrap_or(0) as u32,
            )
        }
        _ => {
            // Brute force: R = B (or A), Q = A, original order, ids are positions.
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
            (
                data,
                r.len() as u32,
                na,
                if self_join { FLAG_SELF } else { 0 },
                1,
                0,
            )
        }
    };
    let index_build = t_start.elapsed().as_secs_f64() - times.upload;

    let spirv = match (algorithm, std::mem::size_of::<T>()) {
        (Algorithm::Grid, 4) => shaders::GRID_JOIN_F32,
        (Algorithm::Grid, _) => shaders::GRID_JOIN_F64,
        (_, 4) => shaders::BRUTE_JOIN_F32,
        _ => shaders::BRUTE_JOIN_F64,
    };
    let push_bytes = 32 + 2 * std::mem::size_of::<T>() as u32;
    let spec = KernelSpec::new(WORKGROUP)
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
    let (mut slots, capacity) = make_slots(ctx, opts.result_buffer_pairs, max_points, counting)?;
    let run = Run {
        kernel,
        data,
        n_cells,
        thr,
        window,
        base_flags: flags,
        capacity,
    };

    // Estimation pass: count-only over a strided sample of the queries (slot 0).
    let t_est = Instant::now();
    let sample_counts = {
        let slot = &mut slots[0];
        let work = Work {
            queries: 0..nq as u32,
            skip: 0,
        };
        let push = run.push_constants(
            &work,
            n_samples as u32,
            stride as u32,
            run.base_flags | FLAG_COUNT,
        );
        submit_search(&run, slot, &push, n_samples, true)?.wait()?;
        read_counters(slot, 2 + n_samples)?.split_off(2)
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
        "estimate: {} pairs from {} sampled queries (stride {stride}); {} batches of <= {} queries; result buffers {} pairs",
        plan.estimated_pairs,
        n_samples,
        plan.ranges.len(),
        plan.ranges.iter().map(|r| r.len()).max().unwrap_or(0),
        capacity
    ));

    // The batches, three in flight.
    let t_loop = Instant::now();
    let mut queue: VecDeque<Work> = plan
        .ranges
        .into_iter()
        .map(|r| Work {
            queries: r,
            skip: 0,
        })
        .collect();
    let mut total: u64 = 0;
    let (mut batches, mut reruns) = (0usize, 0usize);
    // Busy slots, oldest first: completed in submission order.
    let mut busy_order: VecDeque<usize> = VecDeque::new();
    loop {
        // Fill free slots.
        for s in 0..SLOTS {
            if matches!(slots[s].state, SlotState::Free) {
                if let Some(work) = queue.pop_front() {
                    let len = work.queries.len() as u32;
                    let flags = run.base_flags | if counting { FLAG_COUNT } else { 0 };
                    let push = run.push_constants(&work, len, 1, flags);
                    let slot = &mut slots[s];
                    let ticket = submit_search(&run, slot, &push, len as usize, counting)?;
                    slot.state = SlotState::Searching {
                        work,
                        ticket,
                        submitted: Instant::now(),
                    };
                    busy_order.push_back(s);
                    batches += 1;
                }
            }
        }
        let Some(s) = busy_order.pop_front() else {
            break;
        };
        let slot = &mut slots[s];
        match std::mem::replace(&mut slot.state, SlotState::Free) {
            SlotState::Free => {}
            SlotState::Searching {
                work,
                ticket,
                submitted,
            } => {
                let t = Instant::now();
                ticket.wait()?;
                times.wait_search += t.elapsed().as_secs_f64();
                let len = work.queries.len();
                if counting {
                    let t = Instant::now();
                    let counts: Vec<u32> = read_counters(slot, 2 + len)?;
                    times.download += t.elapsed().as_secs_f64();
                    total += counts[2..].iter().map(|&c| c as u64).sum::<u64>();
                    times.busy += submitted.elapsed().as_secs_f64();
                    continue;
                }
                let head: Vec<u32> = read_counters(slot, 2)?;
                let (found, wrapped) = (head[0] as u64, head[1] != 0);
                if wrapped || found > capacity as u64 {
                    let (next, partial) = work.after_overflow(capacity);
                    reruns += 1;
                    for w in next.into_iter().rev() {
                        queue.push_front(w);
                    }
                    if !partial {
                        times.busy += submitted.elapsed().as_secs_f64();
                        continue; // pairs discarded: both halves run again
                    }
                }
                let pairs = (found as usize).min(capacity as usize);
                // Copy exactly the pairs found to the pinned buffer (none where mapped).
                if let Some(host) = &slot.results_host {
                    if pairs > 0 {
                        slot.stream.barrier()?;
                        slot.stream
                            .copy(&slot.results, 0, host, 0, pairs as u64 * 8)?;
                    }
                }
                let ticket = slot.stream.submit()?;
                slot.state = SlotState::Downloading {
                    pairs,
                    ticket,
                    submitted,
                };
                busy_order.push_front(s); // finish its download next
            }
            SlotState::Downloading {
                pairs,
                ticket,
                submitted,
            } => {
                let t = Instant::now();
                ticket.wait()?;
                let buf = slot.results_host.as_ref().unwrap_or(&slot.results);
                let chunk: Vec<Pair> = buf.read_vec(0, pairs)?;
                times.download += t.elapsed().as_secs_f64();
                times.busy += submitted.elapsed().as_secs_f64();
                let t = Instant::now();
                total += chunk.len() as u64;
                if let Some(sink) = sink.as_deref_mut() {
                    sink.push(&chunk).map_err(sink_error)?;
                }
                times.assemble += t.elapsed().as_secs_f64();
            }
        }
    }
    times.loop_wall = t_loop.elapsed().as_secs_f64();

    report.pairs = total;
    report.batches = batches;
    report.phases = vec![
        ("index build".into(), index_build),
        ("upload".into(), times.upload),
        ("estimation".into(), times.estimate),
        ("search kernels (host wait)".into(), times.wait_search),
        ("result transfers".into(), times.download),
        ("assembly (sink)".into(), times.assemble),
    ];
    if reruns > 0 {
        report.notes.push(format!(
            "{reruns} batches overflowed their result buffer and were re-run split"
        ));
    }
    if times.loop_wall > 0.0 {
        report.notes.push(format!(
            "overlap: {:.2} batches in flight on average over {:.4} s of batch loop ({} queues)",
            times.busy / times.loop_wall,
            times.loop_wall,
            ctx.compute_queue_count()
        ));
    }
    Ok(report)
}

/// Records and submits one search: zero the counters, dispatch, and copy the counters to
/// the pinned buffer where device memory is not mapped.
fn submit_search<T: Coord>(
    run: &Run<T>,
    slot: &mut Slot,
    push: &[u8],
    threads: usize,
    counting: bool,
) -> Result<Ticket> {
    let counter_words = if counting { 2 + threads } else { 2 };
    slot.stream
        .fill(&slot.counters, 0, counter_words as u64 * 4, 0)?;
    slot.stream.barrier()?;
    let bindings = run.data.bindings(&slot.results, &slot.counters);
    slot.stream
        .dispatch_threads(&run.kernel, threads as u64, &bindings, push)?;
    if let Some(host) = &slot.counters_host {
        slot.stream.barrier()?;
        slot.stream
            .copy(&slot.counters, 0, host, 0, counter_words as u64 * 4)?;
    }
    slot.stream.submit()
}

fn read_counters(slot: &Slot, words: usize) -> Result<Vec<u32>> {
    slot.counters_host
        .as_ref()
        .unwrap_or(&slot.counters)
        .read_vec(0, words)
}
