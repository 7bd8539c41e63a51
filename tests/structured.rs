//! Structured output (`g4c_runtime::constraint`) through `g4c run`: whatever the model says, its
//! text follows the grammar. The tiny model's weights are random, so unconstrained it writes
//! anything; that its constrained text is JSON the schema accepts (read by serde_json and checked
//! field by field here, not by llguidance) or matches the regular expression (the `regex` crate)
//! shows the mask is applied. Its tokenizer is swapped for one of Gemma's kind, which can spell any
//! text (`synth::byte_tokenizer_json`). Serve's fields: `serve::structured_output_*`.

use crate::batching::{admit, drain, engine, failure};
use crate::common::{assert_one_line_error, g4c, golden_cases, synth_tiny};
use g4c_runtime::constraint::{Grammar, Grammars};
use g4c_runtime::{GenerateOptions, SequenceEvent, SequenceRequest, StopReason};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tiny model with a byte-fallback tokenizer, in a directory that lives as long as the guard.
pub fn byte_model() -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = synth_tiny(0);
    std::fs::write(dir.join("tokenizer.json"), g4c_frontend::synth::byte_tokenizer_json(512).to_string()).unwrap();
    (tmp, dir)
}

/// A schema a random model cannot satisfy by chance, whose every value is bounded (so that greedy
/// decoding ends).
pub const SCHEMA: &str = r#"{"type": "object", "properties": {
    "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 9},
    "tag": {"enum": ["x", "yz"]}
}, "required": ["ok", "n", "tag"], "additionalProperties": false}"#;

/// Whether `text` is a JSON object `SCHEMA` accepts.
pub fn follows_schema(text: &str) -> bool {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) else { return false };
    let n_ok = o.get("n").and_then(Value::as_u64).is_some_and(|n| n <= 9);
    let tag_ok = o.get("tag").is_some_and(|t| t == "x" || t == "yz");
    o.len() == 3 && o.get("ok").is_some_and(Value::is_boolean) && n_ok && tag_ok
}

/// `g4c run MODEL --json` with `extra` flags: the text and the stop reason.
fn run(model: &Path, extra: &[&str]) -> (String, String) {
    let mut args = vec!["run", model.to_str().unwrap(), "--prompt", "ba de", "--json"];
    args.extend_from_slice(extra);
    let out = g4c(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["text"].as_str().unwrap().to_string(), v["stop_reason"].as_str().unwrap().to_string())
}

#[test]
fn run_keeps_greedy_and_sampled_text_to_a_json_schema_and_ends_where_it_is_complete() {
    let (_tmp, model) = byte_model();
    let (free, _) = run(&model, &["--max-new-tokens", "40"]);
    assert!(!follows_schema(&free), "unconstrained, the random model writes no such JSON: {free:?}");
    for extra in [&[][..], &["--temperature", "1", "--seed", "3"], &["--temperature", "1", "--seed", "4"]] {
        let mut args = vec!["--json-schema", SCHEMA, "--max-new-tokens", "100"];
        args.extend_from_slice(extra);
        let (text, stop) = run(&model, &args);
        assert!(follows_schema(&text), "{extra:?}: {text:?}");
        assert!(!text.contains(['\n', '\t']) && !text.contains("  "), "written compactly: {text:?}");
        assert_eq!(stop, "eos", "{extra:?}: {text:?}");
    }
}

#[test]
fn run_keeps_text_to_a_regex() {
    let (_tmp, model) = byte_model();
    let (text, stop) = run(&model, &["--regex", "[a-c]{2}-[0-9]{3}( ok)?", "--max-new-tokens", "20"]);
    assert!(regex::Regex::new("^[a-c]{2}-[0-9]{3}( ok)?$").unwrap().is_match(&text), "{text:?}");
    assert_eq!(stop, "eos", "{text:?}");
}

#[test]
fn grammars_that_cannot_be_kept_are_one_line_errors_naming_the_flag() {
    let (_tmp, model) = byte_model();
    let m = model.to_str().unwrap();
    let out = g4c(&["run", m, "--prompt", "ba", "--json-schema", "{\"type\": 5}"]);
    assert_one_line_error(&out, &["--json-schema"]);
    let out = g4c(&["run", m, "--prompt", "ba", "--json-schema", "{not json"]);
    assert_one_line_error(&out, &["--json-schema", "expected a JSON schema as JSON"]);
    let out = g4c(&["run", m, "--prompt", "ba", "--regex", "(a"]);
    assert_one_line_error(&out, &["--regex"]);
    // The word-level tokenizer of the plain tiny preset spells no JSON.
    let (_tmp, words) = synth_tiny(0);
    let out = g4c(&["run", words.to_str().unwrap(), "--prompt", "ba", "--json-schema", "{}"]);
    assert_one_line_error(&out, &["--json-schema", "decodes as Gemma's"]);
}

/// In the batching engine `serve` runs, side by side: a constrained sequence asking for log
/// probabilities, a plain greedy golden sequence (the call reads logits for the first; this row must
/// still take transformers' tokens), and one whose grammar fails (no allowed token continues it),
/// which ends alone, its row's caches kept: a later prompt that shares them finds them.
#[test]
fn constrained_and_plain_sequences_share_the_engine_and_a_failing_grammar_ends_only_its_own() {
    let tokenizer_dir = tempfile::tempdir().unwrap();
    let json = g4c_frontend::synth::byte_tokenizer_json(512).to_string();
    std::fs::write(tokenizer_dir.path().join("tokenizer.json"), json).unwrap();
    let tokenizer = g4c_frontend::TextTokenizer::open(tokenizer_dir.path(), Some(2), Some(1)).unwrap().unwrap();
    let grammars = Grammars::of_tokenizer(&tokenizer, 512, &[1]).unwrap();
    let constrained = |prompt: &[u32], grammar: &str, allowed: Vec<u32>| {
        let mut options = GenerateOptions {
            max_new_tokens: 12,
            eos_ids: vec![1],
            logprobs: Some(2),
            allowed_token_ids: allowed,
            ..Default::default()
        };
        options.constraint = Some(grammars.constraint(&Grammar::Regex(grammar.into()), &options.ends()).unwrap());
        SequenceRequest { prompt: prompt.to_vec(), options }
    };
    let mut engine = engine(4);
    let kept = admit(&mut engine, constrained(&[2, 17, 301, 44], "[0-9]{3}-[a-c]", vec![]));
    let plain = &golden_cases("tiny")[0];
    let options = GenerateOptions { max_new_tokens: plain.generated_ids.len(), ignore_eos: true, ..Default::default() };
    let beside = admit(&mut engine, SequenceRequest { prompt: plain.prompt_ids.clone(), options });
    // Digits only (`0`–`9` are ids 276–285), where the grammar wants a `z`.
    let failing = admit(&mut engine, constrained(&[2, 5, 6, 7], "z+", (276..286).collect()));
    drain(&mut engine);

    let tokens = kept.tokens();
    let text = tokenizer.decode(&tokens).unwrap();
    assert!(regex::Regex::new("^[0-9]{3}-[a-c]$").unwrap().is_match(&text), "{text:?} {tokens:?}");
    assert_eq!(tokens.last(), Some(&1), "ends with EOS once complete");
    assert_eq!(kept.events().last(), Some(&SequenceEvent::Finished(StopReason::Eos)));
    for event in kept.events() {
        if let SequenceEvent::Token(_, logprobs) = event {
            let logprobs = logprobs.expect("asked for");
            assert!(logprobs.top.iter().all(|(_, lp)| lp.is_finite()), "from the logits before the mask");
        }
    }
    assert_eq!(beside.tokens(), plain.generated_ids, "{} beside a constrained row", plain.name);
    let failed = failure(&failing);
    assert!(failed.contains("structured output: the tokens the grammar allows here are ruled out"), "{failed}");
    let after = admit(
        &mut engine,
        SequenceRequest {
            prompt: vec![2, 5, 6, 7, 8],
            options: GenerateOptions { max_new_tokens: 1, ..Default::default() },
        },
    );
    drain(&mut engine);
    assert_eq!(after.cached_tokens(), 4, "the failed sequence's prompt is still cached");
}
