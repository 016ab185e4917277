//! The grid index built on the device: the arrays `index.rs` builds on the host (B cell ids,
//! G cell ranges, A point lookup, M masks, query cells, points in sorted order), bit for
//! bit, made by glsl/grid_index.comp with the engine's bitonic sort (`vk::sort`), prefix
//! sum (`vk::scan`) and permutations (glsl/lss_permute.comp), left in the device buffers
//! the join kernels read.
//!
//! 1. The raw points go up on the job's transfer stream: R, then (A ⋈ B) Q once R's work
//!    is submitted, so that Q's staging write and copy run while R is sorted.
//! 2. KEYS: every point's cell coordinates (`GridGeometry::coord`'s f64 arithmetic, op for
//!    op) and sort key. Points are ordered by (cell, SORTIDU coordinate, id) as the host
//!    sorts them: one sort of (cell id << 32 | f32 order bits, id) when cell ids fit 32
//!    bits and coordinates are f32; else a sort by (SORTIDU bits, id), then by (cell id,
//!    rank) (RANKS), the ids recovered by a permutation.
//! 3. Points and their cell coordinates gathered in that order; HEADS + scan number the
//!    non-empty cells, whose count comes back to the host (buffer sizes, `n_cells`).
//! 4. CELLS: cell ids, ranges and one mask element (axis, coordinate) per cell and axis;
//!    sorted, HEADS + scan number the distinct ones, whose count comes back; MASKS writes
//!    them and their offsets into `meta`.
//!
//! A ⋈ B queries: KEYS (cell ids only), a sort by (cell id, id), gathers.

use super::device_data::{check_binding, coords_of, DeviceData};
use super::lss::{permute, PERMUTE_GATHER, PERMUTE_MAP};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::grid::GridGeometry;
use crate::metric::Coord;
use crate::vk::{
    scan, shaders, sort, Buffer, Context, GpuSpans, KernelSpec, Memory, PooledBuffer, Stream,
    Ticket, Uploads,
};
use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

const MODE_KEYS: u32 = 0;
const MODE_RANKS: u32 = 1;
const MODE_HEADS: u32 = 2;
const MODE_CELLS: u32 = 3;
const MODE_MASKS: u32 = 4;
const PACK_CELL: u32 = 0;
const PACK_CELL_SORT: u32 = 1;
const NO_SORT_DIM: u32 = u32::MAX;
const WORKGROUP: u32 = 64;
/// Submissions of one build (timed on the GPU clock).
const BUILD_SUBMITS: u32 = 4;

/// Matches `Axis` in glsl/grid_index.comp.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Axis {
    origin: f64,
    width: f64,
    cells: u32,
    dim: u32,
}

/// Matches `Params` in glsl/grid_index.comp (buffers by device address, 0 when unused).
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Params {
    coords: u64,
    axes: u64,
    cells: u64,
    keys: u64,
    values: u64,
    aux: u64,
    out_a: u64,
    out_b: u64,
    out_c: u64,
    n: u32,
    dim: u32,
    k: u32,
    sort_dim: u32,
    pack: u32,
    shift: u32,
    meta_base: u32,
    unused: u32,
}

/// Why the device cannot build this index (the host then does), or None.
pub(super) fn unsupported_because(
    ctx: &Context,
    n_indexed: usize,
    n_queries: usize,
    dim: usize,
    k: usize,
    coord_bytes: usize,
) -> Option<String> {
    if !ctx.features().shader_float64 {
        return Some(format!(
            "{} lacks shaderFloat64, which the cell arithmetic (f64, as on the host) needs",
            ctx.device_name()
        ));
    }
    let words = (dim * coord_bytes / 4) as u64;
    let largest = n_indexed.max(n_queries) as u64;
    // Positions, cell coordinates and gathered words are u32 in the kernels; sorts take 2^31.
    if largest > 1 << 31 || largest * words.max(k as u64) >= u32::MAX as u64 {
        return Some(format!(
            "{largest} points of {dim} dimensions exceed the device build's 32-bit positions"
        ));
    }
    None
}

/// The device plumbing of one build: a compute stream and a pinned read-back buffer.
struct Builder<'c> {
    ctx: &'c Arc<Context>,
    // Declared before `totals`: dropping it waits for the work, so `totals` goes back to
    // the pool idle.
    stream: Stream,
    /// The two counts the host needs (non-empty cells, mask coordinates).
    totals: PooledBuffer,
    words: u32,
    /// Timestamps around each submission's work.
    spans: Option<GpuSpans>,
}

impl Builder<'_> {
    /// Opens a timed span for the work recorded from here on.
    fn begin(&mut self) -> Result<()> {
        match &mut self.spans {
            Some(spans) => spans.begin(&mut self.stream),
            None => Ok(()),
        }
    }

    /// Closes the span and submits the work recorded so far.
    fn submit(&mut self) -> Result<Ticket> {
        if let Some(spans) = &mut self.spans {
            spans.end(&mut self.stream)?;
        }
        self.stream.submit()
    }

    /// `submit`, waiting for the work and releasing what it held.
    fn finish(&mut self) -> Result<()> {
        if let Some(spans) = &mut self.spans {
            spans.end(&mut self.stream)?;
        }
        self.stream.finish()
    }

    fn buffer(&self, bytes: u64, name: &str) -> Result<Arc<Buffer>> {
        Buffer::new(self.ctx, bytes, Memory::Device, name)
    }

    /// Records kernel `mode` over `threads` threads; `used` are the buffers its parameters
    /// address (kept alive until it has run).
    fn dispatch(
        &mut self,
        mode: u32,
        threads: usize,
        p: &Params,
        used: &[&Arc<Buffer>],
    ) -> Result<()> {
        let kernel = self.ctx.kernel(
            "grid_index",
            shaders::GRID_INDEX,
            &KernelSpec::new(WORKGROUP)
                .constant(1, mode)
                .constant(2, self.words)
                .push_bytes(size_of::<Params>() as u32),
        )?;
        self.stream.barrier()?;
        self.stream
            .dispatch_threads(&kernel, threads as u64, &[], bytemuck::bytes_of(p))?;
        self.stream.barrier()?;
        self.keep(used)
    }

    fn keep(&mut self, used: &[&Arc<Buffer>]) -> Result<()> {
        for b in used {
            self.stream.keep_alive(Arc::clone(b))?;
        }
        Ok(())
    }

    /// Sorts `n` (u64 key, u32 value) pairs in place.
    fn sort(&mut self, keys: &Arc<Buffer>, values: &Arc<Buffer>, n: usize) -> Result<()> {
        sort::sort_pairs_u64(&mut self.stream, keys, values, n)?;
        self.keep(&[keys, values])
    }

    /// Records a gather of `n` rows of `width` words of `src` in the order `perm`.
    fn gather(
        &mut self,
        src: &Arc<Buffer>,
        perm: &Arc<Buffer>,
        n: usize,
        width: usize,
        name: &str,
    ) -> Result<Arc<Buffer>> {
        let dst = self.buffer((n * width * 4) as u64, name)?;
        permute(
            &mut self.stream,
            WORKGROUP,
            PERMUTE_GATHER,
            src,
            &dst,
            perm,
            (n * width) as u64,
            width as u32,
        )?;
        Ok(dst)
    }

    /// Numbers the distinct `keys[i] >> shift` of `n` sorted keys: the exclusive scan of
    /// their first occurrences (n + 1 u64, the count last), copied to `totals[slot]`.
    fn number_heads(
        &mut self,
        keys: &Arc<Buffer>,
        n: usize,
        shift: u32,
        slot: u64,
    ) -> Result<Arc<Buffer>> {
        let heads = self.buffer(n as u64 * 4, "index: first of each key")?;
        let p = Params {
            keys: keys.device_address(),
            out_a: heads.device_address(),
            n: n as u32,
            shift,
            ..Default::default()
        };
        self.dispatch(MODE_HEADS, n, &p, &[keys, &heads])?;
        let offsets = self.buffer((n as u64 + 1) * 8, "index: key numbers")?;
        scan::exclusive_scan_u32_to_u64(&mut self.stream, &heads, &offsets, n)?;
        self.stream
            .copy(&offsets, n as u64 * 8, &self.totals, slot * 8, 8)?;
        Ok(offsets)
    }

    fn total(&self, slot: usize) -> Result<u64> {
        Ok(self.totals.read_vec::<u64>(slot, 1)?[0])
    }
}

/// What the device build made.
pub(super) struct Built {
    pub data: DeviceData,
    pub n_cells: u32,
    /// Bytes read back (the two counts).
    pub bytes_down: u64,
    /// The build's submissions on the GPU clock, where the queue has timestamps.
    pub gpu_seconds: Option<f64>,
}

/// Builds the index of `r` (and the sorted queries `q` of an A ⋈ B) over `geom` on the
/// device. Every buffer is complete when this returns.
pub(super) fn build<T: Coord>(
    ctx: &Arc<Context>,
    uploads: &mut Uploads,
    r: &Dataset,
    q: Option<&Dataset>,
    geom: &GridGeometry,
    sort_dim: Option<usize>,
    variance_order: &[usize],
) -> Result<Built> {
    let (n, dim, k) = (r.len(), r.dim(), geom.k());
    let words = (size_of::<T>() / 4) as u32;
    let row_bytes = (dim * size_of::<T>()) as u64;
    check_binding(ctx, n as u64 * row_bytes, "indexed points")?;
    check_binding(ctx, n as u64 * 4, "point lookup (A)")?;
    let nq = q.map_or(n, |q| q.len());
    check_binding(ctx, nq as u64 * k as u64 * 4, "query cells")?;
    if q.is_some() {
        check_binding(ctx, nq as u64 * row_bytes, "query points")?;
    }
    let axes: Vec<Axis> = (0..k)
        .map(|a| Axis {
            origin: geom.origin[a],
            width: geom.width[a],
            cells: geom.cells[a] as u32,
            dim: geom.dims[a] as u32,
        })
        .collect();
    let axes = uploads.upload(&axes, "grid geometry")?;
    let r_raw = uploads.upload(coords_of::<T>(r), "indexed points (input order)")?;
    let r_uploaded = uploads.submit()?;

    let stream = Stream::new(ctx, 0)?;
    let mut b = Builder {
        ctx,
        spans: GpuSpans::new(&stream, BUILD_SUBMITS),
        stream,
        totals: uploads.pool().acquire(16, Memory::Readback)?,
        words,
    };
    b.stream.wait_for(&r_uploaded);
    b.begin()?;
    let keys_params = |raw: &Arc<Buffer>, cells: &Arc<Buffer>, len: usize| Params {
        coords: raw.device_address(),
        axes: axes.device_address(),
        cells: cells.device_address(),
        n: len as u32,
        dim: dim as u32,
        k: k as u32,
        sort_dim: NO_SORT_DIM,
        pack: PACK_CELL,
        ..Default::default()
    };

    // R sorted by (cell, SORTIDU, id): `keys` end up sorted, `order` is A.
    let cells_raw = b.buffer(n as u64 * k as u64 * 4, "cell coordinates (input order)")?;
    let keys = b.buffer(n as u64 * 8, "index: sort keys")?;
    let order = b.buffer(n as u64 * 4, "point lookup (A)")?;
    let sort_dim = sort_dim.map_or(NO_SORT_DIM, |u| u as u32);
    let packed = words == 1 && geom.total_cells().is_some_and(|c| c <= 1 << 32);
    let shift = if packed {
        let p = Params {
            keys: keys.device_address(),
            values: order.device_address(),
            sort_dim,
            pack: PACK_CELL_SORT,
            ..keys_params(&r_raw, &cells_raw, n)
        };
        b.dispatch(
            MODE_KEYS,
            n,
            &p,
            &[&r_raw, &axes, &cells_raw, &keys, &order],
        )?;
        b.sort(&keys, &order, n)?;
        32
    } else {
        let cell_ids = b.buffer(n as u64 * 8, "index: cell ids by point")?;
        let by_coord = b.buffer(n as u64 * 4, "index: points by SORTIDU")?;
        let p = Params {
            keys: cell_ids.device_address(),
            values: by_coord.device_address(),
            aux: keys.device_address(),
            sort_dim,
            ..keys_params(&r_raw, &cells_raw, n)
        };
        b.dispatch(
            MODE_KEYS,
            n,
            &p,
            &[&r_raw, &axes, &cells_raw, &cell_ids, &by_coord, &keys],
        )?;
        b.sort(&keys, &by_coord, n)?;
        let ranks = b.buffer(n as u64 * 4, "index: SORTIDU ranks")?;
        let p = Params {
            keys: keys.device_address(),
            values: by_coord.device_address(),
            aux: cell_ids.device_address(),
            out_b: ranks.device_address(),
            n: n as u32,
            ..Default::default()
        };
        b.dispatch(MODE_RANKS, n, &p, &[&keys, &by_coord, &cell_ids, &ranks])?;
        b.sort(&keys, &ranks, n)?;
        permute(
            &mut b.stream,
            WORKGROUP,
            PERMUTE_MAP,
            &ranks,
            &order,
            &by_coord,
            n as u64,
            1,
        )?;
        0
    };
    let row_words = dim * words as usize;
    let r_coords = b.gather(&r_raw, &order, n, row_words, "indexed points")?;
    let r_cells = b.gather(&cells_raw, &order, n, k, "query cells")?;
    let cell_numbers = b.number_heads(&keys, n, shift, 0)?;
    let cells_counted = b.submit()?;
    b.begin()?;

    // A ⋈ B: the queries go up while R is sorted, and are sorted by (cell, id) while the
    // host waits for the cell count.
    let queries = match q {
        Some(q) => {
            let q_raw = &uploads.upload(coords_of::<T>(q), "query points (input order)")?;
            b.stream.wait_for(&uploads.submit()?);
            let nq = q.len();
            let q_cells_raw = b.buffer(nq as u64 * k as u64 * 4, "query cells (input order)")?;
            let q_keys = b.buffer(nq as u64 * 8, "query cell ids")?;
            let q_ids = b.buffer(nq as u64 * 4, "query ids")?;
            let p = Params {
                keys: q_keys.device_address(),
                values: q_ids.device_address(),
                ..keys_params(q_raw, &q_cells_raw, nq)
            };
            b.dispatch(
                MODE_KEYS,
                nq,
                &p,
                &[q_raw, &axes, &q_cells_raw, &q_keys, &q_ids],
            )?;
            b.sort(&q_keys, &q_ids, nq)?;
            let q_coords = b.gather(q_raw, &q_ids, nq, row_words, "query points")?;
            let q_cells = b.gather(&q_cells_raw, &q_ids, nq, k, "query cells")?;
            b.submit()?;
            b.begin()?;
            Some((q_coords, q_ids, q_cells))
        }
        None => None,
    };

    cells_counted.wait()?;
    let n_cells = b.total(0)?;
    check_binding(ctx, n_cells * 8, "cell ids (B)")?;
    check_binding(ctx, n_cells * 8, "cell ranges (G)")?;
    let cell_keys = b.buffer(n_cells * 8, "cell ids (B)")?;
    let cell_ranges = b.buffer(n_cells * 8, "cell ranges (G)")?;
    let elements = n_cells as usize * k;
    let mask_keys = b.buffer(elements as u64 * 8, "index: mask elements")?;
    let mask_values = b.buffer(elements as u64 * 4, "index: mask element values")?;
    b.stream.fill(&mask_values, 0, elements as u64 * 4, 0)?;
    let p = Params {
        cells: r_cells.device_address(),
        keys: keys.device_address(),
        aux: cell_numbers.device_address(),
        out_a: cell_keys.device_address(),
        out_b: cell_ranges.device_address(),
        out_c: mask_keys.device_address(),
        n: n as u32,
        k: k as u32,
        shift,
        ..Default::default()
    };
    b.dispatch(
        MODE_CELLS,
        n,
        &p,
        &[
            &r_cells,
            &keys,
            &cell_numbers,
            &cell_keys,
            &cell_ranges,
            &mask_keys,
        ],
    )?;
    b.sort(&mask_keys, &mask_values, elements)?;
    let mask_numbers = b.number_heads(&mask_keys, elements, 0, 1)?;
    b.finish()?;
    b.begin()?;
    let mask_len = b.total(1)? as usize;

    // meta: cells per axis, mask offsets (written by MASKS), variance order, mask coordinates.
    let base = 2 * k + 1 + dim;
    let mut header: Vec<u32> = geom.cells.iter().map(|&c| c as u32).collect();
    header.extend(vec![0; k + 1]);
    header.extend(variance_order.iter().map(|&j| j as u32));
    check_binding(ctx, (base + mask_len) as u64 * 4, "grid masks (M)")?;
    let meta = b.buffer((base + mask_len) as u64 * 4, "grid masks (M)")?;
    // Stream updates take at most 64 KiB each.
    for (i, chunk) in header.chunks(16384).enumerate() {
        b.stream
            .update(&meta, i as u64 * 65536, bytemuck::cast_slice(chunk))?;
    }
    let p = Params {
        keys: mask_keys.device_address(),
        aux: mask_numbers.device_address(),
        out_a: meta.device_address(),
        n: elements as u32,
        k: k as u32,
        meta_base: base as u32,
        ..Default::default()
    };
    b.dispatch(
        MODE_MASKS,
        elements,
        &p,
        &[&mask_keys, &mask_numbers, &meta],
    )?;
    b.finish()?;

    let (q_coords, q_ids, q_cells) = match queries {
        Some((c, i, cells)) => (Some(c), Some(i), cells),
        None => (None, None, r_cells),
    };
    Ok(Built {
        data: DeviceData {
            r_coords,
            q_coords,
            cell_keys,
            cell_ranges,
            r_ids: order,
            q_ids,
            q_cells: Some(q_cells),
            meta,
            r_dot: None,
            link: None,
            q_dot: None,
        },
        n_cells: n_cells as u32,
        bytes_down: 16,
        gpu_seconds: b.spans.as_ref().map(|s| s.seconds()).transpose()?,
    })
}
