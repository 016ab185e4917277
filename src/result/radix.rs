//! Parallel radix sorts of join pairs: lexicographic `(i, j)` order, and the CSR (rows of
//! neighbours) built from pairs without a comparison sort.
//!
//! One most-significant-digit pass scatters the entries into buckets by a top digit (a
//! histogram per chunk gives every chunk its own disjoint output ranges: no atomics, no
//! locks), then every bucket, small enough for the cache, is sorted on its own, in
//! parallel, by least-significant-digit passes. That is a few passes over memory where a
//! comparison sort makes log n; the price is one buffer as large as the entries.

use crate::error::{Error, ErrorKind, Result};
use crate::result::{Csr, Pair};
use rayon::prelude::*;

/// Below this many entries, one comparison sort is as fast.
const SMALL: usize = 1 << 15;
/// Aim for buckets of about this many entries (256 KiB: they sort inside L2; measured
/// against 2^13 and 2^17 on 16M join-like pairs).
const BUCKET_PAIRS: usize = 1 << 15;
/// At most 2^16 buckets (the per-chunk histograms stay small).
const MAX_DIGIT_BITS: u32 = 16;

/// Sorts `pairs` lexicographically.
pub fn sort_pairs(pairs: &mut Vec<Pair>) {
    let (max_i, max_j) = maxima(pairs);
    let j_bits = bits(max_j);
    let key_bits = bits(max_i) + j_bits;
    let key = |p: &Pair| (u64::from(p[0]) << j_bits) | u64::from(p[1]);
    let digit_bits = digit_bits(pairs.len(), key_bits);
    // Too few buckets to keep the threads busy: a parallel comparison sort does better.
    if digit_bits == 0 {
        pairs.par_sort_unstable_by_key(key);
        return;
    }
    // More, smaller buckets where that lets the bits below the digit fit 32.
    let digit_bits = digit_bits.max(key_bits.saturating_sub(32).min(MAX_DIGIT_BITS));
    let shift = key_bits - digit_bits;
    if shift > 32 {
        scatter_then_lsd(pairs, key_bits, digit_bits, &key);
        return;
    }
    // Packed: the scatter writes each pair's low key bits as one u32 (half the bytes
    // of the pair), the buckets sort those, and the pairs are rebuilt in place from
    // bucket and low bits (1M uniform 2-D points, 16M pairs: see RESULTS_BENCH.md).
    let low = (1u64 << shift) - 1;
    let (mut packed, starts) = scatter(
        pairs,
        false,
        1 << digit_bits,
        |p| (key(p) >> shift) as usize,
        |p| (key(p) & low) as u32,
        |_| 0,
    );
    let j_mask = (1u64 << j_bits) - 1;
    split_mut(&mut packed, &starts)
        .into_par_iter()
        .zip(split_mut(pairs, &starts))
        .enumerate()
        .for_each_init(Vec::new, |scratch, (b, (ks, out))| {
            lsd(ks, scratch, shift, &|&k: &u32| u64::from(k));
            let high = (b as u64) << shift;
            for (o, &k) in out.iter_mut().zip(ks.iter()) {
                let full = high | u64::from(k);
                *o = [(full >> j_bits) as u32, (full & j_mask) as u32];
            }
        });
}

/// Entries of a bucket's first block in [`Buckets`]; each next one is twice as large, up
/// to `BLOCK` (16 KiB) and to an equal share of `OPEN_ENTRIES` (32 MiB) among the buckets,
/// so that a small join's buckets stay small and partly filled blocks never hold much.
const FIRST_BLOCK: usize = 64;
const BLOCK: usize = 1 << 12;
const OPEN_ENTRIES: usize = 1 << 23;

/// Entries of the first slab [`Buckets`] carves its blocks from; each next slab is twice
/// as large, up to `SLAB` (32 MiB).
const FIRST_SLAB: usize = 1 << 16;
const SLAB: usize = 1 << 23;

/// Entries a bucket stages before they go to its block: one 64-byte cache line.
const LINE: usize = 16;

/// A bucket's staged entries, on a cache line of its own.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; LINE]);

/// The streaming sinks' store: u32 entries appended to one of many buckets, each bucket a
/// list of blocks (never moved once written, so growing costs no copies). Entries are
/// staged a cache line per bucket (all the lines stay in L1/L2) and a full line goes to
/// its block with streaming stores: a direct write to each of a thousand block tails
/// missed the cache on nearly every line (a CSR's 32M entries: 4 ns an entry that way,
/// 3 with the lines). The blocks are carved from a few large slabs advised onto huge
/// pages, each block a whole number of lines on line boundaries.
struct Buckets {
    /// Entries of a bucket's largest block.
    block: usize,
    lines: Vec<Line>,
    /// Entries staged in each bucket's line.
    staged: Vec<u32>,
    /// Where each bucket's next line goes, and the end of its block.
    tail: Vec<*mut u32>,
    end: Vec<*mut u32>,
    /// Each bucket's blocks, as (start, length) in the slabs; the last one's length is
    /// only final once it is full or the buckets are closed.
    blocks: Vec<Vec<(*const u32, usize)>>,
    /// The memory every block lies in, and how much of the last slab is handed out.
    slabs: Vec<Vec<u32>>,
    used: usize,
}

// SAFETY: the raw pointers all point into `slabs`, owned by the same value (never shared,
// never reallocated while it lives), so sending a `Buckets` sends its memory with it.
unsafe impl Send for Buckets {}

impl Buckets {
    fn new(count: usize) -> Self {
        Buckets {
            block: (OPEN_ENTRIES / count).clamp(FIRST_BLOCK, BLOCK),
            lines: vec![Line([0; LINE]); count],
            staged: vec![0; count],
            tail: vec![std::ptr::null_mut(); count],
            end: vec![std::ptr::null_mut(); count],
            blocks: vec![Vec::new(); count],
            slabs: Vec::new(),
            used: 0,
        }
    }

    #[inline(always)]
    fn push(&mut self, b: usize, entry: u32) -> anyhow::Result<()> {
        let k = self.staged[b] as usize;
        self.lines[b].0[k % LINE] = entry;
        if k + 1 < LINE {
            self.staged[b] = k as u32 + 1;
            return Ok(());
        }
        self.staged[b] = 0;
        self.spill(b)
    }

    /// Writes bucket b's full line to its block.
    #[inline]
    fn spill(&mut self, b: usize) -> anyhow::Result<()> {
        if self.tail[b] == self.end[b] {
            self.next_block(b)?;
        }
        let src = &self.lines[b];
        let dst = self.tail[b];
        // SAFETY: `dst..dst + LINE` lies in bucket b's block (blocks are whole lines, and
        // tail < end was just made true), which lies in a live slab and is written by this
        // bucket only; it is 64-byte aligned (`next_block`), as the streaming stores need.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
                let (s, d) = (src.0.as_ptr() as *const __m128i, dst as *mut __m128i);
                for q in 0..4 {
                    _mm_stream_si128(d.add(q), _mm_load_si128(s.add(q)));
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            std::ptr::copy_nonoverlapping(src.0.as_ptr(), dst, LINE);
            self.tail[b] = dst.add(LINE);
        }
        Ok(())
    }

    #[cold]
    fn next_block(&mut self, b: usize) -> anyhow::Result<()> {
        // The open block's length is final now.
        if let Some(last) = self.blocks[b].last_mut() {
            // SAFETY: tail and the block's start lie in the same block.
            last.1 = unsafe { self.tail[b].offset_from(last.0) as usize };
        }
        let size = match self.blocks[b].last() {
            Some(&(_, len)) => (2 * len).clamp(FIRST_BLOCK, self.block),
            None => FIRST_BLOCK.min(self.block),
        };
        if self
            .slabs
            .last()
            .is_none_or(|s| s.capacity() - self.used < size)
        {
            let len = self
                .slabs
                .last()
                .map_or(FIRST_SLAB, |s| (2 * s.capacity()).min(SLAB))
                .max(size + LINE);
            // Capacity only: blocks are written through pointers and read back only as far
            // as written, and fresh memory stays untouched until then. A slab an earlier
            // join left (`scratch`) saves the fresh memory's page faults.
            let slab: Vec<u32> = crate::result::scratch::take_or_alloc(len)
                .ok_or_else(|| anyhow::anyhow!("out of memory for the join's result"))?;
            // Blocks start on a cache line.
            self.used = slab.as_ptr().align_offset(std::mem::align_of::<Line>());
            self.slabs.push(slab);
        }
        let slab = self.slabs.last_mut().expect("a slab was just made");
        // SAFETY: `used + size <= slab.capacity()` (checked above): a fresh range of the
        // slab's buffer, handed to bucket b alone. The buffer never moves (never grown).
        let start = unsafe { slab.as_mut_ptr().add(self.used) };
        self.used += size;
        self.blocks[b].push((start, size));
        self.tail[b] = start;
        // SAFETY: inside the same slab (see above).
        self.end[b] = unsafe { start.add(size) };
        Ok(())
    }

    /// Moves every staged entry to its block and fixes the blocks' lengths: the store,
    /// now read-only, holding every entry pushed.
    fn close(mut self) -> Result<Closed> {
        for b in 0..self.staged.len() {
            let k = self.staged[b] as usize;
            if k > 0 {
                if self.tail[b] == self.end[b] {
                    self.next_block(b)
                        .map_err(|e| Error::new(ErrorKind::OutOfHostMemory, e.to_string()))?;
                }
                // SAFETY: a block has room for a whole line at its tail (see `spill`).
                unsafe {
                    std::ptr::copy_nonoverlapping(self.lines[b].0.as_ptr(), self.tail[b], k);
                    self.tail[b] = self.tail[b].add(k);
                }
                self.staged[b] = 0;
            }
            if let Some(last) = self.blocks[b].last_mut() {
                // SAFETY: tail and the block's start lie in the same block.
                last.1 = unsafe { self.tail[b].offset_from(last.0) as usize };
            }
        }
        // The streaming stores are weakly ordered: make them visible before other threads
        // read the blocks.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a fence has no memory-safety preconditions (SSE, part of x86_64).
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
        Ok(Closed {
            blocks: self.blocks,
            _slabs: self.slabs,
        })
    }
}

/// A closed [`Buckets`]: each bucket's blocks, in the order they were filled, to read.
struct Closed {
    /// (start, length) of each block, in `_slabs`.
    blocks: Vec<Vec<(*const u32, usize)>>,
    _slabs: Vec<Vec<u32>>,
}

// SAFETY: the pointers point into `_slabs`, owned by the value and never written again
// (nothing here writes), so sharing or sending it shares or sends only reads of memory it
// owns.
unsafe impl Send for Closed {}
// SAFETY: as for Send: every access through `&Closed` is a read.
unsafe impl Sync for Closed {}

impl Drop for Closed {
    /// The slabs go back to the scratch pool for the next join (`scratch.rs`).
    fn drop(&mut self) {
        // The blocks point into the slabs: dropped first, so nothing points into a slab
        // that another join is about to write.
        self.blocks = Vec::new();
        crate::result::scratch::give(std::mem::take(&mut self._slabs));
    }
}

impl Closed {
    /// Drops the store (its slabs to the scratch pool, any beyond its cap freed) on a
    /// worker of the calling thread pool (the engine's, through `CpuBackend::install`), so
    /// that the caller has its result first: unmapping the blocks' slabs took 3.6-4.0 ms
    /// of one thread while the other idled (128 MB, a 3-D sorted CSR of 1M points).
    /// Outside a pool (no workers to give it to, and rayon's global pool is not started
    /// for this) it is dropped here.
    fn free_later(self) {
        if rayon::current_thread_index().is_some() {
            rayon::spawn(move || drop(self));
        }
    }

    /// Each bucket's entry count.
    fn sizes(&self) -> Vec<usize> {
        self.blocks
            .iter()
            .map(|f| f.iter().map(|&(_, len)| len).sum())
            .collect()
    }

    /// Bucket b's blocks.
    fn bucket(&self, b: usize) -> Vec<&[u32]> {
        self.blocks[b]
            .iter()
            // SAFETY: `len` entries written before `close` (each block's length was fixed
            // to how far it was written), inside a slab that `self` owns and keeps alive
            // for the borrow.
            .map(|&(p, len)| unsafe { std::slice::from_raw_parts(p, len) })
            .collect()
    }
}

/// The sinks' check of each arriving pair: the buckets are sized for these bounds.
#[inline(always)]
fn within(i: u32, j: u32, rows: u32, cols: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        i < rows && j < cols,
        "pair ({i}, {j}) beyond the join's {rows} x {cols} points"
    );
    Ok(())
}

/// Bucket starts (and the total last) of buckets of `sizes` entries, each followed by
/// `gap(b)` more.
fn starts_of(sizes: &[usize], gap: impl Fn(usize) -> usize) -> Option<Vec<usize>> {
    let mut starts = Vec::with_capacity(sizes.len() + 1);
    let mut acc = 0usize;
    for (b, &s) in sizes.iter().enumerate() {
        starts.push(acc);
        acc = acc.checked_add(s)?.checked_add(gap(b))?;
    }
    starts.push(acc);
    Some(starts)
}

/// How a streaming sink turns each arriving pair into bucket entries.
trait Bucketing: Copy + Send {
    fn put(&self, buckets: &mut Buckets, chunk: &[Pair]) -> anyhow::Result<()>;
}

/// One part of a streaming sink: its own bucket store, pushed to by one worker at a time.
struct Part<K> {
    key: K,
    buckets: Buckets,
    pairs: usize,
}

impl<K: Bucketing> crate::result::PairSink for Part<K> {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self.key.put(&mut self.buckets, chunk)?;
        self.pairs += chunk.len();
        Ok(())
    }
}

/// A streaming sink's parts, one per worker that pushes (`PairSink::parts`): each worker
/// buckets its own pairs into its own store, in its own cache, where a single store had the
/// workers take turns at it (the bucketing was the join's bottleneck: 3 ns an entry,
/// serial) and moved its staging lines between the cores. The parts' blocks of a bucket
/// are read together at the end.
struct Parts<K> {
    key: K,
    count: usize,
    parts: Vec<Part<K>>,
}

impl<K: Bucketing> Parts<K> {
    fn new(key: K, count: usize) -> Self {
        let mut parts = Parts {
            key,
            count,
            parts: Vec::new(),
        };
        parts.add_part();
        parts
    }

    fn add_part(&mut self) {
        self.parts.push(Part {
            key: self.key,
            buckets: Buckets::new(self.count),
            pairs: 0,
        });
    }

    fn pairs(&self) -> usize {
        self.parts.iter().map(|p| p.pairs).sum()
    }

    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        crate::result::PairSink::push(&mut self.parts[0], chunk)
    }

    fn split(&mut self, workers: usize) -> Vec<&mut dyn crate::result::PairSink> {
        while self.parts.len() < workers {
            self.add_part();
        }
        self.parts
            .iter_mut()
            .map(|p| p as &mut dyn crate::result::PairSink)
            .collect()
    }

    /// Every part's store, closed, read as one.
    fn close(self) -> Result<Closed> {
        let mut all = Closed {
            blocks: vec![Vec::new(); self.count],
            _slabs: Vec::new(),
        };
        for part in self.parts {
            let mut closed = part.buckets.close()?;
            for (to, from) in all
                .blocks
                .iter_mut()
                .zip(std::mem::take(&mut closed.blocks))
            {
                to.extend(from);
            }
            all._slabs.append(&mut closed._slabs);
        }
        Ok(all)
    }
}

/// Sorted pairs built as a join streams them: the streaming form of [`sort_pairs`]. Each
/// arriving pair goes at once into a bucket by the top bits of its key `(i, j)`, as the
/// key's low bits in a u32, so the pairs are never stored unsorted; [`finish`] sorts each
/// bucket in cache and writes the pairs out in order. That is one 4-byte scatter a pair,
/// where collecting and then sorting stores 8 bytes a pair, reads them three times
/// (bounds, histogram, scatter) and scatters them.
///
/// [`finish`]: SortingSink::finish
pub(crate) struct SortingSink {
    parts: Parts<SortKey>,
}

/// A sorted-pairs sink's layout of a pair's key.
#[derive(Clone, Copy)]
struct SortKey {
    /// Every first element is below `rows`, every second below `cols`.
    rows: u32,
    cols: u32,
    j_bits: u32,
    /// Key bits below the bucket digit (at most 32: they are what a bucket stores).
    shift: u32,
}

impl Bucketing for SortKey {
    #[inline]
    fn put(&self, buckets: &mut Buckets, chunk: &[Pair]) -> anyhow::Result<()> {
        let low = (1u64 << self.shift) - 1;
        for &[i, j] in chunk {
            within(i, j, self.rows, self.cols)?;
            let key = (u64::from(i) << self.j_bits) | u64::from(j);
            buckets.push((key >> self.shift) as usize, (key & low) as u32)?;
        }
        Ok(())
    }
}

impl SortingSink {
    /// A sink for pairs `[i, j]` with `i < rows` and `j < cols`, or `None` where the keys
    /// would need more than 2^16 buckets (more than 2^24 points each side): then
    /// collect and [`sort_pairs`].
    pub(crate) fn new(rows: usize, cols: usize) -> Option<Self> {
        let rows = u32::try_from(rows).ok()?;
        let cols = u32::try_from(cols).ok()?;
        let (i_bits, j_bits) = (bits(rows.saturating_sub(1)), bits(cols.saturating_sub(1)));
        let key_bits = i_bits + j_bits;
        // 2^10 buckets by the key's top bits (16M pairs of 10^6 points: 16k pairs, 64 KiB,
        // a bucket, sorted inside L2), more where the bits below must fit 32.
        let digit = key_bits.saturating_sub(32).max(key_bits.min(10));
        if digit > MAX_DIGIT_BITS {
            return None;
        }
        let key = SortKey {
            rows,
            cols,
            j_bits,
            shift: key_bits - digit,
        };
        Some(SortingSink {
            parts: Parts::new(key, 1 << digit),
        })
    }

    /// Pairs pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.parts.pairs()
    }

    /// The pairs, lexicographically sorted (as [`sort_pairs`] sorts them).
    pub(crate) fn finish(self) -> Result<Vec<Pair>> {
        let SortKey { j_bits, shift, .. } = self.parts.key;
        let buckets = self.parts.close()?;
        let starts = starts_of(&buckets.sizes(), |_| 0).expect("entries held in memory");
        // Zeroed, so untouched until written, on huge pages where the kernel gives them.
        let mut out: Vec<Pair> = crate::result::huge::zeroed(starts[starts.len() - 1], [0, 0]);
        let j_mask = (1u64 << j_bits) - 1;
        split_mut(&mut out, &starts)
            .into_par_iter()
            .enumerate()
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |(keys, scratch), (b, dst)| {
                    keys.clear();
                    for block in buckets.bucket(b) {
                        keys.extend_from_slice(block);
                    }
                    lsd(keys, scratch, shift, &|&k: &u32| u64::from(k));
                    let high = (b as u64) << shift;
                    for (o, &k) in dst.iter_mut().zip(keys.iter()) {
                        let key = high | u64::from(k);
                        *o = [(key >> j_bits) as u32, (key & j_mask) as u32];
                    }
                },
            );
        buckets.free_later();
        Ok(out)
    }
}

impl crate::result::PairSink for SortingSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self.parts.push(chunk)
    }

    fn parts(&mut self, workers: usize) -> Vec<&mut dyn crate::result::PairSink> {
        self.parts.split(workers)
    }
}

/// The CSR built as a join streams its pairs: the streaming form of [`build_csr`]. Each
/// pair's entries (row i's neighbour j and, in a self-join, row j's neighbour i) go at once
/// into a bucket of rows by the row's top bits, as the row's low bits above the neighbour
/// in a u32; [`finish`] counts each bucket's rows, writes each entry's neighbour into its
/// row (a counting sort in cache, straight into the neighbour array) and sorts the rows'
/// neighbours where asked. Memory: the entries once in blocks, then the CSR.
///
/// [`finish`]: CsrSink::finish
pub(crate) struct CsrSink {
    diagonal: bool,
    sorted: bool,
    parts: Parts<CsrKey>,
}

/// A CSR sink's layout of an entry.
#[derive(Clone, Copy)]
struct CsrKey {
    rows: u32,
    cols: u32,
    self_join: bool,
    /// Row bits below the bucket digit, and the neighbour's bits below them.
    row_shift: u32,
    nbr_bits: u32,
}

impl CsrKey {
    #[inline(always)]
    fn put_one(&self, buckets: &mut Buckets, row: u32, nbr: u32) -> anyhow::Result<()> {
        let low = (1u32 << self.row_shift) - 1;
        // Below 2^32: the row's low bits and the neighbour fit (`CsrSink::new`).
        let entry = ((u64::from(row & low) << self.nbr_bits) | u64::from(nbr)) as u32;
        buckets.push((row >> self.row_shift) as usize, entry)
    }
}

impl Bucketing for CsrKey {
    #[inline]
    fn put(&self, buckets: &mut Buckets, chunk: &[Pair]) -> anyhow::Result<()> {
        for &[i, j] in chunk {
            within(i, j, self.rows, self.cols)?;
            self.put_one(buckets, i, j)?;
            if self.self_join {
                self.put_one(buckets, j, i)?;
            }
        }
        Ok(())
    }
}

impl CsrSink {
    /// A sink for the CSR of `rows` rows over `cols` columns (a self-join: `cols == rows`,
    /// each pair gives both directions, plus the diagonal when `include_self`), each row's
    /// neighbours ascending when `sorted`; `None` where a row's low bits and a neighbour
    /// would not fit 32 bits under 2^16 buckets: then collect and [`build_csr`].
    pub(crate) fn new(
        rows: usize,
        cols: usize,
        self_join: bool,
        include_self: bool,
        sorted: bool,
    ) -> Option<Self> {
        let rows = u32::try_from(rows).ok()?;
        let cols = u32::try_from(cols).ok()?;
        let row_bits = bits(rows.saturating_sub(1));
        let nbr_bits = bits(cols.saturating_sub(1));
        // 2^10 buckets of rows (10^6 rows of 32 neighbours: 32k entries, 128 KiB, a
        // bucket, sorted inside L2), more where the bits below must fit 32.
        let digit = (row_bits + nbr_bits)
            .saturating_sub(32)
            .max(row_bits.min(10));
        if digit > MAX_DIGIT_BITS {
            return None;
        }
        let key = CsrKey {
            rows,
            cols,
            self_join,
            row_shift: row_bits - digit,
            nbr_bits,
        };
        Some(CsrSink {
            diagonal: self_join && include_self,
            sorted,
            parts: Parts::new(key, 1 << digit),
        })
    }

    /// The CSR: rows in order, each row's neighbours ascending when sorted.
    pub(crate) fn finish(self) -> Result<Csr> {
        let CsrSink {
            diagonal,
            sorted,
            parts,
        } = self;
        let CsrKey {
            rows,
            row_shift,
            nbr_bits,
            ..
        } = parts.key;
        let buckets = parts.close()?;
        let rows = rows as usize;
        let rows_per_bucket = 1usize << row_shift;
        let bucket_rows =
            |b: usize| (b * rows_per_bucket).min(rows)..((b + 1) * rows_per_bucket).min(rows);
        let gap = |b: usize| if diagonal { bucket_rows(b).len() } else { 0 };
        let starts = starts_of(&buckets.sizes(), gap).ok_or_else(|| {
            Error::new(ErrorKind::OutOfHostMemory, "the CSR does not fit in memory")
        })?;
        let total = starts[starts.len() - 1];
        let mut neighbors = crate::result::huge::zeroed(total, 0u32);
        let mut offsets = crate::result::huge::zeroed(rows + 1, 0u64);
        let nbr_mask = (1u64 << nbr_bits) - 1;
        let small_rows = SmallRows::new(nbr_bits);
        let count = starts.len() - 1;
        split_mut(&mut neighbors, &starts)
            .into_par_iter()
            .zip(offsets[..rows].par_chunks_mut(rows_per_bucket.max(1)))
            .enumerate()
            .for_each_init(
                || (Vec::new(), Vec::new(), Vec::new()),
                |(counts, keys, scratch), (b, (region, offs))| {
                    let first_row = bucket_rows(b).start;
                    // The bucket's entries in one array in cache (they were streamed out of
                    // it): the row scatter reads them twice.
                    keys.clear();
                    for s in buckets.bucket(b) {
                        keys.extend_from_slice(s);
                    }
                    // Sorted rows: short ones are sorted each on its own after the scatter;
                    // else the bucket is sorted by neighbour first, the diagonal's entries
                    // with it, and the stable scatter by row keeps each row ascending.
                    let each_row = sorted && small_rows.fit(keys.len(), offs.len());
                    let mut diagonal_first = diagonal;
                    if sorted && !each_row {
                        if diagonal {
                            keys.extend(
                                (0..offs.len()).map(|r| {
                                    ((r as u64) << nbr_bits | (first_row + r) as u64) as u32
                                }),
                            );
                            diagonal_first = false;
                        }
                        lsd(keys, scratch, nbr_bits, &|&k: &u32| u64::from(k) & nbr_mask);
                    }
                    let scatter = RowScatter {
                        nbr_bits,
                        first_row,
                        diagonal: diagonal_first,
                    };
                    scatter.scatter(keys, starts[b], offs, region, counts);
                    if each_row {
                        let ends = offs[1..]
                            .iter()
                            .map(|&o| o as usize - starts[b])
                            .chain([region.len()]);
                        // The next bucket's entries start coming into the cache while the
                        // rows, in cache, are sorted: its copy then reads them from there
                        // (1M uniform 3-D points, sorted CSR: the copies took 12 thread-ms,
                        // now 3; the sorts 45 -> 47.5).
                        let next = if b + 1 < count {
                            buckets.bucket(b + 1)
                        } else {
                            Vec::new()
                        };
                        let mut ahead = Ahead::new(&next, offs.len());
                        let mut lo = 0;
                        for hi in ends {
                            ahead.step();
                            small_rows.sort(&mut region[lo..hi]);
                            lo = hi;
                        }
                    }
                },
            );
        offsets[rows] = total as u64;
        buckets.free_later();
        Ok(Csr { offsets, neighbors })
    }
}

/// Prefetches a bucket's blocks, a few cache lines a step, spread over `steps` steps.
struct Ahead<'a> {
    blocks: &'a [&'a [u32]],
    block: usize,
    at: usize,
    per_step: usize,
}

impl<'a> Ahead<'a> {
    fn new(blocks: &'a [&'a [u32]], steps: usize) -> Self {
        let lines: usize = blocks.iter().map(|b| b.len().div_ceil(LINE)).sum();
        Ahead {
            blocks,
            block: 0,
            at: 0,
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    #[inline]
    fn step(&mut self) {
        for _ in 0..self.per_step {
            let Some(b) = self.blocks.get(self.block) else {
                return;
            };
            if self.at < b.len() {
                crate::cpu::prefetch(&b[self.at..]);
            }
            self.at += LINE;
            if self.at >= b.len() {
                self.block += 1;
                self.at = 0;
            }
        }
    }
}

/// Streams a row scatter splits a bucket's entries into, each with its own cursors: one
/// row's entries often come in runs (a point's pairs arrive together), and with one cursor
/// per row each write waits for the one before it to the same row; four streams keep four
/// writes in flight (8 calls of the unsorted CSR of 1M uniform 2-D points, 32M entries:
/// 1.45-1.55 s against 1.62-1.95 s with one stream).
const STREAMS: usize = 4;

/// A counting sort of one bucket's entries (a row's low bits above its neighbour) by row.
struct RowScatter {
    nbr_bits: u32,
    first_row: usize,
    /// Each row starts with its own index (the diagonal).
    diagonal: bool,
}

impl RowScatter {
    /// Writes each row's neighbours into `region`, in the entries' order (stable), and each
    /// row's start, plus `base`, into `offs` (one per row). `counts` is scratch.
    ///
    /// # Panics
    /// If an entry's row is not below `offs.len()`, or `region` is not as long as the
    /// entries and the diagonal.
    fn scatter(
        &self,
        keys: &[u32],
        base: usize,
        offs: &mut [u64],
        region: &mut [u32],
        counts: &mut Vec<usize>,
    ) {
        let rows = offs.len();
        let shift = self.nbr_bits;
        let mask = (1u64 << shift) - 1;
        // u64 shifts: a neighbour may take all 32 bits (then every row bit is above them).
        let row = |e: u32| (u64::from(e) >> shift) as usize;
        // Checked once here, in one vectorised pass, so that the passes below index
        // without a check per entry (they took 56 thread-ms with checks, 41 without: 1M
        // uniform 3-D points, sorted CSR, 31M entries).
        let top = keys.iter().copied().max().map_or(0, row);
        assert!(
            keys.is_empty() || top < rows,
            "an entry beyond its bucket's rows"
        );
        let diagonal = if self.diagonal { rows } else { 0 };
        assert_eq!(region.len(), keys.len() + diagonal, "a bucket's region");
        // Stream k: keys[k*q..(k+1)*q], the last stream also the tail.
        let q = keys.len() / STREAMS;
        let tail = &keys[STREAMS * q..];
        let last = (STREAMS - 1) * rows;
        counts.clear();
        counts.resize(STREAMS * rows, 0);
        for i in 0..q {
            for k in 0..STREAMS {
                // SAFETY: k q + i < STREAMS q <= keys.len(), and every entry's row is below
                // `rows` (asserted above), so k rows + row < STREAMS rows = counts.len().
                unsafe {
                    *counts.get_unchecked_mut(k * rows + row(*keys.get_unchecked(k * q + i))) += 1
                };
            }
        }
        for &e in tail {
            counts[last + row(e)] += 1;
        }
        // Each row's start, then each stream's first place in the row.
        let mut at = 0;
        for (r, off) in offs.iter_mut().enumerate() {
            *off = (base + at) as u64;
            if self.diagonal {
                region[at] = (self.first_row + r) as u32;
                at += 1;
            }
            for k in 0..STREAMS {
                let c = std::mem::replace(&mut counts[k * rows + r], at);
                at += c;
            }
        }
        for i in 0..q {
            for k in 0..STREAMS {
                // SAFETY: the indices into `keys` and `counts` as in the count above. The
                // cursor of (stream k, row r) starts where its entries' places begin and
                // moves once per entry that the count above counted for (k, r), from the
                // same keys: it stays below the next cursor's start, and the last one ends
                // at keys.len() + diagonal = region.len() (asserted above).
                unsafe {
                    let e = *keys.get_unchecked(k * q + i);
                    let c = counts.get_unchecked_mut(k * rows + row(e));
                    *region.get_unchecked_mut(*c) = (u64::from(e) & mask) as u32;
                    *c += 1;
                }
            }
        }
        for &e in tail {
            let c = &mut counts[last + row(e)];
            region[*c] = (u64::from(e) & mask) as u32;
            *c += 1;
        }
    }
}

/// Sorting a sorted CSR's rows one by one, where they are short: a bucket of 1024 rows of
/// 32 neighbours is sorted so in about half the time its two least-significant-digit
/// passes by neighbour take (1M uniform 2-D points, 32M entries: 57 against 120 ms of
/// thread time). With AVX2, a row of up to 32 without distances is sorted by a network
/// (`network_sort`), one of up to 64 by rank (`rank_sort`); longer ones, rare in such a
/// bucket, by a comparison sort.
pub(crate) struct SmallRows {
    /// AVX2 is available and neighbours are below 2^25, as both vector sorts need (ranks
    /// hold a neighbour's 25 bits above 6 bits of its place in the row, in an i32).
    rank: bool,
}

impl SmallRows {
    /// Entries per row, on average, up to which a bucket's rows are sorted one by one.
    const AVERAGE: usize = 48;
    /// The longest row sorted by rank.
    const RANKED: usize = 64;
    /// The longest row without distances sorted by a sorting network instead (1M uniform
    /// 3-D points, sorted CSR, rows of 32 on average: the rows' sorts took 51.5 thread-ms
    /// against 57.5 by rank alone; a network for rows of up to 64 took 94).
    const NETWORK: usize = 32;

    pub(crate) fn new(nbr_bits: u32) -> Self {
        SmallRows {
            rank: crate::cpu::avx2_available() && nbr_bits <= 25,
        }
    }

    /// Whether a bucket of `entries` in `rows` rows is sorted row by row.
    fn fit(&self, entries: usize, rows: usize) -> bool {
        self.rank && entries <= Self::AVERAGE * rows
    }

    pub(crate) fn sort(&self, row: &mut [u32]) {
        self.sort_with(row, &mut [] as &mut [u8]);
    }

    /// `sort`, moving `with[e]` (empty, or one value per entry of `row`: its distance)
    /// along with entry e.
    pub(crate) fn sort_with<C: Copy + Default>(&self, row: &mut [u32], with: &mut [C]) {
        let k = row.len();
        assert!(with.is_empty() || with.len() == k);
        if k < 2 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.rank && k <= Self::NETWORK && with.is_empty() {
            // SAFETY: `rank` is only set where AVX2 is available (`new`), and every
            // neighbour is below 2^25 (`nbr_bits <= 25`); 2 <= k <= 32 = 8 N below.
            unsafe {
                match k.div_ceil(8) {
                    1 => network_sort::<1>(row),
                    2 => network_sort::<2>(row),
                    _ => network_sort::<4>(row),
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.rank && k <= Self::RANKED {
            // SAFETY: `rank` is only set where AVX2 is available (`new`), and every
            // neighbour is below 2^25 (`nbr_bits <= 25`); 2 <= k <= 64 = 8 N below, and
            // `with` is empty or k long (asserted).
            unsafe {
                match k.div_ceil(8) {
                    1 => rank_sort::<1, C>(row, with),
                    2 => rank_sort::<2, C>(row, with),
                    3 => rank_sort::<3, C>(row, with),
                    4 => rank_sort::<4, C>(row, with),
                    5 => rank_sort::<5, C>(row, with),
                    6 => rank_sort::<6, C>(row, with),
                    7 => rank_sort::<7, C>(row, with),
                    _ => rank_sort::<8, C>(row, with),
                }
            }
            return;
        }
        if with.is_empty() {
            row.sort_unstable();
        } else {
            let mut both: Vec<(u32, C)> = row.iter().copied().zip(with.iter().copied()).collect();
            both.sort_unstable_by_key(|e| e.0);
            for ((r, w), (id, c)) in row.iter_mut().zip(with.iter_mut()).zip(both) {
                (*r, *w) = (id, c);
            }
        }
    }
}

/// Sorts `row` (at most 8 N values, N = 1, 2 or 4, each below 2^31) with a bitonic
/// network in N AVX2 registers padded with i32::MAX: each register sorted in place, then
/// sorted runs of registers merged pairwise (a run followed by the next one reversed is a
/// bitonic sequence, which compare-exchanges at halving distances sort).
///
/// # Safety
/// AVX2 must be available, and `row` must hold at most 8 N values, each below 2^31.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn network_sort<const N: usize>(row: &mut [u32]) {
    use std::arch::x86_64::*;
    assert!(row.len() <= 8 * N && N.is_power_of_two() && N <= 4);
    debug_assert!(row.iter().all(|&x| x < 1 << 31));
    let mut v = [_mm256_setzero_si256(); N];
    for (i, v) in v.iter_mut().enumerate() {
        // SAFETY: AVX2 (this function's precondition); `load_padded` reads row only.
        *v = unsafe { load_padded(row, i, _mm256_set1_epi32(i32::MAX)) };
    }
    // A compare-exchange of each lane i with lane partner[i]: MASK has a lane's bit set
    // where it keeps the larger of the two.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn ce<const MASK: i32>(v: __m256i, partner: __m256i) -> __m256i {
        let p = _mm256_permutevar8x32_epi32(v, partner);
        _mm256_blend_epi32::<MASK>(_mm256_min_epi32(v, p), _mm256_max_epi32(v, p))
    }
    // Partners at lane distances 1, 2 and 4, and the lanes reversed.
    let d1 = _mm256_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6);
    let d2 = _mm256_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5);
    let d4 = _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3);
    let rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    // A bitonic register sorted ascending: distances 4, 2, 1, the larger one above.
    let clean = |x| ce::<0xAA>(ce::<0xCC>(ce::<0xF0>(x, d4), d2), d1);
    for x in v.iter_mut() {
        // Pairs, then fours, alternately ascending and descending: a bitonic eight.
        let y = ce::<0x66>(*x, d1);
        *x = clean(ce::<0x5A>(ce::<0x3C>(y, d2), d1));
    }
    // Merge sorted runs of `run` registers pairwise until one run holds them all.
    let mut run = 1;
    while run < N {
        for g in (0..N).step_by(2 * run) {
            // The second run reversed (its registers and their lanes).
            v[g + run..g + 2 * run].reverse();
            for x in &mut v[g + run..g + 2 * run] {
                *x = _mm256_permutevar8x32_epi32(*x, rev);
            }
            // Compare-exchange at register distances run, run / 2, ..., 1, then inside each.
            let mut d = run;
            while d >= 1 {
                for j in g..g + 2 * run {
                    if (j - g) & d == 0 {
                        let (a, b) = (v[j], v[j + d]);
                        v[j] = _mm256_min_epi32(a, b);
                        v[j + d] = _mm256_max_epi32(a, b);
                    }
                }
                d /= 2;
            }
            for x in &mut v[g..g + 2 * run] {
                *x = clean(*x);
            }
        }
        run *= 2;
    }
    for (i, v) in v.iter().enumerate() {
        // SAFETY: AVX2 (this function's precondition); `store_prefix` writes row only.
        unsafe { store_prefix(row, i, *v) };
    }
}

/// Lanes `8 i..8 i + 8` of `row`, each lane past its end `pad`'s: the vector sorts read
/// and write a row in place, where copying it through a padded buffer, one value at a
/// time, took a tenth of their time (1M uniform 3-D points, sorted CSR: the rows' sorts
/// 50 -> 45 thread-ms).
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_padded(
    row: &[u32],
    i: usize,
    pad: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let have = row.len().saturating_sub(8 * i).min(8);
    if have == 8 {
        // SAFETY: 8 i + 8 <= row.len().
        return unsafe { _mm256_loadu_si256(row.as_ptr().add(8 * i) as *const __m256i) };
    }
    if have == 0 {
        return pad;
    }
    // SAFETY: AVX2 (this function's precondition).
    let mask = unsafe { lanes_below(have) };
    // SAFETY: only the lanes under the mask are read: 8 i + have <= row.len().
    let v = unsafe { _mm256_maskload_epi32(row.as_ptr().add(8 * i) as *const i32, mask) };
    _mm256_blendv_epi8(pad, v, mask)
}

/// All bits set in the lanes below `n` (0 to 8), none above.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes_below(n: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Writes lanes of `v` to `row[8 i..]`, as many as fit.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_prefix(row: &mut [u32], i: usize, v: std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let have = row.len().saturating_sub(8 * i).min(8);
    if have == 8 {
        // SAFETY: 8 i + 8 <= row.len().
        unsafe { _mm256_storeu_si256(row.as_mut_ptr().add(8 * i) as *mut __m256i, v) };
    } else if have > 0 {
        let mut lanes = [0u32; 8];
        // SAFETY: 8 lanes, 32 bytes, into `lanes`.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v) };
        row[8 * i..].copy_from_slice(&lanes[..have]);
    }
}

/// Sorts `row` (2 to 8 N values, each below 2^25) by rank: each value, made distinct by
/// its place in the row in 6 low bits, goes to the place given by how many values are
/// below it, counted by comparing it with N vectors of 8 at once.
///
/// `with` (empty, or as long as `row`) is permuted alike.
///
/// # Safety
/// AVX2 must be available, and `row` must hold at most 8 N values, each below 2^25, and
/// `with` none or as many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rank_sort<const N: usize, C: Copy + Default>(row: &mut [u32], with: &mut [C]) {
    use std::arch::x86_64::*;
    let k = row.len();
    debug_assert!(k <= 8 * N && N <= 8);
    // Keys are below 2^31, so signed compares order them; the padding, i32::MAX, is never
    // compared as a key (only the first k are) and its ranks are never used.
    debug_assert!(row.iter().all(|&x| x < 1 << 25));
    let mut keys = [i32::MAX; 64];
    let mut v = [_mm256_setzero_si256(); N];
    let mut rank = [_mm256_setzero_si256(); N];
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (i, v) in v.iter_mut().enumerate() {
        // SAFETY: AVX2 (this function's precondition); `load_padded` reads row only.
        let (x, in_row) = unsafe {
            (
                load_padded(row, i, _mm256_setzero_si256()),
                lanes_below(k.saturating_sub(8 * i).min(8)),
            )
        };
        let place = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * i as i32));
        let key = _mm256_or_si256(_mm256_slli_epi32::<6>(x), place);
        *v = _mm256_blendv_epi8(_mm256_set1_epi32(i32::MAX), key, in_row);
        // SAFETY: 8 (i + 1) <= 8 N <= 64 = keys.len().
        unsafe { _mm256_storeu_si256(keys.as_mut_ptr().add(8 * i) as *mut __m256i, *v) };
    }
    for &x in &keys[..k] {
        let b = _mm256_set1_epi32(x);
        for i in 0..N {
            // Each lane above x gains one: its rank is how many keys are below it.
            rank[i] = _mm256_sub_epi32(rank[i], _mm256_cmpgt_epi32(v[i], b));
        }
    }
    let mut ranks = [0u32; 64];
    for (i, r) in rank.iter().enumerate() {
        // SAFETY: as for the keys' stores.
        unsafe { _mm256_storeu_si256(ranks.as_mut_ptr().add(8 * i) as *mut __m256i, *r) };
    }
    // The k keys are distinct, so their ranks are 0..k, each once: a permutation.
    for j in 0..k {
        row[ranks[j] as usize] = (keys[j] as u32) >> 6;
    }
    if !with.is_empty() {
        let mut old = [C::default(); 64];
        old[..k].copy_from_slice(with);
        for j in 0..k {
            with[ranks[j] as usize] = old[j];
        }
    }
}

impl crate::result::PairSink for CsrSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self.parts.push(chunk)
    }

    fn parts(&mut self, workers: usize) -> Vec<&mut dyn crate::result::PairSink> {
        self.parts.split(workers)
    }
}

/// Sorts `pairs` by their first element, stably (entries with equal first elements keep
/// their order): the grid index's (cell, point) entries.
pub fn sort_by_first(pairs: &mut Vec<Pair>) {
    let key_bits = bits(maxima(pairs).0);
    let key = |p: &Pair| u64::from(p[0]);
    let digit_bits = digit_bits(pairs.len(), key_bits);
    if digit_bits == 0 {
        // Too few buckets to keep the threads busy: one thread's passes (the grid index of
        // 10^5 clustered 3-D points, 10^6 cells: built in 4.2 ms, 8.5 ms with a parallel
        // comparison sort; medians of 50 on 2 loaded cores).
        lsd(pairs, &mut Vec::new(), key_bits, &key);
        return;
    }
    scatter_then_lsd(pairs, key_bits, digit_bits, &key);
}

/// The sort both entry points share: one scatter by the top `digit_bits` of the
/// `key_bits`-bit key into buckets, then every bucket by its low bits, in parallel.
fn scatter_then_lsd(
    pairs: &mut Vec<Pair>,
    key_bits: u32,
    digit_bits: u32,
    key: &(impl Fn(&Pair) -> u64 + Sync),
) {
    let shift = key_bits - digit_bits;
    let (mut out, starts) = scatter(
        pairs,
        false,
        1 << digit_bits,
        |p| (key(p) >> shift) as usize,
        |p| *p,
        |_| 0,
    );
    split_mut(&mut out, &starts)
        .into_par_iter()
        .for_each_init(Vec::new, |scratch, s| lsd(s, scratch, shift, key));
    *pairs = out;
}

/// The CSR of `pairs`: rows by the first element (and, for a self-join, also by the
/// second: each pair gives both directions), plus the diagonal when `include_self`; each
/// row's neighbours ascending when `sorted`, else in no promised order. `pairs` is freed
/// as soon as it has been read. Where a row's low bits and a neighbour fit 32 bits the
/// pairs go through the streaming CSR sink as 4-byte entries (peak: the pairs and the
/// entries, then the entries and the CSR); else they are scattered as 8-byte pairs, then
/// copied out (peak: two copies of the entries). A pair naming a point at or beyond `rows` (a row, or a self-join's neighbour) is an
/// `InvalidArgument` error.
pub fn build_csr(
    pairs: Vec<Pair>,
    self_join: bool,
    rows: usize,
    include_self: bool,
    sorted: bool,
) -> Result<Csr> {
    let per_pair = if self_join { 2 } else { 1 };
    let diagonal = if self_join && include_self { rows } else { 0 };
    let total = (pairs.len() as u64)
        .checked_mul(per_pair)
        .and_then(|t| t.checked_add(diagonal as u64))
        .and_then(|t| usize::try_from(t).ok())
        .ok_or_else(|| Error::new(ErrorKind::OutOfHostMemory, "the CSR does not fit in memory"))?;
    // Every entry must name a row (and, in a self-join, a neighbour) below `rows`: the
    // buckets rely on it.
    let (max_i, max_j) = maxima(&pairs);
    if !pairs.is_empty() && (max_i as usize >= rows || (self_join && max_j as usize >= rows)) {
        return Err(Error::invalid(format!(
            "a pair names point {} of a CSR with {rows} rows",
            max_i.max(if self_join { max_j } else { 0 })
        )));
    }
    // Where a row's low bits and a neighbour pack into u32: the streaming build, fed the
    // whole list (peak: the pairs and the 4-byte entries, then the entries and the CSR).
    let cols = if self_join { rows } else { max_j as usize + 1 };
    if let Some(mut sink) = CsrSink::new(rows, cols, self_join, include_self, sorted) {
        use crate::result::PairSink;
        sink.push(&pairs)
            .map_err(|e| Error::new(ErrorKind::OutOfHostMemory, e.to_string()))?;
        drop(pairs);
        return sink.finish();
    }
    // Else 8-byte entries, scattered in parallel by the rows' top bits: more, smaller
    // buckets where that lets a row's low bits and a neighbour fit 32.
    let row_bits = bits(u32::try_from(rows.saturating_sub(1)).unwrap_or(u32::MAX));
    let nbr_bits = if self_join { row_bits } else { bits(max_j) };
    let digit_bits = match digit_bits(total, row_bits) {
        0 => 0,
        d => d.max(
            (row_bits + nbr_bits)
                .saturating_sub(32)
                .min(MAX_DIGIT_BITS)
                .min(row_bits),
        ),
    };
    let row_shift = row_bits - digit_bits;
    let (mut entries, starts) = scatter(
        &pairs,
        self_join,
        1 << digit_bits,
        |e| (e[0] >> row_shift) as usize,
        |e| *e,
        |_| 0,
    );
    drop(pairs);
    let low = ((1u64 << row_shift) - 1) as u32;
    let by_row_then_nbr = |e: &Pair| (u64::from(e[0] & low) << nbr_bits) | u64::from(e[1]);
    let by_row = |e: &Pair| u64::from(e[0] & low);

    // Bucket b holds rows b << row_shift.. : its own run of offsets and of neighbours.
    let mut offsets = crate::result::huge::zeroed(rows + 1, 0u64);
    let mut neighbors = crate::result::huge::zeroed(total, 0u32);
    let rows_per_bucket = 1usize << row_shift;
    let bucket_rows =
        |b: usize| (b * rows_per_bucket).min(rows)..((b + 1) * rows_per_bucket).min(rows);
    let diag_rows = |b: usize| {
        if diagonal > 0 {
            bucket_rows(b).len()
        } else {
            0
        }
    };
    let mut nbr_parts = Vec::with_capacity(starts.len() - 1);
    let mut rest = neighbors.as_mut_slice();
    for b in 0..starts.len() - 1 {
        let (head, tail) = rest.split_at_mut(starts[b + 1] - starts[b] + diag_rows(b));
        nbr_parts.push(head);
        rest = tail;
    }
    split_mut(&mut entries, &starts)
        .into_par_iter()
        .zip(offsets[..rows].par_chunks_mut(rows_per_bucket.max(1)))
        .zip(nbr_parts)
        .enumerate()
        .for_each_init(Vec::new, |scratch, (b, ((es, offs), nbrs))| {
            if sorted {
                lsd(es, scratch, row_shift + nbr_bits, &by_row_then_nbr);
            } else {
                lsd(es, scratch, row_shift, &by_row);
            }
            // Neighbours of this bucket start at its entries' start plus one diagonal
            // entry for every earlier row.
            let base = starts[b]
                + if diagonal > 0 {
                    bucket_rows(b).start
                } else {
                    0
                };
            let mut k = 0; // into es
            let mut w = 0; // into nbrs
            for (off, r) in offs.iter_mut().zip(bucket_rows(b)) {
                *off = (base + w) as u64;
                let from = k;
                while k < es.len() && es[k][0] as usize == r {
                    k += 1;
                }
                let row = &es[from..k];
                // The diagonal goes first, or at its place among sorted neighbours.
                let at = if diagonal == 0 {
                    usize::MAX
                } else if sorted {
                    row.partition_point(|e| e[1] < r as u32)
                } else {
                    0
                };
                for (x, e) in row.iter().enumerate() {
                    if x == at {
                        nbrs[w] = r as u32;
                        w += 1;
                    }
                    nbrs[w] = e[1];
                    w += 1;
                }
                if at != usize::MAX && at >= row.len() {
                    nbrs[w] = r as u32;
                    w += 1;
                }
            }
            debug_assert_eq!((k, w), (es.len(), nbrs.len()));
        });
    offsets[rows] = total as u64;
    Ok(Csr { offsets, neighbors })
}

/// How many top bits the scatter buckets by: about `BUCKET_PAIRS` entries a bucket, or 0
/// when that gives too few buckets to keep the threads busy.
fn digit_bits(len: usize, key_bits: u32) -> u32 {
    let d = (len / BUCKET_PAIRS)
        .next_power_of_two()
        .trailing_zeros()
        .min(MAX_DIGIT_BITS)
        .min(key_bits);
    if len <= SMALL || (1usize << d) < 4 * rayon::current_num_threads() {
        0
    } else {
        d
    }
}

/// Scatters `pairs` (and, when `both`, each pair reversed too) into `buckets` buckets by
/// `digit`; returns the entries, bucket by bucket, and the buckets' starts (one more than
/// the buckets, the last the total).
fn scatter<E: Copy + Default + Send>(
    pairs: &[Pair],
    both: bool,
    buckets: usize,
    digit: impl Fn(&Pair) -> usize + Sync,
    make: impl Fn(&Pair) -> E + Sync,
    gap: impl Fn(usize) -> usize,
) -> (Vec<E>, Vec<usize>) {
    let threads = rayon::current_num_threads();
    let chunk = pairs.len().div_ceil(4 * threads).max(SMALL);
    let hist: Vec<Vec<usize>> = pairs
        .par_chunks(chunk)
        .map(|c| {
            let mut h = vec![0usize; buckets];
            for p in c {
                h[digit(p)] += 1;
                if both {
                    h[digit(&[p[1], p[0]])] += 1;
                }
            }
            h
        })
        .collect();
    // Chunk c writes bucket b's entries at cursors[c][b]..: buckets in order, and within a
    // bucket the chunks in order.
    let mut cursors = vec![vec![0usize; buckets]; hist.len()];
    let mut starts = Vec::with_capacity(buckets + 1);
    let mut acc = 0usize;
    for b in 0..buckets {
        starts.push(acc);
        for (cur, h) in cursors.iter_mut().zip(&hist) {
            cur[b] = acc;
            acc += h[b];
        }
        acc += gap(b);
    }
    starts.push(acc);

    // Zeroed allocation: the pages are mapped lazily, touched once by the scatter.
    let mut out: Vec<E> = crate::result::huge::zeroed(acc, E::default());
    let dst = OutPtr(out.as_mut_ptr());
    pairs
        .par_chunks(chunk)
        .zip(cursors.into_par_iter())
        .for_each(|(c, mut cur)| {
            let mut put = |e: Pair| {
                let b = digit(&e);
                let e = make(&e);
                // SAFETY: chunk c writes exactly hist[c][b] entries to bucket b, from
                // cursors[c][b] on (the histogram counted the same entries with the same
                // digit); those ranges are disjoint across (chunk, bucket) and cover
                // 0..acc at most once (the gaps stay unwritten), so every write is in
                // bounds and no two threads write the same element. `out` outlives the
                // parallel loop.
                unsafe { dst.at(cur[b]).write(e) };
                cur[b] += 1;
            };
            for p in c {
                put(*p);
                if both {
                    put([p[1], p[0]]);
                }
            }
        });
    (out, starts)
}

/// `v` cut at `starts` (as [`scatter`] returns them) into one slice per bucket.
fn split_mut<'a, E>(v: &'a mut [E], starts: &[usize]) -> Vec<&'a mut [E]> {
    let mut rest = v;
    let mut parts = Vec::with_capacity(starts.len() - 1);
    for w in starts.windows(2) {
        let (head, tail) = rest.split_at_mut(w[1] - w[0]);
        parts.push(head);
        rest = tail;
    }
    parts
}

/// Sorts one bucket by the low `low_bits` bits of `key` (the higher bits are equal in a
/// bucket) with least-significant-digit passes of at most 11 bits (the histogram stays in
/// L1) through `scratch`. Stable.
fn lsd<E: Copy + Default>(
    s: &mut [E],
    scratch: &mut Vec<E>,
    low_bits: u32,
    key: &impl Fn(&E) -> u64,
) {
    if low_bits == 0 {
        return;
    }
    if s.len() < 256 {
        let mask = u64::MAX >> (64 - low_bits);
        s.sort_by_key(|p| key(p) & mask);
        return;
    }
    let passes = low_bits.div_ceil(11);
    let width = low_bits.div_ceil(passes);
    let mask = (1u64 << width) - 1;
    scratch.clear();
    scratch.resize(s.len(), E::default());
    let mut hist = vec![0usize; 1 << width];
    let (mut src, mut dst): (&mut [E], &mut [E]) = (s, scratch);
    for pass in 0..passes {
        let at = pass * width;
        hist.fill(0);
        for p in src.iter() {
            hist[((key(p) >> at) & mask) as usize] += 1;
        }
        let mut acc = 0;
        for h in hist.iter_mut() {
            let c = *h;
            *h = acc;
            acc += c;
        }
        for p in src.iter() {
            let d = ((key(p) >> at) & mask) as usize;
            dst[hist[d]] = *p;
            hist[d] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    // After an odd number of passes the sorted data sits in the scratch buffer.
    if passes % 2 == 1 {
        dst.copy_from_slice(src);
    }
}

fn maxima(pairs: &[Pair]) -> (u32, u32) {
    pairs
        .par_iter()
        .fold(|| (0u32, 0u32), |(a, b), p| (a.max(p[0]), b.max(p[1])))
        .reduce(|| (0, 0), |(a, b), (c, d)| (a.max(c), b.max(d)))
}

fn bits(max: u32) -> u32 {
    32 - max.leading_zeros()
}

/// The scatter's output, shared by the threads that write disjoint ranges of it.
struct OutPtr<E>(*mut E);

// SAFETY: the pointer is only used for writes to disjoint elements (see the scatter), and
// the elements (pairs, packed u32 keys) are plain data that may be sent across threads.
unsafe impl<E: Send> Sync for OutPtr<E> {}

impl<E> OutPtr<E> {
    /// # Safety
    /// `i` must be within the allocation.
    unsafe fn at(&self, i: usize) -> *mut E {
        // SAFETY: the caller keeps `i` in bounds.
        unsafe { self.0.add(i) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 32) as u32
    }

    fn random(n: usize, ri: u32, rj: u32, seed: u64) -> Vec<Pair> {
        let mut s = seed;
        (0..n)
            .map(|_| [lcg(&mut s) % ri, lcg(&mut s) % rj])
            .collect()
    }

    #[test]
    fn sorts_by_first_stably() {
        // One thread's passes (small) and the parallel scatter (large); few and many keys.
        for (n, ri) in [
            (0usize, 1u32),
            (1000, 7),
            (100_000, 1_000_000),
            (400_000, 3_000_000),
            (400_000, 1),
            (300_000, u32::MAX),
        ] {
            let mut pairs: Vec<Pair> = random(n, ri, 1, n as u64)
                .into_iter()
                .enumerate()
                .map(|(i, p)| [p[0], i as u32])
                .collect();
            let mut want = pairs.clone();
            want.sort_by_key(|p| p[0]);
            sort_by_first(&mut pairs);
            assert_eq!(pairs, want);
        }
    }

    #[test]
    fn sorts_like_a_comparison_sort() {
        let mut cases = vec![vec![], vec![[3, 1]]];
        // Large enough for the radix path; skewed, duplicated, full-width and narrow keys.
        for (n, ri, rj) in [
            (200_000usize, 1_000_000u32, 1_000_000u32),
            (300_000, 5, 1 << 31),
            (300_000, u32::MAX, 3),
            (150_000, 1, 1),
            (250_000, u32::MAX, u32::MAX),
        ] {
            cases.push(random(n, ri, rj, n as u64));
        }
        // All pairs in one bucket but one.
        let mut v = vec![[7u32, 9u32]; 100_000];
        v.push([1_000_000, 0]);
        cases.push(v);
        for mut pairs in cases {
            let mut want = pairs.clone();
            want.sort_unstable();
            sort_pairs(&mut pairs);
            assert_eq!(pairs, want);
        }
    }

    #[test]
    fn sorting_sink_sorts_like_a_comparison_sort() {
        use crate::result::PairSink;
        // Point counts from one bucket (small) to the largest that gets a sink; pairs
        // delivered in chunks of several sizes, with duplicates.
        for (rows, cols, n) in [
            (0usize, 0usize, 0usize),
            (1, 1, 5),
            (1000, 1000, 20_000),
            (1 << 20, 1 << 20, 300_000),
            (5, 3_000_000, 100_000),
            (3_000_000, 7, 100_000),
            (1 << 24, 1 << 24, 200_000),
        ] {
            let mut pairs = if rows == 0 {
                Vec::new()
            } else {
                random(n, rows as u32, cols as u32, (rows ^ n) as u64)
            };
            pairs.extend_from_within(..pairs.len() / 10);
            let mut sink = SortingSink::new(rows, cols).expect("within 2^24 points");
            feed(&mut sink, &pairs);
            let mut want = pairs.clone();
            want.sort_unstable();
            assert_eq!(sink.finish().unwrap(), want, "{rows} x {cols}");
        }
        // Beyond 2^24 points a side: collect and sort instead.
        assert!(SortingSink::new(1 << 25, 1 << 25).is_none());
        // A pair beyond the points is an error, not a write out of place.
        let mut sink = SortingSink::new(10, 10).unwrap();
        assert!(sink.push(&[[3, 10]]).is_err());
    }

    /// The CSR by definition: rows built one entry at a time.
    /// Feeds `pairs` to a streaming sink in chunks of several sizes, as the CPU workers
    /// do: a quarter to the sink itself, the rest to three parts at once, from three
    /// threads.
    fn feed(sink: &mut dyn crate::result::PairSink, pairs: &[Pair]) {
        let (mut chunks, mut at, mut sizes) =
            (Vec::new(), 0, [1usize, 7, 4096, 65_536].iter().cycle());
        while at < pairs.len() {
            let end = (at + sizes.next().unwrap()).min(pairs.len());
            chunks.push(&pairs[at..end]);
            at = end;
        }
        let split = chunks.len() / 4;
        for c in &chunks[..split] {
            sink.push(c).unwrap();
        }
        let parts = sink.parts(3);
        assert_eq!(parts.len(), 3);
        let rest = &chunks[split..];
        std::thread::scope(|s| {
            for (k, part) in parts.into_iter().enumerate() {
                s.spawn(move || {
                    for c in rest.iter().skip(k).step_by(3) {
                        part.push(c).unwrap();
                    }
                });
            }
        });
    }

    #[test]
    fn short_rows_sort_like_a_comparison_sort() {
        let mut seed = 3u64;
        for nbr_bits in [1u32, 8, 20, 25] {
            let rows = SmallRows::new(nbr_bits);
            for k in 0..=70 {
                for spread in [1u32, 2, 1 << nbr_bits] {
                    // Values below 2^nbr_bits; a small spread repeats them.
                    let top = spread.min(1 << nbr_bits);
                    let mut row: Vec<u32> = (0..k).map(|_| lcg(&mut seed) % top).collect();
                    let mut want = row.clone();
                    want.sort_unstable();
                    // In a larger buffer, as in a CSR: the values around it stay as they
                    // are (the vector sorts load and store whole registers of 8).
                    let mut buf = vec![u32::MAX - 1; k + 16];
                    buf[8..8 + k].copy_from_slice(&row);
                    rows.sort(&mut row);
                    assert_eq!(row, want, "{k} values below {top}");
                    rows.sort(&mut buf[8..8 + k]);
                    assert_eq!(
                        buf[8..8 + k],
                        want[..],
                        "{k} values below {top}, in a buffer"
                    );
                    assert!(buf[..8]
                        .iter()
                        .chain(&buf[8 + k..])
                        .all(|&x| x == u32::MAX - 1));
                    // With a value moved along with each entry (the CSR's distances).
                    let mut ids: Vec<u32> = (0..k).map(|_| lcg(&mut seed) % top).collect();
                    let mut with: Vec<u64> = ids.iter().map(|&x| u64::from(x) * 3 + 1).collect();
                    rows.sort_with(&mut ids, &mut with);
                    assert_eq!(ids.len(), k);
                    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{k} values, with");
                    assert!(ids
                        .iter()
                        .zip(&with)
                        .all(|(&x, &w)| w == u64::from(x) * 3 + 1));
                }
            }
        }
    }

    fn naive_csr(
        pairs: &[Pair],
        self_join: bool,
        rows: usize,
        include_self: bool,
    ) -> Vec<Vec<u32>> {
        let mut r = vec![Vec::new(); rows];
        for (i, row) in r.iter_mut().enumerate() {
            if self_join && include_self {
                row.push(i as u32);
            }
        }
        for &[i, j] in pairs {
            r[i as usize].push(j);
            if self_join {
                r[j as usize].push(i);
            }
        }
        r
    }

    #[test]
    fn csr_of_more_rows_than_pack_keeps_its_diagonal() {
        // 2^24 + 1 rows: 25 row and 25 neighbour bits, more than the buckets can bring
        // down to 32, so the general path forms the rows, with and without the diagonal,
        // sorted or not. (Smaller shapes go through `CsrSink`: the test below.)
        let rows = (1usize << 24) + 1;
        assert!(CsrSink::new(rows, rows, true, true, true).is_none());
        let pairs: Vec<Pair> = random(3000, rows as u32, rows as u32, 7)
            .into_iter()
            .filter(|p| p[0] != p[1])
            .map(|p| [p[0].min(p[1]), p[0].max(p[1])])
            .collect();
        let mut partners: std::collections::HashMap<u32, Vec<u32>> = Default::default();
        for &[i, j] in &pairs {
            partners.entry(i).or_default().push(j);
            partners.entry(j).or_default().push(i);
        }
        for include_self in [false, true] {
            for sorted in [false, true] {
                let c = build_csr(pairs.clone(), true, rows, include_self, sorted).unwrap();
                assert_eq!(c.offsets.len(), rows + 1);
                assert_eq!(c.offsets[rows] as usize, c.neighbors.len());
                for r in 0..rows {
                    let got = &c.neighbors[c.offsets[r] as usize..c.offsets[r + 1] as usize];
                    if !include_self && got.is_empty() && !partners.contains_key(&(r as u32)) {
                        continue;
                    }
                    let mut got = got.to_vec();
                    if sorted {
                        assert!(got.windows(2).all(|x| x[0] <= x[1]), "row {r} not sorted");
                    } else {
                        got.sort_unstable();
                    }
                    let mut want = partners.get(&(r as u32)).cloned().unwrap_or_default();
                    if include_self {
                        want.push(r as u32);
                    }
                    want.sort_unstable();
                    assert_eq!(got, want, "row {r}");
                }
            }
        }
    }

    #[test]
    fn csr_refuses_pairs_beyond_its_rows() {
        for (pairs, self_join, rows) in [
            (vec![[0, 1], [3, 2]], false, 3),
            (vec![[0, 1], [1, 3]], true, 3),
            (vec![[0, 0]], false, 0),
        ] {
            let e = build_csr(pairs, self_join, rows, false, true).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        // A x B: neighbours are columns, not rows, so any u32 is fine.
        let c = build_csr(vec![[1, u32::MAX]], false, 2, false, true).unwrap();
        assert_eq!(c.neighbors, vec![u32::MAX]);
    }

    #[test]
    fn csr_rows_hold_exactly_their_entries() {
        use crate::result::PairSink;
        // (pairs, self-join, rows, columns)
        let mut cases = vec![
            (vec![], true, 0usize, 0usize),
            (vec![[0, 1]], true, 3, 3),
            (vec![], true, 4, 4),
        ];
        // Self-join pairs (i < j), and A x B pairs with few and many rows.
        let sj: Vec<Pair> = random(400_000, 300_000, 300_000, 1)
            .into_iter()
            .filter(|p| p[0] != p[1])
            .map(|p| [p[0].min(p[1]), p[0].max(p[1])])
            .collect();
        // Row and neighbour bits: 300k rows need 38, 60k rows 32; A x B with 20 + 6 bits
        // packs into u32 under the buckets (the sink's path), 20 + 32 does not (the
        // general one).
        cases.push((sj, true, 300_000, 300_000));
        let sj: Vec<Pair> = random(400_000, 60_000, 60_000, 4)
            .into_iter()
            .filter(|p| p[0] != p[1])
            .map(|p| [p[0].min(p[1]), p[0].max(p[1])])
            .collect();
        cases.push((sj, true, 60_000, 60_000));
        cases.push((random(400_000, 1_000_000, 50, 2), false, 1_000_000, 50));
        cases.push((
            random(300_000, 1_000_000, u32::MAX, 5),
            false,
            1_000_000,
            u32::MAX as usize,
        ));
        cases.push((random(300_000, 7, 1 << 30, 3), false, 7, 1 << 30));
        // Rows of 0 to 79 neighbours, with repeats (buckets sorted row by row, the rows
        // past 64 by the comparison sort).
        let mut seed = 9u64;
        let rowed: Vec<Pair> = (0..5_000u32)
            .flat_map(|r| (0..r % 80).map(move |_| r))
            .map(|r| [r, lcg(&mut seed) % 3_000])
            .collect();
        cases.push((rowed, false, 5_000, 3_000));
        // Few rows with many neighbours each (more than a block), a self-join.
        let dense: Vec<Pair> = random(200_000, 40, 40, 6)
            .into_iter()
            .filter(|p| p[0] != p[1])
            .map(|p| [p[0].min(p[1]), p[0].max(p[1])])
            .collect();
        cases.push((dense, true, 40, 40));
        let mut sinks = 0;
        for (pairs, self_join, rows, cols) in cases {
            for include_self in [false, true] {
                for sorted in [false, true] {
                    let mut want = naive_csr(&pairs, self_join, rows, include_self);
                    for w in want.iter_mut() {
                        w.sort_unstable();
                    }
                    let mut built =
                        vec![
                            build_csr(pairs.clone(), self_join, rows, include_self, sorted)
                                .unwrap(),
                        ];
                    // The streaming form, fed in chunks of several sizes.
                    if let Some(mut sink) =
                        CsrSink::new(rows, cols, self_join, include_self, sorted)
                    {
                        feed(&mut sink, &pairs);
                        built.push(sink.finish().unwrap());
                        sinks += 1;
                    }
                    for c in built {
                        assert_eq!(c.offsets.len(), rows + 1);
                        assert_eq!(c.offsets[0], 0);
                        assert_eq!(c.offsets[rows] as usize, c.neighbors.len());
                        for (r, w) in want.iter().enumerate() {
                            let got =
                                &c.neighbors[c.offsets[r] as usize..c.offsets[r + 1] as usize];
                            let mut got = got.to_vec();
                            if sorted {
                                assert!(got.windows(2).all(|x| x[0] <= x[1]), "row {r} not sorted");
                            } else {
                                got.sort_unstable();
                            }
                            assert_eq!(&got, w, "row {r}");
                        }
                    }
                }
            }
        }
        // Every case but the one whose neighbours need 32 bits beside 2^20 rows.
        assert_eq!(sinks, 9 * 4);
        // A pair beyond the rows or columns is an error, not a write out of place.
        let mut sink = CsrSink::new(10, 5, false, false, true).unwrap();
        assert!(sink.push(&[[3, 5]]).is_err());
        assert!(sink.push(&[[10, 0]]).is_err());
    }
}
