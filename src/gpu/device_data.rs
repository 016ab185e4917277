//! What a GPU join puts on the device: the indexed points R and the queries Q with the
//! grid index arrays (B cell ids, G cell ranges, A point lookup, M masks), or the raw
//! points for brute force; and the order in which kernels bind them
//! (`interface::binding`).

use super::device_index;
use super::dot_filter;
use super::index::{plan_grid, GridIndex};
use super::interface::{binding, flags};
use crate::backend::Job;
use crate::control::Control;
use crate::dataset::{Coords, Dataset};
use crate::error::{Error, Result};
use crate::grid::GridGeometry;
use crate::metric::{threshold, Coord};
use crate::options::IndexBuild;
use crate::result::JoinReport;
use crate::vk::{Buffer, BufferRange, Context, Ticket, Uploads};
use std::sync::Arc;

/// Everything the kernel reads, on the device. Buffers are shared (`Arc`): every dispatch
/// that binds them keeps them alive until it has run.
pub(super) struct DeviceData {
    pub r_coords: Arc<Buffer>,
    pub q_coords: Option<Arc<Buffer>>,
    pub cell_keys: Arc<Buffer>,
    pub cell_ranges: Arc<Buffer>,
    pub r_ids: Arc<Buffer>,
    pub q_ids: Option<Arc<Buffer>>,
    pub q_cells: Option<Arc<Buffer>>,
    pub meta: Arc<Buffer>,
    /// The dot-product filter's copies (`dot_filter.rs`), when it runs.
    pub r_dot: Option<Arc<Buffer>>,
    pub q_dot: Option<Arc<Buffer>>,
    /// DBSCAN's links on the device (FLAG_LINK): core flags and the union-find forest,
    /// by point id.
    pub link: Option<Link>,
}

/// The buffers of FLAG_LINK (`join::link`).
pub(super) struct Link {
    pub core: Arc<Buffer>,
    pub parent: Arc<Buffer>,
}

impl DeviceData {
    /// The kernel's bindings, in `interface::binding` order, with a slot's result,
    /// counter and state buffers. A self-join binds R for Q; unused arrays bind a stand-in.
    pub(super) fn bindings(
        &self,
        results: &Arc<Buffer>,
        counters: &Arc<Buffer>,
        states: &Arc<Buffer>,
    ) -> Vec<BufferRange> {
        let mut b: Vec<(u32, BufferRange)> = vec![
            (binding::R_COORDS, self.r_coords.all()),
            (
                binding::Q_COORDS,
                self.q_coords.as_ref().unwrap_or(&self.r_coords).all(),
            ),
            (binding::CELL_KEYS, self.cell_keys.all()),
            (binding::CELL_RANGES, self.cell_ranges.all()),
            (binding::R_IDS, self.r_ids.all()),
            (
                binding::Q_IDS,
                self.q_ids.as_ref().unwrap_or(&self.r_ids).all(),
            ),
            (
                binding::Q_CELLS,
                self.q_cells.as_ref().unwrap_or(&self.meta).all(),
            ),
            (binding::META, self.meta.all()),
            (binding::RESULTS, results.all()),
            (binding::COUNTERS, counters.all()),
            (binding::STATES, states.all()),
            // LSS kNN only (glsl/lss.glsl): stand-ins.
            (binding::Q_LIMITS, self.meta.all()),
            (binding::Q_RADII, self.meta.all()),
            (
                binding::R_DOT,
                self.r_dot.as_ref().unwrap_or(&self.meta).all(),
            ),
            (
                binding::Q_DOT,
                self.q_dot
                    .as_ref()
                    .or(self.r_dot.as_ref())
                    .unwrap_or(&self.meta)
                    .all(),
            ),
            (
                binding::LINK_CORE,
                self.link.as_ref().map_or(&self.meta, |l| &l.core).all(),
            ),
            (
                binding::LINK_PARENT,
                self.link.as_ref().map_or(&self.meta, |l| &l.parent).all(),
            ),
        ];
        b.sort_by_key(|(i, _)| *i);
        debug_assert!(b.iter().enumerate().all(|(i, (n, _))| i as u32 == *n));
        debug_assert_eq!(b.len() as u32, binding::COUNT);
        b.into_iter().map(|(_, r)| r).collect()
    }
}

/// Fails when a kernel could not bind `bytes` of `name` at once.
pub(super) fn check_binding(ctx: &Context, bytes: u64, name: &str) -> Result<()> {
    let limit = ctx.limits().max_storage_buffer_range;
    if bytes > limit {
        return Err(Error::unsupported(format!(
            "{name} needs {bytes} bytes, more than this device binds at once ({limit}); \
             use the CPU backend or split the data"
        )));
    }
    Ok(())
}

/// Uploads `data` (never empty: Vulkan bindings cannot be), checking the binding limit.
fn upload<T: bytemuck::Pod>(uploads: &mut Uploads, data: &[T], name: &str) -> Result<Arc<Buffer>> {
    check_binding(uploads.context(), std::mem::size_of_val(data) as u64, name)?;
    if data.is_empty() {
        return uploads.upload(&[0u32], name);
    }
    uploads.upload(data, name)
}

/// Row-major coordinates of `data` as `T` (the precision was checked by the caller).
pub(super) fn coords_of<'a, T: Coord>(data: &Dataset<'a>) -> &'a [T] {
    match data.coords() {
        Coords::F32(x) => bytemuck::cast_slice(x),
        Coords::F64(x) => bytemuck::cast_slice(x),
    }
}

fn gather<T: Coord>(coords: &[T], dim: usize, order: &[u32]) -> Vec<T> {
    let mut out = Vec::with_capacity(order.len() * dim);
    for &i in order {
        out.extend_from_slice(&coords[i as usize * dim..(i as usize + 1) * dim]);
    }
    out
}

/// The device data of one join and the kernel parameters that come with it.
pub(super) struct Prepared {
    pub data: DeviceData,
    /// Non-empty cells (grid) or indexed points (brute force).
    pub n_cells: u32,
    /// Query points.
    pub nq: usize,
    pub flags: u32,
    /// Indexed dimensions (spec constant K).
    pub k: u32,
    pub sort_dim: u32,
    /// Reached when every upload has landed: the join's streams wait for it.
    pub ready: Ticket,
    /// The job's uploads (their staging buffers return to the pool when it is dropped).
    pub uploads: Uploads,
    /// Grid: where the index was built.
    pub index_build: Option<IndexBuild>,
    /// Bytes read back while preparing.
    pub bytes_down: u64,
    /// The dot-product filter's cutoff G when it runs (FLAG_DOT_FILTER is set).
    pub dot_cutoff: Option<f32>,
    /// A device-built index's kernels on the GPU clock, where the queue has timestamps.
    pub gpu_index_build: Option<f64>,
    /// Grid: seconds choosing the indexed dimensions (sampled variances, the cost model).
    pub planning: f64,
}

/// Below this many points (indexed + queries), `IndexBuild::Auto` builds on the host: the
/// device build costs a dozen dispatches and two round trips whatever the size. A guess
/// until measured on a real GPU (lavapipe cannot tell: it always builds on the host).
const DEVICE_INDEX_MIN_POINTS: usize = 1 << 16;

/// Where to build the grid index, and why (for the report's notes). `SIMJOIN_GPU_INDEX=
/// host|device` replaces `Auto` (to run whole test suites under either build).
fn choose_build(
    ctx: &Context,
    requested: IndexBuild,
    points: usize,
    cannot: Option<String>,
) -> Result<(IndexBuild, String)> {
    let requested = match (requested, std::env::var("SIMJOIN_GPU_INDEX")) {
        (IndexBuild::Auto, Ok(v)) => v.parse()?,
        (r, _) => r,
    };
    Ok(match (requested, cannot) {
        (IndexBuild::Host, _) => (IndexBuild::Host, "asked for".into()),
        (IndexBuild::Device, Some(why)) => {
            return Err(Error::unsupported(format!(
                "the grid index cannot be built on the device: {why}"
            )))
        }
        (IndexBuild::Device, None) => (IndexBuild::Device, "asked for".into()),
        (IndexBuild::Auto, Some(why)) => (IndexBuild::Host, why),
        (IndexBuild::Auto, None) if ctx.is_software() => (
            IndexBuild::Host,
            "a software device: the host's threads build it faster".into(),
        ),
        (IndexBuild::Auto, None) if points < DEVICE_INDEX_MIN_POINTS => (
            IndexBuild::Host,
            format!("fewer than {DEVICE_INDEX_MIN_POINTS} points"),
        ),
        (IndexBuild::Auto, None) => (IndexBuild::Device, "automatic".into()),
    })
}

/// Grid: plans the index over R (A ⋈ B indexes the smaller set where `may_swap`; pairs
/// are swapped back),
/// builds it on the host or the device with the queries sorted by cell, and uploads what
/// it needs through `uploads`.
pub(super) fn prepare_grid<T: Coord>(
    ctx: &Arc<Context>,
    mut uploads: Uploads,
    job: &Job,
    may_swap: bool,
    report: &mut JoinReport,
    upload_seconds: &mut f64,
) -> Result<Prepared> {
    let (opts, dim, eps, self_join) = (job.opts, job.a.dim(), job.opts.eps, job.b.is_none());
    let (r, q, swap) = match job.b {
        None => (job.a, job.a, false),
        Some(b) if b.len() <= job.a.len() || !may_swap => (b, job.a, false),
        Some(b) => (job.a, b, true),
    };
    let t_plan = std::time::Instant::now();
    // The host's planning and build take a second or more at a few hundred thousand points
    // (several on a loaded machine): a stop is seen between their steps. The copies queued
    // by then hold their buffers, and dropping `uploads` waits for them.
    let plan = plan_grid(&r, &q, self_join, eps, opts.indexed_dims, &opts.control)?;
    let planning = t_plan.elapsed().as_secs_f64();
    opts.control.check()?;
    if let Some(k) = opts.indexed_dims {
        if k > plan.geom.k() {
            report
                .notes
                .push(format!("indexed_dims {k} reduced to {}", plan.geom.k()));
        }
    }
    report.notes.push(format!(
        "grid: k = {} indexed dims {:?}{}, SORTIDU on dim {:?}",
        plan.geom.k(),
        plan.geom.dims,
        if plan.costs.is_empty() {
            " (forced)"
        } else {
            " (cost model)"
        },
        plan.sort_dim
    ));
    if !plan.costs.is_empty() {
        let costs: Vec<String> = plan
            .costs
            .iter()
            .map(|c| {
                format!(
                    "k={}: {} cells, {:.3e} ops",
                    c.k,
                    c.nonempty_cells,
                    c.total()
                )
            })
            .collect();
        report.notes.push(format!(
            "cost model (search + compare memory ops): {}",
            costs.join("; ")
        ));
    }
    // REORDER in the distance test pays when the variance order is not the dataset's.
    let share = plan.top_quarter_share;
    let reorder = variance_order_helps(&plan.variance_order, share);
    let k = plan.geom.k();
    let nq = q.len();
    let cannot = device_index::unsupported_because(ctx, r.len(), nq, dim, k, size_of::<T>());
    let (build, why) = choose_build(ctx, opts.index_build, r.len() + nq, cannot)?;
    let queries = (!self_join).then_some(&q);
    let (data, n_cells, bytes_down, gpu_index_build) = match build {
        IndexBuild::Device => {
            let built = device_index::build::<T>(
                ctx,
                &mut uploads,
                &r,
                queries,
                &plan.geom,
                plan.sort_dim,
                &plan.variance_order,
            )?;
            (
                built.data,
                built.n_cells,
                built.bytes_down,
                built.gpu_seconds,
            )
        }
        _ => {
            let (data, n_cells) = host_index::<T>(
                &mut uploads,
                &r,
                queries,
                plan.geom.clone(),
                plan.sort_dim,
                &plan.variance_order,
                &opts.control,
            )?;
            (data, n_cells, 0, None)
        }
    };
    // The host's part of the uploads (writes into staging or mapped memory); the copies
    // themselves overlap the build.
    *upload_seconds += uploads.host_seconds();
    report.notes.push(format!(
        "grid index built on the {build} ({why}): {n_cells} non-empty cells over {} points",
        r.len()
    ));
    let mut bits = if self_join { flags::FLAG_SELF } else { 0 } | flags::FLAG_SORTIDU;
    if reorder {
        bits |= flags::FLAG_REORDER;
        report
            .notes
            .push("REORDER: distance rejected in variance order first".into());
    } else {
        report.notes.push(format!(
            "REORDER: distance in dataset order (top quarter of dims holds {:.0}% of the variance)",
            100.0 * share
        ));
    }
    if swap {
        bits |= flags::FLAG_SWAP;
    }
    opts.control.check()?;
    let mut data = data;
    let thr = threshold::<T>(opts.metric, eps);
    // A software device's loop budget must cover a thread's least work with the filter's
    // extra pass over the dims; where it does not (lavapipe past about 1,400 dims), the
    // join runs without the filter rather than not at all.
    let (_, budget) = super::join::workgroup_and_budget(ctx);
    let log_cells = super::join::log_cells(r.len().max(q.len()));
    let filter_fits =
        budget == 0 || super::join::least_work(dim, k as u32, log_cells, true) <= budget;
    let dot = dot_filter::prepare(
        &mut uploads,
        &r,
        queries,
        opts.metric,
        thr,
        filter_fits,
        &mut report.notes,
    )?;
    let dot_cutoff = dot.map(|f| {
        bits |= flags::FLAG_DOT_FILTER;
        (data.r_dot, data.q_dot) = (Some(f.r_dot), f.q_dot);
        f.cutoff
    });
    Ok(Prepared {
        data,
        n_cells,
        nq,
        flags: bits,
        k: k as u32,
        sort_dim: plan.sort_dim.unwrap_or(0) as u32,
        ready: uploads.submit()?,
        uploads,
        index_build: Some(build),
        bytes_down,
        dot_cutoff,
        gpu_index_build,
        planning,
    })
}

/// The host build (`index.rs`): the index of `r`, the queries `q` (A ⋈ B) sorted by cell,
/// and the uploads of both. Returns the device data and the number of non-empty cells.
fn host_index<T: Coord>(
    uploads: &mut Uploads,
    r: &Dataset,
    q: Option<&Dataset>,
    geom: GridGeometry,
    sort_dim: Option<usize>,
    variance_order: &[usize],
    control: &Control,
) -> Result<(DeviceData, u32)> {
    let dim = r.dim();
    let idx = GridIndex::build(r, geom, sort_dim);
    control.check()?;
    // Each array goes up (its copy queued) as soon as it exists, while the host goes on.
    let cell_keys = upload(uploads, &idx.cell_keys, "cell ids (B)")?;
    let cell_ranges = upload(uploads, &idx.cell_ranges, "cell ranges (G)")?;
    let r_ids = upload(uploads, &idx.order, "point lookup (A)")?;
    uploads.submit()?;
    let r_coords = upload(
        uploads,
        &gather(coords_of::<T>(r), dim, &idx.order),
        "indexed points",
    )?;
    let mut meta: Vec<u32> = idx.geom.cells.iter().map(|&c| c as u32).collect();
    meta.extend_from_slice(&idx.mask_offsets);
    meta.extend(variance_order.iter().map(|&j| j as u32));
    meta.extend_from_slice(&idx.mask_coords);
    let meta = upload(uploads, &meta, "grid masks (M)")?;
    uploads.submit()?;
    control.check()?;
    let (q_coords, q_ids, q_cells) = match q {
        None => (None, None, idx.query_cells(r, &idx.order)),
        Some(q) => {
            // Queries sorted by cell too: neighbouring threads search the same cells.
            let mut order: Vec<u32> = (0..q.len() as u32).collect();
            let cells = idx.query_cells(q, &order);
            let k = idx.k().max(1);
            // Linear ids of the query cells (the same row-major order as GridGeometry's).
            let keys: Vec<u64> = cells
                .chunks(k)
                .map(|c| {
                    c.iter()
                        .zip(&idx.geom.cells)
                        .fold(0u64, |id, (&x, &n)| id * n + x as u64)
                })
                .collect();
            order.sort_unstable_by_key(|&p| (keys[p as usize], p));
            let sorted_cells: Vec<u32> = order
                .iter()
                .flat_map(|&p| &cells[p as usize * k..(p as usize + 1) * k])
                .copied()
                .collect();
            let q_coords = upload(
                uploads,
                &gather(coords_of::<T>(q), dim, &order),
                "query points",
            )?;
            let q_ids = upload(uploads, &order, "query ids")?;
            (Some(q_coords), Some(q_ids), sorted_cells)
        }
    };
    let q_cells = upload(uploads, &q_cells, "query cells")?;
    Ok((
        DeviceData {
            r_coords,
            q_coords,
            cell_keys,
            cell_ranges,
            r_ids,
            q_ids,
            q_cells: Some(q_cells),
            meta,
            r_dot: None,
            q_dot: None,
            link: None,
        },
        idx.cell_keys.len() as u32,
    ))
}

/// Brute force: R = B (or A), Q = A, in input order; ids are positions. Adds the host's
/// upload time to `upload_seconds`.
pub(super) fn prepare_brute<T: Coord>(
    mut uploads: Uploads,
    job: &Job,
    upload_seconds: &mut f64,
) -> Result<Prepared> {
    let r = job.b.unwrap_or(job.a);
    let dummy = [0u32];
    let data = DeviceData {
        r_coords: upload(&mut uploads, coords_of::<T>(&r), "points")?,
        q_coords: match job.b {
            Some(_) => Some(upload(
                &mut uploads,
                coords_of::<T>(&job.a),
                "query points",
            )?),
            None => None,
        },
        cell_keys: upload(&mut uploads, &dummy, "unused")?,
        cell_ranges: upload(&mut uploads, &dummy, "unused")?,
        r_ids: upload(&mut uploads, &dummy, "unused")?,
        q_ids: None,
        q_cells: None,
        meta: upload(&mut uploads, &dummy, "unused")?,
        r_dot: None,
        q_dot: None,
        link: None,
    };
    *upload_seconds += uploads.host_seconds();
    Ok(Prepared {
        data,
        n_cells: r.len() as u32,
        nq: job.a.len(),
        flags: if job.b.is_none() { flags::FLAG_SELF } else { 0 },
        k: 1,
        sort_dim: 0,
        ready: uploads.submit()?,
        uploads,
        index_build: None,
        bytes_down: 0,
        dot_cutoff: None,
        gpu_index_build: None,
        planning: 0.0,
    })
}

/// Whether rejecting in variance order first is worth a second (canonical) pass on the
/// survivors: when that order differs from the dataset's and a quarter of the dimensions
/// hold at least half of the variance (measured on lavapipe, d = 32, n = 10000: 1.5x
/// faster on such data, 1.5x slower on clusters with equal spread in every dimension).
/// `SIMJOIN_GPU_REORDER=0|1` forces it off or on (to measure what it brings).
fn variance_order_helps(order: &[usize], top_quarter_share: f64) -> bool {
    // Below 4 dimensions there is no "few of many" to reject on early.
    let differs = order.len() >= 4 && order.iter().enumerate().any(|(i, &j)| i != j);
    match std::env::var("SIMJOIN_GPU_REORDER").as_deref() {
        Ok("0") => false,
        Ok("1") => differs,
        _ => differs && top_quarter_share >= 0.5,
    }
}

/// A grid join's index arrays as the kernels read them (bytes of the coordinate arrays),
/// and where they were built: tests compare the host and the device builds.
#[derive(Debug, PartialEq)]
pub struct IndexArrays {
    pub build: IndexBuild,
    pub n_cells: u32,
    pub k: u32,
    pub sort_dim: u32,
    pub r_coords: Vec<u8>,
    pub q_coords: Option<Vec<u8>>,
    pub cell_keys: Vec<u64>,
    pub cell_ranges: Vec<[u32; 2]>,
    pub r_ids: Vec<u32>,
    pub q_ids: Option<Vec<u32>>,
    pub q_cells: Vec<u32>,
    pub meta: Vec<u32>,
}

/// Plans and builds the grid index of the join of `a` (and `b`) under `opts` (its
/// `index_build` says where) and reads the arrays back.
pub fn index_arrays(
    ctx: &Arc<Context>,
    a: &Dataset,
    b: Option<&Dataset>,
    opts: &crate::options::JoinOptions,
) -> Result<IndexArrays> {
    let job = Job {
        a: *a,
        b: b.copied(),
        opts,
    };
    let uploads = Uploads::new(ctx, &crate::vk::StagingPool::new(ctx))?;
    let (mut report, mut seconds) = (JoinReport::default(), 0.0);
    let p = match a.coords() {
        Coords::F32(_) => prepare_grid::<f32>(ctx, uploads, &job, true, &mut report, &mut seconds)?,
        Coords::F64(_) => prepare_grid::<f64>(ctx, uploads, &job, true, &mut report, &mut seconds)?,
    };
    p.ready.wait()?;
    fn all<P: bytemuck::Pod>(ctx: &Arc<Context>, b: &Arc<Buffer>) -> Result<Vec<P>> {
        ctx.download(b, 0, b.size() as usize / size_of::<P>())
    }
    let d = &p.data;
    Ok(IndexArrays {
        build: p.index_build.expect("a grid index"),
        n_cells: p.n_cells,
        k: p.k,
        sort_dim: p.sort_dim,
        r_coords: all(ctx, &d.r_coords)?,
        q_coords: d.q_coords.as_ref().map(|b| all(ctx, b)).transpose()?,
        cell_keys: all(ctx, &d.cell_keys)?,
        cell_ranges: all(ctx, &d.cell_ranges)?,
        r_ids: all(ctx, &d.r_ids)?,
        q_ids: d.q_ids.as_ref().map(|b| all(ctx, b)).transpose()?,
        q_cells: all(ctx, d.q_cells.as_ref().expect("grid query cells"))?,
        meta: all(ctx, &d.meta)?,
    })
}
