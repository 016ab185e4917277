//! The Vulkan context: the logical device on the chosen physical device, its queues, the
//! memory allocator, limits and features. One per device; shared as `Arc<Context>` by
//! everything made from it (buffers, kernels, streams), so it is destroyed last.
//! (`instance.rs` owns the instance, `device_choice.rs` picks the device.)

use super::device_choice::{candidates, choose, Candidate};
use super::instance::{lifecycle_lock, Instance};
use super::kernel::KernelCache;
use super::vkr;
use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// At most this many compute queues are used ("streams" beyond it share queues).
const MAX_COMPUTE_QUEUES: u32 = 3;

/// How to create a [`Context`].
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Device index or case-insensitive name substring. `None`: the `SIMJOIN_DEVICE`
    /// environment variable, else the best device (discrete > integrated > virtual > CPU).
    pub device: Option<String>,
    /// Validation layers + debug messenger. `None`: on when `SIMJOIN_VALIDATION` is set
    /// (to anything but "0" or ""). Asking for validation without the layer is an error.
    pub validation: Option<bool>,
}

/// The device limits simjoin respects, read once at context creation.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_storage_buffer_range: u64,
    pub max_memory_allocation_size: u64,
    pub max_compute_work_group_count: [u32; 3],
    pub max_compute_work_group_size: [u32; 3],
    pub max_compute_work_group_invocations: u32,
    pub max_compute_shared_memory_size: u32,
    pub max_push_constants_size: u32,
    pub max_per_stage_storage_buffers: u32,
    pub min_storage_buffer_offset_alignment: u64,
    pub subgroup_size: u32,
    /// Nanoseconds per timestamp tick (0 when the compute queue has no timestamps).
    pub timestamp_period_ns: f32,
}

/// Optional device features (the required ones are checked at creation).
#[derive(Clone, Copy, Debug, Default)]
pub struct Features {
    /// `shaderFloat64`: f64 coordinates in kernels. Optional: the join refuses f64 without it.
    pub shader_float64: bool,
    /// `shaderBufferInt64Atomics`: 64-bit atomics on storage buffers.
    pub buffer_int64_atomics: bool,
    /// `scalarBlockLayout`: C-like layout for buffers (e.g. `layout(scalar)`).
    pub scalar_block_layout: bool,
    /// `hostQueryReset`: timestamp slots are reset on the host when a timer is made, so a
    /// transfer-only queue (which cannot record a reset) may write each slot once.
    pub host_query_reset: bool,
    /// The f16 matrix-unit tiles (`VK_KHR_cooperative_matrix`, 16 x 16 x 16 f16 products
    /// with f32 accumulation, and `shaderFloat16`) are enabled: glsl/grouped_tiles_coop.comp
    /// can run. Off where the device lacks them or `SIMJOIN_GPU_MATRIX=0`.
    pub f16_matrix_tiles: bool,
}

/// Whether to enable the device's matrix units where it has them: `SIMJOIN_GPU_MATRIX=0`
/// turns them off (to compare the tiles with and without them).
fn matrix_units_wanted() -> bool {
    std::env::var("SIMJOIN_GPU_MATRIX").as_deref() != Ok("0")
}

/// Which queue families and how many queues the context uses.
#[derive(Clone, Copy, Debug)]
pub struct QueueLayout {
    pub compute_family: u32,
    /// 1 to 3 compute queues.
    pub compute_queues: u32,
    /// A transfer-only family (DMA engine), when the device has one.
    pub transfer_family: Option<u32>,
}

/// Owns the Vulkan device (and the instance it came from). `Send + Sync`: queues and the
/// allocator are behind mutexes, so streams and buffers may be created and used from
/// several threads. Fields drop in declaration order after `Drop::drop`: the kernels and
/// the allocator's memory go in `drop`, then the device, then the instance.
pub struct Context {
    pub(crate) kernels: KernelCache,
    /// Timeline semaphores of dropped streams, reused by new ones and destroyed only with
    /// the context (see [`Context::recycle_timeline`]).
    idle_timelines: Mutex<Vec<vk::Semaphore>>,
    /// `None` only during `drop`, which frees the allocator's memory before the device.
    allocator: Option<Mutex<Allocator>>,
    compute_queues: Vec<Mutex<vk::Queue>>,
    transfer_queue: Option<Mutex<vk::Queue>>,
    queue_layout: QueueLayout,
    limits: Limits,
    features: Features,
    name: String,
    software: bool,
    unified_memory: bool,
    zero_copy: AtomicBool,
    dispatch_width: AtomicU32,
    /// timestampValidBits of the compute and the transfer family.
    timestamp_bits: [u32; 2],
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) device: LogicalDevice,
    pub(crate) instance: Instance,
}

/// An owned logical device: waits for it to be idle and destroys it when dropped.
pub(crate) struct LogicalDevice(ash::Device);

impl std::ops::Deref for LogicalDevice {
    type Target = ash::Device;
    fn deref(&self) -> &ash::Device {
        &self.0
    }
}

impl Drop for LogicalDevice {
    fn drop(&mut self) {
        // SAFETY: the owner (`Context`) drops this only after every object made from the
        // device (buffers, pipelines, streams hold the context) and the allocator's memory
        // are gone; waiting for idle first lets no queued work outlive the device.
        unsafe {
            let _ = self.0.device_wait_idle();
            let _serial = lifecycle_lock();
            self.0.destroy_device(None);
        }
    }
}

/// Contexts alive in this process (each owns a Vulkan instance and device).
static LIVE_CONTEXTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many contexts (Vulkan devices opened by simjoin) are alive in this process: an
/// engine's device is released when the engine is dropped, so this returns to its earlier
/// value. For tests and diagnostics.
pub fn live_contexts() -> usize {
    LIVE_CONTEXTS.load(Ordering::SeqCst)
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false)
}

/// A queue the context owns, as streams address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueId {
    Compute(usize),
    Transfer,
}

impl Context {
    /// Creates a context on the device `opts` (or `SIMJOIN_DEVICE`) selects. Each step's
    /// result owns itself, so a failure part-way destroys what exists, in reverse order.
    pub fn new(opts: &ContextOptions) -> Result<Arc<Context>> {
        let validation = opts
            .validation
            .unwrap_or_else(|| env_flag("SIMJOIN_VALIDATION"));
        // The one place that reads SIMJOIN_DEVICE.
        let selector = opts
            .device
            .clone()
            .or_else(|| std::env::var("SIMJOIN_DEVICE").ok());
        // First (and before taking the lifecycle lock, which the probe takes itself): the
        // process-wide device probe's instance exists before the first device: lavapipe
        // builds an llvmpipe screen (with process-wide LLVM set-up) for every instance that
        // enumerates its devices, which is not safe while another lavapipe device runs
        // work. (Added for a SIGSEGV in lavapipe's queue thread, seen once in about 150
        // stress runs; a crash of that shape was later traced to another cause, now fixed:
        // see `recycle_timeline`. Kept as a precaution: it costs one instance per process.)
        let _ = super::device_choice::probe_instance();
        // Creation, enumeration and device creation under one hold of the lifecycle lock.
        let _serial = lifecycle_lock();
        let instance = Instance::new(validation)?;
        let chosen = choose(candidates(&instance)?, selector.as_deref())?;
        // Read once: the device is created with the matrix units exactly when the context
        // says it has them.
        let matrix = chosen.f16_matrix_tiles() && matrix_units_wanted();
        let (device, layout) = Self::create_device(&instance.raw, &chosen, matrix)?;
        let ctx = Self::assemble(instance, chosen, device, layout, matrix)?;
        LIVE_CONTEXTS.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(ctx))
    }

    /// The logical device of `c`; with `matrix`, its matrix units enabled (and what their
    /// kernels need: f16 arithmetic, the Vulkan memory model at device scope).
    fn create_device(
        instance: &ash::Instance,
        c: &Candidate,
        matrix: bool,
    ) -> Result<(LogicalDevice, QueueLayout)> {
        let compute_family = c.compute_family().expect("checked by missing()");
        let compute_queues = c.families[compute_family as usize]
            .queue_count
            .min(MAX_COMPUTE_QUEUES);
        let transfer_family = c.transfer_family();
        let priorities = [1.0f32; MAX_COMPUTE_QUEUES as usize];
        let mut queue_infos = vec![vk::DeviceQueueCreateInfo::default()
            .queue_family_index(compute_family)
            .queue_priorities(&priorities[..compute_queues as usize])];
        if let Some(t) = transfer_family {
            queue_infos.push(
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(t)
                    .queue_priorities(&priorities[..1]),
            );
        }
        let base = vk::PhysicalDeviceFeatures::default()
            .shader_int64(true)
            .shader_float64(c.float64);
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .timeline_semaphore(true)
            .buffer_device_address(true)
            .shader_buffer_int64_atomics(c.int64_atomics)
            .scalar_block_layout(c.scalar_layout)
            .host_query_reset(c.host_query_reset);
        let mut coop =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let extensions = [ash::khr::cooperative_matrix::NAME.as_ptr()];
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_features(&base);
        if matrix {
            f12 = f12
                .shader_float16(true)
                .vulkan_memory_model(true)
                .vulkan_memory_model_device_scope(true);
            info = info
                .enabled_extension_names(&extensions)
                .push_next(&mut coop);
        }
        let info = info.push_next(&mut f12);
        let device = {
            let _serial = lifecycle_lock();
            // SAFETY: `c.physical` belongs to `instance`; the queue infos name existing
            // families with at most their queue count; every enabled feature was reported
            // supported (`Candidate::missing` checked the required ones, optional ones are
            // read).
            unsafe { instance.create_device(c.physical, &info, None) }
        }
        .map_err(vkr("creating the Vulkan device"))?;
        Ok((
            LogicalDevice(device),
            QueueLayout {
                compute_family,
                compute_queues,
                transfer_family,
            },
        ))
    }

    fn assemble(
        instance: Instance,
        c: Candidate,
        device: LogicalDevice,
        layout: QueueLayout,
        matrix: bool,
    ) -> Result<Context> {
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.raw.clone(),
            device: (*device).clone(),
            physical_device: c.physical,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: true,
            allocation_sizes: AllocationSizes::new(64 << 20, 64 << 20)
                .with_max_device_memblock_size(256 << 20)
                .with_max_host_memblock_size(256 << 20),
        })
        .map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("creating the memory allocator: {e}"),
            )
        })?;
        let compute_queues = (0..layout.compute_queues)
            // SAFETY: queue i < the count requested for this family at device creation.
            .map(|i| Mutex::new(unsafe { device.get_device_queue(layout.compute_family, i) }))
            .collect();
        let transfer_queue = layout
            .transfer_family
            // SAFETY: one queue was requested for the transfer family.
            .map(|f| Mutex::new(unsafe { device.get_device_queue(f, 0) }));
        let l = &c.props.limits;
        let timestamps = c.families[layout.compute_family as usize].timestamp_valid_bits > 0;
        let limits = Limits {
            max_storage_buffer_range: l.max_storage_buffer_range as u64,
            max_memory_allocation_size: {
                let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
                let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
                // SAFETY: a Vulkan 1.2 device (checked); the chain points at a local.
                unsafe {
                    instance
                        .raw
                        .get_physical_device_properties2(c.physical, &mut p2)
                };
                m3.max_memory_allocation_size
            },
            max_compute_work_group_count: l.max_compute_work_group_count,
            max_compute_work_group_size: l.max_compute_work_group_size,
            max_compute_work_group_invocations: l.max_compute_work_group_invocations,
            max_compute_shared_memory_size: l.max_compute_shared_memory_size,
            max_push_constants_size: l.max_push_constants_size,
            max_per_stage_storage_buffers: l.max_per_stage_descriptor_storage_buffers,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            subgroup_size: c.subgroup_size.max(1),
            timestamp_period_ns: if timestamps { l.timestamp_period } else { 0.0 },
        };
        let types = c.memory.memory_types_as_slice();
        let device_local: Vec<_> = types
            .iter()
            .filter(|t| {
                t.property_flags
                    .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
            })
            .collect();
        let unified_memory = !device_local.is_empty()
            && device_local.iter().all(|t| {
                t.property_flags
                    .contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
            });
        Ok(Context {
            physical: c.physical,
            allocator: Some(Mutex::new(allocator)),
            compute_queues,
            transfer_queue,
            queue_layout: layout,
            limits,
            features: Features {
                shader_float64: c.float64,
                buffer_int64_atomics: c.int64_atomics,
                scalar_block_layout: c.scalar_layout,
                host_query_reset: c.host_query_reset,
                f16_matrix_tiles: matrix,
            },
            name: c.name(),
            software: c.props.device_type == vk::PhysicalDeviceType::CPU,
            unified_memory,
            zero_copy: AtomicBool::new(true),
            dispatch_width: AtomicU32::new(l.max_compute_work_group_count[0]),
            timestamp_bits: [
                c.families[layout.compute_family as usize].timestamp_valid_bits,
                layout
                    .transfer_family
                    .map_or(0, |f| c.families[f as usize].timestamp_valid_bits),
            ],
            kernels: KernelCache::default(),
            idle_timelines: Mutex::new(Vec::new()),
            device,
            instance,
        })
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// A CPU-type device (lavapipe, SwiftShader): correct but slow. The engine never picks
    /// one automatically.
    pub fn is_software(&self) -> bool {
        self.software
    }

    /// Every device-local memory type is host-visible (lavapipe, integrated GPUs): device
    /// buffers are mapped and uploads/downloads need no staging copy.
    pub fn has_unified_memory(&self) -> bool {
        self.unified_memory
    }

    /// Whether device buffers created from now on are used through their host mapping where
    /// the device offers one (default: yes).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy.load(Ordering::Relaxed)
    }

    /// `false`: treat device-local memory as not host-visible, as on a discrete GPU, so
    /// uploads and downloads go through staging copies. For testing that path on lavapipe
    /// and for comparing the two; affects buffers created afterwards.
    pub fn set_zero_copy(&self, enabled: bool) {
        self.zero_copy.store(enabled, Ordering::Relaxed)
    }

    /// Workgroups per row of a [`super::Stream::dispatch_threads`] grid: the device's
    /// `maxComputeWorkGroupCount[0]` unless lowered by [`Context::set_dispatch_width`].
    pub fn dispatch_width(&self) -> u32 {
        self.dispatch_width.load(Ordering::Relaxed)
    }

    /// Lowers the row width of dispatch grids (clamped to 1..=the device limit), so tests
    /// can exercise 2-D grids of workgroups at small sizes.
    pub fn set_dispatch_width(&self, groups: u32) {
        let max = self.limits.max_compute_work_group_count[0];
        self.dispatch_width
            .store(groups.clamp(1, max), Ordering::Relaxed)
    }

    /// Whether validation layers are on for this context.
    pub fn validation_enabled(&self) -> bool {
        self.instance.validation
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn queue_layout(&self) -> &QueueLayout {
        &self.queue_layout
    }

    /// Number of distinct compute queues (1 to 3); more streams than this share queues.
    pub fn compute_queue_count(&self) -> usize {
        self.compute_queues.len()
    }

    /// Whether a dedicated transfer queue exists (see [`super::Stream::transfer`]).
    pub fn has_transfer_queue(&self) -> bool {
        self.transfer_queue.is_some()
    }

    /// The raw ash device, for code that needs a Vulkan call this layer does not wrap.
    pub fn raw_device(&self) -> &ash::Device {
        &self.device
    }

    /// The raw ash instance and physical device (e.g. to query more properties).
    pub fn raw_instance(&self) -> (&ash::Instance, vk::PhysicalDevice) {
        (&self.instance.raw, self.physical)
    }

    pub(crate) fn allocator(&self) -> MutexGuard<'_, Allocator> {
        // A panic while holding the lock leaves the allocator consistent enough to free.
        self.allocator
            .as_ref()
            .expect("present until drop")
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn queue_family(&self, q: QueueId) -> u32 {
        match q {
            QueueId::Compute(_) => self.queue_layout.compute_family,
            QueueId::Transfer => self
                .queue_layout
                .transfer_family
                .unwrap_or(self.queue_layout.compute_family),
        }
    }

    /// A timeline semaphore that no pending submission signals: a recycled one, else a new
    /// one (at 0). Its owner gives it back with [`Context::recycle_timeline`].
    pub(crate) fn take_timeline(&self) -> Result<vk::Semaphore> {
        let idle = self
            .idle_timelines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        idle.map_or_else(|| self.new_timeline(), Ok)
    }

    fn new_timeline(&self) -> Result<vk::Semaphore> {
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        // SAFETY: a valid timeline create info (the timelineSemaphore feature is enabled at
        // device creation) on this live device.
        unsafe { self.device.create_semaphore(&info, None) }
            .map_err(vkr("creating a timeline semaphore"))
    }

    /// Takes back the timeline semaphore of a dropped stream instead of destroying it.
    /// Why: Mesa's common queue code (lavapipe, and other Mesa drivers with emulated
    /// timelines) runs submissions on a submit thread that, after a submission has
    /// signalled, still releases its waits on *other* timelines. The host can see the
    /// signal, drop the timeline that was waited on and destroy it (legal: every
    /// submission using it has completed) while that thread writes into the freed
    /// semaphore: issue 10's SIGSEGV. Recycled semaphores are never freed under it; the
    /// pool is as large as the most streams alive at once. Destroyed in `drop`, after
    /// [`Context::drain_queues`].
    pub(crate) fn recycle_timeline(&self, semaphore: vk::Semaphore) {
        self.idle_timelines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(semaphore);
    }

    /// Returns when every queue has finished every submission *and* the driver's
    /// bookkeeping of them: an empty submission on each queue, waited on from the host.
    /// A queue runs submissions in order, so when the empty one has signalled, the
    /// driver's submit thread (if any) is done with all earlier ones, including the
    /// releases `recycle_timeline` describes; `vkDeviceWaitIdle` only promises the first.
    fn drain_queues(&self) -> Result<()> {
        let semaphore = self.new_timeline()?;
        let queues = self.compute_queues.iter().chain(self.transfer_queue.iter());
        let mut result = Ok(());
        for (value, queue) in (1u64..).zip(queues) {
            let signal = [semaphore];
            let values = [value];
            let mut timeline =
                vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
            let submit = vk::SubmitInfo::default()
                .signal_semaphores(&signal)
                .push_next(&mut timeline);
            let q = queue.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the queue's mutex is held; an empty batch that only signals our live
            // timeline semaphore with a value above its current one.
            let submitted = unsafe { self.device.queue_submit(*q, &[submit], vk::Fence::null()) };
            drop(q);
            let waited = submitted.and_then(|()| {
                let wait = vk::SemaphoreWaitInfo::default()
                    .semaphores(&signal)
                    .values(&values);
                // SAFETY: a host wait on our live semaphore.
                unsafe { self.device.wait_semaphores(&wait, u64::MAX) }
            });
            if let Err(r) = waited {
                result = Err(super::vk_error(r, "draining a queue"));
                break;
            }
        }
        // SAFETY: the empty batches have completed (or failed to submit, or the device is
        // lost and nothing executes any more), and they waited on nothing, so no driver
        // bookkeeping refers to this semaphore.
        unsafe { self.device.destroy_semaphore(semaphore, None) };
        result
    }

    pub(crate) fn lock_queue(&self, q: QueueId) -> MutexGuard<'_, vk::Queue> {
        let m = match q {
            QueueId::Compute(i) => &self.compute_queues[i % self.compute_queues.len()],
            QueueId::Transfer => self
                .transfer_queue
                .as_ref()
                .unwrap_or(&self.compute_queues[0]),
        };
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Valid bits of timestamps written on queue `q` (0: no timestamps there).
    pub(crate) fn timestamp_bits(&self, q: QueueId) -> u32 {
        match q {
            QueueId::Compute(_) => self.timestamp_bits[0],
            // A transfer-only family cannot record vkCmdResetQueryPool: its slots must
            // have been reset on the host (see `GpuTimer::new`).
            QueueId::Transfer if self.transfer_queue.is_some() => {
                if self.features.host_query_reset {
                    self.timestamp_bits[1]
                } else {
                    0
                }
            }
            QueueId::Transfer => self.timestamp_bits[0],
        }
    }

    /// Queue families buffers must be shareable between (CONCURRENT sharing when > 1).
    pub(crate) fn buffer_families(&self) -> Vec<u32> {
        let mut f = vec![self.queue_layout.compute_family];
        if let Some(t) = self.queue_layout.transfer_family {
            f.push(t);
        }
        f
    }

    /// Blocks until the device has finished all work.
    pub fn wait_idle(&self) -> Result<()> {
        // vkDeviceWaitIdle requires external synchronization of all queues.
        let _guards: Vec<_> = self
            .compute_queues
            .iter()
            .chain(self.transfer_queue.iter())
            .map(|q| q.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        // SAFETY: every queue's mutex is held, as vkDeviceWaitIdle requires.
        unsafe { self.device.device_wait_idle() }.map_err(vkr("waiting for the device"))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Every buffer, kernel, stream and timer holds an `Arc` of the context, so none is
        // left; wait for stray work anyway (a leaked stream's submissions).
        let _ = self.wait_idle();
        let _ = self.drain_queues();
        let idle = std::mem::take(
            self.idle_timelines
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        // SAFETY: the device is idle and no `Kernel` exists (see above); no stream is left
        // and the queues are drained, so no submission or driver thread uses the
        // recycled semaphores.
        unsafe {
            self.kernels.destroy(&self.device);
            for s in idle {
                self.device.destroy_semaphore(s, None);
            }
        }
        // The allocator frees its memory blocks: before the device (a field, dropped next).
        drop(self.allocator.take());
        LIVE_CONTEXTS.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.name)
            .field("software", &self.software)
            .field("unified_memory", &self.unified_memory)
            .field("queues", &self.queue_layout)
            .finish()
    }
}
