//! Result collection shared by the CPU algorithms: each worker fills its own buffer and
//! hands it to the sink in large chunks (one short lock per chunk, none per pair).
//! Count-only runs (no sink) only count.

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

    #[cold]
    fn grow_or_flush(&mut self) {
        if self.buf.len() >= CHUNK_PAIRS {
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
