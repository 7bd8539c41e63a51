//! g4c's integration tests: one binary, one module per topic.

mod common;

mod artifacts;
mod batching;
mod cache;
mod cli;
mod compile;
mod config;
mod conformance;
mod cuda;
mod eval;
mod filetests;
mod frontend_errors;
mod fuzz;
mod goldens;
mod greedy;
mod hardening;
mod interp_ops;
mod ir_text;
mod passes;
mod penalties;
mod plan;
mod properties;
mod quantize;
mod serve;
mod snapshots;
mod structured;
mod synth;
mod verifier;
