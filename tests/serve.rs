//! `g4c serve` on the tiny synthetic model (tokenizer and chat template included), driven by the
//! official `openai` Python client (scripts/setup installs it into .venv) and by raw HTTP for what a
//! client library hides: malformed bodies, 429 and Retry-After, a client leaving mid-stream,
//! SIGTERM. Every server binds 127.0.0.1 on a port the system picks and is killed when dropped;
//! every wait is bounded.

use crate::common::{golden_cases, golden_dir, repo};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The tiny preset with its tokenizer and chat template, made once per test run.
fn tiny_model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &MODEL
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let model = dir.path().join("tiny");
            let out =
                crate::common::g4c(&["synth", "--preset", "tiny", "--seed", "0", "-q", "-o", model.to_str().unwrap()]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            (dir, model)
        })
        .1
}

/// The tiny golden model (transformers' goldens say what it generates) with the tiny preset's
/// tokenizer and chat template.
fn golden_model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &MODEL
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let model = dir.path().join("tiny");
            std::fs::create_dir(&model).unwrap();
            for f in ["config.json", "model.safetensors"] {
                std::fs::copy(golden_dir("tiny").join("published").join(f), model.join(f)).unwrap();
            }
            for f in ["tokenizer.json", "chat_template.jinja"] {
                std::fs::copy(tiny_model().join(f), model.join(f)).unwrap();
            }
            (dir, model)
        })
        .1
}

pub(crate) struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// `g4c serve` on the tiny model with `extra` flags, once it says where it listens.
    fn start(extra: &[&str]) -> Server {
        Server::start_on(tiny_model(), extra)
    }

    /// `g4c serve MODEL` with `extra` flags.
    fn start_on(model: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(model, extra, &[])
    }

    /// `g4c serve MODEL` with `extra` flags and the environment variables `env`.
    pub(crate) fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let cache = crate::common::test_cache();
        let mut child = Command::new(env!("CARGO_BIN_EXE_g4c"))
            .env("G4C_CACHE_DIR", cache)
            .envs(env.iter().copied())
            .args(["serve", model.to_str().unwrap(), "--port", "0", "-q"])
            .args(if extra.contains(&"--served-model-name") { &[][..] } else { &["--served-model-name", "tiny"] })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("g4c runs");
        let log = Arc::new(Mutex::new(vec![]));
        let (lines, tx) = (log.clone(), std::sync::mpsc::channel::<u16>());
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let tx = tx.0;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(port) = line.split("http://127.0.0.1:").nth(1).and_then(|r| r.split(' ').next()) {
                    let _ = tx.send(port.parse().unwrap());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let port = match tx.1.recv_timeout(Duration::from_secs(300)) {
            Ok(port) => port,
            Err(_) => panic!("the server did not start: {:?}", log.lock().unwrap()),
        };
        Server { child, port, log }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String, String) {
        http(self.port, method, path, body)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> (u16, String, Value) {
        let (status, head, body) = self.http("POST", path, &body.to_string());
        let json = serde_json::from_str(&body).unwrap_or_else(|_| json!({"raw": body}));
        (status, head, json)
    }

    fn send(&self, method: &str, path: &str, body: &str) -> TcpStream {
        send(self.port, method, path, body)
    }

    /// The value of an unlabelled metric.
    fn metric(&self, name: &str) -> f64 {
        let (_, _, text) = self.http("GET", "/metrics", "");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).map(|v| v.trim().parse().unwrap()))
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }

    /// Waits (bounded) until `done` holds.
    fn wait_for(&self, what: &str, mut done: impl FnMut(&Server) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}; log: {:?}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Runs `scenario` of tests/serve/openai_client.py against this server.
    fn openai_client(&self, scenario: &str) -> Value {
        let python = repo().join(".venv/bin/python");
        assert!(python.exists(), "{} is missing: run scripts/setup", python.display());
        let out = Command::new(python)
            .arg(repo().join("tests/serve/openai_client.py"))
            .args([scenario, &self.base_url(), "tiny"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scenario}: {}\n{stdout}\nserver: {:?}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{scenario}: {e}: {stdout}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a request and returns the open connection, to read the response as it comes.
fn send(port: u16, method: &str, path: &str, body: &str) -> TcpStream {
    send_with_headers(port, method, path, "", body)
}

/// `send` with more header lines (each ending in `\r\n`).
fn send_with_headers(port: u16, method: &str, path: &str, headers: &str, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// One HTTP/1.1 request; returns the status, the headers (lower-case names) and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut stream = send(port, method, path, body);
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_lowercase(), body.to_string())
}

/// The data lines of a server-sent event stream.
fn sse_data(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

#[test]
fn the_openai_client_chats_and_completes_streaming_and_not() {
    let server = Server::start_on(golden_model(), &["--max-batch", "4", "--context", "64", "--prefill-len", "8"]);
    let out = server.openai_client("basic");
    assert_eq!(out["models"], json!(["tiny"]));
    let (chat, stream) = (&out["chat"], &out["chat_stream"]);
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(stream["object"], "chat.completion.chunk");
    assert_eq!(chat["role"], "assistant");
    assert_eq!(stream["role"], "assistant");
    assert!(!chat["text"].as_str().unwrap().is_empty(), "{chat}");
    assert_eq!(chat["text"], stream["text"], "greedy: streaming changes nothing");
    assert_eq!(chat["usage"]["prompt_tokens"], stream["usage"]["prompt_tokens"]);
    assert_eq!(chat["usage"]["completion_tokens"], stream["usage"]["completion_tokens"]);
    // BOS, `<|turn>` `system`, 3 words, `<turn|>`, `<|turn>` `user`, 4 words, `<turn|>`, `<|turn>` `model`.
    assert_eq!(chat["usage"]["prompt_tokens"], 16, "{chat}");

    let (completion, stream) = (&out["completion"], &out["completion_stream"]);
    assert_eq!(completion["text"], stream["text"]);
    assert_eq!(completion["ids"], stream["ids"]);
    assert_eq!(completion["finish"], "length");
    assert_eq!(completion["usage"]["completion_tokens"], 6);
    let prompt: Vec<u32> =
        completion["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(prompt[0], 2, "BOS first");
    let short = golden_cases("tiny").into_iter().find(|c| c.name == "short").unwrap();
    assert_eq!(short.prompt_ids, [2, 17, 301]);
    assert_eq!(out["completion_ids_prompt"]["ids"], json!(short.generated_ids[..6]), "transformers' tokens");

    assert_eq!(out["n129"]["status"], 400, "{}", out["n129"]);
    assert_eq!(out["n129"]["error"]["param"], "n");
    assert_eq!(out["wrong_model"]["status"], 404);
    assert_eq!(out["wrong_model"]["error"]["code"], "model_not_found");
    let log = server.log();
    assert!(log.iter().any(|l| l.contains("chat 200: prompt 16 tokens")), "one log line per request: {log:?}");
}

#[test]
fn concurrent_streams_with_their_own_sampling_parameters_match_their_runs_alone() {
    let server = Server::start(&["--max-batch", "8", "--context", "64", "--prefill-len", "8"]);
    let out = server.openai_client("concurrent");
    let (together, alone) = (out["together"].as_array().unwrap(), out["alone"].as_array().unwrap());
    for (i, (t, a)) in together.iter().zip(alone).enumerate() {
        assert_eq!(t["text"], a["text"], "stream {i}: beside seven others and alone");
        assert!(!t["text"].as_str().unwrap().is_empty(), "stream {i}: {t}");
    }
    // Streams 0, 4 and 5 ask the same prompt: greedy once, then sampled with seeds 0 and 1.
    let texts: std::collections::HashSet<&str> =
        [0, 4, 5].iter().map(|&i| together[i]["text"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 3, "sampling parameters are per request: {out}");
    let occupancy = server.metric("g4c_batch_rows");
    assert_eq!(occupancy, 8.0);
}

#[test]
fn n_choices_are_what_the_seeds_after_the_requests_sample_alone() {
    // Three choices over two rows: the third waits for one.
    let server = Server::start(&["--max-batch", "2", "--context", "64", "--prefill-len", "8", "--max-queue", "6"]);
    let out = server.openai_client("choices");
    for name in ["chat", "chat_stream", "completion", "completion_stream"] {
        let (together, alone) = (&out[name], &out[format!("{name}_alone")]);
        let choices = together["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{name}: {together}");
        for (i, c) in choices.iter().enumerate() {
            let alone = &alone[i]["choices"][0];
            assert_eq!(c["ids"], alone["ids"], "{name}: choice {i} samples with seed 7 + {i}");
            assert_eq!(c["text"], alone["text"], "{name}: choice {i}");
            assert_eq!(c["finish"], alone["finish"], "{name}: choice {i}");
            if name == "chat_stream" {
                assert_eq!(c["roles"], 1, "{name}: each choice's role once: {c}");
            }
        }
        assert_ne!(choices[0]["ids"], choices[1]["ids"], "{name}: the choices sample apart");
        let generated: usize = choices.iter().map(|c| c["ids"].as_array().unwrap().len()).sum();
        assert_eq!(together["usage"]["completion_tokens"], generated, "{name}: every choice's tokens");
        assert_eq!(together["usage"]["prompt_tokens"], alone[0]["usage"]["prompt_tokens"], "{name}: the prompt once");
    }
    let greedy = out["greedy"]["choices"].as_array().unwrap();
    assert_eq!(greedy[0]["text"], greedy[1]["text"], "greedy choices are one reply twice");
    assert!(!greedy[0]["text"].as_str().unwrap().is_empty());
    // A stop string ends its choice alone.
    let stopped = out["stop"]["choices"].as_array().unwrap();
    let finishes: Vec<&str> = stopped.iter().map(|c| c["finish"].as_str().unwrap()).collect();
    assert!(finishes.contains(&"stop") && finishes.contains(&"length"), "{finishes:?}: {}", out["stop"]);
    for c in stopped {
        let text = c["text"].as_str().unwrap();
        assert!(!text.contains('n'), "the text ends before its stop string: {c}");
    }
    // A list of prompts: choice 2p + i is prompt p's i-th, as its own request's.
    for name in ["prompts", "prompts_stream"] {
        let (together, alone) = (&out[name], out[format!("{name}_alone")].as_array().unwrap());
        let choices = together["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 6, "{name}: {together}");
        for (p, alone) in alone.iter().enumerate() {
            for i in 0..2 {
                let (c, a) = (&choices[2 * p + i], &alone["choices"][i]);
                assert_eq!(
                    (&c["ids"], &c["text"], &c["prompt_ids"]),
                    (&a["ids"], &a["text"], &a["prompt_ids"]),
                    "{name}: prompt {p}, choice {i}"
                );
            }
        }
        assert_ne!(choices[0]["prompt_ids"], choices[2]["prompt_ids"]);
        let sum = |key: &str| alone.iter().map(|a| a["usage"][key].as_u64().unwrap()).sum::<u64>();
        assert_eq!(together["usage"]["prompt_tokens"], sum("prompt_tokens"), "{name}: every prompt's tokens");
        assert_eq!(together["usage"]["completion_tokens"], sum("completion_tokens"), "{name}");
    }
    let (status, _, body) = server.post("/v1/completions", &json!({"prompt": ["ba", "de", "fi", "ko"], "n": 2}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "n");
    assert!(body["error"]["message"].as_str().unwrap().contains("--max-queue"), "{body}");
}

#[test]
fn a_shared_system_prompt_is_prefilled_once() {
    let server = Server::start(&["--max-batch", "2", "--context", "64", "--prefill-len", "16"]);
    let out = server.openai_client("shared_prefix");
    let (first, second) = (&out["first"]["usage"], &out["second"]["usage"]);
    // BOS, `<|turn>` `system`, 5 words, `<turn|>`, `<|turn>` `user`: 11 tokens shared.
    assert_eq!(first["prompt_tokens_details"]["cached_tokens"], 0, "{out}");
    assert_eq!(second["prompt_tokens_details"]["cached_tokens"], 11, "{out}");
    assert_eq!(server.metric("g4c_cached_prompt_tokens_total"), 11.0);
}

#[test]
fn malformed_and_impossible_requests_get_openai_style_errors() {
    let server = Server::start(&["--max-batch", "1", "--context", "32", "--prefill-len", "8"]);
    let error = |status: u16, body: &Value, param: Option<&str>, needle: &str| {
        let (got, _, reply) = server.post("/v1/chat/completions", body);
        assert_eq!(got, status, "{body}: {reply}");
        let e = &reply["error"];
        assert!(e["message"].as_str().unwrap().contains(needle), "{body}: {reply}");
        assert!(e["type"].is_string(), "{reply}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{reply}");
        }
    };
    let user = |content: &str| json!([{"role": "user", "content": content}]);
    error(400, &json!({"messages": user("ba"), "temperature": -1}), Some("temperature"), "expected 0 to 2");
    error(
        400,
        &json!({"messages": user("ba"), "max_tokens": "many"}),
        Some("max_tokens"),
        "`max_tokens`: invalid type",
    );
    error(400, &json!({"messages": user("ba"), "logprobs": 2}), Some("logprobs"), "expected true or false");
    error(
        400,
        &json!({"messages": user("ba"), "presence_penalty": 2.5}),
        Some("presence_penalty"),
        "expected a number from -2 to 2",
    );
    error(400, &json!({"messages": user("ba"), "repeat_penalty": 1.1}), Some("repeat_penalty"), "not supported");
    error(400, &json!({"messages": user("ba xyzzy")}), Some("messages"), "not in the vocabulary");
    let long = vec!["ba"; 40].join(" ");
    error(
        400,
        &json!({"messages": user(&long)}),
        Some("messages"),
        "no room to generate in the context of 32 positions",
    );
    error(400, &json!({"messages": user("ba"), "max_tokens": 30}), Some("max_tokens"), "exceed");
    error(404, &json!({"model": "gpt-4", "messages": user("ba")}), None, "serves `tiny`");
    let (status, _, body) = server.http("POST", "/v1/completions", "{\"prompt\": ");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not JSON"), "{body}");
    let (status, _, body) = server.post("/v1/completions", &json!({"prompt": [2, 9999]}));
    assert_eq!(status, 400, "{body}");
    // Reasons in JSON's words, not Rust's.
    error(400, &json!({"messages": [{"role": "user", "content": 5}]}), Some("messages"), "a list of content parts");
    error(400, &json!({"messages": user("ba"), "max_tokens": -5}), Some("max_tokens"), "a non-negative integer");
    error(400, &json!({"messages": user("ba"), "temperature": 1e308}), Some("temperature"), "found 1e308");
    // What the server cannot read, or an endpoint asked the wrong way, answers in the same format.
    let (got, _, reply) = server.http("GET", "/v1/chat/completions", "");
    assert_eq!(got, 405, "{reply}");
    let reply: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}"));
    assert!(reply["error"]["message"].is_string(), "{reply}");
    // A body over the limit: the server reads up to the limit, so the rest (1 KiB) fits in the
    // socket's buffers and the request is sent whole.
    let body = format!("{{\"prompt\": \"{}\"}}", "b".repeat((64 << 20) + 1024));
    let (got, _, reply) = server.http("POST", "/v1/completions", &body);
    assert_eq!(got, 413, "{reply}");
    assert!(reply.contains("larger than this server reads (64 MiB)"), "{reply}");
    let (_, _, metrics) = server.http("GET", "/metrics", "");
    assert!(metrics.contains("g4c_requests_total{endpoint=\"completion\",status=\"413\"} 1"), "counted: {metrics}");
    // Unknown fields are ignored, as OpenAI does.
    let (status, _, body) =
        server.post("/v1/completions", &json!({"prompt": "ba", "max_tokens": 2, "future_option": {"x": 1}}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.http("GET", "/health", "").0, 200, "errors leave the server serving");
}

#[test]
fn a_full_queue_answers_429_and_a_client_leaving_mid_stream_frees_its_row() {
    let server = Server::start(&["--max-batch", "1", "--max-queue", "2", "--context", "4096", "--prefill-len", "8"]);
    let body = |n: usize, stream: bool| {
        json!({"prompt": "ba de", "max_tokens": n, "ignore_eos": true, "temperature": 0, "stream": stream}).to_string()
    };
    let choices = |n: usize| json!({"prompt": "ba de", "max_tokens": 3, "n": n}).to_string();
    // The only row: a long stream, read until its first tokens arrive.
    let mut leaving = server.send("POST", "/v1/completions", &body(4000, true));
    let mut seen = vec![0u8; 4096];
    let mut got = 0;
    while !String::from_utf8_lossy(&seen[..got]).contains("\"text\"") {
        got += leaving.read(&mut seen[got..]).unwrap();
    }
    // The queue's one place: a request that waits for the row.
    let port = server.port;
    let waiting = std::thread::spawn(move || http(port, "POST", "/v1/completions", &body(3, false)));
    server.wait_for("the second request to queue", |s| s.metric("g4c_queue_depth") == 1.0);
    // Two choices where one place is left: refused whole, nothing of it queued.
    let (status, _, reply) = server.http("POST", "/v1/completions", &choices(2));
    assert_eq!(status, 429, "{reply}");
    assert_eq!(server.metric("g4c_queue_depth"), 1.0, "none of the refused request's sequences waits");
    let (status, _, reply) = server.http("POST", "/v1/completions", &choices(3));
    assert_eq!(status, 400, "more choices than the queue ever holds: {reply}");
    // The queue's last place.
    let also_waiting = std::thread::spawn(move || http(port, "POST", "/v1/completions", &body(3, false)));
    server.wait_for("the third request to queue", |s| s.metric("g4c_queue_depth") == 2.0);
    let (status, head, reply) = server.http("POST", "/v1/completions", &body(3, false));
    assert_eq!(status, 429, "{reply}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(reply.contains("rate_limit_exceeded"), "{reply}");

    // The first client goes away: its row is freed at the next step and the waiting request runs.
    drop(leaving);
    for waiting in [waiting, also_waiting] {
        let (status, _, reply) = waiting.join().unwrap();
        assert_eq!(status, 200, "{reply}");
    }
    server.wait_for("the first request's log line", |s| s.log().iter().any(|l| l.contains("client gone")));
    let generated = server.metric("g4c_generated_tokens_total");
    assert!(generated < 4000.0, "the stream stopped when its client left: {generated} tokens");
}

#[test]
fn sigterm_lets_a_stream_in_flight_finish_then_the_server_exits() {
    let mut server = Server::start(&["--max-batch", "2", "--context", "512", "--prefill-len", "8"]);
    let body = json!({"prompt": "ba", "max_tokens": 300, "ignore_eos": true, "temperature": 0, "stream": true});
    let mut stream = server.send("POST", "/v1/completions", &body.to_string());
    let mut first = [0u8; 64];
    let _ = stream.read(&mut first).unwrap();
    let killed = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let mut rest = String::from_utf8_lossy(&first).to_string();
    stream.read_to_string(&mut rest).unwrap();
    let data = sse_data(&rest);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "the stream finished: {rest}");
    let finish: Vec<Value> = data.iter().filter_map(|d| serde_json::from_str::<Value>(d).ok()).collect();
    assert!(finish.iter().any(|c| c["choices"][0]["finish_reason"] == "length"), "{rest}");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the server did not exit: {:?}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {:?}", server.log());
    assert!(server.log().iter().any(|l| l.contains("g4c serve: stopped")), "{:?}", server.log());
    assert!(TcpStream::connect(("127.0.0.1", server.port)).is_err(), "no new connections");
}

/// Requests still running when `--shutdown-grace` ends are told so: a stream gets an error event
/// before `[DONE]`, a request waiting for its whole reply a `503`.
#[test]
fn requests_cut_off_by_the_shutdown_grace_are_told_so() {
    let mut server = Server::start(&["--max-batch", "1", "--shutdown-grace", "0"]);
    let long = json!({"prompt": "ba", "max_tokens": 4000, "ignore_eos": true, "temperature": 0, "stream": true});
    let mut stream = server.send("POST", "/v1/completions", &long.to_string());
    // Once a token has come, the stream holds the one row (before, it may still be the one queued).
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).contains("\"text\"") {
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first token: {}", String::from_utf8_lossy(&first));
        first.extend_from_slice(&buf[..n]);
    }
    // Waits for the one row, which the stream holds.
    let whole = server.send("POST", "/v1/completions", &json!({"prompt": "ba", "max_tokens": 4}).to_string());
    server.wait_for("the second request to queue", |s| s.metric("g4c_queue_depth") >= 1.0);
    let killed = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let mut rest = String::from_utf8_lossy(&first).to_string();
    stream.read_to_string(&mut rest).unwrap();
    let data = sse_data(&rest);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{rest}");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "service_unavailable", "{rest}");
    let mut response = String::new();
    BufReader::new(whole).read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.contains("--shutdown-grace"), "{response}");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}: {:?}", server.log());
    let log = server.log();
    assert!(log.iter().filter(|l| l.contains(" 503: ") && l.ends_with("cancelled")).count() == 2, "{log:?}");
}

/// `ignore_eos` lets a chat reply go on past the end of the model's turn, as past EOS: it gets as
/// many tokens as it asked for (the tiny model ends its turn within them, greedy).
#[test]
fn ignore_eos_lets_a_chat_reply_go_past_the_end_of_its_turn() {
    let server = Server::start(&["--context", "512"]);
    let ask = |ignore_eos: bool| {
        let body = json!({"messages": [{"role": "user", "content": "ba"}], "max_tokens": 300, "temperature": 0,
                          "ignore_eos": ignore_eos, "return_token_ids": true});
        let (status, _, reply) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        reply["choices"][0].clone()
    };
    let turn_end = json!(508); // `<turn|>` in the tiny preset's tokenizer
    let ended = ask(false);
    assert_eq!(ended["finish_reason"], "stop", "{ended}");
    // vLLM's `stop_reason`: null for the model's EOS (1), the id of any other token that ended it
    // (the end of the turn included).
    let last = ended["token_ids"].as_array().unwrap().last().unwrap().clone();
    let expected = if last == json!(1) { Value::Null } else { last };
    assert_eq!(ended["stop_reason"], expected, "{ended}");
    let ids = ask(true)["token_ids"].as_array().unwrap().clone();
    assert_eq!(ids.len(), 300);
    assert!(ids.contains(&turn_end), "the reply went past the end of its turn: {ids:?}");
}

/// What clients ask besides completions: one model by its id (the `openai` client's
/// `models.retrieve`), a browser's preflight (CORS, any origin by default, or those listed), and
/// `usage` on every chunk of a stream that asked for it (null until the last), as OpenAI sends it.
#[test]
fn models_by_id_cors_and_usage_on_every_chunk() {
    let server = Server::start(&["--max-batch", "1", "--context", "32", "--prefill-len", "8"]);
    let (status, _, model) = server.http("GET", "/v1/models/tiny", "");
    let model: Value = serde_json::from_str(&model).unwrap();
    assert_eq!((status, &model["id"], &model["object"]), (200, &json!("tiny"), &json!("model")), "{model}");
    let (status, _, missing) = server.http("GET", "/v1/models/gpt-4", "");
    assert_eq!(status, 404, "{missing}");
    assert!(missing.contains("model_not_found"), "{missing}");
    // A name with a slash (`org/name`), as clients send it unescaped or escaped.
    let named = Server::start(&["--max-batch", "1", "--context", "32", "--served-model-name", "google/tiny"]);
    for path in ["/v1/models/google/tiny", "/v1/models/google%2Ftiny"] {
        let (status, _, model) = named.http("GET", path, "");
        assert_eq!(status, 200, "{path}: {model}");
        assert!(model.contains("\"id\":\"google/tiny\""), "{path}: {model}");
    }
    let (status, _, missing) = named.http("GET", "/v1/models/google/other", "");
    assert!(status == 404 && missing.contains("model_not_found"), "{missing}");
    drop(named);
    let (status, _, unknown) = server.http("GET", "/v2/nothing", "");
    assert_eq!(status, 404, "{unknown}");
    assert!(unknown.contains("no such endpoint: GET /v2/nothing"), "{unknown}");

    let preflight = |port: u16, origin: &str| {
        let headers = format!(
            "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type,authorization\r\n"
        );
        let mut stream = send_with_headers(port, "OPTIONS", "/v1/chat/completions", &headers, "");
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.to_lowercase()
    };
    let any = preflight(server.port, "http://localhost:3000");
    assert!(any.starts_with("http/1.1 200") && any.contains("access-control-allow-origin: *"), "{any}");
    // `*` would not cover `Authorization`, which OpenAI's JavaScript client sends.
    assert!(any.contains("access-control-allow-headers: content-type,authorization"), "{any}");
    let listed = Server::start(&["--max-batch", "1", "--context", "32", "--allowed-origins", "http://localhost:3000"]);
    let allowed = preflight(listed.port, "http://localhost:3000");
    assert!(allowed.contains("access-control-allow-origin: http://localhost:3000"), "{allowed}");
    let other = preflight(listed.port, "http://elsewhere.example");
    assert!(!other.contains("access-control-allow-origin"), "{other}");
    drop(listed);

    let body = json!({"prompt": "ba", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, text) = server.http("POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let chunks: Vec<Value> =
        sse_data(&text).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let (last, rest) = chunks.split_last().unwrap();
    assert!(!rest.is_empty() && rest.iter().all(|c| c.get("usage") == Some(&Value::Null)), "{text}");
    assert_eq!(last["usage"]["completion_tokens"], 3, "{text}");
}

/// Log probabilities are the log-softmax of transformers' logits (the goldens): each generated
/// token's, and the most likely tokens' at its step, in a completion's lists; a streamed chat
/// reply's chunks carry one token's each, whose texts join into the reply.
#[test]
fn logprobs_are_the_log_softmax_of_transformers_logits() {
    let server = Server::start_on(golden_model(), &["--max-batch", "2", "--context", "64", "--prefill-len", "8"]);
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "short").unwrap();
    let steps = 4;
    let ask = json!({"prompt": case.prompt_ids, "max_tokens": steps, "temperature": 0, "ignore_eos": true,
                     "logprobs": 3});
    let (status, _, reply) = server.post("/v1/completions", &ask);
    assert_eq!(status, 200, "{reply}");
    let (choice, logprobs) = (&reply["choices"][0], &reply["choices"][0]["logprobs"]);
    for (step, row) in case.logits.iter().take(steps).enumerate() {
        let log_sum = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let chosen = row[case.generated_ids[step] as usize] as f64 - log_sum;
        let got = logprobs["token_logprobs"][step].as_f64().unwrap();
        assert!((got - chosen).abs() < 0.05, "step {step}: {got} against transformers' {chosen}");
        let mut want: Vec<f64> = row.iter().map(|&x| x as f64 - log_sum).collect();
        want.sort_by(|a, b| b.total_cmp(a));
        let mut top: Vec<f64> =
            logprobs["top_logprobs"][step].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
        top.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(top.len(), 3, "{logprobs}");
        for (got, want) in top.iter().zip(&want) {
            assert!((got - want).abs() < 0.05, "step {step}: the most likely tokens' {top:?} against {want:?}");
        }
    }
    let tokens: Vec<&str> = logprobs["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), choice["text"].as_str().unwrap(), "{logprobs}");

    let chat = json!({"messages": [{"role": "user", "content": "ba de"}], "max_tokens": 5, "temperature": 0,
                      "logprobs": true, "top_logprobs": 2, "stream": true});
    let (status, _, text) = server.http("POST", "/v1/chat/completions", &chat.to_string());
    assert_eq!(status, 200, "{text}");
    let (mut reply, mut tokens) = (String::new(), String::new());
    for data in sse_data(&text).iter().filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        let choice = &chunk["choices"][0];
        reply += choice["delta"]["content"].as_str().unwrap_or("");
        if let Some(content) = choice["logprobs"]["content"].as_array() {
            assert_eq!(content.len(), 1, "{chunk}");
            let (entry, top) = (&content[0], content[0]["top_logprobs"].as_array().unwrap());
            assert_eq!(top.len(), 2, "{chunk}");
            assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(), "{chunk}");
            assert!(entry["logprob"].as_f64().unwrap() <= top[0]["logprob"].as_f64().unwrap(), "{chunk}");
            tokens += entry["token"].as_str().unwrap();
        }
    }
    assert!(!reply.is_empty());
    assert!(tokens.starts_with(&reply), "the tokens' texts join into the reply ({reply:?}), then its end: {tokens:?}");
}

/// vLLM's `/tokenize` gives a prompt's ids exactly as the generation endpoints take them (a chat's
/// rendered by the template, a text's with BOS first), and `/detokenize` their text.
#[test]
fn tokenize_gives_the_ids_generation_takes_and_detokenize_their_text() {
    let server = Server::start(&["--max-batch", "1", "--context", "32", "--prefill-len", "8"]);
    let messages = json!([{"role": "system", "content": "ba"}, {"role": "user", "content": "de fi"}]);
    let ok = |path: &str, body: Value| {
        let (status, _, reply) = server.post(path, &body);
        assert_eq!(status, 200, "{path} {body}: {reply}");
        reply
    };
    let chat = ok("/v1/chat/completions", json!({"messages": messages, "max_tokens": 1, "return_token_ids": true}));
    let tokenized = ok("/tokenize", json!({"messages": messages, "return_token_strs": true}));
    assert_eq!(tokenized["tokens"], chat["prompt_token_ids"], "{tokenized} {chat}");
    assert_eq!(tokenized["count"], chat["usage"]["prompt_tokens"]);
    assert_eq!(tokenized["max_model_len"], 32);
    let strs = tokenized["token_strs"].as_array().unwrap();
    assert_eq!((strs[0].as_str(), strs.len()), (Some("<bos>"), tokenized["tokens"].as_array().unwrap().len()));

    let completion = ok("/v1/completions", json!({"prompt": "ba de", "max_tokens": 1, "return_token_ids": true}));
    let tokenized = ok("/tokenize", json!({"prompt": "ba de", "model": "tiny"}));
    // vLLM's: a completion's prompt ids are its choice's, a chat's the response's.
    assert_eq!(tokenized["tokens"], completion["choices"][0]["prompt_token_ids"], "{tokenized} {completion}");
    assert_eq!(completion["prompt_token_ids"], Value::Null);
    assert_eq!(tokenized["token_strs"], Value::Null);
    let bare = ok("/tokenize", json!({"prompt": "ba de", "add_special_tokens": false}));
    assert_eq!(bare["tokens"].as_array().unwrap()[..], tokenized["tokens"].as_array().unwrap()[1..]);
    assert_eq!(ok("/detokenize", json!({"tokens": tokenized["tokens"]}))["prompt"], "ba de");

    for (path, body, param) in [
        ("/tokenize", json!({"prompt": "ba", "messages": messages}), None),
        ("/tokenize", json!({}), None),
        ("/tokenize", json!({"prompt": "qqq"}), Some("prompt")),
        ("/tokenize", json!({"messages": messages, "add_generation_prompt": false}), Some("add_generation_prompt")),
        ("/tokenize", json!({"messages": messages, "chat_template": "{{ messages }}"}), Some("chat_template")),
        ("/tokenize", json!({"messages": messages, "continue_final_message": true}), Some("continue_final_message")),
        ("/detokenize", json!({"tokens": [2, 512]}), Some("tokens")),
        ("/detokenize", json!({"tokens": "ba"}), Some("tokens")),
    ] {
        let (status, _, reply) = server.post(path, &body);
        assert_eq!(status, 400, "{path} {body}: {reply}");
        assert_eq!(reply["error"]["param"].as_str(), param, "{path} {body}: {reply}");
    }
    let (status, _, reply) = server.post("/tokenize", &json!({"prompt": "ba", "model": "gpt-4"}));
    assert_eq!((status, &reply["error"]["code"]), (404, &json!("model_not_found")), "{reply}");
}

/// vLLM's `stop_reason`: the stop string or stop id that ended a choice, null for a length (EOS:
/// `ignore_eos_lets_a_chat_reply_go_past_the_end_of_its_turn`).
#[test]
fn stop_reason_names_the_stop_string_or_id_that_ended_a_choice() {
    let server = Server::start(&["--context", "128"]);
    let choice = |body: Value, endpoint: &str| {
        let (status, _, reply) = server.post(endpoint, &body);
        assert_eq!(status, 200, "{reply}");
        reply["choices"][0].clone()
    };
    let free = choice(json!({"prompt": "ba de", "max_tokens": 12, "temperature": 0}), "/v1/completions");
    assert_eq!((&free["finish_reason"], &free["stop_reason"]), (&json!("length"), &Value::Null), "{free}");
    // A stop string cut from the middle of that text.
    let text = free["text"].as_str().unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 4, "{text}");
    let stop = words[2];
    let body = json!({"prompt": "ba de", "max_tokens": 12, "temperature": 0, "stop": [stop]});
    let stopped = choice(body, "/v1/completions");
    assert_eq!((&stopped["finish_reason"], &stopped["stop_reason"]), (&json!("stop"), &json!(stop)), "{stopped}");
    // vLLM's `include_stop_str_in_output`: the same text, and the stop string.
    let body = json!({"prompt": "ba de", "max_tokens": 12, "temperature": 0, "stop": [stop], "include_stop_str_in_output": true});
    let kept = choice(body, "/v1/completions");
    assert_eq!(kept["text"].as_str().unwrap(), format!("{}{stop}", stopped["text"].as_str().unwrap()), "{kept}");
    // A listed stop id: a token the reply generates without it.
    let messages = json!([{"role": "user", "content": "ba"}]);
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0, "return_token_ids": true});
    let free = choice(body, "/v1/chat/completions");
    let id = free["token_ids"][5].clone();
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0, "stop_token_ids": [id]});
    let listed = choice(body, "/v1/chat/completions");
    assert_eq!((&listed["finish_reason"], &listed["stop_reason"]), (&json!("stop"), &id), "{listed}");
    // Its text is left out, as vLLM leaves it, unless `include_stop_str_in_output`.
    let text_of = |n: usize| {
        let (_, _, reply) = server.post("/detokenize", &json!({"tokens": free["token_ids"].as_array().unwrap()[..n]}));
        reply["prompt"].clone()
    };
    assert_eq!(listed["message"]["content"], text_of(5), "{listed}");
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0, "stop_token_ids": [id],
                      "include_stop_str_in_output": true});
    assert_eq!(choice(body, "/v1/chat/completions")["message"]["content"], text_of(6));
}

/// Sampling parameters a request leaves out take the model's own (`generation_config.json`), as
/// vLLM's server does: a model shipping `top_k: 1` answers an unseeded request at temperature 1
/// with the greedy tokens, and one that sets `top_k` itself samples. A default out of its range
/// stops the server before it starts; greedy (`temperature: 0`) is a default like any other.
#[test]
fn sampling_left_out_takes_the_generation_config() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let out = crate::common::g4c(&["synth", "--preset", "tiny", "--seed", "0", "-q", "-o", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(model.join("generation_config.json"), r#"{"temperature": 0, "top_p": 0}"#).unwrap();
    let out = crate::common::g4c(&["serve", model.to_str().unwrap(), "--port", "0", "--context", "64"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("generation_config.json: `top_p`: expected a number in (0, 1], found 0"), "{stderr}");
    std::fs::write(model.join("generation_config.json"), r#"{"eos_token_id": 1, "top_k": 1}"#).unwrap();
    let server = Server::start_on(&model, &["--context", "64"]);
    let tokens = |extra: Value| {
        let mut body = json!({"prompt": "ba de", "max_tokens": 16, "ignore_eos": true, "return_token_ids": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, _, reply) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{reply}");
        reply["choices"][0]["token_ids"].clone()
    };
    let greedy = tokens(json!({"temperature": 0}));
    assert_eq!(tokens(json!({})), greedy, "top_k 1 from generation_config.json");
    let sampled: Vec<Value> = (0..3).map(|seed| tokens(json!({"top_k": 0, "seed": seed}))).collect();
    assert!(sampled.iter().any(|s| *s != greedy), "the request's own top_k: {sampled:?}");
}

/// Structured output as OpenAI's, vLLM's and llama.cpp's clients ask for it: the reply follows the
/// grammar (checked by serde_json and the `regex` crate) and ends with `stop` where it is complete,
/// side by side with an unconstrained request; a grammar that does not compile is a 400 naming the
/// field that gave it.
#[test]
fn structured_output_keeps_replies_to_the_grammar_each_server_names() {
    use crate::structured::{byte_model, follows_schema, SCHEMA};
    let (_tmp, model) = byte_model();
    let server = Server::start_on(&model, &["--context", "128"]);
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    let reply = |endpoint: &str, extra: Value| {
        let mut body = match endpoint {
            "/v1/completions" => json!({"prompt": "ba de", "max_tokens": 60, "temperature": 0}),
            _ => json!({"messages": [{"role": "user", "content": "ba"}], "max_tokens": 60, "temperature": 0}),
        };
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, _, reply) = server.post(endpoint, &body);
        assert_eq!(status, 200, "{body}: {reply}");
        let choice = &reply["choices"][0];
        let text = choice["text"].as_str().or(choice["message"]["content"].as_str()).unwrap().to_string();
        (text, choice["finish_reason"].as_str().unwrap().to_string())
    };
    let json_schema = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
    for (endpoint, extra) in [
        ("/v1/chat/completions", json!({"response_format": json_schema})),
        ("/v1/completions", json!({"guided_json": schema})),
        ("/v1/completions", json!({"structured_outputs": {"json": SCHEMA}, "temperature": 1, "seed": 5})),
        ("/v1/chat/completions", json!({"json_schema": schema})),
    ] {
        let (text, finish) = reply(endpoint, extra.clone());
        assert!(follows_schema(&text) && finish == "stop", "{extra}: {text:?} ({finish})");
    }
    // Any object: the random model's keys run on past `max_tokens`, but they are keys.
    let (text, _) = reply("/v1/completions", json!({"response_format": {"type": "json_object"}}));
    assert!(text.starts_with("{\""), "{text:?}");
    let (text, finish) = reply("/v1/chat/completions", json!({"guided_choice": ["yes", "no way"]}));
    assert!((text == "yes" || text == "no way") && finish == "stop", "{text:?} ({finish})");
    let (text, _) = reply("/v1/completions", json!({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}));
    assert!(regex::Regex::new("^[0-9]{3}-[a-z]{2}$").unwrap().is_match(&text), "{text:?}");
    let (free, _) = reply("/v1/completions", json!({"max_tokens": 40}));
    assert!(!follows_schema(&free), "{free:?}");
    // Each of several choices (of two prompts) keeps to the grammar with a state of its own.
    let body = json!({"prompt": ["ba de", "fi"], "n": 2, "max_tokens": 60, "temperature": 1, "seed": 3,
                      "structured_outputs": {"json": SCHEMA}});
    let (status, _, several) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{several}");
    let texts: Vec<&str> = several["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 4);
    assert!(texts.iter().all(|t| follows_schema(t)), "{texts:?}");
    assert!(texts.windows(2).any(|w| w[0] != w[1]), "sampled apart: {texts:?}");

    for (body, param) in [
        (json!({"prompt": "ba", "guided_regex": "(a"}), "guided_regex"),
        (json!({"prompt": "ba", "guided_json": {"type": 5}}), "guided_json"),
        (json!({"prompt": "ba", "guided_choice": ["a"], "ignore_eos": true}), "guided_choice"),
        // No allowed token starts a number: refused before the reply begins.
        (json!({"prompt": "ba", "guided_regex": "[0-9]+", "allowed_token_ids": [1]}), "guided_regex"),
        (json!({"prompt": "ba", "grammar": "root ::= \"a\""}), "grammar"),
    ] {
        let (status, _, reply) = server.post("/v1/completions", &body);
        assert_eq!((status, reply["error"]["param"].as_str()), (400, Some(param)), "{body}: {reply}");
    }
}
