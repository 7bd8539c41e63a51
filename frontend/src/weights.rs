//! Binds a checkpoint's tensors to the names the IR reads (`weight @layers.3.mlp.up_proj`), after
//! checking every tensor the config implies: all missing, misshaped or unreadable tensors are
//! reported together in one error. A quantized linear (`quantization_config`) binds two weights:
//! `NAME.q`, its 4-bit values, and `NAME.scale`, one scale per group of inputs.

use crate::checkpoint::Checkpoint;
use crate::config::Gemma4Config;
use crate::error::{FrontendError, Result};
use g4c_ir::{DType, SourceLayout, TensorType, WeightDecl};

/// Text-decoder key prefixes in the order they are tried: the published multimodal layout, then
/// transformers' text-only `Gemma4ForCausalLM` layout, then bare keys.
const PREFIXES: [&str; 3] = ["model.language_model.", "model.", ""];

/// A tensor the model reads: its IR name, its key relative to the text prefix (or to the
/// checkpoint's root: `lm_head`), and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedTensor {
    pub name: String,
    pub key: String,
    pub shape: Vec<usize>,
    /// The weight of a linear layer (`nn.Linear`, `[out, in]`): what a quantized checkpoint
    /// quantizes.
    pub linear: bool,
    /// Whether `key` is under the text decoder's prefix (every tensor but `lm_head`).
    pub under_prefix: bool,
}

impl ExpectedTensor {
    /// The tensor's key in a checkpoint whose text decoder is under `prefix`.
    pub fn checkpoint_key(&self, prefix: &str) -> String {
        match self.under_prefix {
            true => format!("{prefix}{}", self.key),
            false => self.key.clone(),
        }
    }
}

/// Every tensor a checkpoint with this config must provide. Dead tensors (keys/values of KV-shared
/// layers, `lm_head` when tied, vision/audio towers) are not listed and are ignored when present.
pub fn expected_tensors(cfg: &Gemma4Config) -> Vec<ExpectedTensor> {
    let d = cfg.hidden_size;
    let mut out = Vec::new();
    // A tensor `NAME.weight`, or `NAME` itself (`layer_scalar`), or a linear's `NAME.weight`.
    #[derive(Clone, Copy)]
    enum Kind {
        Weight,
        Bare,
        Linear,
    }
    let mut add = |name: String, shape: Vec<usize>, kind: Kind| {
        let key = if matches!(kind, Kind::Bare) { name.clone() } else { format!("{name}.weight") };
        out.push(ExpectedTensor { name, key, shape, linear: matches!(kind, Kind::Linear), under_prefix: true });
    };
    add("embed_tokens".into(), vec![cfg.vocab_size, d], Kind::Weight);
    let (l_count, p) = (cfg.num_layers(), cfg.per_layer_input_size);
    if p > 0 {
        add("embed_tokens_per_layer".into(), vec![cfg.per_layer_vocab_size, l_count * p], Kind::Weight);
        add("per_layer_model_projection".into(), vec![l_count * p, d], Kind::Linear);
        add("per_layer_projection_norm".into(), vec![p], Kind::Weight);
    }
    add("norm".into(), vec![d], Kind::Weight);
    for (i, layer) in cfg.layers.iter().enumerate() {
        let y = |s: &str| format!("layers.{i}.{s}");
        let (hd, q_width, kv_width) =
            (layer.head_dim, cfg.num_attention_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim);
        for norm in
            ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
        {
            add(y(norm), vec![d], Kind::Weight);
        }
        add(y("self_attn.q_proj"), vec![q_width, d], Kind::Linear);
        add(y("self_attn.q_norm"), vec![hd], Kind::Weight);
        add(y("self_attn.o_proj"), vec![d, q_width], Kind::Linear);
        if layer.owns_kv(i) {
            add(y("self_attn.k_proj"), vec![kv_width, d], Kind::Linear);
            if !layer.values_are_keys {
                add(y("self_attn.v_proj"), vec![kv_width, d], Kind::Linear);
            }
            add(y("self_attn.k_norm"), vec![hd], Kind::Weight);
        }
        if let Some(moe) = &cfg.moe {
            let (e, i) = (moe.num_experts, moe.intermediate_size);
            add(y("router.proj"), vec![e, d], Kind::Linear);
            add(y("router.scale"), vec![d], Kind::Bare);
            add(y("router.per_expert_scale"), vec![e], Kind::Bare);
            add(y("experts.gate_up_proj"), vec![e, 2 * i, d], Kind::Bare);
            add(y("experts.down_proj"), vec![e, d, i], Kind::Bare);
            for norm in ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]
            {
                add(y(norm), vec![d], Kind::Weight);
            }
        }
        add(y("mlp.gate_proj"), vec![layer.intermediate_size, d], Kind::Linear);
        add(y("mlp.up_proj"), vec![layer.intermediate_size, d], Kind::Linear);
        add(y("mlp.down_proj"), vec![d, layer.intermediate_size], Kind::Linear);
        if p > 0 {
            add(y("per_layer_input_gate"), vec![p, d], Kind::Linear);
            add(y("per_layer_projection"), vec![d, p], Kind::Linear);
            add(y("post_per_layer_input_norm"), vec![d], Kind::Weight);
        }
        add(y("layer_scalar"), vec![1], Kind::Bare);
    }
    if !cfg.tie_word_embeddings {
        let shape = vec![cfg.vocab_size, d];
        out.push(ExpectedTensor {
            name: "lm_head".into(),
            key: "lm_head.weight".into(),
            shape,
            linear: true,
            under_prefix: false,
        });
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
    for t in expected_tensors(cfg) {
        let key = t.checkpoint_key(prefix);
        let module = key.strip_suffix(".weight").unwrap_or(&key);
        match &cfg.quantization {
            Some(q) if t.linear && q.quantizes(module) => match bind_quantized(ckpt, &t, module, q.group_size) {
                Ok(pair) => decls.extend(pair),
                Err(found) => problems.extend(found),
            },
            _ => match float_tensor(ckpt, &key, &t.shape) {
                Ok(dtype) => decls.push(WeightDecl::new(t.name, TensorType::new(dtype, t.shape), key)),
                Err(e) => problems.push(e),
            },
        }
    }
    // Without per-layer inputs the PLE tensors are not read; a checkpoint that has them was saved for
    // another config, and dropping them silently would run a different model.
    if cfg.per_layer_input_size == 0 {
        let key = format!("{prefix}embed_tokens_per_layer.weight");
        if ckpt.entry(&key).is_some() {
            problems.push(format!("`{key}` is present but hidden_size_per_layer_input is 0 (per-layer inputs off)"));
        }
    }
    if problems.is_empty() {
        Ok(decls)
    } else {
        Err(FrontendError::Tensors { dir: ckpt.dir.clone(), problems })
    }
}

/// The element type of float tensor `key` of `shape`, or what is wrong with it.
fn float_tensor(ckpt: &Checkpoint, key: &str, shape: &[usize]) -> std::result::Result<DType, String> {
    match ckpt.entry(key) {
        None => match ckpt.unreadable_dtype(key) {
            Some(dt) => Err(format!("`{key}` has element type {dt}, expected f32, bf16 or f16")),
            None => Err(format!("missing `{key}` (expected shape {shape:?})")),
        },
        Some(e) if !e.dtype.is_float() => {
            Err(format!("`{key}` has element type {}, expected f32, bf16 or f16", e.dtype))
        }
        Some(e) if e.shape != shape => Err(format!("`{key}` has shape {:?}, expected {shape:?}", e.shape)),
        Some(e) => Ok(e.dtype),
    }
}

/// The two weights of a pack-quantized linear `module` of float shape `[out, in]`: `NAME.q`, its
/// 4-bit values (`weight_packed`: int32 `[out, in / 8]`), and `NAME.scale` (`weight_scale`:
/// `[out, in / group]`); `weight_shape`, when present, must say `[out, in]`.
fn bind_quantized(
    ckpt: &Checkpoint,
    t: &ExpectedTensor,
    module: &str,
    group: usize,
) -> std::result::Result<[WeightDecl; 2], Vec<String>> {
    let [out, inputs] = t.shape[..] else { unreachable!("linear weights are matrices") };
    if !inputs.is_multiple_of(8) || !inputs.is_multiple_of(group) {
        return Err(vec![format!(
            "`{module}` has {inputs} inputs, which the quantization group size {group} (and the 8 values of a packed word) must divide"
        )]);
    }
    let mut problems = vec![];
    let packed = format!("{module}.weight_packed");
    // Tensors that would change what the layer is, were they read: refused rather than ignored.
    // Zero points of zero change nothing (some exports write them for symmetric weights too).
    let zero_point = format!("{module}.weight_zero_point");
    let zero = |bytes: &[u8]| bytes.iter().all(|&b| b == 0);
    let nonzero = match (ckpt.tensor(&zero_point), ckpt.raw(&zero_point)) {
        (Some(t), _) => !zero(t.bytes),
        (None, Some(raw)) => !zero(raw.bytes),
        (None, None) => false,
    };
    if nonzero {
        problems.push(format!(
            "`{zero_point}`: zero points other than 0 are not supported (g4c reads symmetric 4-bit values)"
        ));
    }
    let float = format!("{module}.weight");
    if ckpt.contains(&float) && ckpt.contains(&packed) {
        problems
            .push(format!("both `{float}` and `{packed}`: the layer is stored twice, and which one holds is unclear"));
    }
    match ckpt.entry(&packed) {
        Some(e) if e.dtype == DType::I32 && e.shape == [out, inputs / 8] => {}
        Some(e) => problems.push(format!(
            "`{packed}` is {}{:?}, expected i32[{out}, {}] (8 values of 4 bits per word)",
            e.dtype,
            e.shape,
            inputs / 8
        )),
        None => problems.push(match (ckpt.unreadable_dtype(&packed), ckpt.entry(&format!("{module}.weight"))) {
            (Some(dtype), _) => format!(
                "`{packed}` has element type {dtype}, expected i32[{out}, {}] (8 values of 4 bits per word)",
                inputs / 8
            ),
            (None, Some(_)) => format!(
                "`{module}.weight` is stored in float, but quantization_config quantizes `{module}`: expected `{packed}`"
            ),
            (None, None) => format!("missing `{packed}` (expected i32[{out}, {}])", inputs / 8),
        }),
    }
    let scale_key = format!("{module}.weight_scale");
    let scale_dtype = float_tensor(ckpt, &scale_key, &[out, inputs / group]).map_err(|e| problems.push(e)).ok();
    let shape_key = format!("{module}.weight_shape");
    if let Some(raw) = ckpt.raw(&shape_key) {
        let values: Vec<i64> =
            raw.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        if raw.dtype != "I64" || values != [out as i64, inputs as i64] {
            problems.push(format!("`{shape_key}` says {} {values:?}, expected I64 [{out}, {inputs}]", raw.dtype));
        }
    }
    let Some(scale_dtype) = scale_dtype.filter(|_| problems.is_empty()) else { return Err(problems) };
    Ok(quantized_decls(&t.name, module, [out, inputs], group, scale_dtype))
}

/// The declarations of a pack-quantized linear: `NAME.q` (its values, from `MODULE.weight_packed`)
/// and `NAME.scale` (from `MODULE.weight_scale`).
fn quantized_decls(
    name: &str,
    module: &str,
    [out, inputs]: [usize; 2],
    group: usize,
    scale_dtype: DType,
) -> [WeightDecl; 2] {
    let i4 = TensorType::new(DType::I4, [out, inputs]);
    let (values_name, scales_name) = g4c_ir::quantized_names(name);
    let mut values = WeightDecl::new(values_name, i4, format!("{module}.weight_packed"));
    values.layout = SourceLayout::PackedInt4;
    let scale_ty = TensorType::new(scale_dtype, [out, inputs / group]);
    [values, WeightDecl::new(scales_name, scale_ty, format!("{module}.weight_scale"))]
}

/// The declarations a checkpoint of `cfg` in the published layout binds to, with bf16 floats, and
/// no checkpoint behind them: for reports, IR tests and benchmarks that never read a weight.
pub fn declared_weights(cfg: &Gemma4Config) -> Vec<WeightDecl> {
    const PREFIX: &str = "model.language_model.";
    let mut decls = vec![];
    for t in expected_tensors(cfg) {
        let key = t.checkpoint_key(PREFIX);
        let module = key.strip_suffix(".weight").unwrap_or(&key);
        match &cfg.quantization {
            Some(q) if t.linear && q.quantizes(module) => {
                let [out, inputs] = t.shape[..] else { unreachable!("linear weights are matrices") };
                decls.extend(quantized_decls(&t.name, module, [out, inputs], q.group_size, DType::BF16));
            }
            _ => decls.push(WeightDecl::new(t.name, TensorType::new(DType::BF16, t.shape), key)),
        }
    }
    decls
}
