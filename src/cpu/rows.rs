//! The CSR of a grid join built from whole rows, with no pair list: the join searches every
//! adjacent cell of each query point (the full stencil, not the self-join's half), so one
//! worker finds a point's whole row at once; it writes the row's neighbour ids into its
//! own blocks (with their distances, from the store's points still in cache, and sorted
//! there, in L1, where asked) and, at the end, each row is copied into its place in the
//! CSR, rows in id order. A query point appears in exactly one work item, so every row is
//! written by one worker, once.
//!
//! Against bucketing both directions of each unicomp pair (`radix::CsrSink`): twice the
//! distance computations, but 4 bytes written per entry instead of a bucketed entry plus a
//! row scatter and a sort of each bucket, and distances without a pass of random reads
//! (`bench/RESULTS_BENCH.md`, 2026-11-25 evening).

use super::emit::Hits;
use super::store::{MetricKind, Store, LANES};
use crate::error::{Error, ErrorKind, Result};
use crate::metric::Coord;
use crate::result::radix::SmallRows;
use crate::result::Csr;
use rayon::prelude::*;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Entries of a writer's first block at most (4 MiB of ids, on huge pages), and at least;
/// each next one is twice as large, up to `BLOCK_MAX`.
const BLOCK_MIN: usize = 1 << 20;
const BLOCK_FLOOR: usize = 1 << 12;
const BLOCK_MAX: usize = 1 << 23;
/// Rows copied into place per task (and lengths summed per task).
const COPY_ROWS: usize = 4096;
/// Rows ahead whose source the copy prefetches.
const AHEAD: usize = 8;
/// Where a row starts: its block's number above `START_BITS` bits of its place there.
const START_BITS: u32 = 40;
const MAX_BLOCKS: u32 = 1 << (64 - START_BITS);

/// Rows of one writer, in the order written.
struct Block<T> {
    /// Its number, in the order blocks were made.
    no: u32,
    ids: Vec<u32>,
    /// Each entry's distance, when asked (else empty).
    dists: Vec<T>,
}

impl<T> Block<T> {
    /// Not yet a block: no room (the first hit makes one).
    fn none() -> Self {
        Block {
            no: u32::MAX,
            ids: Vec::new(),
            dists: Vec::new(),
        }
    }
}

/// What every writer of one join shares: what each row keeps, where each row is, the
/// finished blocks, and the first failure (an allocation, or an internal error).
pub(crate) struct Rows<'s, T> {
    /// A self-join's row keeps the point itself (the diagonal); else its hit is dropped.
    keep_self: bool,
    /// Each row sorted by neighbour id.
    sort: Option<SmallRows>,
    /// With distances: the index's store, where each neighbour's coordinates are.
    store: Option<&'s Store<T>>,
    /// A writer's first block and its largest, in entries.
    block_min: usize,
    block_max: usize,
    /// By query slot (the query index's order, in which the join gives the rows): 1 +
    /// the row's length once written, else 0. Written as each row ends, in the order the
    /// work items run, so nearly in sequence (by id, the same writes missed the cache:
    /// 40% more join time in 2-D).
    lens: Vec<AtomicU32>,
    /// By query slot: where its row starts (block number, place; see `START_BITS`).
    starts: Vec<AtomicU64>,
    /// Rows recorded, summed as writers are dropped.
    recorded: AtomicUsize,
    /// Blocks made so far (their numbers).
    blocks_made: AtomicU32,
    /// Writers' rows, handed back when a rayon job ends and taken up by the next one: a
    /// few large blocks per thread rather than small ones per job.
    states: Mutex<Vec<WriterState<T>>>,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl<'s, T: Coord + Default> Rows<'s, T> {
    /// `n` rows of neighbour ids below `cols`; `self_join`: a query's own id is a hit only
    /// where `include_self`; `distances`: each entry's distance to its row's point, from
    /// the points of `store` (the index the join searches).
    pub fn new(
        n: usize,
        cols: usize,
        self_join: bool,
        include_self: bool,
        sorted: bool,
        distances: Option<&'s Store<T>>,
    ) -> Result<Self> {
        let nbr_bits = u32::BITS - (cols.saturating_sub(1) as u32).leading_zeros();
        let (lens, starts) = places(n)?;
        Ok(Rows {
            keep_self: !self_join || include_self,
            sort: sorted.then(|| SmallRows::new(nbr_bits)),
            store: distances,
            block_min: BLOCK_MIN,
            block_max: BLOCK_MAX,
            lens,
            starts,
            blocks_made: AtomicU32::new(0),
            recorded: AtomicUsize::new(0),
            states: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        })
    }

    /// First blocks sized for rows of about `per_row` entries over `workers` writers (a
    /// small join does not take, nor fault in, 4 MiB a writer).
    pub fn expect(mut self, per_row: usize, workers: usize) -> Self {
        let each = self.lens.len().saturating_mul(per_row) / workers.max(1);
        self.block_min = each.next_power_of_two().clamp(BLOCK_FLOOR, self.block_max);
        self
    }

    /// A worker's writer, distances in metric `M`; it hands its rows back when dropped.
    pub fn writer<M: MetricKind>(&self) -> RowWriter<'_, 's, T, M> {
        let state = self.states.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let state = state.unwrap_or(WriterState {
            blocks: Vec::new(),
            cur: Block::none(),
            next_cap: self.block_min,
        });
        RowWriter {
            home: self,
            recorded: 0,
            row_start: state.cur.ids.len(),
            state,
            metric: PhantomData,
        }
    }

    fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    /// The row of query slot `qslot` is `len` entries from `start` in block `no`; a row
    /// given twice, or one beyond the rows, stops the join with an internal error (never
    /// a wrong CSR).
    #[inline]
    fn record(&self, qslot: usize, no: u32, start: usize, len: usize) {
        let broken =
            |what: &str| self.fail(Error::new(ErrorKind::Internal, format!("CSR rows: {what}")));
        let (Some(slot), Some(at)) = (self.lens.get(qslot), self.starts.get(qslot)) else {
            return broken("a row beyond n");
        };
        let Ok(len1) = u32::try_from(len + 1) else {
            return broken("a row of 2^32 - 1 entries or more");
        };
        if (start as u64) >> START_BITS != 0 {
            return broken("a block of 2^40 entries or more");
        }
        // A plain load and store (an atomic swap stalls on the block writes before it):
        // a row given twice by two writers at once is still caught, by the count of rows.
        if slot.load(Ordering::Relaxed) != 0 {
            return broken("a row given twice");
        }
        at.store(
            u64::from(no) << START_BITS | start as u64,
            Ordering::Relaxed,
        );
        slot.store(len1, Ordering::Relaxed);
    }

    /// The CSR, and its distances when asked: each row copied into place, rows in id
    /// order; `ids[s]` is the id of the query at slot `s`. Errors: the first failure of a
    /// writer; a row missing (a join that did not give each query point once, or `ids`
    /// not a permutation: an internal error, never a wrong CSR).
    pub fn finish(self, ids: &[u32]) -> Result<(Csr, Option<Vec<T>>)> {
        if let Some(e) = self.error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let n = self.lens.len();
        let broken = |what: &str| Error::new(ErrorKind::Internal, format!("CSR rows: {what}"));
        if self.recorded.into_inner() != n {
            return Err(broken("rows given other than once each"));
        }
        if ids.len() < n {
            return Err(broken("fewer query ids than rows"));
        }
        let with_distances = self.store.is_some();
        // Blocks by number; every number made is a block some writer handed back.
        let made = self.blocks_made.into_inner() as usize;
        let mut blocks: Vec<Option<Block<T>>> = (0..made).map(|_| None).collect();
        for state in self.states.into_inner().unwrap_or_else(|p| p.into_inner()) {
            for block in state.blocks.into_iter().chain([state.cur]) {
                if let Some(slot) = blocks.get_mut(block.no as usize) {
                    *slot = Some(block);
                }
            }
        }
        let blocks: Vec<Block<T>> = blocks
            .into_iter()
            .map(|b| b.ok_or_else(|| broken("a block lost")))
            .collect::<Result<_>>()?;
        // Each row's length and start from its slot to its id (on every thread; ids are
        // distinct, so each place is written once, and one never written is a row missing).
        let (lens, starts) = places(n)?;
        (0..n)
            .into_par_iter()
            .with_min_len(COPY_ROWS)
            .for_each(|s| {
                let r = ids[s] as usize;
                if let (Some(len), Some(start)) = (lens.get(r), starts.get(r)) {
                    start.store(self.starts[s].load(Ordering::Relaxed), Ordering::Relaxed);
                    len.store(self.lens[s].load(Ordering::Relaxed), Ordering::Relaxed);
                }
            });
        drop(self.lens);
        drop(self.starts);
        // Offsets: the lengths summed per run of rows, the runs' totals summed, then each
        // run's running sums (on every thread).
        let len_of = |r: usize| lens[r].load(Ordering::Relaxed).wrapping_sub(1);
        let run_totals: Vec<Option<u64>> = (0..n.div_ceil(COPY_ROWS))
            .into_par_iter()
            .map(|run| {
                let mut sum = 0u64;
                for r in run * COPY_ROWS..((run + 1) * COPY_ROWS).min(n) {
                    let len = len_of(r);
                    if len == u32::MAX {
                        return None;
                    }
                    sum += u64::from(len);
                }
                Some(sum)
            })
            .collect();
        let mut offsets = crate::result::huge::zeroed(n + 1, 0u64);
        let mut run_starts = Vec::with_capacity(run_totals.len());
        let mut total = 0u64;
        for t in run_totals {
            run_starts.push(total);
            total += t.ok_or_else(|| broken("a row missing"))?;
        }
        offsets[n] = total;
        offsets[..n]
            .par_chunks_mut(COPY_ROWS)
            .zip(run_starts.par_iter())
            .enumerate()
            .for_each(|(run, (offs, &s))| {
                let mut at = s;
                for (i, o) in offs.iter_mut().enumerate() {
                    *o = at;
                    at += u64::from(len_of(run * COPY_ROWS + i));
                }
            });
        let total = total as usize;
        let oom = |what: &str| {
            Error::new(
                ErrorKind::OutOfHostMemory,
                format!("cannot allocate a CSR's {total} {what}"),
            )
        };
        let mut neighbors: Vec<u32> = Vec::new();
        neighbors
            .try_reserve_exact(total)
            .map_err(|_| oom("entries"))?;
        crate::result::huge::advise(&mut neighbors);
        let mut dists: Vec<T> = Vec::new();
        if with_distances {
            dists
                .try_reserve_exact(total)
                .map_err(|_| oom("distances"))?;
            crate::result::huge::advise(&mut dists);
        }
        // Tasks of COPY_ROWS rows, each writing its own run of the (not yet initialised)
        // arrays in order: fresh pages are touched front to back.
        let mut rest = &mut neighbors.spare_capacity_mut()[..total];
        let mut rest_d = &mut dists.spare_capacity_mut()[..if with_distances { total } else { 0 }];
        let mut tasks = Vec::with_capacity(n.div_ceil(COPY_ROWS));
        for r0 in (0..n).step_by(COPY_ROWS) {
            let r1 = (r0 + COPY_ROWS).min(n);
            let len = (offsets[r1] - offsets[r0]) as usize;
            let (head, tail) = rest.split_at_mut(len);
            rest = tail;
            let (head_d, tail_d) = rest_d.split_at_mut(if with_distances { len } else { 0 });
            rest_d = tail_d;
            tasks.push((r0..r1, head, head_d));
        }
        // A row's ids and distances (empty when not asked), checked: a bad place is an
        // error, not a panic.
        let row_of = |r: usize| -> Option<(&[u32], &[T])> {
            let len = len_of(r) as usize;
            if len == 0 {
                return Some((&[], &[]));
            }
            let at = starts[r].load(Ordering::Relaxed);
            let block = blocks.get((at >> START_BITS) as usize)?;
            let start = (at & ((1 << START_BITS) - 1)) as usize;
            let ids = block.ids.get(start..start + len)?;
            let dists = if with_distances {
                block.dists.get(start..start + len)?
            } else {
                &[]
            };
            Some((ids, dists))
        };
        tasks.into_par_iter().try_for_each(|(rows, seg, seg_d)| {
            let mut w = 0;
            for r in rows.clone() {
                // Rows lie at random in the blocks: fetch one a few rows ahead.
                if r + AHEAD < rows.end {
                    if let Some((ids, dists)) = row_of(r + AHEAD) {
                        super::prefetch(ids);
                        super::prefetch(dists);
                    }
                }
                let (ids, dists) = row_of(r).ok_or_else(|| broken("a row's place"))?;
                let len = ids.len();
                copy_into(&mut seg[w..w + len], ids);
                if with_distances {
                    copy_into(&mut seg_d[w..w + len], dists);
                }
                w += len;
            }
            // Every element of the task's runs written (checked before `set_len`).
            assert_eq!(w, seg.len());
            assert_eq!(if with_distances { w } else { 0 }, seg_d.len());
            Ok::<(), Error>(())
        })?;
        // SAFETY: the tasks split 0..total (offsets are running sums from 0 to total), and
        // each asserted it wrote every element of its runs (of the distances too, when
        // asked), so all `total` of each array are initialised.
        unsafe {
            neighbors.set_len(total);
            if with_distances {
                dists.set_len(total);
            }
        }
        // The blocks to the scratch pool, for the next join's writers (`scratch.rs`).
        let (ids, dists_blocks): (Vec<Vec<u32>>, Vec<Vec<T>>) =
            blocks.into_iter().map(|b| (b.ids, b.dists)).unzip();
        crate::result::scratch::give(ids);
        crate::result::scratch::give(dists_blocks);
        Ok((Csr { offsets, neighbors }, with_distances.then_some(dists)))
    }
}

/// Where `n` rows lie, all zero: 1 + length (0: not given) and start, each.
fn places(n: usize) -> Result<(Vec<AtomicU32>, Vec<AtomicU64>)> {
    let mut lens = Vec::new();
    let mut starts = Vec::new();
    lens.try_reserve_exact(n)
        .and_then(|_| starts.try_reserve_exact(n))
        .map_err(|_| {
            Error::new(
                ErrorKind::OutOfHostMemory,
                format!("cannot allocate the places of a CSR's {n} rows"),
            )
        })?;
    // Filled in place (the room is reserved: no reallocation), on every thread.
    lens.par_extend((0..n).into_par_iter().map(|_| AtomicU32::new(0)));
    starts.par_extend((0..n).into_par_iter().map(|_| AtomicU64::new(0)));
    Ok((lens, starts))
}

/// `dst = src`, into memory not yet initialised.
fn copy_into<E: Copy>(dst: &mut [std::mem::MaybeUninit<E>], src: &[E]) {
    assert_eq!(dst.len(), src.len());
    // SAFETY: same lengths (asserted), MaybeUninit<E> has E's layout, and the two do not
    // overlap (`dst` is a fresh allocation's spare capacity).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
}

/// One worker's rows: full blocks, the block being written, the next block's size.
struct WriterState<T> {
    blocks: Vec<Block<T>>,
    cur: Block<T>,
    next_cap: usize,
}

/// The rows of one rayon job.
pub(crate) struct RowWriter<'r, 's, T, M> {
    home: &'r Rows<'s, T>,
    state: WriterState<T>,
    /// Where the row being written starts in `state.cur.ids`.
    row_start: usize,
    /// Rows this job recorded.
    recorded: usize,
    metric: PhantomData<M>,
}

impl<T: Coord + Default, M> RowWriter<'_, '_, T, M> {
    /// A new block, the row being written moved to its front; false when out of memory
    /// (the join is stopped).
    #[cold]
    fn grow(&mut self) -> bool {
        let home = self.home;
        let with_distances = home.store.is_some();
        let st = &mut self.state;
        let partial = st.cur.ids.len() - self.row_start;
        let cap = st.next_cap.max(2 * partial + LANES);
        st.next_cap = (st.next_cap * 2).min(home.block_max);
        let mut next = Block::none();
        let reserved = match crate::result::scratch::take_or_alloc(cap) {
            Some(ids) => {
                // Distances get at least the ids' room: a hit writes its distance wherever
                // its id fits.
                let room = ids.capacity();
                next.ids = ids;
                !with_distances
                    || crate::result::scratch::take_or_alloc(room)
                        .map(|d| next.dists = d)
                        .is_some()
            }
            None => false,
        };
        if !reserved {
            home.fail(Error::new(
                ErrorKind::OutOfHostMemory,
                format!("cannot allocate {cap} CSR entries"),
            ));
            return false;
        }
        next.no = home.blocks_made.fetch_add(1, Ordering::Relaxed);
        if next.no >= MAX_BLOCKS {
            home.fail(Error::new(
                ErrorKind::Internal,
                format!("CSR rows: more than {MAX_BLOCKS} blocks"),
            ));
            return false;
        }
        next.ids.extend_from_slice(&st.cur.ids[self.row_start..]);
        st.cur.ids.truncate(self.row_start);
        if with_distances {
            next.dists
                .extend_from_slice(&st.cur.dists[self.row_start..]);
            st.cur.dists.truncate(self.row_start);
        }
        let full = std::mem::replace(&mut st.cur, next);
        self.row_start = 0;
        if full.no != u32::MAX {
            st.blocks.push(full);
        }
        true
    }

    /// The ids' hits left-packed by one permute and written by one store, in AVX2.
    ///
    /// # Safety
    /// AVX2 must be available, `ids` must point at LANES readable u32 and the current block
    /// must have room for LANES more entries.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn push_avx2(&mut self, ids: *const u32, mask: u32) {
        use std::arch::x86_64::*;
        let v = _mm256_loadu_si256(ids as *const __m256i);
        let mask = (mask & 0xff) as usize;
        let pack = _mm256_loadu_si256(PACK8[mask].as_ptr() as *const __m256i);
        let len = self.state.cur.ids.len();
        debug_assert!(self.state.cur.ids.capacity() - len >= LANES);
        _mm256_storeu_si256(
            self.state.cur.ids.as_mut_ptr().add(len) as *mut __m256i,
            _mm256_permutevar8x32_epi32(v, pack),
        );
        self.state.cur.ids.set_len(len + mask.count_ones() as usize);
    }
}

/// The lanes of `ids` (LANES values) equal to `id`, as bits: by one AVX2 compare where
/// `AVX` (only on the path taken after AVX2 was detected).
#[inline(always)]
fn lanes_equal<const AVX: bool>(ids: &[u32], id: u32) -> u32 {
    let ids = &ids[..LANES];
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX is true only where AVX2 was detected; `ids` holds LANES values.
        return unsafe { lanes_equal_avx2(ids.as_ptr(), id) };
    }
    ids.iter()
        .enumerate()
        .fold(0, |m, (l, &x)| m | (((x == id) as u32) << l))
}

/// `lanes_equal` by one AVX2 compare.
///
/// # Safety
/// AVX2 must be available and `ids` must point at LANES readable u32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lanes_equal_avx2(ids: *const u32, id: u32) -> u32 {
    use std::arch::x86_64::*;
    let v = _mm256_loadu_si256(ids as *const __m256i);
    let eq = _mm256_cmpeq_epi32(v, _mm256_set1_epi32(id as i32));
    _mm256_movemask_ps(_mm256_castsi256_ps(eq)) as u32
}

/// For each 8-bit mask, the lanes that move the selected u32 to the front.
#[cfg(target_arch = "x86_64")]
static PACK8: [[u32; 8]; 256] = {
    let mut table = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut k = 0;
        let mut l = 0;
        while l < 8 {
            if m & (1 << l) != 0 {
                table[m][k] = l as u32;
                k += 1;
            }
            l += 1;
        }
        m += 1;
    }
    table
};

impl<T: Coord + Default, M: MetricKind> Hits<T> for RowWriter<'_, '_, T, M> {
    #[inline(always)]
    fn hits<const AVX: bool>(
        &mut self,
        q: &[T],
        qid: u32,
        slot: usize,
        ids: &[u32],
        mut mask: u32,
        _unique: bool,
    ) {
        let ids = &ids[..LANES];
        if self.state.cur.ids.capacity() - self.state.cur.ids.len() < LANES && !self.grow() {
            return;
        }
        if !self.home.keep_self {
            mask &= !lanes_equal::<AVX>(ids, qid);
        }
        if let Some(store) = self.home.store {
            // All eight lanes at once (the neighbours' coordinates were just read by the
            // kernel: in cache), then the hits' accumulators packed like their ids; they
            // become distances (the square root) when the row ends, packed: square roots
            // of every lane of every block with a hit took a fifth of the samples of a CSR
            // with distances (`bench/RESULTS_BENCH.md`, 2026-11-26 midday).
            let fin = store.lane_accs_of::<M, AVX>(q, slot);
            let dists = &mut self.state.cur.dists;
            let len = dists.len();
            // Room: `dists` grows with `ids` (`grow`), which has LANES spare.
            let spare = &mut dists.spare_capacity_mut()[..LANES];
            let mut k = 0;
            for (l, &d) in fin.iter().enumerate() {
                spare[k].write(d);
                k += ((mask >> l) & 1) as usize;
            }
            // SAFETY: the first k <= LANES spare entries were written above.
            unsafe { dists.set_len(len + k) };
        }
        #[cfg(target_arch = "x86_64")]
        if AVX {
            // SAFETY: AVX is true only on the path taken after detecting AVX2; `ids` holds
            // LANES values and the block has room for LANES more (checked above).
            unsafe { self.push_avx2(ids.as_ptr(), mask) };
            return;
        }
        let len = self.state.cur.ids.len();
        let spare = &mut self.state.cur.ids.spare_capacity_mut()[..LANES];
        // Every lane written, the end advanced past hits only: no branch per hit.
        let mut k = 0;
        for (l, &id) in ids.iter().enumerate() {
            spare[k].write(id);
            k += ((mask >> l) & 1) as usize;
        }
        // SAFETY: the first k <= LANES spare entries were written above.
        unsafe { self.state.cur.ids.set_len(len + k) };
    }

    #[inline]
    fn end_query(&mut self, qslot: usize) {
        let end = self.state.cur.ids.len();
        if self.home.store.is_some() && M::METRIC == crate::options::Metric::Euclidean {
            // The row's accumulators to distances (`metric::finish`): one vectorised pass.
            for d in &mut self.state.cur.dists[self.row_start..end] {
                *d = crate::metric::finish(M::METRIC, *d);
            }
        }
        if let Some(sort) = &self.home.sort {
            let cur = &mut self.state.cur;
            let dists = if self.home.store.is_none() {
                &mut [][..]
            } else {
                &mut cur.dists[self.row_start..end]
            };
            sort.sort_with(&mut cur.ids[self.row_start..end], dists);
        }
        let (no, start) = (self.state.cur.no, self.row_start);
        self.home.record(qslot, no, start, end - start);
        self.recorded += 1;
        self.row_start = end;
    }

    #[inline]
    fn stopped(&self) -> bool {
        self.home.failed.load(Ordering::Relaxed)
    }
}

impl<T, M> Drop for RowWriter<'_, '_, T, M> {
    fn drop(&mut self) {
        let state = std::mem::replace(
            &mut self.state,
            WriterState {
                blocks: Vec::new(),
                cur: Block::none(),
                next_cap: 0,
            },
        );
        self.home
            .recorded
            .fetch_add(self.recorded, Ordering::Relaxed);
        let mut states = self.home.states.lock().unwrap_or_else(|p| p.into_inner());
        states.push(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::store::Euclid;

    /// Rows given to writers with tiny blocks (rows moved to a new block part-written,
    /// rows longer than a block), in two jobs, the scalar and the AVX2 hits: the CSR is
    /// exactly the rows given, in id order, sorted where asked, the own id dropped unless
    /// kept; a row given twice or never is an error, never a CSR.
    #[test]
    fn rows_land_in_place_through_small_blocks() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let n = 60usize;
        let rows: Vec<Vec<u32>> = (0..n)
            .map(|_| (0..next() % 70).map(|_| next() % 500).collect())
            .collect();
        let mut shuffled = || {
            let mut o: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                o.swap(i, next() as usize % (i + 1));
            }
            o
        };
        // Rows given in one random order, each at its query slot of another (the id at
        // slot s is ids[s]).
        let order = shuffled();
        let ids: Vec<u32> = shuffled().into_iter().map(|r| r as u32).collect();
        let mut slot_of = vec![0; n];
        for (s, &r) in ids.iter().enumerate() {
            slot_of[r as usize] = s;
        }
        for avx in [false, true] {
            if avx && !crate::cpu::avx2_available() {
                continue;
            }
            for (keep_self, sorted) in [(true, false), (false, true), (true, true)] {
                let mut home = Rows::<f64>::new(n, 500, !keep_self, false, sorted, None).unwrap();
                (home.block_min, home.block_max) = (8, 32);
                let give = |w: &mut RowWriter<f64, Euclid>, r: usize| {
                    // Eight lanes at a time, a random mask; the lanes beyond the row repeat
                    // its ids with their bits clear.
                    let row = &rows[r];
                    let mut k = 0;
                    while k < row.len() {
                        let lanes: Vec<u32> =
                            (0..LANES).map(|l| row[(k + l) % row.len()]).collect();
                        let take = (row.len() - k).min(LANES);
                        let mask = (1u32 << take) - 1;
                        if avx {
                            w.hits::<true>(&[], r as u32, 0, &lanes, mask, false);
                        } else {
                            w.hits::<false>(&[], r as u32, 0, &lanes, mask, false);
                        }
                        k += take;
                    }
                    w.end_query(slot_of[r]);
                };
                // Two jobs; the second takes up the first's writer state.
                {
                    let mut w = home.writer::<Euclid>();
                    for &r in &order[..n / 2] {
                        give(&mut w, r);
                    }
                }
                {
                    let mut w = home.writer::<Euclid>();
                    for &r in &order[n / 2..] {
                        give(&mut w, r);
                    }
                }
                let (csr, d) = home.finish(&ids).unwrap();
                assert!(d.is_none());
                let mut at = 0;
                for (r, row) in rows.iter().enumerate() {
                    let mut want: Vec<u32> = row
                        .iter()
                        .copied()
                        .filter(|&j| keep_self || j != r as u32)
                        .collect();
                    let got = &csr.neighbors[csr.offsets[r] as usize..csr.offsets[r + 1] as usize];
                    assert_eq!(csr.offsets[r], at);
                    at += want.len() as u64;
                    // Unsorted rows keep the order given.
                    if sorted {
                        want.sort_unstable();
                    }
                    assert_eq!(got, &want[..], "row {r} avx {avx} sorted {sorted}");
                }
                assert_eq!(csr.offsets[n], at);
            }
        }
        // A row given twice, one missing, one beyond the rows, or slots whose ids are not
        // a permutation: errors.
        let rows_given = |given: &[usize], ids: &[u32]| {
            let home = Rows::<f64>::new(2, 10, false, false, false, None).unwrap();
            {
                let mut w = home.writer::<Euclid>();
                for &s in given {
                    w.end_query(s);
                }
            }
            home.finish(ids).map(|(csr, _)| csr)
        };
        assert_eq!(rows_given(&[1, 0], &[1, 0]).unwrap().offsets, [0, 0, 0]);
        for (given, ids) in [
            (&[1, 1][..], &[0, 1][..]),
            (&[0], &[0, 1]),
            (&[0, 1, 2], &[0, 1]),
            (&[0, 1], &[1, 1]),
            (&[0, 1], &[0]),
        ] {
            let e = rows_given(given, ids).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Internal, "{given:?} {ids:?}: {e}");
        }
    }
}
