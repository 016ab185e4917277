//! The C ABI (`include/simjoin.h`, generated from this module by cbindgen).
//!
//! Conventions (rustls-ffi style):
//! - every function returns a `simjoin_status` with fixed numbers (or a plain value when it
//!   cannot fail); on failure `simjoin_last_error_message` gives the engine's message;
//! - out-parameters are written only on success;
//! - every `_free` accepts NULL;
//! - no panic crosses the boundary: each body runs inside `catch_unwind`, and a panic
//!   becomes `SIMJOIN_INTERNAL`;
//! - input coordinates are borrowed (never copied by this layer), row-major f32 or f64;
//! - `simjoin_options` starts with its own size so that it can grow without breaking
//!   callers compiled against an older header.
//!
//! Threads: a `simjoin_engine` may be used from several threads at once (the Rust `Engine`
//! is `Send + Sync`). A `simjoin_result` is immutable: its accessors may be called from
//! several threads at once, and it may be freed from any thread (once, after all readers
//! are done). The last-error message is per thread.

#![allow(non_camel_case_types)]
// Every exported function checks its pointers for NULL; the rest of their contract
// (valid, aligned, live memory) is documented in the header and is the caller's to keep.
#![allow(clippy::missing_safety_doc)]

use crate::dataset::Dataset;
use crate::engine::Engine;
use crate::error::{Error, ErrorKind};
use crate::options::{Algorithm, Backend, JoinOptions, Metric, OutputForm};
use crate::result::{JoinOutput, JoinResult, Pair};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status of a call. The numbers are fixed: new statuses are only ever appended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum simjoin_status {
    SIMJOIN_OK = 0,
    /// Bad input: a NULL pointer, NaN/inf coordinates, eps <= 0 or NaN, zero dimensions,
    /// mismatched dimensions or precisions, an unknown enum value.
    SIMJOIN_INVALID_ARGUMENT = 1,
    /// The option combination or the device does not support what was asked.
    SIMJOIN_UNSUPPORTED = 2,
    /// A GPU was asked for and no usable Vulkan device exists.
    SIMJOIN_NO_DEVICE = 3,
    SIMJOIN_OUT_OF_DEVICE_MEMORY = 4,
    SIMJOIN_OUT_OF_HOST_MEMORY = 5,
    SIMJOIN_DEVICE_LOST = 6,
    /// The streaming callback returned non-zero and the join was stopped.
    SIMJOIN_CANCELLED = 7,
    SIMJOIN_IO = 8,
    /// A bug (including a caught panic) or an unexpected driver answer.
    SIMJOIN_INTERNAL = 9,
}

use simjoin_status::*;

impl From<ErrorKind> for simjoin_status {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => SIMJOIN_INVALID_ARGUMENT,
            ErrorKind::Unsupported => SIMJOIN_UNSUPPORTED,
            ErrorKind::NoDevice => SIMJOIN_NO_DEVICE,
            ErrorKind::OutOfDeviceMemory => SIMJOIN_OUT_OF_DEVICE_MEMORY,
            ErrorKind::OutOfHostMemory => SIMJOIN_OUT_OF_HOST_MEMORY,
            ErrorKind::DeviceLost => SIMJOIN_DEVICE_LOST,
            ErrorKind::Cancelled => SIMJOIN_CANCELLED,
            ErrorKind::Io => SIMJOIN_IO,
            ErrorKind::Internal => SIMJOIN_INTERNAL,
        }
    }
}

// Enum-like option values are plain u32 typedefs with #defined constants rather than Rust
// enums: the caller may store any number in the struct, and reading an out-of-range value
// into a Rust enum would be undefined behaviour. Unknown numbers are rejected instead.
// The numbers are literals so that cbindgen can write them; a test checks that they equal
// the Rust enums' discriminants.

/// Distance function: one of `SIMJOIN_METRIC_*`.
pub type simjoin_metric = u32;
pub const SIMJOIN_METRIC_EUCLIDEAN: simjoin_metric = 0;
pub const SIMJOIN_METRIC_MANHATTAN: simjoin_metric = 1;
pub const SIMJOIN_METRIC_CHEBYSHEV: simjoin_metric = 2;

/// Where the join runs: one of `SIMJOIN_BACKEND_*`.
pub type simjoin_backend = u32;
pub const SIMJOIN_BACKEND_AUTO: simjoin_backend = 0;
pub const SIMJOIN_BACKEND_CPU: simjoin_backend = 1;
pub const SIMJOIN_BACKEND_GPU: simjoin_backend = 2;

/// Join algorithm: one of `SIMJOIN_ALGORITHM_*`.
pub type simjoin_algorithm = u32;
pub const SIMJOIN_ALGORITHM_AUTO: simjoin_algorithm = 0;
pub const SIMJOIN_ALGORITHM_GRID: simjoin_algorithm = 1;
pub const SIMJOIN_ALGORITHM_EGO: simjoin_algorithm = 2;
pub const SIMJOIN_ALGORITHM_BRUTE: simjoin_algorithm = 3;
pub const SIMJOIN_ALGORITHM_LSS: simjoin_algorithm = 4;

/// What a join returns: one of `SIMJOIN_OUTPUT_*`.
pub type simjoin_output = u32;
/// Self-join: unique pairs (i < j). A join B: pairs (i in A, j in B).
pub const SIMJOIN_OUTPUT_PAIRS: simjoin_output = 0;
/// Neighbour table in CSR form (self-join: both directions).
pub const SIMJOIN_OUTPUT_CSR: simjoin_output = 1;
/// Only the number of pairs.
pub const SIMJOIN_OUTPUT_COUNT: simjoin_output = 2;

/// Coordinate type of a `simjoin_matrix`: one of `SIMJOIN_DTYPE_*`.
pub type simjoin_dtype = u32;
pub const SIMJOIN_DTYPE_F32: simjoin_dtype = 0;
pub const SIMJOIN_DTYPE_F64: simjoin_dtype = 1;

/// A borrowed row-major point set: point i is `data[i*cols .. (i+1)*cols]`, in `float`
/// (SIMJOIN_DTYPE_F32) or `double` (SIMJOIN_DTYPE_F64). `data` may be NULL only when
/// `rows == 0`. simjoin reads it during the call only and never keeps it.
#[repr(C)]
pub struct simjoin_matrix {
    pub data: *const c_void,
    /// Number of points.
    pub rows: usize,
    /// Dimensions per point (>= 1).
    pub cols: usize,
    pub dtype: simjoin_dtype,
}

/// Join options. Call `simjoin_options_init` first: it sets `size` and every default.
/// `size` lets the struct grow: a library reads only the fields the caller's struct has
/// and uses defaults for the rest.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_options {
    /// `sizeof(simjoin_options)` as the caller compiled it.
    pub size: usize,
    /// Distance threshold: finite and > 0. A pair matches when dist <= eps.
    pub eps: f64,
    pub metric: simjoin_metric,
    pub backend: simjoin_backend,
    pub algorithm: simjoin_algorithm,
    pub output: simjoin_output,
    /// Non-zero: sort pairs lexicographically (and CSR rows by neighbour id).
    pub sorted: u32,
    /// Non-zero: self-join CSR lists each point as its own neighbour.
    pub include_self: u32,
    /// CPU worker threads (0 = all cores).
    pub threads: u64,
    /// GPU grid: indexed dimensions (0 = chosen automatically).
    pub indexed_dims: u64,
    /// GPU: query points per batch (0 = automatic).
    pub batch_points: u64,
    /// GPU: result buffer capacity in pairs (0 = automatic).
    pub result_buffer_pairs: u64,
    /// Vulkan device index or name substring, NUL-terminated (NULL = default).
    pub device: *const c_char,
}

impl simjoin_options {
    fn defaults() -> Self {
        let d = JoinOptions::new(1.0);
        simjoin_options {
            size: std::mem::size_of::<simjoin_options>(),
            eps: 0.0,
            metric: d.metric as u32,
            backend: d.backend as u32,
            algorithm: d.algorithm as u32,
            output: d.output as u32,
            sorted: d.sorted as u32,
            include_self: d.include_self as u32,
            threads: 0,
            indexed_dims: 0,
            batch_points: 0,
            result_buffer_pairs: 0,
            device: std::ptr::null(),
        }
    }
}

/// The engine (opaque). Thread-safe: share one across threads freely.
pub struct simjoin_engine {
    engine: Engine,
}

// What the header promises about threads, checked at compile time.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<simjoin_engine>();
    shareable::<simjoin_result>();
};

/// A join result (opaque, immutable): the output (pairs, CSR or count) and a report of
/// what ran. Pointers it hands out stay valid until `simjoin_result_free`.
pub struct simjoin_result {
    result: JoinResult,
    backend: CString,
    device: CString,
}

/// Receives result pairs during a streaming join: `pairs` holds `count` pairs as
/// `2*count` uint32 values (i0, j0, i1, j1, ...), valid only during the call. Return 0 to
/// go on, non-zero to stop the join (the call then returns SIMJOIN_CANCELLED and the
/// callback is not called again). Chunks
/// arrive one at a time (never concurrently), in no particular order. The callback must
/// not unwind (no C++ exception, no longjmp) through simjoin.
pub type simjoin_pair_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, pairs: *const u32, count: usize) -> c_int>;

// ---------------------------------------------------------------------------------------
// Error plumbing.

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // Interior NULs cannot appear in a C string: replace them.
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

fn null_arg(name: &str) -> Error {
    Error::invalid(format!("argument '{name}' is NULL"))
}

/// Runs `body` behind a panic boundary and turns its outcome into a status, recording the
/// message of a failure as this thread's last error.
fn guard(body: impl FnOnce() -> Result<(), Error>) -> simjoin_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            SIMJOIN_OK
        }
        Ok(Err(e)) => {
            set_last_error(&e.to_string());
            e.kind().into()
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (panic): {what}"));
            SIMJOIN_INTERNAL
        }
    }
}

const METRICS: [(u32, Metric); 3] = [
    (SIMJOIN_METRIC_EUCLIDEAN, Metric::Euclidean),
    (SIMJOIN_METRIC_MANHATTAN, Metric::Manhattan),
    (SIMJOIN_METRIC_CHEBYSHEV, Metric::Chebyshev),
];
const BACKENDS: [(u32, Backend); 3] = [
    (SIMJOIN_BACKEND_AUTO, Backend::Auto),
    (SIMJOIN_BACKEND_CPU, Backend::Cpu),
    (SIMJOIN_BACKEND_GPU, Backend::Gpu),
];
const ALGORITHMS: [(u32, Algorithm); 5] = [
    (SIMJOIN_ALGORITHM_AUTO, Algorithm::Auto),
    (SIMJOIN_ALGORITHM_GRID, Algorithm::Grid),
    (SIMJOIN_ALGORITHM_EGO, Algorithm::Ego),
    (SIMJOIN_ALGORITHM_BRUTE, Algorithm::Brute),
    (SIMJOIN_ALGORITHM_LSS, Algorithm::Lss),
];
const OUTPUTS: [(u32, OutputForm); 3] = [
    (SIMJOIN_OUTPUT_PAIRS, OutputForm::Pairs),
    (SIMJOIN_OUTPUT_CSR, OutputForm::Csr),
    (SIMJOIN_OUTPUT_COUNT, OutputForm::Count),
];

fn enum_value<T: Copy>(what: &str, value: u32, table: &[(u32, T)]) -> Result<T, Error> {
    table
        .iter()
        .find(|(n, _)| *n == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| Error::invalid(format!("unknown {what} value {value}")))
}

fn optional_count(what: &str, value: u64) -> Result<Option<usize>, Error> {
    if value == 0 {
        return Ok(None);
    }
    usize::try_from(value)
        .map(Some)
        .map_err(|_| Error::invalid(format!("{what} {value} does not fit in size_t")))
}

/// Reads the caller's options struct, honouring its `size` (see `simjoin_options`).
unsafe fn read_options(opts: *const simjoin_options) -> Result<JoinOptions, Error> {
    if opts.is_null() {
        return Err(null_arg("opts"));
    }
    let ours = std::mem::size_of::<simjoin_options>();
    let theirs = std::ptr::read_unaligned(opts as *const usize);
    let eps_end = std::mem::offset_of!(simjoin_options, eps) + std::mem::size_of::<f64>();
    if theirs < eps_end {
        return Err(Error::invalid(format!(
            "opts->size is {theirs}: call simjoin_options_init before setting options"
        )));
    }
    if theirs > ours {
        // A newer caller: fine as long as it left every field this library does not know
        // at zero (its default), as Linux does for extensible structs.
        let extra = std::slice::from_raw_parts((opts as *const u8).add(ours), theirs - ours);
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::unsupported(
                "opts sets fields this simjoin library does not know (built against a newer header?)",
            ));
        }
    }
    let mut o = simjoin_options::defaults();
    std::ptr::copy_nonoverlapping(
        opts as *const u8,
        &mut o as *mut simjoin_options as *mut u8,
        theirs.min(ours),
    );

    let mut j = JoinOptions::new(o.eps);
    j.metric = enum_value("metric", o.metric, &METRICS)?;
    j.backend = enum_value("backend", o.backend, &BACKENDS)?;
    j.algorithm = enum_value("algorithm", o.algorithm, &ALGORITHMS)?;
    j.output = enum_value("output", o.output, &OUTPUTS)?;
    j.sorted = o.sorted != 0;
    j.include_self = o.include_self != 0;
    j.threads = optional_count("threads", o.threads)?;
    j.indexed_dims = optional_count("indexed_dims", o.indexed_dims)?;
    j.batch_points = optional_count("batch_points", o.batch_points)?;
    j.result_buffer_pairs = optional_count("result_buffer_pairs", o.result_buffer_pairs)?;
    if !o.device.is_null() {
        let name = CStr::from_ptr(o.device)
            .to_str()
            .map_err(|_| Error::invalid("opts->device is not valid UTF-8"))?;
        j.device = Some(name.to_owned());
    }
    j.validate()?;
    Ok(j)
}

/// Borrows the caller's matrix as a validated `Dataset`.
unsafe fn read_matrix<'a>(name: &str, m: *const simjoin_matrix) -> Result<Dataset<'a>, Error> {
    let m = m.as_ref().ok_or_else(|| null_arg(name))?;
    if m.cols == 0 {
        return Err(Error::invalid(format!(
            "{name}: points must have at least one dimension (cols = 0)"
        )));
    }
    let len = m
        .rows
        .checked_mul(m.cols)
        .ok_or_else(|| Error::invalid(format!("{name}: rows * cols overflows size_t")))?;
    if m.data.is_null() && m.rows != 0 {
        return Err(Error::invalid(format!(
            "{name}->data is NULL but rows = {}",
            m.rows
        )));
    }
    let ds = match m.dtype {
        SIMJOIN_DTYPE_F32 => Dataset::from_f32(borrow(name, m.data, len)?, m.cols),
        SIMJOIN_DTYPE_F64 => Dataset::from_f64(borrow(name, m.data, len)?, m.cols),
        other => {
            return Err(Error::invalid(format!(
                "{name}: unknown dtype value {other}"
            )))
        }
    };
    ds.map_err(|e| Error::with_kind(e.kind(), anyhow::anyhow!("{name}: {e}")))
}

/// The caller's `len` coordinates as a slice, refusing what `slice::from_raw_parts` may not
/// be given: a misaligned pointer or more than isize::MAX bytes.
unsafe fn borrow<'a, T>(name: &str, data: *const c_void, len: usize) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if (data as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Error::invalid(format!(
            "{name}->data is not aligned for its dtype ({} bytes)",
            std::mem::align_of::<T>()
        )));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>() {
        return Err(Error::invalid(format!("{name}: rows * cols is too large")));
    }
    Ok(std::slice::from_raw_parts(data as *const T, len))
}

fn into_handle(result: JoinResult) -> Box<simjoin_result> {
    let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
    Box::new(simjoin_result {
        backend: c(&result.report.backend),
        device: c(&result.report.device),
        result,
    })
}

/// Adapts a C callback to the engine's `PairSink`.
struct CallbackSink {
    callback: unsafe extern "C" fn(*mut c_void, *const u32, usize) -> c_int,
    user_data: *mut c_void,
    /// Set once the callback asked to stop: it is never called again, even if parallel
    /// workers still deliver chunks before the join winds down.
    stopped: bool,
}

// The caller promises (header) that its callback and user_data may be used from the thread
// the engine calls the sink on; the engine calls the sink from one thread at a time.
unsafe impl Send for CallbackSink {}

impl crate::result::PairSink for CallbackSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        if self.stopped {
            anyhow::bail!("the callback asked to stop");
        }
        let code =
            unsafe { (self.callback)(self.user_data, chunk.as_ptr() as *const u32, chunk.len()) };
        if code != 0 {
            self.stopped = true;
            anyhow::bail!("the callback returned {code}");
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Version, status and errors.

/// The library version, "MAJOR.MINOR.PATCH" (static string; equals SIMJOIN_VERSION_STRING
/// of the header it was built with).
#[no_mangle]
pub extern "C" fn simjoin_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// A short static description of a status number ("unknown status" for others).
#[no_mangle]
pub extern "C" fn simjoin_status_str(status: u32) -> *const c_char {
    let s: &'static str = match status {
        0 => "ok\0",
        1 => "invalid argument\0",
        2 => "unsupported\0",
        3 => "no device\0",
        4 => "out of device memory\0",
        5 => "out of host memory\0",
        6 => "device lost\0",
        7 => "cancelled\0",
        8 => "i/o error\0",
        9 => "internal error\0",
        _ => "unknown status\0",
    };
    s.as_ptr() as *const c_char
}

/// Copies the message of this thread's last failed call into `buf` (NUL-terminated,
/// truncated to `len - 1` bytes; nothing is written when `buf` is NULL or `len` is 0) and
/// returns the message's full length in bytes, without the NUL (snprintf style). The
/// message is "" after a successful call.
#[no_mangle]
pub unsafe extern "C" fn simjoin_last_error_message(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(|| {
        LAST_ERROR.with(|e| {
            let msg = e.borrow();
            let bytes = msg.as_bytes();
            if !buf.is_null() && len > 0 {
                let n = bytes.len().min(len - 1);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
            bytes.len()
        })
    })
    .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Options and engine.

/// Fills `*opts` with the defaults (eps = 0, which must be set; Euclidean; automatic
/// backend and algorithm; pairs output) and `opts->size = sizeof(simjoin_options)`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_options_init(opts: *mut simjoin_options) -> simjoin_status {
    guard(|| {
        let opts = opts.as_mut().ok_or_else(|| null_arg("opts"))?;
        *opts = simjoin_options::defaults();
        Ok(())
    })
}

/// Creates an engine. Cheap: the Vulkan context is created on the first GPU join.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_new(out: *mut *mut simjoin_engine) -> simjoin_status {
    guard(|| {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        *out = Box::into_raw(Box::new(simjoin_engine {
            engine: Engine::new(),
        }));
        Ok(())
    })
}

/// Frees an engine (NULL is fine). No join may be running on it.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_free(engine: *mut simjoin_engine) {
    if !engine.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(engine))));
    }
}

// ---------------------------------------------------------------------------------------
// Joins.

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
        let engine = engine.as_ref().ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let a = read_matrix("points", points)?;
        let opts = read_options(opts)?;
        let result = engine.engine.self_join(&a, &opts)?;
        *out = Box::into_raw(into_handle(result));
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
        let engine = engine.as_ref().ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let a = read_matrix("a", a)?;
        let b = read_matrix("b", b)?;
        let opts = read_options(opts)?;
        let result = engine.engine.join(&a, &b, &opts)?;
        *out = Box::into_raw(into_handle(result));
        Ok(())
    })
}

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
        let engine = engine.as_ref().ok_or_else(|| null_arg("engine"))?;
        let callback = callback.ok_or_else(|| null_arg("callback"))?;
        let a = read_matrix(if b.is_some() { "a" } else { "points" }, a)?;
        let b = b.map(|b| read_matrix("b", b)).transpose()?;
        let opts = read_options(opts)?;
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
            };
            *out = Box::into_raw(into_handle(result));
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
    stream(engine, points, None, opts, callback, user_data, out)
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
    stream(engine, a, Some(b), opts, callback, user_data, out)
}

// ---------------------------------------------------------------------------------------
// Results.

/// Frees a result (NULL is fine). Pointers obtained from it become invalid.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_free(result: *mut simjoin_result) {
    if !result.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(result))));
    }
}

/// The result's output form (`SIMJOIN_OUTPUT_*`; streaming results are COUNT).
/// Returns SIMJOIN_OUTPUT_COUNT for NULL.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_output(result: *const simjoin_result) -> simjoin_output {
    match result.as_ref().map(|r| &r.result.output) {
        Some(JoinOutput::Pairs(_)) => SIMJOIN_OUTPUT_PAIRS,
        Some(JoinOutput::Csr(_)) => SIMJOIN_OUTPUT_CSR,
        _ => SIMJOIN_OUTPUT_COUNT,
    }
}

/// Number of result pairs (unique pairs for a self-join), whatever the output form; 0 for
/// NULL.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_count(result: *const simjoin_result) -> u64 {
    result.as_ref().map_or(0, |r| r.result.report.pairs)
}

/// The pairs of a PAIRS result: `*pairs` points at `2 * *count` uint32 values (i0, j0,
/// i1, j1, ...), owned by the result. `*pairs` may be NULL when `*count` is 0.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_pairs(
    result: *const simjoin_result,
    pairs: *mut *const u32,
    count: *mut usize,
) -> simjoin_status {
    guard(|| {
        let r = result.as_ref().ok_or_else(|| null_arg("result"))?;
        if pairs.is_null() || count.is_null() {
            return Err(null_arg(if pairs.is_null() { "pairs" } else { "count" }));
        }
        let p = r.result.pairs().ok_or_else(|| {
            Error::invalid("the result holds no pairs (its output form is not PAIRS)")
        })?;
        *pairs = if p.is_empty() {
            std::ptr::null()
        } else {
            p.as_ptr() as *const u32
        };
        *count = p.len();
        Ok(())
    })
}

/// The neighbour table of a CSR result: row r's neighbours are
/// `neighbors[offsets[r] .. offsets[r+1]]`; `offsets` has `*rows + 1` entries and
/// `neighbors` has `*nnz`. Arrays are owned by the result; `*neighbors` may be NULL when
/// `*nnz` is 0.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_csr(
    result: *const simjoin_result,
    offsets: *mut *const u64,
    rows: *mut usize,
    neighbors: *mut *const u32,
    nnz: *mut usize,
) -> simjoin_status {
    guard(|| {
        let r = result.as_ref().ok_or_else(|| null_arg("result"))?;
        for (p, name) in [
            (offsets.is_null(), "offsets"),
            (rows.is_null(), "rows"),
            (neighbors.is_null(), "neighbors"),
            (nnz.is_null(), "nnz"),
        ] {
            if p {
                return Err(null_arg(name));
            }
        }
        let c = r.result.csr().ok_or_else(|| {
            Error::invalid("the result holds no CSR table (its output form is not CSR)")
        })?;
        *offsets = c.offsets.as_ptr();
        *rows = c.offsets.len() - 1;
        *neighbors = if c.neighbors.is_empty() {
            std::ptr::null()
        } else {
            c.neighbors.as_ptr()
        };
        *nnz = c.neighbors.len();
        Ok(())
    })
}

/// What ran: the report of a result.
#[repr(C)]
pub struct simjoin_report {
    /// Number of result pairs.
    pub pairs: u64,
    /// Wall-clock seconds of the join.
    pub seconds: f64,
    /// Batches the work was split into.
    pub batches: u64,
    /// The algorithm that actually ran (never AUTO).
    pub algorithm: simjoin_algorithm,
    /// "cpu" or "vulkan" (owned by the result).
    pub backend: *const c_char,
    /// Device name (owned by the result).
    pub device: *const c_char,
}

/// Fills `*report` with the result's report; its strings live as long as the result.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_report(
    result: *const simjoin_result,
    report: *mut simjoin_report,
) -> simjoin_status {
    guard(|| {
        let r = result.as_ref().ok_or_else(|| null_arg("result"))?;
        let out = report.as_mut().ok_or_else(|| null_arg("report"))?;
        let rep = &r.result.report;
        *out = simjoin_report {
            pairs: rep.pairs,
            seconds: rep.seconds,
            batches: rep.batches as u64,
            algorithm: rep.algorithm as u32,
            backend: r.backend.as_ptr(),
            device: r.device.as_ptr(),
        };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        let mut buf = [0 as c_char; 256];
        unsafe { simjoin_last_error_message(buf.as_mut_ptr(), buf.len()) };
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn panic_becomes_internal_status() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, SIMJOIN_INTERNAL);
        assert_eq!(last_error(), "internal error (panic): boom");
        assert_eq!(guard(|| Ok(())), SIMJOIN_OK);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn c_constants_match_rust_enums() {
        assert!(METRICS.iter().all(|&(n, m)| n == m as u32));
        assert!(BACKENDS.iter().all(|&(n, b)| n == b as u32));
        assert!(ALGORITHMS.iter().all(|&(n, a)| n == a as u32));
        assert!(OUTPUTS.iter().all(|&(n, o)| n == o as u32));
    }

    #[test]
    fn error_kinds_keep_their_numbers() {
        assert_eq!(simjoin_status::from(ErrorKind::InvalidArgument) as u32, 1);
        assert_eq!(simjoin_status::from(ErrorKind::Internal) as u32, 9);
    }

    #[test]
    fn message_truncates_and_reports_full_length() {
        set_last_error("abcdef");
        let mut buf = [1 as c_char; 4];
        let n = unsafe { simjoin_last_error_message(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 6);
        assert_eq!(
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(),
            "abc"
        );
        assert_eq!(
            unsafe { simjoin_last_error_message(std::ptr::null_mut(), 0) },
            6
        );
    }

    #[test]
    fn older_and_newer_option_structs() {
        let mut o = simjoin_options::defaults();
        o.eps = 0.5;
        o.metric = SIMJOIN_METRIC_CHEBYSHEV;
        // An older caller that only knows size and eps: the rest are defaults.
        o.size = 16;
        let j = unsafe { read_options(&o) }.unwrap();
        assert_eq!((j.eps, j.metric), (0.5, Metric::Euclidean));
        // A newer caller whose extra fields are zero is accepted; non-zero is refused.
        #[repr(C)]
        struct Newer {
            base: simjoin_options,
            extra: u64,
        }
        let mut n = Newer {
            base: simjoin_options::defaults(),
            extra: 0,
        };
        n.base.eps = 1.0;
        n.base.size = std::mem::size_of::<Newer>();
        let whole = &n as *const Newer as *const simjoin_options;
        assert!(unsafe { read_options(whole) }.is_ok());
        n.extra = 7;
        let whole = &n as *const Newer as *const simjoin_options;
        let e = unsafe { read_options(whole) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        // Unknown enum numbers are refused, not transmuted.
        let mut bad = simjoin_options::defaults();
        bad.eps = 1.0;
        bad.metric = 99;
        assert!(unsafe { read_options(&bad) }
            .unwrap_err()
            .to_string()
            .contains("unknown metric value 99"));
    }
}
