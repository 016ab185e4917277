//! simjoin: similarity (eps-distance) joins on any Vulkan GPU or on the CPU.
//!
//! ```no_run
//! use simjoin::{Dataset, Engine, JoinOptions};
//! let points: Vec<f32> = vec![0.0, 0.0, 0.5, 0.0, 3.0, 3.0]; // 3 points in 2-D
//! let data = Dataset::from_f32(&points, 2).unwrap();
//! let result = Engine::new().self_join(&data, &JoinOptions::new(1.0)).unwrap();
//! assert_eq!(result.pairs().unwrap(), &[[0, 1]]);
//! ```
//!
//! Layout: `vk` is the Vulkan layer (device, queues, memory, kernels), `gpu` the GPU join
//! algorithms, `cpu` the native CPU backend, `ffi` the C surface; `metric` and `grid` hold
//! the arithmetic and cell geometry every backend shares so that all agree pair for pair.

// Every `unsafe` block says why it is sound (checked by clippy in CI).
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod auto;
mod backend;
pub mod control;
mod cosine;
pub mod dataset;
pub mod dbscan;
mod device;
pub mod engine;
pub mod error;
pub mod ffi;
mod geo;
pub mod grid;
pub mod knn;
pub mod metric;
pub mod options;
#[doc(hidden)]
pub mod oracle;
mod projection;
pub mod result;
/// Arrow export of results (the module lives in `result/`, beside the rest of the result path).
pub use result::arrow;
pub mod stats;

pub(crate) mod cpu;
#[cfg(feature = "gpu")]
pub(crate) mod gpu;
#[cfg(feature = "gpu")]
pub mod vk;

/// The GPU join kernels' interface (flags, bindings, push constants) and the GLSL header
/// generated from it; public for the test that checks the compiled kernels against it.
#[cfg(feature = "gpu")]
#[doc(hidden)]
pub mod kernel_interface {
    pub use crate::gpu::interface::*;
}

/// The GPU grid index arrays as the join kernels read them, built on the host or the
/// device; public for the test that compares the two builds.
#[cfg(feature = "gpu")]
#[doc(hidden)]
pub mod grid_index_check {
    pub use crate::gpu::device_data::{index_arrays, IndexArrays};
}

pub use control::{Control, Progress};
pub use dataset::{Coords, Dataset, Precision};
pub use dbscan::{dbscan, dbscan_weighted, DbscanOptions, DbscanResult};
pub use device::{devices, DeviceInfo};
pub use engine::{Engine, EngineOptions};
pub use error::{Error, ErrorKind, Result};
pub use knn::{KnnOptions, KnnResult};
pub use options::{Algorithm, Backend, IndexBuild, JoinOptions, Metric, OutputForm};
pub use result::{
    push_split, Csr, Distances, JoinOutput, JoinReport, JoinResult, Pair, PairSink, PairSorter,
    VecSink,
};
