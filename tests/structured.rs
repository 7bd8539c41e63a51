//! Structured output (`g4c_runtime::constraint`) through `g4c run`: whatever the model says, its
//! text follows the grammar. The tiny model's weights are random, so unconstrained it writes
//! anything; that its constrained text is JSON the schema accepts (read by serde_json and checked
//! field by field here, not by llguidance) or matches the regular expression (the `regex` crate)
//! shows the mask is applied. Its tokenizer is swapped for one of Gemma's kind, which can spell any
//! text (`synth::byte_tokenizer_json`). Serve's fields: `serve::structured_output_*`.

use crate::common::{assert_one_line_error, g4c, synth_tiny};
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
