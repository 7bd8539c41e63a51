//! One request's reply as the engine's events arrive: text through stop strings, usage, timings, and
//! the JSON of OpenAI's responses and stream chunks for both endpoints. Dropping a reply (finished,
//! failed, or its client gone) writes the request's log line and metrics.

use crate::api::{Ask, Endpoint};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::routes::App;
use crate::text::{StopStrings, StopText};
use g4c_frontend::TextTokenizer;
use g4c_runtime::{SequenceEvent, StopReason, TokenLogprobs};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// How many tokens before a token are decoded with it to find the text it adds.
const TEXT_CONTEXT: usize = 4;

/// What a reply has to say next.
pub enum Part {
    /// New text (possibly empty) and the ids that produced it.
    Delta {
        text: String,
        ids: Vec<u32>,
    },
    /// The end, with OpenAI's `finish_reason`.
    Done {
        finish_reason: &'static str,
    },
    Failed(ApiError),
}

pub struct Reply {
    pub id: String,
    pub ask: Ask,
    pub model: String,
    pub created: u64,
    pub prompt_ids: Vec<u32>,
    events: UnboundedReceiver<SequenceEvent>,
    /// The server's cancellation of what is still running when its shutdown grace ends.
    cancelled: tokio::sync::watch::Receiver<bool>,
    text: StopText,
    /// Token texts for log probabilities (without it, `token_id:N` as vLLM writes them).
    tokenizer: Option<Arc<TextTokenizer>>,
    generated: Vec<u32>,
    /// Each generated token's log probabilities (when asked for) and where its text starts, in
    /// characters of the text before it.
    logprobs: Vec<(TokenLogprobs, usize)>,
    logprob_chars: usize,
    cached_tokens: usize,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// How it ended (`None` while it runs, or if its client left first).
    outcome: Option<&'static str>,
    /// vLLM's `stop_reason`: the stop string or stop token id that ended it (null: the model's
    /// EOS, or a length).
    stop_reason: Value,
    /// The model's own end-of-sequence token (config.json's first).
    model_eos: Option<u32>,
    /// A part decided before the one returned (the end after the last text).
    pending: Option<Part>,
    metrics: Arc<Metrics>,
}

impl Reply {
    /// The reply to request `id`, which arrived at `arrived`, of `app`'s model.
    pub fn new(
        id: String,
        arrived: Instant,
        ask: Ask,
        prompt_ids: Vec<u32>,
        events: UnboundedReceiver<SequenceEvent>,
        app: &App,
    ) -> Reply {
        let (model, metrics) = (app.model.name.clone(), app.metrics.clone());
        let rule =
            StopStrings { stops: ask.stop.clone(), min_tokens: ask.min_tokens, keep: ask.include_stop_str_in_output };
        let text = StopText::new(app.model.tokenizer.clone(), rule);
        let created = crate::unix_seconds();
        Reply {
            id,
            ask,
            model,
            created,
            prompt_ids,
            events,
            cancelled: app.cancelled.clone(),
            text,
            tokenizer: app.model.tokenizer.clone(),
            generated: vec![],
            logprobs: vec![],
            logprob_chars: 0,
            cached_tokens: 0,
            arrived,
            first_token: None,
            last_token: None,
            outcome: None,
            stop_reason: Value::Null,
            model_eos: app.model.eos_ids.first().copied(),
            pending: None,
            metrics,
        }
    }

    /// The next part of the reply; `None` once it has ended.
    pub async fn next(&mut self) -> Option<Part> {
        if let Some(part) = self.pending.take() {
            return Some(part);
        }
        if self.outcome.is_some() {
            return None;
        }
        loop {
            let cancelled = &mut self.cancelled;
            let event = tokio::select! {
                event = self.events.recv() => event,
                Ok(_) = cancelled.wait_for(|c| *c) => {
                    self.outcome = Some("cancelled");
                    return Some(Part::Failed(ApiError::unavailable(
                        "the server stopped before this request finished (its --shutdown-grace ran out)",
                    )));
                }
            };
            let Some(event) = event else {
                return Some(self.fail(ApiError::server("the engine dropped this request; see the server's log")));
            };
            match event {
                SequenceEvent::Admitted { cached_tokens, .. } => {
                    self.cached_tokens = cached_tokens;
                    self.metrics.prompt_tokens.inc_by(self.prompt_ids.len() as u64);
                    self.metrics.cached_prompt_tokens.inc_by(cached_tokens as u64);
                }
                SequenceEvent::Token(id, logprobs) => {
                    let now = Instant::now();
                    self.first_token.get_or_insert(now);
                    self.last_token = Some(now);
                    if let Some(logprobs) = logprobs {
                        self.logprobs.push((logprobs, self.logprob_chars));
                        self.logprob_chars += self.token_text(self.generated.len(), id).chars().count();
                    }
                    self.generated.push(id);
                    self.metrics.generated_tokens.inc();
                    // A stop id ends the reply, its text left out unless asked for (as vLLM); text held
                    // back before it goes out at the end.
                    let stop_id = self.ask.stop_ids.contains(&id) && !self.ask.include_stop_str_in_output;
                    let text = match stop_id {
                        true => String::new(),
                        false => match self.text.push(id) {
                            Ok(text) => text,
                            Err(e) => return Some(self.fail(ApiError::server(format!("cannot detokenize: {e}")))),
                        },
                    };
                    if let Some(stop) = self.text.stop_string() {
                        self.stop_reason = json!(stop);
                        // The sequence leaves its row at the engine's next step.
                        self.events.close();
                        self.end("stop");
                    }
                    return Some(Part::Delta { text, ids: vec![id] });
                }
                SequenceEvent::Finished(reason) => {
                    if matches!(reason, StopReason::Eos | StopReason::StopId) {
                        self.stop_reason = self.stop_token_reason();
                    }
                    let finish_reason = match reason {
                        StopReason::Eos | StopReason::StopId => "stop",
                        StopReason::MaxTokens | StopReason::Context => "length",
                    };
                    // Text held back for a stop string that never came goes out before the end.
                    let tail = self.text.finish();
                    self.end(finish_reason);
                    if tail.is_empty() {
                        return self.pending.take();
                    }
                    return Some(Part::Delta { text: tail, ids: vec![] });
                }
                SequenceEvent::Failed(message) => return Some(self.fail(ApiError::server(message))),
            }
        }
    }

    /// The `stop_reason` of a reply ended by a token: its id, unless it is the model's own
    /// end-of-sequence token (null). As vLLM, which keeps the tokenizer's EOS as EOS and makes
    /// `generation_config.json`'s other ones (Gemma's `<turn|>`) stop ids.
    fn stop_token_reason(&self) -> Value {
        match self.generated.last() {
            Some(&id) if Some(id) != self.model_eos => json!(id),
            _ => Value::Null,
        }
    }

    /// Ends the reply with `finish_reason`: `Done` is the next part.
    fn end(&mut self, finish_reason: &'static str) {
        self.outcome = Some(finish_reason);
        self.pending = Some(Part::Done { finish_reason });
    }

    fn fail(&mut self, error: ApiError) -> Part {
        self.outcome = Some("error");
        Part::Failed(error)
    }

    pub fn usage(&self) -> Value {
        let (prompt, completion) = (self.prompt_ids.len(), self.generated.len());
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.ask.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// A choice with `text` (chat: as `message`, or `delta` in a chunk) and `ids`.
    fn choice(&self, text: &str, ids: &[u32], finish_reason: Option<&str>, chunk: bool) -> Value {
        let stop_reason = if finish_reason.is_some() { self.stop_reason.clone() } else { Value::Null };
        let mut choice =
            json!({"index": 0, "logprobs": null, "finish_reason": finish_reason, "stop_reason": stop_reason});
        match (self.ask.endpoint, chunk) {
            (Endpoint::Chat, false) => choice["message"] = json!({"role": "assistant", "content": text}),
            (Endpoint::Chat, true) if finish_reason.is_some() && text.is_empty() => choice["delta"] = json!({}),
            (Endpoint::Chat, true) => choice["delta"] = json!({"content": text}),
            (Endpoint::Completion, _) => choice["text"] = json!(text),
        }
        if self.ask.return_token_ids {
            choice["token_ids"] = json!(ids);
        }
        // A choice's ids are the last ones generated: all of them, or a chunk's one.
        if self.ask.logprobs.is_some() && !(chunk && ids.is_empty()) {
            let from = self.generated.len() - ids.len();
            choice["logprobs"] = self.logprobs_json(from, self.logprobs.get(from..).unwrap_or_default());
        }
        choice
    }

    /// The text token `id` adds as the `at`-th generated token: what decoding it after the tokens
    /// before adds (a token alone decodes without the space that joins it to them).
    fn token_text(&self, at: usize, id: u32) -> String {
        let Some(t) = &self.tokenizer else { return format!("token_id:{id}") };
        let before = &self.generated[at.saturating_sub(TEXT_CONTEXT)..at];
        let (Ok(head), Ok(whole)) = (t.decode(before), t.decode(&[before, &[id]].concat())) else {
            return String::new();
        };
        match whole.strip_prefix(&head) {
            Some(text) if !text.is_empty() => text.to_string(),
            // Special tokens decode to nothing: their vocabulary entry (`<turn|>`) instead.
            _ => t.token(id).unwrap_or_default(),
        }
    }

    /// The log probabilities of the generated tokens from the `from`-th on, in the endpoint's form:
    /// chat's `content` list, or a completion's parallel lists (`tokens`, `token_logprobs`,
    /// `top_logprobs`, `text_offset`).
    fn logprobs_json(&self, from: usize, logprobs: &[(TokenLogprobs, usize)]) -> Value {
        let tokens = (from..).zip(logprobs).map(|(at, (lp, offset))| (at, self.generated[at], lp, *offset));
        match self.ask.endpoint {
            Endpoint::Chat => {
                let entry = |at: usize, id: u32, logprob: f32| {
                    let text = self.token_text(at, id);
                    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
                };
                let content = tokens.map(|(at, id, lp, _)| {
                    let mut e = entry(at, id, lp.logprob);
                    e["top_logprobs"] = lp.top.iter().map(|&(top, logprob)| entry(at, top, logprob)).collect();
                    e
                });
                json!({"content": content.collect::<Vec<_>>()})
            }
            Endpoint::Completion => {
                let (mut texts, mut chosen, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
                for (at, id, lp, offset) in tokens {
                    texts.push(self.token_text(at, id));
                    chosen.push(lp.logprob);
                    let alternatives = lp.top.iter().map(|&(alt, logprob)| (self.token_text(at, alt), json!(logprob)));
                    top.push(alternatives.collect::<serde_json::Map<_, _>>());
                    offsets.push(offset);
                }
                json!({"tokens": texts, "token_logprobs": chosen, "top_logprobs": top, "text_offset": offsets})
            }
        }
    }

    fn envelope(&self, choices: Vec<Value>, chunk: bool) -> Value {
        let mut body = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model,
            "choices": choices,
        });
        if self.ask.return_token_ids && !chunk {
            body["prompt_token_ids"] = json!(self.prompt_ids);
        }
        // As OpenAI: with `include_usage`, every chunk has `usage`, null until the last.
        if self.ask.include_usage && chunk {
            body["usage"] = Value::Null;
        }
        body
    }

    /// The whole response of a request that did not stream.
    pub fn response(&self, text: &str, finish_reason: &str) -> Value {
        let mut body = self.envelope(vec![self.choice(text, &self.generated, Some(finish_reason), false)], false);
        body["usage"] = self.usage();
        body
    }

    /// The first chunk of a chat stream: the assistant's role (and the prompt's ids when asked).
    pub fn opening_chunk(&self) -> Option<Value> {
        let mut chunk = match self.ask.endpoint {
            Endpoint::Chat => {
                let mut choice = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                if self.ask.return_token_ids {
                    choice["token_ids"] = json!([]);
                }
                self.envelope(vec![choice], true)
            }
            Endpoint::Completion if self.ask.return_token_ids => self.envelope(vec![], true),
            Endpoint::Completion => return None,
        };
        if self.ask.return_token_ids {
            chunk["prompt_token_ids"] = json!(self.prompt_ids);
        }
        Some(chunk)
    }

    pub fn delta_chunk(&self, text: &str, ids: &[u32]) -> Value {
        self.envelope(vec![self.choice(text, ids, None, true)], true)
    }

    pub fn closing_chunk(&self, finish_reason: &str) -> Value {
        self.envelope(vec![self.choice("", &[], Some(finish_reason), true)], true)
    }

    /// The last chunk when `stream_options.include_usage` asks for it: no choices, the usage.
    pub fn usage_chunk(&self) -> Value {
        let mut chunk = self.envelope(vec![], true);
        chunk["usage"] = self.usage();
        chunk
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("client gone");
        // nginx's 499 for a client that closed the connection before the end.
        let status = match outcome {
            "error" => "500",
            "cancelled" => "503",
            "client gone" => "499",
            _ => "200",
        };
        let m = &self.metrics;
        m.requests.with_label_values(&[self.ask.endpoint.name(), status]).inc();
        let total = self.arrived.elapsed().as_secs_f64();
        m.request_duration.observe(total);
        let ttft = self.first_token.map(|t| (t - self.arrived).as_secs_f64());
        if let Some(ttft) = ttft {
            m.time_to_first_token.observe(ttft);
        }
        let per_token = match (self.first_token, self.last_token) {
            (Some(first), Some(last)) if self.generated.len() > 1 => {
                Some((last - first).as_secs_f64() / (self.generated.len() - 1) as f64)
            }
            _ => None,
        };
        if let Some(t) = per_token {
            m.time_per_output_token.observe(t);
        }
        let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1} ms", s * 1e3));
        eprintln!(
            "g4c serve: {} {} {}: prompt {} tokens ({} cached), {} generated, ttft {}, {} per token, total {:.1} ms, {}",
            self.id,
            self.ask.endpoint.name(),
            status,
            self.prompt_ids.len(),
            self.cached_tokens,
            self.generated.len(),
            ms(ttft),
            ms(per_token),
            total * 1e3,
            outcome
        );
    }
}
