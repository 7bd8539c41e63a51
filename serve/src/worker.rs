//! The engine's thread: it takes queued requests into free rows between calls and steps the batch
//! while any row holds a sequence. Requests reach it through a bounded queue; a full queue is the
//! `429` the handlers answer.

use crate::error::ApiError;
use crate::metrics::Metrics;
use g4c_runtime::batching::CallKind;
use g4c_runtime::{BatchEngine, SequenceEvent, SequenceRequest, SequenceSink};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
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
    metrics: Arc<Metrics>,
    /// False once the engine's thread has stopped.
    alive: Arc<AtomicBool>,
}

impl Queue {
    /// Starts the engine's thread with a queue of `capacity` waiting requests. The thread ends
    /// once every `Queue` is dropped and no row holds a sequence; it drops the engine (a CUDA
    /// device waits for its stream and frees its buffers), which the server waits for before it
    /// returns (`std::thread::JoinHandle::join`), rather than letting the process exit under it.
    pub fn start(
        engine: BatchEngine,
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(Queue, std::thread::JoinHandle<()>)> {
        let (jobs, waiting) = sync_channel(capacity);
        let alive = Arc::new(AtomicBool::new(true));
        let stopped = Stopped { alive: alive.clone(), metrics: metrics.clone() };
        let thread = std::thread::Builder::new().name("g4c-engine".into()).spawn(move || {
            run(engine, waiting, &stopped.metrics);
            drop(stopped);
        })?;
        Ok((Queue { jobs, capacity, metrics, alive }, thread))
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Queues a request's `jobs` (one per choice), or says why not: `400` when there are more than
    /// the queue holds, `429` when it is full, `503` when the engine stopped. Jobs queued before a
    /// refusal are skipped once their handler, refused, has dropped its receiver.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), ApiError> {
        if jobs.len() > self.capacity {
            let message = format!(
                "`n`: this request's {} sequences (`n` for each prompt) are more than this server's queue holds ({}, --max-queue)",
                jobs.len(),
                self.capacity
            );
            return Err(ApiError::param("n", message));
        }
        for job in jobs {
            self.metrics.queue_depth.inc();
            let refused = match self.jobs.try_send(job) {
                Ok(()) => continue,
                Err(TrySendError::Full(_)) => ApiError::busy("the server's queue is full; retry later"),
                Err(TrySendError::Disconnected(_)) => {
                    ApiError::unavailable("the engine has stopped; see the server's log")
                }
            };
            self.metrics.queue_depth.dec();
            return Err(refused);
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

fn run(mut engine: BatchEngine, waiting: Receiver<Job>, metrics: &Metrics) {
    let take = |job: Job, engine: &mut BatchEngine| {
        metrics.queue_depth.dec();
        if !job.sink.is_gone() {
            // A refusal reaches the handler as `Failed`; there is nothing more to do with it here.
            let _ = engine.admit(job.request, Box::new(job.sink));
        }
    };
    let mut open = true;
    loop {
        while open && engine.has_free_row() {
            match waiting.try_recv() {
                Ok(job) => take(job, &mut engine),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        metrics.rows_occupied.set(engine.occupied() as i64);
        if engine.occupied() == 0 {
            match open.then(|| waiting.recv()) {
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
