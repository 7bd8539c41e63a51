//! clap parsers for the size flags, range-checked against `g4c_util::limits` where they enter, so
//! that no later sum or product of them can overflow (clap names the flag in the error).

use g4c_util::limits::{in_range, MAX_BATCH, MAX_CONFIG_DIM, MAX_CONTEXT};

fn parse(text: &str, min: usize, max: usize) -> Result<usize, String> {
    let value: u64 =
        text.trim().parse().map_err(|_| format!("expected an integer from {min} to {max}, found `{text}`"))?;
    in_range(value, min as u64, max as u64).map(|v| v as usize)
}

/// `--batch`: sequences per call.
pub fn batch(text: &str) -> Result<usize, String> {
    parse(text, 1, MAX_BATCH)
}

/// `--context`, `--prefill-len`, `--gen`, `--chunk`: a number of positions, at least one.
pub fn positions(text: &str) -> Result<usize, String> {
    parse(text, 1, MAX_CONTEXT)
}

/// `--max-new-tokens`: at most this many; generation also stops where the context ends.
pub fn new_tokens(text: &str) -> Result<usize, String> {
    parse(text, 0, MAX_CONTEXT)
}

/// `--top-k` (0: off).
pub fn top_k(text: &str) -> Result<usize, String> {
    parse(text, 0, MAX_CONFIG_DIM)
}

/// `--reps`: timed repetitions.
pub fn repetitions(text: &str) -> Result<usize, String> {
    parse(text, 1, 1000)
}
