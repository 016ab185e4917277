//! The native CPU backend: multi-threaded grid join, EGO*-join and brute force. It is the
//! default without a GPU and the reference the GPU paths are tested against.

mod brute;

use crate::engine::{Job, JoinBackend};
use crate::error::{Error, Result};
use crate::options::Algorithm;
use crate::result::{JoinReport, PairSink};

pub(crate) struct CpuBackend {
    threads: Option<usize>,
}

impl CpuBackend {
    pub fn new(threads: Option<usize>) -> Self {
        CpuBackend { threads }
    }

    fn pool(&self) -> Result<rayon::ThreadPool> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads.unwrap_or(0))
            .build()
            .map_err(|e| Error::from(anyhow::anyhow!("cannot start CPU worker threads: {e}")))
    }
}

impl JoinBackend for CpuBackend {
    fn run(&self, job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport> {
        let algorithm = match job.opts.algorithm {
            Algorithm::Auto => Algorithm::Brute,
            a => a,
        };
        let pool = self.pool()?;
        let mut report = match algorithm {
            Algorithm::Brute => pool.install(|| brute::run(job, sink))?,
            other => {
                return Err(Error::unsupported(format!(
                    "the CPU backend has no '{other}' algorithm yet"
                )))
            }
        };
        report.backend = "cpu".into();
        report.device = format!("cpu ({} threads)", pool.current_num_threads());
        report.algorithm = algorithm;
        report.batches = report.batches.max(1);
        Ok(report)
    }
}
