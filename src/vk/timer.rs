//! GPU timestamps: a query pool whose slots streams write with
//! [`super::Stream::timestamp`], read once the writing submission has completed.

use super::context::Context;
use super::stream::Stream;
use super::vkr;
use crate::error::{Error, Result};
use ash::vk;
use std::sync::Arc;

/// GPU timestamps: `slots` query slots that streams write with [`super::Stream::timestamp`];
/// read them once the submission that wrote them has completed.
pub struct GpuTimer {
    pub(super) ctx: Arc<Context>,
    pub(super) pool: vk::QueryPool,
    pub(super) slots: u32,
    /// Valid bits of the queue each slot was last written on.
    pub(super) valid_bits: Vec<std::sync::atomic::AtomicU32>,
}

impl GpuTimer {
    /// A timer of `slots` slots, shared (`Arc`) so that streams writing it keep it alive.
    pub fn new(ctx: &Arc<Context>, slots: u32) -> Result<Arc<GpuTimer>> {
        if ctx.limits().timestamp_period_ns <= 0.0 {
            return Err(Error::unsupported("the compute queue has no timestamps"));
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(slots.max(1));
        // SAFETY: a valid create info for a device that is alive (we hold its context).
        let pool = unsafe { ctx.device.create_query_pool(&info, None) }
            .map_err(vkr("creating a query pool"))?;
        if ctx.features().host_query_reset {
            // SAFETY: the pool was just made (no GPU work uses it); hostQueryReset is
            // enabled; slots 0..max(slots, 1) are its query count.
            unsafe { ctx.device.reset_query_pool(pool, 0, slots.max(1)) };
        }
        let valid_bits = (0..slots)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect();
        Ok(Arc::new(GpuTimer {
            ctx: ctx.clone(),
            pool,
            slots,
            valid_bits,
        }))
    }

    /// Seconds from the timestamp in slot `from` to the one in slot `to` (both written by
    /// completed work on the same queue).
    pub fn seconds(&self, from: u32, to: u32) -> Result<f64> {
        let ticks = |slot: u32| -> Result<u64> {
            if slot >= self.slots {
                return Err(Error::invalid(format!(
                    "timer slot {slot} of {}",
                    self.slots
                )));
            }
            let mut value = [0u64; 1];
            // SAFETY: `slot` < slots (checked); without WAIT the call returns NOT_READY
            // for a slot no completed work has written, and never blocks.
            unsafe {
                self.ctx.device.get_query_pool_results(
                    self.pool,
                    slot,
                    &mut value,
                    vk::QueryResultFlags::TYPE_64,
                )
            }
            .map_err(|r| match r {
                vk::Result::NOT_READY => {
                    Error::invalid(format!("timer slot {slot} not written by completed work"))
                }
                r => super::vk_error(r, "reading a timestamp"),
            })?;
            let bits = self.valid_bits[slot as usize].load(std::sync::atomic::Ordering::Relaxed);
            Ok(if bits >= 64 {
                value[0]
            } else {
                value[0] & ((1u64 << bits) - 1)
            })
        };
        let (a, b) = (ticks(from)?, ticks(to)?);
        Ok(b.wrapping_sub(a) as f64 * self.ctx.limits().timestamp_period_ns as f64 * 1e-9)
    }
}

/// Summed spans of GPU time on one stream: `begin` and `end` timestamps around the work
/// of each submission, read once that work has completed. Spans past the first
/// `max_spans` are not timed.
pub struct GpuSpans {
    timer: Arc<GpuTimer>,
    /// Slots used by closed spans.
    next: u32,
    open: bool,
}

impl GpuSpans {
    /// None where `stream`'s queue has no timestamps.
    pub fn new(stream: &Stream, max_spans: u32) -> Option<GpuSpans> {
        if !stream.has_timestamps() {
            return None;
        }
        let timer = GpuTimer::new(stream.context(), 2 * max_spans).ok()?;
        Some(GpuSpans {
            timer,
            next: 0,
            open: false,
        })
    }

    /// Opens a span at this point of `stream`'s recording (no-op while one is open).
    pub fn begin(&mut self, stream: &mut Stream) -> Result<()> {
        if self.open || self.next + 2 > self.timer.slots {
            return Ok(());
        }
        stream.timestamp(&self.timer, self.next)?;
        self.open = true;
        Ok(())
    }

    /// Closes the open span, if any (call before submitting).
    pub fn end(&mut self, stream: &mut Stream) -> Result<()> {
        if self.open {
            stream.timestamp(&self.timer, self.next + 1)?;
            self.next += 2;
            self.open = false;
        }
        Ok(())
    }

    /// Seconds in the closed spans (their submissions must have completed).
    pub fn seconds(&self) -> Result<f64> {
        (0..self.next)
            .step_by(2)
            .try_fold(0.0, |sum, s| Ok(sum + self.timer.seconds(s, s + 1)?))
    }
}

impl Drop for GpuTimer {
    fn drop(&mut self) {
        // SAFETY: streams hold an `Arc` of the timer until the submissions that write it
        // have completed, so no GPU work uses the pool any more.
        unsafe { self.ctx.device.destroy_query_pool(self.pool, None) };
    }
}
