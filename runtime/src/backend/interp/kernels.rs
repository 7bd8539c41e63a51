//! Straightforward f32 implementations of every op, written for clarity over speed: this is the
//! oracle that passes and backends are checked against.

use crate::tensor::{storage_of, Data, Storage, Tensor};
use g4c_ir::scalar::{self, round_float};
use g4c_ir::{BinaryOp, CompareDir, DType, DotDims, Literal, ReduceKind, TensorType, UnaryOp};
use std::sync::Arc;

type KResult = Result<Tensor, String>;

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Applies `index_map(out_index) -> in_index` to gather a new tensor of type `ty` from `x`.
fn remap(x: &Tensor, ty: TensorType, index_map: impl Fn(usize) -> usize) -> Tensor {
    let n = ty.numel();
    let data = match &x.data {
        Data::F32(v) => Data::F32((0..n).map(|i| v[index_map(i)]).collect()),
        Data::I32(v) => Data::I32((0..n).map(|i| v[index_map(i)]).collect()),
        Data::Bool(v) => Data::Bool((0..n).map(|i| v[index_map(i)]).collect()),
    };
    Tensor::of_type(ty, data)
}

pub fn constant(lit: &Literal, ty: &TensorType) -> Tensor {
    match lit {
        Literal::Splat(v) => Tensor::filled(ty.clone(), *v),
        Literal::Dense(vs) => {
            let data = match storage_of(ty.dtype) {
                Storage::F32 => Data::F32(vs.iter().map(|&v| round_float(ty.dtype, v as f32)).collect()),
                Storage::I32 => Data::I32(vs.iter().map(|&v| v as i32).collect()),
                Storage::Bool => Data::Bool(vs.iter().map(|&v| v != 0.0).collect()),
            };
            Tensor::of_type(ty.clone(), data)
        }
    }
}

pub fn iota(dim: usize, ty: &TensorType) -> Tensor {
    let st = strides(&ty.shape);
    let idx = |i: usize| (i / st[dim]) % ty.shape[dim];
    let n = ty.numel();
    let data = match storage_of(ty.dtype) {
        Storage::F32 => Data::F32((0..n).map(|i| round_float(ty.dtype, idx(i) as f32)).collect()),
        _ => Data::I32((0..n).map(|i| idx(i) as i32).collect()),
    };
    Tensor::of_type(ty.clone(), data)
}

pub fn unary(op: UnaryOp, x: &Tensor) -> KResult {
    let dt = x.ty.dtype;
    let data = match &x.data {
        Data::F32(v) => {
            let Some(f) = scalar::unary_f32(op) else { return Err(format!("`{op}` on floats")) };
            Data::F32(v.iter().map(|&a| round_float(dt, f(a))).collect())
        }
        Data::I32(v) => {
            let out: Option<Vec<i32>> = v.iter().map(|&a| scalar::unary_int(op, dt, a)).collect();
            Data::I32(out.ok_or_else(|| format!("`{op}` on integers"))?.into())
        }
        Data::Bool(v) => match op {
            UnaryOp::Not => Data::Bool(v.iter().map(|a| !a).collect()),
            _ => return Err(format!("`{op}` on bool")),
        },
    };
    Ok(Tensor::of_type(x.ty.clone(), data))
}

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> KResult {
    let dt = a.ty.dtype;
    let data = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => {
            let Some(f) = scalar::binary_f32(op) else { return Err(format!("`{op}` on floats")) };
            Data::F32(x.iter().zip(y.iter()).map(|(&p, &q)| round_float(dt, f(p, q))).collect())
        }
        (Data::I32(x), Data::I32(y)) => {
            let out: Result<Vec<i32>, String> =
                x.iter().zip(y.iter()).map(|(&p, &q)| scalar::binary_int(op, dt, p, q)).collect();
            let out = out?;
            Data::I32(out.into())
        }
        (Data::Bool(x), Data::Bool(y)) => match op {
            BinaryOp::And => Data::Bool(x.iter().zip(y.iter()).map(|(&p, &q)| p && q).collect()),
            BinaryOp::Or => Data::Bool(x.iter().zip(y.iter()).map(|(&p, &q)| p || q).collect()),
            _ => return Err(format!("`{op}` on bool")),
        },
        _ => return Err("operands of different storage".into()),
    };
    Ok(Tensor::of_type(a.ty.clone(), data))
}

pub fn compare(dir: CompareDir, a: &Tensor, b: &Tensor) -> KResult {
    let out: Arc<[bool]> = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => x.iter().zip(y.iter()).map(|(&p, &q)| scalar::compare(dir, p, q)).collect(),
        (Data::I32(x), Data::I32(y)) => x.iter().zip(y.iter()).map(|(&p, &q)| scalar::compare(dir, p, q)).collect(),
        (Data::Bool(x), Data::Bool(y)) => x.iter().zip(y.iter()).map(|(&p, &q)| scalar::compare(dir, p, q)).collect(),
        _ => return Err("operands of different storage".into()),
    };
    Ok(Tensor::of_type(a.ty.with_dtype(DType::Bool), Data::Bool(out)))
}

pub fn select(c: &Tensor, t: &Tensor, f: &Tensor) -> KResult {
    let Data::Bool(c) = &c.data else { return Err("condition is not bool".into()) };
    let data = match (&t.data, &f.data) {
        (Data::F32(x), Data::F32(y)) => {
            Data::F32(c.iter().zip(x.iter().zip(y.iter())).map(|(&c, (&p, &q))| if c { p } else { q }).collect())
        }
        (Data::I32(x), Data::I32(y)) => {
            Data::I32(c.iter().zip(x.iter().zip(y.iter())).map(|(&c, (&p, &q))| if c { p } else { q }).collect())
        }
        (Data::Bool(x), Data::Bool(y)) => {
            Data::Bool(c.iter().zip(x.iter().zip(y.iter())).map(|(&c, (&p, &q))| if c { p } else { q }).collect())
        }
        _ => return Err("branches of different storage".into()),
    };
    Ok(Tensor::of_type(t.ty.clone(), data))
}

/// Element conversion with StableHLO semantics: floats round to nearest even, float to int truncates
/// toward zero, anything to bool is `!= 0`.
pub fn convert(x: &Tensor, to: DType) -> KResult {
    let ty = x.ty.with_dtype(to);
    let data = match (&x.data, storage_of(to)) {
        (Data::F32(v), Storage::F32) => {
            if matches!(to, DType::F32) || x.ty.dtype == to {
                Data::F32(v.clone()) // every narrower float is exactly representable in f32
            } else {
                Data::F32(v.iter().map(|&a| round_float(to, a)).collect())
            }
        }
        (Data::F32(v), Storage::I32) => Data::I32(v.iter().map(|&a| scalar::wrap_int(to, a.trunc() as i64)).collect()),
        (Data::F32(v), Storage::Bool) => Data::Bool(v.iter().map(|&a| a != 0.0).collect()),
        (Data::I32(v), Storage::F32) => Data::F32(v.iter().map(|&a| round_float(to, a as f32)).collect()),
        (Data::I32(v), Storage::I32) => Data::I32(v.iter().map(|&a| scalar::wrap_int(to, a as i64)).collect()),
        (Data::I32(v), Storage::Bool) => Data::Bool(v.iter().map(|&a| a != 0).collect()),
        (Data::Bool(v), Storage::F32) => Data::F32(v.iter().map(|&a| a as u8 as f32).collect()),
        (Data::Bool(v), Storage::I32) => Data::I32(v.iter().map(|&a| a as i32).collect()),
        (Data::Bool(v), Storage::Bool) => Data::Bool(v.clone()),
    };
    Ok(Tensor::of_type(ty, data))
}

pub fn reduce(kind: ReduceKind, x: &Tensor, axes: &[usize], ty: &TensorType) -> KResult {
    let in_st = strides(&x.ty.shape);
    let out_st = strides(&ty.shape);
    let kept: Vec<usize> = (0..x.ty.rank()).filter(|d| !axes.contains(d)).collect();
    let out_index = |i: usize| -> usize {
        kept.iter().enumerate().map(|(o, &d)| ((i / in_st[d]) % x.ty.shape[d]) * out_st[o]).sum()
    };
    let n_out = ty.numel();
    match &x.data {
        Data::F32(v) => {
            let init = match kind {
                ReduceKind::Sum => 0.0,
                ReduceKind::Max => f32::NEG_INFINITY,
                ReduceKind::Min => f32::INFINITY,
            };
            let mut out = vec![init; n_out];
            for (i, &a) in v.iter().enumerate() {
                let o = &mut out[out_index(i)];
                *o = match kind {
                    ReduceKind::Sum => *o + a,
                    ReduceKind::Max => scalar::maximum(*o, a),
                    ReduceKind::Min => scalar::minimum(*o, a),
                };
            }
            let dt = ty.dtype;
            Ok(Tensor::of_type(ty.clone(), Data::F32(out.into_iter().map(|a| round_float(dt, a)).collect())))
        }
        Data::I32(v) => {
            let (min, max) = scalar::int_range(ty.dtype);
            let init = match kind {
                ReduceKind::Sum => 0,
                ReduceKind::Max => min,
                ReduceKind::Min => max,
            };
            let mut out = vec![init; n_out];
            for (i, &a) in v.iter().enumerate() {
                let o = &mut out[out_index(i)];
                *o = match kind {
                    ReduceKind::Sum => o.wrapping_add(a),
                    ReduceKind::Max => (*o).max(a),
                    ReduceKind::Min => (*o).min(a),
                };
            }
            let dt = ty.dtype;
            Ok(Tensor::of_type(
                ty.clone(),
                Data::I32(out.into_iter().map(|a| scalar::wrap_int(dt, a as i64)).collect()),
            ))
        }
        Data::Bool(_) => Err("reduce on bool".into()),
    }
}

pub fn reshape(x: &Tensor, ty: &TensorType) -> Tensor {
    Tensor::of_type(ty.clone(), x.data.clone())
}

pub fn transpose(x: &Tensor, perm: &[usize], ty: &TensorType) -> Tensor {
    let in_st = strides(&x.ty.shape);
    let out_st = strides(&ty.shape);
    remap(x, ty.clone(), |i| (0..perm.len()).map(|o| ((i / out_st[o]) % ty.shape[o]) * in_st[perm[o]]).sum())
}

pub fn broadcast(x: &Tensor, dims: &[usize], ty: &TensorType) -> Tensor {
    let in_st = strides(&x.ty.shape);
    let out_st = strides(&ty.shape);
    remap(x, ty.clone(), |i| {
        dims.iter()
            .enumerate()
            .map(|(d, &o)| if x.ty.shape[d] == 1 { 0 } else { ((i / out_st[o]) % ty.shape[o]) * in_st[d] })
            .sum()
    })
}

pub fn slice(x: &Tensor, start: &[usize], ty: &TensorType) -> Tensor {
    let in_st = strides(&x.ty.shape);
    let out_st = strides(&ty.shape);
    remap(x, ty.clone(), |i| (0..ty.rank()).map(|d| (((i / out_st[d]) % ty.shape[d]) + start[d]) * in_st[d]).sum())
}

pub fn concat(xs: &[&Tensor], axis: usize, ty: &TensorType) -> KResult {
    // Row-major: the result is, for each outer index, the inputs' inner blocks one after another.
    let outer: usize = ty.shape[..axis].iter().product();
    let inner = |t: &Tensor| -> usize { t.ty.shape[axis..].iter().product() };
    macro_rules! join {
        ($variant:ident) => {{
            let mut out = Vec::with_capacity(ty.numel());
            for o in 0..outer {
                for x in xs {
                    let Data::$variant(v) = &x.data else { return Err("operands of different storage".into()) };
                    let n = inner(x);
                    out.extend_from_slice(&v[o * n..(o + 1) * n]);
                }
            }
            Data::$variant(out.into())
        }};
    }
    let data = match &xs[0].data {
        Data::F32(_) => join!(F32),
        Data::I32(_) => join!(I32),
        Data::Bool(_) => join!(Bool),
    };
    Ok(Tensor::of_type(ty.clone(), data))
}

/// `dot_general`: both operands are laid out as `[batch, free, contract]` (transposing when needed),
/// then every output element is a contiguous dot product accumulated in f32.
pub fn dot_general(l: &Tensor, r: &Tensor, d: &DotDims, ty: &TensorType) -> KResult {
    let free = |rank: usize, used: &[&[usize]]| -> Vec<usize> {
        (0..rank).filter(|a| used.iter().all(|u| !u.contains(a))).collect()
    };
    let l_free = free(l.ty.rank(), &[&d.lhs_batch, &d.lhs_contract]);
    let r_free = free(r.ty.rank(), &[&d.rhs_batch, &d.rhs_contract]);
    let arrange = |t: &Tensor, batch: &[usize], fr: &[usize], contract: &[usize]| -> Tensor {
        let perm: Vec<usize> = batch.iter().chain(fr).chain(contract).copied().collect();
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return t.clone();
        }
        let shape: Vec<usize> = perm.iter().map(|&p| t.ty.shape[p]).collect();
        transpose(t, &perm, &t.ty.with_shape(shape))
    };
    let lt = arrange(l, &d.lhs_batch, &l_free, &d.lhs_contract);
    let rt = arrange(r, &d.rhs_batch, &r_free, &d.rhs_contract);
    let size = |t: &Tensor, dims: &[usize]| -> usize { dims.iter().map(|&a| t.ty.shape[a]).product() };
    let batch = size(l, &d.lhs_batch);
    let m = size(l, &l_free);
    let n = size(r, &r_free);
    let k = size(l, &d.lhs_contract);
    let (Some(a), Some(b)) = (lt.as_f32(), rt.as_f32()) else { return Err("dot_general on non-float data".into()) };
    let mut out = vec![0f32; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            let row = &a[(bi * m + i) * k..(bi * m + i + 1) * k];
            for j in 0..n {
                let col = &b[(bi * n + j) * k..(bi * n + j + 1) * k];
                out[(bi * m + i) * n + j] = round_float(ty.dtype, dot(row, col));
            }
        }
    }
    Ok(Tensor::of_type(ty.clone(), Data::F32(out.into())))
}

/// Dot product with eight independent partial sums (lets the compiler vectorise).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

pub fn gather(table: &Tensor, indices: &Tensor, ty: &TensorType) -> KResult {
    let rows = table.ty.shape[0];
    let row_len: usize = table.ty.shape[1..].iter().product();
    let Some(idx) = indices.as_i32() else { return Err("gather indices are not integers".into()) };
    for &i in idx {
        if i < 0 || i as usize >= rows {
            return Err(format!("index {i} out of range for a table of {rows} rows"));
        }
    }
    Ok(remap(table, ty.clone(), |o| idx[o / row_len] as usize * row_len + o % row_len))
}

pub fn update_slots(operand: &Tensor, slots: &Tensor, updates: &Tensor, axis: usize) -> KResult {
    let shape = &operand.ty.shape;
    let (b, s, t) = (shape[0], shape[axis], updates.ty.shape[axis]);
    let outer: usize = shape[1..axis].iter().product(); // dims between batch and the slot axis
    let inner: usize = shape[axis + 1..].iter().product();
    let Some(slot_ids) = slots.as_i32() else { return Err("slots are not i32".into()) };
    for row in 0..b {
        let row_slots = &slot_ids[row * t..(row + 1) * t];
        for (i, &x) in row_slots.iter().enumerate() {
            if x >= 0 && row_slots[..i].contains(&x) {
                return Err(format!("slot {x} written twice in row {row}"));
            }
        }
    }
    macro_rules! scatter {
        ($variant:ident) => {{
            let (Data::$variant(base), Data::$variant(upd)) = (&operand.data, &updates.data) else {
                return Err("operand and updates of different storage".into());
            };
            let mut out = base.to_vec();
            for row in 0..b {
                for ti in 0..t {
                    let slot = slot_ids[row * t + ti];
                    if slot < 0 || slot as usize >= s {
                        continue;
                    }
                    for o in 0..outer {
                        let dst = ((row * outer + o) * s + slot as usize) * inner;
                        let src = ((row * outer + o) * t + ti) * inner;
                        out[dst..dst + inner].copy_from_slice(&upd[src..src + inner]);
                    }
                }
            }
            Data::$variant(out.into())
        }};
    }
    let data = match &operand.data {
        Data::F32(_) => scatter!(F32),
        Data::I32(_) => scatter!(I32),
        Data::Bool(_) => scatter!(Bool),
    };
    Ok(Tensor::of_type(operand.ty.clone(), data))
}

/// `q[..., c] · scale[..., c / group]` in f32, rounded to the result's type.
pub fn dequantize(q: &Tensor, scale: &Tensor, group: usize, ty: &TensorType) -> KResult {
    let (Some(qv), Some(s)) = (q.as_i32(), scale.as_f32()) else {
        return Err(format!("dequantize takes integer values and float scales, found {} and {}", q.ty, scale.ty));
    };
    let out = qv.iter().enumerate().map(|(i, &v)| round_float(ty.dtype, v as f32 * s[i / group])).collect();
    Ok(Tensor::of_type(ty.clone(), Data::F32(out)))
}
