//! Streams: in-order sequences of copies, fills, dispatches and barriers on one queue,
//! submitted as command buffers that signal a per-stream timeline semaphore. A [`Ticket`]
//! is one signalled value: wait on it from the host, or make another stream wait for it.

use super::context::{Context, QueueId};
use super::kernel::Kernel;
use super::memory::{Buffer, BufferRange};
use super::timer::GpuTimer;
use super::vkr;
use crate::error::{Error, Result};
use ash::vk;
use std::any::Any;
use std::sync::Arc;

/// A timeline semaphore; lives as long as any stream or ticket refers to it.
struct Timeline {
    ctx: Arc<Context>,
    semaphore: vk::Semaphore,
}

impl Timeline {
    fn new(ctx: &Arc<Context>) -> Result<Timeline> {
        let semaphore = ctx.take_timeline()?;
        Ok(Timeline {
            ctx: ctx.clone(),
            semaphore,
        })
    }

    fn completed(&self) -> Result<u64> {
        // SAFETY: our live timeline semaphore; reading its counter needs no synchronization.
        unsafe { self.ctx.device.get_semaphore_counter_value(self.semaphore) }
            .map_err(vkr("reading a timeline semaphore"))
    }

    fn wait(&self, value: u64, timeout_ns: u64) -> Result<bool> {
        let semaphores = [self.semaphore];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: waits on our live semaphore; host waits need no external synchronization.
        match unsafe { self.ctx.device.wait_semaphores(&info, timeout_ns) } {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(r) => Err(super::vk_error(r, "waiting for GPU work")),
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // The last `Arc` is gone: no stream signals it any more (a stream holds its own
        // timeline and waits for its work when dropped) and no frame waits on it (frames
        // hold the timelines they wait on until they complete). The driver may still be
        // finishing its bookkeeping of those waits, so the semaphore is not destroyed but
        // goes back to the context (why: `Context::recycle_timeline`).
        self.ctx.recycle_timeline(self.semaphore);
    }
}

/// Completion of one submission: the stream's timeline reaching `value`.
#[derive(Clone)]
pub struct Ticket {
    timeline: Arc<Timeline>,
    value: u64,
}

impl Ticket {
    /// Blocks until the submission (and everything before it on its stream) has finished.
    pub fn wait(&self) -> Result<()> {
        self.timeline.wait(self.value, u64::MAX).map(|_| ())
    }

    /// Waits at most `timeout`; `Ok(false)` when it has not finished yet.
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> Result<bool> {
        self.timeline
            .wait(self.value, timeout.as_nanos().min(u64::MAX as u128) as u64)
    }

    /// Non-blocking completion check.
    pub fn is_done(&self) -> Result<bool> {
        Ok(self.timeline.completed()? >= self.value)
    }
}

/// One command buffer plus what it needs until the GPU has executed it.
struct Frame {
    cmd: vk::CommandBuffer,
    descriptor_pools: Vec<DescriptorPool>,
    /// Timeline value the submission signals (0 while recording).
    value: u64,
    /// Everything the recorded commands use (buffers, kernels, timers, timelines waited
    /// on): kept alive until the frame is recycled, i.e. until the GPU has executed it.
    /// This is what makes dropping a resource while work is in flight safe.
    held: Vec<Box<dyn Any + Send + Sync>>,
}

struct DescriptorPool {
    raw: vk::DescriptorPool,
    sets_left: u32,
    buffers_left: u32,
}

const POOL_SETS: u32 = 64;
const POOL_BUFFERS: u32 = 512;

/// An in-order command stream on one queue. Streams on different queues run concurrently;
/// order them with [`Stream::wait_for`]. `Send`: record on any thread, one thread at a time.
pub struct Stream {
    ctx: Arc<Context>,
    queue: QueueId,
    pool: vk::CommandPool,
    timeline: Arc<Timeline>,
    last_signalled: u64,
    /// The timeline's value when this stream took it (recycled timelines start above 0).
    first_value: u64,
    recording: Option<Frame>,
    in_flight: Vec<Frame>,
    waits: Vec<(Arc<Timeline>, u64)>,
}

impl Stream {
    /// A stream on compute queue `index % compute_queue_count()`: streams 0, 1, 2 get
    /// distinct queues where the device has them and share one otherwise.
    pub fn new(ctx: &Arc<Context>, index: usize) -> Result<Stream> {
        Self::on_queue(ctx, QueueId::Compute(index % ctx.compute_queue_count()))
    }

    /// A stream for copies on the dedicated transfer queue (falls back to compute queue 0).
    /// Only copies, fills and barriers may be recorded on it.
    pub fn transfer(ctx: &Arc<Context>) -> Result<Stream> {
        Self::on_queue(
            ctx,
            if ctx.has_transfer_queue() {
                QueueId::Transfer
            } else {
                QueueId::Compute(0)
            },
        )
    }

    fn on_queue(ctx: &Arc<Context>, queue: QueueId) -> Result<Stream> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(ctx.queue_family(queue))
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // The timeline first: it goes back to the context if the pool cannot be created.
        let timeline = Arc::new(Timeline::new(ctx)?);
        let first_value = timeline.completed()?;
        // SAFETY: a valid create info for a queue family of this live device.
        let pool = unsafe { ctx.device.create_command_pool(&info, None) }
            .map_err(vkr("creating a command pool"))?;
        Ok(Stream {
            ctx: ctx.clone(),
            queue,
            pool,
            timeline,
            last_signalled: first_value,
            first_value,
            recording: None,
            in_flight: Vec::new(),
            waits: Vec::new(),
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// True for a stream on the dedicated transfer queue.
    pub fn is_transfer(&self) -> bool {
        self.queue == QueueId::Transfer
    }

    /// The frame being recorded, starting one (recycling a finished one) if needed.
    fn frame(&mut self) -> Result<&mut Frame> {
        if self.recording.is_none() {
            self.release_completed()?;
            let device = &self.ctx.device;
            let done = self.timeline.completed()?;
            let frame = match self.in_flight.iter().position(|f| f.value <= done) {
                Some(i) => {
                    let mut f = self.in_flight.swap_remove(i);
                    // SAFETY: the frame's submission has completed (its timeline value is
                    // reached, or it was never submitted), so its command buffer and
                    // descriptor sets are not in use; the pools belong to this stream and
                    // are used by one thread at a time (`&mut self`).
                    unsafe {
                        device
                            .reset_command_buffer(f.cmd, vk::CommandBufferResetFlags::empty())
                            .map_err(vkr("resetting a command buffer"))?;
                        for p in &mut f.descriptor_pools {
                            device
                                .reset_descriptor_pool(p.raw, vk::DescriptorPoolResetFlags::empty())
                                .map_err(vkr("resetting a descriptor pool"))?;
                            p.sets_left = POOL_SETS;
                            p.buffers_left = POOL_BUFFERS;
                        }
                    }
                    f.held.clear();
                    f.value = 0;
                    f
                }
                None => {
                    let info = vk::CommandBufferAllocateInfo::default()
                        .command_pool(self.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1);
                    // SAFETY: our command pool, used by one thread at a time (`&mut self`).
                    let cmd = unsafe { device.allocate_command_buffers(&info) }
                        .map_err(vkr("allocating a command buffer"))?[0];
                    Frame {
                        cmd,
                        descriptor_pools: Vec::new(),
                        value: 0,
                        held: Vec::new(),
                    }
                }
            };
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            // SAFETY: the command buffer is in the initial state (new or just reset).
            let started = unsafe { device.begin_command_buffer(frame.cmd, &begin) };
            if let Err(r) = started {
                // Not recording: park it as reusable (value 0) so it is not leaked.
                self.in_flight.push(frame);
                return Err(super::vk_error(r, "beginning a command buffer"));
            }
            self.recording = Some(frame);
        }
        Ok(self.recording.as_mut().expect("just set"))
    }

    fn check_range(&self, buffer: &Buffer, offset: u64, size: u64, what: &str) -> Result<()> {
        if !Arc::ptr_eq(buffer.context(), &self.ctx) {
            return Err(Error::invalid(format!(
                "{what}: buffer belongs to another context"
            )));
        }
        if offset
            .checked_add(size)
            .is_none_or(|end| end > buffer.size())
        {
            return Err(Error::invalid(format!(
                "{what}: bytes {offset}..{} outside a buffer of {} bytes",
                offset.saturating_add(size),
                buffer.size()
            )));
        }
        Ok(())
    }

    /// Copies `size` bytes from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy(
        &mut self,
        src: &Arc<Buffer>,
        src_offset: u64,
        dst: &Arc<Buffer>,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        self.check_range(src, src_offset, size, "copy source")?;
        self.check_range(dst, dst_offset, size, "copy destination")?;
        if size == 0 {
            return Ok(());
        }
        let cmd = self.frame()?.cmd;
        let region = vk::BufferCopy {
            src_offset,
            dst_offset,
            size,
        };
        // SAFETY: both buffers are live buffers of this device with TRANSFER usage, the
        // region is inside both (checked), and `cmd` is recording. The frame holds both
        // buffers until the command has executed.
        unsafe {
            self.ctx
                .device
                .cmd_copy_buffer(cmd, src.raw(), dst.raw(), &[region])
        };
        self.hold(src.clone())?;
        self.hold(dst.clone())
    }

    /// Fills `size` bytes at `offset` with the 32-bit `value` (both multiples of 4).
    pub fn fill(&mut self, buffer: &Arc<Buffer>, offset: u64, size: u64, value: u32) -> Result<()> {
        self.check_range(buffer, offset, size, "fill")?;
        if !offset.is_multiple_of(4) || !size.is_multiple_of(4) {
            return Err(Error::invalid(format!(
                "fill: offset {offset} and size {size} must be multiples of 4"
            )));
        }
        if size == 0 {
            return Ok(());
        }
        let cmd = self.frame()?.cmd;
        // SAFETY: a live buffer of this device, range inside it and 4-byte aligned
        // (checked), `cmd` recording; the frame holds the buffer until executed.
        unsafe {
            self.ctx
                .device
                .cmd_fill_buffer(cmd, buffer.raw(), offset, size, value)
        };
        self.hold(buffer.clone())
    }

    /// Writes `data` (at most 65536 bytes, a multiple of 4) at `offset` (a multiple of 4) in
    /// stream order, unlike a host write to a mapped buffer, which happens at once.
    pub fn update(&mut self, buffer: &Arc<Buffer>, offset: u64, data: &[u8]) -> Result<()> {
        let size = data.len() as u64;
        self.check_range(buffer, offset, size, "update")?;
        if !offset.is_multiple_of(4) || !size.is_multiple_of(4) || size > 65536 {
            return Err(Error::invalid(format!(
                "update: offset {offset} and size {size} must be multiples of 4, size at most 65536"
            )));
        }
        if size == 0 {
            return Ok(());
        }
        let cmd = self.frame()?.cmd;
        // SAFETY: a live buffer of this device, range inside it, size and offset multiples
        // of 4 and at most 65536 bytes (checked); the data is copied into the command
        // buffer at record time; the frame holds the buffer until executed.
        unsafe {
            self.ctx
                .device
                .cmd_update_buffer(cmd, buffer.raw(), offset, data)
        };
        self.hold(buffer.clone())
    }

    /// Makes every earlier write of this stream (kernels, copies, fills) visible to every
    /// later command of it (kernels, copies, indirect arguments). Between two dependent
    /// commands you need one; independent commands may run concurrently without.
    pub fn barrier(&mut self) -> Result<()> {
        let transfer_only = self.is_transfer();
        let cmd = self.frame()?.cmd;
        let (src_stage, dst_stage) = if transfer_only {
            (
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::TRANSFER,
            )
        } else {
            (
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::DRAW_INDIRECT,
            )
        };
        let mut dst_access = vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE;
        if !transfer_only {
            dst_access |= vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::INDIRECT_COMMAND_READ;
        }
        let src_access = if transfer_only {
            vk::AccessFlags::TRANSFER_WRITE
        } else {
            vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE
        };
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(src_access)
            .dst_access_mask(dst_access);
        // SAFETY: a global memory barrier with stages and accesses the queue supports
        // (transfer-only on a transfer queue), recorded into a recording command buffer.
        unsafe {
            self.ctx.device.cmd_pipeline_barrier(
                cmd,
                src_stage,
                dst_stage,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            )
        };
        Ok(())
    }

    /// Records `kernel` over `groups` workgroups with `bindings` at set 0 and `push` as
    /// push constants (exactly `spec.push_bytes` bytes).
    pub fn dispatch(
        &mut self,
        kernel: &Kernel,
        groups: [u32; 3],
        bindings: &[BufferRange],
        push: &[u8],
    ) -> Result<()> {
        let infos = self.check_kernel_args(kernel, bindings, push)?;
        let limits = self.ctx.limits();
        for (i, g) in groups.iter().enumerate() {
            if *g > limits.max_compute_work_group_count[i] {
                return Err(Error::invalid(format!(
                    "kernel {}: {g} workgroups in dimension {i}, the device allows {} (use dispatch_threads)",
                    kernel.name(),
                    limits.max_compute_work_group_count[i]
                )));
            }
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let cmd = self.bind(kernel, &infos, push)?;
        // SAFETY: the pipeline, its descriptor set (every binding a live buffer range,
        // checked against the kernel and the device limits) and its push constants are
        // bound; group counts are within the device limits (checked).
        unsafe {
            self.ctx
                .device
                .cmd_dispatch(cmd, groups[0], groups[1], groups[2])
        };
        self.hold_dispatch(kernel, bindings)
    }

    /// Dispatches at least `threads` invocations of a 1-D kernel: one row of workgroups when
    /// they fit in `maxComputeWorkGroupCount[0]`, else a 2-D grid. The kernel takes its index
    /// from `linear_invocation()` (glsl/common.glsl) and skips indices >= its thread count.
    pub fn dispatch_threads(
        &mut self,
        kernel: &Kernel,
        threads: u64,
        bindings: &[BufferRange],
        push: &[u8],
    ) -> Result<()> {
        let groups = self.grid_for(kernel, threads)?;
        self.dispatch(kernel, groups, bindings, push)
    }

    /// The workgroup grid [`Stream::dispatch_threads`] uses for `threads` invocations.
    pub fn grid_for(&self, kernel: &Kernel, threads: u64) -> Result<[u32; 3]> {
        let wg = kernel.workgroup_size() as u64;
        let limits = self.ctx.limits();
        if threads > u32::MAX as u64 {
            return Err(Error::invalid(format!(
                "kernel {}: {threads} threads exceed 2^32 - 1",
                kernel.name()
            )));
        }
        let groups = threads.div_ceil(wg);
        let max_x = self.ctx.dispatch_width() as u64;
        if groups <= max_x {
            return Ok([groups as u32, 1, 1]);
        }
        let rows = groups.div_ceil(max_x);
        if rows > limits.max_compute_work_group_count[1] as u64 {
            return Err(Error::invalid(format!(
                "kernel {}: {threads} threads exceed the dispatch grid",
                kernel.name()
            )));
        }
        Ok([max_x as u32, rows as u32, 1])
    }

    /// Dispatches with the workgroup counts read on the device from `args` at `offset`
    /// (three u32, written by an earlier kernel, made visible by [`Stream::barrier`]).
    pub fn dispatch_indirect(
        &mut self,
        kernel: &Kernel,
        args: &Arc<Buffer>,
        offset: u64,
        bindings: &[BufferRange],
        push: &[u8],
    ) -> Result<()> {
        self.check_range(args, offset, 12, "indirect arguments")?;
        if !offset.is_multiple_of(4) {
            return Err(Error::invalid(
                "indirect arguments offset must be a multiple of 4",
            ));
        }
        let infos = self.check_kernel_args(kernel, bindings, push)?;
        let cmd = self.bind(kernel, &infos, push)?;
        // SAFETY: as for `dispatch`; `args` is a live buffer with INDIRECT usage holding 12
        // bytes at the 4-byte-aligned `offset` (checked). The workgroup counts it holds are
        // the caller's to keep within the device limits (the device clamps or faults the
        // dispatch, never host memory).
        unsafe {
            self.ctx
                .device
                .cmd_dispatch_indirect(cmd, args.raw(), offset)
        };
        self.hold(args.clone())?;
        self.hold_dispatch(kernel, bindings)
    }

    /// Checks a dispatch's arguments against the kernel and the device limits; returns the
    /// descriptor contents.
    fn check_kernel_args(
        &self,
        kernel: &Kernel,
        bindings: &[BufferRange],
        push: &[u8],
    ) -> Result<Vec<vk::DescriptorBufferInfo>> {
        let name = kernel.name();
        if self.is_transfer() {
            return Err(Error::invalid(format!(
                "kernel {name}: cannot dispatch on a transfer stream"
            )));
        }
        if !Arc::ptr_eq(&kernel.ctx, &self.ctx) {
            return Err(Error::invalid(format!(
                "kernel {name} belongs to another context"
            )));
        }
        let spec = kernel.spec();
        if bindings.len() != spec.bindings as usize {
            return Err(Error::invalid(format!(
                "kernel {name}: {} buffers given, it binds {}",
                bindings.len(),
                spec.bindings
            )));
        }
        if push.len() != spec.push_bytes as usize {
            return Err(Error::invalid(format!(
                "kernel {name}: {} push-constant bytes given, it takes {}",
                push.len(),
                spec.push_bytes
            )));
        }
        let limits = self.ctx.limits();
        let mut infos = Vec::with_capacity(bindings.len());
        for (i, b) in bindings.iter().enumerate() {
            self.check_range(
                &b.buffer,
                b.offset,
                b.size,
                &format!("kernel {name} binding {i}"),
            )?;
            if b.offset % limits.min_storage_buffer_offset_alignment != 0 {
                return Err(Error::invalid(format!(
                    "kernel {name} binding {i}: offset {} not a multiple of minStorageBufferOffsetAlignment {}",
                    b.offset, limits.min_storage_buffer_offset_alignment
                )));
            }
            if b.size > limits.max_storage_buffer_range {
                return Err(Error::invalid(format!(
                    "kernel {name} binding {i}: {} bytes exceed maxStorageBufferRange {} (bind a window or use the device address)",
                    b.size, limits.max_storage_buffer_range
                )));
            }
            // An empty range still needs a valid (non-zero) descriptor; buffers have >= 4 bytes.
            let (offset, range) = if b.size == 0 {
                (0, 4)
            } else {
                (b.offset, b.size)
            };
            infos.push(vk::DescriptorBufferInfo {
                buffer: b.buffer.raw(),
                offset,
                range,
            });
        }
        Ok(infos)
    }

    /// Binds the pipeline, a descriptor set holding `infos`, and the push constants.
    fn bind(
        &mut self,
        kernel: &Kernel,
        infos: &[vk::DescriptorBufferInfo],
        push: &[u8],
    ) -> Result<vk::CommandBuffer> {
        let set = if infos.is_empty() {
            None
        } else {
            Some(self.descriptor_set(kernel)?)
        };
        let cmd = self.frame()?.cmd;
        let device = &self.ctx.device;
        let objects = &kernel.objects;
        // SAFETY: `set` was allocated from this frame's pool with the kernel's layout and is
        // not in use by pending work (the frame is recording); every write names a binding
        // of that layout with a live buffer; pipeline and layout belong to this device;
        // `push` is exactly the layout's push-constant range (checked by the caller).
        unsafe {
            if let Some(set) = set {
                let writes: Vec<_> = infos
                    .iter()
                    .enumerate()
                    .map(|(i, info)| {
                        vk::WriteDescriptorSet::default()
                            .dst_set(set)
                            .dst_binding(i as u32)
                            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                            .buffer_info(std::slice::from_ref(info))
                    })
                    .collect();
                device.update_descriptor_sets(&writes, &[]);
                device.cmd_bind_descriptor_sets(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    objects.pipeline_layout,
                    0,
                    &[set],
                    &[],
                );
            }
            device.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, objects.pipeline);
            if !push.is_empty() {
                device.cmd_push_constants(
                    cmd,
                    objects.pipeline_layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push,
                );
            }
        }
        Ok(cmd)
    }

    fn descriptor_set(&mut self, kernel: &Kernel) -> Result<vk::DescriptorSet> {
        let needed = kernel.spec().bindings;
        let device = self.ctx.device.clone();
        let frame = self.frame()?;
        let fits = |p: &DescriptorPool| p.sets_left >= 1 && p.buffers_left >= needed;
        if !frame.descriptor_pools.last().is_some_and(fits) {
            let buffers = POOL_BUFFERS.max(needed);
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: buffers,
            }];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(POOL_SETS)
                .pool_sizes(&sizes);
            // SAFETY: a valid create info for this live device.
            let raw = unsafe { device.create_descriptor_pool(&info, None) }
                .map_err(vkr("creating a descriptor pool"))?;
            frame.descriptor_pools.push(DescriptorPool {
                raw,
                sets_left: POOL_SETS,
                buffers_left: buffers,
            });
        }
        let pool = frame.descriptor_pools.last_mut().expect("just ensured");
        let layouts = [kernel.objects.set_layout];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool.raw)
            .set_layouts(&layouts);
        // SAFETY: the frame's own pool (used by one thread: `&mut self`) has room for one
        // more set of `needed` buffers (checked above); the layout is the kernel's.
        let set = unsafe { device.allocate_descriptor_sets(&info) }
            .map_err(vkr("allocating a descriptor set"))?[0];
        pool.sets_left -= 1;
        pool.buffers_left -= needed;
        Ok(set)
    }

    /// Records a timestamp into `slot` of `timer`, taken when all earlier commands of this
    /// stream have finished. The timer must outlive the submission.
    /// Whether this stream's queue writes timestamps.
    pub fn has_timestamps(&self) -> bool {
        self.ctx.timestamp_bits(self.queue) > 0
    }

    pub fn timestamp(&mut self, timer: &Arc<GpuTimer>, slot: u32) -> Result<()> {
        if !Arc::ptr_eq(&timer.ctx, &self.ctx) || slot >= timer.slots {
            return Err(Error::invalid(format!(
                "timestamp: slot {slot} of another context or beyond {}",
                timer.slots
            )));
        }
        let bits = self.ctx.timestamp_bits(self.queue);
        if bits == 0 {
            return Err(Error::unsupported("this stream's queue has no timestamps"));
        }
        let written = &timer.valid_bits[slot as usize];
        // A transfer-only queue cannot record a reset (VUID-vkCmdResetQueryPool-
        // commandBuffer-cmdpool): it writes slots the host reset when the timer was made,
        // each once. (Its timestamp bits are 0 where hostQueryReset is missing.)
        let transfer_only = self.queue == QueueId::Transfer && self.ctx.has_transfer_queue();
        if transfer_only {
            use std::sync::atomic::Ordering::Relaxed;
            if written.compare_exchange(0, bits, Relaxed, Relaxed).is_err() {
                return Err(Error::invalid(format!(
                    "timestamp: slot {slot} was written before, and a transfer-only queue \
                     cannot reset it (use a new timer)"
                )));
            }
        } else {
            written.store(bits, std::sync::atomic::Ordering::Relaxed);
        }
        let cmd = self.frame()?.cmd;
        // SAFETY: the timer's live query pool of this device, `slot` inside it (checked);
        // the queue supports timestamps (bits > 0) and, where it cannot reset the slot,
        // the host reset it and nothing wrote it since (checked above). The frame holds
        // the timer until the commands have executed.
        unsafe {
            if !transfer_only {
                self.ctx
                    .device
                    .cmd_reset_query_pool(cmd, timer.pool, slot, 1);
            }
            self.ctx.device.cmd_write_timestamp(
                cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                timer.pool,
                slot,
            );
        }
        self.hold(timer.clone())
    }

    /// Keeps `thing` (e.g. an `Arc` of a resource only a kernel addresses, through a
    /// device address) alive until the work recorded so far has run. Buffers, kernels and
    /// timers named in commands are held automatically.
    pub fn keep_alive<T: Send + Sync + 'static>(&mut self, thing: T) -> Result<()> {
        self.hold(thing)
    }

    fn hold<T: Send + Sync + 'static>(&mut self, thing: T) -> Result<()> {
        self.frame()?.held.push(Box::new(thing));
        Ok(())
    }

    /// Holds what a dispatch uses: the kernel (its pipeline and layouts) and every bound
    /// buffer.
    fn hold_dispatch(&mut self, kernel: &Kernel, bindings: &[BufferRange]) -> Result<()> {
        let frame = self.frame()?;
        frame.held.push(Box::new(kernel.clone()));
        for b in bindings {
            frame.held.push(Box::new(b.buffer.clone()));
        }
        Ok(())
    }

    /// The next submission of this stream starts only after `ticket` (from any stream,
    /// any queue) has completed; its writes are then visible to this stream.
    pub fn wait_for(&mut self, ticket: &Ticket) {
        if Arc::ptr_eq(&ticket.timeline, &self.timeline) {
            return; // a stream is in order with itself
        }
        if !Arc::ptr_eq(&ticket.timeline.ctx, &self.ctx) {
            // Semaphores cannot cross devices: order by blocking until it is done. A
            // failure (device lost) resurfaces at the next submit on that device.
            let _ = ticket.wait();
            return;
        }
        match self
            .waits
            .iter_mut()
            .find(|(t, _)| Arc::ptr_eq(t, &ticket.timeline))
        {
            Some((_, v)) => *v = (*v).max(ticket.value),
            None => self.waits.push((ticket.timeline.clone(), ticket.value)),
        }
    }

    /// Submits what was recorded (possibly nothing) and returns its ticket. Submissions of
    /// one stream run in order: each waits for the previous one.
    pub fn submit(&mut self) -> Result<Ticket> {
        let transfer_only = self.is_transfer();
        let device = self.ctx.device.clone();
        let frame = self.frame()?;
        let cmd = frame.cmd;
        // Make this submission's writes visible to the host once its ticket is waited on.
        let src_stage = if transfer_only {
            vk::PipelineStageFlags::TRANSFER
        } else {
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER
        };
        let to_host = vk::MemoryBarrier::default()
            .src_access_mask(if transfer_only {
                vk::AccessFlags::TRANSFER_WRITE
            } else {
                vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE
            })
            .dst_access_mask(vk::AccessFlags::HOST_READ);
        // SAFETY: a global barrier to the host stage in a recording command buffer.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                src_stage,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[to_host],
                &[],
                &[],
            );
        }
        // SAFETY: `cmd` is recording.
        let ended = unsafe { device.end_command_buffer(cmd) };
        if let Err(r) = ended {
            // Drop the broken recording: the frame is reset before its next use.
            let frame = self.recording.take().expect("recording");
            self.in_flight.push(frame);
            return Err(super::vk_error(r, "ending a command buffer"));
        }
        let value = self.last_signalled + 1;
        let mut wait_semaphores = Vec::new();
        let mut wait_values = Vec::new();
        if self.last_signalled > self.first_value {
            wait_semaphores.push(self.timeline.semaphore);
            wait_values.push(self.last_signalled);
        }
        let waits = std::mem::take(&mut self.waits);
        for (t, v) in &waits {
            wait_semaphores.push(t.semaphore);
            wait_values.push(*v);
        }
        let wait_stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; wait_semaphores.len()];
        let signal = [self.timeline.semaphore];
        let signal_values = [value];
        let mut timeline_info = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let cmds = [cmd];
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&wait_semaphores)
            .wait_dst_stage_mask(&wait_stages)
            .command_buffers(&cmds)
            .signal_semaphores(&signal)
            .push_next(&mut timeline_info);
        let result = {
            let queue = self.ctx.lock_queue(self.queue);
            // SAFETY: the queue is externally synchronized by its mutex (held); `cmd` is
            // executable; every semaphore is a live timeline of this device (ours, or held
            // through `waits` and then by the frame) with wait values in the info chain.
            unsafe { device.queue_submit(*queue, &[submit], vk::Fence::null()) }
        };
        let mut frame = self.recording.take().expect("recording");
        if let Err(r) = result {
            // Not submitted: the frame can be reused at once.
            frame.value = 0;
            self.in_flight.push(frame);
            return Err(super::vk_error(r, "submitting to a queue"));
        }
        frame.value = value;
        for (t, _) in waits {
            frame.held.push(Box::new(t));
        }
        self.in_flight.push(frame);
        self.last_signalled = value;
        Ok(Ticket {
            timeline: self.timeline.clone(),
            value,
        })
    }

    /// Submits and waits: the recorded work has finished when this returns, and what it
    /// held (buffers, kernels, timers) is released.
    pub fn finish(&mut self) -> Result<()> {
        self.submit()?.wait()?;
        self.release_completed()
    }

    /// Drops what completed submissions held, so that a buffer whose last other owner is
    /// gone is freed (and a pooled one goes back to its pool) without waiting for its frame
    /// to be reused. Called by `finish` and before each new recording.
    pub fn release_completed(&mut self) -> Result<()> {
        let done = self.timeline.completed()?;
        for f in self.in_flight.iter_mut().filter(|f| f.value <= done) {
            f.held.clear();
        }
        Ok(())
    }

    /// A ticket for everything submitted so far (completes at once when nothing was).
    pub fn last_ticket(&self) -> Ticket {
        Ticket {
            timeline: self.timeline.clone(),
            value: self.last_signalled,
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Work still queued uses this stream's command buffers and descriptor sets.
        let _ = self.timeline.wait(self.last_signalled, u64::MAX);
        let device = &self.ctx.device;
        // SAFETY: all submitted work of this stream has completed (waited above; after a
        // device loss nothing executes any more), so its command buffers and descriptor
        // pools are idle; they and the command pool belong to this stream alone.
        unsafe {
            if let Some(f) = self.recording.take() {
                let _ = device.end_command_buffer(f.cmd);
                self.in_flight.push(f);
            }
            for f in self.in_flight.drain(..) {
                for p in f.descriptor_pools {
                    device.destroy_descriptor_pool(p.raw, None);
                }
            }
            device.destroy_command_pool(self.pool, None);
        }
    }
}
