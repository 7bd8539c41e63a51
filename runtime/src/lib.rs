//! The g4c runtime: host tensors, weight stores, the backend-neutral executor interface over the
//! entry-point ABI, the backends behind it (the reference interpreter, PJRT, a kernel plan run by
//! the interpreter, and CUDA: on a GPU or in the host emulator), the executable cache, compiled
//! artifacts, the generation loop with sampling and log probabilities, continuous batching, and the
//! measurements behind `g4c bench`. It does
//! not lower IR: the programs a backend compiles come from codegen, through the driver.

pub mod artifact;
pub mod backend;
pub mod batching;
pub mod bench;
pub mod cache;
pub mod constraint;
mod error;
pub mod eval;
pub mod executor;
pub mod generate;
pub mod logprobs;
pub mod penalties;
pub mod progress;
pub mod quantize;
pub mod sampling;
pub mod tensor;
pub mod weights;

pub use backend::interp::{InterpExecutor, Interpreter};
pub use backend::Program;
pub use batching::{BatchEngine, SequenceEvent, SequenceRequest, SequenceSink};
pub use error::{Result, RuntimeError};
pub use executor::{Executor, StepInputs, StepOutput};
pub use g4c_ir::WeightDecl;
pub use generate::{generate, GenerateOptions, Generation, ModelShape, PromptProblem, StopReason, Timings};
pub use logprobs::TokenLogprobs;
pub use progress::{Progress, Silent, Unit};
pub use sampling::SamplingParams;
pub use tensor::{Data, Tensor};
pub use weights::{NoWeights, WeightStore};
