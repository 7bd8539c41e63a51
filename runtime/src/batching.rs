//! Continuous batching: up to `B` sequences generated together by one module compiled for `B` rows
//! (static shapes), each row holding one sequence with its own positions and cache slots. Sequences
//! join between calls and leave at EOS, a stop id, their token limit or the end of the context; a
//! freed row is given to the next sequence.
//!
//! Nothing here needs more than the entry-point ABI (`g4c_ir::abi`): every row carries its own
//! positions, `-1` marks a token that is not there (it writes no slot and sees nothing), and masks
//! come from the positions stored in the slots. So a row's stale cache entries, left by the sequence
//! that held it before, are invisible to the next one: a slot holding position `s` is seen from
//! position `t` only if `s <= t`, and by then the new sequence has written position `s` itself.
//!
//! Each call is either a decode (every generating row feeds its last token; free rows and rows still
//! prefilling feed padding) or a prefill chunk (prefilling rows feed their next chunk; the others
//! feed padding). While both kinds of row exist the two calls alternate, so a long prompt joining
//! delays running streams by one chunk per token and never stalls them for the whole prompt. A row's
//! chunks and the prefill entry point each goes through depend on its own prompt only (rows wanting
//! another width wait for a later call), so a row's tokens go through the same calls whatever the
//! other rows hold, and a greedy sequence comes out the same alone or beside others.
//!
//! **Prefix reuse.** A row keeps the tokens its caches hold after its sequence leaves. A new sequence
//! goes to the free row whose cached tokens share the longest prefix with its prompt and prefills
//! only the rest, as vLLM's prefix caching and llama-server's slot reuse do. Full-attention slots are
//! never overwritten by another position, but a sliding-window ring holds only its last
//! `sliding_slots` positions, so the engine keeps a copy of which position each ring slot holds and
//! reuses a prefix only when every position the next query can see is still there.

use crate::error::{invalid, Result, RuntimeError};
use crate::executor::{Executor, StepInputs, StepOutput};
use crate::generate::{greedy_token, logits_row, GenerateOptions, ModelShape, StopReason};
use crate::logprobs::TokenLogprobs;
use crate::sampling::Sampler;
use crate::tensor::Tensor;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A sequence to generate: its prompt and how to generate (`forced` must be empty).
#[derive(Clone, Debug)]
pub struct SequenceRequest {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
}

/// What the engine tells whoever asked for a sequence, in this order: `Admitted`, then `Token`s, then
/// `Finished` or `Failed`.
#[derive(Clone, Debug, PartialEq)]
pub enum SequenceEvent {
    /// The sequence has row `row`; the first `cached_tokens` tokens of its prompt were found in the
    /// row's caches and are not prefilled again.
    Admitted {
        row: usize,
        cached_tokens: usize,
    },
    /// A generated token, with its log probabilities when the sequence asked for them.
    Token(u32, Option<TokenLogprobs>),
    Finished(StopReason),
    /// The sequence ended because of an error (its own non-finite logits, or a failed call).
    Failed(String),
}

/// Where a sequence's events go.
pub trait SequenceSink: Send {
    /// Delivers `event`; `false` if whoever asked is gone (the sequence then leaves its row).
    fn send(&mut self, event: SequenceEvent) -> bool;
    /// Whether whoever asked is gone (checked before every call).
    fn is_gone(&self) -> bool;
}

/// The two kinds of call a step makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    Prefill,
    Decode,
}

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepReport {
    pub call: CallKind,
    /// Rows holding a sequence during the call.
    pub occupied: usize,
    /// Tokens the call ran that were not padding.
    pub tokens: usize,
}

struct Sequence {
    prompt: Vec<u32>,
    options: GenerateOptions,
    sampler: Sampler,
    generated: Vec<u32>,
    sink: Box<dyn SequenceSink>,
}

impl Sequence {
    /// Whether its whole prompt is in the row's caches (it is generating).
    fn prefilled(&self, row_cached: usize) -> bool {
        row_cached >= self.prompt.len()
    }
}

struct Row {
    /// The tokens whose keys and values this row's caches hold, at positions `0..cached.len()`.
    cached: Vec<u32>,
    /// The position each slot of the row's sliding rings holds (`-1`: none), as the module's
    /// `slot_positions(sliding)` state has it: position `p` is still there iff `ring[p % len] == p`.
    ring: Vec<i64>,
    sequence: Option<Sequence>,
    /// The step at which its last sequence left, to give away the least recently used row first.
    freed_at: u64,
}

pub struct BatchEngine {
    exec: Box<dyn Executor>,
    shape: ModelShape,
    /// The sliding layers' window: how far back a query sees.
    window: usize,
    rows: Vec<Row>,
    steps: u64,
    last_call: Option<CallKind>,
}

impl BatchEngine {
    /// An engine over `exec` (its module compiled for `B` rows), for a model whose sliding layers
    /// see `sliding_window` positions.
    pub fn new(mut exec: Box<dyn Executor>, sliding_window: usize) -> Result<BatchEngine> {
        let shape = ModelShape::of(exec.module())?;
        exec.reset()?;
        let slots = shape.sliding_slots.unwrap_or(0);
        let rows = (0..shape.batch)
            .map(|_| Row { cached: vec![], ring: vec![-1; slots], sequence: None, freed_at: 0 })
            .collect();
        Ok(BatchEngine { exec, shape, window: sliding_window, rows, steps: 0, last_call: None })
    }

    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// Rows holding a sequence.
    pub fn occupied(&self) -> usize {
        self.rows.iter().filter(|r| r.sequence.is_some()).count()
    }

    /// Whether a sequence can be admitted now.
    pub fn has_free_row(&self) -> bool {
        self.rows.iter().any(|r| r.sequence.is_none())
    }

    /// Whether `request` can be generated by this module: a non-empty prompt of ids in the
    /// vocabulary that leaves room in the context to generate.
    pub fn check(&self, request: &SequenceRequest) -> Result<()> {
        if request.options.max_new_tokens == 0 {
            return invalid("a sequence must ask for at least one token");
        }
        if !request.options.forced.is_empty() {
            return invalid("batched generation does not force tokens");
        }
        let problem = self.shape.check_prompt(&request.prompt, request.options.max_new_tokens);
        problem.map_err(|e| RuntimeError::Invalid(e.to_string()))
    }

    /// Gives `request` a free row (the one whose caches hold the longest usable prefix of its prompt,
    /// else the least recently used, else the first); its events go to `sink`. Refused, with `Failed`
    /// sent to the sink too, if it fails `check` or no row is free.
    pub fn admit(&mut self, request: SequenceRequest, mut sink: Box<dyn SequenceSink>) -> Result<usize> {
        let best = (0..self.rows.len())
            .filter(|&i| self.rows[i].sequence.is_none())
            .map(|i| (i, self.reusable(&self.rows[i], &request.prompt)))
            .min_by_key(|&(i, reuse)| (std::cmp::Reverse(reuse), self.rows[i].freed_at));
        let (index, reused) = match (self.check(&request), best) {
            (Ok(()), Some(best)) => best,
            (checked, _) => {
                let e = checked.err().unwrap_or_else(|| RuntimeError::Invalid("every row holds a sequence".into()));
                sink.send(SequenceEvent::Failed(e.to_string()));
                return Err(e);
            }
        };
        let row = &mut self.rows[index];
        row.cached.truncate(reused);
        if !sink.send(SequenceEvent::Admitted { row: index, cached_tokens: reused }) {
            return Ok(index);
        }
        row.sequence = Some(Sequence {
            sampler: Sampler::new(&request.options, &request.prompt),
            prompt: request.prompt,
            options: request.options,
            generated: vec![],
            sink,
        });
        Ok(index)
    }

    /// How many leading tokens of `prompt` `row`'s caches hold and can serve: the common prefix,
    /// less the prompt's last token (run again for its logits), and none if a sliding ring no longer
    /// holds every position the first new query sees.
    fn reusable(&self, row: &Row, prompt: &[u32]) -> usize {
        let common = row.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let reuse = common.min(prompt.len().saturating_sub(1));
        // The query at position `reuse` sees positions `reuse + 1 - window ..= reuse`.
        let seen = (reuse + 1).saturating_sub(self.window)..reuse;
        match row.ring.len() {
            0 => reuse,
            slots if seen.clone().all(|p| row.ring[p % slots] == p as i64) => reuse,
            _ => 0,
        }
    }

    /// Runs one call for the rows that have work, and delivers what it produced; `None` if no row
    /// holds a sequence. A failed call ends every sequence in it with `Failed` and empties all caches;
    /// the engine itself goes on (it returns an error only if the executor cannot even be reset).
    pub fn step(&mut self) -> Result<Option<StepReport>> {
        self.steps += 1;
        for index in 0..self.rows.len() {
            if self.rows[index].sequence.as_ref().is_some_and(|s| s.sink.is_gone()) {
                self.free(index);
            }
        }
        let prefilling = self.rows.iter().any(|r| r.sequence.as_ref().is_some_and(|s| !s.prefilled(r.cached.len())));
        let generating = self.rows.iter().any(|r| r.sequence.as_ref().is_some_and(|s| s.prefilled(r.cached.len())));
        let call = match (prefilling, generating) {
            (false, false) => return Ok(None),
            (true, true) if self.last_call == Some(CallKind::Prefill) => CallKind::Decode,
            (true, _) => CallKind::Prefill,
            (false, true) => CallKind::Decode,
        };
        self.last_call = Some(call);
        let occupied = self.occupied();
        let plan = match call {
            CallKind::Prefill => self.prefill_plan(),
            CallKind::Decode => self.decode_plan(),
        };
        let report = StepReport { call, occupied, tokens: plan.fed.iter().map(|f| f.tokens.len()).sum() };
        // Only greedy tokens come back when they are all that every sequence reads.
        let greedy = |s: &Sequence| s.options.step_output() == StepOutput::GreedyTokens;
        let output = match self.rows.iter().filter_map(|r| r.sequence.as_ref()).all(greedy) {
            true => StepOutput::GreedyTokens,
            false => StepOutput::Logits,
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| self.exec.step(&plan.entry, &plan.inputs, output)));
        match outcome {
            Ok(Ok(out)) => self.deliver(&plan, &out, output)?,
            Ok(Err(e)) => self.fail_all(e.to_string())?,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                self.fail_all(format!("the executor panicked: {what}"))?
            }
        }
        Ok(Some(report))
    }

    /// The next chunk of the prefilling rows that want the same prefill entry point as the first
    /// of them: each row wants the shortest that holds the rest of its prompt, else the longest.
    fn prefill_plan(&self) -> Plan {
        let prefills = &self.shape.prefills;
        let width = |r: &Row| {
            let s = r.sequence.as_ref().filter(|s| !s.prefilled(r.cached.len()))?;
            let left = s.prompt.len() - r.cached.len();
            Some(prefills.iter().position(|(t, _)| *t >= left).unwrap_or(prefills.len() - 1))
        };
        let chosen = self.rows.iter().find_map(width).expect("a prefilling row");
        let (t, entry) = &prefills[chosen];
        let fed = self
            .rows
            .iter()
            .map(|r| match &r.sequence {
                Some(s) if width(r) == Some(chosen) => {
                    let start = r.cached.len();
                    Fed { start, tokens: s.prompt[start..(start + *t).min(s.prompt.len())].to_vec() }
                }
                _ => Fed::nothing(),
            })
            .collect();
        Plan::new(entry, *t, fed, true)
    }

    /// The last token of every generating row.
    fn decode_plan(&self) -> Plan {
        let fed = self
            .rows
            .iter()
            .map(|r| match &r.sequence {
                Some(s) if s.prefilled(r.cached.len()) => {
                    let last = *s.generated.last().expect("a generating sequence has a token");
                    Fed { start: r.cached.len(), tokens: vec![last] }
                }
                _ => Fed::nothing(),
            })
            .collect();
        Plan::new(&self.shape.decode, 1, fed, false)
    }

    /// Records what `plan` wrote into each row's caches, then picks the next token of every row
    /// whose logits the call produced (a row that finished its prompt, or a generating row) from
    /// what the call gave back (`output`). A row whose logits are not finite ends its sequence with
    /// `Failed` and has its caches emptied: they may hold NaN, which the zero weight of a masked slot
    /// does not cancel (0 × NaN).
    fn deliver(&mut self, plan: &Plan, out: &Tensor, output: StepOutput) -> Result<()> {
        let vocab = self.shape.vocab;
        let context = self.shape.context;
        let mut spoiled = vec![];
        for (index, fed) in plan.fed.iter().enumerate() {
            if fed.tokens.is_empty() {
                continue;
            }
            let row = &mut self.rows[index];
            row.cached.extend_from_slice(&fed.tokens);
            let slots = row.ring.len();
            for p in (fed.start..fed.start + fed.tokens.len()).filter(|_| slots > 0) {
                row.ring[p % slots] = p as i64;
            }
            let Some(seq) = row.sequence.as_mut() else { continue };
            if !seq.prefilled(row.cached.len()) {
                continue;
            }
            let what = || format!("row {index} at position {}", row.cached.len() - 1);
            // Logits that are not finite spoil the row's caches; a grammar's failure ends the sequence
            // alone, its caches kept for the next prompt that shares them.
            let picked = match output {
                StepOutput::GreedyTokens => {
                    greedy_token(out, index, vocab, what).map(|token| (token, None)).map_err(|e| (e, true))
                }
                StepOutput::Logits => match logits_row(out, index, vocab, what) {
                    Ok(logits) => seq
                        .sampler
                        .pick(logits)
                        .map_err(|e| (e, false))
                        .map(|token| (token, seq.options.logprobs.map(|n| TokenLogprobs::of(logits, token, n)))),
                    Err(e) => Err((e, true)),
                },
            };
            let picked = picked.and_then(|(token, logprobs)| match seq.sampler.observe(token) {
                Ok(()) => Ok((token, logprobs)),
                Err(e) => Err((e, false)),
            });
            let (token, logprobs) = match picked {
                Ok(picked) => picked,
                Err((e, spoils)) => {
                    seq.sink.send(SequenceEvent::Failed(e.to_string()));
                    self.free(index);
                    if spoils {
                        spoiled.push(index);
                    }
                    continue;
                }
            };
            seq.generated.push(token);
            let room = context - seq.prompt.len();
            let stop = seq.options.stop_after(token, seq.generated.len(), room);
            let delivered = seq.sink.send(SequenceEvent::Token(token, logprobs));
            if let Some(stop) = stop.filter(|_| delivered) {
                seq.sink.send(SequenceEvent::Finished(stop));
            }
            if stop.is_some() || !delivered {
                self.free(index);
            }
        }
        for index in spoiled {
            if let Err(e) = self.empty_row(index) {
                return self.fail_all(format!("emptying row {index}'s caches failed: {e}"));
            }
        }
        Ok(())
    }

    fn empty_row(&mut self, index: usize) -> Result<()> {
        let row = &mut self.rows[index];
        row.cached.clear();
        row.ring.fill(-1);
        self.exec.reset_row(index)
    }

    fn free(&mut self, index: usize) {
        let row = &mut self.rows[index];
        row.sequence = None;
        row.freed_at = self.steps;
    }

    /// Ends every sequence with `message` and empties every cache.
    fn fail_all(&mut self, message: String) -> Result<()> {
        for row in &mut self.rows {
            if let Some(mut seq) = row.sequence.take() {
                seq.sink.send(SequenceEvent::Failed(message.clone()));
            }
        }
        self.empty_caches().map_err(|e| RuntimeError::Invalid(format!("{message}; then {e}")))
    }

    fn empty_caches(&mut self) -> Result<()> {
        for row in &mut self.rows {
            row.cached.clear();
            row.ring.fill(-1);
        }
        self.exec.reset().map_err(|e| RuntimeError::Invalid(format!("resetting the caches failed: {e}")))
    }
}

/// What one row feeds a call: `tokens` at positions `start..`.
struct Fed {
    start: usize,
    tokens: Vec<u32>,
}

impl Fed {
    fn nothing() -> Fed {
        Fed { start: 0, tokens: vec![] }
    }
}

/// One call: the entry point, its inputs, and what each row fed it.
struct Plan {
    entry: String,
    inputs: StepInputs,
    fed: Vec<Fed>,
}

impl Plan {
    /// `t` tokens per row; a prefill also says which token's logits each row wants.
    fn new(entry: &str, t: usize, fed: Vec<Fed>, prefill: bool) -> Plan {
        let rows: Vec<(usize, &[u32])> = fed.iter().map(|f| (f.start, f.tokens.as_slice())).collect();
        let inputs = StepInputs::padded(t, &rows, prefill);
        Plan { entry: entry.to_string(), inputs, fed }
    }
}
