//! The C ABI (`include/simjoin.h`, generated from this module and its children by cbindgen).
//!
//! One file per C object: `options` (join and engine options), `engine`, `matrix` (borrowed
//! input), `join` (the join calls and the streaming callback), `knn` (the kNN join, its
//! options and result), `result` (results and their accessors), `dbscan` (DBSCAN labels,
//! its options and report); this file holds the status numbers, the panic boundary and the
//! error message.
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

// Unsafe operations inside the `unsafe extern "C" fn`s need blocks of their own, so that
// each carries its SAFETY reasoning (the caller's side of the contract is in the header).
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]
// Every exported function checks its pointers for NULL; the rest of their contract
// (valid, aligned, live memory) is documented in the header and is the caller's to keep.
#![allow(clippy::missing_safety_doc)]

mod arrow;
mod engine;
mod join;
mod knn;
mod matrix;
mod options;
mod result;
// Last, so that the generated header lists its items after the older ones.
mod control;
mod dbscan;

pub use arrow::*;
pub use control::*;
pub use dbscan::*;
pub use engine::*;
pub use join::*;
pub use knn::*;
pub use matrix::*;
pub use options::*;
pub use result::*;

use crate::error::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The C ABI's version: bumped whenever a change breaks callers compiled against an older
/// header (a struct loses or moves a field, a function changes its signature). It is the
/// number in the shared library's SONAME (`libsimjoin.so.2`).
/// 2: device choice and CPU threads moved from `simjoin_options` to
/// `simjoin_engine_options` (`simjoin_engine_new_with`).
pub const SIMJOIN_ABI_VERSION: u32 = 2;

/// Status of a call. The numbers are fixed: new statuses are only ever appended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum simjoin_status {
    SIMJOIN_OK = 0,
    /// Bad input: a NULL pointer, NaN/inf coordinates, eps <= 0 or NaN (or out of the
    /// data precision's range: eps*eps overflowing or not a normal number), zero dimensions,
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

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(msg: &str) {
    // Interior NULs cannot appear in a C string: replace them.
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

pub(crate) fn null_arg(name: &str) -> Error {
    Error::invalid(format!("argument '{name}' is NULL"))
}

/// Runs `body` behind a panic boundary and turns its outcome into a status, recording the
/// message of a failure as this thread's last error.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> simjoin_status {
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

// ---------------------------------------------------------------------------------------
// Version, status and errors.

/// The library version, "MAJOR.MINOR.PATCH" (static string; equals SIMJOIN_VERSION_STRING
/// of the header it was built with).
#[no_mangle]
pub extern "C" fn simjoin_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The ABI version of the library (equals SIMJOIN_ABI_VERSION of the header it was built
/// with; a caller may compare the two at startup).
#[no_mangle]
pub extern "C" fn simjoin_abi_version() -> u32 {
    SIMJOIN_ABI_VERSION
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
                // SAFETY: `buf` is non-NULL and writable for `len` bytes (header contract);
                // n + 1 <= len bytes are written; the message is a separate allocation.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
                    *buf.add(n) = 0;
                }
            }
            bytes.len()
        })
    })
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::options::{read_options, ALGORITHMS, BACKENDS, METRICS, OUTPUTS};
    use super::*;
    use crate::options::Metric;
    use std::ffi::CStr;

    fn last_error() -> String {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
        unsafe { simjoin_last_error_message(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
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
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
        let n = unsafe { simjoin_last_error_message(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 6);
        assert_eq!(
            // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(),
            "abc"
        );
        assert_eq!(
            // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
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
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
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
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
        assert!(unsafe { read_options(whole) }.is_ok());
        n.extra = 7;
        let whole = &n as *const Newer as *const simjoin_options;
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
        let e = unsafe { read_options(whole) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        // Unknown enum numbers are refused, not transmuted.
        let mut bad = simjoin_options::defaults();
        bad.eps = 1.0;
        bad.metric = 99;
        // SAFETY: the buffers and option structs passed are live locals of the stated sizes.
        assert!(unsafe { read_options(&bad) }
            .unwrap_err()
            .to_string()
            .contains("unknown metric value 99"));
    }
}
