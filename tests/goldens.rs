//! The interpreter against transformers 5.23 (tests/goldens, made by scripts/goldens/make_goldens.py).
//! Tokens must match exactly and logits within 1e-3 of the logit scale, for checkpoints saved by
//! transformers and for the same weights in the published bf16 layout, and whatever the padding and
//! chunking of the prefill: transformers ran every prompt unpadded, in one call.

use crate::common::{assert_matches_golden, golden_cases, golden_dir, interp_generate};

fn check_model(model: &str, layout: &str) {
    for case in golden_cases(model) {
        let got = interp_generate(&golden_dir(model).join(layout), &case.prompt_ids, case.generated_ids.len(), None);
        assert_matches_golden(&format!("{model}/{layout}/{}", case.name), &got, &case);
    }
}

#[test]
fn tiny_transformers_checkpoint() {
    check_model("tiny", "hf");
}

#[test]
fn tiny_published_bf16_checkpoint() {
    check_model("tiny", "published");
}

#[test]
fn gqa_transformers_checkpoint() {
    check_model("gqa", "hf");
}

#[test]
fn gqa_published_bf16_checkpoint() {
    check_model("gqa", "published");
}

/// Right-padding the prompt to a bucket larger than the window must change nothing: padded tokens
/// carry position -1, write no cache slot and are never attended to (the "bug A/B" family).
#[test]
fn bucket_padding_beyond_the_window_changes_nothing() {
    for model in ["tiny", "gqa"] {
        for case in golden_cases(model) {
            let bucket = 16.max(case.prompt_ids.len());
            let got = interp_generate(
                &golden_dir(model).join("hf"),
                &case.prompt_ids,
                case.generated_ids.len(),
                Some(bucket),
            );
            assert_matches_golden(&format!("{model}/{} padded to {bucket}", case.name), &got, &case);
        }
    }
}

/// Chunked prefill (several prefill calls, the last one padded) must equal one unpadded call.
#[test]
fn chunked_prefill_changes_nothing() {
    for model in ["tiny", "gqa"] {
        for case in golden_cases(model).into_iter().filter(|c| c.prompt_ids.len() > 3) {
            let got =
                interp_generate(&golden_dir(model).join("hf"), &case.prompt_ids, case.generated_ids.len(), Some(3));
            assert_matches_golden(&format!("{model}/{} in chunks of 3", case.name), &got, &case);
        }
    }
}

/// The transformers checkpoint re-saved as two f16 shards with `model.safetensors.index.json`.
#[test]
fn sharded_f16_checkpoint() {
    use safetensors::{tensor::TensorView, Dtype, SafeTensors};
    let src = golden_dir("tiny").join("hf");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    type Shard = Vec<(String, Vec<usize>, Vec<u8>)>;
    let mut shards: [Shard; 2] = [vec![], vec![]];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in st.tensors().into_iter().enumerate() {
        let f16: Vec<u8> = t
            .data()
            .chunks_exact(4)
            .flat_map(|b| half::f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
            .collect();
        let shard = i % 2;
        weight_map.insert(name.clone(), format!("model-0000{}-of-00002.safetensors", shard + 1).into());
        shards[shard].push((name, t.shape().to_vec(), f16));
    }
    for (s, tensors) in shards.iter().enumerate() {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, shape, b)| (n.clone(), TensorView::new(Dtype::F16, shape.clone(), b).unwrap()))
            .collect();
        let path = dir.path().join(format!("model-0000{}-of-00002.safetensors", s + 1));
        std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();

    // bf16-exact weights are f16-exact unless tiny enough to be f16 subnormals, so tokens must match.
    for case in golden_cases("tiny") {
        let got = interp_generate(dir.path(), &case.prompt_ids, case.generated_ids.len(), None);
        assert_eq!(got.generated_ids, case.generated_ids, "tiny/{} from f16 shards", case.name);
    }
}

/// StableHLO through the PJRT CPU plugin against the same goldens: both models, both layouts, and
/// prompts right-padded to a bucket larger than the window.
#[test]
fn pjrt_cpu_matches_goldens() {
    use crate::common::{run_generate, Backend};
    for model in ["tiny", "gqa"] {
        for layout in ["hf", "published"] {
            for case in golden_cases(model) {
                let dir = golden_dir(model).join(layout);
                let got = run_generate(Backend::Pjrt, &dir, &case.prompt_ids, case.generated_ids.len(), None);
                assert_matches_golden(&format!("pjrt {model}/{layout}/{}", case.name), &got, &case);
            }
        }
        for case in golden_cases(model) {
            let bucket = 16.max(case.prompt_ids.len());
            let dir = golden_dir(model).join("hf");
            let got = run_generate(Backend::Pjrt, &dir, &case.prompt_ids, case.generated_ids.len(), Some(bucket));
            assert_matches_golden(&format!("pjrt {model}/{} padded to {bucket}", case.name), &got, &case);
        }
    }
}

/// W4A16: the tiny models quantized by compressed-tensors (pack-quantized, as the Gemma 4 QAT exports
/// are) against transformers' own load of them (scripts/goldens/make_qat_goldens.py), on the
/// interpreter and through PJRT, as saved by transformers and in the published layout (whose
/// `ignore` list leaves the gqa model's `per_layer_projection` in bf16).
#[test]
fn pack_quantized_checkpoints_match_their_goldens() {
    use crate::common::{run_generate, Backend};
    for model in ["tiny-qat", "gqa-qat"] {
        for layout in ["hf", "published"] {
            check_model(model, layout);
            for case in golden_cases(model) {
                let dir = golden_dir(model).join(layout);
                let got = run_generate(Backend::Pjrt, &dir, &case.prompt_ids, case.generated_ids.len(), None);
                assert_matches_golden(&format!("pjrt {model}/{layout}/{}", case.name), &got, &case);
            }
        }
    }
}
