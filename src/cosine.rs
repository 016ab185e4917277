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
    let (na, nb, ca, cb) = engine.install(|| -> Result<_> {
        let na = norms(a, dim)?;
        let nb = match b {
            Some(b) => Some(norms(b, dim)?),
            None => None,
        };
        let ca = normalised(a, dim, &na);
        let cb = b.zip(nb.as_ref()).map(|(b, nb)| normalised(b, dim, nb));
        Ok((na, nb, ca, cb))
    })??;
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
