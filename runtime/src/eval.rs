//! Teacher-forced evaluation, as llama.cpp's `llama-perplexity` does: a token sequence is scored in
//! chunks through the `score` entry point (the caches carry what came before), giving the logits at
//! every position; from them the perplexity of the sequence, and how far they are from another run's
//! logits of the same sequence (KL divergence, top-1 agreement, largest logit difference).

use crate::error::{invalid, Result};
use crate::executor::{Executor, StepInputs, StepOutput};
use crate::generate::{context_of, logits_row};
use crate::logprobs::log_sum_exp;
use g4c_ir::{EntryKind, ResultRole};

/// The logits at every position of `ids` (row `i` predicts token `i + 1`), `[N][vocab]`.
pub fn score(exec: &mut dyn Executor, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let module = exec.module();
    let Some(f) = module.scorer() else { return invalid("the module has no scoring entry point") };
    let Some(EntryKind::Score { tokens: t }) = f.entry_kind() else { unreachable!("a scorer") };
    let entry = f.name.clone();
    let vocab = f.ty(f.result_with(ResultRole::Logits).expect("scorers return logits").value).shape[2];
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return invalid(format!("token id {bad} is outside the vocabulary (0..{vocab})"));
    }
    // Past it the full-attention slots would wrap and overwrite the sequence's first positions.
    if let Some(context) = context_of(f).filter(|&c| ids.len() > c) {
        return invalid(format!("the sequence has {} tokens; the scoring module's context holds {context}", ids.len()));
    }
    exec.reset()?;
    let mut rows = Vec::with_capacity(ids.len());
    for (c, chunk) in ids.chunks(t).enumerate() {
        let inputs = StepInputs::padded(t, &[(c * t, chunk)], false);
        let logits = exec.step(&entry, &inputs, StepOutput::Logits)?;
        for i in 0..chunk.len() {
            rows.push(logits_row(&logits, i, vocab, || format!("position {}", c * t + i))?.to_vec());
        }
    }
    Ok(rows)
}

/// `log softmax` of one row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let log_sum = log_sum_exp(row);
    row.iter().map(|&x| x as f64 - log_sum).collect()
}

/// The perplexity of `ids` under `logits` (row `i` predicting token `i + 1`): `exp` of the mean
/// negative log-likelihood of tokens 1..N.
pub fn perplexity(logits: &[Vec<f32>], ids: &[u32]) -> f64 {
    let n = ids.len().saturating_sub(1).min(logits.len());
    let nll: f64 = (0..n).map(|i| log_sum_exp(&logits[i]) - logits[i][ids[i + 1] as usize] as f64).sum();
    (nll / n.max(1) as f64).exp()
}

/// How far one run's logits are from a reference run's, position by position.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// KL(reference ‖ ours) per position, in nats.
    pub kl: Vec<f64>,
    /// Whether the most likely token agrees, per position.
    pub top1: Vec<bool>,
    /// Largest |Δlogit| per position.
    pub max_abs_diff: Vec<f32>,
}

impl Divergence {
    pub fn of(ours: &[Vec<f32>], reference: &[Vec<f32>]) -> Result<Divergence> {
        if ours.len() != reference.len() || ours.iter().zip(reference).any(|(a, b)| a.len() != b.len()) {
            return invalid(format!(
                "the reference has {} positions of {} logits, this run {} of {}",
                reference.len(),
                reference.first().map_or(0, Vec::len),
                ours.len(),
                ours.first().map_or(0, Vec::len)
            ));
        }
        let mut d = Divergence { kl: vec![], top1: vec![], max_abs_diff: vec![] };
        for (o, r) in ours.iter().zip(reference) {
            let (lo, lr) = (log_softmax(o), log_softmax(r));
            d.kl.push(lr.iter().zip(&lo).map(|(&a, &b)| a.exp() * (a - b)).sum::<f64>().max(0.0));
            d.top1.push(crate::sampling::argmax(o) == crate::sampling::argmax(r));
            d.max_abs_diff.push(o.iter().zip(r).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max));
        }
        Ok(d)
    }

    pub fn kl_mean(&self) -> f64 {
        self.kl.iter().sum::<f64>() / self.kl.len().max(1) as f64
    }

    /// The 99th percentile (nearest rank) of the KL divergences.
    pub fn kl_p99(&self) -> f64 {
        let mut sorted = self.kl.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((0.99 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or(0.0)
    }

    pub fn kl_max(&self) -> f64 {
        self.kl.iter().copied().fold(0.0, f64::max)
    }

    pub fn top1_agreement(&self) -> f64 {
        self.top1.iter().filter(|&&t| t).count() as f64 / self.top1.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_of_a_uniform_model_is_the_vocabulary_size() {
        let logits = vec![vec![0.5f32; 8]; 4];
        assert!((perplexity(&logits, &[1, 2, 3, 4, 5]) - 8.0).abs() < 1e-12);
    }

    #[test]
    fn identical_logits_diverge_by_nothing() {
        let a = vec![vec![1.0f32, 2.0, 3.0], vec![0.0, -1.0, 5.0]];
        let d = Divergence::of(&a, &a).unwrap();
        assert_eq!((d.kl_mean(), d.kl_max(), d.top1_agreement()), (0.0, 0.0, 1.0));
        let b = vec![vec![3.0f32, 2.0, 1.0], vec![0.0, -1.0, 5.0]];
        let d = Divergence::of(&b, &a).unwrap();
        assert!(d.kl[0] > 0.0 && d.kl[1] == 0.0);
        assert_eq!(d.top1, [false, true]);
        assert_eq!(d.max_abs_diff, [2.0, 0.0]);
    }
}
