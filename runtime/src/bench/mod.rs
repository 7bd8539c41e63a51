//! Measurements for `g4c bench`: one timed prefill-then-decode run, the decode roofline, and a host
//! memory-bandwidth probe. Timing stays out of pass/fail tests.

mod bandwidth;
mod traffic;

pub use bandwidth::read_bandwidth;
pub use traffic::{CallTraffic, DecodeTraffic, PlanTraffic};

use crate::error::Result;
use crate::executor::{Executor, StepOutput};
use crate::generate::{decode, greedy_token, prefill, ModelShape};
use crate::tensor::Tensor;
use std::time::Instant;

/// One run: a prompt of `prompt_len` tokens per sequence, then `gen` tokens.
#[derive(Clone, Copy, Debug)]
pub struct BenchRun {
    pub batch: usize,
    pub prompt_len: usize,
    /// Prefill up to the first token's logits (the time to first token).
    pub prefill_seconds: f64,
    pub decode_steps: usize,
    pub decode_seconds: f64,
}

impl BenchRun {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        (self.batch * self.prompt_len) as f64 / self.prefill_seconds
    }

    pub fn decode_tokens_per_second(&self) -> f64 {
        (self.batch * self.decode_steps) as f64 / self.decode_seconds
    }
}

/// Runs a prompt of deterministic pseudo-random tokens through prefill, then `gen − 1` decode steps,
/// each fed the previous step's greedy token (read back as greedy generation reads it: the ids alone).
pub fn run_once(exec: &mut dyn Executor, prompt_len: usize, gen: usize, seed: u64) -> Result<BenchRun> {
    let shape = ModelShape::of(exec.module())?;
    if prompt_len == 0 || prompt_len + gen > shape.context {
        return Err(crate::RuntimeError::Invalid(format!(
            "a prompt of {prompt_len} tokens plus {gen} generated must fit the context of {} (and be non-empty)",
            shape.context
        )));
    }
    let prompts: Vec<Vec<u32>> = (0..shape.batch).map(|b| tokens(prompt_len, shape.vocab, seed + b as u64)).collect();
    let rows: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    exec.reset()?;
    let started = Instant::now();
    let out = prefill(exec, &shape, &rows, StepOutput::GreedyTokens)?;
    let mut next = greedy_tokens(&out, &shape, || "the prefill".into())?;
    let prefill_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let decode_steps = gen.saturating_sub(1);
    for step in 0..decode_steps {
        let out = decode(exec, &shape, &next, prompt_len + step, StepOutput::GreedyTokens)?;
        next = greedy_tokens(&out, &shape, || format!("decode step {}", step + 1))?;
    }
    let decode_seconds = started.elapsed().as_secs_f64();
    Ok(BenchRun { batch: shape.batch, prompt_len, prefill_seconds, decode_steps, decode_seconds })
}

/// Token ids from a small linear congruential generator, away from the special ids at the bottom.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (4 + (x >> 33) % (vocab.max(5) as u64 - 4)) as u32
        })
        .collect()
}

/// Every sequence's greedy token, as a call returned them (`what` names the call).
fn greedy_tokens(out: &Tensor, shape: &ModelShape, what: impl Fn() -> String) -> Result<Vec<u32>> {
    (0..shape.batch).map(|row| greedy_token(out, row, shape.vocab, &what)).collect()
}
