//! The Vulkan layer: instance and device choice, queues ("streams"), memory, and the
//! compiled GLSL kernels. Nothing here knows about joins.
//!
//! The shape follows Kompute: a [`Context`] owns the device; [`Buffer`]s have an explicit
//! [`Memory`] placement; a [`Kernel`] is SPIR-V + specialization constants + push
//! constants (pipelines cached per context); a [`Stream`] records copies, dispatches and
//! barriers and submits them, returning a [`Ticket`] (a timeline-semaphore value) that can
//! be waited on or chained into another stream, on another queue.
//!
//! ```no_run
//! use simjoin::vk::{shaders, Buffer, Context, KernelSpec, Memory, Stream};
//! # fn main() -> simjoin::Result<()> {
//! let ctx = Context::new(&Default::default())?; // SIMJOIN_DEVICE picks the device
//! let input = ctx.upload(&[5u32, 3, 9], "input")?; // device-local; zero-copy where mappable
//! let ids = Buffer::new(&ctx, 1000 * 4, Memory::Device, "ids")?;
//! // A kernel: buffers at set 0, bindings 0..n; parameters as push constants; spec
//! // constant 0 is the workgroup size (`layout(local_size_x_id = 0) in;`).
//! let iota = ctx.kernel("iota", shaders::IOTA, &KernelSpec::new(64).bindings(1).push_bytes(8))?;
//! let mut stream = Stream::new(&ctx, 0)?;
//! stream.dispatch_threads(&iota, 1000, &[ids.all()], bytemuck::cast_slice(&[1000u32, 0]))?;
//! stream.barrier()?; // the next command reads what the kernel wrote
//! stream.copy(&input, 0, &ids, 0, 12)?;
//! let ticket = stream.submit()?; // asynchronous
//! let mut other = Stream::new(&ctx, 1)?; // another compute queue where the device has one
//! other.wait_for(&ticket); // cross-queue order by timeline semaphore
//! other.fill(&ids, 4000 - 8, 8, 0)?;
//! other.submit()?.wait()?; // blocks until done
//! let back: Vec<u32> = ctx.download(&ids, 0, 1000)?; // direct read or staging copy
//! assert_eq!(&back[..4], &[5, 3, 9, 3]);
//! # Ok(()) }
//! ```
//!
//! Large data: a buffer may exceed `maxStorageBufferRange` (128 MiB on lavapipe). Bind a
//! window of it with [`Buffer::slice`] (checked against the limit), or pass
//! [`Buffer::device_address`] in push constants and read it through
//! `GL_EXT_buffer_reference` (what the sort and scan kernels do), which has no range limit.
//! Dispatches larger than `maxComputeWorkGroupCount[0]` are spread over a 2-D grid by
//! [`Stream::dispatch_threads`]; kernels get their linear index from `glsl/common.glsl`'s
//! `linear_invocation()`.
//!
//! Writing a kernel: `#version 460` then `#include "common.glsl"`, which declares the
//! workgroup size (spec constant 0) and `WORKGROUP_SIZE`; use that constant, never
//! `gl_WorkGroupSize.x` in arithmetic (glslang 11 folds it to 1). Further spec constants
//! (ids >= 1, e.g. dimensionality) come from [`KernelSpec::constant`].
//!
//! Sort and scan record into a stream like any command ([`sort::sort_pairs_u32`],
//! [`sort::sort_pairs_u64`], [`scan::exclusive_scan_u32_to_u64`]); they put barriers
//! before and after themselves, and work on any length through device addresses.
//!
//! Synchronization: commands in one stream are NOT ordered unless separated by
//! [`Stream::barrier`] (like Vulkan itself); submissions of one stream run in order; across
//! streams use [`Stream::wait_for`]. After `ticket.wait()` the host sees the results.
//! Buffers must outlive the GPU work using them (or hand an `Arc` to [`Stream::keep_alive`]).
//! [`Buffer::write`] on a mapped buffer happens at once; [`Stream::update`] (small) and
//! [`Stream::copy`] from a [`StagingPool`] buffer happen in stream order.
//!
//! Batching with overlap (the join's three streams): one [`StagingPool`] shared by the
//! streams; per batch, `acquire` an `Upload` buffer, write it, `copy` it to the device,
//! dispatch, `copy` results to an acquired `Readback` buffer, `submit`; the host reads a
//! batch's readback buffer after its ticket's `wait()`, then drops it back into the pool.
//!
//! Testing the discrete-GPU paths on lavapipe: [`Context::set_zero_copy`]`(false)` makes
//! device buffers unmapped (staged copies); [`Context::set_dispatch_width`] forces 2-D
//! dispatch grids at small sizes. [`GpuTimer`] + [`Stream::timestamp`] time GPU work.

mod context;
mod device_choice;
mod instance;
mod kernel;
mod memory;
pub mod scan;
pub mod sort;
mod stream;
mod timer;
mod transfer;

pub use context::{live_contexts, Context, ContextOptions, Features, Limits, QueueLayout};
pub use device_choice::hardware_gpu_present;
pub use kernel::{Kernel, KernelSpec};
pub use memory::{Buffer, BufferRange, Memory, PooledBuffer, StagingPool};
pub use stream::{Stream, Ticket};
pub use timer::{GpuSpans, GpuTimer};
pub use transfer::{Bandwidth, Uploads};

/// SPIR-V for every `glsl/*.comp`, compiled by build.rs: `shaders::NAME` (file stem in
/// upper case) is the module's bytes.
pub mod shaders {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

pub use crate::device::DeviceInfo;
use crate::error::{Error, ErrorKind};
use ash::vk;
use std::sync::atomic::{AtomicU64, Ordering};

static VALIDATION_ERRORS: AtomicU64 = AtomicU64::new(0);
static VALIDATION_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Validation-layer errors reported so far in this process (all contexts). Tests assert
/// this stays zero.
pub fn validation_error_count() -> u64 {
    VALIDATION_ERRORS.load(Ordering::SeqCst)
}

/// Validation-layer warnings (including performance warnings) reported so far.
pub fn validation_warning_count() -> u64 {
    VALIDATION_WARNINGS.load(Ordering::SeqCst)
}

/// Maps a Vulkan failure to the error kinds a caller can act on.
pub(crate) fn vk_error(result: vk::Result, what: &str) -> Error {
    let kind = match result {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_TOO_MANY_OBJECTS => {
            ErrorKind::OutOfDeviceMemory
        }
        vk::Result::ERROR_OUT_OF_HOST_MEMORY => ErrorKind::OutOfHostMemory,
        vk::Result::ERROR_DEVICE_LOST => ErrorKind::DeviceLost,
        vk::Result::ERROR_FEATURE_NOT_PRESENT
        | vk::Result::ERROR_EXTENSION_NOT_PRESENT
        | vk::Result::ERROR_LAYER_NOT_PRESENT
        | vk::Result::ERROR_INCOMPATIBLE_DRIVER => ErrorKind::Unsupported,
        vk::Result::ERROR_INITIALIZATION_FAILED => ErrorKind::NoDevice,
        _ => ErrorKind::Internal,
    };
    Error::new(kind, format!("{what}: {result}"))
}

/// `.map_err` helper: `unsafe { device.create_x(..) }.map_err(vkr("creating x"))?`.
pub(crate) fn vkr(what: &'static str) -> impl Fn(vk::Result) -> Error {
    move |r| vk_error(r, what)
}

/// Lists the Vulkan devices present (empty when there is no Vulkan loader or driver).
pub(crate) fn devices() -> crate::Result<Vec<DeviceInfo>> {
    device_choice::list_devices()
}
