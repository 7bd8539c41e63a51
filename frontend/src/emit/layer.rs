//! One Gemma 4 decoder layer (gemma4.md §3.4): attention with sandwich norms, MLP with sandwich
//! norms (and beside it a mixture of experts, where the model has them), the per-layer-embedding injection, and the layer scalar on the whole residual stream.

use super::attention::{apply_rope, attend};
use super::experts::mixture_of_experts;
use super::nn::Graph;
use super::StepContext;
use crate::config::Gemma4Config;
use g4c_ir::{BinaryOp, ValueId};

pub fn decoder_layer(g: &mut Graph, cfg: &Gemma4Config, l: usize, h: ValueId, cx: &mut StepContext) -> ValueId {
    let spec = &cfg.layers[l];
    let eps = cfg.rms_norm_eps;
    let y = |s: &str| format!("layers.{l}.{s}");
    // Values named `l{l}.…` anchor the printed names of the unnamed ones after them (`ValueNames`).
    let at = |s: &str| format!("l{l}.{s}");
    let [b, t, _] = g.b.shape(h)[..] else { unreachable!("hidden state is [B, T, D]") };
    let (hq, hkv, hd) = (cfg.num_attention_heads, spec.num_kv_heads, spec.head_dim);
    let rope = cx.rope(g, cfg, spec.kind, hd);

    // --- attention ---
    let x = g.rms_norm(h, Some(&y("input_layernorm")), eps);
    let x = g.b.name(x, &at("x"));
    let q = g.linear(x, &y("self_attn.q_proj"));
    let q = g.b.name(q, &at("q.proj"));
    let q = g.b.reshape(q, &[b, t, hq, hd]);
    let q = g.rms_norm(q, Some(&y("self_attn.q_norm")), eps);
    let q = apply_rope(g, q, rope);
    let q = g.b.name(q, &format!("l{l}.q"));
    if spec.owns_kv(l) {
        let k_proj = g.linear(x, &y("self_attn.k_proj"));
        let k_proj = g.b.name(k_proj, &at("k.proj"));
        let k = g.b.reshape(k_proj, &[b, t, hkv, hd]);
        let k = g.rms_norm(k, Some(&y("self_attn.k_norm")), eps);
        let k = apply_rope(g, k, rope);
        let k = g.b.name(k, &at("k"));
        let v = match spec.values_are_keys {
            true => k_proj,
            false => {
                let v = g.linear(x, &y("self_attn.v_proj"));
                g.b.name(v, &at("v.proj"))
            }
        };
        let v = g.b.reshape(v, &[b, t, hkv, hd]);
        let v = g.rms_norm(v, None, eps);
        let v = g.b.name(v, &at("v"));
        let k = g.b.transpose(k, &[0, 2, 1, 3]);
        let v = g.b.transpose(v, &[0, 2, 1, 3]);
        cx.write_kv(g, l, spec.kind, k, v);
    }
    let (keys, values) = cx.kv(spec.kv_source);
    let visible = cx.visible(spec.kind);
    let a = attend(g, q, keys, values, visible);
    let a = g.b.name(a, &at("attn"));
    let a = g.linear(a, &y("self_attn.o_proj"));
    let a = g.rms_norm(a, Some(&y("post_attention_layernorm")), eps);
    let a = g.b.name(a, &at("attn.out"));
    let h = g.b.binary(BinaryOp::Add, h, a);
    let h = g.b.name(h, &at("h.attn"));

    // --- MLP ---
    let x = g.rms_norm(h, Some(&y("pre_feedforward_layernorm")), eps);
    let x = g.b.name(x, &at("mlp.x"));
    let gate = g.linear(x, &y("mlp.gate_proj"));
    let gate = g.gelu_tanh(gate);
    let gate = g.b.name(gate, &at("mlp.gate"));
    let up = g.linear(x, &y("mlp.up_proj"));
    let up = g.b.name(up, &at("mlp.up"));
    let m = g.b.binary(BinaryOp::Mul, gate, up);
    let mut m = g.linear(m, &y("mlp.down_proj"));
    if let Some(moe) = &cfg.moe {
        // The experts read the residual stream, as the MLP's input norm does.
        let dense = g.rms_norm(m, Some(&y("post_feedforward_layernorm_1")), eps);
        let experts = mixture_of_experts(g, moe, eps, l, h);
        let experts = g.rms_norm(experts, Some(&y("post_feedforward_layernorm_2")), eps);
        let experts = g.b.name(experts, &at("experts.out"));
        m = g.b.binary(BinaryOp::Add, dense, experts);
    }
    let m = g.rms_norm(m, Some(&y("post_feedforward_layernorm")), eps);
    let m = g.b.name(m, &at("mlp.out"));
    let mut h = g.b.binary(BinaryOp::Add, h, m);
    h = g.b.name(h, &at("h.mlp"));

    // --- per-layer embedding ---
    if let Some(ple) = cx.per_layer_input(g, l) {
        let ple = g.b.name(ple, &at("ple"));
        let gate = g.linear(h, &y("per_layer_input_gate"));
        let gate = g.gelu_tanh(gate);
        let gated = g.b.binary(BinaryOp::Mul, gate, ple);
        let p = g.linear(gated, &y("per_layer_projection"));
        let p = g.rms_norm(p, Some(&y("post_per_layer_input_norm")), eps);
        let p = g.b.name(p, &at("ple.out"));
        h = g.b.binary(BinaryOp::Add, h, p);
    }

    // --- layer scalar: scales the whole residual stream ---
    let scalar = g.w(&y("layer_scalar"));
    let scalar = g.b.broadcast_to(scalar, &g.b.shape(h));
    let h = g.b.binary(BinaryOp::Mul, h, scalar);
    g.b.name(h, &format!("h.l{l}"))
}
