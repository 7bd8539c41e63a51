//! The backends, side by side behind `Executor`: the reference interpreter, PJRT, and a CUDA kernel
//! plan run on the CPU (`plan`). A backend takes
//! a module after its target's passes and runs its entry points; what it needs to be compiled (the
//! StableHLO of the PJRT backend) comes from codegen through the driver.

pub mod cuda;
pub mod interp;
pub mod pjrt;
pub mod plan;

/// What a backend compiles for one entry point: its program text (PJRT: StableHLO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    pub entry: String,
    pub text: String,
}
