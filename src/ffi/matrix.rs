//! Borrowed input points (`simjoin_matrix`), checked and viewed as a `Dataset`.

use super::null_arg;
use crate::dataset::Dataset;
use crate::error::Error;
use std::ffi::c_void;

/// Coordinate type of a `simjoin_matrix`: one of `SIMJOIN_DTYPE_*`.
pub type simjoin_dtype = u32;
pub const SIMJOIN_DTYPE_F32: simjoin_dtype = 0;
pub const SIMJOIN_DTYPE_F64: simjoin_dtype = 1;
/// IEEE binary16 (`_Float16`, NumPy's `float16`) as its 16-bit patterns: input only,
/// widened exactly to `float` for the call (a copy of 2x the input's size, freed when the
/// call returns), so results (distances) come back as SIMJOIN_DTYPE_F32. Added in 0.3.
pub const SIMJOIN_DTYPE_F16: simjoin_dtype = 2;

/// A borrowed row-major point set: point i is `data[i*cols .. (i+1)*cols]`, in `float`
/// (SIMJOIN_DTYPE_F32), `double` (SIMJOIN_DTYPE_F64) or binary16 (SIMJOIN_DTYPE_F16).
/// `data` may be NULL only when `rows == 0`. simjoin reads it during the call only and
/// never keeps it.
#[repr(C)]
pub struct simjoin_matrix {
    pub data: *const c_void,
    /// Number of points.
    pub rows: usize,
    /// Dimensions per point (>= 1).
    pub cols: usize,
    pub dtype: simjoin_dtype,
}

/// The caller's points: borrowed, or widened to f32 (float16 input) for the call.
pub(crate) struct Points<'a> {
    name: String,
    borrowed: Option<Dataset<'a>>,
    widened: Vec<f32>,
    dim: usize,
}

impl Points<'_> {
    /// The widened copy (float16 input), for a caller that must keep it past this value
    /// (the Arrow stream); empty for borrowed points.
    pub fn take_widened(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.widened)
    }

    /// The points as a validated `Dataset`.
    pub fn dataset(&self) -> Result<Dataset<'_>, Error> {
        match self.borrowed {
            Some(d) => Ok(d),
            None => Dataset::from_f32(&self.widened, self.dim)
                .map_err(|e| Error::with_kind(e.kind(), anyhow::anyhow!("{}: {e}", self.name))),
        }
    }
}

/// Borrows the caller's matrix (float16: widens it to f32), checked.
///
/// # Safety
/// `m` is NULL or points at a `simjoin_matrix` whose `data`, when `rows > 0`, points at
/// `rows * cols` live values of its dtype that stay unchanged for `'a` (header contract).
pub(crate) unsafe fn read_matrix<'a>(
    name: &str,
    m: *const simjoin_matrix,
) -> Result<Points<'a>, Error> {
    // SAFETY: NULL or a live simjoin_matrix (this function's contract).
    let m = unsafe { m.as_ref() }.ok_or_else(|| null_arg(name))?;
    if m.cols == 0 {
        return Err(Error::invalid(format!(
            "{name}: points must have at least one dimension (cols = 0)"
        )));
    }
    let len = m
        .rows
        .checked_mul(m.cols)
        .ok_or_else(|| Error::invalid(format!("{name}: rows * cols overflows size_t")))?;
    if m.data.is_null() && m.rows != 0 {
        return Err(Error::invalid(format!(
            "{name}->data is NULL but rows = {}",
            m.rows
        )));
    }
    let mut points = Points {
        name: name.to_string(),
        borrowed: None,
        widened: Vec::new(),
        dim: m.cols,
    };
    let ds = match m.dtype {
        // SAFETY: `data` holds `len` floats, live for 'a (this function's contract);
        // `borrow` checks alignment and size.
        SIMJOIN_DTYPE_F32 => Dataset::from_f32(unsafe { borrow(name, m.data, len) }?, m.cols),
        // SAFETY: likewise `len` doubles.
        SIMJOIN_DTYPE_F64 => Dataset::from_f64(unsafe { borrow(name, m.data, len) }?, m.cols),
        SIMJOIN_DTYPE_F16 => {
            // SAFETY: likewise `len` 16-bit patterns, read once here.
            let bits: &[u16] = unsafe { borrow(name, m.data, len) }?;
            points.widened = crate::dataset::widen_f16(bits);
            points.dataset()?;
            return Ok(points);
        }
        other => {
            return Err(Error::invalid(format!(
                "{name}: unknown dtype value {other}"
            )))
        }
    };
    points.borrowed =
        Some(ds.map_err(|e| Error::with_kind(e.kind(), anyhow::anyhow!("{name}: {e}")))?);
    Ok(points)
}

/// The caller's `len` coordinates as a slice, refusing what `slice::from_raw_parts` may not
/// be given: a misaligned pointer or more than isize::MAX bytes.
///
/// # Safety
/// `data` points at `len` initialised `T`s that stay live and unchanged for `'a`.
unsafe fn borrow<'a, T>(name: &str, data: *const c_void, len: usize) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if !(data as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::invalid(format!(
            "{name}->data is not aligned for its dtype ({} bytes)",
            std::mem::align_of::<T>()
        )));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>() {
        return Err(Error::invalid(format!("{name}: rows * cols is too large")));
    }
    // SAFETY: non-NULL (len > 0 and the caller checked), aligned and at most isize::MAX
    // bytes (checked above), `len` live values (this function's contract).
    Ok(unsafe { std::slice::from_raw_parts(data as *const T, len) })
}
