//! Log probabilities of generated tokens, as OpenAI's `logprobs` returns them: the chosen token's
//! and the most likely tokens' at each step, from the model's own distribution (the softmax of its
//! logits, before temperature or any other sampling filter, as vLLM reports them by default).

/// One generated token's log probability and the `n` most likely tokens' at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: the lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// Of `token`, chosen from `logits`, with the `n` most likely tokens.
    pub fn of(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
        let log_sum = log_sum_exp(logits);
        let logprob = |id: usize| (logits[id] as f64 - log_sum) as f32;
        let descending = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
        let mut ids: Vec<usize> = (0..logits.len()).collect();
        let n = n.min(ids.len());
        if n > 0 && n < ids.len() {
            ids.select_nth_unstable_by(n - 1, descending);
        }
        ids.truncate(n);
        ids.sort_unstable_by(descending);
        TokenLogprobs {
            logprob: logprob(token as usize),
            top: ids.into_iter().map(|id| (id as u32, logprob(id))).collect(),
        }
    }
}

/// `log Σ exp` of one row, in f64.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::TokenLogprobs;

    #[test]
    fn the_chosen_token_and_the_most_likely_ones() {
        // Probabilities 0.5, 0.25, 0.125, 0.125.
        let logits = [0.0f32, 2f32.ln() * 2.0, 2f32.ln(), 0.0];
        let got = TokenLogprobs::of(&logits, 3, 3);
        let ln = |p: f32| p.ln();
        assert!((got.logprob - ln(0.125)).abs() < 1e-6, "{got:?}");
        let ids: Vec<u32> = got.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 0], "most likely first; of the two 0.125s the lower id");
        for ((_, lp), p) in got.top.iter().zip([0.5, 0.25, 0.125]) {
            assert!((lp - ln(p)).abs() < 1e-6, "{got:?}");
        }
        assert!(TokenLogprobs::of(&logits, 1, 0).top.is_empty());
        assert_eq!(TokenLogprobs::of(&logits, 1, 10).top.len(), 4);
    }
}
