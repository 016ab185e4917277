//! Nested-loop join, parallel over blocks of query points, with the vectorised kernel in
//! canonical dimension order.

use super::emit::Collector;
use super::store::{scan, MetricKind, Store};
use crate::control::Control;
use crate::metric::Coord;
use rayon::prelude::*;

const BLOCK: usize = 64;

/// All pairs of `a` (self-join when `b` is None) or of `a` × `b`, each `dim` wide.
pub(crate) fn join<T: Coord, M: MetricKind>(
    a: &[T],
    b: Option<&[T]>,
    dim: usize,
    thr: T,
    out: &Collector,
    control: &Control,
) {
    let dims: Vec<usize> = (0..dim).collect();
    let na = a.len() / dim;
    let other = b.unwrap_or(a);
    let nb = other.len() / dim;
    let store = Store::gather(other, dim, (0..nb as u32).collect(), &dims);
    let early = dim > 4;
    let blocks = na.div_ceil(BLOCK);
    control.stage("join", blocks as u64);
    (0..blocks).into_par_iter().for_each(|blk| {
        let mut em = out.emitter();
        let found = em.found();
        for i in blk * BLOCK..((blk + 1) * BLOCK).min(na) {
            if em.stopped() || control.check().is_err() {
                return;
            }
            let q = &a[i * dim..(i + 1) * dim];
            let first = if b.is_some() { 0 } else { i + 1 };
            scan::<T, M>(q, &store, first, nb, thr, early, |j| {
                em.push(i as u32, j as u32)
            });
        }
        control.advance(1, em.found() - found);
    });
}
