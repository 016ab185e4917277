//! Cosine joins (`Metric::Cosine`) on every backend: the vectors are normalised (a copy,
//! in the input precision), joined under Euclidean distance at an eps widened to cover
//! every rounding, and each candidate pair is confirmed by cosine's written rule
//! (`metric::cosine_within`, through `cosine_within_fast`'s proven shortcut), so the
//! answer is the rule's set whichever backend and algorithm found the candidates. (The
//! grouped join skips the confirmation where its own f32 product proves the rule accepts:
//! [`sure_dot`].)
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
use crate::metric::{check_norm, cosine_within_fast, norm, threshold, Coord};
use crate::options::{JoinOptions, Metric};
use crate::result::{Confirm, JoinReport, Pair, PairSink};
use rayon::prelude::*;

/// The Euclidean eps under which the normalised copies in precision `T` hold every pair
/// whose cosine rule accepts `e` (see the module's proof).
fn widened_eps<T: Coord>(e: f64, dim: usize) -> f64 {
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let delta = (2.0 * d + 16.0) * u64_ * (1.0 + (1.0 - e).abs());
    let slack = 4.0 * T::UNIT_ROUNDOFF + 2.0 * d.sqrt() * min_normal::<T>();
    ((2.0 * e + 2.0 * delta).max(0.0).sqrt() + slack) * (1.0 + (d + 8.0) * T::UNIT_ROUNDOFF)
}

/// The f32 dot product of two rows' f32 copies (normalised in f64, rounded to `T`, then to
/// f32) at or above which the cosine rule accepts the pair at `e` for certain, where
/// `slack` bounds the product's error as it does the join's floor (`partition::dot_slack`
/// for f32 tiles, `dot_slack_f16` for the matrix units'). A grouped join passes such pairs
/// on unconfirmed: on clustered data nearly all of them (the band between floor and this
/// is a few `slack`s wide), where the confirmation read both rows again in f64.
///
/// Why: with u = a / |a|, v = b / |b| and c = u.v the real cosine, each copy's coordinate
/// is u_i within rho |u_i| + 2^-126 (rho = 2 u_f32 + (D + 4) u64: the norm's and the
/// quotient's f64 roundings, one to `T`, one to f32; 2^-126 where f32 underflows or a
/// device flushes), so the copies' real dot product is within 2 rho + rho^2 (+ terms of
/// 2^-126) of c, and their f32 product (any order) within (D + 2) u_f32 |p| |q| of theirs:
/// together under `dot_slack`'s 4 (D + 4) u_f32. So c >= d - slack. The rule accepts
/// where c >= 1 - e + delta (the module's delta, the other way round: the f64 dot product
/// is within (D + 1) u64 |a| |b| of the real one, and the threshold (1 - e) na nb within
/// (2D + 8) u64 |1 - e| |a| |b| of (1 - e) |a| |b|). The sum is rounded up to f32 after a
/// margin for its own f64 roundings.
pub(crate) fn sure_dot(e: f64, dim: usize, slack: f64) -> f32 {
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let delta = (2.0 * d + 16.0) * u64_ * (1.0 + (1.0 - e).abs());
    let tiny = 8.0 * (d + 4.0) * 2f64.powi(-126);
    let at = (1.0 - e) + delta + slack + tiny + 1e-14;
    let f = at as f32;
    if (f as f64) < at {
        f.next_up()
    } else {
        f
    }
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
    let mut out = vec![T::ZERO; x.len()];
    out.par_chunks_mut(dim)
        .zip(x.par_chunks(dim).zip(norms))
        .for_each(|(o, (row, &n))| {
            for (o, &v) in o.iter_mut().zip(row) {
                *o = T::from_f64(v.to_f64() / n);
            }
        });
    out
}

/// `x` in f32 for the grouped index and join: borrowed where `T` is f32 already (the
/// normalised copies), converted otherwise.
fn as_f32<T: Coord>(x: &[T]) -> std::borrow::Cow<'_, [f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(x))
    } else {
        x.par_iter()
            .map(|v| v.to_f64() as f32)
            .collect::<Vec<f32>>()
            .into()
    }
}

/// `sink` lent for a shorter while (`as_deref_mut` cannot shorten the trait object's
/// lifetime inside the Option).
fn reborrow<'s>(sink: &'s mut Option<&mut dyn PairSink>) -> Option<&'s mut dyn PairSink> {
    sink.as_mut().map(|s| &mut **s as &mut dyn PairSink)
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
        cosine_within_fast(
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
    let mut sink = sink;
    let auto = opts.algorithm == crate::options::Algorithm::Auto;
    let t = std::time::Instant::now();
    // Vectors near a low-dimensional subspace: a Euclidean join of their projections,
    // first where the sample's leaders keep growing (else after the grouped index).
    let fit = match auto {
        true => engine
            .install(|| crate::projection::Projection::fit(&ca, cb.as_deref(), dim, euclid.eps))?,
        false => None,
    };
    let fitted = t.elapsed().as_secs_f64();
    let via_projection = |p, sink| {
        projected(
            engine,
            &rule,
            &ca,
            cb.as_deref(),
            &euclid,
            p,
            sink,
            [prepared, fitted],
        )
    };
    if let Some(p) = fit.as_ref().filter(|p| p.growth >= PROJECTION_FIRST) {
        return via_projection(p, sink);
    }
    // A brute force asked of the GPU runs in the grouped join's tiles (`Plan::brute`);
    // under `auto` it stays where the general join's choice puts it, as grouped plans do
    // until a GPU measures them (AUTO_GROUPED_ON_GPU).
    let brute = opts.algorithm == crate::options::Algorithm::Brute
        && opts.backend == crate::options::Backend::Gpu;
    // The grouped join (`brute`: every pair in its tiles), with the call's phases; None
    // where its plan declines. It compares f32 copies (of T's copies): its eps is f32's
    // widening, which covers the second rounding (module doc).
    let eps32 = widened_eps::<f32>(e, dim);
    let in_groups = |brute: bool, sink: Option<&mut dyn PairSink>| -> Result<Option<JoinReport>> {
        let report = grouped(engine, &rule, &ca, cb.as_deref(), eps32, opts, brute, sink)?;
        Ok(report.map(|mut report| {
            report
                .phases
                .insert(0, ("cosine: norms and normalised copies".into(), prepared));
            report
                .phases
                .push(("join".into(), t.elapsed().as_secs_f64()));
            report
        }))
    };
    if auto || brute {
        if let Some(report) = in_groups(brute, reborrow(&mut sink))? {
            return Ok(report);
        }
    }
    if let Some(p) = &fit {
        return via_projection(p, sink);
    }
    let da = Dataset::from_rows(&ca, dim)?;
    let db = match &cb {
        Some(cb) => Some(Dataset::from_rows(cb, dim)?),
        None => None,
    };
    // (Reborrowed: the sink is wanted again if the general join cannot run.)
    let mut confirm = Confirm::new(|p| rule.accepts(p), reborrow(&mut sink));
    let ran = match &db {
        None => engine.self_join_stream(&da, &euclid, &mut confirm),
        Some(db) => engine.join_stream(&da, db, &euclid, &mut confirm),
    };
    let mut report = match ran {
        // A software device refuses the general join of rows of thousands of dims (its
        // loop budget), before any pair: the brute force in the grouped join's tiles runs.
        Err(err)
            if err.kind() == crate::error::ErrorKind::Unsupported
                && auto
                && opts.backend == crate::options::Backend::Gpu
                && confirm.candidates == 0 =>
        {
            let Some(mut report) = in_groups(true, sink)? else {
                return Err(err);
            };
            report.notes.push(format!(
                "cosine: the general join could not run ({err}): every pair compared in tiles"
            ));
            return Ok(report);
        }
        ran => ran?,
    };
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

/// Where the sample's leaders at eps grow by at least this much from half the sample to
/// all of it, the projection runs before the grouped index (which would need about a
/// leader a neighbourhood): 1 for clusters, 2 where no two rows share one. Measured
/// (2 threads, 2026-11-28): 200 clusters at 128-D (growth 1.09) took 1.1 s grouped, 2.9 s
/// projected; 8-D structure in 384-D (growth 1.41-1.76 at eps 0.2-0.1) 0.25-0.68 s
/// projected, 2.3-2.7 s grouped.
const PROJECTION_FIRST: f64 = 1.25;

/// The join through [`crate::projection`]: a Euclidean join of the rows' projections at
/// the filter's eps on the engine's backend, each candidate confirmed by the rule.
#[allow(clippy::too_many_arguments)]
fn projected<T: Coord>(
    engine: &Engine,
    rule: &Rule<T>,
    ca: &[T],
    cb: Option<&[T]>,
    euclid: &JoinOptions,
    p: &crate::projection::Projection,
    sink: Option<&mut dyn PairSink>,
    [prepared, fitted]: [f64; 2],
) -> Result<JoinReport> {
    let t = std::time::Instant::now();
    let control = &euclid.control;
    let (za, zb) = engine.install(|| (p.apply(ca, control), cb.map(|b| p.apply(b, control))))?;
    let stopped = crate::control::cancelled;
    let za = za.ok_or_else(stopped)?;
    let zb = zb.map(|z| z.ok_or_else(stopped)).transpose()?;
    let projected = t.elapsed().as_secs_f64();
    let mut low = euclid.clone();
    low.eps = p.eps(euclid.eps);
    let da = Dataset::from_f32(&za, p.m + 1)?;
    let db = zb
        .as_deref()
        .map(|z| Dataset::from_f32(z, p.m + 1))
        .transpose()?;
    let mut confirm = Confirm::new(|q| rule.accepts(q), sink);
    let mut report = match &db {
        None => engine.self_join_stream(&da, &low, &mut confirm),
        Some(db) => engine.join_stream(&da, db, &low, &mut confirm),
    }?;
    report.pairs = confirm.accepted;
    report.phases.splice(
        0..0,
        [
            ("cosine: norms and normalised copies".into(), prepared),
            ("cosine: principal directions of a sample".into(), fitted),
            ("cosine: projections".into(), projected),
        ],
    );
    report.notes.push(format!(
        "cosine: a filter on a sample's {} principal directions ({:.2}% of its variance; of {} \
         sample pairs, {} within eps, {} kept by the bound; leaders grow {:.2}x from half the \
         sample): a Euclidean join of their {} coordinates and the norm left, at eps {:.9e}, \
         found {} candidates, {} confirmed by the cosine rule",
        p.m,
        100.0 * p.share,
        p.sampled,
        p.within,
        p.kept,
        p.growth,
        p.m,
        low.eps,
        confirm.candidates,
        confirm.accepted
    ));
    Ok(report)
}

/// Whether `auto` sends a grouped plan's leaders' assignment and comparisons to a hardware
/// GPU. Not yet: measured on an H200 against the CPU backend on the same machine's 16
/// cores (bench/device/cosine.py, 2026-11-28; bench/EMBED_RESULTS.md), the device path took
/// 2.6-3.2x the CPU's time on every clustered workload (100k at 384-D and 768-D, 1M at
/// 384-D), its kernels a small part of it. `backend = gpu` still runs it.
const AUTO_GROUPED_ON_GPU: bool = false;

/// The grouped join of clustered vectors (`cpu/partition.rs`): the plan on the CPU, its
/// comparisons on the device where the join runs on a GPU (`gpu/grouped.rs`), else on the
/// CPU; candidates from the f32 copies, confirmed by the rule on every engine thread (but
/// for those past [`sure_dot`]) and passed to `sink`; None (nothing emitted) where the data
/// show no clusters. With `brute`, the plan is a blocked brute force (`Plan::brute`: every
/// pair of rows in the device's tiles), run only on a device (else None).
#[allow(clippy::too_many_arguments)]
fn grouped<'d, T: Coord>(
    engine: &Engine,
    rule: &Rule<T>,
    ca: &[T],
    cb: Option<&[T]>,
    eps: f64,
    opts: &JoinOptions,
    brute: bool,
    sink: Option<&mut (dyn PairSink + 'd)>,
) -> Result<Option<JoinReport>> {
    let dim = rule.dim;
    // Where the time goes (the report's phases): the copies, the device's assignment of
    // leaders where it ran, the whole plan (that assignment included), the comparisons.
    let phases = std::sync::Mutex::new(Vec::<(String, f64)>::new());
    let phase = |name: &str, t: std::time::Instant| {
        phases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.into(), t.elapsed().as_secs_f64()))
    };
    let out = engine.install(|| {
        let t = std::time::Instant::now();
        let fa = as_f32(ca);
        let fb = cb.map(as_f32);
        phase("cosine: f32 copies", t);
        let candidates = std::sync::atomic::AtomicU64::new(0);
        let accepted = std::sync::atomic::AtomicU64::new(0);
        let sink = std::sync::Mutex::new(sink);
        let certain = std::sync::atomic::AtomicU64::new(0);
        // Chunks flagged `sure` reached `sure_dot`: the rule accepts every pair of them.
        let emit = |chunk: &[Pair], sure: bool| -> anyhow::Result<()> {
            let kept: std::borrow::Cow<[Pair]> = if sure {
                certain.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                chunk.into()
            } else {
                chunk.iter().copied().filter(|&p| rule.accepts(p)).collect()
            };
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
        // The plan's note first, then what fell back to the CPU; the backend; the device;
        // whether the plan compared every pair.
        type Ran = (Vec<String>, &'static str, String, bool);
        let compared = || -> Result<Option<Ran>> {
            use crate::cpu::partition;
            // The leaders' assignment (rows x leaders dot products) on the device where the
            // join runs on a GPU (under `auto`, see AUTO_GROUPED_ON_GPU).
            // (The first assignment and the rounds' for the vectors it left far from every
            // leader: their seconds summed.)
            let assigned = std::sync::Mutex::new(None);
            let on_device = std::sync::Mutex::new(None::<f64>);
            // Once the device failed, the CPU assigns the rest.
            let failed = std::sync::atomic::AtomicBool::new(false);
            let assign = |x: &[f32], leaders: &[f32]| -> Option<Vec<(u32, f32)>> {
                if (opts.backend == crate::options::Backend::Auto && !AUTO_GROUPED_ON_GPU)
                    || failed.load(std::sync::atomic::Ordering::Relaxed)
                {
                    return None;
                }
                let t = std::time::Instant::now();
                let found = engine.on_device_any_metric(opts, |gpu| {
                    gpu.nearest_leaders(x, dim, leaders, &opts.control)
                });
                let (note, found) = match found {
                    Ok(Some(v)) => {
                        *on_device
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(0.0) += t.elapsed().as_secs_f64();
                        ("cosine: leaders assigned on the GPU".to_string(), Some(v))
                    }
                    // Not on a device, or stopped (the CPU's pass sees the stop too).
                    Ok(None) => return None,
                    Err(_) if opts.control.is_cancelled() => return None,
                    Err(e) => {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        (
                            format!(
                                "cosine: the GPU's assignment failed ({e}): assigned on the CPU"
                            ),
                            None,
                        )
                    }
                };
                *assigned.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
                found
            };
            let t = std::time::Instant::now();
            let planned = match brute {
                true => Some(Ok(partition::Plan::brute(&fa, fb.as_deref(), dim, eps))),
                false => {
                    partition::plan(&fa, fb.as_deref(), dim, eps, &opts.control, Some(&assign))
                }
            };
            if let Some(secs) = on_device.into_inner().unwrap_or_else(|p| p.into_inner()) {
                phases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(("cosine: leaders assigned on the device".into(), secs));
            }
            // (A few queries against many vectors are compared with all of them.)
            let blocks = matches!(&planned, Some(Ok(p)) if p.brute);
            phase(
                match blocks {
                    true => "cosine: plan (blocks of rows)",
                    false => "cosine: plan (leaders, groups, bounds)",
                },
                t,
            );
            let mut notes: Vec<String> = assigned
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .into_iter()
                .collect();
            let Some(plan) = planned else {
                return Ok(None);
            };
            let mut plan = plan?;
            plan.sure = sure_dot(rule.e, dim, partition::dot_slack(dim));
            plan.sure_f16 = sure_dot(rule.e, dim, partition::dot_slack_f16(dim));
            let t = std::time::Instant::now();
            let worth = opts.backend != crate::options::Backend::Auto || AUTO_GROUPED_ON_GPU;
            let on_device = match worth
                .then(|| engine.on_device_any_metric(opts, |gpu| gpu.grouped(&plan, opts, &emit)))
            {
                // Out of device memory before any candidate came: the CPU compares instead.
                Some(Err(e))
                    if e.kind() == crate::error::ErrorKind::OutOfDeviceMemory
                        && candidates.load(std::sync::atomic::Ordering::Relaxed) == 0 =>
                {
                    notes.push(format!(
                        "cosine: the GPU ran out of memory ({e}): compared on the CPU"
                    ));
                    None
                }
                other => other.transpose()?.flatten(),
            };
            let (note, backend, device) = match on_device {
                Some((note, device)) => (note, "gpu", device),
                // Not on a device (or out of its memory): the brute force asked for runs
                // in the general join, on the CPU's kernels.
                None if brute => return Ok(None),
                None => {
                    let compared = partition::compare(&plan, &opts.control, &emit)?;
                    let threads = rayon::current_num_threads();
                    (
                        plan.note(compared),
                        "cpu",
                        format!("cpu ({threads} threads)"),
                    )
                }
            };
            phase("cosine: comparisons and confirmation", t);
            notes.insert(0, note);
            Ok(Some((notes, backend, device, plan.brute)))
        };
        let done = compared();
        (
            done,
            candidates.into_inner(),
            accepted.into_inner(),
            certain.into_inner(),
        )
    })?;
    let (done, candidates, accepted, certain) = out;
    let Some((mut notes, backend, device, every_pair)) = done? else {
        // Declined: nothing was emitted.
        return Ok(None);
    };
    // The tiles' products were f32, or f16 with f32 sums on the matrix units (the GPU's
    // note says which): either way under the plan's floor for them.
    notes.push(format!(
        "cosine: {candidates} candidates from the tiles' dot products: {certain} within the \
         threshold by their own bound, {} of the other {} confirmed by the cosine rule",
        accepted - certain,
        candidates - certain
    ));
    Ok(Some(JoinReport {
        pairs: accepted,
        backend: backend.into(),
        device,
        algorithm: match every_pair {
            true => crate::options::Algorithm::Brute,
            false => crate::options::Algorithm::Auto,
        },
        batches: 1,
        notes,
        phases: phases.into_inner().unwrap_or_else(|p| p.into_inner()),
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
fn rule_distance<T: Coord>(
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

/// Extra candidates the Euclidean pass asks for beyond k.
fn knn_extra(k: usize) -> usize {
    (k / 2).max(16)
}

/// T's smallest normal number (the bound on a coordinate's error where rounding to T
/// underflows).
fn min_normal<T: Coord>() -> f64 {
    if T::UNIT_ROUNDOFF > 1e-10 {
        f32::MIN_POSITIVE as f64
    } else {
        f64::MIN_POSITIVE
    }
}

/// The least value of T at or above `e` (positive, finite): a join of T's rows at it,
/// whose rule compares with its eps rounded to T, keeps every row within `e`. (Rounded to
/// the nearest f32, a kNN's last join lost rows tied at its k-th distance.)
fn up_to<T: Coord>(e: f64) -> f64 {
    let t = T::from_f64(e).to_f64();
    match t >= e {
        true => t,
        false if T::UNIT_ROUNDOFF > 1e-10 => f32::from_bits((t as f32).to_bits() + 1) as f64,
        false => f64::from_bits(t.to_bits() + 1),
    }
}

/// How far the rule's computed cosine distance (`metric::cosine_distance`, f64 sums of
/// `dim` terms, any cosine in [-1, 1]) can fall below the real one (module doc's delta).
fn knn_delta(dim: usize) -> f64 {
    (4.0 * dim as f64 + 32.0) * (f64::EPSILON / 2.0)
}

/// A lower bound on the rule's computed cosine distance of two rows whose normalised copies
/// (in a precision of unit roundoff `u` and smallest normal `min`; the copies of copies
/// that `cpu/partition.rs` indexes count as f32's) are at least `apart` apart (real
/// Euclidean distance). Each copy is within `2 u + (dim + 4) u64 + sqrt(dim) min` of its
/// real unit vector (rounding to T, the f64 norm and division, underflow), so the real
/// unit vectors are at least `l = apart - 2 (that)` apart, their real cosine distance is at
/// least l^2 / 2, and the rule computes at least that less `knn_delta`. The bound's own f64
/// roundings (a few u64) are covered by the `1 - 4 u64` and the copies' generous error.
/// Non-decreasing in `apart`; -inf where it proves nothing.
fn rule_floor(apart: f64, dim: usize, u: f64, min: f64) -> f64 {
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
fn rule_reach(limit: f64, dim: usize, u: f64, min: f64) -> f64 {
    let u64_ = f64::EPSILON / 2.0;
    let l2 = 2.0 * (limit + knn_delta(dim)) / (1.0 - 4.0 * u64_);
    (2.0 * copy_error(dim, u, min) + l2.max(0.0).sqrt()) * (1.0 + 1e-9) + 1e-12
}

/// How far a normalised copy can lie from its real unit vector ([`rule_floor`]'s
/// derivation): rounding to a precision of unit roundoff `u`, the f64 norm and division,
/// underflow below `min`.
fn copy_error(dim: usize, u: f64, min: f64) -> f64 {
    let d = dim as f64;
    2.0 * u + (d + 4.0) * (f64::EPSILON / 2.0) + d.sqrt() * min
}

/// Offers `c` (distance, index) to `best`, the k nearest so far in the kNN's order
/// (distance, then index), kept sorted.
fn offer(best: &mut Vec<(f64, u32)>, k: usize, c: (f64, u32)) {
    let at = best.partition_point(|e| e.0.total_cmp(&c.0).then(e.1.cmp(&c.1)).is_lt());
    if at < k {
        best.insert(at, c);
        best.truncate(k);
    }
}

/// The k-th distance of `best` (a query's nearest so far, nearest first), infinite while it
/// holds fewer than k.
fn kth_of(best: &[(f64, u32)], k: usize) -> f64 {
    best.get(k.wrapping_sub(1)).map_or(f64::INFINITY, |e| e.0)
}

/// The f32 dot product (of two f32 unit copies, as `partition::dot` takes it) below which
/// the copies are at least `reach` apart by `partition::dist_floor` (the margin covers its
/// rounding): a row whose product is below it has a floor beyond `reach`.
fn least_dot(reach: f64, slack: f64) -> f64 {
    1.0 - slack - reach * reach / 2.0 - 1e-6
}

/// Offers to `best` (a query's k nearest so far) the candidates of `near` (each an f32 dot
/// product of the query's f32 copy with a row's, as `partition::dot` takes them, and a
/// key that `exact` turns into the rule's distance and the row), as both searches rank
/// them: those whose product is below `least` or whose `floor` (of `dist_floor`) exceeds
/// the k-th distance are ruled out (`cap`: a known upper bound on it), the rest measured by
/// the rule in increasing floor while the floor does not exceed the k-th distance. Every
/// candidate left out has a rule distance above the k-th (ties are measured). Returns the
/// rule distances computed.
#[allow(clippy::too_many_arguments)]
fn rank_by_floor(
    near: &mut Vec<(f64, u32)>,
    best: &mut Neighbours,
    k: usize,
    cap: f64,
    least: f64,
    slack: f64,
    floor: impl Fn(f64) -> f64,
    mut exact: impl FnMut(u32) -> (f64, u32),
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
    let mut n_exact = 0;
    for &(a, key) in near.iter() {
        if floor(a) > kth_of(best, k).min(cap) {
            break;
        }
        n_exact += 1;
        offer(best, k, exact(key));
    }
    n_exact
}

/// A query's nearest (rule distance, row), nearest first.
type Neighbours = Vec<(f64, u32)>;
/// Every query's [`Neighbours`].
type Ranked = Vec<Neighbours>;

/// What one f32 dot product of the grouped kNN (a row loaded on its own, its bound, its
/// place in the ranking, its share of the groups' ordering) costs in products of the
/// blocked brute force (`cpu::knn`'s filtered search, six queries by sixteen points a tile,
/// symmetric for a self-kNN). Where the two take equally long it was 4.2-10.8 at 64-1024-D
/// (20,000-30,000 diffuse topic-shaped vectors, 2 cores; 13.8-21.7 where the brute force's
/// k-d tree prunes at 64-128-D): 8 keeps a wrong choice within about 2x of the faster. It
/// was 1 before (a 384-D search of 3,031 products a query took 8.6 s, its brute force 4.1 s).
const GROUPED_DOT_COST: f64 = 8.0;

/// A kNN's queries take their products with every leader in blocks (`partition::Blocked`)
/// where the probe's queries measure more than 1 / BLOCKED_SHARE of the leaders one at a
/// time: a blocked product cost about a third of a single one (15 G against 5 G
/// multiply-adds a CPU second in a profile of dups-384d's search, AVX2; bench/EMBED_RESULTS.md).
const BLOCKED_SHARE: f64 = 3.0;

/// Each query's k nearest rows by the rule (ties by index) through the grouped index of
/// `cpu/partition.rs` (leaders, groups, radii over f32 copies of the data's unit copies),
/// exact by construction; None where the index declines (no clusters, too few rows).
///
/// L_g is group g's pivot, the mean of its members (`partition::recentre`). A query
/// (A ⋈ B) measures every pivot (an f32 dot product: `pivot_floor` bounds its real
/// distance from below) and visits the groups in increasing `|q - L_g| - r_g`, a
/// lower bound on its distance from every member (triangle inequality). In a group it
/// skips the members whose `|q - L_g| - |x - L_g|` already rules them out, bounds the rest
/// by their f32 dot products and computes the rule's distance, in increasing bound, for
/// those whose bound (`rule_floor`) does not exceed the current k-th distance. It stops at
/// the first group whose bound exceeds it: every row not computed has a rule distance
/// above the k-th (ties are visited), so the k kept are the rule's k nearest.
///
/// A self-kNN's query knows its own group g and its distance from L_g: it visits g first,
/// then the other groups in increasing `|L_g - L_h| - |q - L_g| - r_h` (the leaders'
/// distances bounded once), measuring a leader only for the groups that bound leaves in,
/// and skipping those that the measured `|q - L_h| - r_h` rules out; the same stop.
///
/// A probe of 64 evenly spread queries declines the search (None) where their f32 dot
/// products would cost more than the blocked brute force's: "clusters" that prune little.
#[allow(clippy::too_many_arguments)]
fn knn_grouped<T: Coord>(
    engine: &Engine,
    x: &[T],
    rows_q: &[T],
    self_knn: bool,
    dim: usize,
    k: usize,
    (nx, nq): (&[f64], &[f64]),
    cx: &[T],
    cq: Option<&[T]>,
    sampled: Option<Option<(Vec<f32>, f64)>>,
    control: &crate::control::Control,
) -> Result<Option<(Ranked, String, usize, f64)>> {
    use crate::cpu::partition::{dot, dot4, dot_slack, knn_index_of, knn_leaders, pivot_floor};
    use crate::cpu::partition::{Blocked, KnnLeaders};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    engine.install(|| -> Result<Option<(Ranked, String, usize, f64)>> {
        let t = std::time::Instant::now();
        let fx = as_f32(cx);
        // The sample's leaders, where the caller has not taken them already.
        let sampled = sampled.unwrap_or_else(|| match knn_leaders(&fx, dim, usize::MAX, control) {
            KnnLeaders::Found(l) => l,
            KnnLeaders::Over => None,
        });
        let Some(index) = sampled.and_then(|l| knn_index_of(&fx, dim, l, control)) else {
            control.check()?;
            return Ok(None);
        };
        drop(fx);
        let built = t.elapsed().as_secs_f64();
        let fq = cq.map(as_f32);
        let g = &index.groups;
        let groups = index.leaders.len() / dim;
        let slack = dot_slack(dim);
        let u32_ = f32::EPSILON as f64 / 2.0;
        let floor = |apart: f64| rule_floor(apart, dim, u32_, f32::MIN_POSITIVE as f64);
        let reach = |limit: f64| rule_reach(limit, dim, u32_, f32::MIN_POSITIVE as f64);
        let dist = |r: usize, j: usize| rule_distance((rows_q, nq), (x, nx), dim, r, j);
        let (dots, exact) = (AtomicU64::new(0), AtomicU64::new(0));
        let kth = |best: &Vec<(f64, u32)>| kth_of(best, k);
        // Lower bounds on the leaders' distances from each other (f32, rounded down), for
        // the self-kNN where they fit: a query's own leader and its distance from it then
        // bound every other group's distance (`|L_g - L_h| - |q - L_g| - r_h`) before its
        // leader is measured.
        let between: Option<Vec<f32>> = (self_knn && fq.is_none() && groups <= 2048).then(|| {
            (0..groups * groups)
                .into_par_iter()
                .with_min_len(256)
                .map(|c| {
                    let (a, b) = (c / groups, c % groups);
                    // |C_a - C_b|^2 = |C_a|^2 + |C_b|^2 - 2 C_a.C_b (see `pivot_floor`).
                    let d = dot(
                        &index.leaders[a * dim..(a + 1) * dim],
                        &index.leaders[b * dim..(b + 1) * dim],
                    ) as f64;
                    let l = (index.norm2[a] + index.norm2[b] - 2.0 * d - 2.0 * slack)
                        .max(0.0)
                        .sqrt();
                    (l * (1.0 - 1e-6)) as f32
                })
                .collect()
        });
        // Query `r` (f32 copy `qv`; `me` its own row in a self-kNN) visits group h, whose
        // leader is at least `to_leader` from it: the members not ruled out by
        // `to_leader - |x - L_h|` are bounded by their f32 dot products and, in increasing
        // bound, measured by the rule while the bound does not exceed the k-th distance.
        // Returns the dot products taken and the rule distances computed.
        let visit = |r: usize,
                     qv: &[f32],
                     me: Option<u32>,
                     h: usize,
                     to_leader: f64,
                     best: &mut Vec<(f64, u32)>,
                     near: &mut Vec<(f64, u32)>|
         -> (u64, u64) {
            let limit = kth(best);
            // Members farther than `reach` (by the leader's bound) or with a product below
            // `least` (at least `reach` apart by `dist_floor`, which the margin covers) have
            // a floor above the limit: ruled out without one.
            let reach = reach(limit);
            let least = least_dot(reach, slack);
            near.clear();
            // The members left in, then their dot products four at a time (`dot4`).
            near.extend(
                (g.start[h]..g.start[h + 1])
                    .filter(|&s| to_leader - g.to_leader[s] <= reach && me != Some(g.order[s]))
                    .map(|s| (0.0, s as u32)),
            );
            let row = |s: u32| &g.rows[s as usize * dim..(s as usize + 1) * dim];
            let mut four = near.chunks_exact_mut(4);
            for c in &mut four {
                let d = dot4(qv, [row(c[0].1), row(c[1].1), row(c[2].1), row(c[3].1)]);
                for (e, d) in c.iter_mut().zip(d) {
                    e.0 = d as f64;
                }
            }
            for e in four.into_remainder() {
                e.0 = dot(qv, row(e.1)) as f64;
            }
            let measured = near.len() as u64;
            let n_exact = rank_by_floor(near, best, k, f64::INFINITY, least, slack, floor, |s| {
                let j = g.order[s as usize];
                (dist(r, j as usize), j)
            });
            (measured, n_exact)
        };
        let leader = |h: usize| &index.leaders[h * dim..(h + 1) * dim];
        // Query `r` (f32 copy `qv`); `home`: in a self-kNN, its position in the groups'
        // order; `pd`: its dot products with every leader where they were taken for it in
        // blocks (else one at a time, as needed). Visits the groups in increasing lower
        // bound, stopping where the rule's floor of it exceeds the k-th distance. Counts
        // its f32 dot products, rule distances and leaders measured.
        let search = |r: usize,
                      qv: &[f32],
                      me: Option<u32>,
                      home: Option<usize>,
                      pd: Option<&[f32]>|
         -> (Vec<(f64, u32)>, u64, u64, u64) {
            let mut best: Vec<(f64, u32)> = Vec::with_capacity(k + 1);
            let mut near: Vec<(f64, u32)> = Vec::new();
            let (mut n_dots, mut n_exact) = (0u64, 0u64);
            let mut n_leaders = 0u64;
            let mut tally = |(d, e): (u64, u64)| {
                n_dots += d;
                n_exact += e;
            };
            let mut to_leader = |h: usize| {
                n_leaders += 1;
                let d = pd.map_or_else(|| dot(qv, leader(h)), |pd| pd[h]);
                pivot_floor(d, index.norm2[h], slack)
            };
            // A self-kNN's query visits its own group first: the k-th distance it leaves
            // rules most other groups out before any are sorted.
            let own = home.map(|p| (g.start.partition_point(|&st| st <= p) - 1, g.to_leader[p]));
            if let Some((own, _)) = own {
                let l = to_leader(own);
                tally((1, 0));
                tally(visit(r, qv, me, own, l, &mut best, &mut near));
            }
            let others = (0..groups).filter(|&h| Some(h) != own.map(|o| o.0));
            let others = others.filter(|&h| g.start[h + 1] > g.start[h]);
            match (own, &between, pd) {
                (Some((own, mine)), Some(between), None) => {
                    // The others by the leaders' bound, a leader measured only where that
                    // bound leaves its group in.
                    let limit = kth(&best);
                    let mut lb: Vec<(f64, u32)> = others
                        .filter_map(|h| {
                            let b = between[own * groups + h] as f64 - mine - g.radius[h];
                            (floor(b) <= limit).then_some((b, h as u32))
                        })
                        .collect();
                    lb.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                    for &(b, h) in &lb {
                        let limit = kth(&best);
                        if floor(b) > limit {
                            break;
                        }
                        let h = h as usize;
                        let l = to_leader(h).max(between[own * groups + h] as f64 - mine);
                        tally((1, 0));
                        if floor(l - g.radius[h]) > limit {
                            continue;
                        }
                        tally(visit(r, qv, me, h, l, &mut best, &mut near));
                    }
                }
                _ => {
                    // Every leader measured, the groups by `|q - L_h| - r_h` (with the
                    // leaders' bound where it is tighter), those the k-th distance so far
                    // rules out left unsorted.
                    let limit = kth(&best);
                    let mut lb: Vec<(f64, f64, u32)> = others
                        .filter_map(|h| {
                            let mut l = to_leader(h);
                            if let (Some((own, mine)), Some(between)) = (own, &between) {
                                l = l.max(between[own * groups + h] as f64 - mine);
                            }
                            let b = l - g.radius[h];
                            (floor(b) <= limit).then_some((b, l, h as u32))
                        })
                        .collect();
                    tally((n_leaders - own.is_some() as u64, 0));
                    lb.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                    for &(group_lb, l, h) in &lb {
                        if floor(group_lb) > kth(&best) {
                            break;
                        }
                        tally(visit(r, qv, me, h as usize, l, &mut best, &mut near));
                    }
                }
            }
            (best, n_dots, n_exact, n_leaders)
        };
        // The p-th query: self-kNN's in group order (neighbouring queries visit the same
        // groups), A ⋈ B's in input order: its row, f32 copy, own row and home.
        let at = |p: usize| match &fq {
            None => {
                let r = g.order[p];
                let qv = &g.rows[p * dim..(p + 1) * dim];
                (r, qv, self_knn.then_some(r), Some(p))
            }
            Some(fq) => (p as u32, &fq[p * dim..(p + 1) * dim], None, None),
        };
        let query = |p: usize, pd: Option<&[f32]>| {
            let (r, qv, me, home) = at(p);
            (r, search(r as usize, qv, me, home, pd))
        };
        let rows = nq.len();
        let n = nx.len();
        // Clusters that prune little (spread-out data in a few dozen dimensions: the sample
        // finds "groups" at radius 1 that are no real clusters) make the search a slower
        // brute force: a probe of evenly spread queries declines it where their dot
        // products, at GROUPED_DOT_COST each, cost more than the brute force's products
        // per query (half the rows for a self-kNN's symmetric schedule).
        let probe = rows.min(64);
        let (probed, probed_leaders) = (0..probe)
            .into_par_iter()
            .map(|i| {
                let (_, (_, d, _, l)) = query(i * rows / probe, None);
                (d, l)
            })
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let brute = if self_knn { n as f64 / 2.0 } else { n as f64 };
        if probed as f64 * GROUPED_DOT_COST > probe as f64 * brute {
            control.check()?;
            return Ok(None);
        }
        // Where queries measure more than a few of the leaders (loose clusters: most are
        // in reach of the k-th distance), every query's products with all of them are taken
        // in blocks, four queries at a time, at a fraction of the cost of single products.
        let blocked = (probed_leaders as f64 > probe as f64 * groups as f64 / BLOCKED_SHARE)
            .then(|| Blocked::new(&index.leaders, dim));
        const CHUNK: usize = 64;
        control.stage("cosine kNN", rows.div_ceil(CHUNK) as u64);
        let found: Vec<Vec<(u32, Neighbours)>> = (0..rows.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                if control.is_cancelled() {
                    return Vec::new();
                }
                let span = c * CHUNK..((c + 1) * CHUNK).min(rows);
                let mut out = Vec::with_capacity(span.len());
                let mut pd = vec![0.0f32; if blocked.is_some() { 4 * groups } else { 0 }];
                for p in span.clone().step_by(4) {
                    // The last query repeated where fewer than four are left.
                    let four = [p, p + 1, p + 2, p + 3].map(|p| p.min(span.end - 1));
                    if let Some(b) = &blocked {
                        b.dots(four.map(|p| at(p).1), &mut pd);
                    }
                    for (i, p) in four.into_iter().enumerate() {
                        if i > 0 && p == four[i - 1] {
                            break;
                        }
                        let pd = blocked.as_ref().map(|_| &pd[i * groups..][..groups]);
                        let (r, (best, d, e, _)) = query(p, pd);
                        dots.fetch_add(d, Relaxed);
                        exact.fetch_add(e, Relaxed);
                        out.push((r, best));
                    }
                }
                control.advance(1, 0);
                out
            })
            .collect();
        control.check()?;
        let mut ranked: Ranked = vec![Vec::new(); rows];
        for (r, f) in found.into_iter().flatten() {
            debug_assert_eq!(f.len(), k);
            ranked[r as usize] = f;
        }
        let per = |v: &AtomicU64| v.load(Relaxed) as f64 / rows.max(1) as f64;
        let note = format!(
            "cosine kNN: grouped leaders index, {groups} groups (leaders' radius {:.3}) over {} \
             rows; per query {:.0} f32 dot products (leaders included{}) and {:.1} rule \
             distances on average",
            index.radius,
            n,
            per(&dots),
            match blocked {
                Some(_) => ", every leader's in blocks",
                None => "",
            },
            per(&exact)
        );
        Ok(Some((ranked, note, rayon::current_num_threads(), built)))
    })?
}

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

/// The f32 product of unit copies below which a row is out of a query's reach where its
/// k-th distance is `limit`: [`least_dot`] of [`rule_reach`], and the same rounded down to
/// f32 (none at or above it is), for the f32 tests before [`rank_by_floor`].
fn least_below(limit: f64, dim: usize) -> (f64, f32) {
    let u32_ = f32::EPSILON as f64 / 2.0;
    let reach = rule_reach(limit, dim, u32_, f32::MIN_POSITIVE as f64);
    let least = least_dot(reach, crate::cpu::partition::dot_slack(dim));
    let below = least as f32;
    let below = if below as f64 > least {
        below.next_down()
    } else {
        below
    };
    (least, below)
}

/// Queries [`seeds_pay`] seeds, and rows it samples.
const SEED_PROBE: (usize, usize) = (8, 2048);

/// Whether [`seed_caps`] pays before [`knn_brute`]: where the seeds leave most products
/// past their first coordinates anyway (no clusters: uniform directions), its work is lost
/// (about a tenth of the products'). Decided on the first [`SEED_PROBE`] queries' seeds: the
/// share of a sample of rows whose bound by `partition::Bounded`'s first coordinates and
/// rest (`rest_q`: the queries' rest norms) reaches their floors, paying below a quarter.
#[allow(clippy::too_many_arguments)]
fn seeds_pay(
    fx: &[f32],
    fq: &[f32],
    rest_q: &[f32],
    dim: usize,
    k: usize,
    self_knn: bool,
    dist: &(dyn Fn(usize, usize) -> f64 + Sync),
    control: &crate::control::Control,
) -> bool {
    use crate::cpu::partition::{dot, Bounded};
    let (n, m) = (fx.len() / dim.max(1), fq.len() / dim.max(1));
    let pre = Bounded::pre(dim);
    if seed_coords(dim).is_none() || m == 0 {
        return false;
    }
    let probe = m.min(SEED_PROBE.0);
    let caps = seed_caps(fx, &fq[..probe * dim], dim, k, self_knn, dist, control);
    let step = n.div_ceil(SEED_PROBE.1).max(1);
    let below: Vec<f32> = caps.iter().map(|&c| least_below(c, dim).1).collect();
    let (mut met, mut left) = (0usize, 0usize);
    for j in (0..n).step_by(step) {
        let row = &fx[j * dim..(j + 1) * dim];
        let rest = Bounded::rest(row, pre);
        for (r, &below) in below.iter().enumerate() {
            let q = &fq[r * dim..(r + 1) * dim];
            met += 1;
            left += (dot(&q[..pre], &row[..pre]) + rest_q[r] * rest >= below) as usize;
        }
    }
    4 * left < met
}

/// The coordinates [`seed_caps`] ranks rows by: a third of [`Bounded::pre`]'s, at least 40
/// (a query's cluster stands out from far rows by its products over s coordinates, about
/// s / dim against a spread of sqrt(s) / dim, only where sqrt(s) is beyond the far rows'
/// largest deviation, about 5 at 10^5-10^6 rows: 16 of 192 coordinates left 500,000 rows
/// in 5,000 tight clusters with seeds at random). None where that is more than half of
/// `pre` (below 320 dimensions): the seeds would cost about the bounded products' own time
/// (measured at 192-D: 0.89 s of seeds saved 0.62 s).
fn seed_coords(dim: usize) -> Option<usize> {
    let pre = crate::cpu::partition::Bounded::pre(dim);
    let s = (pre / 3).max(40) / 8 * 8;
    (2 * s <= pre).then_some(s)
}

/// Rows of a task of [`seed_caps`], at most (a few dozen tasks a core at 100k rows).
const SEED_TASK: usize = 1024;

/// Rows a query measures by the rule for [`seed_caps`]: enough of its nearest by the heads
/// that at least k of them be near ones where a few far rows' heads come out on top.
fn seed_rows(k: usize) -> usize {
    2 * k + 8
}

/// For each query (rows of `fq`, `dim` wide) an upper bound on its k-th rule distance
/// among the rows of `fx` (f32 unit copies), before any row is met in full, so that
/// [`knn_brute`]'s bounds prune from its first rows on: the rule distance (`dist(query,
/// row)`) of its [`seed_rows`] rows with the largest f32 products over the first
/// [`seed_coords`] coordinates, the k-th of them (infinite where fewer than k rows). Which
/// rows is a guess (on clustered data, mostly the query's own cluster, for about a tenth
/// of the products' work); the bound is exact, any k rows' distances being one.
fn seed_caps(
    fx: &[f32],
    fq: &[f32],
    dim: usize,
    k: usize,
    self_knn: bool,
    dist: &(dyn Fn(usize, usize) -> f64 + Sync),
    control: &crate::control::Control,
) -> Vec<f64> {
    use crate::cpu::partition::{cached_rows, max_of, Blocked};
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Mutex;
    let (n, m) = (fx.len() / dim.max(1), fq.len() / dim.max(1));
    let want = seed_rows(k);
    if m == 0 || n < k + usize::from(self_knn) || k == 0 {
        return vec![f64::INFINITY; m];
    }
    let Some(s) = seed_coords(dim) else {
        return vec![f64::INFINITY; m];
    };
    // Each query's `want` largest heads so far, and the least of them once there are
    // that many (f32 bits, rising), below which a task offers none.
    let lists: Vec<Mutex<Vec<(f32, u32)>>> = (0..m).map(|_| Mutex::new(Vec::new())).collect();
    let least: Vec<AtomicU32> = (0..m)
        .map(|_| AtomicU32::new(f32::NEG_INFINITY.to_bits()))
        .collect();
    let by_head = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    // Tasks of few rows: until its list fills, a query looks at every row of a task.
    let rows = cached_rows(s).min(SEED_TASK);
    control.stage(
        "cosine kNN: bounds from the rows nearest by the first coordinates",
        n.div_ceil(rows) as u64,
    );
    (0..n.div_ceil(rows))
        .into_par_iter()
        .for_each_init(Vec::<(f32, u32)>::new, |top, t| {
            if control.is_cancelled() {
                return;
            }
            let span = t * rows..((t + 1) * rows).min(n);
            let w = span.len();
            let heads = Blocked::prefix(&fx[span.start * dim..span.end * dim], dim, s);
            let mut pd = vec![0.0f32; 4 * w];
            for p in (0..m).step_by(4) {
                let four = [p, p + 1, p + 2, p + 3].map(|p| p.min(m - 1));
                heads.dots(four.map(|r| &fq[r * dim..r * dim + s]), &mut pd);
                for (i, r) in four.into_iter().enumerate() {
                    if i > 0 && r == four[i - 1] {
                        break;
                    }
                    let mut at = f32::from_bits(least[r].load(Relaxed));
                    let pd = &pd[i * w..(i + 1) * w];
                    // Most runs of rows hold none above `at`: seen from their maximum
                    // (vectorised) before any of them is looked at.
                    top.clear();
                    const RUN: usize = 64;
                    for (c, run) in pd.chunks(RUN).enumerate() {
                        if max_of(run) <= at {
                            continue;
                        }
                        for (l, &h) in (c * RUN..).zip(run) {
                            if h > at && !(self_knn && span.start + l == r) {
                                top.push((h, (span.start + l) as u32));
                                // Cut to the largest `want` now and then, raising `at`.
                                if top.len() == 4 * want {
                                    top.select_nth_unstable_by(want - 1, by_head);
                                    top.truncate(want);
                                    at = top.iter().fold(f32::INFINITY, |a, e| a.min(e.0));
                                }
                            }
                        }
                    }
                    if top.is_empty() {
                        continue;
                    }
                    if top.len() > want {
                        top.select_nth_unstable_by(want - 1, by_head);
                        top.truncate(want);
                    }
                    let mut list = lists[r]
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    list.extend_from_slice(top);
                    if list.len() >= want {
                        list.select_nth_unstable_by(want - 1, by_head);
                        list.truncate(want);
                        let low = list.iter().fold(f32::INFINITY, |a, e| a.min(e.0));
                        // Under the lock, and the least of the largest only rises.
                        least[r].store(low.to_bits(), Relaxed);
                    }
                }
            }
            control.advance(1, 0);
        });
    lists
        .into_par_iter()
        .enumerate()
        .map(|(r, list)| {
            let list = list
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if list.len() < k {
                return f64::INFINITY;
            }
            let mut d: Vec<f64> = list.iter().map(|&(_, j)| dist(r, j as usize)).collect();
            d.select_nth_unstable_by(k - 1, f64::total_cmp);
            d[k - 1]
        })
        .collect()
}

/// Each query's k nearest rows by the rule (ties by index), every query meeting every row:
/// their f32 dot products in blocks (`partition::Bounded`, four queries at a time, the
/// collection in tasks of `partition::cached_rows` rows), then [`rank_by_floor`] as the grouped
/// search ranks a group, exact by the same bounds. Each query's k-th distance found so far
/// (an upper bound on its real k-th distance: first [`seed_caps`]'s, then any task's) is
/// shared, so that a row is measured by the rule only where its floor could still place
/// it, and a block of rows is completed past its first quarter of coordinates only where
/// the rest could lift a product to that floor. Each task's k nearest among its rows
/// within that bound (exact) merge into the query's.
#[allow(clippy::too_many_arguments)]
fn knn_brute<T: Coord>(
    engine: &Engine,
    x: &[T],
    rows_q: &[T],
    self_knn: bool,
    dim: usize,
    k: usize,
    nx: &[f64],
    nq: &[f64],
    cx: &[T],
    cq: Option<&[T]>,
    control: &crate::control::Control,
) -> Result<BruteRun> {
    use crate::cpu::partition::{cached_rows, dot_slack, Bounded};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    engine.install(|| -> Result<BruteRun> {
        let fx = as_f32(cx);
        let fq = cq.map(as_f32);
        let fq: &[f32] = fq.as_deref().unwrap_or(&fx);
        let (n, m) = (nx.len(), nq.len());
        let slack = dot_slack(dim);
        let u32_ = f32::EPSILON as f64 / 2.0;
        let floor = |apart: f64| rule_floor(apart, dim, u32_, f32::MIN_POSITIVE as f64);
        let dist = |r: usize, j: usize| rule_distance((rows_q, nq), (x, nx), dim, r, j);
        // Each query's least k-th distance known (f64 bits; rule distances are compared
        // as f64, never by their bits).
        let t = std::time::Instant::now();
        let pre = Bounded::pre(dim);
        let rest_q: Vec<f32> = fq
            .par_chunks_exact(dim)
            .map(|q| Bounded::rest(q, pre))
            .collect();
        let seeds = match seeds_pay(&fx, fq, &rest_q, dim, k, self_knn, &dist, control) {
            true => seed_caps(&fx, fq, dim, k, self_knn, &dist, control),
            false => vec![f64::INFINITY; m],
        };
        control.check()?;
        let cap: Vec<AtomicU64> = seeds.iter().map(|c| AtomicU64::new(c.to_bits())).collect();
        let seeded = t.elapsed().as_secs_f64();
        let least_of = |r: usize| {
            let limit = f64::from_bits(cap[r].load(Relaxed));
            let (least, below) = least_below(limit, dim);
            (limit, least, below)
        };
        let blocks = AtomicU64::new(0);
        let lower = |r: usize, d: f64| {
            let _ = cap[r].fetch_update(Relaxed, Relaxed, |c| {
                (d < f64::from_bits(c)).then_some(d.to_bits())
            });
        };
        // Each query's k nearest so far, merged from the tasks' own (a task ranks into a
        // list of its own, then merges it: memory m k, not m k a task).
        let shared: Vec<std::sync::Mutex<Neighbours>> =
            (0..m).map(|_| std::sync::Mutex::new(Vec::new())).collect();
        let rows = cached_rows(dim);
        let tasks = n.div_ceil(rows);
        control.stage("cosine kNN: every query with every row", tasks as u64);
        (0..tasks).into_par_iter().for_each_init(
            || (Vec::<(f64, u32)>::new(), Neighbours::new()),
            |(near, local), t| {
                if control.is_cancelled() {
                    return;
                }
                let span = t * rows..((t + 1) * rows).min(n);
                let w = span.len();
                let bounded = Bounded::new(&fx[span.start * dim..span.end * dim], dim);
                let mut pd = vec![0.0f32; 4 * w];
                let (mut done, mut completed) = (Vec::new(), 0);
                for p in (0..m).step_by(4) {
                    // The last query repeated where fewer than four are left.
                    let four = [p, p + 1, p + 2, p + 3].map(|p| p.min(m - 1));
                    let bounds = four.map(least_of);
                    completed += bounded.dots_above(
                        four.map(|r| &fq[r * dim..(r + 1) * dim]),
                        four.map(|r| rest_q[r]),
                        bounds.map(|b| b.2),
                        &mut pd,
                        &mut done,
                    );
                    // The rows of the blocks completed (the others' products are below
                    // every `below`).
                    let rows = || {
                        done.iter().flat_map(|&b| {
                            let b = b as usize * Bounded::BLOCK;
                            b..(b + Bounded::BLOCK).min(w)
                        })
                    };
                    for (i, r) in four.into_iter().enumerate() {
                        if i > 0 && r == four[i - 1] {
                            break;
                        }
                        // Most products fall below `least` once the k-th distance is known:
                        // dropped in f32 first, the rest by `rank_by_floor`.
                        let (limit, least, below) = bounds[i];
                        near.clear();
                        let pd = &pd[i * w..(i + 1) * w];
                        near.extend(
                            rows()
                                .filter(|&l| pd[l] >= below && !(self_knn && span.start + l == r))
                                .map(|l| (pd[l] as f64, (span.start + l) as u32)),
                        );
                        // The task's k nearest among its rows within the limit, exact.
                        local.clear();
                        rank_by_floor(near, local, k, limit, least, slack, floor, |j| {
                            (dist(r, j as usize), j)
                        });
                        if local.is_empty() {
                            continue;
                        }
                        let mut best = shared[r]
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for c in local.drain(..) {
                            offer(&mut best, k, c);
                        }
                        if best.len() >= k {
                            lower(r, best[k - 1].0);
                        }
                    }
                }
                blocks.fetch_add(completed as u64, Relaxed);
                control.advance(1, 0);
            },
        );
        let ranked: Ranked = shared
            .into_iter()
            .map(|b| {
                b.into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            })
            .collect();
        control.check()?;
        let all = (4 * m.div_ceil(4) * n).max(1) as f64;
        Ok(BruteRun {
            ranked,
            seeded,
            completed: blocks.into_inner() as f64 / all,
        })
    })?
}

/// [`knn_brute`]'s answer and what its report says: the seconds [`seed_caps`] took, and
/// the share of the products completed past their first coordinates.
struct BruteRun {
    ranked: Ranked,
    seeded: f64,
    completed: f64,
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
    if opts.algorithm == crate::options::Algorithm::Auto {
        if let Some(found) = knn_distinct(engine, x, q, dim, k, opts)? {
            return Ok(found);
        }
    }
    knn_search(engine, x, q, dim, k, opts)
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
        knn_search(engine, ux, q, dim, ku, opts)
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
fn knn_search<T: Coord>(
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
    use crate::cpu::partition;
    let start = std::time::Instant::now();
    let (nx, nq, cx, cq) = prepare(engine, x, q, dim)?;
    opts.control.check()?;
    let prepared = start.elapsed().as_secs_f64();
    let rows_q: &[T] = q.unwrap_or(x);
    let norms_q: &[f64] = nq.as_deref().unwrap_or(&nx);
    let n = nx.len();
    let rows = norms_q.len();
    let candidates = n - usize::from(q.is_none() && n > 0);
    let on_cpu = opts.backend == crate::options::Backend::Cpu
        || (opts.backend == crate::options::Backend::Auto && !engine.auto_gpu());
    let mut declined = None;
    let auto = opts.algorithm == crate::options::Algorithm::Auto && k >= 1 && k <= candidates;
    // Every query meets every row (`knn_brute`), for `why`, after `phases`.
    let brute = |why: String, phases: Vec<(String, f64)>| -> Result<crate::knn::KnnResult> {
        let t = std::time::Instant::now();
        let run = knn_brute(
            engine,
            x,
            rows_q,
            q.is_none(),
            dim,
            k,
            &nx,
            norms_q,
            &cx,
            cq.as_deref(),
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
    if on_cpu && auto && rows < SMALL_QUERIES {
        return brute(format!("< {SMALL_QUERIES}"), Vec::new());
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
    let dist = |r: usize, j: usize| rule_distance((rows_q, norms_q), (x, &nx), dim, r, j);
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
                for e in &mut c {
                    e.0 = dist(r, e.1 as usize);
                }
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
        "cosine kNN: a Euclidean kNN {of} at k' = {wide} ranked by the cosine rule; {} of {rows} rows certain, the rest by a cosine join at their k-th distance",
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
    if !unsure.is_empty() {
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
    let mut report = first.report;
    report
        .phases
        .insert(0, ("cosine: norms and normalised copies".into(), prepared));
    report.notes.extend(notes);
    Ok(knn_result::<T>(ranked, k, report, start))
}

/// The kNN's answer from each row's k nearest (distance, index), distances reported in
/// the input precision as every kNN's are.
fn knn_result<T: Coord>(
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

    /// A row's f32 copy as the grouped join makes it ([`normalised`], then [`as_f32`]).
    fn f32_copy<T: Coord>(x: &[T], n: f64) -> Vec<f32> {
        as_f32(&normalised(x, x.len(), &[n])).into_owned()
    }

    /// Values in [-0.5, 0.5) from a seeded linear congruential generator.
    fn uniform(mut s: u64) -> impl FnMut() -> f64 {
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// The grouped kNN's chain of bounds (an f32 dot product of the f32 copies, `dist_floor`,
    /// `rule_floor`) never exceeds the rule's computed distance: pairs from identical to
    /// far apart, scalar multiples, f32 and f64 rows, 16 to 384 dimensions.
    #[test]
    fn grouped_knn_bounds_stay_below_the_rule() {
        use crate::cpu::partition::{dist_floor, dot, dot_slack};
        use crate::metric::{cosine_distance, norm};
        fn check<T: Coord>(a: &[T], b: &[T]) -> bool {
            let dim = a.len();
            let (na, nb) = (norm(a), norm(b));
            let (ca, cb) = (f32_copy(a, na), f32_copy(b, nb));
            let apart = dist_floor(dot(&ca, &cb), dot_slack(dim));
            let bound = rule_floor(
                apart,
                dim,
                f32::EPSILON as f64 / 2.0,
                f32::MIN_POSITIVE as f64,
            );
            let rule = cosine_distance(a, b, na, nb);
            assert!(bound <= rule, "{dim}-D: bound {bound} > rule {rule}");
            bound > f64::NEG_INFINITY
        }
        let mut rnd = uniform(7);
        let mut proved = 0;
        for dim in [16usize, 64, 384] {
            for t in 0..3000 {
                let a: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                let step = [0.0, 1e-9, 1e-6, 1e-4, 1e-2, 0.1, 1.0, 10.0][t % 8];
                let f = [1.0, 0.5, 3.0][t % 3];
                let b: Vec<f64> = a.iter().map(|v| (v + step * rnd()) * f).collect();
                let (a32, b32): (Vec<f32>, Vec<f32>) = (
                    a.iter().map(|&v| v as f32).collect(),
                    b.iter().map(|&v| v as f32).collect(),
                );
                proved += usize::from(check(&a, &b)) + usize::from(check(&a32, &b32));
            }
        }
        // The bound proves something for most pairs (the far ones), not only -inf.
        assert!(proved > 6000, "{proved}");
    }

    /// A pair whose copies' f32 dot product (by `partition::dot`, a plain sum either way
    /// round) reaches `sure_dot` is one the rule accepts: pairs placed within a few f32
    /// rounding errors of the threshold on either side, f32 and f64 rows of norms 1e-3 to
    /// 1e3, 2 to 1024 dimensions. The data must hold pairs the rule rejects whose product
    /// reaches 1 - e itself (a bound without the slack would take them), and `sure_dot`
    /// must stay within a slack of 1 - e (or it would take nothing).
    #[test]
    fn sure_dot_admits_only_pairs_the_rule_accepts() {
        use crate::cpu::partition::{dot, dot_slack};
        use crate::metric::{cosine_within, norm};
        let mut rnd = uniform(11);
        // (sure, rejected by the rule though the product reached 1 - e)
        let mut seen = (0usize, 0usize);
        fn check<T: Coord>(a: &[T], b: &[T], e: f64, seen: &mut (usize, usize)) {
            let dim = a.len();
            let (na, nb) = (norm(a), norm(b));
            let (ca, cb) = (f32_copy(a, na), f32_copy(b, nb));
            let sure = sure_dot(e, dim, dot_slack(dim));
            let accepts = cosine_within(a, b, na, nb, e);
            let forward = ca.iter().zip(&cb).fold(0.0f32, |s, (x, y)| s + x * y);
            let backward = ca.iter().zip(&cb).rev().fold(0.0f32, |s, (x, y)| s + x * y);
            for d in [dot(&ca, &cb), forward, backward] {
                if d >= sure {
                    assert!(
                        accepts,
                        "{dim}-D, e {e}: product {d} >= {sure}, rule rejects"
                    );
                    seen.0 += 1;
                }
                if !accepts && d as f64 >= 1.0 - e {
                    seen.1 += 1;
                }
            }
        }
        for dim in [2usize, 16, 64, 384, 1024] {
            let ulps = (dim as f64 + 4.0) * f32::EPSILON as f64 / 2.0;
            for e in [1e-3f32, 0.01, 0.1, 0.5] {
                let e = e as f64;
                let slack = dot_slack(dim);
                let sure = sure_dot(e, dim, slack) as f64;
                assert!(
                    sure > 1.0 - e && sure - (1.0 - e) < slack * 1.01 + 1e-7,
                    "{sure}"
                );
                for t in 0..400 {
                    // u, and w orthogonal to it, unit; b at cosine 1 - e + off from a.
                    let u: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                    let nu = u.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let u: Vec<f64> = u.iter().map(|v| v / nu).collect();
                    let mut w: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                    let along: f64 = w.iter().zip(&u).map(|(x, y)| x * y).sum();
                    w.iter_mut().zip(&u).for_each(|(x, y)| *x -= along * y);
                    let nw = w.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let off = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0][t % 9]
                        * ulps
                        * (1.0 + rnd());
                    let c = 1.0 - e + off;
                    let sin = (1.0 - c * c).max(0.0).sqrt();
                    let (fa, fb) = (10f64.powf(6.0 * rnd()), 10f64.powf(6.0 * rnd()));
                    let a: Vec<f64> = u.iter().map(|v| v * fa).collect();
                    let b: Vec<f64> = u
                        .iter()
                        .zip(&w)
                        .map(|(x, y)| (c * x + sin * y / nw) * fb)
                        .collect();
                    let (a32, b32): (Vec<f32>, Vec<f32>) = (
                        a.iter().map(|&v| v as f32).collect(),
                        b.iter().map(|&v| v as f32).collect(),
                    );
                    check(&a, &b, e, &mut seen);
                    check(&a32, &b32, e, &mut seen);
                }
            }
        }
        assert!(seen.0 > 2000 && seen.1 > 100, "{seen:?}");
    }

    /// `rule_reach` is at least the largest distance whose `rule_floor` is within the
    /// limit (found by bisection: the floor is non-decreasing), and hardly more (so the
    /// search's early rule-out has an effect), for f32 and f64 copies in 2-1024 dimensions.
    #[test]
    fn rule_reach_inverts_the_floor() {
        let mut next = uniform(17);
        for dim in [2usize, 16, 384, 1024] {
            for (u, min) in [
                (f32::EPSILON as f64 / 2.0, f32::MIN_POSITIVE as f64),
                (f64::EPSILON / 2.0, f64::MIN_POSITIVE),
            ] {
                for _ in 0..2000 {
                    // Limits from below zero (nothing ranked yet has a floor there) to 2.
                    let limit = 2.0 * next().powi(3) - 1e-3 * next();
                    let reach = rule_reach(limit, dim, u, min);
                    let (mut lo, mut hi) = (0.0f64, 4.0f64);
                    for _ in 0..200 {
                        let mid = (lo + hi) / 2.0;
                        match rule_floor(mid, dim, u, min) <= limit {
                            true => lo = mid,
                            false => hi = mid,
                        }
                    }
                    assert!(lo <= reach, "{dim}-D u {u:e} limit {limit}: {lo} > {reach}");
                    assert!(
                        reach <= lo * (1.0 + 1e-8) + 1e-11,
                        "{dim}-D: {reach} >> {lo}"
                    );
                    // Points beyond `reach` have floors above the limit.
                    let beyond = reach * (1.0 + 1e-15) + 1e-300;
                    assert!(rule_floor(beyond, dim, u, min) > limit, "{dim}-D {limit}");
                }
            }
        }
        assert_eq!(rule_reach(f64::INFINITY, 8, 1e-8, 0.0), f64::INFINITY);
    }

    /// `up_to` is the least value of T at or above e.
    #[test]
    fn up_to_rounds_up_to_the_precision() {
        for &e in &[1e-12, 0.1119809780682628, 0.25, 1.0 / 3.0, 1.9999999] {
            let (u32_, u64_) = (up_to::<f32>(e), up_to::<f64>(e));
            assert_eq!(u64_, e);
            assert_eq!(u32_ as f32 as f64, u32_);
            assert!(u32_ >= e);
            assert!(
                (f32::from_bits((u32_ as f32).to_bits() - 1) as f64) < e,
                "{e}"
            );
        }
    }

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
