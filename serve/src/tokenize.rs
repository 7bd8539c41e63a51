//! vLLM's `/tokenize` and `/detokenize`: a prompt's token ids exactly as the generation endpoints
//! would take them (the same tokenizer, chat template and BOS rule), so a client can count tokens
//! against the context, and the text of token ids.

use crate::api::{body_object, chat_messages, typed, MessageBody, PromptSpec};
use crate::error::ApiError;
use crate::prepare::prompt_ids;
use crate::ModelInfo;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<MessageBody>>,
    /// Text: BOS first (true, as `/v1/completions` does) or not. Chat: the template writes them.
    add_special_tokens: Option<bool>,
    /// Chat: the template's start of the model's turn, as `/v1/chat/completions` renders it.
    add_generation_prompt: Option<bool>,
    /// Each token's text in the vocabulary beside its id.
    return_token_strs: Option<bool>,
}

#[derive(Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `/tokenize`: `{"count", "max_model_len", "tokens", "token_strs"}`.
pub fn tokenize(model: &ModelInfo, body: &[u8]) -> Result<Value, ApiError> {
    let value = body_object(body)?;
    crate::unserved::check_rendering(&value)?;
    let body: TokenizeBody = typed(&value, "request")?;
    check_model(model, body.model.as_deref())?;
    if model.tokenizer.is_none() {
        return Err(ApiError::invalid("this model has no tokenizer.json, so there is nothing to tokenize with"));
    }
    let ids = match (body.prompt, body.messages) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("give `prompt` or `messages`, not both")),
        (None, None) => return Err(ApiError::invalid("`prompt` or `messages` is required")),
        (Some(text), None) => {
            if body.add_generation_prompt.is_some() {
                return Err(ApiError::unsupported("add_generation_prompt", "a generation prompt for text"));
            }
            match (body.add_special_tokens.unwrap_or(true), model.tokenizer.as_deref()) {
                (false, Some(t)) => {
                    t.encode_continuation(&text).map_err(|e| ApiError::param("prompt", e.to_string()))?
                }
                _ => prompt_ids(model, &PromptSpec::Text(text))?,
            }
        }
        (None, Some(messages)) => {
            if body.add_special_tokens == Some(true) {
                return Err(ApiError::unsupported(
                    "add_special_tokens",
                    "adding special tokens to what the chat template writes",
                ));
            }
            if body.add_generation_prompt == Some(false) {
                return Err(ApiError::unsupported(
                    "add_generation_prompt",
                    "rendering without the start of the model's turn",
                ));
            }
            prompt_ids(model, &PromptSpec::Messages(chat_messages(messages)?))?
        }
    };
    let strs = body.return_token_strs.unwrap_or(false).then(|| {
        let tokenizer = model.tokenizer.as_deref().expect("text was tokenized");
        ids.iter().map(|&id| tokenizer.token(id)).collect::<Vec<_>>()
    });
    Ok(json!({"count": ids.len(), "max_model_len": model.shape.context, "tokens": ids, "token_strs": strs}))
}

/// `/detokenize`: `{"prompt"}`, the text of `tokens` (special tokens skipped, as replies have it).
pub fn detokenize(model: &ModelInfo, body: &[u8]) -> Result<Value, ApiError> {
    let body: DetokenizeBody = typed(&body_object(body)?, "request")?;
    check_model(model, body.model.as_deref())?;
    let Some(tokenizer) = model.tokenizer.as_deref() else {
        return Err(ApiError::invalid("this model has no tokenizer.json, so token ids have no text"));
    };
    let vocab = model.shape.vocab;
    if let Some((i, id)) = body.tokens.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(ApiError::param("tokens", format!("`tokens[{i}]`: {id} is outside the vocabulary (0..{vocab})")));
    }
    let text = tokenizer.decode(&body.tokens).map_err(|e| ApiError::param("tokens", e.to_string()))?;
    Ok(json!({"prompt": text}))
}

/// A request naming a model must name the served one.
pub fn check_model(model: &ModelInfo, asked: Option<&str>) -> Result<(), ApiError> {
    match asked.filter(|m| *m != model.name) {
        Some(asked) => Err(ApiError::not_found(
            format!("the model `{asked}` does not exist; this server serves `{}`", model.name),
            "model_not_found",
        )),
        None => Ok(()),
    }
}
