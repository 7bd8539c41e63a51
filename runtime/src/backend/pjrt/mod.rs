//! The PJRT backend: StableHLO (from codegen, through the driver) compiled by a PJRT plugin, through
//! the executable cache, and run with weights and state in device buffers.

mod binding;
mod compiler;
mod environment;
mod executor;
#[allow(clippy::all)]
mod sys;

pub use binding::{find_cpu_plugin, Api, Buffer, Client, Executable, COMPILE_OPTIONS};
pub use compiler::{CompileEvent, Compiler, EntryExecutable, Provenance};
pub use environment::environment;
pub use executor::PjrtExecutor;

/// The artifact directory and file extension of PJRT programs (StableHLO text).
pub const PROGRAM_FORMAT: crate::artifact::ProgramFormat =
    crate::artifact::ProgramFormat { backend: "pjrt", dir: "stablehlo", extension: "mlir" };
