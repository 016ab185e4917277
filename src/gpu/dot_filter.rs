//! The high-dimensional filter of the GPU grid join: the CPU's f32 dot-product filter
//! (`cpu/dot_filter.rs`, its bound and its copies) per candidate in the kernel
//! (glsl/join_common.glsl `dot_rejects`), before the exact test, which decides every
//! survivor: the pair set does not change.
//!
//! One cutoff G serves the whole join, from the largest centring error and norm over all
//! points (centred on the middle of both sets' bounding box), passed in the push constants
//! (`JoinParams::dot_cutoff`). The copies are by point id, so one upload serves the host-
//! and the device-built index alike (the kernel reads them through the point lookup).
//!
//! Tiled (FLAG_TILE, `tiling`): in the batches, a workgroup sweeps its queries one home
//! cell at a time and stages the candidates' copies in shared memory, TILE at a time, so a
//! candidate's copy is read from device memory once per workgroup instead of once per query
//! (glsl/join_grid.glsl `tile_main`). The estimation pass (strided queries) and joins
//! without the filter scan one thread per query.

use super::device_data::{check_binding, coords_of};
use crate::cpu::dot_filter::{centred_rows, FilterBound};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::metric::Coord;
use crate::options::Metric;
use crate::vk::{Buffer, Uploads};
use std::sync::Arc;

/// From this many dimensions Euclidean grid joins use the filter: the CPU's floor
/// (`cpu::ego::FILTER_MIN_DIM`), not yet measured on a real GPU.
const MIN_DIM: usize = 8;

/// The filter's device data for one join.
pub(super) struct DotFilter {
    /// Filter copies of the indexed points, by id.
    pub r_dot: Arc<Buffer>,
    /// Of the queries (None in a self-join: they are the indexed points).
    pub q_dot: Option<Arc<Buffer>>,
    /// G, rounded up to f32.
    pub cutoff: f32,
}

/// Shared memory a tile may take: the least every Vulkan device offers (16 KiB), less room
/// for the kernel's other shared words.
const TILE_BYTES: u32 = 16 * 1024 - 512;
/// Tiles need cells of at least this many workgroups' worth of queries on average. Half:
/// on an H100 (2026-11-26, 2M exponential 16-D points, 59.8 queries a cell, workgroups of
/// 64) the tiled join took 16.6 s (its dispatches paced, which cost the untiled one 2.7x)
/// against 24.9 s untiled and unpaced; at 27.6 queries a cell it is unmeasured.
const MIN_TILED_CELL: f64 = 0.5;
/// DBSCAN's longest link (join_common.glsl `LINK_STEPS`, charged 2 * 64 + 2): a fresh
/// dispatch must afford one after its first tile, or a stopped query could never progress.
const LINK_CHARGE: u64 = 2 * 64 + 2;

/// The shared-memory tiling of the filter (FLAG_TILE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Tiling {
    /// Candidates per tile (spec constant 5).
    pub tile: u32,
    /// Floats of the tile, tile * (dim + 1) (spec constant 6).
    pub floats: u32,
}

/// Loop iterations the kernel charges one tile of `n` candidates (join_grid.glsl
/// `sweep_cell`): the staging loop, then each member's filter, exact passes and step.
fn tile_cost(n: u64, dim: u64, workgroup: u64, passes: u64) -> u64 {
    (n * (dim + 1)).div_ceil(workgroup) + n * (passes * dim + 1)
}

/// The least loop budget a thread of the tiled kernel needs to make progress: a fresh
/// dispatch's fixed charge and one whole tile.
pub(super) fn least_tiled_charge(
    t: &Tiling,
    dim: usize,
    k: u32,
    log_cells: u32,
    workgroup: u32,
    reorder: bool,
) -> u64 {
    let (d, k, l, wg) = (dim as u64, k as u64, log_cells as u64, workgroup as u64);
    fixed_charge(d, k, l) + tile_cost(t.tile as u64, d, wg, 2 + u64::from(reorder))
}

/// Charged before a fresh dispatch's first tile: loading the query and its masks, a phase,
/// a probe and the windows (tile_main, sweep, sweep_cell).
fn fixed_charge(d: u64, k: u64, l: u64) -> u64 {
    2 * d + k * (3 * l + 2) + k + (k + 2 * l) + (2 * l + 2) + LINK_CHARGE
}

/// The tiling for a filtered grid join, None (with the reason in `notes`) where it is off:
/// on a `software` device unless `SIMJOIN_GPU_TILE=1`, where `SIMJOIN_GPU_TILE=0`, or where
/// a tile of one candidate exceeds the shared memory or a software device's loop `budget`
/// (0 = none), or where cells hold on average fewer queries than a workgroup
/// (`queries_per_cell`). Tiles are a workgroup's worth of
/// candidates, fewer where shared memory or the budget ask. `log_cells` bounds a binary
/// search; `reorder`: the exact test has its REORDER pass.
#[allow(clippy::too_many_arguments)]
pub(super) fn tiling(
    software: bool,
    queries_per_cell: f64,
    shared_bytes: u32,
    workgroup: u32,
    budget: u32,
    dim: usize,
    k: u32,
    log_cells: u32,
    reorder: bool,
    notes: &mut Vec<String>,
) -> Option<Tiling> {
    match std::env::var("SIMJOIN_GPU_TILE").as_deref() {
        Ok("0") => {
            notes.push("GPU filter tiles off (SIMJOIN_GPU_TILE=0): one thread per query".into());
            return None;
        }
        Ok("1") => {}
        _ if software => {
            // Measured on lavapipe (20k clustered points, 16-D to 64-D): the batches took
            // 2.1-3.2x as long tiled; its threads share no memory hierarchy to save.
            notes.push("GPU filter tiles off on a software device: one thread per query".into());
            return None;
        }
        _ if queries_per_cell < MIN_TILED_CELL * workgroup as f64 => {
            // A workgroup sweeps one home cell at a time: with small cells most of its
            // threads would wait while the few in the cell being swept work.
            notes.push(format!(
                "GPU filter tiles off: {queries_per_cell:.1} queries per cell on average, \
                 fewer than {:.0} (half a workgroup of {workgroup}); one thread per query",
                MIN_TILED_CELL * workgroup as f64
            ));
            return None;
        }
        _ => {}
    }
    let (d, k, l, wg) = (dim as u64, k as u64, log_cells as u64, workgroup as u64);
    let passes = 2 + u64::from(reorder);
    let by_memory = (shared_bytes.min(TILE_BYTES) as u64 / 4) / (d + 1);
    let fixed = fixed_charge(d, k, l);
    let mut tile = wg.min(by_memory);
    if budget != 0 {
        while tile > 0 && fixed + tile_cost(tile, d, wg, passes) > budget as u64 {
            tile -= 1;
        }
    }
    if tile == 0 {
        notes.push(format!(
            "GPU filter tiles off: one candidate's copy ({} bytes) exceeds the shared memory \
             or the loop budget; one thread per query",
            4 * (d + 1)
        ));
        return None;
    }
    notes.push(format!(
        "GPU filter in shared-memory tiles: a workgroup of {workgroup} sweeps its queries one \
         home cell at a time, {tile} candidates' f32 copies staged per tile ({} bytes)",
        4 * tile * (d + 1)
    ));
    Some(Tiling {
        tile: tile as u32,
        floats: (tile * (d + 1)) as u32,
    })
}

/// `SIMJOIN_GPU_DOT_FILTER=0` turns the filter off, `=1` on wherever it is safe (below
/// MIN_DIM too, and where it would reject little): for tests and measurements.
fn forced() -> Option<bool> {
    match std::env::var("SIMJOIN_GPU_DOT_FILTER").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// The midpoint of the bounding box of `sets` (row-major, `dim` columns), per dimension.
fn box_centre<T: Coord>(sets: &[&[T]], dim: usize) -> Vec<f64> {
    let mut lo = vec![f64::INFINITY; dim];
    let mut hi = vec![f64::NEG_INFINITY; dim];
    for set in sets {
        for p in set.chunks(dim) {
            for (c, &x) in p.iter().enumerate() {
                lo[c] = lo[c].min(x.to_f64());
                hi[c] = hi[c].max(x.to_f64());
            }
        }
    }
    lo.iter()
        .zip(&hi)
        .map(|(&l, &h)| l + (h - l) / 2.0)
        .collect()
}

/// Prepares the filter for the grid join of queries `q` with indexed points `r` (the same
/// set in a self-join) under threshold `thr`, uploading its copies; None (with the reason
/// in `notes`) where it is off, unsafe or useless, or where it does not `fits` a software
/// device's loop budget.
pub(super) fn prepare<T: Coord>(
    uploads: &mut Uploads,
    r: &Dataset,
    q: Option<&Dataset>,
    metric: Metric,
    thr: T,
    fits: bool,
    notes: &mut Vec<String>,
) -> Result<Option<DotFilter>> {
    let dim = r.dim();
    let force = forced();
    if metric != Metric::Euclidean || force == Some(false) || (force.is_none() && dim < MIN_DIM) {
        return Ok(None);
    }
    let mut off = |why: &str| {
        notes.push(format!("GPU dot-product filter off: {why}"));
        Ok(None)
    };
    if !fits {
        return off("a thread's least work with it exceeds the software device's loop budget");
    }
    let Some(bound) = FilterBound::new(thr, dim) else {
        return off("eps too small for its bound");
    };
    let rc = coords_of::<T>(r);
    let qc = q.map(|q| coords_of::<T>(q));
    let centre = box_centre(&[rc, qc.unwrap_or(&[])], dim);
    let Some((r_rows, r_err, r_n2)) = centred_rows(rc, dim, &centre) else {
        return off("centred norms too large for f32");
    };
    let q_rows = match qc.map(|qc| centred_rows(qc, dim, &centre)) {
        Some(None) => return off("centred norms too large for f32"),
        rows => rows.flatten(),
    };
    let (q_err, q_n2) = q_rows.as_ref().map_or((r_err, r_n2), |q| (q.1, q.2));
    if force.is_none() && !bound.useful(r_n2.max(q_n2)) {
        return off("its error term would exceed eps^2 (spread far wider than eps)");
    }
    let too_big = |rows: &Vec<f32>| {
        check_binding(uploads.context(), 4 * rows.len() as u64, "filter copies").is_err()
    };
    if too_big(&r_rows) || q_rows.as_ref().is_some_and(|q| too_big(&q.0)) {
        return off("its copies exceed the device's binding limit");
    }
    let cutoff = bound.cutoff(q_err, r_err, q_n2, r_n2);
    let r_dot = uploads.upload(&r_rows, "filter copies (indexed)")?;
    let q_dot = match q_rows {
        Some((rows, ..)) => Some(uploads.upload(&rows, "filter copies (queries)")?),
        None => None,
    };
    notes.push(format!(
        "GPU dot-product filter on: f32 copies centred on the bounding box's middle, cutoff \
         G = {cutoff:e} for eps^2 = {:e}, survivors confirmed exactly",
        thr.to_f64()
    ));
    Ok(Some(DotFilter {
        r_dot,
        q_dot,
        cutoff,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiles(software: bool, shared: u32, wg: u32, budget: u32, dim: usize) -> Option<u32> {
        let mut notes = Vec::new();
        tiling(
            software, 1e3, shared, wg, budget, dim, 3, 20, true, &mut notes,
        )
        .map(|t| {
            assert_eq!(t.floats as usize, t.tile as usize * (dim + 1));
            t.tile
        })
    }

    #[test]
    fn tiles_fit_shared_memory_and_the_loop_budget() {
        if std::env::var_os("SIMJOIN_GPU_TILE").is_some() {
            return; // forced: the defaults below do not apply
        }
        // Hardware: a workgroup's worth, fewer where 16 KiB (less the kernel's own words)
        // cannot hold them, none past one candidate.
        assert_eq!(tiles(false, 49152, 64, 0, 16), Some(64));
        assert_eq!(tiles(false, 49152, 64, 0, 64), Some(61));
        assert_eq!(tiles(false, 16384, 64, 0, 500), Some(7));
        assert_eq!(tiles(false, 49152, 64, 0, 4000), None);
        // Software devices: off unless forced.
        assert_eq!(tiles(true, 49152, 8, 7000, 16), None);
        // Cells smaller than half a workgroup: off; from half a workgroup: on.
        let mut notes = Vec::new();
        assert!(tiling(false, 40.0, 49152, 64, 0, 16, 3, 20, true, &mut notes).is_some());
        let small = tiling(false, 20.0, 49152, 64, 0, 16, 3, 20, true, &mut notes);
        assert_eq!(small, None, "{notes:?}");
        assert!(notes[1].contains("queries per cell"), "{notes:?}");
    }

    #[test]
    fn a_budgeted_tile_leaves_room_for_progress() {
        let (d, k, l, wg) = (64u64, 3u64, 20u64, 8u64);
        let fixed = 2 * d + k * (3 * l + 2) + k + (k + 2 * l) + (2 * l + 2) + LINK_CHARGE;
        for budget in [2_000u32, 3_000, 7_000] {
            let mut notes = Vec::new();
            let t = tiling(false, 1e3, 49152, 8, budget, 64, 3, 20, true, &mut notes);
            let Some(t) = t else {
                // Not even one candidate fits: off, said so.
                assert!(fixed + tile_cost(1, d, wg, 3) > budget as u64);
                assert!(notes[0].contains("tiles off"), "{notes:?}");
                continue;
            };
            let n = t.tile as u64;
            assert!(fixed + tile_cost(n, d, wg, 3) <= budget as u64);
            assert!(n == wg || fixed + tile_cost(n + 1, d, wg, 3) > budget as u64);
        }
    }
}
