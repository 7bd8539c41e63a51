//! Choosing the next token from logits: greedy, or seeded sampling with temperature, then min-p,
//! top-k and top-p (in that order, as vLLM's sampler), after any penalties (`penalties`) and the
//! mask of a grammar the text is kept to (`constraint`).

use crate::constraint::Constraint;
use crate::error::{Result, RuntimeError};
use crate::generate::GenerateOptions;
use crate::penalties::Penalties;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
    pub top_p: f32,
    /// Keep the tokens at least this likely relative to the most likely one (0: all).
    pub min_p: f32,
    pub seed: u64,
    /// Divides (or, when negative, multiplies) the logits of the prompt's and reply's tokens (1: none).
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit once per time the reply holds it (0: none).
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if the reply holds it (0: none).
    pub presence_penalty: f32,
}

impl SamplingParams {
    /// Whether the pick is the largest logit whatever the seed.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// The first parameter out of its range, as (field, expected range, value found): the one check
    /// `run`, `chat` and `serve` apply (fields named as the request's, snake case).
    pub fn check(&self) -> std::result::Result<(), (&'static str, &'static str, f32)> {
        type InRange = fn(f32) -> bool;
        let checks: [(&str, &str, f32, InRange); 6] = [
            ("temperature", "a number >= 0", self.temperature, |x| x >= 0.0 && x.is_finite()),
            ("top_p", "a number in (0, 1]", self.top_p, |x| x > 0.0 && x <= 1.0),
            ("min_p", "a number in [0, 1]", self.min_p, |x| (0.0..=1.0).contains(&x)),
            ("repetition_penalty", "a number > 0", self.repetition_penalty, |x| x > 0.0 && x.is_finite()),
            ("frequency_penalty", "a number from -2 to 2", self.frequency_penalty, |x| (-2.0..=2.0).contains(&x)),
            ("presence_penalty", "a number from -2 to 2", self.presence_penalty, |x| (-2.0..=2.0).contains(&x)),
        ];
        match checks.into_iter().find(|(_, _, value, in_range)| !in_range(*value)) {
            Some((field, expected, value, _)) => Err((field, expected, value)),
            None => Ok(()),
        }
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

/// Picks one sequence's tokens: `pick` each from its logits, and `observe` each token the sequence
/// takes (picked or not), which the penalties count and the grammar moves past.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    penalties: Penalties,
    constraint: Option<Constraint>,
    /// The penalized, masked logits, kept between picks so a step allocates no vocabulary-sized row.
    adjusted: Vec<f32>,
}

impl Sampler {
    /// A sampler for a sequence that starts with `prompt`, picking as `options` ask (their sampling
    /// parameters, what changes the logits, the grammar the text is kept to).
    pub fn new(options: &GenerateOptions, prompt: &[u32]) -> Sampler {
        let params = options.sampling;
        let penalties = Penalties::new(options, prompt);
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler { params, rng, penalties, constraint: options.constraint.clone(), adjusted: Vec::new() }
    }

    /// The next token, from the logits the model gives; an error if the grammar fails.
    pub fn pick(&mut self, logits: &[f32]) -> Result<u32> {
        if !self.penalties.is_active() && self.constraint.is_none() {
            return Ok(self.pick_from(logits));
        }
        let mut adjusted = std::mem::take(&mut self.adjusted);
        adjusted.clear();
        adjusted.extend_from_slice(logits);
        self.penalties.apply(&mut adjusted);
        if !adjusted.iter().any(|l| l.is_finite()) {
            return Err(RuntimeError::Invalid(
                "no token is left to pick: allowed_token_ids, bad_words and min_tokens rule out every one".into(),
            ));
        }
        if let Some(constraint) = &mut self.constraint {
            constraint.mask(&mut adjusted)?;
        }
        let token = self.pick_from(&adjusted);
        self.adjusted = adjusted;
        Ok(token)
    }

    /// Counts `token`, the sequence's next token, and moves the grammar past it; an error if the
    /// grammar does not allow it.
    pub fn observe(&mut self, token: u32) -> Result<()> {
        self.penalties.observe(token);
        self.constraint.as_mut().map_or(Ok(()), |c| c.consume(token))
    }

    fn pick_from(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        if p.is_greedy() {
            return argmax(logits) as u32;
        }
        // A token's probability relative to the most likely one's, which min-p bounds below.
        let min_p = p.min_p as f64;
        let weight = |logit: f32, max: f32| {
            let w = (((logit - max) / p.temperature) as f64).exp();
            if w >= min_p {
                w
            } else {
                0.0
            }
        };
        if p.top_k == 0 && p.top_p >= 1.0 {
            // The whole softmax, in id order: no candidate list to build or sort (a sort of a
            // 262,144-token vocabulary per token would cost a batch more than its decode call).
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total = logits.iter().map(|&l| weight(l, max)).sum();
            return self.draw(logits.iter().enumerate().map(|(i, &l)| (i, weight(l, max))), total);
        }
        // Candidates by descending logit (ties: lower id first, like the greedy path); with top-k only
        // the k best are sorted.
        let descending = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
        let mut order: Vec<usize> = (0..logits.len()).collect();
        if p.top_k > 0 && p.top_k < order.len() {
            order.select_nth_unstable_by(p.top_k - 1, descending);
            order.truncate(p.top_k);
        }
        order.sort_unstable_by(descending);
        let max = logits[order[0]];
        let mut probs: Vec<f64> = order.iter().map(|&i| weight(logits[i], max)).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    cumulative += x;
                    cumulative >= p.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            order.truncate(keep);
        }
        let total = probs.iter().sum();
        self.draw(order.into_iter().zip(probs), total)
    }

    /// One of `candidates` (id, unnormalized probability) drawn in proportion to its weight, out of
    /// `total`.
    fn draw(&mut self, candidates: impl Iterator<Item = (usize, f64)>, total: f64) -> u32 {
        let mut u = self.rng.random::<f64>() * total;
        let mut last = 0;
        // Candidates of no weight (below min-p) are never drawn, not even by rounding at the end.
        for (i, x) in candidates.filter(|&(_, x)| x > 0.0) {
            if u < x {
                return i as u32;
            }
            u -= x;
            last = i;
        }
        last as u32
    }
}

/// Index of the largest logit; ties go to the lowest index, like `argmax` in transformers.
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(sampling: SamplingParams, prompt: &[u32]) -> Sampler {
        Sampler::new(&GenerateOptions { sampling, ..Default::default() }, prompt)
    }

    #[test]
    fn greedy_cases() {
        let logits = [0.1, 3.0, 3.0, -1.0];
        let mut s = sampler(SamplingParams::default(), &[]);
        assert_eq!(s.pick(&logits).unwrap(), 1, "ties go to the lowest id");
        let mut s = sampler(SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() }, &[]);
        assert_eq!(s.pick(&logits).unwrap(), 1);
    }

    #[test]
    fn sampling_follows_the_softmax_and_respects_top_k_and_top_p() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1.
        let logits = [2f32.ln() * 2.0, 2f32.ln(), 0.0, 0.0];
        let draw = |params: SamplingParams| {
            let mut s = sampler(params, &[]);
            let mut counts = [0usize; 4];
            for _ in 0..20_000 {
                counts[s.pick(&logits).unwrap() as usize] += 1;
            }
            counts.map(|c| c as f64 / 20_000.0)
        };
        let all = draw(SamplingParams { temperature: 1.0, seed: 7, ..Default::default() });
        for (got, want) in all.iter().zip([0.5, 0.25, 0.125, 0.125]) {
            assert!((got - want).abs() < 0.02, "{all:?}");
        }
        let top2 = draw(SamplingParams { temperature: 1.0, top_k: 2, seed: 7, ..Default::default() });
        assert!((top2[0] - 2.0 / 3.0).abs() < 0.02 && top2[2] == 0.0 && top2[3] == 0.0, "{top2:?}");
        let nucleus = draw(SamplingParams { temperature: 1.0, top_p: 0.7, seed: 7, ..Default::default() });
        assert!(nucleus[2] == 0.0 && nucleus[3] == 0.0 && nucleus[1] > 0.25, "{nucleus:?}");
        // 0.25 and 0.125 are half and a quarter of the most likely token's 0.5.
        let min_p = draw(SamplingParams { temperature: 1.0, min_p: 0.3, seed: 7, ..Default::default() });
        assert!((min_p[0] - 2.0 / 3.0).abs() < 0.02 && min_p[2] == 0.0 && min_p[3] == 0.0, "{min_p:?}");
        let min_p_top_p =
            draw(SamplingParams { temperature: 1.0, min_p: 0.3, top_p: 0.6, seed: 7, ..Default::default() });
        assert_eq!(min_p_top_p, [1.0, 0.0, 0.0, 0.0], "min-p first, then top-p of what it kept (0.5 / 0.75 ≥ 0.6)");
    }

    /// Sampling draws from the softmax of the penalized logits: token 0, in the prompt, has its
    /// logit halved by a repetition penalty of 2, making it as likely as token 1.
    #[test]
    fn sampling_follows_the_penalized_softmax() {
        let logits = [2f32.ln() * 2.0, 2f32.ln(), 0.0, 0.0];
        let params = SamplingParams { temperature: 1.0, repetition_penalty: 2.0, seed: 7, ..Default::default() };
        let mut s = sampler(params, &[0]);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[s.pick(&logits).unwrap() as usize] += 1;
        }
        let got = counts.map(|c| c as f64 / 20_000.0);
        for (got, want) in got.iter().zip([1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0, 1.0 / 6.0]) {
            assert!((got - want).abs() < 0.02, "{got:?}");
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = sampler(SamplingParams { temperature: 0.8, seed, ..Default::default() }, &[]);
            (0..20).map(|_| s.pick(&logits).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }
}
