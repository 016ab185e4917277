//! Writing results: pairs as .npy ((m, 2) uint32) or .csv (header "i,j", one pair per
//! line); kNN answers as .npz (arrays `indices` and `distances`, (m, k) each, stored
//! uncompressed as NumPy's `savez` does) or .csv ("query,rank,neighbor,distance").

use anyhow::{bail, Context, Result};
use simjoin::{Distances, KnnResult, Pair};
use std::io::{BufWriter, Write};
use std::path::Path;

/// Checks the output extension before any work is done.
pub fn check_output_path(path: &Path) -> Result<()> {
    match crate::input::extension(path).as_str() {
        "npy" | "csv" => Ok(()),
        other => bail!(
            "unknown output format '.{other}' for {} (expected .npy or .csv)",
            path.display()
        ),
    }
}

pub fn write_pairs(path: &Path, pairs: &[Pair]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let written: Result<()> = (|| {
        match crate::input::extension(path).as_str() {
            "npy" => {
                use npyz::WriterBuilder;
                let mut w = npyz::WriteOptions::<u32>::new()
                    .default_dtype()
                    .shape(&[pairs.len() as u64, 2])
                    .writer(&mut out)
                    .begin_nd()?;
                w.extend(pairs.iter().flatten().copied())?;
                w.finish()?;
            }
            _ => {
                writeln!(out, "i,j")?;
                for [i, j] in pairs {
                    writeln!(out, "{i},{j}")?;
                }
            }
        }
        out.flush()?;
        Ok(())
    })();
    written.with_context(|| format!("cannot write {}", path.display()))
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
