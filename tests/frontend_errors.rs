//! Bad checkpoints and configs: each is refused with one line that names the file, tensor or field,
//! what was expected and what was found; `g4c` exits non-zero without panicking.

use crate::common::{assert_one_line_error, g4c, published_copy};
use g4c_frontend::Model;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Rewrites `dir/model.safetensors` through `edit(name, dtype, shape, bytes)`, which returns the
/// tensor to write in its place or `None` to drop it.
pub(crate) fn rewrite(
    dir: &Path,
    edit: impl Fn(&str, Dtype, Vec<usize>, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    rewrite_adding(dir, vec![], edit)
}

/// `rewrite`, with the tensors `added` too.
fn rewrite_adding(
    dir: &Path,
    added: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    edit: impl Fn(&str, Dtype, Vec<usize>, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter_map(|(n, t)| edit(&n, t.dtype(), t.shape().to_vec(), t.data().to_vec()).map(|(d, s, b)| (n, d, s, b)))
        .chain(added)
        .collect();
    let views: Vec<(String, TensorView)> =
        kept.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn open_error(dir: &Path) -> String {
    match Model::open(dir) {
        Ok(_) => panic!("{} opened although it is broken", dir.display()),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "error is not one line: {msg}");
            msg
        }
    }
}

pub(crate) fn edit_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

type ConfigEdit = Box<dyn Fn(&mut serde_json::Value)>;

const P: &str = "model.language_model.";

#[test]
fn every_missing_tensor_is_named_in_one_error() {
    let dir = published_copy("tiny");
    let gone =
        [format!("{P}layers.3.mlp.up_proj.weight"), format!("{P}norm.weight"), format!("{P}layers.7.layer_scalar")];
    rewrite(dir.path(), |n, d, s, b| (!gone.iter().any(|g| g == n)).then_some((d, s, b)));
    let msg = open_error(dir.path());
    assert!(msg.contains("3 tensor problems"), "{msg}");
    for g in &gone {
        assert!(msg.contains(&format!("missing `{g}`")), "{msg}");
    }
    assert!(msg.contains("[128, 64]"), "expected shape named: {msg}");
}

#[test]
fn misshaped_tensor_names_expected_and_found() {
    let dir = published_copy("tiny");
    rewrite(dir.path(), |n, d, s, b| {
        if n == format!("{P}layers.4.self_attn.q_proj.weight") {
            // Same bytes, the shape a single-head-dim loader would wrongly expect.
            Some((d, vec![s[0] / 2, s[1] * 2], b))
        } else {
            Some((d, s, b))
        }
    });
    let msg = open_error(dir.path());
    assert!(msg.contains("layers.4.self_attn.q_proj.weight` has shape [128, 128], expected [256, 64]"), "{msg}");
}

#[test]
fn unreadable_element_type_is_reported() {
    let dir = published_copy("tiny");
    rewrite(
        dir.path(),
        |n, d, s, b| {
            if n == format!("{P}norm.weight") {
                Some((Dtype::U16, s, b))
            } else {
                Some((d, s, b))
            }
        },
    );
    let msg = open_error(dir.path());
    assert!(msg.contains("norm.weight` has element type U16"), "{msg}");
}

#[test]
fn dead_and_foreign_tensors_are_ignored() {
    // The published copy carries K/V of KV-shared layers and a vision tensor; dropping them all
    // changes nothing, and neither does their presence.
    let dir = published_copy("tiny");
    Model::open(dir.path()).unwrap();
    rewrite(dir.path(), |n, d, s, b| {
        let dead = n.contains("vision_tower")
            || ["5", "6", "7", "8", "9"].iter().any(|l| {
                n.starts_with(&format!("{P}layers.{l}.self_attn.k"))
                    || n.starts_with(&format!("{P}layers.{l}.self_attn.v"))
            });
        (!dead).then_some((d, s, b))
    });
    Model::open(dir.path()).unwrap();
}

#[test]
fn truncated_safetensors() {
    let dir = published_copy("tiny");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let msg = open_error(dir.path());
    let sizes = format!("has {} bytes, but its header describes {}", bytes.len() - 1000, bytes.len());
    assert!(msg.contains("model.safetensors") && msg.contains("truncated") && msg.contains(&sizes), "{msg}");
    std::fs::write(&path, &bytes[..5]).unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("model.safetensors") && msg.contains("truncated"), "{msg}");
}

#[test]
fn corrupt_safetensors_header() {
    let dir = published_copy("tiny");
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..16].copy_from_slice(b"garbage!");
    std::fs::write(&path, &bytes).unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("model.safetensors") && msg.contains("corrupt"), "{msg}");
}

/// An entry removed from the header (its bytes left in place): the safetensors crate names the
/// tensor after the gap; the message says where the gap is.
#[test]
fn a_gap_in_the_header_is_located() {
    let dir = published_copy("tiny");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let offsets = |v: &serde_json::Value| serde_json::from_value::<[u64; 2]>(v["data_offsets"].clone()).unwrap();
    let mut ranges: Vec<([u64; 2], String)> =
        header.iter().filter(|(n, _)| *n != "__metadata__").map(|(n, v)| (offsets(v), n.clone())).collect();
    ranges.sort();
    // The fourth tensor goes; the data before it ends where it started.
    let ([before, _], removed) = &ranges[3];
    let ([after, _], next) = &ranges[4];
    header.remove(removed);
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(len, b' ');
    std::fs::write(&path, [&(len as u64).to_le_bytes()[..], &text, &bytes[8 + len..]].concat()).unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains(&format!("`{next}` starts at byte {after}")), "{msg}");
    assert!(msg.contains(&format!("end at byte {before}")) && msg.contains("missing from the header"), "{msg}");
}

#[test]
fn missing_weights_file() {
    let dir = published_copy("tiny");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("no model.safetensors or model.safetensors.index.json"), "{msg}");
}

#[test]
fn invalid_json_config() {
    let dir = published_copy("tiny");
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"gemma4\",").unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("config.json: invalid JSON"), "{msg}");
}

/// `model.safetensors` as a link to nothing is that, not "no model.safetensors".
#[test]
fn a_weights_link_to_nothing_is_named() {
    let dir = published_copy("tiny");
    let weights = dir.path().join("model.safetensors");
    std::fs::remove_file(&weights).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone.safetensors"), &weights).unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("model.safetensors: a symbolic link to nothing"), "{msg}");
}

#[test]
fn unsupported_models_and_features() {
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (Box::new(|v| v["model_type"] = "llama".into()), "model_type `llama`"),
        (Box::new(|v| v["text_config"]["attention_bias"] = true.into()), "attention biases"),
        (Box::new(|v| v["text_config"]["hidden_activation"] = "silu".into()), "hidden_activation `silu`"),
        (
            Box::new(|v| v["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into()),
            "rope_type `yarn`",
        ),
    ];
    for (edit, needle) in cases {
        let dir = published_copy("tiny");
        edit_config(dir.path(), edit);
        let msg = open_error(dir.path());
        assert!(msg.contains("unsupported") && msg.contains(needle), "{msg}");
    }
}

#[test]
fn bad_config_fields_name_field_expected_and_found() {
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (
            Box::new(|v| v["text_config"]["hidden_size"] = "wide".into()),
            "field `text_config.hidden_size`: expected a non-negative integer, found \"wide\"",
        ),
        (
            Box::new(|v| v["text_config"]["num_hidden_layers"] = 0.into()),
            "field `text_config.num_hidden_layers`: expected a positive integer, found 0",
        ),
        (
            Box::new(|v| v["text_config"]["eos_token_id"] = serde_json::json!([1, 99999])),
            "field `text_config.eos_token_id`: expected a token id in the vocabulary (0..512), found 99999",
        ),
        (
            Box::new(|v| {
                v["text_config"]["layer_types"].as_array_mut().unwrap().pop();
            }),
            "field `text_config.layer_types`: expected 10 entries",
        ),
        (Box::new(|v| v["text_config"]["layer_types"][1] = "local".into()), "field `text_config.layer_types[1]`"),
        (Box::new(|v| v["text_config"]["num_key_value_heads"] = 3.into()), "a divisor of num_attention_heads"),
        (Box::new(|v| v["text_config"]["num_kv_shared_layers"] = 10.into()), "fewer than num_hidden_layers"),
        (
            Box::new(|v| v["text_config"]["enable_moe_block"] = true.into()),
            "field `text_config.num_experts`: expected a non-negative integer, found nothing",
        ),
        (
            Box::new(|v| {
                let t = &mut v["text_config"];
                (t["enable_moe_block"], t["num_experts"], t["top_k_experts"]) = (true.into(), 4.into(), 5.into());
            }),
            "field `text_config.top_k_experts`: expected at most num_experts (4), found 5",
        ),
        (
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("text_config");
            }),
            "field `text_config`: expected an object, found nothing",
        ),
    ];
    for (edit, needle) in cases {
        let dir = published_copy("tiny");
        edit_config(dir.path(), edit);
        let msg = open_error(dir.path());
        assert!(msg.contains("config.json") && msg.contains(needle), "{msg}");
    }
}

#[test]
fn cli_exits_nonzero_with_one_line_on_a_broken_checkpoint() {
    let dir = published_copy("tiny");
    rewrite(dir.path(), |n, d, s, b| (n != format!("{P}layers.0.self_attn.k_norm.weight")).then_some((d, s, b)));
    let out = g4c(&["run", dir.path().to_str().unwrap(), "--prompt-ids", "2,3"]);
    assert_one_line_error(&out, &["missing", "layers.0.self_attn.k_norm.weight"]);
}

/// A copy of the pack-quantized tiny model in the published layout, for tests that damage it.
#[test]
fn damaged_pack_quantized_tensors_are_named() {
    let q = |s: &str| format!("{P}layers.2.mlp.up_proj.{s}");
    // Truncated words, scales of the wrong shape, a float weight where a packed one belongs, a
    // weight_shape that disagrees, and unsigned words.
    let dir = published_copy("tiny-qat");
    rewrite(dir.path(), |n, d, s, b| {
        if n == q("weight_packed") {
            Some((d, vec![s[0], s[1] - 1], b[..b.len() - 4 * s[0]].to_vec()))
        } else if n == q("weight_scale") {
            Some((d, vec![s[0], s[1] * 2], [b.clone(), b].concat()))
        } else if n == format!("{P}layers.3.mlp.down_proj.weight_packed") {
            Some((Dtype::BF16, vec![s[0], s[1] * 8], vec![0; s[0] * s[1] * 16]))
        } else if n == format!("{P}layers.4.mlp.gate_proj.weight_shape") {
            Some((d, s, [7i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect()))
        } else if n == format!("{P}layers.1.mlp.gate_proj.weight_packed") {
            // The words as unsigned: an element type the IR has none for, named rather than missed.
            Some((Dtype::U32, s, b))
        } else {
            Some((d, s, b))
        }
    });
    let msg = open_error(dir.path());
    assert!(msg.contains(&format!("`{}` is i32[128, 7], expected i32[128, 8]", q("weight_packed"))), "{msg}");
    assert!(msg.contains(&format!("`{}` has shape [128, 16], expected [128, 8]", q("weight_scale"))), "{msg}");
    assert!(msg.contains("layers.3.mlp.down_proj.weight_packed` is bf16[64, 128], expected i32[64, 16]"), "{msg}");
    assert!(msg.contains("layers.4.mlp.gate_proj.weight_shape` says I64 [7, 7], expected I64 [128, 64]"), "{msg}");
    assert!(msg.contains("layers.1.mlp.gate_proj.weight_packed` has element type U32, expected i32"), "{msg}");

    // Zero points, and a float copy beside the packed words: they would change the layer were they
    // read, so they are refused rather than ignored.
    let dir = published_copy("tiny-qat");
    let zero_point = format!("{P}layers.0.self_attn.o_proj.weight_zero_point");
    let float = format!("{P}layers.0.self_attn.q_proj.weight");
    let added = vec![
        (zero_point.clone(), Dtype::I32, vec![64, 1], [vec![0; 63 * 4], 3i32.to_le_bytes().to_vec()].concat()),
        (float.clone(), Dtype::F32, vec![128, 64], vec![0; 128 * 64 * 4]),
    ];
    rewrite_adding(dir.path(), added, |_, d, s, b| Some((d, s, b)));
    let msg = open_error(dir.path());
    assert!(msg.contains(&format!("`{zero_point}`: zero points other than 0")), "{msg}");
    assert!(msg.contains(&format!("both `{float}` and `{float}_packed`")), "{msg}");
}

#[test]
fn quantization_configs_g4c_cannot_run_are_refused_by_field() {
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (Box::new(|c| c["quantization_config"]["quant_method"] = "gptq".into()), "quantization_config.quant_method"),
        (Box::new(|c| c["quantization_config"]["format"] = "int-quantized".into()), "quantization_config.format"),
        (
            Box::new(|c| c["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = false.into()),
            "weights.symmetric`: expected true (g4c has no zero points), found false",
        ),
        (
            Box::new(|c| c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8.into()),
            "weights.num_bits`: expected 4, found 8",
        ),
        (
            Box::new(|c| {
                c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel".into()
            }),
            "weights.strategy",
        ),
        (
            Box::new(|c| {
                c["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
                    serde_json::json!({"num_bits": 8})
            }),
            "input_activations`: expected null (W4A16",
        ),
        (
            Box::new(|c| c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 48.into()),
            "which the quantization group size 48",
        ),
    ];
    for (edit, needle) in cases {
        let dir = published_copy("tiny-qat");
        edit_config(dir.path(), edit);
        let msg = open_error(dir.path());
        assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
    }
}

/// `generation_config.json` that is not an object was read as one with no fields, and its EOS ids
/// were not checked against the vocabulary.
#[test]
fn generation_config_is_an_object_of_ids_in_the_vocabulary() {
    for (text, needle) in [
        ("[]", "generation_config.json: field `(top level)`: expected a JSON object, found []"),
        (
            r#"{"eos_token_id": [1, 9999]}"#,
            "field `eos_token_id`: expected a token id in the vocabulary (0..512), found 9999",
        ),
    ] {
        let dir = published_copy("tiny");
        std::fs::write(dir.path().join("generation_config.json"), text).unwrap();
        let msg = open_error(dir.path());
        assert!(msg.contains(needle), "{msg}");
    }
}
