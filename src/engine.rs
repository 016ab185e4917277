//! The engine: validates a job, picks a backend, runs it into a sink, and assembles the
//! requested output form. Backends only produce pairs; everything shared lives here.

use crate::backend::{Job, JoinBackend, RowsForm};
use crate::cpu::CpuBackend;
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};
use crate::knn::{KnnJob, KnnOptions, KnnResult};
use crate::options::{Backend, JoinOptions, OutputForm};
use crate::result::radix::{CsrSink, SortingSink};
use crate::result::{assemble, entry_distances, CollectSink, JoinReport, JoinResult, PairSink};
use std::sync::OnceLock;
use std::time::Instant;

/// How to create an [`Engine`]: which device it owns, how many CPU threads, validation.
/// These are fixed for the engine's life; per-join choices are in [`JoinOptions`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineOptions {
    /// Vulkan device: index or case-insensitive name substring (see `simjoin info`).
    /// `None`: the `SIMJOIN_DEVICE` environment variable, else the best device.
    pub device: Option<String>,
    /// CPU worker threads. `None`: one per core.
    pub threads: Option<usize>,
    /// Vulkan validation layers. `None`: on when `SIMJOIN_VALIDATION` is set (not "0").
    pub validation: Option<bool>,
}

impl EngineOptions {
    pub fn validate(&self) -> Result<()> {
        if self.threads == Some(0) {
            return Err(Error::invalid("threads must be >= 1 when given"));
        }
        if self.device.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return Err(Error::invalid("device must not be empty when given"));
        }
        Ok(())
    }
}

/// The simjoin engine. It owns its CPU thread pool and its Vulkan context (device, queues,
/// memory, compiled kernels), both created on first use and released when the engine is
/// dropped. Engines are independent: several may live in one process, on the same or on
/// different devices. An `Engine` is `Send + Sync`: joins may run from several threads
/// at once.
pub struct Engine {
    options: EngineOptions,
    cpu: CpuBackend,
    /// The GPU backend on the engine's device, created on first GPU use (or the reason
    /// there is none, kept so that `auto` probes once).
    gpu: OnceLock<std::result::Result<Gpu, Error>>,
    /// Whether `auto` has a hardware GPU to use (asked once, without opening a device).
    auto_gpu: OnceLock<bool>,
}

/// A GPU backend and whether its device is a software rasterizer (never chosen by `auto`).
struct Gpu {
    backend: Box<dyn JoinBackend>,
    software: bool,
    /// Seconds opening the device took (reported by the join that opened it).
    open_seconds: f64,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with default options: the best device, one CPU thread per core.
    pub fn new() -> Self {
        Engine {
            options: EngineOptions::default(),
            cpu: CpuBackend::new(None),
            gpu: OnceLock::new(),
            auto_gpu: OnceLock::new(),
        }
    }

    /// An engine with `options` (checked here; the device is opened on first GPU use).
    pub fn with_options(options: EngineOptions) -> Result<Self> {
        options.validate()?;
        Ok(Engine {
            cpu: CpuBackend::new(options.threads),
            options,
            gpu: OnceLock::new(),
            auto_gpu: OnceLock::new(),
        })
    }

    /// Runs `f` on the engine's CPU thread pool (started on first use), so that rayon
    /// work inside it (DBSCAN's own passes) uses the engine's threads.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        self.cpu.install(f)
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Whether `auto` should try the engine's device: a hardware GPU is present there.
    pub(crate) fn auto_gpu(&self) -> bool {
        *self.auto_gpu.get_or_init(|| {
            #[cfg(feature = "gpu")]
            return crate::vk::hardware_gpu_present(self.options.device.as_deref());
            #[cfg(not(feature = "gpu"))]
            false
        })
    }

    /// The engine's GPU backend, opening the device on first use.
    fn gpu(&self) -> std::result::Result<&Gpu, &Error> {
        self.gpu
            .get_or_init(|| {
                #[cfg(feature = "gpu")]
                {
                    let t = Instant::now();
                    crate::gpu::open(&self.options).map(|(backend, software)| Gpu {
                        backend,
                        software,
                        open_seconds: t.elapsed().as_secs_f64(),
                    })
                }
                #[cfg(not(feature = "gpu"))]
                Err(Error::new(
                    ErrorKind::NoDevice,
                    "this simjoin library was built without the `gpu` feature",
                ))
            })
            .as_ref()
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

    /// The exact k-nearest-neighbour join: for each point of `query` (or, when `None`, of
    /// `data` itself, the point excluded), its `k` nearest points of `data`, nearest first,
    /// ties by smaller index. `k` larger than the candidates is an error.
    pub fn knn(
        &self,
        data: &Dataset,
        query: Option<&Dataset>,
        k: usize,
        opts: &KnnOptions,
    ) -> Result<KnnResult> {
        crate::options::check_sphere_radius(opts.metric, opts.sphere_radius)?;
        if opts.metric == crate::options::Metric::Haversine {
            // The Euclidean kNN of the f64 unit vectors, distances in metres (geo.rs).
            return crate::geo::knn(self, data, query, k, opts);
        }
        if opts.metric == crate::options::Metric::Cosine {
            // Through the grouped leaders' index on clustered rows, else the Euclidean kNN of
            // the normalised vectors re-ranked by the rule (src/cosine/).
            return crate::cosine::knn(self, data, query, k, opts);
        }
        let start = Instant::now();
        let job = KnnJob::new(data, query, k, opts)?;
        opts.control.begin();
        opts.control.check()?;
        // Large classes of exact copies: the distinct rows' kNN, expanded (knn.rs).
        if opts.algorithm == crate::options::Algorithm::Auto {
            if let Some(found) = crate::knn::with_copies(self, &job)? {
                return Ok(found);
            }
        }
        let mut result = match opts.backend {
            Backend::Cpu => self.cpu.knn(&job)?,
            Backend::Gpu => match self.gpu() {
                Ok(gpu) => gpu.backend.knn(&job)?,
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::NoDevice,
                        format!("no usable Vulkan device: {e}"),
                    ))
                }
            },
            Backend::Auto => match self.auto_gpu().then(|| self.gpu()) {
                Some(Ok(gpu)) if !gpu.software => match gpu.backend.knn(&job) {
                    Err(e) if e.kind() == ErrorKind::Unsupported => {
                        let mut r = self.cpu.knn(&job)?;
                        r.report.notes.push(format!(
                            "backend auto: the GPU could not run this kNN job ({e}), ran on the CPU"
                        ));
                        r
                    }
                    other => other?,
                },
                _ => self.cpu.knn(&job)?,
            },
        };
        // A backend's workers that saw the stop left rows undone.
        opts.control.check()?;
        result.report.seconds = start.elapsed().as_secs_f64();
        Ok(result)
    }

    fn collect(&self, a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> Result<JoinResult> {
        let start = Instant::now();
        if opts.output == OutputForm::Count {
            let report = self.run(a, b, opts, None)?;
            return Ok(JoinResult {
                output: crate::result::JoinOutput::Count(report.pairs),
                report,
                distances: None,
            });
        }
        // On a GPU, sorted pairs and the CSR come as rows sorted on the device.
        if let Some((output, report)) = self.device_rows(a, b, opts)? {
            return self.with_distances(a, b, opts, start, report, output, None);
        }
        // Sorted pairs and the CSR are bucketed as they arrive (`SortingSink`, `CsrSink`)
        // rather than collected and then sorted.
        let rows = a.len();
        let cols = b.unwrap_or(a).len();
        let sorting = (opts.output == OutputForm::Pairs && opts.sorted)
            .then(|| SortingSink::new(rows, cols))
            .flatten();
        // The CSR straight from the CPU grid join's whole rows where it runs (`cpu/rows.rs`).
        let rows_csr = if opts.output == OutputForm::Csr
            && !matches!(
                opts.metric,
                crate::options::Metric::Cosine | crate::options::Metric::Haversine
            )
            && crate::cpu::csr_rows_may_apply(a.dim())
            && self.runs_on_cpu(a, b, opts)?
            && csr_rows()
        {
            check_join(a, b, opts)?;
            opts.control.begin();
            let job = Job {
                a: *a,
                b: b.copied(),
                opts,
            };
            self.cpu.csr(&job)?
        } else {
            None
        };
        let csr = (opts.output == OutputForm::Csr && rows_csr.is_none())
            .then(|| CsrSink::new(rows, cols, b.is_none(), opts.include_self, opts.sorted))
            .flatten();
        let assembled = |report: &mut JoinReport, t: Instant| {
            report
                .phases
                .push(("assemble output".into(), t.elapsed().as_secs_f64()))
        };
        let mut made_distances = None;
        let (report, output) = if let Some((csr, distances, report)) = rows_csr {
            made_distances = distances;
            (report, crate::result::JoinOutput::Csr(csr))
        } else if let Some(mut sink) = sorting {
            let mut report = self.run(a, b, opts, Some(&mut sink))?;
            let t = Instant::now();
            let pairs = self.cpu.install(|| sink.finish())??;
            assembled(&mut report, t);
            (report, crate::result::JoinOutput::Pairs(pairs))
        } else if let Some(mut sink) = csr {
            let mut report = self.run(a, b, opts, Some(&mut sink))?;
            let t = Instant::now();
            let csr = self.cpu.install(|| sink.finish())??;
            assembled(&mut report, t);
            (report, crate::result::JoinOutput::Csr(csr))
        } else {
            let mut sink = CollectSink::default();
            let mut report = self.run(a, b, opts, Some(&mut sink))?;
            let t = Instant::now();
            // On the engine's threads, not the caller's alone.
            let output = self.cpu.install(|| {
                assemble(
                    sink.into_pairs()?,
                    opts.output,
                    b.is_none(),
                    rows,
                    opts.include_self,
                    opts.sorted,
                )
            })??;
            assembled(&mut report, t);
            (report, output)
        };
        self.with_distances(a, b, opts, start, report, output, made_distances)
    }

    /// A collected join's result: its distances (`made`, where the join produced them,
    /// else computed for the output's entries when asked) and its total time from `start`.
    #[expect(clippy::too_many_arguments, reason = "the parts of one collected join")]
    fn with_distances(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
        start: Instant,
        mut report: JoinReport,
        output: crate::result::JoinOutput,
        made: Option<crate::result::Distances>,
    ) -> Result<JoinResult> {
        opts.control.check()?;
        let distances = if made.is_some() {
            made
        } else if opts.distances {
            let t = Instant::now();
            let d = self
                .cpu
                .install(|| entry_distances(a, b.unwrap_or(a), opts, &output))??;
            report
                .phases
                .push(("distances".into(), t.elapsed().as_secs_f64()));
            d
        } else {
            None
        };
        report.seconds = start.elapsed().as_secs_f64();
        Ok(JoinResult {
            output,
            report,
            distances,
        })
    }

    /// Each point's number of neighbours within eps in the self-join of `a`, the point
    /// itself included (the count behind DBSCAN's core points and density-based outlier
    /// scores), and the join's report (`pairs`: the self-join's pair count). On a GPU
    /// the counts are made on the device: a count-only search of every adjacent cell, one
    /// count per point read back and no pair; on the CPU (and for GPU algorithms without a
    /// count-only form, LSS) they are counted from the streamed pairs. `opts.output`,
    /// `sorted` and `distances` do not apply.
    pub fn neighbour_counts(
        &self,
        a: &Dataset,
        opts: &JoinOptions,
    ) -> Result<(Vec<u32>, JoinReport)> {
        if let Some(out) = self.device_neighbour_counts(a, opts)? {
            return Ok(out);
        }
        struct Counter(Vec<u32>);
        impl PairSink for Counter {
            fn push(&mut self, chunk: &[crate::result::Pair]) -> anyhow::Result<()> {
                for &[i, j] in chunk {
                    // No overflow: a count is at most the number of points (< 2^32).
                    self.0[i as usize] += 1;
                    self.0[j as usize] += 1;
                }
                Ok(())
            }
        }
        let mut counts = Vec::new();
        counts.try_reserve_exact(a.len()).map_err(|_| {
            Error::new(
                ErrorKind::OutOfHostMemory,
                format!("cannot allocate {} neighbour counts", a.len()),
            )
        })?;
        counts.resize(a.len(), 1u32);
        let mut sink = Counter(counts);
        let report = self.self_join_stream(a, opts, &mut sink)?;
        Ok((sink.0, report))
    }

    /// [`Engine::neighbour_counts`] when the join runs on a GPU that counts on the
    /// device; `None` where a caller must count streamed pairs (DBSCAN then keeps its one
    /// pass that counts and links together).
    pub(crate) fn device_neighbour_counts(
        &self,
        a: &Dataset,
        opts: &JoinOptions,
    ) -> Result<Option<(Vec<u32>, JoinReport)>> {
        let start = Instant::now();
        check_join(a, None, opts)?;
        let job = Job {
            a: *a,
            b: None,
            opts,
        };
        let out = self.on_device(opts, |gpu| gpu.neighbour_counts(&job))?;
        Ok(out.map(|(counts, mut report)| {
            report.seconds = start.elapsed().as_secs_f64();
            (counts, report)
        }))
    }

    /// Sorted pairs or the CSR made as rows sorted on the device, where the join runs on a
    /// GPU (`Gpu`, or `Auto` where the cost model picks it) that makes them
    /// (`gpu/rows.rs`); `None` where the caller assembles streamed pairs instead.
    fn device_rows(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
    ) -> Result<Option<(crate::result::JoinOutput, JoinReport)>> {
        let form = match opts.output {
            OutputForm::Pairs if opts.sorted => RowsForm::Pairs,
            OutputForm::Csr => RowsForm::Csr {
                include_self: opts.include_self,
            },
            _ => return Ok(None),
        };
        // Cosine and haversine joins confirm streamed candidates (src/cosine/, geo.rs).
        if matches!(
            opts.metric,
            crate::options::Metric::Cosine | crate::options::Metric::Haversine
        ) {
            return Ok(None);
        }
        check_join(a, b, opts)?;
        let opened_before = self.gpu.get().is_some();
        let (gpu, note) = match opts.backend {
            Backend::Cpu => return Ok(None),
            Backend::Gpu => match self.gpu() {
                Ok(gpu) => (gpu, None),
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::NoDevice,
                        format!("no usable Vulkan device: {e}"),
                    ))
                }
            },
            Backend::Auto => match self.auto_route(a, b, opts, true)? {
                (Some(gpu), note) => (gpu, note),
                (None, _) => return Ok(None),
            },
        };
        opts.control.begin();
        opts.control.check()?;
        let job = Job {
            a: *a,
            b: b.copied(),
            opts,
        };
        // On the engine's threads: the rows are placed from them.
        let made = match self.cpu.install(|| gpu.backend.rows(&job, form))? {
            Err(e) if opts.backend == Backend::Auto && e.kind() == ErrorKind::Unsupported => {
                return Ok(None)
            }
            other => other?,
        };
        Ok(made.map(|(output, mut report)| {
            report.notes.extend(note);
            if !opened_before {
                // This call opened the device: a long-lived caller pays it once.
                report
                    .phases
                    .insert(0, ("device open (host clock)".into(), gpu.open_seconds));
            }
            (output, report)
        }))
    }

    /// DBSCAN's second pass on the GPU that counted the neighbours (`device_neighbour_counts`):
    /// see `JoinBackend::link`. `None` where the join does not run on such a GPU or its
    /// algorithm has no device links (LSS): the caller links streamed pairs.
    pub(crate) fn device_link(
        &self,
        a: &Dataset,
        opts: &JoinOptions,
        core: &[bool],
        sink: &mut dyn PairSink,
    ) -> Result<Option<(Vec<u32>, JoinReport)>> {
        let job = Job {
            a: *a,
            b: None,
            opts,
        };
        self.on_device(opts, |gpu| gpu.link(&job, core, sink))
    }

    /// `f` on the GPU backend where a join with `opts` runs on a GPU (as `run` picks it:
    /// `Gpu`, or `Auto` with a hardware GPU); `None` on the CPU, and under `Auto` where the
    /// GPU answers `Unsupported` (the CPU then does the work its own way).
    fn on_device<R>(
        &self,
        opts: &JoinOptions,
        f: impl FnOnce(&dyn JoinBackend) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        opts.validate()?;
        // Cosine and haversine joins confirm streamed candidates (src/cosine/, geo.rs):
        // nothing counted or linked on the device.
        if matches!(
            opts.metric,
            crate::options::Metric::Cosine | crate::options::Metric::Haversine
        ) {
            return Ok(None);
        }
        self.on_device_any_metric(opts, f)
    }

    /// [`Engine::on_device`] for any metric: cosine's grouped join (`src/cosine/`) compares
    /// its plan on the device this way.
    pub(crate) fn on_device_any_metric<R>(
        &self,
        opts: &JoinOptions,
        f: impl FnOnce(&dyn JoinBackend) -> Result<Option<R>>,
    ) -> Result<Option<R>> {
        match opts.backend {
            Backend::Cpu => Ok(None),
            Backend::Gpu => match self.gpu() {
                Ok(gpu) => f(gpu.backend.as_ref()),
                Err(e) => Err(Error::new(
                    ErrorKind::NoDevice,
                    format!("no usable Vulkan device: {e}"),
                )),
            },
            Backend::Auto => match self.auto_gpu().then(|| self.gpu()) {
                Some(Ok(gpu)) if !gpu.software => match f(gpu.backend.as_ref()) {
                    Err(e) if e.kind() == ErrorKind::Unsupported => Ok(None),
                    other => other,
                },
                _ => Ok(None),
            },
        }
    }

    /// The backend a join of `a` (with `b`, or a self-join) under `opts` runs on:
    /// `opts.backend` where it names one, else `Backend::Auto`'s choice for this job (the
    /// cost model; the device is opened where it picks the GPU). For callers that choose
    /// how to take the result (the CLI collects sorted pairs from a GPU, which sorts them
    /// on the device).
    pub fn backend_for(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
    ) -> Result<Backend> {
        Ok(match opts.backend {
            Backend::Auto if self.auto_route(a, b, opts, true)?.0.is_some() => Backend::Gpu,
            Backend::Auto => Backend::Cpu,
            other => other,
        })
    }

    /// Whether `opts.backend` runs this engine's joins on the CPU backend (`run`'s choice).
    fn runs_on_cpu(&self, a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> Result<bool> {
        Ok(match opts.backend {
            Backend::Cpu => true,
            Backend::Gpu => false,
            // The CSR's whole rows are the CPU's parallel output: a sink with parts.
            Backend::Auto => self.auto_route(a, b, opts, true)?.0.is_none(),
        })
    }

    /// `Backend::Auto`'s choice for this job: the GPU to run it on, or `None` for the CPU,
    /// and the cost model's note for the report (`None` when there is no GPU to weigh).
    /// A software device (lavapipe) is never a candidate, except for tests with
    /// `SIMJOIN_AUTO_ALLOW_SOFTWARE=1`. The device is opened only if the model picks it.
    fn auto_route(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
        parallel_sink: bool,
    ) -> Result<(Option<&Gpu>, Option<String>)> {
        let allow_software = std::env::var("SIMJOIN_AUTO_ALLOW_SOFTWARE").is_ok_and(|v| v == "1");
        let candidate = self.auto_gpu() || (allow_software && self.gpu().is_ok());
        if !candidate {
            return Ok((None, None));
        }
        let table = crate::auto::CostTable::from_env().map_err(Error::invalid)?;
        let shape = crate::auto::JobShape {
            queries: a.len(),
            indexed: b.map_or(a.len(), |b| b.len()),
            dim: a.dim(),
            pairs: crate::auto::estimate_pairs(a, b, opts),
            output: opts.output,
            parallel_sink,
        };
        let threads = self.cpu.install(rayon::current_num_threads)?;
        let open = self.gpu.get().is_some_and(|g| g.is_ok());
        let choice = crate::auto::choose(&table, &shape, threads, open);
        if !choice.gpu {
            return Ok((None, Some(choice.reason)));
        }
        match self.gpu() {
            Ok(gpu) if !gpu.software || allow_software => Ok((Some(gpu), Some(choice.reason))),
            _ => Ok((
                None,
                Some(format!(
                    "{}; no usable hardware GPU, ran on the CPU",
                    choice.reason
                )),
            )),
        }
    }

    fn run(
        &self,
        a: &Dataset,
        b: Option<&Dataset>,
        opts: &JoinOptions,
        sink: Option<&mut dyn PairSink>,
    ) -> Result<JoinReport> {
        let start = Instant::now();
        check_join(a, b, opts)?;
        if opts.metric == crate::options::Metric::Cosine {
            // A Euclidean join of normalised copies, each candidate confirmed (src/cosine/).
            let mut report = crate::cosine::run(self, a, b, opts, sink)?;
            report.seconds = start.elapsed().as_secs_f64();
            return Ok(report);
        }
        if opts.metric == crate::options::Metric::Haversine {
            // A Euclidean join of the f64 unit vectors, each candidate confirmed (geo.rs).
            let mut report = crate::geo::run(self, a, b, opts, sink)?;
            report.seconds = start.elapsed().as_secs_f64();
            return Ok(report);
        }
        opts.control.begin();
        opts.control.check()?;
        let job = Job {
            a: *a,
            b: b.copied(),
            opts,
        };
        let opened_before = self.gpu.get().is_some();
        let mut report = match opts.backend {
            Backend::Cpu => self.cpu.run(&job, sink)?,
            // On the engine's threads: the GPU backend pushes batches to a sink's parts
            // from them.
            Backend::Gpu => match self.gpu() {
                Ok(gpu) => self.cpu.install(|| gpu.backend.run(&job, sink))??,
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::NoDevice,
                        format!("no usable Vulkan device: {e}"),
                    ))
                }
            },
            // The cost model's choice between the CPU and a hardware GPU (`auto.rs`).
            Backend::Auto => {
                let mut sink = sink;
                let threads = self.cpu.install(rayon::current_num_threads)?;
                let parallel_sink = sink
                    .as_deref_mut()
                    .is_some_and(|s| !s.parts(threads).is_empty());
                let (gpu, note) = self.auto_route(a, b, opts, parallel_sink)?;
                let mut report = match gpu {
                    Some(gpu) => self
                        .cpu
                        .install(|| self.run_gpu_or_cpu(gpu.backend.as_ref(), &job, sink))??,
                    None => self.cpu.run(&job, sink)?,
                };
                report.notes.extend(note);
                report
            }
        };
        // Workers that saw the stop left their work undone: what came out is not the answer.
        opts.control.check()?;
        if let (false, Some(Ok(gpu)), "vulkan") =
            (opened_before, self.gpu.get(), report.backend.as_str())
        {
            // This call opened the device: a long-lived caller pays it once.
            report
                .phases
                .insert(0, ("device open (host clock)".into(), gpu.open_seconds));
        }
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
            // The GPU backend asks for parts only to push a batch's pairs to them.
            fn parts(&mut self, workers: usize) -> Vec<&mut dyn PairSink> {
                let parts = self.inner.parts(workers);
                self.pushed |= !parts.is_empty();
                parts
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
                let mut report = self.cpu.run(job, watch.map(|w| w.inner))?;
                report.notes.push(format!(
                    "backend auto: the GPU could not run this job ({e}), ran on the CPU"
                ));
                Ok(report)
            }
            other => other,
        }
    }
}

/// The CPU's CSR from whole rows (`cpu/rows.rs`), unless `SIMJOIN_CSR_ROWS=0` asks for the
/// CSR from streamed pairs (`radix::CsrSink`) instead: for measurements.
fn csr_rows() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SIMJOIN_CSR_ROWS").is_none_or(|v| v != "0"))
}

/// What every join checks before a backend runs: the options, A and B alike in dimensions
/// and precision, and an eps the data's precision can compare exactly.
pub(crate) fn check_join(a: &Dataset, b: Option<&Dataset>, opts: &JoinOptions) -> Result<()> {
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
    if opts.metric == crate::options::Metric::Haversine {
        crate::metric::check_geo_eps(opts.eps, opts.sphere_radius, a.precision())
    } else {
        crate::metric::check_eps(opts.metric, opts.eps, a.precision())
    }
}
