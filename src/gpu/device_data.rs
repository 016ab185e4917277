//! What a GPU join puts on the device: the indexed points R and the queries Q with the
//! grid index arrays (B cell ids, G cell ranges, A point lookup, M masks), or the raw
//! points for brute force; and the order in which kernels bind them
//! (`interface::binding`).

use super::index::{plan_grid, GridIndex};
use super::interface::{binding, flags};
use crate::backend::Job;
use crate::dataset::{Coords, Dataset};
use crate::error::{Error, Result};
use crate::metric::Coord;
use crate::result::JoinReport;
use crate::vk::{Buffer, BufferRange, Context};
use std::sync::Arc;
use std::time::Instant;

/// Everything the kernel reads, on the device. Buffers are shared (`Arc`): every dispatch
/// that binds them keeps them alive until it has run.
pub(super) struct DeviceData {
    r_coords: Arc<Buffer>,
    q_coords: Option<Arc<Buffer>>,
    cell_keys: Arc<Buffer>,
    cell_ranges: Arc<Buffer>,
    r_ids: Arc<Buffer>,
    q_ids: Option<Arc<Buffer>>,
    q_cells: Option<Arc<Buffer>>,
    meta: Arc<Buffer>,
}

impl DeviceData {
    /// The kernel's bindings, in `interface::binding` order, with a slot's result,
    /// counter and state buffers. A self-join binds R for Q; unused arrays bind a stand-in.
    pub(super) fn bindings(
        &self,
        results: &Arc<Buffer>,
        counters: &Arc<Buffer>,
        states: &Arc<Buffer>,
    ) -> Vec<BufferRange> {
        let mut b: Vec<(u32, BufferRange)> = vec![
            (binding::R_COORDS, self.r_coords.all()),
            (
                binding::Q_COORDS,
                self.q_coords.as_ref().unwrap_or(&self.r_coords).all(),
            ),
            (binding::CELL_KEYS, self.cell_keys.all()),
            (binding::CELL_RANGES, self.cell_ranges.all()),
            (binding::R_IDS, self.r_ids.all()),
            (
                binding::Q_IDS,
                self.q_ids.as_ref().unwrap_or(&self.r_ids).all(),
            ),
            (
                binding::Q_CELLS,
                self.q_cells.as_ref().unwrap_or(&self.meta).all(),
            ),
            (binding::META, self.meta.all()),
            (binding::RESULTS, results.all()),
            (binding::COUNTERS, counters.all()),
            (binding::STATES, states.all()),
            // LSS kNN only (glsl/lss.glsl): stand-ins.
            (binding::Q_LIMITS, self.meta.all()),
            (binding::Q_RADII, self.meta.all()),
        ];
        b.sort_by_key(|(i, _)| *i);
        debug_assert!(b.iter().enumerate().all(|(i, (n, _))| i as u32 == *n));
        debug_assert_eq!(b.len() as u32, binding::COUNT);
        b.into_iter().map(|(_, r)| r).collect()
    }
}

/// Uploads `data` (never empty: Vulkan bindings cannot be), checking the binding limit.
fn upload<T: bytemuck::Pod>(ctx: &Arc<Context>, data: &[T], name: &str) -> Result<Arc<Buffer>> {
    let bytes = std::mem::size_of_val(data) as u64;
    let limit = ctx.limits().max_storage_buffer_range;
    if bytes > limit {
        return Err(Error::unsupported(format!(
            "{name} needs {bytes} bytes, more than this device binds at once ({limit}); \
             use the CPU backend or split the data"
        )));
    }
    if data.is_empty() {
        return ctx.upload(&[0u32], name);
    }
    ctx.upload(data, name)
}

/// Row-major coordinates of `data` as `T` (the precision was checked by the caller).
pub(super) fn coords_of<'a, T: Coord>(data: &Dataset<'a>) -> &'a [T] {
    match data.coords() {
        Coords::F32(x) => bytemuck::cast_slice(x),
        Coords::F64(x) => bytemuck::cast_slice(x),
    }
}

fn gather<T: Coord>(coords: &[T], dim: usize, order: &[u32]) -> Vec<T> {
    let mut out = Vec::with_capacity(order.len() * dim);
    for &i in order {
        out.extend_from_slice(&coords[i as usize * dim..(i as usize + 1) * dim]);
    }
    out
}

/// The device data of one join and the kernel parameters that come with it.
pub(super) struct Prepared {
    pub data: DeviceData,
    /// Non-empty cells (grid) or indexed points (brute force).
    pub n_cells: u32,
    /// Query points.
    pub nq: usize,
    pub flags: u32,
    /// Indexed dimensions (spec constant K).
    pub k: u32,
    pub sort_dim: u32,
}

/// Grid: plans and builds the index over R (A ⋈ B indexes the smaller set; pairs are
/// swapped back), sorts the queries by cell, and uploads everything.
pub(super) fn prepare_grid<T: Coord>(
    ctx: &Arc<Context>,
    job: &Job,
    report: &mut JoinReport,
    upload_seconds: &mut f64,
) -> Result<Prepared> {
    let (opts, dim, eps, self_join) = (job.opts, job.a.dim(), job.opts.eps, job.b.is_none());
    let (r, q, swap) = match job.b {
        None => (job.a, job.a, false),
        Some(b) if b.len() <= job.a.len() => (b, job.a, false),
        Some(b) => (job.a, b, true),
    };
    let plan = plan_grid(&r, &q, self_join, eps, opts.indexed_dims)?;
    if let Some(k) = opts.indexed_dims {
        if k > plan.geom.k() {
            report
                .notes
                .push(format!("indexed_dims {k} reduced to {}", plan.geom.k()));
        }
    }
    report.notes.push(format!(
        "grid: k = {} indexed dims {:?}{}, SORTIDU on dim {:?}",
        plan.geom.k(),
        plan.geom.dims,
        if plan.costs.is_empty() {
            " (forced)"
        } else {
            " (cost model)"
        },
        plan.sort_dim
    ));
    if !plan.costs.is_empty() {
        let costs: Vec<String> = plan
            .costs
            .iter()
            .map(|c| {
                format!(
                    "k={}: {} cells, {:.3e} ops",
                    c.k,
                    c.nonempty_cells,
                    c.total()
                )
            })
            .collect();
        report.notes.push(format!(
            "cost model (search + compare memory ops): {}",
            costs.join("; ")
        ));
    }
    // REORDER in the distance test pays when the variance order is not the dataset's.
    let share = plan.top_quarter_share;
    let reorder = variance_order_helps(&plan.variance_order, share);
    let variance_order = plan.variance_order;
    let idx = GridIndex::build(&r, plan.geom, plan.sort_dim);
    report.notes.push(format!(
        "grid: {} non-empty cells over {} points",
        idx.cell_keys.len(),
        r.len()
    ));
    let r_sorted = gather(coords_of::<T>(&r), dim, &idx.order);
    let mut meta: Vec<u32> = idx.geom.cells.iter().map(|&c| c as u32).collect();
    meta.extend_from_slice(&idx.mask_offsets);
    meta.extend(variance_order.iter().map(|&j| j as u32));
    meta.extend_from_slice(&idx.mask_coords);
    let (q_order, q_cells) = if self_join {
        (None, idx.query_cells(&r, &idx.order))
    } else {
        // Queries sorted by cell too: neighbouring threads search the same cells.
        let mut order: Vec<u32> = (0..q.len() as u32).collect();
        let cells = idx.query_cells(&q, &order);
        let k = idx.k().max(1);
        // Linear ids of the query cells (the same row-major order as GridGeometry's).
        let keys: Vec<u64> = cells
            .chunks(k)
            .map(|c| {
                c.iter()
                    .zip(&idx.geom.cells)
                    .fold(0u64, |id, (&x, &n)| id * n + x as u64)
            })
            .collect();
        order.sort_unstable_by_key(|&p| (keys[p as usize], p));
        let sorted_cells: Vec<u32> = order
            .iter()
            .flat_map(|&p| &cells[p as usize * k..(p as usize + 1) * k])
            .copied()
            .collect();
        (Some(order), sorted_cells)
    };
    let t_up = Instant::now();
    let data = DeviceData {
        r_coords: upload(ctx, &r_sorted, "indexed points")?,
        q_coords: match &q_order {
            Some(o) => Some(upload(
                ctx,
                &gather(coords_of::<T>(&q), dim, o),
                "query points",
            )?),
            None => None,
        },
        cell_keys: upload(ctx, &idx.cell_keys, "cell ids (B)")?,
        cell_ranges: upload(ctx, &idx.cell_ranges, "cell ranges (G)")?,
        r_ids: upload(ctx, &idx.order, "point lookup (A)")?,
        q_ids: match &q_order {
            Some(o) => Some(upload(ctx, o, "query ids")?),
            None => None,
        },
        q_cells: Some(upload(ctx, &q_cells, "query cells")?),
        meta: upload(ctx, &meta, "grid masks (M)")?,
    };
    *upload_seconds += t_up.elapsed().as_secs_f64();
    let mut bits = if self_join { flags::FLAG_SELF } else { 0 } | flags::FLAG_SORTIDU;
    if reorder {
        bits |= flags::FLAG_REORDER;
        report
            .notes
            .push("REORDER: distance rejected in variance order first".into());
    } else {
        report.notes.push(format!(
            "REORDER: distance in dataset order (top quarter of dims holds {:.0}% of the variance)",
            100.0 * share
        ));
    }
    if swap {
        bits |= flags::FLAG_SWAP;
    }
    Ok(Prepared {
        data,
        n_cells: idx.cell_keys.len() as u32,
        nq: q.len(),
        flags: bits,
        k: idx.k() as u32,
        sort_dim: idx.sort_dim.unwrap_or(0) as u32,
    })
}

/// Brute force: R = B (or A), Q = A, in input order; ids are positions. Adds the upload
/// time to `upload_seconds`.
pub(super) fn prepare_brute<T: Coord>(
    ctx: &Arc<Context>,
    job: &Job,
    upload_seconds: &mut f64,
) -> Result<Prepared> {
    let r = job.b.unwrap_or(job.a);
    let t_up = Instant::now();
    let dummy = [0u32];
    let data = DeviceData {
        r_coords: upload(ctx, coords_of::<T>(&r), "points")?,
        q_coords: match job.b {
            Some(_) => Some(upload(ctx, coords_of::<T>(&job.a), "query points")?),
            None => None,
        },
        cell_keys: upload(ctx, &dummy, "unused")?,
        cell_ranges: upload(ctx, &dummy, "unused")?,
        r_ids: upload(ctx, &dummy, "unused")?,
        q_ids: None,
        q_cells: None,
        meta: upload(ctx, &dummy, "unused")?,
    };
    *upload_seconds += t_up.elapsed().as_secs_f64();
    Ok(Prepared {
        data,
        n_cells: r.len() as u32,
        nq: job.a.len(),
        flags: if job.b.is_none() { flags::FLAG_SELF } else { 0 },
        k: 1,
        sort_dim: 0,
    })
}

/// Whether rejecting in variance order first is worth a second (canonical) pass on the
/// survivors: when that order differs from the dataset's and a quarter of the dimensions
/// hold at least half of the variance (measured on lavapipe, d = 32, n = 10000: 1.5x
/// faster on such data, 1.5x slower on clusters with equal spread in every dimension).
/// `SIMJOIN_GPU_REORDER=0|1` forces it off or on (to measure what it brings).
fn variance_order_helps(order: &[usize], top_quarter_share: f64) -> bool {
    // Below 4 dimensions there is no "few of many" to reject on early.
    let differs = order.len() >= 4 && order.iter().enumerate().any(|(i, &j)| i != j);
    match std::env::var("SIMJOIN_GPU_REORDER").as_deref() {
        Ok("0") => false,
        Ok("1") => differs,
        _ => differs && top_quarter_share >= 0.5,
    }
}
