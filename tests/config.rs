//! Config parsing against the layer tables of gemma4.md §1.3 and transformers' own rules.

use crate::common::golden_dir;
use g4c_frontend::synth::Preset;
use g4c_frontend::{AttentionKind, Gemma4Config};
use std::path::Path;

fn parse(v: &serde_json::Value) -> Gemma4Config {
    Gemma4Config::from_json_str(&v.to_string(), Path::new("config.json")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn e2b_layer_table_matches_the_spec() {
    let cfg = parse(&Preset::E2b.config_json());
    // gemma4.md §1.3, the map transformers' `kv_sharing_modes` produces for E2B.
    let kv_map = [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 13, 13, 13, 13, 14, 13, 13, 13, 13, 14, 13, 13, 13, 13, 14,
        13, 13, 13, 13, 14,
    ];
    assert_eq!(cfg.layers.iter().map(|l| l.kv_source).collect::<Vec<_>>(), kv_map);
    for (i, l) in cfg.layers.iter().enumerate() {
        let full = i % 5 == 4;
        assert_eq!(l.kind == AttentionKind::Full, full, "layer {i}");
        assert_eq!(l.head_dim, if full { 512 } else { 256 }, "layer {i}");
        assert_eq!(l.num_kv_heads, 1);
        assert_eq!(l.intermediate_size, if i < 15 { 6144 } else { 12288 }, "layer {i}");
    }
    assert_eq!(cfg.kv_layers().count(), 15);
    let kv_bytes_bf16: usize =
        cfg.kv_layers().map(|l| 2 * cfg.layers[l].num_kv_heads * cfg.layers[l].head_dim * 2).sum();
    assert_eq!(kv_bytes_bf16, 18 * 1024, "18 KiB of KV per token in bf16");
    assert_eq!(cfg.rope_full.inv_freq(512).iter().filter(|&&f| f != 0.0).count(), 64, "64 of 256 pairs rotate");
    assert_eq!(cfg.rope_sliding.inv_freq(256).iter().filter(|&&f| f != 0.0).count(), 128);
    // Exponent over the full head dim: pair j rotates at theta^(-2j/512).
    let f = cfg.rope_full.inv_freq(512);
    assert!((f[1] - 1e6f32.powf(-2.0 / 512.0)).abs() < 1e-9);
}

#[test]
fn e2b_parameter_count_matches_the_spec() {
    let cfg = parse(&Preset::E2b.config_json());
    let n: usize = g4c_frontend::expected_tensors(&cfg).iter().map(|t| t.shape.iter().product::<usize>()).sum();
    // gemma4.md §1.2: 4,628,569,379 parameters, without the dead K/V of the KV-shared layers.
    assert_eq!(n, 4_628_569_379);
}

#[test]
fn text_only_and_multimodal_forms_agree() {
    for model in ["tiny", "gqa"] {
        let hf = Gemma4Config::from_dir(&golden_dir(model).join("hf")).unwrap();
        let published = Gemma4Config::from_dir(&golden_dir(model).join("published")).unwrap();
        assert_eq!(hf, published, "{model}: per_layer_config (transformers) vs global_head_dim (published)");
    }
}

#[test]
fn gqa_kv_sources_follow_the_same_kind_rule() {
    let cfg = Gemma4Config::from_dir(&golden_dir("gqa").join("hf")).unwrap();
    // Layer types s s f s s | f s f: shared full layers read 2, the shared sliding layer reads 4.
    assert_eq!(cfg.layers.iter().map(|l| l.kv_source).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 2, 4, 2]);
    assert!(cfg.layers.iter().all(|l| l.num_kv_heads == 2));
}

#[test]
fn transformers_defaults_apply() {
    let mut v = Preset::Tiny.text_config();
    let obj = v.as_object_mut().unwrap();
    for key in ["layer_types", "global_head_dim", "rope_parameters", "eos_token_id"] {
        obj.remove(key);
    }
    obj.insert("num_hidden_layers".into(), 12.into());
    obj.insert("num_kv_shared_layers".into(), 0.into());
    obj.insert("per_layer_config".into(), serde_json::json!({"05": {"head_dim": 48}}));
    let cfg = parse(&v);
    // Without layer_types, transformers uses a 5:1 pattern and forces the last layer to full.
    let full: Vec<usize> = (0..12).filter(|&i| cfg.layers[i].kind == AttentionKind::Full).collect();
    assert_eq!(full, [5, 11]);
    // With per_layer_config, layers it does not name keep the global head_dim.
    assert_eq!(cfg.layers[5].head_dim, 48);
    assert_eq!(cfg.layers[11].head_dim, 32);
    assert_eq!(cfg.eos_token_ids, [1]);
    assert_eq!(cfg.rope_full.partial_rotary_factor, 0.25);
}

/// An untied config reads `lm_head.weight` from the checkpoint's root, whether the module is bound
/// to a checkpoint or declared from the config alone (it once panicked there, the head missing).
#[test]
fn untied_configs_declare_their_lm_head() {
    let mut json = Preset::Tiny.config_json();
    json["text_config"]["tie_word_embeddings"] = false.into();
    let cfg = parse(&json);
    let head =
        g4c_frontend::expected_tensors(&cfg).into_iter().find(|t| t.name == "lm_head").expect("lm_head expected");
    assert_eq!(
        (head.checkpoint_key("model.language_model."), head.shape),
        ("lm_head.weight".to_string(), vec![512, 64])
    );
    let decls = g4c_frontend::declared_weights(&cfg);
    assert!(decls.iter().any(|d| d.name == "lm_head" && d.source == "lm_head.weight"));
    let shapes = g4c_frontend::Shapes { batch: 1, prefill_len: 4, context: 16 };
    let module = g4c_frontend::emit_module(&cfg, decls, &shapes).unwrap();
    g4c_ir::verify_module(&module).unwrap();
}
