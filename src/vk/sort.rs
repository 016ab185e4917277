//! Bitonic sort on the device, any length: (key, value) pairs with u32 or u64 keys and u32
//! values, ordered by key, then value, so the result is unique (and equals a CPU sort of
//! the pairs); and point ids in Z-order of their quantised coordinate rows (LSS's lists,
//! [`sort_zorder`]), several lists in the same dispatches. Shared-memory stages sort and
//! merge tiles of `2 * workgroup` elements; global stages merge across tiles. The network
//! is one (glsl/bitonic.glsl) for both element kinds.

use super::{shaders, Buffer, Context, KernelSpec, Stream};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

const MODE_LOCAL_SORT: u32 = 0;
const MODE_LOCAL_MERGE: u32 = 1;
const MODE_GLOBAL_STEP: u32 = 2;

/// Matches `Params` in glsl/bitonic_pairs.glsl and glsl/bitonic_zorder.comp (`values`:
/// the rows there; `shift`: 0 and unused for pairs).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    keys: u64,
    values: u64,
    n: u32,
    half_span: u32,
    flip: u32,
    segments: u32,
    shift: u32,
    unused: u32,
}

/// Largest power-of-two workgroup (at most 256) whose tile fits the device's limits.
fn workgroup_size(ctx: &Context, element_bytes: u32) -> u32 {
    let l = ctx.limits();
    let mut wg = 256u32;
    while wg > 1
        && (wg > l.max_compute_work_group_size[0]
            || wg > l.max_compute_work_group_invocations
            || 2 * wg * element_bytes > l.max_compute_shared_memory_size)
    {
        wg /= 2;
    }
    wg
}

/// Where the sort's stages run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortStages {
    /// `GlobalOnly` on software devices (lavapipe's shared memory is slow), else `Tiles`.
    Auto,
    /// Sort and finish merges in shared-memory tiles; only strides >= the tile go global.
    Tiles,
    /// Every compare-exchange stage is one dispatch over global memory.
    GlobalOnly,
}

/// Records a sort of the first `n` (u32 key, u32 value) pairs of `keys` / `values`, in
/// place. Barriers before and after make it see earlier writes of the stream and its
/// results visible to later commands. Submit the stream to run it.
pub fn sort_pairs_u32(
    stream: &mut Stream,
    keys: &Arc<Buffer>,
    values: &Arc<Buffer>,
    n: usize,
) -> Result<()> {
    sort_pairs_with(stream, keys, values, n, false, SortStages::Auto)
}

/// As [`sort_pairs_u32`] with u64 keys.
pub fn sort_pairs_u64(
    stream: &mut Stream,
    keys: &Arc<Buffer>,
    values: &Arc<Buffer>,
    n: usize,
) -> Result<()> {
    sort_pairs_with(stream, keys, values, n, true, SortStages::Auto)
}

/// As [`sort_pairs_u32`] with both arrays in one buffer: the keys at its start and the
/// values `values_offset` bytes in (the layout of the join kernels' FLAG_ROWS results).
pub fn sort_pairs_u32_in(
    stream: &mut Stream,
    buffer: &Arc<Buffer>,
    values_offset: u64,
    n: usize,
) -> Result<()> {
    if n > 1 << 31 || values_offset < n as u64 * 4 || buffer.size() < values_offset + n as u64 * 4 {
        return Err(Error::invalid(format!(
            "sort: {n} pairs with values at byte {values_offset} do not fit a buffer of {} bytes",
            buffer.size()
        )));
    }
    if !values_offset.is_multiple_of(4) {
        return Err(Error::invalid("sort: values must be 4-byte aligned"));
    }
    let network = Network {
        name: "bitonic_u32",
        spirv: shaders::BITONIC_U32,
        element_bytes: 8,
        constants: Vec::new(),
        keys: buffer.device_address(),
        values: buffer.device_address() + values_offset,
        n,
        segments: 1,
        shift: 0,
    };
    network.record(stream, SortStages::Auto)?;
    // The kernels address the buffer through device addresses only.
    stream.keep_alive(buffer.clone())
}

/// Compiles the kernels of the u32 pair sort now (the context keeps them), so that a
/// later sort records without a compile: a software device takes a good part of a
/// second over one, which nobody can interrupt.
pub fn prepare_u32(ctx: &Arc<Context>) -> Result<()> {
    let wg = workgroup_size(ctx, 8);
    for mode in [MODE_LOCAL_SORT, MODE_LOCAL_MERGE, MODE_GLOBAL_STEP] {
        let spec = KernelSpec::new(wg)
            .constant(1, mode)
            .push_bytes(size_of::<Params>() as u32);
        ctx.kernel("bitonic_u32", shaders::BITONIC_U32, &spec)?;
    }
    Ok(())
}

/// [`sort_pairs_u32`] / [`sort_pairs_u64`] (by `key64`) with a choice of stages.
pub fn sort_pairs_with(
    stream: &mut Stream,
    keys: &Arc<Buffer>,
    values: &Arc<Buffer>,
    n: usize,
    key64: bool,
    stages: SortStages,
) -> Result<()> {
    let key_bytes: u32 = if key64 { 8 } else { 4 };
    if n > 1 << 31 {
        return Err(Error::invalid(format!(
            "sort: {n} elements exceed the 2^31 limit"
        )));
    }
    if keys.size() < n as u64 * key_bytes as u64 || values.size() < n as u64 * 4 {
        return Err(Error::invalid(format!(
            "sort: {n} pairs need {} key bytes and {} value bytes; the buffers have {} and {}",
            n as u64 * key_bytes as u64,
            n as u64 * 4,
            keys.size(),
            values.size()
        )));
    }
    let (name, spirv) = if key64 {
        ("bitonic_u64", shaders::BITONIC_U64)
    } else {
        ("bitonic_u32", shaders::BITONIC_U32)
    };
    let network = Network {
        name,
        spirv,
        element_bytes: key_bytes + 4,
        constants: Vec::new(),
        keys: keys.device_address(),
        values: values.device_address(),
        n,
        segments: 1,
        shift: 0,
    };
    network.record(stream, stages)
}

/// Records a sort of `segments` lists of point ids in Z-order (Morton order), in place:
/// list s is `ids[s*n .. (s+1)*n]` (any permutation of 0..n, e.g. from an init kernel),
/// ordered by the rows `rows[id*dim .. (id+1)*dim]` (u32 coordinates < 2^31) shifted by
/// `s * shift` in every dimension, equal rows by id. The comparison finds the dimension
/// of the most significant differing bit (glsl/bitonic_zorder.comp), so no interleaved key
/// is built and any `dim` works. Barriers before and after, as for the pair sort.
#[allow(clippy::too_many_arguments)]
pub fn sort_zorder(
    stream: &mut Stream,
    ids: &Arc<Buffer>,
    rows: &Arc<Buffer>,
    n: usize,
    segments: usize,
    dim: usize,
    shift: u32,
    stages: SortStages,
) -> Result<()> {
    let elements = n as u64 * segments as u64;
    if n > 1 << 31 || elements >= u32::MAX as u64 || n as u64 * dim as u64 >= u32::MAX as u64 {
        return Err(Error::invalid(format!(
            "Z-order sort: {segments} lists of {n} points in {dim} dimensions exceed the 2^32 index range"
        )));
    }
    if dim == 0 || dim > u32::MAX as usize {
        return Err(Error::invalid("Z-order sort: dim must be >= 1"));
    }
    if (shift as u64) * (segments.saturating_sub(1) as u64) >= 1 << 31 {
        return Err(Error::invalid(format!(
            "Z-order sort: {segments} lists shifted by {shift} leave the 2^32 coordinate range"
        )));
    }
    if ids.size() < elements * 4 || rows.size() < n as u64 * dim as u64 * 4 {
        return Err(Error::invalid(format!(
            "Z-order sort: {segments} lists of {n} ids need {} bytes and {n} rows {} bytes; the buffers have {} and {}",
            elements * 4,
            n as u64 * dim as u64 * 4,
            ids.size(),
            rows.size()
        )));
    }
    let network = Network {
        name: "bitonic_zorder",
        spirv: shaders::BITONIC_ZORDER,
        element_bytes: 4,
        constants: vec![(2, dim as u32)],
        keys: ids.device_address(),
        values: rows.device_address(),
        n,
        segments,
        shift,
    };
    network.record(stream, stages)?;
    // The kernels address the buffers through device addresses only.
    stream.keep_alive(ids.clone())?;
    stream.keep_alive(rows.clone())
}

/// One sort: a kernel of the network (glsl/bitonic.glsl) and what it sorts.
struct Network {
    name: &'static str,
    spirv: &'static [u8],
    /// Shared-memory bytes per element of a tile.
    element_bytes: u32,
    /// Specialization constants beyond the workgroup size and MODE.
    constants: Vec<(u32, u32)>,
    keys: u64,
    values: u64,
    n: usize,
    segments: usize,
    shift: u32,
}

impl Network {
    fn record(&self, stream: &mut Stream, stages: SortStages) -> Result<()> {
        let n = self.n;
        if n <= 1 || self.segments == 0 {
            return Ok(());
        }
        let ctx: Arc<Context> = stream.context().clone();
        let wg = workgroup_size(&ctx, self.element_bytes);
        let use_tiles = match stages {
            SortStages::Auto => !ctx.is_software(),
            SortStages::Tiles => true,
            SortStages::GlobalOnly => false,
        };
        // Without tiles every stage is global: as if tiles held one element.
        let tile = if use_tiles { 2 * wg as usize } else { 1 };
        let kernel = |mode| {
            let mut spec = KernelSpec::new(wg)
                .constant(1, mode)
                .push_bytes(size_of::<Params>() as u32);
            for &(id, v) in &self.constants {
                spec = spec.constant(id, v);
            }
            ctx.kernel(self.name, self.spirv, &spec)
        };
        let local_sort = kernel(MODE_LOCAL_SORT)?;
        let local_merge = kernel(MODE_LOCAL_MERGE)?;
        let global_step = kernel(MODE_GLOBAL_STEP)?;
        let params = |half_span: usize, flip: bool| Params {
            keys: self.keys,
            values: self.values,
            n: n as u32,
            half_span: half_span as u32,
            flip: flip as u32,
            segments: self.segments as u32,
            shift: self.shift,
            unused: 0,
        };
        let segments = self.segments as u64;
        let tiles = n.div_ceil(tile) as u64;
        let local_threads = segments * tiles * wg as u64;
        let padded = n.next_power_of_two();

        stream.barrier()?;
        if use_tiles {
            stream.dispatch_threads(
                &local_sort,
                local_threads,
                &[],
                bytemuck::bytes_of(&params(0, false)),
            )?;
            stream.barrier()?;
        }
        let mut block = 2 * tile;
        while block <= padded {
            // First stage of the merge: compare mirror images across the block halves.
            let global_threads = segments * (padded / 2) as u64;
            stream.dispatch_threads(
                &global_step,
                global_threads,
                &[],
                bytemuck::bytes_of(&params(block / 2, true)),
            )?;
            stream.barrier()?;
            let mut stride = block / 4;
            while stride >= tile {
                stream.dispatch_threads(
                    &global_step,
                    global_threads,
                    &[],
                    bytemuck::bytes_of(&params(stride, false)),
                )?;
                stream.barrier()?;
                stride /= 2;
            }
            if use_tiles {
                // Strides below the tile size stay inside one tile: finish in shared memory.
                stream.dispatch_threads(
                    &local_merge,
                    local_threads,
                    &[],
                    bytemuck::bytes_of(&params(0, false)),
                )?;
                stream.barrier()?;
            }
            block *= 2;
        }
        Ok(())
    }
}
