//! Reading point sets: .npy (2-D f16/f32/f64; f16 widened to f32), .csv/.txt (comma or whitespace separated, optional
//! header line) and .fvecs. Every malformed input is a clear error, never a panic.

use anyhow::{bail, Context, Result};
use simjoin::{Coords, Dataset};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Owned row-major coordinates as read from a file.
pub enum Points {
    F32 { data: Vec<f32>, dim: usize },
    F64 { data: Vec<f64>, dim: usize },
}

impl Points {
    /// Converts to the requested precision (None keeps the file's).
    pub fn with_precision(self, want: Option<Precision>) -> Points {
        match (self, want) {
            (Points::F64 { data, dim }, Some(Precision::F32)) => Points::F32 {
                data: data.iter().map(|&x| x as f32).collect(),
                dim,
            },
            (Points::F32 { data, dim }, Some(Precision::F64)) => Points::F64 {
                data: data.iter().map(|&x| x as f64).collect(),
                dim,
            },
            (p, _) => p,
        }
    }
    pub fn precision(&self) -> Precision {
        match self {
            Points::F32 { .. } => Precision::F32,
            Points::F64 { .. } => Precision::F64,
        }
    }
    /// A validated view (finite coordinates, dim >= 1).
    pub fn dataset(&self) -> simjoin::Result<Dataset<'_>> {
        match self {
            Points::F32 { data, dim } => Dataset::new(Coords::F32(data), *dim),
            Points::F64 { data, dim } => Dataset::new(Coords::F64(data), *dim),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    F32,
    F64,
}

/// Reads a point file, choosing the format by extension.
pub fn read_points(path: &Path) -> Result<Points> {
    read_file(path, false)
}

/// `read_points`; with `column`, a 1-D .npy array reads as one column.
fn read_file(path: &Path, column: bool) -> Result<Points> {
    let ext = extension(path);
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = BufReader::new(file);
    let points = match ext.as_str() {
        "npy" => read_npy(reader, column),
        "csv" | "txt" | "tsv" => read_text(reader),
        "fvecs" => read_fvecs(reader),
        _ => bail!("unknown input format '.{ext}' (expected .npy, .csv, .txt or .fvecs)"),
    };
    points.with_context(|| format!("{}", path.display()))
}

/// Reads one number per point: a 1-D .npy (float32/float64) or any point file with one
/// column (.npy n x 1, .csv/.txt one value per line).
pub fn read_weights(path: &Path) -> Result<Vec<f64>> {
    let (values, dim) = match read_file(path, true)? {
        Points::F32 { data, dim } => (data.into_iter().map(f64::from).collect(), dim),
        Points::F64 { data, dim } => (data, dim),
    };
    if dim != 1 {
        bail!(
            "{}: expected one weight per line (one column), got {dim} columns",
            path.display()
        );
    }
    Ok(values)
}

pub fn extension(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

fn read_npy(reader: impl Read, column: bool) -> Result<Points> {
    use npyz::{DType, TypeChar};
    let npy = npyz::NpyFile::new(reader).context("not a valid .npy file")?;
    let mut shape = npy.shape().to_vec();
    if column && shape.len() == 1 {
        shape.push(1);
    }
    if shape.len() != 2 {
        bail!("expected a 2-D array (points x dimensions), got shape {shape:?}");
    }
    let (rows, cols) = (usize::try_from(shape[0])?, usize::try_from(shape[1])?);
    let fortran = npy.order() == npyz::Order::Fortran;
    let width = match npy.dtype() {
        DType::Plain(t) if t.type_char() == TypeChar::Float => t.size_field(),
        other => bail!(
            "unsupported dtype {} (expected float16, float32 or float64)",
            other.descr()
        ),
    };
    let points = match width {
        // float16: widened exactly to f32, as the library widens its float16 input.
        2 => Points::F32 {
            data: row_major(
                npy.into_vec::<half::f16>()?
                    .iter()
                    .map(|v| v.to_f32())
                    .collect(),
                rows,
                cols,
                fortran,
            ),
            dim: cols,
        },
        4 => Points::F32 {
            data: row_major(npy.into_vec::<f32>()?, rows, cols, fortran),
            dim: cols,
        },
        8 => Points::F64 {
            data: row_major(npy.into_vec::<f64>()?, rows, cols, fortran),
            dim: cols,
        },
        w => bail!("unsupported float width {w} bytes (expected float16, float32 or float64)"),
    };
    if cols == 0 {
        bail!("the array has 0 columns: points need at least one dimension");
    }
    Ok(points)
}

/// Column-major (Fortran order) data to row-major.
fn row_major<T: Copy>(data: Vec<T>, rows: usize, cols: usize, fortran: bool) -> Vec<T> {
    if !fortran {
        return data;
    }
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        for c in 0..cols {
            out.push(data[c * rows + r]);
        }
    }
    out
}

/// One point per line; fields separated by commas (then trimmed) or by whitespace. Blank
/// lines and lines starting with '#' are skipped; a first line that is not numeric is a
/// header. Numbers are parsed as f64 (exact for any decimal the file holds).
fn read_text(reader: impl BufRead) -> Result<Points> {
    let mut data = Vec::new();
    let mut dim = 0;
    let mut seen_first = false;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index + 1;
        let line = line.with_context(|| format!("line {line_no}: cannot read"))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = if line.contains(',') {
            line.split(',').map(str::trim).collect()
        } else {
            line.split_whitespace().collect()
        };
        let parsed: Result<Vec<f64>, _> = fields.iter().map(|f| f.parse::<f64>()).collect();
        let first = !seen_first;
        seen_first = true;
        let row = match parsed {
            Ok(row) => row,
            // A first line with letters in it is a header (column names).
            Err(_) if first && line.chars().any(|c| c.is_ascii_alphabetic()) => continue,
            Err(_) => {
                let bad = fields
                    .iter()
                    .find(|f| f.parse::<f64>().is_err())
                    .unwrap_or(&"");
                bail!("line {line_no}: '{bad}' is not a number");
            }
        };
        if dim == 0 {
            dim = row.len();
        } else if row.len() != dim {
            bail!(
                "line {line_no}: {} values, but earlier rows have {dim}",
                row.len()
            );
        }
        data.extend_from_slice(&row);
    }
    if dim == 0 && data.is_empty() {
        // An empty file: no points. One dimension keeps the dataset valid.
        dim = 1;
    }
    Ok(Points::F64 { data, dim })
}

/// .fvecs: each vector is a little-endian i32 dimension followed by that many f32.
fn read_fvecs(mut reader: impl Read) -> Result<Points> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let mut data = Vec::new();
    let mut dim = 0usize;
    let mut pos = 0usize;
    let mut index = 0usize;
    while pos < bytes.len() {
        let header = bytes
            .get(pos..pos + 4)
            .with_context(|| format!("vector {index}: truncated dimension field"))?;
        let d = i32::from_le_bytes(header.try_into().unwrap());
        if d <= 0 {
            bail!("vector {index}: dimension {d} must be positive");
        }
        let d = d as usize;
        if dim == 0 {
            dim = d;
        } else if d != dim {
            bail!("vector {index}: dimension {d}, but earlier vectors have {dim}");
        }
        pos += 4;
        let body = bytes
            .get(pos..pos + 4 * d)
            .with_context(|| format!("vector {index}: truncated (expected {d} floats)"))?;
        data.extend(
            body.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap())),
        );
        pos += 4 * d;
        index += 1;
    }
    Ok(Points::F32 {
        data,
        dim: dim.max(1),
    })
}
