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
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// How many tokens before a token are decoded with it to find the text it adds.
const TEXT_CONTEXT: usize = 4;

/// What a reply has to say next.
pub enum Part {
    /// New text (possibly empty) of choice `index`, and the ids that produced it.
    Delta { index: usize, text: String, ids: Vec<u32> },
    /// The end of choice `index`, with OpenAI's `finish_reason`.
    Done { index: usize, finish_reason: &'static str },
    /// The end of the whole reply.
    Failed(ApiError),
}

/// One choice: one sequence the engine generates for a prompt.
struct Choice {
    /// Set when a stop string ends its text: its sequence leaves its row at the engine's next step.
    ended: Arc<AtomicBool>,
    text: StopText,
    generated: Vec<u32>,
    /// Each generated token's log probabilities (when asked for) and where its text starts, in
    /// characters of the text before it.
    logprobs: Vec<(TokenLogprobs, usize)>,
    logprob_chars: usize,
    cached_tokens: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// OpenAI's `finish_reason`, once it has ended.
    finish_reason: Option<&'static str>,
    /// vLLM's `stop_reason`: the stop string or stop token id that ended it (null: the model's
    /// EOS, or a length).
    stop_reason: Value,
}

pub struct Reply {
    pub id: String,
    pub ask: Ask,
    pub model: String,
    pub created: u64,
    /// Each prompt's token ids; choice `p·n + i` is prompt `p`'s (`prepare::choices`).
    pub prompts: Vec<Vec<u32>>,
    /// Every choice's events, each with the choice's index.
    events: UnboundedReceiver<(usize, SequenceEvent)>,
    /// The server's cancellation of what is still running when its shutdown grace ends.
    cancelled: tokio::sync::watch::Receiver<bool>,
    choices: Vec<Choice>,
    /// Token texts for log probabilities (without it, `token_id:N` as vLLM writes them).
    tokenizer: Option<Arc<TextTokenizer>>,
    arrived: Instant,
    /// Why the whole reply ended early (`error`, `cancelled`), if it did.
    failed: Option<&'static str>,
    /// The model's own end-of-sequence token (config.json's first).
    model_eos: Option<u32>,
    /// Parts decided before the one returned (the end after a choice's last text).
    pending: VecDeque<Part>,
    metrics: Arc<Metrics>,
}

impl Reply {
    /// The reply to request `id`, which arrived at `arrived`, of `app`'s model, for `prompts`: a
    /// choice for each flag of `ended` (set when a stop string ends that choice), their events from
    /// `events`.
    pub fn new(
        id: String,
        arrived: Instant,
        ask: Ask,
        prompts: Vec<Vec<u32>>,
        events: UnboundedReceiver<(usize, SequenceEvent)>,
        ended: Vec<Arc<AtomicBool>>,
        app: &App,
    ) -> Reply {
        let (model, metrics) = (app.model.name.clone(), app.metrics.clone());
        let rule =
            StopStrings { stops: ask.stop.clone(), min_tokens: ask.min_tokens, keep: ask.include_stop_str_in_output };
        let choices = ended
            .into_iter()
            .map(|ended| Choice {
                ended,
                text: StopText::new(app.model.tokenizer.clone(), rule.clone()),
                generated: vec![],
                logprobs: vec![],
                logprob_chars: 0,
                cached_tokens: 0,
                first_token: None,
                last_token: None,
                finish_reason: None,
                stop_reason: Value::Null,
            })
            .collect();
        let created = crate::unix_seconds();
        Reply {
            id,
            ask,
            model,
            created,
            prompts,
            events,
            cancelled: app.cancelled.clone(),
            choices,
            tokenizer: app.model.tokenizer.clone(),
            arrived,
            failed: None,
            model_eos: app.model.eos_ids.first().copied(),
            pending: VecDeque::new(),
            metrics,
        }
    }

    /// The next part of the reply; `None` once every choice has ended, or the reply has failed.
    pub async fn next(&mut self) -> Option<Part> {
        loop {
            if let Some(part) = self.pending.pop_front() {
                return Some(part);
            }
            if self.failed.is_some() || self.choices.iter().all(|c| c.finish_reason.is_some()) {
                return None;
            }
            let cancelled = &mut self.cancelled;
            let event = tokio::select! {
                event = self.events.recv() => event,
                Ok(_) = cancelled.wait_for(|c| *c) => {
                    self.failed = Some("cancelled");
                    return Some(Part::Failed(ApiError::unavailable(
                        "the server stopped before this request finished (its --shutdown-grace ran out)",
                    )));
                }
            };
            let Some((index, event)) = event else {
                return Some(self.fail(ApiError::server("the engine dropped this request; see the server's log")));
            };
            if let Err(error) = self.take(index, event) {
                return Some(self.fail(error));
            }
        }
    }

    pub fn choice_count(&self) -> usize {
        self.choices.len()
    }

    /// Takes choice `index`'s `event` into its state and the parts it makes.
    fn take(&mut self, index: usize, event: SequenceEvent) -> Result<(), ApiError> {
        let prompt_tokens = self.prompt_of(index).len() as u64;
        let Some(choice) = self.choices.get_mut(index).filter(|c| c.finish_reason.is_none()) else {
            // What the engine made before a stop string's end reached it.
            return Ok(());
        };
        match event {
            SequenceEvent::Admitted { cached_tokens, .. } => {
                choice.cached_tokens = cached_tokens;
                self.metrics.prompt_tokens.inc_by(prompt_tokens);
                self.metrics.cached_prompt_tokens.inc_by(cached_tokens as u64);
            }
            SequenceEvent::Token(id, logprobs) => {
                let now = Instant::now();
                choice.first_token.get_or_insert(now);
                choice.last_token = Some(now);
                if let Some(logprobs) = logprobs {
                    choice.logprobs.push((logprobs, choice.logprob_chars));
                    let text = token_text(self.tokenizer.as_deref(), &choice.generated, choice.generated.len(), id);
                    choice.logprob_chars += text.chars().count();
                }
                choice.generated.push(id);
                self.metrics.generated_tokens.inc();
                // A stop id ends the reply, its text left out unless asked for (as vLLM); text held
                // back before it goes out at the end.
                let stop_id = self.ask.stop_ids.contains(&id) && !self.ask.include_stop_str_in_output;
                let text = match stop_id {
                    true => String::new(),
                    false => choice.text.push(id).map_err(|e| ApiError::server(format!("cannot detokenize: {e}")))?,
                };
                self.pending.push_back(Part::Delta { index, text, ids: vec![id] });
                if let Some(stop) = choice.text.stop_string() {
                    choice.stop_reason = json!(stop);
                    choice.ended.store(true, Ordering::SeqCst);
                    choice.finish_reason = Some("stop");
                    self.pending.push_back(Part::Done { index, finish_reason: "stop" });
                }
            }
            SequenceEvent::Finished(reason) => {
                if matches!(reason, StopReason::Eos | StopReason::StopId) {
                    // The model's own end-of-sequence token is null, as vLLM, which keeps the
                    // tokenizer's EOS as EOS and makes `generation_config.json`'s other ones
                    // (Gemma's `<turn|>`) stop ids.
                    choice.stop_reason = match choice.generated.last() {
                        Some(&id) if Some(id) != self.model_eos => json!(id),
                        _ => Value::Null,
                    };
                }
                let finish_reason = match reason {
                    StopReason::Eos | StopReason::StopId => "stop",
                    StopReason::MaxTokens | StopReason::Context => "length",
                };
                // Text held back for a stop string that never came goes out before the end.
                let tail = choice.text.finish();
                if !tail.is_empty() {
                    self.pending.push_back(Part::Delta { index, text: tail, ids: vec![] });
                }
                choice.finish_reason = Some(finish_reason);
                self.pending.push_back(Part::Done { index, finish_reason });
            }
            SequenceEvent::Failed(message) => return Err(ApiError::server(message)),
        }
        Ok(())
    }

    fn fail(&mut self, error: ApiError) -> Part {
        self.failed = Some("error");
        self.pending.clear();
        Part::Failed(error)
    }

    /// Each prompt's tokens once (with those its first choice found cached), the tokens of every
    /// choice.
    pub fn usage(&self) -> Value {
        let prompt: usize = self.prompts.iter().map(Vec::len).sum();
        let completion: usize = self.choices.iter().map(|c| c.generated.len()).sum();
        let cached = self.cached_tokens();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.ask.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// Choice `index` with `text` (chat: as `message`, or `delta` in a chunk) and `ids`, the last it
    /// generated: all of them, or a chunk's one.
    fn choice(&self, index: usize, text: &str, ids: &[u32], finish_reason: Option<&str>, chunk: bool) -> Value {
        let c = &self.choices[index];
        let stop_reason = if finish_reason.is_some() { c.stop_reason.clone() } else { Value::Null };
        let mut choice =
            json!({"index": index, "logprobs": null, "finish_reason": finish_reason, "stop_reason": stop_reason});
        match (self.ask.endpoint, chunk) {
            (Endpoint::Chat, false) => choice["message"] = json!({"role": "assistant", "content": text}),
            (Endpoint::Chat, true) if finish_reason.is_some() && text.is_empty() => choice["delta"] = json!({}),
            (Endpoint::Chat, true) => choice["delta"] = json!({"content": text}),
            (Endpoint::Completion, _) => choice["text"] = json!(text),
        }
        if self.ask.return_token_ids {
            choice["token_ids"] = json!(ids);
            // vLLM's: a completion's choices each carry their prompt's (a stream's, in its first chunk).
            if self.ask.endpoint == Endpoint::Completion && !chunk {
                choice["prompt_token_ids"] = json!(self.prompt_of(index));
            }
        }
        if self.ask.logprobs.is_some() && !(chunk && ids.is_empty()) {
            let from = c.generated.len() - ids.len();
            choice["logprobs"] = self.logprobs_json(c, from);
        }
        choice
    }

    /// The log probabilities of `choice`'s generated tokens from the `from`-th on, in the endpoint's
    /// form: chat's `content` list, or a completion's parallel lists (`tokens`, `token_logprobs`,
    /// `top_logprobs`, `text_offset`).
    fn logprobs_json(&self, choice: &Choice, from: usize) -> Value {
        let generated = &choice.generated;
        let logprobs = choice.logprobs.get(from..).unwrap_or_default();
        let text = |at: usize, id: u32| token_text(self.tokenizer.as_deref(), generated, at, id);
        let tokens = (from..).zip(logprobs).map(|(at, (lp, offset))| (at, generated[at], lp, *offset));
        match self.ask.endpoint {
            Endpoint::Chat => {
                let entry = |at: usize, id: u32, logprob: f32| {
                    let text = text(at, id);
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
                    texts.push(text(at, id));
                    chosen.push(lp.logprob);
                    let alternatives = lp.top.iter().map(|&(alt, logprob)| (text(at, alt), json!(logprob)));
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
        // vLLM's: a chat's prompt is the response's.
        if self.ask.return_token_ids && !chunk && self.ask.endpoint == Endpoint::Chat {
            body["prompt_token_ids"] = json!(self.prompts[0]);
        }
        // As OpenAI: with `include_usage`, every chunk has `usage`, null until the last.
        if self.ask.include_usage && chunk {
            body["usage"] = Value::Null;
        }
        body
    }

    /// The whole response of a request that did not stream, once every choice has ended: each
    /// choice's text is `texts[index]`.
    pub fn response(&self, texts: &[String]) -> Value {
        let choices = (self.choices.iter().zip(texts).enumerate())
            .map(|(index, (c, text))| self.choice(index, text, &c.generated, c.finish_reason, false))
            .collect();
        let mut body = self.envelope(choices, false);
        body["usage"] = self.usage();
        body
    }

    /// The first chunks of a stream: for a chat, each choice's with the assistant's role (the
    /// first with the prompt's ids, when asked for); for a completion asked for ids, each choice's
    /// with its prompt's.
    pub fn opening_chunks(&self) -> Vec<Value> {
        let ids = self.ask.return_token_ids;
        let opening = |index: usize| {
            let mut choice = json!({"index": index, "logprobs": null, "finish_reason": null});
            match self.ask.endpoint {
                Endpoint::Chat => choice["delta"] = json!({"role": "assistant", "content": ""}),
                Endpoint::Completion => {
                    choice["text"] = json!("");
                    choice["prompt_token_ids"] = json!(self.prompt_of(index));
                }
            }
            if ids {
                choice["token_ids"] = json!([]);
            }
            self.envelope(vec![choice], true)
        };
        let mut chunks: Vec<Value> = match self.ask.endpoint {
            Endpoint::Completion if !ids => vec![],
            _ => (0..self.choices.len()).map(opening).collect(),
        };
        if let Some(first) = chunks.first_mut().filter(|_| ids && self.ask.endpoint == Endpoint::Chat) {
            first["prompt_token_ids"] = json!(self.prompts[0]);
        }
        chunks
    }

    pub fn delta_chunk(&self, index: usize, text: &str, ids: &[u32]) -> Value {
        self.envelope(vec![self.choice(index, text, ids, None, true)], true)
    }

    pub fn closing_chunk(&self, index: usize, finish_reason: &str) -> Value {
        self.envelope(vec![self.choice(index, "", &[], Some(finish_reason), true)], true)
    }

    /// The last chunk when `stream_options.include_usage` asks for it: no choices, the usage.
    pub fn usage_chunk(&self) -> Value {
        let mut chunk = self.envelope(vec![], true);
        chunk["usage"] = self.usage();
        chunk
    }

    /// The token ids of choice `index`'s prompt.
    fn prompt_of(&self, index: usize) -> &[u32] {
        &self.prompts[index / self.ask.n]
    }

    /// The prompt tokens found cached: each prompt's first choice's.
    fn cached_tokens(&self) -> usize {
        let n = self.ask.n;
        self.choices.iter().step_by(n).map(|c| c.cached_tokens).sum()
    }

    /// How the reply ended, for its log line and metrics: its failure, else its choices' finish
    /// reasons (each once), else `client gone`.
    fn outcome(&self) -> String {
        if let Some(failed) = self.failed {
            return failed.to_string();
        }
        let mut reasons: Vec<&str> = vec![];
        for c in &self.choices {
            match c.finish_reason {
                Some(r) if !reasons.contains(&r) => reasons.push(r),
                Some(_) => {}
                None => return "client gone".to_string(),
            }
        }
        reasons.join(",")
    }
}

/// The text token `id` adds as the `at`-th of the `generated` tokens: what decoding it after the
/// tokens before adds (a token alone decodes without the space that joins it to them).
fn token_text(tokenizer: Option<&TextTokenizer>, generated: &[u32], at: usize, id: u32) -> String {
    let Some(t) = tokenizer else { return format!("token_id:{id}") };
    let before = &generated[at.saturating_sub(TEXT_CONTEXT)..at];
    let (Ok(head), Ok(whole)) = (t.decode(before), t.decode(&[before, &[id]].concat())) else {
        return String::new();
    };
    match whole.strip_prefix(&head) {
        Some(text) if !text.is_empty() => text.to_string(),
        // Special tokens decode to nothing: their vocabulary entry (`<turn|>`) instead.
        _ => t.token(id).unwrap_or_default(),
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        let outcome = self.outcome();
        // nginx's 499 for a client that closed the connection before the end.
        let status = match outcome.as_str() {
            "error" => "500",
            "cancelled" => "503",
            "client gone" => "499",
            _ => "200",
        };
        let m = &self.metrics;
        m.requests.with_label_values(&[self.ask.endpoint.name(), status]).inc();
        let total = self.arrived.elapsed().as_secs_f64();
        m.request_duration.observe(total);
        let ttft = self.choices.iter().filter_map(|c| c.first_token).min().map(|t| (t - self.arrived).as_secs_f64());
        if let Some(ttft) = ttft {
            m.time_to_first_token.observe(ttft);
        }
        // Each choice is a sequence of its own, decoded beside the others.
        let per_token: Vec<f64> = (self.choices.iter())
            .filter_map(|c| match (c.first_token, c.last_token) {
                (Some(first), Some(last)) if c.generated.len() > 1 => {
                    Some((last - first).as_secs_f64() / (c.generated.len() - 1) as f64)
                }
                _ => None,
            })
            .collect();
        for &t in &per_token {
            m.time_per_output_token.observe(t);
        }
        let mean_per_token = (!per_token.is_empty()).then(|| per_token.iter().sum::<f64>() / per_token.len() as f64);
        let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1} ms", s * 1e3));
        let generated: usize = self.choices.iter().map(|c| c.generated.len()).sum();
        let choices = match self.choices.len() {
            1 => String::new(),
            n => format!(" in {n} choices"),
        };
        let prompt: usize = self.prompts.iter().map(Vec::len).sum();
        eprintln!(
            "g4c serve: {} {} {}: prompt {} tokens ({} cached), {generated} generated{choices}, ttft {}, {} per token, total {:.1} ms, {outcome}",
            self.id,
            self.ask.endpoint.name(),
            status,
            prompt,
            self.cached_tokens(),
            ms(ttft),
            ms(mean_per_token),
            total * 1e3,
        );
    }
}
