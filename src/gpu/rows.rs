//! Sorted results made on the device: sorted pairs and the CSR as rows, one per query
//! point, each row sorted by the engine's bitonic network on the GPU, so that the host only
//! places rows that are already in order (issue 39; BENCHMARKS.md has the design).
//!
//! 1. A count pass: the join kernel count-only over every adjacent cell (not unicomp's
//!    half), so each query counts its whole row: a self-join's pairs keep only the
//!    neighbours above the query (FLAG_ABOVE: row i holds the pairs (i, j > i)), its CSR
//!    every neighbour but the query itself unless the diagonal is asked for
//!    (FLAG_NOT_SELF); A ⋈ B rows are A's points with all their B neighbours.
//! 2. The host turns the counts, by id, into each row's final offset and allocates the
//!    output exactly once; batches are planned from the exact counts (`plan::plan_rows`),
//!    so no batch overflows its buffer.
//! 3. A write pass (FLAG_ROWS): each batch writes (query id, neighbour id) as two u32
//!    arrays, sorted by the bitonic network on the device once the batch is complete; only
//!    the neighbour ids come back (4 bytes a pair), rows in query-id order.
//! 4. The host places each row at its offset, from every engine thread at once.
//!
//! The search runs twice (count, write) over the whole stencil, about 4x unicomp's work,
//! to spare the host the bucketing and the radix sort of every pair.

use super::batch::{run_batches, Counts, Out, Run, Slot, Times};
use super::interface::{flags, JoinParams};
use super::plan::plan_rows;
use crate::backend::RowsForm;
use crate::error::{Error, ErrorKind, Result};
use crate::metric::Coord;
use crate::result::{Csr, JoinOutput, Pair};
use rayon::prelude::*;
use std::ops::Range;

/// The row filter of the whole-stencil search for `form`: see the module's step 1.
pub(super) fn filter(form: RowsForm, self_join: bool) -> u32 {
    match (form, self_join) {
        (_, false) => 0,
        (RowsForm::Pairs, true) => flags::FLAG_ABOVE,
        (RowsForm::Csr { include_self: true }, true) => 0,
        (
            RowsForm::Csr {
                include_self: false,
            },
            true,
        ) => flags::FLAG_NOT_SELF,
    }
}

/// Whether device rows make a job's sorted output: only where
/// `SIMJOIN_GPU_ROWS=1` asks (`=0` or unset: sorted pairs and the CSR bucketed and sorted on
/// the host as the pairs arrive). Measured on an H200 with 16 host cores (2026-11-28,
/// BENCHMARKS.md "Fourth GPU session"), uniform 2-D and 6-D at 2M points: the rows' count
/// pass and sorts took about three times the search's GPU time, and the host's sort was
/// faster in three of four rows (1.3-2.1x), 5% slower in the fourth.
pub(crate) fn enabled() -> bool {
    std::env::var("SIMJOIN_GPU_ROWS").as_deref() == Ok("1")
}

/// Runs the count and write passes of `run` (its flags: the whole-stencil search with the
/// row filter) over the query positions, whose point ids are `ids` (a permutation of the
/// rows `0..ids.len()`); returns the output and the write pass's batches. `None` when a
/// single row exceeds the result buffer (the caller falls back to the host's assembly).
#[allow(clippy::too_many_arguments)]
pub(super) fn run<T: Coord>(
    run: &mut Run<'_, T>,
    slots: &mut [Slot],
    ids: &[u32],
    self_join: bool,
    max_points: usize,
    batch_points: Option<usize>,
    form: RowsForm,
    times: &mut Times,
    counts: &mut Counts,
    notes: &mut Vec<String>,
) -> Result<Option<(JoinOutput, usize)>>
where
    JoinParams<T>: bytemuck::Pod,
{
    let nq = ids.len();
    let points = batch_points
        .unwrap_or(max_points)
        .clamp(1, max_points.max(1));
    // 1. Count pass.
    let ranges: Vec<Range<u32>> = (0..nq)
        .step_by(points)
        .map(|s| s as u32..(s + points).min(nq) as u32)
        .collect();
    let count_batches = ranges.len();
    counts.per_query = Some(vec![0u32; nq]);
    run.params.flags &= !flags::FLAG_ROWS;
    run_batches(run, slots, ranges, Out::Count, "plan", times, counts)?;
    let per_query = counts.per_query.take().unwrap_or_default();
    let total = counts.pairs;
    counts.pairs = 0;
    let Some(ranges) = plan_rows(
        &per_query,
        run.params.capacity as usize,
        max_points,
        batch_points,
    ) else {
        notes.push(format!(
            "device rows: a row of {} pairs exceeds the result buffer ({} pairs): sorted on the host",
            per_query.iter().max().copied().unwrap_or(0),
            run.params.capacity
        ));
        return Ok(None);
    };

    // 2. Row offsets by id, and the output at its final size.
    let t = std::time::Instant::now();
    let mut by_id = vec![0u32; nq];
    for (&id, &c) in ids.iter().zip(&per_query) {
        by_id[id as usize] = c;
    }
    let mut offsets = Vec::with_capacity(nq + 1);
    let mut acc = 0u64;
    offsets.push(0u64);
    for &c in &by_id {
        acc += c as u64;
        offsets.push(acc);
    }
    debug_assert_eq!(acc, total);
    let len = usize::try_from(total).map_err(|_| {
        Error::new(
            ErrorKind::OutOfHostMemory,
            "the result does not fit in memory",
        )
    })?;
    let mut pairs: Vec<Pair> = Vec::new();
    let mut neighbors: Vec<u32> = Vec::new();
    match form {
        RowsForm::Pairs => pairs = zeroed(len)?,
        RowsForm::Csr { .. } => neighbors = zeroed(len)?,
    }
    times.assemble += t.elapsed().as_secs_f64();

    // 3-4. Write pass; each sorted batch placed as it arrives.
    let write_batches = ranges.len();
    run.params.flags |= flags::FLAG_ROWS;
    let mut place = |queries: Range<u32>, values: &[u32]| -> Result<()> {
        let mut rows: Vec<(u32, usize)> = ids[queries.start as usize..queries.end as usize]
            .iter()
            .zip(&per_query[queries.start as usize..queries.end as usize])
            .filter(|(_, &c)| c > 0)
            .map(|(&id, &c)| (id, c as usize))
            .collect();
        // The device sorted the batch by query id: its rows come in that order.
        rows.par_sort_unstable();
        match form {
            RowsForm::Pairs => place_rows(&mut pairs, &offsets, &rows, values, |id, out, v| {
                for (p, &j) in out.iter_mut().zip(v) {
                    *p = [id, j];
                }
            }),
            RowsForm::Csr { .. } => {
                place_rows(&mut neighbors, &offsets, &rows, values, |_, out, v| {
                    out.copy_from_slice(v)
                })
            }
        }
    };
    let placed = run_batches(
        run,
        slots,
        ranges,
        Out::Rows(&mut place),
        "join",
        times,
        counts,
    );
    run.params.flags &= !flags::FLAG_ROWS;
    placed?;
    if counts.pairs != total {
        return Err(Error::new(
            ErrorKind::Internal,
            format!(
                "device rows: {} pairs written, {total} counted",
                counts.pairs
            ),
        ));
    }
    // The report counts the join's pairs: a self-join's CSR holds each twice, and the
    // diagonal where asked.
    if let (true, RowsForm::Csr { include_self }) = (self_join, form) {
        let diagonal = if include_self { nq as u64 } else { 0 };
        counts.pairs = (total - diagonal) / 2;
    }
    notes.push(format!(
        "sorted on the device: {count_batches} count batches (whole stencil), {write_batches} write \
         batches, each sorted by (query, neighbour) by the bitonic network; 4 bytes a pair read back, \
         rows placed at their final offsets"
    ));
    let output = match form {
        RowsForm::Pairs => JoinOutput::Pairs(pairs),
        RowsForm::Csr { .. } => JoinOutput::Csr(Csr { offsets, neighbors }),
    };
    Ok(Some((output, write_batches)))
}

/// `len` zeroed elements (pages untouched until written: `vec!` of zeros allocates them
/// zeroed), or an out-of-memory error instead of an abort.
fn zeroed<E: Clone + bytemuck::Zeroable>(len: usize) -> Result<Vec<E>> {
    // The probe: an allocation of this size succeeds (then freed, untouched).
    Vec::<E>::new().try_reserve_exact(len).map_err(|_| {
        Error::new(
            ErrorKind::OutOfHostMemory,
            format!("cannot allocate a result of {len} entries"),
        )
    })?;
    Ok(crate::result::huge::zeroed(len, E::zeroed()))
}

/// Writes a sorted batch into `out`: `rows` (id, length) ascending by id, `values` their
/// entries back to back; row `id` goes to `out[offsets[id]..]` through `write(id, row,
/// entries)`, from the current rayon pool's threads.
fn place_rows<E: Send>(
    out: &mut [E],
    offsets: &[u64],
    rows: &[(u32, usize)],
    values: &[u32],
    write: impl Fn(u32, &mut [E], &[u32]) + Sync,
) -> Result<()> {
    let mismatch = || {
        Error::new(
            ErrorKind::Internal,
            "device rows: a batch's pairs do not match its rows' counts",
        )
    };
    // Disjoint slices of `out`, one per row, in order.
    let mut jobs: Vec<(u32, &mut [E], &[u32])> = Vec::with_capacity(rows.len());
    let mut rest: &mut [E] = out;
    let (mut base, mut taken) = (0usize, 0usize);
    for &(id, c) in rows {
        let start = offsets[id as usize] as usize;
        let end = offsets[id as usize + 1] as usize;
        if start < base || end - start != c || taken + c > values.len() {
            return Err(mismatch());
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - base);
        let (row, tail) = tail.split_at_mut(c);
        rest = tail;
        base = end;
        jobs.push((id, row, &values[taken..taken + c]));
        taken += c;
    }
    if taken != values.len() {
        return Err(mismatch());
    }
    jobs.into_par_iter()
        .with_min_len(64)
        .for_each(|(id, row, v)| write(id, row, v));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows land at their offsets whatever the order of the batches; counts that do not
    /// match the entries are an error, never a wrong placement.
    #[test]
    fn rows_land_at_their_offsets() {
        // Rows of ids 0..4 with 2, 0, 3, 1 entries.
        let offsets = [0u64, 2, 2, 5, 6];
        let mut out = vec![[0u32; 2]; 6];
        let pair = |id: u32, o: &mut [Pair], v: &[u32]| {
            for (p, &j) in o.iter_mut().zip(v) {
                *p = [id, j];
            }
        };
        place_rows(&mut out, &offsets, &[(2, 3), (3, 1)], &[5, 6, 7, 9], pair).unwrap();
        place_rows(&mut out, &offsets, &[(0, 2)], &[1, 3], pair).unwrap();
        assert_eq!(out, vec![[0, 1], [0, 3], [2, 5], [2, 6], [2, 7], [3, 9]]);
        let mut out = vec![[0u32; 2]; 6];
        assert!(place_rows(&mut out, &offsets, &[(2, 3)], &[5, 6], pair).is_err());
        assert!(place_rows(&mut out, &offsets, &[(2, 2)], &[5, 6], pair).is_err());
        assert!(place_rows(&mut out, &offsets, &[(3, 1), (2, 3)], &[9, 5, 6, 7], pair).is_err());
        assert!(place_rows(&mut out, &offsets, &[(0, 2)], &[1, 3, 4], pair).is_err());
    }
}
