//! Haversine joins (`Metric::Haversine`, the rule in `src/metric.rs`: (latitude, longitude)
//! in degrees, eps and distances in metres) against the brute-force oracle under that rule,
//! exactly: GPS-like clusters across the antimeridian, at and near both poles, around the
//! prime meridian; points given as -180 and 180, longitudes past +-180, poles with
//! different longitudes, exact duplicates and partners a centimetre away; eps from 3 cm to
//! every pair (half the circumference and past it); f32 and f64; every CPU algorithm and,
//! with the `gpu` feature, the GPU on lavapipe (validation on); pairs, counts, CSR with
//! distances in metres, A ⋈ B (one side at the pole), streams, neighbour counts, kNN and
//! DBSCAN; spheres of other radii (`sphere_radius`); bad input refused clearly; and where the rule and the plain haversine formula
//! disagree, counted (only at pairs within a hair of eps).

mod common;

use common::Rng;
use simjoin::metric::{geo_chord2, geo_chord_threshold, geo_distance_m, geo_row, EARTH_RADIUS_M};
use simjoin::{
    dbscan, oracle, Algorithm, Backend, Coords, Dataset, DbscanOptions, Engine, ErrorKind,
    JoinOptions, KnnOptions, Metric, OutputForm, Precision,
};

const R: f64 = EARTH_RADIUS_M;

fn engine() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(Engine::new)
}

fn wrap(lon: f64) -> f64 {
    (lon + 180.0).rem_euclid(360.0) - 180.0
}

/// The point `d` metres from (lat, lon) along `bearing` (radians) on the sphere.
fn destination(lat: f64, lon: f64, bearing: f64, d: f64) -> (f64, f64) {
    let (p1, l1) = (lat.to_radians(), lon.to_radians());
    let a = d / R;
    let p2 = (p1.sin() * a.cos() + p1.cos() * a.sin() * bearing.cos())
        .clamp(-1.0, 1.0)
        .asin();
    let l2 = l1 + (bearing.sin() * a.sin() * p1.cos()).atan2(a.cos() - p1.sin() * p2.sin());
    (p2.to_degrees().clamp(-90.0, 90.0), wrap(l2.to_degrees()))
}

/// Hard places: the antimeridian on the equator and at 60 N, both poles' surroundings,
/// the prime meridian, an ordinary city.
const CENTRES: [(f64, f64); 7] = [
    (0.0, 179.9995),
    (60.0, -179.9999),
    (89.9995, 10.0),
    (-89.9998, -135.0),
    (51.4779, 0.0),
    (35.68, 139.76),
    (-33.86, 151.2),
];

/// `n` GPS-like points around [`CENTRES`] (spread `spread` metres), every 7th an exact
/// duplicate of an earlier point, every 11th a partner 1-2 cm from one, and a few given
/// as aliases: -180 and 180, longitudes past +-180, poles at several longitudes.
fn gps(rng: &mut Rng, n: usize, spread: f64) -> Vec<f64> {
    let mut x: Vec<f64> = vec![
        10.0,
        180.0, //
        10.0,
        -180.0, // the same meridian
        -45.0,
        540.0, // = 180
        -45.0,
        -179.9999999, //
        90.0,
        0.0, //
        90.0,
        77.0, // the same pole
        -90.0,
        -10.0, //
        89.9999999,
        120.0, // 1.1 cm from the pole
        0.0,
        359.99, // = -0.01
        0.0,
        -0.01, //
    ];
    while x.len() < 2 * n {
        let i = x.len() / 2;
        if i.is_multiple_of(7) {
            let j = (rng.next() as usize) % i;
            x.extend_from_within(2 * j..2 * j + 2);
            continue;
        }
        if i.is_multiple_of(11) {
            let j = (rng.next() as usize) % i;
            let (lat, lon) = destination(
                x[2 * j],
                x[2 * j + 1],
                rng.unit() * std::f64::consts::TAU,
                0.01 + 0.01 * rng.unit(),
            );
            x.extend([lat, lon]);
            continue;
        }
        let (clat, clon) = CENTRES[(rng.next() as usize) % CENTRES.len()];
        let (lat, lon) = destination(
            clat,
            clon,
            rng.unit() * std::f64::consts::TAU,
            spread * rng.normal().abs(),
        );
        x.extend([lat, lon]);
    }
    x
}

/// `n` points uniform on the sphere.
fn global(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .flat_map(|_| {
            let lat = (2.0 * rng.unit() - 1.0).asin().to_degrees();
            let lon = 360.0 * rng.unit() - 180.0;
            [lat, lon]
        })
        .collect()
}

fn as_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

fn hav(eps: f64, backend: Backend, algorithm: Algorithm) -> JoinOptions {
    let mut o = JoinOptions::new(eps);
    o.metric = Metric::Haversine;
    o.backend = backend;
    o.algorithm = algorithm;
    o.sorted = true;
    o
}

fn row(data: &Dataset, i: usize) -> [f64; 2] {
    [data.get(i, 0), data.get(i, 1)]
}

/// The rule's distance in metres of rows `i` of `a` and `j` of `b`, rounded to the data's
/// precision (what every result form reports).
fn metres(a: &Dataset, i: usize, b: &Dataset, j: usize) -> f64 {
    let d = geo_distance_m(
        geo_chord2(&geo_row(&row(a, i)), &geo_row(&row(b, j))),
        EARTH_RADIUS_M,
    );
    match a.precision() {
        Precision::F32 => d as f32 as f64,
        Precision::F64 => d,
    }
}

/// The oracle's answers for a self-join of `data` and `data ⋈ other`.
struct Want {
    eps: f64,
    pairs: Vec<[u32; 2]>,
    ab: Vec<[u32; 2]>,
}

fn want(data: &Dataset, other: &Dataset, eps: f64) -> Want {
    Want {
        eps,
        pairs: oracle::self_join(data, Metric::Haversine, eps),
        ab: oracle::join(data, other, Metric::Haversine, eps),
    }
}

/// Every output form of the self-join and of A ⋈ B equals the oracle's.
fn check_all(data: &Dataset, other: &Dataset, w: &Want, backend: Backend, algorithm: Algorithm) {
    let eps = w.eps;
    let what = format!("{:?} eps {eps} m {backend} {algorithm}", data.precision());
    let mut o = hav(eps, backend, algorithm);
    let got = engine().self_join(data, &o).unwrap();
    assert_eq!(got.pairs().unwrap(), &w.pairs[..], "{what}");
    assert_eq!(got.report.pairs, w.pairs.len() as u64, "{what}");
    o.output = OutputForm::Count;
    assert_eq!(
        engine().self_join(data, &o).unwrap().count(),
        w.pairs.len() as u64,
        "{what}"
    );
    // The CSR with each entry's distance in metres.
    o.output = OutputForm::Csr;
    o.distances = true;
    let csr = engine().self_join(data, &o).unwrap();
    let c = csr.csr().unwrap();
    assert_eq!(c.neighbors.len(), 2 * w.pairs.len(), "{what}");
    let d = csr.distances.as_ref().unwrap();
    for r in 0..data.len() {
        for e in c.offsets[r] as usize..c.offsets[r + 1] as usize {
            let n = c.neighbors[e] as usize;
            let (i, j) = (r.min(n) as u32, r.max(n) as u32);
            assert!(w.pairs.binary_search(&[i, j]).is_ok(), "{what}: {r} {n}");
            assert_eq!(
                d.get(e),
                metres(data, r, data, n),
                "{what}: distance {r} {n}"
            );
            assert!(
                d.get(e) <= eps * (1.0 + 1e-6) + 1e-6,
                "{what}: {}",
                d.get(e)
            );
        }
    }
    // A ⋈ B, pairs with distances.
    let mut o = hav(eps, backend, algorithm);
    o.distances = true;
    let ab = engine().join(data, other, &o).unwrap();
    assert_eq!(ab.pairs().unwrap(), &w.ab[..], "{what} A⋈B");
    let d = ab.distances.as_ref().unwrap();
    for (e, &[i, j]) in w.ab.iter().enumerate() {
        assert_eq!(
            d.get(e),
            metres(data, i as usize, other, j as usize),
            "{what}"
        );
    }
    // Streamed, unsorted.
    let o = hav(eps, backend, algorithm);
    let mut sink = simjoin::VecSink::default();
    engine().self_join_stream(data, &o, &mut sink).unwrap();
    let mut streamed = sink.pairs;
    streamed.sort_unstable();
    assert_eq!(streamed, w.pairs, "{what} stream");
    // Neighbour counts, the point itself included.
    let mut counts = vec![1u32; data.len()];
    for [i, j] in &w.pairs {
        counts[*i as usize] += 1;
        counts[*j as usize] += 1;
    }
    let (got, _) = engine().neighbour_counts(data, &o).unwrap();
    assert_eq!(got, counts, "{what} neighbour counts");
}

/// The workloads: (points A, points B with one side at a pole, eps in metres). B is points
/// around the north pole (and the pole itself).
fn workloads() -> Vec<(Vec<f64>, Vec<f64>, f64)> {
    let mut rng = Rng(41);
    let polar = |rng: &mut Rng, n: usize, spread: f64| -> Vec<f64> {
        let mut y = vec![90.0, -33.0, 89.99999, 179.0];
        for _ in 2..n {
            let (lat, lon) = destination(
                89.9995,
                10.0,
                rng.unit() * std::f64::consts::TAU,
                spread * rng.normal().abs(),
            );
            y.extend([lat, lon]);
        }
        y
    };
    let mut out = Vec::new();
    for (n, spread, eps) in [
        (900usize, 30.0, 0.03),
        (900, 400.0, 25.0),
        (700, 5_000.0, 800.0),
        (500, 300_000.0, 60_000.0),
    ] {
        let a = gps(&mut rng, n, spread);
        let b = polar(&mut rng, n / 3, spread);
        out.push((a, b, eps));
    }
    // Thousands of kilometres, half the circumference and past it (every pair).
    for (n, eps) in [
        (400usize, 3_000_000.0),
        (200, std::f64::consts::PI * R),
        (150, 2.5e7),
    ] {
        let mut a = global(&mut rng, n);
        a.extend([10.0, 180.0, -10.0, 0.0, 90.0, 5.0, -90.0, 5.0]); // antipodes
        let b = polar(&mut rng, n / 3, 500_000.0);
        out.push((a, b, eps));
    }
    out
}

#[test]
fn cpu_matches_the_rule() {
    for (x, y, eps) in workloads() {
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        for (a, b) in [
            (
                Dataset::from_f64(&x, 2).unwrap(),
                Dataset::from_f64(&y, 2).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, 2).unwrap(),
                Dataset::from_f32(&y32, 2).unwrap(),
            ),
        ] {
            let w = want(&a, &b, eps);
            // Not vacuous: pairs beyond the duplicates, and A ⋈ B finds some.
            assert!(w.pairs.len() > a.len() / 7, "eps {eps}: {}", w.pairs.len());
            assert!(!w.ab.is_empty(), "eps {eps}");
            for algorithm in [
                Algorithm::Auto,
                Algorithm::Grid,
                Algorithm::Ego,
                Algorithm::Brute,
            ] {
                check_all(&a, &b, &w, Backend::Cpu, algorithm);
            }
        }
    }
}

/// Hand-checked places: -180 and 180 are one meridian, a pole is one point whatever its
/// longitude, the antimeridian is crossed, and eps at half the circumference takes
/// antipodes.
#[test]
fn hand_checked_places() {
    let x: Vec<f64> = vec![
        10.0, 180.0, // 0
        10.0, -180.0, // 1: the same point as 0
        10.0, 540.0, // 2: the same point as 0
        90.0, 0.0, // 3
        90.0, -123.0, // 4: the same point as 3
        0.0, 179.9999, // 5
        0.0, -179.9999, // 6: 22.24 m from 5 across the antimeridian
        -10.0, 0.0, // 7: antipode of 0
        89.9999, 0.0, // 8
        89.9999, 180.0, // 9: 22.24 m from 8 across the pole
    ];
    let data = Dataset::from_f64(&x, 2).unwrap();
    let d = |i: usize, j: usize| metres(&data, i, &data, j);
    for (i, j) in [(0, 1), (0, 2), (1, 2), (3, 4)] {
        assert_eq!(d(i, j), 0.0, "{i} {j}");
    }
    let across = 2.0 * 0.0001f64.to_radians() * R;
    assert!((d(5, 6) - across).abs() < 1e-6, "{} vs {across}", d(5, 6));
    assert!((d(8, 9) - across).abs() < 1e-6, "{} vs {across}", d(8, 9));
    // Antipodes: asin near 1 resolves the chord's last bits to about 0.2 m (the plain
    // haversine formula too).
    assert!(
        (d(0, 7) - std::f64::consts::PI * R).abs() < 1.0,
        "{}",
        d(0, 7)
    );
    let at = |eps: f64| oracle::self_join(&data, Metric::Haversine, eps);
    assert_eq!(at(0.001), vec![[0, 1], [0, 2], [1, 2], [3, 4]]);
    assert_eq!(
        at(23.0),
        vec![
            [0, 1],
            [0, 2],
            [1, 2],
            [3, 4],
            [3, 8],
            [3, 9],
            [4, 8],
            [4, 9],
            [5, 6],
            [8, 9]
        ]
    );
    assert!(!at(std::f64::consts::PI * R * (1.0 - 1e-6)).contains(&[0, 7]));
    assert_eq!(at(std::f64::consts::PI * R).len(), 45);
    for algorithm in [Algorithm::Grid, Algorithm::Ego, Algorithm::Brute] {
        for eps in [0.001, 23.0, 2e7, std::f64::consts::PI * R] {
            let got = engine()
                .self_join(&data, &hav(eps, Backend::Cpu, algorithm))
                .unwrap();
            assert_eq!(got.pairs().unwrap(), &at(eps)[..], "{algorithm} {eps}");
        }
    }
}

/// Base points all over the globe, each with partners placed at eps (1 + k 2e-14), k in
/// -4..=4: many pairs within rounding of eps on either side of the rule's threshold.
fn at_eps(rng: &mut Rng, n: usize, eps: f64) -> Vec<f64> {
    let mut x = Vec::new();
    for _ in 0..n {
        let g = global(rng, 1);
        x.extend_from_slice(&g);
        for k in -4..=4 {
            let d = eps * (1.0 + k as f64 * 2e-14);
            let (lat, lon) = destination(g[0], g[1], rng.unit() * std::f64::consts::TAU, d);
            x.extend([lat, lon]);
        }
    }
    x
}

/// Pairs at eps, either side of the threshold by rounding, on every CPU algorithm (and the
/// GPU's): the widened Euclidean join loses none, the confirmation keeps none too many.
#[test]
fn pairs_at_eps_on_every_algorithm() {
    let mut rng = Rng(46);
    let mut runs = vec![
        (Backend::Cpu, Algorithm::Grid),
        (Backend::Cpu, Algorithm::Ego),
        (Backend::Cpu, Algorithm::Brute),
    ];
    if cfg!(feature = "gpu") {
        common::gpu_test_setup();
        runs.extend([
            (Backend::Gpu, Algorithm::Grid),
            (Backend::Gpu, Algorithm::Lss),
        ]);
    }
    for eps in [0.03, 25.0, 60_000.0, 3e6] {
        let x = at_eps(&mut rng, 60, eps);
        let y = at_eps(&mut rng, 20, eps);
        let data = Dataset::from_f64(&x, 2).unwrap();
        let other = Dataset::from_f64(&y, 2).unwrap();
        let w = want(&data, &other, eps);
        // Both sides of the boundary are present: some partners match, some do not.
        let partners = w
            .pairs
            .iter()
            .filter(|[i, j]| i % 10 == 0 && j / 10 == i / 10)
            .count();
        eprintln!("eps {eps}: {partners} of 540 partners at eps match");
        assert!(partners > 100 && partners < 500, "eps {eps}: {partners}");
        for &(backend, algorithm) in &runs {
            let got = engine()
                .self_join(&data, &hav(eps, backend, algorithm))
                .unwrap();
            assert_eq!(
                got.pairs().unwrap(),
                &w.pairs[..],
                "eps {eps} {backend} {algorithm}"
            );
            let got = engine()
                .join(&data, &other, &hav(eps, backend, algorithm))
                .unwrap();
            assert_eq!(
                got.pairs().unwrap(),
                &w.ab[..],
                "eps {eps} {backend} {algorithm}"
            );
        }
    }
    #[cfg(feature = "gpu")]
    common::assert_no_validation_errors();
}

/// The plain haversine formula in f64, in metres.
fn haversine_formula(a: [f64; 2], b: [f64; 2]) -> f64 {
    let (p1, p2) = (a[0].to_radians(), b[0].to_radians());
    let dp = p2 - p1;
    let dl = (b[1] - a[1]).to_radians();
    let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * R * h.sqrt().min(1.0).asin()
}

/// Where the rule and the plain haversine formula disagree: pairs placed at eps (1 +- a
/// few 1e-14) along random bearings all over the globe, eps from 5 cm to 19,000 km. Every
/// disagreement is at a pair whose formula distance is within `1e-14 eps + 5e-9 m` of eps
/// (the absolute part is both formulas' rounding of coordinates near 1 radian, about 1e-16
/// of R = 0.6 nm each; measured: at most 2.5e-9 m up to eps 20 km, 1e-15 relative beyond),
/// and they are counted.
#[test]
fn rule_and_haversine_formula_disagree_only_at_the_boundary() {
    let mut rng = Rng(43);
    let (mut pairs, mut near, mut disagree, mut worst_rel) = (0usize, 0usize, 0usize, 0.0f64);
    for eps in [0.05, 3.0, 250.0, 20_000.0, 1.5e6, 1.9e7] {
        let thr: f64 = simjoin::metric::threshold(Metric::Haversine, eps);
        let (mut per_eps, mut worst_abs) = (0, 0.0f64);
        for _ in 0..4000 {
            let g = global(&mut rng, 1);
            let (lat, lon) = (g[0], g[1]);
            let k = (rng.next() % 9) as f64 - 4.0;
            let d = eps * (1.0 + k * 2e-14);
            let (lat2, lon2) = destination(lat, lon, rng.unit() * std::f64::consts::TAU, d);
            let (a, b) = ([lat, lon], [lat2, lon2]);
            let rule = simjoin::metric::within(Metric::Haversine, &a, &b, thr);
            let h = haversine_formula(a, b);
            pairs += 1;
            let rel = (h - eps).abs() / eps;
            near += usize::from((h - eps).abs() <= 1e-9 * eps + 1e-8);
            if rule != (h <= eps) {
                disagree += 1;
                per_eps += 1;
                worst_rel = worst_rel.max(rel);
                worst_abs = worst_abs.max((h - eps).abs());
                assert!(
                    (h - eps).abs() <= 1e-14 * eps + 5e-9,
                    "eps {eps}: the rule says {rule} at a formula distance {h} ({rel:e} relative)"
                );
            }
        }
        eprintln!(
            "eps {eps} m: {per_eps} of 4000 pairs placed at eps disagree, at most {worst_abs:e} m \
             from eps"
        );
    }
    eprintln!(
        "{disagree} of {pairs} pairs placed at eps disagree between the rule and the \
         haversine formula (largest relative distance from eps {worst_rel:e})"
    );
    // The pairs do sit at the boundary, and the two formulas do differ there.
    assert!(near > pairs * 9 / 10, "{near} of {pairs}");
    assert!(
        disagree > 0 && disagree < pairs / 2,
        "{disagree} of {pairs}"
    );
}

#[test]
fn knn_matches_the_oracle() {
    let mut rng = Rng(44);
    let x = gps(&mut rng, 700, 2_000.0);
    let q = gps(&mut rng, 150, 5_000.0);
    let (x32, q32) = (as_f32(&x), as_f32(&q));
    for (data, query) in [
        (
            Dataset::from_f64(&x, 2).unwrap(),
            Dataset::from_f64(&q, 2).unwrap(),
        ),
        (
            Dataset::from_f32(&x32, 2).unwrap(),
            Dataset::from_f32(&q32, 2).unwrap(),
        ),
    ] {
        let mut algorithms = vec![
            (Backend::Cpu, Algorithm::Auto),
            (Backend::Cpu, Algorithm::KdTree),
            (Backend::Cpu, Algorithm::Grid),
            (Backend::Cpu, Algorithm::Brute),
        ];
        if cfg!(feature = "gpu") {
            common::gpu_test_setup();
            algorithms.extend([
                (Backend::Gpu, Algorithm::Brute),
                (Backend::Gpu, Algorithm::Lss),
            ]);
        }
        for k in [1usize, 5, 16] {
            for qs in [None, Some(&query)] {
                let (idx, dist) = oracle::knn(&data, qs, k, Metric::Haversine);
                for &(backend, algorithm) in &algorithms {
                    let o = KnnOptions {
                        metric: Metric::Haversine,
                        backend,
                        algorithm,
                        ..Default::default()
                    };
                    let what = format!("{:?} k {k} {backend} {algorithm}", data.precision());
                    let r = engine().knn(&data, qs, k, &o).unwrap();
                    assert_eq!(r.indices, idx, "{what}");
                    let got: Vec<f64> = (0..idx.len()).map(|e| r.distance(e / k, e % k)).collect();
                    assert_eq!(got, dist, "{what}");
                }
            }
        }
    }
    #[cfg(feature = "gpu")]
    common::assert_no_validation_errors();
}

/// The reference DBSCAN (as `tests/dbscan.rs`): neighbours from the oracle, core by count,
/// clusters by search over core-core edges, a border point to its nearest core neighbour
/// by (`distance_acc`, index), clusters numbered by smallest member.
fn reference(data: &Dataset, eps: f64, min_samples: usize) -> (Vec<i64>, Vec<bool>) {
    reference_of(
        data,
        &oracle::self_join(data, Metric::Haversine, eps),
        min_samples,
    )
}

/// [`reference`] from the self-join's pairs `pairs`.
fn reference_of(data: &Dataset, pairs: &[[u32; 2]], min_samples: usize) -> (Vec<i64>, Vec<bool>) {
    let n = data.len();
    let mut adj = vec![Vec::new(); n];
    for &[i, j] in pairs {
        adj[i as usize].push(j as usize);
        adj[j as usize].push(i as usize);
    }
    let core: Vec<bool> = (0..n).map(|i| 1 + adj[i].len() >= min_samples).collect();
    let mut comp = vec![usize::MAX; n];
    for s in 0..n {
        if !core[s] || comp[s] != usize::MAX {
            continue;
        }
        comp[s] = s;
        let mut stack = vec![s];
        while let Some(p) = stack.pop() {
            for &q in &adj[p] {
                if core[q] && comp[q] == usize::MAX {
                    comp[q] = s;
                    stack.push(q);
                }
            }
        }
    }
    let acc = |i: usize, j: usize| -> f64 {
        match data.coords() {
            Coords::F32(x) => simjoin::metric::distance_acc(
                Metric::Haversine,
                &x[2 * i..2 * i + 2],
                &x[2 * j..2 * j + 2],
            ) as f64,
            Coords::F64(x) => simjoin::metric::distance_acc(
                Metric::Haversine,
                &x[2 * i..2 * i + 2],
                &x[2 * j..2 * j + 2],
            ),
        }
    };
    let mut owner = vec![usize::MAX; n];
    for i in 0..n {
        if core[i] {
            owner[i] = comp[i];
        } else if let Some(&c) = adj[i]
            .iter()
            .filter(|&&c| core[c])
            .min_by(|&&a, &&b| acc(i, a).partial_cmp(&acc(i, b)).unwrap().then(a.cmp(&b)))
        {
            owner[i] = comp[c];
        }
    }
    let mut number = std::collections::HashMap::new();
    let labels = owner
        .iter()
        .map(|&c| {
            if c == usize::MAX {
                -1
            } else {
                let next = number.len() as i64;
                *number.entry(c).or_insert(next)
            }
        })
        .collect();
    (labels, core)
}

#[test]
fn dbscan_matches_the_reference() {
    let mut rng = Rng(45);
    let x = gps(&mut rng, 800, 300.0);
    let x32 = as_f32(&x);
    let mut backends = vec![Backend::Cpu];
    if cfg!(feature = "gpu") {
        common::gpu_test_setup();
        backends.push(Backend::Gpu);
    }
    for data in [
        Dataset::from_f64(&x, 2).unwrap(),
        Dataset::from_f32(&x32, 2).unwrap(),
    ] {
        for (eps, min_samples) in [(40.0, 5usize), (150.0, 10)] {
            let (labels, core) = reference(&data, eps, min_samples);
            let clusters = labels.iter().max().map_or(0, |&m| m + 1);
            let noise = labels.iter().filter(|&&l| l < 0).count();
            assert!(
                clusters >= 4 && noise > 0,
                "{clusters} clusters, {noise} noise"
            );
            for &backend in &backends {
                let o = DbscanOptions {
                    eps,
                    min_samples,
                    metric: Metric::Haversine,
                    backend,
                    algorithm: Algorithm::Auto,
                    control: Default::default(),
                    sphere_radius: simjoin::metric::EARTH_RADIUS_M,
                };
                for reorder in [false, true] {
                    let r =
                        simjoin::dbscan::dbscan_reordered(engine(), &data, &o, reorder).unwrap();
                    let what = format!("{:?} eps {eps} {backend} {reorder}", data.precision());
                    assert_eq!(r.core, core, "{what}");
                    assert_eq!(r.labels, labels, "{what}");
                }
                assert_eq!(dbscan(engine(), &data, &o).unwrap().labels, labels);
            }
        }
    }
    #[cfg(feature = "gpu")]
    common::assert_no_validation_errors();
}

/// Spheres other than the Earth's (`sphere_radius`): the Moon's, the unit sphere (eps in
/// radians, scikit-learn's haversine convention) and a huge one. The rule on radius `r`
/// is the Earth's with `r` for `R`: a pair matches when `c <= geo_chord_threshold(e, r)`
/// and its distance is `geo_distance_m(c, r)`. Against a brute-force oracle of that rule:
/// pairs, counts, the CSR's distances, A ⋈ B, kNN (ranked by `c` whatever the radius, so
/// the Earth's oracle's indices, the radius's metres) and DBSCAN.
#[test]
fn another_sphere_radius() {
    let mut rng = Rng(91);
    let mut x = global(&mut rng, 500);
    x.extend(gps(&mut rng, 300, 30_000.0));
    let q = gps(&mut rng, 80, 50_000.0);
    let (x32, q32) = (as_f32(&x), as_f32(&q));
    let mut backends = vec![Backend::Cpu];
    if cfg!(feature = "gpu") {
        common::gpu_test_setup();
        backends.push(Backend::Gpu);
    }
    // (radius, eps): 60 km on the Moon, 0.004 rad on the unit sphere, 2,000 km on a
    // sphere of 10^9 m: each about as selective as 220 km, 25 km and 13 km on the Earth.
    for (r, eps) in [(1_737_400.0, 60_000.0), (1.0, 0.004), (1e9, 2e6)] {
        for (data, other) in [
            (
                Dataset::from_f64(&x, 2).unwrap(),
                Dataset::from_f64(&q, 2).unwrap(),
            ),
            (
                Dataset::from_f32(&x32, 2).unwrap(),
                Dataset::from_f32(&q32, 2).unwrap(),
            ),
        ] {
            let what = format!("r {r} eps {eps} {:?}", data.precision());
            // The oracle: eps rounded to the input precision, the chord on radius r.
            let e = match data.precision() {
                Precision::F32 => eps as f32 as f64,
                Precision::F64 => eps,
            };
            let thr = geo_chord_threshold(e, r);
            let v = |d: &Dataset, i: usize| geo_row(&row(d, i));
            let c = |a: &Dataset, i: usize, b: &Dataset, j: usize| geo_chord2(&v(a, i), &v(b, j));
            let round = |m: f64| match data.precision() {
                Precision::F32 => m as f32 as f64,
                Precision::F64 => m,
            };
            let n = data.len();
            let want: Vec<[u32; 2]> = (0..n)
                .flat_map(|i| (i + 1..n).map(move |j| [i as u32, j as u32]))
                .filter(|&[i, j]| c(&data, i as usize, &data, j as usize) <= thr)
                .collect();
            let want_ab: Vec<[u32; 2]> = (0..n)
                .flat_map(|i| (0..other.len()).map(move |j| [i as u32, j as u32]))
                .filter(|&[i, j]| c(&data, i as usize, &other, j as usize) <= thr)
                .collect();
            assert!(
                want.len() > 300 && want_ab.len() > 50 && want.len() < n * n / 20,
                "{what}: {} pairs, {} A x B",
                want.len(),
                want_ab.len()
            );
            for &backend in &backends {
                let what = format!("{what} {backend}");
                let mut o = hav(eps, backend, Algorithm::Auto);
                o.sphere_radius = r;
                o.distances = true;
                let got = engine().self_join(&data, &o).unwrap();
                assert_eq!(got.pairs().unwrap(), &want[..], "{what}");
                let d = got.distances.as_ref().unwrap();
                for (k, &[i, j]) in want.iter().enumerate() {
                    let m = round(geo_distance_m(c(&data, i as usize, &data, j as usize), r));
                    assert_eq!(d.get(k), m, "{what}: distance {i} {j}");
                    assert!(m <= e * (1.0 + 1e-6), "{what}: {m} m");
                }
                let ab = engine().join(&data, &other, &o).unwrap();
                assert_eq!(ab.pairs().unwrap(), &want_ab[..], "{what} A x B");
                o.output = OutputForm::Count;
                o.distances = false;
                let count = engine().self_join(&data, &o).unwrap().count();
                assert_eq!(count, want.len() as u64, "{what} count");
                // kNN: the Earth's ranking, the radius's distances.
                let ko = KnnOptions {
                    metric: Metric::Haversine,
                    sphere_radius: r,
                    backend,
                    algorithm: if backend == Backend::Gpu {
                        Algorithm::Brute
                    } else {
                        Algorithm::Auto
                    },
                    ..Default::default()
                };
                let k = 4;
                let (idx, _) = oracle::knn(&data, Some(&other), k, Metric::Haversine);
                let kr = engine().knn(&data, Some(&other), k, &ko).unwrap();
                assert_eq!(kr.indices, idx, "{what} kNN");
                for (e, &j) in idx.iter().enumerate() {
                    let m = round(geo_distance_m(c(&other, e / k, &data, j as usize), r));
                    assert_eq!(kr.distance(e / k, e % k), m, "{what} kNN distance");
                }
                // DBSCAN at the same eps on the same sphere.
                let min_samples = 4;
                let (labels, core) = reference_of(&data, &want, min_samples);
                let mut dopts = DbscanOptions::new(eps, min_samples);
                dopts.metric = Metric::Haversine;
                dopts.sphere_radius = r;
                dopts.backend = backend;
                let got = dbscan(engine(), &data, &dopts).unwrap();
                assert_eq!(got.core, core, "{what} DBSCAN core");
                assert_eq!(got.labels, labels, "{what} DBSCAN");
            }
        }
    }
    #[cfg(feature = "gpu")]
    common::assert_no_validation_errors();
}

#[test]
fn bad_input_is_refused_clearly() {
    let o = hav(100.0, Backend::Cpu, Algorithm::Auto);
    let bad_lat = [10.0f64, 0.0, 90.5, 3.0];
    let e = engine()
        .self_join(&Dataset::from_f64(&bad_lat, 2).unwrap(), &o)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("row 1: latitude 90.5"), "{e}");
    // In B too, and for kNN and DBSCAN.
    let good = [10.0f64, 0.0, 11.0, 1.0];
    let (g, b) = (
        Dataset::from_f64(&good, 2).unwrap(),
        Dataset::from_f64(&bad_lat, 2).unwrap(),
    );
    let e = engine().join(&g, &b, &o).unwrap_err();
    assert!(e.to_string().contains("latitude 90.5"), "{e}");
    let ko = KnnOptions {
        metric: Metric::Haversine,
        ..Default::default()
    };
    let e = engine().knn(&b, None, 1, &ko).unwrap_err();
    assert!(e.to_string().contains("latitude 90.5"), "{e}");
    let e = engine().knn(&g, Some(&b), 1, &ko).unwrap_err();
    assert!(e.to_string().contains("latitude 90.5"), "{e}");
    let mut dopts = DbscanOptions::new(100.0, 2);
    dopts.metric = Metric::Haversine;
    let e = dbscan(engine(), &b, &dopts).unwrap_err();
    assert!(e.to_string().contains("latitude 90.5"), "{e}");
    // Not 2 columns.
    let three = [1.0f64, 2.0, 3.0];
    let d3 = Dataset::from_f64(&three, 3).unwrap();
    for e in [
        engine().self_join(&d3, &o).unwrap_err(),
        engine().knn(&d3, None, 1, &ko).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("2 columns"), "{e}");
    }
    // Non-finite coordinates (refused by the dataset itself).
    assert!(Dataset::from_f64(&[f64::NAN, 0.0], 2).is_err());
    assert!(Dataset::from_f64(&[0.0, f64::INFINITY], 2).is_err());
    // An eps whose chord squares below f64's exact range; mixed precision in kNN.
    let e = engine()
        .self_join(&g, &hav(1e-140, Backend::Cpu, Algorithm::Auto))
        .unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
    // A sphere radius that is no radius, or one set on another metric.
    for r in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-310] {
        let mut o = hav(100.0, Backend::Cpu, Algorithm::Auto);
        o.sphere_radius = r;
        let e = engine().self_join(&g, &o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("sphere_radius"), "{e}");
        let ko = KnnOptions {
            sphere_radius: r,
            ..ko.clone()
        };
        let e = engine().knn(&g, None, 1, &ko).unwrap_err();
        assert!(e.to_string().contains("sphere_radius"), "{e}");
        let mut dopts = DbscanOptions::new(100.0, 2);
        dopts.metric = Metric::Haversine;
        dopts.sphere_radius = r;
        let e = dbscan(engine(), &g, &dopts).unwrap_err();
        assert!(e.to_string().contains("sphere_radius"), "{e}");
    }
    let mut o = JoinOptions::new(0.5);
    o.sphere_radius = 1.0;
    let e = engine().self_join(&g, &o).unwrap_err();
    assert!(e.to_string().contains("haversine only"), "{e}");
    let g32 = [10.0f32, 0.0];
    let e = engine()
        .knn(&g, Some(&Dataset::from_f32(&g32, 2).unwrap()), 1, &ko)
        .unwrap_err();
    assert!(e.to_string().contains("precision"), "{e}");
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_matches_the_rule() {
    common::gpu_test_setup();
    for (i, (x, y, eps)) in workloads().into_iter().enumerate() {
        // Lavapipe is slow: the clustered workloads and one global.
        if i == 5 || i == 6 {
            continue;
        }
        let (x32, y32) = (as_f32(&x), as_f32(&y));
        let a = Dataset::from_f32(&x32, 2).unwrap();
        let b = Dataset::from_f32(&y32, 2).unwrap();
        let w = want(&a, &b, eps);
        for algorithm in [Algorithm::Grid, Algorithm::Brute, Algorithm::Lss] {
            check_all(&a, &b, &w, Backend::Gpu, algorithm);
        }
        let a = Dataset::from_f64(&x, 2).unwrap();
        let b = Dataset::from_f64(&y, 2).unwrap();
        let w = want(&a, &b, eps);
        check_all(&a, &b, &w, Backend::Gpu, Algorithm::Grid);
    }
    common::assert_no_validation_errors();
}
