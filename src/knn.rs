//! The exact k-nearest-neighbour join: for every query point, its k nearest data points.
//!
//! One definition of the answer, shared by every backend so that all agree bit for bit:
//! - the distance of a candidate is `metric::distance_acc` in the input precision (squared
//!   for Euclidean), canonical dimension order, no fused multiply-add;
//! - neighbours are ordered by (distance, index): equal distances go to the smaller data
//!   index, at the k-th place too;
//! - a self-kNN (no query set) excludes the point itself (by index; an exact duplicate of
//!   it is a neighbour at distance 0);
//! - reported distances are `sqrt(acc)` for Euclidean (computed on the host in the input
//!   precision, so a GPU's approximate `sqrt` never enters), `acc` otherwise.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::metric::Coord;
use crate::options::{Algorithm, Backend, Metric};
use crate::result::{Distances, JoinReport};

/// How to run a k-nearest-neighbour join.
#[derive(Clone, Debug, PartialEq)]
pub struct KnnOptions {
    pub metric: Metric,
    /// `Metric::Haversine`: the sphere's radius in metres (distances are metres on it);
    /// [`crate::metric::EARTH_RADIUS_M`] by default.
    pub sphere_radius: f64,
    pub backend: Backend,
    /// `Auto`, `KdTree` (CPU), `Grid` (CPU), `Lss` (GPU) or `Brute` (both).
    pub algorithm: Algorithm,
    /// LSS: number of shifted Z-order lists (None = automatic).
    pub lss_lists: Option<usize>,
    /// Stops and watches the join (see [`crate::control`]; the default is inert).
    pub control: crate::control::Control,
}

impl Default for KnnOptions {
    fn default() -> Self {
        KnnOptions {
            metric: Metric::Euclidean,
            sphere_radius: crate::metric::EARTH_RADIUS_M,
            backend: Backend::Auto,
            algorithm: Algorithm::Auto,
            lss_lists: None,
            control: crate::control::Control::default(),
        }
    }
}

/// The answer: `rows` query points × `k` neighbours, row-major. Row r holds query r's
/// neighbours nearest first: `indices[r*k + c]` is a data point index.
#[derive(Clone, Debug)]
pub struct KnnResult {
    pub rows: usize,
    pub k: usize,
    pub indices: Vec<u32>,
    pub distances: Distances,
    pub report: JoinReport,
}

impl KnnResult {
    /// Row r's neighbour indices.
    pub fn row(&self, r: usize) -> &[u32] {
        &self.indices[r * self.k..(r + 1) * self.k]
    }
    /// Distance of row r's c-th neighbour, widened to f64.
    pub fn distance(&self, r: usize, c: usize) -> f64 {
        match &self.distances {
            Distances::F32(d) => d[r * self.k + c] as f64,
            Distances::F64(d) => d[r * self.k + c],
        }
    }
}

/// One kNN join to run; `query == None` is a self-kNN. Checked by [`KnnJob::new`].
pub(crate) struct KnnJob<'a> {
    pub data: Dataset<'a>,
    pub query: Option<Dataset<'a>>,
    pub k: usize,
    pub opts: &'a KnnOptions,
}

impl<'a> KnnJob<'a> {
    pub fn new(
        data: &Dataset<'a>,
        query: Option<&Dataset<'a>>,
        k: usize,
        opts: &'a KnnOptions,
    ) -> Result<Self> {
        crate::options::check_lss_lists(opts.lss_lists)?;
        if matches!(opts.algorithm, Algorithm::Ego) {
            return Err(Error::invalid(
                "'ego' is an eps-join algorithm; kNN uses auto, kdtree, grid, lss or brute",
            ));
        }
        if let Some(q) = query {
            if q.dim() != data.dim() {
                return Err(Error::invalid(format!(
                    "the data have {} dimensions but the queries have {}",
                    data.dim(),
                    q.dim()
                )));
            }
            if q.precision() != data.precision() {
                return Err(Error::invalid(
                    "data and queries must have the same precision (both f32 or both f64)",
                ));
            }
        }
        if k == 0 {
            return Err(Error::invalid("k must be >= 1"));
        }
        let candidates = data.len() - usize::from(query.is_none() && !data.is_empty());
        let rows = query.map_or(data.len(), |q| q.len());
        if rows > 0 && k > candidates {
            return Err(Error::invalid(format!(
                "k = {k} is larger than the {candidates} candidate points{}",
                if query.is_none() {
                    " (a self-kNN excludes the point itself)"
                } else {
                    ""
                }
            )));
        }
        if k > u32::MAX as usize || rows.checked_mul(k).is_none() {
            return Err(Error::invalid(format!(
                "a {rows} x {k} result does not fit in memory"
            )));
        }
        // Distances are ranked in the input precision: none may overflow (a pass over
        // the points, small beside the kNN search itself).
        let (lo, hi, _) = crate::stats::bounds_and_variance(data, query);
        crate::metric::check_extent(opts.metric, &lo, &hi, data.precision())?;
        Ok(KnnJob {
            data: *data,
            query: query.copied(),
            k,
            opts,
        })
    }

    pub fn rows(&self) -> usize {
        self.query.map_or(self.data.len(), |q| q.len())
    }
}

/// The size of a class of exact copies from which a kNN ranks distinct rows ([`Copies`]).
/// The searches tell neighbours apart by distance, and a class's copies are all at one:
/// their rows' work grows with the square of the class (5,000 copies of one 384-D vector
/// took 14.5 s for a cosine kNN at k = 10, 20,000 of one 2-D point 2.8 s for a Euclidean).
pub(crate) const DISTINCT_CLASS: usize = 64;

/// Exact copies among a kNN's data rows (the same values in every coordinate): rows with
/// the same values have the same distance to every row under every metric (the same
/// arithmetic on the same values), so the kNN of the distinct rows, expanded to their
/// copies, is the answer. A query's k nearest classes (ties by their smallest index, the
/// distinct rows' order) hold its k nearest rows: each class's members in index order, and
/// in a self-kNN its own class's other members at their common distance. No class left out
/// can hold one of the k: it is at least as far as the farthest fetched, and at that
/// distance its smallest index exceeds every fetched class's, while the k fetched classes'
/// smallest indices (and the own class's rows) are k rows no farther.
pub(crate) struct Copies {
    /// Each row's class (its distinct row's position in `reps`).
    class: Vec<u32>,
    /// Each class's smallest row index, increasing.
    reps: Vec<u32>,
    /// Class u's rows, in index order: `members[first[u]..first[u + 1]]`.
    first: Vec<usize>,
    members: Vec<u32>,
    /// The largest class.
    pub(crate) biggest: usize,
}

impl Copies {
    /// The classes of `x`'s rows (`dim` wide) where a kNN at k should rank the distinct
    /// rows (a class above [`DISTINCT_CLASS`] and k + 1 rows), else None. Classes by f64
    /// bits (-0 and 0 stay apart, which only costs a missed merge): rows hashed, sorted by
    /// hash, compared in full within one. Above 65,536 rows a sample of 16,384 at an even
    /// stride comes first, and only a hash seen 4 times in it (a class of a thousandth of
    /// the rows shows about 16 times) has every row hashed: every `auto` kNN runs this, and
    /// a sort of every row's hash is a cost beside a low-dimensional kNN of millions of
    /// points (not separated from this VM's noise). A smaller class missed costs its
    /// square, at most a millionth of the rows' pairs.
    pub(crate) fn find<T: Coord>(x: &[T], dim: usize, k: usize) -> Option<Copies> {
        use rayon::prelude::*;
        const SAMPLE: usize = 1 << 14;
        let n = x.len() / dim;
        let row = |i: usize| &x[i * dim..(i + 1) * dim];
        let hash = |i: usize| {
            row(i).iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
                let h = (h ^ v.to_f64().to_bits()).wrapping_mul(0x0000_0100_0000_01b3);
                h ^ (h >> 29)
            })
        };
        if n > 4 * SAMPLE {
            let mut sample: Vec<u64> = (0..SAMPLE).map(|i| hash(i * (n / SAMPLE))).collect();
            sample.sort_unstable();
            if !sample.chunk_by(|a, b| a == b).any(|c| c.len() >= 4) {
                return None;
            }
        }
        let mut order: Vec<(u64, u32)> = (0..n)
            .into_par_iter()
            .map(|i| (hash(i), i as u32))
            .collect();
        order.par_sort_unstable();
        let same = |a: u32, b: u32| {
            let (a, b) = (row(a as usize), row(b as usize));
            a.iter()
                .zip(b)
                .all(|(p, q)| p.to_f64().to_bits() == q.to_f64().to_bits())
        };
        // Each row's smallest copy: in index order within a hash (the sort's second key),
        // a value's first row is its smallest.
        let mut rep: Vec<u32> = (0..n as u32).collect();
        for bucket in order.chunk_by(|a, b| a.0 == b.0) {
            let mut firsts: Vec<u32> = Vec::new();
            for &(_, i) in bucket {
                match firsts.iter().find(|&&f| same(f, i)) {
                    Some(&f) => rep[i as usize] = f,
                    None => firsts.push(i),
                }
            }
        }
        let reps: Vec<u32> = (0..n as u32).filter(|&i| rep[i as usize] == i).collect();
        let mut class = vec![0u32; n];
        for (u, &r) in reps.iter().enumerate() {
            class[r as usize] = u as u32;
        }
        for i in 0..n {
            class[i] = class[rep[i] as usize];
        }
        let m = reps.len();
        let mut first = vec![0usize; m + 1];
        for &c in &class {
            first[c as usize + 1] += 1;
        }
        for u in 0..m {
            first[u + 1] += first[u];
        }
        let mut members = vec![0u32; n];
        let mut fill = first.clone();
        for (i, &c) in class.iter().enumerate() {
            members[fill[c as usize]] = i as u32;
            fill[c as usize] += 1;
        }
        let biggest = (0..m).map(|u| first[u + 1] - first[u]).max().unwrap_or(0);
        (biggest > DISTINCT_CLASS.max(k + 1)).then_some(Copies {
            class,
            reps,
            first,
            members,
            biggest,
        })
    }

    /// The number of distinct rows.
    pub(crate) fn distinct(&self) -> usize {
        self.reps.len()
    }

    /// The k the distinct rows' kNN runs at (their own classes excluded in a self-kNN).
    fn k(&self, k: usize, self_knn: bool) -> usize {
        k.min(self.distinct() - usize::from(self_knn))
    }

    /// The distinct rows' kNN by `search(rows, k)`, or None where no other class exists.
    pub(crate) fn knn<T: Coord>(
        &self,
        x: &[T],
        dim: usize,
        k: usize,
        self_knn: bool,
        search: impl FnOnce(&[T], usize) -> Result<KnnResult>,
    ) -> Result<Option<KnnResult>> {
        match self.k(k, self_knn) {
            0 => Ok(None),
            ku => Ok(Some(search(&self.rows(x, dim), ku)?)),
        }
    }

    /// The expanded kNN's report: the distinct rows' kNN's (`found`; where there was
    /// none, the CPU's), with a note of the copies.
    pub(crate) fn report(&self, found: Option<KnnResult>, k: usize, self_knn: bool) -> JoinReport {
        let mut report = found.map(|f| f.report).unwrap_or_else(|| JoinReport {
            backend: "cpu".into(),
            device: "cpu".into(),
            batches: 1,
            ..Default::default()
        });
        report.notes.push(format!(
            "kNN: {} rows hold {} distinct (the largest class {} copies); the distinct rows' kNN at k = {}, expanded to their copies",
            self.class.len(),
            self.distinct(),
            self.biggest,
            self.k(k, self_knn)
        ));
        report
    }

    /// The distinct rows of `x`, in index order.
    fn rows<T: Coord>(&self, x: &[T], dim: usize) -> Vec<T> {
        self.reps
            .iter()
            .flat_map(|&r| x[r as usize * dim..(r as usize + 1) * dim].iter().copied())
            .collect()
    }

    /// The distinct kNN's query row for query `r` (a self-kNN's queries are the classes).
    pub(crate) fn query_row(&self, r: usize, self_knn: bool) -> usize {
        if self_knn {
            self.class[r] as usize
        } else {
            r
        }
    }

    /// Query r's k nearest rows as (key, index), nearest first, ties by index, from
    /// `near`, its nearest classes by the distinct kNN, and `key`, its ranking key to a data
    /// row (f64, exact: the order the searches rank by); a self-kNN's own class included.
    pub(crate) fn expand(
        &self,
        r: usize,
        self_knn: bool,
        k: usize,
        near: &[u32],
        key: impl Fn(usize) -> f64,
    ) -> Vec<(f64, u32)> {
        let of = |u: usize| &self.members[self.first[u]..self.first[u + 1]];
        let order = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        let mut near: Vec<(f64, u32)> = near
            .iter()
            .map(|&u| (key(self.reps[u as usize] as usize), u))
            .collect();
        near.sort_unstable_by(order);
        let mut c: Vec<(f64, u32)> = Vec::with_capacity(2 * k);
        if self_knn {
            let own = of(self.class[r] as usize);
            if let Some(&j) = own.iter().find(|&&j| j as usize != r) {
                let d0 = key(j as usize);
                c.extend(
                    own.iter()
                        .filter(|&&j| j as usize != r)
                        .take(k)
                        .map(|&j| (d0, j)),
                );
            }
        }
        // Classes at one key interleave by index: a level is taken whole (each class
        // capped at k members) before the count is checked.
        let mut level = 0;
        while level < near.len() {
            let d = near[level].0;
            let end = level + near[level..].iter().take_while(|e| e.0 == d).count();
            for &(_, u) in &near[level..end] {
                c.extend(of(u as usize).iter().take(k).map(|&j| (d, j)));
            }
            level = end;
            if c.iter().filter(|e| e.0 <= d).count() >= k {
                break;
            }
        }
        c.sort_unstable_by(order);
        c.truncate(k);
        c
    }
}

/// A kNN of Euclidean, Manhattan or Chebyshev distance over the distinct rows where the
/// data hold a large class of exact copies ([`Copies`]), keys by `metric::distance_acc`
/// as every search ranks; None where no class is that large. `job` is checked.
pub(crate) fn with_copies(
    engine: &crate::engine::Engine,
    job: &KnnJob,
) -> Result<Option<KnnResult>> {
    use crate::dataset::Coords;
    match (job.data.coords(), job.query.map(|q| q.coords())) {
        (Coords::F32(x), None) => copies_typed(engine, x, None, job),
        (Coords::F64(x), None) => copies_typed(engine, x, None, job),
        (Coords::F32(x), Some(Coords::F32(q))) => copies_typed(engine, x, Some(q), job),
        (Coords::F64(x), Some(Coords::F64(q))) => copies_typed(engine, x, Some(q), job),
        _ => Ok(None),
    }
}

fn copies_typed<T: Coord>(
    engine: &crate::engine::Engine,
    x: &[T],
    q: Option<&[T]>,
    job: &KnnJob,
) -> Result<Option<KnnResult>>
where
    for<'x> Dataset<'x>: crate::cosine::FromRows<'x, T>,
{
    use crate::cosine::FromRows;
    use rayon::prelude::*;
    let start = std::time::Instant::now();
    let (dim, k, self_knn, metric) = (job.data.dim(), job.k, q.is_none(), job.opts.metric);
    let Some(copies) = engine.install(|| Copies::find(x, dim, k))? else {
        return Ok(None);
    };
    let found = copies.knn(x, dim, k, self_knn, |ux, ku| {
        let d = Dataset::from_rows(ux, dim)?;
        let dq = q.map(|q| Dataset::from_rows(q, dim)).transpose()?;
        engine.knn(&d, dq.as_ref(), ku, job.opts)
    })?;
    let rows_q = q.unwrap_or(x);
    let ranked: Vec<Vec<(f64, u32)>> = engine.install(|| {
        (0..job.rows())
            .into_par_iter()
            .map(|r| {
                let qr = &rows_q[r * dim..(r + 1) * dim];
                let near = found
                    .as_ref()
                    .map_or(&[][..], |f| f.row(copies.query_row(r, self_knn)));
                copies.expand(r, self_knn, k, near, |j| {
                    crate::metric::distance_acc(metric, qr, &x[j * dim..(j + 1) * dim]).to_f64()
                })
            })
            .collect()
    })?;
    job.opts.control.check()?;
    let indices: Vec<u32> = ranked.iter().flat_map(|c| c.iter().map(|e| e.1)).collect();
    let reported = ranked
        .iter()
        .flat_map(|c| c.iter())
        .map(|e| crate::metric::finish(metric, T::from_f64(e.0)).to_f64());
    let distances = if T::UNIT_ROUNDOFF > 1e-10 {
        Distances::F32(reported.map(|d| d as f32).collect())
    } else {
        Distances::F64(reported.collect())
    };
    let mut report = copies.report(found, k, self_knn);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(Some(KnnResult {
        rows: job.rows(),
        k,
        indices,
        distances,
        report,
    }))
}

/// The ordering key of a candidate: (distance accumulator, index). Totally ordered because
/// accumulators are finite and never NaN (inputs are finite).
#[inline(always)]
pub(crate) fn key_less<T: Coord>(a: (T, u32), b: (T, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// Turns accumulators into reported distances (square root for Euclidean), in place.
pub(crate) fn finish_distances<T: Coord>(metric: Metric, acc: &mut [T]) {
    if metric == Metric::Euclidean {
        for a in acc {
            *a = crate::metric::finish(metric, *a);
        }
    }
}

/// Allocates a result array of `len` entries, or a clear out-of-memory error.
pub(crate) fn alloc<T: Clone + Send + Sync>(len: usize, fill: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::new(
            crate::error::ErrorKind::OutOfHostMemory,
            format!("cannot allocate the kNN {what} ({len} entries)"),
        )
    })?;
    crate::result::huge::advise(&mut v);
    // Filled by every engine thread: a kNN's arrays are hundreds of MB of first touches.
    use rayon::prelude::*;
    v.par_extend(rayon::iter::repeat_n(fill, len));
    Ok(v)
}

/// [`alloc`] filled in pieces, `control` checked between them (a few GB of first
/// touches take a second).
pub(crate) fn alloc_stoppable<T: Clone + Send + Sync>(
    len: usize,
    fill: T,
    what: &str,
    control: &crate::control::Control,
) -> Result<Vec<T>> {
    const PIECE: usize = 1 << 22;
    let mut v = alloc(len.min(PIECE), fill.clone(), what)?;
    if len > PIECE {
        v.try_reserve_exact(len - v.len()).map_err(|_| {
            Error::new(
                crate::error::ErrorKind::OutOfHostMemory,
                format!("cannot allocate the kNN {what} ({len} entries)"),
            )
        })?;
        crate::result::huge::advise(&mut v);
        use rayon::prelude::*;
        while v.len() < len {
            control.check()?;
            let piece = PIECE.min(len - v.len());
            v.par_extend(rayon::iter::repeat_n(fill.clone(), piece));
        }
    }
    control.check()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::Copies;

    /// Classes, members in index order and the sampled pre-check: 70,000 rows (above the
    /// sample's threshold) find a class of 1,000 copies, interleaved, and its members; all
    /// distinct rows, or one class the sample misses (70 copies), find none.
    #[test]
    fn copies_are_found_through_the_sample() {
        let n = 70_000;
        let distinct: Vec<f32> = (0..n).map(|i| i as f32).collect();
        assert!(Copies::find(&distinct, 1, 10).is_none());
        let mut x = distinct.clone();
        for i in (0..n).step_by(70) {
            x[i] = -1.0;
        }
        let c = Copies::find(&x, 1, 10).expect("a class of 1,000 copies");
        assert_eq!((c.biggest, c.distinct()), (1000, n - 999));
        let u = c.query_row(0, true);
        let of = &c.members[c.first[u]..c.first[u + 1]];
        assert!(of.iter().copied().eq((0..n as u32).step_by(70)));
        // A class of 1,000 is not worth it at k = 1,000.
        assert!(Copies::find(&x, 1, 1000).is_none());
        // At rows 1 mod 4, which the sample's stride (4) never meets.
        let mut rare = distinct;
        for i in 0..70 {
            rare[i * 860 + 1] = -1.0;
        }
        assert!(Copies::find(&rare, 1, 10).is_none());
        // Below the threshold every row is hashed: the same 70 copies are found.
        assert_eq!(
            Copies::find(&rare[..60_000], 1, 10).map(|c| c.biggest),
            Some(70)
        );
    }
}
