//! Scratch memory kept between joins: the slabs of the streaming sinks' bucket stores
//! (`radix::Buckets`: the sorted pairs' and the CSR's) and the whole-row writers' blocks of
//! ids and distances (`cpu/rows.rs`).
//!
//! A sorted CSR of 1M 3-D points buckets its 32M entries into 128 MB of slabs, freed when
//! the result is assembled. Fresh memory costs a page fault and the kernel's zeroing of
//! each page, and on a VM whatever the host does to back it: among the result benchmark's
//! six paths taking turns (`bench/RESULTS_BENCH.md`, 2026-11-26 midday), the sorted CSR's
//! median fell from 237.3 to 224.4 ms and from 230.2 to 218.8 in two runs when its slabs
//! were kept for the next call; in 2-D, with the rows' blocks kept too, the CSR's from
//! 144.4 to 136.7 and 142.2 to 131.7 ms, the CSR with distances' from 323.9 to 218.4 and
//! 261.8 to 239.5. So a slab, once its join is done, waits here for the next
//! join that needs one of about its size, and every slab left waiting is freed about
//! `KEEP` after the last one came back (by a thread that only sleeps and frees): a process
//! that joins in a loop reuses its scratch, one that joined once gets it back soon. At
//! most `CAP` bytes wait at a time, and all are freed ([`release`]) before a fresh
//! allocation that failed is tried again. `SIMJOIN_KEEP_SCRATCH=0` frees each slab at once.
//!
//! Only internal scratch comes here, never a result's memory (which is the caller's), and
//! a slab is handed out as capacity only: its previous contents are never read, since the
//! stores read back only what they wrote.

use std::any::Any;
use std::sync::Mutex;
use std::time::Duration;

/// How long a slab waits for another join after the last one came back.
const KEEP: Duration = Duration::from_secs(1);
/// Bytes that may wait at once: the slabs of a CSR of about 128M entries.
const CAP: usize = 512 << 20;

/// A waiting slab, of one of the element types scratch is made of.
enum Slab {
    U32(Vec<u32>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Slab {
    /// `v` as a slab, if its element type is one of them.
    fn of<T: 'static>(v: Vec<T>) -> Option<Slab> {
        Slab::of_any(Box::new(v))
    }

    /// The slab as a `Vec<T>`, if T is its element type.
    fn into_vec<T: 'static>(self) -> Result<Vec<T>, Slab> {
        let v: Box<dyn Any> = match self {
            Slab::U32(v) => Box::new(v),
            Slab::F32(v) => Box::new(v),
            Slab::F64(v) => Box::new(v),
        };
        v.downcast::<Vec<T>>()
            .map(|v| *v)
            .map_err(|v| Slab::of_any(v).expect("one of the slab types"))
    }

    /// A boxed `Vec` of u32, f32 or f64 as a slab.
    fn of_any(v: Box<dyn Any>) -> Option<Slab> {
        let v = match v.downcast::<Vec<u32>>() {
            Ok(v) => return Some(Slab::U32(*v)),
            Err(v) => v,
        };
        let v = match v.downcast::<Vec<f32>>() {
            Ok(v) => return Some(Slab::F32(*v)),
            Err(v) => v,
        };
        v.downcast::<Vec<f64>>().ok().map(|v| Slab::F64(*v))
    }

    /// Whether it holds `T` elements, and how many fit.
    fn fits<T: 'static>(&self) -> Option<usize> {
        use std::any::TypeId;
        let (t, cap) = match self {
            Slab::U32(v) => (TypeId::of::<u32>(), v.capacity()),
            Slab::F32(v) => (TypeId::of::<f32>(), v.capacity()),
            Slab::F64(v) => (TypeId::of::<f64>(), v.capacity()),
        };
        (t == TypeId::of::<T>()).then_some(cap)
    }

    fn bytes(&self) -> usize {
        match self {
            Slab::U32(v) => v.capacity() * 4,
            Slab::F32(v) => v.capacity() * 4,
            Slab::F64(v) => v.capacity() * 8,
        }
    }

    fn clear(&mut self) {
        match self {
            Slab::U32(v) => v.clear(),
            Slab::F32(v) => v.clear(),
            Slab::F64(v) => v.clear(),
        }
    }
}

struct Pool {
    slabs: Vec<Slab>,
    bytes: usize,
    /// Bumped by every return, so that the waiting thread frees only after a quiet `keep`.
    generation: u64,
    /// The process whose thread waits to free the pool, if one does (a forked child
    /// inherits the pool but not the thread).
    reaper: Option<u32>,
}

/// A pool of waiting slabs: the process's one ([`take`], [`give`], [`release`]), and the
/// tests' own.
struct Scratch {
    pool: Mutex<Pool>,
    /// How long a slab waits after the last one came back, and the bytes that may wait.
    keep: Duration,
    cap: usize,
}

static SCRATCH: Scratch = Scratch::new(KEEP, CAP);

/// `SIMJOIN_KEEP_SCRATCH=0`: nothing waits.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SIMJOIN_KEEP_SCRATCH").is_none_or(|v| v != "0"))
}

/// An empty slab of `T` with room for at least `len` and at most `2 len` elements, if one
/// waits (`T`: u32, f32 or f64; none of another type ever waits).
pub(crate) fn take<T: 'static>(len: usize) -> Option<Vec<T>> {
    SCRATCH.take(len)
}

/// Slabs whose join is done: kept for the next one where there is room, else freed (as
/// are slabs of types other than u32, f32 and f64).
pub(crate) fn give<T: 'static>(slabs: Vec<Vec<T>>) {
    if enabled() {
        SCRATCH.give(slabs);
    }
}

/// An empty buffer with room for `len` elements: a waiting slab ([`take`]), else fresh
/// memory advised onto huge pages, tried once more after [`release`] if it fails; `None`
/// if out of memory.
pub(crate) fn take_or_alloc<T: 'static>(len: usize) -> Option<Vec<T>> {
    if let Some(v) = take(len) {
        return Some(v);
    }
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        // Memory other joins left waiting may be what is missing.
        release();
        v.try_reserve_exact(len).ok()?;
    }
    crate::result::huge::advise(&mut v);
    Some(v)
}

/// Frees every waiting slab now: for an allocation that failed, to try again.
pub(crate) fn release() {
    SCRATCH.release();
}

impl Scratch {
    const fn new(keep: Duration, cap: usize) -> Self {
        Scratch {
            pool: Mutex::new(Pool {
                slabs: Vec::new(),
                bytes: 0,
                generation: 0,
                reaper: None,
            }),
            keep,
            cap,
        }
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        // A panic while holding the lock leaves the pool consistent (every step keeps
        // `bytes` equal to the slabs' sizes), so a poisoned lock is used as it is.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take<T: 'static>(&self, len: usize) -> Option<Vec<T>> {
        let mut p = self.pool();
        let k = p.slabs.iter().position(|s| {
            s.fits::<T>()
                .is_some_and(|cap| cap >= len && cap / 2 <= len)
        })?;
        let slab = p.slabs.swap_remove(k);
        p.bytes -= slab.bytes();
        slab.into_vec::<T>().ok()
    }

    fn give<T: 'static>(&'static self, slabs: Vec<Vec<T>>) {
        if slabs.is_empty() {
            return;
        }
        let mut spare = Vec::new();
        {
            let mut p = self.pool();
            for slab in slabs {
                let Some(mut slab) = Slab::of(slab) else {
                    continue;
                };
                slab.clear();
                if p.bytes + slab.bytes() <= self.cap {
                    p.bytes += slab.bytes();
                    p.slabs.push(slab);
                } else {
                    spare.push(slab);
                }
            }
            p.generation += 1;
            if p.reaper != Some(std::process::id()) {
                let spawned = std::thread::Builder::new()
                    .name("simjoin-scratch".into())
                    .spawn(|| self.reap())
                    .is_ok();
                if spawned {
                    p.reaper = Some(std::process::id());
                } else {
                    // No thread to free them later: free them now.
                    spare.append(&mut p.slabs);
                    p.bytes = 0;
                }
            }
        }
        // Freed outside the lock (unmapping takes a few ms).
        drop(spare);
    }

    fn release(&self) {
        let freed = {
            let mut p = self.pool();
            p.bytes = 0;
            std::mem::take(&mut p.slabs)
        };
        drop(freed);
    }

    /// The waiting thread: frees every slab once `keep` passes with none returned.
    fn reap(&self) {
        let mut seen = self.pool().generation;
        loop {
            std::thread::sleep(self.keep);
            let freed = {
                let mut p = self.pool();
                if p.generation != seen {
                    seen = p.generation;
                    continue;
                }
                p.reaper = None;
                p.bytes = 0;
                std::mem::take(&mut p.slabs)
            };
            drop(freed);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test its own pool, whose slabs wait `ms` milliseconds, 64 MiB at most (long
    /// enough that a loaded machine does not free them while a test looks).
    macro_rules! pool {
        ($ms:expr) => {{
            static S: Scratch = Scratch::new(Duration::from_millis($ms), 64 << 20);
            &S
        }};
    }

    #[test]
    fn slabs_are_reused_by_size_then_freed() {
        let s = pool!(500);
        let slab: Vec<u32> = Vec::with_capacity(3_000_017);
        let at = slab.as_ptr();
        s.give(vec![slab]);
        assert_eq!(s.pool().bytes, 3_000_017 * 4);
        // Not for a request under half its size, nor one above it.
        assert!(s.take::<u32>(1_000_000).is_none());
        assert!(s.take::<u32>(3_000_018).is_none());
        let again = s.take::<u32>(2_000_000).expect("the slab, waiting");
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty() && again.capacity() == 3_000_017);
        assert_eq!(s.pool().bytes, 0);
        s.give(vec![again]);
        // Freed, by the waiting thread, once `keep` passes with nothing returned.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while s.pool().bytes != 0 || s.pool().reaper.is_some() {
            assert!(std::time::Instant::now() < deadline, "scratch never freed");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(s.take::<u32>(3_000_017).is_none());
    }

    #[test]
    fn slabs_keep_their_type_and_release_frees_them() {
        let s = pool!(60_000);
        s.give(vec![Vec::<f64>::with_capacity(1_000_003)]);
        s.give(vec![Vec::<u8>::with_capacity(1_000_003)]);
        // Not handed out as another type; a type that never waits is dropped.
        assert!(s.take::<u32>(1_000_003).is_none());
        assert!(s.take::<f32>(1_000_003).is_none());
        assert_eq!(s.pool().bytes, 1_000_003 * 8);
        s.release();
        assert_eq!(s.pool().bytes, 0);
        assert!(s.take::<f64>(1_000_003).is_none());
    }

    #[test]
    fn at_most_cap_waits() {
        let s = pool!(60_000);
        // Three slabs of 24 MiB: two fit 64 MiB, the third is freed.
        s.give((0..3).map(|_| Vec::<u32>::with_capacity(6 << 20)).collect());
        assert_eq!(s.pool().bytes, 2 * (24 << 20));
        assert_eq!(s.pool().slabs.len(), 2);
    }
}
