//! Points copied into a join-friendly order and layout, and the distance kernel over them.
//!
//! Coordinates are stored column by column (one column per stored dimension), so the
//! kernel compares one query point with LANES consecutive candidates at once: the loop
//! runs ACROSS candidates and each pair keeps its own accumulation order (vectorised
//! without reassociating any pair's sum).

use crate::metric::{accumulate, Coord};
use crate::options::Metric;
use rayon::prelude::*;

/// Candidates compared per kernel step.
pub(crate) const LANES: usize = 8;

/// The metric as a type, so each kernel is compiled for one metric (no branch per term).
pub(crate) trait MetricKind: Send + Sync + 'static {
    const METRIC: Metric;
}
pub(crate) struct Euclid;
pub(crate) struct Manhattan;
pub(crate) struct Chebyshev;
impl MetricKind for Euclid {
    const METRIC: Metric = Metric::Euclidean;
}
impl MetricKind for Manhattan {
    const METRIC: Metric = Metric::Manhattan;
}
impl MetricKind for Chebyshev {
    const METRIC: Metric = Metric::Chebyshev;
}

/// LANES values of a column from `cols[at]`. Callers check `at + LANES <= cols.len()` once
/// per scan (columns are padded by LANES), so the inner loops carry no bounds checks.
#[inline(always)]
fn load<T: Coord>(cols: &[T], at: usize) -> [T; LANES] {
    debug_assert!(at + LANES <= cols.len());
    // SAFETY: in bounds by the caller's check; [T; LANES] has T's alignment.
    unsafe { *(cols.as_ptr().add(at) as *const [T; LANES]) }
}

/// The columns' base pointer, shared by the gather's workers (which write disjoint slots).
struct ColumnsPtr<T>(*mut T);
// SAFETY: a plain pointer into columns that outlive the scoped workers; each worker writes
// only disjoint slots (see `at`), and T: Send may be written from any thread.
unsafe impl<T: Send> Send for ColumnsPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for ColumnsPtr<T> {}
impl<T> ColumnsPtr<T> {
    /// Caller guarantees `at` is in bounds and no other worker touches it.
    unsafe fn at(&self, at: usize) -> *mut T {
        self.0.add(at)
    }
}

/// Points in a chosen order ("slots"), column-major, with their original ids.
pub(crate) struct Store<T> {
    pub n: usize,
    pub dim: usize,
    /// Column length: n plus LANES of padding so a kernel step may read past the end.
    stride: usize,
    cols: Vec<T>,
    /// Original point id of each slot (then LANES of padding).
    pub ids: Vec<u32>,
}

/// Asks the CPU to start loading the cache line at the start of `s` (a hint: no effect on
/// other architectures, never a fault).
#[inline(always)]
pub(crate) fn prefetch<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees; the pointer is
    // that of a live slice.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(s.as_ptr().cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// How many slots ahead [`Store::gather`] prefetches its input rows.
const PREFETCH: usize = 16;

impl<T: Coord> Store<T> {
    /// Copies `data` (row-major, `dim` wide) in slot order `order` (original ids), column c
    /// holding dataset dimension `dims[c]`.
    pub fn gather(data: &[T], dim: usize, order: Vec<u32>, dims: &[usize]) -> Self {
        let n = order.len();
        let stride = n + LANES;
        let mut cols = vec![T::ZERO; stride * dims.len()];
        // One pass over the points (each row read once, in slot order), writing every column.
        let out = ColumnsPtr(cols.as_mut_ptr());
        order
            .par_iter()
            .enumerate()
            .with_min_len(4096)
            .for_each(|(s, &i)| {
                // Rows are read in slot order, i.e. at random in the input: ask for the row
                // PREFETCH slots ahead now, so that several misses are in flight at once.
                if let Some(&ahead) = order.get(s + PREFETCH) {
                    prefetch(&data[ahead as usize * dim..]);
                }
                let row = &data[i as usize * dim..(i as usize + 1) * dim];
                for (c, &j) in dims.iter().enumerate() {
                    // SAFETY: slot s < n of column c < dims.len() is inside `cols`, and each
                    // (c, s) is written by exactly one iteration.
                    unsafe { *out.at(c * stride + s) = row[j] };
                }
            });
        // Ids are padded by LANES too, so whole blocks of them can be loaded.
        let mut ids = order;
        ids.resize(n + LANES, 0);
        Store {
            n,
            dim: dims.len(),
            stride,
            cols,
            ids,
        }
    }

    /// Column c at slots s..s + LANES (padding past n included).
    #[inline(always)]
    pub fn block(&self, c: usize, s: usize) -> [T; LANES] {
        assert!(c < self.dim && s + LANES <= self.stride);
        load(&self.cols, c * self.stride + s)
    }

    /// Column c (stored dimension c) of slots 0..n.
    pub fn column(&self, c: usize) -> &[T] {
        &self.cols[c * self.stride..c * self.stride + self.n]
    }

    /// The canonical accumulated distances (`metric::distance_acc`) of `q` to slots
    /// `s..s + LANES` (readable: columns are padded by LANES), lane by lane in column
    /// order, so the compiler may vectorise across lanes; columns are in the dataset's
    /// dimension order where the store was gathered so.
    #[inline(always)]
    pub fn lane_accs(&self, metric: crate::options::Metric, q: &[T], s: usize) -> [T; LANES] {
        let mut acc = [T::ZERO; LANES];
        for (c, &x) in q.iter().enumerate() {
            let col = &self.cols[c * self.stride + s..][..LANES];
            for (a, &y) in acc.iter_mut().zip(col) {
                *a = crate::metric::accumulate(metric, *a, x, y);
            }
        }
        acc
    }

    /// [`lane_accs`](Self::lane_accs) for the metric `M`: with `AVX`, for f64 and f32, in
    /// explicit AVX2 registers (the compiler left the portable form scalar, lane by lane).
    /// The same arithmetic lane by lane, so the same bits.
    #[inline(always)]
    pub fn lane_accs_of<M: MetricKind, const AVX: bool>(&self, q: &[T], s: usize) -> [T; LANES] {
        assert!(q.len() <= self.dim && s + LANES <= self.stride);
        #[cfg(target_arch = "x86_64")]
        if AVX {
            use std::any::TypeId;
            macro_rules! explicit {
                ($t:ty, $dists:ident) => {
                    if TypeId::of::<T>() == TypeId::of::<$t>() {
                        // SAFETY: AVX is true only where AVX2 was detected; T is $t (the
                        // casts are identities); q.len() <= dim columns of `stride` slots
                        // and s + LANES <= stride (asserted above).
                        let d = unsafe {
                            avx2::$dists::<M>(
                                bytemuck::cast_slice(q),
                                bytemuck::cast_slice(&self.cols),
                                self.stride,
                                s,
                            )
                        };
                        return bytemuck::cast(d);
                    }
                };
            }
            explicit!(f64, accs_f64);
            explicit!(f32, accs_f32);
        }
        self.lane_accs(M::METRIC, q, s)
    }

    /// The stored coordinates of slot `s` into `out` (length dim).
    #[inline]
    pub fn point(&self, s: usize, out: &mut [T]) {
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.cols[c * self.stride + s];
        }
    }
}

/// Calls `hit(s)` for each slot s in `lo..hi` of `store` whose accumulated distance to `q`
/// (in stored column order) is `<= thr`. With `early`, a block of LANES candidates is
/// dropped once every lane exceeds `thr` (exact: partial sums never decrease).
/// In canonical column order this decides exactly like `metric::within`.
#[inline(always)]
pub(crate) fn scan<T: Coord, M: MetricKind>(
    q: &[T],
    store: &Store<T>,
    lo: usize,
    hi: usize,
    thr: T,
    early: bool,
    hit: impl FnMut(usize),
) {
    assert!(q.len() <= store.dim && hi <= store.n);
    scan_cols::<T, M>(q, &store.cols, store.stride, lo, hi, thr, early, hit)
}

/// Where [`scan_blocks`] gives each block with matches: `hit(s, mask)`. A trait, so that
/// a grid join's output (a method marked inline) is inlined into the AVX2 kernel: given as
/// a closure, it was called out of line for every block with a hit (the call and the
/// output's non-AVX2 code were 12% of a 3-D CSR's join).
pub(crate) trait BlockHits {
    fn hit(&mut self, s: usize, mask: u32);
}

impl<F: FnMut(usize, u32)> BlockHits for F {
    #[inline(always)]
    fn hit(&mut self, s: usize, mask: u32) {
        self(s, mask)
    }
}

/// `scan` reporting whole blocks (see `scan_cols_blocks`). `AVX`: the caller runs with
/// AVX2 enabled (detected at run time), so f32 and f64 take the explicit AVX2 kernel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_blocks<T: Coord, M: MetricKind, const AVX: bool>(
    q: &[T],
    store: &Store<T>,
    lo: usize,
    hi: usize,
    thr: T,
    early: bool,
    mut hit: impl BlockHits,
) {
    assert!(q.len() <= store.dim && hi <= store.n);
    #[cfg(target_arch = "x86_64")]
    if AVX {
        use std::any::TypeId;
        // The explicit kernel of T's type, when T is f64 or f32.
        macro_rules! explicit {
            ($t:ty, $kernel:ident) => {
                if TypeId::of::<T>() == TypeId::of::<$t>() {
                    // SAFETY: AVX is true only where AVX2 was detected; T is $t (the same
                    // type, so the casts are identities).
                    unsafe {
                        avx2::$kernel::<M>(
                            bytemuck::cast_slice(q),
                            bytemuck::cast_slice(&store.cols),
                            store.stride,
                            lo,
                            hi,
                            bytemuck::cast(thr),
                            early,
                            hit,
                        )
                    };
                    return;
                }
            };
        }
        explicit!(f64, blocks_f64);
        explicit!(f32, blocks_f32);
    }
    scan_cols_blocks::<T, M>(q, &store.cols, store.stride, lo, hi, thr, early, |s, m| {
        hit.hit(s, m)
    })
}

/// The distance kernel of [`scan_cols_blocks`] written in AVX2 intrinsics for f64 (two
/// registers of 4 lanes) and f32 (one of 8). The compiler's own vectorisation of the
/// portable kernel split the 8 lanes unevenly (scalar, 4-wide and 2-wide parts with
/// shuffles to build the mask). The arithmetic is the portable kernel's, lane by lane:
/// `q - x`, then `acc + d * d` (a separate multiply and add, never fused), `acc + |d|` or
/// `max(acc, |d|)`, in column order, then `acc <= thr`; so the answer is bit for bit
/// the same (inputs are finite: no NaN reaches the comparisons).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BlockHits, MetricKind, LANES};
    use crate::options::Metric;
    use std::arch::x86_64::*;

    /// For one element type: `$step` (one column's terms added to the lanes'
    /// accumulators), the block kernel `$blocks` and the accumulators alone, `$accs`.
    macro_rules! kernels {
        ($step:ident, $blocks:ident, $accs:ident, $t:ty, $v:ty, $halves:expr, $width:expr,
         $load:ident, $store:ident, $set1:ident, $zero:ident, $sub:ident, $mul:ident,
         $add:ident, $max:ident, $andnot:ident, $cmp:ident, $movemask:ident) => {
            /// Adds column c's terms for slots `p..p + LANES` (`p` = column c at the
            /// block's first slot) to the lanes' accumulators: `q - x`, then `acc + d * d`,
            /// `acc + |d|` or `max(acc, |d|)`.
            ///
            /// # Safety
            /// AVX2 must be available; `p..p + LANES` must be readable.
            #[inline(always)]
            unsafe fn $step<M: MetricKind>(acc: &mut [$v; $halves], qc: $t, p: *const $t) {
                let qc = $set1(qc);
                let sign = $set1(-0.0);
                for (h, a) in acc.iter_mut().enumerate() {
                    let d = $sub(qc, $load(p.add(h * $width)));
                    *a = match M::METRIC {
                        Metric::Euclidean => $add(*a, $mul(d, d)),
                        Metric::Manhattan => $add(*a, $andnot(sign, d)),
                        Metric::Chebyshev => $max(*a, $andnot(sign, d)),
                        Metric::Cosine => unreachable!("cosine joins run as Euclidean"),
                        Metric::Haversine => unreachable!("haversine joins run as Euclidean"),
                    };
                }
            }

            /// # Safety
            /// AVX2 must be available; `cols` must hold `q.len()` columns of `stride`
            /// slots, readable up to slot `hi + LANES` (checked).
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn $blocks<M: MetricKind>(
                q: &[$t],
                cols: &[$t],
                stride: usize,
                lo: usize,
                hi: usize,
                thr: $t,
                early: bool,
                mut hit: impl BlockHits,
            ) {
                let dim = q.len();
                // Every load below reads column c < dim at slots < hi + LANES <= stride.
                assert!(hi + LANES <= stride && dim * stride <= cols.len());
                let thr_v = $set1(thr);
                let base = cols.as_ptr();
                let mut s = lo;
                'block: while s < hi {
                    let mut acc: [$v; $halves] = [$zero(); $halves];
                    let mut c = 0;
                    while c < dim {
                        let end = (c + 4).min(dim);
                        while c < end {
                            $step::<M>(&mut acc, *q.get_unchecked(c), base.add(c * stride + s));
                            c += 1;
                        }
                        if early && c < dim {
                            let mut over = 0;
                            for (h, a) in acc.iter().enumerate() {
                                over |= ($movemask($cmp::<_CMP_GT_OQ>(*a, thr_v)) as u32)
                                    << (h * $width);
                            }
                            if over == (1u32 << LANES) - 1 {
                                s += LANES;
                                continue 'block;
                            }
                        }
                    }
                    let mut mask = 0u32;
                    for (h, a) in acc.iter().enumerate() {
                        mask |= ($movemask($cmp::<_CMP_LE_OQ>(*a, thr_v)) as u32) << (h * $width);
                    }
                    if s + LANES > hi {
                        mask &= (1u32 << (hi - s)) - 1;
                    }
                    if mask != 0 {
                        hit.hit(s, mask);
                    }
                    s += LANES;
                }
            }

            /// The accumulated distances of `q` to slots `s..s + LANES`, as
            /// [`Store::lane_accs`](super::Store::lane_accs) makes them (column order, a
            /// separate multiply and add).
            ///
            /// # Safety
            /// AVX2 must be available; `cols` must hold `q.len()` columns of `stride`
            /// slots, and `s + LANES <= stride` (both checked).
            #[inline(always)]
            pub(super) unsafe fn $accs<M: MetricKind>(
                q: &[$t],
                cols: &[$t],
                stride: usize,
                s: usize,
            ) -> [$t; LANES] {
                assert!(s + LANES <= stride && q.len() * stride <= cols.len());
                let mut acc: [$v; $halves] = [$zero(); $halves];
                for (c, &qc) in q.iter().enumerate() {
                    // Slots s..s + LANES of column c: inside `cols` (asserted above).
                    $step::<M>(&mut acc, qc, cols.as_ptr().add(c * stride + s));
                }
                let mut out = [0.0; LANES];
                for (h, a) in acc.iter().enumerate() {
                    $store(out.as_mut_ptr().add(h * $width), *a);
                }
                out
            }
        };
    }
    kernels!(
        step_f64,
        blocks_f64,
        accs_f64,
        f64,
        __m256d,
        2,
        4,
        _mm256_loadu_pd,
        _mm256_storeu_pd,
        _mm256_set1_pd,
        _mm256_setzero_pd,
        _mm256_sub_pd,
        _mm256_mul_pd,
        _mm256_add_pd,
        _mm256_max_pd,
        _mm256_andnot_pd,
        _mm256_cmp_pd,
        _mm256_movemask_pd
    );
    kernels!(
        step_f32,
        blocks_f32,
        accs_f32,
        f32,
        __m256,
        1,
        8,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_setzero_ps,
        _mm256_sub_ps,
        _mm256_mul_ps,
        _mm256_add_ps,
        _mm256_max_ps,
        _mm256_andnot_ps,
        _mm256_cmp_ps,
        _mm256_movemask_ps
    );
}

/// `scan` over any column-major block: column c of slot s at `cols[c * stride + s]`,
/// readable up to slot `hi + LANES` in every column.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_cols<T: Coord, M: MetricKind>(
    q: &[T],
    cols: &[T],
    stride: usize,
    lo: usize,
    hi: usize,
    thr: T,
    early: bool,
    mut hit: impl FnMut(usize),
) {
    scan_cols_blocks::<T, M>(q, cols, stride, lo, hi, thr, early, |s, mut mask| {
        while mask != 0 {
            hit(s + mask.trailing_zeros() as usize);
            mask &= mask - 1;
        }
    })
}

/// `scan_cols` reporting whole blocks: `hit(s, mask)` for the matches among slots
/// `s..s + LANES` (bit l of `mask` is slot s + l; only slots below `hi` are set).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_cols_blocks<T: Coord, M: MetricKind>(
    q: &[T],
    cols: &[T],
    stride: usize,
    lo: usize,
    hi: usize,
    thr: T,
    early: bool,
    mut hit: impl FnMut(usize, u32),
) {
    scan_cols_acc::<T, M>(q, cols, stride, lo, hi, thr, early, |s, _, mask| {
        hit(s, mask);
        thr
    })
}

/// `scan_blocks` with the accumulators and a moving threshold (the kNN's k-th distance):
/// `hit(s, acc, mask)` gets the block's accumulators and returns the threshold for the
/// blocks after it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_acc<T: Coord, M: MetricKind>(
    q: &[T],
    store: &Store<T>,
    lo: usize,
    hi: usize,
    thr: T,
    early: bool,
    hit: impl FnMut(usize, &[T; LANES], u32) -> T,
) {
    assert!(q.len() <= store.dim && hi <= store.n);
    scan_cols_acc::<T, M>(q, &store.cols, store.stride, lo, hi, thr, early, hit)
}

/// The one distance kernel: LANES candidates at a time, each in canonical column order,
/// a block dropped early (with `early`) once every lane exceeds the threshold (exact:
/// partial sums never decrease).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scan_cols_acc<T: Coord, M: MetricKind>(
    q: &[T],
    cols: &[T],
    stride: usize,
    lo: usize,
    hi: usize,
    mut thr: T,
    early: bool,
    mut hit: impl FnMut(usize, &[T; LANES], u32) -> T,
) {
    let dim = q.len();
    // Every load below reads column c < dim at slots < hi + LANES <= stride.
    assert!(hi + LANES <= stride && dim * stride <= cols.len());
    let mut s = lo;
    'block: while s < hi {
        let mut acc = [T::ZERO; LANES];
        let mut c = 0;
        while c < dim {
            let end = (c + 4).min(dim);
            while c < end {
                let x = load(cols, c * stride + s);
                let qc = q[c];
                for l in 0..LANES {
                    acc[l] = accumulate(M::METRIC, acc[l], qc, x[l]);
                }
                c += 1;
            }
            if early && c < dim && acc.iter().all(|&a| a > thr) {
                s += LANES;
                continue 'block;
            }
        }
        let mut mask = 0u32;
        for (l, &a) in acc.iter().enumerate() {
            mask |= ((a <= thr) as u32) << l;
        }
        if s + LANES > hi {
            mask &= (1u32 << (hi - s)) - 1;
        }
        if mask != 0 {
            thr = hit(s, &acc, mask);
        }
        s += LANES;
    }
}

/// The canonical test for slot `s` against `q` (both in stored column order), summing in
/// dataset dimension order: `canon[j]` is the column holding dataset dimension j.
#[inline]
pub(crate) fn confirm<T: Coord, M: MetricKind>(
    q: &[T],
    store: &Store<T>,
    s: usize,
    canon: &[usize],
    thr: T,
) -> bool {
    let mut acc = T::ZERO;
    for &c in canon {
        acc = accumulate(M::METRIC, acc, q[c], store.cols[c * store.stride + s]);
    }
    acc <= thr
}

pub(crate) use crate::metric::reject_threshold;

/// Whether the AVX2 variants of the kernels may run (checked once per join).
pub(crate) fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::env::var_os("SIMJOIN_NO_AVX2").is_none() && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
