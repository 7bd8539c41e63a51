//! Round-to-nearest symmetric 4-bit quantization per group of inputs, computed as compressed-tensors
//! computes it on a bf16 weight (so that g4c's `quantize` pass reproduces its `pack-quantized`
//! exports bit for bit): for each group of `group` consecutive inputs of a row, in bf16 arithmetic,
//! `scale = absmax / 7.5` (bf16's epsilon where the group is all zeros) and
//! `q = clamp(round_half_even(w / scale), -8, 7)`.

/// The scales `[rows, cols / group]` (as f32 values of bf16 numbers) of a row-major matrix whose
/// rows `group` divides.
pub fn int4_scales(values: &[f32], group: usize) -> Vec<f32> {
    values
        .chunks(group)
        .map(|g| {
            let absmax = g.iter().map(|&w| bf16(w).abs()).fold(0f32, f32::max);
            let scale = bf16(absmax / 7.5);
            if scale == 0.0 {
                half::bf16::EPSILON.to_f32()
            } else {
                scale
            }
        })
        .collect()
}

/// The 4-bit values of a `rows × cols` matrix, given its scales (`int4_scales`).
pub fn int4_values(values: &[f32], scales: &[f32], group: usize) -> Vec<i32> {
    values
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let ratio = bf16(bf16(w) / scales[i / group]);
            ratio.round_ties_even().clamp(-8.0, 7.0) as i32
        })
        .collect()
}

fn bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_share_a_scale_and_ties_round_to_even() {
        // One row, two groups of 4: absmax 7.5 gives scale 1, so values are rounded as they are.
        let w = [7.5, -2.5, 0.5, 1.5, 0.0, 0.0, 0.0, 0.0];
        let s = int4_scales(&w, 4);
        assert_eq!(s, [1.0, half::bf16::EPSILON.to_f32()]);
        assert_eq!(int4_values(&w, &s, 4), [7, -2, 0, 2, 0, 0, 0, 0]);
        // -8 is reachable: -7.5 at scale 1 is a tie, which rounds to the even -8.
        let w = [-7.5, 7.5, 1.0, 1.0];
        let s = int4_scales(&w, 4);
        assert_eq!(int4_values(&w, &s, 4), [-8, 7, 1, 1]);
    }
}
