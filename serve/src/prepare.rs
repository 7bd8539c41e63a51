//! From a request body to what the engine is asked for.

use crate::api::{self, Ask, Endpoint, PromptSpec};
use crate::error::ApiError;
use crate::tokenize::check_model;
use crate::ModelInfo;
use g4c_frontend::{SamplingDefaults, TextTokenizer};
use g4c_runtime::sampling::Sampler;
use g4c_runtime::{GenerateOptions, PromptProblem, SamplingParams, SequenceRequest};

/// A request body checked and made into what the engine is asked for: a sequence per prompt (a
/// completion may give several; chat messages are one, through the model's template), each prompt
/// tokenized and checked against the model's context and vocabulary, and the stop and sampling
/// options set.
pub fn prepare(model: &ModelInfo, endpoint: Endpoint, body: &[u8]) -> Result<(Ask, Vec<SequenceRequest>), ApiError> {
    let ask = api::parse(endpoint, body)?;
    check_model(model, ask.model.as_deref())?;
    let options = options(model, &ask)?;
    let several = ask.prompts.len() > 1;
    let requests = (ask.prompts.iter().enumerate())
        .map(|(i, prompt)| {
            let mut options = options.clone();
            // Without a seed, each prompt samples apart, as requests of their own would.
            if ask.seed.is_none() && i > 0 {
                options.sampling.seed = rand::random();
            }
            // A problem of one of several prompts says which.
            sequence(model, &ask, prompt, options).map_err(|mut e| {
                if several {
                    e.message = format!("prompt {i}: {}", e.message);
                }
                e
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((ask, requests))
}

/// How `ask` generates, whatever its prompt: stops, sampling, penalties and grammar, with
/// `max_new_tokens` left for `sequence` to set.
fn options(model: &ModelInfo, ask: &Ask) -> Result<GenerateOptions, ApiError> {
    let tokenizer = model.tokenizer.as_deref();
    if tokenizer.is_none() && !ask.return_token_ids {
        return Err(ApiError::invalid(
            "this model has no tokenizer.json, so replies have no text: ask for `return_token_ids`",
        ));
    }
    if tokenizer.is_none() && !ask.stop.is_empty() {
        return Err(ApiError::param("stop", "`stop`: stop strings need the model's tokenizer.json, which it lacks"));
    }
    let bad_words = match tokenizer {
        Some(t) => bad_words(t, &ask.bad_words)?,
        None if ask.bad_words.is_empty() => vec![],
        None => {
            return Err(ApiError::param("bad_words", "`bad_words` needs the model's tokenizer.json, which it lacks"))
        }
    };
    let shape = &model.shape;
    let biased: Vec<u32> = ask.logit_bias.iter().map(|&(id, _)| id).collect();
    for (field, ids) in
        [("stop", &ask.stop_ids), ("allowed_token_ids", &ask.allowed_token_ids), ("logit_bias", &biased)]
    {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= shape.vocab) {
            let message = format!("`{field}`: token id {bad} is outside the vocabulary (0..{})", shape.vocab);
            return Err(ApiError::param(field, message));
        }
    }
    let mut stop_ids = ask.stop_ids.clone();
    // A stop string that is a special token (`<turn|>`) never appears in the text, which skips
    // special tokens: it stops as that token's id.
    if let Some(t) = tokenizer {
        let special = |id: u32| t.decode(&[id]).is_ok_and(|text| text.is_empty());
        stop_ids.extend(ask.stop.iter().filter_map(|s| t.token_id(s)).filter(|&id| special(id)));
    }
    let defaults = &model.sampling_defaults;
    let mut options = GenerateOptions {
        max_new_tokens: 0,
        eos_ids: model.eos_ids.clone(),
        ignore_eos: ask.ignore_eos,
        stop_ids,
        // What the request leaves out: the model's defaults (vLLM's `--generation-config auto`), else
        // OpenAI's.
        sampling: SamplingParams {
            seed: ask.seed.unwrap_or_else(rand::random),
            frequency_penalty: ask.frequency_penalty,
            presence_penalty: ask.presence_penalty,
            ..sampling_params(&SamplingDefaults {
                temperature: ask.temperature.or(defaults.temperature),
                top_k: ask.top_k.or(defaults.top_k),
                top_p: ask.top_p.or(defaults.top_p),
                min_p: ask.min_p.or(defaults.min_p),
                repetition_penalty: ask.repetition_penalty.or(defaults.repetition_penalty),
            })
        },
        forced: vec![],
        keep_logits: false,
        logprobs: ask.logprobs,
        logit_bias: ask.logit_bias.clone(),
        constraint: None,
        allowed_token_ids: ask.allowed_token_ids.clone(),
        bad_words,
        min_tokens: ask.min_tokens,
    };
    if let Err((field, expected, found)) = options.sampling.check() {
        return Err(ApiError::param(field, format!("`{field}`: expected {expected}, found {found}")));
    }
    if ask.endpoint == Endpoint::Chat {
        options.end_turn_at(model.turn_end);
    }
    let held_back = options.eos_and_stop_ids();
    if ask.min_tokens > 0
        && !ask.allowed_token_ids.is_empty()
        && ask.allowed_token_ids.iter().all(|id| held_back.contains(id))
    {
        let message = "`allowed_token_ids`: every allowed token ends the reply, which `min_tokens` forbids";
        return Err(ApiError::param("allowed_token_ids", message));
    }
    let banned: Vec<u32> = options.bad_words.iter().filter(|w| w.len() == 1).map(|w| w[0]).collect();
    if !ask.allowed_token_ids.is_empty() && ask.allowed_token_ids.iter().all(|id| banned.contains(id)) {
        let message = "`allowed_token_ids`: every allowed token is one of `bad_words`";
        return Err(ApiError::param("allowed_token_ids", message));
    }
    if let Some((field, grammar)) = &ask.grammar {
        let refused = |e: String| ApiError::param(field, format!("`{field}`: {e}"));
        if ask.ignore_eos || ask.min_tokens > 0 {
            let other = if ask.ignore_eos { "`ignore_eos`" } else { "`min_tokens`" };
            return Err(refused(format!(
                "structured output ends where its grammar is complete, which {other} may forbid"
            )));
        }
        let ends = options.ends();
        options.constraint = Some(model.grammars().and_then(|g| g.constraint(grammar, &ends)).map_err(refused)?);
        // The first pick, on flat logits: a grammar that the allowed ids or bad words leave no token
        // to start with is the request's fault, a 400, not a failure after the reply began.
        let flat = vec![0.0; shape.vocab];
        Sampler::new(&options, &[]).pick(&flat).map_err(|e| refused(e.to_string()))?;
    }
    Ok(options)
}

/// The sequence `ask` asks for from `prompt`, generated by `options`: the prompt tokenized (and
/// truncated, when asked), checked against the context, and the reply's length set in what is left.
fn sequence(
    model: &ModelInfo,
    ask: &Ask,
    prompt: &PromptSpec,
    mut options: GenerateOptions,
) -> Result<SequenceRequest, ApiError> {
    let shape = &model.shape;
    let mut prompt = prompt_ids(model, prompt)?;
    if let Some(keep) = ask.truncate_prompt_tokens {
        let keep = match keep {
            -1 => shape.context - 1,
            k if k >= 1 && k as usize <= shape.context => k as usize,
            k => {
                let message = format!("`truncate_prompt_tokens`: expected -1 or 1 to {}, found {k}", shape.context);
                return Err(ApiError::param("truncate_prompt_tokens", message));
            }
        };
        // The last tokens, as vLLM keeps them.
        prompt.drain(..prompt.len().saturating_sub(keep));
    }
    let param = if ask.endpoint == Endpoint::Chat { "messages" } else { "prompt" };
    shape.check_prompt(&prompt, 1).map_err(|problem| {
        let error = ApiError::param(param, problem.to_string());
        match problem {
            PromptProblem::TooLong { .. } => error.with_code("context_length_exceeded"),
            _ => error,
        }
    })?;
    let context = shape.context;
    let room = context - prompt.len();
    options.max_new_tokens = match ask.max_tokens {
        Some((field, n)) if n > room => {
            let message = format!(
                "the prompt ({} tokens) and {field} ({n}) exceed this model's context of {context} positions",
                prompt.len()
            );
            return Err(ApiError::param(field, message).with_code("context_length_exceeded"));
        }
        Some((_, n)) => n,
        // As OpenAI: a chat reply may fill the context, a completion is 16 tokens.
        None if ask.endpoint == Endpoint::Chat => room,
        None => 16.min(room),
    };
    if ask.min_tokens > options.max_new_tokens {
        let message =
            format!("`min_tokens` ({}) exceeds the reply's most tokens ({})", ask.min_tokens, options.max_new_tokens);
        return Err(ApiError::param("min_tokens", message));
    }
    Ok(SequenceRequest { prompt, options })
}

/// The sequences of a request's choices: each prompt's `n` in turn (choice `p·n + i` is prompt
/// `p`'s `i`-th, as vLLM numbers them), choice `i` sampling with the seed `i` after the request's
/// (vLLM's parallel sampling), each with a grammar state of its own.
pub fn choices(prompts: Vec<SequenceRequest>, n: usize) -> Vec<SequenceRequest> {
    let mut all = Vec::with_capacity(prompts.len() * n);
    for first in prompts {
        let seed = first.options.sampling.seed;
        let copies: Vec<SequenceRequest> = (1..n as u64)
            .map(|i| {
                let mut copy = first.clone();
                copy.options.sampling.seed = seed.wrapping_add(i);
                copy
            })
            .collect();
        all.push(first);
        all.extend(copies);
    }
    all
}

/// vLLM's `bad_words` as token sequences: each word's tokens, and, where a space before it spells it
/// with as many other tokens (Gemma's `▁word`), those too: a word at the start of the text and one
/// in the middle of it.
fn bad_words(tokenizer: &TextTokenizer, words: &[String]) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut sequences = vec![];
    for (i, word) in words.iter().enumerate() {
        let encode = |text: &str| {
            tokenizer
                .encode_continuation(text)
                .map_err(|e| ApiError::param("bad_words", format!("`bad_words[{i}]`: {e}")))
        };
        let word = word.trim_start();
        if word.is_empty() {
            return Err(ApiError::param("bad_words", format!("`bad_words[{i}]` is empty")));
        }
        let alone = encode(word)?;
        let spaced = encode(&format!(" {word}"))?;
        if spaced.len() == alone.len() && spaced.first() != alone.first() {
            sequences.push(spaced);
        }
        sequences.push(alone);
    }
    Ok(sequences)
}

/// The sampling parameters `chosen` sets, OpenAI's defaults where it says nothing.
fn sampling_params(chosen: &SamplingDefaults) -> SamplingParams {
    SamplingParams {
        temperature: chosen.temperature.unwrap_or(1.0),
        top_k: chosen.top_k.unwrap_or(0),
        top_p: chosen.top_p.unwrap_or(1.0),
        min_p: chosen.min_p.unwrap_or(0.0),
        repetition_penalty: chosen.repetition_penalty.unwrap_or(1.0),
        ..SamplingParams::default()
    }
}

/// Checks the model's sampling defaults (`generation_config.json`'s) by the rule requests are checked
/// by, before the server takes one: `field: expected …, found …` for the first out of its range.
pub fn check_sampling_defaults(defaults: &SamplingDefaults) -> Result<(), String> {
    sampling_params(defaults)
        .check()
        .map_err(|(field, expected, found)| format!("`{field}`: expected {expected}, found {found}"))
}

/// The token ids of `prompt`: chat messages rendered by the model's template, text with BOS first.
pub fn prompt_ids(model: &ModelInfo, prompt: &PromptSpec) -> Result<Vec<u32>, ApiError> {
    let tokenizer = model.tokenizer.as_deref();
    Ok(match prompt {
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
    })
}

#[cfg(test)]
mod tests {
    use super::prepare;
    use crate::api::Endpoint;
    use crate::ModelInfo;
    use g4c_frontend::{synth, ChatTemplate, TextTokenizer};
    use g4c_runtime::{ModelShape, SequenceRequest};
    use std::sync::Arc;

    fn tiny() -> ModelInfo {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), synth::tokenizer_json(512).to_string()).unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), synth::CHAT_TEMPLATE).unwrap();
        let tokenizer = TextTokenizer::open(dir.path(), Some(2), Some(1)).unwrap().unwrap();
        let chat_template = ChatTemplate::open(dir.path(), &tokenizer).unwrap();
        let prefills = vec![(16, "prefill".into())];
        ModelInfo {
            name: "tiny".into(),
            turn_end: tokenizer.token_id("<turn|>"),
            tokenizer: Some(Arc::new(tokenizer)),
            chat_template,
            eos_ids: vec![1],
            shape: ModelShape {
                batch: 1,
                prefills,
                decode: "decode".into(),
                vocab: 512,
                context: 32,
                sliding_slots: None,
            },
            sampling_defaults: Default::default(),
            grammars: Default::default(),
        }
    }

    /// The sequence of a request with one prompt.
    fn one(prepared: Result<(crate::api::Ask, Vec<SequenceRequest>), crate::error::ApiError>) -> SequenceRequest {
        let mut requests = prepared.unwrap().1;
        assert_eq!(requests.len(), 1);
        requests.remove(0)
    }

    fn body(value: serde_json::Value) -> Vec<u8> {
        value.to_string().into_bytes()
    }

    #[test]
    fn chat_replies_end_at_the_turn_terminator_and_special_stop_strings_become_ids() {
        let model = tiny();
        let turn_end = model.turn_end.unwrap();
        let chat = body(serde_json::json!({"messages": [{"role": "user", "content": "ba"}]}));
        let request = one(prepare(&model, Endpoint::Chat, &chat));
        assert_eq!(request.options.stop_ids, [turn_end]);
        assert_eq!(request.options.max_new_tokens, 32 - request.prompt.len(), "a chat reply may fill the context");
        let past_eos = body(serde_json::json!({"messages": [{"role": "user", "content": "ba"}], "ignore_eos": true}));
        let request = one(prepare(&model, Endpoint::Chat, &past_eos));
        assert!(request.options.stop_ids.is_empty() && request.options.ignore_eos, "ignore_eos passes the turn's end");
        let completion = body(serde_json::json!({"prompt": "ba", "stop": ["<turn|>", "de"]}));
        let request = one(prepare(&model, Endpoint::Completion, &completion));
        assert_eq!(request.options.stop_ids, [turn_end], "`de` is text, `<turn|>` a special token");
        assert_eq!(request.options.max_new_tokens, 16, "OpenAI's default for completions");
    }

    /// A completion's prompts each sample with their own seed (the request's, or a random one each),
    /// and each prompt's choice `i` with that seed plus `i`.
    #[test]
    fn each_prompt_and_choice_samples_with_its_own_seed() {
        let model = tiny();
        let seeds = |request: serde_json::Value| {
            let (ask, requests) = prepare(&model, Endpoint::Completion, &body(request)).unwrap();
            let seeds: Vec<u64> = super::choices(requests, ask.n).iter().map(|r| r.options.sampling.seed).collect();
            seeds
        };
        let seeded = seeds(serde_json::json!({"prompt": ["ba", "de"], "n": 2, "seed": 7}));
        assert_eq!(seeded, [7, 8, 7, 8], "as two requests of their own with seed 7");
        let unseeded = seeds(serde_json::json!({"prompt": ["ba", "ba"], "n": 2}));
        assert_eq!((unseeded[1], unseeded[3]), (unseeded[0] + 1, unseeded[2] + 1));
        assert_ne!(unseeded[0], unseeded[2], "without a seed, prompts sample apart");
    }

    /// What a request leaves out takes the model's defaults (`generation_config.json`), else
    /// OpenAI's; what it sets stays.
    #[test]
    fn sampling_left_out_takes_the_models_defaults() {
        let mut model = tiny();
        let ask = |model: &ModelInfo, extra: serde_json::Value| {
            let mut value = serde_json::json!({"prompt": "ba"});
            value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            one(prepare(model, Endpoint::Completion, &body(value))).options.sampling
        };
        let plain = ask(&model, serde_json::json!({}));
        assert_eq!(
            (plain.temperature, plain.top_k, plain.top_p, plain.min_p, plain.repetition_penalty),
            (1.0, 0, 1.0, 0.0, 1.0)
        );
        model.sampling_defaults = g4c_frontend::SamplingDefaults {
            temperature: Some(0.7),
            top_k: Some(64),
            top_p: Some(0.95),
            min_p: Some(0.01),
            repetition_penalty: Some(1.1),
        };
        let s = ask(&model, serde_json::json!({}));
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty), (0.7, 64, 0.95, 0.01, 1.1));
        let set = serde_json::json!({"temperature": 0, "top_k": -1, "top_p": 1, "min_p": 0, "repetition_penalty": 1});
        let s = ask(&model, set);
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty), (0.0, 0, 1.0, 0.0, 1.0));
    }

    /// Sampling parameters out of their ranges (those `run` has too) are `400`s naming the field.
    #[test]
    fn sampling_out_of_range_is_a_400_naming_the_field() {
        let model = tiny();
        for (field, value) in [
            ("top_p", serde_json::json!(0)),
            ("min_p", serde_json::json!(1.5)),
            ("repetition_penalty", serde_json::json!(0)),
            ("repetition_penalty", serde_json::json!(-1.0)),
            ("frequency_penalty", serde_json::json!(2.5)),
            ("presence_penalty", serde_json::json!(-3)),
        ] {
            let mut request = serde_json::json!({"prompt": "ba"});
            request[field] = value.clone();
            let e = prepare(&model, Endpoint::Completion, &body(request)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)), "{field}: {value}");
            assert!(e.message.contains("expected a number"), "{field}: {}", e.message);
        }
    }

    #[test]
    fn prompts_that_do_not_fit_are_400s_naming_the_field() {
        let model = tiny();
        let long = body(serde_json::json!({"prompt": vec![2; 32]}));
        let e = prepare(&model, Endpoint::Completion, &long).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref(), e.code),
            (400, Some("prompt"), Some("context_length_exceeded"))
        );
        let room = body(serde_json::json!({"prompt": [2, 3], "max_tokens": 31}));
        let e = prepare(&model, Endpoint::Completion, &room).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        let room = body(serde_json::json!({"prompt": [2, 3], "max_completion_tokens": 31}));
        let e = prepare(&model, Endpoint::Completion, &room).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"), "{}", e.message);
        assert!(e.message.contains("max_completion_tokens (31)"), "{}", e.message);
        let outside = body(serde_json::json!({"prompt": [2, 512]}));
        assert!(prepare(&model, Endpoint::Completion, &outside)
            .unwrap_err()
            .message
            .contains("outside the vocabulary"));
    }

    /// vLLM's `truncate_prompt_tokens` keeps the prompt's last tokens (-1: all the context holds with
    /// room for one more); what it cannot be is a `400`.
    #[test]
    fn truncated_prompts_keep_their_last_tokens() {
        let model = tiny();
        let ids: Vec<u32> = (100..140).collect();
        let prompt = |truncate: serde_json::Value| {
            let request = body(serde_json::json!({"prompt": ids, "truncate_prompt_tokens": truncate}));
            prepare(&model, Endpoint::Completion, &request).map(|(_, mut r)| r.remove(0).prompt)
        };
        assert_eq!(prompt(serde_json::json!(3)).unwrap(), [137, 138, 139]);
        assert_eq!(prompt(serde_json::json!(-1)).unwrap(), ids[9..], "31 of a context of 32");
        for bad in [0, -2, 33] {
            let e = prompt(serde_json::json!(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("truncate_prompt_tokens"), "{bad}: {}", e.message);
        }
    }

    /// vLLM's `bad_words` reach the engine as token sequences (what they do: the penalties' tests and
    /// tests/penalties.rs).
    #[test]
    fn bad_words_are_tokenized() {
        let model = tiny();
        let t = model.tokenizer.as_deref().unwrap();
        let id = |w: &str| t.token_id(w).unwrap();
        let request = body(serde_json::json!({"prompt": "ba", "bad_words": ["ba de", " fo"]}));
        let request = one(prepare(&model, Endpoint::Completion, &request));
        // This word-level tokenizer spells a word the same after a space: one sequence each.
        assert_eq!(request.options.bad_words, [vec![id("ba"), id("de")], vec![id("fo")]]);
        let every = body(serde_json::json!({"prompt": "ba", "bad_words": ["de"], "allowed_token_ids": [id("de")]}));
        let e = prepare(&model, Endpoint::Completion, &every).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("allowed_token_ids"), "{}", e.message);
        for words in [serde_json::json!([" "]), serde_json::json!(["qqq"])] {
            let request = body(serde_json::json!({"prompt": "ba", "bad_words": words}));
            let e = prepare(&model, Endpoint::Completion, &request).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("bad_words"), "{words}: {}", e.message);
            assert!(e.message.contains("`bad_words[0]`"), "{}", e.message);
        }
    }

    /// vLLM's `allowed_token_ids` and `min_tokens` reach the engine (what they do: tests/penalties.rs),
    /// checked against the vocabulary and `max_tokens`; `min_tokens` would keep a grammar from ending.
    #[test]
    fn allowed_ids_and_min_tokens_are_checked_and_passed_on() {
        let model = tiny();
        let request = body(serde_json::json!({"prompt": "ba", "allowed_token_ids": [5, 9], "min_tokens": 3}));
        let request = one(prepare(&model, Endpoint::Completion, &request));
        assert_eq!((request.options.allowed_token_ids, request.options.min_tokens), (vec![5, 9], 3));
        for (request, param) in [
            (serde_json::json!({"prompt": "ba", "allowed_token_ids": [5, 512]}), "allowed_token_ids"),
            (serde_json::json!({"prompt": "ba", "allowed_token_ids": []}), "allowed_token_ids"),
            (serde_json::json!({"prompt": "ba", "min_tokens": 20, "max_tokens": 10}), "min_tokens"),
            (serde_json::json!({"prompt": "ba", "min_tokens": 20}), "min_tokens"),
            (serde_json::json!({"prompt": "ba", "min_tokens": 1, "allowed_token_ids": [1]}), "allowed_token_ids"),
            (serde_json::json!({"prompt": "ba", "min_tokens": -1}), "min_tokens"),
            (serde_json::json!({"prompt": "ba", "min_tokens": 2, "guided_regex": "a+"}), "guided_regex"),
        ] {
            let e = prepare(&model, Endpoint::Completion, &body(request.clone())).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{request}: {}", e.message);
        }
    }
}
