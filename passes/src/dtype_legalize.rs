//! Dtype legalization: rewrites the frontend's all-f32 math into the target's compute type C
//! (`Target::compute_dtype`: bf16 on TPU and Ampere+, f16 on Turing, f32 on CPU) under one explicit
//! per-op policy:
//!
//! | op                                                        | computes in                      |
//! |-----------------------------------------------------------|----------------------------------|
//! | `dot_general`                                             | C (operands converted to C)      |
//! | `reduce`, `exp`, `log`, `tanh`, `rsqrt`, `sqrt`, `sin`, `cos`, `pow` | f32 (operands widened) |
//! | other float elementwise ops, `select`, `concat`          | the widest of its operands       |
//! | `reshape`, `transpose`, `broadcast`, `slice`, `gather`    | its operand's type               |
//! | `update_slots`, cache state                               | C (the caches are stored in C)   |
//! | weights                                                   | as stored; converted where used  |
//! | host-gathered rows                                        | C (converted on the host)        |
//! | `logits`                                                  | f32                              |
//!
//! So norm statistics, softmax, RoPE angles and the softcap run in f32, and since the residual
//! stream adds f32 norm outputs it stays f32 too; matmuls, their activations and the KV caches use C.
//! Targets whose compute type is f32 do not run it.
//!
//! **Overflow.** bf16 has f32's exponent range; f16 tops out at 65504, which Gemma's activations
//! exceed (vLLM shipped NaNs on T4 for it). So when C is f16 (Turing) two more rows apply, and every
//! sum and every scaled-up value is f32, leaving f16 only for what is stored or multiplied:
//!
//! | op (C = f16 only)                                         | computes in                      |
//! |-----------------------------------------------------------|----------------------------------|
//! | `dot_general`                                             | operands C, accumulated and returned in f32 (projections, attention logits before the softcap) |
//! | `mul` by a constant above 1 (the embedding scales)        | f32 (operands widened)           |

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{
    BinaryOp, DType, Function, Instr, Literal, Module, Op, ParamRole, ResultRole, Substitution, TensorType, ValueId,
};
use std::collections::HashMap;

pub struct DtypeLegalize;

impl Pass for DtypeLegalize {
    fn name(&self) -> &'static str {
        "dtype-legalize"
    }

    /// Targets that compute in f32 have nothing to legalize.
    fn is_enabled(&self, target: &Target) -> bool {
        target.compute_dtype != DType::F32
    }

    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError> {
        let c = target.compute_dtype;
        for f in &mut module.functions {
            legalize(f, c);
        }
        Ok(())
    }
}

/// f32 and C are the only float types of legalized math; f32 is the wider.
fn widest(types: impl IntoIterator<Item = DType>, c: DType) -> DType {
    if types.into_iter().any(|d| d == DType::F32) {
        DType::F32
    } else {
        c
    }
}

/// Whether C has fewer exponent bits than f32 (f16: 5, against 8 for f32 and bf16), so the overflow
/// rows of the policy apply: with 8 bits the largest finite value is at least 2^127.
fn narrow_range(c: DType) -> bool {
    max_finite(c).is_some_and(|max| max < 2f64.powi(127))
}

fn legalize(f: &mut Function, c: DType) {
    let narrow = narrow_range(c);
    // Float state (the caches) is stored in C, and host-gathered rows arrive in C (the runtime
    // converts them on the host, so a target without bf16 never sees bf16).
    for p in &f.params {
        let dtype = f.values[p.value.index()].ty.dtype;
        let retype = match p.role {
            ParamRole::HostGather { .. } => dtype.is_float(),
            ref role => role.is_state() && dtype == DType::F32,
        };
        if retype {
            f.values[p.value.index()].ty.dtype = c;
        }
    }
    let splats: HashMap<ValueId, f64> = f
        .body
        .iter()
        .filter_map(|i| match i.op {
            Op::Constant { literal: Literal::Splat(v) } => Some((i.result, v)),
            _ => None,
        })
        .collect();
    // Float-to-float converts kept so far, by result: a later cast of one starts from its source.
    let mut converted_from: HashMap<ValueId, ValueId> = HashMap::new();
    let old_body = std::mem::take(&mut f.body);
    let mut replace = Substitution::default();
    for mut instr in old_body {
        replace.apply_to_op(&mut instr.op);
        let ty = |f: &Function, v: ValueId| f.values[v.index()].ty.dtype;
        let result_ty = f.values[instr.result.index()].ty.clone();
        let float_result = result_ty.dtype == DType::F32;
        // The element type this instruction computes in, and the type its float operands need.
        let (compute, operands_to): (Option<DType>, Option<DType>) = match &instr.op {
            // Splat constants take the type of whoever uses them (re-created there, see `cast`).
            Op::Constant { .. } | Op::Iota { .. } | Op::Weight { .. } => (None, None),
            Op::DotGeneral { .. } if narrow => (Some(DType::F32), Some(c)),
            Op::DotGeneral { .. } => (Some(c), Some(c)),
            Op::Binary { op: BinaryOp::Mul, lhs, rhs } if narrow && scales_up(&splats, *lhs, *rhs) => {
                (float_result.then_some(DType::F32), Some(DType::F32))
            }
            Op::Reduce { .. } => (float_result.then_some(DType::F32), Some(DType::F32)),
            Op::Unary { op, .. } if op.is_transcendental() => (Some(DType::F32), Some(DType::F32)),
            Op::Unary { x, .. }
            | Op::Reshape { x }
            | Op::Transpose { input: x, .. }
            | Op::Broadcast { input: x, .. }
            | Op::Slice { input: x, .. } => (float_result.then(|| ty(f, *x)), None),
            Op::Gather { table, .. } => (Some(ty(f, *table)), None),
            // Dequantized weights feed matmuls: they come out in C, rounded once from f32.
            Op::Dequantize { .. } => (float_result.then_some(c), None),
            Op::UpdateSlots { operand, .. } => {
                let d = ty(f, *operand);
                (Some(d), Some(d))
            }
            Op::Convert { x } => {
                // The frontend's converts bring weights, rows and integers into f32 math: floats now
                // enter as C, integers (positions) still as f32.
                if float_result && ty(f, *x).is_float() {
                    (Some(c), None)
                } else {
                    (None, None)
                }
            }
            Op::Binary { .. } | Op::Compare { .. } | Op::Select { .. } | Op::Concat { .. } => {
                let floats: Vec<DType> = instr
                    .op
                    .operands()
                    .iter()
                    .filter(|v| !splats.contains_key(v))
                    .map(|v| ty(f, *v))
                    .filter(|d| d.is_float())
                    .collect();
                let w = widest(floats.iter().copied(), c);
                (float_result.then_some(w), Some(w))
            }
        };
        if let Some(to) = operands_to {
            // Float operands of another type are cast (a select's bool condition is left alone).
            let mut casted: HashMap<ValueId, ValueId> = HashMap::new();
            for v in instr.op.operands() {
                let d = f.values[v.index()].ty.dtype;
                if d.is_float() && d != to && !casted.contains_key(&v) {
                    let c = cast(f, &splats, &converted_from, v, to);
                    casted.insert(v, c);
                }
            }
            instr.op.map_operands(|v| *casted.get(&v).unwrap_or(&v));
        }
        match (&instr.op, compute) {
            (Op::Convert { x }, Some(d)) if f.values[x.index()].ty.dtype == d => {
                // A convert into the type its operand already has: drop it.
                replace.insert(instr.result, *x);
                continue;
            }
            (_, Some(d)) => f.values[instr.result.index()].ty.dtype = d,
            _ => {}
        }
        if let Op::Convert { x } = instr.op {
            if f.values[x.index()].ty.dtype.is_float() && f.values[instr.result.index()].ty.dtype.is_float() {
                converted_from.insert(instr.result, x);
            }
        }
        f.body.push(instr);
    }
    // Results: state back in its parameter's type, everything else (logits) in f32.
    let results = f.results.clone();
    for (i, r) in results.iter().enumerate() {
        let v = replace.get(r.value);
        let state = f.param(&r.name).filter(|_| r.role == ResultRole::NextState);
        let want = match state {
            Some(p) => f.values[p.value.index()].ty.dtype,
            None if f.values[v.index()].ty.dtype.is_float() => DType::F32,
            None => f.values[v.index()].ty.dtype,
        };
        let v = if f.values[v.index()].ty.dtype != want { cast(f, &splats, &converted_from, v, want) } else { v };
        f.results[i].value = v;
    }
}

/// Whether `lhs * rhs` multiplies by a splat constant of magnitude above 1, which can take a value
/// representable in C out of C's range.
fn scales_up(splats: &HashMap<ValueId, f64>, lhs: ValueId, rhs: ValueId) -> bool {
    [lhs, rhs].iter().any(|v| splats.get(v).is_some_and(|c| c.abs() > 1.0))
}

/// `v` as type `to`: a fresh splat constant for splats, else a `convert` appended to the body. A
/// value that is itself a convert is cast from that convert's source, so a bf16 embedding row that
/// entered as f16 reaches f32 exactly, never through f16's range (and back to its source's own type
/// means the source itself).
///
/// Constants saturate to the finite range of `to`, as transformers builds masks from the dtype's
/// finite minimum: a "very negative" mask score that became −inf would turn a fully masked row
/// (a padding token) into NaN, and NaN survives even a multiplication by zero.
fn cast(
    f: &mut Function,
    splats: &HashMap<ValueId, f64>,
    converted_from: &HashMap<ValueId, ValueId>,
    v: ValueId,
    to: DType,
) -> ValueId {
    let v = converted_from.get(&v).copied().unwrap_or(v);
    if f.values[v.index()].ty.dtype == to {
        return v;
    }
    let ty = TensorType { dtype: to, shape: f.values[v.index()].ty.shape.clone() };
    let op = match splats.get(&v) {
        Some(&c) => Op::Constant { literal: Literal::Splat(saturate(c, to)) },
        None => Op::Convert { x: v },
    };
    let result = f.new_value(ty, None);
    f.body.push(Instr { result, op });
    result
}

/// `c` clamped to the largest finite magnitude of a float type (infinities and NaN pass through).
fn saturate(c: f64, dtype: DType) -> f64 {
    let Some(max) = max_finite(dtype).filter(|_| dtype != DType::F32) else { return c };
    if c.is_finite() {
        c.clamp(-max, max)
    } else {
        c
    }
}

/// The largest finite value of a float type.
fn max_finite(dtype: DType) -> Option<f64> {
    match dtype {
        DType::F16 => Some(half::f16::MAX.to_f64()),
        DType::BF16 => Some(half::bf16::MAX.to_f64()),
        DType::F32 => Some(f64::from(f32::MAX)),
        _ => None,
    }
}
