//! How a backend's outputs are compared with the reference's.

use g4c_ir::DType;
use g4c_runtime::{Data, Tensor};

/// How close a backend must come to the reference, stated per op (see `cases`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Equal: integers and predicates identically, floats as values (`0.0 == -0.0`, NaN matches
    /// NaN, infinities must match).
    Exact,
    /// Floats within `ulps` units in the last place of the result's element type, or within `abs`;
    /// NaN and infinities must still match exactly.
    Ulps { ulps: u32, abs: f32 },
    /// `Exact` where the reference is not NaN. StableHLO's `maximum` and `minimum` are IEEE 754's,
    /// which return NaN when either operand is; XLA's CPU backend returns the left operand when
    /// only the right one is NaN. No model reaches it (scores are finite), so it is stated, not
    /// compared.
    ExactWhereNotNan,
}

/// Position of a float along the number line in units of its type's last place.
fn ordinal(dtype: DType, x: f32) -> i64 {
    let (bits, width) = match dtype {
        DType::BF16 => (half::bf16::from_f32(x).to_bits() as i64, 16),
        DType::F16 => (half::f16::from_f32(x).to_bits() as i64, 16),
        _ => (x.to_bits() as i64, 32),
    };
    let sign = 1i64 << (width - 1);
    if bits & sign != 0 {
        -(bits & (sign - 1))
    } else {
        bits
    }
}

/// Whether `got` matches `want`. With `subnormals_as_zero`, a value below f32's smallest normal also
/// matches a zero of its sign (a backend that flushes them).
pub(super) fn close(dtype: DType, want: f32, got: f32, tolerance: Tolerance, subnormals_as_zero: bool) -> bool {
    if tolerance == Tolerance::ExactWhereNotNan && want.is_nan() {
        return true;
    }
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    let flush = |x: f32| if subnormals_as_zero && x.abs() < f32::MIN_POSITIVE { 0.0 } else { x };
    if want == got || flush(want) == flush(got) {
        return true;
    }
    match tolerance {
        Tolerance::Exact | Tolerance::ExactWhereNotNan => false,
        Tolerance::Ulps { ulps, abs } => {
            want.is_finite()
                && got.is_finite()
                && ((want - got).abs() <= abs
                    || (ordinal(dtype, want) - ordinal(dtype, got)).unsigned_abs() <= ulps as u64)
        }
    }
}

/// `t` with every float below f32's smallest normal magnitude replaced by a zero of its sign.
pub fn flush_subnormals(t: &Tensor) -> Tensor {
    match &t.data {
        Data::F32(v) => {
            let flushed =
                v.iter().map(|&x| if x != 0.0 && x.abs() < f32::MIN_POSITIVE { 0.0f32.copysign(x) } else { x });
            Tensor::of_type(t.ty.clone(), Data::F32(flushed.collect()))
        }
        _ => t.clone(),
    }
}

/// `Ok` when every output element matches the same element of one of the acceptable reference
/// outputs `wants` (several when a backend may read a subnormal input as itself or as zero); else
/// the first few mismatching elements, against the first reference.
pub fn outputs(
    wants: &[Vec<Tensor>],
    got: &[Tensor],
    tolerance: Tolerance,
    subnormals_as_zero: bool,
) -> Result<(), String> {
    let want = &wants[0];
    if want.len() != got.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        if w.ty != g.ty {
            return Err(format!("output {i} is {}, expected {}", g.ty, w.ty));
        }
        let matches = |j: usize| {
            wants.iter().any(|ws| match (&ws[i].data, &g.data) {
                (Data::F32(a), Data::F32(b)) => close(w.ty.dtype, a[j], b[j], tolerance, subnormals_as_zero),
                (Data::I32(a), Data::I32(b)) => a[j] == b[j],
                (Data::Bool(a), Data::Bool(b)) => a[j] == b[j],
                _ => false,
            })
        };
        let show = |t: &Tensor, j: usize| match &t.data {
            Data::F32(v) => format!("{:e}", v[j]),
            Data::I32(v) => v[j].to_string(),
            Data::Bool(v) => v[j].to_string(),
        };
        let bad: Vec<String> = (0..w.ty.numel())
            .filter(|&j| !matches(j))
            .map(|j| format!("[{j}] {} vs {}", show(g, j), show(w, j)))
            .collect();
        if !bad.is_empty() {
            let shown: Vec<&str> = bad.iter().take(4).map(String::as_str).collect();
            return Err(format!(
                "output {i} ({}): {} of {} elements, e.g. {}",
                w.ty,
                bad.len(),
                w.ty.numel(),
                shown.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_count_across_zero_and_in_narrow_types() {
        assert_eq!(ordinal(DType::F32, 0.0), ordinal(DType::F32, -0.0));
        assert_eq!(ordinal(DType::F32, f32::from_bits(1)) - ordinal(DType::F32, -f32::from_bits(1)), 2);
        let one_ulp_of_f16_at_1 = 1.0 + half::f16::EPSILON.to_f32();
        let tol = Tolerance::Ulps { ulps: 1, abs: 0.0 };
        assert!(close(DType::F16, 1.0, one_ulp_of_f16_at_1, tol, false));
        assert!(!close(DType::F32, 1.0, one_ulp_of_f16_at_1, tol, false));
        assert!(!close(DType::F32, f32::INFINITY, f32::MAX, Tolerance::Ulps { ulps: 10, abs: f32::MAX }, false));
        assert!(close(DType::F32, f32::NAN, -f32::NAN, Tolerance::Exact, false));
        assert!(!close(DType::F32, 1e-40, 0.0, Tolerance::Exact, false));
        assert!(close(DType::F32, 1e-40, 0.0, Tolerance::Exact, true));
        assert!(!close(DType::F32, 1.0, f32::NAN, Tolerance::ExactWhereNotNan, false));
        assert!(close(DType::F32, f32::NAN, 1.0, Tolerance::ExactWhereNotNan, false));
    }
}
