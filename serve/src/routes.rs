//! The HTTP endpoints: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, plus
//! `/health` and `/metrics`.

use crate::api::{self, Ask, Endpoint, PromptSpec};
use crate::error::ApiError;
use crate::reply::{Part, Reply};
use crate::worker::{Job, Queue};
use crate::{metrics::Metrics, ModelInfo};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use g4c_runtime::{GenerateOptions, SamplingParams, SequenceRequest};
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
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint", "unknown_url") })
        .with_state(app)
}

async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    generate(app, Endpoint::Chat, &body).await
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    generate(app, Endpoint::Completion, &body).await
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let model = json!({"id": app.model.name, "object": "model", "created": 0, "owned_by": "g4c",
                       "max_model_len": app.model.context});
    Json(json!({"object": "list", "data": [model]}))
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

async fn generate(app: Arc<App>, endpoint: Endpoint, body: &[u8]) -> Response {
    let arrived = Instant::now();
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let id = format!("{prefix}-{:016x}", rand::random::<u64>());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let queued = app.prepare(endpoint, body).and_then(|(ask, request)| {
        let prompt_ids = request.prompt.clone();
        app.queue.submit(Job { request, events: tx })?;
        Ok((ask, prompt_ids))
    });
    let (ask, prompt_ids) = match queued {
        Ok(queued) => queued,
        Err(e) => {
            app.metrics.requests.with_label_values(&[endpoint.name(), e.status.as_str()]).inc();
            eprintln!("g4c serve: {id} {} {}: {}", endpoint.name(), e.status.as_u16(), e.message);
            return e.into_response();
        }
    };
    let stream = ask.stream;
    let (model, tokenizer, metrics) = (app.model.name.clone(), app.model.tokenizer.clone(), app.metrics.clone());
    let reply = Reply::new(id, ask, model, prompt_ids, rx, tokenizer, arrived, metrics);
    if stream {
        streamed(reply).into_response()
    } else {
        whole(reply).await
    }
}

/// The response of a request that does not stream, once it has ended.
async fn whole(mut reply: Reply) -> Response {
    let mut text = String::new();
    while let Some(part) = reply.next().await {
        match part {
            Part::Delta { text: t, .. } => text += &t,
            Part::Done { finish_reason } => return Json(reply.response(&text, finish_reason)).into_response(),
            Part::Failed(e) => return e.into_response(),
        }
    }
    ApiError::server("the reply ended without a finish reason").into_response()
}

/// Where a stream is.
enum Phase {
    Open,
    Body,
    Usage,
    DoneMarker,
    End,
}

/// Server-sent events in OpenAI's chunk format, ending with `[DONE]`. If the client goes away, the
/// stream (and with it the reply and its receiver) is dropped, and the sequence leaves its row.
fn streamed(reply: Reply) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let data = |value: serde_json::Value| Ok(Event::default().data(value.to_string()));
    let start = if reply.opening_chunk().is_some() { Phase::Open } else { Phase::Body };
    Sse::new(futures_util::stream::unfold((reply, start), move |(mut reply, phase)| async move {
        match phase {
            Phase::Open => {
                let chunk = reply.opening_chunk().expect("checked at the start");
                Some((data(chunk), (reply, Phase::Body)))
            }
            Phase::Body => loop {
                match reply.next().await {
                    Some(Part::Delta { text, .. }) if text.is_empty() && !reply.ask.return_token_ids => continue,
                    Some(Part::Delta { text, ids }) => {
                        let chunk = reply.delta_chunk(&text, &ids);
                        return Some((data(chunk), (reply, Phase::Body)));
                    }
                    Some(Part::Done { finish_reason }) => {
                        let chunk = reply.closing_chunk(finish_reason);
                        let next = if reply.ask.include_usage { Phase::Usage } else { Phase::DoneMarker };
                        return Some((data(chunk), (reply, next)));
                    }
                    Some(Part::Failed(e)) => return Some((data(e.body()), (reply, Phase::DoneMarker))),
                    None => return Some((Ok(Event::default().data("[DONE]")), (reply, Phase::End))),
                }
            },
            Phase::Usage => {
                let chunk = reply.usage_chunk();
                Some((data(chunk), (reply, Phase::DoneMarker)))
            }
            Phase::DoneMarker => Some((Ok(Event::default().data("[DONE]")), (reply, Phase::End))),
            Phase::End => None,
        }
    }))
}

impl App {
    /// The checked request, its prompt's ids and what the engine is asked for.
    fn prepare(&self, endpoint: Endpoint, body: &[u8]) -> Result<(Ask, SequenceRequest), ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is stopping"));
        }
        let ask = api::parse(endpoint, body)?;
        let model = &self.model;
        if let Some(asked) = ask.model.as_ref().filter(|m| **m != model.name) {
            let message = format!("the model `{asked}` does not exist; this server serves `{}`", model.name);
            return Err(ApiError::not_found(message, "model_not_found"));
        }
        let tokenizer = model.tokenizer.as_deref();
        if tokenizer.is_none() && !ask.return_token_ids {
            return Err(ApiError::invalid(
                "this model has no tokenizer.json, so replies have no text: ask for `return_token_ids`",
            ));
        }
        if tokenizer.is_none() && !ask.stop.is_empty() {
            return Err(ApiError::param(
                "stop",
                "`stop`: stop strings need the model's tokenizer.json, which it lacks",
            ));
        }
        let prompt = match &ask.prompt {
            PromptSpec::Messages(messages) => {
                let (Some(tokenizer), Some(template)) = (tokenizer, model.chat_template.as_ref()) else {
                    return Err(ApiError::invalid(
                        "this model has no chat template (chat_template.jinja or tokenizer_config.json); use /v1/completions",
                    ));
                };
                let text = template.render(messages).map_err(|e| ApiError::param("messages", e.to_string()))?;
                tokenizer.encode(&text).map_err(|e| ApiError::param("messages", e.to_string()))?
            }
            PromptSpec::Text(text) => match tokenizer {
                Some(t) => t.encode(text).map_err(|e| ApiError::param("prompt", e.to_string()))?,
                None => {
                    return Err(ApiError::param("prompt", "`prompt`: this model has no tokenizer.json; give token ids"))
                }
            },
            PromptSpec::Ids(ids) => ids.clone(),
        };
        let vocab = model.vocab;
        for (what, ids) in [("prompt", &prompt), ("stop", &ask.stop_ids)] {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::param(what, format!("token id {bad} is outside the vocabulary (0..{vocab})")));
            }
        }
        let context = model.context;
        if prompt.len() >= context {
            let message = format!(
                "the prompt has {} tokens; this model's context is {context} positions, so at most {} prompt tokens fit",
                prompt.len(),
                context - 1
            );
            let param = if endpoint == Endpoint::Chat { "messages" } else { "prompt" };
            return Err(ApiError::param(param, message).with_code("context_length_exceeded"));
        }
        let room = context - prompt.len();
        let max_new_tokens = match ask.max_tokens {
            Some(n) if n > room => {
                let message = format!(
                    "the prompt ({} tokens) and max_tokens ({n}) exceed this model's context of {context} positions",
                    prompt.len()
                );
                return Err(ApiError::param("max_tokens", message).with_code("context_length_exceeded"));
            }
            Some(n) => n,
            // As OpenAI: a chat reply may fill the context, a completion is 16 tokens.
            None if endpoint == Endpoint::Chat => room,
            None => 16.min(room),
        };
        let mut stop_ids = ask.stop_ids.clone();
        if endpoint == Endpoint::Chat {
            stop_ids.extend(model.turn_end);
        }
        let options = GenerateOptions {
            max_new_tokens,
            eos_ids: model.eos_ids.clone(),
            ignore_eos: ask.ignore_eos,
            stop_ids,
            sampling: SamplingParams {
                temperature: ask.temperature,
                top_k: ask.top_k,
                top_p: ask.top_p,
                seed: ask.seed.unwrap_or_else(rand::random),
            },
            forced: vec![],
        };
        Ok((ask, SequenceRequest { prompt, options }))
    }
}
