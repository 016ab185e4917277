//! Stopping and watching a call from C (`simjoin_control`): a handle the caller makes,
//! names in the options of a join, kNN or DBSCAN call (`control` field), and may cancel
//! from any thread (a signal handler included) while the call runs; the call then
//! returns `SIMJOIN_CANCELLED` once every thread of it has stopped. The caller's own
//! thread may poll the progress (`simjoin_control_progress`), or a callback given at
//! creation is called with it at a bounded rate (and may stop the call).

use super::{guard, null_arg, simjoin_status};
use crate::control::{Control, Progress};
use std::ffi::{c_char, c_void};
use std::time::Duration;

/// A cancel flag and progress counters shared by the caller and the calls that name it
/// (opaque). Create with `simjoin_control_new` or `simjoin_control_new_with_progress`;
/// free with `simjoin_control_free` (safe while a call that named it still runs: the call
/// keeps its own reference).
pub struct simjoin_control {
    control: Control,
}

/// How far a call has come (`simjoin_control_progress`, and the progress callback).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_progress {
    /// What the call is doing: "plan", "index", "join", "knn", "output" (a static string).
    pub stage: *const c_char,
    /// Fraction of the stage's work done, 0 to 1 (in units of work, not of time).
    pub fraction: f64,
    /// Pairs (or kNN rows) found so far by the current join.
    pub pairs: u64,
    /// Seconds since the control was made.
    pub elapsed: f64,
}

/// Called with the progress at most once per interval, from one of the engine's threads
/// (never two at once). It must not call back into simjoin with the same control, and
/// should return quickly. Returning non-zero stops the call, as `simjoin_control_cancel`
/// does.
pub type simjoin_progress_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, progress: *const simjoin_progress) -> i32>;

fn stage_str(stage: &'static str) -> *const c_char {
    // Static NUL-terminated names for the stages `control.rs` sets.
    let s: &'static str = match stage {
        "plan" => "plan\0",
        "index" => "index\0",
        "join" => "join\0",
        "knn" => "knn\0",
        "output" => "output\0",
        _ => "working\0",
    };
    s.as_ptr() as *const c_char
}

fn to_c(p: &Progress) -> simjoin_progress {
    simjoin_progress {
        stage: stage_str(p.stage),
        fraction: p.fraction,
        pairs: p.pairs,
        elapsed: p.elapsed,
    }
}

/// A new control, not cancelled, without a callback. `*out` holds it on success.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_new(out: *mut *mut simjoin_control) -> simjoin_status {
    guard(|| {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let handle = Box::new(simjoin_control {
            control: Control::new(),
        });
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// A new control that calls `callback(user, progress)` at most once per `interval_ms`
/// milliseconds (0: 100) while a call naming it runs. `user` is passed through untouched
/// and must stay valid while such a call runs.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_new_with_progress(
    callback: simjoin_progress_fn,
    user: *mut c_void,
    interval_ms: u32,
    out: *mut *mut simjoin_control,
) -> simjoin_status {
    guard(|| {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let Some(callback) = callback else {
            return Err(null_arg("callback"));
        };
        // The caller's pointer crosses to the engine's threads: its contract (above) is
        // that it stays valid and usable from them while a call runs.
        struct User(*mut c_void);
        // SAFETY: see above; simjoin only passes the pointer back, never dereferences it.
        unsafe impl Send for User {}
        // SAFETY: as above; calls are never concurrent (one reporter at a time).
        unsafe impl Sync for User {}
        let user = User(user);
        let every = Duration::from_millis(if interval_ms == 0 {
            100
        } else {
            interval_ms as u64
        });
        let control = Control::with_progress(every, move |p| {
            let c = to_c(p);
            let user = &user;
            // SAFETY: a function of the caller's with the documented signature; `c` lives
            // across the call.
            unsafe { callback(user.0, &c) == 0 }
        });
        let handle = Box::new(simjoin_control { control });
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Asks every call naming `control` to stop: each returns SIMJOIN_CANCELLED soon after
/// (within milliseconds on the CPU, after the batches in flight on a GPU). Permanent: a
/// call started later with it is cancelled at once. Thread-safe and async-signal-safe
/// (one atomic store): it may be called from a signal handler. NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_cancel(control: *const simjoin_control) {
    // SAFETY: NULL or a live control (header contract).
    if let Some(c) = unsafe { control.as_ref() } {
        c.control.cancel();
    }
}

/// Non-zero once the control was cancelled (or its callback asked to stop); 0 for NULL.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_is_cancelled(control: *const simjoin_control) -> i32 {
    // SAFETY: NULL or a live control (header contract).
    unsafe { control.as_ref() }.is_some_and(|c| c.control.is_cancelled()) as i32
}

/// The progress of the call naming `control` (the last one, once it has returned).
/// Thread-safe: meant to be polled by the caller's own thread while another runs the call.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_progress(
    control: *const simjoin_control,
    out: *mut simjoin_progress,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live control (header contract).
        let c = unsafe { control.as_ref() }.ok_or_else(|| null_arg("control"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        let p = c.control.progress().expect("a C control is live");
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = to_c(&p) };
        Ok(())
    })
}

/// Frees a control (NULL is fine). A call still running with it keeps its own reference
/// and can no longer be cancelled through this handle.
#[no_mangle]
pub unsafe extern "C" fn simjoin_control_free(control: *mut simjoin_control) {
    if !control.is_null() {
        // SAFETY: a handle from simjoin_control_new*, freed once (header contract).
        drop(unsafe { Box::from_raw(control) });
    }
}

/// The control an options struct names: the handle's (shared), or an inert one for NULL.
///
/// # Safety
/// `control` is NULL or a live `simjoin_control`.
pub(crate) unsafe fn control_of(control: *const simjoin_control) -> Control {
    // SAFETY: the caller's contract.
    unsafe { control.as_ref() }.map_or_else(Control::default, |c| c.control.clone())
}
