//! GPU join algorithms over the Vulkan layer (`crate::vk`): the eps-grid self-join and
//! A ⋈ B of GPU-SJ/GPU-JOIN, and the nested-loop brute force.

use crate::engine::JoinBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::options::JoinOptions;
use std::sync::Arc;

/// The GPU backend for `opts`. `explicit`: the caller asked for a GPU (any Vulkan device,
/// lavapipe included); otherwise only a real (non-CPU) GPU is returned, or None.
pub(crate) fn backend(_opts: &JoinOptions, explicit: bool) -> Result<Option<Arc<dyn JoinBackend>>> {
    if explicit {
        Err(Error::new(
            ErrorKind::Unsupported,
            "the GPU join is not built yet",
        ))
    } else {
        Ok(None)
    }
}
