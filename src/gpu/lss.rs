//! LSS on the GPU (Lieberman, Sankaranarayanan & Samet 2008): the eps-join by sort and
//! search over a set of Z-order lists.
//!
//! 1. Quantise A and B onto integers (`zorder.rs`, one scale over both sets' bounds).
//! 2. Index the smaller set (the paper's §V-C; the set itself for a self-join): `lists`
//!    copies of its point ids, copy j shifted by j/m of the range in every dimension, each
//!    sorted in Z-order on the device by the engine's bitonic network with a Z-order
//!    compare-exchange (`vk::sort::sort_zorder`, all lists in the same dispatches).
//! 3. Search (glsl/lss.glsl MODE_SEARCH): per query, binary searches for the corners of its
//!    box (conservative: see `zorder.rs`) in every list; the list with the shortest
//!    interval wins (MININTERVAL).
//! 4. Output the paper's way: a count pass (exact matches in each interval), an exclusive
//!    prefix sum with the engine's scan kernel, and fill passes writing each match at its
//!    rank. When the total exceeds the result buffer, chunks of consecutive ranks are
//!    filled one after another (WALKINTERVALSCHUNKED, the chunk's queries found by binary
//!    search on the prefix sums); a query whose matches straddle chunks pauses at the
//!    chunk's end and resumes there, so even one query with more matches than the buffer
//!    holds loses and repeats nothing. Shortcut: the count pass also writes its matches at
//!    atomically taken slots while the buffer has room, so when the total fits (the common
//!    case) the pairs are already there and the second walk (the fill) is skipped
//!    (measured on lavapipe, uniform 16-D, 20k points: LSS with pairs 1.6x faster).
//!
//! Self-join: each point walks its whole box interval and keeps only partners with a
//! larger id, so every unordered pair comes out once as [i, j], i < j, whatever list
//! either point chose (the paper's half-box shortcut would lose or double pairs when the
//! two points pick different lists).
//!
//! Software devices cut long loops (see `join.rs`): every kernel charges its iterations
//! against a budget and saves where it stopped; `Lss::run` dispatches again until no
//! query stopped.

use super::interface::{binding, flags, JoinParams};
use super::zorder::{auto_lists, shift_for, Quantizer};
use crate::backend::Job;
use crate::dataset::{Coords, Dataset};
use crate::error::{Error, ErrorKind, Result};
use crate::metric::{threshold, Coord};
use crate::options::{Algorithm, Metric};
use crate::result::{sink_error, JoinReport, Pair, PairSink};
use crate::vk::{shaders, sort, Buffer, BufferRange, Context, Kernel, KernelSpec, Memory, Stream};
use std::sync::Arc;
use std::time::Instant;

pub(super) const MODE_INIT: u32 = 0;
pub(super) const MODE_SEARCH: u32 = 1;
pub(super) const MODE_COUNT: u32 = 2;
pub(super) const MODE_FILL: u32 = 3;
pub(super) const MODE_KNN_BOUND: u32 = 4;
pub(super) const MODE_KNN_BRUTE: u32 = 5;

/// Default result buffer: 2^24 entries, less where the binding limit is smaller.
pub(super) const DEFAULT_RESULT_ENTRIES: u64 = 1 << 24;
/// Most query positions processed together (per-position arrays are sized for a block).
const MAX_BLOCK: usize = 1 << 22;
/// Most dispatches recorded in one submission while queries keep stopping early.
const MAX_REPEATS: usize = 16;
/// The longest a submission of repeated dispatches should take (a stop waits for it).
const SUBMISSION_SECONDS: f64 = 0.05;

/// A run's device plumbing: the stream, the kernels' shared settings and the counters.
pub(super) struct Lss<'c> {
    pub ctx: &'c Arc<Context>,
    pub stream: Stream,
    pub workgroup: u32,
    /// Loop iterations per thread and dispatch (0: unlimited).
    pub budget: u32,
    pub dim: usize,
    pub metric: Metric,
    /// [0] unused, [1] some query stopped early, [2..4] sum of interval lengths (lo, hi).
    pub counters: Arc<Buffer>,
    /// Stand-in for bindings a kernel does not use.
    pub dummy: Arc<Buffer>,
    pub dispatches: usize,
    pub resumed: usize,
    /// The job's stop flag, read before each submission.
    control: crate::control::Control,
    /// The stop word the kernels read while they run (see batch::StopWatch), raised by
    /// `watch` once the job is stopped.
    stop: Arc<Buffer>,
    watch: Option<super::batch::StopWatch>,
}

/// The buffers of one dispatch, bound at `interface::binding` numbers; `None` binds the
/// stand-in.
#[derive(Clone, Default)]
pub(super) struct Bindings {
    pub r_coords: Option<BufferRange>,
    pub q_coords: Option<BufferRange>,
    pub cell_keys: Option<BufferRange>,
    pub cell_ranges: Option<BufferRange>,
    pub r_ids: Option<BufferRange>,
    pub q_ids: Option<BufferRange>,
    pub q_cells: Option<BufferRange>,
    pub meta: Option<BufferRange>,
    pub results: Option<BufferRange>,
    pub states: Option<BufferRange>,
    pub q_limits: Option<BufferRange>,
    pub q_radii: Option<BufferRange>,
}

impl<'c> Lss<'c> {
    pub fn new(ctx: &'c Arc<Context>, dim: usize, metric: Metric) -> Result<Self> {
        let (workgroup, budget) = super::join::workgroup_and_budget(ctx);
        let counters = Buffer::new(ctx, 16, Memory::Device, "lss counters")?;
        let dummy = Buffer::new(ctx, 16, Memory::Device, "unused binding")?;
        let mut stream = Stream::new(ctx, 0)?;
        stream.fill(&counters, 0, 16, 0)?;
        stream.fill(&dummy, 0, 16, 0)?;
        Ok(Lss {
            ctx,
            stream,
            workgroup,
            budget,
            dim,
            metric,
            counters,
            dummy,
            dispatches: 0,
            resumed: 0,
            control: Default::default(),
            stop: super::batch::stop_word(ctx)?,
            watch: None,
        })
    }

    /// The job's control: read before each submission, and a stop ends the dispatches in
    /// flight early.
    pub fn watch(&mut self, control: &crate::control::Control) {
        self.watch = Some(super::batch::StopWatch::start(control, &self.stop));
        self.control = control.clone();
    }

    /// Fails on a software device whose loop budget cannot fit the least work a thread of
    /// `mode` must do to make progress.
    pub fn check_budget(&self, mode: u32, log_k: u32) -> Result<()> {
        let d = self.dim as u32;
        let least = self.least(mode, log_k);
        if self.budget != 0 && least > self.budget {
            return Err(Error::unsupported(format!(
                "{} (a software device) cannot run LSS in {d} dimensions: one step exceeds its \
                 per-thread loop budget of {}; use the CPU backend",
                self.ctx.device_name(),
                self.budget
            )));
        }
        Ok(())
    }

    /// The least loop budget a thread of `mode` needs to make progress.
    fn least(&self, mode: u32, log_k: u32) -> u32 {
        let d = self.dim as u32;
        match mode {
            MODE_SEARCH => 3 * d + 1,
            // The query, one candidate, and kNN's tighter thresholds.
            MODE_COUNT | MODE_FILL => 2 * d + 6,
            MODE_KNN_BOUND => 4 * d + 1,
            _ => 2 * d + 2 + log_k,
        }
    }

    fn kernel<T: Coord>(&self, mode: u32) -> Result<Kernel> {
        let spirv = if size_of::<T>() == 4 {
            shaders::LSS_F32
        } else {
            shaders::LSS_F64
        };
        let spec = KernelSpec::new(self.workgroup)
            .bindings(binding::COUNT)
            .push_bytes(size_of::<JoinParams<T>>() as u32)
            .constant(1, self.dim as u32)
            .constant(2, 1)
            .constant(3, self.metric as u32)
            .constant(4, 0)
            .constant(5, mode);
        self.ctx.kernel("lss", spirv, &spec)
    }

    fn ranges(&self, b: &Bindings) -> Vec<BufferRange> {
        let or = |r: &Option<BufferRange>| r.clone().unwrap_or_else(|| self.dummy.all());
        let mut v: Vec<(u32, BufferRange)> = vec![
            (binding::R_COORDS, or(&b.r_coords)),
            (binding::Q_COORDS, or(&b.q_coords)),
            (binding::CELL_KEYS, or(&b.cell_keys)),
            (binding::CELL_RANGES, or(&b.cell_ranges)),
            (binding::R_IDS, or(&b.r_ids)),
            (binding::Q_IDS, or(&b.q_ids)),
            (binding::Q_CELLS, or(&b.q_cells)),
            (binding::META, or(&b.meta)),
            (binding::RESULTS, or(&b.results)),
            (binding::COUNTERS, self.counters.all()),
            (binding::STATES, or(&b.states)),
            (binding::Q_LIMITS, or(&b.q_limits)),
            (binding::Q_RADII, or(&b.q_radii)),
            (binding::R_DOT, self.dummy.all()),
            (binding::Q_DOT, self.dummy.all()),
            (binding::LINK_CORE, self.dummy.all()),
            (binding::LINK_PARENT, self.dummy.all()),
        ];
        v.sort_by_key(|(i, _)| *i);
        debug_assert!(v.iter().enumerate().all(|(i, (n, _))| i as u32 == *n));
        debug_assert_eq!(v.len() as u32, binding::COUNT);
        v.into_iter().map(|(_, r)| r).collect()
    }

    /// Runs kernel `mode` over `threads` threads until no thread stopped early (software
    /// devices: several dispatches per submission, doubling while queries keep stopping).
    pub fn run<T: Coord>(
        &mut self,
        mode: u32,
        threads: usize,
        b: &Bindings,
        params: &JoinParams<T>,
    ) -> Result<()>
    where
        JoinParams<T>: bytemuck::Pod,
    {
        if threads == 0 {
            return Ok(());
        }
        let kernel = self.kernel::<T>(mode)?;
        let ranges = self.ranges(b);
        // A software device's budget, halved while one dispatch takes longer than a
        // submission should (threads out of budget resume: time is bounded, not results).
        let least = self.least(mode, params.log_cells).min(self.budget);
        let mut params = *params;
        let at = self.stop.device_address();
        (params.stop_lo, params.stop_hi) = (at as u32, (at >> 32) as u32);
        // The kernels read the stop word by address, unbound: the frames keep it alive.
        self.stream.keep_alive(self.stop.clone())?;
        let mut repeats = 1;
        loop {
            // `finish` below waited for every dispatch: nothing is in flight here.
            self.control.check()?;
            let push = bytemuck::bytes_of(&params);
            let t = std::time::Instant::now();
            for _ in 0..repeats {
                self.stream.fill(&self.counters, 4, 4, 0)?;
                self.stream.barrier()?;
                self.stream
                    .dispatch_threads(&kernel, threads as u64, &ranges, push)?;
                self.stream.barrier()?;
            }
            self.stream.finish()?;
            self.dispatches += repeats;
            // Threads that saw the stop word stopped unfinished: never a complete answer.
            self.control.check()?;
            if self.budget == 0 || self.counters()?[1] == 0 {
                return Ok(());
            }
            self.resumed += 1;
            // Submissions of at most about SUBMISSION_SECONDS: a stop waits for no more.
            let took = t.elapsed().as_secs_f64();
            if took > SUBMISSION_SECONDS && repeats == 1 {
                params.budget = (params.budget / 2).max(least);
            }
            repeats = if took < SUBMISSION_SECONDS / 2.0 {
                (repeats * 2).min(MAX_REPEATS)
            } else if took > SUBMISSION_SECONDS {
                (repeats / 2).max(1)
            } else {
                repeats
            };
        }
    }

    pub fn counters(&self) -> Result<Vec<u32>> {
        self.ctx.download(&self.counters, 0, 4)
    }

    /// A device buffer of `bytes`, within the binding limit (kernels bind it whole).
    pub fn buffer(&self, bytes: u64, name: &str) -> Result<Arc<Buffer>> {
        check_binding(self.ctx, bytes, name)?;
        Buffer::new(self.ctx, bytes, Memory::Device, name)
    }

    /// Uploads `data` (checked against the binding limit).
    pub fn upload<P: bytemuck::Pod>(&self, data: &[P], name: &str) -> Result<Arc<Buffer>> {
        check_binding(self.ctx, std::mem::size_of_val(data) as u64, name)?;
        if data.is_empty() {
            return self.ctx.upload(&[0u32], name);
        }
        self.ctx.upload(data, name)
    }
}

fn check_binding(ctx: &Context, bytes: u64, name: &str) -> Result<()> {
    let limit = ctx.limits().max_storage_buffer_range;
    if bytes > limit {
        return Err(Error::unsupported(format!(
            "LSS: {name} needs {bytes} bytes, more than this device binds at once ({limit}); \
             use fewer lists, the CPU backend, or split the data"
        )));
    }
    Ok(())
}

/// The set of Z-lists over the indexed points, on the device. The points are renumbered by
/// their position in list 0 (internal ids): list 0 is the identity, a list-0 interval is a
/// run of consecutive points, and `orig` maps internal ids back to the caller's.
pub(super) struct ZIndex {
    pub n: usize,
    pub shift: u32,
    /// Coordinates (T) and quantised rows, by internal id.
    pub coords: Arc<Buffer>,
    pub rows: Arc<Buffer>,
    /// The lists of internal ids: list l at [l*n, (l+1)*n).
    pub ids: Arc<Buffer>,
    /// Internal id -> the caller's id.
    pub orig: Vec<u32>,
}

pub(super) const PERMUTE_INVERT: u32 = 0;
pub(super) const PERMUTE_GATHER: u32 = 1;
pub(super) const PERMUTE_MAP: u32 = 2;

/// Matches `Params` in glsl/lss_permute.comp.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PermuteParams {
    src: u64,
    dst: u64,
    perm: u64,
    count: u32,
    width: u32,
}

/// Records one glsl/lss_permute.comp pass over `count` elements (also used by the grid
/// index built on the device, `device_index.rs`).
#[allow(clippy::too_many_arguments)]
pub(super) fn permute(
    stream: &mut Stream,
    workgroup: u32,
    mode: u32,
    src: &Arc<Buffer>,
    dst: &Arc<Buffer>,
    perm: &Arc<Buffer>,
    count: u64,
    width: u32,
) -> Result<()> {
    let kernel = stream.context().kernel(
        "lss_permute",
        shaders::LSS_PERMUTE,
        &KernelSpec::new(workgroup.max(64))
            .constant(1, mode)
            .push_bytes(size_of::<PermuteParams>() as u32),
    )?;
    let p = PermuteParams {
        src: src.device_address(),
        dst: dst.device_address(),
        perm: perm.device_address(),
        count: count as u32,
        width,
    };
    stream.barrier()?;
    stream.dispatch_threads(&kernel, count, &[], bytemuck::bytes_of(&p))?;
    stream.barrier()?;
    // The kernel addresses the buffers through device addresses only.
    for b in [src, dst, perm] {
        stream.keep_alive(b.clone())?;
    }
    Ok(())
}

/// Row-major coordinates of `data` as `T` (the precision was checked by the caller).
pub(super) fn coords_of<'a, T: Coord>(data: &Dataset<'a>) -> &'a [T] {
    match data.coords() {
        Coords::F32(x) => bytemuck::cast_slice(x),
        Coords::F64(x) => bytemuck::cast_slice(x),
    }
}

/// Most lists chosen automatically on a software device: there the Z-order sort, whose
/// work grows with the lists, dominates (measured on lavapipe: uniform 3-D, 100k points,
/// 10 pairs per point: 1 list 6.3 s, 2 lists 2.3 s, 5 lists 2.7 s, sort 0.5 / 0.8 / 2.1 s;
/// clustered 16-D, 20k points: 1 list 0.84 s, 3 lists 1.4 s, 9 lists 2.9 s).
const SOFTWARE_AUTO_LISTS: usize = 3;

/// Lists to build: the caller's, else `auto_lists` (at most `SOFTWARE_AUTO_LISTS` on a
/// software device); fewer where the lists would not fit one binding. Returns the count
/// and a note.
pub(super) fn choose_lists(
    ctx: &Context,
    requested: Option<usize>,
    dim: usize,
    n: usize,
) -> (usize, String) {
    let auto = if ctx.is_software() {
        auto_lists(dim).min(SOFTWARE_AUTO_LISTS)
    } else {
        auto_lists(dim)
    };
    let wanted = requested.unwrap_or(auto).max(1);
    let fit = (ctx.limits().max_storage_buffer_range / (4 * n.max(1) as u64)).max(1) as usize;
    let lists = wanted.min(fit);
    let mut note = format!(
        "{lists} Z-order lists ({})",
        if requested.is_some() {
            "given"
        } else if ctx.is_software() && auto_lists(dim) > SOFTWARE_AUTO_LISTS {
            "automatic: the paper's Fig. 8 sizes by dimension, at most 3 on a software device \
             where sorting dominates"
        } else {
            "automatic: the paper's Fig. 8 sizes by dimension"
        }
    );
    if lists < wanted {
        note.push_str(&format!(
            ", reduced from {wanted}: more would exceed the binding limit"
        ));
    }
    (lists, note)
}

impl ZIndex {
    /// Quantises, uploads and sorts the `lists` Z-lists of `data` (not empty).
    pub fn build<T: Coord>(
        lss: &mut Lss,
        data: &Dataset,
        quant: &Quantizer,
        lists: usize,
    ) -> Result<ZIndex>
    where
        JoinParams<T>: bytemuck::Pod,
    {
        let (n, dim) = (data.len(), data.dim());
        let lists_n = lists as u64 * n as u64;
        let words = (size_of::<T>() / 4) as u64;
        if lists_n >= u32::MAX as u64 || n as u64 * dim as u64 * words >= u32::MAX as u64 {
            return Err(Error::unsupported(format!(
                "LSS: {lists} lists of {n} points in {dim} dimensions exceed 32-bit positions"
            )));
        }
        let rows = lss.upload(&quant.rows(data), "quantised rows")?;
        let coords = lss.upload(coords_of::<T>(data), "indexed points")?;
        let ids = lss.buffer(lists_n * 4, "Z-lists")?;
        let shift = shift_for(lists);
        let init = JoinParams::<T> {
            n_cells: n as u32,
            lists: lists as u32,
            ..params_zero()
        };
        let b = Bindings {
            r_ids: Some(ids.all()),
            ..Default::default()
        };
        lss.run(MODE_INIT, lists_n as usize, &b, &init)?;
        sort::sort_zorder(
            &mut lss.stream,
            &ids,
            &rows,
            n,
            lists,
            dim,
            shift,
            sort::SortStages::Auto,
        )?;
        // Renumber by list-0 position: orig = list 0, inv = its inverse; gather the points
        // in that order and map every list through inv (list 0 becomes the identity).
        let orig = lss.buffer(n as u64 * 4, "original ids")?;
        lss.stream.copy(&ids, 0, &orig, 0, n as u64 * 4)?;
        let inv = lss.buffer(n as u64 * 4, "list-0 positions")?;
        permute(
            &mut lss.stream,
            lss.workgroup,
            PERMUTE_INVERT,
            &orig,
            &inv,
            &orig,
            n as u64,
            1,
        )?;
        let sorted_coords = lss.buffer(coords.size(), "indexed points (list-0 order)")?;
        let w = (dim as u64 * words) as u32;
        permute(
            &mut lss.stream,
            lss.workgroup,
            PERMUTE_GATHER,
            &coords,
            &sorted_coords,
            &orig,
            n as u64 * w as u64,
            w,
        )?;
        let sorted_rows = lss.buffer(rows.size(), "quantised rows (list-0 order)")?;
        let w = dim as u32;
        permute(
            &mut lss.stream,
            lss.workgroup,
            PERMUTE_GATHER,
            &rows,
            &sorted_rows,
            &orig,
            n as u64 * w as u64,
            w,
        )?;
        permute(
            &mut lss.stream,
            lss.workgroup,
            PERMUTE_MAP,
            &ids,
            &ids,
            &inv,
            lists_n,
            1,
        )?;
        lss.stream.finish()?;
        let orig = lss.ctx.download(&orig, 0, n)?;
        Ok(ZIndex {
            n,
            shift,
            coords: sorted_coords,
            rows: sorted_rows,
            ids,
            orig,
        })
    }
}

/// JoinParams with every field zero (T fields too).
pub(super) fn params_zero<T: Coord>() -> JoinParams<T> {
    JoinParams {
        q_begin: 0,
        q_count: 0,
        q_stride: 1,
        capacity: 0,
        flags: 0,
        n_cells: 0,
        budget: 0,
        log_cells: 0,
        thr: T::ZERO,
        window: T::ZERO,
        thr_reject: T::ZERO,
        dot_cutoff: T::ZERO,
        lists: 0,
        shift: 0,
        radius: 0,
        rank_lo: 0,
        rank_hi: 0,
        k: 0,
        stop_lo: 0,
        stop_hi: 0,
        lanes: 1,
        reserved: 0,
    }
}

/// The query side on the device: coordinates and quantised rows by id, and position ->
/// id (`ids[offset ..]`).
pub(super) struct QuerySide {
    pub n: usize,
    pub coords: Arc<Buffer>,
    pub rows: Arc<Buffer>,
    pub ids: Arc<Buffer>,
}

impl QuerySide {
    /// Queries of the indexed set itself, in the order of its first Z-list (neighbouring
    /// threads then walk neighbouring intervals): positions are internal ids.
    pub fn of_index(index: &ZIndex) -> QuerySide {
        QuerySide {
            n: index.n,
            coords: index.coords.clone(),
            rows: index.rows.clone(),
            ids: index.ids.clone(),
        }
    }

    /// Queries of another set, in input order; `rows` only where the kernels need them.
    pub fn upload<T: Coord>(
        lss: &Lss,
        data: &Dataset,
        quant: Option<&Quantizer>,
    ) -> Result<QuerySide> {
        let ids: Vec<u32> = (0..data.len() as u32).collect();
        Ok(QuerySide {
            n: data.len(),
            coords: lss.upload(coords_of::<T>(data), "query points")?,
            rows: match quant {
                Some(q) => lss.upload(&q.rows(data), "quantised query rows")?,
                None => lss.dummy.clone(),
            },
            ids: lss.upload(&ids, "query order")?,
        })
    }

    /// Position -> id for positions [start, start + len).
    pub fn ids_range(&self, start: usize, len: usize) -> BufferRange {
        self.ids.slice(start as u64 * 4, len as u64 * 4)
    }
}

/// Query blocks: positions [start, end), each at most `MAX_BLOCK` (also within the
/// binding limit of two uvec4 states per position). Testing knob:
/// `SIMJOIN_GPU_LSS_BLOCK=N` caps blocks at N positions (rounded to a multiple of 64).
pub(super) fn blocks(ctx: &Context, n: usize) -> Vec<(usize, usize)> {
    let by_binding = (ctx.limits().max_storage_buffer_range / 32) as usize;
    let cap = std::env::var("SIMJOIN_GPU_LSS_BLOCK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(MAX_BLOCK);
    // Multiples of 64 positions keep every block's id slice aligned for binding.
    let block = (MAX_BLOCK.min(by_binding).min(cap) / 64 * 64).max(64);
    (0..n)
        .step_by(block)
        .map(|s| (s, (s + block).min(n)))
        .collect()
}

/// Per-position arrays of one block.
pub(super) struct BlockArrays {
    pub offsets: Arc<Buffer>,
    pub ranges: Arc<Buffer>,
    pub states: Arc<Buffer>,
}

impl BlockArrays {
    pub fn new(lss: &Lss, len: usize) -> Result<BlockArrays> {
        Ok(BlockArrays {
            offsets: lss.buffer((len as u64 + 1) * 8, "output offsets")?,
            ranges: lss.buffer(len as u64 * 8, "query intervals")?,
            states: lss.buffer(len as u64 * 32, "query states")?,
        })
    }

    pub fn clear_states(&self, stream: &mut Stream, len: usize) -> Result<()> {
        stream.fill(&self.states, 0, len as u64 * 32, 0)?;
        stream.barrier()
    }
}

/// Where a query's output goes: chunks of consecutive ranks.
pub(super) struct Chunk {
    /// Query positions (of the block) with ranks in the chunk.
    pub queries: std::ops::Range<usize>,
    /// Ranks [first, first + len).
    pub first: u64,
    pub len: u64,
}

/// Chunks of at most `capacity` ranks over a block's exclusive prefix sums `offsets`
/// (len + 1 entries, the last the total): the paper's WALKINTERVALSCHUNKED, queries found
/// by binary search on the sums.
pub(super) fn chunks(offsets: &[u64], capacity: u64) -> Vec<Chunk> {
    let len = offsets.len() - 1;
    let total = offsets[len];
    let mut out = Vec::new();
    let mut first = 0u64;
    while first < total {
        let end = (first + capacity).min(total);
        // First query with a rank >= first: offsets[p + 1] > first.
        let qa = offsets[1..].partition_point(|&o| o <= first);
        // First query with no rank < end: offsets[p] >= end.
        let qb = offsets[..len].partition_point(|&o| o < end);
        out.push(Chunk {
            queries: qa..qb,
            first,
            len: end - first,
        });
        first = end;
    }
    out
}

/// Result buffer capacity (entries of `words` u32 pairs) for a caller's request.
pub(super) fn capacity_limit(ctx: &Context, requested: Option<usize>, words: u64) -> u64 {
    let by_binding = ctx.limits().max_storage_buffer_range / (8 * words);
    requested
        .map_or(DEFAULT_RESULT_ENTRIES, |c| c as u64)
        .min(by_binding)
        .min(u32::MAX as u64 / 4)
        .max(1)
}

/// A result buffer for `entries` entries of `words` slots, halved on device
/// out-of-memory down to 1024 entries.
pub(super) fn result_buffer(lss: &Lss, entries: u64, words: u64) -> Result<(Arc<Buffer>, u64)> {
    let mut entries = entries.max(1);
    loop {
        match lss.buffer(entries * words * 8, "results") {
            Ok(b) => return Ok((b, entries)),
            Err(e) if e.kind() == ErrorKind::OutOfDeviceMemory && entries > 1024 => {
                entries /= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Maps pairs of internal ids (the indexed side) back to the caller's: self-join both
/// members, ordered i < j; A ⋈ B the indexed member (first with `swap`, else second).
fn to_caller_ids(pairs: &mut [Pair], orig: &[u32], self_join: bool, swap: bool) {
    use rayon::prelude::*;
    pairs.par_iter_mut().for_each(|p| {
        if self_join {
            let (a, b) = (orig[p[0] as usize], orig[p[1] as usize]);
            *p = [a.min(b), a.max(b)];
        } else if swap {
            p[0] = orig[p[0] as usize];
        } else {
            p[1] = orig[p[1] as usize];
        }
    });
}

/// Seconds of each phase, for the report.
#[derive(Default)]
struct Phases {
    quantise_upload: f64,
    sort: f64,
    search: f64,
    count: f64,
    fill: f64,
    deliver: f64,
}

/// The LSS eps-join (`Algorithm::Lss`).
pub(super) fn run<T: Coord>(
    ctx: &Arc<Context>,
    job: &Job,
    mut sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport>
where
    JoinParams<T>: bytemuck::Pod,
{
    let opts = job.opts;
    let self_join = job.b.is_none();
    let mut report = JoinReport {
        backend: "vulkan".into(),
        device: ctx.device_name().to_string(),
        algorithm: Algorithm::Lss,
        ..Default::default()
    };
    let (na, nb) = (job.a.len(), job.b.map_or(job.a.len(), |b| b.len()));
    if na == 0 || nb == 0 || (self_join && na < 2) {
        report
            .notes
            .push("nothing to join: fewer than two points".into());
        return Ok(report);
    }
    // Index the smaller set (the paper's §V-C); pairs are swapped back to (A, B).
    let (r, q, swap) = match job.b {
        None => (job.a, job.a, false),
        Some(b) if b.len() <= job.a.len() => (b, job.a, false),
        Some(b) => (job.a, b, true),
    };
    let dim = r.dim();
    let mut ph = Phases::default();
    let mut lss = Lss::new(ctx, dim, opts.metric)?;
    lss.watch(&opts.control);
    for mode in [MODE_SEARCH, MODE_COUNT] {
        lss.check_budget(mode, 0)?;
    }
    let t = Instant::now();
    let quant = Quantizer::new(&job.a, job.b.as_ref());
    let (lists, lists_note) = choose_lists(ctx, opts.lss_lists, dim, r.len());
    report.notes.push(lists_note);
    ph.quantise_upload += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let index = ZIndex::build::<T>(&mut lss, &r, &quant, lists)?;
    let queries = if self_join {
        QuerySide::of_index(&index)
    } else {
        QuerySide::upload::<T>(&lss, &q, Some(&quant))?
    };
    ph.sort += t.elapsed().as_secs_f64();

    let thr: T = threshold(opts.metric, opts.eps);
    let radius = quant.radius(opts.metric, thr);
    let mut bits = flags::FLAG_Q_IDS;
    if self_join {
        bits |= flags::FLAG_SELF;
    }
    if swap {
        bits |= flags::FLAG_SWAP;
    }
    let base = JoinParams::<T> {
        flags: bits,
        n_cells: index.n as u32,
        budget: lss.budget,
        thr,
        lists: lists as u32,
        shift: index.shift,
        radius,
        ..params_zero()
    };
    let counting = sink.is_none();
    let cap_limit = capacity_limit(ctx, opts.result_buffer_pairs, 1);
    let mut results: Option<(Arc<Buffer>, u64)> = None;
    let (mut total_pairs, mut interval_sum, mut n_chunks, mut fill_passes) =
        (0u64, 0u64, 0usize, 0usize);
    let blocks = blocks(ctx, queries.n);
    let arrays = BlockArrays::new(&lss, blocks[0].1 - blocks[0].0)?;
    opts.control.stage("join", blocks.len() as u64);
    for &(start, end) in &blocks {
        opts.control.check()?;
        opts.control.advance(1, 0);
        let len = end - start;
        let mut b = Bindings {
            r_coords: Some(index.coords.all()),
            q_coords: Some(queries.coords.all()),
            cell_keys: Some(arrays.offsets.all()),
            cell_ranges: Some(arrays.ranges.all()),
            r_ids: Some(index.ids.all()),
            q_ids: Some(queries.ids_range(start, len)),
            q_cells: Some(queries.rows.all()),
            meta: Some(index.rows.all()),
            states: Some(arrays.states.all()),
            ..Default::default()
        };
        let pass = JoinParams::<T> {
            q_count: len as u32,
            ..base
        };
        let t = Instant::now();
        lss.stream.fill(&lss.counters, 8, 8, 0)?;
        arrays.clear_states(&mut lss.stream, len)?;
        lss.run(MODE_SEARCH, len, &b, &pass)?;
        let c = lss.counters()?;
        interval_sum += c[2] as u64 | (c[3] as u64) << 32;
        ph.search += t.elapsed().as_secs_f64();

        // Count; unless only counting, the count pass also writes the pairs while the
        // result buffer has room (all of them when the total fits: no fill pass then).
        let t = Instant::now();
        if !counting && results.is_none() {
            results = Some(result_buffer(&lss, cap_limit, 1)?);
        }
        let mut count = pass;
        if let Some((buffer, capacity)) = &results {
            b.results = Some(buffer.all());
            count.capacity = *capacity as u32;
        }
        lss.stream.fill(&lss.counters, 0, 4, 0)?;
        arrays.clear_states(&mut lss.stream, len)?;
        lss.run(MODE_COUNT, len, &b, &count)?;
        crate::vk::scan::exclusive_scan_u64_in_place(&mut lss.stream, &arrays.offsets, len)?;
        lss.stream.finish()?;
        let offsets: Vec<u64> = ctx.download(&arrays.offsets, 0, len + 1)?;
        let block_total = offsets[len];
        total_pairs += block_total;
        ph.count += t.elapsed().as_secs_f64();
        if counting || block_total == 0 {
            continue;
        }
        let (buffer, capacity) = results.clone().expect("allocated");
        if block_total <= capacity {
            let t = Instant::now();
            let mut pairs: Vec<Pair> = ctx.download(&buffer, 0, block_total as usize)?;
            to_caller_ids(&mut pairs, &index.orig, self_join, swap);
            if let Some(s) = sink.as_deref_mut() {
                s.push(&pairs).map_err(sink_error)?;
            }
            ph.deliver += t.elapsed().as_secs_f64();
            n_chunks += 1;
            continue;
        }

        // Fill: chunks of consecutive ranks that fit the result buffer.
        fill_passes += 1;
        arrays.clear_states(&mut lss.stream, len)?;
        for chunk in chunks(&offsets, capacity) {
            let t = Instant::now();
            let fill = JoinParams::<T> {
                q_begin: chunk.queries.start as u32,
                q_count: chunk.queries.len() as u32,
                capacity: capacity as u32,
                rank_lo: chunk.first as u32,
                rank_hi: (chunk.first >> 32) as u32,
                ..base
            };
            lss.run(MODE_FILL, chunk.queries.len(), &b, &fill)?;
            ph.fill += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let mut pairs: Vec<Pair> = ctx.download(&buffer, 0, chunk.len as usize)?;
            to_caller_ids(&mut pairs, &index.orig, self_join, swap);
            if let Some(s) = sink.as_deref_mut() {
                s.push(&pairs).map_err(sink_error)?;
            }
            ph.deliver += t.elapsed().as_secs_f64();
            n_chunks += 1;
        }
    }
    report.pairs = total_pairs;
    report.batches = n_chunks.max(1);
    let avg = interval_sum as f64 / queries.n as f64;
    report.notes.push(format!(
        "lss: shift {} and box radius {radius} (quantised units, range 2^31); average \
         interval {avg:.1} points ({:.2}% of the {} indexed); {} query block(s), {} output \
         chunk(s){}; {}",
        index.shift,
        100.0 * avg / index.n as f64,
        index.n,
        blocks.len(),
        n_chunks,
        results.map_or(String::new(), |(_, c)| format!(" of <= {c} pairs")),
        if fill_passes == 0 {
            "pairs written by the count pass (they fit the buffer)".to_string()
        } else {
            format!("{fill_passes} block(s) needed the scan + chunked fill")
        }
    ));
    report.notes.push(format!(
        "{} dispatches ({} resubmissions after queries stopped early){}",
        lss.dispatches,
        lss.resumed,
        if lss.budget != 0 {
            format!(
                ", software device: workgroup {}, loop budget {} per thread",
                lss.workgroup, lss.budget
            )
        } else {
            String::new()
        }
    ));
    report.phases = vec![
        ("quantise + upload".into(), ph.quantise_upload),
        ("sort (Z-lists)".into(), ph.sort),
        ("search (intervals)".into(), ph.search),
        ("output: count + scan".into(), ph.count),
        ("output: fill".into(), ph.fill),
        ("output: transfer + sink".into(), ph.deliver),
    ];
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_rank_once() {
        // Counts 0, 5, 0, 0, 12, 1, 0, 7 (a query bigger than the chunk).
        let counts = [0u64, 5, 0, 0, 12, 1, 0, 7];
        let mut offsets = vec![0u64];
        for c in counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        for cap in [1u64, 3, 4, 5, 7, 25, 100] {
            let cs = chunks(&offsets, cap);
            let mut next = 0;
            for c in &cs {
                assert_eq!(c.first, next);
                assert!(c.len >= 1 && c.len <= cap);
                next += c.len;
                // Every query with a rank in the chunk is in its range; the others in it
                // have no matches.
                for (p, w) in offsets.windows(2).enumerate() {
                    let overlaps = w[0] < c.first + c.len && w[1] > c.first;
                    if overlaps {
                        assert!(c.queries.contains(&p), "cap {cap} p {p}");
                    } else if c.queries.contains(&p) {
                        assert_eq!(w[0], w[1], "cap {cap} p {p}");
                    }
                }
            }
            assert_eq!(next, 25);
        }
        assert!(chunks(&[0, 0, 0], 4).is_empty());
    }
}
