//! Reading a packed 4-bit weight: a word of 8 values and its scale, dequantized as the
//! interpreter does.

use crate::cuda::elemental::{rounded, Emitter};
use crate::cuda::CudaError;
use g4c_ir::DType;
use g4c_passes::PackedWeight;

/// The loads of packed weight `w`'s word holding its 8 values from `(n, k)` on (`k` a multiple of
/// 8) and of their scale: two C expressions.
pub(super) fn packed_loads(
    em: &mut Emitter,
    w: &PackedWeight,
    n: &str,
    k: &str,
    depth: usize,
) -> Result<(String, String), CudaError> {
    let array = em.weight_arg(&w.q);
    // Row `n` starts at word `n · depth / 8` (the depth is whole words): no product of `n` and
    // the depth, which a 4-bit matrix of 2^31 values would overflow.
    let word = format!("ld_word({array}, {n} * {} + ({k} >> 3))", depth / 8);
    let scale = em.value(w.scale, &[n.to_string(), format!("({k} / {})", w.group)])?;
    Ok((word, scale))
}

/// Value `i` (a C variable) of the 8 in `word`, dequantized exactly as `dequantize` does:
/// `(float)q · scale`, rounded to the weight's type. An f16 weight, and where the GPU has bf16
/// arithmetic a bf16 weight of bf16 scales, is dequantized 8 values at a time, two per
/// instruction, into an array declared here (`dequant8_f16`, `dequant8_bf16`: the same values);
/// any other value by value.
pub(super) fn packed_value(em: &mut Emitter, w: &PackedWeight, word: &str, scale: &str) -> String {
    let pairs = match w.dtype {
        DType::F16 => Some("dequant8_f16"),
        DType::BF16 if em.bf16_math && em.k.ty(w.scale).dtype == DType::BF16 => Some("dequant8_bf16"),
        _ => None,
    };
    if let Some(dequantize) = pairs {
        let values = em.fresh("dq");
        em.line(format!("float {values}[8];"));
        em.line(format!("{dequantize}({word}, {scale}, {values});"));
        return format!("{values}[i]");
    }
    rounded(w.dtype, &format!("(float)nib({word}, i) * {scale}"))
}
