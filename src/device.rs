//! The devices a GPU backend could run on, as `simjoin info` lists them.

/// One Vulkan device as `simjoin info` and backend selection see it.
#[derive(Clone, Debug, Default)]
pub struct DeviceInfo {
    /// Index in enumeration order (what `SIMJOIN_DEVICE=<index>` selects).
    pub index: usize,
    pub name: String,
    /// "discrete", "integrated", "virtual", "cpu" or "other".
    pub kind: String,
    /// Vulkan API version the device reports, e.g. "1.3.255".
    pub api_version: String,
    /// Driver name and version.
    pub driver: String,
    /// Human-readable lines: queue families, memory heaps, the limits simjoin relies on,
    /// optional features (f64, int64, subgroup size).
    pub details: Vec<String>,
}

/// Lists the Vulkan devices present (empty when there is no Vulkan loader or driver, or
/// when the library was built without the `gpu` feature).
pub fn devices() -> crate::Result<Vec<DeviceInfo>> {
    #[cfg(feature = "gpu")]
    return crate::vk::devices();
    #[cfg(not(feature = "gpu"))]
    Ok(Vec::new())
}
