//! What each elementwise op computes on single elements. The interpreter and constant folding both
//! use these, so a folded constant is bit-identical to what the interpreter would have computed.

use crate::{BinaryOp, CompareDir, DType, UnaryOp};

/// The f32 function of a float unary op (`None` for `not`).
pub fn unary_f32(op: UnaryOp) -> Option<fn(f32) -> f32> {
    Some(match op {
        UnaryOp::Neg => |a| -a,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Tanh => f32::tanh,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => |a| 1.0 / a.sqrt(),
        // -1, 0 or 1; zeros keep their sign and NaN stays NaN (StableHLO `sign`).
        UnaryOp::Sign => |a| if a == 0.0 || a.is_nan() { a } else { a.signum() },
        UnaryOp::Sin => f32::sin,
        UnaryOp::Cos => f32::cos,
        UnaryOp::Not => return None,
    })
}

/// The f32 function of a float binary op (`None` for `and`/`or`).
pub fn binary_f32(op: BinaryOp) -> Option<fn(f32, f32) -> f32> {
    Some(match op {
        BinaryOp::Add => |p, q| p + q,
        BinaryOp::Sub => |p, q| p - q,
        BinaryOp::Mul => |p, q| p * q,
        BinaryOp::Div => |p, q| p / q,
        BinaryOp::Max => maximum,
        BinaryOp::Min => minimum,
        BinaryOp::Pow => f32::powf,
        BinaryOp::Rem => |p, q| p % q,
        BinaryOp::And | BinaryOp::Or => return None,
    })
}

/// IEEE 754 `maximum` (as StableHLO's): NaN if either operand is NaN.
pub fn maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// IEEE 754 `minimum`: NaN if either operand is NaN.
pub fn minimum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.min(b)
    }
}

/// An integer binary op of `dtype` with two's-complement wrapping into it; division by zero and
/// `pow` are errors.
pub fn binary_int(op: BinaryOp, dtype: DType, p: i32, q: i32) -> Result<i32, String> {
    binary_i32(op, p, q).map(|r| wrap_int(dtype, r as i64))
}

/// `neg` and `abs` of an integer of `dtype`, wrapping (`-(-128)` is `-128` in `i8`); `None` for the
/// float-only ops.
pub fn unary_int(op: UnaryOp, dtype: DType, v: i32) -> Option<i32> {
    match op {
        UnaryOp::Neg => Some(wrap_int(dtype, -(v as i64))),
        UnaryOp::Abs => Some(wrap_int(dtype, (v as i64).abs())),
        UnaryOp::Sign => Some(v.signum()),
        _ => None,
    }
}

/// The smallest and largest values of an integer dtype.
pub fn int_range(dtype: DType) -> (i32, i32) {
    match dtype {
        DType::I8 => (i8::MIN as i32, i8::MAX as i32),
        DType::I4 => (-8, 7),
        _ => (i32::MIN, i32::MAX),
    }
}

/// An integer binary op with two's-complement wrapping in 32 bits; division by zero and `pow` are
/// errors.
fn binary_i32(op: BinaryOp, p: i32, q: i32) -> Result<i32, String> {
    Ok(match op {
        BinaryOp::Add => p.wrapping_add(q),
        BinaryOp::Sub => p.wrapping_sub(q),
        BinaryOp::Mul => p.wrapping_mul(q),
        BinaryOp::Max => p.max(q),
        BinaryOp::Min => p.min(q),
        BinaryOp::And => p & q,
        BinaryOp::Or => p | q,
        BinaryOp::Div | BinaryOp::Rem if q == 0 => return Err(format!("integer `{op}` by zero")),
        BinaryOp::Div => p.wrapping_div(q),
        BinaryOp::Rem => p.wrapping_rem(q),
        BinaryOp::Pow => return Err("`pow` on integers".into()),
    })
}

pub fn compare<T: PartialOrd>(dir: CompareDir, p: T, q: T) -> bool {
    match dir {
        CompareDir::Eq => p == q,
        CompareDir::Ne => p != q,
        CompareDir::Lt => p < q,
        CompareDir::Le => p <= q,
        CompareDir::Gt => p > q,
        CompareDir::Ge => p >= q,
    }
}

/// An integer wrapped (two's complement) into an integer dtype: `i8`, `i4`, else `i32`.
pub fn wrap_int(dtype: DType, v: i64) -> i32 {
    match dtype {
        DType::I8 => v as i8 as i32,
        DType::I4 => (((v & 0xF) ^ 0x8) - 0x8) as i32,
        _ => v as i32,
    }
}

/// Rounds an f32 to the nearest value of a float dtype (round-to-nearest-even); others unchanged.
pub fn round_float(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}
