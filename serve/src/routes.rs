//! The HTTP endpoints: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, plus
//! vLLM's `/tokenize` and `/detokenize`, `/health` and `/metrics`.

use crate::api::{Ask, Endpoint};
use crate::error::ApiError;
use crate::reply::{Part, Reply};
use crate::tokenize::check_model;
use crate::worker::{ChoiceSink, Job, Queue};
use crate::{metrics::Metrics, ModelInfo};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, Method, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use g4c_runtime::SequenceRequest;
use serde_json::json;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What every handler shares.
pub struct App {
    pub model: ModelInfo,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    /// Set once the server has been told to stop.
    pub draining: AtomicBool,
    /// Turns true when the requests still in flight after `--shutdown-grace` are cancelled.
    pub cancelled: tokio::sync::watch::Receiver<bool>,
    /// When the server started, in seconds since the Unix epoch.
    pub started: u64,
}

/// The largest request body read: room for a prompt filling the largest context as token ids or as
/// escaped text (axum's default, 2 MiB, is not).
pub const MAX_BODY_BYTES: usize = 64 << 20;

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        // Served names hold slashes (`google/gemma-4-E2B-it`), which clients send unescaped.
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|method: Method, uri: Uri| async move {
            ApiError::not_found(format!("no such endpoint: {method} {}", uri.path()), "unknown_url")
        })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

// A body that could not be read (too large, a broken chunked encoding) is answered in the API's
// error format, as everything else is, not in axum's plain text.
async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => generate(app, Endpoint::Chat, body).await,
        Err(rejected) => app.refuse(Endpoint::Chat, "-", ApiError::unread_body(rejected)),
    }
}

async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => generate(app, Endpoint::Completion, body).await,
        Err(rejected) => app.refuse(Endpoint::Completion, "-", ApiError::unread_body(rejected)),
    }
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [app.model_object()]}))
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match check_model(&app.model, Some(&id)) {
        Ok(()) => Json(app.model_object()).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tokenize(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    tokenizing(app, body, crate::tokenize::tokenize).await
}

async fn detokenize(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    tokenizing(app, body, crate::tokenize::detokenize).await
}

/// `/tokenize` or `/detokenize` (`answer`), off the async threads as a generation's prompt is.
async fn tokenizing(
    app: Arc<App>,
    body: Result<Bytes, BytesRejection>,
    answer: fn(&ModelInfo, &[u8]) -> Result<serde_json::Value, ApiError>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejected) => return ApiError::unread_body(rejected).into_response(),
    };
    let answered = tokio::task::spawn_blocking(move || answer(&app.model, &body))
        .await
        .unwrap_or_else(|e| Err(ApiError::server(format!("tokenizing failed: {e}"))));
    match answered {
        Ok(value) => Json(value).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    match (app.draining.load(Ordering::SeqCst), app.queue.is_alive()) {
        (false, true) => Json(json!({"status": "ok"})).into_response(),
        (true, _) => ApiError::unavailable("the server is stopping").into_response(),
        (false, false) => ApiError::unavailable("the engine has stopped; see the server's log").into_response(),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

async fn generate(app: Arc<App>, endpoint: Endpoint, body: Bytes) -> Response {
    let arrived = Instant::now();
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let id = format!("{prefix}-{:016x}", rand::random::<u64>());
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    // Rendering and tokenizing a prompt of megabytes takes a while: off the async threads.
    let preparing = app.clone();
    let prepared = tokio::task::spawn_blocking(move || preparing.prepare(endpoint, &body))
        .await
        .unwrap_or_else(|e| Err(ApiError::server(format!("preparing the request failed: {e}"))));
    let queued = prepared.and_then(|(ask, requests)| {
        let (sequences, capacity) = (requests.len() * ask.n, app.queue.capacity());
        if sequences > capacity {
            let (param, asked) = match ask.n {
                1 => ("prompt", format!("{sequences} prompts")),
                n => ("n", format!("{sequences} sequences ({n} for each prompt)")),
            };
            let message =
                format!("this request's {asked} are more than this server's queue holds ({capacity}, --max-queue)");
            return Err(ApiError::param(param, message));
        }
        let prompts: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt.clone()).collect();
        let mut ended = vec![];
        let mut jobs = vec![];
        for (index, request) in crate::prepare::choices(requests, ask.n).into_iter().enumerate() {
            let flag = Arc::new(AtomicBool::new(false));
            jobs.push(Job { request, sink: ChoiceSink { index, events: events.clone(), ended: flag.clone() } });
            ended.push(flag);
        }
        // Only the jobs' senders are left: the channel closes when the engine has let go of all.
        drop(events);
        app.queue.submit(jobs)?;
        Ok((ask, prompts, ended))
    });
    let (ask, prompts, ended) = match queued {
        Ok(queued) => queued,
        Err(e) => return app.refuse(endpoint, &id, e),
    };
    let stream = ask.stream;
    let reply = Reply::new(id, arrived, ask, prompts, rx, ended, &app);
    if stream {
        streamed(reply).into_response()
    } else {
        whole(reply).await
    }
}

/// The response of a request that does not stream, once every choice has ended.
async fn whole(mut reply: Reply) -> Response {
    let mut texts = vec![String::new(); reply.choice_count()];
    while let Some(part) = reply.next().await {
        match part {
            Part::Delta { index, text, .. } => texts[index] += &text,
            Part::Done { .. } => {}
            Part::Failed(e) => return e.into_response(),
        }
    }
    Json(reply.response(&texts)).into_response()
}

/// Where a stream is.
enum Phase {
    /// The opening chunks still to send, first.
    Open(std::vec::IntoIter<serde_json::Value>),
    Body,
    DoneMarker,
    End,
}

type Step = Option<(Result<Event, Infallible>, (Reply, Phase))>;

fn sse(value: serde_json::Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
}

/// Server-sent events in OpenAI's chunk format, ending with `[DONE]`. If the client goes away, the
/// stream (and with it the reply and its receiver) is dropped, and the sequences leave their rows.
fn streamed(reply: Reply) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let start = Phase::Open(reply.opening_chunks().into_iter());
    let events = futures_util::stream::unfold((reply, start), |(reply, phase)| async move {
        match phase {
            Phase::Open(mut chunks) => match chunks.next() {
                Some(chunk) => Some((sse(chunk), (reply, Phase::Open(chunks)))),
                None => body(reply).await,
            },
            Phase::Body => body(reply).await,
            Phase::DoneMarker => Some((Ok(Event::default().data("[DONE]")), (reply, Phase::End))),
            Phase::End => None,
        }
    });
    // Comment lines every 15 s keep proxies and clients from timing out a request waiting for a row.
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// The next event of a stream's body: a choice's text or end, or the failure that ends them all;
/// once every choice has ended, the usage (when asked for) and `[DONE]`.
async fn body(mut reply: Reply) -> Step {
    loop {
        let chunk = match reply.next().await {
            Some(Part::Delta { text, .. }) if text.is_empty() && !reply.ask.return_token_ids => continue,
            Some(Part::Delta { index, text, ids }) => reply.delta_chunk(index, &text, &ids),
            Some(Part::Done { index, finish_reason }) => reply.closing_chunk(index, finish_reason),
            Some(Part::Failed(e)) => return Some((sse(e.body()), (reply, Phase::DoneMarker))),
            None if reply.ask.include_usage => return Some((sse(reply.usage_chunk()), (reply, Phase::DoneMarker))),
            None => return Some((Ok(Event::default().data("[DONE]")), (reply, Phase::End))),
        };
        return Some((sse(chunk), (reply, Phase::Body)));
    }
}

impl App {
    /// The response refusing request `id` to `endpoint` (`-`: its body was never read), counted and
    /// logged as every request is.
    fn refuse(&self, endpoint: Endpoint, id: &str, e: ApiError) -> Response {
        self.metrics.requests.with_label_values(&[endpoint.name(), e.status.as_str()]).inc();
        eprintln!("g4c serve: {id} {} {}: {}", endpoint.name(), e.status.as_u16(), e.message);
        e.into_response()
    }

    /// The served model as `/v1/models` lists it (`created`: when the server started).
    fn model_object(&self) -> serde_json::Value {
        json!({"id": self.model.name, "object": "model", "created": self.started, "owned_by": "g4c",
               "max_model_len": self.model.shape.context})
    }

    /// `prepare`, unless the server is stopping.
    fn prepare(&self, endpoint: Endpoint, body: &[u8]) -> Result<(Ask, Vec<SequenceRequest>), ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is stopping"));
        }
        crate::prepare::prepare(&self.model, endpoint, body)
    }
}
