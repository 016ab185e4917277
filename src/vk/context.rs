//! The Vulkan context: instance (with validation when asked), device choice, logical device,
//! queues, allocator, limits and features. One per device; shared as `Arc<Context>`.

use super::kernel::KernelCache;
use super::{vkr, DeviceInfo, VALIDATION_ERRORS, VALIDATION_WARNINGS};
use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};
use std::ffi::{c_char, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";
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

/// Owns the Vulkan instance and device. `Send + Sync`: queues and the allocator are behind
/// mutexes, so streams and buffers may be created and used from several threads.
pub struct Context {
    _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) device: ash::Device,
    allocator: ManuallyDrop<Mutex<Allocator>>,
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
    validation: bool,
    pub(crate) kernels: KernelCache,
}

/// A queue the context owns, as streams address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueId {
    Compute(usize),
    Transfer,
}

fn cstr_field(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

fn kind_name(t: vk::PhysicalDeviceType) -> &'static str {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
        vk::PhysicalDeviceType::CPU => "cpu",
        _ => "other",
    }
}

/// Automatic choice order: discrete > integrated > virtual > CPU > other.
fn kind_rank(t: vk::PhysicalDeviceType) -> u32 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false)
}

unsafe extern "system" fn debug_callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    let message = if data.is_null() || (*data).p_message.is_null() {
        "(no message)".into()
    } else {
        CStr::from_ptr((*data).p_message).to_string_lossy()
    };
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        VALIDATION_ERRORS.fetch_add(1, Ordering::SeqCst);
        eprintln!("[vulkan validation ERROR] {message}");
    } else if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING) {
        VALIDATION_WARNINGS.fetch_add(1, Ordering::SeqCst);
        eprintln!("[vulkan validation warning] {message}");
    }
    vk::FALSE
}

/// What the debug messenger reports: errors and warnings, to `debug_callback`.
fn messenger_info() -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(debug_callback))
}

fn load_entry() -> Result<ash::Entry> {
    unsafe { ash::Entry::load() }.map_err(|e| {
        Error::new(
            ErrorKind::NoDevice,
            format!("cannot load the Vulkan loader (libvulkan.so.1): {e}"),
        )
    })
}

fn create_instance(entry: &ash::Entry, validation: bool) -> Result<ash::Instance> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"simjoin")
        .engine_name(c"simjoin")
        .api_version(vk::API_VERSION_1_2);
    let mut layers: Vec<*const c_char> = Vec::new();
    let mut extensions: Vec<*const c_char> = Vec::new();
    if validation {
        let available = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(vkr("listing instance layers"))?;
        let found = available
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
        if !found {
            return Err(Error::unsupported(
                "SIMJOIN_VALIDATION is set but the Khronos validation layer (VK_LAYER_KHRONOS_validation) \
                 is not installed (Debian: apt install vulkan-validationlayers)",
            ));
        }
        layers.push(VALIDATION_LAYER.as_ptr());
        extensions.push(ash::ext::debug_utils::NAME.as_ptr());
    }
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&extensions);
    // Also report problems of instance creation and destruction themselves.
    let mut creation_messenger = messenger_info();
    if validation {
        info = info.push_next(&mut creation_messenger);
    }
    unsafe { entry.create_instance(&info, None) }.map_err(|r| {
        let mut e = super::vk_error(r, "creating the Vulkan instance");
        if r == vk::Result::ERROR_INCOMPATIBLE_DRIVER {
            e = Error::new(ErrorKind::NoDevice, format!("no Vulkan 1.2 driver: {e}"));
        }
        e
    })
}

/// Everything read about one physical device.
#[derive(Debug)]
struct Candidate {
    index: usize,
    physical: vk::PhysicalDevice,
    props: vk::PhysicalDeviceProperties,
    subgroup_size: u32,
    driver: String,
    families: Vec<vk::QueueFamilyProperties>,
    memory: vk::PhysicalDeviceMemoryProperties,
    int64: bool,
    float64: bool,
    timeline: bool,
    bda: bool,
    int64_atomics: bool,
    scalar_layout: bool,
}

impl Candidate {
    fn read(instance: &ash::Instance, index: usize, physical: vk::PhysicalDevice) -> Candidate {
        let props = unsafe { instance.get_physical_device_properties(physical) };
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let memory = unsafe { instance.get_physical_device_memory_properties(physical) };
        let api_ok = props.api_version >= vk::API_VERSION_1_2;
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default();
        if api_ok {
            let mut props2 = vk::PhysicalDeviceProperties2::default()
                .push_next(&mut subgroup)
                .push_next(&mut driver);
            unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
            features = features.push_next(&mut f12);
            unsafe { instance.get_physical_device_features2(physical, &mut features) };
        }
        let base = features.features;
        Candidate {
            index,
            physical,
            props,
            subgroup_size: subgroup.subgroup_size,
            driver: format!(
                "{} ({})",
                cstr_field(&driver.driver_name),
                cstr_field(&driver.driver_info)
            ),
            families,
            memory,
            int64: base.shader_int64 == vk::TRUE,
            float64: base.shader_float64 == vk::TRUE,
            timeline: f12.timeline_semaphore == vk::TRUE,
            bda: f12.buffer_device_address == vk::TRUE,
            int64_atomics: f12.shader_buffer_int64_atomics == vk::TRUE,
            scalar_layout: f12.scalar_block_layout == vk::TRUE,
        }
    }

    fn name(&self) -> String {
        cstr_field(&self.props.device_name)
    }

    /// The compute family with the most queues (ties: the lower index).
    fn compute_family(&self) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        for (i, f) in self.families.iter().enumerate() {
            let more = best.map_or(true, |(_, count)| f.queue_count > count);
            if f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0 && more {
                best = Some((i as u32, f.queue_count));
            }
        }
        best.map(|(i, _)| i)
    }

    /// A transfer-only family (a DMA engine), when there is one.
    fn transfer_family(&self) -> Option<u32> {
        self.families
            .iter()
            .position(|f| {
                f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                    && !f
                        .queue_flags
                        .intersects(vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS)
                    && f.queue_count > 0
            })
            .map(|i| i as u32)
    }

    /// Why this device cannot run simjoin's kernels, if it cannot.
    fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.props.api_version < vk::API_VERSION_1_2 {
            missing.push("Vulkan 1.2");
        }
        if self.compute_family().is_none() {
            missing.push("a compute queue");
        }
        if !self.timeline {
            missing.push("timelineSemaphore");
        }
        if !self.bda {
            missing.push("bufferDeviceAddress");
        }
        if !self.int64 {
            missing.push("shaderInt64");
        }
        missing
    }

    fn info(&self) -> DeviceInfo {
        let l = &self.props.limits;
        let mut details = Vec::new();
        for (i, f) in self.families.iter().enumerate() {
            details.push(format!(
                "queue family {i}: {} queue(s), {:?}",
                f.queue_count, f.queue_flags
            ));
        }
        for (i, h) in self.memory.memory_heaps_as_slice().iter().enumerate() {
            details.push(format!(
                "memory heap {i}: {} MiB, {:?}",
                h.size >> 20,
                h.flags
            ));
        }
        for (i, t) in self.memory.memory_types_as_slice().iter().enumerate() {
            details.push(format!(
                "memory type {i}: heap {}, {:?}",
                t.heap_index, t.property_flags
            ));
        }
        details.push(format!(
            "maxStorageBufferRange: {} MiB",
            l.max_storage_buffer_range >> 20
        ));
        details.push(format!(
            "maxComputeWorkGroupCount: {:?}",
            l.max_compute_work_group_count
        ));
        details.push(format!(
            "maxComputeWorkGroupSize: {:?}, invocations {}",
            l.max_compute_work_group_size, l.max_compute_work_group_invocations
        ));
        details.push(format!(
            "maxComputeSharedMemorySize: {} KiB",
            l.max_compute_shared_memory_size >> 10
        ));
        details.push(format!(
            "maxPushConstantsSize: {} B",
            l.max_push_constants_size
        ));
        details.push(format!("subgroup size: {}", self.subgroup_size));
        details.push(format!(
            "shaderFloat64: {}, shaderInt64: {}",
            self.float64, self.int64
        ));
        details.push(format!(
            "timelineSemaphore: {}, bufferDeviceAddress: {}, 64-bit buffer atomics: {}",
            self.timeline, self.bda, self.int64_atomics
        ));
        let missing = self.missing();
        if missing.is_empty() {
            details.push("usable by simjoin: yes".into());
        } else {
            details.push(format!(
                "usable by simjoin: no (lacks {})",
                missing.join(", ")
            ));
        }
        DeviceInfo {
            index: self.index,
            name: self.name(),
            kind: kind_name(self.props.device_type).into(),
            api_version: version_string(self.props.api_version),
            driver: self.driver.clone(),
            details,
        }
    }
}

fn candidates(instance: &ash::Instance) -> Result<Vec<Candidate>> {
    let physical =
        unsafe { instance.enumerate_physical_devices() }.map_err(vkr("listing Vulkan devices"))?;
    Ok(physical
        .into_iter()
        .enumerate()
        .map(|(i, p)| Candidate::read(instance, i, p))
        .collect())
}

pub(super) fn list_devices() -> Result<Vec<DeviceInfo>> {
    let Ok(entry) = load_entry() else {
        return Ok(Vec::new());
    };
    let instance = match create_instance(&entry, false) {
        Ok(i) => i,
        Err(e) if e.kind() == ErrorKind::NoDevice => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let result = candidates(&instance).map(|c| c.iter().map(Candidate::info).collect());
    unsafe { instance.destroy_instance(None) };
    result
}

/// Picks the device: by selector (index or name substring), else by kind rank.
fn choose(cands: Vec<Candidate>, selector: Option<&str>) -> Result<Candidate> {
    if cands.is_empty() {
        return Err(Error::new(ErrorKind::NoDevice, "no Vulkan device found"));
    }
    let chosen = match selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(sel) => {
            let names: Vec<String> = cands
                .iter()
                .map(|c| format!("{}: {}", c.index, c.name()))
                .collect();
            let found = match sel.parse::<usize>() {
                Ok(i) => cands.into_iter().find(|c| c.index == i),
                Err(_) => {
                    let needle = sel.to_lowercase();
                    cands
                        .into_iter()
                        .find(|c| c.name().to_lowercase().contains(&needle))
                }
            };
            found.ok_or_else(|| {
                Error::new(
                    ErrorKind::NoDevice,
                    format!(
                        "no Vulkan device matches {sel:?} (devices: {})",
                        names.join("; ")
                    ),
                )
            })?
        }
        None => {
            let mut usable: Vec<Candidate> = cands
                .into_iter()
                .filter(|c| c.missing().is_empty())
                .collect();
            usable.sort_by_key(|c| (kind_rank(c.props.device_type), c.index));
            usable.into_iter().next().ok_or_else(|| {
                Error::new(ErrorKind::NoDevice, "no Vulkan device has what simjoin needs (Vulkan 1.2, timeline semaphores, buffer device address, shaderInt64)")
            })?
        }
    };
    let missing = chosen.missing();
    if !missing.is_empty() {
        return Err(Error::unsupported(format!(
            "Vulkan device {:?} lacks {}",
            chosen.name(),
            missing.join(", ")
        )));
    }
    Ok(chosen)
}

impl Context {
    /// Creates a context on the device `opts` (or `SIMJOIN_DEVICE`) selects.
    pub fn new(opts: &ContextOptions) -> Result<Arc<Context>> {
        let validation = opts
            .validation
            .unwrap_or_else(|| env_flag("SIMJOIN_VALIDATION"));
        let selector = opts
            .device
            .clone()
            .or_else(|| std::env::var("SIMJOIN_DEVICE").ok());
        let entry = load_entry()?;
        let instance = create_instance(&entry, validation)?;
        // From here on, failures must destroy what exists: build in a guard-like sequence.
        let debug = if validation {
            let loader = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let info = messenger_info();
            match unsafe { loader.create_debug_utils_messenger(&info, None) } {
                Ok(m) => Some((loader, m)),
                Err(r) => {
                    unsafe { instance.destroy_instance(None) };
                    return Err(super::vk_error(r, "creating the debug messenger"));
                }
            }
        } else {
            None
        };
        let destroy_instance = |debug: &Option<(
            ash::ext::debug_utils::Instance,
            vk::DebugUtilsMessengerEXT,
        )>| unsafe {
            if let Some((loader, m)) = debug {
                loader.destroy_debug_utils_messenger(*m, None);
            }
            instance.destroy_instance(None);
        };
        let chosen = match candidates(&instance).and_then(|c| choose(c, selector.as_deref())) {
            Ok(c) => c,
            Err(e) => {
                destroy_instance(&debug);
                return Err(e);
            }
        };
        match Self::create_device(&instance, &chosen) {
            Ok((device, layout)) => Ok(Arc::new(Self::assemble(
                entry, instance, debug, chosen, device, layout, validation,
            )?)),
            Err(e) => {
                destroy_instance(&debug);
                Err(e)
            }
        }
    }

    fn create_device(
        instance: &ash::Instance,
        c: &Candidate,
    ) -> Result<(ash::Device, QueueLayout)> {
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
            .scalar_block_layout(c.scalar_layout);
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_features(&base)
            .push_next(&mut f12);
        let device = unsafe { instance.create_device(c.physical, &info, None) }
            .map_err(vkr("creating the Vulkan device"))?;
        Ok((
            device,
            QueueLayout {
                compute_family,
                compute_queues,
                transfer_family,
            },
        ))
    }

    fn assemble(
        entry: ash::Entry,
        instance: ash::Instance,
        debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
        c: Candidate,
        device: ash::Device,
        layout: QueueLayout,
        validation: bool,
    ) -> Result<Context> {
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.clone(),
            device: device.clone(),
            physical_device: c.physical,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: true,
            allocation_sizes: AllocationSizes::new(64 << 20, 64 << 20)
                .with_max_device_memblock_size(256 << 20)
                .with_max_host_memblock_size(256 << 20),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                unsafe {
                    device.destroy_device(None);
                    if let Some((loader, m)) = &debug {
                        loader.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("creating the memory allocator: {e}"),
                ));
            }
        };
        let compute_queues = (0..layout.compute_queues)
            .map(|i| Mutex::new(unsafe { device.get_device_queue(layout.compute_family, i) }))
            .collect();
        let transfer_queue = layout
            .transfer_family
            .map(|f| Mutex::new(unsafe { device.get_device_queue(f, 0) }));
        let l = &c.props.limits;
        let timestamps = c.families[layout.compute_family as usize].timestamp_valid_bits > 0;
        let limits = Limits {
            max_storage_buffer_range: l.max_storage_buffer_range as u64,
            max_memory_allocation_size: {
                let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
                let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
                unsafe { instance.get_physical_device_properties2(c.physical, &mut p2) };
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
            _entry: entry,
            instance,
            debug,
            physical: c.physical,
            device,
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            compute_queues,
            transfer_queue,
            queue_layout: layout,
            limits,
            features: Features {
                shader_float64: c.float64,
                buffer_int64_atomics: c.int64_atomics,
                scalar_block_layout: c.scalar_layout,
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
            validation,
            kernels: KernelCache::default(),
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
        self.validation
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
        (&self.instance, self.physical)
    }

    pub(crate) fn allocator(&self) -> MutexGuard<'_, Allocator> {
        // A panic while holding the lock leaves the allocator consistent enough to free.
        self.allocator.lock().unwrap_or_else(|p| p.into_inner())
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
            QueueId::Transfer if self.transfer_queue.is_some() => self.timestamp_bits[1],
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
        unsafe { self.device.device_wait_idle() }.map_err(vkr("waiting for the device"))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe {
            let _ = self.device.device_wait_idle();
            self.kernels.destroy(&self.device);
            // The allocator frees its memory blocks: before the device goes.
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
            if let Some((loader, m)) = &self.debug {
                loader.destroy_debug_utils_messenger(*m, None);
            }
            self.instance.destroy_instance(None);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up device: `kind`, name, and whether it has what simjoin needs.
    fn fake(index: usize, kind: vk::PhysicalDeviceType, name: &str, capable: bool) -> Candidate {
        let mut props = vk::PhysicalDeviceProperties {
            device_type: kind,
            api_version: vk::API_VERSION_1_2,
            ..Default::default()
        };
        for (dst, src) in props.device_name.iter_mut().zip(name.bytes()) {
            *dst = src as c_char;
        }
        let family = vk::QueueFamilyProperties {
            queue_flags: vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER,
            queue_count: 1,
            ..Default::default()
        };
        Candidate {
            index,
            physical: vk::PhysicalDevice::null(),
            props,
            subgroup_size: 32,
            driver: String::new(),
            families: vec![family],
            memory: vk::PhysicalDeviceMemoryProperties::default(),
            int64: true,
            float64: false,
            timeline: capable,
            bda: true,
            int64_atomics: false,
            scalar_layout: false,
        }
    }

    fn devices() -> Vec<Candidate> {
        vec![
            fake(0, vk::PhysicalDeviceType::CPU, "llvmpipe", true),
            fake(1, vk::PhysicalDeviceType::INTEGRATED_GPU, "Intel UHD", true),
            fake(
                2,
                vk::PhysicalDeviceType::DISCRETE_GPU,
                "Old Discrete",
                false,
            ),
            fake(3, vk::PhysicalDeviceType::DISCRETE_GPU, "NVIDIA H100", true),
            fake(4, vk::PhysicalDeviceType::VIRTUAL_GPU, "virtio", true),
        ]
    }

    #[test]
    fn automatic_choice_prefers_capable_discrete_then_integrated() {
        assert_eq!(choose(devices(), None).unwrap().index, 3);
        let no_discrete: Vec<_> = devices().into_iter().filter(|c| c.index != 3).collect();
        assert_eq!(choose(no_discrete, None).unwrap().index, 1);
        let only_cpu_and_virtual: Vec<_> = devices()
            .into_iter()
            .filter(|c| c.index == 0 || c.index == 4)
            .collect();
        assert_eq!(choose(only_cpu_and_virtual, None).unwrap().index, 4);
        assert_eq!(
            choose(Vec::new(), None).unwrap_err().kind(),
            ErrorKind::NoDevice
        );
    }

    #[test]
    fn selector_by_index_or_name_and_clear_errors() {
        assert_eq!(choose(devices(), Some("0")).unwrap().index, 0);
        assert_eq!(choose(devices(), Some("h100")).unwrap().index, 3);
        assert_eq!(
            choose(devices(), Some("  ")).unwrap().index,
            3,
            "blank means automatic"
        );
        assert_eq!(
            choose(devices(), Some("7")).unwrap_err().kind(),
            ErrorKind::NoDevice
        );
        assert_eq!(
            choose(devices(), Some("radeon")).unwrap_err().kind(),
            ErrorKind::NoDevice
        );
        // Asking for a device that lacks a required feature names what is missing.
        let err = choose(devices(), Some("old")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("timelineSemaphore"), "{err}");
    }
}
