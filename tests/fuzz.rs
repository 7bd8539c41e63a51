//! Fuzzing every parser of untrusted bytes: IR text, safetensors headers, the shard index, configs
//! (compressed-tensors' `quantization_config` among them), artifact manifests, cache entries and the
//! server's request bodies.
//!
//! Each target first runs its corpus, `tests/fuzz/<target>/` (seeds made by
//! `scripts/fuzz/make_corpus.py`, and every input that once failed), then `G4C_FUZZ_CASES` (default
//! 100) inputs made by mutating corpus inputs: bytes flipped, inserted, deleted, truncated or spliced
//! from another input, lines deleted or repeated, numbers and JSON values replaced by awkward ones
//! (0, -1, 2^32, 2^64, 1e309, NaN, "", null, [], {}). A target passes an input if it returns `Ok` or a
//! one-line error, without panicking. `make fuzz` runs 20,000 per target. A failing input is shrunk
//! by proptest and written to `tests/fuzz/<target>/crash-<hash>`: commit it with the fix, and it runs
//! in every `make test` from then on. The generator is seeded, so a run is reproducible; set
//! `G4C_FUZZ_SEED` to explore elsewhere.

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use std::path::{Path, PathBuf};

type Target = fn(&[u8]) -> Result<(), String>;

/// Parse, verify, and (once verified) print → parse → print is the identity.
fn ir_text(bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let module = g4c_ir::parse_module(text).map_err(|e| e.to_string())?;
    g4c_ir::verify_module(&module).map_err(|e| e.to_string())?;
    let printed = g4c_ir::print_module(&module);
    let again = g4c_ir::parse_module(&printed).map_err(|e| format!("BUG: printed IR does not parse: {e}"))?;
    if g4c_ir::print_module(&again) != printed {
        return Err("BUG: print → parse → print changed the text".into());
    }
    Ok(())
}

/// A single-file checkpoint: the header, then every tensor's bytes.
fn safetensors(bytes: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let ckpt = g4c_frontend::Checkpoint::open_file(&path).map_err(|e| e.to_string())?;
    let names: Vec<String> = ckpt.names().map(str::to_string).collect();
    for name in names {
        let _ = ckpt.tensor(&name);
    }
    Ok(())
}

/// `model.safetensors.index.json` over the small shard of the safetensors corpus.
fn index(bytes: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors.index.json"), bytes).unwrap();
    let shard = std::fs::read(corpus_dir("safetensors").join("seed-small.safetensors")).unwrap();
    std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), shard).unwrap();
    g4c_frontend::Checkpoint::open(dir.path()).map(drop).map_err(|e| e.to_string())
}

/// `config.json`, and the tensors it implies (whose sizes multiply the config's numbers).
fn config(bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let cfg = g4c_frontend::Gemma4Config::from_json_str(text, Path::new("config.json")).map_err(|e| e.to_string())?;
    for t in g4c_frontend::expected_tensors(&cfg) {
        g4c_util::limits::tensor_elements(&t.shape).map_err(|e| format!("BUG: a config was accepted with {e}"))?;
    }
    Ok(())
}

/// An artifact's `manifest.json`.
fn manifest(bytes: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("manifest.json"), bytes).unwrap();
    g4c_runtime::artifact::Artifact::read_manifest(dir.path()).map(drop).map_err(|e| e.to_string())
}

/// A cache entry, in full (`lookup`, `verify`) and by its header only (`cache ls`).
fn cache_entry(bytes: &[u8]) -> Result<(), String> {
    use g4c_runtime::cache::entry;
    let peeked = entry::peek_meta(bytes).map(drop).map_err(|e| e.to_string());
    entry::decode(bytes).map(drop).map_err(|e| e.to_string()).and(peeked)
}

/// A request body to `g4c serve`, as both endpoints prepare it for the tiny model: parsed, checked,
/// its messages rendered by the chat template and tokenized. Errors must be `400`s or `404`s.
fn server_request(bytes: &[u8]) -> Result<(), String> {
    use g4c_serve::api::Endpoint;
    static MODEL: std::sync::OnceLock<g4c_serve::ModelInfo> = std::sync::OnceLock::new();
    let model = MODEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), g4c_frontend::synth::tokenizer_json(512).to_string())
            .unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), g4c_frontend::synth::CHAT_TEMPLATE).unwrap();
        let tokenizer = g4c_frontend::TextTokenizer::open(dir.path(), Some(2), Some(1)).unwrap().unwrap();
        let chat_template = g4c_frontend::ChatTemplate::open(dir.path(), &tokenizer).unwrap();
        g4c_serve::ModelInfo {
            name: "tiny".into(),
            turn_end: tokenizer.token_id("<turn|>"),
            tokenizer: Some(std::sync::Arc::new(tokenizer)),
            chat_template,
            eos_ids: vec![1],
            shape: g4c_runtime::ModelShape {
                batch: 1,
                prefills: vec![(16, "prefill".into())],
                decode: "decode".into(),
                vocab: 512,
                context: 64,
                sliding_slots: Some(19),
            },
            sampling_defaults: Default::default(),
            grammars: Default::default(),
        }
    });
    let mut outcome = Ok(());
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        match g4c_serve::prepare::prepare(model, endpoint, bytes) {
            Ok((_, requests)) => {
                if let Some(r) = requests.iter().find(|r| r.prompt.len() >= 64 || r.options.max_new_tokens == 0) {
                    return Err(format!("BUG: accepted a request the engine refuses: {r:?}"));
                }
            }
            Err(e) if e.status != 400 && e.status != 404 => {
                return Err(format!("BUG: status {}: {}", e.status, e.message))
            }
            Err(e) => outcome = Err(e.message),
        }
    }
    outcome
}

fn corpus_dir(target: &str) -> PathBuf {
    crate::common::repo().join("tests/fuzz").join(target)
}

/// The corpus of `target`: its committed files, plus inputs made here for targets whose valid inputs
/// carry checksums (a mutation of a file on disk would fail only the checksum).
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir(target))
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    inputs.sort();
    if target == "cache_entry" {
        use g4c_runtime::cache::entry::{encode, EntryMeta};
        let meta = serde_json::json!({"program": "p", "environment": "e", "entry": "decode"});
        let meta = EntryMeta(meta.as_object().unwrap().clone());
        inputs.push(("encoded".into(), encode(&meta, b"an executable")));
    }
    inputs
}

/// Runs `target` on one input; a panic is a failure, and so is an error of more than one line.
fn check(target: Target, input: &[u8]) -> Result<(), String> {
    match std::panic::catch_unwind(|| target(input)) {
        Err(panic) => {
            let message =
                panic.downcast_ref::<String>().cloned().or(panic.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panicked: {}", message.unwrap_or_default()))
        }
        Ok(Err(e)) if e.starts_with("BUG") || e.contains('\n') => Err(e),
        Ok(_) => Ok(()),
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Insert { at: usize, byte: u8 },
    Delete { at: usize, len: usize },
    Truncate { at: usize },
    Splice { from: usize, at: usize, len: usize },
    DeleteLine { line: usize },
    RepeatLine { line: usize },
    Number { nth: usize, awkward: usize },
    JsonValue { nth: usize, awkward: usize },
}

const AWKWARD_NUMBERS: [&str; 10] =
    ["0", "-1", "1", "4294967296", "18446744073709551616", "1e309", "-0.0", "2.5", "65536", "999999999999"];
const AWKWARD_JSON: [&str; 10] = ["0", "-1", "4294967296", "1e300", "\"\"", "null", "[]", "{}", "true", "\"x\""];

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<prop::sample::Index>().prop_map(|i| i.index(usize::MAX));
    prop_oneof![
        (at.clone(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (at.clone(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        (at.clone(), 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        at.clone().prop_map(|at| Mutation::Truncate { at }),
        (at.clone(), at.clone(), 1usize..256).prop_map(|(from, at, len)| Mutation::Splice { from, at, len }),
        at.clone().prop_map(|line| Mutation::DeleteLine { line }),
        at.clone().prop_map(|line| Mutation::RepeatLine { line }),
        (at.clone(), 0..AWKWARD_NUMBERS.len()).prop_map(|(nth, awkward)| Mutation::Number { nth, awkward }),
        (at, 0..AWKWARD_JSON.len()).prop_map(|(nth, awkward)| Mutation::JsonValue { nth, awkward }),
    ]
}

/// `input` with `m` applied (positions taken modulo the input's length); `other` is the splice source.
fn mutate(mut input: Vec<u8>, m: &Mutation, other: &[u8]) -> Vec<u8> {
    let n = input.len();
    let pos = |at: usize, len: usize| if len == 0 { 0 } else { at % len };
    let lines = |input: &[u8]| -> Vec<Vec<u8>> { input.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect() };
    match *m {
        Mutation::Flip { at, bit } if n > 0 => input[pos(at, n)] ^= 1 << bit,
        Mutation::Insert { at, byte } => input.insert(pos(at, n + 1), byte),
        Mutation::Delete { at, len } if n > 0 => {
            let start = pos(at, n);
            input.drain(start..(start + len).min(n));
        }
        Mutation::Truncate { at } => input.truncate(pos(at, n + 1)),
        Mutation::Splice { from, at, len } if !other.is_empty() => {
            let start = pos(from, other.len());
            let piece = &other[start..(start + len).min(other.len())];
            let at = pos(at, n + 1);
            input.splice(at..at, piece.iter().copied());
        }
        Mutation::DeleteLine { line } | Mutation::RepeatLine { line } => {
            let mut all = lines(&input);
            let i = pos(line, all.len());
            match m {
                Mutation::DeleteLine { .. } => drop(all.remove(i)),
                _ => all.insert(i, all[i].clone()),
            }
            input = all.join(&b'\n');
        }
        Mutation::Number { nth, awkward } => {
            let text = String::from_utf8_lossy(&input).into_owned();
            let numbers: Vec<(usize, usize)> = number_spans(&text);
            if !numbers.is_empty() {
                let (start, end) = numbers[pos(nth, numbers.len())];
                input = format!("{}{}{}", &text[..start], AWKWARD_NUMBERS[awkward], &text[end..]).into_bytes();
            }
        }
        Mutation::JsonValue { nth, awkward } => {
            if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&input) {
                let count = json_values(&mut value, &mut |_| {});
                let target = pos(nth, count);
                let mut i = 0;
                let replacement: serde_json::Value = serde_json::from_str(AWKWARD_JSON[awkward]).unwrap();
                json_values(&mut value, &mut |v| {
                    if i == target {
                        *v = replacement.clone();
                    }
                    i += 1;
                });
                input = serde_json::to_vec_pretty(&value).unwrap();
            }
        }
        _ => {}
    }
    input
}

/// Byte ranges of the decimal numbers in `text`.
fn number_spans(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut spans = vec![];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    spans
}

/// Calls `visit` on every value of `value` below the root, depth first; returns how many.
fn json_values(value: &mut serde_json::Value, visit: &mut dyn FnMut(&mut serde_json::Value)) -> usize {
    let children: Vec<&mut serde_json::Value> = match value {
        serde_json::Value::Object(map) => map.values_mut().collect(),
        serde_json::Value::Array(list) => list.iter_mut().collect(),
        _ => vec![],
    };
    let mut count = 0;
    for child in children {
        visit(child);
        count += 1 + json_values(child, visit);
    }
    count
}

/// The corpus, then `G4C_FUZZ_CASES` mutated inputs; a failure is shrunk, written as a crash file, and fails
/// the test with its path.
fn fuzz(name: &str, target: Target) {
    let corpus = corpus(name);
    assert!(!corpus.is_empty(), "tests/fuzz/{name} has no inputs");
    for (file, input) in &corpus {
        if let Err(e) = check(target, input) {
            panic!("tests/fuzz/{name}/{file}: {e}");
        }
    }
    let mut runner = crate::common::fuzz_runner();
    let inputs = corpus.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>();
    let strategy = (0..inputs.len(), 0..inputs.len(), prop::collection::vec(mutation(), 1..6));
    let make = |(base, other, ms): &(usize, usize, Vec<Mutation>)| {
        ms.iter().fold(inputs[*base].clone(), |input, m| mutate(input, m, &inputs[*other]))
    };
    let result = runner.run(&strategy, |case| check(target, &make(&case)).map_err(TestCaseError::fail));
    if let Err(TestError::Fail(reason, case)) = result {
        let input = make(&case);
        let hash = blake3::hash(&input).to_hex();
        let path = corpus_dir(name).join(format!("crash-{}", &hash[..16]));
        std::fs::write(&path, &input).unwrap();
        panic!("{name}: {reason}; the input is in {}", path.display());
    }
}

#[test]
fn fuzz_ir_text() {
    fuzz("ir_text", ir_text);
}

#[test]
fn fuzz_safetensors() {
    fuzz("safetensors", safetensors);
}

#[test]
fn fuzz_index() {
    fuzz("index", index);
}

#[test]
fn fuzz_config() {
    fuzz("config", config);
}

#[test]
fn fuzz_manifest() {
    fuzz("manifest", manifest);
}

#[test]
fn fuzz_cache_entry() {
    fuzz("cache_entry", cache_entry);
}

#[test]
fn fuzz_server_request() {
    fuzz("server_request", server_request);
}
