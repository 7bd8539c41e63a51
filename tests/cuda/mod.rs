//! CUDA code generation without a GPU: every kernel of a plan compiled to PTX by NVRTC for sm_75,
//! sm_80 and sm_90 and assembled by ptxas, whose report must agree with the plan's fit proof; the
//! kernels on the host emulator against the goldens and the module; and, in the modules below,
//! artifacts (`artifact`), E2B's plans (`e2b_plans`), kernels launch by launch against the
//! interpreter on a GPU and on the host (`kernel_checks`), products of every shape (`products`),
//! what ptxas made of them (`machine_code`), and the GPU backend through cudarc against a stand-in
//! for the CUDA driver (`stand_in_driver`).

mod artifact;
mod e2b_plans;
mod kernel_checks;
mod machine_code;
mod products;
mod stand_in_driver;

use e2b_plans::e2b_plan;

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
use safetensors::SafeTensors;
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

/// t4g with one SM: two blocks of a matvec fit it at once, so every matvec of one row and more
/// than two groups of columns strides over them (`Tile::strided`), as E2B's do on the real GPUs
/// and no tiny model's does there.
pub(crate) static ONE_SM_T4G: std::sync::LazyLock<Target> = std::sync::LazyLock::new(|| {
    let mut t = Target::by_name("t4g").unwrap().clone();
    t.gpu.as_mut().unwrap().sm_count = 1;
    t
});

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
/// decode attention `split-attention` splits into chunks (attention kernels); and the keys-as-values
/// and mixture-of-experts models.
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
    // The larger models' layers: keys as values, and a mixture of experts (its decode step's
    // gathered experts).
    for model in ["keqv", "moe"] {
        let case = golden_cases(model).into_iter().find(|c| c.name == "short").unwrap();
        let (dir, n) = (golden_dir(model).join("hf"), case.generated_ids.len());
        let got = target_generate(Backend::CudaHost, "t4g", &dir, &case.prompt_ids, n, None, &|_| {});
        assert_matches_golden(&format!("cuda-host {model}/{}", case.name), &got, &case);
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
    fn upload_at(&mut self, buffer: usize, offset: usize, bytes: &[u8]) -> g4c_runtime::Result<()> {
        self.device.upload_at(buffer, offset, bytes)
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
/// rings (with float weights, also against transformers' goldens), and with 1100-slot caches,
/// whose attention `split-attention` splits into chunks of slots (attention kernels, the last
/// chunk padded; in 2-token prefills too, with heads along two axes). In f16 the same kernels are
/// held to the goldens by `narrow_targets_are_no_worse_than_transformers_in_that_dtype`: there
/// one-ulp differences in f16 roundings grow over the tiny model's layers too much for a
/// comparison with the interpreter.
#[test]
fn cuda_kernels_on_the_host_compute_what_the_module_does() {
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "short").unwrap();
    let dir = golden_dir("tiny").join("hf");
    let n = case.generated_ids.len();
    let t4g = Target::by_name("t4g").unwrap();
    let passes = f32_pipeline(t4g);
    let prompt = &case.prompt_ids;
    // 4-token chunks of an 11-token prompt: the sliding rings (window 4) are 7 slots, so the
    // second chunk's writes wrap past the ring's end, and its queries must read the slots it has
    // just written beside the ones the first chunk left.
    let long_case = golden_cases("tiny").into_iter().find(|c| c.name == "long").unwrap();
    let long = &long_case.prompt_ids;
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
    // The wrapping chunks with the float weights: transformers' own generation of that prompt.
    let (n, float) = (long_case.generated_ids.len(), float_pipeline(t4g));
    let got = target_generate(Backend::CudaHost, "t4g", &dir, long, n, Some(4), &float);
    assert_matches_golden("cuda-host t4g in f32, tiny/long in 4-token prefills", &got, &long_case);
}

/// `g4c eval`'s scoring entry point (the logits of every token) through the kernels on the host,
/// after t4g's pipeline without its f16 legalization: the 64-token eval sequence in calls of 5
/// tokens, so the sliding rings wrap within calls and between them, and the LM head's product is a
/// GEMM over every row. With float weights the logits are transformers' (`tests/goldens/tiny/eval`,
/// within `g4c eval`'s own test's 2e-2); with 4-bit weights, the interpreter's of the same module,
/// within 1e-3 of each row's scale.
#[test]
fn scoring_through_the_kernels_on_the_host_reproduces_transformers_and_the_module() {
    let dir = golden_dir("tiny").join("hf");
    let eval = golden_dir("tiny").join("eval");
    let text = std::fs::read_to_string(eval.join("ids.txt")).unwrap();
    let ids: Vec<u32> = text.split(|c: char| c == ',' || c.is_whitespace()).filter_map(|t| t.parse().ok()).collect();
    assert_eq!(ids.len(), 64);
    let model = Model::open(&dir).unwrap();
    let t4g = Target::by_name("t4g").unwrap();
    let scoring = |pipeline: &dyn Fn(&mut g4c_ir::Module)| {
        let shapes = Shapes { batch: 1, prefill_len: 5, context: ids.len() };
        let mut module = g4c_frontend::emit_scoring_module(&model.config, model.weights.clone(), &shapes).unwrap();
        pipeline(&mut module);
        std::sync::Arc::new(module)
    };
    let logits = |backend: Backend, module: &std::sync::Arc<g4c_ir::Module>| {
        let options =
            g4c_driver::SessionOptions { backend, target: Some("t4g".into()), use_cache: false, ..Default::default() };
        let session = g4c_driver::Session::open(&dir, options).unwrap();
        let mut ready = session.executor(module.clone(), &g4c_driver::Feedback::silent()).unwrap();
        g4c_runtime::eval::score(ready.executor.as_mut(), &ids).unwrap()
    };
    let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);

    let reference = std::fs::read(eval.join("reference.safetensors")).unwrap();
    let reference = SafeTensors::deserialize(&reference).unwrap();
    let theirs: Vec<f32> = reference
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let got = logits(Backend::CudaHost, &scoring(&float_pipeline(t4g)));
    assert_eq!(got.len() * got[0].len(), theirs.len());
    for (i, (ours, theirs)) in got.iter().zip(theirs.chunks(got[0].len())).enumerate() {
        let d = worst(ours, theirs);
        assert!(d < 2e-2, "position {i}: float logits differ from transformers' by {d}");
    }

    let module = scoring(&f32_pipeline(t4g));
    let (want, got) = (logits(Backend::Interp, &module), logits(Backend::CudaHost, &module));
    assert_eq!(got.len(), ids.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = worst(a, b);
        assert!(d <= 1e-3 * scale, "position {i}: logits differ by {d} (scale {scale})");
    }
}

/// A CUDA target's pipeline without its narrow-type legalization, so in f32: weights quantized to
/// 4 bits (dequantized inside the kernels), a long cache's attention split into chunks.
fn f32_pipeline(target: &'static Target) -> impl Fn(&mut g4c_ir::Module) {
    move |m: &mut g4c_ir::Module| {
        g4c_passes::Quantize { group: 8, head: false }.run(m, target).unwrap();
        float_pipeline(target)(m);
    }
}

/// `f32_pipeline` with the weights left as the checkpoint has them.
fn float_pipeline(target: &'static Target) -> impl Fn(&mut g4c_ir::Module) {
    move |m: &mut g4c_ir::Module| {
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
