//! The screen of [`super::nearest_leaders`]: each vector's products with every leader over
//! its first coordinates only, the few largest completed. On clustered data a vector's
//! nearest leader stands far above the others already there, and the caller takes the
//! screen's best only where it is proven (or, for a join's groups, within the radius), so
//! the screen's arithmetic decides how fast, never what is found.
//!
//! Where the CPU has AVX512-VNNI the heads are bytes ([`Heads::I8`]): [`SCREEN_I8`]
//! coordinates in a third of the instructions of [`SCREEN`] f32 ones (each `vpdpbusd` sums
//! 64 byte products, a 512-bit FMA 16 float ones). Elsewhere they are f32.

use super::products::{heads_block4, heads_block4_i8, in_blocks, vnni, SCREEN_I8};
use super::{dot, BLOCK};

/// Coordinates [`screen`] reads of each vector and leader in f32.
pub(super) const SCREEN: usize = 48;

/// Leaders whose products over the first coordinates are largest, completed by
/// [`screen`]: of 53,623 leaders around random centres in 384-D, a vector's nearest
/// (a product of 0.9) has a head product about 6 standard deviations above the others'.
pub(super) const SCREEN_BEST: usize = 4;

/// Vectors a task of [`screen`] takes: their first coordinates (48 KB in f32) meet each
/// block of leaders' in turn.
pub(super) const SCREEN_TILE: usize = 256;

/// The leaders' first coordinates as [`screen`] reads them.
pub(super) enum Heads {
    /// The first [`SCREEN`] coordinates ([`in_blocks`]).
    F32(Vec<f32>),
    /// The first [`SCREEN_I8`] coordinates of each leader divided by `scale` (its largest
    /// magnitude among them over 127) and rounded: [`super::heads_block4_i8`]'s layout, a
    /// block of [`BLOCK`] leaders at a time (the last padded with zeros). `bias` is 128
    /// times the sum of a leader's bytes: a vector's bytes are offset by 128 (unsigned),
    /// which adds that to every sum.
    I8 {
        blocks: Vec<i8>,
        scale: Vec<f32>,
        bias: Vec<i32>,
    },
}

impl Heads {
    /// The heads of `leaders` (`dim` wide): bytes where the CPU has AVX512-VNNI and the
    /// rows are wide enough, else f32.
    pub(super) fn new(leaders: &[f32], dim: usize) -> Heads {
        match vnni() && dim >= SCREEN_I8 {
            true => Heads::quantised(leaders, dim),
            false => Heads::F32(in_blocks(leaders, dim, SCREEN)),
        }
    }

    /// [`Heads::I8`] of `leaders`, whatever the CPU (its kernel is then the portable one).
    pub(super) fn quantised(leaders: &[f32], dim: usize) -> Heads {
        assert!(dim >= SCREEN_I8, "rows of at least {SCREEN_I8} coordinates");
        let k = leaders.len() / dim;
        let padded = k.div_ceil(BLOCK) * BLOCK;
        let mut blocks = vec![0i8; padded * SCREEN_I8];
        let (mut scale, mut bias) = (vec![0.0f32; padded], vec![0i32; padded]);
        for (j, l) in leaders.chunks_exact(dim).enumerate() {
            let head = &l[..SCREEN_I8];
            let s = scale_of(head);
            let blk = &mut blocks[(j / BLOCK) * BLOCK * SCREEN_I8..][..BLOCK * SCREEN_I8];
            let mut sum = 0i32;
            for (c, &v) in head.iter().enumerate() {
                let q = quantised(v, s);
                blk[((c / 4) * BLOCK + j % BLOCK) * 4 + c % 4] = q as i8;
                sum += q;
            }
            scale[j] = s;
            bias[j] = 128 * sum;
        }
        Heads::I8 {
            blocks,
            scale,
            bias,
        }
    }
}

/// A head's step: its largest magnitude over 127 (0 for a zero head).
fn scale_of(head: &[f32]) -> f32 {
    head.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0
}

/// `v` in steps of `s`, rounded, within -127..=127 (0 where the step is 0).
fn quantised(v: f32, s: f32) -> i32 {
    match s > 0.0 {
        true => ((v / s).round() as i32).clamp(-127, 127),
        false => 0,
    }
}

/// For each row of `x` (`dim` wide), the best of the [`SCREEN_BEST`] leaders whose products
/// over the first coordinates (`heads`, of `leaders`) are largest: its index and whole f32
/// dot product (the larger product, then the lower index). Each block of leaders (6 KB in
/// f32, 2 KB in bytes: it stays in the L1 cache) is met by all the rows, four at a time
/// (1M 384-D vectors against 33,875 leaders: 27 s, 36 s with the rows meeting 1,024
/// leaders at a time from the L2 cache).
pub(super) fn screen(x: &[f32], dim: usize, leaders: &[f32], heads: &Heads) -> Vec<(u32, f32)> {
    let (blocks, scale, bias) = match heads {
        Heads::F32(h) => return screen_f32(x, dim, leaders, h, SCREEN),
        Heads::I8 {
            blocks,
            scale,
            bias,
        } => (blocks, scale, bias),
    };
    let (k, m) = (leaders.len() / dim, x.len() / dim);
    // Each row's head in bytes, offset by 128: its own step cancels from its ranking.
    let mut qx = vec![0u8; m * SCREEN_I8];
    for (q, p) in qx.chunks_exact_mut(SCREEN_I8).zip(x.chunks_exact(dim)) {
        let s = scale_of(&p[..SCREEN_I8]);
        for (q, &v) in q.iter_mut().zip(p) {
            *q = (quantised(v, s) + 128) as u8;
        }
    }
    let mut top = vec![[(f32::NEG_INFINITY, 0u32); SCREEN_BEST]; m];
    let mut four = [0.0f32; 4 * BLOCK];
    for (b, blk) in blocks.chunks_exact(BLOCK * SCREEN_I8).enumerate() {
        let scale: &[f32; BLOCK] = scale[b * BLOCK..][..BLOCK].try_into().expect("a block");
        let bias: &[i32; BLOCK] = bias[b * BLOCK..][..BLOCK].try_into().expect("a block");
        // The block's real leaders, a bit each.
        let real = match k - b * BLOCK {
            l if l >= BLOCK => u32::MAX,
            l => (1u32 << l) - 1,
        };
        for v in (0..m).step_by(4) {
            let w = [v, v + 1, v + 2, v + 3].map(|w| w.min(m - 1));
            let low = w.map(|w| top[w][SCREEN_BEST - 1].0);
            let heads = w.map(|w| &qx[w * SCREEN_I8..][..SCREEN_I8]);
            let over = heads_block4_i8(heads, blk, (bias, scale), low, &mut four);
            // The last row repeated where fewer than four are left: once.
            for (i, &w) in w.iter().enumerate().take(m - v) {
                let mut lanes = over[i] & real;
                while lanes != 0 {
                    let l = lanes.trailing_zeros() as usize;
                    lanes &= lanes - 1;
                    insert(&mut top[w], four[i * BLOCK + l], (b * BLOCK + l) as u32);
                }
            }
        }
    }
    completed(x, dim, leaders, &top)
}

/// [`screen`] over f32 heads: `heads` holds the leaders' first `pre` >= `SCREEN`
/// coordinates ([`in_blocks`]), of which the first [`SCREEN`] are read.
pub(super) fn screen_f32(
    x: &[f32],
    dim: usize,
    leaders: &[f32],
    heads: &[f32],
    pre: usize,
) -> Vec<(u32, f32)> {
    let (k, m) = (leaders.len() / dim, x.len() / dim);
    let mut top = vec![[(f32::NEG_INFINITY, 0u32); SCREEN_BEST]; m];
    let mut four = [0.0f32; 4 * BLOCK];
    for (b, blk) in heads.chunks_exact(BLOCK * pre).enumerate() {
        let blk = &blk[..BLOCK * SCREEN];
        for v in (0..m).step_by(4) {
            let w = [v, v + 1, v + 2, v + 3].map(|w| w.min(m - 1));
            heads_block4(w.map(|w| &x[w * dim..][..SCREEN]), blk, &mut four);
            offer(&mut top, w, m - v, &four, b * BLOCK, k);
        }
    }
    completed(x, dim, leaders, &top)
}

/// Rows `w`'s head products with the block of leaders from `first` (`four[i * BLOCK + l]`,
/// of `k` leaders in all) offered to their [`SCREEN_BEST`] largest so far (`top`, in
/// decreasing order). Where fewer than four rows were `left`, the last was repeated: once.
#[inline]
fn offer(
    top: &mut [[(f32, u32); SCREEN_BEST]],
    w: [usize; 4],
    left: usize,
    four: &[f32; 4 * BLOCK],
    first: usize,
    k: usize,
) {
    for (i, &w) in w.iter().enumerate().take(left) {
        let t = &mut top[w];
        // All lanes counted at once (the padding's too: skipped below).
        let all: &[f32; BLOCK] = four[i * BLOCK..][..BLOCK].try_into().expect("a block");
        let low = t[SCREEN_BEST - 1].0;
        if all.iter().fold(0u32, |a, &h| a + (h > low) as u32) == 0 {
            continue;
        }
        for (l, &h) in all[..BLOCK.min(k - first)].iter().enumerate() {
            insert(t, h, (first + l) as u32);
        }
    }
}

/// Leader `j`'s head product `h` into a row's [`SCREEN_BEST`] largest (`t`, decreasing),
/// after those equal to it.
#[inline]
fn insert(t: &mut [(f32, u32); SCREEN_BEST], h: f32, j: u32) {
    if h > t[SCREEN_BEST - 1].0 {
        let at = t.iter().position(|e| h > e.0).unwrap_or(SCREEN_BEST - 1);
        t.copy_within(at..SCREEN_BEST - 1, at + 1);
        t[at] = (h, j);
    }
}

/// Each row's best of its `top` leaders by whole f32 dot product (the larger, then the
/// lower index).
fn completed(
    x: &[f32],
    dim: usize,
    leaders: &[f32],
    top: &[[(f32, u32); SCREEN_BEST]],
) -> Vec<(u32, f32)> {
    x.chunks_exact(dim)
        .zip(top)
        .map(|(p, t)| {
            t.iter()
                .filter(|e| e.0 > f32::NEG_INFINITY)
                .map(|&(_, j)| (j, dot(p, &leaders[j as usize * dim..][..dim])))
                .fold((0u32, f32::NEG_INFINITY), |best, (j, d)| {
                    match d > best.1 || (d == best.1 && j < best.0) {
                        true => (j, d),
                        false => best,
                    }
                })
        })
        .collect()
}
