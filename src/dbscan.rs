//! DBSCAN on the eps-join, in O(n) memory beyond the input, on any backend.
//!
//! The answer (deterministic, the same on every backend, bit for bit):
//! - a point is a *core* point when at least `min_samples` points lie within eps of it,
//!   the point itself included (scikit-learn's count); "within eps" is the join's match
//!   test (`metric.rs`: input precision, canonical order, `<=`);
//! - core points within eps of each other are in the same cluster (the connected
//!   components of the core-core pairs);
//! - a non-core point with a core point within eps is a *border* point: it goes to the
//!   cluster of its nearest core neighbour by `metric::distance_acc` in the input
//!   precision, equal distances to the smaller index;
//! - every other point is noise (label -1);
//! - clusters are numbered 0, 1, ... in the order of their smallest member index (core or
//!   border): the cluster holding the smallest clustered point index is 0, and so on.
//!
//! How: one streamed pass over the self-join (`Engine::self_join_stream`), whose pairs are
//! consumed chunk by chunk as the backend produces them and never collected. The pass
//! counts each point's neighbours and links (union-find: path halving, the smaller root
//! index wins) every pair whose two points have both already reached min_samples
//! neighbours, the pair's whole chunk counted (counts only grow, so both are core
//! points); any other pair is kept until the counts are final. A pair is kept only while
//! one of its points is still short of min_samples, so at most min_samples - 2 pairs per
//! point are kept; they are kept up to a budget of 8 per point (64 bytes per point, so one
//! pass is certain up to min_samples = 10), and beyond it they are dropped and a second
//! pass over the join does their work. The kept pairs (or the second pass) then link
//! core-core pairs and give each non-core point its nearest core neighbour. On a GPU the
//! counts are made on the device instead (`Engine::neighbour_counts`: a count-only search
//! of every adjacent cell, one count per point read back, no pairs), so the host never
//! counts; the second pass then links core points in a union-find on the device as well
//! (`JoinBackend::link`), and only pairs of a core and a non-core point (border
//! candidates) and the rare link the device left undone come to the host, which finishes
//! the forest and gives border points their nearest core point. From 2^19 points on, the join runs on a copy of
//! the points in Z-order, so that the per-point arrays are updated in cache order (10M
//! clustered 2-D points on 2 cores: 6.8 s -> 4.3 s); labels and ties are in the input's
//! indices either way.
//!
//! Memory beyond the input and the answer (labels, core flags), whatever the number of
//! pairs: about 30 bytes per point plus one coordinate (neighbour counts, union-find
//! parents, core flags, each point's nearest core point and its distance, cluster
//! numbers), the kept pairs (at most 64 bytes per point), and from 2^19 points the
//! reordered copy of the input and its order (16 bytes per point while sorting).
//!
//! With sample weights ([`dbscan_weighted`], scikit-learn's `sample_weight`) a point is core
//! when the weights within eps, its own included, sum to at least min_samples: the sums
//! are exact (fixed point) so the answer keeps not depending on the pairs' order; a first
//! pass sums them (32 bytes per point more), a second links.
//!
//! A free function rather than an `Engine` method: DBSCAN is a client of the engine's public
//! streaming interface and needs nothing inside it, so the engine stays as it is.

use crate::cpu::prefetch;
use crate::dataset::{Coords, Dataset};
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::metric::{distance_acc, Coord};
use crate::options::{Algorithm, Backend, JoinOptions, Metric};
use crate::result::{JoinReport, Pair, PairSink};
use std::time::Instant;

/// How to run DBSCAN.
#[derive(Clone, Debug, PartialEq)]
pub struct DbscanOptions {
    /// Neighbourhood radius: finite and > 0 (a point within eps is a neighbour, `<=`).
    pub eps: f64,
    /// Neighbours (the point itself included) that make a point a core point: >= 1.
    pub min_samples: usize,
    pub metric: Metric,
    /// `Metric::Haversine`: the sphere's radius in metres (eps is metres on it);
    /// [`crate::metric::EARTH_RADIUS_M`] by default.
    pub sphere_radius: f64,
    pub backend: Backend,
    /// The join's algorithm (`JoinOptions::algorithm`): the answer is the same whichever
    /// runs; `Auto` lets the engine choose.
    pub algorithm: Algorithm,
    /// Stops and watches every pass (see [`crate::control`]; the default is inert).
    pub control: crate::control::Control,
}

impl DbscanOptions {
    /// `eps` and `min_samples` with the defaults for the rest (Euclidean, automatic
    /// backend and algorithm).
    pub fn new(eps: f64, min_samples: usize) -> Self {
        DbscanOptions {
            eps,
            min_samples,
            metric: Metric::default(),
            sphere_radius: crate::metric::EARTH_RADIUS_M,
            backend: Backend::default(),
            algorithm: Algorithm::default(),
            control: crate::control::Control::default(),
        }
    }

    /// Checks what can be checked without the data.
    pub fn validate(&self) -> Result<()> {
        if !self.eps.is_finite() || self.eps <= 0.0 {
            return Err(Error::invalid(format!(
                "eps must be a finite number > 0 (got {})",
                self.eps
            )));
        }
        if self.algorithm == Algorithm::KdTree {
            return Err(Error::invalid(
                "'kdtree' is a k-nearest-neighbour algorithm; DBSCAN's join uses auto, grid, ego, brute or lss",
            ));
        }
        if self.min_samples < 1 {
            return Err(Error::invalid(format!(
                "min_samples must be >= 1 (got {})",
                self.min_samples
            )));
        }
        Ok(())
    }
}

/// The clustering.
#[derive(Clone, Debug)]
pub struct DbscanResult {
    /// Each point's cluster (0, 1, ...) or -1 for noise.
    pub labels: Vec<i64>,
    /// Whether each point is a core point.
    pub core: Vec<bool>,
    /// Number of clusters.
    pub clusters: usize,
    /// Number of noise points (label -1).
    pub noise: usize,
    /// Number of core points.
    pub core_points: usize,
    /// What ran: `pairs` is the number of unique pairs of the eps-join, `seconds` the whole
    /// clustering, `phases` its passes; backend, device and algorithm those of the join.
    pub report: JoinReport,
}

impl DbscanResult {
    /// The core points' indices, ascending (scikit-learn's `core_sample_indices_`).
    pub fn core_indices(&self) -> Vec<usize> {
        (0..self.core.len()).filter(|&i| self.core[i]).collect()
    }
}

/// DBSCAN of `data` (see the module documentation for the exact answer).
pub fn dbscan(engine: &Engine, data: &Dataset, opts: &DbscanOptions) -> Result<DbscanResult> {
    dbscan_weighted(engine, data, opts, None)
}

/// [`dbscan`] with a weight per point (scikit-learn's `sample_weight`): a point is a core
/// point when the weights of the points within eps, its own included, sum to at least
/// `min_samples`. Weights may be fractional, zero or negative (a negative weight keeps
/// its neighbours from being core); they must be finite and below 2^63 in magnitude.
/// The sums are exact and independent of the order the pairs come in (fixed point with
/// enough bits for both ends of the weights' range), so the answer is deterministic; scikit-learn rounds its float sums, so
/// where a sum falls within rounding of min_samples it can decide otherwise (ten
/// neighbours of weight 0.1 sum to 1.0000000000000000555 here, to 0.9999999999999999 in
/// NumPy). Clusters, border points and noise follow as without weights. Counting needs
/// its own pass over the join (the running sums of possibly negative weights prove
/// nothing before the end), then a second pass links; neither keeps pairs. `None`: every
/// weight 1, which is [`dbscan`].
pub fn dbscan_weighted(
    engine: &Engine,
    data: &Dataset,
    opts: &DbscanOptions,
    sample_weight: Option<&[f64]>,
) -> Result<DbscanResult> {
    dbscan_reordered_weighted(engine, data, opts, data.len() >= REORDER_MIN, sample_weight)
}

/// [`dbscan`], with the Z-order copy of the points made or not whatever their number (for
/// the tests: the answer must not depend on it).
#[doc(hidden)]
pub fn dbscan_reordered(
    engine: &Engine,
    data: &Dataset,
    opts: &DbscanOptions,
    reorder: bool,
) -> Result<DbscanResult> {
    dbscan_reordered_weighted(engine, data, opts, reorder, None)
}

/// [`dbscan_weighted`] with the reordering chosen (tests).
#[doc(hidden)]
pub fn dbscan_reordered_weighted(
    engine: &Engine,
    data: &Dataset,
    opts: &DbscanOptions,
    reorder: bool,
    sample_weight: Option<&[f64]>,
) -> Result<DbscanResult> {
    opts.validate()?;
    if let Some(w) = sample_weight {
        check_weights(w, data.len())?;
    }
    match data.coords() {
        Coords::F32(x) => run(engine, data.dim(), x, opts, reorder, sample_weight),
        Coords::F64(x) => run(engine, data.dim(), x, opts, reorder, sample_weight),
    }
}

/// Largest |weight| accepted: 2^63, so that 2^32 points' weights sum without overflow in
/// [`Fixed`] at a resolution of 2^-31 or finer.
const MAX_WEIGHT: f64 = (1u64 << 63) as f64;

fn check_weights(w: &[f64], n: usize) -> Result<()> {
    if w.len() != n {
        return Err(Error::invalid(format!(
            "sample_weight has {} entries for {n} points",
            w.len()
        )));
    }
    if let Some(i) = w.iter().position(|x| x.is_nan() || x.abs() >= MAX_WEIGHT) {
        return Err(Error::invalid(format!(
            "sample_weight[{i}] = {} is not a finite number below 2^63 in magnitude",
            w[i]
        )));
    }
    Ok(())
}

/// Exact sums of f64 weights whatever their order: each weight as a signed fixed-point
/// number with `shift` fraction bits, chosen from the largest |weight| (< 2^e) as 94 - e,
/// so that 2^32 of them stay below 2^126. A weight converts exactly unless it is more than
/// 2^41 times smaller than the largest; then it is truncated toward zero by less than
/// 2^(e-94) (the sum of all such errors is below 2^(e-62)).
struct Fixed {
    shift: i32,
}

impl Fixed {
    fn new(weights: &[f64]) -> Self {
        let max = weights.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        // max < 2^e (for 0 any e will do).
        let e = if max == 0.0 {
            0
        } else {
            (((max.to_bits() >> 52) & 0x7ff) as i32 - 1022).max(-1021)
        };
        Fixed { shift: 94 - e }
    }

    /// `w * 2^shift`, exact where w's last bit is at least 2^-shift, else truncated.
    fn to_fixed(&self, w: f64) -> i128 {
        if w == 0.0 {
            return 0;
        }
        let bits = w.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32;
        let frac = (bits & ((1u64 << 52) - 1)) as i128;
        // w = m * 2^k with m an integer.
        let (m, k) = if exp == 0 {
            (frac, -1074)
        } else {
            (frac | (1i128 << 52), exp - 1075)
        };
        let s = k + self.shift;
        let v = if s >= 0 {
            // No overflow: |w| < 2^e, so m * 2^(k + shift) < 2^(e + shift) = 2^94.
            m << s
        } else if s > -127 {
            m >> -s
        } else {
            0
        };
        if w < 0.0 {
            -v
        } else {
            v
        }
    }

    /// `min_samples * 2^shift`; `None` where that exceeds every possible sum (no core
    /// points).
    fn threshold(&self, min_samples: usize) -> Option<i128> {
        let m = min_samples as i128;
        let bits = 128 - m.leading_zeros() as i32;
        (self.shift >= 0 && bits + self.shift <= 126).then(|| m << self.shift)
    }
}

/// The weighted count pass: each pair adds each point's fixed-point weight to the other's
/// sum (each sum starts at the point's own weight). Links wait for the second pass.
struct WeightSink<'a> {
    weight: &'a [i128],
    sum: &'a mut [i128],
}

impl PairSink for WeightSink<'_> {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        for &[i, j] in chunk {
            // No overflow: |sum| <= 2^32 * 2^94 (see `Fixed`).
            self.sum[i as usize] += self.weight[j as usize];
            self.sum[j as usize] += self.weight[i as usize];
        }
        Ok(())
    }
}

fn alloc<T: Clone>(len: usize, fill: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::new(
            ErrorKind::OutOfHostMemory,
            format!("cannot allocate the DBSCAN {what} ({len} entries)"),
        )
    })?;
    v.resize(len, fill);
    Ok(v)
}

/// Pairs kept per point at most (64 bytes per point) before DBSCAN gives up on a single
/// pass over the join. A pair is kept only while one of its points has fewer than
/// min_samples neighbours so far (its chunk counted), at most min_samples - 2 times per
/// point: up to min_samples = 10 one pass is certain.
const DEFERRED_PER_POINT: usize = 8;

/// Kept pairs, in chunks (no regrowing of one large array), up to a budget.
struct Deferred {
    chunks: Vec<Vec<Pair>>,
    len: usize,
    budget: usize,
    /// The budget was exceeded: the chunks were dropped.
    overflow: bool,
}

impl Deferred {
    const CHUNK: usize = 1 << 16;

    fn new(budget: usize) -> Self {
        Deferred {
            chunks: Vec::new(),
            len: 0,
            budget,
            overflow: false,
        }
    }

    #[inline]
    fn push(&mut self, pair: Pair) {
        if self.overflow {
            return;
        }
        if self.len == self.budget {
            return self.give_up();
        }
        match self.chunks.last_mut() {
            Some(c) if c.len() < c.capacity() => c.push(pair),
            _ => {
                let mut c = Vec::new();
                if c.try_reserve_exact(Self::CHUNK).is_err() {
                    return self.give_up();
                }
                c.push(pair);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    #[cold]
    fn give_up(&mut self) {
        self.overflow = true;
        self.chunks = Vec::new();
    }
}

/// The single pass: every pair adds a neighbour to both of its points; a pair whose two
/// points have both reached min_samples (counts only grow: they are core points) is linked
/// at once, any other is kept until the core flags are final. A chunk is counted whole
/// before any of its pairs is decided: fewer pairs wait than when deciding pair by pair,
/// and the counting loop has no branch.
struct CountSink<'a> {
    degree: &'a mut [u32],
    parent: &'a mut [u32],
    threshold: u32,
    deferred: &'a mut Deferred,
}

impl PairSink for CountSink<'_> {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        for &[i, j] in chunk {
            // No overflow: a degree is at most n < 2^32 (the self count included).
            self.degree[i as usize] += 1;
            self.degree[j as usize] += 1;
        }
        for &[i, j] in chunk {
            // One parent: already linked, so both are core points (only they are linked)
            // and the pair has nothing left to do: most pairs in a dense cluster.
            if self.parent[i as usize] == self.parent[j as usize] {
                continue;
            }
            if self.degree[i as usize] >= self.threshold
                && self.degree[j as usize] >= self.threshold
            {
                link(self.parent, i, j);
            } else {
                self.deferred.push([i, j]);
            }
        }
        Ok(())
    }
}

/// Links the sets of `i` and `j`: the smaller root stays a root (union by index).
#[inline(always)]
fn union(parent: &mut [u32], i: u32, j: u32) {
    // Most core-core pairs are already linked, and often share a parent: skipping them
    // before the finds cut the union-find's time by about 40% (10^5 clustered 2-D points).
    if parent[i as usize] != parent[j as usize] {
        link(parent, i, j);
    }
}

/// [`union`] past its shortcut.
fn link(parent: &mut [u32], i: u32, j: u32) {
    let a = find(parent, i);
    let b = find(parent, j);
    if a < b {
        parent[b as usize] = a;
    } else if b < a {
        parent[a as usize] = b;
    }
}

/// Union-find root of `x`, halving the path on the way.
#[inline]
fn find(parent: &mut [u32], mut x: u32) -> u32 {
    loop {
        let p = parent[x as usize];
        if p == x {
            return x;
        }
        let grand = parent[p as usize];
        parent[x as usize] = grand;
        x = grand;
    }
}

/// Once the core flags are known: core-core pairs are linked, a core neighbour of a
/// non-core point is offered to it as its nearest core point.
struct LinkSink<'a, T: Coord> {
    x: &'a [T],
    dim: usize,
    metric: Metric,
    core: &'a [bool],
    parent: &'a mut [u32],
    /// The original index of each position (ties between core points go to the smaller);
    /// empty: positions are the original indices.
    orig: &'a [u32],
    /// For a non-core point: its nearest core neighbour so far (`u32::MAX`: none) and the
    /// accumulated distance to it.
    nearest: &'a mut [u32],
    nearest_acc: &'a mut [T],
}

impl<T: Coord> LinkSink<'_, T> {
    #[inline]
    fn offer(&mut self, p: u32, c: u32) {
        let (p, dim) = (p as usize, self.dim);
        let acc = distance_acc(
            self.metric,
            &self.x[p * dim..(p + 1) * dim],
            &self.x[c as usize * dim..(c as usize + 1) * dim],
        );
        let best = self.nearest[p];
        if best == u32::MAX
            || acc < self.nearest_acc[p]
            || (acc == self.nearest_acc[p] && original(self.orig, c) < original(self.orig, best))
        {
            self.nearest[p] = c;
            self.nearest_acc[p] = acc;
        }
    }
}

/// The original index of position `p` (`orig` empty: the points were not reordered).
#[inline]
fn original(orig: &[u32], p: u32) -> u32 {
    if orig.is_empty() {
        p
    } else {
        orig[p as usize]
    }
}

/// How many pairs ahead the link pass prefetches the points' rows.
const LINK_PREFETCH: usize = 8;

impl<T: Coord> PairSink for LinkSink<'_, T> {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        for (k, &[i, j]) in chunk.iter().enumerate() {
            // The points' rows are read at random: start loading those of a later pair.
            if let Some(&[a, b]) = chunk.get(k + LINK_PREFETCH) {
                prefetch(&self.x[a as usize * self.dim..]);
                prefetch(&self.x[b as usize * self.dim..]);
            }
            match (self.core[i as usize], self.core[j as usize]) {
                (true, true) => union(self.parent, i, j),
                (true, false) => self.offer(j, i),
                (false, true) => self.offer(i, j),
                (false, false) => {}
            }
        }
        Ok(())
    }
}

/// Spreads the low 32 bits of `v` to the even bits of a u64.
fn spread2(v: u64) -> u64 {
    let mut x = v & 0xFFFF_FFFF;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    (x | (x << 1)) & 0x5555_5555_5555_5555
}

/// Spreads the low 21 bits of `v` to every third bit of a u64.
fn spread3(v: u64) -> u64 {
    let mut x = v & 0x1F_FFFF;
    x = (x | (x << 32)) & 0x001F_0000_0000_FFFF;
    x = (x | (x << 16)) & 0x001F_0000_FF00_00FF;
    x = (x | (x << 8)) & 0x100F_00F0_0F00_F00F;
    x = (x | (x << 4)) & 0x10C3_0C30_C30C_30C3;
    (x | (x << 2)) & 0x1249_2492_4924_9249
}

/// Inputs at least this large are clustered in Z-order (below it the per-point arrays stay
/// in cache and reordering costs as much as it saves). Measured on 2 cores, clustered 2-D
/// points: 10^5 points 0.033 s -> 0.041 s with it, 3 x 10^5 even (0.22 s), 10^6 points
/// 1.02 s -> 0.50 s; with the radix-sorted key (0.5x the reordering's time), 10^5 points
/// still even: 12.5 vs 12.4 ms in 2-D, 16.2 vs 16.2 ms in 3-D (means of 5 alternating
/// medians of 30 runs each).
const REORDER_MIN: usize = 1 << 19;

/// The points in Z-order over (up to) their three widest dimensions: `(orig, sorted)` where
/// `orig[p]` is the original index of the point at position p and `sorted` their
/// coordinates in that order. Neighbours then have nearby positions, so the per-point
/// arrays the sinks update are touched in cache-friendly order (the pairs' indices would
/// otherwise be scattered over the whole input), and the join's own index is built from
/// nearly sorted points. The key is the Z-order's top 32 bits (cells far smaller than eps
/// at any n this runs on), sorted by the engine's radix sort, which is stable: equal keys
/// stay in index order, so the order is deterministic. Runs on the engine's threads.
fn spatial_order<T: Coord>(
    engine: &Engine,
    x: &[T],
    n: usize,
    dim: usize,
) -> Result<(Vec<u32>, Vec<T>)> {
    use rayon::prelude::*;
    let oom = |what: &str| {
        Error::new(
            ErrorKind::OutOfHostMemory,
            format!("cannot allocate the DBSCAN {what} ({n} points)"),
        )
    };
    engine.install(|| {
        let (lo, hi) = x
            .par_chunks(dim * 4096)
            .map(|block| {
                let mut lo = vec![f64::INFINITY; dim];
                let mut hi = vec![f64::NEG_INFINITY; dim];
                for row in block.chunks_exact(dim) {
                    for (k, &v) in row.iter().enumerate() {
                        lo[k] = lo[k].min(v.to_f64());
                        hi[k] = hi[k].max(v.to_f64());
                    }
                }
                (lo, hi)
            })
            .reduce(
                || (vec![f64::INFINITY; dim], vec![f64::NEG_INFINITY; dim]),
                |(mut lo, mut hi), (l, h)| {
                    for k in 0..dim {
                        lo[k] = lo[k].min(l[k]);
                        hi[k] = hi[k].max(h[k]);
                    }
                    (lo, hi)
                },
            );
        let mut dims: Vec<usize> = (0..dim).collect();
        dims.sort_by(|&a, &b| (hi[b] - lo[b]).total_cmp(&(hi[a] - lo[a])).then(a.cmp(&b)));
        dims.truncate(3);
        // Bits per dimension of a 32-bit key: 32, 16, or 10 (the top 30 of 3 x 21 used).
        let bits: u32 = match dims.len() {
            1 => 32,
            2 => 16,
            _ => 10,
        };
        let top = (1u64 << bits) - 1;
        let scale: Vec<f64> = dims
            .iter()
            .map(|&k| {
                if hi[k] > lo[k] {
                    top as f64 / (hi[k] - lo[k])
                } else {
                    0.0
                }
            })
            .collect();
        let key = |row: &[T]| -> u32 {
            let mut q = [0u64; 3];
            for (c, &k) in dims.iter().enumerate() {
                q[c] = (((row[k].to_f64() - lo[k]) * scale[c]) as u64).min(top);
            }
            (match dims.len() {
                1 => q[0],
                2 => spread2(q[0]) | (spread2(q[1]) << 1),
                _ => spread3(q[0]) | (spread3(q[1]) << 1) | (spread3(q[2]) << 2),
            }) as u32
        };
        let mut keyed: Vec<crate::result::Pair> = Vec::new();
        keyed.try_reserve_exact(n).map_err(|_| oom("sort keys"))?;
        x.par_chunks_exact(dim)
            .enumerate()
            .map(|(i, row)| [key(row), i as u32])
            .collect_into_vec(&mut keyed);
        crate::result::radix::sort_by_first(&mut keyed);
        let mut orig: Vec<u32> = Vec::new();
        orig.try_reserve_exact(n).map_err(|_| oom("point order"))?;
        keyed
            .par_iter()
            .map(|&[_, i]| i)
            .collect_into_vec(&mut orig);
        drop(keyed);
        let mut sorted: Vec<T> = Vec::new();
        sorted
            .try_reserve_exact(x.len())
            .map_err(|_| oom("reordered points"))?;
        sorted.resize(x.len(), T::ZERO);
        sorted
            .par_chunks_mut(dim * 1024)
            .zip(orig.par_chunks(1024))
            .for_each(|(out, ids)| {
                for (row, &i) in out.chunks_exact_mut(dim).zip(ids) {
                    row.copy_from_slice(&x[i as usize * dim..(i as usize + 1) * dim]);
                }
            });
        Ok((orig, sorted))
    })?
}

/// A coordinate type whose slices make a `Dataset`.
trait Points: Coord {
    fn dataset(x: &[Self], dim: usize) -> Result<Dataset<'_>>;
}
impl Points for f32 {
    fn dataset(x: &[Self], dim: usize) -> Result<Dataset<'_>> {
        Dataset::from_f32(x, dim)
    }
}
impl Points for f64 {
    fn dataset(x: &[Self], dim: usize) -> Result<Dataset<'_>> {
        Dataset::from_f64(x, dim)
    }
}

fn run<T: Points>(
    engine: &Engine,
    dim: usize,
    x: &[T],
    opts: &DbscanOptions,
    reorder: bool,
    sample_weight: Option<&[f64]>,
) -> Result<DbscanResult> {
    let start = Instant::now();
    let n = x.len() / dim;
    let mut join = JoinOptions::new(opts.eps);
    join.metric = opts.metric;
    join.sphere_radius = opts.sphere_radius;
    join.backend = opts.backend;
    join.algorithm = opts.algorithm;
    join.control = opts.control.clone();
    join.validate()?;
    // A stopped control ends the call before the Z-order copy (200,000 32-D points took
    // over 50 ms to copy under AddressSanitizer, tests/c/test_cancel.c).
    opts.control.check()?;
    let mut report = JoinReport::default();
    let mut phases = Vec::new();

    // Large inputs in Z-order (a copy: the input stays as it is); `orig` maps back (empty
    // when the points keep their order).
    let t = Instant::now();
    let reorder = reorder && n > 1;
    let (orig, sorted) = if reorder {
        spatial_order(engine, x, n, dim)?
    } else {
        (Vec::new(), Vec::new())
    };
    let xs: &[T] = if reorder { &sorted } else { x };
    let data = T::dataset(xs, dim)?;
    if reorder {
        phases.push(("spatial order".to_string(), t.elapsed().as_secs_f64()));
        opts.control.check()?;
    }

    // The join: neighbour counts (the point itself included), core-core links where both
    // points had already reached min_samples, the other pairs kept for later within a
    // budget. With fewer than two points there is no pair.
    let threshold = u32::try_from(opts.min_samples).unwrap_or(u32::MAX);
    let mut degree: Vec<u32> = alloc(n, 1u32, "neighbour counts")?;
    let mut parent: Vec<u32> = alloc(n, 0u32, "union-find")?;
    for (i, p) in parent.iter_mut().enumerate() {
        *p = i as u32;
    }
    let mut deferred = Deferred::new(n.saturating_mul(DEFERRED_PER_POINT));
    // With weights: exact fixed-point sums, in the positions' order, counted in a pass of
    // their own (`WeightSink`); the core flags come from them below.
    let mut weighted_core: Option<Vec<bool>> = None;
    if let Some(w) = sample_weight {
        let t = Instant::now();
        let fixed = Fixed::new(w);
        let mut weight: Vec<i128> = alloc(n, 0i128, "weights")?;
        for (p, wp) in weight.iter_mut().enumerate() {
            *wp = fixed.to_fixed(w[original(&orig, p as u32) as usize]);
        }
        let mut sum = weight.clone();
        if n > 1 {
            let mut sink = WeightSink {
                weight: &weight,
                sum: &mut sum,
            };
            report = engine.self_join_stream(&data, &join, &mut sink)?;
        }
        let threshold = fixed.threshold(opts.min_samples);
        weighted_core = Some(
            sum.iter()
                .map(|&s| threshold.is_some_and(|t| s >= t))
                .collect(),
        );
        phases.push((
            "weight sums (join 1)".to_string(),
            t.elapsed().as_secs_f64(),
        ));
    }
    // On a GPU the counts are made on the device (no pair is read back for them); then
    // every link waits for the second pass below.
    let t = Instant::now();
    let on_device = if n > 1 && sample_weight.is_none() {
        engine.device_neighbour_counts(&data, &join)?
    } else {
        None
    };
    let counted_on_device = on_device.is_some();
    let second_pass = match on_device {
        Some((counts, counted)) => {
            degree = counts;
            report = counted;
            phases.push((
                "neighbour counts on the device (join 1)".to_string(),
                t.elapsed().as_secs_f64(),
            ));
            true
        }
        // Weighted: the sums above were the first pass; links need the second.
        None if sample_weight.is_some() => true,
        None => {
            if n > 1 {
                let mut sink = CountSink {
                    degree: &mut degree,
                    parent: &mut parent,
                    threshold,
                    deferred: &mut deferred,
                };
                report = engine.self_join_stream(&data, &join, &mut sink)?;
                phases.push((
                    "count and link (join 1)".to_string(),
                    t.elapsed().as_secs_f64(),
                ));
            }
            if deferred.overflow {
                report.notes.push(format!(
                    "dbscan: more than {DEFERRED_PER_POINT} pairs per point waited for their core flags: a second pass over the join"
                ));
            }
            deferred.overflow
        }
    };
    // The join's own phases (index build, join), within the one above.
    phases.extend(
        report
            .phases
            .drain(..)
            .map(|(k, v)| (format!("join 1: {k}"), v)),
    );
    let core: Vec<bool> = match weighted_core {
        Some(core) => core,
        None => {
            let mut core: Vec<bool> = alloc(n, false, "core flags")?;
            for (c, &d) in core.iter_mut().zip(&degree) {
                *c = d >= threshold;
            }
            core
        }
    };
    let core_points = core.iter().filter(|&&c| c).count();

    // The kept pairs, now that every point's core flag is known: links, and each border
    // point's nearest core point. Over budget, a second pass over the join instead.
    let mut nearest: Vec<u32> = alloc(n, u32::MAX, "nearest core points")?;
    if core_points > 0 && n > 1 {
        let mut nearest_acc: Vec<T> = alloc(n, T::ZERO, "nearest core distances")?;
        let t = Instant::now();
        let mut sink = LinkSink {
            x: xs,
            dim,
            metric: opts.metric,
            core: &core,
            orig: &orig,
            parent: &mut parent,
            nearest: &mut nearest,
            nearest_acc: &mut nearest_acc,
        };
        if second_pass {
            // The GPU that counted links core points on the device too: only border
            // candidates (and links it left undone) come to the sink.
            let linked = if counted_on_device {
                engine.device_link(&data, &join, &core, &mut sink)?
            } else {
                None
            };
            let second = match linked {
                Some((forest, second)) => {
                    // Each point joins its root in the device's forest; parents are never
                    // above their point, so one ascending pass finds every root.
                    let mut root = forest;
                    for x in 0..n {
                        let p = root[x] as usize;
                        if p != x {
                            root[x] = root[p];
                            union(&mut parent, x as u32, root[x]);
                        }
                    }
                    phases.push((
                        "link core points on the device (join 2)".to_string(),
                        t.elapsed().as_secs_f64(),
                    ));
                    second
                }
                None => {
                    let second = engine.self_join_stream(&data, &join, &mut sink)?;
                    phases.push((
                        "link core points (join 2)".to_string(),
                        t.elapsed().as_secs_f64(),
                    ));
                    second
                }
            };
            report.batches += second.batches;
            report.notes.extend(second.notes);
        } else {
            for chunk in &deferred.chunks {
                sink.push(chunk).map_err(Error::from)?;
            }
            phases.push((
                format!("link {} kept pairs", deferred.len),
                t.elapsed().as_secs_f64(),
            ));
        }
    }
    drop(deferred);
    drop(sorted);

    // Labels. Each position's cluster root (u32::MAX: noise), kept in `nearest` (a
    // position reads only its own entry before overwriting it).
    let t = Instant::now();
    for p in 0..n {
        let anchor = if core[p] { p as u32 } else { nearest[p] };
        nearest[p] = if anchor == u32::MAX {
            u32::MAX
        } else {
            find(&mut parent, anchor)
        };
    }
    let root = nearest;
    // Back to the input's order: `position[i]` is where original point i went (the
    // union-find's array is free now; none is needed when the points kept their order).
    let mut position = parent;
    for (p, &i) in orig.iter().enumerate() {
        position[i as usize] = p as u32;
    }
    drop(orig);
    let core_out = if reorder {
        let mut out: Vec<bool> = alloc(n, false, "core flags")?;
        for (o, &p) in out.iter_mut().zip(&position) {
            *o = core[p as usize];
        }
        out
    } else {
        core
    };
    // Clusters numbered in the order of their smallest original index; `number` maps a
    // root to its cluster (u32::MAX: not numbered yet), in the counts' array.
    let mut labels: Vec<i64> = alloc(n, -1i64, "labels")?;
    let mut number = degree;
    number.fill(u32::MAX);
    let mut clusters = 0u32;
    let mut noise = 0usize;
    for i in 0..n {
        let p = if reorder { position[i] as usize } else { i };
        let r = root[p];
        if r == u32::MAX {
            noise += 1;
            continue;
        }
        if number[r as usize] == u32::MAX {
            number[r as usize] = clusters;
            clusters += 1;
        }
        labels[i] = number[r as usize] as i64;
    }
    phases.push(("label".to_string(), t.elapsed().as_secs_f64()));

    if report.backend.is_empty() {
        // No join ran (fewer than two points): no backend was asked anything.
        report.backend = match opts.backend {
            Backend::Gpu => "vulkan".into(),
            _ => "cpu".into(),
        };
        report.notes.push("no join was needed".into());
    }
    report.phases = phases;
    report.seconds = start.elapsed().as_secs_f64();
    Ok(DbscanResult {
        labels,
        core: core_out,
        clusters: clusters as usize,
        noise,
        core_points,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_halves_paths() {
        let mut parent = vec![0u32, 0, 1, 2, 3];
        assert_eq!(find(&mut parent, 4), 0);
        assert_eq!(find(&mut parent, 3), 0);
        assert!(parent[4] <= 2);
    }

    #[test]
    fn options_are_checked() {
        assert!(DbscanOptions::new(0.5, 5).validate().is_ok());
        for (eps, m) in [
            (0.0, 5),
            (-1.0, 5),
            (f64::NAN, 5),
            (f64::INFINITY, 5),
            (0.5, 0),
        ] {
            let e = DbscanOptions::new(eps, m).validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
    }
}
