//! The few errors a caller can act on (wgpu-hal style). Everything inside uses `anyhow`;
//! at the API boundary an error carries one of these kinds, which the C surface maps to
//! fixed status numbers.

use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad input: NaN/inf coordinates, eps <= 0, zero dimensions, mismatched sizes, ...
    InvalidArgument,
    /// The chosen device lacks a feature (e.g. f64 without shaderFloat64), or an option
    /// combination is not implemented for the chosen backend.
    Unsupported,
    /// No usable Vulkan device when a GPU was explicitly asked for.
    NoDevice,
    /// Device memory ran out even at the smallest batch size.
    OutOfDeviceMemory,
    /// Host memory ran out (or a size would not fit in memory / in an index type).
    OutOfHostMemory,
    /// The GPU was lost (driver reset, hang).
    DeviceLost,
    /// The caller's sink returned an error and the join was stopped.
    Cancelled,
    /// File or stream I/O.
    Io,
    /// A bug or an unexpected driver answer.
    Internal,
}

/// A simjoin error: a kind plus a human-readable message (with the cause chain).
pub struct Error {
    kind: ErrorKind,
    source: anyhow::Error,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, msg: impl fmt::Display) -> Self {
        Error {
            kind,
            source: anyhow::anyhow!("{msg}"),
        }
    }
    pub fn invalid(msg: impl fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidArgument, msg)
    }
    pub fn unsupported(msg: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Unsupported, msg)
    }
    pub fn with_kind(kind: ErrorKind, source: anyhow::Error) -> Self {
        Error { kind, source }
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:#}` prints anyhow's whole context chain on one line.
        write!(f, "{:#}", self.source)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {:#}", self.kind, self.source)
    }
}

impl std::error::Error for Error {}

/// Internal code returns `anyhow::Result`; an error that does not already carry a
/// simjoin `Error` inside is classified as `Internal`.
impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        match e.downcast::<Error>() {
            Ok(inner) => inner,
            Err(e) => {
                let kind = e
                    .chain()
                    .find_map(|c| c.downcast_ref::<Error>().map(|x| x.kind))
                    .unwrap_or(ErrorKind::Internal);
                Error { kind, source: e }
            }
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error {
            kind: ErrorKind::Io,
            source: e.into(),
        }
    }
}
