//! Result collection shared by the CPU algorithms: each worker fills its own buffer and
//! hands it to the sink in large chunks (one short lock per chunk, none per pair); a
//! worker that finds the sink busy keeps joining into a larger buffer instead of waiting.
//! A sink's push runs on the worker that holds it, in one thread ([`in_sink`]): parallel
//! work there (`result::Confirm`, `push_split`) would let the threads that wait for it take
//! up other tasks of the join (rayon's work stealing), whose pairs then wait for the sink
//! that waits for them (5 of 100 cosine joins at 8 threads hung so).
//! A sink with parts (`PairSink::parts`) takes chunks from all the workers at once: each
//! worker delivers to its own part, or to any part that is free. Count-only runs (no
//! sink) only count.

use super::store::LANES;
use crate::error::Error;
use crate::result::{sink_error, Pair, PairSink};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Pairs a worker buffers before it takes the sink's lock.
const CHUNK_PAIRS: usize = 1 << 16;
/// Pairs a worker buffers at most while another worker is in the sink (4 MiB) before it
/// waits for the sink.
const PENDING_PAIRS: usize = 8 * CHUNK_PAIRS;

thread_local! {
    /// Whether this thread holds a CPU join's sink (or a part) while it pushes to it.
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is in a CPU join's sink: a sink's own work then runs in this thread
/// alone (see the module's doc).
pub(crate) fn in_sink() -> bool {
    HOLDING.get()
}

/// Runs `f` (a push to a CPU join's sink, under its lock) marked as in the sink
/// ([`in_sink`]), the mark undone when it returns or panics.
pub(crate) fn holding<R>(f: impl FnOnce() -> R) -> R {
    struct Holding(bool);
    impl Drop for Holding {
        fn drop(&mut self) {
            HOLDING.set(self.0);
        }
    }
    let _holding = Holding(HOLDING.replace(true));
    f()
}

/// State shared by every worker of one join.
pub(crate) struct Collector<'s> {
    /// The sink, or its parts; empty when counting only.
    sinks: Vec<Mutex<&'s mut dyn PairSink>>,
    error: Mutex<Option<Error>>,
    stopped: AtomicBool,
    count: AtomicU64,
}

impl<'s> Collector<'s> {
    /// Collects into `sink` (its parts, when it has some for `workers` threads).
    pub fn new(sink: Option<&'s mut dyn PairSink>, workers: usize) -> Self {
        let sinks = match sink {
            None => Vec::new(),
            Some(sink) => {
                // Asked twice: an empty answer would still hold the borrow that a kept one
                // needs, and then the sink itself could not be kept.
                if workers > 1 && !sink.parts(workers).is_empty() {
                    sink.parts(workers).into_iter().map(Mutex::new).collect()
                } else {
                    vec![Mutex::new(sink)]
                }
            }
        };
        Collector {
            sinks,
            error: Mutex::new(None),
            stopped: AtomicBool::new(false),
            count: AtomicU64::new(0),
        }
    }

    /// A per-worker emitter; it flushes when full and when dropped.
    pub fn emitter(&self) -> Emitter<'_, 's> {
        Emitter {
            collector: self,
            buf: Vec::new(),
            count: 0,
            collect: !self.sinks.is_empty(),
            // The worker thread's own part (rayon numbers its threads from 0).
            part: rayon::current_thread_index().unwrap_or(0) % self.sinks.len().max(1),
        }
    }

    /// True once the sink failed: workers stop early.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// The number of pairs, or the sink's error (`Cancelled`).
    pub fn finish(self) -> crate::error::Result<u64> {
        if let Some(e) = self.error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        Ok(self.count.into_inner())
    }

    /// Delivers `chunk` to the first part free from `part` on, or waits for that part.
    fn deliver(&self, part: usize, chunk: &[Pair]) {
        if !self.try_deliver(part, chunk) {
            let sink = &self.sinks[part];
            self.push(sink.lock().unwrap_or_else(|p| p.into_inner()), chunk);
        }
    }

    /// `deliver`, unless other workers are in every part: then nothing is delivered and
    /// the answer is false.
    fn try_deliver(&self, part: usize, chunk: &[Pair]) -> bool {
        if chunk.is_empty() || self.stopped() || self.sinks.is_empty() {
            return true;
        }
        let n = self.sinks.len();
        for k in 0..n {
            match self.sinks[(part + k) % n].try_lock() {
                Ok(sink) => self.push(sink, chunk),
                Err(TryLockError::Poisoned(p)) => self.push(p.into_inner(), chunk),
                Err(TryLockError::WouldBlock) => continue,
            }
            return true;
        }
        false
    }

    fn push(&self, mut sink: MutexGuard<&'s mut dyn PairSink>, chunk: &[Pair]) {
        if self.stopped() {
            return;
        }
        if let Err(e) = holding(|| sink.push(chunk)) {
            self.stopped.store(true, Ordering::Relaxed);
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(sink_error(e));
        }
    }
}

/// Where a grid join's hits go, one per worker: pairs to the collector ([`Emitter`]), or
/// each query's whole row (`rows::RowWriter`).
pub(crate) trait Hits<T> {
    /// Query `qid` (coordinates `q`) is within eps of the points at slots `slot + l` of
    /// the index's store, ids `ids[l]`, for the set bits l of `mask` (`ids` holds LANES
    /// values); `unique` (a self-join's half stencil): as `[min, max]` pairs. `AVX`: only
    /// on the path taken after AVX2 was detected.
    #[allow(clippy::too_many_arguments)]
    fn hits<const AVX: bool>(
        &mut self,
        q: &[T],
        qid: u32,
        slot: usize,
        ids: &[u32],
        mask: u32,
        unique: bool,
    );
    /// Every hit of the query at slot `qslot` of the query index's store has been given.
    fn end_query(&mut self, qslot: usize);
    /// The output failed: the join stops early.
    fn stopped(&self) -> bool;
    /// Pairs found so far by this worker (for progress; 0 where not counted).
    fn found(&self) -> u64 {
        0
    }
}

impl<T> Hits<T> for Emitter<'_, '_> {
    #[inline(always)]
    fn hits<const AVX: bool>(
        &mut self,
        _q: &[T],
        qid: u32,
        _slot: usize,
        ids: &[u32],
        mask: u32,
        unique: bool,
    ) {
        let ids = &ids[..LANES];
        #[cfg(target_arch = "x86_64")]
        if AVX {
            // SAFETY: AVX is true only on the path taken after detecting AVX2; `ids` holds
            // LANES values.
            unsafe { self.push_mask_ids_avx2(mask, ids.as_ptr(), qid, unique) };
            return;
        }
        self.push_mask(mask, |l| {
            let id = ids[l];
            if unique {
                [qid.min(id), qid.max(id)]
            } else {
                [qid, id]
            }
        })
    }

    #[inline(always)]
    fn end_query(&mut self, _qslot: usize) {}

    #[inline]
    fn stopped(&self) -> bool {
        self.collector.stopped()
    }

    fn found(&self) -> u64 {
        self.count
    }
}

/// One worker's output buffer.
pub(crate) struct Emitter<'c, 's> {
    collector: &'c Collector<'s>,
    buf: Vec<Pair>,
    count: u64,
    collect: bool,
    /// The sink part this worker delivers to first.
    part: usize,
}

impl Emitter<'_, '_> {
    #[inline(always)]
    pub fn push(&mut self, i: u32, j: u32) {
        self.count += 1;
        if self.collect {
            if self.buf.len() == self.buf.capacity() {
                self.grow_or_flush();
            }
            self.buf.push([i, j]);
        }
    }

    /// Pushes the pairs `pair_of(l)` for the set bits l of `mask` (l < LANES) without a
    /// branch per pair: every lane is written, and the end advances only past hits.
    /// `pair_of` is called for every lane, so it must accept lanes whose bit is clear.
    #[inline(always)]
    pub fn push_mask(&mut self, mask: u32, mut pair_of: impl FnMut(usize) -> Pair) {
        let hits = mask.count_ones() as usize;
        self.count += hits as u64;
        if !self.collect {
            return;
        }
        if self.buf.capacity() - self.buf.len() < LANES {
            self.grow_or_flush();
        }
        let len = self.buf.len();
        let spare = &mut self.buf.spare_capacity_mut()[..LANES];
        let mut k = 0;
        for l in 0..LANES {
            spare[k].write(pair_of(l));
            k += ((mask >> l) & 1) as usize;
        }
        debug_assert_eq!(k, hits);
        // SAFETY: the first `hits` spare entries were written above.
        unsafe { self.buf.set_len(len + hits) };
    }

    /// `push_mask` for pairs of `qid` with `ids[l]` (`unique`: as `[min, max]`), built and
    /// left-packed with AVX2 shuffles instead of one store per lane.
    ///
    /// # Safety
    /// AVX2 must be available and `ids` must point at LANES readable u32.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn push_mask_ids_avx2(
        &mut self,
        mask: u32,
        ids: *const u32,
        qid: u32,
        unique: bool,
    ) {
        use std::arch::x86_64::*;
        let hits = mask.count_ones() as usize;
        self.count += hits as u64;
        if !self.collect {
            return;
        }
        if self.buf.capacity() - self.buf.len() < LANES {
            self.grow_or_flush();
        }
        let v = _mm256_loadu_si256(ids as *const __m256i);
        let q = _mm256_set1_epi32(qid as i32);
        let (first, second) = if unique {
            (_mm256_min_epu32(v, q), _mm256_max_epu32(v, q))
        } else {
            (q, v)
        };
        // Interleave into pairs 0-3 and 4-7 (unpack works within 128-bit halves).
        let lo = _mm256_unpacklo_epi32(first, second);
        let hi = _mm256_unpackhi_epi32(first, second);
        let pairs03 = _mm256_permute2x128_si256::<0x20>(lo, hi);
        let pairs47 = _mm256_permute2x128_si256::<0x31>(lo, hi);
        let (m03, m47) = ((mask & 15) as usize, ((mask >> 4) & 15) as usize);
        let len = self.buf.len();
        let base = self.buf.as_mut_ptr();
        // Each store writes 4 pairs; the spare capacity is >= LANES, so both fit.
        let pack03 = _mm256_loadu_si256(PACK[m03].as_ptr() as *const __m256i);
        _mm256_storeu_si256(
            base.add(len) as *mut __m256i,
            _mm256_permutevar8x32_epi32(pairs03, pack03),
        );
        let after = len + m03.count_ones() as usize;
        let pack47 = _mm256_loadu_si256(PACK[m47].as_ptr() as *const __m256i);
        _mm256_storeu_si256(
            base.add(after) as *mut __m256i,
            _mm256_permutevar8x32_epi32(pairs47, pack47),
        );
        self.buf.set_len(len + hits);
    }

    #[cold]
    fn grow_or_flush(&mut self) {
        let len = self.buf.len();
        if len + LANES <= CHUNK_PAIRS {
            self.buf.reserve(CHUNK_PAIRS.min((len * 2).max(1024)) - len);
        } else if len + LANES > PENDING_PAIRS {
            self.flush();
        } else if self.collector.try_deliver(self.part, &self.buf) {
            self.buf.clear();
        } else {
            // The sink is busy: join on rather than wait (the sink can be the slower side,
            // as DBSCAN's is).
            self.buf.reserve(len.min(PENDING_PAIRS - len));
        }
    }

    pub fn flush(&mut self) {
        self.collector.deliver(self.part, &self.buf);
        self.buf.clear();
    }

    #[inline]
    pub fn stopped(&self) -> bool {
        self.collector.stopped()
    }

    /// Pairs this worker found so far.
    pub fn found(&self) -> u64 {
        self.count
    }
}

impl Drop for Emitter<'_, '_> {
    fn drop(&mut self) {
        self.flush();
        self.collector
            .count
            .fetch_add(self.count, Ordering::Relaxed);
    }
}

/// For each 4-bit mask, the u32 indices that move the selected 64-bit pairs to the front.
#[cfg(target_arch = "x86_64")]
static PACK: [[u32; 8]; 16] = {
    let mut table = [[0u32; 8]; 16];
    let mut m = 0;
    while m < 16 {
        let mut k = 0;
        let mut e = 0;
        while e < 4 {
            if m & (1 << e) != 0 {
                table[m][2 * k] = 2 * e as u32;
                table[m][2 * k + 1] = 2 * e as u32 + 1;
                k += 1;
            }
            e += 1;
        }
        m += 1;
    }
    table
};
