//! `simjoin demo`: generates seeded clustered data and runs a real join on it.

/// SplitMix64: a tiny seeded generator. Hand-written (rather than `rand`) so that a seed
/// gives the same demo data whatever crate versions are in the lock file.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// `n` points in `dim` dimensions: Gaussian clusters (sigma `spread`) around `clusters`
/// uniform centres in the unit cube, plus 10% uniform background noise. Row-major f32.
pub fn clustered(n: usize, dim: usize, clusters: usize, spread: f64, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    let centres: Vec<f64> = (0..clusters.max(1) * dim).map(|_| rng.uniform()).collect();
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        if rng.uniform() < 0.1 {
            out.extend((0..dim).map(|_| rng.uniform() as f32));
        } else {
            let c = (rng.next_u64() % clusters.max(1) as u64) as usize;
            out.extend((0..dim).map(|k| (centres[c * dim + k] + spread * rng.normal()) as f32));
        }
    }
    out
}

/// Neighbour-count histogram in power-of-two buckets: (label, number of points).
pub fn degree_histogram(pairs: &[simjoin::Pair], n: usize) -> Vec<(String, usize)> {
    let mut degree = vec![0u32; n];
    for &[i, j] in pairs {
        degree[i as usize] += 1;
        degree[j as usize] += 1;
    }
    let mut buckets: Vec<usize> = Vec::new();
    for &d in &degree {
        // Bucket 0 holds degree 0; bucket b >= 1 holds [2^(b-1), 2^b).
        let b = if d == 0 {
            0
        } else {
            32 - d.leading_zeros() as usize
        };
        if buckets.len() <= b {
            buckets.resize(b + 1, 0);
        }
        buckets[b] += 1;
    }
    buckets
        .iter()
        .enumerate()
        .map(|(b, &count)| {
            let label = match b {
                0 => "0".to_string(),
                1 => "1".to_string(),
                _ => format!("{}-{}", 1u64 << (b - 1), (1u64 << b) - 1),
            };
            (label, count)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data() {
        assert_eq!(clustered(100, 3, 4, 0.01, 7), clustered(100, 3, 4, 0.01, 7));
        assert_ne!(clustered(100, 3, 4, 0.01, 7), clustered(100, 3, 4, 0.01, 8));
    }

    #[test]
    fn histogram_counts_every_point_once() {
        let pairs = [[0, 1], [0, 2], [0, 3], [1, 2]];
        let h = degree_histogram(&pairs, 5);
        // degrees: 3, 2, 2, 1, 0
        assert_eq!(h, vec![("0".into(), 1), ("1".into(), 1), ("2-3".into(), 3)]);
    }
}
