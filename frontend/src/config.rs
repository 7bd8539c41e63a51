//! `config.json` of a Gemma 4 checkpoint, in both forms found in the wild: text-only
//! (`model_type: gemma4_text`) and multimodal (`gemma4` with a nested `text_config`). Defaults and
//! derived values follow transformers 5.23's `Gemma4TextConfig` (see `shared/docs/gemma4.md` §1).

use crate::error::{io_error, FrontendError, Result};
use crate::generation_config::{GenerationConfig, SamplingDefaults};
use crate::quantization::WeightQuantization;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

pub use g4c_ir::AttentionKind;

/// RoPE of one attention kind. `partial_rotary_factor < 1` is transformers' "proportional" RoPE:
/// the first `int(f * head_dim / 2)` frequency pairs rotate, the rest pass through.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub partial_rotary_factor: f64,
    pub factor: f64,
}

impl Rope {
    /// Inverse frequencies for a head of `head_dim` channels (`head_dim / 2` entries, zeros past the
    /// rotated pairs). The exponent's denominator is the full head dim, as in transformers.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let rotated = (self.partial_rotary_factor * head_dim as f64 / 2.0).floor() as usize;
        (0..head_dim / 2)
            .map(|j| {
                if j < rotated {
                    let exponent = (2 * j) as f32 / head_dim as f32;
                    (1.0 / (self.theta as f32).powf(exponent)) / self.factor as f32
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// Everything about one decoder layer that varies by layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub kind: AttentionKind,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// The layer whose keys/values this layer attends over (itself unless KV-shared).
    pub kv_source: usize,
    /// Its values are its keys' projection (`attention_k_eq_v`, full-attention layers of the
    /// larger Gemma 4 models): no `v_proj`, the key projection before `k_norm` and RoPE.
    pub values_are_keys: bool,
    pub intermediate_size: usize,
}

impl LayerSpec {
    pub fn owns_kv(&self, index: usize) -> bool {
        self.kv_source == index
    }
}

/// A mixture of experts beside each layer's MLP (`enable_moe_block`, 26B-A4B): a router picks
/// `top_k` of `num_experts` feed-forward experts per token.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Each expert's intermediate width.
    pub intermediate_size: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub rms_norm_eps: f64,
    pub sliding_window: usize,
    pub final_logit_softcapping: Option<f64>,
    /// Per-layer-embedding width P (0: the model has no PLE).
    pub per_layer_input_size: usize,
    pub per_layer_vocab_size: usize,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub rope_sliding: Rope,
    pub rope_full: Rope,
    pub layers: Vec<LayerSpec>,
    /// Every layer's mixture of experts, if the model has them.
    pub moe: Option<MoeSpec>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// How the linear weights are quantized (`quantization_config`), if they are.
    pub quantization: Option<WeightQuantization>,
    /// `generation_config.json`'s sampling parameters (none without the file).
    pub sampling_defaults: SamplingDefaults,
}

impl Gemma4Config {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn rope(&self, kind: AttentionKind) -> &Rope {
        match kind {
            AttentionKind::Sliding => &self.rope_sliding,
            AttentionKind::Full => &self.rope_full,
        }
    }

    /// Layers that own a KV cache (all others read another layer's).
    pub fn kv_layers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.layers.len()).filter(|&i| self.layers[i].owns_kv(i))
    }

    /// Reads `DIR/config.json` (and `DIR/generation_config.json` for extra EOS ids and sampling
    /// defaults, if present).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            let message = "expected a checkpoint directory (config.json and safetensors) or an artifact, found a file";
            return Err(FrontendError::Io { path: dir.to_path_buf(), message: message.into() });
        }
        let path = dir.join("config.json");
        let text = g4c_util::files::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        let mut cfg = Self::from_json_str(&text, &path)?;
        if let Some(generation) = GenerationConfig::read(dir, cfg.vocab_size)? {
            for id in generation.eos_token_ids {
                if !cfg.eos_token_ids.contains(&id) {
                    cfg.eos_token_ids.push(id);
                }
            }
            cfg.sampling_defaults = generation.sampling;
        }
        Ok(cfg)
    }

    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| FrontendError::Json { path: path.to_path_buf(), message: e.to_string() })?;
        let Some(root) = root.as_object() else {
            return Err(FrontendError::Config {
                path: path.into(),
                field: "(top level)".into(),
                expected: "a JSON object".into(),
                found: kind_of(&root),
            });
        };
        let top = Reader { path: path.into(), prefix: String::new(), obj: root.clone() };
        let quantization = WeightQuantization::from_config(&top)?;
        let model_type = top.string("model_type", None)?;
        let text_reader = match model_type.as_str() {
            "gemma4_text" => top,
            "gemma4" => {
                let inner = top.object("text_config")?;
                let r = Reader { path: path.into(), prefix: "text_config.".into(), obj: inner };
                let inner_type = r.string("model_type", Some("gemma4_text"))?;
                if inner_type != "gemma4_text" {
                    return Err(r.unsupported(format!("text_config.model_type `{inner_type}` (expected gemma4_text)")));
                }
                r
            }
            other => {
                return Err(
                    top.unsupported(format!("model_type `{other}` (g4c reads Gemma 4: `gemma4` or `gemma4_text`)"))
                )
            }
        };
        let cfg = Gemma4Config { quantization, ..parse_text_config(&text_reader)? };
        // Each size is capped, but their products are what get allocated and multiplied further.
        for t in crate::weights::expected_tensors(&cfg) {
            if let Err(limit) = g4c_util::limits::tensor_elements(&t.shape) {
                return Err(text_reader.unsupported(format!("`{}`: {limit} (g4c's limit)", t.key)));
            }
        }
        Ok(cfg)
    }
}

fn parse_text_config(r: &Reader) -> Result<Gemma4Config> {
    if r.bool("attention_bias", false)? {
        return Err(r.unsupported("attention biases (attention_bias) are not supported yet".into()));
    }
    if let Some(v) = r.obj.get("use_bidirectional_attention").filter(|v| !v.is_null()) {
        if v.as_str() == Some("all") {
            return Err(r.unsupported("bidirectional text attention (use_bidirectional_attention = \"all\")".into()));
        }
    }
    let activation = r.string("hidden_activation", Some("gelu_pytorch_tanh"))?;
    if !matches!(activation.as_str(), "gelu_pytorch_tanh" | "gelu_tanh") {
        return Err(r.unsupported(format!("hidden_activation `{activation}` (expected gelu_pytorch_tanh)")));
    }

    let vocab_size = r.positive("vocab_size", Some(262_144))?;
    let hidden_size = r.positive("hidden_size", Some(2304))?;
    let num_layers = r.positive("num_hidden_layers", Some(30))?;
    if num_layers > g4c_util::limits::MAX_LAYERS {
        let limit = g4c_util::limits::MAX_LAYERS;
        return Err(r.bad("num_hidden_layers", format!("at most {limit} (g4c's limit)"), num_layers.to_string()));
    }
    let num_attention_heads = r.positive("num_attention_heads", Some(8))?;
    let num_kv_heads = r.positive("num_key_value_heads", Some(4))?;
    let head_dim = r.positive("head_dim", Some(256))?;
    let intermediate = r.positive("intermediate_size", Some(9216))?;
    let double_wide = r.bool("use_double_wide_mlp", false)?;
    let sliding_window = r.positive("sliding_window", Some(512))?;
    let num_shared = r.usize("num_kv_shared_layers", Some(0))?;
    if num_shared >= num_layers {
        return Err(r.bad(
            "num_kv_shared_layers",
            format!("fewer than num_hidden_layers ({num_layers})"),
            num_shared.to_string(),
        ));
    }

    let given_layer_types = r.obj.get("layer_types").is_some_and(|v| !v.is_null());
    let mut kinds = match r.obj.get("layer_types").filter(|v| !v.is_null()) {
        None => (0..num_layers)
            .map(|i| if (i + 1) % 6 == 0 { AttentionKind::Full } else { AttentionKind::Sliding })
            .collect::<Vec<_>>(),
        Some(v) => {
            let list = v.as_array().ok_or_else(|| r.bad("layer_types", "a list".into(), kind_of(v)))?;
            if list.len() != num_layers {
                return Err(r.bad(
                    "layer_types",
                    format!("{num_layers} entries (num_hidden_layers)"),
                    format!("{} entries", list.len()),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(AttentionKind::Sliding),
                    Some("full_attention") => Ok(AttentionKind::Full),
                    _ => Err(r.bad(
                        &format!("layer_types[{i}]"),
                        "\"sliding_attention\" or \"full_attention\"".into(),
                        t.to_string(),
                    )),
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    // transformers forces the last layer to full attention.
    *kinds.last_mut().unwrap() = AttentionKind::Full;

    // Full-attention layers' values are their keys (transformers' "alternative attention").
    let values_are_keys = r.bool("attention_k_eq_v", false)?;

    // Per-layer head geometry: `per_layer_config` (what transformers 5.x saves) or `global_head_dim`
    // (and, where values are keys, `num_global_key_value_heads`), as transformers 5.23 derives it.
    let head_dims: Vec<usize>;
    let mut kv_heads = vec![num_kv_heads; num_layers];
    match r.get("per_layer_config") {
        Some(_) => {
            let mut dims = vec![head_dim; num_layers];
            let per_layer = r.child("per_layer_config")?;
            for key in per_layer.obj.keys() {
                let layer: usize = key.parse().ok().filter(|&l| l < num_layers).ok_or_else(|| {
                    per_layer.bad(key, format!("a layer index below {num_layers}"), format!("key {key:?}"))
                })?;
                if per_layer.get(key).is_none() {
                    continue;
                }
                let sub = per_layer.child(key)?;
                for key in sub.obj.keys() {
                    if !matches!(key.as_str(), "head_dim" | "num_key_value_heads") {
                        return Err(sub.unsupported(format!("per-layer override `{key}` on layer {layer}")));
                    }
                }
                dims[layer] = sub.positive("head_dim", Some(dims[layer]))?;
                kv_heads[layer] = sub.positive("num_key_value_heads", Some(kv_heads[layer]))?;
            }
            head_dims = dims;
        }
        None => {
            let global_head_dim = r.positive("global_head_dim", Some(512))?;
            head_dims =
                kinds.iter().map(|k| if *k == AttentionKind::Full { global_head_dim } else { head_dim }).collect();
            if values_are_keys && r.get("num_global_key_value_heads").is_some() {
                let global = r.positive("num_global_key_value_heads", None)?;
                for (heads, kind) in kv_heads.iter_mut().zip(&kinds) {
                    if *kind == AttentionKind::Full {
                        *heads = global;
                    }
                }
            }
        }
    }
    for (l, &kv) in kv_heads.iter().enumerate() {
        if num_attention_heads % kv != 0 {
            return Err(r.bad(
                "num_key_value_heads",
                format!("a divisor of num_attention_heads ({num_attention_heads}) on layer {l}"),
                kv.to_string(),
            ));
        }
    }
    for (l, &d) in head_dims.iter().enumerate() {
        if d % 2 != 0 {
            return Err(r.bad("head_dim", format!("an even head dim on layer {l}"), d.to_string()));
        }
    }

    // KV sharing (transformers' `kv_sharing_modes`): a shared layer reads the last non-shared layer
    // of the same attention kind.
    let first_shared = num_layers - num_shared;
    let mut kv_source: Vec<usize> = (0..num_layers).collect();
    for l in first_shared..num_layers {
        let src = (0..first_shared).rev().find(|&s| kinds[s] == kinds[l]).ok_or_else(|| {
            // Without `layer_types` the kinds are the default pattern's, which may be what is wrong.
            let assumed =
                if given_layer_types { "" } else { " (no `layer_types` given: every 6th layer full, and the last)" };
            r.bad(
                "num_kv_shared_layers",
                format!(
                    "a non-shared {} layer before layer {first_shared} to share keys/values from{assumed}",
                    kinds[l].name()
                ),
                num_shared.to_string(),
            )
        })?;
        if head_dims[src] != head_dims[l] || kv_heads[src] != kv_heads[l] {
            return Err(
                r.unsupported(format!("layer {l} shares keys/values of layer {src} but their head geometry differs"))
            );
        }
        kv_source[l] = src;
    }
    let layers = (0..num_layers)
        .map(|l| LayerSpec {
            kind: kinds[l],
            head_dim: head_dims[l],
            num_kv_heads: kv_heads[l],
            kv_source: kv_source[l],
            values_are_keys: values_are_keys && kinds[l] == AttentionKind::Full,
            intermediate_size: if double_wide && l >= first_shared { 2 * intermediate } else { intermediate },
        })
        .collect();

    let rope = |kind: &str, default: Rope| -> Result<Rope> {
        if r.get("rope_parameters").is_none() {
            return Ok(default);
        }
        let all = r.child("rope_parameters")?;
        if all.get(kind).is_none() {
            return Ok(default);
        }
        let sub = all.child(kind)?;
        let rope_type = sub.string("rope_type", Some("default"))?;
        let theta = sub.float("rope_theta", Some(default.theta))?;
        let factor = sub.float("factor", Some(1.0))?;
        let partial = match rope_type.as_str() {
            "default" => 1.0,
            "proportional" => {
                let f = sub.float("partial_rotary_factor", Some(1.0))?;
                if !(f > 0.0 && f <= 1.0) {
                    return Err(sub.bad("partial_rotary_factor", "a fraction in (0, 1]".into(), f.to_string()));
                }
                f
            }
            other => return Err(sub.unsupported(format!("rope_type `{other}` (expected default or proportional)"))),
        };
        Ok(Rope { theta, partial_rotary_factor: partial, factor })
    };
    let rope_sliding = rope("sliding_attention", Rope { theta: 10_000.0, partial_rotary_factor: 1.0, factor: 1.0 })?;
    let rope_full = rope("full_attention", Rope { theta: 1_000_000.0, partial_rotary_factor: 0.25, factor: 1.0 })?;

    let softcap = match r.obj.get("final_logit_softcapping") {
        None | Some(Value::Null) => None,
        Some(_) => Some(r.float("final_logit_softcapping", None)?),
    };
    let per_layer_input_size = match r.obj.get("hidden_size_per_layer_input") {
        Some(Value::Null) => 0,
        _ => r.usize("hidden_size_per_layer_input", Some(256))?,
    };
    let per_layer_vocab_size = r.positive("vocab_size_per_layer_input", Some(262_144))?;
    let moe = match r.bool("enable_moe_block", false)? {
        false => None,
        true => {
            let num_experts = r.positive("num_experts", None)?;
            let top_k = r.positive("top_k_experts", None)?;
            if top_k > num_experts {
                return Err(r.bad("top_k_experts", format!("at most num_experts ({num_experts})"), top_k.to_string()));
            }
            Some(MoeSpec { num_experts, top_k, intermediate_size: r.positive("moe_intermediate_size", None)? })
        }
    };

    let bos_token_id = r.optional_token_id("bos_token_id", Some(2))?;
    let eos_token_ids = r.token_ids("eos_token_id").map(|v| if v.is_empty() { vec![1] } else { v })?;
    let pad_token_id = r.optional_token_id("pad_token_id", Some(0))?;
    r.in_vocabulary("bos_token_id", &Vec::from_iter(bos_token_id), vocab_size)?;
    r.in_vocabulary("eos_token_id", &eos_token_ids, vocab_size)?;
    r.in_vocabulary("pad_token_id", &Vec::from_iter(pad_token_id), vocab_size)?;
    Ok(Gemma4Config {
        vocab_size,
        hidden_size,
        num_attention_heads,
        rms_norm_eps: r.float("rms_norm_eps", Some(1e-6))?,
        sliding_window,
        final_logit_softcapping: softcap,
        per_layer_input_size,
        per_layer_vocab_size,
        tie_word_embeddings: r.bool("tie_word_embeddings", true)?,
        max_position_embeddings: r.positive("max_position_embeddings", Some(131_072))?,
        rope_sliding,
        rope_full,
        layers,
        moe,
        bos_token_id,
        eos_token_ids,
        pad_token_id,
        quantization: None,
        sampling_defaults: SamplingDefaults::default(),
    })
}

/// Reads typed fields of one JSON object and reports problems with the field's full path.
pub(crate) struct Reader {
    pub path: PathBuf,
    pub prefix: String,
    pub obj: Map<String, Value>,
}

impl Reader {
    /// Token ids that `field` names must be in the vocabulary.
    pub(crate) fn in_vocabulary(&self, field: &str, ids: &[u32], vocab: usize) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(self.bad(field, format!("a token id in the vocabulary (0..{vocab})"), id.to_string())),
            None => Ok(()),
        }
    }

    pub(crate) fn bad(&self, field: &str, expected: String, found: String) -> FrontendError {
        FrontendError::Config { path: self.path.clone(), field: format!("{}{field}", self.prefix), expected, found }
    }

    pub(crate) fn unsupported(&self, message: String) -> FrontendError {
        FrontendError::Unsupported { path: self.path.clone(), message }
    }

    pub(crate) fn get(&self, field: &str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn missing(&self, field: &str, expected: &str) -> FrontendError {
        self.bad(field, expected.into(), "nothing (field missing)".into())
    }

    /// The object at `field`, read by a reader whose errors name `PREFIX.field.…`.
    pub(crate) fn child(&self, field: &str) -> Result<Reader> {
        Ok(Reader { path: self.path.clone(), prefix: format!("{}{field}.", self.prefix), obj: self.object(field)? })
    }

    pub(crate) fn object(&self, field: &str) -> Result<Map<String, Value>> {
        match self.get(field) {
            Some(Value::Object(m)) => Ok(m.clone()),
            Some(v) => Err(self.bad(field, "an object".into(), kind_of(v))),
            None => Err(self.missing(field, "an object")),
        }
    }

    pub(crate) fn string(&self, field: &str, default: Option<&str>) -> Result<String> {
        match (self.get(field), default) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (Some(v), _) => Err(self.bad(field, "a string".into(), kind_of(v))),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => Err(self.missing(field, "a string")),
        }
    }

    pub(crate) fn bool(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(field, "true or false".into(), kind_of(v))),
            None => Ok(default),
        }
    }

    /// A size: a non-negative integer up to `MAX_CONFIG_DIM`, so that products of sizes cannot overflow.
    pub(crate) fn usize(&self, field: &str, default: Option<usize>) -> Result<usize> {
        use g4c_util::limits::MAX_CONFIG_DIM;
        match (self.get(field), default) {
            (Some(v), _) => match v.as_u64() {
                Some(x) if x <= MAX_CONFIG_DIM as u64 => Ok(x as usize),
                Some(x) => Err(self.bad(field, format!("at most {MAX_CONFIG_DIM} (g4c's limit)"), x.to_string())),
                None => Err(self.bad(field, "a non-negative integer".into(), kind_of(v))),
            },
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.missing(field, "a non-negative integer")),
        }
    }

    pub(crate) fn positive(&self, field: &str, default: Option<usize>) -> Result<usize> {
        let v = self.usize(field, default)?;
        if v == 0 {
            return Err(self.bad(field, "a positive integer".into(), "0".into()));
        }
        Ok(v)
    }

    pub(crate) fn float(&self, field: &str, default: Option<f64>) -> Result<f64> {
        match (self.get(field), default) {
            (Some(v), _) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| self.bad(field, "a positive number".into(), kind_of(v))),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.missing(field, "a positive number")),
        }
    }

    /// Any number, if the field holds one (ranges are the caller's).
    pub(crate) fn optional_number(&self, field: &str) -> Result<Option<f64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.bad(field, "a number".into(), kind_of(v))),
        }
    }

    pub(crate) fn optional_token_id(&self, field: &str, default: Option<u32>) -> Result<Option<u32>> {
        match self.obj.get(field) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(field, "a token id".into(), kind_of(v))),
        }
    }

    /// A token id or a list of them (transformers accepts both for `eos_token_id`).
    pub(crate) fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
        let bad = |v: &Value| self.bad(field, "a token id or a list of token ids".into(), kind_of(v));
        match self.get(field) {
            None => Ok(vec![]),
            Some(Value::Array(items)) => {
                items.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(v))).collect()
            }
            Some(v) => Ok(vec![v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(v))?]),
        }
    }
}

pub(crate) fn kind_of(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::Rope;

    #[test]
    fn proportional_rope_keeps_the_full_head_dim_in_the_exponent() {
        // gemma4.md §3.3: head 64 with factor 0.25 rotates int(0.25 * 64 / 2) = 8 pairs at theta^(-2j/64).
        let rope = Rope { theta: 1e6, partial_rotary_factor: 0.25, factor: 1.0 };
        let inv = rope.inv_freq(64);
        assert_eq!(inv.len(), 32);
        assert!(inv[8..].iter().all(|&f| f == 0.0));
        for (j, &f) in inv[..8].iter().enumerate() {
            let want = 1.0 / 1e6f64.powf(2.0 * j as f64 / 64.0);
            assert!(((f as f64) - want).abs() <= 1e-7 * want.max(1e-30), "pair {j}: {f} vs {want}");
        }
    }
}
