//! Binds a checkpoint's tensors to the names the IR reads (`weight @layers.3.mlp.up_proj`), after
//! checking every tensor the config implies: all missing, misshaped or unreadable tensors are
//! reported together in one error.

use crate::checkpoint::Checkpoint;
use crate::config::Gemma4Config;
use crate::error::{FrontendError, Result};
use g4c_ir::{TensorType, WeightDecl};

/// Text-decoder key prefixes in the order they are tried: the published multimodal layout, then
/// transformers' text-only `Gemma4ForCausalLM` layout, then bare keys.
const PREFIXES: [&str; 3] = ["model.language_model.", "model.", ""];

/// A tensor the model reads: its IR name, its key relative to the text prefix, and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedTensor {
    pub name: String,
    pub key: String,
    pub shape: Vec<usize>,
}

/// Every tensor a checkpoint with this config must provide. Dead tensors (keys/values of KV-shared
/// layers, `lm_head` when tied, vision/audio towers) are not listed and are ignored when present.
pub fn expected_tensors(cfg: &Gemma4Config) -> Vec<ExpectedTensor> {
    let d = cfg.hidden_size;
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, weight_suffix: bool| {
        let key = if weight_suffix { format!("{name}.weight") } else { name.clone() };
        out.push(ExpectedTensor { name, key, shape });
    };
    add("embed_tokens".into(), vec![cfg.vocab_size, d], true);
    let (l_count, p) = (cfg.num_layers(), cfg.per_layer_input_size);
    if p > 0 {
        add("embed_tokens_per_layer".into(), vec![cfg.per_layer_vocab_size, l_count * p], true);
        add("per_layer_model_projection".into(), vec![l_count * p, d], true);
        add("per_layer_projection_norm".into(), vec![p], true);
    }
    add("norm".into(), vec![d], true);
    for (i, layer) in cfg.layers.iter().enumerate() {
        let y = |s: &str| format!("layers.{i}.{s}");
        let (hd, q_width, kv_width) =
            (layer.head_dim, cfg.num_attention_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim);
        for norm in
            ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
        {
            add(y(norm), vec![d], true);
        }
        add(y("self_attn.q_proj"), vec![q_width, d], true);
        add(y("self_attn.q_norm"), vec![hd], true);
        add(y("self_attn.o_proj"), vec![d, q_width], true);
        if layer.owns_kv(i) {
            add(y("self_attn.k_proj"), vec![kv_width, d], true);
            add(y("self_attn.v_proj"), vec![kv_width, d], true);
            add(y("self_attn.k_norm"), vec![hd], true);
        }
        add(y("mlp.gate_proj"), vec![layer.intermediate_size, d], true);
        add(y("mlp.up_proj"), vec![layer.intermediate_size, d], true);
        add(y("mlp.down_proj"), vec![d, layer.intermediate_size], true);
        if p > 0 {
            add(y("per_layer_input_gate"), vec![p, d], true);
            add(y("per_layer_projection"), vec![d, p], true);
            add(y("post_per_layer_input_norm"), vec![d], true);
        }
        add(y("layer_scalar"), vec![1], false);
    }
    out
}

/// The key prefix under which this checkpoint keeps its text decoder.
pub fn text_prefix(ckpt: &Checkpoint) -> Result<&'static str> {
    PREFIXES
        .into_iter()
        .find(|p| ckpt.entry(&format!("{p}embed_tokens.weight")).is_some() || ckpt.unreadable_dtype(&format!("{p}embed_tokens.weight")).is_some())
        .ok_or_else(|| FrontendError::Tensors {
            dir: ckpt.dir.clone(),
            problems: vec![
                "no Gemma 4 text decoder found: expected `model.language_model.embed_tokens.weight` or `model.embed_tokens.weight`".into(),
            ],
        })
}

/// Checks the checkpoint against the config and returns the IR's weight declarations.
pub fn bind_weights(cfg: &Gemma4Config, ckpt: &Checkpoint) -> Result<Vec<WeightDecl>> {
    let prefix = text_prefix(ckpt)?;
    let mut problems = Vec::new();
    let mut decls = Vec::new();
    let mut expected = expected_tensors(cfg);
    if !cfg.tie_word_embeddings {
        expected.push(ExpectedTensor {
            name: "lm_head".into(),
            key: "lm_head.weight".into(),
            shape: vec![cfg.vocab_size, cfg.hidden_size],
        });
    }
    for t in expected {
        let key = if t.name == "lm_head" { t.key.clone() } else { format!("{prefix}{}", t.key) };
        match ckpt.entry(&key) {
            None => match ckpt.unreadable_dtype(&key) {
                Some(dt) => problems.push(format!("`{key}` has element type {dt}, expected F32, BF16 or F16")),
                None => problems.push(format!("missing `{key}` (expected shape {:?})", t.shape)),
            },
            Some(e) if !e.dtype.is_float() => {
                problems.push(format!("`{key}` has element type {}, expected f32, bf16 or f16", e.dtype))
            }
            Some(e) if e.shape != t.shape => {
                problems.push(format!("`{key}` has shape {:?}, expected {:?}", e.shape, t.shape))
            }
            Some(e) => decls.push(WeightDecl::new(t.name, TensorType::new(e.dtype, e.shape.clone()), key)),
        }
    }
    if problems.is_empty() {
        Ok(decls)
    } else {
        Err(FrontendError::Tensors { dir: ckpt.dir.clone(), problems })
    }
}
