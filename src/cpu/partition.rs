//! Candidate pairs of a cosine join on clustered high-dimensional data (embeddings), far
//! fewer than all pairs: the unit vectors are grouped around leaders, and two groups
//! farther apart than their radii plus eps are never compared.
//!
//! In many dimensions eps-grids and boxes prune nothing, but embeddings lie in clusters.
//! Leaders are picked from a sample (each sampled vector farther than `radius` from every
//! leader so far becomes one); every vector joins its nearest leader, and each group keeps
//! its largest distance from its leader. Groups `a`, `b` can hold a pair within eps only
//! if `|L_a - L_b| <= r_a + r_b + eps` (triangle inequality); the surviving pairs of groups
//! are compared in f32 dot products, and a pair goes on as a candidate unless its dot
//! product proves it farther than eps (the bound covers f32's rounding and the copies'
//! norms). The caller (`src/cosine.rs`) confirms every candidate by cosine's exact rule, so
//! this only has to keep every pair within the (widened) eps, which the bounds guarantee.
//! Where a sample finds no clusters at this radius (uniform data on the sphere), it declines
//! and the caller runs the general join.

use crate::control::Control;
use crate::result::Pair;
use rayon::prelude::*;

/// Vectors sampled to choose leaders: an eighth of them, within these bounds (enough to
/// meet every cluster of a few dozen vectors; the leaders' pass costs sample x leaders).
const SAMPLE_MIN: usize = 4096;
const SAMPLE_MAX: usize = 16384;
/// Leaders per sampled vector above which the data have no clusters at this radius.
const MAX_LEADER_SHARE: f64 = 0.5;
/// Fewest vectors for which grouping pays.
const MIN_POINTS: usize = 4096;

/// `sum a_i b_i` in f32, in any order (the bounds below hold for any): with AVX2 and FMA
/// where the CPU has them, else over eight lanes.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { dot_fma(a, b) };
    }
    dot_lanes(a, b)
}

/// Whether AVX2 and FMA are available (detected once).
#[cfg(target_arch = "x86_64")]
fn fma() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(super::dot_filter::fma_available)
}

/// [`dot`] with 256-bit fused multiply-adds, two accumulators.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n, so both 8-float loads at i and i + 8 are in bounds.
        unsafe {
            s0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                s0,
            );
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                s1,
            );
        }
        i += 16;
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(s0, s1)) };
    let mut s = lanes.iter().sum::<f32>();
    for k in i..n {
        s += a[k] * b[k];
    }
    s
}

/// [`dot`] of `p` with four rows at once (the same sums in another order, so the same
/// bounds hold): `p` is loaded once for the four, and the four sums run side by side.
#[inline]
pub(crate) fn dot4(p: &[f32], r: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { dot4_fma(p, r) };
    }
    r.map(|x| dot_lanes(p, x))
}

/// [`dot4`] with 256-bit fused multiply-adds.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_fma(p: &[f32], r: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = r.iter().fold(p.len(), |n, x| n.min(x.len()));
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, within `p` and every row of `r`.
        unsafe {
            let x = _mm256_loadu_ps(p.as_ptr().add(i));
            for j in 0..4 {
                acc[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(r[j].as_ptr().add(i)), acc[j]);
            }
        }
        i += 8;
    }
    let mut out = [0.0f32; 4];
    for j in 0..4 {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j]) };
        let mut s = lanes.iter().sum::<f32>();
        for t in i..n {
            s += p[t] * r[j][t];
        }
        out[j] = s;
    }
    out
}

/// [`dot`] over eight lanes (vectorised by the compiler).
#[inline]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Exact-enough Euclidean distance in f64 between two f32 rows.
fn dist64(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = x as f64 - y as f64;
            d * d
        })
        .sum::<f64>()
        .sqrt()
}

/// The slack of a comparison through an f32 dot product of two f32 copies of unit vectors:
/// their squared norms are within (dim + 2) u_f32 of 1 (rounded unit vectors) and the f32
/// dot product (any order) within (dim + 2) u_f32 |a| |b| of the real one, so
/// `|a - b|^2 >= 2 - 2 dot - 2 slack` with room (the slack covers each error twice, and
/// the f64 arithmetic that evaluates the bound).
pub(crate) fn dot_slack(dim: usize) -> f64 {
    let u = f32::EPSILON as f64 / 2.0;
    4.0 * (dim as f64 + 4.0) * u
}

/// A lower bound on the real Euclidean distance of two f32 copies of unit vectors whose
/// f32 dot product (by [`dot`]) is `dot` (see [`dot_slack`]).
#[inline]
pub(crate) fn dist_floor(dot: f32, slack: f64) -> f64 {
    (2.0 - 2.0 * dot as f64 - 2.0 * slack).max(0.0).sqrt()
}

/// Groups of vectors: `order` lists the vectors group by group (`start[g]..start[g + 1]`),
/// `rows` holds them in that order, and `radius[g]` is the largest distance of group g's
/// vectors from its leader (f64, rounded up).
pub(crate) struct Groups {
    pub(crate) order: Vec<u32>,
    pub(crate) start: Vec<usize>,
    pub(crate) rows: Vec<f32>,
    pub(crate) radius: Vec<f64>,
    /// Each vector's distance from its leader (in `order`'s order), rounded up.
    pub(crate) to_leader: Vec<f64>,
}

/// A grouped index of unit vectors for the kNN: the leaders (`dim` wide, row-major) and
/// the groups around them.
pub(crate) struct Index {
    pub(crate) leaders: Vec<f32>,
    pub(crate) groups: Groups,
    /// The leaders' radius (the sample's covering distance).
    pub(crate) radius: f64,
}

/// The grouped index of the unit vectors `x` (f32 copies, `dim` wide) for a kNN, or None
/// where grouping does not pay (too few vectors or dimensions, no clusters) or `control`
/// stopped it. No eps sets the leaders' radius here: it steps down from 1 until the sample
/// has about sqrt(n) / 2 leaders (a query then measures about as many leaders as members
/// of the groups it visits), keeping the last radius before the sample stops showing
/// clusters (`leaders` declines, or more than 16 times the target would lead); declines
/// where even radius 1 finds none.
pub(crate) fn knn_index(x: &[f32], dim: usize, control: &Control) -> Option<Index> {
    let n = x.len() / dim;
    if n < MIN_POINTS || dim < 16 {
        return None;
    }
    let target = ((n as f64).sqrt() / 2.0) as usize;
    // Many more leaders than the target cost every vector's assignment and buy nothing.
    let most = (16 * target).max(1024);
    let mut radius = 1.0f64;
    let mut best: Option<(Vec<f32>, f64)> = None;
    while radius > 0.05 {
        if control.is_cancelled() {
            return None;
        }
        match leaders_capped(x, dim, radius, most) {
            None => break,
            Some(l) => {
                let enough = l.len() / dim >= target;
                best = Some((l, radius));
                if enough {
                    break;
                }
            }
        }
        radius *= 0.8;
    }
    let (leaders, radius) = best?;
    let groups = group(x, dim, &leaders, control)?;
    Some(Index {
        leaders,
        groups,
        radius,
    })
}

/// Leaders from an even sample of `x` (`n` rows of `dim`), or None where more than
/// `MAX_LEADER_SHARE` of the sample would lead (no clusters at this radius).
fn leaders(x: &[f32], dim: usize, radius: f64) -> Option<Vec<f32>> {
    leaders_capped(x, dim, radius, usize::MAX)
}

/// [`leaders`], declining also where more than `most` would lead.
fn leaders_capped(x: &[f32], dim: usize, radius: f64, most: usize) -> Option<Vec<f32>> {
    let n = x.len() / dim;
    let sample = (n / 8).clamp(SAMPLE_MIN, SAMPLE_MAX).min(n);
    let step = (n / sample).max(1);
    let cap = ((sample as f64 * MAX_LEADER_SHARE) as usize).min(most);
    let mut out: Vec<f32> = Vec::new();
    // Unit vectors: |a - b|^2 = 2 - 2 a.b, so "within radius" is a.b >= 1 - radius^2 / 2
    // (a rough choice: the bounds below use the exact distances).
    let near = (1.0 - radius * radius / 2.0) as f32;
    for i in (0..n).step_by(step) {
        let p = &x[i * dim..(i + 1) * dim];
        if !out.chunks_exact(dim).any(|l| dot(l, p) >= near) {
            if out.len() / dim >= cap {
                return None;
            }
            out.extend_from_slice(p);
        }
    }
    Some(out)
}

fn group(x: &[f32], dim: usize, leaders: &[f32], control: &Control) -> Option<Groups> {
    let n = x.len() / dim;
    let k = leaders.len() / dim;
    // Each vector's nearest leader (largest dot product; the first of equals), in tiles of
    // TILE vectors that meet every leader while four of them stay in the L1 cache.
    const TILE: usize = 32;
    let nearest: Vec<u32> = x
        .par_chunks(TILE * dim)
        .enumerate()
        .flat_map_iter(|(c, tile)| {
            let m = tile.len() / dim;
            let mut best: Vec<(f32, u32)> = vec![(f32::NEG_INFINITY, 0u32); m];
            let quads = leaders.chunks_exact(4 * dim);
            let rest = quads.remainder();
            // Stopped: every leader skipped (the caller discards the answer).
            let quads = quads.take(if c % 128 == 0 && control.is_cancelled() {
                0
            } else {
                usize::MAX
            });
            for (q, l) in quads.enumerate() {
                let ls = [
                    &l[..dim],
                    &l[dim..2 * dim],
                    &l[2 * dim..3 * dim],
                    &l[3 * dim..],
                ];
                for (p, b) in tile.chunks_exact(dim).zip(best.iter_mut()) {
                    for (t, d) in dot4(p, ls).into_iter().enumerate() {
                        if d > b.0 {
                            *b = (d, (4 * q + t) as u32);
                        }
                    }
                }
            }
            for (g, l) in rest.chunks_exact(dim).enumerate() {
                for (p, b) in tile.chunks_exact(dim).zip(best.iter_mut()) {
                    let d = dot(l, p);
                    if d > b.0 {
                        *b = (d, (k - rest.len() / dim + g) as u32);
                    }
                }
            }
            best.into_iter().map(|b| b.1)
        })
        .collect();
    control.check().ok()?;
    let mut start = vec![0usize; k + 1];
    for &g in &nearest {
        start[g as usize + 1] += 1;
    }
    for g in 0..k {
        start[g + 1] += start[g];
    }
    let mut fill = start.clone();
    let mut order = vec![0u32; n];
    for (i, &g) in nearest.iter().enumerate() {
        order[fill[g as usize]] = i as u32;
        fill[g as usize] += 1;
    }
    let mut rows = Vec::with_capacity(x.len());
    rows.extend(
        order
            .iter()
            .flat_map(|&i| &x[i as usize * dim..(i as usize + 1) * dim]),
    );
    // Rounded up past f64's error in a sum of `dim` terms.
    let to_leader: Vec<f64> = (0..n)
        .into_par_iter()
        .map(|s| {
            let g = nearest[order[s] as usize] as usize;
            dist64(
                &leaders[g * dim..(g + 1) * dim],
                &rows[s * dim..(s + 1) * dim],
            ) * (1.0 + 1e-9)
        })
        .collect();
    let radius: Vec<f64> = (0..k)
        .map(|g| {
            to_leader[start[g]..start[g + 1]]
                .iter()
                .copied()
                .fold(0.0f64, f64::max)
        })
        .collect();
    Some(Groups {
        order,
        start,
        rows,
        radius,
        to_leader,
    })
}

/// Candidate pairs of the self-join (`b` None, pairs `[i, j]`, i < j) or A ⋈ B of the
/// unit vectors `a`, `b` (f32 copies, `dim` wide) within Euclidean distance `eps`, handed
/// to `emit` in chunks from the engine's threads; None where the data show no clusters
/// (nothing was emitted then). `control` is read between pairs of groups.
pub(crate) fn candidates(
    a: &[f32],
    b: Option<&[f32]>,
    dim: usize,
    eps: f64,
    control: &Control,
    emit: &(dyn Fn(&[Pair]) -> anyhow::Result<()> + Sync),
) -> Option<crate::error::Result<String>> {
    let na = a.len() / dim;
    if na < MIN_POINTS || dim < 16 {
        return None;
    }
    let lead = leaders(a, dim, eps)?;
    let ga = group(a, dim, &lead, control)?;
    let gb = match b {
        Some(b) => Some(group(b, dim, &lead, control)?),
        None => None,
    };
    let gb_ref = gb.as_ref().unwrap_or(&ga);
    let k = lead.len() / dim;
    // A pair within eps has a.b >= (|a|^2 + |b|^2 - eps^2) / 2 >= 1 - eps^2 / 2 - slack
    // (`dot_slack`).
    let slack = dot_slack(dim);
    let floor = (1.0 - eps * eps / 2.0 - slack) as f32;
    let lead = &lead[..];
    let ga = &ga;
    let pairs_of_groups: Vec<(u32, u32, f64)> = (0..k as u32)
        .into_par_iter()
        .flat_map_iter(|g| {
            let lg = &lead[g as usize * dim..(g as usize + 1) * dim];
            let first = if b.is_none() { g } else { 0 };
            (first..k as u32).filter_map(move |h| {
                let (sa, sb) = (
                    ga.start[g as usize + 1] - ga.start[g as usize],
                    gb_ref.start[h as usize + 1] - gb_ref.start[h as usize],
                );
                if sa == 0 || sb == 0 {
                    return None;
                }
                let lh = &lead[h as usize * dim..(h as usize + 1) * dim];
                let gap = if g == h {
                    0.0
                } else {
                    dist64(lg, lh) * (1.0 - 1e-9)
                };
                (gap <= ga.radius[g as usize] + gb_ref.radius[h as usize] + eps * (1.0 + 1e-9))
                    .then_some((g, h, gap))
            })
        })
        .collect();
    let compared = std::sync::atomic::AtomicU64::new(0);
    control.stage("join", pairs_of_groups.len() as u64);
    let result: anyhow::Result<()> = pairs_of_groups.par_iter().try_for_each(|&(g, h, gap)| {
        if control.is_cancelled() {
            return Ok(());
        }
        let (ra, rb) = (
            ga.start[g as usize]..ga.start[g as usize + 1],
            gb_ref.start[h as usize]..gb_ref.start[h as usize + 1],
        );
        let same = b.is_none() && g == h;
        // A vector within eps of some vector of the other group is within that group's
        // radius plus eps of its leader (triangle inequality): the rest are skipped. The
        // leaders' distance less the vector's own distance from its leader bounds that
        // distance from below at no cost; the survivors are measured.
        let near = |gr: &Groups, range: std::ops::Range<usize>, other: u32, r: f64| {
            let l = &lead[other as usize * dim..(other as usize + 1) * dim];
            let reach = (r + eps) * (1.0 + 1e-9);
            range
                .filter(|&s| {
                    gap - gr.to_leader[s] <= reach
                        && dist64(&gr.rows[s * dim..(s + 1) * dim], l) <= reach
                })
                .collect::<Vec<usize>>()
        };
        let (sa, sb) = if same {
            (ra.clone().collect(), rb.clone().collect())
        } else {
            let sa = near(ga, ra.clone(), h, gb_ref.radius[h as usize]);
            if sa.is_empty() {
                control.advance(1, 0);
                return Ok(());
            }
            (sa, near(gb_ref, rb.clone(), g, ga.radius[g as usize]))
        };
        let mut buf: Vec<Pair> = Vec::new();
        for (x, &s) in sa.iter().enumerate() {
            let p = &ga.rows[s * dim..(s + 1) * dim];
            let i = ga.order[s];
            let from = if same { x + 1 } else { 0 };
            for &t in &sb[from.min(sb.len())..] {
                let q = &gb_ref.rows[t * dim..(t + 1) * dim];
                if dot(p, q) >= floor {
                    let j = gb_ref.order[t];
                    buf.push(if b.is_none() {
                        [i.min(j), i.max(j)]
                    } else {
                        [i, j]
                    });
                }
            }
        }
        compared.fetch_add(
            (sa.len() * sb.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        control.advance(1, 0);
        if buf.is_empty() {
            Ok(())
        } else {
            emit(&buf)
        }
    });
    if let Err(e) = result {
        return Some(Err(crate::result::sink_error(e)));
    }
    if let Err(e) = control.check() {
        return Some(Err(e));
    }
    Some(Ok(format!(
        "cosine: {k} groups around leaders (radius {eps:.4}); {} of {} pairs of groups compared, {} vector pairs",
        pairs_of_groups.len(),
        if b.is_none() { k * (k + 1) / 2 } else { k * k },
        compared.into_inner()
    )))
}
