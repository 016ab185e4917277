//! Join options (`simjoin_options`) and engine options (`simjoin_engine_options`): C
//! structs that start with their own size so that they can grow, read field by field into
//! the Rust options with unknown enum numbers refused.

use super::control::{control_of, simjoin_control};
use super::{guard, null_arg, simjoin_status};
use crate::engine::EngineOptions;
use crate::error::Error;
use crate::options::{Algorithm, Backend, JoinOptions, Metric, OutputForm};
use std::ffi::{c_char, CStr};

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
/// Cosine distance, 1 - cos(a, b): eps-joins, kNN and DBSCAN; zero vectors are
/// SIMJOIN_INVALID_ARGUMENT. Added in 0.3.
pub const SIMJOIN_METRIC_COSINE: simjoin_metric = 3;
/// Great-circle distance on a sphere of the mean Earth radius (6,371,008.8 m): points are
/// 2 columns, (latitude, longitude) in degrees; eps and distances in metres. Latitudes
/// outside [-90, 90] are SIMJOIN_INVALID_ARGUMENT. Added in 0.3.
pub const SIMJOIN_METRIC_HAVERSINE: simjoin_metric = 4;

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
/// k-d tree (CPU k-nearest-neighbour join).
pub const SIMJOIN_ALGORITHM_KDTREE: simjoin_algorithm = 5;

/// What a join returns: one of `SIMJOIN_OUTPUT_*`.
pub type simjoin_output = u32;
/// Self-join: unique pairs (i < j). A join B: pairs (i in A, j in B).
pub const SIMJOIN_OUTPUT_PAIRS: simjoin_output = 0;
/// Neighbour table in CSR form (self-join: both directions).
pub const SIMJOIN_OUTPUT_CSR: simjoin_output = 1;
/// Only the number of pairs.
pub const SIMJOIN_OUTPUT_COUNT: simjoin_output = 2;

/// Join options. Call `simjoin_options_init` first: it sets `size` and every default.
/// `size` lets the struct grow: a library reads only the fields the caller's struct has
/// and uses defaults for the rest.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_options {
    /// `sizeof(simjoin_options)` as the caller compiled it.
    pub size: usize,
    /// Distance threshold: finite and > 0. A pair matches when dist <= eps. The comparison
    /// threshold (eps*eps for Euclidean, else eps, in the data's precision) must be a
    /// normal number: f64 Euclidean eps within about [1.5e-154, 1.3e154], f32 [1.1e-19, 1.8e19].
    pub eps: f64,
    pub metric: simjoin_metric,
    pub backend: simjoin_backend,
    pub algorithm: simjoin_algorithm,
    pub output: simjoin_output,
    /// Non-zero: sort pairs lexicographically (and CSR rows by neighbour id).
    pub sorted: u32,
    /// Non-zero: self-join CSR lists each point as its own neighbour.
    pub include_self: u32,
    /// GPU grid: indexed dimensions (0 = chosen automatically).
    pub indexed_dims: u64,
    /// GPU: query points per batch (0 = automatic).
    pub batch_points: u64,
    /// GPU: result buffer capacity in pairs (0 = automatic).
    pub result_buffer_pairs: u64,
    /// LSS: number of shifted Z-order lists, 1 to 64 (0 = automatic). Added in 0.3 (the struct's size tells an older caller apart).
    pub lss_lists: u64,
    /// Non-zero: also compute each pair's (or CSR entry's) distance
    /// (`simjoin_result_distances`). Added in 0.3.
    pub distances: u32,
    /// NULL, or a control that can stop the call and reports its progress (see
    /// `simjoin_control_new`); it must be live when the call starts. Added in 0.3.
    pub control: *const simjoin_control,
    /// SIMJOIN_METRIC_HAVERSINE: the sphere's radius in metres (0 = the mean Earth radius,
    /// SIMJOIN_EARTH_RADIUS_M); other metrics take only 0. Added in 0.3.
    pub sphere_radius: f64,
}

/// The mean Earth radius in metres: haversine's sphere unless `sphere_radius` says otherwise.
pub const SIMJOIN_EARTH_RADIUS_M: f64 = 6371008.8;
// A literal for cbindgen, the engine's value by construction.
const _: () = assert!(SIMJOIN_EARTH_RADIUS_M == crate::metric::EARTH_RADIUS_M);

/// A C `sphere_radius` as the engine's: 0 is the Earth's.
pub(crate) fn sphere_radius(value: f64) -> f64 {
    if value == 0.0 {
        crate::metric::EARTH_RADIUS_M
    } else {
        value
    }
}

impl simjoin_options {
    pub(crate) fn defaults() -> Self {
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
            indexed_dims: 0,
            batch_points: 0,
            result_buffer_pairs: 0,
            lss_lists: 0,
            distances: 0,
            control: std::ptr::null(),
            sphere_radius: 0.0,
        }
    }
}

/// Validation layers for an engine's Vulkan device: one of `SIMJOIN_VALIDATION_*`.
pub type simjoin_validation = u32;
/// On when the `SIMJOIN_VALIDATION` environment variable is set (not "0").
pub const SIMJOIN_VALIDATION_DEFAULT: simjoin_validation = 0;
pub const SIMJOIN_VALIDATION_ON: simjoin_validation = 1;
pub const SIMJOIN_VALIDATION_OFF: simjoin_validation = 2;

/// Engine options. Call `simjoin_engine_options_init` first: it sets `size` and every
/// default. They hold for the engine's whole life.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_engine_options {
    /// `sizeof(simjoin_engine_options)` as the caller compiled it.
    pub size: usize,
    /// Vulkan device index or name substring, NUL-terminated (NULL = the
    /// `SIMJOIN_DEVICE` environment variable, else the best device). Copied at creation.
    pub device: *const c_char,
    /// CPU worker threads (0 = one per core).
    pub threads: u64,
    /// One of `SIMJOIN_VALIDATION_*`.
    pub validation: simjoin_validation,
}

impl simjoin_engine_options {
    fn defaults() -> Self {
        simjoin_engine_options {
            size: std::mem::size_of::<simjoin_engine_options>(),
            device: std::ptr::null(),
            threads: 0,
            validation: SIMJOIN_VALIDATION_DEFAULT,
        }
    }
}

pub(crate) const METRICS: [(u32, Metric); 5] = [
    (SIMJOIN_METRIC_EUCLIDEAN, Metric::Euclidean),
    (SIMJOIN_METRIC_MANHATTAN, Metric::Manhattan),
    (SIMJOIN_METRIC_CHEBYSHEV, Metric::Chebyshev),
    (SIMJOIN_METRIC_COSINE, Metric::Cosine),
    (SIMJOIN_METRIC_HAVERSINE, Metric::Haversine),
];
pub(crate) const BACKENDS: [(u32, Backend); 3] = [
    (SIMJOIN_BACKEND_AUTO, Backend::Auto),
    (SIMJOIN_BACKEND_CPU, Backend::Cpu),
    (SIMJOIN_BACKEND_GPU, Backend::Gpu),
];
pub(crate) const ALGORITHMS: [(u32, Algorithm); 6] = [
    (SIMJOIN_ALGORITHM_AUTO, Algorithm::Auto),
    (SIMJOIN_ALGORITHM_GRID, Algorithm::Grid),
    (SIMJOIN_ALGORITHM_EGO, Algorithm::Ego),
    (SIMJOIN_ALGORITHM_BRUTE, Algorithm::Brute),
    (SIMJOIN_ALGORITHM_LSS, Algorithm::Lss),
    (SIMJOIN_ALGORITHM_KDTREE, Algorithm::KdTree),
];
pub(crate) const OUTPUTS: [(u32, OutputForm); 3] = [
    (SIMJOIN_OUTPUT_PAIRS, OutputForm::Pairs),
    (SIMJOIN_OUTPUT_CSR, OutputForm::Csr),
    (SIMJOIN_OUTPUT_COUNT, OutputForm::Count),
];

pub(crate) fn enum_value<T: Copy>(what: &str, value: u32, table: &[(u32, T)]) -> Result<T, Error> {
    table
        .iter()
        .find(|(n, _)| *n == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| Error::invalid(format!("unknown {what} value {value}")))
}

pub(crate) fn optional_count(what: &str, value: u64) -> Result<Option<usize>, Error> {
    if value == 0 {
        return Ok(None);
    }
    usize::try_from(value)
        .map(Some)
        .map_err(|_| Error::invalid(format!("{what} {value} does not fit in size_t")))
}

/// Reads a size-prefixed options struct of the caller's into our `T`: fields the caller's
/// (older) struct lacks keep `defaults`; fields of a newer caller beyond ours must be zero.
///
/// # Safety
/// `ptr` is non-NULL and points at a readable struct of at least the `usize` it starts
/// with and of the size that `usize` states.
pub(crate) unsafe fn read_sized<T: Copy>(
    ptr: *const T,
    defaults: T,
    least: usize,
    what: &str,
) -> Result<T, Error> {
    let ours = std::mem::size_of::<T>();
    // SAFETY: the caller's struct starts with its size (a usize); unaligned read as the
    // caller may hand any pointer.
    let theirs = unsafe { std::ptr::read_unaligned(ptr as *const usize) };
    if theirs < least {
        return Err(Error::invalid(format!(
            "{what}->size is {theirs}: call {what}_init before setting options"
        )));
    }
    if theirs > ours {
        // A newer caller: fine as long as it left every field this library does not know
        // at zero (its default), as Linux does for extensible structs.
        // SAFETY: the caller's struct is `theirs` bytes long (its size field says so).
        let extra =
            unsafe { std::slice::from_raw_parts((ptr as *const u8).add(ours), theirs - ours) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::unsupported(format!(
                "{what} sets fields this simjoin library does not know (built against a newer header?)"
            )));
        }
    }
    let mut out = defaults;
    // SAFETY: copies min(theirs, ours) bytes: readable in the caller's struct, writable in
    // ours; every field of T is plain data valid for any bit pattern (integers, floats,
    // raw pointers).
    unsafe {
        std::ptr::copy_nonoverlapping(
            ptr as *const u8,
            &mut out as *mut T as *mut u8,
            theirs.min(ours),
        )
    };
    Ok(out)
}

/// `sizeof` of a struct whose last field ends at `end` (trailing padding to `align`).
pub(crate) const fn padded(end: usize, align: usize) -> usize {
    end.div_ceil(align) * align
}

/// The `_init_sized` functions' one body: `defaults` written into the caller's struct of
/// `size` bytes, as far as both structs go (an older, smaller caller's struct is never
/// written past its end); the bytes of a newer, larger caller's struct beyond ours set to
/// zero (their defaults, which `read_sized` accepts); its `size` field set to `size`.
///
/// # Safety
/// `ptr` is NULL (refused) or points at `size` writable bytes.
pub(crate) unsafe fn init_sized<T: Copy>(
    ptr: *mut T,
    size: usize,
    defaults: T,
    least: usize,
    what: &str,
) -> Result<(), Error> {
    if ptr.is_null() {
        return Err(null_arg("opts"));
    }
    if size < least {
        return Err(Error::invalid(format!(
            "{what}_init_sized: size {size} is smaller than the smallest {what} ({least} bytes)"
        )));
    }
    let ours = std::mem::size_of::<T>();
    // SAFETY: `ptr` has `size` writable bytes (contract); min(size, ours) bytes are copied
    // from `defaults` (readable: a local T), the rest up to `size` zeroed, and the size
    // written unaligned into its first usize (size >= least >= size_of::<usize>()).
    unsafe {
        std::ptr::copy_nonoverlapping(
            &defaults as *const T as *const u8,
            ptr as *mut u8,
            size.min(ours),
        );
        if size > ours {
            std::ptr::write_bytes((ptr as *mut u8).add(ours), 0, size - ours);
        }
        std::ptr::write_unaligned(ptr as *mut usize, size);
    }
    Ok(())
}

/// Reads the caller's options struct, honouring its `size` (see `simjoin_options`).
pub(crate) unsafe fn read_options(opts: *const simjoin_options) -> Result<JoinOptions, Error> {
    if opts.is_null() {
        return Err(null_arg("opts"));
    }
    let eps_end = std::mem::offset_of!(simjoin_options, eps) + std::mem::size_of::<f64>();
    // SAFETY: non-NULL; the header's contract makes it a live simjoin_options of its size.
    let o = unsafe {
        read_sized(
            opts,
            simjoin_options::defaults(),
            eps_end,
            "simjoin_options",
        )
    }?;
    let mut j = JoinOptions::new(o.eps);
    j.metric = enum_value("metric", o.metric, &METRICS)?;
    j.backend = enum_value("backend", o.backend, &BACKENDS)?;
    j.algorithm = enum_value("algorithm", o.algorithm, &ALGORITHMS)?;
    j.output = enum_value("output", o.output, &OUTPUTS)?;
    j.sorted = o.sorted != 0;
    j.include_self = o.include_self != 0;
    j.indexed_dims = optional_count("indexed_dims", o.indexed_dims)?;
    j.batch_points = optional_count("batch_points", o.batch_points)?;
    j.result_buffer_pairs = optional_count("result_buffer_pairs", o.result_buffer_pairs)?;
    j.lss_lists = optional_count("lss_lists", o.lss_lists)?;
    j.distances = o.distances != 0;
    j.sphere_radius = sphere_radius(o.sphere_radius);
    // SAFETY: NULL or a live control (header contract).
    j.control = unsafe { control_of(o.control) };
    j.validate()?;
    Ok(j)
}

/// Reads the caller's engine options (see `simjoin_engine_options`).
///
/// # Safety
/// `opts` is NULL (defaults) or a live `simjoin_engine_options` of its stated size whose
/// `device`, when not NULL, is a NUL-terminated string.
pub(crate) unsafe fn read_engine_options(
    opts: *const simjoin_engine_options,
) -> Result<EngineOptions, Error> {
    if opts.is_null() {
        return Ok(EngineOptions::default());
    }
    let least = std::mem::size_of::<usize>();
    // SAFETY: non-NULL and, by the contract above, a live struct of its stated size.
    let o = unsafe {
        read_sized(
            opts,
            simjoin_engine_options::defaults(),
            least,
            "simjoin_engine_options",
        )
    }?;
    let device = if o.device.is_null() {
        None
    } else {
        // SAFETY: a non-NULL device is a NUL-terminated string (header contract).
        let name = unsafe { CStr::from_ptr(o.device) }
            .to_str()
            .map_err(|_| Error::invalid("opts->device is not valid UTF-8"))?;
        Some(name.to_owned())
    };
    let validation = match o.validation {
        SIMJOIN_VALIDATION_DEFAULT => None,
        SIMJOIN_VALIDATION_ON => Some(true),
        SIMJOIN_VALIDATION_OFF => Some(false),
        other => return Err(Error::invalid(format!("unknown validation value {other}"))),
    };
    let options = EngineOptions {
        device,
        threads: optional_count("threads", o.threads)?,
        validation,
    };
    options.validate()?;
    Ok(options)
}

/// The size of `simjoin_options` in simjoin 0.2 (frozen: what `simjoin_options_init`
/// writes, so that a program compiled against a 0.2 header is never written past the end
/// of its struct by a later library whose struct has grown).
const OPTIONS_0_2: usize = padded(
    std::mem::offset_of!(simjoin_options, distances) + std::mem::size_of::<u32>(),
    std::mem::align_of::<simjoin_options>(),
);

/// The smallest `simjoin_options` read: up to `eps`, which has no default.
const OPTIONS_LEAST: usize =
    std::mem::offset_of!(simjoin_options, eps) + std::mem::size_of::<f64>();

/// Fills the caller's `simjoin_options` of `size` bytes (`sizeof` as the caller compiled
/// it) with the defaults (eps = 0, which must be set; Euclidean; automatic backend and
/// algorithm; pairs output) and sets `opts->size = size`. Fields of a newer header that
/// this library lacks are zeroed (their defaults); a smaller, older struct is filled as
/// far as it goes. The header's `simjoin_options_init(opts)` macro calls this with
/// `sizeof *(opts)`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_options_init_sized(
    opts: *mut simjoin_options,
    size: usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL (refused) or `size` writable bytes (header contract).
        unsafe {
            init_sized(
                opts,
                size,
                simjoin_options::defaults(),
                OPTIONS_LEAST,
                "simjoin_options",
            )
        }
    })
}

/// The function programs compiled against simjoin 0.2 call: `simjoin_options_init_sized`
/// with the 0.2 size of the struct. (Compiled against this header, `simjoin_options_init`
/// is a macro passing the caller's own `sizeof`.)
#[no_mangle]
pub unsafe extern "C" fn simjoin_options_init(opts: *mut simjoin_options) -> simjoin_status {
    // SAFETY: a 0.2 caller's struct has OPTIONS_0_2 writable bytes (its header's contract).
    unsafe { simjoin_options_init_sized(opts, OPTIONS_0_2) }
}

/// The size of `simjoin_engine_options` in simjoin 0.2 (frozen, as `OPTIONS_0_2`).
const ENGINE_OPTIONS_0_2: usize = padded(
    std::mem::offset_of!(simjoin_engine_options, validation) + std::mem::size_of::<u32>(),
    std::mem::align_of::<simjoin_engine_options>(),
);

/// Fills the caller's `simjoin_engine_options` of `size` bytes with the engine defaults
/// (the default device, one CPU thread per core, validation from the environment) and
/// sets `opts->size = size`, as `simjoin_options_init_sized` does. The header's
/// `simjoin_engine_options_init(opts)` macro calls this with `sizeof *(opts)`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_options_init_sized(
    opts: *mut simjoin_engine_options,
    size: usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL (refused) or `size` writable bytes (header contract).
        unsafe {
            init_sized(
                opts,
                size,
                simjoin_engine_options::defaults(),
                std::mem::size_of::<usize>(),
                "simjoin_engine_options",
            )
        }
    })
}

/// For programs compiled against simjoin 0.2: `simjoin_engine_options_init_sized` with
/// the 0.2 size of the struct.
#[no_mangle]
pub unsafe extern "C" fn simjoin_engine_options_init(
    opts: *mut simjoin_engine_options,
) -> simjoin_status {
    // SAFETY: a 0.2 caller's struct has ENGINE_OPTIONS_0_2 writable bytes.
    unsafe { simjoin_engine_options_init_sized(opts, ENGINE_OPTIONS_0_2) }
}
