//! CUDA code generation for a kernel plan: CUDA C per kernel call, a device function (`kernel`, over
//! the `elemental` emitter), and a kernel per launch calling them on its blocks; one translation
//! unit per entry point with identical kernels emitted once, compiled to
//! PTX by NVRTC (`nvrtc`) for the target's `compute_XY` and to cubins by `ptxas` (`ptxas`), which
//! also reports each kernel's registers, shared memory and spills. None of it needs a GPU.

mod elemental;
mod kernel;
mod loops;
mod nvrtc;
mod ptxas;
mod shared;

pub use nvrtc::{compile_ptx, nvrtc_path, nvrtc_version};
pub use ptxas::{assemble, find_ptxas, Cubin, KernelResources};

use g4c_ir::plan::{EntryPlan, KernelPlan};
use g4c_ir::{DType, Target};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA codegen: {0} is not supported")]
    Unsupported(String),
    #[error("CUDA codegen: kernel {kernel}: {message}")]
    Kernel { kernel: String, message: String },
    #[error("NVRTC was not found (expected {0}); run scripts/setup, which installs it into .venv, or set G4C_NVRTC to libnvrtc.so.12")]
    NoNvrtc(String),
    #[error("NVRTC failed to compile {what} for {arch}: {log}")]
    Nvrtc { what: String, arch: String, log: String },
    #[error("ptxas was not found (expected {0}); run scripts/setup, which installs it into .venv, or set G4C_PTXAS")]
    NoPtxas(String),
    #[error("ptxas failed for {arch}: {message}")]
    Ptxas { arch: String, message: String },
}

/// How a plan kernel is launched from a program: the symbol of its launch (which the calls run side
/// by side in it share) and the weights it takes after its inputs (then its output, unless it
/// writes an input in place); a launch takes its calls' arguments one after the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSymbol {
    pub kernel: String,
    pub symbol: String,
    pub weights: Vec<String>,
}

/// The CUDA C of one entry point's kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaProgram {
    pub entry: String,
    pub source: String,
    /// One per kernel call of the entry's plan, in order.
    pub kernels: Vec<KernelSymbol>,
    /// Distinct kernels in `source` (launches of layers alike share one).
    pub functions: usize,
}

const PRELUDE: &str = include_str!("prelude.cu");

/// The CUDA C of every launch of `entry`, a kernel each; a kernel whose code equals an earlier
/// one's (the same layer shapes) is emitted once.
pub fn emit_entry(plan: &KernelPlan, entry: &EntryPlan) -> Result<CudaProgram, CudaError> {
    let mut source = format!("// g4c kernels of @{} for {}\n{PRELUDE}\n", entry.entry, plan.target);
    let target = Target::by_name(plan.target).map_err(CudaError::Unsupported)?;
    let bf16_math = target.computes_natively(DType::BF16);
    let gpu =
        target.gpu.as_ref().ok_or_else(|| CudaError::Unsupported(format!("target {}, not a GPU,", plan.target)))?;
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut kernels = Vec::new();
    for calls in entry.launches() {
        let parts = calls
            .iter()
            .enumerate()
            .map(|(n, call)| {
                let k = plan.kernels.function(&call.kernel).expect("a plan's kernels are in its module");
                kernel::kernel_code(k, call, &format!("{}_{n}", kernel::NAME), bf16_math)
                    .map_err(|e| CudaError::Kernel { kernel: call.kernel.clone(), message: e.to_string() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let code = kernel::launch_code(calls, &parts, gpu.registers_per_sm);
        let symbol = match seen.get(&code) {
            Some(s) => s.clone(),
            None => {
                let hash = blake3::hash(code.as_bytes()).to_hex();
                let kinds: Vec<&str> = calls.iter().map(|c| c.kind.name()).collect();
                let symbol = format!("g4c_{}_{}", kinds.join("_"), &hash[..12]);
                source.push_str(&code.replace(kernel::NAME, &symbol));
                source.push('\n');
                seen.insert(code, symbol.clone());
                symbol
            }
        };
        for (call, part) in calls.iter().zip(parts) {
            kernels.push(KernelSymbol { kernel: call.kernel.clone(), symbol: symbol.clone(), weights: part.weights });
        }
    }
    Ok(CudaProgram { entry: entry.entry.clone(), source, kernels, functions: seen.len() })
}
