//! The exact k-nearest-neighbour join on the GPU (`knn.rs` defines the answer).
//!
//! LSS (`Algorithm::Lss`, and `Auto`): the paper's §V-E made exact.
//! 1. The set of Z-lists over the data (`lss::ZIndex`).
//! 2. Bound (glsl/lss.glsl KNN_BOUND): per query, in every list, the k (k + 1 for a
//!    self-kNN) consecutive points around the query's own Z-order position are k distinct
//!    points other than the query, so the largest of their accumulators bounds the k-th
//!    smallest accumulator from above; the bound is the smallest over the lists.
//! 3. Exact range search within the bound: its conservative box radius (host, f64,
//!    `zorder::Quantizer::radius`), the shortest box interval over the lists (SEARCH), then
//!    count / scan / fill of every point with accumulator <= the bound, as (id, acc)
//!    candidates. Ties at the k-th place are all inside the bound, so selection by
//!    (accumulator, index) sees every one of them.
//! 4. Selection on the host: the k smallest candidates by (accumulator, index) per query
//!    (`select_nth_unstable`, then a sort of the k), in parallel; output chunks that split
//!    a query's candidates are joined first.
//!
//! Brute force (`Algorithm::Brute`): every query scans every data point keeping the k best
//! by (accumulator, index) in a max-heap in the result buffer (KNN_BRUTE); the host sorts
//! each heap. Queries run in chunks whose heaps fit the result buffer.
//!
//! Distances are `sqrt(acc)` on the host for Euclidean (`knn::finish_distances`).

use super::interface::{flags, JoinParams};
use super::lss::{
    capacity_limit, choose_lists, chunks, coords_of, params_zero, result_buffer, Bindings,
    BlockArrays, Lss, QuerySide, ZIndex, MODE_COUNT, MODE_FILL, MODE_KNN_BOUND, MODE_KNN_BRUTE,
    MODE_SEARCH,
};
use super::zorder::Quantizer;
use crate::dataset::Precision;
use crate::error::{Error, Result};
use crate::knn::{alloc, finish_distances, key_less, KnnJob, KnnResult};
use crate::metric::Coord;
use crate::options::Algorithm;
use crate::result::Distances;
use crate::result::JoinReport;
use crate::vk::{Buffer, Context};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// Testing knob: `SIMJOIN_GPU_KNN_ENTRIES=N` caps the kNN result buffer at N candidates
/// (heap entries for brute force), so tests cover chunked output at small sizes.
const ENTRIES_ENV: &str = "SIMJOIN_GPU_KNN_ENTRIES";

pub(super) fn run(ctx: &Arc<Context>, job: &KnnJob) -> Result<KnnResult> {
    let algorithm = match job.opts.algorithm {
        Algorithm::Auto | Algorithm::Lss => Algorithm::Lss,
        Algorithm::Brute => Algorithm::Brute,
        // The grid and k-d tree kNN are CPU algorithms: the GPU's own index for kNN is LSS.
        other => {
            return Err(Error::unsupported(format!(
                "'{other}' kNN runs on the CPU backend (backend=cpu, or auto); the GPU backend has lss and brute"
            )))
        }
    };
    match job.data.precision() {
        Precision::F32 => run_typed::<f32>(ctx, job, algorithm),
        Precision::F64 => {
            if !ctx.features().shader_float64 {
                return Err(Error::unsupported(format!(
                    "f64 coordinates need shaderFloat64, which {} lacks: convert to f32 or use the CPU backend",
                    ctx.device_name()
                )));
            }
            run_typed::<f64>(ctx, job, algorithm)
        }
    }
}

/// One query's neighbours: (accumulator, index), best first.
type Row<T> = Vec<(T, u32)>;
/// Receives a row's neighbours: (row, best first).
type Put<'a, T> = &'a mut dyn FnMut(usize, &[(T, u32)]);

fn run_typed<T: Coord>(ctx: &Arc<Context>, job: &KnnJob, algorithm: Algorithm) -> Result<KnnResult>
where
    JoinParams<T>: bytemuck::Pod,
{
    let (rows, k) = (job.rows(), job.k);
    let mut report = JoinReport {
        backend: "vulkan".into(),
        device: ctx.device_name().to_string(),
        algorithm,
        batches: 1,
        ..Default::default()
    };
    let mut indices = alloc(rows * k, 0u32, "indices")?;
    let mut accs = alloc(rows * k, T::ZERO, "distances")?;
    if rows > 0 {
        let mut put = |row: usize, best: &[(T, u32)]| {
            debug_assert_eq!(best.len(), k);
            for (c, &(acc, id)) in best.iter().enumerate() {
                indices[row * k + c] = id;
                accs[row * k + c] = acc;
            }
        };
        match algorithm {
            Algorithm::Brute => brute::<T>(ctx, job, &mut report, &mut put)?,
            _ => lss_knn::<T>(ctx, job, &mut report, &mut put)?,
        }
    }
    finish_distances(job.opts.metric, &mut accs);
    let distances = if size_of::<T>() == 4 {
        Distances::F32(accs.iter().map(|a| a.to_f64() as f32).collect())
    } else {
        Distances::F64(accs.iter().map(|a| a.to_f64()).collect())
    };
    Ok(KnnResult {
        rows,
        k,
        indices,
        distances,
        report,
    })
}

/// The k best of `cands` by (accumulator, index), sorted.
fn select<T: Coord>(mut cands: Vec<(T, u32)>, k: usize) -> Result<Row<T>> {
    if cands.len() < k {
        return Err(Error::new(
            crate::error::ErrorKind::Internal,
            format!(
                "kNN: {} candidates within the bound, fewer than k = {k}",
                cands.len()
            ),
        ));
    }
    let order = |a: &(T, u32), b: &(T, u32)| {
        if key_less(*a, *b) {
            std::cmp::Ordering::Less
        } else if key_less(*b, *a) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    };
    if cands.len() > k {
        cands.select_nth_unstable_by(k - 1, order);
        cands.truncate(k);
    }
    cands.sort_unstable_by(order);
    Ok(cands)
}

/// Decodes `entries` (id, accumulator) candidates from the result buffer's words.
fn decode<T: Coord>(words: &[[u32; 2]]) -> Vec<(T, u32)> {
    if size_of::<T>() == 4 {
        words
            .iter()
            .map(|w| (T::from_f64(f32::from_bits(w[1]) as f64), w[0]))
            .collect()
    } else {
        words
            .chunks_exact(2)
            .map(|w| {
                let bits = w[1][0] as u64 | (w[1][1] as u64) << 32;
                (T::from_f64(f64::from_bits(bits)), w[0][0])
            })
            .collect()
    }
}

fn entries_override() -> Option<usize> {
    std::env::var(ENTRIES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
}

fn software_note(lss: &Lss) -> String {
    format!(
        "{} dispatches ({} resubmissions after queries stopped early){}",
        lss.dispatches,
        lss.resumed,
        if lss.budget != 0 {
            format!(
                ", software device: workgroup {}, loop budget {} per thread",
                lss.workgroup, lss.budget
            )
        } else {
            String::new()
        }
    )
}

fn lss_knn<T: Coord>(
    ctx: &Arc<Context>,
    job: &KnnJob,
    report: &mut JoinReport,
    put: Put<T>,
) -> Result<()>
where
    JoinParams<T>: bytemuck::Pod,
{
    let (data, k, metric) = (job.data, job.k, job.opts.metric);
    let self_knn = job.query.is_none();
    let words = (size_of::<T>() / 4) as u64;
    let mut lss = Lss::new(ctx, data.dim(), metric)?;
    lss.watch(&job.opts.control);
    for mode in [MODE_KNN_BOUND, MODE_SEARCH, MODE_COUNT] {
        lss.check_budget(mode, 0)?;
    }
    let (mut t_sort, mut t_bound, mut t_search, mut t_output, mut t_select) =
        (0.0, 0.0, 0.0, 0.0, 0.0);
    let t = Instant::now();
    let quant = Quantizer::new(&data, job.query.as_ref());
    let (lists, note) = choose_lists(ctx, job.opts.lss_lists, data.dim(), data.len());
    report.notes.push(note);
    let index = ZIndex::build::<T>(&mut lss, &data, &quant, lists)?;
    let queries = match job.query {
        None => QuerySide::of_index(&index),
        Some(q) => QuerySide::upload::<T>(&lss, &q, Some(&quant))?,
    };
    t_sort += t.elapsed().as_secs_f64();
    let mut bits = flags::FLAG_Q_IDS | flags::FLAG_KNN;
    if self_knn {
        bits |= flags::FLAG_SELF;
    }
    let base = JoinParams::<T> {
        flags: bits,
        n_cells: index.n as u32,
        budget: lss.budget,
        lists: lists as u32,
        shift: index.shift,
        k: k as u32,
        ..params_zero()
    };
    let cap_limit = capacity_limit(ctx, entries_override(), words);
    let mut results: Option<(Arc<Buffer>, u64)> = None;
    let (mut interval_sum, mut candidates, mut n_chunks) = (0u64, 0u64, 0usize);
    let blocks = super::lss::blocks(ctx, queries.n);
    let block_len = blocks[0].1 - blocks[0].0;
    let arrays = BlockArrays::new(&lss, block_len)?;
    let limits = lss.buffer(block_len as u64 * words * 4, "kNN bounds")?;
    job.opts.control.stage("knn", blocks.len() as u64);
    for &(start, end) in &blocks {
        job.opts.control.check()?;
        job.opts.control.advance(1, 0);
        let len = end - start;
        // Rows of this block's query positions.
        let row_of: Vec<u32> = if self_knn {
            index.orig[start..end].to_vec()
        } else {
            (start as u32..end as u32).collect()
        };
        let mut b = Bindings {
            r_coords: Some(index.coords.all()),
            q_coords: Some(queries.coords.all()),
            cell_keys: Some(arrays.offsets.all()),
            cell_ranges: Some(arrays.ranges.all()),
            r_ids: Some(index.ids.all()),
            q_ids: Some(queries.ids_range(start, len)),
            q_cells: Some(queries.rows.all()),
            meta: Some(index.rows.all()),
            states: Some(arrays.states.all()),
            q_limits: Some(limits.all()),
            ..Default::default()
        };
        let pass = JoinParams::<T> {
            q_count: len as u32,
            ..base
        };
        let t = Instant::now();
        arrays.clear_states(&mut lss.stream, len)?;
        lss.run(MODE_KNN_BOUND, len, &b, &pass)?;
        let bounds: Vec<T> = ctx.download(&limits, 0, len)?;
        let radii: Vec<u32> = bounds
            .par_iter()
            .map(|&acc| quant.radius(metric, acc))
            .collect();
        let radii = lss.upload(&radii, "kNN box radii")?;
        b.q_radii = Some(radii.all());
        t_bound += t.elapsed().as_secs_f64();

        let t = Instant::now();
        lss.stream.fill(&lss.counters, 8, 8, 0)?;
        arrays.clear_states(&mut lss.stream, len)?;
        lss.run(MODE_SEARCH, len, &b, &pass)?;
        let c = lss.counters()?;
        interval_sum += c[2] as u64 | (c[3] as u64) << 32;
        t_search += t.elapsed().as_secs_f64();

        let t = Instant::now();
        arrays.clear_states(&mut lss.stream, len)?;
        lss.run(MODE_COUNT, len, &b, &pass)?;
        crate::vk::scan::exclusive_scan_u64_in_place(&mut lss.stream, &arrays.offsets, len)?;
        lss.stream.finish()?;
        let offsets: Vec<u64> = ctx.download(&arrays.offsets, 0, len + 1)?;
        let total = offsets[len];
        candidates += total;
        let want = total.min(cap_limit);
        if results.as_ref().is_none_or(|(_, c)| *c < want) {
            results = Some(result_buffer(&lss, want, words)?);
        }
        let (buffer, capacity) = results.clone().expect("allocated");
        b.results = Some(buffer.all());
        arrays.clear_states(&mut lss.stream, len)?;
        // Candidates of a query split across chunks: (position, those so far).
        let mut pending: Option<(usize, Vec<(T, u32)>)> = None;
        for chunk in chunks(&offsets, capacity) {
            let fill = JoinParams::<T> {
                q_begin: chunk.queries.start as u32,
                q_count: chunk.queries.len() as u32,
                capacity: capacity as u32,
                rank_lo: chunk.first as u32,
                rank_hi: (chunk.first >> 32) as u32,
                ..base
            };
            lss.run(MODE_FILL, chunk.queries.len(), &b, &fill)?;
            let raw: Vec<[u32; 2]> = ctx.download(&buffer, 0, (chunk.len * words) as usize)?;
            // Internal ids back to the caller's before selection (ties go by those).
            let cands: Vec<(T, u32)> = decode::<T>(&raw)
                .into_iter()
                .map(|(acc, id)| (acc, index.orig[id as usize]))
                .collect();
            n_chunks += 1;
            let t_sel = Instant::now();
            let chunk_end = chunk.first + chunk.len;
            let mut complete: Vec<(usize, Vec<(T, u32)>)> = Vec::new();
            for p in chunk.queries.clone() {
                let (lo, hi) = (offsets[p].max(chunk.first), offsets[p + 1].min(chunk_end));
                if lo >= hi {
                    continue;
                }
                let part = &cands[(lo - chunk.first) as usize..(hi - chunk.first) as usize];
                let mut mine = match pending.take() {
                    Some((q, v)) if q == p => v,
                    Some(_) => unreachable!("a split query completes before the next starts"),
                    None => Vec::new(),
                };
                mine.extend_from_slice(part);
                if offsets[p + 1] <= chunk_end {
                    complete.push((p, mine));
                } else {
                    pending = Some((p, mine));
                }
            }
            let rows: Vec<(usize, Row<T>)> = complete
                .into_par_iter()
                .map(|(p, c)| Ok((p, select(c, k)?)))
                .collect::<Result<_>>()?;
            for (p, best) in rows {
                put(row_of[p] as usize, &best);
            }
            t_select += t_sel.elapsed().as_secs_f64();
        }
        t_output += t.elapsed().as_secs_f64();
        if let Some((p, _)) = pending {
            return Err(Error::new(
                crate::error::ErrorKind::Internal,
                format!("kNN: query position {p}'s candidates were not all delivered"),
            ));
        }
    }
    report.batches = n_chunks.max(1);
    let nq = queries.n as f64;
    report.notes.push(format!(
        "lss kNN: average interval {:.1} points ({:.2}% of the {} indexed); {:.1} candidates \
         within the bound per query ({:.2} k); {} output chunk(s)",
        interval_sum as f64 / nq,
        100.0 * interval_sum as f64 / nq / index.n as f64,
        index.n,
        candidates as f64 / nq,
        candidates as f64 / nq / k as f64,
        n_chunks
    ));
    report.notes.push(software_note(&lss));
    report.phases = vec![
        ("sort (Z-lists) + upload".into(), t_sort),
        ("bound (lists' windows)".into(), t_bound),
        ("search (intervals)".into(), t_search),
        ("output: count + scan + fill".into(), t_output - t_select),
        ("select k (host)".into(), t_select),
    ];
    Ok(())
}

fn brute<T: Coord>(
    ctx: &Arc<Context>,
    job: &KnnJob,
    report: &mut JoinReport,
    put: Put<T>,
) -> Result<()>
where
    JoinParams<T>: bytemuck::Pod,
{
    let (data, k) = (job.data, job.k);
    let words = (size_of::<T>() / 4) as u64;
    let mut lss = Lss::new(ctx, data.dim(), job.opts.metric)?;
    lss.watch(&job.opts.control);
    let log_k = usize::BITS - k.leading_zeros() + 1;
    lss.check_budget(MODE_KNN_BRUTE, log_k)?;
    let t = Instant::now();
    let coords = lss.upload(coords_of::<T>(&data), "data points")?;
    let queries = match job.query {
        Some(q) => QuerySide::upload::<T>(&lss, &q, None)?,
        None => QuerySide {
            n: data.len(),
            coords: coords.clone(),
            rows: lss.dummy.clone(),
            ids: lss.upload(&(0..data.len() as u32).collect::<Vec<_>>(), "query order")?,
        },
    };
    let t_upload = t.elapsed().as_secs_f64();
    // Heaps of one chunk of queries fill the result buffer.
    let capacity = capacity_limit(ctx, entries_override(), words).max(k as u64);
    let per_chunk = (capacity / k as u64).max(1) as usize;
    let base = JoinParams::<T> {
        flags: flags::FLAG_Q_IDS
            | if job.query.is_none() {
                flags::FLAG_SELF
            } else {
                0
            },
        n_cells: data.len() as u32,
        budget: lss.budget,
        log_cells: log_k,
        k: k as u32,
        ..params_zero()
    };
    let (mut t_scan, mut t_select, mut n_chunks) = (0.0, 0.0, 0usize);
    let blocks = super::lss::blocks(ctx, queries.n);
    let arrays = BlockArrays::new(&lss, blocks[0].1 - blocks[0].0)?;
    let (buffer, _) = {
        let chunk = per_chunk.min(blocks[0].1 - blocks[0].0) as u64;
        let (b, got) = result_buffer(&lss, chunk * k as u64, words)?;
        (b, got)
    };
    let heap_entries = buffer.size() / (8 * words);
    let per_chunk = ((heap_entries / k as u64) as usize).max(1);
    job.opts.control.stage("knn", blocks.len() as u64);
    for &(start, end) in &blocks {
        job.opts.control.check()?;
        job.opts.control.advance(1, 0);
        let len = end - start;
        let b = Bindings {
            r_coords: Some(coords.all()),
            q_coords: Some(queries.coords.all()),
            q_ids: Some(queries.ids_range(start, len)),
            states: Some(arrays.states.all()),
            results: Some(buffer.all()),
            ..Default::default()
        };
        arrays.clear_states(&mut lss.stream, len)?;
        for c0 in (0..len).step_by(per_chunk) {
            let c1 = (c0 + per_chunk).min(len);
            let t = Instant::now();
            let pass = JoinParams::<T> {
                q_begin: c0 as u32,
                q_count: (c1 - c0) as u32,
                ..base
            };
            lss.run(MODE_KNN_BRUTE, c1 - c0, &b, &pass)?;
            let raw: Vec<[u32; 2]> =
                ctx.download(&buffer, 0, ((c1 - c0) * k) as usize * words as usize)?;
            t_scan += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let heaps = decode::<T>(&raw);
            let rows: Vec<Row<T>> = heaps
                .par_chunks(k)
                .map(|h| select(h.to_vec(), k))
                .collect::<Result<_>>()?;
            for (i, best) in rows.iter().enumerate() {
                put(start + c0 + i, best);
            }
            t_select += t.elapsed().as_secs_f64();
            n_chunks += 1;
        }
    }
    report.batches = n_chunks;
    report.notes.push(format!(
        "brute kNN: a heap of k = {k} per query, {n_chunks} chunk(s) of <= {per_chunk} queries"
    ));
    report.notes.push(software_note(&lss));
    report.phases = vec![
        ("upload".into(), t_upload),
        ("scan (heaps)".into(), t_scan),
        ("sort k (host)".into(), t_select),
    ];
    Ok(())
}
