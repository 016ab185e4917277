//! The grouped cosine join on the GPU: the host plans (`cpu/partition/`: leaders, groups,
//! the pairs of groups the bounds keep, each pair's members that can meet), with each
//! vector's nearest leader found on the device ([`nearest_leaders`],
//! glsl/nearest_leaders.comp: every rows x leaders dot product, the largest kept); the
//! device computes every f32 dot product of the members in 32 x 32 tiles
//! (glsl/grouped_tiles.comp) and returns the pairs at or above the plan's floor, flagged
//! where their product also reaches `Plan::sure`, and the host confirms the others by the
//! cosine rule (the caller's `emit`). The candidates are the
//! CPU path's (`partition::compare`): the same bound on the same f32 copies, so the
//! confirmed set is the rule's on either.
//!
//! Batches of tiles go through two slots: while the device runs one, the host builds the
//! next batch's member lists and confirms the previous batch's pairs. A batch whose pairs
//! overflow its result buffer is run again in halves until each part fits: no pair is
//! lost, whatever the buffer's size. The join stops between batches.

use crate::control::Control;
use crate::cpu::partition::Plan;
use crate::error::{Error, Result};
use crate::options::JoinOptions;
use crate::vk::{shaders, Buffer, Context, Kernel, KernelSpec, Memory, Stream, Ticket};
use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;
use std::sync::Arc;

/// Rows per side of a tile (SIDE in the kernel).
const SIDE: usize = 32;
/// A tile's flag: a self-join's group with itself on the diagonal (pairs x < y only).
const TRIANGLE: u32 = 1 << 16;
/// Threads per workgroup (the kernel's 8 x 8 layout).
const WORKGROUP: u32 = 64;
/// Pairs of groups whose members are listed in parallel at a time.
const PLAN_CHUNK: usize = 512;

/// Matches `Params` in glsl/grouped_tiles.comp.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows_a: u64,
    rows_b: u64,
    list: u64,
    tiles: u64,
    pairs: u64,
    counter: u64,
    first_tile: u32,
    n_tiles: u32,
    capacity: u32,
    dim: u32,
    floor_dot: f32,
    /// Products at or above it are flagged sure (bit 31 of the B position).
    sure_dot: f32,
}

/// A pair's flag in the kernel's output: its product reached `sure_dot`.
const SURE: u32 = 1 << 31;

/// Work as the host builds it: member positions and tiles `[a offset, b offset, sizes
/// and flags, 0]` into them (sent in batches of tiles).
#[derive(Default)]
struct Batch {
    list: Vec<u32>,
    tiles: Vec<[u32; 4]>,
    /// Pairs of groups in it (progress) and vector pairs its tiles compare.
    groups: u64,
    compared: u64,
}

impl Batch {
    /// Adds the tiles of one pair of groups' members (`same`: one list, upper triangle).
    fn add(&mut self, sa: &[usize], sb: &[usize], same: bool) {
        let a_off = self.list.len();
        self.list.extend(sa.iter().map(|&s| s as u32));
        let b_off = if same {
            a_off
        } else {
            self.list.extend(sb.iter().map(|&t| t as u32));
            a_off + sa.len()
        };
        for i in (0..sa.len()).step_by(SIDE) {
            let na = SIDE.min(sa.len() - i);
            let first = if same { i } else { 0 };
            for j in (first..sb.len()).step_by(SIDE) {
                let nb = SIDE.min(sb.len() - j);
                let tri = if same && i == j { TRIANGLE } else { 0 };
                self.tiles.push([
                    (a_off + i) as u32,
                    (b_off + j) as u32,
                    na as u32 | (nb as u32) << 8 | tri,
                    0,
                ]);
            }
        }
        self.compared += if same {
            (sa.len() * sa.len().saturating_sub(1) / 2) as u64
        } else {
            (sa.len() * sb.len()) as u64
        };
    }
}

/// A slot: a batch's buffers and stream, and the batch in flight.
struct Slot {
    stream: Stream,
    list: Option<Arc<Buffer>>,
    tiles: Option<Arc<Buffer>>,
    pairs: Arc<Buffer>,
    counter: Arc<Buffer>,
    flight: Option<(Ticket, u32, u64)>,
}

/// A buffer of at least `bytes` in `memory`: `have` where it is big enough.
fn at_least(
    ctx: &Arc<Context>,
    have: &mut Option<Arc<Buffer>>,
    bytes: u64,
    memory: Memory,
    name: &str,
) -> Result<Arc<Buffer>> {
    match have {
        Some(b) if b.size() >= bytes => Ok(b.clone()),
        _ => {
            let b = Buffer::new(ctx, bytes.max(16).next_power_of_two(), memory, name)?;
            *have = Some(b.clone());
            Ok(b)
        }
    }
}

/// Runs the comparisons of `plan` on the device of `ctx`: candidates (query ids) to `emit`
/// from the engine's threads. Returns the report's note.
pub(super) fn run(
    ctx: &Arc<Context>,
    plan: &Plan,
    opts: &JoinOptions,
    emit: &crate::cpu::partition::Candidates,
) -> Result<String> {
    let control = &opts.control;
    let dim = plan.dim;
    if plan.makes_b() {
        // Its B rows exist only a block at a time, on the CPU (`Plan::brute_made`).
        return Err(Error::new(
            crate::error::ErrorKind::Internal,
            "a plan whose rows are made on demand runs on the CPU",
        ));
    }
    if dim > u32::MAX as usize / 4 {
        return Err(Error::invalid(format!(
            "{dim} dimensions: too many for the GPU"
        )));
    }
    let software = ctx.is_software();
    // Tiles a batch holds: a short wait on a software device (about 25 ms on lavapipe at
    // 384-D; a stop waits for two, and 256 took over 250 ms on 2 loaded cores), a few
    // milliseconds' work on a GPU.
    let max_tiles = if software { 64 } else { 1 << 16 };
    // Result slots: the option where given (at least one tile's worth), else a default.
    let capacity = opts
        .result_buffer_pairs
        .unwrap_or(if software { 1 << 20 } else { 1 << 24 })
        .clamp(SIDE * SIDE, 1 << 28) as u32;
    // The matrix units where the device has them (f16 copies, a wider floor), else f32 tiles.
    let matrix = ctx.features().f16_matrix_tiles;
    let (name, spirv, workgroup, floor, sure) = if matrix {
        let sub = ctx.limits().subgroup_size;
        (
            "grouped_tiles_coop",
            shaders::GROUPED_TILES_COOP,
            4 * sub,
            plan.floor_f16(),
            plan.sure_f16,
        )
    } else {
        (
            "grouped_tiles",
            shaders::GROUPED_TILES,
            WORKGROUP,
            plan.floor,
            plan.sure,
        )
    };
    // The flag takes B's positions' top bit: where it could be a position, no flag.
    let sure = if plan.gb().order.len() < SURE as usize {
        sure
    } else {
        f32::INFINITY
    };
    let kernel = ctx.kernel_stoppable(
        name,
        spirv,
        &KernelSpec::new(workgroup).push_bytes(size_of::<Params>() as u32),
        || control.check(),
    )?;
    let rows_a = ctx.upload(&plan.ga.rows, "grouped rows A")?;
    let rows_b = if plan.self_join {
        rows_a.clone()
    } else {
        ctx.upload(&plan.gb().rows, "grouped rows B")?
    };
    // Two slots; their result buffers halved while the device is out of memory (down to
    // one tile's pairs).
    let asked = capacity;
    let mut capacity = capacity;
    let mut slots = loop {
        let made = (0..2)
            .map(|i| -> Result<Slot> {
                Ok(Slot {
                    stream: Stream::new(ctx, i)?,
                    list: None,
                    tiles: None,
                    pairs: Buffer::new(
                        ctx,
                        capacity as u64 * 8,
                        Memory::Readback,
                        "grouped pairs",
                    )?,
                    counter: Buffer::new(ctx, 16, Memory::Readback, "grouped counter")?,
                    flight: None,
                })
            })
            .collect::<Result<Vec<_>>>();
        match made {
            Ok(slots) => break slots,
            Err(e)
                if e.kind() == crate::error::ErrorKind::OutOfDeviceMemory
                    && capacity > (SIDE * SIDE) as u32 =>
            {
                capacity = (capacity / 2).max((SIDE * SIDE) as u32);
            }
            Err(e) => return Err(e),
        }
    };
    let base = Params {
        rows_a: rows_a.device_address(),
        rows_b: rows_b.device_address(),
        capacity,
        dim: dim as u32,
        floor_dot: floor,
        sure_dot: sure,
        ..Zeroable::zeroed()
    };
    let job = Job {
        kernel: &kernel,
        base,
        plan,
        emit,
        control,
        found: std::cell::Cell::new(0),
        drained: std::cell::Cell::new(0),
        waited: std::cell::Cell::new(0.0),
        confirmed: std::cell::Cell::new(0.0),
    };
    // Where the host's time goes (the report's note): member lists, waits, confirmations.
    let mut listed = 0.0f64;
    control.stage("join", plan.pairs.len() as u64);
    let (mut batches, mut reruns, mut compared, mut tiles) = (0u64, 0u64, 0u64, 0u64);
    let mut next = 0usize;
    let mut turn = 0usize;
    while next < plan.pairs.len() {
        control.check()?;
        // The next pairs of groups, a chunk at a time (members found in parallel), until
        // they make a batch's worth of tiles.
        let mut work = Batch::default();
        let t = std::time::Instant::now();
        while next < plan.pairs.len() && work.tiles.len() < max_tiles {
            let end = (next + PLAN_CHUNK).min(plan.pairs.len());
            let members: Vec<_> = (next..end)
                .into_par_iter()
                .map(|p| plan.members(p))
                .collect();
            for (sa, sb, same) in members.iter().flatten() {
                work.add(sa, sb, *same);
            }
            work.groups += (end - next) as u64;
            next = end;
        }
        listed += t.elapsed().as_secs_f64();
        compared += work.compared;
        tiles += work.tiles.len() as u64;
        if work.tiles.is_empty() {
            control.advance(work.groups, 0);
            continue;
        }
        // In batches of at most max_tiles (each with the whole member list), fewer where
        // the pairs a tile found so far say more would overflow half the result buffer
        // (before any batch came back, a full tile's SIDE^2: the first batches cannot
        // overflow, and the H200's 1M run of 2026-11-28 ran 6 parts again without that):
        // a stop waits for at most the two in flight. The last one counts the pairs of
        // groups.
        let mut from = 0;
        while from < work.tiles.len() {
            control.check()?;
            let per_tile = match job.drained.get() {
                0 => (SIDE * SIDE) as f64,
                t => job.found.get() as f64 / t as f64,
            };
            let fit = (capacity as f64 / 2.0 / per_tile.max(1.0)) as usize;
            let to = work.tiles.len().min(from + fit.clamp(SIDE, max_tiles));
            let slot = &mut slots[turn];
            turn ^= 1;
            reruns += job.drain(slot)?;
            let groups = if to == work.tiles.len() {
                work.groups
            } else {
                0
            };
            job.submit(ctx, slot, &work.list, &work.tiles[from..to], groups)?;
            batches += 1;
            from = to;
        }
    }
    for slot in &mut slots {
        reruns += job.drain(slot)?;
    }
    control.check()?;
    Ok(format!(
        "{}; on the GPU: {tiles} tiles of 32 x 32 {} in {batches} batches, result buffers of {capacity} pairs{}{}; \
         host: member lists {listed:.3} s, waiting for the device {:.3} s, reading and confirming pairs {:.3} s",
        plan.note(compared),
        if matrix {
            "on the matrix units (f16 copies, f32 sums)"
        } else {
            "of f32 products"
        },
        if capacity < asked {
            format!(" (of {asked} asked: out of device memory)")
        } else {
            String::new()
        },
        if reruns > 0 {
            format!(", {reruns} parts run again after a full result buffer")
        } else {
            String::new()
        },
        job.waited.get(),
        job.confirmed.get(),
    ))
}

/// What every batch of one join shares.
struct Job<'a> {
    kernel: &'a Kernel,
    base: Params,
    plan: &'a Plan<'a>,
    emit: &'a crate::cpu::partition::Candidates<'a>,
    control: &'a Control,
    /// Pairs found by the batches drained so far, and their tiles.
    found: std::cell::Cell<u64>,
    drained: std::cell::Cell<u64>,
    /// Seconds spent waiting for batches, and reading and confirming their pairs.
    waited: std::cell::Cell<f64>,
    confirmed: std::cell::Cell<f64>,
}

impl Job<'_> {
    /// Uploads a batch (its member `list` and `tiles`) into `slot` and starts it; `groups`:
    /// the pairs of groups it completes (progress, once drained).
    fn submit(
        &self,
        ctx: &Arc<Context>,
        slot: &mut Slot,
        list: &[u32],
        tiles: &[[u32; 4]],
        groups: u64,
    ) -> Result<()> {
        let list_buf = at_least(
            ctx,
            &mut slot.list,
            size_of_val(list) as u64,
            Memory::Upload,
            "grouped lists",
        )?;
        let tiles_buf = at_least(
            ctx,
            &mut slot.tiles,
            size_of_val(tiles) as u64,
            Memory::Upload,
            "grouped tiles",
        )?;
        list_buf.write(0, list)?;
        tiles_buf.write(0, tiles)?;
        let n = tiles.len() as u32;
        let ticket = self.dispatch(slot, 0, n)?;
        slot.flight = Some((ticket, n, groups));
        Ok(())
    }

    /// Dispatches tiles `first..first + n` of the batch in `slot`, counter reset.
    fn dispatch(&self, slot: &mut Slot, first: u32, n: u32) -> Result<Ticket> {
        let (list, tiles) = match (&slot.list, &slot.tiles) {
            (Some(l), Some(t)) => (l.clone(), t.clone()),
            _ => {
                return Err(Error::new(
                    crate::error::ErrorKind::Internal,
                    "grouped batch without buffers",
                ))
            }
        };
        slot.counter.write(0, &[0u32])?;
        let p = Params {
            list: list.device_address(),
            tiles: tiles.device_address(),
            pairs: slot.pairs.device_address(),
            counter: slot.counter.device_address(),
            first_tile: first,
            n_tiles: n,
            ..self.base
        };
        let s = &mut slot.stream;
        s.dispatch_threads(
            self.kernel,
            n as u64 * self.kernel.workgroup_size() as u64,
            &[],
            bytemuck::bytes_of(&p),
        )?;
        s.keep_alive((list, tiles, slot.pairs.clone(), slot.counter.clone()))?;
        s.submit()
    }

    /// Waits for the batch in `slot` (if any) and hands its pairs on; a part whose pairs
    /// overflowed the buffer runs again in halves. Returns the parts run again.
    fn drain(&self, slot: &mut Slot) -> Result<u64> {
        let Some((ticket, n, groups)) = slot.flight.take() else {
            return Ok(0);
        };
        let mut reruns = 0;
        let mut parts = vec![(0u32, n, Some(ticket))];
        while let Some((first, n, ticket)) = parts.pop() {
            let ticket = match ticket {
                Some(t) => t,
                None => {
                    self.control.check()?;
                    reruns += 1;
                    self.dispatch(slot, first, n)?
                }
            };
            let t = std::time::Instant::now();
            ticket.wait()?;
            self.waited
                .set(self.waited.get() + t.elapsed().as_secs_f64());
            let found = slot.counter.read_vec::<u32>(0, 1)?[0];
            if found > self.base.capacity {
                // A tile holds at most SIDE^2 <= capacity pairs: n > 1 here.
                let half = n / 2;
                parts.push((first + half, n - half, None));
                parts.push((first, half, None));
                continue;
            }
            self.found.set(self.found.get() + found as u64);
            self.drained.set(self.drained.get() + n as u64);
            let t = std::time::Instant::now();
            let raw: Vec<[u32; 2]> = slot.pairs.read_vec(0, found as usize)?;
            raw.par_chunks(4096)
                .try_for_each(|chunk| {
                    let (mut check, mut sure) = (Vec::new(), Vec::new());
                    for &[s, t] in chunk {
                        let pair = self.plan.pair(s as usize, (t & !SURE) as usize);
                        if t & SURE != 0 {
                            sure.push(pair);
                        } else {
                            check.push(pair);
                        }
                    }
                    if !check.is_empty() {
                        (self.emit)(&check, false)?;
                    }
                    if !sure.is_empty() {
                        (self.emit)(&sure, true)?;
                    }
                    Ok(())
                })
                .map_err(crate::result::sink_error)?;
            self.confirmed
                .set(self.confirmed.get() + t.elapsed().as_secs_f64());
        }
        self.control.advance(groups, 0);
        Ok(reruns)
    }
}

/// Rows (and leaders) of a workgroup's tile in glsl/nearest_leaders.comp (SIDE there).
const ASSIGN_SIDE: usize = 64;

/// Matches `Params` in glsl/nearest_leaders.comp.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AssignParams {
    rows: u64,
    leaders: u64,
    out: u64,
    first_row: u32,
    n_rows: u32,
    first_leader: u32,
    n_leaders: u32,
    dim: u32,
    pad: u32,
}

/// Each row of `x` (f32 unit vectors, `dim` wide)'s nearest of `leaders` on the device:
/// (leader, f32 dot product), the first of equal ones, as `partition::nearest_leaders`
/// answers on the CPU (up to the order of the f32 sums). In dispatches of a bounded size,
/// `control` read between them.
pub(super) fn nearest_leaders(
    ctx: &Arc<Context>,
    x: &[f32],
    dim: usize,
    leaders: &[f32],
    control: &Control,
) -> Result<Vec<(u32, f32)>> {
    let (n, k) = (x.len() / dim, leaders.len() / dim);
    if n == 0 || k == 0 {
        return Ok(vec![(0, f32::NEG_INFINITY); n]);
    }
    if n > u32::MAX as usize || k > u32::MAX as usize || dim > u32::MAX as usize / 4 {
        return Err(Error::invalid(
            "too many rows or leaders for the GPU's assignment",
        ));
    }
    let kernel = ctx.kernel_stoppable(
        "nearest_leaders",
        shaders::NEAREST_LEADERS,
        &KernelSpec::new(WORKGROUP).push_bytes(size_of::<AssignParams>() as u32),
        || control.check(),
    )?;
    let rows = ctx.upload(x, "assignment rows")?;
    let lead = ctx.upload(leaders, "assignment leaders")?;
    let best = Buffer::new(ctx, n as u64 * 8, Memory::Device, "assignment best")?;
    let out = Buffer::new(ctx, n as u64 * 8, Memory::Readback, "assignment out")?;
    // A dispatch: enough rows to fill the device (2^18 rows, 4096 workgroups, on a GPU: the
    // H200's first runs took 26 workgroups a dispatch at 1M rows and 13,000 leaders, a
    // fifth of one workgroup an SM) against as many leaders as keep it to about 2^34
    // multiply-adds (milliseconds on a GPU; 2^12 rows and 2^25 on a software device,
    // about 40 ms on lavapipe: a short wait for a stop), whole tiles of leaders.
    let (fill, budget): (usize, u64) = if ctx.is_software() {
        (1 << 12, 1 << 25)
    } else {
        (1 << 18, 1 << 34)
    };
    let row_step = n.min(fill);
    let lead_step =
        ((budget / (row_step * dim).max(1) as u64) as usize / ASSIGN_SIDE).max(1) * ASSIGN_SIDE;
    let mut stream = Stream::new(ctx, 0)?;
    for first in (0..n).step_by(row_step) {
        let m = row_step.min(n - first);
        for from in (0..k).step_by(lead_step) {
            control.check()?;
            let p = AssignParams {
                rows: rows.device_address(),
                leaders: lead.device_address(),
                out: best.device_address(),
                first_row: first as u32,
                n_rows: m as u32,
                first_leader: from as u32,
                n_leaders: lead_step.min(k - from) as u32,
                dim: dim as u32,
                pad: 0,
            };
            if from > 0 {
                // The previous dispatch's bests (an earlier submission) are read.
                stream.barrier()?;
            }
            stream.dispatch_threads(
                &kernel,
                m.div_ceil(ASSIGN_SIDE) as u64 * WORKGROUP as u64,
                &[],
                bytemuck::bytes_of(&p),
            )?;
            stream.keep_alive((rows.clone(), lead.clone(), best.clone()))?;
            stream.submit()?.wait()?;
        }
        control.advance(m as u64, 0);
    }
    stream.barrier()?;
    stream.copy(&best, 0, &out, 0, n as u64 * 8)?;
    stream.submit()?.wait()?;
    let raw: Vec<[u32; 2]> = out.read_vec(0, n)?;
    Ok(raw
        .into_iter()
        .map(|[j, bits]| {
            if (j as usize) < k {
                (j, f32::from_bits(bits))
            } else {
                (0, f32::NEG_INFINITY)
            }
        })
        .collect())
}
