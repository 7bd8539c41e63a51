//! The generation loop over the entry-point ABI (`g4c_ir::abi`): chunked, padded prefill of the
//! prompt, then one decode call per token. Backend-agnostic: anything that can call a module's entry
//! points is an `Executor`.

use crate::constraint::Constraint;
use crate::error::{invalid, Result, RuntimeError};
use crate::executor::{Executor, StepInputs, StepOutput};
use crate::penalties::change_logits;
use crate::sampling::{Sampler, SamplingParams};
use crate::tensor::Tensor;
use g4c_ir::{AttentionKind, Function, Module, ParamRole, ResultRole};
use std::time::Instant;

#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub eos_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Tokens that end generation like EOS (kept even with `ignore_eos`).
    pub stop_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Teacher forcing: token `i` is `forced[i]` whatever the logits say, to compare logits along a
    /// reference's token sequence.
    pub forced: Vec<u32>,
    /// Keep the logits each token was chosen from (`Generation::logits`). Greedy generation that
    /// neither forces tokens nor keeps logits copies back each step's greedy token alone
    /// (`StepOutput::GreedyTokens`).
    pub keep_logits: bool,
    /// For `BatchEngine`'s sequences: each token comes with its log probability and those of the
    /// `n` most likely tokens at its step (`SequenceEvent::Token`).
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits before anything reads them (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// The grammar the generated text is kept to (structured output), made for this sequence's
    /// ends (`eos_ids` and `stop_ids`).
    pub constraint: Option<Constraint>,
    /// The only tokens that may be generated (empty: any; vLLM's `allowed_token_ids`).
    pub allowed_token_ids: Vec<u32>,
    /// Token sequences the reply may not hold (vLLM's `bad_words`, tokenized).
    pub bad_words: Vec<Vec<u32>>,
    /// No end (EOS, a stop id) before this many tokens (vLLM's `min_tokens`).
    pub min_tokens: usize,
}

impl GenerateOptions {
    /// Ends a chat reply where the model ends its turn (`turn_end`, Gemma 4's `<turn|>`), as at EOS:
    /// it joins the stop ids unless `ignore_eos` lets both pass (as vLLM, whose Gemma EOS ids include it).
    pub fn end_turn_at(&mut self, turn_end: Option<u32>) {
        if !self.ignore_eos {
            self.stop_ids.extend(turn_end);
        }
    }

    /// EOS and the stop ids, EOS even where it is ignored: what `min_tokens` keeps back (as vLLM).
    pub fn eos_and_stop_ids(&self) -> Vec<u32> {
        self.eos_ids.iter().chain(&self.stop_ids).copied().collect()
    }

    /// The tokens that end the sequence: EOS unless it is ignored, and the stop ids.
    pub fn ends(&self) -> Vec<u32> {
        let eos = self.eos_ids.iter().filter(|_| !self.ignore_eos);
        eos.chain(&self.stop_ids).copied().collect()
    }

    /// Why generation ends after `token`, the `generated`-th token, when the context leaves `room`
    /// tokens to generate; `None` if it goes on.
    pub fn stop_after(&self, token: u32, generated: usize, room: usize) -> Option<StopReason> {
        if !self.ignore_eos && self.eos_ids.contains(&token) {
            Some(StopReason::Eos)
        } else if self.stop_ids.contains(&token) {
            Some(StopReason::StopId)
        } else if generated >= self.max_new_tokens {
            Some(StopReason::MaxTokens)
        } else if generated >= room {
            Some(StopReason::Context)
        } else {
            None
        }
    }

    /// What each call copies back: only the greedy tokens when they are all this generation reads.
    pub fn step_output(&self) -> StepOutput {
        match self.sampling.is_greedy()
            && !change_logits(self)
            && self.constraint.is_none()
            && self.forced.is_empty()
            && !self.keep_logits
            && self.logprobs.is_none()
        {
            true => StepOutput::GreedyTokens,
            false => StepOutput::Logits,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    StopId,
    MaxTokens,
    /// The sequence reached the last position of the context.
    Context,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::StopId => "stop_id",
            StopReason::MaxTokens => "max_tokens",
            StopReason::Context => "context",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// Row `i`: the logits from which `generated_ids[i]` was chosen (with `keep_logits`, else none).
    pub logits: Vec<Vec<f32>>,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Wall-clock time of the two phases (measured, never part of a pass/fail test).
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// All prefill calls, up to the first generated token.
    pub prefill_seconds: f64,
    /// All decode calls (one per generated token after the first).
    pub decode_seconds: f64,
}

/// Static facts about a compiled module that the loop needs, read off its entry points' roles.
#[derive(Clone, Debug)]
pub struct ModelShape {
    pub batch: usize,
    /// The prefill entry points by tokens per call, shortest first.
    pub prefills: Vec<(usize, String)>,
    /// The decode entry point.
    pub decode: String,
    pub vocab: usize,
    /// Highest number of positions a sequence may use.
    pub context: usize,
    /// Slots of each sliding-window ring cache (`None` without sliding layers): position `p` lives
    /// in slot `p mod sliding_slots` until a later position overwrites it.
    pub sliding_slots: Option<usize>,
}

/// The positions an entry point's sequences may reach: full-attention slots are never reused, so
/// their count bounds them (`None` without full-attention layers).
pub(crate) fn context_of(f: &Function) -> Option<usize> {
    f.param_with(&ParamRole::SlotPositions(AttentionKind::Full)).map(|p| f.ty(p.value).shape[1])
}

impl ModelShape {
    pub fn of(module: &Module) -> Result<ModelShape> {
        let Some(decode) = module.decode() else { return invalid("the module has no decode entry point") };
        let prefills: Vec<(usize, String)> = module.prefills().into_iter().map(|(t, f)| (t, f.name.clone())).collect();
        if prefills.is_empty() {
            return invalid("the module has no prefill entry point");
        }
        let ids = decode.param_with(&ParamRole::TokenIds).expect("a decode entry point has token ids");
        let batch = decode.ty(ids.value).shape[0];
        let logits = decode.result_with(ResultRole::Logits).map(|r| decode.ty(r.value));
        let Some([_, vocab]) = logits.and_then(|t| <[usize; 2]>::try_from(t.shape.as_slice()).ok()) else {
            let found = logits.map_or("none".to_string(), |t| t.to_string());
            return invalid(format!("the decode entry point's logits must be f32[B, V], found {found}"));
        };
        let context = context_of(decode)
            .ok_or_else(|| RuntimeError::Invalid("the module has no full-attention slot positions".into()))?;
        let sliding_slots =
            decode.param_with(&ParamRole::SlotPositions(AttentionKind::Sliding)).map(|p| decode.ty(p.value).shape[1]);
        Ok(ModelShape { batch, prefills, decode: decode.name.clone(), vocab, context, sliding_slots })
    }

    /// Whether this module can generate `new_tokens` tokens after `prompt`: a prompt of ids in the
    /// vocabulary, non-empty, that leaves room in the context unless nothing is to be generated.
    pub fn check_prompt(&self, prompt: &[u32], new_tokens: usize) -> std::result::Result<(), PromptProblem> {
        if prompt.is_empty() {
            return Err(PromptProblem::Empty);
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(PromptProblem::OutOfVocabulary { id, vocab: self.vocab });
        }
        if prompt.len() > self.context || (prompt.len() == self.context && new_tokens > 0) {
            return Err(PromptProblem::TooLong { len: prompt.len(), context: self.context });
        }
        Ok(())
    }

    /// The prefill calls for a prompt of `len` tokens: the shortest entry point that holds what is
    /// left, or the longest while even that does not; each as (entry point, its length, tokens used).
    pub fn prefill_plan(&self, len: usize) -> Vec<(&str, usize, usize)> {
        let mut plan = vec![];
        let mut left = len;
        while left > 0 {
            let (t, name) =
                self.prefills.iter().find(|(t, _)| *t >= left).unwrap_or(self.prefills.last().expect("one"));
            let used = left.min(*t);
            plan.push((name.as_str(), *t, used));
            left -= used;
        }
        plan
    }
}

/// Why a prompt cannot be generated from (`ModelShape::check_prompt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptProblem {
    Empty,
    OutOfVocabulary {
        id: u32,
        vocab: usize,
    },
    /// No room is left in the context to generate.
    TooLong {
        len: usize,
        context: usize,
    },
}

impl std::fmt::Display for PromptProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            PromptProblem::Empty => write!(f, "the prompt is empty: give at least one token id"),
            PromptProblem::OutOfVocabulary { id, vocab } => {
                write!(f, "prompt token id {id} is outside the vocabulary (0..{vocab})")
            }
            PromptProblem::TooLong { len, context } => {
                write!(f, "prompt of {len} tokens leaves no room to generate in the context of {context} positions")
            }
        }
    }
}

/// Generates up to `max_new_tokens` tokens after `prompt`, greedily unless `opts.sampling` says
/// otherwise, calling `on_token` with each as it comes; stops early where the context ends.
pub fn generate(
    exec: &mut dyn Executor,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    let shape = ModelShape::of(exec.module())?;
    if shape.batch != 1 {
        return invalid(format!("generation runs one sequence; this module has batch {}", shape.batch));
    }
    shape.check_prompt(prompt, opts.max_new_tokens).map_err(|e| RuntimeError::Invalid(e.to_string()))?;
    // Generated token i takes position prompt.len() + i, so the context holds this many.
    let room = shape.context - prompt.len();
    exec.reset()?;
    let mut gen = Generation {
        prompt_ids: prompt.to_vec(),
        generated_ids: vec![],
        logits: vec![],
        stop: StopReason::MaxTokens,
        timings: Timings::default(),
    };
    if opts.max_new_tokens == 0 {
        return Ok(gen);
    }

    let output = opts.step_output();
    let started = Instant::now();
    let mut out = prefill(exec, &shape, &[prompt], output)?;
    gen.timings.prefill_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut sampler = Sampler::new(opts, prompt);
    let mut position = prompt.len();
    loop {
        // The call `out` came from, named only for an error (no formatting in the decode loop).
        let (step, at) = (gen.generated_ids.len(), position.saturating_sub(1));
        let call = || match step {
            0 => "the prefill".to_string(),
            _ => format!("decode step {step} (position {at})"),
        };
        let token = match output {
            StepOutput::GreedyTokens => greedy_token(&out, 0, shape.vocab, call)?,
            StepOutput::Logits => {
                let logits = logits_row(&out, 0, shape.vocab, call)?;
                let token = match opts.forced.get(gen.generated_ids.len()) {
                    Some(&forced) => forced,
                    None => sampler.pick(logits)?,
                };
                if opts.keep_logits {
                    gen.logits.push(logits.to_vec());
                }
                token
            }
        };
        sampler.observe(token)?;
        gen.generated_ids.push(token);
        on_token(token);
        if let Some(stop) = opts.stop_after(token, gen.generated_ids.len(), room) {
            gen.stop = stop;
            break;
        }
        out = decode(exec, &shape, &[token], position, output)?;
        position += 1;
    }
    gen.timings.decode_seconds = started.elapsed().as_secs_f64();
    Ok(gen)
}

/// Prefills `prompts` (one per sequence of the batch, all of one length) along
/// `ModelShape::prefill_plan`, each call's tokens right-padded with position -1; returns what the
/// last call gives back (`output`) after each prompt.
pub fn prefill(exec: &mut dyn Executor, shape: &ModelShape, prompts: &[&[u32]], output: StepOutput) -> Result<Tensor> {
    let b = shape.batch;
    let len = prompts.first().map_or(0, |p| p.len());
    if prompts.len() != b || prompts.iter().any(|p| p.len() != len) || len == 0 {
        return invalid(format!("prefill takes {b} non-empty prompts of one length"));
    }
    let mut out = None;
    let mut start = 0;
    for (entry, t, n) in shape.prefill_plan(len) {
        let rows: Vec<(usize, &[u32])> = prompts.iter().map(|p| (start, &p[start..start + n])).collect();
        out = Some(exec.step(entry, &StepInputs::padded(t, &rows, true), output)?);
        start += n;
    }
    out.ok_or_else(|| RuntimeError::Invalid("empty prompt".into()))
}

/// One decode call: `tokens[b]` at `position` for every sequence of the batch; returns what the
/// call gives back (`output`).
pub fn decode(
    exec: &mut dyn Executor,
    shape: &ModelShape,
    tokens: &[u32],
    position: usize,
    output: StepOutput,
) -> Result<Tensor> {
    let rows: Vec<(usize, &[u32])> = tokens.iter().map(|t| (position, std::slice::from_ref(t))).collect();
    exec.step(&shape.decode, &StepInputs::padded(1, &rows, false), output)
}

/// Sequence `row`'s logits in a call's `f32[B, V]` logits, if every one is finite; else an error
/// naming the call (`what`), rather than a token picked from NaNs.
pub(crate) fn logits_row(logits: &Tensor, row: usize, vocab: usize, what: impl FnOnce() -> String) -> Result<&[f32]> {
    let Some(values) = logits.as_f32().and_then(|v| v.get(row * vocab..(row + 1) * vocab)) else {
        return invalid(format!("{} returned no logits for row {row}", what()));
    };
    match values.iter().position(|x| !x.is_finite()) {
        None => Ok(values),
        Some(i) => invalid(format!("the logits of {} are not finite ({} at token {i})", what(), values[i])),
    }
}

/// Sequence `row`'s token in a call's `i32[B]` greedy tokens; an error naming the call (`what`)
/// where it is -1, which marks logits that are not finite (`ResultRole::GreedyTokens`).
pub(crate) fn greedy_token(tokens: &Tensor, row: usize, vocab: usize, what: impl FnOnce() -> String) -> Result<u32> {
    match tokens.as_i32().and_then(|t| t.get(row)) {
        Some(&id) if (0..vocab as i32).contains(&id) => Ok(id as u32),
        Some(_) => invalid(format!("the logits of {} are not finite", what())),
        None => invalid(format!("{} returned no greedy token for row {row}", what())),
    }
}

#[cfg(test)]
mod tests {
    use super::ModelShape;

    #[test]
    fn prefill_plan_uses_the_shortest_entry_that_holds_the_rest() {
        let shape = ModelShape {
            batch: 1,
            prefills: vec![(4, "prefill_4".into()), (8, "prefill".into())],
            decode: "decode".into(),
            vocab: 10,
            context: 64,
            sliding_slots: None,
        };
        assert_eq!(shape.prefill_plan(3), [("prefill_4", 4, 3)]);
        assert_eq!(shape.prefill_plan(4), [("prefill_4", 4, 4)]);
        assert_eq!(shape.prefill_plan(5), [("prefill", 8, 5)]);
        assert_eq!(shape.prefill_plan(11), [("prefill", 8, 8), ("prefill_4", 4, 3)]);
        assert_eq!(shape.prefill_plan(20), [("prefill", 8, 8), ("prefill", 8, 8), ("prefill_4", 4, 4)]);
    }
}
