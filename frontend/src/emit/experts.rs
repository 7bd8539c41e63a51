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
    let e = moe.num_experts;

    // The router: unweighted RMSNorm, its scale and 1/√D, then the experts' probabilities.
    let x = g.rms_norm(h, None, eps);
    let scale = g.w(&y("router.scale"));
    let scale = g.b.broadcast_to(scale, &[b, t, d]);
    let x = g.b.binary(BinaryOp::Mul, x, scale);
    let x = g.b.binary_scalar(BinaryOp::Mul, x, (d as f64).powf(-0.5));
    let scores = g.linear(x, &y("router.proj"));
    let probs = g.softmax(scores);
    let rank = rank(g, probs);
    let limit = g.b.splat(moe.top_k as f64, TensorType::new(DType::F32, [b, t, e]));
    let picked = g.b.compare(CompareDir::Lt, rank, limit);
    let zero = g.b.splat(0.0, TensorType::new(DType::F32, [b, t, e]));
    let kept = g.b.select(picked, probs, zero);
    let total = g.b.reduce(ReduceKind::Sum, kept, &[2]);
    let total = g.b.broadcast(total, &[b, t, e], &[0, 1]);
    let weights = g.b.binary(BinaryOp::Div, kept, total);
    let per_expert = g.w(&y("router.per_expert_scale"));
    let per_expert = g.b.broadcast(per_expert, &[b, t, e], &[2]);
    let weights = g.b.binary(BinaryOp::Mul, weights, per_expert);
    let weights = g.b.name(weights, &format!("l{l}.expert_weights"));

    let x = g.rms_norm(h, Some(&y("pre_feedforward_layernorm_2")), eps);
    match t {
        1 => picked_experts(g, moe, l, x, weights, rank),
        _ => every_expert(g, moe, l, x, weights),
    }
}

/// Every expert on the normed stream `x: [B, T, D]`, their outputs weighed by `weights: [B, T, E]`.
fn every_expert(g: &mut Graph, moe: &MoeSpec, l: usize, x: ValueId, weights: ValueId) -> ValueId {
    let [b, t, d] = g.b.shape(x)[..] else { unreachable!("hidden state is [B, T, D]") };
    let e = moe.num_experts;
    let gate_up = g.w(&format!("layers.{l}.experts.gate_up_proj"));
    let dims = DotDims { lhs_contract: vec![2], rhs_contract: vec![2], ..Default::default() };
    let gate_up = g.b.dot_general(x, gate_up, dims); // [B, T, E, 2I]
    let act = gelu_gate_times_up(g, gate_up, moe.intermediate_size);
    let down = g.w(&format!("layers.{l}.experts.down_proj"));
    let dims = DotDims { lhs_batch: vec![2], rhs_batch: vec![0], lhs_contract: vec![3], rhs_contract: vec![2] };
    let out = g.b.dot_general(act, down, dims); // [E, B, T, D]
    let weights = g.b.transpose(weights, &[2, 0, 1]);
    let weights = g.b.broadcast(weights, &[e, b, t, d], &[0, 1, 2]);
    let weighted = g.b.binary(BinaryOp::Mul, out, weights);
    g.b.reduce(ReduceKind::Sum, weighted, &[0])
}

/// The experts each token of `x: [B, T, D]` picked (those ranked below `top_k` in `rank`), their
/// weights gathered by index, their outputs weighed by `weights: [B, T, E]`.
fn picked_experts(g: &mut Graph, moe: &MoeSpec, l: usize, x: ValueId, weights: ValueId, rank: ValueId) -> ValueId {
    let [b, t, d] = g.b.shape(x)[..] else { unreachable!("hidden state is [B, T, D]") };
    let (e, k) = (moe.num_experts, moe.top_k);
    // Pick `i` is the expert ranked `i`: its index and its weight.
    let picks = [b, t, k, e];
    let rank = g.b.broadcast(rank, &picks, &[0, 1, 3]);
    let pick: Vec<f64> = (0..k * e).map(|i| (i / e) as f64).collect();
    let pick = g.b.dense(pick, TensorType::new(DType::F32, [k, e]));
    let pick = g.b.broadcast(pick, &picks, &[2, 3]);
    let is_pick = g.b.compare(CompareDir::Eq, rank, pick); // [B, T, K, E]
    let zeros = g.b.splat(0.0, TensorType::new(DType::F32, picks));
    let expert: Vec<f64> = (0..k * e).map(|i| (i % e) as f64).collect();
    let expert = g.b.dense(expert, TensorType::new(DType::F32, [k, e]));
    let expert = g.b.broadcast(expert, &picks, &[2, 3]);
    let index = g.b.select(is_pick, expert, zeros);
    let index = g.b.reduce(ReduceKind::Sum, index, &[3]);
    let index = g.b.convert(index, DType::I32); // [B, T, K]
    let weight = g.b.broadcast(weights, &picks, &[0, 1, 3]);
    let weight = g.b.select(is_pick, weight, zeros);
    let weight = g.b.reduce(ReduceKind::Sum, weight, &[3]); // [B, T, K]

    let gate_up = g.embedding_rows(&format!("layers.{l}.experts.gate_up_proj"), index); // [B, T, K, 2I, D]
    let dims = DotDims { lhs_batch: vec![0, 1], rhs_batch: vec![0, 1], lhs_contract: vec![2], rhs_contract: vec![4] };
    let gate_up = g.b.dot_general(x, gate_up, dims); // [B, T, K, 2I]
    let act = gelu_gate_times_up(g, gate_up, moe.intermediate_size);
    let down = g.embedding_rows(&format!("layers.{l}.experts.down_proj"), index); // [B, T, K, D, I]
    let dims =
        DotDims { lhs_batch: vec![0, 1, 2], rhs_batch: vec![0, 1, 2], lhs_contract: vec![3], rhs_contract: vec![4] };
    let out = g.b.dot_general(act, down, dims); // [B, T, K, D]
    let weight = g.b.broadcast(weight, &[b, t, k, d], &[0, 1, 2]);
    let weighted = g.b.binary(BinaryOp::Mul, out, weight);
    g.b.reduce(ReduceKind::Sum, weighted, &[2])
}

/// `GELU(gate)·up` of experts' `gate_up: [..., 2I]` (the gate's `I` first, as transformers chunks it).
fn gelu_gate_times_up(g: &mut Graph, gate_up: ValueId, inner: usize) -> ValueId {
    let last = g.b.ty(gate_up).rank() - 1;
    let gate = g.b.slice_axis(gate_up, last, 0, inner);
    let gate = g.gelu_tanh(gate);
    let up = g.b.slice_axis(gate_up, last, inner, 2 * inner);
    g.b.binary(BinaryOp::Mul, gate, up)
}

/// Each expert's place when `probs: [B, T, E]` is sorted largest first (ties to the lower expert,
/// as a stable sort): how many experts rank above it, `0..E`, as f32.
fn rank(g: &mut Graph, probs: ValueId) -> ValueId {
    let shape = g.b.shape(probs);
    let e = shape[2];
    let pairs = [shape[0], shape[1], e, e];
    let own = g.b.broadcast(probs, &pairs, &[0, 1, 2]); // [.., e, j] = p_e
    let other = g.b.broadcast(probs, &pairs, &[0, 1, 3]); // [.., e, j] = p_j
    let one = g.b.splat(1.0, TensorType::new(DType::F32, pairs));
    let zero = g.b.splat(0.0, TensorType::new(DType::F32, pairs));
    let above = g.b.compare(CompareDir::Gt, other, own);
    let above = g.b.select(above, one, zero);
    let tied = g.b.compare(CompareDir::Eq, other, own);
    let tied = g.b.select(tied, one, zero);
    let lower: Vec<f64> = (0..e * e).map(|i| if i % e < i / e { 1.0 } else { 0.0 }).collect();
    let lower = g.b.dense(lower, TensorType::new(DType::F32, [e, e]));
    let lower = g.b.broadcast(lower, &pairs, &[2, 3]);
    let tied_lower = g.b.binary(BinaryOp::Mul, tied, lower);
    let ahead = g.b.binary(BinaryOp::Add, above, tied_lower);
    g.b.reduce(ReduceKind::Sum, ahead, &[3])
}
