//! The op conformance harness: every op of the IR, in every element type a target computes in, on
//! random inputs and on edge values (±0, subnormals, ±inf, NaN, values around f16's 65504, empty
//! axes), run through a backend and compared with the reference interpreter within a tolerance stated
//! per op. A backend plugs in by implementing `OpBackend`; the PJRT backend does here. The CUDA
//! backend is checked kernel by kernel instead (`check_kernels`): its unit is a plan's fused
//! kernel, not an op.

mod backends;
mod cases;
mod compare;
mod kernels;

pub use backends::{InterpBackend, PjrtBackend};
pub use cases::cases;
pub use compare::Tolerance;
pub use kernels::{check_kernels, LaunchCheck};

use anyhow::Result;
use g4c_ir::Module;
use g4c_runtime::Tensor;

/// Something that runs a one-function module (no weights) on inputs given in parameter order.
pub trait OpBackend {
    fn name(&self) -> &str;
    fn run(&mut self, module: &Module, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Whether it may compute as if float values below f32's smallest normal were zero, in its
    /// inputs and results (flush-to-zero and denormals-are-zero, as XLA's CPU and GPU backends run
    /// their arithmetic). Each output element then matches if it matches the reference run on the
    /// inputs as given or on the inputs flushed, with subnormal results taken as zeros.
    fn flushes_subnormals(&self) -> bool {
        false
    }
}

/// One op on one set of inputs: a module with a single function `@case`.
pub struct Case {
    /// e.g. `exp f16[2,9] edge`
    pub name: String,
    pub module: Module,
    pub inputs: Vec<Tensor>,
    pub tolerance: Tolerance,
}

/// Runs every case on `reference` and `backend`; returns one line per disagreement or failure.
pub fn check(reference: &mut dyn OpBackend, backend: &mut dyn OpBackend, cases: &[Case]) -> Vec<String> {
    let mut problems = vec![];
    let flush = backend.flushes_subnormals();
    for case in cases {
        let outcome = (|| -> Result<Result<(), String>> {
            let mut wants = vec![reference.run(&case.module, &case.inputs)?];
            if flush {
                let flushed: Vec<Tensor> = case.inputs.iter().map(compare::flush_subnormals).collect();
                wants.push(reference.run(&case.module, &flushed)?);
            }
            let got = backend.run(&case.module, &case.inputs)?;
            Ok(compare::outputs(&wants, &got, case.tolerance, flush))
        })();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(mismatch)) => problems.push(format!(
                "{}: {} differs from {}: {mismatch}",
                case.name,
                backend.name(),
                reference.name()
            )),
            Err(e) => problems.push(format!("{}: {e:#}", case.name)),
        }
    }
    problems
}
