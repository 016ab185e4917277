//! Device choice: what each physical device offers ([`Candidate`]), the ranking
//! (discrete > integrated > virtual > CPU), selection by index or name, and the listing
//! behind `simjoin info`.

use super::instance::Instance;
use super::{vkr, DeviceInfo};
use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use std::ffi::c_char;

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

/// Everything read about one physical device.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub(crate) index: usize,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) props: vk::PhysicalDeviceProperties,
    pub(crate) subgroup_size: u32,
    pub(crate) driver: String,
    pub(crate) families: Vec<vk::QueueFamilyProperties>,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    pub(crate) int64: bool,
    pub(crate) float64: bool,
    pub(crate) timeline: bool,
    pub(crate) bda: bool,
    pub(crate) int64_atomics: bool,
    pub(crate) scalar_layout: bool,
    /// `hostQueryReset`: timestamp slots reset on the host (needed on transfer-only queues).
    pub(crate) host_query_reset: bool,
    /// `shaderFloat16`: f16 arithmetic in shaders.
    pub(crate) float16: bool,
    /// `vulkanMemoryModel` and `vulkanMemoryModelDeviceScope`: kernels with cooperative
    /// matrices are compiled for the Vulkan memory model, and once it is on, every kernel's
    /// device-scope atomics need the second (VUID-RuntimeSpirv-vulkanMemoryModel-06265).
    pub(crate) memory_model: bool,
    /// The shapes the device's matrix units take in compute shaders
    /// (`VK_KHR_cooperative_matrix`, its feature on); empty without them.
    pub(crate) matrix_shapes: Vec<MatrixShape>,
}

/// One product shape of `VK_KHR_cooperative_matrix`: C (m x n, type `c`) += A (m x k,
/// type `a`) B (k x n, type `b`), by the invocations of one `scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatrixShape {
    pub(crate) m: u32,
    pub(crate) n: u32,
    pub(crate) k: u32,
    pub(crate) a: vk::ComponentTypeKHR,
    pub(crate) b: vk::ComponentTypeKHR,
    pub(crate) c: vk::ComponentTypeKHR,
    pub(crate) result: vk::ComponentTypeKHR,
    pub(crate) saturating: bool,
    pub(crate) scope: vk::ScopeKHR,
}

impl MatrixShape {
    /// The shape the f16 tiles use (glsl/grouped_tiles_coop.comp): 16 x 16 x 16, f16
    /// inputs, f32 accumulation, one subgroup.
    pub(crate) const F16_TILES: MatrixShape = MatrixShape {
        m: 16,
        n: 16,
        k: 16,
        a: vk::ComponentTypeKHR::FLOAT16,
        b: vk::ComponentTypeKHR::FLOAT16,
        c: vk::ComponentTypeKHR::FLOAT32,
        result: vk::ComponentTypeKHR::FLOAT32,
        saturating: false,
        scope: vk::ScopeKHR::SUBGROUP,
    };
}

/// Whether `physical` lists the device extension `name`.
fn has_extension(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    name: &std::ffi::CStr,
) -> bool {
    // SAFETY: a plain query of a device enumerated from this live instance.
    unsafe { instance.enumerate_device_extension_properties(physical) }.is_ok_and(|list| {
        list.iter()
            .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
    })
}

impl Candidate {
    fn read(
        entry: &ash::Entry,
        instance: &ash::Instance,
        index: usize,
        physical: vk::PhysicalDevice,
    ) -> Candidate {
        // SAFETY: `physical` was enumerated from this live instance; plain queries.
        let (props, families, memory) = unsafe {
            (
                instance.get_physical_device_properties(physical),
                instance.get_physical_device_queue_family_properties(physical),
                instance.get_physical_device_memory_properties(physical),
            )
        };
        let api_ok = props.api_version >= vk::API_VERSION_1_2;
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut pcoop = vk::PhysicalDeviceCooperativeMatrixPropertiesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default();
        let coop_ext =
            api_ok && has_extension(instance, physical, ash::khr::cooperative_matrix::NAME);
        if api_ok {
            let mut props2 = vk::PhysicalDeviceProperties2::default()
                .push_next(&mut subgroup)
                .push_next(&mut driver);
            features = features.push_next(&mut f12);
            if coop_ext {
                props2 = props2.push_next(&mut pcoop);
                features = features.push_next(&mut fcoop);
            }
            // SAFETY: the device reports Vulkan >= 1.2, so these structs are known to it;
            // the chains point at locals that live across the calls.
            unsafe {
                instance.get_physical_device_properties2(physical, &mut props2);
                instance.get_physical_device_features2(physical, &mut features);
            }
        }
        let base = features.features;
        let mut matrix_shapes = Vec::new();
        if coop_ext
            && fcoop.cooperative_matrix == vk::TRUE
            && pcoop
                .cooperative_matrix_supported_stages
                .contains(vk::ShaderStageFlags::COMPUTE)
        {
            let loader = ash::khr::cooperative_matrix::Instance::new(entry, instance);
            // SAFETY: the device lists the extension, whose instance-level query this is.
            let listed =
                unsafe { loader.get_physical_device_cooperative_matrix_properties(physical) };
            matrix_shapes = listed
                .unwrap_or_default()
                .iter()
                .map(|p| MatrixShape {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    a: p.a_type,
                    b: p.b_type,
                    c: p.c_type,
                    result: p.result_type,
                    saturating: p.saturating_accumulation == vk::TRUE,
                    scope: p.scope,
                })
                .collect();
        }
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
            host_query_reset: f12.host_query_reset == vk::TRUE,
            float16: f12.shader_float16 == vk::TRUE,
            memory_model: f12.vulkan_memory_model == vk::TRUE
                && f12.vulkan_memory_model_device_scope == vk::TRUE,
            matrix_shapes,
        }
    }

    /// Whether the f16 matrix-unit tiles can run here (the shape, f16 arithmetic, the
    /// Vulkan memory model, and a subgroup size that divides 128).
    pub(crate) fn f16_matrix_tiles(&self) -> bool {
        self.float16
            && self.memory_model
            && (1..=128).contains(&self.subgroup_size)
            && 128 % self.subgroup_size == 0
            && self.matrix_shapes.contains(&MatrixShape::F16_TILES)
    }

    pub(crate) fn name(&self) -> String {
        cstr_field(&self.props.device_name)
    }

    /// The compute family with the most queues (ties: the lower index).
    pub(crate) fn compute_family(&self) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        for (i, f) in self.families.iter().enumerate() {
            let more = best.is_none_or(|(_, count)| f.queue_count > count);
            if f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0 && more {
                best = Some((i as u32, f.queue_count));
            }
        }
        best.map(|(i, _)| i)
    }

    /// A transfer-only family (a DMA engine), when there is one.
    pub(crate) fn transfer_family(&self) -> Option<u32> {
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
    pub(crate) fn missing(&self) -> Vec<&'static str> {
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

    pub(crate) fn info(&self) -> DeviceInfo {
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
        details.push(format!("shaderFloat16: {}", self.float16));
        if self.matrix_shapes.is_empty() {
            details.push("matrix units (VK_KHR_cooperative_matrix): none".into());
        } else {
            let shapes: Vec<String> = self
                .matrix_shapes
                .iter()
                .map(|s| {
                    format!(
                        "{}x{}x{} {:?}*{:?}+{:?}->{:?}{} {:?}",
                        s.m,
                        s.n,
                        s.k,
                        s.a,
                        s.b,
                        s.c,
                        s.result,
                        if s.saturating { " sat" } else { "" },
                        s.scope
                    )
                })
                .collect();
            details.push(format!(
                "matrix units (VK_KHR_cooperative_matrix): {}; f16 tiles: {}",
                shapes.join(", "),
                if self.f16_matrix_tiles() { "yes" } else { "no" }
            ));
        }
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

pub(crate) fn candidates(instance: &Instance) -> Result<Vec<Candidate>> {
    // SAFETY: a plain query of a live instance.
    let physical = unsafe { instance.raw.enumerate_physical_devices() }
        .map_err(vkr("listing Vulkan devices"))?;
    Ok(physical
        .into_iter()
        .enumerate()
        .map(|(i, p)| Candidate::read(&instance.entry, &instance.raw, i, p))
        .collect())
}

/// The devices present, read once per process through a plain instance (no validation,
/// no device) that is kept: listing devices and `auto`'s "is there a real GPU?" then cost
/// nothing after the first time, and no driver is loaded and unloaded per engine (drivers
/// are not all clean to unload: lavapipe leaves allocations behind on every unload).
struct Probe {
    _instance: Instance,
    candidates: Vec<Candidate>,
}

fn probe() -> std::result::Result<&'static Probe, Error> {
    static PROBE: std::sync::OnceLock<std::result::Result<Probe, (ErrorKind, String)>> =
        std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            let _serial = super::instance::lifecycle_lock();
            let instance = Instance::new(false).map_err(|e| (e.kind(), e.to_string()))?;
            let candidates = candidates(&instance).map_err(|e| (e.kind(), e.to_string()))?;
            Ok(Probe {
                _instance: instance,
                candidates,
            })
        })
        .as_ref()
        .map_err(|(kind, msg)| Error::new(*kind, msg))
}

/// Creates the probe's instance if it does not exist yet (see `Context::new`).
pub(super) fn probe_instance() -> bool {
    probe().is_ok()
}

pub(super) fn list_devices() -> Result<Vec<DeviceInfo>> {
    match probe() {
        Ok(p) => Ok(p.candidates.iter().map(Candidate::info).collect()),
        Err(e) if e.kind() == ErrorKind::NoDevice => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Whether `selector` (or, without one, `SIMJOIN_DEVICE`, else the best device) names a
/// usable hardware GPU: what `backend = auto` asks before opening a device. No device
/// is created to answer.
pub fn hardware_gpu_present(selector: Option<&str>) -> bool {
    let env = std::env::var("SIMJOIN_DEVICE").ok();
    let selector = selector.or(env.as_deref());
    probe().is_ok_and(|p| {
        choose(p.candidates.clone(), selector)
            .is_ok_and(|c| c.props.device_type != vk::PhysicalDeviceType::CPU)
    })
}

/// Picks the device: by selector (index or name substring), else by kind rank.
pub(crate) fn choose(cands: Vec<Candidate>, selector: Option<&str>) -> Result<Candidate> {
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
            host_query_reset: false,
            float16: true,
            memory_model: true,
            matrix_shapes: Vec::new(),
        }
    }

    #[test]
    fn matrix_tiles_need_the_shape_f16_the_memory_model_and_a_subgroup_dividing_128() {
        let mut c = fake(0, vk::PhysicalDeviceType::DISCRETE_GPU, "GPU", true);
        assert!(!c.f16_matrix_tiles(), "no shapes listed");
        let other = MatrixShape {
            k: 8,
            ..MatrixShape::F16_TILES
        };
        c.matrix_shapes = vec![other];
        assert!(!c.f16_matrix_tiles(), "only another shape");
        c.matrix_shapes.push(MatrixShape::F16_TILES);
        assert!(c.f16_matrix_tiles());
        let info = c.info().details.join("\n");
        assert!(
            info.contains("16x16x16") && info.contains("f16 tiles: yes"),
            "{info}"
        );
        for (what, change) in [
            (
                "no f16",
                (|c: &mut Candidate| c.float16 = false) as fn(&mut Candidate),
            ),
            ("no memory model", |c| c.memory_model = false),
            ("subgroup of 48", |c| c.subgroup_size = 48),
            ("subgroup of 256", |c| c.subgroup_size = 256),
        ] {
            let mut d = c.clone();
            change(&mut d);
            assert!(!d.f16_matrix_tiles(), "{what}");
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
