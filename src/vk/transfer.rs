//! Synchronous upload and download helpers: the zero-copy path where device memory is
//! mapped (unified memory, resizable BAR), else a staging copy through a stream, waited for;
//! and [`Uploads`], a job's asynchronous uploads through a staging pool on one stream.

use super::context::Context;
use super::memory::{Buffer, Memory, PooledBuffer, StagingPool};
use super::stream::{Stream, Ticket};
use super::timer::GpuSpans;
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

/// Copy bandwidth between host memory and a device.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    /// Bytes moved per measurement.
    pub bytes: u64,
    /// The link: large copies between pinned host buffers and device memory, several in
    /// flight on every queue the context has (the transfer queue and the compute queues),
    /// submit of the first to completion of the last, bytes per second each way. What the
    /// link carries, and so the bound on a join's transfers. Where device memory is mapped
    /// (unified memory) nothing crosses a link: the figures are a host memcpy's.
    pub link_up: f64,
    pub link_down: f64,
    /// A serial round trip, as a naive read-back meets it: one copy, a wait, then one host
    /// thread reading the pinned buffer into a fresh array (written in place and read in
    /// place where device memory is mapped), bytes per second.
    pub upload: f64,
    pub download: f64,
}

/// The link measurement's copies: at most this many bytes each, dealt round the queues.
const LINK_CHUNK: u64 = 32 << 20;

impl Context {
    /// Measures [`Bandwidth`] with buffers of `bytes`, best of `reps` (buffers allocated
    /// outside the timing, as a join's result slots are).
    pub fn transfer_bandwidth(self: &Arc<Self>, bytes: u64, reps: usize) -> Result<Bandwidth> {
        let bytes = bytes.max(4) & !3;
        let words = (bytes / 4) as usize;
        let host: Vec<u32> = (0..words as u32).collect();
        let device = Buffer::new(self, bytes, Memory::Device, "bandwidth probe")?;
        // SIMJOIN_GPU_STAGING=1: the pinned path on a unified-memory device too (tests).
        let staged =
            !device.is_mapped() || std::env::var("SIMJOIN_GPU_STAGING").is_ok_and(|v| v == "1");
        let pinned = if !staged {
            None
        } else {
            Some((
                Buffer::new(self, bytes, Memory::Upload, "bandwidth probe upload")?,
                Buffer::new(self, bytes, Memory::Readback, "bandwidth probe readback")?,
            ))
        };
        let mut stream = Stream::new(self, 0)?;
        let (mut up, mut down) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps.max(1) {
            let t = std::time::Instant::now();
            match &pinned {
                None => device.write(0, &host)?,
                Some((upload, _)) => {
                    upload.write(0, &host)?;
                    // Orders the copy after the previous round's reads of `device`.
                    stream.barrier()?;
                    stream.copy(upload, 0, &device, 0, bytes)?;
                    stream.submit()?.wait()?;
                }
            }
            up = up.min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            let back: Vec<u32> = match &pinned {
                None => device.read_vec(0, words)?,
                Some((_, readback)) => {
                    stream.barrier()?;
                    stream.copy(&device, 0, readback, 0, bytes)?;
                    stream.submit()?.wait()?;
                    readback.read_vec(0, words)?
                }
            };
            down = down.min(t.elapsed().as_secs_f64());
            // The round trip must be exact, or the figures measure nothing.
            if back != host {
                return Err(anyhow::anyhow!("the bandwidth probe read back other data").into());
            }
        }
        let (link_up, link_down) = match &pinned {
            Some((_, readback)) => {
                // Both directions from and to host memory: an upload buffer may be
                // device-local memory the host maps (resizable BAR, as on the H100), where
                // a copy from it never crosses the link.
                let upload = &Buffer::new(self, bytes, Memory::Readback, "link probe source")?;
                upload.write(0, &host)?;
                let mut streams = (0..self.compute_queue_count())
                    .map(|i| Stream::new(self, i))
                    .collect::<Result<Vec<_>>>()?;
                if self.has_transfer_queue() {
                    streams.push(Stream::transfer(self)?);
                }
                let (mut lu, mut ld) = (f64::INFINITY, f64::INFINITY);
                let mut after = Vec::new();
                for _ in 0..reps.max(1) {
                    lu = lu.min(link_copies(
                        &mut streams,
                        upload,
                        &device,
                        bytes,
                        &mut after,
                    )?);
                    ld = ld.min(link_copies(
                        &mut streams,
                        &device,
                        readback,
                        bytes,
                        &mut after,
                    )?);
                }
                if readback.read_vec::<u32>(0, words)? != host {
                    return Err(anyhow::anyhow!("the link probe read back other data").into());
                }
                (bytes as f64 / lu, bytes as f64 / ld)
            }
            None => (bytes as f64 / up, bytes as f64 / down),
        };
        Ok(Bandwidth {
            bytes,
            link_up,
            link_down,
            upload: bytes as f64 / up,
            download: bytes as f64 / down,
        })
    }
}

/// Seconds to copy `bytes` from `src` to `dst` in chunks of at most LINK_CHUNK dealt round
/// the streams, all submitted before any is waited for. Each stream first waits for
/// `after` (the previous measurement's copies, whose writes these copies read).
fn link_copies(
    streams: &mut [Stream],
    src: &Arc<Buffer>,
    dst: &Arc<Buffer>,
    bytes: u64,
    after: &mut Vec<Ticket>,
) -> Result<f64> {
    for s in streams.iter_mut() {
        for t in after.iter() {
            s.wait_for(t);
        }
    }
    let chunk = LINK_CHUNK.min(bytes.div_ceil(streams.len() as u64).next_multiple_of(4));
    let t = std::time::Instant::now();
    let mut tickets = Vec::new();
    let mut offset = 0;
    let mut k = 0;
    while offset < bytes {
        let len = chunk.min(bytes - offset);
        let s = &mut streams[k % streams.len()];
        s.copy(src, offset, dst, offset, len)?;
        tickets.push(s.submit()?);
        offset += len;
        k += 1;
    }
    for t in &tickets {
        t.wait()?;
    }
    let seconds = t.elapsed().as_secs_f64();
    *after = tickets;
    Ok(seconds)
}

/// The uploads of one job: device-local buffers filled from host data, written in place
/// where device memory is mapped, else through pinned staging buffers from a reused
/// [`StagingPool`] and copied on this job's one transfer stream. Copies run once
/// [`Uploads::submit`] is called, while the host goes on; a compute stream orders its work
/// after them with `wait_for` on the returned ticket.
pub struct Uploads {
    // Declared before `staged`: dropping the stream waits for its copies and releases what
    // they held, so the staging buffers go back to the pool idle.
    stream: Stream,
    pool: Arc<StagingPool>,
    /// Staging buffers of the copies recorded so far.
    staged: Vec<PooledBuffer>,
    bytes: u64,
    host_seconds: f64,
    /// The copies' time on the GPU clock, where the transfer queue has timestamps.
    spans: Option<GpuSpans>,
}

/// Submissions of one job's uploads whose copies are timed (a join makes a handful).
const TIMED_SUBMITS: u32 = 16;

impl Uploads {
    pub fn new(ctx: &Arc<Context>, pool: &Arc<StagingPool>) -> Result<Uploads> {
        let stream = Stream::transfer(ctx)?;
        Ok(Uploads {
            spans: GpuSpans::new(&stream, TIMED_SUBMITS),
            stream,
            pool: pool.clone(),
            staged: Vec::new(),
            bytes: 0,
            host_seconds: 0.0,
        })
    }

    /// A device-local buffer that holds `data` once the next [`Uploads::submit`]'s ticket
    /// is reached (at once where device memory is mapped). Empty data gives a 4-byte buffer.
    pub fn upload<T: Pod>(&mut self, data: &[T], name: &str) -> Result<Arc<Buffer>> {
        let t = std::time::Instant::now();
        let buffer = self.record(data, name);
        self.host_seconds += t.elapsed().as_secs_f64();
        buffer
    }

    fn record<T: Pod>(&mut self, data: &[T], name: &str) -> Result<Arc<Buffer>> {
        let bytes = std::mem::size_of_val(data) as u64;
        let ctx = self.stream.context().clone();
        let buffer = Buffer::new(&ctx, bytes, Memory::Device, name)?;
        self.bytes += bytes;
        if bytes == 0 {
            return Ok(buffer);
        }
        if buffer.is_mapped() {
            buffer.write(0, data)?;
            return Ok(buffer);
        }
        let staging = self.pool.acquire(bytes, Memory::Upload)?;
        staging.write(0, data)?;
        if let Some(spans) = &mut self.spans {
            spans.begin(&mut self.stream)?;
        }
        self.stream.copy(&staging, 0, &buffer, 0, bytes)?;
        self.staged.push(staging);
        Ok(buffer)
    }

    /// Submits the copies recorded since the last call; the ticket covers all so far.
    pub fn submit(&mut self) -> Result<Ticket> {
        if let Some(spans) = &mut self.spans {
            spans.end(&mut self.stream)?;
        }
        self.stream.submit()
    }

    /// Seconds the copies took on the GPU clock (0 where data was written in place), once
    /// every submission has completed; None where the transfer queue has no timestamps.
    pub fn gpu_seconds(&self) -> Result<Option<f64>> {
        self.spans.as_ref().map(|s| s.seconds()).transpose()
    }

    /// Seconds the host spent in [`Uploads::upload`] (allocating, writing, recording).
    pub fn host_seconds(&self) -> f64 {
        self.host_seconds
    }

    /// Bytes uploaded so far (written in place or copied).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn context(&self) -> &Arc<Context> {
        self.stream.context()
    }

    /// The pool the staging buffers come from (for read-backs of the same job).
    pub fn pool(&self) -> &Arc<StagingPool> {
        &self.pool
    }
}
