//! What changes the logits before the sampler (or the greedy pick) reads them, in vLLM's order:
//! - **allowed tokens** (vLLM's `allowed_token_ids`): every other token's logit is -inf;
//! - **bad words** (vLLM's `bad_words`, as token sequences): a sequence's last token has -inf where
//!   the reply ends with the rest of it (a one-token word: always);
//! - **a least number of tokens** (vLLM's `min_tokens`): until the reply has that many, EOS (even
//!   where ignored) and the stop ids have -inf;
//! - **logit bias** (OpenAI's `logit_bias`): added to chosen tokens' logits (vLLM applies these three
//!   as logits processors, before the penalties);
//!
//! then penalties on tokens the sequence has already seen, as vLLM's `apply_penalties`:
//! - **repetition** (vLLM's `repetition_penalty`, transformers' `RepetitionPenaltyLogitsProcessor`):
//!   a token of the prompt or the reply has a positive logit divided by it, a negative one multiplied;
//! - **frequency** (OpenAI's `frequency_penalty`): subtracted once per time the reply holds the token;
//! - **presence** (OpenAI's `presence_penalty`): subtracted once if the reply holds the token.

use crate::generate::GenerateOptions;
use std::collections::{BTreeMap, BTreeSet};

/// Whether `options` change any logit; if none does, a greedy pick is the largest of the logits as
/// the model gives them (which a device's greedy token is).
pub fn change_logits(options: &GenerateOptions) -> bool {
    let params = &options.sampling;
    !options.allowed_token_ids.is_empty()
        || !options.bad_words.is_empty()
        || options.min_tokens > 0
        || !options.logit_bias.is_empty()
        || params.repetition_penalty != 1.0
        || params.frequency_penalty != 0.0
        || params.presence_penalty != 0.0
}

pub struct Penalties {
    /// Whether anything changes logits (`change_logits`).
    active: bool,
    /// The only tokens that may be picked, sorted (none: all).
    allowed: Vec<u32>,
    /// Token sequences the reply may not hold.
    bad_words: Vec<Vec<u32>>,
    /// EOS and the stop ids, kept from the reply until it has `min_tokens`.
    ends: Vec<u32>,
    min_tokens: usize,
    /// Token ids and what is added to their logits.
    bias: Vec<(u32, f32)>,
    repetition: f32,
    frequency: f32,
    presence: f32,
    /// The prompt's distinct tokens (read by the repetition penalty only).
    prompt: BTreeSet<u32>,
    /// How many times the reply holds each token so far.
    reply: BTreeMap<u32, u32>,
    /// The reply so far (kept where bad words need it; else only counted).
    history: Vec<u32>,
    generated: usize,
}

impl Penalties {
    /// What `options` ask for, on a sequence that starts with `prompt`.
    pub fn new(options: &GenerateOptions, prompt: &[u32]) -> Penalties {
        let params = &options.sampling;
        let repetition = params.repetition_penalty;
        Penalties {
            active: change_logits(options),
            allowed: {
                let mut allowed = options.allowed_token_ids.clone();
                allowed.sort_unstable();
                allowed.dedup();
                allowed
            },
            bad_words: options.bad_words.iter().filter(|w| !w.is_empty()).cloned().collect(),
            ends: options.eos_and_stop_ids(),
            min_tokens: options.min_tokens,
            bias: options.logit_bias.clone(),
            repetition,
            frequency: params.frequency_penalty,
            presence: params.presence_penalty,
            prompt: if repetition != 1.0 { prompt.iter().copied().collect() } else { BTreeSet::new() },
            reply: BTreeMap::new(),
            history: Vec::new(),
            generated: 0,
        }
    }

    /// Whether anything changes logits.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Counts `token`, the reply's next token.
    pub fn observe(&mut self, token: u32) {
        if self.is_active() {
            *self.reply.entry(token).or_default() += 1;
            self.generated += 1;
            if !self.bad_words.is_empty() {
                self.history.push(token);
            }
        }
    }

    /// Applies the bias and penalties to `logits`, one row of the vocabulary (ids past its end are
    /// let be).
    pub fn apply(&self, logits: &mut [f32]) {
        if !self.allowed.is_empty() {
            // `allowed` is sorted: one pass, nothing allocated per token.
            let mut next = self.allowed.iter().peekable();
            for (id, logit) in logits.iter_mut().enumerate() {
                if next.next_if(|&&a| a as usize == id).is_none() {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        for word in &self.bad_words {
            let (last, before) = word.split_last().expect("bad words are not empty");
            if self.history.ends_with(before) {
                if let Some(l) = logits.get_mut(*last as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if self.generated < self.min_tokens {
            for &id in &self.ends {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &(id, bias) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.repetition != 1.0 {
            for &id in self.prompt.iter().chain(self.reply.keys().filter(|id| !self.prompt.contains(id))) {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / self.repetition } else { *l * self.repetition };
                }
            }
        }
        for (&id, &count) in &self.reply {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= self.frequency * count as f32 + self.presence;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Penalties;
    use crate::generate::GenerateOptions;
    use crate::sampling::SamplingParams;

    fn penalties(repetition: f32, frequency: f32, presence: f32, prompt: &[u32]) -> Penalties {
        let sampling = SamplingParams {
            repetition_penalty: repetition,
            frequency_penalty: frequency,
            presence_penalty: presence,
            ..Default::default()
        };
        Penalties::new(&GenerateOptions { sampling, ..Default::default() }, prompt)
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens() {
        let mut p = penalties(2.0, 0.0, 0.0, &[0, 1, 1]);
        p.observe(3);
        p.observe(3);
        let mut logits = [4.0, -4.0, 4.0, -1.0, 0.0];
        p.apply(&mut logits);
        assert_eq!(logits, [2.0, -8.0, 4.0, -2.0, 0.0], "once per token, however often seen");
    }

    #[test]
    fn frequency_and_presence_count_the_reply_only() {
        let mut p = penalties(1.0, 0.5, 1.0, &[0]);
        for t in [2, 2, 2, 4] {
            p.observe(t);
        }
        let mut logits = [1.0; 5];
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, 1.0, -1.5, 1.0, -0.5]);
    }

    #[test]
    fn the_bias_is_added_before_the_repetition_penalty_divides() {
        let options = GenerateOptions {
            sampling: SamplingParams { repetition_penalty: 2.0, ..Default::default() },
            logit_bias: vec![(0, 3.0), (2, -1.0)],
            ..Default::default()
        };
        let mut p = Penalties::new(&options, &[0]);
        assert!(p.is_active());
        p.observe(2);
        let mut logits = [1.0, 1.0, 0.5];
        p.apply(&mut logits);
        assert_eq!(logits, [2.0, 1.0, -1.0]);
    }

    #[test]
    fn no_penalty_changes_nothing_and_ids_past_the_vocabulary_are_let_be() {
        let mut p = penalties(1.0, 0.0, 0.0, &[0, 1]);
        assert!(!p.is_active());
        p.observe(1);
        let mut logits = [1.0, -1.0];
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, -1.0]);
        let mut p = penalties(1.5, 1.0, 1.0, &[7]);
        p.observe(9);
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, -1.0]);
    }

    #[test]
    fn a_bad_words_last_token_is_banned_where_the_reply_ends_with_the_rest() {
        let options = GenerateOptions { bad_words: vec![vec![4], vec![1, 2], vec![1, 2, 3]], ..Default::default() };
        let mut p = Penalties::new(&options, &[1, 2]);
        let inf = f32::NEG_INFINITY;
        let apply = |p: &Penalties| {
            let mut logits = [0.0; 5];
            p.apply(&mut logits);
            logits
        };
        assert_eq!(apply(&p), [0.0, 0.0, 0.0, 0.0, inf], "the prompt's `1 2` is not the reply's");
        p.observe(1);
        assert_eq!(apply(&p), [0.0, 0.0, inf, 0.0, inf]);
        p.observe(2);
        assert_eq!(apply(&p), [0.0, 0.0, 0.0, inf, inf]);
    }

    #[test]
    fn only_allowed_tokens_and_no_end_before_the_least_number_of_tokens() {
        let options = GenerateOptions {
            allowed_token_ids: vec![9, 3, 0, 1, 3],
            min_tokens: 2,
            eos_ids: vec![1],
            stop_ids: vec![3],
            ..Default::default()
        };
        let mut p = Penalties::new(&options, &[]);
        let inf = f32::NEG_INFINITY;
        let mut logits = [1.0, 2.0, 3.0, 4.0, 5.0];
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, inf, inf, inf, inf], "EOS and the stop id wait; 2 and 4 are not allowed");
        p.observe(0);
        p.observe(0);
        let mut logits = [1.0, 2.0, 3.0, 4.0, 5.0];
        p.apply(&mut logits);
        assert_eq!(logits, [1.0, 2.0, inf, 4.0, inf], "two tokens in, the ends may come");
        let ignored = GenerateOptions { ignore_eos: true, ..options };
        let mut logits = [1.0, 2.0, 3.0, 4.0, 5.0];
        Penalties::new(&ignored, &[]).apply(&mut logits);
        assert_eq!(logits[1], inf, "an ignored EOS is kept back too, as vLLM keeps it");
    }
}
