//! The cosine kNN of few queries: every query meets every row in blocks, bounded by the
//! products over the first coordinates, from a k-th distance seeded before the first row.

use super::knn::*;
use super::*;

/// The f32 product of unit copies below which a row is out of a query's reach where its
/// k-th distance is `limit`: [`least_dot`] of [`rule_reach`], and the same rounded down to
/// f32 (none at or above it is), for the f32 tests before [`rank_by_floor`].
pub(super) fn least_below(limit: f64, dim: usize) -> (f64, f32) {
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

/// The collection's f32 unit copies as the products read them: the copy the search made
/// already, or each row's made where a task meets it (few queries: the whole collection's
/// copy cost as long as their products). The same bits either way ([`unit_f32`]).
struct Units<'a, T> {
    made: Option<std::borrow::Cow<'a, [f32]>>,
    x: &'a [T],
    norms: &'a [f64],
    dim: usize,
}

impl<'a, T: Coord> Units<'a, T> {
    fn new(made: Option<&'a [T]>, x: &'a [T], norms: &'a [f64], dim: usize) -> Self {
        Units {
            made: made.map(as_f32),
            x,
            norms,
            dim,
        }
    }
    /// The copies of rows `span`, one after the other.
    fn span(&self, span: std::ops::Range<usize>) -> std::borrow::Cow<'_, [f32]> {
        let d = self.dim;
        match &self.made {
            Some(c) => c[span.start * d..span.end * d].into(),
            None => unit_rows_f32(self.x, self.norms, d, span, d).into(),
        }
    }
    /// [`Blocked::prefix`] of the copies of rows `span`: their first `s` coordinates.
    fn prefix(&self, span: std::ops::Range<usize>, s: usize) -> crate::cpu::partition::Blocked {
        use crate::cpu::partition::Blocked;
        let d = self.dim;
        match &self.made {
            Some(c) => Blocked::prefix(&c[span.start * d..span.end * d], d, s),
            None => Blocked::new(&unit_rows_f32(self.x, self.norms, d, span, s), s),
        }
    }
}

/// Which data row each query is, where the queries are rows of the data (a self-kNN leaves
/// a query's own row out).
#[derive(Clone, Copy)]
pub(super) enum Own<'a> {
    /// Queries apart from the data.
    Apart,
    /// Query r is row r.
    All,
    /// Query r is row `rows[r]`.
    Rows(&'a [usize]),
}

impl Own<'_> {
    /// Whether row `j` is query `r` itself.
    fn is(self, r: usize, j: usize) -> bool {
        match self {
            Own::Apart => false,
            Own::All => r == j,
            Own::Rows(rows) => rows[r] == j,
        }
    }
    fn any(self) -> bool {
        !matches!(self, Own::Apart)
    }
}

/// Queries [`seeds_pay`] seeds, and rows it samples.
const SEED_PROBE: (usize, usize) = (8, 2048);

/// Whether [`seed_caps`] pays before [`knn_brute()`]: where the seeds leave most products
/// past their first coordinates anyway (no clusters: uniform directions), its work is lost
/// (about a tenth of the products'). Decided on the first [`SEED_PROBE`] queries' seeds: the
/// share of a sample of rows whose bound by `partition::Bounded`'s first coordinates and
/// rest (`rest_q`: the queries' rest norms) reaches their floors, paying below a quarter.
#[allow(clippy::too_many_arguments)]
fn seeds_pay<T: Coord>(
    fx: &Units<T>,
    fq: &[f32],
    rest_q: &[f32],
    dim: usize,
    k: usize,
    own: Own,
    dist: &(dyn Fn(usize, usize) -> f64 + Sync),
    control: &crate::control::Control,
) -> bool {
    use crate::cpu::partition::{dot, Bounded};
    let (n, m) = (fx.norms.len(), fq.len() / dim.max(1));
    let pre = Bounded::pre(dim);
    if seed_coords(dim).is_none() || m == 0 {
        return false;
    }
    let probe = m.min(SEED_PROBE.0);
    let caps = seed_caps(fx, &fq[..probe * dim], dim, k, own, dist, control);
    let step = n.div_ceil(SEED_PROBE.1).max(1);
    let below: Vec<f32> = caps.iter().map(|&c| least_below(c, dim).1).collect();
    let (mut met, mut left) = (0usize, 0usize);
    for j in (0..n).step_by(step) {
        let row = fx.span(j..j + 1);
        let rest = Bounded::rest(&row, pre);
        for (r, &below) in below.iter().enumerate() {
            let q = &fq[r * dim..(r + 1) * dim];
            met += 1;
            left += (dot(&q[..pre], &row[..pre]) + rest_q[r] * rest >= below) as usize;
        }
    }
    4 * left < met
}

/// The coordinates [`seed_caps`] ranks rows by: a third of
/// [`Bounded::pre`](crate::cpu::partition::Bounded::pre)'s, at least 40
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
/// [`knn_brute()`]'s bounds prune from its first rows on: the rule distance (`dist(query,
/// row)`) of its [`seed_rows`] rows with the largest f32 products over the first
/// [`seed_coords`] coordinates, the k-th of them (infinite where fewer than k rows). Which
/// rows is a guess (on clustered data, mostly the query's own cluster, for about a tenth
/// of the products' work); the bound is exact, any k rows' distances being one.
fn seed_caps<T: Coord>(
    fx: &Units<T>,
    fq: &[f32],
    dim: usize,
    k: usize,
    own: Own,
    dist: &(dyn Fn(usize, usize) -> f64 + Sync),
    control: &crate::control::Control,
) -> Vec<f64> {
    use crate::cpu::partition::{cached_rows, max_of};
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Mutex;
    let (n, m) = (fx.norms.len(), fq.len() / dim.max(1));
    let want = seed_rows(k);
    if m == 0 || n < k + usize::from(own.any()) || k == 0 {
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
            let heads = fx.prefix(span.clone(), s);
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
                            if h > at && !own.is(r, span.start + l) {
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
/// (an upper bound on its real k-th distance: first `caps` where given, else
/// [`seed_caps`]'s, then any task's) is
/// shared, so that a row is measured by the rule only where its floor could still place
/// it, and a block of rows is completed past its first quarter of coordinates only where
/// the rest could lift a product to that floor. Each task's k nearest among its rows
/// within that bound (exact) merge into the query's.
#[allow(clippy::too_many_arguments)]
pub(super) fn knn_brute<T: Coord>(
    engine: &Engine,
    x: &[T],
    rows_q: &[T],
    own: Own,
    dim: usize,
    k: usize,
    nx: &[f64],
    nq: &[f64],
    cx: Option<&[T]>,
    cq: Option<&[T]>,
    caps: Option<&[f64]>,
    control: &crate::control::Control,
) -> Result<BruteRun> {
    use crate::cpu::partition::{cached_rows, dot_slack, Bounded};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    engine.install(|| -> Result<BruteRun> {
        let fx = Units::new(cx, x, nx, dim);
        let fq = match cq {
            Some(cq) => as_f32(cq),
            None => fx.span(0..nx.len()),
        };
        let fq: &[f32] = &fq;
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
        let seeds = match caps {
            Some(caps) => caps.to_vec(),
            None if seeds_pay(&fx, fq, &rest_q, dim, k, own, &dist, control) => {
                seed_caps(&fx, fq, dim, k, own, &dist, control)
            }
            None => vec![f64::INFINITY; m],
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
                let copies = fx.span(span.clone());
                let bounded = Bounded::new(&copies, dim);
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
                                .filter(|&l| pd[l] >= below && !own.is(r, span.start + l))
                                .map(|l| (pd[l] as f64, (span.start + l) as u32)),
                        );
                        // The task's k nearest among its rows within the limit, exact.
                        local.clear();
                        rank_by_floor(
                            near,
                            local,
                            k,
                            limit,
                            least,
                            slack,
                            floor,
                            |j| j,
                            |e| measure((rows_q, nq), (x, nx), dim, r, e),
                        );
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

/// [`knn_brute()`]'s answer and what its report says: the seconds [`seed_caps`] took, and
/// the share of the products completed past their first coordinates.
pub(super) struct BruteRun {
    pub(super) ranked: Ranked,
    pub(super) seeded: f64,
    pub(super) completed: f64,
}
