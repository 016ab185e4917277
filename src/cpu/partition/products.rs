//! The f32 dot products of unit copies that the grouped cosine join and kNN compute, and
//! what bounds their errors: one pair at a time ([`dot`], [`dot4`]), a block of rows
//! coordinate by coordinate ([`heads_block`], [`Blocked`]), and products completed past
//! their first coordinates only where Cauchy-Schwarz on the rest can lift them to a floor
//! ([`Bounded`]); the slack of an f32 or f16 product ([`dot_slack`], [`dot_slack_f16`]) and
//! the distance floors it gives ([`dist_floor`], [`pivot_floor`]). AVX2/FMA and AVX-512
//! kernels where the CPU has them, chosen at run time.

/// `sum a_i b_i` in f32, in any order (the bounds below hold for any): with AVX2 and FMA
/// where the CPU has them, else over eight lanes.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { dot_fma(a, b) };
    }
    dot_lanes(a, b)
}

/// Whether AVX2 and FMA are available (detected once).
#[cfg(target_arch = "x86_64")]
pub(super) fn fma() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(crate::cpu::dot_filter::fma_available)
}

/// [`dot`] with 256-bit fused multiply-adds, four accumulators (enough to hide the
/// multiply-add's latency).
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (t, acc) in s.iter_mut().enumerate() {
            // SAFETY: i + 32 <= n, so the 8 floats at i + 8t (t < 4) are within both.
            unsafe {
                *acc = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8 * t)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8 * t)),
                    *acc,
                );
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            s[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                s[0],
            );
        }
        i += 8;
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe {
        _mm256_storeu_ps(
            lanes.as_mut_ptr(),
            _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])),
        )
    };
    let mut s = lanes.iter().sum::<f32>();
    for k in i..n {
        s += a[k] * b[k];
    }
    s
}

/// [`dot`] of `p` with four rows at once (the same sums in another order, so the same
/// bounds hold): `p` is loaded once for the four, and the four sums run side by side.
#[inline]
pub(crate) fn dot4(p: &[f32], r: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { dot4_fma(p, r) };
    }
    r.map(|x| dot_lanes(p, x))
}

/// [`dot4`] with 256-bit fused multiply-adds.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_fma(p: &[f32], r: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = r.iter().fold(p.len(), |n, x| n.min(x.len()));
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, within `p` and every row of `r`.
        unsafe {
            let x = _mm256_loadu_ps(p.as_ptr().add(i));
            for j in 0..4 {
                acc[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(r[j].as_ptr().add(i)), acc[j]);
            }
        }
        i += 8;
    }
    let mut out = [0.0f32; 4];
    for j in 0..4 {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j]) };
        let mut s = lanes.iter().sum::<f32>();
        for t in i..n {
            s += p[t] * r[j][t];
        }
        out[j] = s;
    }
    out
}

/// The products of four rows `q` with four rows `r` (`out[b][a]`: `r[b]`'s with `q[a]`),
/// the same sums as [`dot`]'s in another order (so the same bounds hold): with AVX-512,
/// sixteen sums side by side, each row loaded once for four products (the kNN's queries of
/// one group meeting a group's members: half the loads of [`dot4`] a product, and enough
/// independent sums to hide the multiply-add's latency); else four [`dot4`]s.
#[inline]
pub(crate) fn dot4x4(q: [&[f32]; 4], r: [&[f32]; 4]) -> [[f32; 4]; 4] {
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    if avx512() {
        // SAFETY: AVX-512F was detected at run time.
        return unsafe { dot4x4_avx512(q, r) };
    }
    let by_q = q.map(|q| dot4(q, r));
    std::array::from_fn(|b| std::array::from_fn(|a| by_q[a][b]))
}

/// [`dot4x4`] with 512-bit fused multiply-adds: sixteen accumulators of sixteen lanes, the
/// coordinates past the last multiple of 16 by masked loads (zeros add nothing).
///
/// # Safety
/// AVX-512F must be available.
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn dot4x4_avx512(q: [&[f32]; 4], r: [&[f32]; 4]) -> [[f32; 4]; 4] {
    use std::arch::x86_64::*;
    let n = q
        .iter()
        .chain(r.iter())
        .fold(usize::MAX, |n, x| n.min(x.len()));
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut i = 0;
    while i < n {
        // The lanes i + l < n (all 16 but in the last step).
        let mask = match n - i >= 16 {
            true => 0xffff,
            false => ((1u32 << (n - i)) - 1) as __mmask16,
        };
        // SAFETY: `mask` covers only lanes i + l < n, within every row of `q` and `r` (a
        // masked load reads no lane outside its mask).
        unsafe {
            let x = [
                _mm512_maskz_loadu_ps(mask, q[0].as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, q[1].as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, q[2].as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, q[3].as_ptr().add(i)),
            ];
            for (b, v) in r.iter().enumerate() {
                let y = _mm512_maskz_loadu_ps(mask, v.as_ptr().add(i));
                for a in 0..4 {
                    acc[4 * b + a] = _mm512_fmadd_ps(x[a], y, acc[4 * b + a]);
                }
            }
        }
        i += 16;
    }
    let mut out = [[0.0f32; 4]; 4];
    for (b, o) in out.iter_mut().enumerate() {
        for (a, s) in o.iter_mut().enumerate() {
            *s = _mm512_reduce_add_ps(acc[4 * b + a]);
        }
    }
    out
}

/// [`dot`] over eight lanes (vectorised by the compiler).
#[inline]
pub(super) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Exact-enough Euclidean distance in f64 between two f32 rows.
pub(super) fn dist64(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = x as f64 - y as f64;
            d * d
        })
        .sum::<f64>()
        .sqrt()
}

/// The slack of a comparison through an f32 dot product of two f32 copies of unit vectors:
/// their squared norms are within (dim + 2) u_f32 of 1 (rounded unit vectors) and the f32
/// dot product (any order) within (dim + 2) u_f32 |a| |b| of the real one, so
/// `|a - b|^2 >= 2 - 2 dot - 2 slack` with room (the slack covers each error twice, and
/// the f64 arithmetic that evaluates the bound).
pub(crate) fn dot_slack(dim: usize) -> f64 {
    let u = f32::EPSILON as f64 / 2.0;
    4.0 * (dim as f64 + 4.0) * u
}

/// The slack of the same comparison where the dot product is taken on a GPU's matrix units
/// (glsl/grouped_tiles_coop.comp): f16 copies of the f32 rows scaled by 2^8, their exact
/// products summed in f32. On top of [`dot_slack`] (the f32 copies' norms, an f32 sum):
/// - each coordinate's conversion: within one f16 ulp (`u` = 2^-10 relative, any rounding
///   mode), or 2^-22 absolute below f16's normal range once unscaled (a device may flush);
///   so `|a.b - a'.b'| <= (2u + u^2) |a||b| + (1 + u) 2^-22 sqrt(d) (|a| + |b|) + d 2^-44`,
///   counted twice;
/// - the accumulation: matrix units may align a block's terms to its largest and truncate
///   (one ulp a term, not half), taken as `4 (d + 16) 2^-23 sum |a'_i b'_i|`, twice the
///   f32 sum's bound in [`dot_slack`] at a full ulp.
///
/// The norms are at most `sqrt(1 + (d + 2) 2^-24)` (f32 copies of unit vectors).
pub(crate) fn dot_slack_f16(dim: usize) -> f64 {
    let d = dim as f64;
    let u = 2f64.powi(-10);
    let tiny = 2f64.powi(-22);
    let norm = (1.0 + (d + 2.0) * 2f64.powi(-24)).sqrt();
    let input = (2.0 * u + u * u) * norm * norm
        + (1.0 + u) * tiny * d.sqrt() * 2.0 * norm
        + d * tiny * tiny;
    let sum_abs = (norm * (1.0 + u) + tiny * d.sqrt()).powi(2);
    let accumulate = 4.0 * (d + 16.0) * 2f64.powi(-23) * sum_abs;
    dot_slack(dim) + 2.0 * input + accumulate
}

/// A lower bound on the real Euclidean distance of two f32 copies of unit vectors whose
/// f32 dot product (by [`dot`]) is `dot` (see [`dot_slack`]).
#[inline]
pub(crate) fn dist_floor(dot: f32, slack: f64) -> f64 {
    (2.0 - 2.0 * dot as f64 - 2.0 * slack).max(0.0).sqrt()
}

/// A lower bound on the real Euclidean distance of an f32 copy of a unit vector from an f32
/// point of squared norm `n2` (f64; at most about 1: a mean of such copies) whose f32 dot
/// product by [`dot`] is `dot`: `|q - c|^2 = |q|^2 + |c|^2 - 2 q.c`, where |q|^2 is within
/// (dim + 2) u_f32 of 1 and the dot product within (dim + 2) u_f32 |q| |c| of the real one,
/// both inside [`dot_slack`] twice. [`dist_floor`] is the case `n2 = 1`.
#[inline]
pub(crate) fn pivot_floor(dot: f32, n2: f64, slack: f64) -> f64 {
    (1.0 + n2 - 2.0 * dot as f64 - 2.0 * slack).max(0.0).sqrt()
}

/// Leaders per block of [`heads_block`].
pub(super) const BLOCK: usize = 32;

/// The first `pre` coordinates of `rows` (`dim` wide) in blocks of [`BLOCK`] rows,
/// coordinate by coordinate, as [`heads_block`] reads them (the last block padded with
/// zero rows).
pub(super) fn in_blocks(rows: &[f32], dim: usize, pre: usize) -> Vec<f32> {
    let n = rows.len() / dim;
    let mut out = vec![0.0f32; n.div_ceil(BLOCK) * BLOCK * pre];
    for (j, l) in rows.chunks_exact(dim).enumerate() {
        let blk = &mut out[(j / BLOCK) * BLOCK * pre..][..BLOCK * pre];
        for (c, &v) in l[..pre].iter().enumerate() {
            blk[c * BLOCK + j % BLOCK] = v;
        }
    }
    out
}

/// The dot products of two rows `p`, `q` with a block of [`BLOCK`] rows stored coordinate
/// by coordinate (`blk[c * BLOCK + l]` is row l's coordinate c), into `out` (`p`'s, then
/// `q`'s): one product per lane, with no sum across lanes, so short rows cost no more per
/// coordinate than long ones.
#[inline]
pub(super) fn heads_block(p: &[f32], q: &[f32], blk: &[f32], out: &mut [f32; 2 * BLOCK]) {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { heads_block_fma(p, q, blk, out) };
    }
    out.fill(0.0);
    for ((&x, &y), row) in p.iter().zip(q).zip(blk.chunks_exact(BLOCK)) {
        for l in 0..BLOCK {
            out[l] += x * row[l];
            out[BLOCK + l] += y * row[l];
        }
    }
}

/// [`heads_block`] with 256-bit fused multiply-adds: eight accumulators of eight lanes
/// (enough to hide the multiply-add's latency), each block row loaded once for both.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads_block_fma(p: &[f32], q: &[f32], blk: &[f32], out: &mut [f32; 2 * BLOCK]) {
    use std::arch::x86_64::*;
    let n = p.len().min(q.len()).min(blk.len() / BLOCK);
    let mut a = [_mm256_setzero_ps(); 4];
    let mut b = [_mm256_setzero_ps(); 4];
    for c in 0..n {
        // SAFETY: c < n, within `p`, `q`, and the block's row c * BLOCK .. (c + 1) * BLOCK.
        unsafe {
            let x = _mm256_set1_ps(*p.get_unchecked(c));
            let y = _mm256_set1_ps(*q.get_unchecked(c));
            let row = blk.as_ptr().add(c * BLOCK);
            for t in 0..4 {
                let r = _mm256_loadu_ps(row.add(8 * t));
                a[t] = _mm256_fmadd_ps(x, r, a[t]);
                b[t] = _mm256_fmadd_ps(y, r, b[t]);
            }
        }
    }
    for t in 0..4 {
        // SAFETY: `out` holds 2 * BLOCK = 64 floats: lanes 8t.. and BLOCK + 8t.. are within.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), a[t]);
            _mm256_storeu_ps(out.as_mut_ptr().add(BLOCK + 8 * t), b[t]);
        }
    }
}

/// Whether [`heads_block4`] runs its AVX-512 kernel (as the kNN filter's `Kernel::detect`
/// chooses: built by Rust >= 1.89, the CPU has AVX-512F, SIMJOIN_NO_AVX512 unset).
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
pub(super) fn avx512() -> bool {
    use crate::cpu::dot_filter::Kernel;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| Kernel::detect() == Kernel::Avx512)
}

/// [`heads_block`] for four rows (`out[i * BLOCK + l]`: row i's product with block row l):
/// with AVX-512, each block row is loaded once for the four; else two [`heads_block`]s.
/// Every lane sums its coordinates in order with fused multiply-adds either way, so the
/// products are the same.
#[inline]
pub(super) fn heads_block4(r: [&[f32]; 4], blk: &[f32], out: &mut [f32; 4 * BLOCK]) {
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    if avx512() {
        // SAFETY: AVX-512F was detected at run time.
        return unsafe { heads_block4_avx512(r, blk, out) };
    }
    let (a, b) = out.split_at_mut(2 * BLOCK);
    heads_block(r[0], r[1], blk, a.try_into().expect("2 * BLOCK"));
    heads_block(r[2], r[3], blk, b.try_into().expect("2 * BLOCK"));
}

/// [`heads_block4`] with 512-bit fused multiply-adds: eight accumulators of sixteen lanes
/// (a block row in two registers, four rows), enough to hide the multiply-add's latency.
///
/// # Safety
/// AVX-512F must be available.
// Built only by compilers that have these intrinsics (build.rs sets simjoin_avx512).
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn heads_block4_avx512(r: [&[f32]; 4], blk: &[f32], out: &mut [f32; 4 * BLOCK]) {
    use std::arch::x86_64::*;
    let n = r.iter().fold(blk.len() / BLOCK, |n, x| n.min(x.len()));
    let mut acc = [_mm512_setzero_ps(); 8];
    for c in 0..n {
        // SAFETY: c < n: within every row of `r` and the block's row c * BLOCK ..
        // (c + 1) * BLOCK (BLOCK = 32 floats: two loads of 16).
        unsafe {
            let row = blk.as_ptr().add(c * BLOCK);
            let (lo, hi) = (_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16)));
            for i in 0..4 {
                let x = _mm512_set1_ps(*r[i].get_unchecked(c));
                acc[2 * i] = _mm512_fmadd_ps(x, lo, acc[2 * i]);
                acc[2 * i + 1] = _mm512_fmadd_ps(x, hi, acc[2 * i + 1]);
            }
        }
    }
    for (j, a) in acc.into_iter().enumerate() {
        // SAFETY: `out` holds 4 * BLOCK = 128 floats: lanes 16 j .. 16 j + 16 are within.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * j), a) };
    }
}

/// Coordinates of the int8 screen's heads ([`heads_block4_i8`]): a multiple of four
/// (each lane of `vpdpbusd` sums four byte products).
pub(super) const SCREEN_I8: usize = 64;

/// Whether [`heads_block4_i8`] runs its AVX-512 VNNI kernel: [`avx512`], the CPU has
/// AVX512-VNNI, and SIMJOIN_NO_VNNI is unset (which keeps the f32 screen, for comparison).
pub(crate) fn vnni() -> bool {
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            avx512()
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::env::var_os("SIMJOIN_NO_VNNI").is_none()
        })
    }
    #[cfg(not(all(target_arch = "x86_64", simjoin_avx512)))]
    false
}

/// The screen's estimates of four rows' head products with a block of [`BLOCK`] leaders,
/// from bytes: the rows' heads `r` (unsigned, [`SCREEN_I8`] apiece) and the block's `blk`
/// (signed, four coordinates a lane: `blk[(g * BLOCK + l) * 4 + t]` is leader l's
/// coordinate 4g + t). Each sum of byte products is exact in i32 (at most 64 x 255 x 127);
/// leader l's estimate is `(sum - bias[l]) * scale[l]` in f32 (the difference exact below
/// 2^24), into `out[i * BLOCK + l]`. Returns for each row i the lanes whose estimate
/// exceeds `low[i]`, a bit a lane. Every kernel gives the same values and lanes.
#[inline]
pub(super) fn heads_block4_i8(
    r: [&[u8]; 4],
    blk: &[i8],
    (bias, scale): (&[i32; BLOCK], &[f32; BLOCK]),
    low: [f32; 4],
    out: &mut [f32; 4 * BLOCK],
) -> [u32; 4] {
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    if vnni() {
        // SAFETY: AVX-512F and AVX512-VNNI were detected at run time.
        return unsafe { heads_block4_vnni(r, blk, (bias, scale), low, out) };
    }
    heads_block4_i8_portable(r, blk, (bias, scale), low, out)
}

/// [`heads_block4_i8`] one integer product at a time.
pub(super) fn heads_block4_i8_portable(
    r: [&[u8]; 4],
    blk: &[i8],
    (bias, scale): (&[i32; BLOCK], &[f32; BLOCK]),
    low: [f32; 4],
    out: &mut [f32; 4 * BLOCK],
) -> [u32; 4] {
    let n = r
        .iter()
        .fold(blk.len() / (4 * BLOCK), |n, x| n.min(x.len() / 4));
    let mut over = [0u32; 4];
    for (i, x) in r.iter().enumerate() {
        for l in 0..BLOCK {
            let sum: i32 = (0..4 * n)
                .map(|c| x[c] as i32 * blk[((c / 4) * BLOCK + l) * 4 + c % 4] as i32)
                .sum();
            let e = (sum - bias[l]) as f32 * scale[l];
            out[i * BLOCK + l] = e;
            over[i] |= ((e > low[i]) as u32) << l;
        }
    }
    over
}

/// [`heads_block4_i8`] with `vpdpbusd`: four byte products summed into each of sixteen
/// i32 lanes an instruction, eight accumulators (a block in two registers, four rows);
/// then the estimates and their comparisons sixteen lanes at a time.
///
/// # Safety
/// AVX-512F and AVX512-VNNI must be available.
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn heads_block4_vnni(
    r: [&[u8]; 4],
    blk: &[i8],
    (bias, scale): (&[i32; BLOCK], &[f32; BLOCK]),
    low: [f32; 4],
    out: &mut [f32; 4 * BLOCK],
) -> [u32; 4] {
    use std::arch::x86_64::*;
    let n = r
        .iter()
        .fold(blk.len() / (4 * BLOCK), |n, x| n.min(x.len() / 4));
    let mut acc = [_mm512_setzero_si512(); 8];
    for g in 0..n {
        // SAFETY: g < n: the block's bytes g * 128 .. (g + 1) * 128 (two loads of 64) and
        // each row's bytes 4g .. 4g + 4 are within their slices.
        unsafe {
            let at = blk.as_ptr().add(g * 4 * BLOCK);
            let lo = _mm512_loadu_si512(at as *const _);
            let hi = _mm512_loadu_si512(at.add(64) as *const _);
            for i in 0..4 {
                let four = std::ptr::read_unaligned(r[i].as_ptr().add(4 * g) as *const i32);
                let x = _mm512_set1_epi32(four);
                acc[2 * i] = _mm512_dpbusd_epi32(acc[2 * i], x, lo);
                acc[2 * i + 1] = _mm512_dpbusd_epi32(acc[2 * i + 1], x, hi);
            }
        }
    }
    let mut over = [0u32; 4];
    // SAFETY: `bias` and `scale` hold BLOCK = 32 lanes (two loads of 16 each), `out` 4 *
    // BLOCK: lanes 32 i .. 32 i + 32 are within.
    unsafe {
        let bias = [0, 16].map(|h| _mm512_loadu_si512(bias.as_ptr().add(h) as *const _));
        let scale = [0, 16].map(|h| _mm512_loadu_ps(scale.as_ptr().add(h)));
        for i in 0..4 {
            let low = _mm512_set1_ps(low[i]);
            for h in 0..2 {
                let e = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[2 * i + h], bias[h]));
                let e = _mm512_mul_ps(e, scale[h]);
                _mm512_storeu_ps(out.as_mut_ptr().add(i * BLOCK + 16 * h), e);
                over[i] |= (_mm512_cmp_ps_mask::<_CMP_GT_OQ>(e, low) as u32) << (16 * h);
            }
        }
    }
    over
}

/// Rows stored for products of four rows with every one of them at a time (queries' with
/// every pivot of the kNN's index): all coordinates in blocks of [`BLOCK`] ([`in_blocks`]),
/// so that [`heads_block4`] reads each block row once for the four.
pub(crate) struct Blocked {
    blocks: Vec<f32>,
    rows: usize,
    dim: usize,
}

impl Blocked {
    pub(crate) fn new(rows: &[f32], dim: usize) -> Blocked {
        Blocked {
            blocks: in_blocks(rows, dim, dim),
            rows: rows.len() / dim,
            dim,
        }
    }
    /// [`Blocked::new`] of the first `pre` coordinates of each row only: [`Blocked::dots`]
    /// then gives the products over those coordinates.
    pub(crate) fn prefix(rows: &[f32], dim: usize, pre: usize) -> Blocked {
        Blocked {
            blocks: in_blocks(rows, dim, pre),
            rows: rows.len() / dim,
            dim: pre,
        }
    }
    /// The f32 dot products of each of `r` (`dim` wide) with every row, into `out` (row
    /// i's at `out[i * rows..]`): the same sums as [`dot`]'s in another order, so the same
    /// bounds hold.
    pub(crate) fn dots(&self, r: [&[f32]; 4], out: &mut [f32]) {
        let n = self.rows;
        assert_eq!(out.len(), 4 * n, "four rows of products");
        let mut four = [0.0f32; 4 * BLOCK];
        for (b, blk) in self.blocks.chunks_exact(BLOCK * self.dim).enumerate() {
            heads_block4(r, blk, &mut four);
            let width = BLOCK.min(n - b * BLOCK);
            for i in 0..4 {
                out[i * n + b * BLOCK..][..width].copy_from_slice(&four[i * BLOCK..][..width]);
            }
        }
    }
}

impl Blocked {
    /// [`Blocked::dots`] of every row of `tile` (`dim` wide, at most a few dozen), into
    /// `out` (row i's at `out[i * rows..]`), each block of the stored rows met by all of
    /// the tile's before the next: the block stays in the L1 cache, the tile in L2. Four
    /// rows at a time against all the stored ones read them from memory once per four
    /// (30,000 384-D pivots: 46 MB a time, and every pair of them took 26 s, not 7).
    pub(crate) fn dots_tile(&self, tile: &[f32], out: &mut [f32]) {
        let (n, m) = (self.rows, tile.len() / self.dim);
        assert_eq!(out.len(), m * n, "a row of products for each of the tile's");
        let row = |w: usize| &tile[w.min(m - 1) * self.dim..][..self.dim];
        let mut four = [0.0f32; 4 * BLOCK];
        for (b, blk) in self.blocks.chunks_exact(BLOCK * self.dim).enumerate() {
            let width = BLOCK.min(n - b * BLOCK);
            for v in (0..m).step_by(4) {
                heads_block4([row(v), row(v + 1), row(v + 2), row(v + 3)], blk, &mut four);
                for i in 0..4.min(m - v) {
                    out[(v + i) * n + b * BLOCK..][..width]
                        .copy_from_slice(&four[i * BLOCK..][..width]);
                }
            }
        }
    }
}

/// Rows (f32 copies of unit vectors) whose products with other such rows are completed
/// only where they can reach a floor: first over the first [`Bounded::pre`] coordinates (in
/// [`Blocked`]'s layout, four queries by a block of [`BLOCK`] rows), then over the rest only
/// for the rows where Cauchy-Schwarz on the rest (the two rows' norms over it) leaves the
/// product at or above its query's floor: a block at a time where many of its rows are
/// left, one row at a time where few are. On clustered data a query's floor (its k-th
/// neighbour's product) is far above what the rest can add to a far row's head, so about
/// a quarter of the products' work is done.
pub(crate) struct Bounded<'r> {
    rows: Blocked,
    /// The same rows, one after the other (for the rows completed one at a time).
    each: &'r [f32],
    pre: usize,
    /// Each row's norm over its coordinates from `pre` on, rounded up ([`Bounded::rest`]).
    rest: Vec<f32>,
    /// What the f32 roundings may add to a product beyond its head and the rest's bound.
    margin: f32,
}

/// Rows left in a block (of its 4 x [`BLOCK`] products) up to which [`Bounded::dots_above`]
/// completes them one at a time: a row's rest alone runs at about a quarter of the
/// block's rate a product.
const EACH_MAX: usize = 24;

impl<'r> Bounded<'r> {
    /// Rows a block of [`Bounded::dots_above`] holds.
    pub(crate) const BLOCK: usize = BLOCK;

    /// Where the products split: a quarter of the coordinates (a multiple of 8) in 64
    /// dimensions or more, all of them below (the bound then saves nothing).
    pub(crate) fn pre(dim: usize) -> usize {
        match dim >= 64 {
            true => dim / 4 / 8 * 8,
            false => dim,
        }
    }
    /// The norm of `p` over its coordinates from `pre` on, rounded up: their f32 sum of
    /// squares ([`dot`], any order) is within (d + 2) u_f32 of the real one, relative (d
    /// terms, none negative), so widened by (d + 4) u_f32 it is at least the real one; the
    /// root in f64, widened for its rounding and rounded up to f32.
    pub(crate) fn rest(p: &[f32], pre: usize) -> f32 {
        let t = &p[pre..];
        let u = f32::EPSILON as f64 / 2.0;
        let sq = dot(t, t).max(0.0) as f64 * (1.0 + (t.len() as f64 + 4.0) * u);
        let s = sq.sqrt() * (1.0 + 1e-12);
        let f = s as f32;
        if (f as f64) < s {
            f.next_up()
        } else {
            f
        }
    }
    pub(crate) fn new(rows: &'r [f32], dim: usize) -> Bounded<'r> {
        let pre = Bounded::pre(dim);
        // The f32 product d of unit copies a, b (norms at most 1 + (dim + 2) u, so |a||b|
        // <= 2), in any order, is within (dim + 2) u |a||b| of the real one (as for
        // `dot_slack`), and so is the head h over the first `pre` coordinates of the real
        // head; the rest's real product is at most rest(a) rest(b) (Cauchy-Schwarz). So
        // d <= h + rest(a) rest(b) + 4 (dim + 2) u, and the f32 sum of h and the norms'
        // product and the floor less the margin round by at most 2^-24 * 3 each: 1e-6
        // covers them.
        let u = f32::EPSILON as f64 / 2.0;
        let margin = (4.0 * (dim as f64 + 2.0) * u + 1e-6) as f32;
        Bounded {
            rows: Blocked::new(rows, dim),
            each: rows,
            pre,
            rest: rows
                .chunks_exact(dim)
                .map(|p| Bounded::rest(p, pre))
                .collect(),
            margin,
        }
    }
    /// The f32 dot products of the four rows `r` (with their [`Bounded::rest`] norms
    /// `rest`) with the rows of the blocks of [`BLOCK`] rows it lists in `done` (block b:
    /// rows `b * BLOCK..`), into `out` as [`Blocked::dots`] does, except that a row whose
    /// product with `r[i]` (in any order) is proven below `below[i]` may get minus
    /// infinity; every row of the other blocks has such a proof for all four, and its
    /// products are left as they were. Returns the products completed past the first
    /// coordinates.
    pub(crate) fn dots_above(
        &self,
        r: [&[f32]; 4],
        rest: [f32; 4],
        below: [f32; 4],
        out: &mut [f32],
        done: &mut Vec<u32>,
    ) -> usize {
        let (n, dim, pre) = (self.rows.rows, self.rows.dim, self.pre);
        assert_eq!(out.len(), 4 * n, "four rows of products");
        done.clear();
        // Nothing to prune (no floor yet, or one no head can miss): the products whole.
        if pre == dim || below.iter().all(|&b| b <= -2.0) {
            self.rows.dots(r, out);
            done.extend(0..n.div_ceil(BLOCK) as u32);
            return 4 * n;
        }
        let mut completed = 0;
        let at = below.map(|b| b - self.margin);
        let (mut head, mut tail) = ([0.0f32; 4 * BLOCK], [0.0f32; 4 * BLOCK]);
        for (b, blk) in self.rows.blocks.chunks_exact(BLOCK * dim).enumerate() {
            heads_block4(r.map(|r| &r[..pre]), blk, &mut head);
            let width = BLOCK.min(n - b * BLOCK);
            let rs = &self.rest[b * BLOCK..][..width];
            // Counted first (vectorised), the rows marked only in the few blocks with some.
            let count = (0..4).fold(0u32, |c, i| {
                let h = &head[i * BLOCK..][..width];
                h.iter()
                    .zip(rs)
                    .fold(c, |c, (&h, &q)| c + (h + rest[i] * q >= at[i]) as u32)
            }) as usize;
            if count == 0 {
                continue;
            }
            done.push(b as u32);
            if count > EACH_MAX {
                completed += 4 * width;
                heads_block4(r.map(|r| &r[pre..]), &blk[pre * BLOCK..], &mut tail);
                for i in 0..4 {
                    let o = &mut out[i * n + b * BLOCK..][..width];
                    for (l, o) in o.iter_mut().enumerate() {
                        *o = head[i * BLOCK + l] + tail[i * BLOCK + l];
                    }
                }
                continue;
            }
            for i in 0..4 {
                let o = &mut out[i * n + b * BLOCK..][..width];
                for (l, o) in o.iter_mut().enumerate() {
                    *o = match head[i * BLOCK + l] + rest[i] * rs[l] >= at[i] {
                        true => {
                            let row = &self.each[(b * BLOCK + l) * dim..][..dim];
                            head[i * BLOCK + l] + dot(&r[i][pre..], &row[pre..])
                        }
                        false => f32::NEG_INFINITY,
                    };
                }
            }
            completed += count;
        }
        completed
    }
}

/// The largest of `v` (minus infinity where empty; no NaN), over eight lanes so that it
/// vectorises.
pub(crate) fn max_of(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for c in chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    lanes.iter().fold(tail, |a, &b| a.max(b))
}

/// Rows of `dim` f32 coordinates that [`Blocked`] holds in about 1 MB (at least a block),
/// so that the rows met by many others stay in a core's L2 cache while they are: a
/// 1,024-row block of 768-D rows (3 MB) made 250 queries' products with 99,750 rows take
/// about twice the 384-D ones' time, not 1.
pub(crate) fn cached_rows(dim: usize) -> usize {
    ((1 << 18) / dim.max(1) / BLOCK).max(1) * BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::partition::tests::vectors;

    /// The int8 screen's kernel against the rule it states, computed apart: every sum of
    /// byte products, the estimate `(sum - bias) * scale` and the lanes above each row's
    /// `low`, with bytes at their extremes (0 and 255 against -127 and 127), lows at
    /// -inf, inside and above the estimates, and a short last row group. On a CPU with
    /// AVX512-VNNI this checks that kernel; elsewhere the portable one.
    #[test]
    fn int8_head_products_are_the_stated_sums() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..40 {
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|i| match (round, i) {
                    (0, _) => vec![255u8; SCREEN_I8],
                    (1, 0) => vec![0u8; SCREEN_I8],
                    _ => (0..SCREEN_I8).map(|_| next() as u8).collect(),
                })
                .collect();
            let blk: Vec<i8> = (0..SCREEN_I8 * BLOCK)
                .map(|_| match round {
                    0 => 127,
                    1 => -127,
                    _ => (next() % 255) as i8,
                })
                .collect();
            let bias: [i32; BLOCK] = std::array::from_fn(|_| (next() % 4001) as i32 - 2000);
            let scale: [f32; BLOCK] = std::array::from_fn(|_| (next() % 1000) as f32 * 1e-6);
            let r: [&[u8]; 4] = std::array::from_fn(|i| &rows[i][..]);
            // The rule, a product at a time.
            let want: Vec<f32> = (0..4 * BLOCK)
                .map(|t| {
                    let (i, l) = (t / BLOCK, t % BLOCK);
                    let sum: i64 = (0..SCREEN_I8)
                        .map(|c| rows[i][c] as i64 * blk[(c / 4 * BLOCK + l) * 4 + c % 4] as i64)
                        .sum();
                    (sum - bias[l] as i64) as f32 * scale[l]
                })
                .collect();
            let low: [f32; 4] = match round % 3 {
                0 => [f32::NEG_INFINITY; 4],
                1 => std::array::from_fn(|i| want[i * BLOCK + 7]),
                _ => [f32::INFINITY, 0.0, want[2 * BLOCK], -1e9],
            };
            for kernel in [heads_block4_i8, heads_block4_i8_portable] {
                let mut out = [f32::NAN; 4 * BLOCK];
                let over = kernel(r, &blk, (&bias, &scale), low, &mut out);
                assert_eq!(out.to_vec(), want, "round {round}");
                for i in 0..4 {
                    let lanes = (0..BLOCK)
                        .filter(|&l| want[i * BLOCK + l] > low[i])
                        .fold(0u32, |m, l| m | 1 << l);
                    assert_eq!(over[i], lanes, "round {round} row {i}");
                }
            }
        }
    }

    /// [`Bounded::dots_above`] leaves out no row whose f32 product with its query reaches
    /// the query's floor, where the bound is as tight as it gets: each query is a row's
    /// head, another direction's, plus a multiple of that row's rest (so Cauchy-Schwarz on
    /// the rest holds with equality), and its floor is that row's own f32 product (in two
    /// orders, and one f32 step above). The products of the blocks it completes are those
    /// of [`Blocked::dots`] within the f32 slack, and on such tight floors it completes
    /// few blocks of clustered rows (the point of it).
    #[test]
    fn bounded_products_keep_every_row_at_its_floor() {
        let mut skipped = 0usize;
        for (dim, n) in [(64usize, 70usize), (100, 200), (384, 300), (1024, 65)] {
            let rows = vectors(dim as u64 * 7, n, dim, 4, false);
            let other = vectors(dim as u64 * 7 + 1, 8, dim, 0, false);
            let bounded = Bounded::new(&rows, dim);
            let pre = Bounded::pre(dim);
            let slack = dot_slack(dim) as f32;
            let mut out = vec![f32::NAN; 4 * n];
            let mut whole = vec![0.0f32; 4 * n];
            let mut done = Vec::new();
            for t in 0..n.min(40) {
                // Four queries aimed at rows j[i]: the other direction's head (scaled),
                // row j's rest scaled by 0.5..2, normalised.
                let j: [usize; 4] = std::array::from_fn(|i| (t * 7 + i * 13) % n);
                let q: Vec<Vec<f32>> = (0..4)
                    .map(|i| {
                        let (r, o) = (&rows[j[i] * dim..][..dim], &other[(i % 8) * dim..][..dim]);
                        let f = 0.5 + 0.5 * i as f32;
                        let mut v: Vec<f32> = (0..dim)
                            .map(|c| if c < pre { o[c] * 0.3 } else { r[c] * f })
                            .collect();
                        let norm = v.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt();
                        v.iter_mut().for_each(|a| *a = (*a as f64 / norm) as f32);
                        v
                    })
                    .collect();
                let four: [&[f32]; 4] = std::array::from_fn(|i| &q[i][..]);
                let rest = four.map(|q| Bounded::rest(q, pre));
                let forward = |i: usize, l: usize| {
                    let r = &rows[l * dim..][..dim];
                    four[i].iter().zip(r).fold(0.0f32, |s, (a, b)| s + a * b)
                };
                let backward = |i: usize, l: usize| {
                    let r = &rows[l * dim..][..dim];
                    four[i]
                        .iter()
                        .zip(r)
                        .rev()
                        .fold(0.0f32, |s, (a, b)| s + a * b)
                };
                Blocked::new(&rows, dim).dots(four, &mut whole);
                for i in 0..4 {
                    // The bound is tight on row j[i]: its head and rest's norms give its
                    // product to within rounding.
                    let r = &rows[j[i] * dim..][..dim];
                    let bound = dot(&four[i][..pre], &r[..pre]) + rest[i] * Bounded::rest(r, pre);
                    assert!(
                        (bound - forward(i, j[i])).abs() < 1e-4,
                        "{dim}-D: not tight"
                    );
                }
                let floors = [
                    std::array::from_fn(|i| dot(four[i], &rows[j[i] * dim..][..dim])),
                    std::array::from_fn(|i| forward(i, j[i])),
                    std::array::from_fn(|i| backward(i, j[i]).next_up()),
                ];
                for below in floors {
                    let completed = bounded.dots_above(four, rest, below, &mut out, &mut done);
                    let blocks = n.div_ceil(BLOCK) as u32;
                    for b in 0..blocks {
                        let span = b as usize * BLOCK..((b as usize + 1) * BLOCK).min(n);
                        for i in 0..4 {
                            for l in span.clone() {
                                let (got, want) = (out[i * n + l], whole[i * n + l]);
                                if done.contains(&b) && got != f32::NEG_INFINITY {
                                    assert!((got - want).abs() <= slack, "{dim}-D: {got} {want}");
                                    continue;
                                }
                                let at = below[i];
                                for d in [
                                    want,
                                    forward(i, l),
                                    backward(i, l),
                                    dot(four[i], &rows[l * dim..][..dim]),
                                ] {
                                    assert!(d < at, "{dim}-D: row {l} left out at {d} >= {at}");
                                }
                            }
                        }
                    }
                    skipped += 4 * n - completed;
                }
            }
        }
        assert!(
            skipped > 1000,
            "{skipped} products left at their first coordinates"
        );
    }

    /// [`Blocked::dots`] (and so [`heads_block4`], on the widest kernel the CPU has) gives
    /// each row's product with every row of a partial last block, in its place: each lane a
    /// sum in coordinate order, fused where the CPU has FMA, as [`heads_block`] sums.
    #[test]
    fn blocked_products_are_each_lanes_ordered_sum() {
        let fused = {
            #[cfg(target_arch = "x86_64")]
            {
                fma()
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        };
        for (dim, n) in [(7usize, 1usize), (40, 33), (96, 70)] {
            let rows = vectors(dim as u64, n, dim, 3, false);
            let queries = vectors(dim as u64 + 1, 4, dim, 3, false);
            let q: [&[f32]; 4] = std::array::from_fn(|i| &queries[i * dim..(i + 1) * dim]);
            let mut out = vec![f32::NAN; 4 * n];
            Blocked::new(&rows, dim).dots(q, &mut out);
            for (i, q) in q.iter().enumerate() {
                for (j, r) in rows.chunks_exact(dim).enumerate() {
                    let want = q.iter().zip(r).fold(0.0f32, |s, (&a, &b)| match fused {
                        true => a.mul_add(b, s),
                        false => s + a * b,
                    });
                    let got = out[i * n + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "dim {dim}: {i} x {j}");
                }
            }
        }
    }

    /// [`dot4x4`] puts each pair's product in its place (`out[b][a]`: row b's with query
    /// a), within [`dot_slack`] of the exact f64 sum, at lengths around the kernels'
    /// 8- and 16-lane steps (tails of every width) and at embedding sizes.
    #[test]
    fn four_by_four_products_are_each_pairs_within_the_slack() {
        for dim in [1usize, 7, 8, 15, 16, 17, 31, 33, 384, 1023] {
            let rows = vectors(dim as u64 + 11, 4, dim, 2, false);
            let queries = vectors(dim as u64 + 12, 4, dim, 2, false);
            let q: [&[f32]; 4] = std::array::from_fn(|a| &queries[a * dim..][..dim]);
            let r: [&[f32]; 4] = std::array::from_fn(|b| &rows[b * dim..][..dim]);
            let got = dot4x4(q, r);
            for b in 0..4 {
                for a in 0..4 {
                    let exact: f64 = q[a]
                        .iter()
                        .zip(r[b])
                        .map(|(&x, &y)| x as f64 * y as f64)
                        .sum();
                    let err = (got[b][a] as f64 - exact).abs();
                    assert!(
                        err <= dot_slack(dim),
                        "{dim}-D: row {b} x query {a}: {} against {exact} (error {err:e})",
                        got[b][a]
                    );
                }
            }
        }
    }
}

/// [`dot_slack_f16`] against an emulation of the worst a matrix unit may do: every
/// coordinate (scaled by 2^8) truncated to f16 (a full ulp; below f16's normal range
/// flushed to zero), products exact, summed in blocks aligned to the block's largest term
/// and truncated to f32's 24 bits. The error must stay within the f16 terms counted once
/// (the slack counts them twice).
#[cfg(test)]
mod f16_bound_tests {
    use super::{dot_slack, dot_slack_f16};

    /// `y` truncated toward zero to f16, flushed to zero below 2^-14 (f64 arithmetic:
    /// exact for these values).
    fn f16_down(y: f64) -> f64 {
        let a = y.abs();
        if a < 2f64.powi(-14) {
            return 0.0;
        }
        let ulp = 2f64.powi(a.log2().floor() as i32 - 10);
        ((a / ulp).floor() * ulp).copysign(y)
    }

    /// `x` truncated toward zero to a 24-bit significand.
    fn f32_down(x: f64) -> f64 {
        if x == 0.0 {
            return 0.0;
        }
        let ulp = 2f64.powi(x.abs().log2().floor() as i32 - 23);
        ((x.abs() / ulp).floor() * ulp).copysign(x)
    }

    /// The emulated matrix unit's dot product of f32 rows `a`, `b` (unscaled), with
    /// blocks of `block` products added to the accumulator at a time.
    fn matrix_dot(a: &[f32], b: &[f32], block: usize) -> f64 {
        let mut acc = 0.0f64;
        let terms: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| f16_down(x as f64 * 256.0) * f16_down(y as f64 * 256.0))
            .collect();
        for chunk in terms.chunks(block) {
            let big = chunk.iter().fold(acc.abs(), |m, t| m.max(t.abs()));
            if big == 0.0 {
                continue;
            }
            // Every term (the accumulator too) truncated to the largest's 24 bits.
            let ulp = 2f64.powi(big.log2().floor() as i32 - 23);
            let cut = |t: f64| (t.abs() / ulp).floor().copysign(t) * ulp;
            acc = f32_down(chunk.iter().map(|&t| cut(t)).sum::<f64>() + cut(acc));
        }
        acc / 65536.0
    }

    /// The f32 copy of the unit vector along `v`.
    fn unit(v: &[f64]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| (x / n) as f32).collect()
    }

    fn check(a: &[f32], b: &[f32], what: &str) -> f64 {
        let d = a.len();
        let exact: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let once = (dot_slack_f16(d) - dot_slack(d)) / 2.0;
        let mut worst = 0.0f64;
        for block in [1, 4, 16] {
            let err = (exact - matrix_dot(a, b, block)).abs();
            assert!(
                err <= once,
                "{what}, {d}-D, blocks of {block}: error {err:e} > {once:e}"
            );
            worst = worst.max(err);
        }
        worst
    }

    #[test]
    fn the_f16_slack_covers_truncation_flushing_and_truncated_sums() {
        let mut state = 0x9E3779B97F4A7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for d in [2usize, 3, 16, 64, 128, 384, 768, 1024, 2048] {
            // Every coordinate just below the next f16 (scaled): truncation loses almost a
            // full ulp of each, all of one sign; one coordinate sets the norm.
            let v = 1.0 / (d as f64).sqrt() * 256.0;
            let ulp = 2f64.powi(v.log2().floor() as i32 - 10);
            let top = ((v / ulp).floor() + 0.999) * ulp / 256.0;
            let mut w = vec![top; d];
            w[0] = (1.0 - (d - 1) as f64 * top * top).max(0.0).sqrt();
            let a = unit(&w);
            let worst = check(&a, &a, "worst truncation");
            // Such data does come near the bound: the test can fail.
            if d >= 16 {
                assert!(
                    worst > 0.25 * (dot_slack_f16(d) - dot_slack(d)) / 2.0,
                    "{d}-D: {worst:e}"
                );
            }
            // Tiny coordinates (flushed), a few large.
            let mut t: Vec<f64> = (0..d)
                .map(|i| if i % 7 == 0 { 1.0 } else { 1e-9 * next() })
                .collect();
            t[d - 1] = 3e-7;
            let ta = unit(&t);
            check(&ta, &ta, "flushed");
            // Random pairs, near each other and not.
            for _ in 0..20 {
                let p: Vec<f64> = (0..d).map(|_| next() - 0.5).collect();
                let q: Vec<f64> = p.iter().map(|x| x + 0.05 * (next() - 0.5)).collect();
                check(&unit(&p), &unit(&q), "random");
                let r: Vec<f64> = (0..d).map(|_| next() * next()).collect();
                check(&unit(&p), &unit(&r), "random");
            }
        }
    }
}
