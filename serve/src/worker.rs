//! The engine's thread: it takes queued requests into free rows between calls and steps the batch
//! while any row holds a sequence. Requests reach it through a bounded queue; a full queue is the
//! `429` the handlers answer.

use crate::error::ApiError;
use crate::metrics::Metrics;
use g4c_runtime::batching::CallKind;
use g4c_runtime::{BatchEngine, SequenceEvent, SequenceRequest, SequenceSink};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// A sequence waiting for a row, and where its events go.
pub struct Job {
    pub request: SequenceRequest,
    pub sink: ChoiceSink,
}

/// Where one choice's events go: its request's handler, which reads every choice's events from one
/// channel, each with its index. Once the handler has dropped its receiver (the client went away)
/// or marked the choice ended (a stop string ended its text), the sequence leaves its row.
pub struct ChoiceSink {
    pub index: usize,
    pub events: UnboundedSender<(usize, SequenceEvent)>,
    pub ended: Arc<AtomicBool>,
}

impl SequenceSink for ChoiceSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.events.send((self.index, event)).is_ok() && !self.is_gone()
    }

    fn is_gone(&self) -> bool {
        self.events.is_closed() || self.ended.load(Ordering::SeqCst)
    }
}

/// The handlers' side of the queue.
pub struct Queue {
    jobs: SyncSender<Job>,
    /// How many jobs may wait (`--max-queue`).
    capacity: usize,
    /// Jobs queued or being queued and not yet taken: a request's room is reserved here for all its
    /// sequences at once, so that it is queued whole or not at all.
    waiting: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    /// False once the engine's thread has stopped.
    alive: Arc<AtomicBool>,
}

impl Queue {
    /// Starts the engine's thread with a queue of `capacity` waiting sequences. The thread ends
    /// once every `Queue` is dropped and no row holds a sequence; it drops the engine (a CUDA
    /// device waits for its stream and frees its buffers), which the server waits for before it
    /// returns (`std::thread::JoinHandle::join`), rather than letting the process exit under it.
    pub fn start(
        engine: BatchEngine,
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(Queue, std::thread::JoinHandle<()>)> {
        let (jobs, queued) = sync_channel(capacity);
        let alive = Arc::new(AtomicBool::new(true));
        let waiting = Arc::new(AtomicUsize::new(0));
        let stopped = Stopped { alive: alive.clone(), metrics: metrics.clone() };
        let taken = waiting.clone();
        let thread = std::thread::Builder::new().name("g4c-engine".into()).spawn(move || {
            run(engine, queued, &taken, &stopped.metrics);
            drop(stopped);
        })?;
        Ok((Queue { jobs, capacity, waiting, metrics, alive }, thread))
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// How many jobs may wait (`--max-queue`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues a request's `jobs` (one per sequence), all or none, or says why not: `429` when the
    /// queue has no room for them all, `503` when the engine stopped.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), ApiError> {
        let n = jobs.len();
        let room = |w: usize| (w + n <= self.capacity).then_some(w + n);
        if self.waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, room).is_err() {
            return Err(ApiError::busy("the server's queue is full; retry later"));
        }
        self.metrics.queue_depth.add(n as i64);
        for (sent, job) in jobs.into_iter().enumerate() {
            // With room reserved, only an engine that has stopped refuses; the jobs sent before
            // are skipped once the refused handler drops its receiver.
            if self.jobs.try_send(job).is_err() {
                self.waiting.fetch_sub(n - sent, Ordering::SeqCst);
                self.metrics.queue_depth.sub((n - sent) as i64);
                return Err(ApiError::unavailable("the engine has stopped; see the server's log"));
            }
        }
        Ok(())
    }
}

/// Marks the engine stopped when its thread ends, by returning or by a panic: nothing waits in its
/// queue or holds a row any more.
struct Stopped {
    alive: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        self.metrics.queue_depth.set(0);
        self.metrics.rows_occupied.set(0);
    }
}

fn run(mut engine: BatchEngine, jobs: Receiver<Job>, waiting: &AtomicUsize, metrics: &Metrics) {
    let take = |job: Job, engine: &mut BatchEngine| {
        waiting.fetch_sub(1, Ordering::SeqCst);
        metrics.queue_depth.dec();
        if !job.sink.is_gone() {
            // A refusal reaches the handler as `Failed`; there is nothing more to do with it here.
            let _ = engine.admit(job.request, Box::new(job.sink));
        }
    };
    let mut open = true;
    loop {
        while open && engine.has_free_row() {
            match jobs.try_recv() {
                Ok(job) => take(job, &mut engine),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        metrics.rows_occupied.set(engine.occupied() as i64);
        if engine.occupied() == 0 {
            match open.then(|| jobs.recv()) {
                Some(Ok(job)) => take(job, &mut engine),
                _ => return,
            }
            continue;
        }
        match engine.step() {
            Ok(Some(report)) => {
                let kind = match report.call {
                    CallKind::Prefill => "prefill",
                    CallKind::Decode => "decode",
                };
                metrics.engine_calls.with_label_values(&[kind]).inc();
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("g4c serve: the engine stopped: {e}");
                return;
            }
        }
    }
}
