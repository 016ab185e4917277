//! Buffers with explicit placement, a pool of pinned staging buffers, and synchronous
//! upload/download helpers that take the zero-copy path where device memory is mappable.

use super::context::Context;

use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use bytemuck::Pod;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::{AllocationError, MemoryLocation};
use std::sync::{Arc, Mutex, Weak};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Device-local: fastest for kernels. Also host-mapped on unified-memory devices
    /// (lavapipe, integrated GPUs): check [`Buffer::is_mapped`] for the zero-copy path.
    Device,
    /// Host-visible and coherent, written by the host, read by the device (upload staging).
    /// Device-local too where the device offers it (resizable BAR).
    Upload,
    /// Host-visible, coherent and host-cached where available: device writes, host reads.
    Readback,
}

/// A Vulkan buffer and its memory, always handed out as `Arc<Buffer>`. It holds its context
/// alive, and every stream command that uses it holds a clone until the GPU has executed
/// that command: dropping the caller's handle while work is in flight is safe, the memory
/// is freed when the last user (the host or the GPU work) is done.
pub struct Buffer {
    ctx: Arc<Context>,
    raw: vk::Buffer,
    allocation: Option<Allocation>,
    /// Size the caller asked for (Vulkan buffers cannot be empty: 0 is backed by 4 bytes).
    size: u64,
    memory: Memory,
    address: u64,
    coherent_map: bool,
    properties: vk::MemoryPropertyFlags,
}

/// A byte window of a buffer, as bound to a kernel's storage-buffer binding. It shares
/// ownership of the buffer, so a dispatch that binds it keeps the buffer alive.
#[derive(Clone)]
pub struct BufferRange {
    pub buffer: Arc<Buffer>,
    pub offset: u64,
    pub size: u64,
}

fn alloc_error(e: AllocationError, name: &str, size: u64) -> Error {
    let kind = match e {
        AllocationError::OutOfMemory => ErrorKind::OutOfDeviceMemory,
        _ => ErrorKind::Internal,
    };
    Error::new(
        kind,
        format!("allocating {size} bytes for buffer {name:?}: {e}"),
    )
}

impl Buffer {
    /// A buffer of `size` bytes usable as storage buffer, copy source/destination, indirect
    /// arguments and by device address.
    pub fn new(ctx: &Arc<Context>, size: u64, memory: Memory, name: &str) -> Result<Arc<Buffer>> {
        let limit = ctx.limits().max_memory_allocation_size;
        if limit > 0 && size > limit {
            return Err(Error::new(
                ErrorKind::OutOfDeviceMemory,
                format!("buffer {name:?} of {size} bytes exceeds maxMemoryAllocationSize ({limit} bytes)"),
            ));
        }
        let families = ctx.buffer_families();
        let mut info = vk::BufferCreateInfo::default().size(size.max(4)).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST
                | vk::BufferUsageFlags::INDIRECT_BUFFER
                | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS,
        );
        // Used from the compute and the transfer family without ownership transfers.
        info = if families.len() > 1 {
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&families)
        } else {
            info.sharing_mode(vk::SharingMode::EXCLUSIVE)
        };
        let device = &ctx.device;
        // SAFETY: `info` is a valid create info (usage flags the device supports, size > 0,
        // queue families of this device) and the device is alive (we hold its context).
        let raw = unsafe { device.create_buffer(&info, None) }
            .map_err(super::vkr("creating a buffer"))?;
        // From here on the buffer is owned: a failure below destroys it (Drop).
        let mut buffer = Buffer {
            ctx: ctx.clone(),
            raw,
            allocation: None,
            size,
            memory,
            address: 0,
            properties: vk::MemoryPropertyFlags::empty(),
            coherent_map: false,
        };
        // SAFETY: `raw` is a live buffer of this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(raw) };
        let location = match memory {
            Memory::Device => MemoryLocation::GpuOnly,
            Memory::Upload => MemoryLocation::CpuToGpu,
            Memory::Readback => MemoryLocation::GpuToCpu,
        };
        let desc = AllocationCreateDesc {
            name,
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        };
        let allocation = ctx
            .allocator()
            .allocate(&desc)
            .map_err(|e| alloc_error(e, name, size))?;
        buffer.properties = allocation.memory_properties();
        buffer.coherent_map = allocation.mapped_ptr().is_some()
            && allocation
                .memory_properties()
                .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
            && (memory != Memory::Device || ctx.zero_copy());
        // SAFETY: reading the allocation's memory handle and offset; the allocation stays
        // alive in `buffer` (freed by Drop after the buffer is destroyed).
        let (memory_handle, offset) = unsafe { (allocation.memory(), allocation.offset()) };
        buffer.allocation = Some(allocation);
        // SAFETY: the allocation satisfies `requirements` (gpu-allocator honours size,
        // alignment and memory type bits) and `raw` has no memory bound yet.
        unsafe { device.bind_buffer_memory(raw, memory_handle, offset) }
            .map_err(super::vkr("binding buffer memory"))?;
        // SAFETY: `raw` was created with SHADER_DEVICE_ADDRESS usage, the device has the
        // bufferDeviceAddress feature enabled (checked at context creation), memory is bound.
        buffer.address = unsafe {
            device.get_buffer_device_address(&vk::BufferDeviceAddressInfo::default().buffer(raw))
        };
        Ok(Arc::new(buffer))
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn memory(&self) -> Memory {
        self.memory
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn raw(&self) -> vk::Buffer {
        self.raw
    }

    /// The buffer's GPU address (for `GL_EXT_buffer_reference`; no range limit applies).
    pub fn device_address(&self) -> u64 {
        self.address
    }

    /// Host-mapped and coherent: [`Buffer::write`] / [`Buffer::read`] work directly.
    pub fn is_mapped(&self) -> bool {
        self.coherent_map
    }

    /// The memory is device-local (for `Upload` buffers: resizable BAR or unified memory).
    pub fn is_device_local(&self) -> bool {
        self.properties
            .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
    }

    /// The memory is host-cached: host reads through the mapping are fast.
    pub fn is_host_cached(&self) -> bool {
        self.properties
            .contains(vk::MemoryPropertyFlags::HOST_CACHED)
    }

    /// The whole buffer as a binding.
    pub fn all(self: &Arc<Self>) -> BufferRange {
        BufferRange {
            buffer: self.clone(),
            offset: 0,
            size: self.size,
        }
    }

    /// Bytes `offset..offset + size` as a binding (checked when bound).
    pub fn slice(self: &Arc<Self>, offset: u64, size: u64) -> BufferRange {
        BufferRange {
            buffer: self.clone(),
            offset,
            size,
        }
    }

    fn mapped_bytes(&self, offset: u64, len: u64, what: &str) -> Result<*mut u8> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::invalid(format!(
                "{what}: bytes {offset}..{} outside a buffer of {} bytes",
                offset.saturating_add(len),
                self.size
            )));
        }
        if !self.coherent_map {
            // The caller's mistake (a device-only buffer of a discrete GPU), not ours.
            return Err(Error::invalid(format!(
                "{what}: buffer is not host-mapped (use a staging copy, or Context::upload \
                 and Context::download)"
            )));
        }
        let base = self
            .allocation
            .as_ref()
            .and_then(|a| a.mapped_ptr())
            .expect("checked coherent_map");
        // SAFETY: offset + len <= size (checked above) and the mapping covers the whole
        // allocation, which is at least `size` bytes.
        Ok(unsafe { (base.as_ptr() as *mut u8).add(offset as usize) })
    }

    /// Writes `data` at element index `first` (in units of `T`) of a mapped buffer. The
    /// write happens now, on the host: the device must not be using these bytes.
    pub fn write<T: Pod>(&self, first: usize, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let dst = self.mapped_bytes(
            (first * size_of::<T>()) as u64,
            bytes.len() as u64,
            "Buffer::write",
        )?;
        // SAFETY: `dst` is valid for `bytes.len()` bytes (mapped_bytes checked the range);
        // mapped device memory never overlaps a Rust slice. Device access to these bytes at
        // the same time gives the device unspecified values, never host memory unsafety.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Reads `out.len()` elements starting at element `first` of a mapped buffer.
    pub fn read<T: Pod>(&self, first: usize, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let src = self.mapped_bytes(
            (first * size_of::<T>()) as u64,
            bytes.len() as u64,
            "Buffer::read",
        )?;
        // SAFETY: `src` is valid for `bytes.len()` bytes (range checked) and `T: Pod`
        // accepts any bit pattern, so whatever the device wrote is a valid `T`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, bytes.as_mut_ptr(), bytes.len()) };
        Ok(())
    }

    /// `count` elements of `T` from element `first` of a mapped buffer, read in place (no
    /// copy: a batch's results go from the pinned buffer straight to the sink).
    ///
    /// # Safety
    /// No device work may write these bytes while the slice lives: the caller has waited
    /// for the work that wrote them and submits none that writes them before the slice is
    /// dropped. (The host cannot write them meanwhile: `write` takes `&self`, but this
    /// borrow of `self` is shared too, so the caller must not call it on these bytes.)
    pub unsafe fn mapped_slice<T: Pod>(&self, first: usize, count: usize) -> Result<&[T]> {
        let (offset, len) = match (
            first.checked_mul(size_of::<T>()),
            count.checked_mul(size_of::<T>()),
        ) {
            (Some(offset), Some(len)) => (offset as u64, len as u64),
            _ => return Err(Error::invalid("Buffer::mapped_slice: size overflows")),
        };
        let ptr = self.mapped_bytes(offset, len, "Buffer::mapped_slice")?;
        if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::invalid(
                "Buffer::mapped_slice: the mapping is not aligned for this type",
            ));
        }
        // SAFETY: `ptr` is valid for `len` bytes of the live mapping (range checked), aligned
        // for `T` (checked); `T: Pod` accepts any bits; nothing writes them while the slice
        // lives (this function's contract). The slice borrows `self`, which keeps the
        // mapping alive.
        Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, count) })
    }

    /// Reads `count` elements starting at element `first` of a mapped buffer.
    pub fn read_vec<T: Pod>(&self, first: usize, count: usize) -> Result<Vec<T>> {
        // Fresh zeroed pages, on huge pages when large (results come back this way).
        let mut out = crate::result::huge::zeroed(count, T::zeroed());
        self.read(first, &mut out)?;
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: no GPU work uses the buffer any more: every recorded command holds an
        // `Arc` of it until its submission completed, so this runs after the last one.
        unsafe { self.ctx.device.destroy_buffer(self.raw, None) };
        if let Some(a) = self.allocation.take() {
            let _ = self.ctx.allocator().free(a);
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("size", &self.size)
            .field("memory", &self.memory)
            .field("mapped", &self.coherent_map)
            .finish()
    }
}

/// Reuses pinned host staging buffers across batches (allocating pinned memory is slow).
/// Buffers come back to the pool when the [`PooledBuffer`] is dropped.
pub struct StagingPool {
    ctx: Arc<Context>,
    free: Mutex<Vec<Arc<Buffer>>>,
}

/// A staging buffer on loan from a [`StagingPool`]; derefs to `Arc<Buffer>`. Dropped, it
/// goes back to the pool only when no GPU work holds it any more (else it is freed once
/// that work completes), so a pooled buffer is never handed out while in use.
pub struct PooledBuffer {
    buffer: Option<Arc<Buffer>>,
    pool: Weak<StagingPool>,
}

/// Pooled buffers are at least this big and sized in powers of two so they get reused.
const MIN_STAGING_BYTES: u64 = 64 << 10;
/// Free buffers kept per pool; beyond this, returned buffers are freed.
const MAX_RETAINED: usize = 16;

impl StagingPool {
    pub fn new(ctx: &Arc<Context>) -> Arc<StagingPool> {
        Arc::new(StagingPool {
            ctx: ctx.clone(),
            free: Mutex::new(Vec::new()),
        })
    }

    /// A host-visible buffer of at least `bytes` (`memory` is `Upload` or `Readback`).
    pub fn acquire(self: &Arc<Self>, bytes: u64, memory: Memory) -> Result<PooledBuffer> {
        if memory == Memory::Device {
            return Err(Error::invalid(
                "StagingPool hands out Upload or Readback buffers, not Device",
            ));
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.memory == memory && b.size >= bytes)
            .min_by_key(|(_, b)| b.size)
            .map(|(i, _)| i);
        let buffer = match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                // Round up for reuse, but never past what one allocation may hold.
                let limit = self.ctx.limits().max_memory_allocation_size.max(bytes);
                let size = bytes
                    .max(MIN_STAGING_BYTES)
                    .checked_next_power_of_two()
                    .map_or(bytes, |rounded| rounded.min(limit));
                Buffer::new(&self.ctx, size, memory, "staging")?
            }
        };
        Ok(PooledBuffer {
            buffer: Some(buffer),
            pool: Arc::downgrade(self),
        })
    }

    /// Buffers currently idle in the pool.
    pub fn idle_count(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl std::ops::Deref for PooledBuffer {
    type Target = Arc<Buffer>;
    fn deref(&self) -> &Arc<Buffer> {
        self.buffer.as_ref().expect("present until drop")
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let (Some(buffer), Some(pool)) = (self.buffer.take(), self.pool.upgrade()) {
            // Only an unshared buffer is idle: a clone held by a stream frame means GPU work
            // may still use it.
            if Arc::strong_count(&buffer) == 1 {
                let mut free = pool.free.lock().unwrap_or_else(|p| p.into_inner());
                if free.len() < MAX_RETAINED {
                    free.push(buffer);
                }
            }
        }
    }
}
