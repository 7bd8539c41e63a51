//! The `g4c` command line: the stable `run` contract (`--json`, `--logits-out`, `--ignore-eos`),
//! `ir`, `synth`, and one-line errors for bad invocations.

use crate::common::{assert_one_line_error, g4c, golden_cases, golden_dir, run_case};

#[test]
fn run_json_and_logits_out_match_goldens() {
    for (model, backend) in [("tiny", "interp"), ("gqa", "interp"), ("tiny", "pjrt"), ("gqa", "pjrt")] {
        let case = golden_cases(model).into_iter().find(|c| c.name == "long").unwrap();
        let dir = golden_dir(model).join("published");
        let (generation, json) = run_case(&g4c, &dir, &case, &["--backend", backend]);
        assert_eq!(json["backend"], backend);
        crate::common::assert_matches_golden(&format!("cli {model} {backend}"), &generation, &case);
    }
}

#[test]
fn run_stops_at_eos_unless_ignored() {
    // Greedy tiny generation from the golden "single" case; make its first generated token the EOS id
    // through generation_config.json and check that generation stops right there.
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "single").unwrap();
    let dir = crate::common::published_copy("tiny");
    let eos = case.generated_ids[2];
    std::fs::write(dir.path().join("generation_config.json"), format!("{{\"eos_token_id\": [1, {eos}]}}")).unwrap();
    let path = dir.path().to_str().unwrap();
    let out = g4c(&["run", path, "--prompt-ids", "2", "--max-new-tokens", "10", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["generated_ids"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(json["stop_reason"], "eos");
    let out = g4c(&["run", path, "--prompt-ids", "2", "--max-new-tokens", "10", "--json", "--ignore-eos"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["generated_ids"].as_array().unwrap().len(), 10);
    assert_eq!(json["stop_reason"], "max_tokens");
}

#[test]
fn run_text_prompt_streams_words() {
    let (_tmp, dir) = crate::common::synth_tiny(3);
    let out = g4c(&["run", dir.to_str().unwrap(), "--prompt", "ba de fi", "--max-new-tokens", "6", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // BOS (2) is added in front of the three words.
    assert_eq!(json["prompt_ids"].as_array().unwrap()[0], 2);
    assert_eq!(json["prompt_ids"].as_array().unwrap().len(), 4);
    // One word per generated id, special tokens (ids 0-3) skipped.
    let words = json["generated_ids"].as_array().unwrap().iter().filter(|v| v.as_u64().unwrap() > 3).count();
    assert_eq!(json["text"].as_str().unwrap().split(' ').count(), words);
    let out = g4c(&["run", dir.to_str().unwrap(), "--prompt", "ba de fi", "--max-new-tokens", "6"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim_end(), json["text"].as_str().unwrap());
}

/// `run --chat` renders the prompt as a user's message through the checkpoint's chat template:
/// Gemma 4's turns, written out by hand here, tokenize to the same prompt. A checkpoint without a
/// template is refused in one line.
#[test]
fn run_chat_renders_the_prompt_through_the_template() {
    let (_tmp, dir) = crate::common::synth_tiny(3);
    let prompt_ids = |args: &[&str]| {
        let out = g4c(&[&["run", dir.to_str().unwrap(), "--max-new-tokens", "1", "--json"], args].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["prompt_ids"].clone()
    };
    let chat = prompt_ids(&["--chat", "--prompt", "ba de fi"]);
    assert_eq!(chat, prompt_ids(&["--prompt", "<|turn>user\nba de fi<turn|>\n<|turn>model\n"]));
    assert_eq!(chat.as_array().unwrap().len(), 9, "BOS, the user's turn of 3 words, the model's header: {chat}");
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    let out = g4c(&["run", dir.to_str().unwrap(), "--chat", "--prompt", "ba de fi"]);
    crate::common::assert_one_line_error(&out, &["--chat needs a chat template", "chat_template.jinja"]);
}

#[test]
fn ir_prints_a_module_that_parses_and_verifies() {
    let dir = golden_dir("tiny").join("published");
    let out = g4c(&["ir", dir.to_str().unwrap(), "--entry", "decode", "--prefill-len", "4", "--context", "16"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let module = g4c_ir::parse_module(&text).unwrap();
    g4c_ir::verify_module(&module).unwrap();
    assert_eq!(module.functions.len(), 1);
    assert_eq!(module.functions[0].name, "decode");
}

#[test]
fn bad_invocations_get_one_line_errors() {
    let tiny = golden_dir("tiny").join("published");
    let config_file = tiny.join("config.json").to_str().unwrap().to_string();
    let tiny = tiny.to_str().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["run", tiny, "--prompt-ids", "2,512,3"], vec!["512", "vocabulary"]),
        (vec!["run", tiny, "--prompt-ids", ""], vec!["prompt is empty"]),
        (vec!["run", tiny, "--prompt-ids", "2,x"], vec!["`x`", "token id"]),
        (vec!["run", tiny, "--prompt-ids", "2,,3"], vec!["--prompt-ids", "empty entry", "`2,,3`"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--chat"], vec!["--chat", "--prompt"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--stop-ids", "9999"], vec!["--stop-ids", "9999", "vocabulary"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--min-p", "1.5"], vec!["--min-p", "[0, 1]", "1.5"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--temperature", "-1"], vec!["--temperature", ">= 0", "-1"]),
        (vec!["serve", tiny, "--prefill-len", "32", "--context", "16"], vec!["--prefill-len 32", "16"]),
        (
            vec!["run", tiny, "--prompt-ids", "2", "--logits-out", "/nonexistent/l.st"],
            vec!["--logits-out", "/nonexistent"],
        ),
        (vec!["inspect", tiny], vec!["is a checkpoint, not an artifact"]),
        (vec!["run", &config_file, "--prompt-ids", "2"], vec!["config.json", "expected a checkpoint directory"]),
        (vec!["serve", tiny, "--served-model-name", " "], vec!["--served-model-name", "empty"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--frobnicate"], vec!["--frobnicate"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--backend", "tpu"], vec!["tpu"]),
        (vec!["run", tiny, "--prompt", "hello"], vec!["tokenizer.json"]),
        (vec!["run", "/nonexistent/model", "--prompt-ids", "2"], vec!["/nonexistent/model", "config.json"]),
        (vec!["synth", "--preset", "huge", "-o", "/tmp/never"], vec!["huge", "tiny"]),
        (vec!["bench", tiny, "--backend", "plan"], vec!["'plan'", "--backend", "pjrt, cuda"]),
        (vec!["ir", tiny, "--prefill-len", "64", "--context", "16"], vec!["prefill length 64", "16"]),
        (vec!["ir", tiny, "--target", "tpu9"], vec!["unknown target `tpu9`", "tpu-v6e"]),
        (vec!["ir", tiny, "--target", "cpu", "--dump-dir", &config_file], vec!["--dump-dir", "not a directory"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--target", "tpu9"], vec!["unknown target `tpu9`"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--plugin", "/nonexistent/plugin.so"], vec!["/nonexistent/plugin.so"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--plugin", "/etc/hostname"], vec!["/etc/hostname", "cannot load"]),
        (
            vec!["run", tiny, "--prompt-ids", "2", "--backend", "interp", "--plugin", "/etc/hostname"],
            vec!["--plugin", "the backend is interp"],
        ),
        (vec!["run", tiny, "--prompt-ids", "2", "--stop-ids", ""], vec!["--stop-ids", "no token ids"]),
        (
            vec!["run", tiny, "--prompt-ids", "2", "--prefill-buckets", "256,128"],
            vec!["--prefill-buckets", "increasing"],
        ),
        (vec!["run", tiny, "--prompt-ids", "2", "--prefill-buckets", "0"], vec!["--prefill-buckets", "between 1"]),
        (vec!["run", tiny, "--prompt-ids", "2", "--prefill-buckets", "128,x"], vec!["--prefill-buckets", "`x`"]),
    ];
    for (args, needles) in cases {
        let out = g4c(&args);
        assert_one_line_error(&out, &needles);
    }
}

/// clap's own refusal of non-UTF-8 does not say which flag it was.
#[test]
fn a_prompt_that_is_not_utf8_is_refused_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let tiny = golden_dir("tiny").join("published");
    let prompt = std::ffi::OsStr::from_bytes(b"a\xff");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
        .arg("run")
        .arg(&tiny)
        .arg("--prompt")
        .arg(prompt)
        .output()
        .expect("g4c runs");
    assert_one_line_error(&out, &["--prompt", "not UTF-8"]);
}

#[test]
fn sampling_is_seeded_and_stop_ids_end_generation() {
    let tiny = golden_dir("tiny").join("published");
    let tiny = tiny.to_str().unwrap();
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["run", tiny, "--prompt-ids", "2,17", "--max-new-tokens", "12", "--json", "--ignore-eos"];
        args.extend_from_slice(extra);
        let out = g4c(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let hot = ["--temperature", "3.0", "--top-k", "50"];
    let a = run(&[&hot[..], &["--seed", "11"]].concat());
    let b = run(&[&hot[..], &["--seed", "11"]].concat());
    let c = run(&[&hot[..], &["--seed", "12"]].concat());
    assert_eq!(a["generated_ids"], b["generated_ids"], "same seed, same tokens");
    assert_ne!(a["generated_ids"], c["generated_ids"], "another seed, other tokens");
    let greedy = run(&[]);
    // min-p 1 keeps only the most likely token: greedy, however hot.
    let sharpest = run(&[&hot[..], &["--seed", "11", "--min-p", "1"]].concat());
    assert_eq!(sharpest["generated_ids"], greedy["generated_ids"], "--min-p 1 is greedy");
    let third = greedy["generated_ids"][2].as_u64().unwrap().to_string();
    let stopped = run(&["--stop-ids", &third]);
    assert_eq!(stopped["generated_ids"].as_array().unwrap().len(), 3, "{stopped}");
    assert_eq!(stopped["stop_reason"], "stop_id");
}

/// `g4c bench --project` runs nothing and prints, per CUDA target, the plan's bytes per decode step
/// and the tok/s the datasheet bandwidth allows.
#[test]
fn bench_project_prints_the_plans_roofline() {
    let dir = golden_dir("tiny-qat").join("hf");
    let out = g4c(&["bench", dir.to_str().unwrap(), "--project", "--json", "--context", "64", "--prompt-len", "16"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["projection"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["target"].as_str().unwrap()).collect::<Vec<_>>(), ["t4g", "h200"]);
    for r in rows {
        let (w, kv, act) = (
            r["weight_bytes"].as_u64().unwrap(),
            r["kv_bytes"].as_u64().unwrap(),
            r["activation_bytes"].as_u64().unwrap(),
        );
        assert_eq!(r["bytes_per_step"].as_u64().unwrap(), w + kv + act);
        let tok_s = r["bandwidth_bytes_per_s"].as_f64().unwrap() / (w + kv + act) as f64;
        assert!((r["tokens_per_s"].as_f64().unwrap() - tok_s).abs() < 1e-6 * tok_s, "{r}");
        assert!(w > 0 && kv > 0 && act > 0, "{r}");
    }
}

/// `g4c chat` keeps the conversation in the caches: the second turn's prompt (the first turn, its
/// reply, the new message) is partly found there, and its reply is what `run` generates from that
/// prompt alone.
#[test]
fn chat_answers_each_line_and_keeps_the_turns_before_in_the_caches() {
    use std::io::Write;
    let (_tmp, dir) = crate::common::synth_tiny(3);
    let dir = dir.to_str().unwrap();
    let mut chat = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
        .env("G4C_CACHE_DIR", crate::common::test_cache())
        .args(["chat", dir, "--max-new-tokens", "8", "--context", "256", "--json", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("g4c runs");
    chat.stdin.take().unwrap().write_all(b"ba de\n\nfi ba\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let turns: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(turns.len(), 2, "one reply a message; the empty line is none: {turns:?}");
    let ids =
        |v: &serde_json::Value| -> Vec<u64> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect() };
    let (first, second) = (&turns[0], &turns[1]);
    let earlier = [ids(&first["prompt_ids"]), ids(&first["generated_ids"])].concat();
    assert!(ids(&second["prompt_ids"]).starts_with(&earlier[..earlier.len() - 1]), "{second}");
    assert!(second["cached_tokens"].as_u64().unwrap() > ids(&first["prompt_ids"]).len() as u64, "{second}");
    let prompt: Vec<String> = ids(&second["prompt_ids"]).iter().map(u64::to_string).collect();
    let alone =
        g4c(&["run", dir, "--prompt-ids", &prompt.join(","), "--max-new-tokens", "8", "--context", "256", "--json"]);
    assert!(alone.status.success(), "{}", String::from_utf8_lossy(&alone.stderr));
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(second["generated_ids"], alone["generated_ids"], "the reply from the caches is the reply from scratch");

    let golden = golden_dir("tiny").join("published");
    let out = g4c(&["chat", golden.to_str().unwrap()]);
    assert_one_line_error(&out, &["chat needs", "tokenizer.json"]);
}

/// `g4c chat`'s commands: `/clear` starts a new conversation (the same message then gets the same
/// prompt as at first), `/help` lists them on stderr, `/exit` ends the conversation, and an unknown
/// `/word` is an error (piped: the conversation's).
#[test]
fn chat_commands_clear_help_and_exit() {
    use std::io::Write;
    let (_tmp, dir) = crate::common::synth_tiny(3);
    let chat = |input: &[u8]| {
        let mut chat = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
            .env("G4C_CACHE_DIR", crate::common::test_cache())
            .args(["chat", dir.to_str().unwrap(), "--max-new-tokens", "4", "--context", "256", "--json", "-q"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("g4c runs");
        chat.stdin.take().unwrap().write_all(input).unwrap();
        chat.wait_with_output().unwrap()
    };
    let out = chat(b"ba de\n/help\n/clear\nba de\n/exit\nfi ba\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("/clear  forget the conversation"), "{stderr}");
    let turns: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(turns.len(), 2, "nothing after /exit: {turns:?}");
    assert_eq!(turns[0]["prompt_ids"], turns[1]["prompt_ids"], "after /clear the message starts anew");
    assert_eq!(turns[0]["generated_ids"], turns[1]["generated_ids"]);
    let out = chat(b"/nosuch\n");
    assert_one_line_error(&out, &["message 1", "unknown command `/nosuch`", "/help"]);
}

/// A conversation that fills `g4c chat`'s context drops its oldest turns (as Ollama trims one) and
/// goes on, rather than refusing every message after.
#[test]
fn chat_drops_the_oldest_turns_when_the_context_is_full() {
    use std::io::Write;
    let (_tmp, dir) = crate::common::synth_tiny(3);
    let mut chat = std::process::Command::new(env!("CARGO_BIN_EXE_g4c"))
        .env("G4C_CACHE_DIR", crate::common::test_cache())
        .args(["chat", dir.to_str().unwrap(), "--max-new-tokens", "8", "--context", "48", "--json"])
        .args(["--system", "ba", "--prefill-len", "16"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("g4c runs");
    chat.stdin.take().unwrap().write_all("ba de fi\n".repeat(8).as_bytes()).unwrap();
    let out = chat.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let turns: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(turns.len(), 8, "every message answered: {stderr}");
    let lengths: Vec<usize> = turns.iter().map(|t| t["prompt_ids"].as_array().unwrap().len()).collect();
    assert!(lengths.iter().all(|&n| n < 48), "{lengths:?}");
    assert!(lengths.windows(2).any(|w| w[1] < w[0]), "no turn was dropped: {lengths:?}");
    assert!(stderr.contains("turns were dropped"), "{stderr}");
}
