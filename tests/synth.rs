//! `g4c synth`: the published layout, deterministic per seed, and loadable.

use crate::common::g4c;
use g4c_frontend::{Checkpoint, Model};
use g4c_ir::DType;

#[test]
fn tiny_synth_writes_the_published_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    let out = g4c(&["synth", "--preset", "tiny", "--seed", "5", "-o", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "gemma4");
    assert_eq!(config["text_config"]["model_type"], "gemma4_text");
    assert!(dir.join("tokenizer.json").exists());

    let ckpt = Checkpoint::open(&dir).unwrap();
    assert!(ckpt.names().all(|n| n.starts_with("model.language_model.") || n.starts_with("model.vision_tower.")));
    assert!(ckpt.names().all(|n| ckpt.entry(n).unwrap().dtype == DType::BF16));
    // Dead K/V of the KV-shared layers are shipped, as in the base release.
    assert!(ckpt.entry("model.language_model.layers.7.self_attn.k_proj.weight").is_some());

    let values = |name: &str| -> Vec<f32> {
        ckpt.tensor(name)
            .unwrap()
            .bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    };
    let norm = values("model.language_model.layers.2.post_feedforward_layernorm.weight");
    assert!(
        norm.iter().all(|&w| (0.5..=2.0).contains(&w)) && norm.iter().any(|&w| w > 1.2),
        "norm weights in U[0.5, 2]"
    );
    let scalars: Vec<f32> =
        (0..10).flat_map(|l| values(&format!("model.language_model.layers.{l}.layer_scalar"))).collect();
    assert!(scalars.iter().all(|&s| (0.3..=1.0).contains(&s)));
    assert!(scalars.windows(2).any(|w| w[0] != w[1]), "layer scalars differ per layer");
    Model::open(&dir).unwrap();
}

#[test]
fn synth_is_deterministic_per_seed_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |n: &str| tmp.path().join(n);
    for (name, seed) in [("a", "1"), ("b", "1"), ("c", "2")] {
        let out = g4c(&["synth", "--preset", "tiny", "--seed", seed, "-o", path(name).to_str().unwrap()]);
        assert!(out.status.success());
    }
    let bytes = |n: &str| std::fs::read(path(n).join("model.safetensors")).unwrap();
    assert_eq!(bytes("a"), bytes("b"));
    assert_ne!(bytes("a"), bytes("c"));
    let out = g4c(&["synth", "--preset", "tiny", "-o", path("a").to_str().unwrap()]);
    crate::common::assert_one_line_error(&out, &["already exists"]);
    // Nothing half-written is left next to the outputs.
    let names: Vec<String> =
        std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
}
