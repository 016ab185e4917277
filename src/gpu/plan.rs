//! Batching (GPU-SJ §V-A, GPU-JOIN §3): an estimation pass counts the matches of a strided
//! sample of the queries; batches are contiguous query ranges whose estimated results fill
//! about half a result buffer, and there are at least three of them so that upload, search,
//! download and host-side assembly overlap. The estimate only sizes batches: a batch that
//! overflows anyway is resumed where each query stopped (see glsl/join_common.glsl), so no
//! pair is lost.

use std::ops::Range;

/// Fraction of a result buffer a batch is planned to fill (room for estimation error).
pub const FILL: f64 = 0.5;
/// Fewest batches (the papers use at least 3 streams, hence batches).
pub const MIN_BATCHES: usize = 3;
/// Sampled queries in the estimation pass: about 1%, within these bounds.
pub const MIN_ESTIMATE_SAMPLE: usize = 1024;
pub const MAX_ESTIMATE_SAMPLE: usize = 1 << 16;

/// Stride of the estimation sample over `nq` queries.
pub fn estimate_stride(nq: usize) -> usize {
    let want = (nq / 100)
        .clamp(MIN_ESTIMATE_SAMPLE, MAX_ESTIMATE_SAMPLE)
        .min(nq.max(1));
    (nq / want).max(1)
}

/// Whether a join's batches are sized by the estimation pass. Not where the dot-product
/// filter runs (`high_dim`): there a query's scan is long and the pass's few sampled
/// queries (one thread each) cannot fill a GPU, so it takes about as long as a whole batch
/// (H200, 2M exponential points: 3.5 of 11.7 s at 16-D, 11.8 of 38.1 s at 32-D,
/// BENCHMARKS.md), while a batch that overflows its buffer only resumes.
/// `SIMJOIN_GPU_ESTIMATE=1` runs it always, `=0` never.
pub fn estimate_wanted(high_dim: bool) -> bool {
    match std::env::var("SIMJOIN_GPU_ESTIMATE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !high_dim,
    }
}

/// Batches by query count alone: the user's `forced_points`, else [`MIN_BATCHES`] equal
/// ranges (more where `max_points` is smaller).
pub fn plan_by_points(nq: usize, max_points: usize, forced_points: Option<usize>) -> BatchPlan {
    let points = forced_points
        .unwrap_or(nq.div_ceil(MIN_BATCHES))
        .clamp(1, max_points.max(1));
    BatchPlan {
        ranges: (0..nq)
            .step_by(points)
            .map(|s| s as u32..(s + points).min(nq) as u32)
            .collect(),
        estimated_pairs: 0,
    }
}

/// Batches of the device-sorted rows' write pass (`rows.rs`) over query positions
/// `0..counts.len()`, from each query's exact pair count: consecutive ranges of at most
/// `max_points` (or the user's `forced_points`) queries whose pairs fit `capacity`; unless
/// the user sized them, about [`MIN_BATCHES`] of them or more (so that the streams
/// overlap); ranges without a pair are left out. `None` when one query's
/// row alone exceeds `capacity`.
pub fn plan_rows(
    counts: &[u32],
    capacity: usize,
    max_points: usize,
    forced_points: Option<usize>,
) -> Option<Vec<Range<u32>>> {
    if counts.iter().any(|&c| c as usize > capacity) {
        return None;
    }
    let total: u64 = counts.iter().map(|&c| c as u64).sum();
    let points = forced_points
        .unwrap_or(max_points)
        .clamp(1, max_points.max(1));
    // Pairs a batch aims at: a share of the total, within the buffer (the buffer whole
    // where the user sized the batches).
    let share = match forced_points {
        Some(_) => capacity as u64,
        None => total.div_ceil(MIN_BATCHES as u64),
    };
    let target = (share as usize).clamp(1, capacity.max(1));
    let mut ranges = Vec::new();
    let (mut start, mut pairs) = (0usize, 0usize);
    for (q, &c) in counts.iter().enumerate() {
        let c = c as usize;
        if q > start && (q - start == points || pairs + c > target) {
            if pairs > 0 {
                ranges.push(start as u32..q as u32);
            }
            (start, pairs) = (q, 0);
        }
        pairs += c;
    }
    if pairs > 0 {
        ranges.push(start as u32..counts.len() as u32);
    }
    Some(ranges)
}

/// The batches of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchPlan {
    pub ranges: Vec<Range<u32>>,
    /// Estimated result pairs of the whole join (from the sample).
    pub estimated_pairs: u64,
}

/// Plans batches over query positions `0..nq`. `sample_counts[s]` holds the matches of
/// position `s * stride`. `capacity`: result slots per batch buffer. `max_points`: most
/// queries in one batch (size of the per-query counter buffer). `forced_points`: the
/// user's `batch_points`.
pub fn plan_batches(
    nq: usize,
    stride: usize,
    sample_counts: &[u32],
    capacity: usize,
    max_points: usize,
    forced_points: Option<usize>,
) -> BatchPlan {
    let stride = stride.max(1);
    let estimated_pairs: u64 = sample_counts
        .iter()
        .map(|&c| c as u64 * stride as u64)
        .sum();
    if nq == 0 {
        return BatchPlan {
            ranges: Vec::new(),
            estimated_pairs,
        };
    }
    let max_points = max_points.max(1);
    if let Some(points) = forced_points {
        let points = points.clamp(1, max_points);
        let ranges = (0..nq)
            .step_by(points)
            .map(|s| s as u32..(s + points).min(nq) as u32)
            .collect();
        return BatchPlan {
            ranges,
            estimated_pairs,
        };
    }
    let target = (capacity as f64 * FILL).max(1.0);
    let by_results = (estimated_pairs as f64 / target).ceil() as usize;
    let by_points = nq.div_ceil(max_points);
    let batches = by_results.max(by_points).max(MIN_BATCHES).min(nq);
    // Cut where the cumulative estimate crosses each 1/batches share; each sample stands
    // for the `stride` positions starting at it (plus one so empty regions still count).
    let weight = |s: usize| sample_counts.get(s).map_or(1.0, |&c| c as f64 + 1.0);
    let total: f64 = (0..nq.div_ceil(stride)).map(weight).sum();
    let mut ranges = Vec::with_capacity(batches);
    let mut start = 0usize;
    let mut acc = 0.0;
    let mut cut = 1;
    for s in 0..nq.div_ceil(stride) {
        acc += weight(s);
        let end = ((s + 1) * stride).min(nq);
        while cut < batches && acc >= total * cut as f64 / batches as f64 {
            cut += 1;
            if end > start {
                push_capped(&mut ranges, start, end, max_points);
                start = end;
            }
        }
    }
    if start < nq {
        push_capped(&mut ranges, start, nq, max_points);
    }
    // Fewer cuts than wanted (a sample is heavier than a share): split the largest ranges.
    while ranges.len() < batches {
        let (i, longest) = ranges
            .iter()
            .enumerate()
            .max_by_key(|(_, r)| r.len())
            .map(|(i, r)| (i, r.clone()))
            .unwrap();
        if longest.len() < 2 {
            break;
        }
        let mid = longest.start + (longest.end - longest.start) / 2;
        ranges[i] = longest.start..mid;
        ranges.insert(i + 1, mid..longest.end);
    }
    BatchPlan {
        ranges,
        estimated_pairs,
    }
}

fn push_capped(ranges: &mut Vec<Range<u32>>, start: usize, end: usize, max_points: usize) {
    let mut s = start;
    while s < end {
        let e = (s + max_points).min(end);
        ranges.push(s as u32..e as u32);
        s = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row batches: every query with pairs in exactly one range, in order, each range's
    /// pairs within the buffer and its length within the points; a row too long: None.
    #[test]
    fn row_batches_fit_and_cover() {
        let mut seed = 7u64;
        for case in 0..200 {
            let n = case % 37;
            let counts: Vec<u32> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (seed >> 33) as u32;
                    if r.is_multiple_of(3) {
                        0
                    } else {
                        r % 9
                    }
                })
                .collect();
            let capacity = 8 + case % 5;
            let points = 1 + case % 6;
            let forced = (case % 4 == 0).then_some(1 + case % 3);
            let ranges = plan_rows(&counts, capacity, points, forced).expect("rows fit");
            let mut next = 0u32;
            for r in &ranges {
                assert!(r.start >= next && r.start < r.end);
                assert!(counts[next as usize..r.start as usize]
                    .iter()
                    .all(|&c| c == 0));
                let pairs: u32 = counts[r.start as usize..r.end as usize].iter().sum();
                assert!(pairs > 0 && pairs as usize <= capacity);
                assert!(r.len() <= forced.unwrap_or(points).min(points));
                next = r.end;
            }
            assert!(counts[next as usize..].iter().all(|&c| c == 0));
            // Even rows are split into several batches, for the streams to overlap.
            let even = vec![2u32; 12];
            assert!(plan_rows(&even, 64, 100, None).unwrap().len() >= MIN_BATCHES);
        }
        assert_eq!(plan_rows(&[1, 9, 2], 8, 4, None), None);
        assert_eq!(plan_rows(&[], 8, 4, None), Some(vec![]));
    }

    fn covers(plan: &BatchPlan, nq: usize) {
        let mut next = 0u32;
        for r in &plan.ranges {
            assert_eq!(r.start, next, "{plan:?}");
            assert!(r.end > r.start);
            next = r.end;
        }
        assert_eq!(next as usize, nq);
    }

    #[test]
    fn at_least_three_batches_covering_everything() {
        for nq in [1usize, 2, 3, 4, 10, 1000, 12345] {
            let stride = estimate_stride(nq);
            let samples = vec![5u32; nq.div_ceil(stride)];
            let plan = plan_batches(nq, stride, &samples, 1 << 20, 1 << 20, None);
            covers(&plan, nq);
            assert!(plan.ranges.len() >= nq.min(MIN_BATCHES), "nq={nq} {plan:?}");
        }
    }

    #[test]
    fn batches_follow_the_estimate() {
        // Dense first half: 100 matches per query; sparse second half: 0.
        let nq = 10_000;
        let samples: Vec<u32> = (0..nq).map(|i| if i < nq / 2 { 100 } else { 0 }).collect();
        let plan = plan_batches(nq, 1, &samples, 20_000, 1 << 20, None);
        covers(&plan, nq);
        assert_eq!(plan.estimated_pairs, 500_000);
        // 500k pairs at 10k per batch: ~50 batches, nearly all in the dense half.
        assert!(plan.ranges.len() >= 50, "{}", plan.ranges.len());
        let dense = plan
            .ranges
            .iter()
            .filter(|r| r.end as usize <= nq / 2)
            .count();
        assert!(dense >= 45, "{dense}");
    }

    #[test]
    fn forced_batch_points_and_caps() {
        let plan = plan_batches(100, 1, &[0; 100], 10, 1000, Some(7));
        covers(&plan, 100);
        assert_eq!(plan.ranges.len(), 15);
        let plan = plan_batches(100, 1, &[0; 100], 10, 8, None);
        covers(&plan, 100);
        assert!(plan.ranges.iter().all(|r| r.len() <= 8));
    }
}
