//! CUDA code generation without a GPU: every kernel of a plan compiled to PTX by NVRTC for sm_75,
//! sm_80 and sm_90 and assembled by ptxas, whose report must agree with the plan's fit proof.

use crate::common::golden_dir;
use g4c_codegen::cuda::{assemble, compile_ptx, emit_entry, ptx_isa_version};
use g4c_frontend::{Model, Shapes};
use g4c_ir::plan::KernelPlan;
use g4c_ir::Target;
use g4c_passes::{plan_module, Pipeline, PipelineOptions};

fn tiny_plan(target: &str, prefill_len: usize) -> KernelPlan {
    let target = Target::by_name(target).unwrap();
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    let mut m = model.module(&Shapes { batch: 1, prefill_len, context: 24 }).unwrap();
    Pipeline::new(target, &PipelineOptions { quantize_group: Some(8) }).run_all(&mut m).unwrap();
    plan_module(&m, target).unwrap()
}

/// For t4g (sm_75), a100 (sm_80) and h200 (sm_90): NVRTC compiles every kernel, and ptxas finds in
/// each exactly the static shared memory the plan's footprint says, no spills, and no more
/// registers than the launch's budget.
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
            for (call, k) in entry.calls.iter().zip(&program.kernels) {
                let used = cubin.kernels[&k.symbol];
                let what = format!("{target} {} ({})", call.kernel, k.symbol);
                assert_eq!(used.smem_bytes, call.launch.smem_bytes, "{what}: shared memory");
                assert_eq!((used.spill_stores, used.spill_loads), (0, 0), "{what}: spills");
                assert!(used.registers <= call.launch.registers, "{what}: {} registers", used.registers);
            }
        }
    }
}
