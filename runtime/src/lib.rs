//! The g4c runtime: host tensors, the reference interpreter, weight stores, the PJRT binding and its
//! executor, the executable cache and the compiler that goes through it, compiled artifacts, the
//! generation loop and the measurements behind `g4c bench`. Backends implement `Executor` (the CUDA
//! backend will too) and reuse the loop.

pub mod artifact;
pub mod bench;
pub mod cache;
pub mod compiler;
mod error;
pub mod executor;
pub mod generate;
pub mod interp;
pub mod pjrt;
mod pjrt_executor;
pub mod progress;
pub mod sampling;
pub mod tensor;
pub mod weights;

pub use compiler::{lower_module, CompileEvent, Compiler, EntryExecutable, Provenance};
pub use error::{Result, RuntimeError};
pub use executor::{Executor, InterpExecutor};
pub use g4c_ir::WeightDecl;
pub use generate::{generate, GenerateOptions, Generation, ModelShape, StopReason, Timings};
pub use interp::Interpreter;
pub use pjrt_executor::PjrtExecutor;
pub use progress::{Progress, Silent, Unit};
pub use sampling::SamplingParams;
pub use tensor::{Data, Tensor};
pub use weights::WeightStore;
