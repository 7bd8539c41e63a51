//! Request fields of OpenAI's, vLLM's and llama.cpp's servers that ask for something this server
//! does not do. Each is refused, naming it, unless it is absent, `null`, or at the value that asks
//! for nothing: a request served without what it asked for would look like an answer to it.

use crate::error::ApiError;
use serde_json::Value;

/// A field, what it asks for, and whether a value asks for nothing.
struct Unserved {
    field: &'static str,
    what: &'static str,
    asks_nothing: fn(&Value) -> bool,
}

const fn unserved(field: &'static str, what: &'static str, asks_nothing: fn(&Value) -> bool) -> Unserved {
    Unserved { field, what, asks_nothing }
}

fn never(_: &Value) -> bool {
    false
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}

fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}

const UNSERVED: &[Unserved] = &[
    // OpenAI's.
    unserved("echo", "echoing the prompt", is_false),
    unserved("best_of", "more than one candidate", is_one),
    unserved("tools", "tool calling", is_empty),
    unserved("tool_choice", "tool calling", |v| v == "none" || v == "auto"),
    unserved("functions", "function calling", is_empty),
    unserved("function_call", "function calling", |v| v == "none" || v == "auto"),
    unserved("suffix", "a suffix", is_empty),
    unserved("modalities", "output other than text", |v| v.as_array().is_some_and(|m| m.iter().all(|x| x == "text"))),
    unserved("audio", "audio output", never),
    unserved("prediction", "a predicted output", never),
    unserved("reasoning_effort", "a reasoning effort", never),
    unserved("verbosity", "a verbosity", never),
    unserved("web_search_options", "web search", never),
    // vLLM's.
    unserved("skip_special_tokens", "text with special tokens", is_true),
    unserved("prompt_logprobs", "the prompt's log probabilities", never),
    unserved("use_beam_search", "beam search", is_false),
    unserved("length_penalty", "a beam search's length penalty", is_one),
    unserved("chat_template", "a chat template other than the model's", never),
    unserved("continue_final_message", "continuing the last message", is_false),
    unserved("guided_whitespace_pattern", "a whitespace pattern (JSON is written one way)", never),
    unserved("chat_template_kwargs", "arguments to the chat template", is_empty),
    unserved("documents", "documents for the chat template", is_empty),
    unserved("logits_processors", "logits processors", is_empty),
    unserved("return_tokens_as_token_ids", "tokens as `token_id:N` strings", is_false),
    // llama.cpp's.
    unserved("repeat_penalty", "llama.cpp's penalty over the last tokens (`repetition_penalty` is served)", is_one),
    unserved("n_predict", "llama.cpp's `n_predict` (`max_tokens` is served)", |v| v.as_f64() == Some(-1.0)),
    unserved("typical_p", "typical sampling", is_one),
    unserved("mirostat", "mirostat sampling", is_zero),
    unserved("dry_multiplier", "DRY sampling", is_zero),
    unserved("xtc_probability", "XTC sampling", is_zero),
    unserved("dynatemp_range", "dynamic temperature", is_zero),
    unserved("top_n_sigma", "top-n-sigma sampling", |v| v.as_f64() == Some(-1.0)),
    unserved("grammar", "a GBNF grammar (`guided_grammar` takes one in Lark syntax)", never),
];

/// The fields that change how a chat is rendered into tokens: `/tokenize` refuses these alone.
const RENDERING: &[&str] =
    &["tools", "functions", "chat_template", "chat_template_kwargs", "documents", "continue_final_message"];

/// The first field of `body` (a generation request object) asking for what this server does not
/// do, as a `400` naming it. Fields whose meaning depends on the endpoint (`add_special_tokens`,
/// `add_generation_prompt`) are the endpoint's to refuse.
pub fn check(body: &Value) -> Result<(), ApiError> {
    check_where(body, |_| true)
}

/// As `check`, for a `/tokenize` body: only the fields that would give other ids than generation
/// takes.
pub fn check_rendering(body: &Value) -> Result<(), ApiError> {
    check_where(body, |field| RENDERING.contains(&field))
}

fn check_where(body: &Value, applies: impl Fn(&str) -> bool) -> Result<(), ApiError> {
    for u in UNSERVED.iter().filter(|u| applies(u.field)) {
        if let Some(v) = body.get(u.field).filter(|v| !v.is_null()) {
            if !(u.asks_nothing)(v) {
                return Err(ApiError::unsupported(u.field, u.what));
            }
        }
    }
    Ok(())
}
