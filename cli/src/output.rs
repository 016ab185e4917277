//! Writing results. Pairs stream out batch by batch as the join (or the external sort)
//! produces them: .npy ((m, 2) uint32, the count patched into the header at the end), .csv
//! (header "i,j[,distance]", one pair per line) or .parquet (columns i, j and optionally
//! distance). kNN answers go to .npz (arrays `indices` and `distances`, (m, k) each, stored
//! uncompressed as NumPy's `savez` does) or .csv ("query,rank,neighbor,distance").

use anyhow::{bail, Context, Result};
use arrow_array::{ArrayRef, Float32Array, Float64Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use simjoin::{Distances, KnnResult, Pair, Precision};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

/// Checks the output extension (and that it can hold distances, when asked) before any
/// work is done.
pub fn check_output_path(path: &Path, distances: bool) -> Result<()> {
    match crate::input::extension(path).as_str() {
        "npy" if distances => bail!(
            "--distances needs a .csv or .parquet output ({} holds (m, 2) uint32 pairs only)",
            path.display()
        ),
        "npy" | "csv" | "parquet" => Ok(()),
        other => bail!(
            "unknown output format '.{other}' for {} (expected .npy, .csv or .parquet)",
            path.display()
        ),
    }
}

/// Bytes a CSV writer gathers before one write call.
const CSV_FLUSH: usize = 1 << 20;

/// A pair file being written; `finish` completes it (an unfinished .npy has a wrong count).
pub struct PairWriter {
    format: Format,
}

enum Format {
    Npy(BufWriter<File>, u64),
    Csv(File, Vec<u8>),
    Parquet(Box<ArrowWriter<File>>, SchemaRef),
}

impl PairWriter {
    /// Creates the file; `distances` holds the coordinates' precision when pairs come with
    /// their distances.
    pub fn create(path: &Path, distances: Option<Precision>) -> Result<Self> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let format = match crate::input::extension(path).as_str() {
            "npy" => {
                let mut out = BufWriter::with_capacity(1 << 20, file);
                out.write_all(&npy_header(0))?;
                Format::Npy(out, 0)
            }
            "csv" => {
                let header: &[u8] = match distances {
                    Some(_) => b"i,j,distance\n",
                    None => b"i,j\n",
                };
                let mut buf = Vec::with_capacity(CSV_FLUSH + 4096);
                buf.extend_from_slice(header);
                Format::Csv(file, buf)
            }
            _ => {
                let mut fields = vec![
                    Field::new("i", DataType::UInt32, false),
                    Field::new("j", DataType::UInt32, false),
                ];
                if let Some(p) = distances {
                    let t = match p {
                        Precision::F32 => DataType::Float32,
                        Precision::F64 => DataType::Float64,
                    };
                    fields.push(Field::new("distance", t, false));
                }
                let schema = Arc::new(Schema::new(fields));
                // Dictionary encoding rarely pays for point ids and costs a trial per
                // column chunk; plain pages write at memory speed.
                let props = WriterProperties::builder()
                    .set_dictionary_enabled(false)
                    .build();
                let w = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
                Format::Parquet(Box::new(w), schema)
            }
        };
        Ok(PairWriter { format })
    }

    /// Appends pairs (with their distances when the file has that column).
    pub fn write(&mut self, pairs: &[Pair], distances: Option<Distances>) -> Result<()> {
        match &mut self.format {
            Format::Npy(out, rows) => {
                out.write_all(bytemuck::cast_slice(pairs))?;
                *rows += pairs.len() as u64;
            }
            Format::Csv(file, buf) => {
                let mut int = itoa::Buffer::new();
                let mut float = zmij::Buffer::new();
                for (e, &[i, j]) in pairs.iter().enumerate() {
                    buf.extend_from_slice(int.format(i).as_bytes());
                    buf.push(b',');
                    buf.extend_from_slice(int.format(j).as_bytes());
                    match &distances {
                        Some(Distances::F32(d)) => {
                            buf.push(b',');
                            buf.extend_from_slice(float.format_finite(d[e]).as_bytes());
                        }
                        Some(Distances::F64(d)) => {
                            buf.push(b',');
                            buf.extend_from_slice(float.format_finite(d[e]).as_bytes());
                        }
                        None => {}
                    }
                    buf.push(b'\n');
                    if buf.len() >= CSV_FLUSH {
                        file.write_all(buf)?;
                        buf.clear();
                    }
                }
            }
            Format::Parquet(w, schema) => {
                let mut columns: Vec<ArrayRef> = vec![
                    Arc::new(UInt32Array::from_iter_values(pairs.iter().map(|p| p[0]))),
                    Arc::new(UInt32Array::from_iter_values(pairs.iter().map(|p| p[1]))),
                ];
                match distances {
                    Some(Distances::F32(d)) => columns.push(Arc::new(Float32Array::from(d))),
                    Some(Distances::F64(d)) => columns.push(Arc::new(Float64Array::from(d))),
                    None => {}
                }
                w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            }
        }
        Ok(())
    }

    /// Completes the file (the .npy count, the CSV tail, the Parquet footer); returns its
    /// size in bytes.
    pub fn finish(self) -> Result<u64> {
        let mut file = match self.format {
            Format::Npy(out, rows) => {
                let mut file = out.into_inner().map_err(|e| e.into_error())?;
                file.seek(SeekFrom::Start(0))?;
                file.write_all(&npy_header(rows))?;
                file
            }
            Format::Csv(mut file, buf) => {
                file.write_all(&buf)?;
                file
            }
            Format::Parquet(w, _) => w.into_inner()?,
        };
        Ok(file.seek(SeekFrom::End(0))?)
    }
}

/// The .npy (version 1.0) header of `rows` pairs. Its length does not depend on `rows`
/// (the dictionary is padded with spaces for a 20-digit count), so the real count can be
/// written over the first one once the pairs are all out.
fn npy_header(rows: u64) -> Vec<u8> {
    let descr = if cfg!(target_endian = "little") {
        "<u4"
    } else {
        ">u4"
    };
    let dict = |rows: u64| {
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, 2), }}")
    };
    // Magic (6), version (2), length (2), dictionary, newline: a multiple of 64 bytes.
    let total = (10 + dict(u64::MAX).len() + 1).next_multiple_of(64);
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    h.extend_from_slice(dict(rows).as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Checks a kNN output extension before any work is done.
pub fn check_knn_output_path(path: &Path) -> Result<()> {
    match crate::input::extension(path).as_str() {
        "npz" | "csv" => Ok(()),
        other => bail!(
            "unknown kNN output format '.{other}' for {} (expected .npz or .csv)",
            path.display()
        ),
    }
}

pub fn write_knn(path: &Path, r: &KnnResult) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let written: Result<()> = (|| {
        let shape = [r.rows as u64, r.k as u64];
        if crate::input::extension(path) == "npz" {
            // An .npz is a zip of .npy members; numpy.load reads stored (uncompressed) ones.
            let mut zip = zip::ZipWriter::new(BufWriter::new(file));
            let member = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(true);
            zip.start_file("indices.npy", member)?;
            write_npy(&mut zip, &shape, r.indices.iter().copied())?;
            zip.start_file("distances.npy", member)?;
            match &r.distances {
                Distances::F32(d) => write_npy(&mut zip, &shape, d.iter().copied())?,
                Distances::F64(d) => write_npy(&mut zip, &shape, d.iter().copied())?,
            }
            zip.finish()?.flush()?;
        } else {
            let mut out = BufWriter::new(file);
            writeln!(out, "query,rank,neighbor,distance")?;
            for row in 0..r.rows {
                for (rank, &j) in r.row(row).iter().enumerate() {
                    // `{}` of a float is the shortest string that reads back exactly.
                    match &r.distances {
                        Distances::F32(d) => {
                            writeln!(out, "{row},{rank},{j},{}", d[row * r.k + rank])?
                        }
                        Distances::F64(d) => {
                            writeln!(out, "{row},{rank},{j},{}", d[row * r.k + rank])?
                        }
                    }
                }
            }
            out.flush()?;
        }
        Ok(())
    })();
    written.with_context(|| format!("cannot write {}", path.display()))
}

fn write_npy<T: npyz::Serialize + npyz::AutoSerialize>(
    out: &mut impl Write,
    shape: &[u64],
    values: impl Iterator<Item = T>,
) -> Result<()> {
    use npyz::WriterBuilder;
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(out)
        .begin_nd()?;
    w.extend(values)?;
    w.finish()?;
    Ok(())
}
