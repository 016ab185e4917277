//! Cosine joins: the Euclidean join of the normalised copies at a widened eps, the
//! projection first where the vectors lie near a low-dimensional subspace, the grouped
//! join where they form clusters; every candidate confirmed by the rule.

use super::*;

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
    let auto = opts.algorithm == crate::options::Algorithm::Auto;
    // A few queries (A) against a large B: compared in blocks (`Plan::brute`), whatever the
    // data, with B's f32 copies made a block at a time where they are met: a copy of the
    // whole of B first cost as long as the queries' products. On the CPU only (a device
    // uploads whole sides; `auto` keeps these plans on the CPU).
    let (n_a, n_b) = (a.len() / dim.max(1), b.map(|b| b.len() / dim.max(1)));
    let few = auto
        && opts.backend != crate::options::Backend::Gpu
        && n_b.is_some_and(|n_b| n_b > n_a && crate::cpu::partition::small_side(n_a, n_b, dim));
    let (na, nb, ca, cb) = prepare(engine, a, b, dim, (true, !few))?;
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
    let t = std::time::Instant::now();
    // Vectors near a low-dimensional subspace: a Euclidean join of their projections,
    // first where the sample's leaders keep growing (else after the grouped index).
    let fit = match auto && !few {
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
    let make_b = |span: std::ops::Range<usize>| unit_rows_f32(rule.b, rule.nb, dim, span, dim);
    let made: Option<&crate::cpu::partition::MakeRows> = match few {
        true => Some(&make_b),
        false => None,
    };
    let in_groups = |brute: bool, sink: Option<&mut dyn PairSink>| -> Result<Option<JoinReport>> {
        let report = grouped(
            engine,
            &rule,
            (&ca, cb.as_deref()),
            made,
            eps32,
            opts,
            brute,
            sink,
        )?;
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
    if few {
        // Its plan never declines; the joins below would need B's copy.
        return Err(crate::error::Error::new(
            crate::error::ErrorKind::Internal,
            "a few queries' blocked brute force declined",
        ));
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
    let mut confirm = Confirm::new(|c: &[Pair]| rule.keep(c), reborrow(&mut sink));
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
    let mut confirm = Confirm::new(|c: &[Pair]| rule.keep(c), sink);
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

/// The grouped join of clustered vectors (`cpu/partition/`): the plan on the CPU, its
/// comparisons on the device where the join runs on a GPU (`gpu/grouped.rs`), else on the
/// CPU; candidates from the f32 copies, confirmed by the rule on every engine thread (but
/// for those past [`sure_dot`]) and passed to `sink`; None (nothing emitted) where the data
/// show no clusters. With `brute`, the plan is a blocked brute force (`Plan::brute`: every
/// pair of rows in the device's tiles), run only on a device (else None). With `made`,
/// B's copy is not given (`cb` empty): the plan is [`Plan::brute_made`] of B's rows made
/// a block at a time, on the CPU.
///
/// [`Plan::brute_made`]: crate::cpu::partition::Plan::brute_made
#[allow(clippy::too_many_arguments)]
fn grouped<'d, T: Coord>(
    engine: &Engine,
    rule: &Rule<T>,
    (ca, cb): (&[T], Option<&[T]>),
    made: Option<&crate::cpu::partition::MakeRows>,
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
                rule.keep(chunk).into()
            };
            candidates.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            accepted.fetch_add(kept.len() as u64, std::sync::atomic::Ordering::Relaxed);
            opts.control.advance(0, kept.len() as u64);
            match sink
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref_mut()
            {
                Some(s) if !kept.is_empty() => crate::cpu::holding(|| s.push(&kept)),
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
            let planned = match (made, brute) {
                (Some(make_b), _) => Some(Ok(partition::Plan::brute_made(
                    &fa,
                    rule.nb.len(),
                    make_b,
                    dim,
                    eps,
                ))),
                (None, true) => Some(Ok(partition::Plan::brute(&fa, fb.as_deref(), dim, eps))),
                (None, false) => {
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
            // (A plan whose B rows are made where met runs on the CPU.)
            let worth = (opts.backend != crate::options::Backend::Auto || AUTO_GROUPED_ON_GPU)
                && made.is_none();
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
