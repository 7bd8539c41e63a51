//! What changes the logits before the sampler (or the greedy pick) reads them, in vLLM's order:
//! - **logit bias** (OpenAI's `logit_bias`): added to chosen tokens' logits, first (vLLM applies it
//!   with the logits processors, before the penalties);
//!
//! then penalties on tokens the sequence has already seen, as vLLM's `apply_penalties`:
//! - **repetition** (vLLM's `repetition_penalty`, transformers' `RepetitionPenaltyLogitsProcessor`):
//!   a token of the prompt or the reply has a positive logit divided by it, a negative one multiplied;
//! - **frequency** (OpenAI's `frequency_penalty`): subtracted once per time the reply holds the token;
//! - **presence** (OpenAI's `presence_penalty`): subtracted once if the reply holds the token.

use crate::sampling::SamplingParams;
use std::collections::{BTreeMap, BTreeSet};

/// Whether `params`' penalties or `bias` change any logit; if none does, a greedy pick is the
/// largest of the logits as the model gives them (which a device's greedy token is).
pub fn change_logits(params: &SamplingParams, bias: &[(u32, f32)]) -> bool {
    !bias.is_empty()
        || params.repetition_penalty != 1.0
        || params.frequency_penalty != 0.0
        || params.presence_penalty != 0.0
}

pub struct Penalties {
    /// Whether anything changes logits (`change_logits`).
    active: bool,
    /// Token ids and what is added to their logits.
    bias: Vec<(u32, f32)>,
    repetition: f32,
    frequency: f32,
    presence: f32,
    /// The prompt's distinct tokens (read by the repetition penalty only).
    prompt: BTreeSet<u32>,
    /// How many times the reply holds each token so far.
    reply: BTreeMap<u32, u32>,
}

impl Penalties {
    /// The penalties `params` ask for, and `bias`, on a sequence that starts with `prompt`.
    pub fn new(params: &SamplingParams, bias: &[(u32, f32)], prompt: &[u32]) -> Penalties {
        let repetition = params.repetition_penalty;
        let prompt = if repetition != 1.0 { prompt.iter().copied().collect() } else { BTreeSet::new() };
        let (frequency, presence) = (params.frequency_penalty, params.presence_penalty);
        let active = change_logits(params, bias);
        Penalties { active, bias: bias.to_vec(), repetition, frequency, presence, prompt, reply: BTreeMap::new() }
    }

    /// Whether anything changes logits.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Counts `token`, the reply's next token.
    pub fn observe(&mut self, token: u32) {
        if self.is_active() {
            *self.reply.entry(token).or_default() += 1;
        }
    }

    /// Applies the bias and penalties to `logits`, one row of the vocabulary (ids past its end are
    /// let be).
    pub fn apply(&self, logits: &mut [f32]) {
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
    use crate::sampling::SamplingParams;

    fn penalties(repetition: f32, frequency: f32, presence: f32, prompt: &[u32]) -> Penalties {
        let params = SamplingParams {
            repetition_penalty: repetition,
            frequency_penalty: frequency,
            presence_penalty: presence,
            ..Default::default()
        };
        Penalties::new(&params, &[], prompt)
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
        let mut p = Penalties::new(
            &SamplingParams { repetition_penalty: 2.0, ..Default::default() },
            &[(0, 3.0), (2, -1.0)],
            &[0],
        );
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
}
