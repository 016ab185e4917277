//! Join options: what to compute (eps, metric, output form) and how (backend, algorithm,
//! batch sizes). Every field has a sensible default; `JoinOptions::new(eps)` is enough.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Distance function. A pair matches when `dist(a, b) <= eps` (see `metric.rs` for the
/// exact arithmetic every backend uses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Metric {
    #[default]
    Euclidean = 0,
    Manhattan = 1,
    Chebyshev = 2,
    /// Cosine distance, 1 - cos(a, b) (SciPy's and scikit-learn's): eps-joins of
    /// embeddings. See `metric.rs` for its arithmetic; zero vectors are an error.
    Cosine = 3,
    /// Great-circle distance on a sphere of radius [`crate::metric::EARTH_RADIUS_M`]:
    /// points are (latitude, longitude) in degrees (2 columns), eps and distances in
    /// metres. See `metric.rs` for its arithmetic (f64 unit vectors and the chord);
    /// latitudes outside [-90, 90] and non-finite coordinates are an error.
    Haversine = 4,
}

/// Where the join runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Backend {
    /// The native CPU backend or a real (non-CPU) Vulkan GPU, whichever the cost model
    /// (`simjoin::auto`) predicts faster for the job; the CPU where there is no such GPU.
    /// A software Vulkan device (lavapipe) is never chosen automatically.
    #[default]
    Auto = 0,
    /// The native multi-threaded CPU backend.
    Cpu = 1,
    /// A Vulkan device (any kind, lavapipe included); the engine's device (`EngineOptions::device`) or
    /// `SIMJOIN_DEVICE` picks which.
    Gpu = 2,
}

/// Join algorithm. `Auto` chooses from dimensionality, size and eps by a cost estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Algorithm {
    #[default]
    Auto = 0,
    /// eps-grid join (GPU-SJ / GPU-JOIN on the GPU, Grid-join on the CPU).
    Grid = 1,
    /// EGO*-join (CPU).
    Ego = 2,
    /// Nested-loop brute force.
    Brute = 3,
    /// Sort-and-search over a set of Z-order curves (LSS).
    Lss = 4,
    /// k-d tree: the CPU's k-nearest-neighbour search (not an eps-join algorithm).
    KdTree = 5,
}

/// Where the GPU grid join builds its index (the report's `index_build` says which ran).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum IndexBuild {
    /// The device, except for tiny inputs, on software devices and where the device cannot
    /// (no `shaderFloat64`, index sizes past 32-bit positions). `SIMJOIN_GPU_INDEX=host` or
    /// `=device` overrides it.
    #[default]
    Auto = 0,
    /// On the host (rayon), then uploaded.
    Host = 1,
    /// By the engine's kernels on the device (an error where the device cannot).
    Device = 2,
}

/// What the join returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum OutputForm {
    /// Self-join: unique pairs (i < j). A ⋈ B: pairs (i in A, j in B).
    #[default]
    Pairs = 0,
    /// Neighbour table in CSR form. Self-join: both directions, self excluded unless
    /// `include_self`; A ⋈ B: rows are points of A, columns points of B.
    Csr = 1,
    /// Only the number of pairs (as `Pairs` would return).
    Count = 2,
}

#[derive(Clone, Debug, PartialEq)]
pub struct JoinOptions {
    /// Distance threshold; must be finite and > 0.
    pub eps: f64,
    pub metric: Metric,
    /// `Metric::Haversine`: the sphere's radius in metres (eps and distances are metres
    /// on it); [`crate::metric::EARTH_RADIUS_M`] by default. Other metrics take only that.
    pub sphere_radius: f64,
    pub backend: Backend,
    pub algorithm: Algorithm,
    pub output: OutputForm,
    /// Sort pairs lexicographically (and CSR rows by neighbour id).
    pub sorted: bool,
    /// Self-join CSR only: list each point as its own neighbour.
    pub include_self: bool,
    /// Also return the distance of every pair or CSR entry (`JoinResult::distances`).
    pub distances: bool,
    /// GPU grid: number of indexed dimensions k (None = chosen by the sampling cost model).
    pub indexed_dims: Option<usize>,
    /// GPU: number of query points per batch (None = from the estimation pass).
    pub batch_points: Option<usize>,
    /// GPU: capacity of each device result buffer, in pairs (None = from device memory).
    pub result_buffer_pairs: Option<usize>,
    /// LSS: number of shifted Z-order lists (None = chosen from dimensionality and eps).
    pub lss_lists: Option<usize>,
    /// GPU grid: where the index is built.
    pub index_build: IndexBuild,
    /// Stops and watches the join (`Control::new()` to keep a handle; the default is
    /// inert). Not part of what is computed: it takes no part in equality.
    pub control: crate::control::Control,
}

impl JoinOptions {
    pub fn new(eps: f64) -> Self {
        JoinOptions {
            eps,
            metric: Metric::default(),
            sphere_radius: crate::metric::EARTH_RADIUS_M,
            backend: Backend::default(),
            algorithm: Algorithm::default(),
            output: OutputForm::default(),
            sorted: false,
            include_self: false,
            distances: false,
            indexed_dims: None,
            batch_points: None,
            result_buffer_pairs: None,
            lss_lists: None,
            index_build: IndexBuild::Auto,
            control: crate::control::Control::default(),
        }
    }

    /// Checks what can be checked without the data.
    pub fn validate(&self) -> Result<()> {
        if !self.eps.is_finite() || self.eps <= 0.0 {
            return Err(Error::invalid(format!(
                "eps must be a finite number > 0 (got {})",
                self.eps
            )));
        }
        check_sphere_radius(self.metric, self.sphere_radius)?;
        if self.indexed_dims == Some(0) {
            return Err(Error::invalid("indexed_dims must be >= 1 when given"));
        }
        if self.batch_points == Some(0) {
            return Err(Error::invalid("batch_points must be >= 1 when given"));
        }
        check_lss_lists(self.lss_lists)?;
        if self.result_buffer_pairs == Some(0) {
            return Err(Error::invalid(
                "result_buffer_pairs must be >= 1 when given",
            ));
        }
        Ok(())
    }
}

/// `Ok` for a sphere radius the metric can take: any valid radius for haversine, only the
/// default for the others (a radius set on them is a mistake worth saying).
pub(crate) fn check_sphere_radius(metric: Metric, radius: f64) -> Result<()> {
    if metric == Metric::Haversine {
        crate::metric::check_sphere_radius(radius)
    } else if radius == crate::metric::EARTH_RADIUS_M {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "sphere_radius ({radius} m) applies to metric haversine only, not {metric}"
        )))
    }
}

/// Most shifted Z-order lists LSS builds (the paper's d + 1 is at most 65 up to 64-D; more
/// than this never paid in its experiments or ours).
pub const MAX_LSS_LISTS: usize = 64;

pub(crate) fn check_lss_lists(lists: Option<usize>) -> Result<()> {
    match lists {
        Some(l) if l == 0 || l > MAX_LSS_LISTS => Err(Error::invalid(format!(
            "lss_lists must be between 1 and {MAX_LSS_LISTS} when given (got {l})"
        ))),
        _ => Ok(()),
    }
}

macro_rules! names {
    ($ty:ty { $($variant:ident = $name:literal),* $(,)? }) => {
        impl $ty {
            pub fn name(self) -> &'static str {
                match self { $(<$ty>::$variant => $name),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
        impl FromStr for $ty {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                match s.to_ascii_lowercase().as_str() {
                    $($name => Ok(<$ty>::$variant),)*
                    _ => Err(Error::invalid(format!(
                        concat!("unknown ", stringify!($ty), " '{}' (expected one of: {})"),
                        s,
                        [$($name),*].join(", ")))),
                }
            }
        }
    };
}

names!(Metric { Euclidean = "euclidean", Manhattan = "manhattan", Chebyshev = "chebyshev", Cosine = "cosine", Haversine = "haversine" });
names!(Backend { Auto = "auto", Cpu = "cpu", Gpu = "gpu" });
names!(Algorithm { Auto = "auto", Grid = "grid", Ego = "ego", Brute = "brute", Lss = "lss", KdTree = "kdtree" });
names!(IndexBuild { Auto = "auto", Host = "host", Device = "device" });
names!(OutputForm { Pairs = "pairs", Csr = "csr", Count = "count" });
