//! Constant folding of splats: an op whose operands are all splat constants becomes a splat constant
//! (and `select` on a constant condition becomes the chosen operand). Arithmetic follows the
//! interpreter: floats in f32 rounded to their dtype, integers wrapping in theirs.

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{scalar, BinaryOp, CompareDir, DType, Literal, Module, Op, Substitution, UnaryOp, ValueId};
use std::collections::HashMap;

pub struct ConstantFold;

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "constant-fold"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        for f in &mut module.functions {
            let mut splats: HashMap<ValueId, f64> = HashMap::new();
            let mut replace = Substitution::default();
            for instr in &mut f.body {
                replace.apply_to_op(&mut instr.op);
                let ty = &f.values[instr.result.index()].ty;
                let splat = |v: &ValueId| splats.get(v).copied();
                let dtype_of = |v: &ValueId| f.values[v.index()].ty.dtype;
                if let Op::Constant { literal: Literal::Splat(c) } = &instr.op {
                    // Its value as the interpreter makes it: the literal rounded to the constant's type
                    // (a literal a narrower type cannot hold, e.g. after `dtype-legalize`, is not it).
                    splats.insert(instr.result, if ty.dtype.is_float() { round(ty.dtype, *c as f32) } else { *c });
                    continue;
                }
                let folded = match &instr.op {
                    Op::Broadcast { input, .. } => splat(input),
                    Op::Reshape { x } => splat(x),
                    Op::Convert { x } => splat(x).map(|c| convert(dtype_of(x), ty.dtype, c)),
                    Op::Unary { op, x } => splat(x).and_then(|c| unary(*op, ty.dtype, c)),
                    Op::Binary { op, lhs, rhs } => {
                        splat(lhs).zip(splat(rhs)).and_then(|(p, q)| binary(*op, ty.dtype, p, q))
                    }
                    Op::Compare { lhs, rhs, dir } => splat(lhs).zip(splat(rhs)).map(|(p, q)| compare(*dir, p, q)),
                    Op::Select { cond, on_true, on_false } => {
                        if let Some(c) = splat(cond) {
                            replace.insert(instr.result, if c != 0.0 { *on_true } else { *on_false });
                        }
                        None
                    }
                    _ => None,
                };
                if let Some(c) = folded {
                    splats.insert(instr.result, c);
                    instr.op = Op::Constant { literal: Literal::Splat(c) };
                }
            }
            replace.apply_to_results(&mut f.results);
        }
        Ok(())
    }
}

fn round(dtype: DType, x: f32) -> f64 {
    scalar::round_float(dtype, x) as f64
}

/// As the interpreter converts: floats round, float to int truncates toward zero, ints wrap.
fn convert(from: DType, to: DType, c: f64) -> f64 {
    match to {
        DType::Bool => (c != 0.0) as u8 as f64,
        d if d.is_float() => round(d, c as f32),
        d if from.is_float() => scalar::wrap_int(d, (c as f32).trunc() as i64) as f64,
        d => scalar::wrap_int(d, c as i64) as f64,
    }
}

fn unary(u: UnaryOp, dtype: DType, c: f64) -> Option<f64> {
    if !dtype.is_float() {
        return match u {
            UnaryOp::Not if dtype == DType::Bool => Some((c == 0.0) as u8 as f64),
            UnaryOp::Not => None,
            // `unary_int` says which integer ops it computes.
            _ => scalar::unary_int(u, dtype, c as i32).map(|v| v as f64),
        };
    }
    let y = scalar::unary_f32(u)?(c as f32);
    Some(round(dtype, y))
}

fn binary(b: BinaryOp, dtype: DType, p: f64, q: f64) -> Option<f64> {
    if dtype == DType::Bool {
        let (p, q) = (p != 0.0, q != 0.0);
        return match b {
            BinaryOp::And => Some((p && q) as u8 as f64),
            BinaryOp::Or => Some((p || q) as u8 as f64),
            _ => None,
        };
    }
    if !dtype.is_float() {
        return scalar::binary_int(b, dtype, p as i32, q as i32).ok().map(|r| r as f64);
    }
    Some(round(dtype, scalar::binary_f32(b)?(p as f32, q as f32)))
}

fn compare(dir: CompareDir, p: f64, q: f64) -> f64 {
    scalar::compare(dir, p, q) as u8 as f64
}
