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
            let got = interp_generate(&golden_dir(model).join("hf"), &case.prompt_ids, case.generated_ids.len(), Some(bucket));
            assert_matches_golden(&format!("{model}/{} padded to {bucket}", case.name), &got, &case);
        }
    }
}

/// Chunked prefill (several prefill calls, the last one padded) must equal one unpadded call.
#[test]
fn chunked_prefill_changes_nothing() {
    for model in ["tiny", "gqa"] {
        for case in golden_cases(model).into_iter().filter(|c| c.prompt_ids.len() > 3) {
            let got = interp_generate(&golden_dir(model).join("hf"), &case.prompt_ids, case.generated_ids.len(), Some(3));
            assert_matches_golden(&format!("{model}/{} in chunks of 3", case.name), &got, &case);
        }
    }
}
