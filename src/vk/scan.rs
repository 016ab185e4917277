//! Exclusive prefix sum of u32 counts into u64 offsets (or of u64 values in place) on the
//! device, any length, by multi-level reduce-then-scan (no inter-workgroup communication
//! within a dispatch).

use super::{shaders, Buffer, Context, KernelSpec, Memory, Stream};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

const MODE_REDUCE: u32 = 0;
const MODE_SCAN: u32 = 1;
/// Elements per invocation (ITEMS in glsl/scan.comp).
const ITEMS: usize = 4;

/// Matches `Params` in glsl/scan.comp.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    input: u64,
    output: u64,
    bases: u64,
    n: u32,
    write_total: u32,
}

fn workgroup_size(ctx: &Context) -> u32 {
    let l = ctx.limits();
    let mut wg = 256u32;
    while wg > 1
        && (wg > l.max_compute_work_group_size[0]
            || wg > l.max_compute_work_group_invocations
            || wg * 8 > l.max_compute_shared_memory_size)
    {
        wg /= 2;
    }
    wg
}

/// Records `offsets[i] = counts[0] + ... + counts[i-1]` for `i` in `0..=n` (so
/// `offsets[n]` is the total): `counts` holds `n` u32, `offsets` room for `n + 1` u64.
/// Scratch space for the upper levels is allocated here and kept alive by the stream.
/// Barriers before and after, as for the sort. Submit the stream to run it.
pub fn exclusive_scan_u32_to_u64(
    stream: &mut Stream,
    counts: &Arc<Buffer>,
    offsets: &Arc<Buffer>,
    n: usize,
) -> Result<()> {
    scan(stream, counts, false, offsets, n)
}

/// Records `values[i] = values[0] + ... + values[i-1]` (the old values) for `i` in
/// `0..=n`, in place: `values` holds `n` u64 and room for the total at `[n]`. The same
/// kernel as [`exclusive_scan_u32_to_u64`], reading u64 input (every invocation reads its
/// elements before writing them).
pub fn exclusive_scan_u64_in_place(
    stream: &mut Stream,
    values: &Arc<Buffer>,
    n: usize,
) -> Result<()> {
    scan(stream, values, true, values, n)
}

fn scan(
    stream: &mut Stream,
    counts: &Arc<Buffer>,
    input_u64: bool,
    offsets: &Arc<Buffer>,
    n: usize,
) -> Result<()> {
    let ctx: Arc<Context> = stream.context().clone();
    let wg = workgroup_size(&ctx);
    let tile = wg as usize * ITEMS;
    if n > u32::MAX as usize - tile {
        return Err(Error::invalid(format!(
            "scan: {n} elements exceed the 2^32 - {tile} limit"
        )));
    }
    let input_bytes = n as u64 * if input_u64 { 8 } else { 4 };
    if counts.size() < input_bytes || offsets.size() < (n as u64 + 1) * 8 {
        return Err(Error::invalid(format!(
            "scan: {n} counts need {} input bytes and {} output bytes; the buffers have {} and {}",
            input_bytes,
            (n as u64 + 1) * 8,
            counts.size(),
            offsets.size()
        )));
    }
    stream.barrier()?;
    if n == 0 {
        stream.fill(offsets, 0, 8, 0)?;
        return stream.barrier();
    }
    // Level l has sizes[l] elements; level l + 1 holds one sum per tile of level l.
    let mut sizes = vec![n];
    while *sizes.last().expect("non-empty") > tile {
        sizes.push(sizes.last().expect("non-empty").div_ceil(tile));
    }
    let scratch_elems: usize = sizes[1..].iter().sum();
    let scratch = if scratch_elems > 0 {
        Some(Buffer::new(
            &ctx,
            scratch_elems as u64 * 8,
            Memory::Device,
            "scan scratch",
        )?)
    } else {
        None
    };
    // Device address of each level's u64 array (level 0 is the caller's input / output).
    let mut level_addr = vec![0u64; sizes.len()];
    let mut offset = 0u64;
    for l in 1..sizes.len() {
        level_addr[l] = scratch.as_ref().expect("allocated").device_address() + offset;
        offset += sizes[l] as u64 * 8;
    }
    let kernel = |mode: u32, input_u64: bool| {
        ctx.kernel(
            "scan",
            shaders::SCAN,
            &KernelSpec::new(wg)
                .constant(1, mode)
                .constant(2, input_u64 as u32)
                .push_bytes(size_of::<Params>() as u32),
        )
    };
    let input_of = |l: usize| {
        if l == 0 {
            counts.device_address()
        } else {
            level_addr[l]
        }
    };
    let output_of = |l: usize| {
        if l == 0 {
            offsets.device_address()
        } else {
            level_addr[l]
        }
    };
    let threads = |l: usize| (sizes[l].div_ceil(tile) * wg as usize) as u64;
    let top = sizes.len() - 1;

    // Up: tile sums of each level into the next.
    for l in 0..top {
        let reduce = kernel(MODE_REDUCE, l > 0 || input_u64)?;
        let p = Params {
            input: input_of(l),
            output: level_addr[l + 1],
            bases: 0,
            n: sizes[l] as u32,
            write_total: 0,
        };
        stream.dispatch_threads(&reduce, threads(l), &[], bytemuck::bytes_of(&p))?;
        stream.barrier()?;
    }
    // Down: scan each level within tiles, offset by the scanned level above.
    for l in (0..=top).rev() {
        let scan = kernel(MODE_SCAN, l > 0 || input_u64)?;
        let bases = if l == top { 0 } else { level_addr[l + 1] };
        let p = Params {
            input: input_of(l),
            output: output_of(l),
            bases,
            n: sizes[l] as u32,
            write_total: (l == 0) as u32,
        };
        stream.dispatch_threads(&scan, threads(l), &[], bytemuck::bytes_of(&p))?;
        stream.barrier()?;
    }
    if let Some(s) = scratch {
        stream.keep_alive(s)?;
    }
    Ok(())
}
