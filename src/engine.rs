//! The engine: validates a job, picks a backend, runs it into a sink, and assembles the
//! requested output form. Backends only produce pairs; everything shared lives here.

use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Backend, JoinOptions, OutputForm};
use crate::result::{assemble, JoinReport, JoinResult, PairSink, VecSink};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// One join to run: A ⋈ A (self-join, `b == None`) or A ⋈ B.
pub(crate) struct Job<'a> {
    pub a: Dataset<'a>,
    pub b: Option<Dataset<'a>>,
    pub opts: &'a JoinOptions,
}

/// What every backend implements. `sink == None` means count only: the backend need not
/// materialise pairs, only count them into `JoinReport::pairs`.
/// Self-join pairs must come out as `[i, j]` with `i < j`, each unordered pair once.
pub(crate) trait JoinBackend: Send + Sync {
    fn run(&self, job: &Job, sink: Option<&mut dyn PairSink>) -> Result<JoinReport>;
}

/// The simjoin engine. Cheap to create; the Vulkan context is created on first GPU use and
/// kept. An `Engine` is `Send + Sync`: joins may run from several threads at once.
pub struct Engine {
    gpu: OnceLock<Option<Arc<dyn JoinBackend>>>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    pub fn new() -> Self {
        Engine {
            gpu: OnceLock::new(),
        }
    }

    /// Self-join A ⋈ A.
    pub fn self_join(&self, a: &Dataset, opts: &JoinOptions) -> Result<JoinResult> {
        self.collect(a, None, opts)
    }

    /// Join A ⋈ B: pairs (i in A, j in B).
    pub fn join(&self, a: &Dataset, b: &Dataset, opts: &JoinOptions) -> Result<JoinResult> {
        self.collect(a, Some(b), opts)
    }

    /// Self-join streaming unique pairs (i < j) into `sink` as they are produced.
    /// `opts.output` and `opts.sorted` are ignored: chunks come in no particular order.
    pub fn self_join_stream(
        &self,
        a: &Dataset,
        opts: &JoinOptions,
        sink: &mut dyn PairSink,
    ) -> Result<JoinReport> {
        self.run(a, None, opts, Some(sink))
    }

    /// A ⋈ B streaming pairs (i in A, j in B) into `sink`.
    pub fn join_stream(
        &self,
        a: &Dataset,
        b: &Dataset,
        opts: &JoinOptions,
        sink: &mut dyn PairSink,
    ) -> Result<JoinReport> {
        self.run(a, Some(b), opts, Some(sink))
    }

    fn collect(&self, a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> Result<JoinResult> {
        let start = Instant::now();
        if opts.output == OutputForm::Count {
            let report = self.run(a, b, opts, None)?;
            return Ok(JoinResult {
                output: crate::result::JoinOutput::Count(report.pairs),
                report,
            });
        }
        let mut sink = VecSink::default();
        let mut report = self.run(a, b, opts, Some(&mut sink))?;
        let t = Instant::now();
        let output = assemble(
            sink.pairs,
            opts.output,
            b.is_none(),
            a.len(),
            opts.include_self,
            opts.sorted,
        )?;
        report
            .phases
            .push(("assemble output".into(), t.elapsed().as_secs_f64()));
        report.seconds = start.elapsed().as_secs_f64();
        Ok(JoinResult { output, report })
    }

    fn run(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
        sink: Option<&mut dyn PairSink>,
    ) -> Result<JoinReport> {
        let start = Instant::now();
        opts.validate()?;
        if let Some(b) = b {
            if b.dim() != a.dim() {
                return Err(Error::invalid(format!(
                    "A has {} dimensions but B has {}",
                    a.dim(),
                    b.dim()
                )));
            }
            if b.precision() != a.precision() {
                return Err(Error::invalid(
                    "A and B must have the same coordinate precision (both f32 or both f64)",
                ));
            }
        }
        let job = Job {
            a: *a,
            b: b.copied(),
            opts,
        };
        let cpu = || crate::cpu::CpuBackend::new(opts.threads);
        let mut report = match opts.backend {
            Backend::Cpu => cpu().run(&job, sink)?,
            Backend::Gpu => crate::gpu::backend(opts, true)?
                .ok_or_else(|| Error::new(ErrorKind::NoDevice, "no Vulkan device found"))?
                .run(&job, sink)?,
            // A real GPU when present (probed once per engine: creating a Vulkan instance is
            // not free), else the CPU.
            Backend::Auto => match self
                .gpu
                .get_or_init(|| crate::gpu::backend(opts, false).ok().flatten())
            {
                Some(gpu) => self.run_gpu_or_cpu(gpu.as_ref(), &job, sink)?,
                None => cpu().run(&job, sink)?,
            },
        };
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// `Backend::Auto` on a GPU that cannot do this job (f64 without shaderFloat64, an
    /// algorithm only the CPU has) falls back to the CPU backend, as long as no pair has
    /// reached the caller's sink yet.
    fn run_gpu_or_cpu(
        &self,
        gpu: &dyn JoinBackend,
        job: &Job,
        sink: Option<&mut dyn PairSink>,
    ) -> Result<JoinReport> {
        struct Watch<'s> {
            inner: &'s mut dyn PairSink,
            pushed: bool,
        }
        impl PairSink for Watch<'_> {
            fn push(&mut self, chunk: &[crate::result::Pair]) -> anyhow::Result<()> {
                self.pushed |= !chunk.is_empty();
                self.inner.push(chunk)
            }
        }
        let mut watch = sink.map(|inner| Watch {
            inner,
            pushed: false,
        });
        let first = gpu.run(job, watch.as_mut().map(|w| w as &mut dyn PairSink));
        match first {
            Err(e)
                if e.kind() == ErrorKind::Unsupported
                    && !watch.as_ref().is_some_and(|w| w.pushed) =>
            {
                let cpu = crate::cpu::CpuBackend::new(job.opts.threads);
                let mut report = cpu.run(job, watch.map(|w| w.inner))?;
                report.notes.push(format!(
                    "backend auto: the GPU could not run this job ({e}), ran on the CPU"
                ));
                Ok(report)
            }
            other => other,
        }
    }
}
