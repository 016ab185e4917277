//! Synchronous upload and download helpers: the zero-copy path where device memory is
//! mapped (unified memory, resizable BAR), else a staging copy through a stream, waited for.

use super::context::Context;
use super::memory::{Buffer, Memory};
use super::stream::Stream;
use crate::error::Result;
use bytemuck::Pod;
use std::sync::Arc;

impl Context {
    /// A device-local buffer holding `data`. Zero-copy where device memory is mapped
    /// (unified memory: written in place), or where a host-visible upload buffer lands in
    /// device memory (resizable BAR: that buffer is returned, its `memory()` is `Upload`);
    /// else written to a staging buffer and copied (waited for).
    pub fn upload<T: Pod>(self: &Arc<Self>, data: &[T], name: &str) -> Result<Arc<Buffer>> {
        let bytes = std::mem::size_of_val(data) as u64;
        let buffer = Buffer::new(self, bytes, Memory::Device, name)?;
        if buffer.is_mapped() {
            buffer.write(0, data)?;
            return Ok(buffer);
        }
        if bytes == 0 {
            return Ok(buffer);
        }
        let staging = Buffer::new(self, bytes, Memory::Upload, name)?;
        staging.write(0, data)?;
        if self.zero_copy() && staging.is_device_local() {
            return Ok(staging);
        }
        let mut stream = Stream::new(self, 0)?;
        stream.copy(&staging, 0, &buffer, 0, bytes)?;
        stream.submit()?.wait()?;
        Ok(buffer)
    }

    /// Reads `count` elements of `T` from element `first` of any buffer: directly where it
    /// is mapped, else through a read-back staging copy (waited for). The caller makes
    /// sure the device has finished writing it.
    pub fn download<T: Pod>(
        self: &Arc<Self>,
        buffer: &Arc<Buffer>,
        first: usize,
        count: usize,
    ) -> Result<Vec<T>> {
        // Mapped reads of uncached device memory (a BAR window) crawl: copy those instead.
        if buffer.is_mapped() && (self.has_unified_memory() || buffer.is_host_cached()) {
            return buffer.read_vec(first, count);
        }
        let bytes = (count * size_of::<T>()) as u64;
        let offset = (first * size_of::<T>()) as u64;
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = Buffer::new(self, bytes, Memory::Readback, "download staging")?;
        let mut stream = Stream::new(self, 0)?;
        stream.copy(buffer, offset, &staging, 0, bytes)?;
        stream.submit()?.wait()?;
        staging.read_vec(0, count)
    }
}
