//! GPU join algorithms over the Vulkan layer (`crate::vk`): the eps-grid self-join and
//! A ⋈ B of GPU-SJ/GPU-JOIN, and the nested-loop brute force.
//!
//! - `index`: host side of the grid: REORDER (dimensions by sampled variance), k by
//!   GPU-JOIN's sampling cost model, linear cell ids that never overflow (dimensions are
//!   dropped instead), and the index arrays B (cell ids), G (cell ranges), A (point lookup)
//!   and M (per-dimension masks); points sorted by cell, then by the SORTIDU dimension.
//! - `plan`: batch sizes from an estimation pass over a sample of the queries (>= 3).
//! - `join`: the driver: uploads, estimation, three slots (stream + result buffer + pinned
//!   read-back) in flight, continuations when a result buffer fills up or a software
//!   device's loop budget runs out, the report.
//! - `glsl/grid_join_*.comp`, `glsl/brute_join_*.comp` (f32/f64) with `join_*.glsl`: the
//!   kernels; the match test is `metric.rs`'s, bit for bit.

pub(crate) mod index;
mod join;
pub(crate) mod plan;

use crate::engine::{Job, JoinBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::options::JoinOptions;
use crate::result::{JoinReport, PairSink};
use crate::vk::{Context, ContextOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The GPU backend for `opts`. `explicit`: the caller asked for a GPU (any Vulkan device,
/// lavapipe included); otherwise only a real (non-CPU) GPU is returned, or None.
pub(crate) fn backend(opts: &JoinOptions, explicit: bool) -> Result<Option<Arc<dyn JoinBackend>>> {
    match context(opts) {
        Ok(ctx) if explicit || !ctx.is_software() => Ok(Some(Arc::new(GpuBackend { ctx }))),
        Ok(_) => Ok(None),
        Err(e) if explicit => Err(Error::new(
            ErrorKind::NoDevice,
            format!("no usable Vulkan device: {e}"),
        )),
        Err(_) => Ok(None),
    }
}

/// One Vulkan context per device selector for the whole process: contexts are expensive
/// (instance, device, pipelines), and kernels are cached in them.
fn context(opts: &JoinOptions) -> Result<Arc<Context>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<Option<String>, Arc<Context>>>> = OnceLock::new();
    let selector = opts
        .device
        .clone()
        .or_else(|| std::env::var("SIMJOIN_DEVICE").ok());
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(ctx) = map.get(&selector) {
        return Ok(ctx.clone());
    }
    let ctx = Context::new(&ContextOptions {
        device: selector.clone(),
        validation: None,
    })?;
    // Testing knob: `SIMJOIN_GPU_DISPATCH_WIDTH=N` caps rows of workgroups at N, so every
    // multi-workgroup dispatch runs as a 2-D grid (with surplus workgroups) at small sizes.
    if let Some(width) = std::env::var("SIMJOIN_GPU_DISPATCH_WIDTH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        ctx.set_dispatch_width(width);
    }
    map.insert(selector, ctx.clone());
    Ok(ctx)
}

struct GpuBackend {
    ctx: Arc<Context>,
}

impl JoinBackend for GpuBackend {
    fn run(&self, job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport> {
        join::run(&self.ctx, job, sink)
    }
}
