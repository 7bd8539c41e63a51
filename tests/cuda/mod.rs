//! CUDA code generation without a GPU: every kernel of a plan compiled to PTX by NVRTC for sm_75,
//! sm_80 and sm_90 and assembled by ptxas, whose report must agree with the plan's fit proof.

mod machine_code;
mod products;

use products::{assert_split_gemm_agrees, assert_split_matvecs_agree, assert_strided_matvecs_agree};

use crate::common::{
    assert_matches_golden, golden_cases, golden_dir, greedy_generate, long_context_generate, run_transformed,
    session_generate, target_generate, Backend, WeightTable,
};
use g4c_codegen::cuda::{assemble, compile_ptx, emit_entry, CudaProgram};
use g4c_frontend::{Model, Shapes};
use g4c_ir::plan::{
    launch_smem_bytes, print_plan, EntryPlan, KernelCall, KernelKind, KernelPlan, ReduceSplit, SharedRegion,
};
use g4c_ir::Target;
use g4c_passes::{plan_module, Pass, Pipeline, PipelineOptions};
use g4c_runtime::backend::cuda::{ptx_isa_version, CudaDevice, Device, DeviceProgram, Emulator};
use g4c_runtime::generate::Generation;
use std::path::Path;
/// The checkpoint in `dir`, its module for `shapes` after `target`'s pipeline, and its kernel plan.
fn planned(
    dir: &std::path::Path,
    target: &'static Target,
    shapes: Shapes,
    quantize_group: Option<usize>,
) -> (Model, g4c_ir::Module, KernelPlan) {
    let model = Model::open(dir).unwrap();
    let mut m = model.module(&shapes).unwrap();
    Pipeline::new(target, &PipelineOptions { quantize_group, ..Default::default() }).run_all(&mut m).unwrap();
    let plan = plan_module(&m, target).unwrap();
    (model, m, plan)
}

fn tiny_plan(target: &str, prefill_len: usize) -> KernelPlan {
    let (dir, shapes) = (golden_dir("tiny").join("published"), Shapes { batch: 1, prefill_len, context: 24 });
    planned(&dir, Target::by_name(target).unwrap(), shapes, Some(8)).2
}

/// Each launch of `entry`, its calls and the symbol of its kernel in `program`.
fn launch_symbols<'p>(entry: &'p EntryPlan, program: &'p CudaProgram) -> Vec<(&'p [KernelCall], &'p str)> {
    let mut first = 0;
    let launches = entry.launches().map(|calls| {
        let symbol = program.kernels[first].symbol.as_str();
        assert!(program.kernels[first..first + calls.len()].iter().all(|k| k.symbol == symbol), "{symbol}");
        first += calls.len();
        (calls, symbol)
    });
    launches.collect()
}

/// For t4g (sm_75), a100 (sm_80) and h200 (sm_90): NVRTC compiles every kernel, and ptxas finds in
/// each exactly the static shared memory the plan's footprint says (`SharedRegion`), no spills, and no more
/// registers than the launch's budget; on sm_90 every kernel waits for the one before it.
#[test]
fn every_kernel_compiles_and_ptxas_agrees_with_the_fit_proof() {
    for (target, sm) in [("t4g", (7, 5)), ("a100", (8, 0)), ("h200", (9, 0))] {
        let plan = tiny_plan(target, 16);
        for entry in &plan.entries {
            let program = emit_entry(&plan, entry).unwrap();
            let ptx = compile_ptx(&program.source, sm, &entry.entry).unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx_isa_version(&ptx).is_some(), "{target}: PTX without a .version");
            let cubin = assemble(&ptx, sm).unwrap_or_else(|e| panic!("{target}: {e}"));
            assert_eq!(cubin.kernels.len(), program.functions, "{target} @{}", entry.entry);
            // On sm_90 every kernel waits for the one before it, which programmatic dependent
            // launch (`G4C_CUDA_PDL`) relies on; the instruction does not exist before sm_90.
            let (kernels, waiting) = g4c_runtime::backend::cuda::ptx_kernels_waiting(&ptx);
            let want = if sm >= (9, 0) { program.functions } else { 0 };
            assert_eq!((kernels, waiting), (program.functions, want), "{target} @{}: kernels, waiting", entry.entry);
            for (calls, symbol) in launch_symbols(entry, &program) {
                let used = cubin.kernels[symbol];
                let what = format!("{target} {} ({symbol})", calls[0].kernel);
                assert_eq!(used.smem_bytes, SharedRegion::of(calls).static_bytes(), "{what}: shared memory");
                assert_eq!((used.spill_stores, used.spill_loads), (0, 0), "{what}: spills");
                assert!(used.registers <= calls[0].launch.registers, "{what}: {} registers", used.registers);
            }
        }
    }
}

/// The CUDA C of the plan, compiled by the host C++ compiler and run on the CPU through the device
/// executor (the same code that drives a GPU): the f32 tiny model against transformers' goldens,
/// plain and pack-quantized, with the interpreter's tolerance; also with 1100-slot caches, whose
/// decode attention `split-attention` splits into chunks (attention kernels).
#[test]
fn cuda_kernels_on_the_host_match_the_goldens() {
    let t4g = Target::by_name("t4g").unwrap();
    let split = |m: &mut g4c_ir::Module| {
        g4c_passes::SplitAttention.run(m, t4g).unwrap();
        g4c_passes::Dce.run(m, t4g).unwrap();
    };
    for model in ["tiny", "tiny-qat"] {
        let case = golden_cases(model).into_iter().find(|c| c.name == "short").unwrap();
        let (dir, n) = (golden_dir(model).join("hf"), case.generated_ids.len());
        let got = target_generate(Backend::CudaHost, "t4g", &dir, &case.prompt_ids, n, None, &|_| {});
        assert_matches_golden(&format!("cuda-host {model}/{}", case.name), &got, &case);
        let got = long_context_generate(Backend::CudaHost, Some("t4g"), &dir, &case.prompt_ids, n, None, 1100, &split);
        assert_matches_golden(&format!("cuda-host {model}/{}, 1100-slot caches", case.name), &got, &case);
    }
    // The LM head as a packed 4-bit matvec: f16 weights on t4g, bf16 on h200.
    let case = golden_cases("tiny-qat-head").into_iter().find(|c| c.name == "short").unwrap();
    let (dir, n) = (golden_dir("tiny-qat").join("hf"), case.generated_ids.len());
    let head = |m: &mut g4c_ir::Module| g4c_passes::Quantize { group: 8, head: true }.run(m, t4g).unwrap();
    for target in ["t4g", "h200"] {
        let got = target_generate(Backend::CudaHost, target, &dir, &case.prompt_ids, n, None, &head);
        assert_matches_golden(&format!("cuda-host {target} tiny-qat, head quantized/{}", case.name), &got, &case);
    }
}

/// The host emulator, noting which launch sequence each call runs, and which it was asked to ready
/// ahead (`Device::prepare`, by entry point and id).
struct NotingSequences {
    device: g4c_runtime::backend::cuda::Emulator,
    runs: std::sync::Arc<std::sync::Mutex<Vec<SequenceRun>>>,
    prepared: std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>>,
}

/// A run `NotingSequences` noted: the entry point, the sequence's id, its launches, the bytes they
/// must move.
#[derive(Debug)]
struct SequenceRun {
    entry: String,
    id: u64,
    launches: usize,
    bytes: u64,
}

impl g4c_runtime::backend::cuda::Device for NotingSequences {
    fn alloc(&mut self, bytes: usize) -> g4c_runtime::Result<usize> {
        self.device.alloc(bytes)
    }
    fn upload(&mut self, buffer: usize, bytes: &[u8]) -> g4c_runtime::Result<()> {
        self.device.upload(buffer, bytes)
    }
    fn upload_queued(&mut self, buffer: usize, bytes: &[u8]) -> g4c_runtime::Result<()> {
        self.device.upload_queued(buffer, bytes)
    }
    fn download(&mut self, buffer: usize, bytes: usize) -> g4c_runtime::Result<Vec<u8>> {
        self.device.download(buffer, bytes)
    }
    fn copy(&mut self, dst: usize, src: usize, bytes: usize) -> g4c_runtime::Result<()> {
        self.device.copy(dst, src, bytes)
    }
    fn run(&mut self, sequence: &g4c_runtime::backend::cuda::LaunchSequence) -> g4c_runtime::Result<()> {
        self.runs.lock().unwrap().push(SequenceRun {
            entry: sequence.program.clone(),
            id: sequence.id,
            launches: sequence.launches.len(),
            bytes: sequence.launches.iter().map(|l| l.bytes).sum(),
        });
        self.device.run(sequence)
    }
    fn prepare(&mut self, sequence: &g4c_runtime::backend::cuda::LaunchSequence) -> g4c_runtime::Result<()> {
        self.prepared.lock().unwrap().push((sequence.program.clone(), sequence.id));
        self.device.prepare(sequence)
    }
}

/// What lets a GPU replay a CUDA graph instead of launching kernel by kernel: every call of an entry
/// point runs the very same launch sequence (same buffers), holding all of the plan's launches,
/// and it is the one `DeviceExecutor::prepare` readied before the first call (a GPU records its
/// graph then, not in the first call's time). The bytes its launches must move (what
/// `G4C_CUDA_PROFILE` divides by their time) add up to the plan's traffic.
#[test]
fn each_entry_point_runs_one_fixed_launch_sequence() {
    use g4c_runtime::backend::cuda::{DeviceExecutor, Emulator};
    let target = Target::by_name("t4g").unwrap();
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    let prompt = [2, 17, 99, 300];
    let mut m = model.module(&Shapes { batch: 1, prefill_len: prompt.len(), context: 12 }).unwrap();
    Pipeline::for_target(target).run_all(&mut m).unwrap();
    let plan = std::sync::Arc::new(g4c_driver::kernel_plan(&m, target).unwrap());
    let programs = g4c_driver::cuda_programs(&plan, target, false).unwrap().programs;
    let (runs, prepared) = (Default::default(), Default::default());
    let device = NotingSequences { device: Emulator::new(&programs).unwrap(), runs, prepared };
    let (runs, prepared) = (device.runs.clone(), device.prepared.clone());
    let m = std::sync::Arc::new(m);
    let mut exec = DeviceExecutor::new(m.clone(), plan.clone(), &programs, model.checkpoint.clone(), device).unwrap();
    exec.prepare().unwrap();
    let opts = g4c_runtime::GenerateOptions { max_new_tokens: 4, ignore_eos: true, ..Default::default() };
    g4c_runtime::generate(&mut exec, &prompt, &opts, &mut |_| {}).unwrap();
    let (runs, prepared) = (runs.lock().unwrap(), prepared.lock().unwrap());
    for entry in ["prefill", "decode"] {
        let calls: Vec<&SequenceRun> = runs.iter().filter(|r| r.entry == entry).collect();
        let launches = plan.entry(entry).unwrap().launches().count();
        assert!(!calls.is_empty(), "@{entry} never ran");
        assert!(calls.iter().all(|r| r.id == calls[0].id && r.launches == launches), "@{entry}: {calls:?}, {launches}");
        let readied: Vec<u64> = prepared.iter().filter(|(e, _)| e == entry).map(|&(_, id)| id).collect();
        assert_eq!(readied, [calls[0].id], "@{entry}: the sequence readied ahead is the one its calls run");
    }
    let decode = runs.iter().find(|r| r.entry == "decode").unwrap();
    let traffic = g4c_runtime::bench::PlanTraffic::of(&plan, &m, None).unwrap();
    assert_eq!(decode.bytes, traffic.total(), "a decode step's launches' bytes against the plan's traffic");
    assert_eq!(runs.iter().filter(|r| r.entry == "decode").count(), 3, "{runs:?}");
}

/// The tensor-core GEMMs on the host: the 11-token prompt prefilled through them (then 3 decode
/// steps over the caches it wrote) is no further from the goldens than transformers' own run in the
/// same dtype. For a100 the tiny model's bf16 weights go through Ampere's m16n8k16 bf16 fragments;
/// for t4g the pack-quantized model's 4-bit weights are dequantized while staged, 8 from each word,
/// into Turing's m16n8k8 f16 fragments. The deep model's 768-deep down projections split their
/// contraction over 3 blocks (split-K), whose partial sums the last block of a tile adds: in bf16
/// on a100, and from 4-bit weights in groups of 32 on t4g.
#[test]
fn tensor_core_prefill_on_the_host_is_no_worse_than_transformers() {
    let runs = [("tiny", "a100", 1), ("tiny-qat", "t4g", 1), ("deep", "a100", 3), ("deep-qat", "t4g", 3)];
    for (model, target, most_splits) in runs {
        let mut case = golden_cases(model).into_iter().find(|c| c.name == "long").unwrap();
        assert!(case.prompt_ids.len() > g4c_ir::plan::MATVEC_MAX_ROWS, "the prompt must take the GEMM");
        let shapes = Shapes { batch: 1, prefill_len: case.prompt_ids.len(), context: 32 };
        let plan = planned(&golden_dir(model).join("hf"), Target::by_name(target).unwrap(), shapes, None).2;
        let gemms =
            plan.entry("prefill").unwrap().calls.iter().filter_map(|c| c.launch.tile.filter(|t| t.mma.is_some()));
        assert_eq!(gemms.map(|t| t.splits).max(), Some(most_splits), "{model} on {target}: most splits of a GEMM");
        case.generated_ids.truncate(4);
        let rows = crate::common::forced_logits(Backend::CudaHost, &golden_dir(model).join("hf"), target, &case);
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        let ours: Vec<f32> = rows
            .iter()
            .zip(&case.logits)
            .map(|(r, g)| r.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max))
            .collect();
        let errors = if target == "t4g" { &case.f16_error } else { &case.bf16_error };
        let theirs = &errors[..ours.len()];
        assert!(mean(&ours) <= mean(theirs), "{model} on {target} (host): {ours:?} against transformers' {theirs:?}");
    }
}

/// After t4g's pipeline without its f16 legalization (so in f32, with 4-bit weights dequantized
/// inside the matvecs), the kernels on the host generate what the interpreter generates from the
/// same module, with logits within 1e-3 of their scale (the matvec sums in another order), also
/// through a padded 16-token prefill (GEMM kernels), 4-token prefills whose writes wrap the sliding
/// rings, and with 1100-slot caches, whose attention
/// `split-attention` splits into chunks of slots (attention kernels, the last chunk padded; in
/// 2-token prefills too, with heads along two axes). In f16
/// the same kernels are held to the goldens
/// by `narrow_targets_are_no_worse_than_transformers_in_that_dtype`: there one-ulp differences in f16
/// roundings grow over the tiny model's layers too much for a comparison with the interpreter.
#[test]
fn cuda_kernels_on_the_host_compute_what_the_module_does() {
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "short").unwrap();
    let dir = golden_dir("tiny").join("hf");
    let n = case.generated_ids.len();
    let passes = f32_pipeline(Target::by_name("t4g").unwrap());
    let prompt = &case.prompt_ids;
    // 4-token chunks of an 11-token prompt: the sliding rings (window 4) are 7 slots, so the
    // second chunk's writes wrap past the ring's end, and its queries must read the slots it has
    // just written beside the ones the first chunk left.
    let long = &golden_cases("tiny").into_iter().find(|c| c.name == "long").unwrap().prompt_ids;
    let runs: [(&str, Generation, Generation); 5] = [
        (
            "one prefill call",
            run_transformed(Backend::Interp, &dir, prompt, n, None, &passes),
            target_generate(Backend::CudaHost, "t4g", &dir, prompt, n, None, &passes),
        ),
        (
            "a padded 16-token prefill",
            run_transformed(Backend::Interp, &dir, prompt, n, Some(16), &passes),
            target_generate(Backend::CudaHost, "t4g", &dir, prompt, n, Some(16), &passes),
        ),
        (
            "4-token prefills whose ring writes wrap",
            run_transformed(Backend::Interp, &dir, long, n, Some(4), &passes),
            target_generate(Backend::CudaHost, "t4g", &dir, long, n, Some(4), &passes),
        ),
        (
            "1100-slot caches",
            long_context_generate(Backend::Interp, None, &dir, prompt, n, None, 1100, &passes),
            long_context_generate(Backend::CudaHost, Some("t4g"), &dir, prompt, n, None, 1100, &passes),
        ),
        (
            "1100-slot caches, 2-token prefills (two rows of heads, also split)",
            long_context_generate(Backend::Interp, None, &dir, prompt, n, Some(2), 1100, &passes),
            long_context_generate(Backend::CudaHost, Some("t4g"), &dir, prompt, n, Some(2), 1100, &passes),
        ),
    ];
    for (what, want, got) in runs {
        assert_computes_what_the_module_does(what, &got, &want);
    }
}

/// A CUDA target's pipeline without its narrow-type legalization, so in f32: weights quantized to
/// 4 bits (dequantized inside the kernels), a long cache's attention split into chunks.
fn f32_pipeline(target: &'static Target) -> impl Fn(&mut g4c_ir::Module) {
    move |m: &mut g4c_ir::Module| {
        g4c_passes::Quantize { group: 8, head: false }.run(m, target).unwrap();
        for name in ["host-tables", "weight-dtype", "split-attention", "constant-fold", "cse", "dce"] {
            g4c_passes::pass_by_name(name).unwrap().run(m, target).unwrap();
        }
    }
}

/// The same tokens as the interpreter's run of the same module, and logits within 1e-3 of their
/// scale (the kernels sum in other orders).
fn assert_computes_what_the_module_does(what: &str, got: &Generation, want: &Generation) {
    assert_eq!(got.generated_ids, want.generated_ids, "{what}");
    for (step, (a, b)) in got.logits.iter().zip(&want.logits).enumerate() {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-3 * scale, "{what}, step {step}: logits differ by {worst} (scale {scale})");
    }
}

/// `--backend cuda` without a CUDA driver is one clear line and a failure, before anything compiles.
#[test]
fn cuda_without_a_driver_fails_cleanly() {
    if g4c_runtime::backend::cuda::cuda_driver_problem().is_none() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let dir = golden_dir("tiny").join("hf");
    let out = crate::common::g4c(&[
        "run",
        dir.to_str().unwrap(),
        "--backend",
        "cuda",
        "--target",
        "t4g",
        "--prompt-ids",
        "2,17",
        "--max-new-tokens",
        "2",
    ]);
    crate::common::assert_one_line_error(&out, &["--backend cuda", "no CUDA driver"]);
}

/// `g4c compile --target t4g -o` writes an artifact with CUDA C, PTX and a cubin per entry point and
/// reports every launch's shared memory beside the limit, equal to what ptxas found; `g4c run` of
/// it without a CUDA driver fails in one line; its kernels run on the host and generate what the
/// interpreter generates from its module.
#[test]
fn a_t4g_artifact_holds_its_kernels() {
    let dir = golden_dir("tiny-qat").join("hf");
    let out = tempfile::tempdir().unwrap();
    let artifact = out.path().join("a.g4c");
    let (model, art) = (dir.to_str().unwrap(), artifact.to_str().unwrap());
    let compiled = crate::common::g4c(&[
        "compile",
        model,
        "--target",
        "t4g",
        "--context",
        "32",
        "--prefill-len",
        "8",
        "-o",
        art,
        "--json",
    ]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let report: serde_json::Value = serde_json::from_slice(&compiled.stdout).unwrap();
    let kernels = &report["kernels"];
    let limit = kernels["limits"]["smem_per_block_optin"].as_u64().unwrap();
    for entry in kernels["entries"].as_array().unwrap() {
        for launch in entry["launches"].as_array().unwrap() {
            let smem = launch["smem_bytes"].as_u64().unwrap();
            assert!(smem <= limit, "{launch}");
            let dynamic = launch["dynamic_smem_bytes"].as_u64().unwrap();
            assert_eq!(launch["ptxas"]["smem_bytes"].as_u64(), Some(smem - dynamic), "{launch}");
            assert_eq!(launch["ptxas"]["spill_bytes"].as_u64(), Some(0), "{launch}");
        }
    }
    let decode = kernels["entries"].as_array().unwrap().iter().find(|e| e["entry"] == "decode").unwrap();
    let launches = decode["launches"].as_array().unwrap();
    let calls: Vec<&serde_json::Value> = launches.iter().flat_map(|l| l["calls"].as_array().unwrap()).collect();
    let preludes = calls.iter().filter(|c| c["prelude"]["reductions"].as_u64() > Some(0));
    assert!(preludes.count() > 0, "decode's norm statistics are reported in preludes");
    assert!(launches.len() < calls.len(), "a decode layer's q, k and v projections are reported in one launch");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(artifact.join("manifest.json")).unwrap()).unwrap();
    let cuda = &manifest["cuda"];
    assert_eq!(cuda["compute"], "compute_75");
    assert!(cuda["ptx_isa"].as_str().unwrap().starts_with("8."), "{cuda}");
    for e in cuda["entries"].as_array().unwrap() {
        for file in [&e["source"], &e["ptx"], &e["cubin"][1]] {
            assert!(artifact.join(file.as_str().unwrap()).is_file(), "{file}");
        }
    }
    let args = ["run", art, "--prompt-ids", "2,17,301", "--max-new-tokens", "6"];
    if g4c_runtime::backend::cuda::cuda_driver_problem().is_some() {
        crate::common::assert_one_line_error(&crate::common::g4c(&args), &["--backend cuda", "no CUDA driver"]);
        // `g4c bench` of it measures its kernels, so it needs the driver too.
        let bench = ["bench", art, "--prompt-len", "8", "--gen", "4", "-q"];
        crate::common::assert_one_line_error(&crate::common::g4c(&bench), &["--backend cuda", "no CUDA driver"]);
    }
    let tokens = |backend: &str| {
        let out = crate::common::g4c(&[&args[..], &["--backend", backend]].concat());
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(tokens("cuda-host"), tokens("interp"));
    damaged_kernels_are_refused(&artifact);
}

/// A t4g artifact whose kernel files were damaged, or written by a g4c whose CUDA C differs, is
/// refused by `run` (on the host too, before anything compiles) and by `inspect --verify`, naming
/// the file.
fn damaged_kernels_are_refused(artifact: &Path) {
    let edit_manifest = |dir: &Path, edit: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join("manifest.json");
        let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut manifest);
        std::fs::write(&path, serde_json::to_string(&manifest).unwrap()).unwrap();
    };
    let ptx_flipped = |dir: &Path| {
        let path = dir.join("cuda/decode.ptx");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(path, bytes).unwrap();
    };
    // Another g4c's CUDA C, recorded with its own hash: only comparing it with this g4c's finds it.
    let source_foreign = |dir: &Path| {
        let path = dir.join("cuda/prefill.cu");
        let source = std::fs::read_to_string(&path).unwrap() + "// another g4c\n";
        std::fs::write(&path, &source).unwrap();
        let hash = blake3::hash(source.as_bytes()).to_hex().to_string();
        edit_manifest(dir, &|m| {
            *entry(m, "prefill").pointer_mut("/blake3/cuda~1prefill.cu").unwrap() = hash.clone().into()
        });
    };
    let hashes_missing = |dir: &Path| {
        edit_manifest(dir, &|m| drop(entry(m, "decode").as_object_mut().unwrap().remove("blake3").unwrap()))
    };
    type Damage<'a> = &'a dyn Fn(&Path);
    let cases: [(Damage, &[&str]); 3] = [
        (&ptx_flipped, &["cuda/decode.ptx", "does not match its content hash"]),
        (&source_foreign, &["cuda/prefill.cu", "differs from the CUDA C this g4c emits"]),
        (&hashes_missing, &["no content hash for cuda/decode", "compile it again"]),
    ];
    for (damage, needles) in cases {
        let copy = tempfile::tempdir().unwrap();
        for entry in walk(artifact) {
            let to = copy.path().join(entry.strip_prefix(artifact).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, to).unwrap();
        }
        damage(copy.path());
        let dir = copy.path().to_str().unwrap();
        let run = ["run", dir, "--backend", "cuda-host", "--prompt-ids", "2,17", "--max-new-tokens", "1"];
        crate::common::assert_one_line_error(&crate::common::g4c(&run), needles);
        crate::common::assert_one_line_error(&crate::common::g4c(&["inspect", "--verify", dir]), needles);
    }
}

/// The manifest's CUDA entry point `name`.
fn entry<'a>(manifest: &'a mut serde_json::Value, name: &str) -> &'a mut serde_json::Value {
    let entries = manifest["cuda"]["entries"].as_array_mut().unwrap();
    entries.iter_mut().find(|e| e["name"] == name).unwrap()
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .flat_map(|e| match e.path().is_dir() {
            true => walk(&e.path()),
            false => vec![e.path()],
        })
        .collect()
}

fn e2b_plan(target: &'static Target) -> KernelPlan {
    e2b_plan_of(target, Shapes { batch: 1, prefill_len: 128, context: 4096 })
}

/// `e2b_plan` for other shapes.
fn e2b_plan_of(target: &'static Target, shapes: Shapes) -> KernelPlan {
    let mut m = g4c_frontend::synth::Preset::E2b.declared_module(&shapes).unwrap();
    Pipeline::new(target, &PipelineOptions { quantize_group: Some(32), ..Default::default() }).run_all(&mut m).unwrap();
    plan_module(&m, target).unwrap()
}

/// E2B's decode plan on t4g, W4A16 in groups of 32 (the QAT export's): every launch, its kind,
/// buffers, grid, tile and shared memory.
#[test]
fn e2b_decode_plan_on_t4g() {
    let mut plan = e2b_plan(Target::by_name("t4g").unwrap());
    plan.entries.retain(|e| e.entry == "decode");
    // Beside the other tests' snapshots (insta looks beside the source file, `tests/cuda/`).
    insta::with_settings!({ snapshot_path => "../snapshots" }, {
        insta::assert_snapshot!("e2b_w4a16_t4g_decode_plan", print_plan(&plan, false));
    });
}

/// E2B's 12288-deep down projections (the 20 layers of doubled feed-forward width) stride over
/// their 192 groups of columns on t4g, in a region past the static 48 KiB (`SharedRegion`): the
/// activations take 48 KiB and the partial sums 256 bytes more, and a T4's SM holds one block of
/// either. On h200 192 groups are less than a wave, and the region stays static.
#[test]
fn e2b_down_projections_on_t4g_stride_in_a_dynamic_region() {
    for (target, strided, region) in
        [("t4g", true, SharedRegion::Dynamic(49408)), ("h200", false, SharedRegion::Static(49152))]
    {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let down: Vec<&[KernelCall]> = (plan.entry("decode").unwrap().launches())
            .filter(|l| l.iter().any(|c| c.launch.tile.is_some_and(|t| t.k == 12288)))
            .collect();
        assert_eq!(down.len(), 20, "{target}");
        for launch in down {
            let what = format!("{target}: {}", launch[0].kernel);
            assert_eq!((launch.len(), SharedRegion::of(launch)), (1, region), "{what}");
            assert_eq!(launch[0].launch.tile.unwrap().strided, strided, "{what}");
        }
    }
}

/// A decode step of several sequences computes each sliding layer's softmax maximum and sum in its
/// weighted sum of values, as one sequence's does: a block stages one head's probabilities of one
/// sequence and computes that row's statistics alone (`staged_row_of`), where the statistics of
/// all 32 rows in each of its 256 blocks were over the preludes' budget, two launches of their own
/// each layer. On h200 the full-attention layers' too; on t4g (40 SMs) their 4096-slot rows, in 512
/// blocks, stay over the budget of what an SM's blocks recompute. And each layer's residual kernel,
/// whose blocks write 256 features of one sequence, computes that sequence's norm statistics alone
/// (`element_row_of`), which took a launch of their own each layer.
#[test]
fn e2b_batched_decode_computes_statistics_a_row_a_block() {
    for (target, sums) in [("h200", 35), ("t4g", 28)] {
        let plan = e2b_plan_of(Target::by_name(target).unwrap(), Shapes { batch: 4, prefill_len: 64, context: 4096 });
        let one_row = |c: &&KernelCall| c.launch.prelude.is_some_and(|p| p.one_row);
        let calls: Vec<&KernelCall> = plan.entry("decode").unwrap().calls.iter().filter(one_row).collect();
        let staged = calls.iter().filter(|c| matches!(c.launch.split, Some(ReduceSplit::WarpsPerExtent { .. })));
        let residual = calls.iter().filter(|c| c.kind == KernelKind::Loop && c.launch.prelude.unwrap().reductions == 3);
        assert_eq!(staged.count(), sums, "{target}: weighted sums computing their row's softmax statistics");
        assert_eq!(residual.count(), 35, "{target}: residual kernels computing their row's three norms' statistics");
    }
}

/// A decode step of 8 sequences (`g4c serve`'s default batch) stages each matvec's activations
/// once a block: every matvec of 8 rows at least 1536 deep strides over its columns, one block an
/// SM staging its 8 × 1536 or more activations (48 KiB and up, in a dynamic region) for all of
/// its groups. Unstrided, each block of a 6144-wide gate/up projection (6144 blocks, a column each)
/// staged them all: 32 GB through L2 a step. Where the blocks would still stage more than the
/// weights hold, the deep ones split their contraction over blocks (`Tile::splits`), each staging
/// a share: the down projections (6144 and 12288 deep) on every GPU, the full layers' 4096-deep
/// output projections on a100 and h200 (t4g's 64 KiB holds no 8 × 2048 share beside the partial
/// sums); a matvec deeper than the opt-in holds and not split stages a step at a time (deeper than
/// 1536 on t4g, 4096 on a100, 6144 on h200). The per-layer projection (256 deep, 8 KiB) does not
/// stride. With the blocks few, three of each layer's four kernels of norm statistics move into
/// the preludes of the matvecs reading them (the fourth would give the gate/up projection's
/// prelude two norms of 8 × 1536, over a block's budget): 397 launches on a100 and h200, 411 on
/// t4g, where there were 503 and 517.
#[test]
fn e2b_decode_of_8_sequences_stages_activations_once_a_block() {
    // Each target: the deepest contraction staged whole, the launches.
    for (target, whole_at_most, launches) in [("t4g", 1536, 411), ("a100", 4096, 397), ("h200", 6144, 397)] {
        // The shares a contraction so deep splits into.
        let splits = |depth: usize| match (target, depth) {
            (_, 6144) => 4,
            ("t4g", 12288) => 7,
            ("a100", 12288) => 5,
            ("h200", 12288) => 6,
            ("a100" | "h200", 4096) => 2,
            _ => 1,
        };
        let plan = e2b_plan_of(Target::by_name(target).unwrap(), Shapes { batch: 8, prefill_len: 64, context: 4096 });
        let decode = plan.entry("decode").unwrap();
        let mut strided = 0;
        for c in decode.calls.iter().filter(|c| matches!(c.kind, KernelKind::Matvec | KernelKind::MatvecW4)) {
            let (m, tile) =
                (g4c_passes::matvec_of(plan.kernels.function(&c.kernel).unwrap()).unwrap(), c.launch.tile.unwrap());
            let what = format!("{target}: {} ({} rows, {} deep): {tile:?}", c.kernel, m.rows, m.depth);
            assert_eq!(m.rows, 8, "{what}");
            assert_eq!(tile.strided, m.depth >= 1536, "{what}");
            assert_eq!(tile.splits, splits(m.depth), "{what}: split");
            if tile.strided {
                let stepped = tile.splits == 1 && (tile.k as usize) < m.depth;
                assert_eq!(stepped, tile.splits == 1 && m.depth > whole_at_most, "{what}: staged in steps");
                assert!(SharedRegion::of(std::slice::from_ref(c)).dynamic_bytes() > 0, "{what}: a dynamic region");
                strided += 1;
            }
        }
        assert_eq!(strided, 242 - 35, "{target}: strided matvecs");
        assert_eq!(decode.launches().count(), launches, "{target}: launches");
    }
}

/// A decode layer's projections (q, k and v; q alone where the layer reads another's cache)
/// compute the residual stream they stage (`recompute`) rather than wait for the kernel
/// materializing it, and run in its launch, one dependent launch fewer: every layer but the first
/// (whose input is the embedding). On t4g the 3 full-attention layers that compute their own keys
/// and values did not while a block took one group of 8 columns: their 640 blocks of projections
/// recomputed more than the preludes' budget for t4g's 40 SMs; 74 blocks striding over them
/// recompute it once each.
#[test]
fn e2b_projections_run_beside_the_residual_kernel() {
    for (target, layers) in [("h200", 34), ("t4g", 34)] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let beside = plan
            .entry("decode")
            .unwrap()
            .launches()
            .filter(|l| {
                let projections: Vec<_> = l[1..].iter().filter(|c| !c.tail).collect();
                let matvecs = !projections.is_empty() && projections.iter().all(|c| c.kind == KernelKind::MatvecW4);
                l[0].kind == KernelKind::Loop && matvecs
            })
            .count();
        assert_eq!(beside, layers, "{target}: launches of the residual kernel and a layer's projections");
    }
}

/// E2B's 128-token prefill GEMMs split their contraction where their tiles leave SMs idle
/// (`gemm_splits`): 1536 wide (48 tiles of 64 × 64), 6144 deep, the down projection takes 2
/// splits on an H200's 132 SMs and 3 on a T4's 40 (where 48 blocks were two waves, the second a
/// fifth full); 256 wide (8 tiles), 1536 deep, 6 and 4 for the key and value projections, 12 and
/// 5 for the per-layer gate, whose steps are 64 deep (`STAGED_READS`), twice as many; 4096 wide
/// (128 tiles) none.
#[test]
fn e2b_prefill_gemms_split_where_tiles_leave_sms_idle() {
    for (target, want) in [("h200", [2, 6, 12, 1]), ("t4g", [3, 4, 5, 1])] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let (prefill, kernels) = (plan.entry("prefill").unwrap(), &plan.kernels);
        let splits = |cols: usize, depth: usize, k: u32| -> Vec<u32> {
            let gemms = prefill.calls.iter().filter(|c| c.launch.tile.is_some_and(|t| t.mma.is_some() && t.k == k));
            let shaped = gemms.filter(|c| {
                let m = g4c_passes::matvec_of(kernels.function(&c.kernel).unwrap()).unwrap();
                (m.cols, m.depth) == (cols, depth)
            });
            let splits: std::collections::BTreeSet<u32> = shaped.map(|c| c.launch.tile.unwrap().splits).collect();
            splits.into_iter().collect()
        };
        let got = [splits(1536, 6144, 128), splits(256, 1536, 128), splits(256, 1536, 64), splits(4096, 1536, 128)];
        assert_eq!(
            got,
            want.map(|s| vec![s]),
            "{target}: splits of the down, key, per-layer gate and full-query products"
        );
    }
}

/// Every launch's counts of finished blocks (split GEMMs', tails') lie before every launch's partial
/// sums in the split-sums buffer: a count must start at zero, and partial sums stay where a launch
/// left them. E2B's prefill has split GEMMs of 8 tiles (32 bytes of counts) and of 64 (256 bytes):
/// laid out launch by launch from one offset, the wider one's counts began on the narrower one's
/// partial sums, and most of its tiles would never have counted to their last block.
#[test]
fn no_count_lies_where_partial_sums_were_left() {
    for target in ["h200", "t4g"] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        for e in &plan.entries {
            let (mut counts_end, mut partials_start, mut tiles) = (0, u64::MAX, std::collections::BTreeSet::new());
            for c in &e.calls {
                let Some(sums) = c.split_sums else { continue };
                let counts = match g4c_passes::split_sums_bytes(plan.kernels.function(&c.kernel).unwrap(), &c.launch) {
                    Some(bytes) => {
                        tiles.insert(c.launch.grid / c.launch.tile.unwrap().splits);
                        partials_start = partials_start.min(sums.partials);
                        bytes.counts
                    }
                    None => 4,
                };
                counts_end = counts_end.max(sums.counts + counts);
            }
            assert!(
                counts_end <= partials_start,
                "{target} @{}: counts up to {counts_end}, sums from {partials_start}",
                e.entry
            );
            if e.entry == "prefill" {
                assert!(tiles.len() > 1, "{target}: split GEMMs of {tiles:?} tiles");
            }
        }
    }
}

/// Every E2B kernel, decode and prefill, compiles for t4g, a100 and h200, within each one's shared
/// memory, and ptxas agrees with the footprints and finds no spills: for one sequence and a
/// 128-token prefill, and for `g4c serve`'s default of 8 sequences and 64-token prefills (whose
/// 512-row GEMMs spilled on t4g, see `Edges` and `STAGED_READS`); and the decode of the batch whose
/// strided matvecs take the largest dynamic regions (past 48 KiB, `SharedRegion`), which ptxas does
/// not count: 5 sequences on t4g (61,920 bytes), 4 on a100 (98,816) and 6 on h200 (74,112; deeper
/// matvecs of 2 to 4 rows split their contraction there, `Tile::splits`, into shares within 48
/// KiB).
#[test]
fn e2b_kernels_compile_and_fit_on_every_gpu_class() {
    let served = Shapes { batch: 8, prefill_len: 64, context: 4096 };
    for (target, sm, batch) in [("t4g", (7, 5), 5), ("a100", (8, 0), 4), ("h200", (9, 0), 6)] {
        let t = Target::by_name(target).unwrap();
        let limit = t.gpu.as_ref().unwrap().smem_per_block_optin;
        let mut batched = e2b_plan_of(t, Shapes { batch, ..served });
        batched.entries.retain(|e| e.entry == "decode");
        let dynamic = batched.entries[0].launches().filter(|l| SharedRegion::of(l).dynamic_bytes() > 0).count();
        assert!(dynamic > 0, "{target}: {batch} sequences' decode has no dynamic region");
        for plan in [e2b_plan(t), e2b_plan_of(t, served), batched] {
            assert_fits(&plan, (target, sm), limit);
        }
    }
}

/// `plan`'s kernels compiled for `sm` (`target`'s): each launch within `limit` bytes of shared
/// memory, whose static part ptxas finds exactly, and no spills.
fn assert_fits(plan: &KernelPlan, (target, sm): (&str, (u32, u32)), limit: u32) {
    for entry in &plan.entries {
        let program = emit_entry(plan, entry).unwrap();
        let ptx = compile_ptx(&program.source, sm, &entry.entry).unwrap_or_else(|e| panic!("{e}"));
        let cubin = assemble(&ptx, sm).unwrap_or_else(|e| panic!("{target}: {e}"));
        for (calls, symbol) in launch_symbols(entry, &program) {
            let used = cubin.kernels[symbol];
            let what = format!("{target} @{} {} ({symbol})", entry.entry, calls[0].kernel);
            assert!(launch_smem_bytes(calls) <= limit, "{what}");
            assert_eq!(used.smem_bytes, SharedRegion::of(calls).static_bytes(), "{what}: shared memory");
            assert_eq!((used.spill_stores, used.spill_loads), (0, 0), "{what}: spills");
        }
    }
}

/// On a GPU (skipped without one, saying why): the tiny models' kernels through the CUDA driver
/// against the goldens, reading the logits and reading the greedy tokens alone, for t4g (sm_75
/// PTX, which a newer GPU's driver JIT-compiles: how Turing's kernels run on an H200) and for h200
/// (its sm_90 cubin), where the GPU can run them; in f32 with 1100-slot caches, the attention
/// kernels against the interpreter; and every kernel of the tiny model on random inputs against
/// the interpreter. Every case runs on a thread of its own and says how it went, so that one run
/// on a lent GPU reports all that disagree, not only the first.
#[test]
fn cuda_kernels_on_a_gpu_match_the_goldens() {
    let Some(gpu) = GpuCases::open() else { return };
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
    let Some(gpu) = GpuCases::open() else { return };
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

/// The cases of a GPU test: each runs and says how it went, and the test fails at the end listing
/// every one that failed.
struct GpuCases {
    /// The GPU's compute capability.
    capability: (u32, u32),
    failed: std::sync::Mutex<Vec<String>>,
}

impl GpuCases {
    /// `None`, saying why, where no GPU can be used; a failure instead with `G4C_REQUIRE_GPU` set
    /// (`scripts/device-check` sets it: there a skipped test would read as a passed one).
    fn open() -> Option<GpuCases> {
        let Some(capability) = g4c_runtime::backend::cuda::cuda_device_capability() else {
            let why = g4c_runtime::backend::cuda::cuda_driver_problem().unwrap_or_else(|| "no usable GPU".into());
            assert!(std::env::var_os("G4C_REQUIRE_GPU").is_none(), "G4C_REQUIRE_GPU is set, and {why}");
            eprintln!("skipped: {why}");
            return None;
        };
        Some(GpuCases { capability, failed: Default::default() })
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

    fn check(&self, what: String, case: &dyn Fn()) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)) {
            Ok(()) => eprintln!("gpu case passed: {what}"),
            Err(_) => {
                eprintln!("gpu case FAILED: {what}");
                self.failed.lock().unwrap().push(what);
            }
        }
    }

    /// Fails listing the cases that failed. A kernel's fault is sticky for GPU 0's context, which
    /// every case shares: once one faults, those still running fail too, so the first failure
    /// printed is the one to read first.
    fn finish(self) {
        let failed = self.failed.into_inner().unwrap();
        assert!(
            failed.is_empty(),
            "on the GPU, {} cases failed (the first may have made later ones fail: a kernel's fault is sticky for the context they share): {failed:?}",
            failed.len()
        );
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

/// t4g with one SM: two blocks of a matvec fit it at once, so every matvec of one row and more
/// than two groups of columns strides over them (`Tile::strided`), as E2B's do on the real GPUs
/// and no tiny model's does there.
pub(crate) static ONE_SM_T4G: std::sync::LazyLock<Target> = std::sync::LazyLock::new(|| {
    let mut t = Target::by_name("t4g").unwrap().clone();
    t.gpu.as_mut().unwrap().sm_count = 1;
    t
});

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
