//! Result-type rules of every op. The builder uses them to compute result types and the verifier
//! uses them to check the declared ones, so the two can never disagree.

use crate::{BinaryOp, DType, DotDims, Literal, Op, ReduceKind, TensorType, UnaryOp};

/// Computes the result type of `op`. Ops whose result type is not determined by their operands
/// (`constant`, `iota`, `convert`, `reshape`, `broadcast`, `dot_general`'s element type) take it
/// from `declared` and check it; `None` there is an error for those ops.
pub fn infer_type(
    op: &Op,
    operand: &dyn Fn(usize) -> TensorType,
    weight: &dyn Fn(&str) -> Option<TensorType>,
    declared: Option<&TensorType>,
) -> Result<TensorType, String> {
    let need_declared =
        || declared.cloned().ok_or_else(|| format!("`{}` needs an explicit result type", op.mnemonic()));
    match op {
        Op::Weight { name } => weight(name).ok_or_else(|| format!("no weight named @{name}")),
        Op::Constant { literal: lit } => {
            let ty = need_declared()?;
            if let Literal::Dense(vs) = lit {
                if vs.len() != ty.numel() {
                    return Err(format!("constant has {} values, type {ty} needs {}", vs.len(), ty.numel()));
                }
            }
            Ok(ty)
        }
        Op::Iota { dim } => {
            let ty = need_declared()?;
            if *dim >= ty.rank() {
                return Err(format!("iota dim {dim} out of range for {ty}"));
            }
            if ty.dtype == DType::Bool {
                return Err(format!("iota cannot produce {ty}"));
            }
            Ok(ty)
        }
        Op::Unary { op: u, .. } => {
            let x = operand(0);
            let ok = match u {
                UnaryOp::Not => x.dtype == DType::Bool,
                _ if u.is_transcendental() => x.dtype.is_float(),
                _ => x.dtype != DType::Bool,
            };
            if !ok {
                return Err(format!("`{u}` does not accept {x}"));
            }
            Ok(x)
        }
        Op::Binary { op: b, .. } => {
            let (a, c) = (operand(0), operand(1));
            if a != c {
                return Err(format!("`{b}` operands differ: {a} vs {c}"));
            }
            let ok = match b {
                BinaryOp::And | BinaryOp::Or => a.dtype == DType::Bool || a.dtype.is_int(),
                BinaryOp::Pow => a.dtype.is_float(),
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Max
                | BinaryOp::Min
                | BinaryOp::Rem => a.dtype != DType::Bool,
            };
            if !ok {
                return Err(format!("`{b}` does not accept {a}"));
            }
            Ok(a)
        }
        Op::Compare { dir, .. } => {
            let (a, c) = (operand(0), operand(1));
            if a != c {
                return Err(format!("`compare {dir}` operands differ: {a} vs {c}"));
            }
            Ok(a.with_dtype(DType::Bool))
        }
        Op::Select { .. } => {
            let (c, t, f) = (operand(0), operand(1), operand(2));
            if c.dtype != DType::Bool || c.shape != t.shape {
                return Err(format!("select condition must be bool{:?}, found {c}", t.shape));
            }
            if t != f {
                return Err(format!("select branches differ: {t} vs {f}"));
            }
            Ok(t)
        }
        Op::Convert { .. } => {
            let (x, ty) = (operand(0), need_declared()?);
            if x.shape != ty.shape {
                return Err(format!("convert changes shape: {x} to {ty}"));
            }
            Ok(ty)
        }
        Op::Reduce { kind, axes, .. } => {
            let x = operand(0);
            check_axes(axes, x.rank(), "reduce axes")?;
            if !axes.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("reduce axes must be increasing, found {axes:?}"));
            }
            if x.dtype == DType::Bool || (*kind == ReduceKind::Sum && x.dtype == DType::I4) {
                return Err(format!("reduce {kind} does not accept {x}"));
            }
            let shape = (0..x.rank()).filter(|d| !axes.contains(d)).map(|d| x.shape[d]).collect::<Vec<_>>();
            Ok(x.with_shape(shape))
        }
        Op::Reshape { .. } => {
            let (x, ty) = (operand(0), need_declared()?);
            if x.numel() != ty.numel() || x.dtype != ty.dtype {
                return Err(format!("reshape {x} to {ty} changes the element count or type"));
            }
            Ok(ty)
        }
        Op::Transpose { perm, .. } => {
            let x = operand(0);
            if perm.len() != x.rank() || !is_permutation(perm) {
                return Err(format!("transpose perm {perm:?} is not a permutation of rank {}", x.rank()));
            }
            Ok(x.with_shape(perm.iter().map(|&p| x.shape[p]).collect::<Vec<_>>()))
        }
        Op::Broadcast { dims, .. } => {
            let (x, ty) = (operand(0), need_declared()?);
            if dims.len() != x.rank() || x.dtype != ty.dtype {
                return Err(format!("broadcast of {x} to {ty} with dims {dims:?}: rank or type mismatch"));
            }
            check_axes(dims, ty.rank(), "broadcast dims")?;
            if !dims.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("broadcast dims must be increasing, found {dims:?}"));
            }
            for (i, &d) in dims.iter().enumerate() {
                if x.shape[i] != ty.shape[d] && x.shape[i] != 1 {
                    return Err(format!(
                        "broadcast of {x} to {ty}: input dim {i} ({}) does not fit result dim {d} ({})",
                        x.shape[i], ty.shape[d]
                    ));
                }
            }
            Ok(ty)
        }
        Op::Slice { start, limit, .. } => {
            let x = operand(0);
            if start.len() != x.rank() || limit.len() != x.rank() {
                return Err(format!("slice bounds {start:?}..{limit:?} do not match rank of {x}"));
            }
            let mut shape = Vec::with_capacity(x.rank());
            for d in 0..x.rank() {
                if start[d] > limit[d] || limit[d] > x.shape[d] {
                    return Err(format!("slice [{}, {}) out of range for dim {d} of {x}", start[d], limit[d]));
                }
                shape.push(limit[d] - start[d]);
            }
            Ok(x.with_shape(shape))
        }
        Op::Concat { inputs, axis } => {
            if inputs.is_empty() {
                return Err("concat needs at least one operand".into());
            }
            let first = operand(0);
            if *axis >= first.rank() {
                return Err(format!("concat axis {axis} out of range for {first}"));
            }
            let mut shape = first.shape.clone();
            for i in 1..inputs.len() {
                let t = operand(i);
                let same_rest =
                    t.rank() == first.rank() && (0..t.rank()).all(|d| d == *axis || t.shape[d] == first.shape[d]);
                if t.dtype != first.dtype || !same_rest {
                    return Err(format!("concat operand {i} ({t}) does not match {first} off axis {axis}"));
                }
                shape[*axis] += t.shape[*axis];
            }
            Ok(first.with_shape(shape))
        }
        Op::DotGeneral { dims, .. } => {
            let (l, r) = (operand(0), operand(1));
            let shape = dot_shape(&l, &r, dims)?;
            if l.dtype != r.dtype || !l.dtype.is_float() {
                return Err(format!("dot_general needs float operands of one type, found {l} and {r}"));
            }
            let dtype = match declared {
                Some(d) if d.dtype.is_float() => d.dtype,
                Some(d) => return Err(format!("dot_general cannot produce {d}")),
                None => l.dtype,
            };
            Ok(TensorType::new(dtype, shape))
        }
        Op::Gather { .. } => {
            let (t, i) = (operand(0), operand(1));
            if t.rank() == 0 || !i.dtype.is_int() {
                return Err(format!("gather needs a table of rank >= 1 and integer indices, found {t} and {i}"));
            }
            let mut shape = i.shape.clone();
            shape.extend_from_slice(&t.shape[1..]);
            Ok(t.with_shape(shape))
        }
        Op::Dequantize { group, .. } => dequantize_type(&operand(0), &operand(1), *group, need_declared()?),
        Op::UpdateSlots { axis, .. } => {
            let (o, s, u) = (operand(0), operand(1), operand(2));
            if o.rank() < 2 || *axis == 0 || *axis >= o.rank() {
                return Err(format!("update_slots axis {axis} must be a non-batch axis of {o}"));
            }
            if s.dtype != DType::I32 || s.rank() != 2 || s.shape[0] != o.shape[0] {
                return Err(format!("update_slots slots must be i32[{},T], found {s}", o.shape[0]));
            }
            let mut expect = o.shape.clone();
            expect[*axis] = s.shape[1];
            if u.dtype != o.dtype || u.shape != expect {
                return Err(format!("update_slots updates must be {}, found {u}", o.with_shape(expect)));
            }
            Ok(o)
        }
    }
}

/// `dequantize`: integer values `[..., n]`, float scales `[..., n / group]`, a float result of the
/// values' shape.
fn dequantize_type(
    q: &TensorType,
    scale: &TensorType,
    group: usize,
    declared: TensorType,
) -> Result<TensorType, String> {
    if !matches!(q.dtype, DType::I4 | DType::I8) || q.rank() == 0 {
        return Err(format!("dequantize needs i4 or i8 values of rank >= 1, found {q}"));
    }
    let n = q.shape[q.rank() - 1];
    if group == 0 || !n.is_multiple_of(group) {
        return Err(format!("dequantize group {group} does not divide the last dimension of {q}"));
    }
    let mut groups = q.shape.clone();
    groups[q.rank() - 1] = n / group;
    if !scale.dtype.is_float() || scale.shape != groups {
        return Err(format!(
            "dequantize scales must be a float {groups:?} for {q} in groups of {group}, found {scale}"
        ));
    }
    if !declared.dtype.is_float() || declared.shape != q.shape {
        return Err(format!("dequantize of {q} cannot produce {declared}"));
    }
    Ok(declared)
}

/// Shape of `dot_general(lhs, rhs)`: batch dims, then lhs free dims, then rhs free dims.
pub fn dot_shape(l: &TensorType, r: &TensorType, d: &DotDims) -> Result<Vec<usize>, String> {
    let err = |m: String| Err(format!("dot_general {l} x {r}: {m}"));
    if d.lhs_batch.len() != d.rhs_batch.len() || d.lhs_contract.len() != d.rhs_contract.len() {
        return err("batch/contract dimension lists differ in length".into());
    }
    let lhs_used: Vec<usize> = d.lhs_batch.iter().chain(&d.lhs_contract).copied().collect();
    let rhs_used: Vec<usize> = d.rhs_batch.iter().chain(&d.rhs_contract).copied().collect();
    check_axes(&lhs_used, l.rank(), "lhs dims")?;
    check_axes(&rhs_used, r.rank(), "rhs dims")?;
    for (a, b) in lhs_used.iter().zip(&rhs_used) {
        if l.shape[*a] != r.shape[*b] {
            return err(format!("lhs dim {a} ({}) != rhs dim {b} ({})", l.shape[*a], r.shape[*b]));
        }
    }
    let mut shape: Vec<usize> = d.lhs_batch.iter().map(|&a| l.shape[a]).collect();
    shape.extend((0..l.rank()).filter(|a| !lhs_used.contains(a)).map(|a| l.shape[a]));
    shape.extend((0..r.rank()).filter(|a| !rhs_used.contains(a)).map(|a| r.shape[a]));
    Ok(shape)
}

fn check_axes(axes: &[usize], rank: usize, what: &str) -> Result<(), String> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(format!("{what} {axes:?}: {a} out of range for rank {rank}"));
        }
        if axes[..i].contains(&a) {
            return Err(format!("{what} {axes:?}: {a} repeated"));
        }
    }
    Ok(())
}

fn is_permutation(perm: &[usize]) -> bool {
    let mut seen = vec![false; perm.len()];
    perm.iter().all(|&p| p < perm.len() && !std::mem::replace(&mut seen[p], true))
}
