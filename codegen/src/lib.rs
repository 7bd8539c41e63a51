//! Code generation from g4c IR. `stablehlo` lowers an entry point to a StableHLO module for any PJRT
//! plugin (CPU, TPU, GPU); `cuda` emits a kernel plan's kernels as CUDA C and compiles them to PTX
//! and cubins without a GPU.

pub mod cuda;
pub mod stablehlo;

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("StableHLO codegen: @{function}: {message}")]
    Lowering { function: String, message: String },
}
