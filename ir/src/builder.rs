//! Appends well-typed instructions to a function. Result types come from `infer_type`, so a builder
//! can only produce IR the verifier accepts; an ill-typed request is a bug in the caller and panics
//! with the op and the mismatch.
//!
//! Every value gets a name as it is built: the ones the caller chooses (`name`, and weights, named
//! after themselves), and after the last chosen one, `{that name}.{k}` for the k-th value since. A
//! pass that removes or adds an instruction then changes only those lines of a dump, not the names
//! of everything after them.

use crate::{
    infer_type, BinaryOp, CompareDir, DType, DotDims, FuncResult, Function, Instr, Literal, Op, Param, ParamRole,
    ReduceKind, ResultRole, TensorType, UnaryOp, ValueId, WeightDecl,
};
use std::collections::HashSet;

pub struct FunctionBuilder<'w> {
    func: Function,
    weights: &'w [WeightDecl],
    names: HashSet<String>,
    /// Values whose names were chosen (parameters, weights, `name`): they keep them.
    chosen: HashSet<ValueId>,
    /// The last chosen name and how many values have been named after it since.
    anchor: Option<(String, usize)>,
}

impl<'w> FunctionBuilder<'w> {
    pub fn new(name: impl Into<String>, weights: &'w [WeightDecl]) -> Self {
        FunctionBuilder {
            func: Function::new(name),
            weights,
            names: HashSet::new(),
            chosen: HashSet::new(),
            anchor: None,
        }
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.func.ty(v)
    }

    /// The module weight `name`, if it is declared.
    pub fn weight_decl(&self, name: &str) -> Option<&'w WeightDecl> {
        self.weights.iter().find(|w| w.name == name)
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.func.ty(v).shape.clone()
    }

    /// A per-call input parameter without a model role.
    pub fn input(&mut self, name: &str, ty: TensorType) -> ValueId {
        self.param(name, ty, ParamRole::Input)
    }

    /// A parameter carrying `role` (`abi`).
    pub fn param(&mut self, name: &str, ty: TensorType, role: ParamRole) -> ValueId {
        assert!(self.names.insert(name.to_string()), "duplicate parameter name {name}");
        let value = self.func.new_value(ty, Some(name.to_string()));
        self.func.params.push(Param { value, role });
        self.chosen.insert(value);
        value
    }

    /// Names `v` (made unique with a `.N` suffix when taken), and the values built after it after
    /// it; a value whose name was chosen before (a parameter, a weight, an op the builder elided and
    /// returned the operand of) keeps it.
    pub fn name(&mut self, v: ValueId, name: &str) -> ValueId {
        if !self.chosen.insert(v) {
            return v;
        }
        if let Some(auto) = self.func.values[v.index()].name.take() {
            self.names.remove(&auto);
        }
        let mut candidate = name.to_string();
        let mut n = 1;
        while self.names.contains(&candidate) || candidate.chars().all(|c| c.is_ascii_digit()) {
            candidate = format!("{name}.{n}");
            n += 1;
        }
        self.names.insert(candidate.clone());
        self.func.values[v.index()].name = Some(candidate.clone());
        self.anchor = Some((candidate, 0));
        v
    }

    /// The next name after the anchor, if there is one yet.
    fn auto_name(&mut self) -> Option<String> {
        let (anchor, k) = self.anchor.as_mut()?;
        loop {
            *k += 1;
            let candidate = format!("{anchor}.{k}");
            if self.names.insert(candidate.clone()) {
                return Some(candidate);
            }
        }
    }

    /// Appends `op`; `declared` is required for ops whose result type is not implied by operands.
    pub fn op(&mut self, op: Op, declared: Option<TensorType>) -> ValueId {
        let operands = op.operands();
        let ty = infer_type(
            &op,
            &|i| self.func.ty(operands[i]).clone(),
            &|n| self.weights.iter().find(|w| w.name == n).map(|w| w.ty.clone()),
            declared.as_ref(),
        )
        .unwrap_or_else(|e| panic!("ill-typed `{}` in @{}: {e}", op.mnemonic(), self.func.name));
        let name = self.auto_name();
        let result = self.func.new_value(ty, name);
        self.func.body.push(Instr { result, op });
        result
    }

    /// The function, returning `results` in order (a `NextState` result is named like its state).
    pub fn finish(mut self, results: Vec<(&str, ValueId, ResultRole)>) -> Function {
        self.func.results =
            results.into_iter().map(|(name, value, role)| FuncResult { name: name.to_string(), value, role }).collect();
        self.func
    }

    // ---- one method per op ----

    /// Reads weight `name`; the value is named after it.
    pub fn weight(&mut self, name: &str) -> ValueId {
        let v = self.op(Op::Weight { name: name.to_string() }, None);
        self.name(v, name)
    }

    pub fn splat(&mut self, value: f64, ty: TensorType) -> ValueId {
        self.op(Op::Constant { literal: Literal::Splat(value) }, Some(ty))
    }

    pub fn scalar(&mut self, value: f64, dtype: DType) -> ValueId {
        self.splat(value, TensorType::scalar(dtype))
    }

    pub fn dense(&mut self, values: Vec<f64>, ty: TensorType) -> ValueId {
        self.op(Op::Constant { literal: Literal::Dense(values) }, Some(ty))
    }

    pub fn iota(&mut self, dim: usize, ty: TensorType) -> ValueId {
        self.op(Op::Iota { dim }, Some(ty))
    }

    pub fn unary(&mut self, u: UnaryOp, x: ValueId) -> ValueId {
        self.op(Op::Unary { op: u, x }, None)
    }

    pub fn binary(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Binary { op: b, lhs: x, rhs: y }, None)
    }

    pub fn compare(&mut self, dir: CompareDir, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Compare { lhs: x, rhs: y, dir }, None)
    }

    pub fn select(&mut self, cond: ValueId, on_true: ValueId, on_false: ValueId) -> ValueId {
        self.op(Op::Select { cond, on_true, on_false }, None)
    }

    pub fn convert(&mut self, x: ValueId, dtype: DType) -> ValueId {
        if self.ty(x).dtype == dtype {
            return x;
        }
        let ty = self.ty(x).with_dtype(dtype);
        self.op(Op::Convert { x }, Some(ty))
    }

    pub fn reduce(&mut self, kind: ReduceKind, x: ValueId, axes: &[usize]) -> ValueId {
        self.op(Op::Reduce { kind, input: x, axes: axes.to_vec() }, None)
    }

    pub fn reshape(&mut self, x: ValueId, shape: &[usize]) -> ValueId {
        if self.ty(x).shape == shape {
            return x;
        }
        let ty = self.ty(x).with_shape(shape);
        self.op(Op::Reshape { x }, Some(ty))
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[usize]) -> ValueId {
        self.op(Op::Transpose { input: x, perm: perm.to_vec() }, None)
    }

    pub fn broadcast(&mut self, x: ValueId, shape: &[usize], dims: &[usize]) -> ValueId {
        if self.ty(x).shape == shape {
            return x;
        }
        let ty = self.ty(x).with_shape(shape);
        self.op(Op::Broadcast { input: x, dims: dims.to_vec() }, Some(ty))
    }

    pub fn slice(&mut self, x: ValueId, start: &[usize], limit: &[usize]) -> ValueId {
        self.op(Op::Slice { input: x, start: start.to_vec(), limit: limit.to_vec() }, None)
    }

    /// Slice of `[start, limit)` along one axis, everything along the others.
    pub fn slice_axis(&mut self, x: ValueId, axis: usize, start: usize, limit: usize) -> ValueId {
        let shape = self.shape(x);
        let mut lo = vec![0; shape.len()];
        let mut hi = shape;
        lo[axis] = start;
        hi[axis] = limit;
        self.slice(x, &lo, &hi)
    }

    pub fn concat(&mut self, inputs: &[ValueId], axis: usize) -> ValueId {
        self.op(Op::Concat { inputs: inputs.to_vec(), axis }, None)
    }

    pub fn dot_general(&mut self, lhs: ValueId, rhs: ValueId, dims: DotDims) -> ValueId {
        self.op(Op::DotGeneral { lhs, rhs, dims }, None)
    }

    pub fn gather(&mut self, table: ValueId, indices: ValueId) -> ValueId {
        self.op(Op::Gather { table, indices }, None)
    }

    pub fn update_slots(&mut self, operand: ValueId, slots: ValueId, updates: ValueId, axis: usize) -> ValueId {
        self.op(Op::UpdateSlots { operand, slots, updates, axis }, None)
    }

    /// `q · scale` per group of `group` along the last axis, as `dtype`.
    pub fn dequantize(&mut self, q: ValueId, scale: ValueId, group: usize, dtype: DType) -> ValueId {
        let ty = self.ty(q).with_dtype(dtype);
        self.op(Op::Dequantize { q, scale, group }, Some(ty))
    }

    // ---- conveniences built from the ops above ----

    /// Numpy-style broadcast of `x` to `shape` (trailing dimensions aligned).
    pub fn broadcast_to(&mut self, x: ValueId, shape: &[usize]) -> ValueId {
        let rank = self.ty(x).rank();
        assert!(rank <= shape.len(), "cannot broadcast {} to {shape:?}", self.ty(x));
        let dims: Vec<usize> = (shape.len() - rank..shape.len()).collect();
        self.broadcast(x, shape, &dims)
    }

    /// An entry point's greedy tokens (`ResultRole::GreedyTokens`): the argmax of `logits` along
    /// the last axis, as `i32` without that axis; the lowest id on ties, as the host's greedy
    /// sampler picks, and -1 (no token) where a row holds a value that is not finite, which the host
    /// refuses to pick from. Each element is a candidate: its id where it equals the row's max, the
    /// vocabulary size where it does not, -1 where it is not finite (`0·x` is not 0); the least
    /// candidate is the result. So no backend's handling of NaN in a max matters (XLA's CPU max
    /// drops NaN operands).
    pub fn greedy_tokens(&mut self, logits: ValueId) -> ValueId {
        let shape = self.shape(logits);
        let axis = shape.len() - 1;
        let keep: Vec<usize> = (0..axis).collect();
        let max = self.reduce(ReduceKind::Max, logits, &[axis]);
        let max = self.broadcast(max, &shape, &keep);
        let hit = self.compare(CompareDir::Eq, logits, max);
        let ids = TensorType::new(DType::I32, shape.clone());
        let id = self.iota(axis, ids.clone());
        let none = self.splat(shape[axis] as f64, ids.clone());
        let candidate = self.select(hit, id, none);
        let zero = self.splat(0.0, self.ty(logits).clone());
        let product = self.binary(BinaryOp::Mul, logits, zero);
        let finite = self.compare(CompareDir::Eq, product, zero);
        let refused = self.splat(-1.0, ids);
        let candidate = self.select(finite, candidate, refused);
        self.reduce(ReduceKind::Min, candidate, &[axis])
    }

    /// `x op c` for a scalar constant `c` of `x`'s element type.
    pub fn binary_scalar(&mut self, b: BinaryOp, x: ValueId, c: f64) -> ValueId {
        let ty = self.ty(x).clone();
        let c = self.splat(c, ty);
        self.binary(b, x, c)
    }
}

/// The numpy broadcast of two shapes, if they are compatible.
pub fn common_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| if i + s.len() >= n { s[i + s.len() - n] } else { 1 };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::common_shape;

    #[test]
    fn numpy_broadcasting() {
        assert_eq!(common_shape(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(common_shape(&[], &[5]), Some(vec![5]));
        assert_eq!(common_shape(&[2, 3], &[4, 3]), None);
    }
}
