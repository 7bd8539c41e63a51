//! The mixture of experts beside a layer's MLP (`enable_moe_block`, Gemma 4 26B-A4B), as
//! transformers' `Gemma4TextRouter` and `Gemma4TextExperts` compute it: a router scores the experts
//! from the residual stream, keeps the `top_k` most probable, and the token's output is their
//! outputs weighted by their renormalized probabilities times a per-expert scale.
//!
//! A decode step (one token per row) reads only the experts picked: their weights are gathered by
//! index. A prefill runs every expert on every token, weighted zero where the router did not pick
//! it: its tokens pick most experts between them, and gathering each token's would copy the
//! weights once per token.

use super::nn::Graph;
use crate::config::MoeSpec;
use g4c_ir::{BinaryOp, CompareDir, DType, DotDims, ReduceKind, TensorType, ValueId};

/// The experts' output for the residual stream `h: [B, T, D]` of layer `l` (before its
/// `post_feedforward_layernorm_2`).
pub fn mixture_of_experts(g: &mut Graph, moe: &MoeSpec, eps: f64, l: usize, h: ValueId) -> ValueId {
    let y = |s: &str| format!("layers.{l}.{s}");
    let [b, t, d] = g.b.shape(h)[..] else { unreachable!("hidden state is [B, T, D]") };
    let (e, inner) = (moe.num_experts, moe.intermediate_size);

    // The router: unweighted RMSNorm, its scale and 1/√D, then the experts' probabilities.
    let x = g.rms_norm(h, None, eps);
    let scale = g.w(&y("router.scale"));
    let scale = g.b.broadcast_to(scale, &[b, t, d]);
    let x = g.b.binary(BinaryOp::Mul, x, scale);
    let x = g.b.binary_scalar(BinaryOp::Mul, x, (d as f64).powf(-0.5));
    let scores = g.linear(x, &y("router.proj"));
    let probs = g.softmax(scores);
    let kept = top_k(g, probs, moe.top_k);
    let total = g.b.reduce(ReduceKind::Sum, kept, &[2]);
    let total = g.b.broadcast(total, &[b, t, e], &[0, 1]);
    let weights = g.b.binary(BinaryOp::Div, kept, total);
    let per_expert = g.w(&y("router.per_expert_scale"));
    let per_expert = g.b.broadcast(per_expert, &[b, t, e], &[2]);
    let weights = g.b.binary(BinaryOp::Mul, weights, per_expert);
    let weights = g.b.name(weights, &format!("l{l}.expert_weights"));
    let x = g.rms_norm(h, Some(&y("pre_feedforward_layernorm_2")), eps);
    if t == 1 {
        return picked_experts(g, moe, l, x, weights, kept);
    }

    // Every expert on the normed stream: GELU(gate)·up, then down, `[E, B, T, D]`.
    let gate_up = g.w(&y("experts.gate_up_proj"));
    let dims = DotDims { lhs_contract: vec![2], rhs_contract: vec![2], ..Default::default() };
    let gate_up = g.b.dot_general(x, gate_up, dims); // [B, T, E, 2I]
    let gate = g.b.slice_axis(gate_up, 3, 0, inner);
    let gate = g.gelu_tanh(gate);
    let up = g.b.slice_axis(gate_up, 3, inner, 2 * inner);
    let act = g.b.binary(BinaryOp::Mul, gate, up);
    let down = g.w(&y("experts.down_proj"));
    let dims = DotDims { lhs_batch: vec![2], rhs_batch: vec![0], lhs_contract: vec![3], rhs_contract: vec![2] };
    let out = g.b.dot_general(act, down, dims); // [E, B, T, D]

    let weights = g.b.transpose(weights, &[2, 0, 1]);
    let weights = g.b.broadcast(weights, &[e, b, t, d], &[0, 1, 2]);
    let weighted = g.b.binary(BinaryOp::Mul, out, weights);
    g.b.reduce(ReduceKind::Sum, weighted, &[0])
}

/// The experts' output for the normed stream `x: [B, T, D]` from the experts each token picked
/// (those whose `kept` probability is not zero), their weights gathered by index: `weights: [B, T, E]`
/// (zero where not picked) weighs their outputs.
fn picked_experts(g: &mut Graph, moe: &MoeSpec, l: usize, x: ValueId, weights: ValueId, kept: ValueId) -> ValueId {
    let y = |s: &str| format!("layers.{l}.{s}");
    let [b, t, d] = g.b.shape(x)[..] else { unreachable!("hidden state is [B, T, D]") };
    let (e, k, inner) = (moe.num_experts, moe.top_k, moe.intermediate_size);
    // The `i`-th picked expert of each token, in expert order, and its weight: over the experts,
    // the one with `i` picked ones before it.
    let picks = [b, t, k, e];
    let (one, zero) = (
        g.b.splat(1.0, TensorType::new(DType::F32, [b, t, e])),
        g.b.splat(0.0, TensorType::new(DType::F32, [b, t, e])),
    );
    let none = g.b.splat(0.0, TensorType::new(DType::F32, [b, t, e]));
    let picked = g.b.compare(CompareDir::Gt, kept, none);
    let picked = g.b.select(picked, one, zero);
    let before: Vec<f64> = (0..e * e).map(|i| if i / e < i % e { 1.0 } else { 0.0 }).collect();
    let before = g.b.dense(before, TensorType::new(DType::F32, [e, e]));
    let dims = DotDims { lhs_contract: vec![2], rhs_contract: vec![0], ..Default::default() };
    let order = g.b.dot_general(picked, before, dims); // [B, T, E]: picked experts before each
    let order = g.b.broadcast(order, &picks, &[0, 1, 3]);
    let slot: Vec<f64> = (0..k * e).map(|i| (i / e) as f64).collect();
    let slot = g.b.dense(slot, TensorType::new(DType::F32, [k, e]));
    let slot = g.b.broadcast(slot, &picks, &[2, 3]);
    let at = g.b.compare(CompareDir::Eq, order, slot);
    let picked = g.b.broadcast(picked, &picks, &[0, 1, 3]);
    let one = g.b.splat(1.0, TensorType::new(DType::F32, picks));
    let is_picked = g.b.compare(CompareDir::Eq, picked, one);
    let at = g.b.binary(BinaryOp::And, at, is_picked); // [B, T, K, E]: expert e is pick i
    let zeros = g.b.splat(0.0, TensorType::new(DType::F32, picks));
    let expert: Vec<f64> = (0..k * e).map(|i| (i % e) as f64).collect();
    let expert = g.b.dense(expert, TensorType::new(DType::F32, [k, e]));
    let expert = g.b.broadcast(expert, &picks, &[2, 3]);
    let index = g.b.select(at, expert, zeros);
    let index = g.b.reduce(ReduceKind::Sum, index, &[3]);
    let index = g.b.convert(index, DType::I32); // [B, T, K]
    let weight = g.b.broadcast(weights, &picks, &[0, 1, 3]);
    let weight = g.b.select(at, weight, zeros);
    let weight = g.b.reduce(ReduceKind::Sum, weight, &[3]); // [B, T, K]

    let gate_up = g.embedding_rows(&y("experts.gate_up_proj"), index); // [B, T, K, 2I, D]
    let dims = DotDims { lhs_batch: vec![0, 1], rhs_batch: vec![0, 1], lhs_contract: vec![2], rhs_contract: vec![4] };
    let gate_up = g.b.dot_general(x, gate_up, dims); // [B, T, K, 2I]
    let gate = g.b.slice_axis(gate_up, 3, 0, inner);
    let gate = g.gelu_tanh(gate);
    let up = g.b.slice_axis(gate_up, 3, inner, 2 * inner);
    let act = g.b.binary(BinaryOp::Mul, gate, up);
    let down = g.embedding_rows(&y("experts.down_proj"), index); // [B, T, K, D, I]
    let dims =
        DotDims { lhs_batch: vec![0, 1, 2], rhs_batch: vec![0, 1, 2], lhs_contract: vec![3], rhs_contract: vec![4] };
    let out = g.b.dot_general(act, down, dims); // [B, T, K, D]
    let weight = g.b.broadcast(weight, &[b, t, k, d], &[0, 1, 2]);
    let weighted = g.b.binary(BinaryOp::Mul, out, weight);
    g.b.reduce(ReduceKind::Sum, weighted, &[2])
}

/// `probs: [B, T, E]` where each token's `k` largest are (ties to the lower expert, as a stable
/// sort would), zero elsewhere. An expert is kept when fewer than `k` experts rank above it.
fn top_k(g: &mut Graph, probs: ValueId, k: usize) -> ValueId {
    let shape = g.b.shape(probs);
    let e = shape[2];
    let pairs = [shape[0], shape[1], e, e];
    let own = g.b.broadcast(probs, &pairs, &[0, 1, 2]); // [.., e, j] = p_e
    let other = g.b.broadcast(probs, &pairs, &[0, 1, 3]); // [.., e, j] = p_j
    let (one, zero) =
        (g.b.splat(1.0, TensorType::new(DType::F32, pairs)), g.b.splat(0.0, TensorType::new(DType::F32, pairs)));
    let above = g.b.compare(CompareDir::Gt, other, own);
    let above = g.b.select(above, one, zero);
    let tied = g.b.compare(CompareDir::Eq, other, own);
    let tied = g.b.select(tied, one, zero);
    let lower: Vec<f64> = (0..e * e).map(|i| if i % e < i / e { 1.0 } else { 0.0 }).collect();
    let lower = g.b.dense(lower, TensorType::new(DType::F32, [e, e]));
    let lower = g.b.broadcast(lower, &pairs, &[2, 3]);
    let tied_lower = g.b.binary(BinaryOp::Mul, tied, lower);
    let ahead = g.b.binary(BinaryOp::Add, above, tied_lower);
    let rank = g.b.reduce(ReduceKind::Sum, ahead, &[3]);
    let limit = g.b.splat(k as f64, TensorType::new(DType::F32, shape.clone()));
    let kept = g.b.compare(CompareDir::Lt, rank, limit);
    let none = g.b.splat(0.0, TensorType::new(DType::F32, shape));
    g.b.select(kept, probs, none)
}
