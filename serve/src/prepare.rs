//! From a request body to what the engine is asked for.

use crate::api::{self, Ask, Endpoint, PromptSpec};
use crate::error::ApiError;
use crate::ModelInfo;
use g4c_runtime::{GenerateOptions, PromptProblem, SamplingParams, SequenceRequest};

/// A request body checked and made into what the engine is asked for: its prompt tokenized (chat
/// messages through the model's template), its limits checked against the model's context and
/// vocabulary, and the stop and sampling options set.
pub fn prepare(model: &ModelInfo, endpoint: Endpoint, body: &[u8]) -> Result<(Ask, SequenceRequest), ApiError> {
    let ask = api::parse(endpoint, body)?;
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
        return Err(ApiError::param("stop", "`stop`: stop strings need the model's tokenizer.json, which it lacks"));
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
    let shape = &model.shape;
    let param = if endpoint == Endpoint::Chat { "messages" } else { "prompt" };
    shape.check_prompt(&prompt, 1).map_err(|problem| {
        let error = ApiError::param(param, problem.to_string());
        match problem {
            PromptProblem::TooLong { .. } => error.with_code("context_length_exceeded"),
            _ => error,
        }
    })?;
    if let Some(bad) = ask.stop_ids.iter().find(|&&id| id as usize >= shape.vocab) {
        return Err(ApiError::param(
            "stop",
            format!("stop token id {bad} is outside the vocabulary (0..{})", shape.vocab),
        ));
    }
    let context = shape.context;
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
