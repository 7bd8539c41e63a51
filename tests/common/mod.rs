//! Shared helpers: golden fixtures, running generation through the library and through the binary.

use g4c_driver::{Feedback, Session, SessionOptions};
use g4c_frontend::Shapes;
use g4c_runtime::{generate, GenerateOptions, Generation};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden_dir(model: &str) -> PathBuf {
    repo().join("tests/goldens").join(model)
}

pub struct GoldenCase {
    pub name: String,
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// Row i: the transformers logits from which generated token i was chosen.
    pub logits: Vec<Vec<f32>>,
    /// Per step, max |Δlogit| between transformers' full forward and its cached decode.
    pub reference_spread: Vec<f32>,
    /// Per step, max |Δlogit| of transformers run in bf16 / f16 (teacher forced) from these logits.
    pub bf16_error: Vec<f32>,
    pub f16_error: Vec<f32>,
}

pub fn golden_cases(model: &str) -> Vec<GoldenCase> {
    let dir = golden_dir(model);
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("logits.safetensors")).unwrap();
    let logits = SafeTensors::deserialize(&bytes).unwrap();
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_string();
            let ids = |k: &str| c[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>();
            let floats = |k: &str| c[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let t = logits.tensor(&name).unwrap();
            let vocab = t.shape()[1];
            let values: Vec<f32> =
                t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            GoldenCase {
                prompt_ids: ids("prompt_ids"),
                generated_ids: ids("generated_ids"),
                logits: values.chunks(vocab).map(|r| r.to_vec()).collect(),
                reference_spread: floats("reference_spread"),
                bf16_error: floats("bf16_error"),
                f16_error: floats("f16_error"),
                name,
            }
        })
        .collect()
}

pub use g4c_driver::BackendKind as Backend;

/// Greedy generation, EOS ignored, logits kept. `prefill_len` defaults to the prompt length.
pub fn run_generate(
    backend: Backend,
    dir: &Path,
    prompt: &[u32],
    new_tokens: usize,
    prefill_len: Option<usize>,
) -> Generation {
    run_transformed(backend, dir, prompt, new_tokens, prefill_len, &|_| {})
}

/// `run_generate` on the module after `transform` (a pass, a pipeline).
pub fn run_transformed(
    backend: Backend,
    dir: &Path,
    prompt: &[u32],
    new_tokens: usize,
    prefill_len: Option<usize>,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    let opts =
        GenerateOptions { max_new_tokens: new_tokens, ignore_eos: true, keep_logits: true, ..Default::default() };
    generate_on(backend, None, dir, prompt, prefill_len, &opts, transform)
}

/// Greedy generation, logits kept, on a backend that runs `target`'s kernel plan (the plan on the CPU, the CUDA
/// kernels on the host) of the module after `transform`.
pub fn target_generate(
    backend: Backend,
    target: &str,
    dir: &Path,
    prompt: &[u32],
    new_tokens: usize,
    prefill_len: Option<usize>,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    let opts =
        GenerateOptions { max_new_tokens: new_tokens, ignore_eos: true, keep_logits: true, ..Default::default() };
    generate_on(backend, Some(target), dir, prompt, prefill_len, &opts, transform)
}

/// `target_generate` (or, without a target, `run_transformed`) with the full-attention caches
/// `context` slots long: long enough for `split-attention` to split them.
#[allow(clippy::too_many_arguments)]
pub fn long_context_generate(
    backend: Backend,
    target: Option<&str>,
    dir: &Path,
    prompt: &[u32],
    new_tokens: usize,
    prefill_len: Option<usize>,
    context: usize,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    let opts =
        GenerateOptions { max_new_tokens: new_tokens, ignore_eos: true, keep_logits: true, ..Default::default() };
    generate_in_context(backend, target, dir, prompt, prefill_len, Some(context), &opts, transform)
}

/// Greedy generation as `g4c run` does it: each call copies back the greedy tokens alone (no logits
/// kept); on `target`'s kernel plan where one is given.
pub fn greedy_generate(
    backend: Backend,
    target: Option<&str>,
    dir: &Path,
    prompt: &[u32],
    new_tokens: usize,
) -> Generation {
    let opts = GenerateOptions { max_new_tokens: new_tokens, ignore_eos: true, ..Default::default() };
    generate_on(backend, target, dir, prompt, None, &opts, &|_| {})
}

/// Logits along the golden's tokens (teacher forced) after `target`'s pipeline.
pub fn forced_logits(backend: Backend, dir: &Path, target: &str, case: &GoldenCase) -> Vec<Vec<f32>> {
    let target = g4c_ir::Target::by_name(target).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: case.generated_ids.len(),
        ignore_eos: true,
        forced: case.generated_ids.clone(),
        keep_logits: true,
        ..Default::default()
    };
    let pipeline = |m: &mut g4c_ir::Module| {
        g4c_passes::Pipeline::for_target(target).run_all(m).unwrap();
    };
    // A kernel plan is made for the target; the other backends run the module they are given.
    let plan_target = matches!(backend, Backend::Plan | Backend::CudaHost).then_some(target.name);
    generate_on(backend, plan_target, dir, &case.prompt_ids, None, &opts, &pipeline).logits
}

/// Opens `dir`, emits the module for the prompt (one prefill call unless `prefill_len` says
/// otherwise), applies `transform`, and generates with `opts` on `backend` (compiling, with no cache).
fn generate_on(
    backend: Backend,
    target: Option<&str>,
    dir: &Path,
    prompt: &[u32],
    prefill_len: Option<usize>,
    opts: &GenerateOptions,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    generate_in_context(backend, target, dir, prompt, prefill_len, None, opts, transform)
}

/// `generate_on` with caches of `context` slots (default: the prompt and the new tokens).
#[allow(clippy::too_many_arguments)]
fn generate_in_context(
    backend: Backend,
    target: Option<&str>,
    dir: &Path,
    prompt: &[u32],
    prefill_len: Option<usize>,
    context: Option<usize>,
    opts: &GenerateOptions,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    let options =
        SessionOptions { backend, target: target.map(str::to_string), use_cache: false, ..Default::default() };
    let session = Session::open(dir, options).unwrap_or_else(|e| panic!("{e}"));
    session_generate(&session, prompt, (prefill_len, context), opts, transform)
}

/// A session running `target`'s CUDA kernels in the host emulator, `target` given whole (a real GPU's
/// description changed, such as a t4g of one SM), for the checkpoint in `dir`.
pub fn cuda_host_session(dir: &Path, target: &'static g4c_ir::Target) -> Session {
    kernel_session(dir, Backend::CudaHost, target)
}

/// A session on `dir` whose `backend` runs `target`'s kernel plan (`Plan` or `CudaHost`), with no
/// cache.
pub fn kernel_session(dir: &Path, backend: Backend, target: &'static g4c_ir::Target) -> Session {
    let options =
        SessionOptions { backend, target: Some(target.name.to_string()), use_cache: false, ..Default::default() };
    let mut session = Session::open(dir, options).unwrap_or_else(|e| panic!("{e}"));
    session.source.target = target;
    session
}

/// `generate_in_context` on an open session.
pub fn session_generate(
    session: &Session,
    prompt: &[u32],
    (prefill_len, context): (Option<usize>, Option<usize>),
    opts: &GenerateOptions,
    transform: &dyn Fn(&mut g4c_ir::Module),
) -> Generation {
    let context = context.unwrap_or(prompt.len() + opts.max_new_tokens);
    let shapes = Shapes { batch: 1, prefill_len: prefill_len.unwrap_or(prompt.len()), context };
    let mut module = session.source.emit(&shapes).unwrap_or_else(|e| panic!("{e}"));
    transform(&mut module);
    g4c_ir::verify_module(&module).unwrap();
    let mut ready = session.executor(Arc::new(module), &Feedback::silent()).unwrap_or_else(|e| panic!("{e}"));
    generate(ready.executor.as_mut(), prompt, opts, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

pub fn interp_generate(dir: &Path, prompt: &[u32], new_tokens: usize, prefill_len: Option<usize>) -> Generation {
    run_generate(Backend::Interp, dir, prompt, new_tokens, prefill_len)
}

/// Tokens exact; logits within 1e-3 of the largest golden |logit| (gemma4.md §9), or within twice
/// the reference's own spread at that step, where transformers' two paths disagree by more.
pub fn assert_matches_golden(what: &str, got: &Generation, golden: &GoldenCase) {
    if let Some(i) = got.generated_ids.iter().zip(&golden.generated_ids).position(|(a, b)| a != b) {
        let mut row = golden.logits[i].clone();
        row.sort_by(|a, b| b.total_cmp(a));
        panic!(
            "{what}: token {i} is {} where transformers chose {} (golden top-2 margin there: {})",
            got.generated_ids[i],
            golden.generated_ids[i],
            row[0] - row[1]
        );
    }
    assert_eq!(got.generated_ids.len(), golden.generated_ids.len(), "{what}: number of tokens");
    assert_eq!(got.logits.len(), golden.logits.len(), "{what}: one logits row per generated token");
    let scale = golden.logits.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    for (i, (row, want)) in got.logits.iter().zip(&golden.logits).enumerate() {
        let tol = (1e-3 * scale).max(2.0 * golden.reference_spread[i]);
        let worst = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= tol, "{what}: step {i}: logits differ by {worst} (tolerance {tol})");
    }
}

/// Runs the `g4c` binary with an executable cache shared by this test run (never the user's).
pub fn g4c(args: &[&str]) -> Output {
    g4c_with_cache(test_cache(), args)
}

/// The tiny preset synthesized with `seed` (its tokenizer and chat template included), in a
/// temporary directory that lives as long as the returned guard.
pub fn synth_tiny(seed: u64) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    let out = g4c(&["synth", "--preset", "tiny", "--seed", &seed.to_string(), "-q", "-o", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (tmp, dir)
}

/// The executable cache this test run's `g4c` commands share.
pub fn test_cache() -> &'static Path {
    static CACHE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Runs the `g4c` binary with its executable cache in `cache`.
pub fn g4c_with_cache(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_g4c")).env("G4C_CACHE_DIR", cache).args(args).output().expect("g4c runs")
}

/// Asserts a failed run: non-zero exit, no panic, one line on stderr containing every `needle`.
pub fn assert_one_line_error(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "error is not one line: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "error does not mention {n:?}: {stderr}");
    }
}

/// A copy of golden model `model` (`tiny`, `tiny-qat`) in the published layout, in a temporary directory, for tests
/// that damage it.
pub fn published_copy(model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden_dir(model).join("published").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

pub fn ids(v: &[u32]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// Runs golden `case` through `g4c run MODEL --json --logits-out` (with `extra` flags) using
/// `runner` (`g4c`, or one with its own cache); returns the generation and the JSON it printed.
/// The run must succeed and print exactly one JSON object.
pub fn run_case(
    runner: &dyn Fn(&[&str]) -> Output,
    model: &Path,
    case: &GoldenCase,
    extra: &[&str],
) -> (Generation, serde_json::Value) {
    let tmp = tempfile::tempdir().unwrap();
    let logits_path = tmp.path().join("logits.safetensors");
    let n = case.generated_ids.len().to_string();
    let prompt = ids(&case.prompt_ids);
    let mut args = vec!["run", model.to_str().unwrap(), "--prompt-ids", &prompt, "--max-new-tokens", &n];
    args.extend(["--ignore-eos", "--json", "--logits-out", logits_path.to_str().unwrap()]);
    args.extend(extra);
    let out = runner(&args);
    assert!(out.status.success(), "g4c {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end().lines().count(), 1, "--json prints exactly one object: {stdout}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let list =
        |k: &str| -> Vec<u32> { json[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    assert_eq!(list("prompt_ids"), case.prompt_ids);

    let bytes = std::fs::read(&logits_path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.names(), vec!["logits"]);
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let vocab = case.logits[0].len();
    assert_eq!(t.shape(), &[case.generated_ids.len(), vocab]);
    let values: Vec<f32> = t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let generation = Generation {
        prompt_ids: list("prompt_ids"),
        generated_ids: list("generated_ids"),
        logits: values.chunks(vocab).map(|r| r.to_vec()).collect(),
        stop: g4c_runtime::StopReason::MaxTokens,
        timings: Default::default(),
    };
    (generation, json)
}

/// proptest's runner for the fuzz targets and property tests: `G4C_FUZZ_CASES` inputs each (default
/// 100; `make fuzz` 20,000), drawn from `G4C_FUZZ_SEED` (default 0) so that a run is repeatable and
/// another seed explores other inputs; no persistence files (failures are kept as corpus files).
pub fn fuzz_runner() -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let cases = std::env::var("G4C_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let seed = std::env::var("G4C_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0u64);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases, failure_persistence: None, ..Default::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes))
}

/// A weight store for hand-written IR: every weight is a constant from a table, by source name.
pub struct WeightTable(pub Vec<(String, g4c_runtime::Tensor)>);

impl g4c_runtime::WeightStore for WeightTable {
    fn load(&self, decl: &g4c_runtime::WeightDecl) -> g4c_runtime::Result<g4c_runtime::Tensor> {
        Ok(self.0.iter().find(|(n, _)| *n == decl.source).expect("weight in table").1.clone())
    }
}
