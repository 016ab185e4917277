//! Haversine joins (`Metric::Haversine`: (latitude, longitude) in degrees, eps and
//! distances in metres) on every backend. Each point becomes the rule's f64 unit vector
//! (`metric::geo_unit_vector`, a copy of 24 bytes a point); the vectors are joined under
//! Euclidean distance at an eps a hair above the chord `sqrt(C)` of the rule, and each
//! candidate is confirmed by the rule (`c <= C`, `metric::geo_chord2`), so the answer is
//! the rule's set whichever backend and algorithm found the candidates.
//!
//! Why the Euclidean join finds every pair: the rule's `c` is by definition the f64
//! Euclidean accumulator of the two vectors in canonical order (every backend computes it
//! bit for bit, `metric.rs`), and the Euclidean threshold `eps_w * eps_w` with
//! `eps_w = sqrt(C) (1 + 1e-9)` is above `C` whatever the rounding of the square root and
//! the square. kNN ranks by `c` and then by index, which is exactly the Euclidean kNN of
//! the vectors: it runs as one, and its distances are converted to metres.

use crate::dataset::{Coords, Dataset, Precision};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::knn::{KnnOptions, KnnResult};
use crate::metric::{
    check_geo, geo_chord2, geo_chord_threshold, geo_distance_m, geo_unit_vector, threshold, Coord,
    EARTH_RADIUS_M,
};
use crate::options::{JoinOptions, Metric};
use crate::result::{Confirm, Distances, JoinReport, Pair, PairSink};
use rayon::prelude::*;

/// The Euclidean eps under which the vectors hold every pair with `c <= c_thr`.
fn widened_eps(c_thr: f64) -> f64 {
    if c_thr.is_infinite() {
        // Every pair: unit vectors are at most 2 (plus rounding) apart.
        4.0
    } else {
        c_thr.sqrt() * (1.0 + 1e-9)
    }
}

/// The rows' unit vectors (3 f64 a row), the rows checked: 2 columns, finite, latitude
/// within [-90, 90].
fn vectors(data: &Dataset) -> Result<Vec<f64>> {
    if data.dim() != 2 {
        return Err(Error::invalid(format!(
            "haversine points are 2 columns, (latitude, longitude) in degrees; the data have {}",
            data.dim()
        )));
    }
    fn typed<T: Coord>(x: &[T]) -> Result<Vec<f64>> {
        let rows: Vec<Result<[f64; 3]>> = x
            .par_chunks_exact(2)
            .enumerate()
            .map(|(r, p)| {
                let (lat, lon) = (p[0].to_f64(), p[1].to_f64());
                check_geo(lat, lon, r)?;
                Ok(geo_unit_vector(lat, lon))
            })
            .collect();
        let mut out = Vec::with_capacity(rows.len() * 3);
        for r in rows {
            out.extend_from_slice(&r?);
        }
        Ok(out)
    }
    match data.coords() {
        Coords::F32(x) => typed(x),
        Coords::F64(x) => typed(x),
    }
}

fn row(v: &[f64], i: usize) -> &[f64; 3] {
    v[i * 3..i * 3 + 3].try_into().expect("3 coordinates")
}

/// The haversine join `a ⋈ b` (self-join when `b` is None) into `sink` (count only when
/// None), as `Engine::run` runs any join (after `check_join`).
pub(crate) fn run(
    engine: &Engine,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &JoinOptions,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    let t = std::time::Instant::now();
    let (va, vb) = engine.install(|| -> Result<_> {
        let va = vectors(a)?;
        let vb = b.map(vectors).transpose()?;
        Ok((va, vb))
    })??;
    opts.control.check()?;
    let prepared = t.elapsed().as_secs_f64();
    let e = match a.precision() {
        Precision::F32 => f64::from(threshold::<f32>(Metric::Haversine, opts.eps)),
        Precision::F64 => opts.eps,
    };
    let c_thr = geo_chord_threshold(e, opts.sphere_radius);
    let mut euclid = opts.clone();
    euclid.metric = Metric::Euclidean;
    euclid.sphere_radius = EARTH_RADIUS_M;
    euclid.eps = widened_eps(c_thr);
    let da = Dataset::from_f64(&va, 3)?;
    let db = vb.as_deref().map(|v| Dataset::from_f64(v, 3)).transpose()?;
    let vb_or_a = vb.as_deref().unwrap_or(&va);
    let accepts =
        |[i, j]: Pair| geo_chord2(row(&va, i as usize), row(vb_or_a, j as usize)) <= c_thr;
    let keep = |c: &[Pair]| c.iter().copied().filter(|&p| accepts(p)).collect();
    let mut confirm = Confirm::new(keep, sink);
    let mut report = match &db {
        None => engine.self_join_stream(&da, &euclid, &mut confirm),
        Some(db) => engine.join_stream(&da, db, &euclid, &mut confirm),
    }?;
    report.pairs = confirm.accepted;
    report
        .phases
        .insert(0, ("haversine: unit vectors".into(), prepared));
    report.notes.push(format!(
        "haversine: a Euclidean join of the f64 unit vectors at eps {:.9e} (the chord of \
         {e} m, widened 1e-9) found {} candidates, {} confirmed by the rule",
        euclid.eps, confirm.candidates, confirm.accepted
    ));
    Ok(report)
}

/// The haversine kNN: the Euclidean kNN of the unit vectors (it ranks by the rule's `c`,
/// then by index), distances converted to metres from `c` and rounded to the input
/// precision.
pub(crate) fn knn(
    engine: &Engine,
    data: &Dataset,
    query: Option<&Dataset>,
    k: usize,
    opts: &KnnOptions,
) -> Result<KnnResult> {
    if let Some(q) = query {
        if q.precision() != data.precision() {
            return Err(Error::invalid(
                "data and queries must have the same precision (both f32 or both f64)",
            ));
        }
    }
    let t = std::time::Instant::now();
    let (vd, vq) = engine.install(|| -> Result<_> {
        let vd = vectors(data)?;
        let vq = query.map(vectors).transpose()?;
        Ok((vd, vq))
    })??;
    let prepared = t.elapsed().as_secs_f64();
    let dd = Dataset::from_f64(&vd, 3)?;
    let dq = vq.as_deref().map(|v| Dataset::from_f64(v, 3)).transpose()?;
    let mut euclid = opts.clone();
    euclid.metric = Metric::Euclidean;
    euclid.sphere_radius = EARTH_RADIUS_M;
    let mut result = engine.knn(&dd, dq.as_ref(), k, &euclid)?;
    let qv: &[f64] = vq.as_deref().unwrap_or(&vd);
    let metres = |e: usize| {
        let (r, j) = (e / k, result.indices[e] as usize);
        geo_distance_m(geo_chord2(row(qv, r), row(&vd, j)), opts.sphere_radius)
    };
    let n = result.indices.len();
    let distances = engine.install(|| match data.precision() {
        Precision::F32 => {
            Distances::F32((0..n).into_par_iter().map(|e| metres(e) as f32).collect())
        }
        Precision::F64 => Distances::F64((0..n).into_par_iter().map(metres).collect()),
    })?;
    result.distances = distances;
    result
        .report
        .phases
        .insert(0, ("haversine: unit vectors".into(), prepared));
    result.report.notes.push(
        "haversine: a Euclidean kNN of the f64 unit vectors (ranked by the chord squared), \
         distances in metres"
            .into(),
    );
    Ok(result)
}
