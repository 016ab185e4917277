//! The join calls: collected (`simjoin_self_join`, `simjoin_join`), streamed to a
//! callback (`simjoin_self_join_stream`, `simjoin_join_stream`), and each row's neighbour
//! count (`simjoin_neighbour_counts`).

use super::engine::simjoin_engine;
use super::matrix::{read_matrix, simjoin_matrix};
use super::options::{read_options, simjoin_options};
use super::result::{into_handle, simjoin_result};
use super::{guard, null_arg, simjoin_status};
use crate::result::{JoinOutput, JoinResult, Pair};
use std::ffi::{c_int, c_void};

/// Receives result pairs during a streaming join: `pairs` holds `count` pairs as
/// `2*count` uint32 values (i0, j0, i1, j1, ...), valid only during the call. Return 0 to
/// go on, non-zero to stop the join (the call then returns SIMJOIN_CANCELLED and the
/// callback is not called again). Chunks
/// arrive one at a time (never concurrently), in no particular order. The callback must
/// not unwind (no C++ exception, no longjmp) through simjoin.
pub type simjoin_pair_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, pairs: *const u32, count: usize) -> c_int>;

/// Adapts a C callback to the engine's `PairSink`.
struct CallbackSink {
    callback: unsafe extern "C" fn(*mut c_void, *const u32, usize) -> c_int,
    user_data: *mut c_void,
    /// Set once the callback asked to stop: it is never called again, even if parallel
    /// workers still deliver chunks before the join winds down.
    stopped: bool,
}

// SAFETY: the caller promises (header) that its callback and user_data may be used from the
// thread the engine calls the sink on; the engine calls the sink from one thread at a time.
unsafe impl Send for CallbackSink {}

impl crate::result::PairSink for CallbackSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        if self.stopped {
            anyhow::bail!("the callback asked to stop");
        }
        // SAFETY: the callback is the caller's (non-NULL, checked); `chunk` is `count` pairs of
        // two u32s, live for the call, as the header documents.
        let code =
            unsafe { (self.callback)(self.user_data, chunk.as_ptr() as *const u32, chunk.len()) };
        if code != 0 {
            self.stopped = true;
            anyhow::bail!("the callback returned {code}");
        }
        Ok(())
    }
}

/// Self-join: all pairs of points of `points` within `opts->eps`. On success `*out` holds
/// a new result (free it with `simjoin_result_free`).
#[no_mangle]
pub unsafe extern "C" fn simjoin_self_join(
    engine: *const simjoin_engine,
    points: *const simjoin_matrix,
    opts: *const simjoin_options,
    out: *mut *mut simjoin_result,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: NULL or live structs whose data outlive this call (header contract).
        let a_points = unsafe { read_matrix("points", points) }?;
        let a = a_points.dataset()?;
        // SAFETY: NULL or a live simjoin_options of its stated size (header contract).
        let opts = unsafe { read_options(opts) }?;
        let result = engine.engine.self_join(&a, &opts)?;
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = Box::into_raw(into_handle(result)) };
        Ok(())
    })
}

/// Each row's number of rows within `opts->eps` in the self-join of `points`, the row
/// itself included (DBSCAN's core-point count; a density score for outlier detection).
/// On a GPU they are counted on the device (one count per row read back, no pairs); on
/// the CPU from the join's streamed pairs. `opts` is required (it holds eps); its output
/// form, sorting and distances do not apply. On
/// success `counts` (`points->rows` entries; may be NULL only when rows is 0) holds the
/// counts and `*pairs` (NULL when not wanted) the self-join's number of pairs.
#[no_mangle]
pub unsafe extern "C" fn simjoin_neighbour_counts(
    engine: *const simjoin_engine,
    points: *const simjoin_matrix,
    opts: *const simjoin_options,
    counts: *mut u32,
    pairs: *mut u64,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        // SAFETY: NULL or a live matrix whose data outlive this call (header contract).
        let a_points = unsafe { read_matrix("points", points) }?;
        let a = a_points.dataset()?;
        if counts.is_null() && !a.is_empty() {
            return Err(null_arg("counts"));
        }
        // SAFETY: NULL or a live simjoin_options of its stated size (header contract).
        let opts = unsafe { read_options(opts) }?;
        let (got, report) = engine.engine.neighbour_counts(&a, &opts)?;
        if !got.is_empty() {
            // SAFETY: `counts` is non-NULL (checked above: rows > 0) and writable for
            // `points->rows` = got.len() entries (header contract); not our allocation.
            unsafe { std::ptr::copy_nonoverlapping(got.as_ptr(), counts, got.len()) };
        }
        // SAFETY: NULL (skipped) or a writable uint64_t (header contract).
        if let Some(out) = unsafe { pairs.as_mut() } {
            *out = report.pairs;
        }
        Ok(())
    })
}

/// A join B: all pairs (i in A, j in B) within `opts->eps`. A and B must have the same
/// number of columns and the same dtype.
#[no_mangle]
pub unsafe extern "C" fn simjoin_join(
    engine: *const simjoin_engine,
    a: *const simjoin_matrix,
    b: *const simjoin_matrix,
    opts: *const simjoin_options,
    out: *mut *mut simjoin_result,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: NULL or live structs whose data outlive this call (header contract).
        let (a_points, b_points) = unsafe { (read_matrix("a", a)?, read_matrix("b", b)?) };
        let (a, b) = (a_points.dataset()?, b_points.dataset()?);
        // SAFETY: NULL or a live simjoin_options of its stated size (header contract).
        let opts = unsafe { read_options(opts) }?;
        let result = engine.engine.join(&a, &b, &opts)?;
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = Box::into_raw(into_handle(result)) };
        Ok(())
    })
}

/// The streaming joins' common body.
///
/// # Safety
/// The header's contract for `simjoin_self_join_stream` / `simjoin_join_stream`.
unsafe fn stream(
    engine: *const simjoin_engine,
    a: *const simjoin_matrix,
    b: Option<*const simjoin_matrix>,
    opts: *const simjoin_options,
    callback: simjoin_pair_callback,
    user_data: *mut c_void,
    out: *mut *mut simjoin_result,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        let callback = callback.ok_or_else(|| null_arg("callback"))?;
        // SAFETY: NULL or live structs whose data outlive this call (header contract).
        let a_points = unsafe { read_matrix(if b.is_some() { "a" } else { "points" }, a) }?;
        let a = a_points.dataset()?;
        // SAFETY: as above.
        let b_points = b.map(|b| unsafe { read_matrix("b", b) }).transpose()?;
        let b = b_points.as_ref().map(|p| p.dataset()).transpose()?;
        // SAFETY: NULL or a live simjoin_options of its stated size (header contract).
        let opts = unsafe { read_options(opts) }?;
        let mut sink = CallbackSink {
            callback,
            user_data,
            stopped: false,
        };
        let report = match &b {
            None => engine.engine.self_join_stream(&a, &opts, &mut sink)?,
            Some(b) => engine.engine.join_stream(&a, b, &opts, &mut sink)?,
        };
        if !out.is_null() {
            let result = JoinResult {
                output: JoinOutput::Count(report.pairs),
                report,
                distances: None,
            };
            // SAFETY: `out` is non-NULL (checked) and writable (header contract).
            unsafe { *out = Box::into_raw(into_handle(result)) };
        }
        Ok(())
    })
}

/// Streaming self-join: unique pairs (i < j) go to `callback` in chunks as batches finish
/// (`opts->output` and `opts->sorted` are ignored). `out` may be NULL; otherwise on
/// success it receives a count-only result with the report.
#[no_mangle]
pub unsafe extern "C" fn simjoin_self_join_stream(
    engine: *const simjoin_engine,
    points: *const simjoin_matrix,
    opts: *const simjoin_options,
    callback: simjoin_pair_callback,
    user_data: *mut c_void,
    out: *mut *mut simjoin_result,
) -> simjoin_status {
    // SAFETY: this function's contract is `stream`'s.
    unsafe { stream(engine, points, None, opts, callback, user_data, out) }
}

/// Streaming A join B: pairs (i in A, j in B) go to `callback`; see
/// `simjoin_self_join_stream`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_join_stream(
    engine: *const simjoin_engine,
    a: *const simjoin_matrix,
    b: *const simjoin_matrix,
    opts: *const simjoin_options,
    callback: simjoin_pair_callback,
    user_data: *mut c_void,
    out: *mut *mut simjoin_result,
) -> simjoin_status {
    // SAFETY: this function's contract is `stream`'s.
    unsafe { stream(engine, a, Some(b), opts, callback, user_data, out) }
}
