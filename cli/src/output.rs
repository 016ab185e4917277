//! Writing result pairs: .npy ((m, 2) uint32) or .csv (header "i,j", one pair per line).

use anyhow::{bail, Context, Result};
use simjoin::Pair;
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
