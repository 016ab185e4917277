//! Stopping and watching a running job. A [`Control`] is a handle the caller keeps and
//! the job carries in its options (`JoinOptions::control`, `KnnOptions::control`,
//! `DbscanOptions::control`): [`Control::cancel`] from any thread stops every job that
//! carries it, [`Control::progress`] reads how far the running job has come, and a
//! callback ([`Control::with_progress`]) is told at a bounded rate.
//!
//! How a stop travels: every backend's workers read the flag between small pieces of
//! work (a run of a CPU grid item's queries, an EGO recursion step, a kNN chunk, a GPU
//! batch), so a stop is seen within milliseconds on the CPU and after the batches in
//! flight on a GPU. The job then ends with `ErrorKind::Cancelled`, after its threads
//! have stopped and its buffers are freed (the call returns only then).
//!
//! Progress is counted in a stage's units of work (grid items, EGO tasks, kNN chunks,
//! GPU batches): `fraction` is exact in those units, not in time.

use crate::error::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A stop flag and progress counters shared by the caller and a running job. Clones
/// share the same flag. The default (`Control::default()`) is inert: nothing can stop
/// the job through it and it keeps no progress.
#[derive(Clone, Default)]
pub struct Control(Option<Arc<Shared>>);

/// The callback [`Control::with_progress`] keeps: false asks the job to stop.
type Callback = Box<dyn Fn(&Progress) -> bool + Send + Sync>;

struct Shared {
    cancelled: AtomicBool,
    /// Counters the workers write, on cache lines of their own, away from the flag that
    /// every check reads.
    work: Padded,
    stage: Mutex<&'static str>,
    callback: Option<(Callback, Duration)>,
    /// When the callback was last called, in ns after `origin` (one caller at a time).
    last_report: AtomicU64,
    reporting: Mutex<()>,
    origin: Instant,
}

#[repr(align(128))]
struct Padded {
    total: AtomicU64,
    done: AtomicU64,
    pairs: AtomicU64,
}

/// How far a job has come.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// What the job is doing: "plan", "index", "join", "knn", "dbscan", "output".
    pub stage: &'static str,
    /// Fraction of the stage's work done, 0 to 1 (in units of work, not of time).
    pub fraction: f64,
    /// Pairs (or kNN rows) found so far.
    pub pairs: u64,
    /// Seconds since the control was made (a control per call: since the call began).
    pub elapsed: f64,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Control(inert)"),
            Some(s) => f
                .debug_struct("Control")
                .field("cancelled", &s.cancelled.load(Ordering::Relaxed))
                .finish_non_exhaustive(),
        }
    }
}

/// A control says how a job is watched, not what it computes: options that agree in
/// everything else are equal whatever their controls.
impl PartialEq for Control {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Control {
    /// A live control: cancellable, keeping progress, without a callback.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A live control that calls `f` with the job's progress at most once per `every`
    /// (from whichever engine thread notices first, never two calls at once). `f`
    /// returning false stops the job, as [`Control::cancel`] does.
    pub fn with_progress(
        every: Duration,
        f: impl Fn(&Progress) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self::build(Some((Box::new(f), every)))
    }

    fn build(callback: Option<(Callback, Duration)>) -> Self {
        let now = Instant::now();
        Control(Some(Arc::new(Shared {
            cancelled: AtomicBool::new(false),
            work: Padded {
                total: AtomicU64::new(0),
                done: AtomicU64::new(0),
                pairs: AtomicU64::new(0),
            },
            stage: Mutex::new("plan"),
            callback,
            last_report: AtomicU64::new(0),
            reporting: Mutex::new(()),
            origin: now,
        })))
    }

    /// Asks every job carrying this control to stop. Idempotent, from any thread, and
    /// permanent: a job started later with this control stops at once.
    pub fn cancel(&self) {
        if let Some(s) = &self.0 {
            s.cancelled.store(true, Ordering::SeqCst);
        }
    }

    /// Whether [`Control::cancel`] was called (or the callback returned false).
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|s| s.cancelled.load(Ordering::Relaxed))
    }

    /// The running (or last) job's progress; `None` for an inert control.
    pub fn progress(&self) -> Option<Progress> {
        self.0.as_ref().map(|s| s.snapshot())
    }

    /// `Err(Cancelled)` once the job was asked to stop; calls the progress callback when
    /// it is due. What workers call between pieces of work.
    #[inline]
    pub(crate) fn check(&self) -> Result<()> {
        match &self.0 {
            None => Ok(()),
            Some(s) => {
                s.maybe_report();
                if s.cancelled.load(Ordering::Relaxed) {
                    Err(cancelled())
                } else {
                    Ok(())
                }
            }
        }
    }

    /// A job starts: its pairs count from zero.
    pub(crate) fn begin(&self) {
        if let Some(s) = &self.0 {
            s.work.pairs.store(0, Ordering::Relaxed);
            self.stage("plan", 1);
        }
    }

    /// The job enters `stage`, which has `total` units of work.
    pub(crate) fn stage(&self, stage: &'static str, total: u64) {
        if let Some(s) = &self.0 {
            *s.stage.lock().unwrap_or_else(|p| p.into_inner()) = stage;
            s.work.done.store(0, Ordering::Relaxed);
            s.work.total.store(total.max(1), Ordering::Relaxed);
        }
    }

    /// `units` of the stage's work are done and `pairs` more pairs found.
    #[inline]
    pub(crate) fn advance(&self, units: u64, pairs: u64) {
        if let Some(s) = &self.0 {
            s.work.done.fetch_add(units, Ordering::Relaxed);
            if pairs > 0 {
                s.work.pairs.fetch_add(pairs, Ordering::Relaxed);
            }
            s.maybe_report();
        }
    }
}

impl Shared {
    fn snapshot(&self) -> Progress {
        let total = self.work.total.load(Ordering::Relaxed).max(1);
        let done = self.work.done.load(Ordering::Relaxed).min(total);
        Progress {
            stage: *self.stage.lock().unwrap_or_else(|p| p.into_inner()),
            fraction: done as f64 / total as f64,
            pairs: self.work.pairs.load(Ordering::Relaxed),
            elapsed: self.origin.elapsed().as_secs_f64(),
        }
    }

    /// Calls the callback if one is kept and its interval has passed since the last call.
    #[inline]
    fn maybe_report(&self) {
        let Some((f, every)) = &self.callback else {
            return;
        };
        let now = self.origin.elapsed().as_nanos() as u64;
        let last = self.last_report.load(Ordering::Relaxed);
        if now.saturating_sub(last) < every.as_nanos() as u64 {
            return;
        }
        // One thread reports; the others go on working. Not after the job was asked to
        // stop: a callback that answered stop is not asked again while workers finish
        // (the C test counted a fourth call after its third said stop).
        let Ok(_one) = self.reporting.try_lock() else {
            return;
        };
        if self.cancelled.load(Ordering::SeqCst) {
            return;
        }
        if self
            .last_report
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // A panicking callback must not take the job's thread down with it.
        let snapshot = self.snapshot();
        let go_on = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&snapshot)))
            .unwrap_or(false);
        if !go_on {
            self.cancelled.store(true, Ordering::SeqCst);
        }
    }
}

/// The error a stopped job returns.
pub(crate) fn cancelled() -> Error {
    Error::new(ErrorKind::Cancelled, "the job was cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inert_control_never_stops() {
        let c = Control::default();
        c.cancel();
        assert!(!c.is_cancelled());
        assert!(c.check().is_ok());
        assert!(c.progress().is_none());
    }

    #[test]
    fn cancel_is_seen_by_clones() {
        let c = Control::new();
        let d = c.clone();
        assert!(d.check().is_ok());
        c.cancel();
        assert!(d.is_cancelled());
        assert_eq!(d.check().unwrap_err().kind(), ErrorKind::Cancelled);
    }

    #[test]
    fn progress_counts_units_and_pairs() {
        let c = Control::new();
        c.begin();
        c.stage("join", 8);
        c.advance(2, 5);
        c.advance(2, 0);
        let p = c.progress().unwrap();
        assert_eq!(p.stage, "join");
        assert_eq!(p.fraction, 0.5);
        assert_eq!(p.pairs, 5);
        c.advance(100, 0);
        assert_eq!(c.progress().unwrap().fraction, 1.0);
    }

    #[test]
    fn callback_is_rate_limited_and_can_stop() {
        use std::sync::atomic::AtomicUsize;
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let c = Control::with_progress(Duration::from_millis(20), move |p| {
            seen.fetch_add(1, Ordering::Relaxed);
            p.fraction < 0.5
        });
        c.stage("join", 100);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(110) {
            c.advance(0, 0);
        }
        let n = calls.load(Ordering::Relaxed);
        assert!((2..=7).contains(&n), "{n} calls in 110 ms at 20 ms");
        assert!(!c.is_cancelled());
        c.advance(60, 0);
        std::thread::sleep(Duration::from_millis(25));
        assert!(c.check().is_err(), "the callback's false stops the job");
        // Once stopped, the callback is not called again while the workers finish.
        let stopped = calls.load(Ordering::Relaxed);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(25));
            c.advance(1, 0);
        }
        assert_eq!(calls.load(Ordering::Relaxed), stopped);
    }
}
