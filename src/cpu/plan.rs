//! Which algorithm runs, over which grid: the paper's Table 1 (grid for low dimensions
//! and small eps, EGO*-join for high dimensions and large eps) made concrete by a cost
//! estimate and thresholds measured on this project's machines (bench/CPU_RESULTS.md).

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::grid::{bounds, GridGeometry};
use crate::options::{Algorithm, JoinOptions};

/// Most dimensions the grid join indexes by default (3^(k-1) row lookups per cell).
const GRID_MAX_K: usize = 4;
/// Above this dimensionality `auto` prefers the EGO*-join.
const GRID_MAX_AUTO_DIM: usize = 8;
/// Below this many candidate pairs (|A|·|B|) brute force wins: no index to build.
const BRUTE_MAX_WORK: f64 = 2.0e5;

pub(crate) struct Plan {
    pub algorithm: Algorithm,
    /// Grid over the indexed dimensions (grid: k of them; EGO: all, variance order).
    pub geometry: Option<GridGeometry>,
    pub notes: Vec<String>,
}

/// Per-dimension bounds and variance over A and B together.
fn stats(a: &Dataset, b: Option<&Dataset>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = a.dim();
    let (mut lo, mut hi) = bounds(a);
    if let Some(b) = b {
        let (l2, h2) = bounds(b);
        for j in 0..d {
            lo[j] = lo[j].min(l2[j]);
            hi[j] = hi[j].max(h2[j]);
        }
    }
    let mut sum = vec![0.0f64; d];
    let mut sq = vec![0.0f64; d];
    let mut n = 0usize;
    for set in std::iter::once(a).chain(b) {
        // Sums shifted by the lower bound keep the variance accurate.
        for i in 0..set.len() {
            for j in 0..d {
                let x = set.get(i, j) - lo[j];
                sum[j] += x;
                sq[j] += x * x;
            }
        }
        n += set.len();
    }
    let var = (0..d)
        .map(|j| {
            if n == 0 {
                0.0
            } else {
                (sq[j] / n as f64 - (sum[j] / n as f64).powi(2)).max(0.0)
            }
        })
        .collect();
    (lo, hi, var)
}

/// Dimensions by decreasing variance (ties by dimension number, so the order is stable).
fn variance_order(var: &[f64]) -> Vec<usize> {
    let mut dims: Vec<usize> = (0..var.len()).collect();
    dims.sort_by(|&x, &y| var[y].total_cmp(&var[x]).then(x.cmp(&y)));
    dims
}

pub(crate) fn choose(
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    threads: usize,
) -> Result<Plan> {
    let d = a.dim();
    let na = a.len();
    let nb = b.map_or(na, |b| b.len());
    let mut notes = Vec::new();
    let algorithm = match opts.algorithm {
        Algorithm::Auto => {
            let work = if b.is_some() {
                na as f64 * nb as f64
            } else {
                na as f64 * na as f64 / 2.0
            };
            let chosen = if work <= BRUTE_MAX_WORK {
                notes.push(format!(
                    "auto: brute force, {work:.0} candidate pairs is too few to pay for an index"
                ));
                Algorithm::Brute
            } else if d <= GRID_MAX_AUTO_DIM {
                notes.push(format!(
                    "auto: grid join, {d} dimensions <= {GRID_MAX_AUTO_DIM} (Table 1: low dim)"
                ));
                Algorithm::Grid
            } else {
                notes.push(format!(
                    "auto: EGO*-join, {d} dimensions > {GRID_MAX_AUTO_DIM} (Table 1: high dim)"
                ));
                Algorithm::Ego
            };
            chosen
        }
        Algorithm::Lss => {
            return Err(Error::unsupported(
                "the CPU backend has no 'lss' algorithm (use grid, ego, brute or auto)",
            ))
        }
        other => other,
    };
    let _ = threads;
    let geometry = match algorithm {
        Algorithm::Brute => None,
        Algorithm::Grid => {
            let (lo, hi, var) = stats(a, b);
            let order = variance_order(&var);
            let mut k = opts.indexed_dims.unwrap_or(GRID_MAX_K).min(d);
            loop {
                let g = GridGeometry::new(&order[..k], &lo, &hi, opts.eps)?;
                if g.total_cells().is_some() || k == 1 {
                    notes.push(format!(
                        "grid: {k} indexed dims {:?}, cells per dim {:?}",
                        g.dims, g.cells
                    ));
                    break Some(g);
                }
                k -= 1;
            }
        }
        Algorithm::Ego => {
            let (lo, hi, var) = stats(a, b);
            let order = variance_order(&var);
            let g = GridGeometry::new(&order, &lo, &hi, opts.eps)?;
            notes.push(format!("ego: dimension order by variance {:?}", g.dims));
            Some(g)
        }
        _ => unreachable!(),
    };
    Ok(Plan {
        algorithm,
        geometry,
        notes,
    })
}
