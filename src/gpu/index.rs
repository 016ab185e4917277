//! Host side of the GPU eps-grid (GPU-SJ / GPU-JOIN): choosing the indexed dimensions
//! (REORDER by sampled variance, k by the sampling cost model), and building the index of
//! non-empty cells that the search kernel reads:
//! - `cell_keys` (the paper's B): sorted linear ids of the non-empty cells (u64),
//! - `cell_ranges` (G): cell -> [start, end) range of positions in the sorted point order,
//! - `order` (A): sorted position -> original point id,
//! - `mask_coords` / `mask_offsets` (M): per indexed dimension, the sorted distinct cell
//!   coordinates that hold at least one point.
//!
//! Points are sorted by cell and, inside a cell, by the SORTIDU dimension. Cell coordinates
//! come from `GridGeometry` (f64 on the host) so no pair is lost on cell edges.

use crate::control::Control;
use crate::dataset::Dataset;
use crate::error::Result;
use crate::grid::GridGeometry;
use crate::stats::{bounds, order_by_variance};
use rayon::prelude::*;

/// Most dimensions the cost model will index: 3^k adjacent cells grow too fast beyond it
/// (GPU-JOIN: "indexing k > 10 is likely to degrade performance"; it uses k = 6).
pub const MAX_AUTO_K: usize = 8;
/// Fraction of the points sampled for the variance estimate (GPU-JOIN uses 1%).
const VARIANCE_SAMPLE_FRACTION: f64 = 0.01;
/// Smallest / largest sample for the variance estimate and for the k cost model.
const MIN_SAMPLE: usize = 256;
const MAX_COST_SAMPLE: usize = 2048;

/// Deterministic strided sample of `n` positions, about `fraction * n`, clamped to
/// [min(MIN_SAMPLE, n), max].
pub fn sample_positions(n: usize, fraction: f64, max: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let want = ((n as f64 * fraction).ceil() as usize)
        .max(MIN_SAMPLE.min(n))
        .min(max.max(1))
        .min(n);
    let stride = n / want;
    (0..want).map(|s| s * stride).collect()
}

/// Per-dimension variance estimated on a sample of about 1% of the points (REORDER).
pub fn sampled_variances(data: &Dataset) -> Vec<f64> {
    let sample = sample_positions(data.len(), VARIANCE_SAMPLE_FRACTION, usize::MAX);
    let mut var = vec![0.0f64; data.dim()];
    if !sample.is_empty() {
        for (j, v) in var.iter_mut().enumerate() {
            let mean = sample.iter().map(|&i| data.get(i, j)).sum::<f64>() / sample.len() as f64;
            *v = sample
                .iter()
                .map(|&i| (data.get(i, j) - mean).powi(2))
                .sum::<f64>()
                / sample.len() as f64;
        }
    }
    var
}

/// Share of the total variance held by the top quarter of the dimensions: high when a few
/// dimensions decide most distances, which is when rejecting in variance order pays.
pub fn top_quarter_variance_share(var: &[f64]) -> f64 {
    let total: f64 = var.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let order = order_by_variance(var);
    order
        .iter()
        .take(var.len().div_ceil(4))
        .map(|&j| var[j])
        .sum::<f64>()
        / total
}

/// A grid over the first k of `dims`, dropping trailing dimensions while the total number
/// of cells would overflow the u64 linear ids (never wrapped). Always keeps >= 1 dimension.
pub fn geometry_for(dims: &[usize], lo: &[f64], hi: &[f64], eps: f64) -> Result<GridGeometry> {
    let mut k = dims.len();
    loop {
        let g = GridGeometry::new(&dims[..k], lo, hi, eps)?;
        // One cell per dimension is at most 2^31, so one dimension always fits.
        if g.total_cells().is_some() || k == 1 {
            return Ok(g);
        }
        k -= 1;
    }
}

/// Linear cell id of every point of `data` under `geom`, in parallel.
fn point_keys(data: &Dataset, geom: &GridGeometry) -> Vec<u64> {
    (0..data.len())
        .into_par_iter()
        .map_init(
            || vec![0u64; geom.k()],
            |coords, i| {
                geom.point_coords(data, i, coords);
                geom.linear_id(coords)
            },
        )
        .collect()
}

/// Splits a linear id back into cell coordinates.
pub fn key_coords(geom: &GridGeometry, mut key: u64, out: &mut [u64]) {
    for axis in (0..geom.k()).rev() {
        out[axis] = key % geom.cells[axis];
        key /= geom.cells[axis];
    }
}

/// The eps-grid index over one point set.
pub struct GridIndex {
    pub geom: GridGeometry,
    /// Sorted position -> original point id (A).
    pub order: Vec<u32>,
    /// Sorted linear ids of the non-empty cells (B).
    pub cell_keys: Vec<u64>,
    /// Per non-empty cell, [start, end) positions in `order` (G).
    pub cell_ranges: Vec<[u32; 2]>,
    /// Per indexed dimension a, the distinct non-empty coordinates
    /// `mask_coords[mask_offsets[a]..mask_offsets[a+1]]`, sorted (M).
    pub mask_coords: Vec<u32>,
    pub mask_offsets: Vec<u32>,
}

impl GridIndex {
    /// Builds the index of `data` over `geom`; `sort_dim` is the SORTIDU dimension.
    pub fn build(data: &Dataset, geom: GridGeometry, sort_dim: Option<usize>) -> GridIndex {
        let keys = point_keys(data, &geom);
        let mut order: Vec<u32> = (0..data.len() as u32).collect();
        // Sort by (cell, SORTIDU coordinate, id): deterministic, cells contiguous.
        order.par_sort_unstable_by(|&x, &y| {
            let (x, y) = (x as usize, y as usize);
            keys[x]
                .cmp(&keys[y])
                .then_with(|| match sort_dim {
                    Some(u) => data.get(x, u).total_cmp(&data.get(y, u)),
                    None => std::cmp::Ordering::Equal,
                })
                .then(x.cmp(&y))
        });
        let mut cell_keys = Vec::new();
        let mut cell_ranges: Vec<[u32; 2]> = Vec::new();
        for (pos, &id) in order.iter().enumerate() {
            let key = keys[id as usize];
            if cell_keys.last() != Some(&key) {
                cell_keys.push(key);
                cell_ranges.push([pos as u32, pos as u32]);
            }
            cell_ranges.last_mut().unwrap()[1] = pos as u32 + 1;
        }
        let k = geom.k();
        let mut per_axis: Vec<Vec<u32>> = vec![Vec::new(); k];
        let mut coords = vec![0u64; k];
        for &key in &cell_keys {
            key_coords(&geom, key, &mut coords);
            for a in 0..k {
                per_axis[a].push(coords[a] as u32);
            }
        }
        let mut mask_coords = Vec::new();
        let mut mask_offsets = vec![0u32];
        for mut axis in per_axis {
            axis.sort_unstable();
            axis.dedup();
            mask_coords.extend_from_slice(&axis);
            mask_offsets.push(mask_coords.len() as u32);
        }
        GridIndex {
            geom,
            order,
            cell_keys,
            cell_ranges,
            mask_coords,
            mask_offsets,
        }
    }

    pub fn k(&self) -> usize {
        self.geom.k()
    }

    fn mask(&self, axis: usize) -> &[u32] {
        &self.mask_coords[self.mask_offsets[axis] as usize..self.mask_offsets[axis + 1] as usize]
    }

    /// Cell coordinates (u32 per indexed dimension) of every point of `data`, for upload as
    /// query cells. Clamped into the grid, so points of another set are safe too.
    pub fn query_cells(&self, data: &Dataset, positions: &[u32]) -> Vec<u32> {
        let k = self.k();
        let mut out = vec![0u32; positions.len() * k];
        out.par_chunks_mut(k.max(1))
            .zip(positions.par_iter())
            .for_each_init(
                || vec![0u64; k],
                |coords, (dst, &p)| {
                    self.geom.point_coords(data, p as usize, coords);
                    for a in 0..k {
                        dst[a] = coords[a] as u32;
                    }
                },
            );
        out
    }

    /// Per indexed dimension, the coordinates among home-1, home, home+1 that hold points
    /// (the paper's O_j ∩ M_j).
    pub fn adjacent(&self, home: &[u32]) -> Vec<Vec<u32>> {
        (0..self.k())
            .map(|a| {
                let m = self.mask(a);
                let lo = home[a].saturating_sub(1);
                (lo..=home[a] + 1)
                    .filter(|c| m.binary_search(c).is_ok())
                    .collect()
            })
            .collect()
    }

    /// Visits the non-empty adjacent cells a query in cell `home` must search, as indices
    /// into `cell_keys`, exactly as the kernel does. `unicomp` (self-join): only the cells
    /// the odd/even pattern of GPU-SJ assigns to this cell, home cell excluded (the caller
    /// handles it); otherwise every adjacent cell, home included.
    pub fn for_each_adjacent(&self, home: &[u32], unicomp: bool, mut visit: impl FnMut(usize)) {
        let k = self.k();
        let adj = self.adjacent(home);
        let mut coords = vec![0u64; k];
        let mut lookup = |coords: &[u64]| {
            if let Ok(c) = self.cell_keys.binary_search(&self.geom.linear_id(coords)) {
                visit(c);
            }
        };
        if !unicomp {
            let total: usize = adj.iter().map(|v| v.len()).product();
            for combo in 0..total {
                let mut rest = combo;
                for a in (0..k).rev() {
                    coords[a] = adj[a][rest % adj[a].len()] as u64;
                    rest /= adj[a].len();
                }
                lookup(&coords);
            }
            return;
        }
        // unicomp: the cell with the odd coordinate in the highest dimension where two
        // adjacent cells differ evaluates the pair, so each unordered cell pair is seen once.
        for j in 0..k {
            if home[j] & 1 == 0 {
                continue;
            }
            let others: Vec<u32> = adj[j].iter().copied().filter(|&c| c != home[j]).collect();
            let total: usize = adj[..j].iter().map(|v| v.len()).product::<usize>() * others.len();
            for combo in 0..total {
                let mut rest = combo;
                for a in (0..k).rev() {
                    coords[a] = if a > j {
                        home[a] as u64
                    } else if a == j {
                        let c = others[rest % others.len()];
                        rest /= others.len();
                        c as u64
                    } else {
                        let c = adj[a][rest % adj[a].len()];
                        rest /= adj[a].len();
                        c as u64
                    };
                }
                lookup(&coords);
            }
        }
    }
}

/// What the cost model saw for one k.
#[derive(Clone, Debug)]
pub struct KCost {
    pub k: usize,
    pub nonempty_cells: usize,
    /// Estimated memory operations of cell searches and of distance comparisons (whole set).
    pub search_ops: f64,
    pub compare_ops: f64,
}

impl KCost {
    pub fn total(&self) -> f64 {
        self.search_ops + self.compare_ops
    }
}

/// GPU-JOIN's sampling cost model: for each k, search a sample of the queries through the
/// index, count the cells probed and the candidate points compared (mu), and scale by 1/f:
/// compare ops = mu/f * dim, search ops = probes/f * log2|G|. Returns the costs per k.
/// Each k keys and sorts every indexed point (a tenth of a second at 200,000 points, half
/// a second on CI's loaded cores, where a SIGINT once waited 2.9 s for the planning), so
/// `control` is checked before each k and after its sort.
#[allow(clippy::too_many_arguments)]
pub fn k_costs(
    indexed: &Dataset,
    queries: &Dataset,
    self_join: bool,
    dims: &[usize],
    lo: &[f64],
    hi: &[f64],
    eps: f64,
    control: &Control,
) -> Result<Vec<KCost>> {
    let kmax = dims.len().min(MAX_AUTO_K);
    let sample = sample_positions(queries.len(), 0.01, MAX_COST_SAMPLE);
    let f = sample.len() as f64 / queries.len().max(1) as f64;
    let mut out: Vec<KCost> = Vec::new();
    for k in 1..=kmax {
        control.check()?;
        let geom = geometry_for(&dims[..k], lo, hi, eps)?;
        if geom.k() < k {
            break; // linear ids would overflow: larger k cannot be indexed
        }
        // Cell sizes: the points' keys sorted on every thread, then counted in runs. (A
        // hash map filled by one thread took most of the H100 run's 1.5-3 s host index
        // build at 10M points.)
        let mut all = point_keys(indexed, &geom);
        all.par_sort_unstable();
        let (keys, sizes) = runs(&all);
        drop(all);
        control.check()?;
        let log_g = (keys.len().max(2) as f64).log2();
        let lite = skeleton(&geom, keys);
        let size_of = |key: u64| lite.cell_keys.binary_search(&key).map_or(0, |c| sizes[c]);
        // On every thread, summed as integers (twice the points compared: the home cell
        // adds halves), so the totals do not depend on the order.
        let (probes, twice_compared) = sample
            .par_iter()
            .map_init(
                || vec![0u64; k],
                |coords, &q| {
                    geom.point_coords(queries, q, coords);
                    let home: Vec<u32> = coords.iter().map(|&c| c as u32).collect();
                    let (p, cells) = lite.probe(&home, self_join);
                    // The skeleton's cells are `keys`, in order: cell c holds sizes[c].
                    let mut twice: u64 = cells.iter().map(|&c| 2 * u64::from(sizes[c])).sum();
                    if self_join {
                        // Home cell: half of its other points on average.
                        twice += u64::from(size_of(geom.linear_id(coords)).saturating_sub(1));
                    }
                    (p as u64, twice)
                },
            )
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let (probes, compared) = (probes as f64, twice_compared as f64 / 2.0);
        let cost = KCost {
            k,
            nonempty_cells: lite.cell_keys.len(),
            search_ops: probes / f * log_g,
            compare_ops: compared / f * indexed.dim() as f64,
        };
        let stop = out.iter().map(|c| c.total()).fold(f64::INFINITY, f64::min) < cost.search_ops;
        out.push(cost);
        if stop {
            break; // searching alone already costs more than the best k: larger k only worse
        }
    }
    Ok(out)
}

/// The distinct values of sorted `keys` and how many times each occurs.
fn runs(keys: &[u64]) -> (Vec<u64>, Vec<u32>) {
    let (mut distinct, mut counts) = (Vec::new(), Vec::new());
    for run in keys.chunk_by(|a, b| a == b) {
        distinct.push(run[0]);
        counts.push(run.len() as u32);
    }
    (distinct, counts)
}

/// The minimum of the cost model (smallest k on ties).
pub fn choose_k(costs: &[KCost]) -> usize {
    costs
        .iter()
        .min_by(|a, b| a.total().total_cmp(&b.total()).then(a.k.cmp(&b.k)))
        .map_or(1, |c| c.k)
}

/// An index with only the cell keys and masks: enough to count probes for the cost model.
fn skeleton(geom: &GridGeometry, keys: Vec<u64>) -> GridIndex {
    let mut masks = vec![Vec::new(); geom.k()];
    let mut c = vec![0u64; geom.k()];
    for &key in &keys {
        key_coords(geom, key, &mut c);
        for (a, m) in masks.iter_mut().enumerate() {
            m.push(c[a] as u32);
        }
    }
    let mut mask_offsets = vec![0u32];
    for m in &mut masks {
        m.sort_unstable();
        m.dedup();
        mask_offsets.push(mask_offsets.last().unwrap() + m.len() as u32);
    }
    GridIndex {
        geom: geom.clone(),
        order: Vec::new(),
        cell_keys: keys,
        cell_ranges: Vec::new(),
        mask_coords: masks.concat(),
        mask_offsets,
    }
}

impl GridIndex {
    /// (cells probed by binary search, indices of the non-empty ones found), as the kernel
    /// probes them (home cell excluded for the self-join: it is searched without a probe).
    fn probe(&self, home: &[u32], unicomp: bool) -> (usize, Vec<usize>) {
        let mut found = Vec::new();
        self.for_each_adjacent(home, unicomp, |c| found.push(c));
        let adj = self.adjacent(home);
        let probes = if unicomp {
            (0..home.len())
                .filter(|&j| home[j] & 1 == 1)
                .map(|j| {
                    adj[..j].iter().map(|v| v.len()).product::<usize>()
                        * adj[j].iter().filter(|&&c| c != home[j]).count()
                })
                .sum()
        } else {
            adj.iter().map(|v| v.len()).product()
        };
        (probes, found)
    }
}

/// Everything decided about the grid before the index is built.
pub struct GridPlan {
    pub geom: GridGeometry,
    /// Every dimension, by decreasing sampled variance (REORDER).
    pub variance_order: Vec<usize>,
    /// `top_quarter_variance_share` of the indexed set.
    pub top_quarter_share: f64,
    pub sort_dim: Option<usize>,
    pub costs: Vec<KCost>,
}

/// Chooses the indexed dimensions (REORDER + cost model, or `forced_k`) and the SORTIDU
/// dimension for a join indexing `indexed` and querying `queries`.
pub fn plan_grid(
    indexed: &Dataset,
    queries: &Dataset,
    self_join: bool,
    eps: f64,
    forced_k: Option<usize>,
    control: &Control,
) -> Result<GridPlan> {
    let variances = sampled_variances(indexed);
    let dims = order_by_variance(&variances);
    // The indexed set's bounds give the tightest grid; queries of another set outside
    // them are clamped into the grid, which keeps them correct (see grid.rs).
    let (lo, hi) = bounds(indexed);
    let (k, costs) = match forced_k {
        Some(k) => (k.min(dims.len()), Vec::new()),
        None => {
            let costs = k_costs(indexed, queries, self_join, &dims, &lo, &hi, eps, control)?;
            (choose_k(&costs), costs)
        }
    };
    let geom = geometry_for(&dims[..k], &lo, &hi, eps)?;
    // SORTIDU on the highest-variance dimension that is not indexed; with every
    // dimension indexed, on the first indexed one (the paper allows both).
    let sort_dim = dims.get(geom.k()).copied().or(dims.first().copied());
    Ok(GridPlan {
        geom,
        variance_order: dims,
        top_quarter_share: top_quarter_variance_share(&variances),
        sort_dim,
        costs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{threshold, within};
    use crate::options::Metric;
    use crate::oracle;

    /// Host emulation of the search kernel (same cells, same unicomp, SORTIDU skipped):
    /// checks the index and the adjacency pattern against the oracle without a GPU.
    fn emulate_self_join(data: &Dataset, idx: &GridIndex, eps: f64) -> Vec<[u32; 2]> {
        let thr: f64 = threshold(Metric::Euclidean, eps);
        let Coords64(x) = coords64(data);
        let d = data.dim();
        let pt = |id: u32| &x[id as usize * d..(id as usize + 1) * d];
        let cells = idx.query_cells(data, &idx.order);
        let mut out = Vec::new();
        for pos in 0..idx.order.len() {
            let me = idx.order[pos];
            let home = &cells[pos * idx.k()..(pos + 1) * idx.k()];
            let own = idx.cell_ranges[idx.cell_ranges.partition_point(|r| r[1] as usize <= pos)];
            let mut check = |q: usize| {
                let other = idx.order[q];
                if within(Metric::Euclidean, pt(me), pt(other), thr) {
                    out.push([me.min(other), me.max(other)]);
                }
            };
            for q in pos + 1..own[1] as usize {
                check(q);
            }
            idx.for_each_adjacent(home, true, |c| {
                let r = idx.cell_ranges[c];
                for q in r[0] as usize..r[1] as usize {
                    check(q);
                }
            });
        }
        out.sort_unstable();
        out
    }

    struct Coords64(Vec<f64>);
    fn coords64(data: &Dataset) -> Coords64 {
        Coords64(
            (0..data.len() * data.dim())
                .map(|t| data.get(t / data.dim(), t % data.dim()))
                .collect(),
        )
    }

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn unicomp_emulation_matches_oracle() {
        let mut seed = 7;
        // Coordinates on a 0.1 lattice: many pairs exactly eps apart and on cell edges.
        for (n, d, eps, k) in [
            (300, 2, 0.1, 2),
            (400, 3, 0.2, 3),
            (300, 5, 0.3, 2),
            (200, 4, 0.25, 4),
            (300, 3, 0.1, 1),
        ] {
            let pts: Vec<f64> = (0..n * d)
                .map(|_| (lcg(&mut seed) * 10.0).round() / 10.0)
                .collect();
            let data = Dataset::from_f64(&pts, d).unwrap();
            let plan = plan_grid(&data, &data, true, eps, Some(k), &Control::default()).unwrap();
            let idx = GridIndex::build(&data, plan.geom, plan.sort_dim);
            let got = emulate_self_join(&data, &idx, eps);
            let want = oracle::self_join(&data, Metric::Euclidean, eps);
            assert!(
                want.len() > 50,
                "too few pairs to test anything: {}",
                want.len()
            );
            assert_eq!(got, want, "n={n} d={d} k={k}");
        }
    }

    #[test]
    fn index_arrays_are_consistent() {
        let pts: Vec<f64> = vec![0.0, 0.0, 0.05, 0.0, 1.0, 1.0, 0.0, 0.0, 3.0, 0.5];
        let data = Dataset::from_f64(&pts, 2).unwrap();
        let plan = plan_grid(&data, &data, true, 0.1, Some(2), &Control::default()).unwrap();
        let idx = GridIndex::build(&data, plan.geom, plan.sort_dim);
        assert!(idx.cell_keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(idx.cell_ranges.last().unwrap()[1], 5);
        let mut seen = idx.order.clone();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(idx.mask_offsets.len(), 3);
    }

    /// A stopped job's planning ends at its next check: the cost model's first k.
    #[test]
    fn a_stop_ends_the_planning() {
        let mut seed = 5;
        let (n, d) = (3000, 8);
        let pts: Vec<f64> = (0..n * d).map(|_| lcg(&mut seed)).collect();
        let data = Dataset::from_f64(&pts, d).unwrap();
        let control = Control::new();
        assert!(plan_grid(&data, &data, true, 0.3, None, &control).is_ok());
        control.cancel();
        let stopped = plan_grid(&data, &data, true, 0.3, None, &control);
        assert!(stopped.is_err_and(|e| e.kind() == crate::error::ErrorKind::Cancelled));
    }

    #[test]
    fn cost_model_prefers_few_dims_on_high_dim_uniform() {
        let mut seed = 3;
        let (n, d) = (2000, 32);
        let pts: Vec<f64> = (0..n * d).map(|_| lcg(&mut seed)).collect();
        let data = Dataset::from_f64(&pts, d).unwrap();
        let plan = plan_grid(&data, &data, true, 0.3, None, &Control::default()).unwrap();
        assert!(plan.geom.k() >= 1 && plan.geom.k() <= MAX_AUTO_K);
        assert!(!plan.costs.is_empty());
        assert_eq!(plan.geom.k(), choose_k(&plan.costs));
    }

    /// The cost model against a plain one-thread version of it (cell sizes in a hash map,
    /// sums in query order): the same cells, probes and comparisons for every k, on
    /// clustered data with duplicates, self-join and A ⋈ B.
    #[test]
    fn cost_model_counts_match_a_serial_reference() {
        use std::collections::HashMap;
        fn reference(
            r: &Dataset,
            q: &Dataset,
            self_join: bool,
            eps: f64,
        ) -> Vec<(usize, f64, f64)> {
            let dims = order_by_variance(&sampled_variances(r));
            let (lo, hi) = bounds(r);
            let sample = sample_positions(q.len(), 0.01, MAX_COST_SAMPLE);
            let f = sample.len() as f64 / q.len() as f64;
            let mut out = Vec::new();
            for k in 1..=dims.len().min(MAX_AUTO_K) {
                let geom = geometry_for(&dims[..k], &lo, &hi, eps).unwrap();
                let mut sizes: HashMap<u64, u32> = HashMap::new();
                for key in point_keys(r, &geom) {
                    *sizes.entry(key).or_default() += 1;
                }
                let mut keys: Vec<u64> = sizes.keys().copied().collect();
                keys.sort_unstable();
                let lite = skeleton(&geom, keys);
                let (mut probes, mut compared) = (0f64, 0f64);
                let mut coords = vec![0u64; k];
                for &i in &sample {
                    geom.point_coords(q, i, &mut coords);
                    let home: Vec<u32> = coords.iter().map(|&c| c as u32).collect();
                    let (p, cells) = lite.probe(&home, self_join);
                    probes += p as f64;
                    compared += cells
                        .iter()
                        .map(|&c| sizes[&lite.cell_keys[c]] as f64)
                        .sum::<f64>();
                    if self_join {
                        compared += (sizes[&geom.linear_id(&coords)] as f64 - 1.0) / 2.0;
                    }
                }
                let log_g = (sizes.len().max(2) as f64).log2();
                out.push((
                    sizes.len(),
                    probes / f * log_g,
                    compared / f * r.dim() as f64,
                ));
            }
            out
        }
        let mut seed = 11;
        for (n, d, eps) in [(6000, 2, 0.02), (5000, 3, 0.05), (4000, 5, 0.1)] {
            // Five tight clusters, a tenth of the points repeated.
            let centres: Vec<f64> = (0..5 * d).map(|_| lcg(&mut seed)).collect();
            let mut pts: Vec<f64> = (0..n * d)
                .map(|t| centres[(t / d % 5) * d + t % d] + 0.05 * lcg(&mut seed))
                .collect();
            for i in 0..n / 10 {
                let (from, to) = (i * d, (n - 1 - i) * d);
                pts.copy_within(from..from + d, to);
            }
            let a = Dataset::from_f64(&pts, d).unwrap();
            let b = Dataset::from_f64(&pts[..n / 2 * d], d).unwrap();
            for (r, q, self_join) in [(&a, &a, true), (&b, &a, false)] {
                let dims = order_by_variance(&sampled_variances(r));
                let (lo, hi) = bounds(r);
                let got =
                    k_costs(r, q, self_join, &dims, &lo, &hi, eps, &Control::default()).unwrap();
                let want = reference(r, q, self_join, eps);
                assert!(!got.is_empty());
                for c in &got {
                    let w = want[c.k - 1];
                    assert_eq!(
                        (c.nonempty_cells, c.search_ops, c.compare_ops),
                        w,
                        "n {n} d {d} k {}",
                        c.k
                    );
                }
            }
        }
    }

    #[test]
    fn overflowing_linear_ids_drop_dimensions() {
        // 8 dims each needing ~2^31 cells: 2^248 cells cannot be a u64 id.
        let lo = vec![0.0; 8];
        let hi = vec![1.0e9; 8];
        let g = geometry_for(&[0, 1, 2, 3, 4, 5, 6, 7], &lo, &hi, 0.5).unwrap();
        assert!(g.total_cells().is_some());
        assert!(g.k() < 8 && g.k() >= 1);
    }

    #[test]
    fn variance_orders_dims() {
        let pts: Vec<f64> = (0..500)
            .flat_map(|i| [0.0, i as f64, (i % 7) as f64])
            .collect();
        let data = Dataset::from_f64(&pts, 3).unwrap();
        let var = sampled_variances(&data);
        assert_eq!(order_by_variance(&var), vec![1, 2, 0]);
        assert!(top_quarter_variance_share(&var) > 0.5);
    }
}
