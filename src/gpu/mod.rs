//! GPU join algorithms over the Vulkan layer (`crate::vk`): the eps-grid self-join and
//! A ⋈ B of GPU-SJ/GPU-JOIN, and the nested-loop brute force.
//!
//! - `index`: host side of the grid: REORDER (dimensions by sampled variance), k by
//!   GPU-JOIN's sampling cost model, linear cell ids that never overflow (dimensions are
//!   dropped instead), and the index arrays B (cell ids), G (cell ranges), A (point lookup)
//!   and M (per-dimension masks); points sorted by cell, then by the SORTIDU dimension.
//! - `device_index`: the same index arrays built on the device (glsl/grid_index.comp with
//!   the engine's sort and scan), chosen automatically except for tiny inputs.
//! - `dot_filter`: Euclidean joins from 8 dimensions reject candidates by the CPU's f32
//!   dot-product filter and its proven bound before the exact test.
//! - `plan`: batch sizes from an estimation pass over a sample of the queries (>= 3).
//! - `join`: the driver: uploads, estimation, three slots (stream + result buffer + pinned
//!   read-back) in flight, continuations when a result buffer fills up or a software
//!   device's loop budget runs out, the report.
//! - `rows`: sorted pairs and the CSR as rows sorted on the device (a count pass, then
//!   batches sorted by the bitonic network and placed at their final offsets).
//! - `grouped`: the grouped cosine join's tiles of f32 dot products (its plan from
//!   `cpu/partition/`), batches in two slots.
//! - `lss`, `zorder`: LSS (sort and search over a set of Z-order lists): the eps-join,
//!   and with `knn` the exact k-nearest-neighbour join (LSS or brute force).
//! - `glsl/grid_join_*.comp`, `glsl/brute_join_*.comp`, `glsl/lss_*.comp` (f32/f64) with
//!   `join_*.glsl`, `lss.glsl`: the kernels; the match test is `metric.rs`'s, bit for bit.

mod batch;
pub(crate) mod device_data;
mod device_index;
mod dot_filter;
mod grouped;
pub(crate) mod index;
pub mod interface;
mod join;
mod knn;
mod lss;
pub(crate) mod plan;
mod rows;
mod zorder;

use crate::backend::{Job, JoinBackend, RowsForm};
use crate::engine::EngineOptions;
use crate::error::Result;
use crate::knn::{KnnJob, KnnResult};
use crate::result::{JoinOutput, JoinReport, PairSink};
use crate::vk::{Context, ContextOptions, StagingPool};
use std::sync::Arc;

/// Opens the engine's device: the GPU backend and whether the device is a software
/// rasterizer. Each engine owns its context; it is released when the engine is dropped.
pub(crate) fn open(opts: &EngineOptions) -> Result<(Box<dyn JoinBackend>, bool)> {
    let ctx = Context::new(&ContextOptions {
        device: opts.device.clone(),
        validation: opts.validation,
    })?;
    // Testing knob: `SIMJOIN_GPU_DISPATCH_WIDTH=N` caps rows of workgroups at N, so every
    // multi-workgroup dispatch runs as a 2-D grid (with surplus workgroups) at small sizes.
    if let Some(width) = std::env::var("SIMJOIN_GPU_DISPATCH_WIDTH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        ctx.set_dispatch_width(width);
    }
    let software = ctx.is_software();
    let pools = Pools {
        staging: StagingPool::new(&ctx),
        slots: batch::SlotPool::default(),
    };
    Ok((Box::new(GpuBackend { ctx, pools }), software))
}

struct GpuBackend {
    ctx: Arc<Context>,
    pools: Pools,
}

/// What the engine's joins reuse instead of allocating anew.
pub(super) struct Pools {
    /// Pinned staging buffers for uploads.
    pub staging: Arc<StagingPool>,
    /// The batch loop's result slots (device result buffers, pinned read-back buffers,
    /// streams): allocating them took 0.13-0.22 s a join on an H100 (2026-11-26).
    pub slots: batch::SlotPool,
}

impl JoinBackend for GpuBackend {
    fn run(&self, job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport> {
        join::run(&self.ctx, &self.pools, job, sink)
    }

    fn rows(&self, job: &Job, form: RowsForm) -> Result<Option<(JoinOutput, JoinReport)>> {
        join::rows(&self.ctx, &self.pools, job, form)
    }

    fn neighbour_counts(&self, job: &Job) -> Result<Option<(Vec<u32>, JoinReport)>> {
        join::neighbour_counts(&self.ctx, &self.pools, job)
    }

    fn link(
        &self,
        job: &Job,
        core: &[bool],
        sink: &mut dyn PairSink,
    ) -> Result<Option<(Vec<u32>, JoinReport)>> {
        join::link(&self.ctx, &self.pools, job, core, sink)
    }

    fn knn(&self, job: &KnnJob) -> Result<KnnResult> {
        knn::run(&self.ctx, job)
    }

    fn nearest_leaders(
        &self,
        x: &[f32],
        dim: usize,
        leaders: &[f32],
        control: &crate::control::Control,
    ) -> Result<Option<Vec<(u32, f32)>>> {
        grouped::nearest_leaders(&self.ctx, x, dim, leaders, control).map(Some)
    }

    fn grouped(
        &self,
        plan: &crate::cpu::partition::Plan,
        opts: &crate::options::JoinOptions,
        emit: &crate::cpu::partition::Candidates,
    ) -> Result<Option<(String, String)>> {
        let note = grouped::run(&self.ctx, plan, opts, emit)?;
        Ok(Some((note, self.ctx.device_name().to_string())))
    }
}
