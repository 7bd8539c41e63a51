//! Numeric building blocks shared by every layer, each following transformers' Gemma 4 code
//! (`shared/docs/gemma4.md` §2–3). Everything computes in f32; weights are converted once per
//! function from their stored type.

use g4c_ir::{BinaryOp, DType, DotDims, FunctionBuilder, ReduceKind, UnaryOp, ValueId};
use std::collections::HashMap;

/// Masked-out attention scores. Finite, so a query that sees no key at all (a padding token) gets a
/// uniform distribution instead of NaN.
pub const MASKED_SCORE: f64 = -1e30;

pub struct Graph<'w> {
    pub b: FunctionBuilder<'w>,
    weights: HashMap<String, ValueId>,
}

impl<'w> Graph<'w> {
    pub fn new(b: FunctionBuilder<'w>) -> Self {
        Graph { b, weights: HashMap::new() }
    }

    /// Weight `name` as f32 (loaded and converted once per function).
    pub fn w(&mut self, name: &str) -> ValueId {
        if let Some(v) = self.weights.get(name) {
            return *v;
        }
        let raw = self.b.weight(name);
        let v = self.b.convert(raw, DType::F32);
        self.weights.insert(name.to_string(), v);
        v
    }

    /// Rows of embedding table `name` for integer `ids`, as f32. Rows are gathered in the stored
    /// dtype and only they are converted: a whole-table convert of E2B's PLE table would be 9.4 GB.
    pub fn embedding_rows(&mut self, name: &str, ids: ValueId) -> ValueId {
        let table = self.b.weight(name);
        let rows = self.b.gather(table, ids);
        self.b.convert(rows, DType::F32)
    }

    /// A linear layer's weight `W[out, in]` as f32: the weight converted, or, when the checkpoint
    /// quantizes it (`NAME.q` and `NAME.scale`), its values times their group scales. Once per function.
    fn linear_weight(&mut self, name: &str) -> ValueId {
        let (q, scale) = g4c_ir::quantized_names(name);
        let Some((q_decl, s_decl)) = self.b.weight_decl(&q).zip(self.b.weight_decl(&scale)) else {
            return self.w(name);
        };
        if let Some(v) = self.weights.get(name) {
            return *v;
        }
        let group = q_decl.ty.shape[1] / s_decl.ty.shape[1];
        let (qv, sv) = (self.b.weight(&q), self.b.weight(&scale));
        let w = self.b.dequantize(qv, sv, group, DType::F32);
        let w = self.b.name(w, name);
        self.weights.insert(name.to_string(), w);
        w
    }

    /// `x · Wᵀ` for an HF linear weight `W[out, in]`: `[..., in]` to `[..., out]`.
    pub fn linear(&mut self, x: ValueId, weight: &str) -> ValueId {
        let w = self.linear_weight(weight);
        let rank = self.b.ty(x).rank();
        let dims = DotDims { lhs_contract: vec![rank - 1], rhs_contract: vec![1], ..Default::default() };
        self.b.dot_general(x, w, dims)
    }

    /// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps)`, times `weight` (`x̂·w`, not `x̂·(1+w)`)
    /// when given. transformers computes it as `x * pow(mean + eps, -0.5)`.
    pub fn rms_norm(&mut self, x: ValueId, weight: Option<&str>, eps: f64) -> ValueId {
        let shape = self.b.shape(x);
        let rank = shape.len();
        let n = shape[rank - 1] as f64;
        let sq = self.b.binary(BinaryOp::Mul, x, x);
        let sum = self.b.reduce(ReduceKind::Sum, sq, &[rank - 1]);
        let mean = self.b.binary_scalar(BinaryOp::Div, sum, n);
        let shifted = self.b.binary_scalar(BinaryOp::Add, mean, eps);
        let inv = self.b.unary(UnaryOp::Rsqrt, shifted);
        let inv = self.b.broadcast(inv, &shape, &(0..rank - 1).collect::<Vec<_>>());
        let normed = self.b.binary(BinaryOp::Mul, x, inv);
        match weight {
            None => normed,
            Some(name) => {
                let w = self.w(name);
                let w = self.b.broadcast_to(w, &shape);
                self.b.binary(BinaryOp::Mul, normed, w)
            }
        }
    }

    /// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    pub fn gelu_tanh(&mut self, x: ValueId) -> ValueId {
        let x2 = self.b.binary(BinaryOp::Mul, x, x);
        let x3 = self.b.binary(BinaryOp::Mul, x2, x);
        let cubic = self.b.binary_scalar(BinaryOp::Mul, x3, 0.044715);
        let inner = self.b.binary(BinaryOp::Add, x, cubic);
        let inner = self.b.binary_scalar(BinaryOp::Mul, inner, (2.0 / std::f64::consts::PI).sqrt());
        let t = self.b.unary(UnaryOp::Tanh, inner);
        let one_plus = self.b.binary_scalar(BinaryOp::Add, t, 1.0);
        let half_x = self.b.binary_scalar(BinaryOp::Mul, x, 0.5);
        self.b.binary(BinaryOp::Mul, half_x, one_plus)
    }

    /// Softmax over the last axis, max-subtracted.
    pub fn softmax(&mut self, x: ValueId) -> ValueId {
        let shape = self.b.shape(x);
        let rank = shape.len();
        let keep: Vec<usize> = (0..rank - 1).collect();
        let max = self.b.reduce(ReduceKind::Max, x, &[rank - 1]);
        let max = self.b.broadcast(max, &shape, &keep);
        let shifted = self.b.binary(BinaryOp::Sub, x, max);
        let e = self.b.unary(UnaryOp::Exp, shifted);
        let sum = self.b.reduce(ReduceKind::Sum, e, &[rank - 1]);
        let sum = self.b.broadcast(sum, &shape, &keep);
        self.b.binary(BinaryOp::Div, e, sum)
    }

    /// `cap · tanh(x / cap)`.
    pub fn softcap(&mut self, x: ValueId, cap: f64) -> ValueId {
        let scaled = self.b.binary_scalar(BinaryOp::Div, x, cap);
        let t = self.b.unary(UnaryOp::Tanh, scaled);
        self.b.binary_scalar(BinaryOp::Mul, t, cap)
    }
}
