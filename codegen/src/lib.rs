//! Code generation from g4c IR: StableHLO for XLA/PJRT (next), fused CUDA kernels (later).
//! Nothing lives here yet; the crate exists so the workspace already shows the pipeline.
