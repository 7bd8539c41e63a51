//! The request bodies of `/v1/chat/completions` and `/v1/completions`, parsed and checked into an
//! `Ask`. As OpenAI does, unknown fields are ignored; a known field of the wrong type or out of range
//! is a `400` naming it, and so is a feature this server does not have (the fields `unserved`
//! lists: tools, beam search, …), rather than a request quietly served without it.

use crate::error::ApiError;
use g4c_frontend::ChatMessage;
use g4c_runtime::constraint::Grammar;
use serde::Deserialize;
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completion => "completion",
        }
    }
}

/// What to generate from, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptSpec {
    /// Rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Tokenized with BOS first.
    Text(String),
    /// Used as given.
    Ids(Vec<u32>),
}

/// A checked request.
#[derive(Clone, Debug, PartialEq)]
pub struct Ask {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    /// Chat: the messages; a completion: one prompt or several.
    pub prompts: Vec<PromptSpec>,
    /// The most tokens to generate, and the field that said so (`max_tokens` or
    /// `max_completion_tokens`).
    pub max_tokens: Option<(&'static str, usize)>,
    /// The sampling parameters the request sets; those it leaves out take the model's defaults
    /// (`generation_config.json`), else OpenAI's.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0: all tokens.
    pub top_k: Option<usize>,
    /// vLLM's `min_p` (0: off).
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_ids: Vec<u32>,
    /// How many choices to generate for each prompt, each its own sequence (vLLM: with a `seed`,
    /// choice `i` samples with `seed + i`).
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// vLLM's `ignore_eos`.
    pub ignore_eos: bool,
    /// vLLM's `return_token_ids`: choices carry the generated ids, the response the prompt's.
    pub return_token_ids: bool,
    /// Each generated token's log probability, and those of this many most likely tokens
    /// (completions' `logprobs: n`; chat's `logprobs: true` with `top_logprobs: n`).
    pub logprobs: Option<usize>,
    /// vLLM's `repetition_penalty` (1: none; a default as above), OpenAI's `frequency_penalty` and
    /// `presence_penalty` (0: none): `g4c_runtime::penalties`.
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// OpenAI's `logit_bias`: token ids and what is added to their logits (-100 to 100).
    pub logit_bias: Vec<(u32, f32)>,
    /// The grammar the text must follow (structured output), and the field that asked for it.
    pub grammar: Option<(&'static str, Grammar)>,
    /// vLLM's `min_tokens`: no end (EOS, stop id, stop string) before this many tokens.
    pub min_tokens: usize,
    /// vLLM's `allowed_token_ids`: the only tokens to generate (empty: any).
    pub allowed_token_ids: Vec<u32>,
    /// vLLM's `include_stop_str_in_output`: the text keeps the stop string that ended it.
    pub include_stop_str_in_output: bool,
    /// vLLM's `truncate_prompt_tokens`: only the prompt's last tokens, this many (`-1`: as many as
    /// the context holds with room for a token).
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM's `bad_words`: words the reply may not hold.
    pub bad_words: Vec<String>,
}

/// The most choices a request may ask for (`n`), as OpenAI, and the most prompts a completion may give.
const MAX_CHOICES: u64 = 128;

/// The most tokens a request may ask for: as many positions as any context has.
const MAX_TOKENS_LIMIT: u64 = g4c_util::limits::MAX_CONTEXT as u64;

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Ask, ApiError> {
    let value = body_object(body)?;
    let field = |name: &str| value.get(name).filter(|v| !v.is_null());
    crate::unserved::check(&value)?;
    let common: Common = typed(&value, "request")?;
    let prompts = match endpoint {
        Endpoint::Chat => {
            let messages = field("messages").ok_or_else(|| ApiError::param("messages", "`messages` is required"))?;
            let messages: Vec<MessageBody> = typed(messages, "messages")?;
            vec![PromptSpec::Messages(chat_messages(messages)?)]
        }
        Endpoint::Completion => {
            let prompt = field("prompt").ok_or_else(|| ApiError::param("prompt", "`prompt` is required"))?;
            completion_prompts(typed(prompt, "prompt")?)?
        }
    };
    let grammar = crate::structured::requested(&value)?;
    Ok(Ask { grammar, ..common.check(endpoint, prompts)? })
}

/// A request body: a JSON object, else a `400` saying what it is not.
pub(crate) fn body_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))?;
    match value.is_object() {
        true => Ok(value),
        false => Err(ApiError::invalid("the body must be a JSON object")),
    }
}

/// `value` (field `what` of the body, or `request`: the body) as `T`, or a `400` naming the field
/// at fault and serde's reason.
pub(crate) fn typed<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let field = match (what, inner.as_str()) {
            ("request", ".") => "request".to_string(),
            ("request", path) => path.to_string(),
            (what, ".") => what.to_string(),
            (what, path) if path.starts_with('[') => format!("{what}{path}"),
            (what, path) => format!("{what}.{path}"),
        };
        // OpenAI's `param` names the top-level field.
        let param = field.split(['.', '[']).next().unwrap_or(what).to_string();
        ApiError::param(&param, format!("`{field}`: {}", plain_types(&e.into_inner().to_string())))
    })
}

/// serde's reason with its Rust type names said as a client's JSON has them.
fn plain_types(reason: &str) -> String {
    [
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected i64", "expected an integer from -2^63 to 2^63 - 1"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ]
    .iter()
    .fold(reason.to_string(), |text, (rust, json)| text.replace(rust, json))
}

#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<Stop>,
    stop_token_ids: Option<Vec<u32>>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logit_bias: Option<serde_json::Map<String, Value>>,
    min_tokens: Option<u64>,
    allowed_token_ids: Option<Vec<u32>>,
    include_stop_str_in_output: Option<bool>,
    truncate_prompt_tokens: Option<i64>,
    bad_words: Option<Vec<String>>,
    n: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    ignore_eos: Option<bool>,
    return_token_ids: Option<bool>,
    logprobs: Option<Value>,
    top_logprobs: Option<u64>,
    // vLLM's, accepted only at the values that ask for nothing (the others: `unserved`).
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// `logit_bias` (`{"TOKEN_ID": BIAS}`, as OpenAI has it: ids as strings) as pairs.
fn logit_bias(map: Option<&serde_json::Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let refuse = |message: String| ApiError::param("logit_bias", format!("`logit_bias`: {message}"));
    let Some(map) = map else { return Ok(vec![]) };
    map.iter()
        .map(|(id, bias)| {
            let id = id.parse::<u32>().map_err(|_| refuse(format!("expected token ids as keys, found {id:?}")))?;
            match bias.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(refuse(format!("expected a number from -100 to 100 for token {id}, found {bias}"))),
            }
        })
        .collect()
}

/// `stop`: a string, or a list of strings and token ids.
#[derive(Deserialize)]
#[serde(untagged, expecting = "expected a string, or a list of strings and token ids")]
enum Stop {
    One(String),
    Many(Vec<StopItem>),
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "expected a string or a token id")]
enum StopItem {
    Text(String),
    Id(u32),
}

#[derive(Deserialize)]
pub(crate) struct MessageBody {
    role: String,
    content: Option<Content>,
}

/// A message's content: text, or a list of parts of which only text is supported.
#[derive(Deserialize)]
#[serde(untagged, expecting = "expected a string, or a list of content parts")]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// A completion's `prompt`: text, token ids, or a list of either.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string, a list of token ids, a list of strings, or a list of lists of token ids"
)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

pub(crate) fn chat_messages(messages: Vec<MessageBody>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty: give at least one message"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            if !["system", "developer", "user", "assistant"].contains(&m.role.as_str()) {
                return Err(ApiError::param(
                    "messages",
                    format!("messages[{i}].role: expected system, developer, user or assistant, found `{}`", m.role),
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(text)) => text,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.into_iter().enumerate() {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text += &t,
                            ("text", None) => {
                                return Err(ApiError::param(
                                    "messages",
                                    format!("messages[{i}].content[{j}]: a text part without `text`"),
                                ))
                            }
                            (kind, _) => {
                                return Err(ApiError::param(
                                    "messages",
                                    format!(
                                        "messages[{i}].content[{j}]: only text parts are supported, found `{kind}`"
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            // Gemma's templates have no developer turn; OpenAI's newer clients send one for system.
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

/// A completion's prompts: one, or a list (each generated as a request of its own would be).
fn completion_prompts(prompt: Prompt) -> Result<Vec<PromptSpec>, ApiError> {
    let prompts = match prompt {
        Prompt::Text(text) => vec![PromptSpec::Text(text)],
        Prompt::Ids(ids) => vec![PromptSpec::Ids(ids)],
        Prompt::Texts(texts) => texts.into_iter().map(PromptSpec::Text).collect(),
        Prompt::IdLists(lists) => lists.into_iter().map(PromptSpec::Ids).collect(),
    };
    let empty = |p: &PromptSpec| match p {
        PromptSpec::Text(t) => t.is_empty(),
        PromptSpec::Ids(ids) => ids.is_empty(),
        PromptSpec::Messages(_) => false,
    };
    if prompts.len() as u64 > MAX_CHOICES {
        let message = format!("`prompt`: at most {MAX_CHOICES} prompts, found {}", prompts.len());
        return Err(ApiError::param("prompt", message));
    }
    // `[]` is an empty list of ids: one prompt.
    match prompts.iter().position(empty) {
        Some(_) if prompts.len() == 1 => Err(ApiError::param("prompt", "`prompt` is empty")),
        Some(i) => Err(ApiError::param("prompt", format!("`prompt[{i}]` is empty"))),
        None => Ok(prompts),
    }
}

impl Common {
    fn check(self, endpoint: Endpoint, prompts: Vec<PromptSpec>) -> Result<Ask, ApiError> {
        let n = match self.n.unwrap_or(1) {
            n @ 1..=MAX_CHOICES => n as usize,
            n => return Err(ApiError::param("n", format!("`n`: expected 1 to {MAX_CHOICES}, found {n}"))),
        };
        let logprobs = self.logprobs(endpoint)?;
        let logit_bias = logit_bias(self.logit_bias.as_ref())?;
        // What is done: text gets BOS first, a chat what its template writes (and one BOS).
        match (endpoint, self.add_special_tokens) {
            (Endpoint::Chat, Some(true)) => {
                return Err(ApiError::unsupported(
                    "add_special_tokens",
                    "adding special tokens to what the chat template writes",
                ));
            }
            (Endpoint::Completion, Some(false)) => {
                return Err(ApiError::unsupported("add_special_tokens", "a text prompt without BOS"));
            }
            _ => {}
        }
        if self.add_generation_prompt == Some(false) {
            return Err(ApiError::unsupported("add_generation_prompt", "continuing the last message"));
        }
        if self.stream != Some(true) && self.stream_options.is_some() {
            return Err(ApiError::param("stream_options", "`stream_options` is only allowed with `stream: true`"));
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => Some(("max_completion_tokens", n)),
            (None, Some(n)) => Some(("max_tokens", n)),
            (None, None) => None,
        };
        if let Some((name, n)) = max_tokens {
            if n == 0 || n > MAX_TOKENS_LIMIT {
                return Err(ApiError::param(name, format!("`{name}`: expected 1 to {MAX_TOKENS_LIMIT}, found {n}")));
            }
        }
        // At most the reply's length, which `prepare` knows.
        let min_tokens = self.min_tokens.unwrap_or(0).min(MAX_TOKENS_LIMIT + 1) as usize;
        if self.allowed_token_ids.as_ref().is_some_and(|ids| ids.is_empty()) {
            return Err(ApiError::param(
                "allowed_token_ids",
                "`allowed_token_ids`: expected at least one id, found none",
            ));
        }
        // OpenAI's range; the others are `SamplingParams::check`'s, once the model's defaults are in
        // (`prepare`).
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(ApiError::param("temperature", format!("`temperature`: expected 0 to 2, found {t:?}")));
        }
        let top_k = match self.top_k {
            None => None,
            Some(-1) | Some(0) => Some(0),
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::param("top_k", format!("`top_k`: expected -1, 0 (all) or more, found {k}")))
            }
        };
        let (mut stop, mut stop_ids) = (vec![], self.stop_token_ids.unwrap_or_default());
        match self.stop {
            None => {}
            Some(Stop::One(s)) => stop.push(s),
            Some(Stop::Many(items)) => {
                for item in items {
                    match item {
                        StopItem::Text(s) => stop.push(s),
                        StopItem::Id(id) => stop_ids.push(id),
                    }
                }
            }
        }
        if stop.iter().any(|s| s.is_empty()) {
            return Err(ApiError::param("stop", "`stop`: a stop string is empty"));
        }
        Ok(Ask {
            endpoint,
            model: self.model,
            prompts,
            max_tokens: max_tokens.map(|(name, n)| (name, n as usize)),
            temperature: self.temperature.map(|t| t as f32),
            top_p: self.top_p.map(|p| p as f32),
            top_k,
            min_p: self.min_p.map(|p| p as f32),
            seed: self.seed.map(|s| s as u64),
            stop,
            stop_ids,
            n,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
            logprobs,
            repetition_penalty: self.repetition_penalty.map(|r| r as f32),
            logit_bias,
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0) as f32,
            presence_penalty: self.presence_penalty.unwrap_or(0.0) as f32,
            grammar: None,
            min_tokens,
            allowed_token_ids: self.allowed_token_ids.unwrap_or_default(),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            bad_words: self.bad_words.unwrap_or_default(),
        })
    }

    /// How many most likely tokens' log probabilities each token comes with, if any are asked for:
    /// a completion's `logprobs` is that number, a chat's is `true` and `top_logprobs` the number.
    fn logprobs(&self, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
        let most = |name: &str, n: u64| match n {
            0..=MAX_TOP_LOGPROBS => Ok(n as usize),
            n => Err(ApiError::param(name, format!("`{name}`: expected 0 to {MAX_TOP_LOGPROBS}, found {n}"))),
        };
        let asked = self.logprobs.as_ref().filter(|v| !v.is_null());
        match endpoint {
            Endpoint::Completion => {
                if self.top_logprobs.is_some() {
                    return Err(ApiError::param(
                        "top_logprobs",
                        "`top_logprobs` is for chat; a completion's `logprobs` is the number",
                    ));
                }
                match asked {
                    None => Ok(None),
                    Some(Value::Number(n)) if n.as_u64().is_some() => most("logprobs", n.as_u64().unwrap()).map(Some),
                    Some(v) => Err(ApiError::param(
                        "logprobs",
                        format!("`logprobs`: expected a number of tokens, 0 to {MAX_TOP_LOGPROBS}, found {v}"),
                    )),
                }
            }
            Endpoint::Chat => {
                let on = match asked {
                    None | Some(Value::Bool(false)) => false,
                    Some(Value::Bool(true)) => true,
                    Some(v) => {
                        return Err(ApiError::param(
                            "logprobs",
                            format!("`logprobs`: expected true or false, found {v}"),
                        ))
                    }
                };
                match (on, self.top_logprobs) {
                    (true, n) => most("top_logprobs", n.unwrap_or(0)).map(Some),
                    (false, Some(n)) if n > 0 => {
                        Err(ApiError::param("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
                    }
                    (false, _) => Ok(None),
                }
            }
        }
    }
}

/// The most alternatives a token's log probabilities may list (OpenAI's and vLLM's default limit).
const MAX_TOP_LOGPROBS: u64 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Ask, ApiError> {
        parse(Endpoint::Chat, body.to_string().as_bytes())
    }

    fn completion(body: Value) -> Result<Ask, ApiError> {
        parse(Endpoint::Completion, body.to_string().as_bytes())
    }

    #[test]
    fn a_chat_request_with_every_supported_field() {
        let ask = chat(serde_json::json!({
            "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "seed": 3,
            "stop": ["x", 17], "stream": true, "stream_options": {"include_usage": true}, "n": 1,
            "logprobs": false, "frequency_penalty": 0, "some_future_field": {"ignored": true}
        }))
        .unwrap();
        let messages = vec![
            ChatMessage { role: "system".into(), content: "be brief".into() },
            ChatMessage { role: "user".into(), content: "hi".into() },
        ];
        assert_eq!(ask.prompts, [PromptSpec::Messages(messages)]);
        assert_eq!(
            (ask.max_tokens, ask.temperature, ask.top_p, ask.top_k, ask.seed),
            (Some(("max_completion_tokens", 5)), Some(0.5), Some(0.9), Some(7), Some(3))
        );
        assert_eq!((ask.stop, ask.stop_ids), (vec!["x".to_string()], vec![17]));
        assert_eq!(ask.min_p, Some(0.05));
        assert!(ask.stream && ask.include_usage);
    }

    #[test]
    fn logprobs_as_each_endpoint_asks_for_them() {
        let user = serde_json::json!([{"role": "user", "content": "x"}]);
        let chat_logprobs = |extra: Value| {
            let mut body = serde_json::json!({"messages": user});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat(body).map(|a| a.logprobs)
        };
        assert_eq!(chat_logprobs(serde_json::json!({})).unwrap(), None);
        assert_eq!(chat_logprobs(serde_json::json!({"logprobs": true})).unwrap(), Some(0));
        assert_eq!(chat_logprobs(serde_json::json!({"logprobs": true, "top_logprobs": 5})).unwrap(), Some(5));
        assert_eq!(chat_logprobs(serde_json::json!({"logprobs": false, "top_logprobs": 0})).unwrap(), None);
        let completion_logprobs =
            |v: Value| completion(serde_json::json!({"prompt": "x", "logprobs": v})).map(|a| a.logprobs);
        assert_eq!(completion_logprobs(Value::Null).unwrap(), None);
        assert_eq!(completion_logprobs(serde_json::json!(0)).unwrap(), Some(0));
        assert_eq!(completion_logprobs(serde_json::json!(3)).unwrap(), Some(3));
        for bad in [serde_json::json!(true), serde_json::json!(-1), serde_json::json!(21)] {
            assert_eq!(completion_logprobs(bad.clone()).unwrap_err().param.as_deref(), Some("logprobs"), "{bad}");
        }
    }

    #[test]
    fn completion_prompts_text_ids_and_lists() {
        let prompt = |p: Value| completion(serde_json::json!({"prompt": p})).map(|a| a.prompts);
        assert_eq!(prompt("ba de".into()).unwrap(), [PromptSpec::Text("ba de".into())]);
        assert_eq!(prompt(serde_json::json!([2, 5])).unwrap(), [PromptSpec::Ids(vec![2, 5])]);
        assert_eq!(prompt(serde_json::json!([[2, 5]])).unwrap(), [PromptSpec::Ids(vec![2, 5])]);
        assert_eq!(prompt(serde_json::json!(["a"])).unwrap(), [PromptSpec::Text("a".into())]);
        let two = [PromptSpec::Text("a".into()), PromptSpec::Text("b".into())];
        assert_eq!(prompt(serde_json::json!(["a", "b"])).unwrap(), two);
        assert!(prompt(serde_json::json!([])).unwrap_err().message.contains("`prompt` is empty"));
        assert!(prompt(serde_json::json!(["a", ""])).unwrap_err().message.contains("`prompt[1]` is empty"));
        assert!(prompt(serde_json::json!([[2], []])).unwrap_err().message.contains("`prompt[1]` is empty"));
        // vLLM's `add_special_tokens`: true (BOS first) is what a completion gets, false is refused.
        let bos = |add: bool| completion(serde_json::json!({"prompt": "ba", "add_special_tokens": add}));
        assert!(bos(true).is_ok());
        assert_eq!(bos(false).unwrap_err().param.as_deref(), Some("add_special_tokens"));
    }

    #[test]
    fn wrong_and_unsupported_fields_are_400s_naming_the_field() {
        let cases = [
            (serde_json::json!({"messages": []}), "messages"),
            (serde_json::json!({}), "messages"),
            (serde_json::json!({"messages": [{"role": "robot", "content": "x"}]}), "messages"),
            (serde_json::json!({"messages": "hi"}), "messages"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}), "temperature"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), "temperature"),
            (serde_json::json!({"messages": [{"role": "user", "content": 5}]}), "messages"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "n": 129}), "n"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 2}), "logprobs"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}), "top_logprobs"),
            (
                serde_json::json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "stop": [""]}), "stop"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "top_k": -2}), "top_k"),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}], "n": 0}), "n"),
            (serde_json::json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), "messages"),
            (
                serde_json::json!({"messages": [{"role": "user", "content": "x"}], "stream_options": {}}),
                "stream_options",
            ),
        ];
        for (body, param) in cases {
            let err = chat(body.clone()).unwrap_err();
            assert_eq!(err.status, 400, "{body}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
        }
        assert_eq!(parse(Endpoint::Chat, b"{not json").unwrap_err().status, 400);
        assert_eq!(parse(Endpoint::Chat, b"[1]").unwrap_err().status, 400);
        let message = |body: Value| chat(body).unwrap_err().message;
        let part = message(serde_json::json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}));
        assert!(part.contains("messages[0].content[0]: a text part without `text`"), "{part}");
        assert!(
            message(serde_json::json!({"messages": [{"role": "user", "content": 5}]})).contains("expected a string")
        );
        assert!(message(serde_json::json!({"messages": [{"role": "user", "content": "x"}], "n": 0}))
            .contains("expected 1 to 128"));
        let seed = message(serde_json::json!({"messages": [{"role": "user", "content": "x"}], "seed": u64::MAX}));
        assert!(seed.contains("`seed`") && seed.contains("from -2^63"), "{seed}");
    }

    /// vLLM's and llama.cpp's own fields are served at the values that ask for nothing, and refused,
    /// naming the field, at any other.
    #[test]
    fn engine_specific_fields_are_refused_unless_they_ask_for_nothing() {
        let with = |field: &str, value: Value| {
            let mut body = serde_json::json!({"messages": [{"role": "user", "content": "x"}]});
            body[field] = value;
            chat(body)
        };
        let nothing = [
            ("repetition_penalty", serde_json::json!(1.0)),
            ("repeat_penalty", serde_json::json!(1)),
            ("skip_special_tokens", serde_json::json!(true)),
            ("add_generation_prompt", serde_json::json!(true)),
            ("continue_final_message", serde_json::json!(false)),
            ("guided_json", Value::Null),
            ("tool_choice", serde_json::json!("none")),
            ("modalities", serde_json::json!(["text"])),
            ("use_beam_search", serde_json::json!(false)),
            ("n_predict", serde_json::json!(-1)),
            ("typical_p", serde_json::json!(1.0)),
            ("chat_template_kwargs", serde_json::json!({})),
            ("add_special_tokens", serde_json::json!(false)),
        ];
        for (field, value) in nothing {
            assert!(with(field, value.clone()).is_ok(), "{field}: {value}");
        }
        let something = [
            ("repeat_penalty", serde_json::json!(1.1)),
            ("skip_special_tokens", serde_json::json!(false)),
            ("add_generation_prompt", serde_json::json!(false)),
            ("continue_final_message", serde_json::json!(true)),
            ("grammar", serde_json::json!("root ::= \"a\"")),
            ("prompt_logprobs", serde_json::json!(1)),
            ("chat_template", serde_json::json!("{{ messages }}")),
            ("tool_choice", serde_json::json!("required")),
            ("functions", serde_json::json!([{"name": "f"}])),
            ("modalities", serde_json::json!(["text", "audio"])),
            ("reasoning_effort", serde_json::json!("low")),
            ("n_predict", serde_json::json!(3)),
            ("mirostat", serde_json::json!(2)),
            ("dry_multiplier", serde_json::json!(0.8)),
            ("xtc_probability", serde_json::json!(0.5)),
            ("add_special_tokens", serde_json::json!(true)),
        ];
        for (field, value) in something {
            let err = with(field, value.clone()).unwrap_err();
            assert_eq!((err.status.as_u16(), err.param.as_deref()), (400, Some(field)), "{field}: {value}");
            assert!(err.message.contains("not supported"), "{field}: {}", err.message);
        }
    }

    /// The penalties and `logit_bias` are taken (their ranges: `prepare`'s test), and a bias
    /// outside OpenAI's range or not keyed by token ids is refused, naming the field.
    #[test]
    fn penalties_are_served_within_their_ranges() {
        let with = |field: &str, value: Value| {
            let mut body = serde_json::json!({"messages": [{"role": "user", "content": "x"}]});
            body[field] = value;
            chat(body)
        };
        let ask = with("repetition_penalty", serde_json::json!(1.3)).unwrap();
        assert_eq!((ask.repetition_penalty, ask.frequency_penalty, ask.presence_penalty), (Some(1.3), 0.0, 0.0));
        assert_eq!(with("frequency_penalty", serde_json::json!(-2)).unwrap().frequency_penalty, -2.0);
        assert_eq!(with("presence_penalty", serde_json::json!(0.5)).unwrap().presence_penalty, 0.5);
        let bias = with("logit_bias", serde_json::json!({"17": -100, "4": 2.5})).unwrap().logit_bias;
        assert_eq!(bias, [(17, -100.0), (4, 2.5)]);
        for (field, value) in [
            ("logit_bias", serde_json::json!({"x": 1})),
            ("logit_bias", serde_json::json!({"17": 101})),
            ("logit_bias", serde_json::json!({"17": "a"})),
        ] {
            let err = with(field, value.clone()).unwrap_err();
            assert_eq!((err.status.as_u16(), err.param.as_deref()), (400, Some(field)), "{field}: {value}");
            assert!(err.message.contains("expected"), "{field}: {}", err.message);
        }
    }
}
