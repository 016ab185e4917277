//! The engine handle: `simjoin_engine_new[_with]` and `simjoin_engine_free`. The handle
//! owns a Rust `Engine`, which owns its device and thread pool: freeing it releases both.

use super::options::{read_engine_options, simjoin_engine_options};
use super::{guard, null_arg, simjoin_status};
use crate::engine::Engine;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The engine (opaque). Thread-safe: share one across threads freely.
pub struct simjoin_engine {
    pub(crate) engine: Engine,
}

// What the header promises about threads, checked at compile time.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<simjoin_engine>();
    shareable::<super::result::simjoin_result>();
};

/// Creates an engine with default options (`simjoin_engine_new_with(NULL, out)`). Cheap:
/// the Vulkan device is opened on the first GPU join.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_new(out: *mut *mut simjoin_engine) -> simjoin_status {
    guard(|| {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe {
            *out = Box::into_raw(Box::new(simjoin_engine {
                engine: Engine::new(),
            }))
        };
        Ok(())
    })
}

/// Creates an engine with `opts` (NULL: the defaults). The device is opened on the first
/// GPU join; the engine owns it until `simjoin_engine_free`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_new_with(
    opts: *const simjoin_engine_options,
    out: *mut *mut simjoin_engine,
) -> simjoin_status {
    guard(|| {
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: NULL or a live simjoin_engine_options (header contract).
        let options = unsafe { read_engine_options(opts) }?;
        let engine = Engine::with_options(options)?;
        // SAFETY: `out` is non-NULL and writable (header contract).
        unsafe { *out = Box::into_raw(Box::new(simjoin_engine { engine })) };
        Ok(())
    })
}

/// Frees an engine and releases its device and threads (NULL is fine). No join may be
/// running on it.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_free(engine: *mut simjoin_engine) {
    if !engine.is_null() {
        // SAFETY: a handle from simjoin_engine_new[_with], freed once, with no join running
        // on it (header contract).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(engine) })));
    }
}
