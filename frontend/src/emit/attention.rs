//! Attention pieces: RoPE, ring-cache slot writes, masks from stored positions, and the attention
//! product itself (MQA/GQA without repeating keys/values).
//!
//! Masks never look at slot indices. Each cache slot stores the absolute position of the token in it
//! (`-1` = empty), and a query at position `t` sees a slot holding position `s` iff
//! `0 <= s <= t` and, for sliding layers, `t - s < window` (gemma4.md §4.1, §6.2). Padding tokens carry
//! position `-1`: they write no slot and no query attends to them.

use super::nn::{Graph, MASKED_SCORE};
use g4c_ir::{BinaryOp, CompareDir, DType, DotDims, TensorType, UnaryOp, ValueId};

/// `cos` and `sin` of the rotary angles, `[B, T, head_dim]` each (halves repeated, transformers' layout).
#[derive(Clone, Copy)]
pub struct RopeTables {
    pub cos: ValueId,
    pub sin: ValueId,
}

/// Angles `t · inv_freq` in f32 from logical positions `pos_f32: [B, T]`.
pub fn rope_tables(g: &mut Graph, pos_f32: ValueId, inv_freq: &[f32]) -> RopeTables {
    let [b, t] = g.b.shape(pos_f32)[..] else { unreachable!("positions are [B, T]") };
    let half = inv_freq.len();
    let inv = g.b.dense(inv_freq.iter().map(|&x| x as f64).collect(), TensorType::new(DType::F32, [half]));
    let inv = g.b.broadcast(inv, &[b, t, half], &[2]);
    let pos = g.b.broadcast(pos_f32, &[b, t, half], &[0, 1]);
    let angles = g.b.binary(BinaryOp::Mul, pos, inv);
    let angles = g.b.concat(&[angles, angles], 2);
    let cos = g.b.unary(UnaryOp::Cos, angles);
    let sin = g.b.unary(UnaryOp::Sin, angles);
    RopeTables { cos, sin }
}

/// `x·cos + rotate_half(x)·sin` for `x: [B, T, H, d]`, pairing channel `i` with `i + d/2`.
pub fn apply_rope(g: &mut Graph, x: ValueId, tables: RopeTables) -> ValueId {
    let shape = g.b.shape(x);
    let d = shape[3];
    let lo = g.b.slice_axis(x, 3, 0, d / 2);
    let hi = g.b.slice_axis(x, 3, d / 2, d);
    let neg_hi = g.b.unary(UnaryOp::Neg, hi);
    let rotated = g.b.concat(&[neg_hi, lo], 3);
    let cos = g.b.broadcast(tables.cos, &shape, &[0, 1, 3]);
    let sin = g.b.broadcast(tables.sin, &shape, &[0, 1, 3]);
    let a = g.b.binary(BinaryOp::Mul, x, cos);
    let c = g.b.binary(BinaryOp::Mul, rotated, sin);
    g.b.binary(BinaryOp::Add, a, c)
}

/// Ring slot of each token: `pos mod capacity`, or `-1` (write nothing) for padding (`pos < 0`).
pub fn ring_slots(g: &mut Graph, pos: ValueId, capacity: usize) -> ValueId {
    let zero = g.b.splat(0.0, g.b.ty(pos).clone());
    let real = g.b.compare(CompareDir::Ge, pos, zero);
    let slot = g.b.binary_scalar(BinaryOp::Rem, pos, capacity as f64);
    let none = g.b.splat(-1.0, g.b.ty(pos).clone());
    g.b.select(real, slot, none)
}

/// Which cache slots each query may attend to: `[B, T, S]` bool from query positions `[B, T]` and
/// stored slot positions `[B, S]`.
pub fn visibility(g: &mut Graph, q_pos: ValueId, slot_pos: ValueId, window: Option<usize>) -> ValueId {
    let [b, t] = g.b.shape(q_pos)[..] else { unreachable!() };
    let s = g.b.shape(slot_pos)[1];
    let shape = [b, t, s];
    let q = g.b.broadcast(q_pos, &shape, &[0, 1]);
    let k = g.b.broadcast(slot_pos, &shape, &[0, 2]);
    let zero = g.b.splat(0.0, TensorType::new(DType::I32, shape));
    let filled = g.b.compare(CompareDir::Ge, k, zero);
    let causal = g.b.compare(CompareDir::Le, k, q);
    let mut visible = g.b.binary(BinaryOp::And, filled, causal);
    if let Some(w) = window {
        let dist = g.b.binary(BinaryOp::Sub, q, k);
        let w = g.b.splat(w as f64, TensorType::new(DType::I32, shape));
        let in_window = g.b.compare(CompareDir::Lt, dist, w);
        visible = g.b.binary(BinaryOp::And, visible, in_window);
    }
    visible
}

/// Scaled-by-1.0 dot-product attention. `q: [B, T, Hq, d]`, `k`/`v`: `[B, Hkv, S, d]`,
/// `visible: [B, T, S]`; returns `[B, T, Hq·d]`. Query head `h` reads KV head `h / (Hq / Hkv)`
/// (transformers' `repeat_kv` order) without materialising repeated keys.
pub fn attend(g: &mut Graph, q: ValueId, k: ValueId, v: ValueId, visible: ValueId) -> ValueId {
    let [b, t, hq, d] = g.b.shape(q)[..] else { unreachable!() };
    let [_, hkv, s, _] = g.b.shape(k)[..] else { unreachable!() };
    let groups = hq / hkv;
    let q = g.b.reshape(q, &[b, t, hkv, groups, d]);
    let scores = g.b.dot_general(
        q,
        k,
        DotDims { lhs_batch: vec![0, 2], rhs_batch: vec![0, 1], lhs_contract: vec![4], rhs_contract: vec![3] },
    ); // [B, Hkv, T, G, S]
    let shape = [b, hkv, t, groups, s];
    let visible = g.b.broadcast(visible, &shape, &[0, 2, 4]);
    let masked = g.b.splat(MASKED_SCORE, TensorType::new(DType::F32, shape));
    let scores = g.b.select(visible, scores, masked);
    let probs = g.softmax(scores);
    let out = g.b.dot_general(
        probs,
        v,
        DotDims { lhs_batch: vec![0, 1], rhs_batch: vec![0, 1], lhs_contract: vec![4], rhs_contract: vec![2] },
    ); // [B, Hkv, T, G, d]
    let out = g.b.transpose(out, &[0, 2, 1, 3, 4]);
    g.b.reshape(out, &[b, t, hq * d])
}
