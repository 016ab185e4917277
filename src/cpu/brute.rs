//! Nested-loop join, parallel over blocks of query points.

use crate::dataset::Coords;
use crate::engine::Job;
use crate::error::Result;
use crate::metric::{threshold, within, Coord};
use crate::result::{sink_error, JoinReport, Pair, PairSink};
use rayon::prelude::*;
use std::sync::Mutex;

const BLOCK: usize = 256;

pub(crate) fn run(job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport> {
    match (job.a.coords(), job.b.map(|b| b.coords())) {
        (Coords::F32(a), None) => go(job, a, None, sink),
        (Coords::F64(a), None) => go(job, a, None, sink),
        (Coords::F32(a), Some(Coords::F32(b))) => go(job, a, Some(b), sink),
        (Coords::F64(a), Some(Coords::F64(b))) => go(job, a, Some(b), sink),
        _ => unreachable!("engine checks precisions match"),
    }
}

fn go<T: Coord>(
    job: &Job,
    a: &[T],
    b: Option<&[T]>,
    sink: Option<&mut dyn PairSink>,
) -> Result<JoinReport> {
    let dim = job.a.dim();
    let thr: T = threshold(job.opts.metric, job.opts.eps);
    let metric = job.opts.metric;
    let n = job.a.len();
    let counting = sink.is_none();
    let sink = sink.map(Mutex::new);
    let total = (0..n.div_ceil(BLOCK))
        .into_par_iter()
        .map(|blk| -> Result<u64> {
            let mut out: Vec<Pair> = Vec::new();
            let mut count = 0u64;
            for i in blk * BLOCK..((blk + 1) * BLOCK).min(n) {
                let p = &a[i * dim..(i + 1) * dim];
                let (other, first) = match b {
                    Some(b) => (b, 0),
                    None => (a, i + 1),
                };
                for (j, q) in other.chunks_exact(dim).enumerate().skip(first) {
                    if within(metric, p, q, thr) {
                        count += 1;
                        if !counting {
                            out.push([i as u32, j as u32]);
                        }
                    }
                }
            }
            if let Some(s) = &sink {
                if !out.is_empty() {
                    s.lock().unwrap().push(&out).map_err(sink_error)?;
                }
            }
            Ok(count)
        })
        .try_reduce(|| 0, |x, y| Ok(x + y))?;
    Ok(JoinReport {
        pairs: total,
        batches: 1,
        ..Default::default()
    })
}
