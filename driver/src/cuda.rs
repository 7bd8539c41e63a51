//! The CUDA programs of a module for a CUDA target: its kernel plan, each entry point's kernels as
//! CUDA C, and, for a GPU, PTX from NVRTC for the target's compute capability and a cubin from
//! ptxas when it is installed; and the compile report's account of every kernel against the
//! target's limits.

use anyhow::{Context, Result};
use g4c_codegen::cuda::{assemble, compile_ptx, emit_entry, find_ptxas, nvrtc_version, KernelResources};
use g4c_ir::plan::{launch_grid, launch_smem_bytes, EntryPlan, KernelPlan, SharedRegion};
use g4c_ir::{Module, Target};
use g4c_runtime::backend::cuda::{launch_bindings, DeviceProgram, KernelBinding};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The plan of `module` for `target`.
pub fn kernel_plan(module: &Module, target: &'static Target) -> Result<KernelPlan> {
    Ok(g4c_passes::plan_module(module, target)?)
}

/// What compiling a plan's kernels made.
pub struct CudaBuild {
    pub programs: Vec<DeviceProgram>,
    /// ptxas's account of each kernel function, when ptxas ran.
    pub resources: BTreeMap<String, KernelResources>,
    /// The NVRTC that made the PTX, when any was made.
    pub nvrtc: Option<(i32, i32)>,
}

/// Every entry point's kernels as CUDA C; with `compile`, also PTX (and a cubin where ptxas is).
/// Entry points compile side by side, each on a thread: NVRTC compiles a program on one core
/// (E2B's prefill 13.4 s, its decode 8.4 s here), and the two need not wait for each other.
pub fn cuda_programs(plan: &KernelPlan, target: &Target, compile: bool) -> Result<CudaBuild> {
    let gpu = target.gpu.as_ref().with_context(|| format!("target {} is not a CUDA target", target.name))?;
    let sm = gpu.compute_capability;
    let built: Vec<Result<(DeviceProgram, BTreeMap<String, KernelResources>)>> = std::thread::scope(|threads| {
        let entries: Vec<_> =
            plan.entries.iter().map(|entry| threads.spawn(move || entry_program(plan, entry, sm, compile))).collect();
        entries.into_iter().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut programs = Vec::new();
    let mut resources = BTreeMap::new();
    for entry in built {
        let (program, used) = entry?;
        resources.extend(used);
        programs.push(program);
    }
    let nvrtc = if compile { Some(nvrtc_version()?) } else { None };
    Ok(CudaBuild { programs, resources, nvrtc })
}

/// `entry`'s kernels as CUDA C; with `compile`, also PTX for `sm` and, where ptxas is, a cubin
/// and ptxas's account of each kernel function.
fn entry_program(
    plan: &KernelPlan,
    entry: &EntryPlan,
    sm: (u32, u32),
    compile: bool,
) -> Result<(DeviceProgram, BTreeMap<String, KernelResources>)> {
    let program = emit_entry(plan, entry)?;
    let ptx = compile.then(|| compile_ptx(&program.source, sm, &entry.entry)).transpose()?;
    let (cubin, used) = match (&ptx, find_ptxas()) {
        (Some(ptx), Ok(_)) => {
            let cubin = assemble(ptx, sm)?;
            (Some((sm, cubin.bytes)), cubin.kernels)
        }
        _ => (None, BTreeMap::new()),
    };
    let kernels = program.kernels.into_iter().map(|k| KernelBinding { symbol: k.symbol, weights: k.weights }).collect();
    Ok((DeviceProgram { entry: entry.entry.clone(), source: program.source, ptx, cubin, kernels }, used))
}

/// The `kernels` section of the compile report: the target's limits, and per entry point every
/// launch's footprint beside them (and the part of it that is dynamic shared memory, which ptxas
/// does not count), with what ptxas found in its function where it ran, and the calls it runs
/// side by side (and as tails).
pub fn kernel_report(plan: &KernelPlan, build: &CudaBuild, target: &Target) -> Value {
    let gpu = target.gpu.as_ref().expect("a CUDA target");
    let entries: Vec<Value> = plan
        .entries
        .iter()
        .zip(&build.programs)
        .map(|(e, p)| {
            let launches: Vec<Value> = launch_bindings(e, &p.kernels)
                .map(|(calls, bindings)| {
                    let symbol = &bindings[0].symbol;
                    let ptxas = build.resources.get(symbol).map(|r| {
                        json!({"registers": r.registers, "smem_bytes": r.smem_bytes, "spill_bytes": r.spill_stores + r.spill_loads})
                    });
                    let parts: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            json!({
                                "kernel": c.kernel,
                                "kind": c.kind.name(),
                                "tail": c.tail,
                                "grid": c.launch.grid,
                                "smem_bytes": c.launch.smem_bytes,
                                "tile": c.launch.tile.map(|t| json!({
                                    "rows": t.rows, "cols": t.cols, "k": t.k, "stages": t.stages,
                                    "mma": t.mma.map(|m| m.name()), "packed": t.packed, "splits": t.splits, "strided": t.strided,
                                })),
                                "prelude": c.launch.prelude.map(|p| json!({"reductions": p.reductions, "outputs": p.outputs})),
                            })
                        })
                        .collect();
                    json!({
                        "symbol": symbol,
                        "grid": launch_grid(calls),
                        "block": calls[0].launch.block,
                        "smem_bytes": launch_smem_bytes(calls),
                        "dynamic_smem_bytes": SharedRegion::of(calls).dynamic_bytes(),
                        "registers": calls[0].launch.registers,
                        "ptxas": ptxas,
                        "calls": parts,
                    })
                })
                .collect();
            let functions: std::collections::BTreeSet<&str> = p.kernels.iter().map(|k| k.symbol.as_str()).collect();
            json!({
                "entry": e.entry,
                "kernels": e.calls.len(),
                "functions": functions.len(),
                "scratch_bytes": e.scratch_bytes(),
                "max_smem_bytes": e.launches().map(launch_smem_bytes).max().unwrap_or(0),
                "launches": launches,
            })
        })
        .collect();
    json!({
        "compute": format!("compute_{}{}", gpu.compute_capability.0, gpu.compute_capability.1),
        "nvrtc": build.nvrtc.map(|(a, b)| format!("{a}.{b}")),
        "limits": {
            "smem_per_block": gpu.smem_per_block,
            "smem_per_block_optin": gpu.smem_per_block_optin,
            "threads_per_block": gpu.threads_per_block,
            "registers_per_sm": gpu.registers_per_sm,
        },
        "entries": entries,
    })
}
