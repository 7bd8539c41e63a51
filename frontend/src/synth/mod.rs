//! `g4c synth`: synthetic Gemma 4 checkpoints in the published layout (multimodal `config.json`,
//! `model.language_model.` keys, bf16), with non-trivial norm weights and layer scalars so that
//! `x̂·w` vs `x̂·(1+w)` and layer-scalar placement bugs show. Output appears atomically: everything is
//! written into a temporary sibling directory that is renamed into place at the end.

mod tokenizer;

pub use tokenizer::tokenizer_json;

use crate::config::Gemma4Config;
use crate::error::{io_error, FrontendError, Result};
use crate::weights::expected_tensors;
use g4c_util::atomic::{AtomicDir, AtomicFile};
use g4c_util::safetensors_writer::{write_safetensors, Filler, TensorSpec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal, Uniform};
use serde_json::{json, Value};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// gemma4.md §7: every irregularity of E2B at toy size (~0.7 M parameters).
    Tiny,
    /// The real E2B text-decoder shapes (≈4.6 G parameters, ≈9.3 GB in bf16).
    E2b,
}

impl Preset {
    /// The preset's module with weights declared from its config, bf16 as published, and no
    /// checkpoint behind them: for reports, IR tests and compile benchmarks that never read a weight.
    pub fn declared_module(self, shapes: &crate::Shapes) -> Result<g4c_ir::Module> {
        let cfg = Gemma4Config::from_json_str(&self.config_json().to_string(), Path::new("(synthetic config)"))?;
        let weights = expected_tensors(&cfg)
            .into_iter()
            .map(|t| g4c_ir::WeightDecl::new(t.name, g4c_ir::TensorType::new(g4c_ir::DType::BF16, t.shape), t.key))
            .collect();
        crate::emit_module(&cfg, weights, shapes)
    }

    pub fn parse(name: &str) -> Option<Preset> {
        match name {
            "tiny" => Some(Preset::Tiny),
            "e2b" => Some(Preset::E2b),
            _ => None,
        }
    }

    /// The `text_config` of the preset.
    pub fn text_config(self) -> Value {
        let (layers, period, shared) = match self {
            Preset::Tiny => (10, 5, 5),
            Preset::E2b => (35, 5, 20),
        };
        let layer_types: Vec<&str> = (0..layers)
            .map(|i| if i % period == period - 1 { "full_attention" } else { "sliding_attention" })
            .collect();
        let (vocab, hidden, inter, heads, head_dim, global_head_dim, window, ple) = match self {
            Preset::Tiny => (512, 64, 128, 4, 32, 64, 4, 8),
            Preset::E2b => (262_144, 1536, 6144, 8, 256, 512, 512, 256),
        };
        json!({
            "model_type": "gemma4_text",
            "vocab_size": vocab, "vocab_size_per_layer_input": vocab,
            "hidden_size": hidden, "intermediate_size": inter, "use_double_wide_mlp": true,
            "num_hidden_layers": layers, "layer_types": layer_types,
            "num_attention_heads": heads, "num_key_value_heads": 1, "num_global_key_value_heads": null,
            "head_dim": head_dim, "global_head_dim": global_head_dim,
            "sliding_window": window, "num_kv_shared_layers": shared,
            "hidden_size_per_layer_input": ple,
            "final_logit_softcapping": 30.0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
            },
            "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 131072,
            "attention_k_eq_v": false, "enable_moe_block": false, "tie_word_embeddings": true,
            "attention_bias": false, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
            "dtype": "bfloat16"
        })
    }

    /// The published (multimodal) `config.json` around the text config.
    pub fn config_json(self) -> Value {
        json!({
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": self.text_config(),
            "tie_word_embeddings": true,
            "dtype": "bfloat16"
        })
    }
}

/// How a synthetic tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    Normal(f32),
    Uniform(f32, f32),
}

fn init_for(key: &str, shape: &[usize]) -> Init {
    let leaf = key.rsplit('.').nth(1).unwrap_or(key);
    if key.ends_with("layer_scalar") {
        Init::Uniform(0.3, 1.0)
    } else if leaf.ends_with("norm") || leaf.ends_with("layernorm") {
        Init::Uniform(0.5, 2.0)
    } else if leaf.starts_with("embed_tokens") {
        Init::Normal(0.5)
    } else {
        Init::Normal(1.0 / (shape[shape.len() - 1] as f32).sqrt())
    }
}

/// A seed per tensor, so values do not depend on the order tensors are written in.
fn tensor_seed(seed: u64, key: &str) -> u64 {
    key.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn bf16_filler<'a>(key: &str, shape: &[usize], seed: u64) -> Filler<'a> {
    let mut rng = ChaCha8Rng::seed_from_u64(tensor_seed(seed, key));
    let init = init_for(key, shape);
    let normal = Normal::new(0.0f32, 1.0).expect("valid normal");
    let unit = Uniform::new(0.0f32, 1.0).expect("valid uniform");
    Box::new(move |_, buf: &mut [u8]| {
        for c in buf.chunks_exact_mut(2) {
            let x = match init {
                Init::Normal(std) => normal.sample(&mut rng) * std,
                Init::Uniform(lo, hi) => lo + (hi - lo) * unit.sample(&mut rng),
            };
            c.copy_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
        }
        Ok(())
    })
}

/// Every tensor of the published layout: the ones the model reads, the dead keys/values of the
/// KV-shared layers (the base release ships them), and one vision-tower tensor a loader must ignore.
fn published_tensors(cfg: &Gemma4Config) -> Vec<(String, Vec<usize>)> {
    const PREFIX: &str = "model.language_model.";
    let mut out: Vec<(String, Vec<usize>)> =
        expected_tensors(cfg).into_iter().map(|t| (format!("{PREFIX}{}", t.key), t.shape)).collect();
    for (i, layer) in cfg.layers.iter().enumerate().filter(|(i, l)| !l.owns_kv(*i)) {
        let kv = layer.num_kv_heads * layer.head_dim;
        out.push((format!("{PREFIX}layers.{i}.self_attn.k_proj.weight"), vec![kv, cfg.hidden_size]));
        out.push((format!("{PREFIX}layers.{i}.self_attn.v_proj.weight"), vec![kv, cfg.hidden_size]));
        out.push((format!("{PREFIX}layers.{i}.self_attn.k_norm.weight"), vec![layer.head_dim]));
    }
    out.push(("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight".into(), vec![16, 16]));
    out
}

/// Writes a synthetic checkpoint of `preset` to `out` (which must not exist yet); `on_written` hears
/// of every chunk of tensor bytes written, out of `total_bytes(preset)`.
pub fn synthesize(preset: Preset, seed: u64, out: &Path, on_written: &mut dyn FnMut(u64)) -> Result<()> {
    if out.exists() {
        return Err(FrontendError::Io {
            path: out.into(),
            message: "already exists; remove it or choose another output directory".into(),
        });
    }
    let config = preset.config_json();
    let cfg = Gemma4Config::from_json_str(&config.to_string(), Path::new("(synthetic config)"))?;
    let dir = AtomicDir::create(out).map_err(|e| io_error(out, e))?;
    write_json(&dir.path().join("config.json"), &config)?;
    if preset == Preset::Tiny {
        write_json(&dir.path().join("tokenizer.json"), &tokenizer_json(cfg.vocab_size))?;
    }
    let specs = published_tensors(&cfg)
        .into_iter()
        .map(|(key, shape)| TensorSpec {
            fill: bf16_filler(&key, &shape, seed),
            key,
            dtype: "BF16",
            elem_bytes: 2,
            shape,
        })
        .collect();
    let path = dir.path().join("model.safetensors");
    let mut file = AtomicFile::create(&path).map_err(|e| io_error(&path, e))?;
    write_safetensors(&mut file, specs, on_written).map_err(|e| io_error(&path, e))?;
    file.commit().map_err(|e| io_error(&path, e))?;
    dir.commit().map_err(|e| io_error(out, e))
}

/// Bytes of tensor data `synthesize` writes for `preset`.
pub fn total_bytes(preset: Preset) -> Result<u64> {
    let config = preset.config_json();
    let cfg = Gemma4Config::from_json_str(&config.to_string(), Path::new("(synthetic config)"))?;
    Ok(published_tensors(&cfg).iter().map(|(_, shape)| 2 * shape.iter().product::<usize>() as u64).sum())
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(|e| io_error(path, e))
}
