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

/// A request waiting for a row, and where its events go.
pub struct Job {
    pub request: SequenceRequest,
    pub events: UnboundedSender<SequenceEvent>,
}

/// A request's events go to its handler; once the handler has dropped its receiver (the client
/// went away, or a stop string ended the text), the sequence leaves its row.
struct ChannelSink(UnboundedSender<SequenceEvent>);

impl SequenceSink for ChannelSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_gone(&self) -> bool {
        self.0.is_closed()
    }
}

/// The handlers' side of the queue.
pub struct Queue {
    jobs: SyncSender<Job>,
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
        Ok((Queue { jobs, metrics, alive }, thread))
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Queues `job`, or says why not: `429` when the queue is full, `503` when the engine stopped.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queue_depth.inc();
        let refused = match self.jobs.try_send(job) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => ApiError::busy("the server's queue is full; retry later"),
            Err(TrySendError::Disconnected(_)) => ApiError::unavailable("the engine has stopped; see the server's log"),
        };
        self.metrics.queue_depth.dec();
        Err(refused)
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
        if !job.events.is_closed() {
            // A refusal reaches the handler as `Failed`; there is nothing more to do with it here.
            let _ = engine.admit(job.request, Box::new(ChannelSink(job.events)));
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
