//! Which algorithm runs, over which grid: the paper's Table 1 (grid for low dimensions
//! and small eps, EGO*-join for high dimensions and large eps) made concrete by a cost
//! estimate and thresholds measured on this project's machines (bench/CPU_RESULTS.md).

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::grid::GridGeometry;
use crate::options::{Algorithm, JoinOptions};
use crate::stats::{bounds_and_variance, order_by_variance};

/// Most dimensions the grid join indexes by default (3^(k-1) row lookups per cell).
const GRID_MAX_K: usize = 4;
/// Above this dimensionality `auto` prefers the EGO*-join.
const GRID_MAX_AUTO_DIM: usize = 8;
/// `auto` leaves the grid for brute force when the neighbour cells would hold more than
/// this share of all pairs (eps comparable to the data's extent).
const GRID_MAX_SHARE: f64 = 0.5;
/// Below this many candidate pairs (|A|·|B|) brute force wins: no index to build.
const BRUTE_MAX_WORK: f64 = 2.0e5;

pub(crate) struct Plan {
    pub algorithm: Algorithm,
    /// Grid over the indexed dimensions (grid: k of them; EGO: all, variance order).
    pub geometry: Option<GridGeometry>,
    pub notes: Vec<String>,
}

pub(crate) fn choose(a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> Result<Plan> {
    let d = a.dim();
    let na = a.len();
    let nb = b.map_or(na, |b| b.len());
    let mut notes = Vec::new();
    if opts.algorithm == Algorithm::Lss {
        return Err(Error::unsupported(
            "the CPU backend has no 'lss' algorithm (use grid, ego, brute or auto)",
        ));
    }
    if opts.algorithm == Algorithm::KdTree {
        return Err(Error::invalid(
            "'kdtree' is a k-nearest-neighbour algorithm; an eps-join uses grid, ego, brute, lss or auto",
        ));
    }
    // Candidate pairs brute force would test.
    let work = if b.is_some() {
        na as f64 * nb as f64
    } else {
        na as f64 * na as f64 / 2.0
    };
    if opts.algorithm == Algorithm::Brute
        || (opts.algorithm == Algorithm::Auto && work <= BRUTE_MAX_WORK)
    {
        if opts.algorithm == Algorithm::Auto {
            notes.push(format!(
                "auto: brute force, {work:.0} candidate pairs are too few to pay for an index"
            ));
        }
        return Ok(Plan {
            algorithm: Algorithm::Brute,
            geometry: None,
            notes,
        });
    }
    let (lo, hi, var) = bounds_and_variance(a, b);
    let order = order_by_variance(&var);
    let algorithm = match opts.algorithm {
        Algorithm::Auto if d > GRID_MAX_AUTO_DIM => {
            notes.push(format!(
                "auto: EGO*-join, {d} dimensions > {GRID_MAX_AUTO_DIM} (Table 1: high dim; measured: EGO* wins from 10-D)"
            ));
            Algorithm::Ego
        }
        Algorithm::Auto => Algorithm::Grid,
        other => other,
    };
    if algorithm == Algorithm::Ego {
        let g = GridGeometry::new(&order, &lo, &hi, opts.eps)?;
        // The first few dimensions say what the order is; 384 of them only fill the note.
        const SHOWN: usize = 8;
        let more = match g.dims.len().saturating_sub(SHOWN) {
            0 => String::new(),
            rest => format!(" and {rest} more"),
        };
        notes.push(format!(
            "ego: dimension order by variance {:?}{more}",
            &g.dims[..g.dims.len().min(SHOWN)]
        ));
        return Ok(Plan {
            algorithm,
            geometry: Some(g),
            notes,
        });
    }
    let mut k = opts.indexed_dims.unwrap_or(GRID_MAX_K).min(d);
    let g = loop {
        let g = GridGeometry::new(&order[..k], &lo, &hi, opts.eps)?;
        if g.total_cells().is_some() || k == 1 {
            break g;
        }
        k -= 1;
    };
    notes.push(format!(
        "grid: {k} indexed dims {:?}, cells per dim {:?}",
        g.dims, g.cells
    ));
    if opts.algorithm == Algorithm::Auto {
        // Share of all pairs the 3^k neighbour cells hold if points were spread evenly:
        // near 1 when eps spans the data, and then the grid is brute force plus overhead.
        let share: f64 = g.cells.iter().map(|&c| (3.0 / c as f64).min(1.0)).product();
        if share > GRID_MAX_SHARE {
            notes.push(format!(
                "auto: brute force, eps spans the data (neighbour cells hold ~{:.0}% of all pairs)",
                share * 100.0
            ));
            return Ok(Plan {
                algorithm: Algorithm::Brute,
                geometry: None,
                notes,
            });
        }
        notes.push(format!(
            "auto: grid join, {d} dimensions <= {GRID_MAX_AUTO_DIM} (Table 1: low dim), neighbour cells hold ~{:.2}% of all pairs",
            share * 100.0
        ));
    }
    Ok(Plan {
        algorithm: Algorithm::Grid,
        geometry: Some(g),
        notes,
    })
}
