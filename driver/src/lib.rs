//! The driver: everything between a front end (the `g4c` command line, the tests, the benchmarks, a
//! server) and the pipeline crates. It opens a checkpoint or an artifact for a target and a backend,
//! runs emission, verification and the target's passes, lowers and compiles through the caches, and
//! hands back a ready executor, or writes an artifact. Callers only parse flags and print.

mod compile;
pub mod conformance;
mod cuda;
mod lower;
pub mod pjrt;
mod session;
mod source;

pub use compile::{compile, emit, run_passes, CompileRequest, Compiled};
pub use cuda::{cuda_programs, kernel_plan, kernel_report, CudaBuild};
pub use lower::stablehlo_programs;
pub use session::{BackendKind, Ready, Session, SessionOptions};
pub use source::{open_checkpoint, ModelSource};

use g4c_runtime::backend::pjrt::CompileEvent;
use g4c_runtime::{Progress, Silent};

/// How the driver tells its caller about long steps while it works.
pub struct Feedback<'a> {
    /// Progress of uploads, compiles and writes.
    pub progress: &'a dyn Progress,
    /// What happened to each entry point's executable (loaded from a cache, or compiled and why).
    pub on_compile: &'a dyn Fn(&CompileEvent),
}

impl Feedback<'static> {
    pub fn silent() -> Feedback<'static> {
        Feedback { progress: &Silent, on_compile: &|_| {} }
    }
}
