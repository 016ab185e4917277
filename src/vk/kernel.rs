//! Kernels: a SPIR-V compute module + specialization constants + push constants, with its
//! storage buffers at set 0, bindings 0..n. Pipelines are cached per context.

use super::context::Context;
use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// How to build a kernel's pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    /// Specialization constant 0: the kernel declares `layout(local_size_x_id = 0) in;`.
    pub workgroup_size: u32,
    /// Further specialization constants `(constant_id, value)` (ids >= 1), e.g. the
    /// dimensionality. Bools are 0/1; floats as `f32::to_bits`.
    pub constants: Vec<(u32, u32)>,
    /// Number of storage buffers at set 0, bindings 0..bindings.
    pub bindings: u32,
    /// Size of the push-constant block in bytes (a multiple of 4, at most 128 is portable).
    pub push_bytes: u32,
}

impl KernelSpec {
    pub fn new(workgroup_size: u32) -> Self {
        KernelSpec {
            workgroup_size,
            constants: Vec::new(),
            bindings: 0,
            push_bytes: 0,
        }
    }
    pub fn bindings(mut self, n: u32) -> Self {
        self.bindings = n;
        self
    }
    pub fn push_bytes(mut self, n: u32) -> Self {
        self.push_bytes = n;
        self
    }
    pub fn constant(mut self, id: u32, value: u32) -> Self {
        self.constants.push((id, value));
        self
    }
}

/// The Vulkan objects behind a kernel; owned by the context's cache, destroyed with it.
pub(crate) struct KernelObjects {
    module: vk::ShaderModule,
    pub(crate) set_layout: vk::DescriptorSetLayout,
    pub(crate) pipeline_layout: vk::PipelineLayout,
    pub(crate) pipeline: vk::Pipeline,
}

#[derive(PartialEq, Eq, Hash)]
struct KernelKey {
    spirv_hash: u64,
    spirv_len: usize,
    spec: KernelSpec,
}

/// The cache's key of a module and its specialization.
fn key(spirv: &[u8], spec: &KernelSpec) -> KernelKey {
    let mut h = DefaultHasher::new();
    spirv.hash(&mut h);
    KernelKey {
        spirv_hash: h.finish(),
        spirv_len: spirv.len(),
        spec: spec.clone(),
    }
}

/// One cached kernel: empty until its first compile ends.
type Slot = Arc<Mutex<Option<Arc<KernelObjects>>>>;

/// The map is locked only to find a kernel's slot, and a compile holds only its own slot:
/// a compile (up to half a second) never makes a caller of another kernel wait, so a
/// stopped job returns at once even while another job compiles (the H200 run of
/// 2026-11-28: a stop waited 250 ms for another test's compile behind one map lock).
#[derive(Default)]
pub(crate) struct KernelCache {
    map: Mutex<HashMap<KernelKey, Slot>>,
}

impl KernelCache {
    fn slot(&self, key: KernelKey) -> Slot {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key).or_default().clone()
    }

    /// Whether the kernel is compiled, without waiting for a compile in progress.
    fn is_cached(&self, key: KernelKey) -> bool {
        match self.slot(key).try_lock() {
            Ok(s) => s.is_some(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().is_some(),
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    /// Destroys every cached pipeline. Called by the context's Drop.
    ///
    /// # Safety
    /// The device is idle and no `Kernel` of this context exists any more (each holds an
    /// `Arc` of the context, so the context's Drop runs only after the last one is gone).
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for (_, slot) in map.drain() {
            let Some(k) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() else {
                continue;
            };
            // SAFETY: per this function's contract nothing uses these objects any more;
            // each is destroyed once (drained from the map), dependents first.
            unsafe {
                device.destroy_pipeline(k.pipeline, None);
                device.destroy_pipeline_layout(k.pipeline_layout, None);
                device.destroy_descriptor_set_layout(k.set_layout, None);
                device.destroy_shader_module(k.module, None);
            }
        }
    }
}

/// A compute pipeline ready to dispatch on a [`super::Stream`]. Cheap to clone. It holds
/// its context, so the pipeline (owned by the context's cache) outlives every kernel and
/// every frame that recorded it.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) ctx: Arc<Context>,
    pub(crate) objects: Arc<KernelObjects>,
    name: Arc<str>,
    spec: Arc<KernelSpec>,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }
    pub fn workgroup_size(&self) -> u32 {
        self.spec.workgroup_size
    }
}

impl Context {
    /// The kernel for `spirv` (e.g. `vk::shaders::NAME`) specialized by `spec`; built once
    /// per context and spec, then served from the cache.
    pub fn kernel(self: &Arc<Self>, name: &str, spirv: &[u8], spec: &KernelSpec) -> Result<Kernel> {
        let l = self.limits();
        let wg = spec.workgroup_size;
        if wg == 0
            || wg > l.max_compute_work_group_size[0]
            || wg > l.max_compute_work_group_invocations
        {
            return Err(Error::unsupported(format!(
                "kernel {name}: workgroup size {wg} outside 1..={} on this device",
                l.max_compute_work_group_size[0].min(l.max_compute_work_group_invocations)
            )));
        }
        if !spec.push_bytes.is_multiple_of(4) || spec.push_bytes > l.max_push_constants_size {
            return Err(Error::unsupported(format!(
                "kernel {name}: {} push-constant bytes (must be a multiple of 4, at most {})",
                spec.push_bytes, l.max_push_constants_size
            )));
        }
        if spec.bindings > l.max_per_stage_storage_buffers {
            return Err(Error::unsupported(format!(
                "kernel {name}: {} storage buffers, the device allows {}",
                spec.bindings, l.max_per_stage_storage_buffers
            )));
        }
        if spec.constants.iter().any(|&(id, _)| id == 0) {
            return Err(Error::invalid(format!(
                "kernel {name}: constant_id 0 is the workgroup size"
            )));
        }
        let slot = self.kernels.slot(key(spirv, spec));
        // Held through the compile: a second caller of the same kernel waits for it.
        let mut cached = slot.lock().unwrap_or_else(|p| p.into_inner());
        let objects = match &*cached {
            Some(o) => o.clone(),
            None => {
                let o = Arc::new(self.build_pipeline(name, spirv, spec)?);
                *cached = Some(o.clone());
                o
            }
        };
        Ok(Kernel {
            ctx: self.clone(),
            objects,
            name: name.into(),
            spec: Arc::new(spec.clone()),
        })
    }

    /// `kernel`, whose wait a caller can stop: `check` is called every few milliseconds
    /// while the pipeline is compiled (its error, such as a cancelled job's, is returned).
    /// A driver's compile cannot be interrupted (lavapipe takes up to half a second for a
    /// join kernel on a slow machine), so it runs on a thread of its own: a stopped caller
    /// returns at once, and the compile ends on that thread and still fills the cache (the
    /// thread holds the context until then). A cached kernel is returned without a thread.
    pub fn kernel_stoppable(
        self: &Arc<Self>,
        name: &str,
        spirv: &'static [u8],
        spec: &KernelSpec,
        check: impl Fn() -> Result<()>,
    ) -> Result<Kernel> {
        if self.kernels.is_cached(key(spirv, spec)) {
            return self.kernel(name, spirv, spec);
        }
        check()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let (ctx, owned_name, owned_spec) = (self.clone(), name.to_string(), spec.clone());
        let thread = std::thread::Builder::new()
            .name("simjoin-compile".into())
            .spawn(move || {
                // The receiver is gone when the caller stopped: the cache keeps the kernel.
                let _ = tx.send(ctx.kernel(&owned_name, spirv, &owned_spec));
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("kernel {name}: no compile thread: {e}"),
                )
            })?;
        loop {
            match rx.recv_timeout(std::time::Duration::from_millis(2)) {
                Ok(kernel) => {
                    // The thread ends right after sending, but still holds the context:
                    // joined, so that an engine dropped after this join releases its
                    // device at once (a loaded machine once saw the context outlive the
                    // engine, tests/engine_lifecycle.rs).
                    let _ = thread.join();
                    return kernel;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => check()?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!("kernel {name}: the compile thread ended without a result"),
                    ))
                }
            }
        }
    }

    fn build_pipeline(&self, name: &str, spirv: &[u8], spec: &KernelSpec) -> Result<KernelObjects> {
        let device = &self.device;
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spirv))
            .map_err(|e| Error::invalid(format!("kernel {name}: not SPIR-V: {e}")))?;
        // SAFETY: `words` is SPIR-V as read_spv returns it (aligned u32 words, magic checked);
        // our embedded modules are compiled by build.rs for this Vulkan version.
        let module = unsafe {
            device.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
        }
        .map_err(super::vkr("creating a shader module"))?;
        let bindings: Vec<_> = (0..spec.bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        // SAFETY: a valid create info (storage buffers at bindings 0..n, compute stage).
        let set_layout = unsafe {
            device.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )
        };
        let set_layout = match set_layout {
            Ok(s) => s,
            Err(r) => {
                // SAFETY: the module was just created and nothing uses it.
                unsafe { device.destroy_shader_module(module, None) };
                return Err(super::vk_error(r, "creating a descriptor set layout"));
            }
        };
        let push = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(spec.push_bytes)];
        let set_layouts = [set_layout];
        let mut layout_info = vk::PipelineLayoutCreateInfo::default();
        if spec.bindings > 0 {
            layout_info = layout_info.set_layouts(&set_layouts);
        }
        if spec.push_bytes > 0 {
            layout_info = layout_info.push_constant_ranges(&push);
        }
        // SAFETY: the set layout is live; the push range is within maxPushConstantsSize
        // (checked by `kernel`).
        let pipeline_layout = match unsafe { device.create_pipeline_layout(&layout_info, None) } {
            Ok(l) => l,
            Err(r) => {
                // SAFETY: both were just created and nothing uses them.
                unsafe {
                    device.destroy_descriptor_set_layout(set_layout, None);
                    device.destroy_shader_module(module, None);
                }
                return Err(super::vk_error(r, "creating a pipeline layout"));
            }
        };
        let mut values = vec![spec.workgroup_size];
        let mut entries = vec![vk::SpecializationMapEntry {
            constant_id: 0,
            offset: 0,
            size: 4,
        }];
        for (i, &(id, v)) in spec.constants.iter().enumerate() {
            values.push(v);
            entries.push(vk::SpecializationMapEntry {
                constant_id: id,
                offset: 4 * (i as u32 + 1),
                size: 4,
            });
        }
        let spec_data: &[u8] = bytemuck::cast_slice(&values);
        let spec_info = vk::SpecializationInfo::default()
            .map_entries(&entries)
            .data(spec_data);
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main")
            .specialization_info(&spec_info);
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(pipeline_layout);
        // SAFETY: module, layout and specialization data are live for the call; the
        // workgroup size is within the device limits (checked by `kernel`).
        match unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &[info], None) } {
            Ok(p) => Ok(KernelObjects {
                module,
                set_layout,
                pipeline_layout,
                pipeline: p[0],
            }),
            Err((_, r)) => {
                // SAFETY: all three were just created and nothing uses them.
                unsafe {
                    device.destroy_pipeline_layout(pipeline_layout, None);
                    device.destroy_descriptor_set_layout(set_layout, None);
                    device.destroy_shader_module(module, None);
                }
                Err(super::vk_error(
                    r,
                    &format!("creating compute pipeline {name}"),
                ))
            }
        }
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("spec", &*self.spec)
            .finish()
    }
}
