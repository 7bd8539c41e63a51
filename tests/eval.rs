//! `g4c eval`: perplexity and divergence from reference logits, checked against transformers'
//! logits of a 64-token sequence on the tiny model (tests/goldens/tiny/eval, made by
//! scripts/goldens/make_eval_goldens.py).

use crate::common::{assert_one_line_error, g4c, golden_dir};
use serde_json::Value;
use std::path::PathBuf;

fn eval_dir() -> PathBuf {
    golden_dir("tiny").join("eval")
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `g4c eval MODEL --ids <the golden sequence> --json` with `extra`; returns its JSON.
fn eval_json(model: &std::path::Path, extra: &[&str]) -> Value {
    let ids = eval_dir().join("ids.txt");
    let mut args = vec!["eval", path(model), "--ids", path(&ids), "--json"];
    args.extend_from_slice(extra);
    let out = g4c(&args);
    assert!(out.status.success(), "g4c {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn transformers_perplexity() -> f64 {
    let made: Value = serde_json::from_str(&std::fs::read_to_string(eval_dir().join("eval.json")).unwrap()).unwrap();
    made["perplexity"].as_f64().unwrap()
}

#[test]
fn eval_reproduces_transformers_perplexity_and_logits() {
    let model = golden_dir("tiny").join("hf");
    let reference = eval_dir().join("reference.safetensors");
    let expected = transformers_perplexity();
    // The whole sequence in one call and in chunks of 5 (so that ring caches wrap between calls),
    // on PJRT and on the interpreter.
    for extra in [&[][..], &["--chunk", "5"], &["--backend", "interp", "--chunk", "16"]] {
        let mut args = vec!["--reference", path(&reference)];
        args.extend_from_slice(extra);
        let got = eval_json(&model, &args);
        assert_eq!(got["tokens"], 64);
        let ppl = got["perplexity"].as_f64().unwrap();
        assert!((ppl / expected - 1.0).abs() < 1e-4, "{extra:?}: perplexity {ppl}, transformers {expected}");
        let r = &got["reference"];
        assert_eq!(r["top1_agreement"], 1.0, "{extra:?}: {r}");
        assert!(r["kl_max"].as_f64().unwrap() < 1e-5, "{extra:?}: {r}");
        let diffs = r["max_abs_logit_diff"].as_array().unwrap();
        assert_eq!(diffs.len(), 64);
        assert!(diffs.iter().all(|d| d.as_f64().unwrap() < 2e-2), "{extra:?}: {r}");
    }
}

#[test]
fn eval_measures_what_w4a16_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let f32_logits = tmp.path().join("f32.safetensors");
    let qat_logits = tmp.path().join("qat.safetensors");
    let tiny = golden_dir("tiny").join("hf");
    eval_json(&tiny, &["--save-logits", path(&f32_logits)]);
    // The published QAT checkpoint (compressed-tensors' quantization of the same weights) ...
    eval_json(&golden_dir("tiny-qat").join("hf"), &["--save-logits", path(&qat_logits)]);
    // ... scores as g4c's own quantization of the float checkpoint does,
    let ours = eval_json(&tiny, &["--quantize", "w4a16:g8", "--reference", path(&qat_logits)]);
    assert_eq!(ours["quantize"], "w4a16:g8");
    assert!(ours["reference"]["kl_max"].as_f64().unwrap() < 1e-9, "{}", ours["reference"]);
    // and both differ measurably from the float model.
    let drift = eval_json(&tiny, &["--quantize", "w4a16:g8", "--reference", path(&f32_logits)]);
    let kl = drift["reference"]["kl_mean"].as_f64().unwrap();
    assert!(kl > 1e-4, "4-bit weights left the logits unchanged? KL {kl}");
    assert!(drift["perplexity"] != eval_json(&tiny, &[])["perplexity"]);
}

#[test]
fn eval_rejects_bad_input_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = golden_dir("tiny").join("hf");
    let reference = eval_dir().join("reference.safetensors");
    let write = |name: &str, text: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases: Vec<(PathBuf, Vec<String>, Vec<&str>)> = vec![
        (write("vocab.txt", b"1,99999"), vec![], vec!["vocab.txt: token 1 is 99999", "vocabulary (0..512)"]),
        (write("one.txt", b"5"), vec![], vec!["1 token", "at least 2"]),
        (write("word.txt", b"1 2 x"), vec![], vec!["--ids", "`x`"]),
        (write("commas.txt", b"2,,17"), vec![], vec!["commas.txt", "entry 2 is empty"]),
        (write("trailing.txt", b"2 17,\n"), vec![], vec!["trailing.txt", "entry 3 is empty"]),
        (
            write("short.txt", b"1,2,3"),
            vec!["--reference".into(), path(&reference).into()],
            vec!["[64, 512]", "[3, vocab]"],
        ),
        (
            write("ref.txt", b"1,2,3"),
            vec!["--reference".into(), path(&write("bad.safetensors", b"\x10\0\0")).into()],
            vec!["bad.safetensors", "not a safetensors file"],
        ),
        (write("chunk.txt", b"1,2,3"), vec!["--chunk".into(), "0".into()], vec!["--chunk", "found 0"]),
    ];
    for (ids, extra, needles) in cases {
        let mut args = vec!["eval", path(&model), "--ids", path(&ids)];
        args.extend(extra.iter().map(String::as_str));
        assert_one_line_error(&g4c(&args), &needles);
    }
    assert_one_line_error(&g4c(&["eval", path(&model), "--text", path(&reference)]), &["tokenizer.json", "--ids"]);

    // Reference logits with a NaN read as perfect agreement (KL 0): refused, naming the element.
    let ids = write("nan.txt", b"1,2,3");
    let saved = tmp.path().join("saved.safetensors");
    let out = g4c(&["eval", path(&model), "--ids", path(&ids), "--save-logits", path(&saved)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut bytes = std::fs::read(&saved).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let at = header + (512 + 7) * 4; // row 1, column 7 of `logits`, the first tensor of the data
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&saved, &bytes).unwrap();
    let out = g4c(&["eval", path(&model), "--ids", path(&ids), "--reference", path(&saved)]);
    assert_one_line_error(&out, &["saved.safetensors", "`logits` [1, 7]", "NaN", "finite"]);
}

#[test]
fn eval_text_scores_what_the_tokenizer_makes_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(g4c(&["synth", "--preset", "tiny", "-q", "-o", path(&model)]).status.success());
    let text = "ba de fi ko la mu ne po";
    let json = |args: &[&str]| -> Value {
        let out = g4c(args);
        assert!(out.status.success(), "g4c {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    let prompt = json(&["run", path(&model), "--prompt", text, "--max-new-tokens", "1", "--json"]);
    let ids: Vec<String> = prompt["prompt_ids"].as_array().unwrap().iter().map(|i| i.to_string()).collect();
    // The ids read off the vocabulary itself (synth's tokenizer is word-level, split on whitespace),
    // independently of the tokenizer g4c runs; BOS first.
    let tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = &tokenizer["model"]["vocab"];
    let expected: Vec<String> = std::iter::once(&vocab["<bos>"])
        .chain(text.split_whitespace().map(|w| &vocab[w]))
        .map(|i| i.to_string())
        .collect();
    assert_eq!(ids, expected, "the prompt's ids are the vocabulary's");
    let (text_file, ids_file) = (tmp.path().join("text.txt"), tmp.path().join("ids.txt"));
    std::fs::write(&text_file, text).unwrap();
    std::fs::write(&ids_file, ids.join(" ")).unwrap();
    let by_text = json(&["eval", path(&model), "--text", path(&text_file), "--json"]);
    let by_ids = json(&["eval", path(&model), "--ids", path(&ids_file), "--chunk", "3", "--json"]);
    assert_eq!(by_text["tokens"], ids.len());
    let (a, b) = (by_text["perplexity"].as_f64().unwrap(), by_ids["perplexity"].as_f64().unwrap());
    assert!((a / b - 1.0).abs() < 1e-4, "--text {a}, --ids {b}");
}

/// `score` refuses a sequence longer than its module's context, whose full-attention slots would
/// wrap and overwrite its first positions (the CLI sizes the module to the sequence; a library
/// caller may not).
#[test]
fn scoring_past_the_modules_context_is_refused() {
    use g4c_driver::{Feedback, Session, SessionOptions};
    let options = SessionOptions { backend: crate::common::Backend::Interp, use_cache: false, ..Default::default() };
    let session = Session::open(&golden_dir("tiny").join("published"), options).unwrap();
    let module = session.source.scoring_module(4, 8).unwrap();
    let mut executor = session.executor(module, &Feedback::silent()).unwrap().executor;
    let ids: Vec<u32> = (0..16).map(|i| 2 + i * 7).collect();
    let error = g4c_runtime::eval::score(executor.as_mut(), &ids).unwrap_err().to_string();
    assert!(error.contains("16 tokens") && error.contains("context holds 8"), "{error}");
    assert_eq!(g4c_runtime::eval::score(executor.as_mut(), &ids[..8]).unwrap().len(), 8);
}
