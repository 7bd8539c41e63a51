//! Code generation from g4c IR. `stablehlo` lowers an entry point to a StableHLO module for any PJRT
//! plugin (CPU, TPU, GPU); CUDA kernels come later.

pub mod stablehlo;

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("StableHLO codegen: @{function}: {message}")]
    Lowering { function: String, message: String },
}
