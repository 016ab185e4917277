//! Sorted pairs in bounded memory: pairs gather in the library's `PairSorter` (bucketed by
//! key as they arrive) up to the budget over its peak bytes a pair; a full sorter is
//! finished and spilled to a temporary file (a run), and at the end the runs are merged
//! k-way into the output. A result that fits the budget is sorted in memory and never
//! touches a temporary file.

use anyhow::{Context, Result};
use simjoin::{Pair, PairSorter};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Pairs handed to the output at a time.
const OUT_BATCH: usize = 1 << 16;
/// Runs merged at once (each holds a file descriptor and a read buffer); more runs are first
/// merged in groups into longer runs.
const MAX_FAN_IN: usize = 256;
/// The smallest read buffer of a run during a merge, in pairs (64 KiB).
const MIN_READ_PAIRS: usize = 1 << 13;

pub struct ExternalSort {
    /// Pairs not yet spilled, sorted as they arrive (`simjoin::PairSorter`).
    sorter: PairSorter,
    rows: usize,
    cols: usize,
    /// Pairs held at most before a spill: the budget over the sorter's peak bytes a pair.
    cap: usize,
    dir: PathBuf,
    runs: Vec<Run>,
    fan_in: usize,
}

/// A sorted run in an unlinked temporary file.
struct Run {
    file: File,
    pairs: u64,
}

impl ExternalSort {
    /// `budget`: bytes of pairs held in memory; `dir`: where runs are spilled; pairs are
    /// `[i, j]` with `i < rows`, `j < cols`.
    pub fn new(budget: u64, dir: &Path, rows: usize, cols: usize) -> Self {
        let sorter = PairSorter::new(rows, cols);
        let peak = sorter.bytes_per_pair().1 as u64;
        ExternalSort {
            sorter,
            rows,
            cols,
            cap: (budget / peak).max(1) as usize,
            dir: dir.to_path_buf(),
            runs: Vec::new(),
            fan_in: MAX_FAN_IN,
        }
    }

    /// Runs spilled so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    pub fn push(&mut self, mut chunk: &[Pair]) -> Result<()> {
        while !chunk.is_empty() {
            if self.sorter.len() == self.cap {
                self.spill()?;
            }
            let take = chunk.len().min(self.cap - self.sorter.len());
            // A GPU batch's pairs arrive in one large chunk from one thread: bucketed by
            // the sorter's parts from every worker thread at once.
            simjoin::push_split(&mut self.sorter, &chunk[..take])?;
            chunk = &chunk[take..];
        }
        Ok(())
    }

    /// Sorts the pairs held and writes them out as a run.
    fn spill(&mut self) -> Result<()> {
        let sorter = std::mem::replace(&mut self.sorter, PairSorter::new(self.rows, self.cols));
        let sorted = sorter.finish()?;
        let mut run = Run::create(&self.dir)?;
        run.file
            .write_all(bytemuck::cast_slice(&sorted))
            .context("cannot write a sort run")?;
        run.pairs = sorted.len() as u64;
        self.runs.push(run);
        Ok(())
    }

    /// Hands every pair, sorted, to `out` in batches.
    /// Writes the pairs to `out` in order; `sort_seconds` gets the time the in-memory sort
    /// took to finish (before any pair is written), when no run was spilled.
    pub fn finish(
        mut self,
        mut out: impl FnMut(&[Pair]) -> Result<()>,
        sort_seconds: &mut f64,
    ) -> Result<()> {
        if self.runs.is_empty() {
            let t = std::time::Instant::now();
            let sorted = self.sorter.finish()?;
            *sort_seconds = t.elapsed().as_secs_f64();
            return sorted.chunks(OUT_BATCH).try_for_each(out);
        }
        if !self.sorter.is_empty() {
            self.spill()?;
        }
        // Free the sorter before the merge takes its read buffers from the same budget.
        drop(std::mem::replace(&mut self.sorter, PairSorter::new(0, 0)));
        let read_pairs = |runs: usize| (self.cap / (runs + 1)).max(MIN_READ_PAIRS);
        while self.runs.len() > self.fan_in {
            let group: Vec<Run> = self.runs.drain(..self.fan_in).collect();
            let mut merged = Run::create(&self.dir)?;
            merge(group, read_pairs(self.fan_in), |pairs| {
                merged.pairs += pairs.len() as u64;
                Ok(merged.file.write_all(bytemuck::cast_slice(pairs))?)
            })?;
            self.runs.push(merged);
        }
        let runs = std::mem::take(&mut self.runs);
        let read = read_pairs(runs.len());
        merge(runs, read, &mut out)
    }
}

impl Run {
    fn create(dir: &Path) -> Result<Run> {
        // A unique name, removed at once: the open file keeps the data, and the space comes
        // back when it is closed, however the process ends.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!(".simjoin-sort-{}-{n}.tmp", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create the sort run {}", path.display()))?;
        std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove the sort run {}", path.display()))?;
        Ok(Run { file, pairs: 0 })
    }
}

/// A run read back in blocks.
struct Reader {
    run: Run,
    block: Vec<Pair>,
    next: usize,
}

impl Reader {
    fn new(mut run: Run, block_pairs: usize) -> Result<Reader> {
        run.file.seek(SeekFrom::Start(0))?;
        let mut r = Reader {
            run,
            block: Vec::with_capacity(block_pairs),
            next: 0,
        };
        r.refill()?;
        Ok(r)
    }

    fn refill(&mut self) -> Result<()> {
        let n = (self.block.capacity() as u64).min(self.run.pairs) as usize;
        self.block.clear();
        self.block.resize(n, [0, 0]);
        self.run
            .file
            .read_exact(bytemuck::cast_slice_mut(&mut self.block))
            .context("cannot read a sort run back")?;
        self.run.pairs -= n as u64;
        self.next = 0;
        Ok(())
    }

    /// The next pair, or None at the end of the run.
    fn pop(&mut self) -> Result<Option<Pair>> {
        if self.next == self.block.len() {
            if self.run.pairs == 0 {
                return Ok(None);
            }
            self.refill()?;
        }
        self.next += 1;
        Ok(Some(self.block[self.next - 1]))
    }
}

/// Merges sorted runs into `out`, in batches, through a heap of each run's next pair.
fn merge(
    runs: Vec<Run>,
    read_pairs: usize,
    mut out: impl FnMut(&[Pair]) -> Result<()>,
) -> Result<()> {
    let mut readers = runs
        .into_iter()
        .map(|r| Reader::new(r, read_pairs))
        .collect::<Result<Vec<_>>>()?;
    let mut heap = BinaryHeap::with_capacity(readers.len());
    for (k, r) in readers.iter_mut().enumerate() {
        if let Some(p) = r.pop()? {
            heap.push(Reverse((p, k)));
        }
    }
    let mut batch = Vec::with_capacity(OUT_BATCH);
    while let Some(mut top) = heap.peek_mut() {
        let Reverse((pair, k)) = *top;
        batch.push(pair);
        // Replacing the top sifts once, where pop and push would sift twice.
        match readers[k].pop()? {
            Some(p) => *top = Reverse((p, k)),
            None => {
                std::collections::binary_heap::PeekMut::pop(top);
            }
        }
        if batch.len() == OUT_BATCH {
            out(&batch)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        out(&batch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random_pairs(n: usize, seed: u64) -> Vec<Pair> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Few distinct i so that ties on i are common.
                [(s >> 54) as u32, (s >> 20) as u32]
            })
            .collect()
    }

    /// Small budgets and fan-ins force many runs and multi-pass merges; every variant
    /// equals an in-memory sort, and no temporary file is left behind.
    #[test]
    fn equals_the_in_memory_sort() {
        let dir = std::env::temp_dir().join(format!("simjoin-sort-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Columns below 2^24: the sorter buckets pairs as they arrive (12 bytes a pair at
        // the peak); up to 2^32: it collects them (16).
        for (n, budget, fan_in, cols, peak) in [
            (0, 64, 4, 1u64 << 32, 16),
            (1000, 1 << 20, 4, 1 << 32, 16),
            (100_000, 8 * 1000, 256, 1 << 32, 16),
            (100_000, 8 * 999, 3, 1 << 32, 16),
            (54_321, 8 * 4096, 2, 1 << 32, 16),
            (0, 64, 4, 1 << 24, 12),
            (1000, 1 << 20, 4, 1 << 24, 12),
            (100_000, 12 * 1000, 256, 1 << 24, 12),
            (100_000, 12 * 999, 3, 1 << 20, 12),
            (54_321, 12 * 4096, 2, 1 << 24, 12),
        ] {
            let mut pairs = pseudo_random_pairs(n, n as u64 + 7);
            for p in pairs.iter_mut() {
                p[1] = (u64::from(p[1]) % cols) as u32;
            }
            let mut want = pairs.clone();
            want.sort_unstable();
            let mut sort = ExternalSort::new(budget, &dir, 1 << 10, cols as usize);
            sort.fan_in = fan_in;
            for chunk in pairs.chunks(777) {
                sort.push(chunk).unwrap();
            }
            let cap = budget as usize / peak;
            let expect_runs = if n > cap { n.div_ceil(cap) - 1 } else { 0 };
            assert_eq!(sort.runs(), expect_runs, "n {n} budget {budget}");
            let mut got = Vec::new();
            sort.finish(
                |b| {
                    assert!(b.len() <= OUT_BATCH);
                    got.extend_from_slice(b);
                    Ok(())
                },
                &mut 0.0,
            )
            .unwrap();
            assert!(got == want, "n {n} budget {budget} fan-in {fan_in}");
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        }
        std::fs::remove_dir(&dir).unwrap();
    }

    /// A GPU batch arrives as one large chunk: the sorter's parts bucket its pieces from
    /// several threads at once (`simjoin::push_split`), across spills too.
    #[test]
    fn large_chunks_from_several_threads() {
        let dir = std::env::temp_dir().join(format!("simjoin-sort-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for (n, runs) in [(600_000, 2), (200_000, 0)] {
            let mut pairs = pseudo_random_pairs(n, 5);
            for p in pairs.iter_mut() {
                p[1] %= 1 << 20;
            }
            let mut want = pairs.clone();
            want.sort_unstable();
            let mut sort = ExternalSort::new(12 * 250_000, &dir, 1 << 10, 1 << 20);
            pool.install(|| sort.push(&pairs)).unwrap();
            assert_eq!(sort.runs(), runs);
            let mut got = Vec::new();
            sort.finish(
                |b| {
                    got.extend_from_slice(b);
                    Ok(())
                },
                &mut 0.0,
            )
            .unwrap();
            assert!(got == want, "n {n}");
        }
        std::fs::remove_dir(&dir).unwrap();
    }
}
