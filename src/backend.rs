//! The seam between the engine and its backends: what a join asks for ([`Job`]) and what
//! every backend implements ([`JoinBackend`]). The engine (`engine.rs`) and the backends
//! (`cpu/`, `gpu/`) both depend on this module and not on each other.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::knn::{KnnJob, KnnResult};
use crate::options::JoinOptions;
use crate::result::{Csr, Distances, JoinOutput, JoinReport, PairSink};

/// The form of a device-rows result ([`JoinBackend::rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowsForm {
    /// Sorted pairs: a self-join's `[i, j]` with `i < j`, A ⋈ B's `[a, b]`, ascending.
    Pairs,
    /// The CSR, every row sorted (a self-join's rows symmetric; with the diagonal when
    /// `include_self`).
    Csr { include_self: bool },
}

/// One join to run: A ⋈ A (self-join, `b == None`) or A ⋈ B. Dimensions and precision
/// of A and B were checked equal by the engine.
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

    /// The CSR of `job` (`opts.output == Csr`: rows, sorted and with the diagonal as
    /// `opts` asks; its distances too, where asked and made on the way, else `None`) where this backend builds it without streaming pairs (the CPU grid
    /// join: each query point's whole row at once); `None`: it does not for this job, and
    /// the caller builds it from streamed pairs.
    fn csr(&self, job: &Job) -> Result<Option<(Csr, Option<Distances>, JoinReport)>> {
        let _ = job;
        Ok(None)
    }

    /// Sorted pairs or the CSR of `job` made as rows sorted on the device (a GPU:
    /// `gpu/rows.rs`); `None`: this backend does not for this job, and the caller
    /// assembles streamed pairs.
    fn rows(&self, job: &Job, form: RowsForm) -> Result<Option<(JoinOutput, JoinReport)>> {
        let _ = (job, form);
        Ok(None)
    }

    /// Each point's number of neighbours within eps in the self-join `job` (the point
    /// itself included), where this backend counts them without handing pairs over (a
    /// GPU counts on the device); `None`: it does not, and a caller counts streamed pairs.
    fn neighbour_counts(&self, job: &Job) -> Result<Option<(Vec<u32>, JoinReport)>> {
        let _ = job;
        Ok(None)
    }

    /// DBSCAN's links where this backend makes them itself (a GPU, in a union-find on the
    /// device): the self-join `job` with each point's core flag; pairs of two core points
    /// are linked there, pairs of two non-core points dropped, the rest (border candidates,
    /// links left undone) go to `sink`; returns the forest (each point's parent, never
    /// above the point). `None`: it does not, and the caller links streamed pairs.
    fn link(
        &self,
        job: &Job,
        core: &[bool],
        sink: &mut dyn PairSink,
    ) -> Result<Option<(Vec<u32>, JoinReport)>> {
        let _ = (job, core, sink);
        Ok(None)
    }

    /// The comparisons of a grouped cosine join's plan (`cpu/partition/`), where this
    /// backend makes them itself (a GPU, `gpu/grouped.rs`): every candidate pair to `emit`;
    /// returns the report's note and the device's name. `None`: it does not, and the
    /// caller compares on the CPU.
    fn grouped(
        &self,
        plan: &crate::cpu::partition::Plan,
        opts: &JoinOptions,
        emit: &crate::cpu::partition::Candidates,
    ) -> Result<Option<(String, String)>> {
        let _ = (plan, opts, emit);
        Ok(None)
    }

    /// Each row of `x` (f32 unit vectors, `dim` wide)'s nearest of `leaders` and that f32
    /// dot product, for a grouped cosine join's plan (`cpu/partition/`), where this
    /// backend finds them itself (a GPU); `None`: it does not, and the CPU does.
    fn nearest_leaders(
        &self,
        x: &[f32],
        dim: usize,
        leaders: &[f32],
        control: &crate::control::Control,
    ) -> Result<Option<Vec<(u32, f32)>>> {
        let _ = (x, dim, leaders, control);
        Ok(None)
    }

    /// The exact k-nearest-neighbour join (see `knn.rs` for the answer's definition).
    /// `ErrorKind::Unsupported` when this backend has not the asked algorithm.
    fn knn(&self, job: &KnnJob) -> Result<KnnResult> {
        Err(Error::unsupported(format!(
            "this backend has no '{}' kNN algorithm",
            job.opts.algorithm
        )))
    }
}
