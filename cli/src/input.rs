//! Reading point sets: .npy (2-D f16/f32/f64; f16 widened to f32), .csv/.txt (comma or
//! whitespace separated, optional header line), .parquet (numeric columns) and .fvecs;
//! `--columns` picks the coordinate columns by header name or index (e.g. a CSV's
//! latitude and longitude beside an id and a name). Every malformed input is a clear
//! error, never a panic.

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

/// Reads a point file, choosing the format by extension; `columns` (`--columns`): the
/// coordinate columns, comma-separated header names or 0-based indices, in the order
/// given (names only where the file names its columns: a text header, Parquet).
pub fn read_points(path: &Path, columns: Option<&str>) -> Result<Points> {
    let picks = columns.map(parse_columns).transpose()?;
    read_file(path, false, picks.as_deref()).with_context(|| format!("{}", path.display()))
}

/// A column of `--columns`: by name or by 0-based index.
#[derive(Clone, Debug, PartialEq)]
enum Column {
    Name(String),
    Index(usize),
}

fn parse_columns(spec: &str) -> Result<Vec<Column>> {
    let picks: Vec<Column> = spec
        .split(',')
        .map(str::trim)
        .map(|c| match c.parse::<usize>() {
            Ok(i) => Column::Index(i),
            Err(_) => Column::Name(c.to_string()),
        })
        .collect();
    if picks.iter().any(|c| *c == Column::Name(String::new())) {
        bail!("--columns '{spec}': an empty column name");
    }
    Ok(picks)
}

/// The index of each pick among `names` (a header; `None` where the file names no
/// columns), below `width` columns.
fn resolve(picks: &[Column], names: Option<&[String]>, width: usize) -> Result<Vec<usize>> {
    picks
        .iter()
        .map(|c| match c {
            Column::Index(i) if *i < width => Ok(*i),
            Column::Index(i) => bail!("--columns: column {i} does not exist ({width} columns)"),
            Column::Name(n) => match names {
                Some(names) => names.iter().position(|h| h == n).with_context(|| {
                    format!("--columns: no column named '{n}' (the columns: {})", names.join(", "))
                }),
                None => bail!("--columns: '{n}' is a name, but this file has no column names; use 0-based indices"),
            },
        })
        .collect()
}

/// `read_points`; with `column`, a 1-D .npy array reads as one column.
fn read_file(path: &Path, column: bool, picks: Option<&[Column]>) -> Result<Points> {
    let ext = extension(path);
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    if ext == "parquet" {
        return read_parquet(file, picks);
    }
    if matches!(ext.as_str(), "csv" | "txt" | "tsv") {
        return read_text(BufReader::new(file), picks);
    }
    let file_bytes = file.metadata().map_or(u64::MAX, |m| m.len());
    let reader = BufReader::new(file);
    let points = match ext.as_str() {
        "npy" => read_npy(reader, column, file_bytes)?,
        "fvecs" => read_fvecs(reader)?,
        _ => bail!("unknown input format '.{ext}' (expected .npy, .csv, .txt, .parquet or .fvecs)"),
    };
    match picks {
        Some(picks) => select(points, picks),
        None => Ok(points),
    }
}

/// The picked columns (indices only: .npy and .fvecs name none) of a matrix.
fn select(points: Points, picks: &[Column]) -> Result<Points> {
    fn pick<T: Copy>(data: &[T], dim: usize, cols: &[usize]) -> Vec<T> {
        data.chunks_exact(dim.max(1))
            .flat_map(|row| cols.iter().map(|&c| row[c]))
            .collect()
    }
    Ok(match points {
        Points::F32 { data, dim } => {
            let cols = resolve(picks, None, dim)?;
            Points::F32 {
                data: pick(&data, dim, &cols),
                dim: cols.len(),
            }
        }
        Points::F64 { data, dim } => {
            let cols = resolve(picks, None, dim)?;
            Points::F64 {
                data: pick(&data, dim, &cols),
                dim: cols.len(),
            }
        }
    })
}

/// .parquet: the picked columns (default: every column), each of a float or integer type
/// without nulls, read as f64 (f32 columns: f32 where every picked column is f32).
fn read_parquet(file: std::fs::File, picks: Option<&[Column]>) -> Result<Points> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
        UInt32Type, UInt64Type, UInt8Type,
    };
    use arrow_schema::DataType;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).context("not a valid .parquet file")?;
    let names: Vec<String> = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let cols = match picks {
        Some(picks) => resolve(picks, Some(&names), names.len())?,
        None => (0..names.len()).collect(),
    };
    if cols.is_empty() {
        bail!("no columns: points need at least one dimension");
    }
    let types: Vec<DataType> = cols
        .iter()
        .map(|&c| builder.schema().field(c).data_type().clone())
        .collect();
    let all_f32 = types.iter().all(|t| *t == DataType::Float32);
    let reader = builder.build().context("cannot read the .parquet file")?;
    let dim = cols.len();
    let mut data: Vec<f64> = Vec::new();
    let mut row0 = 0usize;
    for batch in reader {
        let batch = batch.context("cannot read the .parquet file")?;
        let rows = batch.num_rows();
        let start = data.len();
        data.resize(start + rows * dim, 0.0);
        for (k, &c) in cols.iter().enumerate() {
            let array = batch.column(c);
            if let Some(r) = (0..rows).find(|&r| array.is_null(r)) {
                bail!("row {}: column '{}' is null", row0 + r, names[c]);
            }
            macro_rules! fill {
                ($t:ty) => {{
                    for (r, v) in array.as_primitive::<$t>().values().iter().enumerate() {
                        data[start + r * dim + k] = *v as f64;
                    }
                }};
            }
            match array.data_type() {
                DataType::Float64 => fill!(Float64Type),
                DataType::Float32 => fill!(Float32Type),
                DataType::Int8 => fill!(Int8Type),
                DataType::Int16 => fill!(Int16Type),
                DataType::Int32 => fill!(Int32Type),
                DataType::Int64 => fill!(Int64Type),
                DataType::UInt8 => fill!(UInt8Type),
                DataType::UInt16 => fill!(UInt16Type),
                DataType::UInt32 => fill!(UInt32Type),
                DataType::UInt64 => fill!(UInt64Type),
                other => bail!(
                    "column '{}' is {other}: coordinates must be a float or integer type (pick columns with --columns)",
                    names[c]
                ),
            }
        }
        row0 += rows;
    }
    Ok(if all_f32 {
        Points::F32 {
            data: data.iter().map(|&v| v as f32).collect(),
            dim,
        }
    } else {
        Points::F64 { data, dim }
    })
}

/// Reads one number per point: a 1-D .npy (float32/float64) or any point file with one
/// column (.npy n x 1, .csv/.txt one value per line).
pub fn read_weights(path: &Path) -> Result<Vec<f64>> {
    let (values, dim) =
        match read_file(path, true, None).with_context(|| format!("{}", path.display()))? {
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

fn read_npy(mut reader: impl Read, column: bool, file_bytes: u64) -> Result<Points> {
    use npyz::{DType, Endianness, TypeChar};
    let header = npyz::NpyHeader::from_reader(&mut reader).context("not a valid .npy file")?;
    let mut shape = header.shape().to_vec();
    if column && shape.len() == 1 {
        shape.push(1);
    }
    if shape.len() != 2 {
        bail!("expected a 2-D array (points x dimensions), got shape {shape:?}");
    }
    let (rows, cols) = (usize::try_from(shape[0])?, usize::try_from(shape[1])?);
    let fortran = header.order() == npyz::Order::Fortran;
    let (width, big_endian) = match header.dtype() {
        DType::Plain(t) if t.type_char() == TypeChar::Float => {
            (t.size_field(), t.endianness() == Endianness::Big)
        }
        other => bail!(
            "unsupported dtype {} (expected float16, float32 or float64)",
            other.descr()
        ),
    };
    // The header's shape checked against the file's size before the buffer is allocated.
    let n = rows
        .checked_mul(cols)
        .filter(|&n| {
            (n as u64)
                .checked_mul(width)
                .is_some_and(|b| b <= file_bytes)
        })
        .with_context(|| {
            format!(
                "the .npy file ({file_bytes} bytes) is too short for its header's shape {shape:?}"
            )
        })?;
    // The data section read whole into its final buffer (npyz's element iterator read
    // 750 MB/s here: 2 s of a 1.5 GB file), bytes swapped where the file's order is not
    // this machine's.
    fn bulk<T: bytemuck::Pod + Default>(
        mut reader: impl Read,
        n: usize,
        swap: impl Fn(T) -> T,
        big_endian: bool,
    ) -> Result<Vec<T>> {
        let mut data = vec![T::default(); n];
        reader
            .read_exact(bytemuck::cast_slice_mut(&mut data))
            .context("the .npy file ends before the data its header describes")?;
        if big_endian != cfg!(target_endian = "big") {
            data.iter_mut().for_each(|v| *v = swap(*v));
        }
        Ok(data)
    }
    let points = match width {
        // float16: widened exactly to f32, as the library widens its float16 input.
        2 => Points::F32 {
            data: row_major(
                bulk(reader, n, u16::swap_bytes, big_endian)?
                    .into_iter()
                    .map(|v| half::f16::from_bits(v).to_f32())
                    .collect(),
                rows,
                cols,
                fortran,
            ),
            dim: cols,
        },
        4 => Points::F32 {
            data: row_major(
                bulk(
                    reader,
                    n,
                    |v: f32| f32::from_bits(v.to_bits().swap_bytes()),
                    big_endian,
                )?,
                rows,
                cols,
                fortran,
            ),
            dim: cols,
        },
        8 => Points::F64 {
            data: row_major(
                bulk(
                    reader,
                    n,
                    |v: f64| f64::from_bits(v.to_bits().swap_bytes()),
                    big_endian,
                )?,
                rows,
                cols,
                fortran,
            ),
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

/// The fields of a text line: split at commas outside double quotes (then trimmed, quotes
/// removed, `""` inside quotes a quote), or at whitespace where the line has no comma.
fn split_fields(line: &str) -> Vec<String> {
    if !line.contains(',') {
        return line.split_whitespace().map(str::to_string).collect();
    }
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields.iter().map(|f| f.trim().to_string()).collect()
}

/// One point per line; fields separated by commas (then trimmed; double quotes as in CSV)
/// or by whitespace. Blank lines and lines starting with '#' are skipped; a first line
/// that is not numeric (in the picked columns) is a header, whose names `--columns` may
/// use. Numbers are parsed as f64 (exact for any decimal the file holds); columns not
/// picked may hold anything.
fn read_text(reader: impl BufRead, picks: Option<&[Column]>) -> Result<Points> {
    let mut data = Vec::new();
    let mut dim = 0;
    let mut seen_first = false;
    let mut header: Option<Vec<String>> = None;
    let mut cols: Option<Vec<usize>> = None;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index + 1;
        let line = line.with_context(|| format!("line {line_no}: cannot read"))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let all = split_fields(line);
        let first = !seen_first;
        seen_first = true;
        if let (true, Some(picks)) = (first, picks) {
            // A header where a name is picked or a picked field is not a number.
            let names_picked = picks.iter().any(|c| matches!(c, Column::Name(_)));
            let numeric = picks.iter().all(|c| match c {
                Column::Index(i) => all.get(*i).is_some_and(|f| f.parse::<f64>().is_ok()),
                Column::Name(_) => false,
            });
            if names_picked || !numeric {
                cols = Some(resolve(picks, Some(&all), all.len())?);
                header = Some(all);
                continue;
            }
        }
        let fields: Vec<&str> = match picks {
            None => all.iter().map(String::as_str).collect(),
            Some(p) => {
                if cols.is_none() {
                    cols = Some(resolve(p, header.as_deref(), all.len())?);
                }
                let mut picked = Vec::new();
                for &c in cols.as_deref().unwrap_or_default() {
                    match all.get(c) {
                        Some(f) => picked.push(f.as_str()),
                        None => bail!("line {line_no}: no column {c} ({} fields)", all.len()),
                    }
                }
                picked
            }
        };
        let parsed: Result<Vec<f64>, _> = fields.iter().map(|f| f.parse::<f64>()).collect();
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
