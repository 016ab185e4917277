//! The batch driver: the estimation pass, then the batches over three slots, each a stream
//! (its own queue where the device has several), a device result buffer, counters,
//! per-query continuation states and, where device memory is not host-mapped, pinned
//! read-back buffers. A slot's batch goes: search (kernel) -> read the counters -> copy
//! exactly the pairs found to its pinned buffer -> hand them to the sink -> search again if
//! some query stopped early (result buffer full, or a software device's loop budget used
//! up), resuming where it stopped. While the host assembles one slot's pairs, the other two
//! slots' kernels and copies run.
//!
//! Lifetimes: every buffer, the kernel and the timer are shared (`Arc`) with the streams'
//! in-flight frames, so nothing here depends on declaration or drop order.

use super::device_data::DeviceData;
use super::interface::{flags, JoinParams};
use super::plan::{plan_batches, BatchPlan};
use crate::error::{ErrorKind, Result};
use crate::metric::Coord;
use crate::result::{sink_error, Pair, PairSink};
use crate::vk::{Buffer, Context, GpuTimer, Kernel, Memory, Stream, Ticket};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Streams (and pinned buffers) the batches rotate over.
pub(super) const SLOTS: usize = 3;
/// Default result buffer: 2^24 pairs (128 MiB), less where the binding limit is smaller.
const DEFAULT_RESULT_PAIRS: u64 = 1 << 24;
/// Timestamp slots a join's timer needs (see `Run::timer`).
pub(super) const TIMER_SLOTS: u32 = 4 * SLOTS as u32;
/// Words of the counters buffer: [result slots taken, some query stopped, filter
/// rejections (2 words), candidates through the filter (2 words)].
const COUNTER_WORDS: usize = 6;
/// Smallest result buffer tried when device memory runs out.
const MIN_RESULT_PAIRS: u64 = 1 << 10;

/// One batch slot: a stream and its buffers.
pub(super) struct Slot {
    stream: Stream,
    results: Arc<Buffer>,
    /// COUNTER_WORDS words.
    counters: Arc<Buffer>,
    /// Continuation state per query of the batch (uvec4).
    states: Arc<Buffer>,
    /// Pinned read-back buffers where device memory is not mapped.
    results_host: Option<Arc<Buffer>>,
    counters_host: Option<Arc<Buffer>>,
    states_host: Option<Arc<Buffer>>,
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
        /// A copy to the pinned buffer was recorded (with its timestamps).
        copied: bool,
        ticket: Ticket,
        submitted: Instant,
    },
}

/// Measured times (seconds) for the report.
#[derive(Default)]
pub(super) struct Times {
    pub upload: f64,
    /// Kernel creation and the result slots' allocation.
    pub setup: f64,
    pub estimate: f64,
    pub wait_search: f64,
    pub download: f64,
    pub assemble: f64,
    pub loop_wall: f64,
    /// Sum over batches of submit-to-done seconds (observed on the host).
    pub busy: f64,
    /// Sum of the search dispatches' GPU time (timestamps), when the queue has them, and
    /// the number of dispatches it sums.
    pub gpu_search: Option<f64>,
    pub gpu_searches: usize,
    /// The estimation pass's dispatches on the GPU clock.
    pub gpu_estimate: Option<f64>,
    /// The result copies into pinned buffers on the GPU clock (discrete GPUs).
    pub gpu_copies: Option<f64>,
}

/// What the batch loop counted, for the report.
#[derive(Default)]
pub(super) struct Counts {
    pub pairs: u64,
    pub dispatches: usize,
    pub resumed: usize,
    pub overflowed: usize,
    /// Bytes read back (counters, query states, pairs).
    pub bytes_down: u64,
    /// Dot-product filter (batches, not the estimation): candidates rejected, and tested.
    pub dot_rejected: u64,
    pub dot_tested: u64,
    /// Count-only runs that keep each query's count: matches per query position.
    pub per_query: Option<Vec<u32>>,
}

/// What every dispatch of one join shares.
pub(super) struct Run<'a, T: Coord> {
    pub kernel: Kernel,
    /// Timestamps where supported (TIMER_SLOTS): two per batch slot around its search
    /// dispatch, then two per batch slot around its result copy.
    pub timer: Option<Arc<GpuTimer>>,
    pub data: &'a DeviceData,
    /// The parameters every dispatch shares; the batch fields and the loop budget are
    /// set per dispatch.
    pub params: JoinParams<T>,
    pub pace: Pace,
    /// The job's stop flag, read before each dispatch, and its progress (batches done).
    pub control: crate::control::Control,
    /// The stop word the kernels read (`params.stop_lo/hi` hold its address): set when
    /// the job is stopped while a dispatch runs, so that the dispatch ends early.
    pub stop: Option<Arc<Buffer>>,
}

/// How often [`StopWatch`] looks at the job's stop flag.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// Raises a job's stop word as soon as the job is stopped, from a thread of its own, so
/// that the dispatches in flight end early whatever the join's thread is doing (waiting
/// for a dispatch, reading a timer, delivering pairs). Inert controls (nobody can stop
/// the job) get no thread. Dropping it ends the thread.
pub(super) struct StopWatch {
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StopWatch {
    pub fn start(control: &crate::control::Control, stop: &Arc<Buffer>) -> StopWatch {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // An inert control reports no progress: it cannot be cancelled.
        let thread = control.progress().map(|_| {
            let (control, stop, done) = (control.clone(), stop.clone(), done.clone());
            std::thread::Builder::new()
                .name("simjoin-stop".into())
                .spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Acquire) {
                        if control.is_cancelled() {
                            // A failed write leaves the dispatches to run to their end.
                            let _ = raise(&stop);
                            return;
                        }
                        std::thread::park_timeout(STOP_POLL);
                    }
                })
        });
        StopWatch {
            done,
            thread: thread.and_then(|t| t.ok()),
        }
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn raise(stop: &Buffer) -> Result<()> {
    stop.write(0, &[1u32])?;
    // Out of the CPU's write-combining buffers now, not at their leisure.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// A host-visible word for [`Run::stop`], zeroed.
pub(super) fn stop_word(ctx: &Arc<Context>) -> Result<Arc<Buffer>> {
    let word = Buffer::new(ctx, 4, Memory::Upload, "join stop word")?;
    word.write(0, &[0u32])?;
    Ok(word)
}

impl<T: Coord> Run<'_, T> {
    /// Sets the stop word: every dispatch of the job in flight ends early. Once a job
    /// ends in an error (a stop, a sink's error), the slots it drops wait for their
    /// dispatches: this makes that wait short.
    pub(super) fn raise_stop(&self) -> Result<()> {
        self.stop.as_deref().map_or(Ok(()), raise)
    }
}

/// Threads a query gets in the dispatches that run one query a thread (`JoinParams::lanes`;
/// not the tiled sweep): GPU-JOIN's several threads a point, for joins whose queries each
/// scan many candidates. With one thread a query, a high-dimensional query's scan is long
/// and serial: on an H200 (2M exponential 16-D points, BENCHMARKS.md) each dispatch ran
/// about 3.6 s, and the estimation pass's 20,000 sampled queries could not fill the GPU.
/// Split `LANES` ways, every thread scans an eighth of each cell, dispatches shorten and
/// the GPU fills. By default on hardware GPUs where the high-dimensional filter runs
/// (`high_dim`), else one; `SIMJOIN_GPU_LANES=N` (1 to 64) sets it on any device (tests,
/// measurements). Not yet measured on a GPU.
pub(super) fn lanes(software: bool, high_dim: bool) -> u32 {
    match std::env::var("SIMJOIN_GPU_LANES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        Some(n) => n.clamp(1, 64),
        None if high_dim && !software => LANES,
        None => 1,
    }
}

/// Threads a high-dimensional query gets by default on a hardware GPU ([`lanes`]).
const LANES: u32 = 8;

/// The per-thread loop budget a paced hardware GPU's first dispatch gets.
const PACE_START: u32 = 1 << 16;

/// The seconds a search dispatch should take, where `SIMJOIN_GPU_DISPATCH_MS` asks for
/// paced dispatches. Desktop drivers reset a GPU whose kernel runs for seconds while it
/// drives a display: 50-100 ms keeps a join clear of that. Off by default: on an H100
/// (no display) a 16-D join paced at 50 ms took 67.9 s against 24.9 s unpaced, its
/// batches of a million queries each resuming hundreds of times (2026-11-26); batches
/// sized by time too are the missing half.
/// A software device (`software`: lavapipe, whose loop limit caps every dispatch anyway)
/// is paced at `SOFTWARE_DISPATCH_SECONDS` unless asked otherwise: its long dispatches
/// are what a stopped job waits for.
pub(super) fn dispatch_target(software: bool) -> Option<f64> {
    match std::env::var("SIMJOIN_GPU_DISPATCH_MS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        Some(ms) if ms.is_finite() && ms > 0.0 => Some(ms / 1e3),
        // 0: unpaced, a software device too (its loop limit still cuts each dispatch).
        Some(0.0) => None,
        _ => software.then_some(SOFTWARE_DISPATCH_SECONDS),
    }
}

/// The seconds a software device's search dispatch aims at (see [`dispatch_target`]).
const SOFTWARE_DISPATCH_SECONDS: f64 = 0.025;

/// The per-thread loop budget of the search dispatches: a software device's loop limit
/// (lavapipe), none on a hardware GPU; or, paced ([`dispatch_target`]), adapted so that
/// each dispatch takes about the target: doubled after a dispatch under half of it,
/// scaled down after one over twice it, within [`floor`, `cap`] (the floor: what a thread
/// must be allowed, to make progress; the cap: a software device's limit). Threads out of
/// budget stop and resume in the next dispatch (the mechanism a full result buffer uses),
/// so the budget bounds time, never results.
pub(super) struct Pace {
    budget: std::cell::Cell<u32>,
    floor: u32,
    cap: u32,
    /// Seconds a dispatch aims at; None: a fixed budget.
    target: Option<f64>,
    /// The longest search dispatch seen, seconds.
    longest: std::cell::Cell<f64>,
}

impl Pace {
    /// The pace of a device: `software_budget` is a software device's loop limit (0 on
    /// hardware, none); `floor` the least budget a thread needs to make progress;
    /// `target` the seconds a dispatch should take, if paced ([`dispatch_target`]).
    pub fn new(software_budget: u32, floor: u32, target: Option<f64>) -> Self {
        let cap = match software_budget {
            0 => u32::MAX / 2,
            b => b,
        };
        let (start, floor) = match target {
            // Unpaced: a software device's limit, or no budget at all (0).
            None => (software_budget, software_budget),
            // Room above the least on hardware: a budget that barely allows a step would
            // spend its dispatches on the fixed charge.
            Some(_) => {
                let floor = if software_budget == 0 {
                    floor * 4
                } else {
                    floor
                }
                .min(cap);
                (PACE_START.clamp(floor, cap), floor)
            }
        };
        Pace {
            budget: std::cell::Cell::new(start),
            floor,
            cap,
            target,
            longest: std::cell::Cell::new(0.0),
        }
    }

    pub fn budget(&self) -> u32 {
        self.budget.get()
    }

    pub fn longest(&self) -> f64 {
        self.longest.get()
    }

    /// The target seconds of a dispatch, where the budget adapts.
    pub fn target(&self) -> Option<f64> {
        self.target
    }

    /// A search dispatch took `seconds`.
    fn observe(&self, seconds: f64) {
        self.longest.set(self.longest.get().max(seconds));
        let Some(target) = self.target else { return };
        if !seconds.is_finite() {
            return;
        }
        let b = self.budget.get() as f64;
        let next = if seconds < target / 2.0 {
            b * 2.0
        } else if seconds > 2.0 * target {
            b * target / seconds
        } else {
            b
        };
        self.budget
            .set(next.clamp(self.floor as f64, self.cap as f64) as u32);
    }
}

impl<T: Coord> Run<'_, T>
where
    JoinParams<T>: bytemuck::Pod,
{
    /// The push constants of one dispatch over `queries` (every `stride`-th position),
    /// with the pace's current loop budget. Lanes (`params.lanes` threads a query) where the
    /// dispatch runs one query a thread: not in the tiled sweep (FLAG_TILE over
    /// consecutive queries), whose workgroups share their queries' candidates instead.
    fn push(&self, queries: &Range<u32>, q_count: u32, stride: u32, bits: u32) -> JoinParams<T> {
        let tiled = bits & flags::FLAG_TILE != 0 && stride == 1;
        JoinParams {
            q_begin: queries.start,
            q_count,
            q_stride: stride,
            flags: bits,
            budget: self.pace.budget(),
            lanes: if tiled { 1 } else { self.params.lanes.max(1) },
            ..self.params
        }
    }
}

fn new_slot(
    ctx: &Arc<Context>,
    index: usize,
    capacity: u64,
    max_points: usize,
    lanes: u32,
    counting: bool,
) -> Result<Slot> {
    let result_bytes = if counting { 8 } else { capacity * 8 };
    // A continuation state per thread: `lanes` a query.
    let state_bytes = max_points as u64 * lanes.max(1) as u64 * 16;
    let results = Buffer::new(ctx, result_bytes, Memory::Device, "join results")?;
    let counter_bytes = 4 * COUNTER_WORDS as u64;
    let counters = Buffer::new(ctx, counter_bytes, Memory::Device, "join counters")?;
    let states = Buffer::new(ctx, state_bytes, Memory::Device, "join query states")?;
    // `SIMJOIN_GPU_STAGING=1` takes the discrete-GPU path (copies into pinned buffers) on
    // a unified-memory device too, so that tests on lavapipe cover it.
    let staging =
        !results.is_mapped() || std::env::var("SIMJOIN_GPU_STAGING").is_ok_and(|v| v == "1");
    let pinned = |bytes, name| -> Result<Option<Arc<Buffer>>> {
        Ok(if !staging {
            None
        } else {
            Some(Buffer::new(ctx, bytes, Memory::Readback, name)?)
        })
    };
    Ok(Slot {
        stream: Stream::new(ctx, index)?,
        results_host: pinned(result_bytes, "pinned results")?,
        counters_host: pinned(counter_bytes, "pinned counters")?,
        states_host: pinned(state_bytes, "pinned query states")?,
        results,
        counters,
        states,
        state: SlotState::Free,
    })
}

/// Result slots kept between joins: one set of [`SLOTS`], the last one given back (an
/// idle engine holds it, up to 3 result buffers on the device and 3 pinned on the host,
/// 128 MiB each by default, until it is dropped or a join needs another size).
#[derive(Default)]
pub(crate) struct SlotPool {
    kept: std::sync::Mutex<Option<KeptSlots>>,
}

struct KeptSlots {
    slots: Vec<Slot>,
    capacity: u32,
    max_points: usize,
    lanes: u32,
    counting: bool,
}

impl SlotPool {
    /// Keeps `slots` (every one idle: their batches have been waited for) for the next join.
    pub(super) fn give(
        &self,
        slots: Vec<Slot>,
        capacity: u32,
        max_points: usize,
        lanes: u32,
        counting: bool,
    ) {
        if slots.iter().all(|s| matches!(s.state, SlotState::Free)) {
            let kept = KeptSlots {
                slots,
                capacity,
                max_points,
                lanes,
                counting,
            };
            *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        }
    }

    /// The kept set, when it has this `capacity`, room for `max_points` queries and the
    /// same kind (`counting`); a kept set that does not fit is dropped, so that its memory
    /// is back before new slots are allocated.
    fn take(
        &self,
        capacity: u32,
        max_points: usize,
        lanes: u32,
        counting: bool,
    ) -> Option<(Vec<Slot>, usize)> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        (kept.capacity == capacity
            && kept.max_points >= max_points
            && kept.lanes == lanes
            && kept.counting == counting)
            .then_some((kept.slots, kept.max_points))
    }
}

/// The three slots, from `pool` where it keeps a set that fits. Result-buffer capacity:
/// the user's, else the default within the binding limit. On device out-of-memory, the
/// kept set is dropped, then the result buffers and the batch size (query states) are
/// halved, down to MIN_RESULT_PAIRS pairs and `min_points` queries, before giving up.
/// Returns the slots, the capacity, the most queries per batch and whether the slots were
/// kept from an earlier join.
pub(super) fn make_slots(
    ctx: &Arc<Context>,
    pool: &SlotPool,
    requested: Option<usize>,
    mut max_points: usize,
    min_points: usize,
    lanes: u32,
    counting: bool,
) -> Result<(Vec<Slot>, u32, usize, bool)> {
    let limit_pairs = ctx.limits().max_storage_buffer_range / 8;
    let mut capacity = match requested {
        Some(c) => (c as u64).min(limit_pairs),
        None => DEFAULT_RESULT_PAIRS.min(limit_pairs),
    }
    .min(u32::MAX as u64 / 2)
    .max(1);
    if let Some((slots, kept_points)) = pool.take(capacity as u32, max_points, lanes, counting) {
        return Ok((slots, capacity as u32, kept_points, true));
    }
    loop {
        match (0..SLOTS)
            .map(|i| new_slot(ctx, i, capacity, max_points, lanes, counting))
            .collect::<Result<Vec<_>>>()
        {
            Ok(slots) => return Ok((slots, capacity as u32, max_points, false)),
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

/// Orders every slot's next submission after `ticket` (the uploads).
pub(super) fn wait_for(slots: &mut [Slot], ticket: &Ticket) {
    for slot in slots {
        slot.stream.wait_for(ticket);
    }
}

/// One dispatch over no query on `slot`, waited for: a software device (lavapipe) compiles
/// a kernel at its first dispatch, for a good part of a second that nothing interrupts,
/// and this moves that compile before the join's batches (and a stop waiting on them).
pub(super) fn warm_up<T: Coord>(run: &Run<'_, T>, slot: &mut Slot) -> Result<()>
where
    JoinParams<T>: bytemuck::Pod,
{
    let push = JoinParams {
        q_count: 0,
        ..run.push(&(0..0), 0, 1, run.params.flags | flags::FLAG_COUNT)
    };
    submit_search(run, slot, 0, &push, 1, true, true)?.wait()
}

/// The estimation pass: count-only over every `stride`-th of `nq` queries (slot 0), then
/// the batch plan.
#[allow(clippy::too_many_arguments)]
pub(super) fn estimate<T: Coord>(
    run: &Run<'_, T>,
    slot: &mut Slot,
    nq: usize,
    stride: usize,
    max_points: usize,
    batch_points: Option<usize>,
    counts: &mut Counts,
    gpu_seconds: &mut Option<f64>,
) -> Result<BatchPlan>
where
    JoinParams<T>: bytemuck::Pod,
{
    let n_samples = nq.div_ceil(stride);
    let mut fresh = true;
    // Threads a sampled query, as the dispatches had them.
    let mut lanes;
    loop {
        run.control.check()?;
        let push = run.push(
            &(0..nq as u32),
            n_samples as u32,
            stride as u32,
            run.params.flags | flags::FLAG_COUNT,
        );
        let t = Instant::now();
        lanes = push.lanes;
        submit_search(run, slot, 0, &push, n_samples, fresh, true)?.wait()?;
        let mut took = t.elapsed().as_secs_f64();
        counts.dispatches += 1;
        if let Some(timer) = &run.timer {
            took = timer.seconds(0, 1)?;
            if let Some(gpu) = gpu_seconds.as_mut() {
                *gpu += took;
            }
        }
        run.pace.observe(took);
        fresh = false;
        let head = read_words(
            slot.counters_host.as_ref().unwrap_or(&slot.counters),
            2,
            counts,
        )?;
        if head[1] == 0 {
            break;
        }
    }
    let sample_counts = read_matches(slot, n_samples, lanes, counts)?;
    Ok(plan_batches(
        nq,
        stride,
        &sample_counts,
        run.params.capacity as usize,
        max_points,
        batch_points,
    ))
}

/// Receives a device-rows batch: its query positions and its rows' entries (`Out::Rows`).
pub(super) type PlaceRows<'s> = dyn FnMut(Range<u32>, &[u32]) -> Result<()> + 's;

/// Where a batch's results go.
pub(super) enum Out<'s> {
    /// Counted only (each query's count in `Counts::per_query` where kept).
    Count,
    /// Pairs, to a sink.
    Pairs(&'s mut dyn PairSink),
    /// FLAG_ROWS: a batch's pairs accumulate over its dispatches, are sorted on the device
    /// by (query id, indexed id) once it is complete, and only the indexed ids are read
    /// back: `place(queries, ids)` gets the batch's query positions and those ids, its
    /// rows in query-id order (`rows.rs`). Every batch must fit the result buffer.
    Rows(&'s mut PlaceRows<'s>),
}

impl<'s> Out<'s> {
    /// A sink's pairs, or count only without one.
    pub fn pairs(sink: Option<&'s mut dyn PairSink>) -> Self {
        sink.map_or(Out::Count, Out::Pairs)
    }
}

/// Runs the batches, three in flight (busy slots are completed oldest first), delivering
/// their results to `out`. `stage`: the progress stage the batches count in.
pub(super) fn run_batches<T: Coord>(
    run: &Run<'_, T>,
    slots: &mut [Slot],
    ranges: Vec<Range<u32>>,
    mut out: Out<'_>,
    stage: &'static str,
    times: &mut Times,
    counts: &mut Counts,
) -> Result<()>
where
    JoinParams<T>: bytemuck::Pod,
{
    let counting = matches!(out, Out::Count);
    let rows = matches!(out, Out::Rows(_));
    debug_assert_eq!(rows, run.params.flags & flags::FLAG_ROWS != 0);
    let capacity = run.params.capacity as usize;
    let t_loop = Instant::now();
    let mut queue: VecDeque<Range<u32>> = ranges.into();
    let mut busy: VecDeque<usize> = VecDeque::new();
    let bits = run.params.flags | if counting { flags::FLAG_COUNT } else { 0 };
    // Threads a query in these dispatches (`Run::push`).
    let bits_lanes = run.push(&(0..0), 0, 1, bits).lanes;
    run.control.stage(stage, queue.len() as u64);
    let mut reported = counts.pairs;
    loop {
        // A stop submits nothing more; the batches in flight complete when the caller
        // drops the slots (each stream waits for its work), before their buffers go.
        run.control.check()?;
        for (s, slot) in slots.iter_mut().enumerate() {
            if matches!(slot.state, SlotState::Free) {
                if let Some(queries) = queue.pop_front() {
                    let push = run.push(&queries, queries.len() as u32, 1, bits);
                    let ticket = submit_search(run, slot, s, &push, queries.len(), true, counting)?;
                    counts.dispatches += 1;
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
                    let mut took = submitted.elapsed().as_secs_f64();
                    if let Some(timer) = &run.timer {
                        took = timer.seconds(2 * s as u32, 2 * s as u32 + 1)?;
                        if let Some(gpu) = times.gpu_search.as_mut() {
                            *gpu += took;
                            times.gpu_searches += 1;
                        }
                    }
                    run.pace.observe(took);
                    let t = Instant::now();
                    let head = read_words(
                        slot.counters_host.as_ref().unwrap_or(&slot.counters),
                        COUNTER_WORDS,
                        counts,
                    )?;
                    let (slots_taken, incomplete) = (head[0] as usize, head[1] != 0);
                    let wide = |at: usize| head[at] as u64 | (head[at + 1] as u64) << 32;
                    counts.dot_rejected += wide(2);
                    counts.dot_tested += wide(4);
                    if slots_taken > capacity {
                        counts.overflowed += 1;
                    }
                    if counting {
                        if !incomplete {
                            let matches = read_matches(slot, queries.len(), bits_lanes, counts)?;
                            counts.pairs += matches.iter().map(|&c| c as u64).sum::<u64>();
                            if let Some(per_query) = counts.per_query.as_mut() {
                                per_query[queries.start as usize..queries.end as usize]
                                    .copy_from_slice(&matches);
                            }
                        }
                        times.download += t.elapsed().as_secs_f64();
                        (queries, incomplete, submitted)
                    } else if rows && incomplete {
                        // The batch's pairs stay on the device until it is complete.
                        times.download += t.elapsed().as_secs_f64();
                        (queries, incomplete, submitted)
                    } else if rows {
                        // Complete: sort by (query id, indexed id) on the device, then copy
                        // the indexed ids (the second array) to the pinned buffer.
                        if slots_taken > capacity {
                            return Err(crate::error::Error::new(
                                ErrorKind::Internal,
                                format!(
                                    "device rows: a batch found {slots_taken} pairs, more than its \
                                     {capacity} counted"
                                ),
                            ));
                        }
                        let pairs = slots_taken;
                        let values_at = capacity as u64 * 4;
                        crate::vk::sort::sort_pairs_u32_in(
                            &mut slot.stream,
                            &slot.results,
                            values_at,
                            pairs,
                        )?;
                        let copied = slot.results_host.is_some() && pairs > 0;
                        if let (Some(host), true) = (&slot.results_host, copied) {
                            let stamp = copy_stamps(run, s);
                            if let Some((timer, first)) = stamp {
                                slot.stream.timestamp(timer, first)?;
                            }
                            slot.stream.copy(
                                &slot.results,
                                values_at,
                                host,
                                0,
                                pairs as u64 * 4,
                            )?;
                            if let Some((timer, first)) = stamp {
                                slot.stream.timestamp(timer, first + 1)?;
                            }
                        }
                        let ticket = slot.stream.submit()?;
                        slot.state = SlotState::Downloading {
                            queries,
                            pairs,
                            incomplete,
                            copied,
                            ticket,
                            submitted,
                        };
                        busy.push_front(s);
                        times.download += t.elapsed().as_secs_f64();
                        continue;
                    } else {
                        let pairs = slots_taken.min(capacity);
                        if let (Some(host), true) = (&slot.results_host, pairs > 0) {
                            // Copy exactly the pairs found to the pinned buffer.
                            slot.stream.barrier()?;
                            let stamp = copy_stamps(run, s);
                            if let Some((timer, first)) = stamp {
                                slot.stream.timestamp(timer, first)?;
                            }
                            slot.stream
                                .copy(&slot.results, 0, host, 0, pairs as u64 * 8)?;
                            if let Some((timer, first)) = stamp {
                                slot.stream.timestamp(timer, first + 1)?;
                            }
                            let ticket = slot.stream.submit()?;
                            slot.state = SlotState::Downloading {
                                queries,
                                pairs,
                                incomplete,
                                copied: true,
                                ticket,
                                submitted,
                            };
                            busy.push_front(s);
                            times.download += t.elapsed().as_secs_f64();
                            continue;
                        }
                        times.download += t.elapsed().as_secs_f64();
                        deliver(slot, pairs, &mut out, counts, times)?;
                        (queries, incomplete, submitted)
                    }
                }
                SlotState::Downloading {
                    queries,
                    pairs,
                    incomplete,
                    copied,
                    ticket,
                    submitted,
                } => {
                    let t = Instant::now();
                    ticket.wait()?;
                    times.download += t.elapsed().as_secs_f64();
                    if let (Some((timer, first)), Some(gpu), true) =
                        (copy_stamps(run, s), times.gpu_copies.as_mut(), copied)
                    {
                        *gpu += timer.seconds(first, first + 1)?;
                    }
                    if let Out::Rows(place) = &mut out {
                        deliver_rows(slot, &queries, pairs, capacity, place, counts, times)?;
                    } else {
                        deliver(slot, pairs, &mut out, counts, times)?;
                    }
                    (queries, incomplete, submitted)
                }
            };
        times.busy += submitted.elapsed().as_secs_f64();
        run.control
            .advance(u64::from(!incomplete), counts.pairs - reported);
        reported = counts.pairs;
        if incomplete {
            // A stopped job's batch is not resumed (its threads may have stopped for that).
            run.control.check()?;
            // Some queries stopped early: run the batch again; finished queries return at once.
            let push = run.push(&queries, queries.len() as u32, 1, bits);
            let ticket = submit_search(run, slot, s, &push, queries.len(), false, counting)?;
            counts.dispatches += 1;
            counts.resumed += 1;
            slot.state = SlotState::Searching {
                queries,
                ticket,
                submitted: Instant::now(),
            };
            busy.push_back(s);
        }
    }
    times.loop_wall = t_loop.elapsed().as_secs_f64();
    Ok(())
}

/// The timer and first of the two timestamp slots around batch slot `s`'s result copy.
fn copy_stamps<'a, T: Coord>(run: &'a Run<'_, T>, s: usize) -> Option<(&'a Arc<GpuTimer>, u32)> {
    run.timer.as_ref().map(|t| (t, 2 * (SLOTS + s) as u32))
}

/// FLAG_ROWS: hands the `pairs` indexed ids of `slot`'s sorted batch over `queries` to
/// `place`.
fn deliver_rows(
    slot: &Slot,
    queries: &Range<u32>,
    pairs: usize,
    capacity: usize,
    place: &mut PlaceRows<'_>,
    counts: &mut Counts,
    times: &mut Times,
) -> Result<()> {
    let t = Instant::now();
    let (buffer, first) = match &slot.results_host {
        Some(host) => (host, 0),
        None => (&slot.results, capacity),
    };
    let ids: &[u32] = if pairs == 0 {
        &[]
    } else {
        // SAFETY: the search, the sort and the copy that wrote these words have completed
        // (the caller waited for their ticket); the slot gets new work only after this
        // returns, and the slice does not outlive it.
        unsafe { buffer.mapped_slice(first, pairs)? }
    };
    counts.pairs += pairs as u64;
    counts.bytes_down += pairs as u64 * 4;
    place(queries.clone(), ids)?;
    times.assemble += t.elapsed().as_secs_f64();
    Ok(())
}

/// Hands the first `pairs` results of `slot` to the sink (none: count only).
fn deliver(
    slot: &Slot,
    pairs: usize,
    out: &mut Out<'_>,
    counts: &mut Counts,
    times: &mut Times,
) -> Result<()> {
    let t = Instant::now();
    let buffer = slot.results_host.as_ref().unwrap_or(&slot.results);
    // SAFETY: the work writing these results (the search, and the copy to the pinned
    // buffer where there is one) has completed: the caller waited for its ticket. The
    // slot gets new work only after this returns, and the slice does not outlive it.
    let chunk: &[Pair] = unsafe { buffer.mapped_slice(0, pairs)? };
    times.download += t.elapsed().as_secs_f64();
    let t = Instant::now();
    counts.pairs += chunk.len() as u64;
    counts.bytes_down += size_of_val(chunk) as u64;
    if let Out::Pairs(sink) = out {
        // From the engine's threads at once where the sink has parts.
        crate::result::push_split(&mut **sink, chunk).map_err(sink_error)?;
    }
    times.assemble += t.elapsed().as_secs_f64();
    Ok(())
}

/// Records and submits one search dispatch over `threads` queries (`push.lanes` threads
/// each): zero the counters (and, for a new batch, the query states), dispatch, and copy
/// counters (and states when counting) to the pinned buffers where device memory is not
/// mapped.
fn submit_search<T: Coord>(
    run: &Run<'_, T>,
    slot: &mut Slot,
    slot_index: usize,
    push: &JoinParams<T>,
    threads: usize,
    fresh: bool,
    counting: bool,
) -> Result<Ticket>
where
    JoinParams<T>: bytemuck::Pod,
{
    let threads = threads * push.lanes.max(1) as usize;
    // FLAG_ROWS: a resumed dispatch appends to its batch's pairs (word 0 kept).
    let kept = if !fresh && push.flags & flags::FLAG_ROWS != 0 {
        4
    } else {
        0
    };
    slot.stream
        .fill(&slot.counters, kept, 4 * COUNTER_WORDS as u64 - kept, 0)?;
    if fresh {
        slot.stream.fill(&slot.states, 0, threads as u64 * 16, 0)?;
    }
    slot.stream.barrier()?;
    let bindings = run
        .data
        .bindings(&slot.results, &slot.counters, &slot.states);
    if let Some(stop) = &run.stop {
        // The kernel reads it by address, unbound: the frame keeps it alive.
        slot.stream.keep_alive(stop.clone())?;
    }
    let stamps = run.timer.as_ref().map(|t| (t, 2 * slot_index as u32));
    if let Some((timer, first)) = stamps {
        slot.stream.timestamp(timer, first)?;
    }
    slot.stream.dispatch_threads(
        &run.kernel,
        threads as u64,
        &bindings,
        bytemuck::bytes_of(push),
    )?;
    if let Some((timer, first)) = stamps {
        slot.stream.timestamp(timer, first + 1)?;
    }
    if let Some(host) = &slot.counters_host {
        slot.stream.barrier()?;
        slot.stream
            .copy(&slot.counters, 0, host, 0, 4 * COUNTER_WORDS as u64)?;
        if counting {
            let states_host = slot.states_host.as_ref().expect("pinned with the counters");
            slot.stream
                .copy(&slot.states, 0, states_host, 0, threads as u64 * 16)?;
        }
    }
    slot.stream.submit()
}

fn read_words(buffer: &Buffer, words: usize, counts: &mut Counts) -> Result<Vec<u32>> {
    counts.bytes_down += words as u64 * 4;
    buffer.read_vec(0, words)
}

/// Matches per query of the last count-only batch over `queries` queries (the states'
/// fourth word, summed over each query's `lanes` threads).
fn read_matches(slot: &Slot, queries: usize, lanes: u32, counts: &mut Counts) -> Result<Vec<u32>> {
    let lanes = lanes.max(1) as usize;
    counts.bytes_down += (queries * lanes) as u64 * 16;
    let states: Vec<[u32; 4]> = slot
        .states_host
        .as_ref()
        .unwrap_or(&slot.states)
        .read_vec(0, queries * lanes)?;
    // A query's count is below 2^32 (its candidates are), so the sum of its lanes is too.
    Ok(states
        .chunks_exact(lanes)
        .map(|l| l.iter().map(|s| s[3]).sum())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::Pace;

    /// A paced budget doubles under half the target, shrinks over twice it, and stays
    /// within its floor and cap; unpaced, a software device's budget is fixed and a
    /// hardware GPU has none.
    #[test]
    fn pace_adapts_within_bounds() {
        let p = Pace::new(0, 100, Some(0.05));
        let t = p.target().unwrap();
        let b0 = p.budget();
        p.observe(t / 4.0);
        assert_eq!(p.budget(), 2 * b0);
        p.observe(t);
        assert_eq!(p.budget(), 2 * b0);
        p.observe(t * 8.0);
        assert_eq!(p.budget(), b0 / 4);
        for _ in 0..40 {
            p.observe(1e3);
        }
        assert_eq!(p.budget(), 400, "the floor: 4x the least");
        for _ in 0..80 {
            p.observe(0.0);
        }
        assert_eq!(p.budget(), u32::MAX / 2);
        assert_eq!(p.longest(), 1e3);
        let s = Pace::new(7000, 50, None);
        assert_eq!((s.budget(), s.target()), (7000, None));
        s.observe(1e3);
        assert_eq!(s.budget(), 7000);
        let h = Pace::new(0, 50, None);
        assert_eq!(h.budget(), 0, "unpaced hardware: no budget");
        let paced_soft = Pace::new(7000, 50, Some(1e-4));
        paced_soft.observe(1.0);
        assert!(paced_soft.budget() < 7000 && paced_soft.budget() >= 50);
        for _ in 0..40 {
            paced_soft.observe(0.0);
        }
        assert_eq!(
            paced_soft.budget(),
            7000,
            "a software device's limit caps it"
        );
    }
}
