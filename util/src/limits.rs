//! The sizes g4c accepts, in one place. Each is far above what any Gemma 4 model or machine needs and
//! far below where a product of sizes would overflow 64 bits or a position would wrap its `i32`; input
//! beyond one is refused where it enters (a flag, a config, IR text, a safetensors header) with the
//! limit in the message.

/// Sequences per call (`--batch`).
pub const MAX_BATCH: usize = 1024;
/// Positions a sequence may reach (`--context`, prefill lengths, tokens to generate or score).
/// Positions travel as `i32`; the model's own `max_position_embeddings` usually caps lower.
pub const MAX_CONTEXT: usize = 1 << 24;
/// Any one dimension a config gives (vocabulary, hidden size, heads, head dim, MLP width, window).
pub const MAX_CONFIG_DIM: usize = 1 << 24;
/// Decoder layers a config may have.
pub const MAX_LAYERS: usize = 1024;
/// Elements of any one tensor (a weight, a cache, an IR value): 2^40, a terabyte of bytes.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

/// `value` if it lies in `min..=max`, else a message giving the range and the value.
pub fn in_range(value: u64, min: u64, max: u64) -> Result<u64, String> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(format!("expected {min} to {max}, found {value}"))
    }
}

/// Elements of a tensor of `shape`, if they are at most `MAX_TENSOR_ELEMENTS`.
pub fn tensor_elements(shape: &[usize]) -> Result<u64, String> {
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64).filter(|&n| n <= MAX_TENSOR_ELEMENTS))
        .ok_or_else(|| format!("a tensor of shape {shape:?} exceeds {MAX_TENSOR_ELEMENTS} elements"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_element_counts_name_the_limit() {
        assert_eq!(in_range(8, 1, MAX_BATCH as u64), Ok(8));
        assert_eq!(in_range(0, 1, 1024), Err("expected 1 to 1024, found 0".into()));
        assert_eq!(tensor_elements(&[2, 3]), Ok(6));
        assert_eq!(tensor_elements(&[]), Ok(1));
        assert!(tensor_elements(&[1 << 21, 1 << 20]).is_err());
        assert!(tensor_elements(&[usize::MAX, usize::MAX, 0]).is_err(), "overflow is caught before the zero");
    }
}
