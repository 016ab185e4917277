//! The result path: how pairs travel from a join to the user.
//!
//! 1. A backend finds pairs: the CPU's workers in chunks, the GPU's batch loop a whole
//!    result buffer at a time (`gpu/batch.rs`, read in place from pinned buffers that an
//!    engine keeps between joins).
//! 2. They reach a [`PairSink`] (this file): the caller's, or one of the engine's own.
//!    [`push_split`] hands a large chunk to a sink's parts from every engine thread at
//!    once.
//! 3. The engine's sinks build the output forms as the pairs arrive: sorted pairs and the
//!    CSR bucketed by key (`radix.rs`: `SortingSink`, `CsrSink`, and the radix sorts that
//!    finish them), unsorted pairs collected (`CollectSink`), Arrow record batches made
//!    while the join runs (`arrow.rs`).
//! 4. Their memory: scratch slabs kept between joins (`scratch.rs`) and large arrays on
//!    huge pages (`huge.rs`).
//!
//! This file also holds the report of what ran ([`JoinReport`]) and the assembly of a
//! collected result into its output form.

pub mod arrow;
pub(crate) mod huge;
pub(crate) mod radix;
pub(crate) mod scratch;

use crate::error::{Error, ErrorKind, Result};
use crate::options::{Algorithm, IndexBuild, OutputForm};
use rayon::prelude::*;

/// A result pair. Self-join: `[i, j]` with `i < j`. A ⋈ B: `[i in A, j in B]`.
pub type Pair = [u32; 2];

/// Receives result pairs as a join produces them. Chunks arrive in no particular order
/// and may be large or small; the engine calls the sink (and each of its parts) from one
/// thread at a time. Returning an error stops the join with `ErrorKind::Cancelled`.
pub trait PairSink: Send {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()>;

    /// Up to `workers` parts of this sink that a backend's worker threads may push to at
    /// the same time, each chunk to one part (which one is unspecified); the chunks pushed
    /// to the parts together are the join's pairs. The default, no parts, sends every
    /// chunk through `push`, one worker at a time. A sink with much work per pair splits it
    /// this way instead of the workers taking turns at it (the engine's sorted and CSR
    /// outputs do). The GPU backend splits each large batch of pairs across the parts and
    /// pushes the pieces from the engine's threads at once. The engine may ask more than
    /// once, before and during a join: each answer should be the same parts (more where
    /// more workers are asked for).
    fn parts(&mut self, workers: usize) -> Vec<&mut dyn PairSink> {
        let _ = workers;
        Vec::new()
    }
}

impl<F: FnMut(&[Pair]) -> anyhow::Result<()> + Send> PairSink for F {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self(chunk)
    }
}

/// Pairs a worker takes at least in [`push_split`], for the fork to pay.
const PAIRS_PER_WORKER: usize = 1 << 16;

/// Pushes `chunk` to `sink`: split across its parts ([`PairSink::parts`]) and pushed from
/// the current rayon pool's threads at once where the sink has parts and the chunk holds
/// at least 2^16 pairs a worker, else through `push`. The GPU backend hands each batch
/// over this way, and a sink that receives large chunks may use it for its own store
/// (the CLI's external sort does). Measured on an H100's host (10M uniform 2-D points,
/// 503M pairs, sorted): pushing from the batch loop's one thread took 4.2 s, 65% of the
/// join.
pub fn push_split(sink: &mut dyn PairSink, chunk: &[Pair]) -> anyhow::Result<()> {
    use rayon::prelude::*;
    let workers = rayon::current_num_threads().min(chunk.len() / PAIRS_PER_WORKER);
    // Not within a CPU join's sink (`cpu::emit`'s doc: a join could hang).
    let workers = if crate::cpu::in_sink() { 1 } else { workers };
    // Asked twice: holding the first answer across the `push` below would keep the sink
    // borrowed (repeated answers are the same parts, as `PairSink::parts` asks).
    if workers > 1 && !sink.parts(workers).is_empty() {
        let mut parts = sink.parts(workers);
        let per = chunk.len().div_ceil(parts.len());
        return parts
            .par_iter_mut()
            .zip(chunk.par_chunks(per))
            .try_for_each(|(part, piece)| part.push(piece));
    }
    sink.push(chunk)
}

/// A sink that keeps every pair in memory.
#[derive(Default)]
pub struct VecSink {
    pub pairs: Vec<Pair>,
}

impl PairSink for VecSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self.pairs.extend_from_slice(chunk);
        Ok(())
    }
}

/// The engine's own collecting sink: one array grown by doubling. Large arrays are
/// separate mappings that `realloc` moves with `mremap` (no copy, no second resident
/// copy), so the peak stays near 8 bytes per pair; a failed allocation is an error, not an
/// abort.
#[derive(Default)]
pub(crate) struct CollectSink {
    pairs: Vec<Pair>,
}

impl PairSink for CollectSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        if self.pairs.capacity() - self.pairs.len() < chunk.len() {
            let want = chunk.len().max(self.pairs.len());
            self.pairs.try_reserve(want).map_err(|_| {
                anyhow::anyhow!(
                    "out of memory for {} result pairs",
                    self.pairs.len() + chunk.len()
                )
            })?;
            // No huge-page advice here: this buffer grows under the sink's lock while the
            // workers wait, and 2 MiB faults there measured 30-40% slower (16M pairs).
        }
        self.pairs.extend_from_slice(chunk);
        Ok(())
    }
}

/// Pairs sorted as they arrive, for callers that stream a join themselves (the CLI's sorted
/// output): push chunks, then [`finish`](PairSorter::finish) hands them back in
/// lexicographic order. With fewer than 2^24 points a side each pair is bucketed by its
/// key's top bits on arrival (4 bytes a pair held, 8 more while finishing: the engine's
/// own sorted output); else the pairs are collected and radix-sorted (8 bytes a pair, 16 at
/// the peak).
pub struct PairSorter {
    inner: Sorter,
}

enum Sorter {
    Buckets(crate::result::radix::SortingSink),
    Collect(Vec<Pair>),
}

impl PairSorter {
    /// A sorter for pairs `[i, j]` with `i < rows` and `j < cols` (a pair beyond them is an
    /// error from `push`).
    pub fn new(rows: usize, cols: usize) -> Self {
        let inner = match crate::result::radix::SortingSink::new(rows, cols) {
            Some(s) => Sorter::Buckets(s),
            None => Sorter::Collect(Vec::new()),
        };
        PairSorter { inner }
    }

    /// Pairs pushed so far.
    pub fn len(&self) -> usize {
        match &self.inner {
            Sorter::Buckets(s) => s.len(),
            Sorter::Collect(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held per pair until `finish`, and at its peak.
    pub fn bytes_per_pair(&self) -> (usize, usize) {
        match &self.inner {
            Sorter::Buckets(_) => (4, 12),
            Sorter::Collect(_) => (8, 16),
        }
    }

    /// Every pair pushed, lexicographically sorted.
    pub fn finish(self) -> Result<Vec<Pair>> {
        match self.inner {
            Sorter::Buckets(s) => s.finish(),
            Sorter::Collect(mut v) => {
                sort_pairs(&mut v);
                Ok(v)
            }
        }
    }
}

impl PairSink for PairSorter {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        match &mut self.inner {
            Sorter::Buckets(s) => s.push(chunk),
            Sorter::Collect(v) => {
                v.try_reserve(chunk.len())
                    .map_err(|_| anyhow::anyhow!("out of memory for {} pairs", v.len()))?;
                v.extend_from_slice(chunk);
                Ok(())
            }
        }
    }

    fn parts(&mut self, workers: usize) -> Vec<&mut dyn PairSink> {
        match &mut self.inner {
            Sorter::Buckets(s) => s.parts(workers),
            Sorter::Collect(_) => Vec::new(),
        }
    }
}

impl CollectSink {
    pub fn into_pairs(self) -> Result<Vec<Pair>> {
        Ok(self.pairs)
    }
}

/// Wraps a sink error so the engine reports it as `Cancelled` with the sink's message.
pub(crate) fn sink_error(e: anyhow::Error) -> Error {
    Error::with_kind(
        ErrorKind::Cancelled,
        e.context("the result sink stopped the join"),
    )
}

/// What a backend reports about a run.
#[derive(Clone, Debug, Default)]
pub struct JoinReport {
    /// Number of result pairs (unique pairs for a self-join).
    pub pairs: u64,
    /// "cpu" or "vulkan".
    pub backend: String,
    /// Device name ("cpu: N threads" for the CPU backend).
    pub device: String,
    /// The algorithm that actually ran (never `Auto`).
    pub algorithm: Algorithm,
    /// Batches the work was split into (1 for unbatched runs).
    pub batches: usize,
    /// Wall-clock seconds of the whole join (index build to results assembled).
    pub seconds: f64,
    /// Named phases with their seconds, in the order they ran (may overlap on the GPU).
    pub phases: Vec<(String, f64)>,
    /// Free-form notes on choices made (indexed dims, batch sizes, why auto picked what).
    pub notes: Vec<String>,
    /// GPU grid join: where its index was built (`Host` or `Device`); None for other joins.
    pub index_build: Option<IndexBuild>,
    /// GPU joins: bytes copied host -> device (inputs, index) and device -> host (results,
    /// counters), whether or not the device shares the host's memory; 0 on the CPU.
    pub bytes_to_device: u64,
    pub bytes_from_device: u64,
}

/// Distances of result entries, in the input precision (Euclidean: the square root of the
/// canonical accumulator of `metric.rs`, computed in that precision).
#[derive(Clone, Debug, PartialEq)]
pub enum Distances {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Distances {
    pub fn len(&self) -> usize {
        match self {
            Distances::F32(v) => v.len(),
            Distances::F64(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Entry e widened to f64.
    pub fn get(&self, e: usize) -> f64 {
        match self {
            Distances::F32(v) => v[e] as f64,
            Distances::F64(v) => v[e],
        }
    }
}

/// CSR neighbour table: row `r`'s neighbours are `neighbors[offsets[r]..offsets[r+1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    pub offsets: Vec<u64>,
    pub neighbors: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinOutput {
    Pairs(Vec<Pair>),
    Csr(Csr),
    Count(u64),
}

#[derive(Clone, Debug)]
pub struct JoinResult {
    pub output: JoinOutput,
    pub report: JoinReport,
    /// With `JoinOptions::distances`: the distance of each pair (`Pairs`) or of each CSR
    /// neighbour entry (`Csr`), in the same order.
    pub distances: Option<Distances>,
}

impl JoinResult {
    /// The pairs, if the output form was `Pairs`.
    pub fn pairs(&self) -> Option<&[Pair]> {
        match &self.output {
            JoinOutput::Pairs(p) => Some(p),
            _ => None,
        }
    }
    pub fn csr(&self) -> Option<&Csr> {
        match &self.output {
            JoinOutput::Csr(c) => Some(c),
            _ => None,
        }
    }
    pub fn count(&self) -> u64 {
        self.report.pairs
    }
}

/// Sorts pairs lexicographically (a parallel radix sort, `radix.rs`).
pub fn sort_pairs(pairs: &mut Vec<Pair>) {
    crate::result::radix::sort_pairs(pairs);
}

/// Builds the output form from collected pairs.
/// `rows`: number of CSR rows (n of the self-join, |A| for A ⋈ B).
pub(crate) fn assemble(
    mut pairs: Vec<Pair>,
    form: OutputForm,
    self_join: bool,
    rows: usize,
    include_self: bool,
    sorted: bool,
) -> Result<JoinOutput> {
    match form {
        OutputForm::Count => Ok(JoinOutput::Count(pairs.len() as u64)),
        OutputForm::Pairs => {
            if sorted {
                sort_pairs(&mut pairs);
            }
            Ok(JoinOutput::Pairs(pairs))
        }
        OutputForm::Csr => Ok(JoinOutput::Csr(build_csr(
            pairs,
            self_join,
            rows,
            include_self,
            sorted,
        )?)),
    }
}

pub use crate::result::radix::build_csr;

/// The result entries whose distances are asked for.
enum Entries<'a> {
    Pairs(&'a [Pair]),
    Csr(&'a Csr),
}

/// The distance of each pair `[i, j]`, between `a[i]` and `b[j]` (pass `a` as `b` for a
/// self-join), exactly as `JoinOptions::distances` computes it: for callers that stream
/// pairs through a `PairSink` and want their distances chunk by chunk.
pub fn pair_distances(
    a: &crate::dataset::Dataset,
    b: &crate::dataset::Dataset,
    opts: &crate::options::JoinOptions,
    pairs: &[Pair],
) -> Result<Distances> {
    distances_of(a, b, opts, Entries::Pairs(pairs))
}

/// The distances of a join output's entries (None for a count).
pub(crate) fn entry_distances(
    a: &crate::dataset::Dataset,
    b: &crate::dataset::Dataset,
    opts: &crate::options::JoinOptions,
    output: &JoinOutput,
) -> Result<Option<Distances>> {
    let entries = match output {
        JoinOutput::Pairs(p) => Entries::Pairs(p),
        JoinOutput::Csr(c) => Entries::Csr(c),
        JoinOutput::Count(_) => return Ok(None),
    };
    distances_of(a, b, opts, entries).map(Some)
}

/// The distance of each result entry: pair e is `(a[i], b[j])`, or CSR row r's neighbour n
/// is `(a[r], b[n])` (`b` is `a` for a self-join). Canonical arithmetic (`metric.rs`):
/// the accumulator in the input precision, square-rooted in that precision for Euclidean;
/// haversine's metres on `opts.sphere_radius`.
fn distances_of(
    a: &crate::dataset::Dataset,
    b: &crate::dataset::Dataset,
    opts: &crate::options::JoinOptions,
    output: Entries,
) -> Result<Distances> {
    let (metric, radius) = (opts.metric, opts.sphere_radius);
    use crate::dataset::Coords;
    fn fill<T: crate::metric::Coord>(
        a: &[T],
        b: &[T],
        dim: usize,
        output: &Entries,
        // The distance of two rows; called with a constant metric, so it inlines to the
        // metric's own loop.
        distance: impl Fn(&[T], &[T]) -> T + Sync,
    ) -> Result<Vec<T>> {
        let dist = |i: u32, j: u32| {
            distance(
                &a[i as usize * dim..(i as usize + 1) * dim],
                &b[j as usize * dim..(j as usize + 1) * dim],
            )
        };
        let len = match output {
            Entries::Pairs(p) => p.len(),
            Entries::Csr(c) => c.neighbors.len(),
        };
        let mut out: Vec<T> = Vec::new();
        out.try_reserve_exact(len).map_err(|_| {
            Error::new(
                ErrorKind::OutOfHostMemory,
                format!("cannot allocate {len} distances"),
            )
        })?;
        crate::result::huge::advise(&mut out);
        // Points a few entries ahead are fetched while this one is computed: the
        // neighbours are random points, and waiting for each from memory in turn was most
        // of the time (CSR of 16M pairs, 32M distances: 190-350 ms -> see RESULTS_BENCH.md).
        const AHEAD: usize = 16;
        fn row_of<T>(x: &[T], i: u32, dim: usize) -> &[T] {
            &x[i as usize * dim..]
        }
        match output {
            Entries::Pairs(p) => p
                .par_iter()
                .enumerate()
                .map(|(k, &[i, j])| {
                    if let Some(&[fi, fj]) = p.get(k + AHEAD) {
                        crate::cpu::prefetch(row_of(a, fi, dim));
                        crate::cpu::prefetch(row_of(b, fj, dim));
                    }
                    dist(i, j)
                })
                .collect_into_vec(&mut out),
            Entries::Csr(c) => {
                // Blocks of rows, each writing its own run of the (not yet initialised)
                // distances: no zero fill of memory about to be written, no task per row.
                const BLOCK_ROWS: usize = 1024;
                let rows = c.offsets.len() - 1;
                assert!(c.offsets[0] == 0 && c.offsets[rows] as usize == len);
                let mut rest = &mut out.spare_capacity_mut()[..len];
                let mut blocks = Vec::with_capacity(rows.div_ceil(BLOCK_ROWS));
                for r0 in (0..rows).step_by(BLOCK_ROWS) {
                    let r1 = (r0 + BLOCK_ROWS).min(rows);
                    let (head, tail) = rest.split_at_mut((c.offsets[r1] - c.offsets[r0]) as usize);
                    blocks.push((r0..r1, head));
                    rest = tail;
                }
                blocks.into_par_iter().for_each(|(block, seg)| {
                    let ahead = &c.neighbors[c.offsets[block.start] as usize + AHEAD.min(seg.len())
                        ..c.offsets[block.end] as usize];
                    let mut w = 0;
                    for r in block {
                        let row = &c.neighbors[c.offsets[r] as usize..c.offsets[r + 1] as usize];
                        for &n in row {
                            if let Some(&f) = ahead.get(w) {
                                crate::cpu::prefetch(row_of(b, f, dim));
                            }
                            seg[w].write(dist(r as u32, n));
                            w += 1;
                        }
                    }
                    // Every element of the block written (checked before `set_len`).
                    assert_eq!(w, seg.len());
                });
                // SAFETY: the blocks split 0..len (offsets[0] = 0, offsets[rows] = len,
                // asserted above; split_at_mut panics on a non-monotone offset), and each
                // block asserted it wrote every one of its elements, so all `len`
                // elements are initialised.
                unsafe { out.set_len(len) };
            }
        }
        Ok(out)
    }
    fn by_metric<T: crate::metric::Coord>(
        a: &[T],
        b: &[T],
        dim: usize,
        metric: crate::options::Metric,
        radius: f64,
        output: &Entries,
    ) -> Result<Vec<T>> {
        use crate::metric::{distance_acc, finish};
        use crate::options::Metric::*;
        macro_rules! with {
            ($m:expr) => {
                fill(a, b, dim, output, |p, q| finish($m, distance_acc($m, p, q)))
            };
        }
        match metric {
            Euclidean => with!(Euclidean),
            Manhattan => with!(Manhattan),
            Chebyshev => with!(Chebyshev),
            Cosine => with!(Cosine),
            // Metres from the f64 chord squared, rounded to T once.
            Haversine => fill(a, b, dim, output, |p, q| {
                use crate::metric::{geo_chord2, geo_distance_m, geo_row};
                T::from_f64(geo_distance_m(geo_chord2(&geo_row(p), &geo_row(q)), radius))
            }),
        }
    }
    let dim = a.dim();
    Ok(match (a.coords(), b.coords()) {
        (Coords::F32(x), Coords::F32(y)) => {
            Distances::F32(by_metric(x, y, dim, metric, radius, &output)?)
        }
        (Coords::F64(x), Coords::F64(y)) => {
            Distances::F64(by_metric(x, y, dim, metric, radius, &output)?)
        }
        _ => return Err(Error::invalid("A and B must have the same precision")),
    })
}

/// A sink that keeps only the candidate pairs `accepts` confirms (of each chunk, in order)
/// and passes them on (or
/// only counts them, without `inner`): how the engine runs a metric through a wider
/// Euclidean join (cosine, haversine) and keeps exactly the metric's own set.
pub(crate) struct Confirm<'s, F> {
    pub accepts: F,
    pub inner: Option<&'s mut dyn PairSink>,
    pub candidates: u64,
    pub accepted: u64,
}

impl<'s, F: Fn(&[Pair]) -> Vec<Pair> + Send + Sync> Confirm<'s, F> {
    pub fn new(accepts: F, inner: Option<&'s mut dyn PairSink>) -> Self {
        Confirm {
            accepts,
            inner,
            candidates: 0,
            accepted: 0,
        }
    }
}

impl<F: Fn(&[Pair]) -> Vec<Pair> + Send + Sync> PairSink for Confirm<'_, F> {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        self.candidates += chunk.len() as u64;
        let accepts = &self.accepts;
        // Large chunks (a GPU batch) are confirmed by every engine thread; within a CPU
        // join's sink by its thread alone (`cpu::emit`'s doc: else a join can hang).
        let kept: Vec<Pair> = if chunk.len() >= 1 << 13 && !crate::cpu::in_sink() {
            chunk.par_chunks(1 << 11).flat_map_iter(accepts).collect()
        } else {
            accepts(chunk)
        };
        self.accepted += kept.len() as u64;
        match self.inner.as_deref_mut() {
            Some(inner) => push_split(inner, &kept),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pair_sorter_sorts_in_both_of_its_forms() {
        // Below 2^24 points a side the pairs are bucketed; beyond, collected.
        for (rows, cols) in [(1000usize, 70_000usize), (1 << 25, 1 << 25)] {
            let mut s = 5u64;
            let pairs: Vec<Pair> = (0..50_000)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    [
                        ((s >> 33) % rows as u64) as u32,
                        ((s >> 7) % cols as u64) as u32,
                    ]
                })
                .collect();
            let mut sorter = PairSorter::new(rows, cols);
            assert!(sorter.is_empty());
            for c in pairs.chunks(999) {
                sorter.push(c).unwrap();
            }
            assert_eq!(sorter.len(), pairs.len());
            let peak = sorter.bytes_per_pair().1;
            assert_eq!(peak, if rows < 1 << 24 { 12 } else { 16 });
            let mut want = pairs.clone();
            want.sort_unstable();
            assert_eq!(sorter.finish().unwrap(), want);
        }
        // A pair beyond the points is an error, not a write out of place.
        assert!(PairSorter::new(4, 4).push(&[[4, 0]]).is_err());
    }

    use super::*;

    #[test]
    fn csr_self_join_both_directions() {
        let pairs = vec![[0, 2], [1, 2]];
        let c = build_csr(pairs.clone(), true, 3, false, true).unwrap();
        assert_eq!(c.offsets, vec![0, 1, 2, 4]);
        assert_eq!(c.neighbors, vec![2, 2, 0, 1]);
        let c = build_csr(pairs.clone(), true, 3, true, true).unwrap();
        assert_eq!(c.offsets, vec![0, 2, 4, 7]);
        assert_eq!(c.neighbors, vec![0, 2, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn csr_ab_by_rows_of_a() {
        let pairs = vec![[1, 5], [0, 3], [1, 0]];
        let c = build_csr(pairs.clone(), false, 2, false, true).unwrap();
        assert_eq!(c.offsets, vec![0, 1, 3]);
        assert_eq!(c.neighbors, vec![3, 0, 5]);
    }
}
