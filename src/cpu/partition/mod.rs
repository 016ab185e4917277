//! Candidate pairs of a cosine join on clustered high-dimensional data (embeddings), far
//! fewer than all pairs: the unit vectors are grouped around leaders, and two groups
//! farther apart than their radii plus eps are never compared.
//!
//! In many dimensions eps-grids and boxes prune nothing, but embeddings lie in clusters.
//! Leaders are picked from a sample (each sampled vector farther than `radius` from every
//! leader so far becomes one), and more from samples of the vectors still beyond `radius`
//! of every leader (clusters the sample missed); every vector joins its nearest leader
//! (found mostly from a quarter of the coordinates, the rest bounded by Cauchy-Schwarz),
//! and each group keeps its largest distance from its leader. Groups `a`, `b` can hold a pair within eps only
//! if `|L_a - L_b| <= r_a + r_b + eps` (triangle inequality); the surviving pairs of groups
//! are compared in f32 dot products, and a pair goes on as a candidate unless its dot
//! product proves it farther than eps (the bound covers f32's rounding and the copies'
//! norms). The caller (`src/cosine/`) confirms every candidate by cosine's exact rule, so
//! this only has to keep every pair within the (widened) eps, which the bounds guarantee.
//! Where a sample finds no clusters at this radius (uniform data on the sphere), it declines
//! and the caller runs the general join.

mod products;
mod screen;

pub(crate) use products::*;
use screen::{screen, screen_f32, Heads, SCREEN, SCREEN_TILE};

use crate::control::Control;
use crate::result::Pair;
use rayon::prelude::*;

/// Vectors sampled to choose leaders: an eighth of them, within these bounds (enough to
/// meet every cluster of a few dozen vectors; the leaders' pass costs sample x leaders).
const SAMPLE_MIN: usize = 4096;
const SAMPLE_MAX: usize = 16384;
/// Where a sample of `SAMPLE_MAX` leads at more than its share (more clusters than it can
/// meet: 1M vectors around 30,000 centres), the pass runs again on an eighth of the
/// vectors up to this many. Not first: a larger sample meets each cluster more often and
/// gives it more leaders (clusters-384d-1m: 24,581 leaders against 13,014, 35 s against
/// 19 s).
const SAMPLE_WIDE: usize = 1 << 17;
/// Leaders per sampled vector above which the data have no clusters at this radius.
/// (A sample of 16384 drawn from 10,000 clusters of 100 vectors meets 8,000 of them, and
/// leads at about 0.6; from 30,000 clusters, at about 0.77: a wider sample follows.)
const MAX_LEADER_SHARE: f64 = 0.75;
/// The same for the vectors left beyond every leader's radius: where more than half of a
/// sample of them would lead, they are the loose edges of clusters, not clusters the
/// sample missed, and new leaders would each gather few.
const COVER_SHARE: f64 = 0.5;
/// Groups are used only where the bounds leave at most this share of the vector pairs
/// to compare (estimated on a sample, [`kept_share`]). Measured, 2 threads, self-joins
/// of 20,000-97,500 vectors: a share of 0.78-1.0 took 2.5-30x the general join's time
/// (clusters-384d at eps 0.5: 10.6 s against EGO's 4.2; uniform 64-D vectors at eps 0.55,
/// groups of 12: 162 s against 5.5), 0.01-0.04 a quarter of it.
const WIDE_PAIRS_SHARE: f64 = 0.25;
/// Fewest vectors for which grouping pays.
const MIN_POINTS: usize = 4096;

/// Groups of vectors: `order` lists the vectors group by group (`start[g]..start[g + 1]`),
/// `rows` holds them in that order, and `radius[g]` is the largest distance of group g's
/// vectors from its leader (f64, rounded up).
pub(crate) struct Groups<'x> {
    pub(crate) order: Vec<u32>,
    pub(crate) start: Vec<usize>,
    /// Copies in group order; borrowed where that is the input's order (`Plan::brute`).
    pub(crate) rows: std::borrow::Cow<'x, [f32]>,
    pub(crate) radius: Vec<f64>,
    /// Each vector's distance from its leader (in `order`'s order), rounded up.
    pub(crate) to_leader: Vec<f64>,
    /// Vectors given their leader by [`screen`] ([`nearest_leaders`]).
    pub(crate) screened: usize,
}

/// A grouped index of unit vectors for the kNN: each group's pivot (`dim` wide, row-major:
/// the mean of its members, see [`recentre`]), the pivots' squared norms, and the groups,
/// whose `radius` and `to_leader` are distances from the pivots.
pub(crate) struct Index {
    pub(crate) leaders: Vec<f32>,
    pub(crate) norm2: Vec<f64>,
    pub(crate) groups: Groups<'static>,
    /// The leaders' radius (the sample's covering distance).
    pub(crate) radius: f64,
}

/// The grouped index of the unit vectors `x` (f32 copies, `dim` wide) for a kNN, or None
/// where grouping does not pay (too few vectors or dimensions, no clusters) or `control`
/// stopped it. No eps sets the leaders' radius here: it steps down from 1 until the sample
/// has about sqrt(n) leaders (a query visiting v groups of k measures up to k leaders and
/// about v n / k members, least at k = sqrt(v n), at least sqrt(n); with sqrt(n) / 2, a
/// 384-D set of diffuse topics stopped at 159 groups and took 3.9 s, at 754 1.7 s),
/// keeping the last radius before the sample stops showing
/// clusters (`leaders` declines, or more than 16 times the target would lead); declines
/// where even radius 1 finds none. At radius 1 more may lead (more clusters than the
/// target), up to 1 / [`KNN_LEADERS_SHARE`] of the rows.
#[cfg(test)]
pub(crate) fn knn_index(x: &[f32], dim: usize, control: &Control) -> Option<Index> {
    match knn_leaders(x, dim, usize::MAX, control) {
        KnnLeaders::Found(sampled) => knn_index_of(x, dim, sampled?, control),
        KnnLeaders::Over => unreachable!("no cap"),
    }
}

/// What the first step of [`knn_index`] found: the sample's leaders.
pub(crate) enum KnnLeaders {
    /// More than the count asked of [`knn_leaders`] lead at its first radius (1); the
    /// index would have at least as many.
    Over,
    /// The index's leaders and their radius, or None where it declines.
    Found(Option<(Vec<f32>, f64)>),
}

/// The first step of [`knn_index`], the sample's leaders and their radius, which tell what
/// grouping every vector would cost before it is paid; [`KnnLeaders::Over`] as soon as
/// more than `over` lead at the first radius (at the cost of finding that many).
pub(crate) fn knn_leaders(x: &[f32], dim: usize, over: usize, control: &Control) -> KnnLeaders {
    if x.len() / dim < MIN_POINTS || dim < 16 {
        return KnnLeaders::Found(None);
    }
    stepped_leaders(x, dim, over, control)
}

/// The rest of [`knn_index`]: every vector grouped around the leaders [`knn_leaders`] found.
pub(crate) fn knn_index_of(
    x: &[f32],
    dim: usize,
    (mut leaders, radius): (Vec<f32>, f64),
    control: &Control,
) -> Option<Index> {
    let mut groups = group(x, dim, &mut leaders, radius, Within::Nearest, control, None)?;
    let norm2 = recentre(&mut groups, &mut leaders, dim);
    Some(Index {
        leaders,
        norm2,
        groups,
        radius,
    })
}

/// Each row of `q` (f32 copies of unit vectors, `dim` wide): its home among `index`'s
/// groups, the pivot of largest f32 dot product, and its distance from that pivot rounded
/// up (as [`Groups::to_leader`]); None where `control` stopped. A query of an A ⋈ B kNN
/// then bounds the other groups as a member of its home does.
pub(crate) fn homes(
    q: &[f32],
    dim: usize,
    index: &Index,
    control: &Control,
) -> Option<Vec<(u32, f64)>> {
    let near = near_dot(index.radius);
    let (found, _) = nearest_leaders(q, dim, &index.leaders, near, None, control, false)?;
    Some(
        found
            .into_par_iter()
            .enumerate()
            .map(|(i, (h, _))| {
                let l = &index.leaders[h as usize * dim..(h as usize + 1) * dim];
                (h, dist64(l, &q[i * dim..(i + 1) * dim]) * (1.0 + 1e-9))
            })
            .collect(),
    )
}

/// Moves each non-empty group's pivot from its leader to the mean of its members (f64 sums,
/// rounded to f32) and measures `to_leader` and `radius` from it (rounded up as in
/// [`group`]); returns the pivots' squared norms (f64 sums of the f32 values' squares).
/// The triangle inequality holds around any point, and the mean is nearer its members
/// than one of them: in loose clusters (high dimension, each vector far from the others)
/// the bounds then prune where a leader's did not. Measured on a 384-D set of 600 loose
/// clusters (`embed_bench.py`'s dups-384d, 30,000 vectors): radius 0.79 around a leader,
/// 0.57 around the mean, and the rows a k = 10 query's bounds leave from 13,828 to 199.
fn recentre(groups: &mut Groups<'_>, leaders: &mut [f32], dim: usize) -> Vec<f64> {
    let g = &*groups;
    let centre = |h: usize| -> Vec<f32> {
        let (a, b) = (g.start[h], g.start[h + 1]);
        let mut sum = vec![0.0f64; dim];
        for r in g.rows[a * dim..b * dim].chunks_exact(dim) {
            for (s, &v) in sum.iter_mut().zip(r) {
                *s += v as f64;
            }
        }
        sum.iter().map(|&s| (s / (b - a) as f64) as f32).collect()
    };
    let k = g.start.len() - 1;
    let centres: Vec<Option<Vec<f32>>> = (0..k)
        .into_par_iter()
        .map(|h| (g.start[h + 1] > g.start[h]).then(|| centre(h)))
        .collect();
    for (h, c) in centres.into_iter().enumerate() {
        if let Some(c) = c {
            leaders[h * dim..(h + 1) * dim].copy_from_slice(&c);
        }
    }
    let (rows, start) = (&groups.rows, &groups.start);
    let leaders = &*leaders;
    groups
        .to_leader
        .par_iter_mut()
        .enumerate()
        .for_each(|(s, d)| {
            let h = start.partition_point(|&st| st <= s) - 1;
            *d = dist64(
                &leaders[h * dim..(h + 1) * dim],
                &rows[s * dim..(s + 1) * dim],
            ) * (1.0 + 1e-9);
        });
    groups.radius = (0..k)
        .map(|h| {
            groups.to_leader[start[h]..start[h + 1]]
                .iter()
                .copied()
                .fold(0.0f64, f64::max)
        })
        .collect();
    leaders
        .chunks_exact(dim)
        .map(|c| c.iter().map(|&v| v as f64 * v as f64).sum())
        .collect()
}

/// Leaders of `x` at a radius stepped down from 1 until the sample has about sqrt(n)
/// of them (see [`knn_index`]), and that radius; None where even radius 1 finds no
/// clusters or `control` stopped; [`KnnLeaders::Over`] where more than `over` (below the
/// most the index takes) lead at radius 1.
fn stepped_leaders(x: &[f32], dim: usize, over: usize, control: &Control) -> KnnLeaders {
    let n = x.len() / dim;
    let target = (n as f64).sqrt() as usize;
    // Stepping down past many more leaders than the target costs every vector's
    // assignment and buys nothing.
    let most = (16 * target).max(1024);
    // But where more clusters than that lead at radius 1, each needs its leader (1M
    // vectors around 30,000 centres: capped at 16,000, the index declined and the brute
    // force ran over 20 min). Up to KNN_LEADERS_SHARE of the rows: grouping then costs
    // at most that share of the brute force's products (n^2 / 2) on the leaders' side.
    let widest = (n / KNN_LEADERS_SHARE).max(most);
    let mut radius = 1.0f64;
    let mut best: Option<(Vec<f32>, f64)> = None;
    while radius > 0.05 {
        if control.is_cancelled() {
            return KnnLeaders::Found(None);
        }
        let first = best.is_none();
        let cap = if first { widest.min(over) } else { most };
        match leaders_capped(x, dim, radius, cap, control) {
            Err(Declined::Capped) if first && cap < widest => return KnnLeaders::Over,
            Err(_) => break,
            Ok(l) => {
                let enough = l.len() / dim >= target;
                best = Some((l, radius));
                if enough {
                    break;
                }
            }
        }
        radius *= 0.8;
    }
    KnnLeaders::Found(best)
}

/// The kNN's leaders at radius 1 may number up to 1 / KNN_LEADERS_SHARE of the rows
/// ([`stepped_leaders`]).
const KNN_LEADERS_SHARE: usize = 16;

/// Leaders from an even sample of `x` (`n` rows of `dim`), or None where more than
/// `MAX_LEADER_SHARE` of the sample would lead (no clusters at this radius).
#[cfg(test)]
fn leaders(x: &[f32], dim: usize, radius: f64, control: &Control) -> Option<Vec<f32>> {
    leaders_capped(x, dim, radius, usize::MAX, control).ok()
}

/// Why [`leaders_capped`] found no leaders.
enum Declined {
    /// More than its `most` would lead.
    Capped,
    /// More than `MAX_LEADER_SHARE` of the sample would lead, or the pass was stopped.
    Spread,
}

/// [`leaders`], declining also where more than `most` would lead.
fn leaders_capped(
    x: &[f32],
    dim: usize,
    radius: f64,
    most: usize,
    control: &Control,
) -> Result<Vec<f32>, Declined> {
    let n = x.len() / dim;
    let near = near_dot(radius);
    let first = (n / 8).clamp(SAMPLE_MIN, SAMPLE_MAX).min(n);
    let mut sample = first;
    loop {
        let step = (n / sample).max(1);
        let share_cap = (sample as f64 * MAX_LEADER_SHARE) as usize;
        let cap = share_cap.min(most);
        let picked: Vec<usize> = (0..n).step_by(step).collect();
        let mut out = Prefixed::new(Split::new(dim, near));
        if lead(x, &picked, near, (cap, MAX_LEADER_SHARE), &mut out, control) {
            return Ok(out.rows);
        }
        if control.is_cancelled() {
            return Err(Declined::Spread);
        }
        if out.len() >= cap && cap < share_cap {
            return Err(Declined::Capped);
        }
        // More clusters than the first sample can meet: once more on a wider one.
        if sample == first && n / 8 > first {
            sample = (n / 8).min(SAMPLE_WIDE);
            continue;
        }
        return Err(Declined::Spread);
    }
}

/// Unit vectors: |a - b|^2 = 2 - 2 a.b, so "within radius" is a.b >= 1 - radius^2 / 2 (a
/// rough choice: the bounds use the exact distances).
fn near_dot(radius: f64) -> f32 {
    (1.0 - radius * radius / 2.0) as f32
}

/// The leader rule over the rows `picked` of `x`, in order: a row leads when no leader so
/// far (those in `out` included) has a dot product of at least `near` with it. False (and
/// `out` incomplete) where `out` would pass `cap` rows, where nearly every row of a chunk
/// leads, where a quarter of the way through the rate of new leaders already shows that
/// more than `share` of `picked` would lead ([`share_floor`]), or where `control` stops
/// (read between chunks). The same leaders as
/// a serial pass, found in chunks: a chunk's rows meet the leaders so far in parallel
/// (wide rows screened first, [`Prefixed::covered`]), then the unmatched ones meet each
/// other in order.
fn lead(
    x: &[f32],
    picked: &[usize],
    near: f32,
    (cap, share): (usize, f64),
    out: &mut Prefixed,
    control: &Control,
) -> bool {
    let dim = out.split.dim;
    let mut done = 0usize;
    let mut judged = false;
    for chunk in picked.chunks(LEAD_CHUNK) {
        if control.is_cancelled() {
            return false;
        }
        let open: Vec<usize> = match out.blocked {
            // Screened, in tiles of rows gathered (1M 384-D vectors around 30,000
            // centres: the pass over 125,000 of them took 72 s one product at a time).
            Some(_) => chunk
                .par_chunks(LEAD_TILE)
                .flat_map_iter(|t| {
                    let covered = out.covered(&rows_at(x, dim, t.iter().copied()), near);
                    t.iter()
                        .zip(covered)
                        .filter(|p| !p.1)
                        .map(|p| *p.0)
                        .collect::<Vec<_>>()
                })
                .collect(),
            None => chunk
                .par_iter()
                .copied()
                .filter(|&i| !out.any_at_least(&x[i * dim..(i + 1) * dim], near, 0))
                .collect(),
        };
        let old = out.len();
        for i in open {
            let p = &x[i * dim..(i + 1) * dim];
            if !out.any_at_least(p, near, old) {
                if out.len() >= cap {
                    return false;
                }
                out.push(p);
            }
        }
        done += chunk.len();
        let at = done as f64 / picked.len() as f64;
        // Nearly every row of a full chunk leading (no clusters at all at this radius:
        // uniform data) stops the pass from the second chunk on; sampled clusters leave
        // a rate well below it there (measured on the second chunk: clusters-384d-1m 0.92,
        // topics-384d's cover pass 0.96, the other embedding workloads 0.15-0.83).
        let rate = (out.len() - old) as f64 / chunk.len() as f64;
        if done >= 2 * LEAD_CHUNK && chunk.len() == LEAD_CHUNK && rate >= 0.99 {
            return false;
        }
        // The pass costs about (rows done) x (leaders so far): judged once, at a quarter,
        // on a full chunk, it stops a doomed pass at a sixteenth of its cost.
        if !judged && at >= 0.25 && done >= 4 * LEAD_CHUNK && chunk.len() == LEAD_CHUNK {
            judged = true;
            let rate = (out.len() - old) as f64 / chunk.len() as f64;
            if share_floor(at, rate) > share + 0.05 {
                return false;
            }
        }
    }
    true
}

/// Rows the leader rule takes at a time.
const LEAD_CHUNK: usize = 512;

/// Rows of a chunk that one task of the leader rule screens ([`Prefixed::covered`]).
const LEAD_TILE: usize = 64;

/// A lower bound on the share of a sample that leads, from the rate `m` at which rows
/// became new leaders at fraction `x0` of it. Where rows come from clusters in random
/// order, the rate at `x` is a mixture of exponentials in `x` (a cluster still unmet
/// after `x`), a decreasing, log-convex function with rate 1 at 0: at least `m` before
/// `x0` and at least `m^(x / x0)` after it. The share is the integral of the rate. (Rows
/// sorted by cluster give a rate about equal to the share all along, above this bound.)
fn share_floor(x0: f64, m: f64) -> f64 {
    if m >= 1.0 {
        return 1.0;
    }
    if m <= 0.0 {
        return 0.0;
    }
    x0 * m + x0 * (m - m.powf(1.0 / x0)) / -m.ln()
}

/// Where dot products of unit vectors split so that most can stop early: the first `pre`
/// coordinates are summed first, then the next `pre`, then twice as many, ... (`cuts`),
/// and by Cauchy-Schwarz the coordinates after a cut add at most the product of the two
/// rows' norms over them. Only the choice of leaders uses this (a heuristic: the join's
/// bounds are measured on whatever leader a vector gets), so f32's rounding of the bound
/// needs only a small margin, not a proof.
#[derive(Clone)]
struct Split {
    dim: usize,
    pre: usize,
    /// The cuts after `pre`, increasing, each below `dim`.
    cuts: Vec<usize>,
}

/// Added to a Cauchy-Schwarz bound for the f32 rounding of its terms.
const SPLIT_MARGIN: f32 = 1e-4;

impl Split {
    /// A quarter of the coordinates first (a multiple of 8), at most 96 (enough for the
    /// bound to rule out most leaders of clustered data), or all of them in few dimensions
    /// (the split then saves nothing). More where the rows sought are far (`near`, the dot
    /// product sought, is low): the bound over the coordinates left is about their share
    /// of the rows' norms, so it rules a leader out only where that share is below
    /// 1 - near (near-duplicate joins group at radius 1: a half).
    fn new(dim: usize, near: f32) -> Split {
        let pre = if dim >= 64 {
            let quarter = (dim / 4 / 8 * 8).min(96);
            let far = if near.is_finite() {
                (dim as f64 * (1.0 - near as f64).clamp(0.0, 1.0)) as usize
            } else {
                0
            };
            quarter.max(far.div_ceil(8) * 8).min(dim)
        } else {
            dim
        };
        let mut cuts = vec![pre];
        while *cuts.last().unwrap() < dim {
            let c = *cuts.last().unwrap();
            cuts.push((2 * c).min(dim));
        }
        cuts.pop();
        Split { dim, pre, cuts }
    }
    /// No split: every product whole in [`heads_block`]'s blocks.
    fn whole(dim: usize) -> Split {
        Split {
            dim,
            pre: dim,
            cuts: Vec::new(),
        }
    }
    /// The norms of `p`'s coordinates after each cut.
    fn rest_norms(&self, p: &[f32]) -> Vec<f32> {
        self.cuts
            .iter()
            .map(|&c| dot(&p[c..], &p[c..]).max(0.0).sqrt())
            .collect()
    }
    /// `head` (the dot product of `p` and `l` over the first `pre` coordinates) completed,
    /// or None once a cut's bound shows it below `at_least`; `rp`, `rl`: the two rows'
    /// [`Split::rest_norms`].
    #[inline]
    fn complete(
        &self,
        p: &[f32],
        l: &[f32],
        mut head: f32,
        rp: &[f32],
        rl: impl Fn(usize) -> f32,
        at_least: f32,
    ) -> Option<f32> {
        for (t, &c) in self.cuts.iter().enumerate() {
            if head + rp[t] * rl(t) + SPLIT_MARGIN < at_least {
                return None;
            }
            let end = self.cuts.get(t + 1).copied().unwrap_or(self.dim);
            head += dot(&p[c..end], &l[c..end]);
        }
        Some(head)
    }
}

/// Rows (leaders) kept with their remaining norms for [`Split`]'s early stop, and in
/// [`in_blocks`]' layout (all coordinates) where rows are wide enough for [`screen`].
struct Prefixed {
    split: Split,
    rows: Vec<f32>,
    /// Each row's [`Split::rest_norms`], `split.cuts.len()` apiece.
    rest: Vec<f32>,
    /// The rows in blocks of [`BLOCK`], coordinate by coordinate (the last block padded
    /// with zeros), where `dim` >= 2 [`SCREEN`].
    blocked: Option<Vec<f32>>,
}

impl Prefixed {
    fn new(split: Split) -> Prefixed {
        Prefixed {
            blocked: (split.dim >= 2 * SCREEN).then(Vec::new),
            split,
            rows: Vec::new(),
            rest: Vec::new(),
        }
    }
    fn len(&self) -> usize {
        self.rows.len() / self.split.dim
    }
    fn push(&mut self, p: &[f32]) {
        let (dim, j) = (self.split.dim, self.len());
        if let Some(b) = &mut self.blocked {
            if j % BLOCK == 0 {
                b.resize(b.len() + BLOCK * dim, 0.0);
            }
            let blk = &mut b[(j / BLOCK) * BLOCK * dim..][..BLOCK * dim];
            for (c, &v) in p.iter().enumerate() {
                blk[c * BLOCK + j % BLOCK] = v;
            }
        }
        self.rest.extend(self.split.rest_norms(p));
        self.rows.extend_from_slice(p);
    }
    /// For each row of `x`, whether some row so far has an f32 dot product of at least
    /// `near` with it: first by [`screen`] (clustered rows find such a row among their few
    /// largest head products), then, for the rows it leaves, by whole products in blocks
    /// (four rows at a time, stopping once all four have one). Needs `blocked`.
    fn covered(&self, x: &[f32], near: f32) -> Vec<bool> {
        let (dim, k) = (self.split.dim, self.len());
        let blocked = self.blocked.as_deref().expect("wide rows");
        let m = x.len() / dim;
        if k == 0 {
            return vec![false; m];
        }
        let found = screen_f32(x, dim, &self.rows, blocked, dim);
        let mut covered: Vec<bool> = found.iter().map(|&(_, d)| d >= near).collect();
        let open: Vec<usize> = (0..m).filter(|&i| !covered[i]).collect();
        let mut four = [0.0f32; 4 * BLOCK];
        for w in open.chunks(4) {
            let rows = [0, 1, 2, 3].map(|i| &x[w[i.min(w.len() - 1)] * dim..][..dim]);
            let mut hit = [false; 4];
            for (b, blk) in blocked.chunks_exact(BLOCK * dim).enumerate() {
                heads_block4(rows, blk, &mut four);
                let lanes = BLOCK.min(k - b * BLOCK);
                for (i, h) in hit.iter_mut().enumerate() {
                    *h |= four[i * BLOCK..][..lanes].iter().any(|&d| d >= near);
                }
                if hit.iter().all(|&h| h) {
                    break;
                }
            }
            for (&i, &h) in w.iter().zip(&hit) {
                covered[i] = h;
            }
        }
        covered
    }
    /// Whether some row from `from` on has a dot product with `p` of at least `near`.
    fn any_at_least(&self, p: &[f32], near: f32, from: usize) -> bool {
        let (dim, pre, c) = (self.split.dim, self.split.pre, self.split.cuts.len());
        let rp = self.split.rest_norms(p);
        (from..self.len()).any(|j| {
            let l = &self.rows[j * dim..(j + 1) * dim];
            let head = dot(&l[..pre], &p[..pre]);
            let rl = &self.rest[j * c..(j + 1) * c];
            self.split
                .complete(p, l, head, &rp, |t| rl[t], near)
                .is_some_and(|d| d >= near)
        })
    }
}

/// The rows `ids` of `x` (`dim` wide), one after the other.
fn rows_at(x: &[f32], dim: usize, ids: impl Iterator<Item = usize>) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.size_hint().0 * dim);
    for i in ids {
        out.extend_from_slice(&x[i * dim..(i + 1) * dim]);
    }
    out
}

/// The index of the first largest value of `row` (not empty, no NaN): [`max_of`], then its
/// first position.
fn argmax(row: &[f32]) -> usize {
    let top = max_of(row);
    row.iter().position(|&v| v == top).unwrap_or(0)
}

/// Each vector's nearest leader (largest f32 dot product) and that dot product, or None
/// once `control` stops; with `progress`, each vector counts as a unit of the stage. Where
/// no leader reaches `floor`, a vector gets the leader whose head product is largest (its
/// search stops there: no leader is near it anyway).
///
/// `screened`: where the caller needs the nearest leader ([`Within::Nearest`]) and knows
/// that no two leaders have a dot product of `near` or more (the leader rule's), a vector
/// within half that separation of a leader needs no other: by the triangle inequality
/// every other leader is farther ([`screen_proves`]). Where any leader within the radius
/// of `near` will do ([`Within::Radius`]), one found within it needs no other either.
/// Where a probe of evenly spread vectors finds most of them settled so, every vector is
/// first [`screen`]ed (its products with every leader over the first [`SCREEN`]
/// coordinates, the few largest completed), and only those the screen leaves open take the
/// search below, for the nearest (with [`Within::Radius`], none: they keep the screen's
/// best). (The kNN's grouping of 1M 384-D vectors around 30,000 centres, 29,531 leaders:
/// about 54 s with the search alone, 20 s screened.)
///
/// The search: the dot products of each vector with every leader's first coordinates, 32
/// leaders at a time ([`heads_block`]); then a vector completes its best leader's dot
/// product, and another leader's only where [`Split`]'s bound says it could still win (on
/// clustered data, seldom).
fn nearest_leaders(
    x: &[f32],
    dim: usize,
    leaders: &[f32],
    floor: f32,
    screened: Option<(Within, f32)>,
    control: &Control,
    progress: bool,
) -> Option<(Vec<(u32, f32)>, usize)> {
    let n = x.len() / dim;
    let split = Split::new(dim, sought(x, dim, leaders, floor));
    // The screen where it reads at most half of the search's coordinates and settles most
    // vectors (the probe's share).
    let taken = match screened {
        Some((how, near)) if split.pre >= 2 * SCREEN && n > 0 && !leaders.is_empty() => {
            let taken = match how {
                Within::Nearest => screen_proves(near),
                Within::Radius => near,
            };
            let heads = Heads::new(leaders, dim);
            let rows = n.min(SOUGHT_ROWS);
            let probe = rows_at(x, dim, (0..rows).map(|i| i * n / rows));
            let hits = screen(&probe, dim, leaders, &heads)
                .iter()
                .filter(|&&(_, d)| d >= taken)
                .count();
            (2 * hits >= rows).then_some((how, taken, heads))
        }
        _ => None,
    };
    let Some((how, taken, heads)) = taken else {
        let search = Search::new(leaders, dim, floor, split);
        let all = x
            .par_chunks(NEAREST_TILE * dim)
            .flat_map_iter(|tile| search.tile(tile, control, progress))
            .collect();
        control.check().ok()?;
        return Some((all, 0));
    };
    let mut found: Vec<(u32, f32)> = x
        .par_chunks(SCREEN_TILE * dim)
        .flat_map_iter(|tile| {
            let m = tile.len() / dim;
            // Stopped: left open (the caller discards the answer).
            if control.is_cancelled() {
                return vec![(0u32, f32::NEG_INFINITY); m].into_iter();
            }
            let got = screen(tile, dim, leaders, &heads);
            if progress {
                let sure = got.iter().filter(|&&(_, d)| d >= taken).count();
                control.advance(sure as u64, 0);
            }
            got.into_iter()
        })
        .collect();
    // Stopped: no rows gathered for the search.
    control.check().ok()?;
    let screened = found.iter().filter(|&&(_, d)| d >= taken).count();
    // Any leader within the radius will do, and the screen found none for the rest: most
    // are far from every leader (clusters the sample missed), and get leaders of their
    // own in [`group`]'s next rounds (1M 384-D vectors around 30,000 centres: 48,206 left
    // by the screen, 15 s to search; searching them too changed no plan measured).
    if how == Within::Radius {
        return Some((found, screened));
    }
    // The rest searched, gathered a tile at a time, with whole products in blocks: most
    // are far from every leader (clusters the sample missed), where the split's bounds
    // rule few out and every leader's product was completed one at a time (1M 384-D
    // vectors around 30,000 centres: 13,712 left took 23 s that way, 1.8 s in blocks).
    let search = Search::new(leaders, dim, floor, Split::whole(dim));
    let open: Vec<usize> = (0..n).filter(|&i| found[i].1 < taken).collect();
    let again: Vec<(u32, f32)> = open
        .par_chunks(NEAREST_TILE)
        .flat_map_iter(|ids| search.tile(&rows_at(x, dim, ids.iter().copied()), control, progress))
        .collect();
    control.check().ok()?;
    for (&i, g) in open.iter().zip(again) {
        found[i] = g;
    }
    Some((found, screened))
}

/// Vectors a task of [`nearest_leaders`]' search takes.
const NEAREST_TILE: usize = 64;

/// The f32 dot product with a leader at which a vector has no nearer leader, where no two
/// leaders have a product of `apart` or more ([`nearest_leaders`]): leaders at least `sep`
/// apart and a vector within `sep / 2` of one. With margins for f32 rounding (products of
/// unit vectors within about 3e-5 of the real ones, norms within 1e-6 of 1).
fn screen_proves(apart: f32) -> f32 {
    let sep2 = (2.0 - 2.0 * (apart as f64 + 1e-4)).max(0.0);
    (1.0 - sep2 / 8.0 + 1e-4) as f32
}

/// Each leader's largest f32 dot product with another (`dim` wide, f32 copies of unit
/// vectors), -inf for a lone one: [`screen_proves`] of it proves a vector's nearest leader
/// among them all, whatever rule picked them (a vector within half its own leader's
/// separation from the others has no other leader nearer). None once `control` stops.
fn nearest_other(leaders: &[f32], dim: usize, control: &Control) -> Option<Vec<f32>> {
    const TILE: usize = 32;
    let k = leaders.len() / dim;
    let blocked = Blocked::new(leaders, dim);
    let found = leaders
        .par_chunks(TILE * dim)
        .enumerate()
        .flat_map_iter(|(t, tile)| {
            let m = tile.len() / dim;
            // Stopped: skipped (the caller discards the answer).
            if control.is_cancelled() {
                return vec![f32::NEG_INFINITY; m];
            }
            let mut out = vec![0.0f32; m * k];
            blocked.dots_tile(tile, &mut out);
            let best = |i: usize| {
                let own = t * TILE + i;
                let row = &out[i * k..(i + 1) * k];
                let before = row[..own].iter().fold(f32::NEG_INFINITY, |a, &d| a.max(d));
                row[own + 1..].iter().fold(before, |a, &d| a.max(d))
            };
            (0..m).map(best).collect::<Vec<f32>>()
        })
        .collect();
    control.check().ok()?;
    Some(found)
}

/// [`nearest_leaders`]' search: every leader's first `split.pre` coordinates in blocks
/// ([`in_blocks`]) and its norms after each cut.
struct Search<'a> {
    leaders: &'a [f32],
    dim: usize,
    floor: f32,
    split: Split,
    heads: Vec<f32>,
    /// Each leader's norms after each cut, cut by cut (`rest[t * k + j]`; zeros without
    /// cuts).
    rest: Vec<f32>,
}

impl<'a> Search<'a> {
    fn new(leaders: &'a [f32], dim: usize, floor: f32, split: Split) -> Search<'a> {
        let k = leaders.len() / dim;
        let heads = in_blocks(leaders, dim, split.pre);
        let mut rest = vec![0.0f32; split.cuts.len().max(1) * k];
        for (j, l) in leaders.chunks_exact(dim).enumerate() {
            for (t, r) in split.rest_norms(l).into_iter().enumerate() {
                rest[t * k + j] = r;
            }
        }
        Search {
            leaders,
            dim,
            floor,
            split,
            heads,
            rest,
        }
    }

    /// The rows of `tile` (at most [`NEAREST_TILE`]): their head products with each block
    /// of leaders in turn (the block stays in the L1 cache for the tile, the tile's rows in
    /// L2), four rows at a time (the last ones repeated where fewer are left), each row's
    /// filling its row of `rows`; then each row's bounds.
    fn tile(&self, tile: &[f32], control: &Control, progress: bool) -> Vec<(u32, f32)> {
        let (dim, split, rest) = (self.dim, &self.split, &self.rest[..]);
        let k = self.leaders.len() / dim;
        let m = tile.len() / dim;
        // Stopped: every leader skipped (the caller discards the answer).
        if control.is_cancelled() {
            return vec![(0u32, 0.0f32); m];
        }
        let pre = split.pre;
        let leader = |j: usize| &self.leaders[j * dim..(j + 1) * dim];
        let width = k.div_ceil(BLOCK) * BLOCK;
        let mut rows = vec![0.0f32; m * width];
        let mut four = [0.0f32; 4 * BLOCK];
        for (b, blk) in self.heads.chunks_exact(BLOCK * pre).enumerate() {
            for v in (0..m).step_by(4) {
                let w = [v, v + 1, v + 2, v + 3].map(|w| w.min(m - 1));
                heads_block4(w.map(|w| &tile[w * dim..][..pre]), blk, &mut four);
                for (i, w) in w.into_iter().enumerate() {
                    let out = &four[i * BLOCK..][..BLOCK];
                    rows[w * width + b * BLOCK..][..BLOCK].copy_from_slice(out);
                }
            }
        }
        if progress {
            control.advance(m as u64, 0);
        }
        let mut out = Vec::with_capacity(m);
        for (v, p) in tile.chunks_exact(dim).enumerate() {
            let row = &rows[v * width..][..k];
            let rp = split.rest_norms(p);
            let complete = |j: usize, at_least: f32| {
                split.complete(p, leader(j), row[j], &rp, |t| rest[t * k + j], at_least)
            };
            let first = argmax(row);
            let mut best = (
                complete(first, f32::NEG_INFINITY).unwrap_or(f32::NEG_INFINITY),
                first,
            );
            // The first cut's bound (without cuts, the whole product), tested for every
            // leader before any work, a chunk of leaders at a time (vectorised), then
            // leader by leader in a chunk where some may pass.
            let r0 = rp.first().copied().unwrap_or(0.0);
            const CHUNK: usize = 64;
            for (c, (hs, rs)) in row.chunks(CHUNK).zip(rest[..k].chunks(CHUNK)).enumerate() {
                let at = best.0.max(self.floor) - SPLIT_MARGIN;
                let pass = hs
                    .iter()
                    .zip(rs)
                    .fold(0u32, |n, (&h, &r)| n + (h + r0 * r >= at) as u32);
                if pass == 0 {
                    continue;
                }
                for j in c * CHUNK..c * CHUNK + hs.len() {
                    let at = best.0.max(self.floor);
                    if j == first || row[j] + r0 * rest[j] + SPLIT_MARGIN < at {
                        continue;
                    }
                    if let Some(d) = complete(j, at) {
                        if d > best.0 || (d == best.0 && j < best.1) {
                            best = (d, j);
                        }
                    }
                }
            }
            out.push((best.1 as u32, best.0));
        }
        out
    }
}

/// The product [`nearest_leaders`] splits its products for ([`Split::new`]): the rows' best
/// products with the leaders, not `floor`, are what the bounds must rule the other leaders
/// out below, and on clustered data they are far above it (a kNN's leaders at radius 1 sit
/// at a floor of 0.5, their rows at 0.9 and more: the first 192 of 384 coordinates, not
/// 96). The 10th percentile of SOUGHT_ROWS evenly spread rows' best products, at least
/// `floor` (a choice of speed: any split gives the same leaders).
fn sought(x: &[f32], dim: usize, leaders: &[f32], floor: f32) -> f32 {
    let n = x.len() / dim;
    // Where the floor leaves the split at its least (a join's leaders at eps), nothing to
    // gain.
    if n == 0 || leaders.is_empty() || Split::new(dim, floor).pre == Split::new(dim, 1.0).pre {
        return floor;
    }
    let rows = n.min(SOUGHT_ROWS);
    let mut best: Vec<f32> = (0..rows)
        .into_par_iter()
        .map(|i| {
            let p = &x[i * n / rows * dim..][..dim];
            leaders
                .chunks_exact(dim)
                .map(|l| dot(p, l))
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    best.sort_unstable_by(f32::total_cmp);
    best[rows / 10].max(floor)
}

/// Rows whose best products set [`nearest_leaders`]' split ([`sought`]).
const SOUGHT_ROWS: usize = 256;

/// Where a device finds each row's nearest leader (`gpu/grouped.rs`): rows and leaders in,
/// each row's leader and f32 dot product out, as [`nearest_leaders`] answers; None: the CPU
/// finds them.
pub(crate) type Assign<'a> = dyn Fn(&[f32], &[f32]) -> Option<Vec<(u32, f32)>> + Sync + 'a;

/// Which leader [`group`] and [`nearest_leaders`] give a vector.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Within {
    /// The nearest (a kNN's groups, whose pivots then move to their members' means).
    Nearest,
    /// One within the radius, the nearest unless [`screen`] found another first; where
    /// the screen finds none, the best it found (a join's groups: its bounds hold around
    /// any leader, and each group's radius is measured).
    Radius,
}

/// Rounds of [`group`]'s search for clusters the leaders' sample missed.
const COVER_ROUNDS: usize = 4;

/// Groups `x` around its `leaders` (within `radius` of some, the nearest or one within it
/// as `within` says; beyond it from all of them, one of them). Vectors farther than
/// `radius` from every leader (clusters the sample missed, the edges of wide ones) get
/// leaders of their own, appended to `leaders` (the groups of vectors grouped before are
/// then empty): in each of a few rounds, the leader rule runs on an even sample of them,
/// and they move to a new leader where it is nearer. A round stops the search where its
/// sample shows no clusters (more than `COVER_SHARE` of it would lead): those vectors stay
/// with a leader they already have.
fn group(
    x: &[f32],
    dim: usize,
    leaders: &mut Vec<f32>,
    radius: f64,
    within: Within,
    control: &Control,
    assign: Option<&Assign>,
) -> Option<Groups<'static>> {
    let n = x.len() / dim;
    let near = near_dot(radius);
    let screened = Some((within, near));
    control.stage("cosine: grouping", n as u64);
    // A kNN's groups (the nearest leader) on the CPU: the screen's best first, as a join's
    // groups take it, with no search for the vectors it leaves unproven; the rounds below
    // give the clusters the sample missed their leaders, and only then do the vectors whose
    // leader the separations of all the leaders do not prove nearest search them all.
    // Searched first, most of them were vectors of the clusters the sample missed, which
    // then took leaders of their own (1M 384-D vectors around 10,000 centres: 190,656
    // searched against 8,058 leaders, about a third of the kNN's time).
    let first = assign.and_then(|f| f(x, leaders));
    let defer = within == Within::Nearest && first.is_none();
    let (mut nearest, mut by_screen, proven) = match first {
        Some(found) => (found, 0, true),
        // Nothing screened: the probe sent every vector to the search, whose answer is
        // the nearest already (a screen that ran settles at least the probe's hits).
        None if defer => {
            let radius = Some((Within::Radius, near));
            let (found, s) = nearest_leaders(x, dim, leaders, near, radius, control, true)?;
            (found, 0, s == 0)
        }
        None => {
            let (found, s) = nearest_leaders(x, dim, leaders, near, screened, control, true)?;
            (found, s, true)
        }
    };
    for _ in 0..COVER_ROUNDS {
        let far: Vec<usize> = (0..n).filter(|&i| nearest[i].1 < near).collect();
        if far.is_empty() {
            break;
        }
        // Up to `SAMPLE_WIDE` of them: a vector at a cluster's loose edge is covered only
        // where it is picked. With `SAMPLE_MAX`, the rounds over the 48,000 vectors left
        // far by 1M vectors around 30,000 centres met a third of them, and the wide groups
        // those kept had 7.6 billion vector pairs compared (266 s, against 17 million and
        // 95 s); clusters-384d-1m's rounds now make 20,131 groups, not 13,014 (27 s, not
        // 20-23 s).
        let step = far.len().div_ceil(SAMPLE_WIDE);
        let picked: Vec<usize> = far.iter().copied().step_by(step).collect();
        let cap = (picked.len() as f64 * COVER_SHARE).ceil() as usize;
        let mut more = Prefixed::new(Split::new(dim, near));
        if !lead(x, &picked, near, (cap, COVER_SHARE), &mut more, control) {
            break;
        }
        let rows = rows_at(x, dim, far.iter().copied());
        // On the device too where it assigned the first leaders.
        let again = match assign.and_then(|f| f(&rows, &more.rows)) {
            Some(found) => found,
            None => {
                let (found, s) =
                    nearest_leaders(&rows, dim, &more.rows, near, screened, control, false)?;
                by_screen += s;
                found
            }
        };
        let old = (leaders.len() / dim) as u32;
        for (&i, (g, d)) in far.iter().zip(again) {
            if d > nearest[i].1 {
                nearest[i] = (old + g, d);
            }
        }
        leaders.extend_from_slice(&more.rows);
    }
    control.check().ok()?;
    if !proven {
        let proves: Vec<f32> = nearest_other(leaders, dim, control)?
            .into_iter()
            .map(screen_proves)
            .collect();
        let open: Vec<usize> = (0..n)
            .filter(|&i| nearest[i].1 < proves[nearest[i].0 as usize])
            .collect();
        by_screen = n - open.len();
        let rows = rows_at(x, dim, open.iter().copied());
        let (found, _) = nearest_leaders(&rows, dim, leaders, near, None, control, false)?;
        for (&i, g) in open.iter().zip(found) {
            nearest[i] = g;
        }
    }
    let k = leaders.len() / dim;
    let nearest: Vec<u32> = nearest.into_iter().map(|(g, _)| g).collect();
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
    let mut rows = vec![0.0f32; x.len()];
    rows.par_chunks_mut(dim)
        .zip(&order)
        .for_each(|(r, &i)| r.copy_from_slice(&x[i as usize * dim..(i as usize + 1) * dim]));
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
        rows: rows.into(),
        radius,
        to_leader,
        screened: by_screen,
    })
}

/// A grouped cosine join's plan: the unit vectors of A (and B) grouped around shared
/// leaders, and the pairs of groups whose leaders are close enough for a pair within eps.
/// The CPU ([`compare`]) and a GPU (`gpu/grouped.rs`) compare the [`Plan::members`] of
/// each pair of groups in f32 dot products and keep a pair unless its product reaches
/// below [`Plan::floor`].
pub(crate) struct Plan<'x> {
    pub(crate) dim: usize,
    /// Self-join: pairs `[i, j]` with i < j, else A ⋈ B.
    pub(crate) self_join: bool,
    eps: f64,
    /// The leaders' radius: eps, or a wider one where eps shows no clusters.
    radius: f64,
    lead: Vec<f32>,
    pub(crate) ga: Groups<'x>,
    gb: Option<Groups<'x>>,
    /// Pairs of groups (g of A, h of B) that may hold a pair, and a lower bound on their
    /// leaders' distance.
    pub(crate) pairs: Vec<(u32, u32, f64)>,
    slack: f64,
    /// A pair within eps has an f32 dot product of at least this.
    pub(crate) floor: f32,
    /// A pair whose f32 dot product reaches this needs no confirmation: the caller's rule
    /// accepts it for certain (`cosine::sure_dot`). Infinite (every candidate confirmed)
    /// until the caller sets it; `sure_f16` the same for the matrix units' products.
    pub(crate) sure: f32,
    pub(crate) sure_f16: f32,
    /// A blocked brute force ([`Plan::brute`]): every pair of blocks, every member kept.
    pub(crate) brute: bool,
    /// B's rows made a block at a time where [`compare`] meets them ([`Plan::brute_made`]):
    /// B's groups then hold no rows.
    make_b: Option<&'x MakeRows<'x>>,
}

/// A side's f32 unit copies made on demand: rows `range`, one after the other, the same
/// bits as the side's copy would hold.
pub(crate) type MakeRows<'a> = dyn Fn(std::ops::Range<usize>) -> Vec<f32> + Sync + 'a;

/// Rows a block of [`Plan::brute`].
const BRUTE_BLOCK: usize = 1024;

/// Below this many vectors on one side of an A ⋈ B, [`plan`] compares every pair
/// ([`Plan::brute`]).
const SMALL_SIDE: usize = 256;

/// Whether [`plan`] makes an A ⋈ B of `na` and `nb` vectors of `dim` dimensions a
/// blocked brute force for its smaller side's size alone ([`SMALL_SIDE`]; the larger
/// side would be grouped): known before any copy is made.
pub(crate) fn small_side(na: usize, nb: usize, dim: usize) -> bool {
    na.max(nb) >= MIN_POINTS && dim >= 16 && na.min(nb) < SMALL_SIDE
}

/// An A ⋈ B whose smaller side has fewer vectors than 1 / LEADERS_PER_QUERY of the
/// leaders that the larger side's sample picks is a blocked brute force too: grouping the
/// larger side (each vector against every leader) costs more than the queries' products
/// ([`Bounded`]: most stop at their first coordinates). Measured, 2 threads, queries
/// against the other rows of clustered 384-D vectors (100k, 2,000 clusters, eps 0.1):
/// 1,000 queries 0.27 s brute against 1.16 grouped, 2,500 0.84 against 0.79. (Before the
/// bound, at 2: 500 queries 0.63 s brute against 1.24, 1,000 0.95 against 1.16, 1,500
/// 1.87 against 1.21.)
const LEADERS_PER_QUERY: usize = 1;

impl<'x> Plan<'x> {
    /// The plan of a blocked brute force of the self-join (`b` None) or A ⋈ B of the unit
    /// vectors `a`, `b` (f32 copies) within Euclidean distance `eps`: blocks of
    /// [`BRUTE_BLOCK`] rows in input order, every pair of blocks kept and every member of
    /// each (no leaders, no bounds). The same floor as [`plan`]'s on the same copies, so a
    /// device's tiles (`gpu/grouped.rs`) return the same candidates as a brute force of
    /// every pair; for data where [`plan`] declines (no clusters), and [`plan`]'s own for
    /// an A ⋈ B with a side under [`SMALL_SIDE`] vectors. The rows are borrowed.
    pub(crate) fn brute(a: &'x [f32], b: Option<&'x [f32]>, dim: usize, eps: f64) -> Self {
        Plan::blocks(a, b.map(|b| (b.len() / dim, b)), None, dim, eps)
    }

    /// [`Plan::brute`] of A ⋈ B whose `nb` rows of B `make_b` makes a block at a time
    /// where [`compare`] meets them: no copy of B (a few queries against a large side, whose
    /// copy cost as long as their products). On the CPU only: a device uploads whole sides.
    pub(crate) fn brute_made(
        a: &'x [f32],
        nb: usize,
        make_b: &'x MakeRows<'x>,
        dim: usize,
        eps: f64,
    ) -> Self {
        Plan::blocks(a, Some((nb, &[])), Some(make_b), dim, eps)
    }

    /// [`Plan::brute`]'s plan: B as its number of rows and its rows (none where `make_b`
    /// makes them).
    fn blocks(
        a: &'x [f32],
        b: Option<(usize, &'x [f32])>,
        make_b: Option<&'x MakeRows<'x>>,
        dim: usize,
        eps: f64,
    ) -> Self {
        let blocks = |n: usize, x: &'x [f32]| {
            let k = n.div_ceil(BRUTE_BLOCK);
            Groups {
                order: (0..n as u32).collect(),
                start: (0..=k).map(|g| (g * BRUTE_BLOCK).min(n)).collect(),
                rows: x.into(),
                radius: vec![f64::INFINITY; k],
                to_leader: vec![0.0; n],
                screened: 0,
            }
        };
        let ga = blocks(a.len() / dim, a);
        let gb = b.map(|(n, x)| blocks(n, x));
        let count = |g: &Groups<'_>| (g.start.len() - 1) as u32;
        let (ka, kb) = (count(&ga), count(gb.as_ref().unwrap_or(&ga)));
        let pairs = (0..ka)
            .flat_map(|g| (if b.is_none() { g } else { 0 }..kb).map(move |h| (g, h, 0.0)))
            .collect();
        let slack = dot_slack(dim);
        Plan {
            dim,
            self_join: b.is_none(),
            eps,
            radius: f64::INFINITY,
            lead: Vec::new(),
            ga,
            gb,
            pairs,
            slack,
            floor: (1.0 - eps * eps / 2.0 - slack) as f32,
            sure: f32::INFINITY,
            sure_f16: f32::INFINITY,
            brute: true,
            make_b,
        }
    }

    /// Whether B's rows are made where they are met ([`Plan::brute_made`]).
    pub(crate) fn makes_b(&self) -> bool {
        self.make_b.is_some()
    }

    /// The f32 copies of B's rows at positions `range` (in the groups' order), one after
    /// the other: borrowed, or made ([`Plan::brute_made`]).
    fn rows_b(&self, range: std::ops::Range<usize>) -> std::borrow::Cow<'_, [f32]> {
        match self.make_b {
            Some(make) => make(range).into(),
            None => self.gb().rows[range.start * self.dim..range.end * self.dim].into(),
        }
    }

    /// [`Plan::floor`] for dot products taken on a GPU's matrix units from f16 copies
    /// ([`dot_slack_f16`]).
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn floor_f16(&self) -> f32 {
        (1.0 - self.eps * self.eps / 2.0 - dot_slack_f16(self.dim)) as f32
    }

    /// B's groups (A's in a self-join).
    pub(crate) fn gb(&self) -> &Groups<'x> {
        self.gb.as_ref().unwrap_or(&self.ga)
    }

    /// The pair of query ids of positions `s` of A's groups and `t` of B's (a self-join's
    /// in order).
    #[inline]
    pub(crate) fn pair(&self, s: usize, t: usize) -> Pair {
        let (i, j) = (self.ga.order[s], self.gb().order[t]);
        if self.self_join {
            [i.min(j), i.max(j)]
        } else {
            [i, j]
        }
    }

    /// The positions (in the groups' order) of the members of the `p`-th pair of groups
    /// that can meet, and whether it is a self-join's group with itself (then both lists
    /// are the group and only pairs `x < y` of list positions count); None where no
    /// member of A's group can.
    pub(crate) fn members(&self, p: usize) -> Option<(Vec<usize>, Vec<usize>, bool)> {
        let (g, h, gap) = self.pairs[p];
        let (ga, gb, dim, eps) = (&self.ga, self.gb(), self.dim, self.eps);
        let (ra, rb) = (
            ga.start[g as usize]..ga.start[g as usize + 1],
            gb.start[h as usize]..gb.start[h as usize + 1],
        );
        let same = self.self_join && g == h;
        if same {
            return Some((ra.clone().collect(), ra.collect(), true));
        }
        if self.brute {
            return Some((ra.collect(), rb.collect(), false));
        }
        // A vector within eps of some vector of the other group is within that group's
        // radius plus eps of its leader (triangle inequality): the rest are skipped. The
        // leaders' distance less the vector's own distance from its leader bounds that
        // distance from below at no cost; the survivors are measured.
        let near = |gr: &Groups<'_>, range: std::ops::Range<usize>, other: u32, r: f64| {
            let l = &self.lead[other as usize * dim..(other as usize + 1) * dim];
            let reach = (r + eps) * (1.0 + 1e-9);
            range
                .filter(|&s| {
                    gap - gr.to_leader[s] <= reach
                        && dist_floor(dot(&gr.rows[s * dim..(s + 1) * dim], l), self.slack) <= reach
                })
                .collect::<Vec<usize>>()
        };
        let sa = near(ga, ra, h, gb.radius[h as usize]);
        if sa.is_empty() {
            return None;
        }
        Some((sa, near(gb, rb, g, ga.radius[g as usize]), false))
    }

    /// The report's line on the plan and the vector pairs compared.
    pub(crate) fn note(&self, compared: u64) -> String {
        if self.brute {
            return format!(
                "cosine: blocked brute force, blocks of {BRUTE_BLOCK} rows; {} pairs of blocks, \
                 {compared} vector pairs compared{}",
                self.pairs.len(),
                match self.makes_b() {
                    true => "; B's f32 copies made a block at a time where met",
                    false => "",
                }
            );
        }
        let k = self.lead.len() / self.dim;
        let gb = self.gb.as_ref();
        let n = self.ga.order.len() + gb.map_or(0, |g| g.order.len());
        let screened = self.ga.screened + gb.map_or(0, |g| g.screened);
        format!(
            "cosine: {k} groups around leaders (radius {:.4}); {} of {} pairs of groups compared, {compared} vector pairs{}",
            self.radius,
            self.pairs.len(),
            if self.self_join { k * (k + 1) / 2 } else { k * k },
            match screened {
                0 => String::new(),
                s => format!("; {s} of {n} vectors placed by a screen of their first coordinates"),
            }
        )
    }
}

/// The grouped plan of the self-join (`b` None) or A ⋈ B of the unit vectors `a`, `b`
/// (f32 copies, `dim` wide) within Euclidean distance `eps`; None where the data show no
/// clusters (or too few vectors or dimensions), Some(Err) where `control` stopped. With
/// `assign`, a device may find each vector's nearest leader.
pub(crate) fn plan<'x>(
    a: &'x [f32],
    b: Option<&'x [f32]>,
    dim: usize,
    eps: f64,
    control: &Control,
    assign: Option<&Assign>,
) -> Option<crate::error::Result<Plan<'x>>> {
    // The larger side's sample picks the leaders (a few thousand queries against a large
    // set would miss most of its clusters: its vectors then sat in wide groups, and a
    // 5,000 x 95,000 join walked 1.6M pairs of groups); it is grouped first.
    let b_first = b.is_some_and(|b| b.len() > a.len());
    let (first, other) = match b {
        Some(b) if b_first => (b, Some(a)),
        _ => (a, b),
    };
    if first.len() / dim < MIN_POINTS || dim < 16 {
        return None;
    }
    // A few queries against a large set: a blocked brute force ([`Plan::brute`]), whose
    // cost is the queries' products alone; grouping or sorting the large side costs more
    // (measured, 95,000 clustered 384-D vectors against 100-1,000 of the same clusters:
    // the grouped and general joins about 1 s each whatever the queries, most of it on the
    // large side, its leaders or its sort).
    if other.is_some_and(|o| small_side(first.len() / dim, o.len() / dim, dim)) {
        return Some(Ok(Plan::brute(a, b, dim, eps)));
    }
    // Declined (None) or stopped (the stop).
    let stopped = || control.check().err().map(Err);
    // Where eps is too small for the sample to show clusters at it (near-duplicates),
    // groups of a wider radius still prune: the bounds hold for any groups.
    // More queries, but still few against the large side's leaders: grouping it (each of
    // its vectors against every leader) costs more than the queries' products. Known once
    // that many lead (the pass stops there).
    let few = other.map_or(usize::MAX, |o| o.len() / dim * LEADERS_PER_QUERY);
    let (mut lead, radius) = match leaders_capped(first, dim, eps, few, control) {
        Ok(l) => (l, eps),
        Err(Declined::Capped) => return Some(Ok(Plan::brute(a, b, dim, eps))),
        Err(Declined::Spread) => match stepped_leaders(first, dim, usize::MAX, control) {
            KnnLeaders::Found(Some((l, r))) if r > eps => (l, r),
            _ => return stopped(),
        },
    };
    if few < lead.len() / dim {
        return Some(Ok(Plan::brute(a, b, dim, eps)));
    }
    // Groups that cannot prune are known from a few hundred rows before every vector is
    // assigned (uniform 64-D vectors at eps 0.55 spent 8.6 s grouping 97,500, the general
    // join 5.5 s in all).
    match early_share(first, dim, &lead, radius, eps, control) {
        None => return stopped(),
        Some(share) if share > 2.0 * WIDE_PAIRS_SHARE => return None,
        Some(_) => {}
    }
    let Some(mut g1) = group(
        first,
        dim,
        &mut lead,
        radius,
        Within::Radius,
        control,
        assign,
    ) else {
        return stopped();
    };
    // The other side's vectors far from every leader may lead new groups too; the first
    // side's groups of them are empty.
    let g2 = match other {
        Some(o) => match group(o, dim, &mut lead, radius, Within::Radius, control, assign) {
            Some(g) => Some(g),
            None => return stopped(),
        },
        None => None,
    };
    let k = lead.len() / dim;
    let end = *g1.start.last().unwrap_or(&0);
    g1.start.resize(k + 1, end);
    g1.radius.resize(k, 0.0);
    let (ga, gb) = match g2 {
        Some(g2) if b_first => (g2, Some(g1)),
        g2 => (g1, g2),
    };
    let gb_ref = gb.as_ref().unwrap_or(&ga);
    // A pair within eps has a.b >= (|a|^2 + |b|^2 - eps^2) / 2 >= 1 - eps^2 / 2 - slack
    // (`dot_slack`).
    let slack = dot_slack(dim);
    let floor = (1.0 - eps * eps / 2.0 - slack) as f32;
    // Groups whose members are mostly within reach of each other prune nothing (no
    // clusters at this radius, or eps too wide for them), and small groups cost more a pair
    // than the general join's blocks: it does better.
    if kept_share(&lead, dim, &ga, gb_ref, b.is_none(), eps, slack) > WIDE_PAIRS_SHARE {
        return None;
    }
    let pairs = group_pairs(&lead, dim, &ga, gb_ref, b.is_none(), eps, slack, control);
    if let Err(e) = control.check() {
        return Some(Err(e));
    }
    let plan = Plan {
        dim,
        self_join: b.is_none(),
        eps,
        radius,
        lead,
        ga,
        gb,
        pairs,
        slack,
        floor,
        sure: f32::INFINITY,
        sure_f16: f32::INFINITY,
        brute: false,
        make_b: None,
    };
    Some(Ok(plan))
}

/// Vector pairs [`kept_share`] and [`early_share`] draw.
const SHARE_SAMPLE: usize = 4096;

/// Rows of `x` that [`early_share`] assigns.
const EARLY_ROWS: usize = 512;

/// The `i`-th of a fixed sequence of evenly spread 64-bit values (a splitmix64 step).
fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// [`kept_share`] foreseen before the vectors are grouped: [`EARLY_ROWS`] rows of `x`
/// spread evenly, each given its nearest leader, every group's radius taken as the 90th
/// percentile of their distances from theirs, and pairs of those rows drawn as
/// [`kept_share`] draws them. Rows farther than the groups' `radius` from every leader are
/// left out: [`group`] gives them leaders of their own (clusters the leaders' sample
/// missed: a fifth of clusters-384d-1m's 10,000, which made the guessed radius that of
/// vectors a cluster apart and declined the plan). Where they are most of the rows the
/// estimate says nothing (0). An estimate only (the radii are guessed): the plan checks
/// [`kept_share`] once the groups are made. None where `control` stopped.
fn early_share(
    x: &[f32],
    dim: usize,
    lead: &[f32],
    radius: f64,
    eps: f64,
    control: &Control,
) -> Option<f64> {
    let n = x.len() / dim;
    let m = EARLY_ROWS.min(n);
    if m < 2 {
        return Some(0.0);
    }
    let rows = rows_at(x, dim, (0..m).map(|i| i * (n / m)));
    let within = near_dot(radius);
    let screened = Some((Within::Nearest, within));
    let (found, _) = nearest_leaders(&rows, dim, lead, within, screened, control, false)?;
    let near: Vec<(usize, u32, f32)> = found
        .into_iter()
        .enumerate()
        .filter(|&(_, (_, d))| d >= within)
        .map(|(i, (g, d))| (i, g, d))
        .collect();
    // (At least two: the pairs drawn below are of two rows.)
    if near.len() < (m / 2).max(2) {
        return Some(0.0);
    }
    let covered = near.len();
    let apart = |d: f32| (2.0 - 2.0 * d as f64).max(0.0).sqrt();
    let mut to_leader: Vec<f64> = near.iter().map(|&(_, _, d)| apart(d)).collect();
    to_leader.sort_unstable_by(f64::total_cmp);
    let guessed = to_leader[covered * 9 / 10];
    let reach = guessed + eps;
    let leader = |g: u32| &lead[g as usize * dim..(g as usize + 1) * dim];
    let row = |i: usize| &rows[i * dim..(i + 1) * dim];
    let kept = (0..SHARE_SAMPLE as u64)
        .into_par_iter()
        .filter(|&i| {
            let z = spread(i);
            let s = (z % covered as u64) as usize;
            let t = (s + 1 + ((z >> 32) % (covered as u64 - 1)) as usize) % covered;
            let ((s, g, _), (t, h, _)) = (near[s], near[t]);
            g == h
                || (apart(dot(leader(g), leader(h))) <= guessed + reach
                    && apart(dot(row(s), leader(h))) <= reach
                    && apart(dot(row(t), leader(g))) <= reach)
        })
        .count();
    Some(kept as f64 / SHARE_SAMPLE as f64)
}

/// An estimate of the share of all vector pairs of the groups `ga`, `gb` (around the
/// leaders `lead`) that a plan would compare: `SHARE_SAMPLE` pairs drawn evenly (a fixed
/// sequence), each counted where [`group_pairs`] keeps its pair of groups and
/// [`Plan::members`] keeps both of its vectors (the same tests).
#[allow(clippy::too_many_arguments)]
fn kept_share(
    lead: &[f32],
    dim: usize,
    ga: &Groups<'_>,
    gb: &Groups<'_>,
    self_join: bool,
    eps: f64,
    slack: f64,
) -> f64 {
    let (na, nb) = (ga.order.len() as u64, gb.order.len() as u64);
    if na == 0 || nb == 0 || (self_join && na < 2) {
        return 0.0;
    }
    let leader = |g: usize| &lead[g * dim..(g + 1) * dim];
    let group_of = |gr: &Groups<'_>, s: usize| gr.start.partition_point(|&st| st <= s) - 1;
    let kept = (0..SHARE_SAMPLE as u64)
        .into_par_iter()
        .filter(|&i| {
            let z = spread(i);
            let s = (z % na) as usize;
            let mut t = ((z >> 32).wrapping_mul(0x2545_F491_4F6C_DD1D) % nb) as usize;
            if self_join && t == s {
                t = (t + 1) % nb as usize;
            }
            let (g, h) = (group_of(ga, s), group_of(gb, t));
            if self_join && g == h {
                return true;
            }
            let gap = match g == h {
                true => 0.0,
                false => dist_floor(dot(leader(g), leader(h)), slack),
            };
            if gap > ga.radius[g] + gb.radius[h] + eps * (1.0 + 1e-9) {
                return false;
            }
            let near = |gr: &Groups<'_>, s: usize, other: usize, r: f64| {
                let reach = (r + eps) * (1.0 + 1e-9);
                gap - gr.to_leader[s] <= reach
                    && dist_floor(dot(&gr.rows[s * dim..(s + 1) * dim], leader(other)), slack)
                        <= reach
            };
            near(ga, s, h, gb.radius[h]) && near(gb, t, g, ga.radius[g])
        })
        .count();
    kept as f64 / SHARE_SAMPLE as f64
}

/// Where a grouped join hands its candidates, in chunks, from any thread: `true` with a
/// chunk whose products all reached [`Plan::sure`] (or `sure_f16`), accepted without
/// confirmation.
pub(crate) type Candidates<'a> = dyn Fn(&[Pair], bool) -> anyhow::Result<()> + Sync + 'a;

/// The pairs of groups (g of `ga`, h of `gb`; h >= g in a `self_join`) whose leaders'
/// distance, bounded below by their f32 dot product (`dist_floor`), is within the two
/// groups' radii and eps: with that bound, in order (g, then h). Every pair of leaders'
/// dot product, taken for a tile of A's leaders against a block of [`BLOCK`] leaders at a
/// time ([`heads_block4`] over all coordinates; any f32 order is within the slack): each
/// block is read once a tile, from the cache, not once a leader.
#[allow(clippy::too_many_arguments)]
fn group_pairs(
    lead: &[f32],
    dim: usize,
    ga: &Groups<'_>,
    gb: &Groups<'_>,
    self_join: bool,
    eps: f64,
    slack: f64,
    control: &Control,
) -> Vec<(u32, u32, f64)> {
    /// A's leaders a tile (four of them go through `heads_block4` together).
    const TILE: usize = 16;
    let k = lead.len() / dim;
    let blocks = in_blocks(lead, dim, dim);
    let size = |g: &Groups<'_>, i: usize| g.start[i + 1] - g.start[i];
    let leader = |g: usize| &lead[g * dim..(g + 1) * dim];
    (0..k.div_ceil(TILE))
        .into_par_iter()
        .flat_map_iter(|tile| {
            let rows = tile * TILE..((tile + 1) * TILE).min(k);
            let mut kept: Vec<Vec<(u32, u32, f64)>> = vec![Vec::new(); rows.len()];
            // Stopped: no more pairs (the caller returns the stop).
            if control.is_cancelled() {
                return kept.into_iter().flatten();
            }
            let mut out = [0.0f32; 4 * BLOCK];
            let first = if self_join { rows.start / BLOCK } else { 0 };
            for (bk, blk) in blocks.chunks_exact(BLOCK * dim).enumerate().skip(first) {
                for g in rows.clone().step_by(4) {
                    // The last leader repeated where fewer than four are left.
                    let four = [g, g + 1, g + 2, g + 3].map(|g| g.min(rows.end - 1));
                    heads_block4(four.map(leader), blk, &mut out);
                    for (i, gi) in four.into_iter().enumerate() {
                        let at = i * BLOCK;
                        if (i > 0 && gi == four[i - 1]) || size(ga, gi) == 0 {
                            continue;
                        }
                        for l in 0..BLOCK.min(k - bk * BLOCK) {
                            let h = bk * BLOCK + l;
                            if (self_join && h < gi) || size(gb, h) == 0 {
                                continue;
                            }
                            let reach = ga.radius[gi] + gb.radius[h] + eps * (1.0 + 1e-9);
                            // Most pairs are far: ruled out in squares first (no root),
                            // with room for the root's rounding; the rest by the bound.
                            let d = out[at + l];
                            let sq = 2.0 - 2.0 * d as f64 - 2.0 * slack;
                            if gi != h && sq > reach * reach * (1.0 + 1e-9) {
                                continue;
                            }
                            let gap = if gi == h { 0.0 } else { dist_floor(d, slack) };
                            if gap <= reach {
                                kept[gi - rows.start].push((gi as u32, h as u32, gap));
                            }
                        }
                    }
                }
            }
            kept.into_iter().flatten()
        })
        .collect()
}

/// From this many of A's rows in a pair of blocks of [`Plan::brute`], [`compare`] copies
/// B's block into [`Blocked`]'s layout and meets it four of A's rows at a time: the
/// comparisons of 100 and 250 queries with 95,000 clustered 384-D rows took 0.21-0.29 and
/// 0.60 s through [`dot4`] (one row at a time), 0.06-0.09 and 0.16-0.22 s so (2 threads); the
/// copy is one row's products' worth of work per eight rows. Not for the grouped plans:
/// their pairs of groups hold a few dozen members each, filtered (the copy weighs more), and
/// measured within this machine's noise either way; nor for a block met with itself (the
/// square's every product, twice the half it needs: slower on the grouped self-join).
const BLOCKED_ROWS: usize = 8;

/// The CPU's comparison of every pair of groups of `plan`: candidates to `emit` in chunks
/// from the engine's threads (`control` read between pairs of groups); returns the vector
/// pairs compared.
pub(crate) fn compare(
    plan: &Plan<'_>,
    control: &Control,
    emit: &Candidates,
) -> crate::error::Result<u64> {
    let (dim, floor, sure) = (plan.dim, plan.floor, plan.sure);
    let (ga, gb) = (&plan.ga, plan.gb());
    let compared = std::sync::atomic::AtomicU64::new(0);
    control.stage("join", plan.pairs.len() as u64);
    let result: anyhow::Result<()> = (0..plan.pairs.len()).into_par_iter().try_for_each(|p| {
        if control.is_cancelled() {
            return Ok(());
        }
        let Some((sa, sb, same)) = plan.members(p) else {
            control.advance(1, 0);
            return Ok(());
        };
        let (mut buf, mut certain) = (Vec::<Pair>::new(), Vec::<Pair>::new());
        let mut keep = |s: usize, t: usize, d: f32| {
            if d >= sure {
                certain.push(plan.pair(s, t));
            } else if d >= floor {
                buf.push(plan.pair(s, t));
            }
        };
        let row_a = |s: usize| &ga.rows[s * dim..(s + 1) * dim];
        // A brute force's blocks are rows in order (the general path below takes any).
        let contiguous = sb.last().is_some_and(|&l| l + 1 - sb[0] == sb.len());
        if plan.brute && !same && sa.len() >= BLOCKED_ROWS && contiguous {
            // B's rows (a brute force's block: in order) in parts that stay in a core's
            // cache, each met by four of A's rows at a time, past their first coordinates
            // only where the rest can lift a product to the floor.
            let pre = Bounded::pre(dim);
            let rest: Vec<f32> = sa.iter().map(|&s| Bounded::rest(row_a(s), pre)).collect();
            let mut done = Vec::new();
            for sb in sb.chunks(cached_rows(dim)) {
                let rows_b = plan.rows_b(sb[0]..sb[0] + sb.len());
                let bounded = Bounded::new(&rows_b, dim);
                let n = sb.len();
                let mut pd = vec![0.0f32; 4 * n];
                for x in (0..sa.len()).step_by(4) {
                    // The last row repeated where fewer than four are left.
                    let four = [x, x + 1, x + 2, x + 3].map(|x| x.min(sa.len() - 1));
                    let r = four.map(|x| row_a(sa[x]));
                    bounded.dots_above(r, four.map(|x| rest[x]), [floor; 4], &mut pd, &mut done);
                    for (i, x) in four.into_iter().enumerate() {
                        if i > 0 && x == four[i - 1] {
                            break;
                        }
                        for &b in &done {
                            let span = b as usize * Bounded::BLOCK..;
                            let pd = &pd[i * n..(i + 1) * n][span.clone()];
                            for (&t, &d) in sb[span].iter().zip(pd).take(Bounded::BLOCK) {
                                keep(sa[x], t, d);
                            }
                        }
                    }
                }
            }
        } else {
            // B's rows (made for the block where the plan makes them: a brute force's,
            // in order, from `base`).
            let (base, rows_b) = match plan.makes_b() && contiguous {
                true => (sb[0], plan.rows_b(sb[0]..sb[0] + sb.len())),
                false => (0, std::borrow::Cow::Borrowed(&gb.rows[..])),
            };
            for (x, &s) in sa.iter().enumerate() {
                let p = row_a(s);
                let from = if same { x + 1 } else { 0 };
                let row = |t: usize| &rows_b[(t - base) * dim..(t - base + 1) * dim];
                let others = &sb[from.min(sb.len())..];
                let quads = others.chunks_exact(4);
                for &t in quads.remainder() {
                    keep(s, t, dot(p, row(t)));
                }
                for q in quads {
                    let d = dot4(p, [row(q[0]), row(q[1]), row(q[2]), row(q[3])]);
                    for (&t, d) in q.iter().zip(d) {
                        keep(s, t, d);
                    }
                }
            }
        }
        let pairs = if same {
            sa.len() * sa.len().saturating_sub(1) / 2
        } else {
            sa.len() * sb.len()
        };
        compared.fetch_add(pairs as u64, std::sync::atomic::Ordering::Relaxed);
        control.advance(1, 0);
        if !buf.is_empty() {
            emit(&buf, false)?;
        }
        if !certain.is_empty() {
            emit(&certain, true)?;
        }
        Ok(())
    });
    result.map_err(crate::result::sink_error)?;
    control.check()?;
    Ok(compared.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the leaders' separation is known (`apart`), [`nearest_leaders`]' screen proves
    /// most vectors' leaders, and every vector still gets a leader of largest f32 dot
    /// product up to the split's margin: 384-D and 1000-D, tight clusters and a tenth of the
    /// vectors uniform (none of which the screen proves: they take the search), leaders of
    /// the leader rule at radius 1 and 0.6. (Taking the screen's best for every vector gives
    /// some uniform vectors a leader short of their largest product.)
    #[test]
    fn screened_nearest_leaders_are_the_nearest() {
        let control = Control::new();
        for (dim, seed) in [(384usize, 3u64), (1000, 4)] {
            let mut x = vectors(seed, 3000, dim, 40, false);
            // The leaders of the clusters; then every tenth vector uniform (far from all).
            let lead = [1.0, 0.6].map(|r| (r, leaders(&x, dim, r, &control).expect("clusters")));
            every_tenth_uniform(&mut x, dim, seed + 100);
            for (radius, leaders) in lead {
                let k = leaders.len() / dim;
                let near = near_dot(radius);
                // No floor: the search finds every vector's largest product.
                let floor = f32::NEG_INFINITY;
                let nearest = Some((Within::Nearest, near));
                let got = nearest_leaders(&x, dim, &leaders, floor, nearest, &control, false);
                let (got, screened) = got.unwrap();
                assert!(
                    (2000..=2700).contains(&screened),
                    "dim {dim} radius {radius}: {screened} of 3000 screened ({k} leaders)"
                );
                for (i, p) in x.chunks_exact(dim).enumerate() {
                    let g = got[i].0 as usize;
                    let mine = dot(&leaders[g * dim..(g + 1) * dim], p);
                    let best = best_dot(p, &leaders, dim);
                    assert!(
                        mine >= best - 2.0 * SPLIT_MARGIN,
                        "dim {dim} radius {radius} vector {i}: {mine} < {best} ({k} leaders)"
                    );
                }
            }
        }
    }

    /// The screen over byte heads ([`Heads::quantised`], on whichever kernel this CPU
    /// runs) settles as many vectors as the f32 one, each with its leader's whole f32
    /// product, and every vector it settles has the leader of largest product: tight
    /// clusters in 384-D and 1000-D, a tenth of the vectors uniform, leaders at radius 1
    /// and 0.6.
    #[test]
    fn the_byte_screen_settles_as_the_f32_one_does() {
        let control = Control::new();
        for (dim, seed) in [(384usize, 13u64), (1000, 14)] {
            let mut x = vectors(seed, 3000, dim, 40, false);
            let lead = [1.0, 0.6].map(|r| (r, leaders(&x, dim, r, &control).expect("clusters")));
            every_tenth_uniform(&mut x, dim, seed + 100);
            for (radius, leaders) in lead {
                let taken = screen_proves(near_dot(radius));
                let f32_heads = Heads::F32(products::in_blocks(&leaders, dim, SCREEN));
                let settled = |heads: &Heads| {
                    let got = screen(&x, dim, &leaders, heads);
                    (0..got.len()).filter(|&i| got[i].1 >= taken).count()
                };
                let bytes = Heads::quantised(&leaders, dim);
                let (by_f32, by_bytes) = (settled(&f32_heads), settled(&bytes));
                assert!(
                    by_bytes >= 2500 && by_bytes + 30 >= by_f32,
                    "dim {dim} radius {radius}: {by_bytes} settled, {by_f32} by f32 heads"
                );
                let got = screen(&x, dim, &leaders, &bytes);
                for (i, p) in x.chunks_exact(dim).enumerate() {
                    let g = got[i].0 as usize;
                    let mine = dot(&leaders[g * dim..(g + 1) * dim], p);
                    assert_eq!(mine, got[i].1, "dim {dim} radius {radius} vector {i}");
                    if got[i].1 >= taken {
                        let best = best_dot(p, &leaders, dim);
                        assert!(mine >= best, "dim {dim} vector {i}: {mine} < {best}");
                    }
                }
            }
        }
    }

    /// A join's groups take any leader within their radius ([`Within::Radius`]): where
    /// vectors sit farther from their leaders than half the leaders' separation (none
    /// proven nearest: clusters about 0.14 wide, leaders 0.2 apart), the screen still
    /// settles most of them, and every vector with a leader within the radius gets one
    /// (every tenth is uniform, near none).
    #[test]
    fn a_joins_screen_takes_any_leader_within_the_radius() {
        let control = Control::new();
        let (dim, radius) = (384usize, 0.2f64);
        let mut x = vectors(7, 3000, dim, 40, false);
        let leaders = leaders(&x, dim, radius, &control).expect("clusters");
        every_tenth_uniform(&mut x, dim, 107);
        let near = near_dot(radius);
        let floor = f32::NEG_INFINITY;
        // Nearest only: the probe finds too few proven, nothing is screened.
        let nearest = Some((Within::Nearest, near));
        let got = nearest_leaders(&x, dim, &leaders, floor, nearest, &control, false);
        assert_eq!(got.unwrap().1, 0);
        let within = Some((Within::Radius, near));
        let got = nearest_leaders(&x, dim, &leaders, floor, within, &control, false);
        let (got, screened) = got.unwrap();
        assert!(
            (2000..=2700).contains(&screened),
            "{screened} of 3000 screened"
        );
        for (i, p) in x.chunks_exact(dim).enumerate() {
            let g = got[i].0 as usize;
            let mine = dot(&leaders[g * dim..(g + 1) * dim], p);
            assert!(
                (mine - got[i].1).abs() <= 1e-5,
                "vector {i}: {mine} {}",
                got[i].1
            );
            let best = best_dot(p, &leaders, dim);
            assert!(
                mine >= near || best < near,
                "vector {i}: {mine} < {near} <= {best}"
            );
        }
    }

    /// Every tenth vector of `x` (the 5th, 15th, ...) replaced by a uniform one (far from
    /// every cluster).
    fn every_tenth_uniform(x: &mut [f32], dim: usize, seed: u64) {
        let n = x.len() / dim;
        let lone = vectors(seed, n / 10, dim, 0, false);
        for (i, v) in lone.chunks_exact(dim).enumerate() {
            x[(10 * i + 5) * dim..(10 * i + 6) * dim].copy_from_slice(v);
        }
    }

    /// Unit vectors (f32): `centres` directions plus noise, or uniform (`centres` 0); with
    /// `tail_only`, every coordinate before the last eighth is zero (the split's first
    /// coordinates then say nothing).
    pub(super) fn vectors(
        seed: u64,
        n: usize,
        dim: usize,
        centres: usize,
        tail_only: bool,
    ) -> Vec<f32> {
        let mut s = seed;
        let mut gauss = move || {
            // Sum of uniforms: a rough normal, enough for directions.
            (0..12)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (s >> 11) as f64 / (1u64 << 53) as f64
                })
                .sum::<f64>()
                - 6.0
        };
        let first = if tail_only { dim - dim / 8 - 1 } else { 0 };
        let c: Vec<f64> = (0..centres * dim).map(|_| gauss()).collect();
        let mut out = Vec::with_capacity(n * dim);
        for i in 0..n {
            let mut v: Vec<f64> = (0..dim)
                .map(|d| {
                    let base = if centres > 0 {
                        c[(i % centres) * dim + d]
                    } else {
                        0.0
                    };
                    base + if centres > 0 { 0.1 } else { 1.0 } * gauss()
                })
                .collect();
            v[..first].iter_mut().for_each(|x| *x = 0.0);
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            out.extend(v.iter().map(|x| (x / norm) as f32));
        }
        out
    }

    fn best_dot(p: &[f32], leaders: &[f32], dim: usize) -> f32 {
        leaders
            .chunks_exact(dim)
            .map(|l| dot(l, p))
            .fold(f32::NEG_INFINITY, f32::max)
    }

    /// Every vector gets a leader whose f32 dot product is the largest, up to the split's
    /// margin: short and long rows, dimensions on and off the multiples of 8 and of the
    /// block, leaders short of a block, clustered, uniform and tail-only data.
    #[test]
    fn nearest_leaders_finds_the_largest_dot_product() {
        let control = Control::new();
        for &dim in &[3usize, 8, 63, 64, 100, 130, 384, 1000] {
            for &(centres, tail) in &[(7usize, false), (0, false), (5, true)] {
                if tail && dim < 16 {
                    continue;
                }
                let x = vectors(dim as u64 * 31 + centres as u64, 301, dim, centres, tail);
                for &k in &[1usize, 5, 33, 70] {
                    let leaders = &x[..k * dim];
                    let got =
                        nearest_leaders(&x, dim, leaders, f32::NEG_INFINITY, None, &control, false)
                            .unwrap();
                    let got: Vec<u32> = got.0.into_iter().map(|(g, _)| g).collect();
                    for (i, p) in x.chunks_exact(dim).enumerate() {
                        let g = got[i] as usize;
                        assert!(g < k);
                        let mine = dot(&leaders[g * dim..(g + 1) * dim], p);
                        let best = best_dot(p, leaders, dim);
                        assert!(
                            mine >= best - 2.0 * SPLIT_MARGIN,
                            "dim {dim}, k {k}, vector {i}: {mine} < {best}"
                        );
                    }
                }
            }
        }
    }

    /// The kNN index's invariants, which its search's bounds rest on: each pivot is its
    /// group's mean (to f32 rounding), `norm2` its squared norm, every member's `to_leader`
    /// at least its real distance from the pivot (and hardly more), each radius the
    /// largest of them; and `pivot_floor` a lower bound on a unit vector's real distance
    /// from a pivot that is tight (within the slack), so that the test fails if the bound is
    /// taken as a unit vector's (a mean is shorter) or the distances are shrunk.
    #[test]
    fn knn_index_pivots_are_means_and_bound_tightly() {
        for (dim, centres) in [(48usize, 30usize), (100, 12)] {
            let x = vectors(5, 6000, dim, centres, false);
            let index = knn_index(&x, dim, &Control::new()).expect("clustered data are grouped");
            let g = &index.groups;
            let slack = dot_slack(dim);
            let queries = vectors(9, 50, dim, centres, false);
            let mut shortest = f64::INFINITY;
            for h in 0..g.start.len() - 1 {
                let (a, b) = (g.start[h], g.start[h + 1]);
                if a == b {
                    continue;
                }
                let pivot = &index.leaders[h * dim..(h + 1) * dim];
                let n2: f64 = pivot.iter().map(|&v| v as f64 * v as f64).sum();
                assert_eq!(index.norm2[h], n2, "group {h}");
                shortest = shortest.min(n2);
                for c in 0..dim {
                    let mean = g.rows[a * dim..b * dim]
                        .chunks_exact(dim)
                        .map(|r| r[c] as f64)
                        .sum::<f64>()
                        / (b - a) as f64;
                    assert!(
                        (pivot[c] as f64 - mean).abs() <= 1e-6,
                        "group {h}: not the mean"
                    );
                }
                let mut widest = 0.0f64;
                for s in a..b {
                    let d = dist64(pivot, &g.rows[s * dim..(s + 1) * dim]);
                    assert!(g.to_leader[s] >= d && g.to_leader[s] <= d * (1.0 + 1e-6) + 1e-12);
                    widest = widest.max(g.to_leader[s]);
                }
                assert_eq!(g.radius[h], widest, "group {h}");
                for q in queries
                    .chunks_exact(dim)
                    .chain(g.rows[a * dim..b * dim].chunks_exact(dim))
                {
                    let real = dist64(q, pivot);
                    let l = pivot_floor(dot(q, pivot), index.norm2[h], slack);
                    // Tight in squares: within the slack's 2 x 2 (a float's rounding).
                    let tight = l * l >= real * real - 4.0 * slack;
                    assert!(l <= real && tight, "{dim}-D group {h}: {l} vs {real}");
                }
            }
            // The data make the test able to fail: a mean is further inside the sphere
            // than the slack allows for.
            assert!(shortest < 1.0 - 8.0 * slack, "{dim}-D: {shortest}");
        }
    }

    /// `n` clustered vectors (`seen`: seed and centres) whose rows off the leaders'
    /// sample's stride (every 8th) come from other centres (`hidden`), which it then misses.
    fn with_missed_clusters(
        n: usize,
        dim: usize,
        seen: (u64, usize),
        hidden: (u64, usize),
    ) -> Vec<f32> {
        let seen = vectors(seen.0, n, dim, seen.1, false);
        let hidden = vectors(hidden.0, n, dim, hidden.1, false);
        (0..n)
            .flat_map(|i| {
                let src = if i % 8 == 3 { &hidden } else { &seen };
                src[i * dim..(i + 1) * dim].to_vec()
            })
            .collect()
    }

    /// Clusters the sample never meets get leaders of their own when the groups are made:
    /// every vector ends within the leaders' radius of its leader.
    #[test]
    fn missed_clusters_get_leaders() {
        let (n, dim, radius) = (40_000usize, 96usize, 0.5);
        let control = Control::new();
        let x = with_missed_clusters(n, dim, (1, 49), (2, 30));
        let mut l = leaders(&x, dim, radius, &control).unwrap();
        let before = l.len() / dim;
        let g = group(&x, dim, &mut l, radius, Within::Radius, &control, None).unwrap();
        assert!(l.len() / dim > before, "no leaders added");
        assert_eq!(g.start.len(), l.len() / dim + 1);
        let worst = g.to_leader.iter().copied().fold(0.0f64, f64::max);
        assert!(worst <= radius * 1.01, "a vector {worst} from its leader");
        let mut seen_rows: Vec<u32> = g.order.clone();
        seen_rows.sort_unstable();
        assert!(seen_rows.iter().copied().eq(0..n as u32));
    }

    /// A kNN's groups ([`Within::Nearest`]) where the sample misses clusters: the screen's
    /// best is taken first and the rounds add leaders, yet every vector within the radius
    /// of some leader ends in the group of its nearest among them all (largest f32
    /// product, up to the split's margin), most proven by the leaders' separations
    /// without a search. Leaders at radius 0.6 (several a cluster, so the screen's best
    /// of four is not always the nearest) and at 1.
    #[test]
    fn knn_groups_take_the_nearest_of_all_leaders() {
        let (n, dim) = (40_000usize, 384usize);
        let control = Control::new();
        let x = with_missed_clusters(n, dim, (21, 40), (22, 12));
        for radius in [0.3, 0.45, 0.6, 1.0] {
            let mut l = leaders(&x, dim, radius, &control).unwrap();
            let before = l.len() / dim;
            let g = group(&x, dim, &mut l, radius, Within::Nearest, &control, None).unwrap();
            assert!(l.len() / dim > before, "radius {radius}: no leaders added");
            nearest_in_groups(&x, dim, &l, &g, near_dot(radius));
            assert!(
                g.screened >= n / 2,
                "radius {radius}: {} proven",
                g.screened
            );
        }
        // Vectors near the middle of eight leaders about 0.45 apart: the screen's best of
        // four is often not the nearest, and none is proven by the separations (products
        // about 0.89), so each takes the search.
        let (centres, per) = (50usize, 8usize);
        let c = vectors(23, centres, dim, 0, false);
        let spread = vectors(24, centres * per, dim, 0, false);
        let unit = |v: Vec<f32>| {
            let norm = v.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt();
            v.into_iter()
                .map(|a| (a as f64 / norm) as f32)
                .collect::<Vec<f32>>()
        };
        let mut l: Vec<f32> = (0..centres * per)
            .flat_map(|j| {
                let (c, r) = (&c[(j / per) * dim..][..dim], &spread[j * dim..][..dim]);
                unit(c.iter().zip(r).map(|(&a, &b)| a + 0.35 * b).collect())
            })
            .collect();
        let noise = vectors(25, 4000, dim, 0, false);
        let x: Vec<f32> = (0..4000)
            .flat_map(|i| {
                let (c, e) = (&c[(i % centres) * dim..][..dim], &noise[i * dim..][..dim]);
                unit(c.iter().zip(e).map(|(&a, &b)| a + 0.05 * b).collect())
            })
            .collect();
        let radius = 0.45;
        let g = group(&x, dim, &mut l, radius, Within::Nearest, &control, None).unwrap();
        assert_eq!(l.len() / dim, centres * per, "no vector is far");
        nearest_in_groups(&x, dim, &l, &g, near_dot(radius));
    }

    /// Every vector of `g` within `near` of some leader is in its nearest's group.
    fn nearest_in_groups(x: &[f32], dim: usize, l: &[f32], g: &Groups, near: f32) {
        for h in 0..g.start.len() - 1 {
            for s in g.start[h]..g.start[h + 1] {
                let p = &x[g.order[s] as usize * dim..][..dim];
                let best = best_dot(p, l, dim);
                let mine = dot(&l[h * dim..(h + 1) * dim], p);
                assert!(
                    best < near || mine >= best - 2.0 * SPLIT_MARGIN,
                    "vector {}: {mine} < {best}",
                    g.order[s]
                );
            }
        }
    }

    /// The chunked leaders' pass keeps the serial rule: every sampled vector is within the
    /// radius of some leader, and no two leaders are within it of each other (up to the
    /// split's margin); it declines where most of the sample would lead.
    #[test]
    fn leaders_cover_the_sample_and_stay_apart() {
        for &(dim, centres) in &[(64usize, 40usize), (130, 300), (384, 1000)] {
            let n = 6000;
            let x = vectors(dim as u64, n, dim, centres, false);
            let radius = 0.8;
            let near = (1.0 - radius * radius / 2.0) as f32;
            let l = leaders(&x, dim, radius, &Control::new()).expect("clustered data have leaders");
            let k = l.len() / dim;
            assert!(
                k >= centres.min(n / 8) / 2 && k <= 2 * centres,
                "{k} leaders for {centres} centres"
            );
            let step = (n / (n / 8).clamp(SAMPLE_MIN, SAMPLE_MAX).min(n)).max(1);
            for p in x.chunks_exact(dim).step_by(step) {
                assert!(best_dot(p, &l, dim) >= near - 2.0 * SPLIT_MARGIN);
            }
            for i in 0..k {
                for j in 0..i {
                    assert!(
                        dot(&l[i * dim..(i + 1) * dim], &l[j * dim..(j + 1) * dim])
                            < near + 2.0 * SPLIT_MARGIN
                    );
                }
            }
            let uniform = vectors(5, n, dim, 0, false);
            assert!(
                leaders(&uniform, dim, 0.1, &Control::new()).is_none(),
                "uniform data declined"
            );
        }
    }

    /// The share's floor holds under the model it assumes: for rates that are mixtures of
    /// exponentials (clusters of several sizes met in random order), the share that leads
    /// (the rate's integral) is at least the floor read at a quarter, and for one
    /// exponential close to it.
    #[test]
    fn share_floor_bounds_mixtures_of_exponentials() {
        let share = |rate: &dyn Fn(f64) -> f64| {
            (0..10_000)
                .map(|i| rate((i as f64 + 0.5) / 1e4))
                .sum::<f64>()
                / 1e4
        };
        for &l in &[0.1f64, 0.5, 1.0, 1.6, 3.0, 8.0, 30.0] {
            let one = |x: f64| (-l * x).exp();
            let (s, f) = (share(&one), share_floor(0.25, one(0.25)));
            // Exact after the quarter; before it, short by at most (1 - rate) a row.
            assert!(
                f <= s + 1e-6 && s - f <= 0.25 * (1.0 - one(0.25)) + 1e-6,
                "lambda {l}: share {s}, floor {f}"
            );
            for &(w, l2) in &[(0.3f64, 0.2f64), (0.5, 20.0), (0.8, 1.0)] {
                let mix = |x: f64| w * (-l * x).exp() + (1.0 - w) * (-l2 * x).exp();
                let (s, f) = (share(&mix), share_floor(0.25, mix(0.25)));
                assert!(
                    f <= s + 1e-6,
                    "mixture {w} x {l}, {l2}: share {s}, floor {f}"
                );
            }
        }
        assert_eq!(share_floor(0.25, 1.0), 1.0);
        assert_eq!(share_floor(0.25, 0.0), 0.0);
    }

    /// Groups of uniform vectors at a wide eps are within reach of each other: both
    /// estimates of the share of pairs a plan compares say most ([`early_share`] before
    /// the vectors are grouped, [`kept_share`] after), and [`plan`] declines; clustered
    /// vectors at a narrower eps leave few, and are planned.
    #[test]
    fn shares_of_pairs_compared_tell_groups_that_prune() {
        let (n, dim) = (6000usize, 64usize);
        let control = Control::new();
        for (centres, eps, wide) in [(0usize, 1.15f64, true), (60, 0.3, false)] {
            let x = vectors(5, n, dim, centres, false);
            let mut lead = leaders(&x, dim, eps, &control).expect("the sample leads");
            let early = early_share(&x, dim, &lead, eps, eps, &control).unwrap();
            let g = group(&x, dim, &mut lead, eps, Within::Radius, &control, None).unwrap();
            let kept = kept_share(&lead, dim, &g, &g, true, eps, dot_slack(dim));
            let what = format!("{centres} centres: early {early}, kept {kept}");
            assert_eq!(early > 2.0 * WIDE_PAIRS_SHARE, wide, "{what}");
            assert_eq!(kept > WIDE_PAIRS_SHARE, wide, "{what}");
            assert_eq!(
                plan(&x, None, dim, eps, &control, None).is_none(),
                wide,
                "{what}"
            );
        }
    }

    /// `n` unit vectors, each one of `centres` random directions (drawn for it at random,
    /// not in turn as [`vectors`] does: an even sample meets clusters by chance) plus a
    /// random direction of length `noise`, normalised; `seed` and `seed + 1` draw them.
    fn scattered(seed: u64, n: usize, dim: usize, centres: usize, noise: f64) -> Vec<f32> {
        let c = vectors(seed, centres, dim, 0, false);
        let off = vectors(seed + 1, n, dim, 0, false);
        (0..n)
            .flat_map(|i| {
                let g = (spread(i as u64) % centres as u64) as usize;
                let v: Vec<f64> = (0..dim)
                    .map(|d| c[g * dim + d] as f64 + noise * off[i * dim + d] as f64)
                    .collect();
                let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                v.into_iter().map(move |x| (x / norm) as f32)
            })
            .collect()
    }

    /// More clusters than 16 sqrt(n) (the kNN's leaders' cap before, below which its index
    /// declined: 1M vectors around 30,000 centres then ran the brute force for over 20
    /// min): 100,000 64-D vectors around 8,000 centres get a leader for most clusters.
    #[test]
    fn many_clusters_lead_a_knn() {
        let (n, dim, centres) = (100_000usize, 64usize, 8000usize);
        let x = scattered(5, n, dim, centres, 0.02);
        let KnnLeaders::Found(Some((l, radius))) =
            knn_leaders(&x, dim, usize::MAX, &Control::new())
        else {
            panic!("the kNN's leaders declined")
        };
        let led = l.len() / dim;
        let old_cap = 16 * (n as f64).sqrt() as usize;
        assert!(
            led > old_cap && led <= n / KNN_LEADERS_SHARE,
            "{led} leaders"
        );
        assert_eq!(radius, 1.0);
        // Fewer queries than leaders: the brute force is the cheaper (`Over`).
        assert!(matches!(
            knn_leaders(&x, dim, led / 2, &Control::new()),
            KnnLeaders::Over
        ));
    }

    /// More clusters than the leaders' sample meets (17,000 vectors around 4,096 centres,
    /// drawn at random: the 4,096-vector sample misses about a third of them, as
    /// clusters-384d-1m's 16,384 miss a fifth of its 10,000; the early estimate's rows, at
    /// another step, meet missed ones): the estimate leaves the missed clusters' vectors
    /// to [`group`], which gives them leaders, and the plan is grouped. (Counted with
    /// them, a tenth of the rows a cluster apart from every leader made the guessed radius
    /// 1.4 and declined the plan: the 1M join then ran as a general join, over 14 minutes
    /// against 20 s.)
    #[test]
    fn a_sample_that_misses_clusters_still_plans() {
        let (n, dim, centres, eps) = (17000usize, 64usize, 4096usize, 0.2f64);
        let x = scattered(11, n, dim, centres, 0.05);
        let control = Control::new();
        let lead = leaders(&x, dim, eps, &control).expect("the sample leads");
        let sampled = lead.len() / dim;
        assert!(
            sampled < centres * 3 / 4,
            "{sampled} leaders: the sample should miss clusters"
        );
        let early = early_share(&x, dim, &lead, eps, eps, &control).unwrap();
        assert!(early <= 2.0 * WIDE_PAIRS_SHARE, "early share {early}");
        let plan = plan(&x, None, dim, eps, &control, None)
            .expect("planned, not declined")
            .unwrap();
        assert!(!plan.brute);
        let groups = plan.lead.len() / dim;
        assert!(
            groups > sampled + centres / 5,
            "{groups} groups, {sampled} from the sample"
        );
    }

    /// More clusters than a `SAMPLE_MAX` sample can meet (400,000 vectors around 30,000
    /// centres, drawn at random): that sample leads at more than its share, and the pass
    /// runs again on a wider one, which finds the clusters. (Without it the 1M-vector join
    /// of 30,000 clusters declined the plan and ran as a general join.)
    #[test]
    fn more_clusters_than_the_sample_meets_get_a_wider_sample() {
        let (n, dim, centres, radius) = (400_000usize, 16usize, 30_000usize, 0.3f64);
        let x = scattered(21, n, dim, centres, 0.02);
        let control = Control::new();
        let near = near_dot(radius);
        let picked: Vec<usize> = (0..n).step_by(n / SAMPLE_MAX).collect();
        let mut out = Prefixed::new(Split::new(dim, near));
        let cap = (picked.len() as f64 * MAX_LEADER_SHARE) as usize;
        assert!(
            !lead(
                &x,
                &picked,
                near,
                (cap, MAX_LEADER_SHARE),
                &mut out,
                &control
            ),
            "a sample of {} leads within its share",
            picked.len()
        );
        let found = leaders(&x, dim, radius, &control).expect("the wider sample leads");
        let k = found.len() / dim;
        assert!(k > centres * 3 / 4 && k <= centres, "{k} leaders");
    }

    /// Wide rows' leader rule (screened: [`Prefixed::covered`]) picks the leaders of a
    /// serial pass of plain f32 dot products: 384-D, clusters with every fifth row uniform
    /// (nearly all of those lead), more rows than a chunk, radius 1 and 0.6; and rows that
    /// are zero before their last eighth (the screen's coordinates say nothing: the whole
    /// products decide).
    #[test]
    fn screened_leader_rule_is_the_serial_one() {
        let (n, dim) = (3000usize, 384usize);
        for (tail, radius) in [(false, 1.0), (false, 0.6), (true, 1.0)] {
            let mut x = vectors(7, n, dim, 60, tail);
            let lone = vectors(8, n / 5, dim, 0, tail);
            for (i, v) in lone.chunks_exact(dim).enumerate() {
                x[(5 * i + 2) * dim..(5 * i + 3) * dim].copy_from_slice(v);
            }
            let picked: Vec<usize> = (0..n).collect();
            let near = near_dot(radius);
            let mut out = Prefixed::new(Split::new(dim, near));
            assert!(out.blocked.is_some());
            assert!(lead(&x, &picked, near, (n, 1.0), &mut out, &Control::new()));
            let mut want: Vec<f32> = Vec::new();
            for p in x.chunks_exact(dim) {
                if !want.chunks_exact(dim).any(|l| dot(l, p) >= near) {
                    want.extend_from_slice(p);
                }
            }
            assert!(
                want.len() / dim > n / 5,
                "radius {radius}: {}",
                want.len() / dim
            );
            assert!(
                out.rows == want,
                "radius {radius}: {} leaders, {} serially",
                out.len(),
                want.len() / dim
            );
        }
    }

    /// A pass whose rows nearly all lead stops after its second chunk; one whose rate is
    /// lower but shows more than `share` would lead stops at its quarter (a sixteenth of
    /// its cost); one over clustered rows runs to the end.
    #[test]
    fn the_leader_rule_stops_a_doomed_pass_early() {
        let (n, dim) = (8192usize, 64usize);
        let near = near_dot(0.1);
        let picked: Vec<usize> = (0..n).collect();
        let uniform = vectors(9, n, dim, 0, false);
        let mut out = Prefixed::new(Split::new(dim, near));
        assert!(!lead(
            &uniform,
            &picked,
            near,
            (n, 0.75),
            &mut out,
            &Control::new()
        ));
        assert!(
            out.len() <= 2 * LEAD_CHUNK,
            "{} leaders before it stopped",
            out.len()
        );
        // Pairs of copies: half the rows lead, a rate far below 0.99 but above 0.2: it
        // stops at its quarter, 2,048 rows in.
        let pairs: Vec<f32> = uniform[..n / 2 * dim].repeat(2);
        let picked: Vec<usize> = (0..n / 2).flat_map(|i| [i, i + n / 2]).collect();
        let mut out = Prefixed::new(Split::new(dim, near));
        assert!(!lead(
            &pairs,
            &picked,
            near,
            (n, 0.2),
            &mut out,
            &Control::new()
        ));
        assert!(
            out.len() == n / 8,
            "{} leaders before it stopped",
            out.len()
        );
        let picked: Vec<usize> = (0..n).collect();
        let clustered = vectors(9, n, dim, 40, false);
        let near = near_dot(0.8);
        let mut out = Prefixed::new(Split::new(dim, near));
        assert!(lead(
            &clustered,
            &picked,
            near,
            (n, 0.5),
            &mut out,
            &Control::new()
        ));
        assert!(out.len() < 200, "{} leaders for 40 clusters", out.len());
    }
}
