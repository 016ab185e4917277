//! Result collection shared by the CPU algorithms: each worker fills its own buffer and
//! hands it to the sink in large chunks (one short lock per chunk, none per pair).
//! Count-only runs (no sink) only count.

use super::store::LANES;
use crate::error::Error;
use crate::result::{sink_error, Pair, PairSink};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Pairs a worker buffers before it takes the sink's lock.
const CHUNK_PAIRS: usize = 1 << 16;

/// State shared by every worker of one join.
pub(crate) struct Collector<'s> {
    sink: Option<Mutex<&'s mut dyn PairSink>>,
    error: Mutex<Option<Error>>,
    stopped: AtomicBool,
    count: AtomicU64,
}

impl<'s> Collector<'s> {
    pub fn new(sink: Option<&'s mut dyn PairSink>) -> Self {
        Collector {
            sink: sink.map(Mutex::new),
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
            collect: self.sink.is_some(),
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

    fn deliver(&self, chunk: &[Pair]) {
        if chunk.is_empty() || self.stopped() {
            return;
        }
        let Some(sink) = &self.sink else { return };
        let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
        if self.stopped() {
            return;
        }
        if let Err(e) = sink.push(chunk) {
            self.stopped.store(true, Ordering::Relaxed);
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(sink_error(e));
        }
    }
}

/// One worker's output buffer.
pub(crate) struct Emitter<'c, 's> {
    collector: &'c Collector<'s>,
    buf: Vec<Pair>,
    count: u64,
    collect: bool,
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

    #[cold]
    fn grow_or_flush(&mut self) {
        if self.buf.len() + LANES > CHUNK_PAIRS {
            self.flush();
        } else {
            self.buf
                .reserve(CHUNK_PAIRS.min((self.buf.len() * 2).max(1024)) - self.buf.len());
        }
    }

    pub fn flush(&mut self) {
        self.collector.deliver(&self.buf);
        self.buf.clear();
    }

    #[inline]
    pub fn stopped(&self) -> bool {
        self.collector.stopped()
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
