//! Every kernel of a plan on random inputs against the interpreter, launch by launch, on a GPU
//! when one is lent and on the host emulator; the tiny models' goldens through the GPU.

use super::*;

/// On a GPU (skipped without one, saying why): the tiny models' kernels through the CUDA driver
/// against the goldens, reading the logits and reading the greedy tokens alone, for t4g (sm_75
/// PTX, which a newer GPU's driver JIT-compiles: how Turing's kernels run on an H200) and for h200
/// (its sm_90 cubin), where the GPU can run them; in f32 with 1100-slot caches, the attention
/// kernels against the interpreter; and every kernel of the tiny model on random inputs against
/// the interpreter. Every case runs in a process of its own (`GpuCases`), beside the others, and
/// says how it went, so that one run on a lent GPU reports all that disagree, not only the first.
#[test]
fn cuda_kernels_on_a_gpu_match_the_goldens() {
    let Some(gpu) = GpuCases::open(this_test!()) else { return };
    std::thread::scope(|threads| {
        for target in gpu.targets() {
            let gpu = &gpu;
            for model in ["tiny", "tiny-qat", "gqa"] {
                threads.spawn(move || {
                    for case in golden_cases(model) {
                        let dir = golden_dir(model).join("hf");
                        let n = case.generated_ids.len();
                        let what = format!("cuda {target} {model}/{}", case.name);
                        gpu.check(what.clone(), &|| {
                            let got = target_generate(Backend::Cuda, target, &dir, &case.prompt_ids, n, None, &|_| {});
                            assert_matches_golden(&what, &got, &case);
                        });
                        // As `g4c run` generates: each step copies back the greedy token alone.
                        gpu.check(format!("{what}, greedy tokens alone"), &|| {
                            let greedy = greedy_generate(Backend::Cuda, Some(target), &dir, &case.prompt_ids, n);
                            assert_eq!(greedy.generated_ids, case.generated_ids, "{what}, greedy tokens alone");
                        });
                    }
                });
            }
            // Every launch on random inputs against the interpreter, kernel by kernel.
            threads.spawn(move || {
                gpu.check(format!("cuda {target}, every kernel on random inputs"), &|| {
                    let (dir, t) = (golden_dir("tiny").join("published"), Target::by_name(target).unwrap());
                    assert_kernels_agree(t, &dir, TINY_CHECKED, &["prefill", "decode"], on_the_gpu);
                    assert_kernels_agree(t, &dir, TINY_LONG_CHECKED, &["decode"], on_the_gpu);
                    assert_kernels_agree(t, &dir, TINY_SHORT_PREFILL_CHECKED, &["prefill"], on_the_gpu);
                    assert_kernels_agree(t, &dir, TINY_BATCHED_CHECKED, &["decode"], on_the_gpu);
                });
            });
            // A prefill GEMM split over blocks, against the interpreter.
            threads.spawn(move || {
                gpu.check(format!("cuda {target}, a split GEMM"), &|| {
                    let t = if target == "t4g" { "f16" } else { "bf16" };
                    assert_split_gemm_agrees(target, t, |programs| CudaDevice::new(programs).unwrap());
                });
            });
            // Matvecs striding over their columns, planned for a t4g of one SM (on a real GPU's
            // plans they stride only with E2B's widths), and splitting their contraction, for one
            // of four SMs, against the interpreter.
            if target == "t4g" {
                threads.spawn(move || {
                    gpu.check(format!("cuda {target}, strided matvecs"), &|| {
                        assert_strided_matvecs_agree(|programs| CudaDevice::new(programs).unwrap());
                        assert_split_matvecs_agree(|programs| CudaDevice::new(programs).unwrap());
                    });
                });
            }
            // The attention kernels (1100-slot caches, split into chunks), in f32 against the interpreter.
            threads.spawn(move || {
                let what = format!("cuda {target}, 1100-slot caches");
                gpu.check(what.clone(), &|| {
                    let case = golden_cases("tiny").into_iter().find(|c| c.name == "short").unwrap();
                    let (dir, n) = (golden_dir("tiny").join("hf"), case.generated_ids.len());
                    let passes = f32_pipeline(Target::by_name(target).unwrap());
                    let want =
                        long_context_generate(Backend::Interp, None, &dir, &case.prompt_ids, n, None, 1100, &passes);
                    let got = long_context_generate(
                        Backend::Cuda,
                        Some(target),
                        &dir,
                        &case.prompt_ids,
                        n,
                        None,
                        1100,
                        &passes,
                    );
                    assert_computes_what_the_module_does(&what, &got, &want);
                });
            });
        }
    });
    gpu.finish();
}

/// On a GPU, with `G4C_E2B_DIR` naming an `e2b-qat` checkpoint (skipped without either, saying
/// why; `scripts/device-check` runs it after E2B's benchmark): every E2B kernel on random inputs
/// against the interpreter, for t4g and h200, as the GPU runs them: a decode step of one sequence
/// and of 8, and a 9-token prefill's tensor-core GEMMs.
#[test]
fn e2b_kernels_on_a_gpu_compute_what_the_interpreter_does() {
    let Some(dir) = std::env::var_os("G4C_E2B_DIR").map(std::path::PathBuf::from) else {
        eprintln!("skipped: G4C_E2B_DIR names no E2B checkpoint");
        return;
    };
    let Some(gpu) = GpuCases::open(this_test!()) else { return };
    std::thread::scope(|threads| {
        for target in gpu.targets() {
            for (what, checked, entry) in [
                ("every E2B decode kernel", E2B_CHECKED, "decode"),
                ("every E2B decode kernel of 8 sequences", E2B_BATCHED_CHECKED, "decode"),
                ("every E2B prefill kernel of 9 tokens", E2B_PREFILL_CHECKED, "prefill"),
            ] {
                let (gpu, dir) = (&gpu, &dir);
                threads.spawn(move || {
                    gpu.check(format!("cuda {target}, {what} on random inputs"), &|| {
                        assert_kernels_agree(Target::by_name(target).unwrap(), dir, checked, &[entry], on_the_gpu);
                    });
                });
            }
        }
    });
    gpu.finish();
}

/// The full name of the test function it is written in, as the test binary takes it to run that
/// test alone (`cuda::kernel_checks::NAME`): the path of a function declared there, less the
/// crate's name and its own.
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let test = path.strip_suffix("::here").expect("a function's path ends with its name");
        test.split_once("::").expect("a path begins with its crate's name").1
    }};
}
use this_test;

/// `this_test!()` is the name the test binary runs a test by, which `GpuCases` runs each case by.
#[test]
fn this_test_names_the_test_it_is_written_in() {
    assert_eq!(this_test!(), "cuda::kernel_checks::this_test_names_the_test_it_is_written_in");
}

/// The cases of a GPU test. Each runs in a process of its own, the test binary again running that
/// case alone (`G4C_GPU_CASE` naming it), at most `G4C_GPU_CASE_SECONDS` (default 180): a kernel's
/// fault, which is sticky for its process's context, or a kernel that never ends costs that case
/// alone, not every case after it. Each says how it went, and the test fails at the end listing
/// every case that failed.
struct GpuCases {
    /// The GPU's compute capability.
    capability: (u32, u32),
    /// The test, which a case's process runs.
    test: &'static str,
    /// In a case's process: the case it runs, and whether it ran.
    only: Option<(String, std::sync::atomic::AtomicBool)>,
    failed: std::sync::Mutex<Vec<String>>,
}

impl GpuCases {
    /// `None`, saying why, where no GPU can be used; a failure instead with `G4C_REQUIRE_GPU` set
    /// (`scripts/device-check` sets it: there a skipped test would read as a passed one). `test`:
    /// the test's full name (`this_test!()`).
    fn open(test: &'static str) -> Option<GpuCases> {
        let Some(capability) = g4c_runtime::backend::cuda::cuda_device_capability() else {
            let why = g4c_runtime::backend::cuda::cuda_driver_problem().unwrap_or_else(|| "no usable GPU".into());
            assert!(std::env::var_os("G4C_REQUIRE_GPU").is_none(), "G4C_REQUIRE_GPU is set, and {why}");
            eprintln!("skipped: {why}");
            return None;
        };
        let only = std::env::var("G4C_GPU_CASE").ok().map(|case| (case, Default::default()));
        Some(GpuCases { capability, test, only, failed: Default::default() })
    }

    /// t4g and h200, those whose code this GPU runs.
    fn targets(&self) -> Vec<&'static str> {
        let gpu = self.capability;
        let runs = |target: &&str| {
            let cc = Target::by_name(target).unwrap().gpu.as_ref().unwrap().compute_capability;
            if cc > gpu {
                eprintln!("skipped {target}: sm_{}{} code does not run on this sm_{}{} GPU", cc.0, cc.1, gpu.0, gpu.1);
            }
            cc <= gpu
        };
        ["t4g", "h200"].into_iter().filter(runs).collect()
    }

    /// Case `what`: in a process of its own, or here in a case's process if it is that process's.
    fn check(&self, what: String, case: &dyn Fn()) {
        let passed = match &self.only {
            Some((only, _)) if *only != what => return,
            Some((_, ran)) => {
                ran.store(true, std::sync::atomic::Ordering::Relaxed);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)).is_ok()
            }
            None => self.apart(&what),
        };
        if passed {
            eprintln!("gpu case passed: {what}");
        } else {
            eprintln!("gpu case FAILED: {what}");
            self.failed.lock().unwrap().push(what);
        }
    }

    /// Runs case `what` in a process of its own: whether it passed. Its output is printed when it
    /// did not.
    fn apart(&self, what: &str) -> bool {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", self.test, "--nocapture", "--test-threads", "1"])
            .env("G4C_GPU_CASE", what)
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let seconds = std::env::var("G4C_GPU_CASE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(180);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let output = std::fs::read_to_string(log.path()).unwrap_or_default();
        let passed = status.is_some_and(|s| s.success()) && output.contains(&format!("gpu case passed: {what}"));
        if !passed {
            let ended = match status {
                Some(status) => format!("ended with {status}"),
                None => format!("killed after {seconds} s (G4C_GPU_CASE_SECONDS)"),
            };
            eprintln!("gpu case {what}: its process {ended}:");
            for line in output.lines() {
                eprintln!("    | {line}");
            }
        }
        passed
    }

    /// Fails listing the cases that failed; in a case's process, also if its case is not one of
    /// the test's.
    fn finish(self) {
        if let Some((case, ran)) = &self.only {
            assert!(ran.load(std::sync::atomic::Ordering::Relaxed), "{} has no case {case:?}", self.test);
        }
        let failed = self.failed.into_inner().unwrap();
        assert!(failed.is_empty(), "on the GPU, {} cases failed: {failed:?}", failed.len());
    }
}

/// The tiny model as the kernel checks plan it: a 16-token prefill, context 24, quantized to 4 bits
/// in groups of 8.
const TINY_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 1, prefill_len: 16, context: 24 }, Some(8));

/// The tiny model with a 5-token prefill, whose products are matvecs of 5 rows: 3 columns a block
/// (a packed one's 16 sums a thread), the last block's columns past the end.
const TINY_SHORT_PREFILL_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 1, prefill_len: 5, context: 24 }, Some(8));

/// The tiny model with 1100-slot caches, whose decode attention `split-attention` splits into 18
/// chunks; the random slot positions (counting up from below 64) leave all but the first unseen.
const TINY_LONG_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 1, prefill_len: 2, context: 1100 }, Some(8));

/// The tiny model decoding 4 sequences a step (as `g4c serve` batches them): its products are
/// matvecs of 4 rows.
const TINY_BATCHED_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 4, prefill_len: 2, context: 24 }, Some(8));

/// E2B as the kernel checks plan it: a 128-token prefill, context 4096, its own quantization.
const E2B_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 1, prefill_len: 128, context: 4096 }, None);

/// E2B decoding 8 sequences a step (`g4c serve`'s default batch): matvecs of 8 rows, striding,
/// staging their activations a step at a time or splitting their contraction where deep.
const E2B_BATCHED_CHECKED: (Shapes, Option<usize>) = (Shapes { batch: 8, prefill_len: 2, context: 4096 }, None);

/// E2B with a prefill of 9 tokens, the fewest that its products take tensor-core GEMM tiles for
/// (more than a matvec's 8 rows).
const E2B_PREFILL_CHECKED: (Shapes, Option<usize>) =
    (Shapes { batch: 1, prefill_len: g4c_ir::plan::MATVEC_MAX_ROWS + 1, context: 4096 }, None);

/// Every launch of `entries` of `target`'s plan of the checkpoint in `dir` (for `shapes`, quantized
/// in groups of `quantize_group` if given), on random inputs, on `device` (made from the plan's
/// programs) against the interpreter, kernel by kernel; fails listing every launch that disagrees,
/// else returns how many ran (at least one).
fn assert_kernels_agree(
    t: &'static Target,
    dir: &std::path::Path,
    (shapes, quantize_group): (Shapes, Option<usize>),
    entries: &[&str],
    device: impl FnOnce(&[DeviceProgram]) -> Box<dyn Device>,
) -> usize {
    let target = t.name;
    let (model, m, mut plan) = planned(dir, t, shapes, quantize_group);
    plan.entries.retain(|e| entries.contains(&e.entry.as_str()));
    let programs = g4c_driver::cuda_programs(&plan, t, true).unwrap().programs;
    let mut device = device(&programs);
    let checks =
        g4c_driver::conformance::check_kernels(&m, &plan, &programs, model.checkpoint, device.as_mut(), 1).unwrap();
    let failed: Vec<String> = checks
        .iter()
        .filter_map(|c| {
            c.outcome.as_ref().err().map(|e| format!("{target} @{} {} {:?}: {e}", c.entry, c.symbol, c.kernels))
        })
        .collect();
    assert!(!checks.is_empty(), "{target}: no launch of {entries:?}");
    assert!(failed.is_empty(), "{} of {} launches disagree:\n{}", failed.len(), checks.len(), failed.join("\n"));
    checks.len()
}

/// The GPU, for `assert_kernels_agree`.
fn on_the_gpu(programs: &[DeviceProgram]) -> Box<dyn Device> {
    Box::new(CudaDevice::new(programs).unwrap())
}

/// The host emulator, for `assert_kernels_agree`.
fn on_the_host(programs: &[DeviceProgram]) -> Box<dyn Device> {
    Box::new(Emulator::new(programs).unwrap())
}

#[test]
fn every_kernel_on_the_host_computes_what_the_interpreter_does_on_random_inputs() {
    for target in ["t4g", "h200"] {
        let (target, emulator) = (Target::by_name(target).unwrap(), on_the_host);
        let dir = golden_dir("tiny").join("published");
        let launches = assert_kernels_agree(target, &dir, TINY_CHECKED, &["prefill", "decode"], emulator);
        assert!(launches > 40, "{}: {launches} launches", target.name);
        assert_kernels_agree(target, &dir, TINY_LONG_CHECKED, &["decode"], emulator);
        assert_kernels_agree(target, &dir, TINY_SHORT_PREFILL_CHECKED, &["prefill"], emulator);
        assert_kernels_agree(target, &dir, TINY_BATCHED_CHECKED, &["decode"], emulator);
    }
}

/// Matvecs whose blocks stride over their groups of columns, staging their activations once and
/// loading the next group's words while they combine one's sums, compute what the interpreter does:
/// every launch of the tiny model planned for a one-SM t4g, on random inputs, in the host emulator,
/// and of its decode step of 4 sequences, whose matvecs of 4 rows stride too.
/// (Deeper ones, of partial last groups: `a_strided_matvec_computes_what_the_module_does`.)
#[test]
fn strided_matvecs_on_the_host_compute_what_the_interpreter_does() {
    let (t, dir) = (&*ONE_SM_T4G, golden_dir("tiny").join("published"));
    for (checked, entries, rows) in
        [(TINY_CHECKED, &["prefill", "decode"][..], 1), (TINY_BATCHED_CHECKED, &["decode"][..], 4)]
    {
        let plan = planned(&dir, t, checked.0, checked.1).2;
        let strided = |packed: bool| {
            let calls = plan.entries.iter().filter(|e| entries.contains(&e.entry.as_str())).flat_map(|e| &e.calls);
            calls.filter(|c| c.launch.tile.is_some_and(|t| t.strided && t.packed == packed && t.rows == rows)).count()
        };
        assert!(
            strided(true) > 10 && strided(false) > 0,
            "strided calls of {rows} rows: {} packed, {} not",
            strided(true),
            strided(false)
        );
        assert_kernels_agree(t, &dir, checked, entries, on_the_host);
    }
}

/// E2B's decode kernels on random inputs, in the host emulator, against the interpreter, planned
/// for t4g, a100 and h200: the LM head striding 125 groups a block, the 12288-deep down
/// projections, attention over 4096 slots in 64 chunks, the full layers' 512-wide heads, shapes no
/// tiny model has, checked before a lent GPU's time goes on them; h200's decode step of 4
/// sequences (`g4c serve`'s batches), whose matvecs of 4 rows stride; and t4g's and h200's of 8,
/// whose matvecs of 8 rows stride too, a step at a time where the GPU's shared memory does not
/// hold the whole contraction (t4g's deeper than 1536, h200's 12288-deep).
#[test]
#[ignore = "minutes over an e2b-qat checkpoint: G4C_E2B_DIR=DIR cargo test --release --test g4c -- --ignored e2b_"]
fn e2b_decode_kernels_on_the_host_compute_what_the_interpreter_does() {
    let dir = e2b_dir();
    for target in ["t4g", "a100", "h200"] {
        assert_kernels_agree(Target::by_name(target).unwrap(), &dir, E2B_CHECKED, &["decode"], on_the_host);
    }
    for (target, batch) in [("h200", 4), ("t4g", 8), ("h200", 8)] {
        let batched = (Shapes { batch, ..E2B_BATCHED_CHECKED.0 }, None);
        assert_kernels_agree(Target::by_name(target).unwrap(), &dir, batched, &["decode"], on_the_host);
    }
}

/// E2B's prefill kernels the same way, for a prefill of 9 tokens, the fewest that its products
/// take tensor-core GEMM tiles for (more than a matvec's 8 rows): E2B's depths and widths, split
/// over blocks as a short prefill's tiles leave SMs idle, m16n8k8 in f16 on t4g and m16n8k16 in
/// bf16 on h200.
#[test]
#[ignore = "minutes over an e2b-qat checkpoint: G4C_E2B_DIR=DIR cargo test --release --test g4c -- --ignored e2b_"]
fn e2b_prefill_kernels_on_the_host_compute_what_the_interpreter_does() {
    let dir = e2b_dir();
    for target in ["t4g", "h200"] {
        assert_kernels_agree(Target::by_name(target).unwrap(), &dir, E2B_PREFILL_CHECKED, &["prefill"], on_the_host);
    }
}

/// The E2B checkpoint `G4C_E2B_DIR` names, for the tests over E2B's kernels (ignored unless asked
/// for, since they take minutes).
fn e2b_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("G4C_E2B_DIR")
        .expect("G4C_E2B_DIR must name an E2B checkpoint (g4c synth --preset e2b-qat -o DIR)");
    std::path::PathBuf::from(dir)
}

/// The same strided matvecs against transformers' goldens: the tiny model, f32 and QAT, through
/// the kernels of a one-SM t4g on the host emulator, with the interpreter's tolerance.
#[test]
fn strided_matvecs_on_the_host_match_the_goldens() {
    for model in ["tiny", "tiny-qat"] {
        let case = golden_cases(model).into_iter().find(|c| c.name == "short").unwrap();
        let session = crate::common::cuda_host_session(&golden_dir(model).join("hf"), &ONE_SM_T4G);
        let opts = g4c_runtime::GenerateOptions {
            max_new_tokens: case.generated_ids.len(),
            ignore_eos: true,
            keep_logits: true,
            ..Default::default()
        };
        let got = session_generate(&session, &case.prompt_ids, (None, None), &opts, &|_| {});
        assert_matches_golden(&format!("cuda-host one-SM t4g {model}/{}", case.name), &got, &case);
    }
}

/// `dequant8_bf16` and `dequant8_f16` (the prelude every kernel includes, with the emulator's
/// stand-ins for the pair instructions) against `rbf16` and `rf16` of `(float)q · s`, bit for bit
/// (any NaN matching any NaN; the sign of zero counts): every 4-bit value in every slot of a word,
/// times every bf16 scale, and for f16 every f16 scale too (the pair path) and every bf16 one
/// (most of which f16 cannot hold: the value-by-value path).
#[test]
fn packed_dequantization_in_pairs_is_bit_for_bit_the_value_by_value_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let check = r#"
#include <cstdio>
static bool same(float a, float b) { return (a != a && b != b) || __float_as_uint(a) == __float_as_uint(b); }
int main() {
  // Each value 0..15 in each slot (with the other slots counting the other way), and two mixes.
  unsigned words[18] = {0x76543210u, 0xfedcba98u};
  for (unsigned n = 0; n < 16; ++n) { unsigned w = 0; for (int i = 0; i < 8; ++i) w |= ((n + 3 * i) & 15u) << (4 * i); words[2 + n] = w; }
  long failures = 0;
  for (unsigned bits = 0; bits < 65536; ++bits) {
    const float bf = b2f((u16)bits), hf = h2f((u16)bits);
    for (unsigned w : words) {
      float v[8];
      dequant8_bf16(w, bf, v);
      for (int i = 0; i < 8; ++i) failures += !same(v[i], rbf16((float)nib(w, i) * bf));
      for (float s : {hf, bf}) {
        dequant8_f16(w, s, v);
        for (int i = 0; i < 8; ++i) failures += !same(v[i], rf16((float)nib(w, i) * s));
      }
    }
  }
  printf("%ld\n", failures);
  return failures != 0;
}

"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("emulator.h"), g4c_runtime::backend::cuda::emulator_header()).unwrap();
    let source = dir.path().join("check.cpp");
    let prelude = read("codegen/src/cuda/prelude.cu");
    std::fs::write(&source, format!("#include \"emulator.h\"\n{prelude}\n{check}")).unwrap();
    let binary = dir.path().join("check");
    let built = std::process::Command::new("c++")
        .args(["-std=c++20", "-O1", "-w", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .unwrap();
    assert!(built.status.success(), "c++: {}", String::from_utf8_lossy(&built.stderr));
    let ran = std::process::Command::new(&binary).output().unwrap();
    let failures = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "{} values differ from the value-by-value dequantization", failures.trim());
}
