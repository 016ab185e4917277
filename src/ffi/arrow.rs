//! Join results as an Arrow C stream (`simjoin_self_join_arrow`, `simjoin_join_arrow`).

use super::engine::simjoin_engine;
use super::matrix::{read_matrix, simjoin_matrix};
use super::options::{read_options, simjoin_options};
use super::{guard, null_arg, simjoin_status};
use crate::result::arrow::PairBatches;
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use std::ffi::c_void;

/// The streaming body of both calls.
///
/// # Safety
/// The header's contract for `simjoin_self_join_arrow`.
unsafe fn start(
    engine: *const simjoin_engine,
    a: *const simjoin_matrix,
    b: Option<*const simjoin_matrix>,
    opts: *const simjoin_options,
    out: *mut c_void,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: NULL or live matrices whose data stay alive until the stream is released
        // (header contract).
        let mut a_points = unsafe { read_matrix(if b.is_some() { "a" } else { "points" }, a) }?;
        // SAFETY: as above.
        let mut b_points = b.map(|b| unsafe { read_matrix("b", b) }).transpose()?;
        // SAFETY: NULL or a live simjoin_options of its stated size (header contract).
        let opts = unsafe { read_options(opts) }?;
        let a = a_points.dataset()?;
        let b = b_points.as_ref().map(|p| p.dataset()).transpose()?;
        // SAFETY: the caller keeps the engine and the matrices' data alive until it calls
        // the stream's release (header contract), which drops the reader; float16 input's
        // widened copies go to the reader (below), which frees them after its thread.
        let mut reader = unsafe { PairBatches::start(&engine.engine, &a, b.as_ref(), &opts) }?;
        reader.keep(a_points.take_widened());
        if let Some(b) = b_points.as_mut() {
            reader.keep(b.take_widened());
        }
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        // SAFETY: `out` is non-NULL (checked) and points at writable storage for a
        // `struct ArrowArrayStream` (header contract); it is written, not dropped.
        unsafe { std::ptr::write(out as *mut FFI_ArrowArrayStream, stream) };
        Ok(())
    })
}

/// Self-join streamed as Arrow record batches: fills `*out`, a caller-allocated `struct
/// ArrowArrayStream` (the Arrow C stream interface), whose batches have columns `i`, `j`
/// (uint32, i < j) and, with `opts->distances`, `distance` (float or double, the points'
/// type). The join runs on a thread of its own while the consumer pulls batches (at most a
/// few chunks ahead: a result larger than memory streams through), unsorted; `output` and
/// `sorted` are ignored. The engine and the points' data must stay alive until the
/// consumer calls the stream's `release`, which stops the join if it is still running.
/// Errors of the join come out of the stream's `get_next`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_self_join_arrow(
    engine: *const simjoin_engine,
    points: *const simjoin_matrix,
    opts: *const simjoin_options,
    out: *mut c_void,
) -> simjoin_status {
    // SAFETY: this function's contract is `start`'s.
    unsafe { start(engine, points, None, opts, out) }
}

/// A join B streamed as Arrow record batches (`i` in A, `j` in B); see
/// `simjoin_self_join_arrow`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_join_arrow(
    engine: *const simjoin_engine,
    a: *const simjoin_matrix,
    b: *const simjoin_matrix,
    opts: *const simjoin_options,
    out: *mut c_void,
) -> simjoin_status {
    // SAFETY: this function's contract is `start`'s.
    unsafe { start(engine, a, Some(b), opts, out) }
}
