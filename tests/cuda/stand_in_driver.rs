//! The CUDA backend's GPU side without a GPU: `CudaDevice` through cudarc (modules from the cubin
//! or the PTX, buffers, queued uploads through page-locked staging, each entry point's launches
//! recorded once as a graph and replayed, programmatic dependent launch, profiling) against a
//! stand-in for the CUDA driver (`libcuda_stand_in.cpp`: the driver's rules kept, kernels run by
//! the host emulator), which a process started with it on its library path loads in place of
//! `libcuda.so`. What only a GPU can tell, the kernels' machine code and speed, waits for one.

use super::*;
use crate::common::GoldenCase;
use g4c_driver::{Session, SessionOptions};
use g4c_runtime::backend::cuda::build_for_host;
use g4c_runtime::{generate, GenerateOptions};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;

/// A stand-in CUDA driver and NVRTC: `libcuda.so`, `libnvrtc.so` and a folder for the host builds
/// of the kernels the driver runs (the NVRTC stand-in's builds of the programs it compiles in a
/// `nvrtc` folder there), in a temporary folder, and the environment that makes a process use them
/// as a GPU of `target`'s.
struct StandIn {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl StandIn {
    fn new(target: &Target) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        for library in ["cuda", "nvrtc"] {
            let source = crate::common::repo().join(format!("tests/cuda/lib{library}_stand_in.cpp"));
            let built = Command::new("c++")
                .args(["-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-o"])
                .arg(dir.path().join(format!("lib{library}.so")))
                .arg(&source)
                .arg("-ldl")
                .output()
                .unwrap();
            assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
        }
        let kernels = dir.path().join("kernels");
        let nvrtc_builds = kernels.join("nvrtc");
        std::fs::create_dir_all(&nvrtc_builds).unwrap();
        let host_build = g4c_runtime::backend::cuda::host_build_in(&nvrtc_builds).unwrap();
        let nvrtc = g4c_codegen::cuda::nvrtc_path().expect("NVRTC (scripts/setup installs it into .venv)");
        let gpu = target.gpu.as_ref().unwrap();
        let (major, minor) = gpu.compute_capability;
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let env = vec![
            ("LD_LIBRARY_PATH", path(dir.path())),
            ("G4C_STAND_IN_KERNELS", path(&kernels)),
            ("G4C_STAND_IN_CAPABILITY", format!("{major}.{minor}")),
            ("G4C_STAND_IN_SMEM_OPTIN", gpu.smem_per_block_optin.to_string()),
            ("G4C_STAND_IN_SMS", gpu.sm_count.to_string()),
            ("G4C_STAND_IN_NVRTC", path(&nvrtc)),
            ("G4C_STAND_IN_NVRTC_BUILDS", path(&nvrtc_builds)),
            ("G4C_STAND_IN_CXX", host_build.join(" ")),
        ];
        StandIn { dir, env }
    }

    /// Builds the kernels of an artifact's CUDA C files for the host, where the stand-in finds them.
    fn add_artifact(&self, artifact: &Path) {
        let kernels = self.dir.path().join("kernels").join(artifact.file_name().unwrap());
        std::fs::create_dir(&kernels).unwrap();
        for entry in std::fs::read_dir(artifact.join("cuda")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cu") {
                let name = path.file_stem().unwrap().to_str().unwrap();
                build_for_host(name, &std::fs::read_to_string(&path).unwrap(), &kernels).unwrap();
            }
        }
    }

    /// `command` with the stand-in's environment and `extra`.
    fn run(&self, mut command: Command, extra: &[(&str, &str)]) -> Output {
        command.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        command.envs(extra.iter().copied());
        command.output().unwrap()
    }

    /// GPU test `test` (its full name) on the stand-in with `G4C_REQUIRE_GPU` set, as
    /// `scripts/device-check` runs it, and `extra`: its stderr, once it passed and the stand-ins
    /// refused nothing.
    fn gpu_test(&self, test: &str, extra: &[(&str, &str)]) -> String {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", test, "--nocapture"]);
        let out = self.run(command, &[&[("G4C_REQUIRE_GPU", "1")], extra].concat());
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains("1 passed"), "{test}: {stdout}\n{stderr}");
        refused_nothing(test, &[&stdout, &stderr]);
        stderr.into_owned()
    }

    /// `g4c ARGS` on the stand-in.
    fn g4c(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_g4c"));
        command.args(args).env("G4C_CACHE_DIR", crate::common::test_cache());
        self.run(command, extra)
    }
}

/// Fails, naming `what` ran, if any of its `outputs` says that a stand-in refused a call: each
/// refusal is printed, beginning "libcuda stand-in:" or "libnvrtc stand-in:", even where g4c let it
/// pass (a release's error, say).
fn refused_nothing(what: &str, outputs: &[&str]) {
    for output in outputs {
        assert!(!output.contains(" stand-in: "), "{what}: a stand-in refused a call: {output}");
    }
}

/// The tiny model's goldens through `CudaDevice` on a stand-in h200, in f32 against transformers'
/// tokens and logits: `tiny_goldens_through_the_cuda_device` run in a process of its own that
/// loads the stand-in.
#[test]
fn the_cuda_device_on_a_stand_in_driver_matches_the_goldens() {
    let stand_in = StandIn::new(Target::by_name("h200").unwrap());
    let mut test = Command::new(std::env::current_exe().unwrap());
    let name = "cuda::stand_in_driver::tiny_goldens_through_the_cuda_device";
    test.args(["--exact", name, "--ignored", "--nocapture", "--test-threads", "1"]);
    let out = stand_in.run(test, &[("G4C_STAND_IN_TEST", "1")]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the inner test ran: {stdout}\n{stderr}");
    assert!(stderr.contains("stand-in cases passed: 3") && stderr.contains("stand-in rules kept"), "{stderr}");
}

/// Run by `the_cuda_device_on_a_stand_in_driver_matches_the_goldens` in a process that loads the
/// stand-in (skipped elsewhere): for the golden cases `short` (a 3-token prefill) and `long` (11
/// tokens, past the sliding window), their first 12 tokens: the case generated through the
/// session's `CudaDevice` (its kernels, which the session compiles, built for the host by the NVRTC
/// stand-in), its logits kept, and for `long` again copying back the greedy tokens alone, stepped
/// on a thread other than the one that made it; then `g4c serve`'s batching engine on 4 rows of the
/// device, sequences joining at different steps, each its golden's tokens; then the stand-in's own
/// rules.
#[test]
#[ignore = "run by the_cuda_device_on_a_stand_in_driver_matches_the_goldens, in a process loading the stand-in driver"]
fn tiny_goldens_through_the_cuda_device() {
    let Some(kernels) =
        std::env::var_os("G4C_STAND_IN_KERNELS").filter(|_| std::env::var_os("G4C_STAND_IN_TEST").is_some())
    else {
        eprintln!("skipped: run by the_cuda_device_on_a_stand_in_driver_matches_the_goldens");
        return;
    };
    assert_eq!(g4c_runtime::backend::cuda::cuda_device_capability(), Some((9, 0)), "the stand-in is loaded");
    let dir = golden_dir("tiny").join("hf");
    let options =
        SessionOptions { backend: Backend::Cuda, target: Some("h200".into()), use_cache: false, ..Default::default() };
    let session = Session::open(&dir, options).unwrap();
    let cases: Vec<GoldenCase> = golden_cases("tiny")
        .into_iter()
        .filter(|c| ["short", "long"].contains(&c.name.as_str()))
        .map(first_12)
        .collect();
    for case in &cases {
        let n = case.generated_ids.len();
        let shapes = Shapes { batch: 1, prefill_len: case.prompt_ids.len(), context: case.prompt_ids.len() + n };
        let module = session.source.emit(&shapes).unwrap();
        let kept = GenerateOptions { max_new_tokens: n, ignore_eos: true, keep_logits: true, ..Default::default() };
        let got = session_generate(&session, &case.prompt_ids, (None, None), &kept, &|_| {});
        assert_matches_golden(&format!("stand-in h200 {}", case.name), &got, case);
        if case.name == "long" {
            // Made on this thread and stepped on another, as `g4c serve`'s engine thread steps it.
            let mut ready = session.executor(Arc::new(module), &g4c_driver::Feedback::silent()).unwrap();
            let greedy = GenerateOptions { keep_logits: false, ..kept };
            let got = std::thread::scope(|threads| {
                let stepped =
                    threads.spawn(|| generate(ready.executor.as_mut(), &case.prompt_ids, &greedy, &mut |_| {}));
                stepped.join().unwrap().unwrap()
            });
            assert_eq!(got.generated_ids, case.generated_ids, "stand-in h200 {}, greedy tokens alone", case.name);
        }
    }
    // `g4c serve`'s engine: 4 rows through the session's `CudaDevice`, two sequences joining 5 steps
    // late (rows at different positions and ring slots), each its golden's tokens.
    let mut engine = crate::batching::session_engine(&session, 4);
    let waves: [&[&str]; 2] = [&["long", "single"], &["window", "short"]];
    let goldens = golden_cases("tiny");
    crate::batching::assert_waves_generate_their_golden_tokens(&mut engine, &goldens, &waves, "stand-in h200, batch 4");
    eprintln!("stand-in cases passed: {}", cases.len() + 1);
    the_stand_in_keeps_the_drivers_rules(std::path::Path::new(&kernels));
}

/// What the stand-in refuses, as the driver does (its last check leaves the context faulted): a
/// call on a thread where no context is current; waiting for a stream that records a graph, which
/// spoils the recording; a launch with more than 48 KiB of dynamic shared memory before its
/// function opts in to it; the host writing page-locked memory before a copy queued from it ran.
fn the_stand_in_keeps_the_drivers_rules(kernels: &Path) {
    use cudarc::driver::{result, sys, CudaContext};
    let context = CudaContext::new(0).unwrap();
    // SAFETY (this function's driver calls): each allocation is used within its size, on the
    // stand-in, and the process ends with the test.
    let elsewhere = std::thread::spawn(|| unsafe { result::malloc_sync(16) }.map(|_| ())).join().unwrap();
    let refused = |r: Result<(), result::DriverError>, code: sys::CUresult, what: &str| {
        assert_eq!(r.map_err(|e| e.0), Err(code), "{what}");
    };
    refused(elsewhere, sys::CUresult::CUDA_ERROR_INVALID_CONTEXT, "no current context");

    let stream = context.new_stream().unwrap();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    refused(stream.synchronize(), sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "waiting while recording");
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map(|_| ());
    refused(ended, sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "a spoiled recording");

    let dir = kernels.join("rules");
    std::fs::create_dir(&dir).unwrap();
    build_for_host("rules", "extern \"C\" __global__ void g4c_rules(float* out) { out[threadIdx.x] = 1.f; }\n", &dir)
        .unwrap();
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry g4c_rules(\n.param .u64 g4c_rules_param_0\n)\n{\nret;\n}\n";
    let module = context.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).unwrap();
    let function = module.load_function("g4c_rules").unwrap();
    let mut out = unsafe { result::malloc_sync(64 * 4) }.unwrap();
    let mut params = [&mut out as *mut sys::CUdeviceptr as *mut std::ffi::c_void];
    let mut launch = |smem| unsafe {
        result::launch_kernel(function.cu_function(), (1, 1, 1), (64, 1, 1), smem, stream.cu_stream(), &mut params)
    };
    refused(launch(64 * 1024), sys::CUresult::CUDA_ERROR_INVALID_VALUE, "64 KiB without opting in");
    let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    function.set_attribute(attribute, 64 * 1024).unwrap();
    launch(64 * 1024).unwrap();
    stream.synchronize().unwrap();

    let pinned = unsafe { result::malloc_host(16, 0) }.unwrap() as *mut u8;
    let staged = unsafe { std::slice::from_raw_parts_mut(pinned, 16) };
    unsafe { result::memcpy_htod_async(out, &staged[..], stream.cu_stream()) }.unwrap();
    staged[0] = 1;
    refused(
        stream.synchronize(),
        sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
        "page-locked bytes written before their copy",
    );
    eprintln!("stand-in rules kept");
}

/// A golden case's first 12 generated tokens.
fn first_12(case: GoldenCase) -> GoldenCase {
    let n = 12;
    GoldenCase {
        generated_ids: case.generated_ids[..n].to_vec(),
        logits: case.logits[..n].to_vec(),
        reference_spread: case.reference_spread[..n].to_vec(),
        bf16_error: case.bf16_error[..n].to_vec(),
        f16_error: case.f16_error[..n].to_vec(),
        ..case
    }
}

/// `model`'s golden checkpoint compiled for `target` into `dir`, with `extra` options.
fn compiled(model: &str, target: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let artifact = dir.join(format!("{model}-{target}.g4c"));
    let checkpoint = golden_dir(model).join("hf");
    let mut args = vec!["compile", checkpoint.to_str().unwrap(), "--target", target, "-o", artifact.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = crate::common::g4c(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    artifact
}

/// `g4c run` of tiny-qat's h200 artifact on a stand-in GPU generates what the interpreter
/// generates from the artifact's module (`--backend interp`), a 3-token prompt in one 4-token
/// prefill and a 6-token one in two: on an sm_90 GPU from its cubin, as it is, with programmatic
/// dependent launch and profiled launch by launch; on an sm_100 GPU from its PTX, which the driver
/// JIT-compiles (the cubin is for another GPU). `g4c serve` of it answers both prompts with the
/// same tokens, and `g4c bench` of it runs there too.
#[test]
fn an_artifact_on_a_stand_in_driver_generates_what_the_interpreter_does() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = compiled("tiny-qat", "h200", dir.path(), &["--context", "32", "--prefill-buckets", "4"]);
    let stand_in = StandIn::new(Target::by_name("h200").unwrap());
    stand_in.add_artifact(&artifact);
    let art = artifact.to_str().unwrap();
    let variants: [&[(&str, &str)]; 4] =
        [&[], &[("G4C_CUDA_PDL", "1")], &[("G4C_CUDA_PROFILE", "1")], &[("G4C_STAND_IN_CAPABILITY", "10.0")]];
    // `g4c serve` of it too, asked for ids and answered with ids.
    let env: Vec<(&str, &str)> = stand_in.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = crate::serve::Server::start_with_env(&artifact, &[], &env);
    for prompt in ["2,17,301", "2,17,301,45,99,7"] {
        let args = ["run", art, "--prompt-ids", prompt, "--max-new-tokens", "6", "--ignore-eos", "--json"];
        let interp = crate::common::g4c(&[&args[..], &["--backend", "interp"]].concat());
        assert!(interp.status.success(), "{}", String::from_utf8_lossy(&interp.stderr));
        let want: serde_json::Value = serde_json::from_slice(&interp.stdout).unwrap();
        for extra in variants {
            let out = stand_in.g4c(&args, extra);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{extra:?}: {stderr}");
            // A refusal that g4c let pass (a release's error, say) is printed all the same.
            refused_nothing(&format!("{extra:?}"), &[&stderr]);
            let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(got["backend"], "cuda", "{got}");
            assert_eq!(got["generated_ids"], want["generated_ids"], "{prompt} with {extra:?}");
            if extra.iter().any(|(k, _)| *k == "G4C_CUDA_PROFILE") {
                assert!(stderr.contains("ms of kernels in all"), "{stderr}");
            }
        }
        let ids: Vec<u32> = prompt.split(',').map(|id| id.parse().unwrap()).collect();
        let ask = serde_json::json!({
            "model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
            "return_token_ids": true,
        });
        let (status, _, reply) = server.post("/v1/completions", &ask);
        assert_eq!(status, 200, "{reply}; server: {:?}", server.log());
        assert_eq!(reply["choices"][0]["token_ids"], want["generated_ids"], "g4c serve, {prompt}");
    }
    refused_nothing("g4c serve", &[&server.log().join("\n")]);
    let bench = ["bench", art, "--prompt-len", "4", "--gen", "2", "--reps", "1", "--json"];
    let out = stand_in.g4c(&bench, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// With `G4C_STAND_IN_ARTIFACT` naming a CUDA artifact (E2B's: BENCHMARKS.md has what it found),
/// `g4c run` of it on a stand-in of its target's GPU generates what the host emulator
/// (`--backend cuda-host`) generates: 3 tokens of a 3-token prompt.
#[test]
#[ignore = "minutes over a large artifact: G4C_STAND_IN_ARTIFACT=DIR cargo test --release --test g4c -- --ignored an_artifact_named"]
fn an_artifact_named_on_a_stand_in_driver_generates_what_the_host_emulator_does() {
    let artifact =
        PathBuf::from(std::env::var_os("G4C_STAND_IN_ARTIFACT").expect("G4C_STAND_IN_ARTIFACT names an artifact"));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(artifact.join("manifest.json")).unwrap()).unwrap();
    let target = Target::by_name(manifest["target"]["name"].as_str().unwrap()).unwrap();
    let stand_in = StandIn::new(target);
    stand_in.add_artifact(&artifact);
    let args = ["run", artifact.to_str().unwrap(), "--prompt-ids", "2,17,301", "--max-new-tokens", "3"];
    let args = [&args[..], &["--ignore-eos", "--json"]].concat();
    let tokens = |out: Output| {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        refused_nothing("g4c run", &[&String::from_utf8_lossy(&out.stderr)]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["generated_ids"].clone()
    };
    let host = crate::common::g4c(&[&args[..], &["--backend", "cuda-host"]].concat());
    assert_eq!(tokens(stand_in.g4c(&args, &[])), tokens(host));
}

/// One case of the GPU tests on a stand-in h200, in the process of its own that the test runs it
/// in: every launch of the tiny model's h200 plan on random inputs through `CudaDevice` (a graph
/// recorded for each) against the interpreter. (All the cases: `the_gpu_tests_on_a_stand_in_driver`.)
#[test]
fn a_gpu_case_on_a_stand_in_driver_passes() {
    let stand_in = StandIn::new(Target::by_name("h200").unwrap());
    let case = "cuda h200, every kernel on random inputs";
    let stderr =
        stand_in.gpu_test("cuda::kernel_checks::cuda_kernels_on_a_gpu_match_the_goldens", &[("G4C_GPU_CASE", case)]);
    assert!(stderr.contains(&format!("gpu case passed: {case}")), "{stderr}");
}

/// The GPU tests, `scripts/device-check`'s first step, on a stand-in h200 (which runs t4g's kernels
/// from their PTX and h200's from their cubin) with `G4C_REQUIRE_GPU` set, as device-check runs
/// them: every case passes, and the stand-ins refuse nothing. E2B's kernels too where
/// `G4C_E2B_DIR` names an `e2b-qat` checkpoint (hours).
#[test]
#[ignore = "20 minutes on 2 cores: cargo test --release --test g4c -- --ignored the_gpu_tests_on"]
fn the_gpu_tests_on_a_stand_in_driver() {
    let stand_in = StandIn::new(Target::by_name("h200").unwrap());
    for test in [
        "cuda::kernel_checks::cuda_kernels_on_a_gpu_match_the_goldens",
        "cuda::kernel_checks::e2b_kernels_on_a_gpu_compute_what_the_interpreter_does",
    ] {
        // Cases that run beside each other on 2 cores take longer than on a GPU machine.
        let stderr = stand_in.gpu_test(test, &[("G4C_GPU_CASE_SECONDS", "3600")]);
        let cases = stderr.lines().filter(|l| l.starts_with("gpu case passed")).count();
        eprintln!("{test}: {cases} cases passed on the stand-in");
    }
}

/// A dry run of `scripts/device-check` on a stand-in h200, the tiny QAT model in E2B's place: every
/// step runs, on the GPU backend's own code, and ends well, but the XLA baseline (this machine has
/// no PJRT CUDA plugin), before a lent GPU's minutes go on the script; the stand-ins refuse nothing.
#[test]
#[ignore = "about an hour on 2 cores: cargo test --release --test g4c -- --ignored the_device_check_on"]
fn the_device_check_on_a_stand_in_driver() {
    let stand_in = StandIn::new(Target::by_name("h200").unwrap());
    let out = tempfile::tempdir().unwrap();
    let mut command = Command::new("bash");
    command.arg(crate::common::repo().join("scripts/device-check"));
    let (dir, tests) = (golden_dir("tiny-qat").join("hf"), std::env::current_exe().unwrap());
    let ran = stand_in.run(
        command,
        &[
            ("OUT", out.path().to_str().unwrap()),
            ("E2B_DIR", dir.to_str().unwrap()),
            ("G4C_BIN", env!("CARGO_BIN_EXE_g4c")),
            ("G4C_TEST_BIN", tests.to_str().unwrap()),
            ("DEVICE_CHECK_SECONDS", "36000"),
            ("DEVICE_CHECK_STEP_SCALE", "30"),
            ("G4C_GPU_CASE_SECONDS", "3600"),
            // The tiny model's vocabulary is 512 tokens.
            ("DEVICE_CHECK_PROMPT_IDS", "2,105,236"),
        ],
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    let log = std::fs::read_to_string(out.path().join("log.txt")).unwrap();
    eprintln!("{log}");
    assert!(ran.status.success() && log.contains("] done: "), "{stdout}\n{stderr}");
    assert!(!log.contains("FAILED") && !log.contains("skipped"), "{log}\n{stdout}\n{stderr}");
    assert!(stdout.contains("same logits"), "{stdout}");
    refused_nothing("scripts/device-check", &[&stdout, &stderr]);
}
