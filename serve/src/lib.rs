//! `g4c serve`: an OpenAI-compatible HTTP server (tokio + axum) in front of continuous batching
//! (`g4c_runtime::batching`). Handlers parse and check requests, tokenize prompts (chat messages
//! through the model's own template) and queue them; one thread runs the engine, which takes queued
//! requests into free rows between calls; each request's tokens come back over a channel and go out
//! as one JSON response or as server-sent events.

pub mod api;
pub mod error;
pub mod metrics;
mod origins;
pub mod prepare;
mod reply;
mod routes;
pub mod structured;
pub mod text;
pub mod tokenize;
mod unserved;
mod worker;

use g4c_frontend::{ChatTemplate, TextTokenizer};
use g4c_runtime::constraint::Grammars;
use g4c_runtime::{BatchEngine, ModelShape};
pub use origins::AllowedOrigins;
use routes::App;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What the server knows of the model beyond the engine.
pub struct ModelInfo {
    /// The name `/v1/models` lists and requests must give (or leave out).
    pub name: String,
    pub tokenizer: Option<Arc<TextTokenizer>>,
    pub chat_template: Option<ChatTemplate>,
    pub eos_ids: Vec<u32>,
    /// The token that ends a chat turn (Gemma 4's `<turn|>`): it ends a chat reply.
    pub turn_end: Option<u32>,
    /// The compiled module's vocabulary, context and batch (the engine's).
    pub shape: ModelShape,
    /// Sampling parameters a request leaves out take these (`generation_config.json`'s).
    pub sampling_defaults: g4c_frontend::SamplingDefaults,
    /// The vocabulary indexed for structured output (`ModelInfo::grammars`).
    pub grammars: OnceLock<Result<Grammars, String>>,
}

impl ModelInfo {
    /// The vocabulary indexed for structured output, made at the first request that asks for it
    /// (a moment's work for a vocabulary of 262,144 tokens, which most servers never need).
    pub fn grammars(&self) -> Result<&Grammars, String> {
        let index = || {
            let tokenizer = self.tokenizer.as_deref().ok_or("structured output needs the model's tokenizer.json")?;
            Grammars::of_tokenizer(tokenizer, self.shape.vocab, &self.eos_ids)
        };
        self.grammars.get_or_init(index).as_ref().map_err(Clone::clone)
    }
}

pub struct ServeOptions {
    /// Where to accept connections (`bind`).
    pub listener: std::net::TcpListener,
    /// Sequences (each choice of each prompt of a request) that may wait for a row; a request whose
    /// sequences do not all fit is refused with `429`.
    pub max_queue: usize,
    /// After `SIGTERM` or Ctrl-C, how long requests in flight may take to finish before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    /// The web pages that may call the server from a browser.
    pub allowed_origins: AllowedOrigins,
}

/// How long the replies cancelled at the end of `--shutdown-grace` have to tell their clients.
const CANCELLED_FLUSH: Duration = Duration::from_secs(1);

/// A listener on `host:port` (port 0: any free one; the server's first log line says which), made
/// before the model is loaded so that a port in use fails at once.
pub fn bind(host: &str, port: u16) -> Result<std::net::TcpListener, String> {
    let listener =
        std::net::TcpListener::bind((host, port)).map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    Ok(listener)
}

/// Serves until `SIGTERM` or Ctrl-C: then it stops accepting connections, lets the requests in
/// flight finish (for up to `shutdown_grace`) and returns.
pub fn serve(engine: BatchEngine, model: ModelInfo, options: ServeOptions) -> Result<(), String> {
    let batch = engine.shape().batch;
    let metrics = Arc::new(metrics::Metrics::new(batch));
    let (queue, engine_thread) = worker::Queue::start(engine, options.max_queue, metrics.clone())
        .map_err(|e| format!("cannot start the engine's thread: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let served = runtime.block_on(async move {
        let bound = options.listener.local_addr().map_err(|e| format!("cannot listen: {e}"))?;
        let listener = tokio::net::TcpListener::from_std(options.listener)
            .map_err(|e| format!("cannot listen on {bound}: {e}"))?;
        eprintln!(
            "g4c serve: listening on http://{bound} (model {}, batch {batch}, context {}, queue {})",
            model.name, model.shape.context, options.max_queue
        );
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let started = unix_seconds();
        let app = Arc::new(App { model, queue, metrics, draining: AtomicBool::new(false), cancelled, started });
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let signalled = app.clone();
        tokio::spawn(async move {
            stop_signal().await;
            signalled.draining.store(true, Ordering::SeqCst);
            eprintln!("g4c serve: stopping: no new connections; requests in flight may finish");
            let _ = stop.send(true);
        });
        let mut graceful = stopping.clone();
        let router = match options.allowed_origins.layer() {
            Some(cors) => routes::router(app).layer(cors),
            None => routes::router(app),
        };
        let server = axum::serve(listener, router).with_graceful_shutdown(async move {
            let _ = graceful.wait_for(|s| *s).await;
        });
        let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
        let mut deadline = stopping;
        let grace = options.shutdown_grace;
        tokio::select! {
            served = &mut server => served.map_err(|e| format!("the server failed: {e}"))?,
            _ = async move {
                let _ = deadline.wait_for(|s| *s).await;
                tokio::time::sleep(grace).await;
            } => {
                eprintln!("g4c serve: requests still in flight after {} s are cancelled", grace.as_secs());
                // Their clients are told so (a 503, or an error event before `[DONE]`), if they
                // take it within a moment.
                let _ = cancel.send(true);
                let _ = tokio::time::timeout(CANCELLED_FLUSH, &mut server).await;
            }
        }
        Ok(())
    });
    // Dropping the runtime drops the handlers still running, which hold the queue: the engine's
    // thread then sees it closed, lets its rows go and drops the engine before it ends.
    drop(runtime);
    if engine_thread.join().is_err() {
        eprintln!("g4c serve: the engine's thread panicked");
    }
    eprintln!("g4c serve: stopped");
    served
}

/// Now, in seconds since the Unix epoch (OpenAI's `created`).
fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `SIGTERM` (or Ctrl-C).
async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
