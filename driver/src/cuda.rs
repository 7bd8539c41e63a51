//! The CUDA programs of a module for a CUDA target: its kernel plan, each entry point's kernels as
//! CUDA C, and, for a GPU, PTX from NVRTC for the target's compute capability and a cubin from
//! ptxas when it is installed.

use anyhow::{Context, Result};
use g4c_codegen::cuda::{assemble, compile_ptx, emit_entry, find_ptxas};
use g4c_ir::plan::KernelPlan;
use g4c_ir::{Module, Target};
use g4c_runtime::backend::cuda::{DeviceProgram, KernelBinding};

/// The plan of `module` for `target`.
pub fn kernel_plan(module: &Module, target: &'static Target) -> Result<KernelPlan> {
    Ok(g4c_passes::plan_module(module, target)?)
}

/// Every entry point's kernels as CUDA C; with `compile`, also PTX (and a cubin where ptxas is).
pub fn cuda_programs(plan: &KernelPlan, target: &Target, compile: bool) -> Result<Vec<DeviceProgram>> {
    let gpu = target.gpu.as_ref().with_context(|| format!("target {} is not a CUDA target", target.name))?;
    let sm = gpu.compute_capability;
    let mut programs = Vec::new();
    for entry in &plan.entries {
        let program = emit_entry(plan, entry)?;
        let (ptx, cubin) = match compile {
            false => (None, None),
            true => {
                let ptx = compile_ptx(&program.source, sm, &entry.entry)?;
                let cubin = match find_ptxas() {
                    Ok(_) => Some((sm, assemble(&ptx, sm)?.bytes)),
                    Err(_) => None,
                };
                (Some(ptx), cubin)
            }
        };
        let kernels =
            program.kernels.into_iter().map(|k| KernelBinding { symbol: k.symbol, weights: k.weights }).collect();
        programs.push(DeviceProgram { entry: entry.entry.clone(), source: program.source, ptx, cubin, kernels });
    }
    Ok(programs)
}
