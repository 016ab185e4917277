//! The cosine kNN's entry (`knn`), its choice of path, and the ranking every path shares:
//! the rule's distance, the bounds of copies' products on it ([`rule_floor`]), and a
//! query's k nearest kept in order.

use super::knn_brute::{knn_brute, Own};
use super::knn_grouped::knn_grouped;
use super::*;

/// The cosine kNN (`Metric::Cosine`): every query's k nearest data rows by the rule's
/// distance (`metric::cosine_distance`, f64), ties by index, a self-kNN excluding the row
/// itself, as `knn.rs` defines the answer for every metric.
///
/// How: the Euclidean kNN of the normalised copies at k' > k gives candidates, ranked
/// exactly by the rule. A row is certain when its k-th exact distance c_k is below what
/// any other row can reach: every non-candidate's copies are at least the k'-th
/// candidate's Euclidean distance apart, so (rounding bounded as in the module's proof) its
/// real cosine distance is at least L^2 / 2 and its computed one at least L^2 / 2 - delta.
/// The rows that are not certain (near-duplicates and ties at the k'-th place) meet every
/// row (`knn_brute`, c_k an upper bound on their k-th distance from the start) where they
/// are few enough ([`Uncertain`]), else a cosine join of those queries at eps c_k (widened
/// for rounding) with the data finds every row within c_k, each query's list cut to its k
/// nearest as it grows; either way their k nearest are exact.
///
/// On the CPU (algorithm `Auto`) clustered rows go through the grouped leaders' index
/// instead (`knn_grouped`), the same answer with far fewer distances; where it declines,
/// the path above runs. The report's notes say which ran.
pub(crate) fn knn(
    engine: &Engine,
    data: &Dataset,
    query: Option<&Dataset>,
    k: usize,
    opts: &crate::knn::KnnOptions,
) -> Result<crate::knn::KnnResult> {
    match (data.coords(), query.map(|q| q.coords())) {
        (Coords::F32(x), None) => knn_typed(engine, x, None, data.dim(), k, opts),
        (Coords::F64(x), None) => knn_typed(engine, x, None, data.dim(), k, opts),
        (Coords::F32(x), Some(Coords::F32(y))) => {
            knn_typed(engine, x, Some(y), data.dim(), k, opts)
        }
        (Coords::F64(x), Some(Coords::F64(y))) => {
            knn_typed(engine, x, Some(y), data.dim(), k, opts)
        }
        _ => Err(crate::error::Error::invalid(
            "data and queries must have the same precision (both f32 or both f64)",
        )),
    }
}

/// The rule's distance from query row `r` to data row `j` (each set: rows `dim` wide and
/// their norms), as both kNN paths rank them.
#[inline]
pub(super) fn rule_distance<T: Coord>(
    q: (&[T], &[f64]),
    x: (&[T], &[f64]),
    dim: usize,
    r: usize,
    j: usize,
) -> f64 {
    crate::metric::cosine_distance(
        &q.0[r * dim..(r + 1) * dim],
        &x.0[j * dim..(j + 1) * dim],
        q.1[r],
        x.1[j],
    )
}

/// [`rule_distance`] from query row `r` to each entry's row (`.1`), written to its `.0`:
/// the same bits, [`COSINE_LANES`] rows side by side ([`crate::metric::cosine_dots`]).
pub(super) fn measure<T: Coord>(
    q: (&[T], &[f64]),
    x: (&[T], &[f64]),
    dim: usize,
    r: usize,
    entries: &mut [(f64, u32)],
) {
    let qr = &q.0[r * dim..(r + 1) * dim];
    for lanes in entries.chunks_mut(COSINE_LANES) {
        // A short last group repeats its last row.
        let last = lanes.len() - 1;
        let dots = crate::metric::cosine_dots::<T, COSINE_LANES>(std::array::from_fn(|l| {
            let j = lanes[l.min(last)].1 as usize;
            (qr, &x.0[j * dim..(j + 1) * dim])
        }));
        for (e, dot) in lanes.iter_mut().zip(dots) {
            e.0 = crate::metric::cosine_distance_of(dot, q.1[r], x.1[e.1 as usize]);
        }
    }
}

/// How the rows the Euclidean pass leaves uncertain are answered ([`knn_search`]).
pub(super) struct Uncertain {
    /// Where their count times the rows' times the dimensions is at most this, each of them
    /// meets every row (`knn_brute`, from its k-th distance); else one cosine join finds
    /// their candidates.
    pub(super) brute_work: f64,
    /// Candidate pairs the join's lists hold, about (16 bytes a pair), before a query's
    /// list is cut to its k nearest.
    pub(super) held_pairs: usize,
}

/// [`Uncertain`] as the kNN runs it: at most about 2.7e11 products meeting every row
/// (1.5e11 for 20,000 collinear rows of 384-D; 100 uncertain rows of a million take 3.8e10
/// and the join took as long), 16 MiB of candidates.
pub(super) const UNCERTAIN: Uncertain = Uncertain {
    brute_work: (1u64 << 38) as f64,
    held_pairs: 1 << 20,
};

/// Extra candidates the Euclidean pass asks for beyond k.
pub(super) fn knn_extra(k: usize) -> usize {
    (k / 2).max(16)
}

/// The least value of T at or above `e` (positive, finite): a join of T's rows at it,
/// whose rule compares with its eps rounded to T, keeps every row within `e`. (Rounded to
/// the nearest f32, a kNN's last join lost rows tied at its k-th distance.)
pub(super) fn up_to<T: Coord>(e: f64) -> f64 {
    let t = T::from_f64(e).to_f64();
    match t >= e {
        true => t,
        false if T::UNIT_ROUNDOFF > 1e-10 => f32::from_bits((t as f32).to_bits() + 1) as f64,
        false => f64::from_bits(t.to_bits() + 1),
    }
}

/// How far the rule's computed cosine distance (`metric::cosine_distance`, f64 sums of
/// `dim` terms, any cosine in [-1, 1]) can fall below the real one (module doc's delta).
pub(super) fn knn_delta(dim: usize) -> f64 {
    (4.0 * dim as f64 + 32.0) * (f64::EPSILON / 2.0)
}

/// A lower bound on the rule's computed cosine distance of two rows whose normalised copies
/// (in a precision of unit roundoff `u` and smallest normal `min`; the copies of copies
/// that `cpu/partition/` indexes count as f32's) are at least `apart` apart (real
/// Euclidean distance). Each copy is within `2 u + (dim + 4) u64 + sqrt(dim) min` of its
/// real unit vector (rounding to T, the f64 norm and division, underflow), so the real
/// unit vectors are at least `l = apart - 2 (that)` apart, their real cosine distance is at
/// least l^2 / 2, and the rule computes at least that less `knn_delta`. The bound's own f64
/// roundings (a few u64) are covered by the `1 - 4 u64` and the copies' generous error.
/// Non-decreasing in `apart`; -inf where it proves nothing.
pub(super) fn rule_floor(apart: f64, dim: usize, u: f64, min: f64) -> f64 {
    let u64_ = f64::EPSILON / 2.0;
    let l = apart - 2.0 * copy_error(dim, u, min);
    if l <= 0.0 {
        f64::NEG_INFINITY
    } else {
        l * l / 2.0 * (1.0 - 4.0 * u64_) - knn_delta(dim)
    }
}

/// At least every `apart` whose [`rule_floor`] is within `limit` (it is non-decreasing), so
/// that a search can rule rows out by comparing distances, and dot products, before
/// taking the floor (a root and more) of each: the inverse of the floor, widened for its
/// own rounding. Infinite where `limit` is.
pub(super) fn rule_reach(limit: f64, dim: usize, u: f64, min: f64) -> f64 {
    let u64_ = f64::EPSILON / 2.0;
    let l2 = 2.0 * (limit + knn_delta(dim)) / (1.0 - 4.0 * u64_);
    (2.0 * copy_error(dim, u, min) + l2.max(0.0).sqrt()) * (1.0 + 1e-9) + 1e-12
}

/// How far a normalised copy can lie from its real unit vector ([`rule_floor`]'s
/// derivation): rounding to a precision of unit roundoff `u`, the f64 norm and division,
/// underflow below `min`.
pub(super) fn copy_error(dim: usize, u: f64, min: f64) -> f64 {
    let d = dim as f64;
    2.0 * u + (d + 4.0) * (f64::EPSILON / 2.0) + d.sqrt() * min
}

/// Offers `c` (distance, index) to `best`, the k nearest so far in the kNN's order
/// (distance, then index), kept sorted.
pub(super) fn offer(best: &mut Vec<(f64, u32)>, k: usize, c: (f64, u32)) {
    let at = best.partition_point(|e| e.0.total_cmp(&c.0).then(e.1.cmp(&c.1)).is_lt());
    if at < k {
        best.insert(at, c);
        best.truncate(k);
    }
}

/// The k-th distance of `best` (a query's nearest so far, nearest first), infinite while it
/// holds fewer than k.
pub(super) fn kth_of(best: &[(f64, u32)], k: usize) -> f64 {
    best.get(k.wrapping_sub(1)).map_or(f64::INFINITY, |e| e.0)
}

/// The f32 dot product (of two f32 unit copies, as `partition::dot` takes it) below which
/// the copies are at least `reach` apart by `partition::dist_floor` (the margin covers its
/// rounding): a row whose product is below it has a floor beyond `reach`.
pub(super) fn least_dot(reach: f64, slack: f64) -> f64 {
    1.0 - slack - reach * reach / 2.0 - 1e-6
}

/// Offers to `best` (a query's k nearest so far) the candidates of `near` (each an f32 dot
/// product of the query's f32 copy with a row's, as `partition::dot` takes them, and a
/// key that `row_of` turns into the row), as both searches rank them: those whose product
/// is below `least` or whose `floor` (of `dist_floor`) exceeds the k-th distance are ruled
/// out (`cap`: a known upper bound on it), the rest measured by the rule (`measure_rows`:
/// [`measure`] of the query) in increasing floor, [`COSINE_LANES`] at a time, while the
/// floor does not exceed the k-th distance. Every candidate left out has a rule distance
/// above the k-th (ties are measured). Returns the rule distances computed.
#[allow(clippy::too_many_arguments)]
pub(super) fn rank_by_floor(
    near: &mut Vec<(f64, u32)>,
    best: &mut Neighbours,
    k: usize,
    cap: f64,
    least: f64,
    slack: f64,
    floor: impl Fn(f64) -> f64,
    row_of: impl Fn(u32) -> u32,
    mut measure_rows: impl FnMut(&mut [(f64, u32)]),
) -> u64 {
    let limit = kth_of(best, k).min(cap);
    near.retain_mut(|e| {
        if e.0 < least {
            return false;
        }
        e.0 = crate::cpu::partition::dist_floor(e.0 as f32, slack);
        floor(e.0) <= limit
    });
    near.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut at = 0;
    while at < near.len() {
        // The next candidates whose floor can still place them (by the k-th distance now).
        let limit = kth_of(best, k).min(cap);
        let mut lanes = [(0.0, 0u32); COSINE_LANES];
        let mut m = 0;
        while m < COSINE_LANES && at + m < near.len() && floor(near[at + m].0) <= limit {
            lanes[m] = (0.0, row_of(near[at + m].1));
            m += 1;
        }
        if m == 0 {
            break;
        }
        measure_rows(&mut lanes[..m]);
        for &c in &lanes[..m] {
            offer(best, k, c);
        }
        at += m;
    }
    at as u64
}

/// A query's nearest (rule distance, row), nearest first.
pub(super) type Neighbours = Vec<(f64, u32)>;
/// Every query's [`Neighbours`].
pub(super) type Ranked = Vec<Neighbours>;

/// Below this many queries a cosine kNN on the CPU compares every query with every row
/// (`knn_brute`): the grouped index's leaders and groups, or the Euclidean pass's tree,
/// cost the collection's time whatever the queries (100 queries x 95,000 clustered 384-D
/// rows, 2 threads: 0.9 s of the grouped path's 1.0 s building its index). The join's
/// `partition::SMALL_SIDE`, for the same reason.
const SMALL_QUERIES: usize = 256;

/// A kNN of at least [`SMALL_QUERIES`] queries against a collection meets every row too
/// where the queries number fewer than KNN_QUERIES_PER_LEADER times the leaders the
/// collection's sample picks (`partition::knn_leaders`): grouping the rows (each against
/// every leader) would cost more than the queries' products, most of which stop at their
/// first coordinates. Measured, 2 threads, k = 10, queries drawn from clusters-384d-100k
/// and -768d-100k against the other rows (2,000 leaders), every row met against grouped:
/// 384-D 2,500 queries 1.0-1.3 / 1.7-1.9 s, 5,000 1.78 / 1.89; 768-D 2,500 1.5-1.6 /
/// 2.7-2.9, 5,000 2.37 / 3.30. (Before the first coordinates' bounds the two met at about
/// one query a leader.)
const KNN_QUERIES_PER_LEADER: usize = 2;

fn knn_typed<T: Coord>(
    engine: &Engine,
    x: &[T],
    q: Option<&[T]>,
    dim: usize,
    k: usize,
    opts: &crate::knn::KnnOptions,
) -> Result<crate::knn::KnnResult>
where
    for<'x> Dataset<'x>: FromRows<'x, T>,
{
    if opts.algorithm == crate::options::Algorithm::Auto {
        if let Some(found) = knn_distinct(engine, x, q, dim, k, opts)? {
            return Ok(found);
        }
    }
    knn_search(engine, x, q, dim, k, opts, &UNCERTAIN)
}

/// The cosine kNN where the data hold a large class of exact copies
/// ([`crate::knn::Copies`]): the kNN of the distinct rows, expanded to their copies,
/// ranked by the rule's f64 distance. Without it the copies' rows cannot be told apart by
/// the Euclidean pass, and their fallback join compared every pair of a class.
///
/// None where no class is that large (the search ranks a few copies well: their fallback
/// join is small), or k is out of range (the search reports it).
fn knn_distinct<T: Coord>(
    engine: &Engine,
    x: &[T],
    q: Option<&[T]>,
    dim: usize,
    k: usize,
    opts: &crate::knn::KnnOptions,
) -> Result<Option<crate::knn::KnnResult>>
where
    for<'x> Dataset<'x>: FromRows<'x, T>,
{
    let start = std::time::Instant::now();
    let n = x.len() / dim;
    let self_knn = q.is_none();
    if k == 0 || k + usize::from(self_knn) > n {
        return Ok(None);
    }
    let Some(copies) = engine.install(|| crate::knn::Copies::find(x, dim, k))? else {
        return Ok(None);
    };
    // Zero and non-finite rows are refused here, by their own row numbers.
    let (nx, nq) = engine.install(|| -> Result<_> {
        Ok((norms(x, dim)?, q.map(|q| norms(q, dim)).transpose()?))
    })??;
    let prepared = start.elapsed().as_secs_f64();
    let found = copies.knn(x, dim, k, self_knn, |ux, ku| {
        knn_search(engine, ux, q, dim, ku, opts, &UNCERTAIN)
    })?;
    let (rows_q, norms_q) = (q.unwrap_or(x), nq.as_deref().unwrap_or(&nx));
    let dist = |r: usize, j: usize| rule_distance((rows_q, norms_q), (x, &nx), dim, r, j);
    let ranked: Vec<Vec<(f64, u32)>> = engine.install(|| {
        (0..norms_q.len())
            .into_par_iter()
            .map(|r| {
                let near = found
                    .as_ref()
                    .map_or(&[][..], |f| f.row(copies.query_row(r, self_knn)));
                copies.expand(r, self_knn, k, near, |j| dist(r, j))
            })
            .collect()
    })?;
    opts.control.check()?;
    let mut report = copies.report(found, k, self_knn);
    report
        .phases
        .insert(0, ("cosine kNN: exact copies found".into(), prepared));
    Ok(Some(knn_result::<T>(ranked, k, report, start)))
}

/// The cosine kNN of `x`'s rows (`knn_typed` without the duplicates' shortcut).
pub(super) fn knn_search<T: Coord>(
    engine: &Engine,
    x: &[T],
    q: Option<&[T]>,
    dim: usize,
    k: usize,
    opts: &crate::knn::KnnOptions,
    uncertain: &Uncertain,
) -> Result<crate::knn::KnnResult>
where
    for<'x> Dataset<'x>: FromRows<'x, T>,
{
    use crate::cpu::partition;
    let start = std::time::Instant::now();
    let n = x.len() / dim.max(1);
    let rows = q.map_or(n, |q| q.len() / dim.max(1));
    let candidates = n - usize::from(q.is_none() && n > 0);
    let on_cpu = opts.backend == crate::options::Backend::Cpu
        || (opts.backend == crate::options::Backend::Auto && !engine.auto_gpu());
    let mut declined = None;
    let auto = opts.algorithm == crate::options::Algorithm::Auto && k >= 1 && k <= candidates;
    // A few queries meet every row (below), which makes each row's f32 copy where it meets
    // them: a copy of the whole collection first cost as long as their products (100
    // queries x 99,900 384-D rows, 2 threads: 0.035 of 0.12 s).
    let few = on_cpu && auto && rows < SMALL_QUERIES && q.is_some();
    let (nx, nq, cx, cq) = prepare(engine, x, q, dim, (!few, true))?;
    opts.control.check()?;
    let prepared = start.elapsed().as_secs_f64();
    let rows_q: &[T] = q.unwrap_or(x);
    let norms_q: &[f64] = nq.as_deref().unwrap_or(&nx);
    // Every query meets every row (`knn_brute`), for `why`, after `phases`.
    let brute = |why: String, phases: Vec<(String, f64)>| -> Result<crate::knn::KnnResult> {
        let t = std::time::Instant::now();
        let run = knn_brute(
            engine,
            x,
            rows_q,
            if q.is_none() { Own::All } else { Own::Apart },
            dim,
            k,
            &nx,
            norms_q,
            (!few).then_some(&cx[..]),
            cq.as_deref(),
            None,
            &opts.control,
        )?;
        let mut phases = phases;
        phases.insert(0, ("cosine: norms and normalised copies".into(), prepared));
        phases.push((
            "cosine kNN: bounds from the rows nearest by the first coordinates".into(),
            run.seeded,
        ));
        phases.push((
            "cosine kNN: every query with every row".into(),
            t.elapsed().as_secs_f64() - run.seeded,
        ));
        let report = JoinReport {
            backend: "cpu".into(),
            device: format!(
                "cpu ({} threads)",
                engine.install(rayon::current_num_threads)?
            ),
            algorithm: crate::options::Algorithm::Brute,
            batches: 1,
            notes: vec![format!(
                "cosine kNN: {rows} queries ({why}) meet every one of {n} rows \
                 (f32 products in blocks, {:.1}% of them completed past their first \
                 coordinates; the rule's distance where they leave a row in)",
                100.0 * run.completed
            )],
            phases,
            ..Default::default()
        };
        Ok(knn_result::<T>(run.ranked, k, report, start))
    };
    // (`few` among them: its collection was not copied.)
    if on_cpu && auto && rows < SMALL_QUERIES {
        return brute(format!("< {SMALL_QUERIES}"), Vec::new());
    }
    // Asked for by name: the same exact scan, not the Euclidean pass's generic one over
    // every pair (5,000 x 384-D rows: 7.6 s, against 0.37 s by `auto`).
    let named = opts.algorithm == crate::options::Algorithm::Brute;
    if on_cpu && named && k >= 1 && k <= candidates {
        return brute("algorithm brute".into(), Vec::new());
    }
    // Vectors near a low-dimensional subspace: a Euclidean kNN of their projections finds
    // the candidates, first where the sample's leaders keep growing (as for joins), else
    // where the grouped index declines.
    let t = std::time::Instant::now();
    let fit = match auto {
        true => {
            engine.install(|| crate::projection::Projection::fit_knn(&cx, cq.as_deref(), dim))?
        }
        false => None,
    };
    let fitted = t.elapsed().as_secs_f64();
    let projection_first = fit.as_ref().is_some_and(|p| p.growth >= PROJECTION_FIRST);
    // More queries against a collection, but fewer than the leaders its sample picks: the
    // grouped index (each row against every leader) would cost more than the queries' own
    // products. Found at the cost of that many leaders; those found serve the index.
    let mut sampled = None;
    let mut leaders_s = 0.0;
    if on_cpu && auto && !projection_first && q.is_some() {
        let t = std::time::Instant::now();
        let over = rows.div_ceil(KNN_QUERIES_PER_LEADER);
        let found =
            engine.install(|| partition::knn_leaders(&as_f32(&cx), dim, over, &opts.control))?;
        opts.control.check()?;
        leaders_s = t.elapsed().as_secs_f64();
        match found {
            partition::KnnLeaders::Over => {
                return brute(
                    format!("more than {over} of the rows' sample lead at radius 1"),
                    vec![
                        ("cosine: principal directions of a sample".into(), fitted),
                        ("cosine kNN: the rows' sample's leaders".into(), leaders_s),
                    ],
                );
            }
            partition::KnnLeaders::Found(l) => sampled = Some(l),
        }
    }
    if on_cpu && auto && !projection_first {
        let t = std::time::Instant::now();
        if let Some((ranked, note, threads, built)) = knn_grouped(
            engine,
            x,
            rows_q,
            q.is_none(),
            dim,
            k,
            (&nx, norms_q),
            &cx,
            cq.as_deref(),
            sampled.take(),
            &opts.control,
        )? {
            let report = JoinReport {
                backend: "cpu".into(),
                device: format!("cpu ({threads} threads)"),
                algorithm: crate::options::Algorithm::Auto,
                batches: 1,
                notes: vec![note],
                phases: vec![
                    ("cosine: norms and normalised copies".into(), prepared),
                    ("cosine kNN: leaders and groups".into(), leaders_s + built),
                    (
                        "cosine kNN: grouped search".into(),
                        t.elapsed().as_secs_f64() - built,
                    ),
                ],
                ..Default::default()
            };
            return Ok(knn_result::<T>(ranked, k, report, start));
        }
        declined = Some(t.elapsed().as_secs_f64());
    }
    // The Euclidean pass checks k against the candidates, dimensions, k = 0 and the like.
    let wide = (k + knn_extra(k)).min(candidates.max(k));
    let mut euclid = opts.clone();
    euclid.metric = Metric::Euclidean;
    let d = dim as f64;
    let delta = knn_delta(dim);
    let (first, projection) = match &fit {
        // The z of the rows: a row whose k'-th candidate's z is `far` apart (as the
        // Euclidean rule computes it) is at least `apart(far)` from every other row's copy.
        Some(p) => {
            let t = std::time::Instant::now();
            let control = &opts.control;
            let (zx, zq) = engine.install(|| {
                (
                    p.apply(&cx, control),
                    cq.as_deref().map(|c| p.apply(c, control)),
                )
            })?;
            let zx = zx.ok_or_else(crate::control::cancelled)?;
            let zq = zq
                .map(|z| z.ok_or_else(crate::control::cancelled))
                .transpose()?;
            let projected = t.elapsed().as_secs_f64();
            let dz = Dataset::from_f32(&zx, p.m + 1)?;
            let dzq = zq
                .as_deref()
                .map(|z| Dataset::from_f32(z, p.m + 1))
                .transpose()?;
            let mut first = engine.knn(&dz, dzq.as_ref(), wide, &euclid)?;
            first.report.phases.splice(
                0..0,
                [
                    ("cosine: principal directions of a sample".into(), fitted),
                    ("cosine: projections".into(), projected),
                ],
            );
            (first, Some(p))
        }
        None => {
            let dx = Dataset::from_rows(&cx, dim)?;
            let dq = cq
                .as_deref()
                .map(|c| Dataset::from_rows(c, dim))
                .transpose()?;
            (engine.knn(&dx, dq.as_ref(), wide, &euclid)?, None)
        }
    };
    // Bounds of the module's proof, for a row whose k'-th candidate is `far` (Euclidean,
    // as reported: sqrt of the accumulator in T) apart; of the projections' bound, through
    // `Projection::apart`.
    let reach = |far: f64| -> f64 {
        let real = match projection {
            Some(p) => p.apart(far),
            None => {
                let acc = far * far * (1.0 - 4.0 * T::UNIT_ROUNDOFF);
                (acc / (1.0 + (d + 4.0) * T::UNIT_ROUNDOFF)).sqrt()
            }
        };
        rule_floor(real, dim, T::UNIT_ROUNDOFF, min_normal::<T>())
    };
    let all_candidates = wide >= candidates;
    let fast = |r: usize, j: usize| {
        crate::metric::cosine_distance_fast(
            &rows_q[r * dim..(r + 1) * dim],
            &x[j * dim..(j + 1) * dim],
            norms_q[r],
            nx[j],
        )
    };
    let slack = crate::metric::cosine_distance_slack(dim);
    // Each row: its k nearest among the candidates, exactly ranked, and whether certain.
    // The fast distances (within `slack` of the rule's) rule out the candidates whose
    // lower end lies above the k-th smallest upper end; the rest take the rule's distance.
    let ranked: Vec<(Vec<(f64, u32)>, bool)> = engine.install(|| {
        (0..rows)
            .into_par_iter()
            .map(|r| {
                let ids = first.row(r);
                let mut c: Vec<(f64, u32)> =
                    ids.iter().map(|&j| (fast(r, j as usize), j)).collect();
                c.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                if let Some(&(kth, _)) = c.get(k.saturating_sub(1)) {
                    let reach = kth + slack;
                    c.retain(|e| e.0 - slack <= reach);
                }
                measure((rows_q, norms_q), (x, &nx), dim, r, &mut c);
                c.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                c.truncate(k);
                let certain = all_candidates
                    || c.last()
                        .is_some_and(|&(ck, _)| ck < reach(first.distance(r, wide - 1)));
                (c, certain)
            })
            .collect()
    })?;
    opts.control.check()?;
    let unsure: Vec<usize> = (0..rows).filter(|&r| !ranked[r].1).collect();
    let mut ranked: Vec<Vec<(f64, u32)>> = ranked.into_iter().map(|(c, _)| c).collect();
    let of = match projection {
        Some(p) => format!(
            "of their projections on a sample's {} principal directions and the norm left ({:.2}% of its variance; leaders grow {:.2}x from half the sample)",
            p.m,
            100.0 * p.share,
            p.growth
        ),
        None => "of the normalised vectors".into(),
    };
    let mut notes = vec![format!(
        "cosine kNN: a Euclidean kNN {of} at k' = {wide} ranked by the cosine rule; {} of {rows} rows certain, the rest searched from their k-th distance",
        rows - unsure.len()
    )];
    if let Some(s) = declined {
        notes.insert(
            0,
            format!(
                "cosine kNN: the grouped leaders' index declined (too few rows or dimensions, no clusters, or little pruning), {s:.3} s"
            ),
        );
    }
    let bound: Vec<f64> = unsure.iter().map(|&r| kth_of(&ranked[r], k)).collect();
    let work = unsure.len() as f64 * n as f64 * dim as f64;
    if !unsure.is_empty() && on_cpu && work <= uncertain.brute_work {
        // Each uncertain query meets every row, its k-th distance from the first pass an
        // upper bound on its real one from the start.
        let copies_q: &[T] = cq.as_deref().unwrap_or(&cx);
        let pick = |v: &[T]| -> Vec<T> {
            unsure
                .iter()
                .flat_map(|&r| v[r * dim..(r + 1) * dim].iter().copied())
                .collect()
        };
        let nq_sub: Vec<f64> = unsure.iter().map(|&r| norms_q[r]).collect();
        let own = match q {
            None => Own::Rows(&unsure),
            Some(_) => Own::Apart,
        };
        let run = knn_brute(
            engine,
            x,
            &pick(rows_q),
            own,
            dim,
            k,
            &nx,
            &nq_sub,
            Some(&cx),
            Some(&pick(copies_q)),
            Some(&bound),
            &opts.control,
        )?;
        for (r, f) in unsure.iter().zip(run.ranked) {
            debug_assert_eq!(f.len(), k);
            ranked[*r] = f;
        }
        notes.push(format!(
            "cosine kNN: {} rows met every row from their k-th distance",
            unsure.len()
        ));
    } else if !unsure.is_empty() {
        // One cosine join of the uncertain queries at the largest of their k-th distances.
        let worst = unsure
            .iter()
            .map(|&r| ranked[r].last().map_or(2.0, |c| c.0))
            .fold(0.0f64, f64::max);
        // The join compares with its eps rounded to T (`metric::threshold`): rounded up.
        let e = up_to::<T>((worst + 4.0 * delta).max(1e-12));
        let sub: Vec<T> = unsure
            .iter()
            .flat_map(|&r| rows_q[r * dim..(r + 1) * dim].iter().copied())
            .collect();
        // Each query's candidates (rule distance, row; NaN until measured), cut to its k
        // nearest whenever the join has added uncertain.held_pairs since: memory k a query and that,
        // whatever the join finds (every pair of a set of collinear rows lies at their k-th
        // distance, and the join's eps is the largest of the queries' own).
        let mut found: Vec<Vec<(f64, u32)>> = vec![Vec::new(); unsure.len()];
        let cut_one = |f: &mut Vec<(f64, u32)>, r: usize, b: f64| {
            // Unmeasured rows surely beyond the query's k-th distance (its first pass's
            // k-th, or the k-th measured here) are dropped.
            let limit = match k.checked_sub(1).and_then(|at| f.get(at)) {
                Some(c) if !c.0.is_nan() => b.min(c.0),
                _ => b,
            };
            f.retain(|c| !c.0.is_nan() || fast(r, c.1 as usize) - slack <= limit);
            let from = f.partition_point(|c| !c.0.is_nan());
            measure((rows_q, norms_q), (x, &nx), dim, r, &mut f[from..]);
            f.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            f.truncate(k);
        };
        let cut = |found: &mut [Vec<(f64, u32)>]| {
            engine.install(|| {
                found
                    .par_iter_mut()
                    .zip(unsure.par_iter().zip(&bound))
                    .filter(|(f, _)| f.len() > k || f.last().is_some_and(|c| c.0.is_nan()))
                    .for_each(|(f, (&r, &b))| cut_one(f, r, b))
            })
        };
        if e < 2.0 {
            let ds = Dataset::from_rows(&sub, dim)?;
            let dx = Dataset::from_rows(x, dim)?;
            let mut jo = JoinOptions::new(e);
            jo.metric = Metric::Cosine;
            jo.backend = opts.backend;
            jo.control = opts.control.clone();
            // A query's list is cut where it reaches `held` (on the thread in the sink:
            // a parallel cut there could take up a join task that waits for the sink).
            let held = k + (uncertain.held_pairs / unsure.len()).max(64);
            let mut sink = |chunk: &[Pair]| -> anyhow::Result<()> {
                for &[i, j] in chunk {
                    let (i, f) = (i as usize, &mut found[i as usize]);
                    if q.is_some() || j as usize != unsure[i] {
                        f.push((f64::NAN, j));
                        if f.len() >= held {
                            cut_one(f, unsure[i], bound[i]);
                        }
                    }
                }
                Ok(())
            };
            engine.join_stream(&ds, &dx, &jo, &mut sink)?;
        } else {
            // Every row is within reach: all of them are candidates, in blocks.
            engine.install(|| {
                found
                    .par_iter_mut()
                    .zip(unsure.par_iter().zip(&bound))
                    .for_each(|(f, (&r, &b))| {
                        for from in (0..n).step_by(uncertain.held_pairs / 16) {
                            let rows =
                                from as u32..(from + uncertain.held_pairs / 16).min(n) as u32;
                            f.extend(
                                rows.filter(|&j| q.is_some() || j as usize != r)
                                    .map(|j| (f64::NAN, j)),
                            );
                            cut_one(f, r, b);
                        }
                    })
            })?;
        }
        cut(&mut found)?;
        for (r, f) in unsure.iter().zip(found) {
            debug_assert_eq!(f.len(), k);
            ranked[*r] = f;
        }
        notes.push(format!(
            "cosine kNN: {} rows joined at eps {e:.3e}",
            unsure.len()
        ));
    }
    let mut report = first.report;
    report
        .phases
        .insert(0, ("cosine: norms and normalised copies".into(), prepared));
    report.notes.extend(notes);
    Ok(knn_result::<T>(ranked, k, report, start))
}

/// The kNN's answer from each row's k nearest (distance, index), distances reported in
/// the input precision as every kNN's are.
pub(super) fn knn_result<T: Coord>(
    ranked: Vec<Vec<(f64, u32)>>,
    k: usize,
    mut report: JoinReport,
    start: std::time::Instant,
) -> crate::knn::KnnResult {
    use crate::result::Distances;
    let indices: Vec<u32> = ranked.iter().flat_map(|c| c.iter().map(|e| e.1)).collect();
    let distances = if T::UNIT_ROUNDOFF > 1e-10 {
        Distances::F32(
            ranked
                .iter()
                .flat_map(|c| c.iter().map(|e| e.0 as f32))
                .collect(),
        )
    } else {
        Distances::F64(ranked.iter().flat_map(|c| c.iter().map(|e| e.0)).collect())
    };
    report.seconds = start.elapsed().as_secs_f64();
    crate::knn::KnnResult {
        rows: ranked.len(),
        k,
        indices,
        distances,
        report,
    }
}
