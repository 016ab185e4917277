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
    /// Bumped by every return, so that the waiting thread frees only after a quiet `KEEP`.
    generation: u64,
    /// The process whose thread waits to free the pool, if one does (a forked child
    /// inherits the pool but not the thread).
    reaper: Option<u32>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    slabs: Vec::new(),
    bytes: 0,
    generation: 0,
    reaper: None,
});

fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SIMJOIN_KEEP_SCRATCH").is_none_or(|v| v != "0"))
}

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // A panic while holding the lock leaves the pool consistent (every step keeps `bytes`
    // equal to the slabs' sizes), so a poisoned lock is used as it is.
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// An empty slab of `T` with room for at least `len` and at most `2 len` elements, if one
/// waits (`T`: u32, f32 or f64; none of another type ever waits).
pub(crate) fn take<T: 'static>(len: usize) -> Option<Vec<T>> {
    let mut p = pool();
    let k = p.slabs.iter().position(|s| {
        s.fits::<T>()
            .is_some_and(|cap| cap >= len && cap / 2 <= len)
    })?;
    let slab = p.slabs.swap_remove(k);
    p.bytes -= slab.bytes();
    slab.into_vec::<T>().ok()
}

/// Slabs whose join is done: kept for the next one where there is room, else freed (as
/// are slabs of types other than u32, f32 and f64).
pub(crate) fn give<T: 'static>(slabs: Vec<Vec<T>>) {
    if slabs.is_empty() || !enabled() {
        return;
    }
    let mut spare = Vec::new();
    {
        let mut p = pool();
        for slab in slabs {
            let Some(mut slab) = Slab::of(slab) else {
                continue;
            };
            slab.clear();
            if p.bytes + slab.bytes() <= CAP {
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
                .spawn(reap)
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

/// Frees every waiting slab now: for an allocation that failed, to try again.
pub(crate) fn release() {
    let freed = {
        let mut p = pool();
        p.bytes = 0;
        std::mem::take(&mut p.slabs)
    };
    drop(freed);
}

/// The waiting thread: frees every slab once `KEEP` passes with none returned.
fn reap() {
    let mut seen = pool().generation;
    loop {
        std::thread::sleep(KEEP);
        let freed = {
            let mut p = pool();
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

/// Bytes waiting now (for the tests).
#[cfg(test)]
fn waiting() -> usize {
    pool().bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slabs_are_reused_by_size_then_freed() {
        // Other tests of this binary use the pool too: look for this test's slab among
        // what is handed out, and give the others back.
        let slab: Vec<u32> = Vec::with_capacity(3_000_017);
        let at = slab.as_ptr();
        give(vec![slab]);
        let mut others = Vec::new();
        // Too large a slab for a request under half its size is not handed out.
        while let Some(s) = take(1_000_000) {
            assert_ne!(s.as_ptr(), at);
            others.push(s);
        }
        let again = loop {
            let s = take(2_000_000).expect("this test's slab, waiting");
            if s.as_ptr() == at {
                break s;
            }
            others.push(s);
        };
        assert!(again.is_empty() && again.capacity() >= 2_000_000);
        give(others);
        give(vec![again]);
        // Freed, by the waiting thread, once KEEP passes with nothing returned.
        let deadline = std::time::Instant::now() + 60 * KEEP;
        while waiting() != 0 || pool().reaper.is_some() {
            assert!(std::time::Instant::now() < deadline, "scratch never freed");
            std::thread::sleep(KEEP / 10);
        }
    }

    #[test]
    fn slabs_keep_their_type_and_release_frees_them() {
        let slab: Vec<f64> = Vec::with_capacity(1_000_003);
        let at = slab.as_ptr() as usize;
        give(vec![slab]);
        // Not handed out as another type.
        let mut others = Vec::new();
        while let Some(s) = take::<u32>(1_000_003) {
            assert_ne!(s.as_ptr() as usize, at);
            others.push(s);
        }
        give(others);
        release();
        while let Some(s) = take::<f64>(1_000_003) {
            assert_ne!(s.as_ptr() as usize, at, "released, yet handed out");
        }
    }

    #[test]
    fn at_most_cap_waits() {
        let big: Vec<Vec<u32>> = (0..3)
            .map(|_| Vec::with_capacity(CAP / 4 / 2 + 1))
            .collect();
        give(big);
        assert!(waiting() <= CAP);
    }
}
