//! Results as Arrow record batches (`i`, `j` and, when asked, `distance`), produced while
//! the join runs: the join streams its pairs on a thread of its own into a bounded queue and
//! the reader turns them into batches as the consumer pulls, so a result larger than memory
//! goes through batch by batch. The C ABI exports a reader as an `ArrowArrayStream` (the
//! Arrow C stream interface, through arrow-rs's FFI), which pyarrow, DuckDB and Polars read.

use crate::dataset::Dataset;
use crate::engine::Engine;
use crate::error::Error;
use crate::options::{JoinOptions, OutputForm};
use crate::result::{Distances, Pair, PairSink};
use arrow_array::{
    ArrayRef, Float32Array, Float64Array, RecordBatch, RecordBatchReader, UInt32Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Rows per record batch (the last may be shorter).
pub const BATCH_ROWS: usize = 1 << 20;
/// Chunks the join may run ahead of the consumer.
const QUEUE_CHUNKS: usize = 16;

type Chunk = std::result::Result<(Vec<Pair>, Option<Distances>), Error>;

/// A join running on its own thread, read as Arrow record batches.
pub struct PairBatches {
    schema: SchemaRef,
    rx: Option<Receiver<Chunk>>,
    worker: Option<JoinHandle<()>>,
    done: bool,
    /// Coordinates the reader owns (float16 input widened for the join): freed after
    /// `drop` has joined the worker, as fields drop after `Drop::drop`.
    owned: Vec<Vec<f32>>,
}

/// Sends each chunk (with its distances when asked) to the queue; fails when the reader
/// is gone, which stops the join.
struct QueueSink {
    tx: SyncSender<Chunk>,
    a: Dataset<'static>,
    b: Dataset<'static>,
    opts: JoinOptions,
}

impl PairSink for QueueSink {
    fn push(&mut self, chunk: &[Pair]) -> anyhow::Result<()> {
        let distances = if self.opts.distances {
            Some(crate::result::pair_distances(
                &self.a, &self.b, &self.opts, chunk,
            )?)
        } else {
            None
        };
        self.tx
            .send(Ok((chunk.to_vec(), distances)))
            .map_err(|_| anyhow::anyhow!("the Arrow stream was released"))
    }
}

impl PairBatches {
    /// Starts the join `a ⋈ b` (self-join when `b` is None) on a new thread.
    ///
    /// # Safety
    /// `engine`, and the coordinates `a` and `b` borrow, must stay alive and unchanged
    /// until the returned reader is dropped (the reader's drop waits for the join thread,
    /// which is the only user of them).
    pub unsafe fn start(
        engine: &Engine,
        a: &Dataset<'_>,
        b: Option<&Dataset<'_>>,
        opts: &JoinOptions,
    ) -> crate::error::Result<PairBatches> {
        // Bad input is an error here, before the stream exists, not in its first batch.
        crate::engine::check_join(a, b, opts)?;
        let mut opts = opts.clone();
        opts.output = OutputForm::Pairs;
        let dist_type = match a.precision() {
            crate::dataset::Precision::F32 => DataType::Float32,
            crate::dataset::Precision::F64 => DataType::Float64,
        };
        let mut fields = vec![
            Field::new("i", DataType::UInt32, false),
            Field::new("j", DataType::UInt32, false),
        ];
        if opts.distances {
            fields.push(Field::new("distance", dist_type, false));
        }
        let schema = Arc::new(Schema::new(fields));
        // SAFETY: the caller keeps the engine and the data alive until the reader is
        // dropped, and the reader's drop joins this thread first: the 'static borrows
        // never outlive what they point at.
        let (engine, a, b): (&'static Engine, Dataset<'static>, Option<Dataset<'static>>) = unsafe {
            (
                std::mem::transmute::<&Engine, &'static Engine>(engine),
                std::mem::transmute::<Dataset<'_>, Dataset<'static>>(*a),
                b.map(|b| std::mem::transmute::<Dataset<'_>, Dataset<'static>>(*b)),
            )
        };
        let (tx, rx) = sync_channel(QUEUE_CHUNKS);
        let worker = std::thread::Builder::new()
            .name("simjoin-arrow".into())
            .spawn(move || {
                let mut sink = QueueSink {
                    tx: tx.clone(),
                    a,
                    b: b.unwrap_or(a),
                    opts: opts.clone(),
                };
                let r = match &b {
                    None => engine.self_join_stream(&a, &opts, &mut sink),
                    Some(b) => engine.join_stream(&a, b, &opts, &mut sink),
                };
                if let Err(e) = r {
                    // The reader may be gone already (that is how it stops the join).
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| Error::from(anyhow::anyhow!("cannot start the join thread: {e}")))?;
        Ok(PairBatches {
            schema,
            rx: Some(rx),
            worker: Some(worker),
            done: false,
            owned: Vec::new(),
        })
    }

    fn batch(&self, pairs: Vec<Pair>, dist: Vec<Distances>) -> Result<RecordBatch, ArrowError> {
        let (i, j): (Vec<u32>, Vec<u32>) = pairs.into_iter().map(|[i, j]| (i, j)).unzip();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(UInt32Array::from(i)),
            Arc::new(UInt32Array::from(j)),
        ];
        if self.schema.fields().len() == 3 {
            let mut f32s = Vec::new();
            let mut f64s = Vec::new();
            for d in dist {
                match d {
                    Distances::F32(v) => f32s.extend(v),
                    Distances::F64(v) => f64s.extend(v),
                }
            }
            columns.push(match self.schema.field(2).data_type() {
                DataType::Float32 => Arc::new(Float32Array::from(f32s)),
                _ => Arc::new(Float64Array::from(f64s)),
            });
        }
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

impl Iterator for PairBatches {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rx = self.rx.as_ref()?;
        let mut pairs: Vec<Pair> = Vec::new();
        let mut dist = Vec::new();
        while pairs.len() < BATCH_ROWS {
            match rx.recv() {
                Ok(Ok((p, d))) => {
                    if pairs.is_empty() {
                        pairs = p;
                    } else {
                        pairs.extend_from_slice(&p);
                    }
                    dist.extend(d);
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Some(Err(ArrowError::ExternalError(Box::new(e))));
                }
                // The join finished: every sender is gone.
                Err(_) => {
                    self.done = true;
                    break;
                }
            }
        }
        if pairs.is_empty() {
            return None;
        }
        Some(self.batch(pairs, dist))
    }
}

impl RecordBatchReader for PairBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

impl PairBatches {
    /// Keeps `coords` until the reader is dropped (after its join thread has ended): for
    /// points the join reads that the caller does not own. Moving a `Vec` does not move
    /// its elements, so a dataset over them stays valid.
    pub(crate) fn keep(&mut self, coords: Vec<f32>) {
        self.owned.push(coords);
    }
}

impl Drop for PairBatches {
    fn drop(&mut self) {
        // Closing the queue makes the join's next push fail, which stops it; then wait for
        // the thread so that nothing touches the borrowed data after this returns.
        drop(self.rx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
