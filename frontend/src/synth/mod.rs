//! `g4c synth`: synthetic Gemma 4 checkpoints in the published layout (multimodal `config.json`,
//! `model.language_model.` keys, bf16), with non-trivial norm weights and layer scalars so that
//! `x̂·w` vs `x̂·(1+w)` and layer-scalar placement bugs show. Output appears atomically: everything is
//! written into a temporary sibling directory that is renamed into place at the end.

mod tokenizer;

pub use tokenizer::{byte_tokenizer_json, tokenizer_json, CHAT_TEMPLATE};

use crate::config::Gemma4Config;
use crate::error::{io_error, FrontendError, Result};
use crate::weights::{declared_weights, expected_tensors};
use g4c_util::atomic::{AtomicDir, AtomicFile};
use g4c_util::safetensors_writer::{write_safetensors, Filler, TensorSpec};
use rand::{Rng, SeedableRng};
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
    /// E2B as Google's QAT export publishes it (`gemma-4-E2B-it-qat-w4a16-ct`): the linears
    /// pack-quantized (4-bit values, bf16 scales per 32 inputs), no keys or values on the KV-shared
    /// layers, a compressed-tensors `quantization_config`; ≈6.6 GB.
    E2bQat,
}

impl Preset {
    /// The preset's module with weights declared from its config, bf16 as published, and no
    /// checkpoint behind them: for reports, IR tests and compile benchmarks that never read a weight.
    pub fn declared_module(self, shapes: &crate::Shapes) -> Result<g4c_ir::Module> {
        let cfg = self.config()?;
        crate::emit_module(&cfg, declared_weights(&cfg), shapes)
    }

    pub const NAMES: &'static str = "tiny, e2b, e2b-qat";

    pub fn parse(name: &str) -> Option<Preset> {
        match name {
            "tiny" => Some(Preset::Tiny),
            "e2b" => Some(Preset::E2b),
            "e2b-qat" => Some(Preset::E2bQat),
            _ => None,
        }
    }

    /// The preset's config, parsed as a checkpoint's would be.
    pub fn config(self) -> Result<Gemma4Config> {
        Gemma4Config::from_json_str(&self.config_json().to_string(), Path::new("(synthetic config)"))
    }

    /// The `text_config` of the preset.
    pub fn text_config(self) -> Value {
        let (layers, period, shared) = match self {
            Preset::Tiny => (10, 5, 5),
            Preset::E2b | Preset::E2bQat => (35, 5, 20),
        };
        let layer_types: Vec<&str> = (0..layers)
            .map(|i| if i % period == period - 1 { "full_attention" } else { "sliding_attention" })
            .collect();
        let (vocab, hidden, inter, heads, head_dim, global_head_dim, window, ple) = match self {
            Preset::Tiny => (512, 64, 128, 4, 32, 64, 4, 8),
            Preset::E2b | Preset::E2bQat => (262_144, 1536, 6144, 8, 256, 512, 512, 256),
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
        let mut config = json!({
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": self.text_config(),
            "tie_word_embeddings": true,
            "dtype": "bfloat16"
        });
        if self == Preset::E2bQat {
            // As compressed-tensors 0.20 writes it (gemma4.md §5.1).
            config["quantization_config"] = json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "version": "0.20.1",
                "ignore": ["lm_head", "re:model\\.vision_tower\\..*"],
                "config_groups": {"group_0": {
                    "targets": ["Linear"], "format": "pack-quantized",
                    "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                                "symmetric": true, "dynamic": false},
                    "input_activations": null, "output_activations": null
                }},
                "kv_cache_scheme": null, "sparsity_config": {}, "transform_config": {}
            });
        }
        config
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

/// What a synthetic tensor holds.
enum Content {
    /// bf16 values drawn as `init_for` says.
    Bf16,
    /// Random 4-bit values, eight to an int32 word (compressed-tensors' `weight_packed`).
    PackedInt4,
    /// bf16 scales for 4-bit values of a linear with this many inputs, so that the dequantized
    /// weights have the spread `init_for` gives float ones.
    Scales { inputs: usize },
    /// Fixed int64 values (`weight_shape`).
    Int64(Vec<i64>),
}

impl Content {
    fn dtype(&self) -> (&'static str, usize) {
        match self {
            Content::Bf16 | Content::Scales { .. } => ("BF16", 2),
            Content::PackedInt4 => ("I32", 4),
            Content::Int64(_) => ("I64", 8),
        }
    }

    fn filler<'a>(&self, key: &str, shape: &[usize], seed: u64) -> Filler<'a> {
        let mut rng = ChaCha8Rng::seed_from_u64(tensor_seed(seed, key));
        match self {
            Content::Bf16 => bf16_filler(key, shape, seed),
            Content::PackedInt4 => Box::new(move |_, buf: &mut [u8]| {
                rng.fill(buf);
                Ok(())
            }),
            Content::Scales { inputs } => {
                // Uniform 4-bit values have a standard deviation of about 4.6 (in steps of the scale).
                let base = 1.0 / ((*inputs as f32).sqrt() * 4.6);
                let jitter = Uniform::new(0.8f32, 1.2).expect("valid uniform");
                Box::new(move |_, buf: &mut [u8]| {
                    for c in buf.chunks_exact_mut(2) {
                        c.copy_from_slice(&half::bf16::from_f32(base * jitter.sample(&mut rng)).to_le_bytes());
                    }
                    Ok(())
                })
            }
            Content::Int64(values) => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Box::new(move |start, buf: &mut [u8]| {
                    buf.copy_from_slice(&bytes[start * 8..start * 8 + buf.len()]);
                    Ok(())
                })
            }
        }
    }
}

/// Every tensor of the published layout: the ones the model reads (a quantized linear as its
/// packed values, scales and shape), the dead keys/values of the KV-shared layers (the base release
/// ships them; the QAT export does not), and one vision-tower tensor a loader must ignore.
fn published_tensors(cfg: &Gemma4Config) -> Vec<(String, Vec<usize>, Content)> {
    const PREFIX: &str = "model.language_model.";
    let mut out = vec![];
    for t in expected_tensors(cfg) {
        let key = t.checkpoint_key(PREFIX);
        let module = key.strip_suffix(".weight").unwrap_or(&key).to_string();
        match &cfg.quantization {
            Some(q) if t.linear && q.quantizes(&module) => {
                let [rows, inputs] = t.shape[..] else { unreachable!("linear weights are matrices") };
                out.push((format!("{module}.weight_packed"), vec![rows, inputs / 8], Content::PackedInt4));
                out.push((
                    format!("{module}.weight_scale"),
                    vec![rows, inputs / q.group_size],
                    Content::Scales { inputs },
                ));
                out.push((format!("{module}.weight_shape"), vec![2], Content::Int64(vec![rows as i64, inputs as i64])));
            }
            _ => out.push((key, t.shape, Content::Bf16)),
        }
    }
    if cfg.quantization.is_none() {
        for (i, layer) in cfg.layers.iter().enumerate().filter(|(i, l)| !l.owns_kv(*i)) {
            let kv = layer.num_kv_heads * layer.head_dim;
            for (leaf, shape) in [
                ("k_proj", vec![kv, cfg.hidden_size]),
                ("v_proj", vec![kv, cfg.hidden_size]),
                ("k_norm", vec![layer.head_dim]),
            ] {
                out.push((format!("{PREFIX}layers.{i}.self_attn.{leaf}.weight"), shape, Content::Bf16));
            }
        }
    }
    out.push(("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight".into(), vec![16, 16], Content::Bf16));
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
    let cfg = preset.config()?;
    let dir = AtomicDir::create(out).map_err(|e| io_error(out, e))?;
    write_json(&dir.path().join("config.json"), &config)?;
    if preset == Preset::Tiny {
        write_json(&dir.path().join("tokenizer.json"), &tokenizer_json(cfg.vocab_size))?;
        let template = dir.path().join("chat_template.jinja");
        std::fs::write(&template, tokenizer::CHAT_TEMPLATE).map_err(|e| io_error(&template, e))?;
    }
    let specs = published_tensors(&cfg)
        .into_iter()
        .map(|(key, shape, content)| {
            let (dtype, elem_bytes) = content.dtype();
            TensorSpec { fill: content.filler(&key, &shape, seed), key, dtype, elem_bytes, shape }
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
    let tensors = published_tensors(&preset.config()?);
    Ok(tensors.iter().map(|(_, shape, c)| (c.dtype().1 * shape.iter().product::<usize>()) as u64).sum())
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(|e| io_error(path, e))
}
