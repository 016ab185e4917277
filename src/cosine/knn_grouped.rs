//! The cosine kNN through the grouped index of `cpu/partition/` (leaders, groups, radii).

use super::knn::*;
use super::*;

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
/// `cpu/partition/` (leaders, groups, radii over f32 copies of the data's unit copies),
/// exact by construction; None where the index declines (no clusters, too few rows).
///
/// L_g is group g's pivot, the mean of its members (`partition::recentre`). A query
/// measures a pivot by an f32 dot product (`pivot_floor` bounds its real distance from
/// below) and visits groups in increasing `|q - L_g| - r_g`, a lower bound on its
/// distance from every member (triangle inequality). In a group it
/// skips the members whose `|q - L_g| - |x - L_g|` already rules them out, bounds the rest
/// by their f32 dot products and computes the rule's distance, in increasing bound, for
/// those whose bound (`rule_floor`) does not exceed the current k-th distance. It stops at
/// the first group whose bound exceeds it: every row not computed has a rule distance
/// above the k-th (ties are visited), so the k kept are the rule's k nearest.
///
/// Each query has a home group g and an upper bound on its distance from L_g (a
/// self-kNN's, its own group; an A ⋈ B's, the pivot of its largest dot product,
/// `partition::homes`): it visits g first,
/// then the other groups in increasing `|L_g - L_h| - |q - L_g| - r_h` (g's nearest groups
/// by the pivots' distances, bounded once: [`NearGroups`]), measuring a leader only for
/// the groups that bound leaves in, and skipping those that the measured `|q - L_h| - r_h`
/// rules out; the same stop. Past the end of g's list, every pivot left off it is
/// measured, where the list's end does not rule them out. The queries of one home group
/// walk its list in step, a group that several visit met by all of those at once
/// (products four rows by four, `dot4x4`), each with its own bounds and stop.
///
/// A probe of 64 evenly spread queries declines the search (None) where their f32 dot
/// products would cost more than the blocked brute force's: "clusters" that prune little.
#[allow(clippy::too_many_arguments)]
pub(super) fn knn_grouped<T: Coord>(
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
    use crate::cpu::partition::pivot_floor;
    use crate::cpu::partition::{dot, dot4, dot4x4, dot_slack, homes, knn_index_of, knn_leaders};
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
        let (dots, exact, past) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let kth = |best: &Vec<(f64, u32)>| kth_of(best, k);
        // A self-kNN's query knows its own group and its distance from that group's pivot:
        // each group's nearest others by the pivots' bound then come before any other
        // pivot is measured.
        let near_groups = NearGroups::new(&index, slack);
        // An A ⋈ B kNN's queries: each one's home group and distance from its pivot (the
        // lists serve it as they serve the home's members), and the queries in order of
        // their homes (neighbouring queries then visit the same groups).
        let homes = match &fq {
            Some(fq) => match homes(fq, dim, &index, control) {
                Some(h) => Some(h),
                None => {
                    control.check()?;
                    return Ok(None);
                }
            },
            None => None,
        };
        let by_home: Vec<u32> = match &homes {
            Some(h) => {
                let mut o: Vec<u32> = (0..h.len() as u32).collect();
                o.sort_by_key(|&i| h[i as usize].0);
                o
            }
            None => Vec::new(),
        };
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
            let n_exact = rank_by_floor(
                near,
                best,
                k,
                f64::INFINITY,
                least,
                slack,
                floor,
                |s| g.order[s as usize],
                |e| measure((rows_q, nq), (x, nx), dim, r, e),
            );
            (measured, n_exact)
        };
        let leader = |h: usize| &index.leaders[h * dim..(h + 1) * dim];
        // Query `qv`'s distance from group h's pivot, bounded below: from its product with
        // every leader where `pd` holds them (taken in blocks), else one product.
        let to_leader = |qv: &[f32], pd: Option<&[f32]>, h: usize| {
            let d = pd.map_or_else(|| dot(qv, leader(h)), |pd| pd[h]);
            pivot_floor(d, index.norm2[h], slack)
        };
        // Query `r`'s walk over the groups left off its home group `own`'s list (`walked`,
        // sorted): those leaders measured, their groups visited by `|q - L_h| - r_h`, those
        // the k-th distance so far rules out left unsorted; stops where the rule's floor of
        // that bound exceeds the k-th distance.
        #[allow(clippy::too_many_arguments)]
        let rest = |r: usize,
                    qv: &[f32],
                    me: Option<u32>,
                    own: usize,
                    pd: Option<&[f32]>,
                    walked: &[u32],
                    best: &mut Vec<(f64, u32)>,
                    near: &mut Vec<(f64, u32)>,
                    t: &mut Tally| {
            let limit = kth(best);
            let mut measured = 0u64;
            let mut lb: Vec<(f64, f64, u32)> = (0..groups)
                .filter(|&h| h != own && g.start[h + 1] > g.start[h])
                .filter(|&h| walked.binary_search(&(h as u32)).is_err())
                .filter_map(|h| {
                    measured += 1;
                    let l = to_leader(qv, pd, h);
                    let b = l - g.radius[h];
                    (floor(b) <= limit).then_some((b, l, h as u32))
                })
                .collect();
            t.leaders += measured;
            t.dots += measured;
            lb.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            for &(group_lb, l, h) in &lb {
                if floor(group_lb) > kth(best) {
                    break;
                }
                t.add(visit(r, qv, me, h as usize, l, best, near));
            }
        };
        // Group h met by the queries `act` of `qs` (their index there and a bound on their
        // distance from L_h), as `visit` meets it with each: the members any of them leaves
        // in, their products with all of them four members at a time (`dot4x4`), then
        // each query's ranked by its own bounds. One query alone takes `visit`.
        let visit_many = |qs: &[Query],
                          h: usize,
                          act: &[(usize, f64)],
                          best: &mut [Vec<(f64, u32)>],
                          t: &mut [Tally],
                          s: &mut Scratch| {
            if let [(i, l)] = *act {
                let (r, qv, me, _) = qs[i];
                t[i].add(visit(r, qv, me, h, l, &mut best[i], &mut s.near));
                return;
            }
            // Each query's reach and least product, as `visit` takes them.
            s.bounds.clear();
            s.bounds.extend(act.iter().map(|&(i, _)| {
                let reach = reach(kth(&best[i]));
                (reach, least_dot(reach, slack))
            }));
            s.members.clear();
            s.masks.clear();
            for m in g.start[h]..g.start[h + 1] {
                let mut mask = 0u64;
                for (j, &(i, l)) in act.iter().enumerate() {
                    if l - g.to_leader[m] <= s.bounds[j].0 && qs[i].2 != Some(g.order[m]) {
                        mask |= 1 << j;
                    }
                }
                if mask != 0 {
                    s.members.push(m as u32);
                    s.masks.push(mask);
                }
            }
            // Where the tiles below would mostly compute products no query reads (each
            // keeps few members, not the same ones), each query takes its own as `visit`.
            let needed: u32 = s.masks.iter().map(|m| m.count_ones()).sum();
            let tiles: u32 = s
                .masks
                .chunks(4)
                .map(|c| {
                    let kept = c.iter().fold(0, |a, m| a | m);
                    (0..act.len())
                        .step_by(4)
                        .filter(|j0| kept >> j0 & 0xf != 0)
                        .count() as u32
                })
                .sum();
            if 16 * tiles > SPARSE_TILES * needed {
                for &(i, l) in act {
                    let (r, qv, me, _) = qs[i];
                    t[i].add(visit(r, qv, me, h, l, &mut best[i], &mut s.near));
                }
                return;
            }
            let row = |m: u32| &g.rows[m as usize * dim..(m as usize + 1) * dim];
            // Four members by four queries at a time: the members' rows stay in the L1
            // cache while every query meets them (`prods[u * w + j]`: member u's with the
            // j-th query).
            let w = act.len().next_multiple_of(4);
            s.prods.clear();
            s.prods.resize(s.members.len() * w, 0.0);
            for (c, four) in s.members.chunks(4).enumerate() {
                let rows4 = std::array::from_fn(|u| row(four[u.min(four.len() - 1)]));
                // The queries that keep any of the four (the others' products are not read).
                let kept = s.masks[4 * c..][..four.len()].iter().fold(0, |a, m| a | m);
                for j0 in (0..act.len()).step_by(4) {
                    if kept >> j0 & 0xf == 0 {
                        continue;
                    }
                    let q4 = std::array::from_fn(|j| qs[act[(j0 + j).min(act.len() - 1)].0].1);
                    let p = dot4x4(q4, rows4);
                    for (u, p) in p.iter().enumerate().take(four.len()) {
                        s.prods[(4 * c + u) * w + j0..][..4].copy_from_slice(p);
                    }
                }
            }
            for (j, &(i, _)) in act.iter().enumerate() {
                s.near.clear();
                s.near.extend(
                    s.members
                        .iter()
                        .zip(&s.masks)
                        .zip(s.prods.chunks_exact(w))
                        .filter(|((_, &mask), _)| mask >> j & 1 != 0)
                        .map(|((&m, _), p)| (p[j] as f64, m)),
                );
                t[i].dots += s.members.len() as u64;
                t[i].exact += rank_by_floor(
                    &mut s.near,
                    &mut best[i],
                    k,
                    f64::INFINITY,
                    s.bounds[j].1,
                    slack,
                    floor,
                    |m| g.order[m as usize],
                    |e| measure((rows_q, nq), (x, nx), dim, qs[i].0, e),
                );
            }
        };
        // One to STEP queries of one home group (`qs`: row, f32 copy, own row, home and an
        // upper bound on the distance from its pivot; `pd`: their products with every
        // leader, a row each, where taken in blocks, else one at a time as needed) walk in
        // step: own group first (the k-th distance it leaves rules most other groups out),
        // then its list of nearest groups by the pivots' bound `|L_g - L_h| - |q - L_g| -
        // r_h`, in increasing bound, a leader measured only where that bound leaves its
        // group in; a query stops where that bound rules a group out. Each keeps its own
        // bounds, k-th distance and stop; a group that several visit is met by those at
        // once (`visit_many`). Past the list's end, each query that it does not rule out
        // goes on alone (`rest`). Each one's neighbours, tally, and whether it went past.
        let search_many = |qs: &[Query], pd: Option<&[f32]>| -> Vec<Found> {
            let m = qs.len();
            let own = qs[0].3 .0;
            let pd_of = |i: usize| pd.map(|pd| &pd[i * groups..][..groups]);
            let mut best: Vec<Vec<(f64, u32)>> =
                (0..m).map(|_| Vec::with_capacity(k + 1)).collect();
            let mut t = vec![Tally::default(); m];
            let mut scratch = Scratch::default();
            let mut act: Vec<(usize, f64)> = (0..m)
                .map(|i| {
                    t[i].leaders += 1;
                    t[i].dots += 1;
                    (i, to_leader(qs[i].1, pd_of(i), own))
                })
                .collect();
            visit_many(qs, own, &act, &mut best, &mut t, &mut scratch);
            let (list, beyond) = near_groups.of(own);
            // Whether each query still walks the list, and whether it ran to the list's end.
            let (mut alive, mut ended) = (vec![true; m], vec![true; m]);
            for &(apart, h) in list {
                let h = h as usize;
                act.clear();
                for i in 0..m {
                    if !alive[i] {
                        continue;
                    }
                    let (limit, mine) = (kth(&best[i]), qs[i].3 .1);
                    if floor(NearGroups::key(apart, h, &g.radius) - mine) > limit {
                        (alive[i], ended[i]) = (false, false);
                        continue;
                    }
                    let l = to_leader(qs[i].1, pd_of(i), h).max(apart as f64 - mine);
                    t[i].leaders += 1;
                    t[i].dots += 1;
                    if floor(l - g.radius[h]) <= limit {
                        act.push((i, l));
                    }
                }
                if !act.is_empty() {
                    visit_many(qs, h, &act, &mut best, &mut t, &mut scratch);
                }
                if !alive.contains(&true) {
                    break;
                }
            }
            let mut walked: Option<Vec<u32>> = None;
            (0..m)
                .map(|i| {
                    let (r, qv, me, (_, mine)) = qs[i];
                    let mut best = std::mem::take(&mut best[i]);
                    let mut t = t[i];
                    if !ended[i] || floor(beyond - mine) > kth(&best) {
                        return (best, t, false);
                    }
                    let walked = walked.get_or_insert_with(|| near_groups.sorted(own));
                    rest(
                        r,
                        qv,
                        me,
                        own,
                        pd_of(i),
                        walked,
                        &mut best,
                        &mut scratch.near,
                        &mut t,
                    );
                    (best, t, true)
                })
                .collect()
        };
        // The p-th query, in order of home groups (neighbouring queries visit the same
        // groups): its row, f32 copy, own row (a self-kNN's) and home.
        let at = |p: usize| -> Query {
            match (&fq, &homes) {
                (Some(fq), Some(homes)) => {
                    let r = by_home[p] as usize;
                    let (h, mine) = homes[r];
                    (r, &fq[r * dim..(r + 1) * dim], None, (h as usize, mine))
                }
                _ => {
                    let r = g.order[p];
                    let qv = &g.rows[p * dim..(p + 1) * dim];
                    let home = g.start.partition_point(|&st| st <= p) - 1;
                    (
                        r as usize,
                        qv,
                        self_knn.then_some(r),
                        (home, g.to_leader[p]),
                    )
                }
            }
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
                let (_, t, _) = search_many(&[at(i * rows / probe)], None).remove(0);
                (t.dots, t.leaders)
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
        // Queries that walk in step at most (a bit each in `Scratch::masks`).
        const STEP: usize = 64;
        const { assert!(STEP <= u64::BITS as usize) };
        control.stage("cosine kNN", rows.div_ceil(CHUNK) as u64);
        let found: Vec<Vec<(u32, Neighbours)>> = (0..rows.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                if control.is_cancelled() {
                    return Vec::new();
                }
                let span = c * CHUNK..((c + 1) * CHUNK).min(rows);
                let mut out = Vec::with_capacity(span.len());
                let mut pd = vec![0.0f32; if blocked.is_some() { STEP * groups } else { 0 }];
                for p in span.clone().step_by(STEP) {
                    let step = p..(p + STEP).min(span.end);
                    let qs: Vec<_> = step.clone().map(at).collect();
                    if let Some(b) = &blocked {
                        // Four at a time (the last repeated where fewer are left).
                        for (i, pd) in pd.chunks_exact_mut(4 * groups).enumerate() {
                            let q = |j: usize| qs[(4 * i + j).min(qs.len() - 1)].1;
                            b.dots([q(0), q(1), q(2), q(3)], pd);
                        }
                    }
                    // Runs of queries with one home group walk in step.
                    let mut from = 0;
                    while from < qs.len() {
                        let home = qs[from].3 .0;
                        let run = qs[from..].iter().take_while(|q| q.3 .0 == home).count();
                        let pd = blocked
                            .as_ref()
                            .map(|_| &pd[from * groups..(from + run) * groups]);
                        let found = search_many(&qs[from..from + run], pd);
                        for ((r, ..), (best, t, beyond)) in qs[from..from + run].iter().zip(found) {
                            dots.fetch_add(t.dots, Relaxed);
                            past.fetch_add(beyond as u64, Relaxed);
                            exact.fetch_add(t.exact, Relaxed);
                            out.push((*r as u32, best));
                        }
                        from += run;
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
             distances on average; each group's nearest {} groups by the pivots' bound first, \
             {} queries measured the pivots past them",
            index.radius,
            n,
            per(&dots),
            match blocked {
                Some(_) => ", every leader's in blocks",
                None => "",
            },
            per(&exact),
            near_groups.each,
            past.load(Relaxed)
        );
        Ok(Some((ranked, note, rayon::current_num_threads(), built)))
    })?
}

/// A visit of several queries takes its products in tiles of four members by four
/// queries (`dot4x4`) unless the tiles would compute more than this many times the
/// products its queries keep; then each query takes its own (`dot4`).
const SPARSE_TILES: u32 = 2;

/// A query of the grouped kNN: its row, f32 copy, own row (a self-kNN's), home group and
/// an upper bound on its distance from that group's pivot.
type Query<'a> = (usize, &'a [f32], Option<u32>, (usize, f64));

/// What a query of the grouped kNN took: f32 dot products (leaders included), rule
/// distances and leaders measured.
#[derive(Clone, Copy, Default)]
struct Tally {
    dots: u64,
    exact: u64,
    leaders: u64,
}

impl Tally {
    /// Adds a visit's products and rule distances.
    fn add(&mut self, (dots, exact): (u64, u64)) {
        self.dots += dots;
        self.exact += exact;
    }
}

/// A query's answer from the grouped kNN: its neighbours, its tally, and whether it went
/// past its home group's list.
type Found = (Neighbours, Tally, bool);

/// A worker's buffers for the grouped kNN's visits: the members a visit computes, which
/// of its queries keep each (bit j: the j-th), their products with each query, one
/// query's candidates, and each query's reach and least product.
#[derive(Default)]
struct Scratch {
    members: Vec<u32>,
    masks: Vec<u64>,
    prods: Vec<f32>,
    near: Vec<(f64, u32)>,
    /// Each query's reach and least product in a visit.
    bounds: Vec<(f64, f64)>,
}

/// Entries that [`NearGroups`] keeps in all: every pair of up to 2,048 groups (the bound
/// then orders every other group before any is measured), fewer of each of more groups.
const NEAR_ENTRIES: usize = 2048 * 2048;

/// Each group's list entries are at least this many (where there are as many groups).
const NEAR_LEAST: usize = 64;

/// Each list's length where there are `groups` groups: [`NEAR_ENTRIES`] shared, at least
/// [`NEAR_LEAST`] (the tests below set it to cut the lists short: any length gives the
/// same answer).
fn near_each(groups: usize) -> usize {
    #[cfg(test)]
    match tests::EACH.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {}
        each => return each,
    }
    (NEAR_ENTRIES / groups.max(1)).max(NEAR_LEAST)
}

/// For the kNN over the grouped index: each group g's nearest other (non-empty) groups
/// h by `|L_g - L_h| - r_h` (a lower bound on the distance of a query at L_g from h's
/// members), in increasing order of it, with a lower bound on `|L_g - L_h|` each; and the
/// least of that bound among the groups left off g's list. A query in g at distance m from
/// L_g is then at least `|L_g - L_h| - m - r_h` from h's members: it walks g's list until
/// that exceeds its k-th distance, and measures the pivots left off only where `beyond - m`
/// does not (1M vectors around 30,000 centres: 30,000 pivots measured by every query, or a
/// few dozen).
struct NearGroups {
    /// Group g's list: `list[start[g]..start[g + 1]]`, (lower bound on |L_g - L_h|, h).
    start: Vec<usize>,
    list: Vec<(f32, u32)>,
    /// The least key among the groups left off each list (infinite where none is).
    beyond: Vec<f64>,
    /// The most entries a list has.
    each: usize,
}

impl NearGroups {
    /// The lists of `index`'s groups, from every pair of pivots' f32 dot products (taken
    /// four groups at a time against all, `partition::Blocked`; `slack`: `dot_slack`).
    fn new(index: &crate::cpu::partition::Index, slack: f64) -> NearGroups {
        use crate::cpu::partition::Blocked;
        let g = &index.groups;
        let dim = index.leaders.len() / index.norm2.len().max(1);
        let groups = index.norm2.len();
        let filled = (0..groups).filter(|&h| g.start[h + 1] > g.start[h]).count();
        let each = near_each(groups);
        let blocked = Blocked::new(&index.leaders, dim);
        // A tile of groups at a time meets every pivot (`Blocked::dots_tile`).
        const TILE: usize = 32;
        let lists: Vec<(Vec<(f32, u32)>, f64)> = (0..groups.div_ceil(TILE))
            .into_par_iter()
            .flat_map_iter(|c| {
                let tile = c * TILE..((c + 1) * TILE).min(groups);
                let mut pd = vec![0.0f32; tile.len() * groups];
                blocked.dots_tile(&index.leaders[tile.start * dim..tile.end * dim], &mut pd);
                tile.clone()
                    .map(|a| {
                        let pd = &pd[(a - tile.start) * groups..][..groups];
                        // Each pivot's bound and key (infinite for g itself and the
                        // empty groups), then the `each` least keys: those below the
                        // (each + 1)-th, which is then the least left off.
                        let apart: Vec<f32> = (0..groups)
                            .map(|h| {
                                // |C_a - C_h|^2 = |C_a|^2 + |C_h|^2 - 2 C_a.C_h (see
                                // `pivot_floor`), rounded down.
                                let l = (index.norm2[a] + index.norm2[h]
                                    - 2.0 * pd[h] as f64
                                    - 2.0 * slack)
                                    .max(0.0)
                                    .sqrt();
                                (l * (1.0 - 1e-6)) as f32
                            })
                            .collect();
                        let keys: Vec<f64> = (0..groups)
                            .map(|h| match h != a && g.start[h + 1] > g.start[h] {
                                true => Self::key(apart[h], h, &g.radius),
                                false => f64::INFINITY,
                            })
                            .collect();
                        let mut beyond = f64::INFINITY;
                        let others = filled - usize::from(g.start[a + 1] > g.start[a]);
                        if others > each {
                            let mut least = keys.clone();
                            least.select_nth_unstable_by(each, f64::total_cmp);
                            beyond = least[each];
                        }
                        let mut v: Vec<(f32, u32)> = (0..groups)
                            .filter(|&h| keys[h] < beyond)
                            .map(|h| (apart[h], h as u32))
                            .collect();
                        let key = |e: &(f32, u32)| keys[e.1 as usize];
                        v.sort_unstable_by(|x, y| key(x).total_cmp(&key(y)));
                        (v, beyond)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut start = Vec::with_capacity(groups + 1);
        start.push(0);
        let mut list = Vec::new();
        let mut beyond = Vec::with_capacity(groups);
        for (v, b) in lists {
            list.extend(v);
            start.push(list.len());
            beyond.push(b);
        }
        NearGroups {
            start,
            list,
            beyond,
            each,
        }
    }
    /// The lists' order: `|L_g - L_h| - r_h` (one expression, so that the walk's bounds
    /// increase along a list).
    fn key(apart: f32, h: usize, radius: &[f64]) -> f64 {
        apart as f64 - radius[h]
    }
    /// The groups on g's list, sorted (for a binary search).
    fn sorted(&self, g: usize) -> Vec<u32> {
        let mut v: Vec<u32> = self.of(g).0.iter().map(|e| e.1).collect();
        v.sort_unstable();
        v
    }
    /// Group g's list and the least key of the groups left off it.
    fn of(&self, g: usize) -> (&[(f32, u32)], f64) {
        (&self.list[self.start[g]..self.start[g + 1]], self.beyond[g])
    }
}

#[cfg(test)]
mod tests {
    use crate::{oracle, Backend, Dataset, Engine, KnnOptions, Metric};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// Where not 0, the length of every list (`near_each`).
    pub(super) static EACH: AtomicUsize = AtomicUsize::new(0);

    /// Lists cut to one group (`near_each`) of about 575: the queries whose list's end does
    /// not rule the rest out (rows far from every cluster of 20, alone in their groups)
    /// measure the pivots past it, and the kNN equals the oracle's exactly, f32 rows, k =
    /// 1, 10 and 15, self and A ⋈ B (1,500 queries from their home groups, some halfway
    /// between two clusters). The notes show the lists cut and queries going past them. (Without the
    /// pivots past the lists it loses neighbours in the second-nearest cluster.)
    #[test]
    fn knn_past_short_lists_is_exact() {
        let (dim, centres, per, lone) = (48usize, 400usize, 20usize, 200usize);
        let mut s = 5u64;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let c: Vec<f64> = (0..centres * dim).map(|_| rnd()).collect();
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
        // `members` rows around the centres in turn, then `mid` halfway between two
        // centres (their neighbours in both clusters), then `lone` in random directions.
        let mut draw = |members: usize, mid: usize, lone: usize| -> Vec<f32> {
            let mut x: Vec<f32> = Vec::new();
            for i in 0..members + mid + lone {
                let centre = |j: usize| &c[(j % centres) * dim..(j % centres + 1) * dim];
                let v: Vec<f64> = if i < members {
                    centre(i).iter().map(|a| a + 0.03 * rnd()).collect()
                } else if i < members + mid {
                    let (a, b, f) = (7 * i, 7 * i + 3, 1.0 + 0.01 * rnd());
                    let (na, nb) = (norm(centre(a)), norm(centre(b)));
                    (0..dim)
                        .map(|d| centre(a)[d] / na + f * centre(b)[d] / nb)
                        .collect()
                } else {
                    (0..dim).map(|_| rnd()).collect()
                };
                let n = norm(&v);
                x.extend(v.iter().map(|a| (a / n) as f32));
            }
            x
        };
        let x = draw(centres * per, 0, lone);
        // Queries for A ⋈ B: more than twice the groups (fewer meet every row instead).
        let q = draw(1100, 200, lone);
        let (data, query) = (
            Dataset::from_f32(&x, dim).unwrap(),
            Dataset::from_f32(&q, dim).unwrap(),
        );
        let o = KnnOptions {
            metric: Metric::Cosine,
            backend: Backend::Cpu,
            ..Default::default()
        };
        EACH.store(1, Relaxed);
        let mut past = [0u64; 2];
        for (ab, query) in [None, Some(&query)].into_iter().enumerate() {
            let (idx, dist) = oracle::knn(&data, query, 30, Metric::Cosine);
            for k in [1usize, 10, 15] {
                let got = Engine::new().knn(&data, query, k, &o).unwrap();
                let notes = got.report.notes.join("; ");
                assert!(
                    notes.contains("each group's nearest 1 groups"),
                    "ab={ab} k={k}: {notes}"
                );
                let tail = &notes[notes.find("first, ").unwrap() + 7..];
                past[ab] += tail[..tail.find(' ').unwrap()].parse::<u64>().unwrap();
                for r in 0..got.rows {
                    let want = &idx[r * 30..r * 30 + k];
                    assert_eq!(
                        &got.indices[r * k..(r + 1) * k],
                        want,
                        "ab={ab} k={k} row {r}"
                    );
                    for (c, &d) in dist[r * 30..r * 30 + k].iter().enumerate() {
                        assert_eq!(got.distance(r, c), d, "ab={ab} k={k} row {r}");
                    }
                }
            }
        }
        EACH.store(0, Relaxed);
        assert!(
            past[0] > 0 && past[1] > 0,
            "queries past their lists: {past:?}"
        );
    }
}
