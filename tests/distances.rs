//! `JoinOptions::distances`: every pair's and CSR entry's distance equals the canonical one
//! (metric.rs accumulator in the input precision, square-rooted in it for Euclidean), bit
//! for bit, in the output's order.

mod common;

use common::Rng;
use simjoin::metric::distance_acc;
use simjoin::{Algorithm, Backend, Dataset, Distances, Engine, JoinOptions, Metric, OutputForm};

fn canonical(a: &[f64], b: &[f64], dim: usize, i: u32, j: u32, m: Metric, f32_: bool) -> f64 {
    let (pi, pj) = (
        &a[i as usize * dim..(i as usize + 1) * dim],
        &b[j as usize * dim..(j as usize + 1) * dim],
    );
    if f32_ {
        let x: Vec<f32> = pi.iter().map(|&v| v as f32).collect();
        let y: Vec<f32> = pj.iter().map(|&v| v as f32).collect();
        let acc = distance_acc(m, &x, &y);
        (if m == Metric::Euclidean {
            acc.sqrt()
        } else {
            acc
        }) as f64
    } else {
        let acc = distance_acc(m, pi, pj);
        if m == Metric::Euclidean {
            acc.sqrt()
        } else {
            acc
        }
    }
}

/// Each output form, sorted or not, with and without the diagonal; 1-D and 2-D CSRs get
/// their distances as their rows are found (`cpu/rows.rs`), short rows and long ones (past
/// the 64 the rank sort takes), 3-D and 4-D ones from a pass after the join.
#[test]
fn pair_and_csr_distances_are_canonical() {
    for (dim, eps) in [
        (1, 0.03),
        (2, 0.15),
        (2, 0.4),
        (3, 0.2),
        (3, 0.45),
        (4, 0.3),
    ] {
        for sorted in [true, false] {
            for include_self in [false, true] {
                // Auto: brute force at this size; the grid: whole rows up to 2-D.
                for alg in [Algorithm::Auto, Algorithm::Grid] {
                    distances_are_canonical(dim, eps, sorted, include_self, alg);
                }
            }
        }
    }
}

fn distances_are_canonical(dim: usize, eps: f64, sorted: bool, include_self: bool, alg: Algorithm) {
    let engine = Engine::new();
    let mut rng = Rng(3);
    let a: Vec<f64> = (0..600 * dim).map(|_| rng.unit()).collect();
    let b: Vec<f64> = (0..300 * dim).map(|_| rng.unit()).collect();
    for f32_ in [false, true] {
        let (a32, b32): (Vec<f32>, Vec<f32>) = (
            a.iter().map(|&v| v as f32).collect(),
            b.iter().map(|&v| v as f32).collect(),
        );
        let (da, db) = if f32_ {
            (
                Dataset::from_f32(&a32, dim).unwrap(),
                Dataset::from_f32(&b32, dim).unwrap(),
            )
        } else {
            (
                Dataset::from_f64(&a, dim).unwrap(),
                Dataset::from_f64(&b, dim).unwrap(),
            )
        };
        for m in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            for (form, ab) in [
                (OutputForm::Pairs, false),
                (OutputForm::Pairs, true),
                (OutputForm::Csr, false),
                (OutputForm::Csr, true),
            ] {
                let mut o = JoinOptions::new(eps);
                o.metric = m;
                o.backend = Backend::Cpu;
                o.output = form;
                o.sorted = sorted;
                o.include_self = include_self;
                o.algorithm = alg;
                o.distances = true;
                let r = if ab {
                    engine.join(&da, &db, &o).unwrap()
                } else {
                    engine.self_join(&da, &o).unwrap()
                };
                let d = r.distances.as_ref().expect("distances asked for");
                let on_the_way = r.report.notes.iter().any(|n| n.contains("as each row"));
                assert_eq!(
                    on_the_way,
                    form == OutputForm::Csr && dim <= 2 && alg == Algorithm::Grid,
                    "{:?}",
                    r.report.notes
                );
                match d {
                    Distances::F32(_) => assert!(f32_),
                    Distances::F64(_) => assert!(!f32_),
                }
                let other = if ab { &b } else { &a };
                let entries: Vec<(u32, u32)> = match form {
                    OutputForm::Pairs => r.pairs().unwrap().iter().map(|p| (p[0], p[1])).collect(),
                    _ => {
                        let c = r.csr().unwrap();
                        (0..c.offsets.len() - 1)
                            .flat_map(|row| {
                                let (s, e) = (c.offsets[row] as usize, c.offsets[row + 1] as usize);
                                c.neighbors[s..e].iter().map(move |&n| (row as u32, n))
                            })
                            .collect()
                    }
                };
                assert_eq!(d.len(), entries.len());
                assert!(!entries.is_empty());
                for (e, &(i, j)) in entries.iter().enumerate() {
                    assert_eq!(
                        d.get(e),
                        canonical(&a, other, dim, i, j, m, f32_),
                        "{m} {form:?} ab={ab} f32={f32_} dim {dim} sorted {sorted} entry {e}"
                    );
                }
                // Without the option: none.
                o.distances = false;
                assert!(engine.self_join(&da, &o).unwrap().distances.is_none());
            }
        }
    }
}

/// The test above once more without AVX2 (the portable distance kernel and the rows'
/// portable accumulators), in a child process because the switch is read from the
/// environment.
#[test]
fn portable_kernel_distances_too() {
    common::run_in_child(
        "pair_and_csr_distances_are_canonical",
        &[("SIMJOIN_NO_AVX2", "1")],
    );
}
