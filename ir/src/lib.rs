//! The g4c IR: a small typed SSA form for statically shaped tensor programs.
//!
//! A [`Module`] holds named checkpoint weights and entry-point [`Function`]s (`prefill` or
//! `prefill_{T}` per prefill length, `decode`, and `eval`'s `score`).
//! State that outlives a call (KV caches and the absolute position stored in every cache slot) is
//! explicit: a state parameter in, a result of the same name out; every parameter and result has a
//! role (`abi`) that says what it carries. The text form round-trips
//! exactly (`print_module(parse_module(t)?) == t` for printed `t`), so tests can be written as text.

pub mod abi;
mod builder;
mod dtype;
mod function;
mod infer;
mod named_enum;
mod op;
mod parse;
pub mod plan;
mod print;
pub mod scalar;
mod substitution;
pub mod target;
mod types;
mod verify;
mod weight;

pub use abi::{AttentionKind, CallArg, EntryKind, KvPart, ParamRole, ResultRole};
pub use builder::{common_shape, FunctionBuilder};
pub use dtype::DType;
pub use function::{FuncResult, Function, Instr, Module, Param, ValueData, ValueId};
pub use infer::infer_type;
pub use op::{Attr, BinaryOp, CompareDir, DotDims, Literal, Op, ReduceKind, UnaryOp};
pub use parse::{parse_module, ParseError};
pub use print::{fmt_f64, print_function, print_module, ValueNames};
pub use substitution::Substitution;
pub use target::{GpuLimits, MmaShape, Platform, Target, TARGETS};
pub use types::TensorType;
pub use verify::{verify_function, verify_module, VerifyError};
pub use weight::{quantized_names, SourceLayout, WeightDecl};
