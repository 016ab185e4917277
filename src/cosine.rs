//! Cosine joins (`Metric::Cosine`) on every backend: the vectors are normalised (a copy,
//! in the input precision), joined under Euclidean distance at an eps widened to cover
//! every rounding, and each candidate pair is confirmed by cosine's written rule
//! (`metric::cosine_within`), so the answer is the rule's set whichever backend and
//! algorithm found the candidates.
//!
//! Why the widened Euclidean join finds every pair: for unit vectors u, v,
//! |u - v|^2 = 2 - 2 cos. A pair the rule accepts (f64 sums of at most D + 1 roundings
//! each, Cauchy-Schwarz bounding the dot's error by (D + 1) u64 |a| |b|) has a real
//! cosine of at least 1 - e - delta, delta = (2D + 16) u64 (1 + |1 - e|), so
//! |u - v| <= sqrt(2e + 2 delta). The copies are u and v rounded to T (each coordinate
//! within u_T relative, or within T's smallest normal where it underflows): at most
//! 2 (u_T |u| + sqrt(D) min_T) apart from them. The Euclidean kernel's squared distance
//! in T is within (D + 4) u_T of the copies' real one, and eps' rounded to T and squared
//! loses at most 3 u_T. `widened_eps` covers all of it with room to spare.

use crate::dataset::{Coords, Dataset};
use crate::engine::Engine;
use crate::error::Result;
use crate::metric::{check_norm, cosine_within, norm, threshold, Coord};
use crate::options::{JoinOptions, Metric};
use crate::result::{Confirm, JoinReport, Pair, PairSink};
use rayon::prelude::*;

/// The Euclidean eps under which the normalised copies in precision `T` hold every pair
/// whose cosine rule accepts `e` (see the module's proof).
fn widened_eps<T: Coord>(e: f64, dim: usize) -> f64 {
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let delta = (2.0 * d + 16.0) * u64_ * (1.0 + (1.0 - e).abs());
    let min_t = if T::UNIT_ROUNDOFF > 1e-10 {
        f32::MIN_POSITIVE as f64
    } else {
        f64::MIN_POSITIVE
    };
    let slack = 4.0 * T::UNIT_ROUNDOFF + 2.0 * d.sqrt() * min_t;
    ((2.0 * e + 2.0 * delta).max(0.0).sqrt() + slack) * (1.0 + (d + 8.0) * T::UNIT_ROUNDOFF)
}

/// Each row's norm under the cosine rule, checked (zero or unsquarable norms are errors).
fn norms<T: Coord>(x: &[T], dim: usize) -> Result<Vec<f64>> {
    let out: Vec<f64> = x.par_chunks_exact(dim).map(norm).collect();
    if let Some((row, &n)) = out
        .iter()
        .enumerate()
        .find(|(_, n)| !(**n * **n).is_normal() || !n.is_normal())
    {
        check_norm(n, row)?;
    }
    Ok(out)
}

/// The rows divided by their norms (in f64), rounded to `T`.
fn normalised<T: Coord>(x: &[T], dim: usize, norms: &[f64]) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    x.par_iter()
        .enumerate()
        .map(|(k, &v)| T::from_f64(v.to_f64() / norms[k / dim]))
        .collect_into_vec(&mut out);
    out
}

/// Norms of `a` (and `b`), checked, and the normalised copies, on the engine's threads.
type Prepared<T> = (Vec<f64>, Option<Vec<f64>>, Vec<T>, Option<Vec<T>>);
fn prepare<T: Coord>(engine: &Engine, a: &[T], b: Option<&[T]>, dim: usize) -> Result<Prepared<T>> {
    engine.install(|| -> Result<_> {
        let na = norms(a, dim)?;
        let nb = b.map(|b| norms(b, dim)).transpose()?;
        let ca = normalised(a, dim, &na);
        let cb = b.zip(nb.as_ref()).map(|(b, nb)| normalised(b, dim, nb));
        Ok((na, nb, ca, cb))
    })?
}

/// The cosine rule over the original rows and their norms.
struct Rule<'a, T> {
    a: &'a [T],
    b: &'a [T],
    dim: usize,
    na: &'a [f64],
    nb: &'a [f64],
    e: f64,
}

impl<T: Coord> Rule<'_, T> {
    fn accepts(&self, [i, j]: Pair) -> bool {
        let (i, j) = (i as usize, j as usize);
        let d = self.dim;
        cosine_within(
            &self.a[i * d..(i + 1) * d],
            &self.b[j * d..(j + 1) * d],
            self.na[i],
            self.nb[j],
            self.e,
        )
    }
}

/// The cosine join `a ⋈ b` (self-join when `b` is None) into `sink` (count only when
/// None), as `Engine::run` runs any join.
pub(crate) fn run(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    match (a.coords(), b.map(|b| b.coords())) {
        (Coords::F32(x), None) => typed(engine, x, None, a.dim(), opts, sink),
        (Coords::F64(x), None) => typed(engine, x, None, a.dim(), opts, sink),
        (Coords::F32(x), Some(Coords::F32(y))) => typed(engine, x, Some(y), a.dim(), opts, sink),
        (Coords::F64(x), Some(Coords::F64(y))) => typed(engine, x, Some(y), a.dim(), opts, sink),
        _ => Err(crate::error::Error::invalid(
            "A and B must have the same coordinate precision",
        )),
    }
}

fn typed<T: Coord>(
    engine: &Engine,
    a: &[T],
    b: Option<&[T]>,
    dim: usize,
    opts: &JoinOptions,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport>
where
    for<'x> Dataset<'x>: FromRows<'x, T>,
{
    let t = std::time::Instant::now();
    let (na, nb, ca, cb) = prepare(engine, a, b, dim)?;
    opts.control.check()?;
    let prepared = t.elapsed().as_secs_f64();
    let e = threshold::<T>(Metric::Cosine, opts.eps).to_f64();
    let mut euclid = opts.clone();
    euclid.metric = Metric::Euclidean;
    euclid.eps = widened_eps::<T>(e, dim);
    let rule = Rule {
        a,
        b: b.unwrap_or(a),
        dim,
        na: &na,
        nb: nb.as_deref().unwrap_or(&na),
        e,
    };
    let on_cpu = opts.backend == crate::options::Backend::Cpu
        || (opts.backend == crate::options::Backend::Auto && !engine.auto_gpu());
    let mut sink = sink;
    if on_cpu && opts.algorithm == crate::options::Algorithm::Auto {
        let t = std::time::Instant::now();
        // The grouped join compares f32 copies (of T's copies): its eps is f32's widening,
        // which covers the second rounding (module doc).
        let eps32 = widened_eps::<f32>(e, dim);
        if let Some(mut report) = grouped(
            engine,
            &rule,
            &ca,
            cb.as_deref(),
            eps32,
            opts,
            sink.as_deref_mut(),
        )? {
            report
                .phases
                .insert(0, ("cosine: norms and normalised copies".into(), prepared));
            report
                .phases
                .push(("join".into(), t.elapsed().as_secs_f64()));
            return Ok(report);
        }
    }
    let da = Dataset::from_rows(&ca, dim)?;
    let db = match &cb {
        Some(cb) => Some(Dataset::from_rows(cb, dim)?),
        None => None,
    };
    let mut confirm = Confirm::new(|p| rule.accepts(p), sink);
    let mut report = match &db {
        None => engine.self_join_stream(&da, &euclid, &mut confirm),
        Some(db) => engine.join_stream(&da, db, &euclid, &mut confirm),
    }?;
    report.pairs = confirm.accepted;
    report
        .phases
        .insert(0, ("cosine: norms and normalised copies".into(), prepared));
    report.notes.push(format!(
        "cosine: a Euclidean join of the normalised vectors at eps {:.9e} (2 (1 - cos) widened \
         for rounding) found {} candidates, {} confirmed by the cosine rule",
        euclid.eps, confirm.candidates, confirm.accepted
    ));
    Ok(report)
}

/// The CPU's grouped join of clustered vectors (`cpu/partition.rs`): candidates from the
/// f32 copies, confirmed by the rule on every engine thread and passed to `sink`; None
/// (nothing emitted) where the data show no clusters.
fn grouped<'d, T: Coord>(
    engine: &Engine,
    rule: &Rule<T>,
    ca: &[T],
    cb: Option<&[T]>,
    eps: f64,
    opts: &JoinOptions,
    sink: Option<&mut (dyn PairSink + 'd)>,
) -> Result<Option<JoinReport>> {
    let dim = rule.dim;
    let f32s = |x: &[T]| -> Vec<f32> { x.par_iter().map(|v| v.to_f64() as f32).collect() };
    let out = engine.install(|| {
        let fa = f32s(ca);
        let fb = cb.map(f32s);
        let candidates = std::sync::atomic::AtomicU64::new(0);
        let accepted = std::sync::atomic::AtomicU64::new(0);
        let sink = std::sync::Mutex::new(sink);
        let emit = |chunk: &[Pair]| -> anyhow::Result<()> {
            let kept: Vec<Pair> = chunk.iter().copied().filter(|&p| rule.accepts(p)).collect();
            candidates.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            accepted.fetch_add(kept.len() as u64, std::sync::atomic::Ordering::Relaxed);
            opts.control.advance(0, kept.len() as u64);
            match sink
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref_mut()
            {
                Some(s) if !kept.is_empty() => s.push(&kept),
                _ => Ok(()),
            }
        };
        let note =
            crate::cpu::partition::candidates(&fa, fb.as_deref(), dim, eps, &opts.control, &emit);
        (
            note,
            candidates.into_inner(),
            accepted.into_inner(),
            rayon::current_num_threads(),
        )
    })?;
    let (note, candidates, accepted, threads) = out;
    let Some(note) = note else { return Ok(None) };
    let note = note?;
    Ok(Some(JoinReport {
        pairs: accepted,
        backend: "cpu".into(),
        device: format!("cpu ({threads} threads)"),
        algorithm: crate::options::Algorithm::Auto,
        batches: 1,
        notes: vec![
            note,
            format!(
                "cosine: {candidates} candidates from f32 dot products, {accepted} confirmed by the cosine rule"
            ),
        ],
        ..Default::default()
    }))
}

/// The cosine kNN (`Metric::Cosine`): every query's k nearest data rows by the rule's
/// distance (`metric::cosine_distance`, f64), ties by index, a self-kNN excluding the row
/// itself, as `knn.rs` defines the answer for every metric.
///
/// How: the Euclidean kNN of the normalised copies at k' > k gives candidates, ranked
/// exactly by the rule. A row is certain when its k-th exact distance c_k is below what
/// any other row can reach: every non-candidate's copies are at least the k'-th
/// candidate's Euclidean distance apart, so (rounding bounded as in the module's proof) its
/// real cosine distance is at least L^2 / 2 and its computed one at least L^2 / 2 - delta.
/// The rows that are not certain (near-duplicates and ties at the k'-th place) are answered
/// by a cosine join of those queries at eps c_k (widened for rounding) with the data: it
/// holds every row within c_k, so their k nearest among its candidates are exact.
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

/// Extra candidates the Euclidean pass asks for beyond k.
fn knn_extra(k: usize) -> usize {
    (k / 2).max(16)
}

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
    use crate::result::Distances;
    let start = std::time::Instant::now();
    let (nx, nq, cx, cq) = prepare(engine, x, q, dim)?;
    opts.control.check()?;
    let prepared = start.elapsed().as_secs_f64();
    let rows_q: &[T] = q.unwrap_or(x);
    let norms_q: &[f64] = nq.as_deref().unwrap_or(&nx);
    let n = nx.len();
    let rows = norms_q.len();
    let candidates = n - usize::from(q.is_none() && n > 0);
    // The Euclidean pass checks k against the candidates, dimensions, k = 0 and the like.
    let wide = (k + knn_extra(k)).min(candidates.max(k));
    let dx = Dataset::from_rows(&cx, dim)?;
    let dq = cq
        .as_deref()
        .map(|c| Dataset::from_rows(c, dim))
        .transpose()?;
    let mut euclid = opts.clone();
    euclid.metric = Metric::Euclidean;
    let first = engine.knn(&dx, dq.as_ref(), wide, &euclid)?;
    let dist = |r: usize, j: usize| {
        crate::metric::cosine_distance(
            &rows_q[r * dim..(r + 1) * dim],
            &x[j * dim..(j + 1) * dim],
            norms_q[r],
            nx[j],
        )
    };
    // Bounds of the module's proof, for a row whose k'-th candidate is `far` (Euclidean,
    // as reported: sqrt of the accumulator in T) apart.
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let min_t = if T::UNIT_ROUNDOFF > 1e-10 {
        f32::MIN_POSITIVE as f64
    } else {
        f64::MIN_POSITIVE
    };
    let delta = (4.0 * d + 32.0) * u64_;
    let reach = |far: f64| -> f64 {
        let acc = far * far * (1.0 - 4.0 * T::UNIT_ROUNDOFF);
        let real = (acc / (1.0 + (d + 4.0) * T::UNIT_ROUNDOFF)).sqrt();
        let l = real - 2.0 * (2.0 * T::UNIT_ROUNDOFF + (d + 4.0) * u64_ + d.sqrt() * min_t);
        if l <= 0.0 {
            f64::NEG_INFINITY
        } else {
            l * l / 2.0 - delta
        }
    };
    let all_candidates = wide >= candidates;
    // Each row: its k nearest among the candidates, exactly ranked, and whether certain.
    let ranked: Vec<(Vec<(f64, u32)>, bool)> = engine.install(|| {
        (0..rows)
            .into_par_iter()
            .map(|r| {
                let ids = first.row(r);
                let mut c: Vec<(f64, u32)> =
                    ids.iter().map(|&j| (dist(r, j as usize), j)).collect();
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
    let mut notes = vec![format!(
        "cosine kNN: a Euclidean kNN of the normalised vectors at k' = {wide} ranked by the          cosine rule; {} of {rows} rows certain, the rest by a cosine join at their k-th distance",
        rows - unsure.len()
    )];
    if !unsure.is_empty() {
        // One cosine join of the uncertain queries at the largest of their k-th distances.
        let worst = unsure
            .iter()
            .map(|&r| ranked[r].last().map_or(2.0, |c| c.0))
            .fold(0.0f64, f64::max);
        let e = (worst + 4.0 * delta).max(1e-12);
        let sub: Vec<T> = unsure
            .iter()
            .flat_map(|&r| rows_q[r * dim..(r + 1) * dim].iter().copied())
            .collect();
        let mut found: Vec<Vec<(f64, u32)>> = vec![Vec::new(); unsure.len()];
        if e < 2.0 {
            let ds = Dataset::from_rows(&sub, dim)?;
            let dx = Dataset::from_rows(x, dim)?;
            let mut jo = JoinOptions::new(e);
            jo.metric = Metric::Cosine;
            jo.backend = opts.backend;
            jo.control = opts.control.clone();
            let mut sink = |chunk: &[Pair]| -> anyhow::Result<()> {
                for &[i, j] in chunk {
                    found[i as usize].push((0.0, j));
                }
                Ok(())
            };
            engine.join_stream(&ds, &dx, &jo, &mut sink)?;
        } else {
            // Every row is within reach: all of them are candidates.
            for f in &mut found {
                f.extend((0..n as u32).map(|j| (0.0, j)));
            }
        }
        let done: Vec<Vec<(f64, u32)>> = engine.install(|| {
            found
                .into_par_iter()
                .zip(unsure.par_iter())
                .map(|(mut f, &r)| {
                    if q.is_none() {
                        f.retain(|&(_, j)| j as usize != r);
                    }
                    for c in &mut f {
                        c.0 = dist(r, c.1 as usize);
                    }
                    f.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    f.truncate(k);
                    f
                })
                .collect()
        })?;
        for (r, f) in unsure.iter().zip(done) {
            debug_assert_eq!(f.len(), k);
            ranked[*r] = f;
        }
        notes.push(format!(
            "cosine kNN: {} rows joined at eps {e:.3e}",
            unsure.len()
        ));
    }
    let indices: Vec<u32> = ranked.iter().flat_map(|c| c.iter().map(|e| e.1)).collect();
    // Reported in the input precision, as every kNN's distances are.
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
    let mut report = first.report;
    report
        .phases
        .insert(0, ("cosine: norms and normalised copies".into(), prepared));
    report.notes.extend(notes);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(crate::knn::KnnResult {
        rows,
        k,
        indices,
        distances,
        report,
    })
}

/// A dataset over rows of `T` (f32 or f64).
pub(crate) trait FromRows<'x, T> {
    fn from_rows(x: &'x [T], dim: usize) -> Result<Dataset<'x>>;
}
impl<'x> FromRows<'x, f32> for Dataset<'x> {
    fn from_rows(x: &'x [f32], dim: usize) -> Result<Dataset<'x>> {
        Dataset::from_f32(x, dim)
    }
}
impl<'x> FromRows<'x, f64> for Dataset<'x> {
    fn from_rows(x: &'x [f64], dim: usize) -> Result<Dataset<'x>> {
        Dataset::from_f64(x, dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widened_eps_covers_the_rule_and_is_close_to_it() {
        for dim in [2usize, 64, 1024] {
            for e in [1e-6, 0.01, 0.1, 0.5, 1.0, 1.9] {
                let w32 = widened_eps::<f32>(e, dim);
                let w64 = widened_eps::<f64>(e, dim);
                let exact = (2.0 * e).sqrt();
                assert!(w32 > exact && w64 > exact);
                assert!(w64 < exact * 1.0001 + 1e-12, "{w64} vs {exact}");
                assert!(w32 < exact * 1.001 + 1e-6, "{w32} vs {exact}");
            }
        }
    }
}
