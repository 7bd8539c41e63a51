//! A logit bias and repetition, frequency and presence penalties (`g4c_runtime::penalties`) against
//! transformers: greedy decoding over biased and penalized logits of the tiny golden model, as
//! scripts/goldens/make_penalty_goldens.py made it (transformers' `SequenceBiasLogitsProcessor` and
//! `RepetitionPenaltyLogitsProcessor`, then vLLM's formula for the other two), through `g4c run` on the interpreter and PJRT, and
//! through the batching engine that `g4c serve` runs, every case side by side; vLLM's
//! `allowed_token_ids`, `bad_words` and `min_tokens` (transformers' `PrefixConstrainedLogitsProcessor`,
//! `NoBadWordsLogitsProcessor` and `MinNewTokensLengthLogitsProcessor`), which only `serve` takes,
//! through the engine.

use crate::batching::{admit, drain};
use crate::common::{g4c, golden_cases, golden_dir};
use g4c_runtime::{GenerateOptions, SamplingParams, SequenceEvent, SequenceRequest, StopReason};

struct PenaltyCase {
    name: String,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    logit_bias: Vec<(u32, f32)>,
    allowed_token_ids: Vec<u32>,
    bad_words: Vec<Vec<u32>>,
    min_tokens: usize,
    stop_ids: Vec<u32>,
    generated_ids: Vec<u32>,
}

impl PenaltyCase {
    /// Whether `g4c run` has flags for all the case asks (`serve`'s fields alone: not).
    fn runs_on_the_cli(&self) -> bool {
        self.allowed_token_ids.is_empty()
            && self.bad_words.is_empty()
            && self.min_tokens == 0
            && self.stop_ids.is_empty()
    }
}

fn penalty_cases() -> Vec<PenaltyCase> {
    let text = std::fs::read_to_string(golden_dir("tiny").join("penalties.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().map_or(vec![], |a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect())
    };
    let number = |v: &serde_json::Value| v.as_f64().unwrap() as f32;
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| PenaltyCase {
            name: c["name"].as_str().unwrap().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            params: SamplingParams {
                repetition_penalty: number(&c["repetition_penalty"]),
                frequency_penalty: number(&c["frequency_penalty"]),
                presence_penalty: number(&c["presence_penalty"]),
                ..Default::default()
            },
            logit_bias: c["logit_bias"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(id, bias)| (id.parse().unwrap(), number(bias)))
                .collect(),
            allowed_token_ids: ids(&c["allowed_token_ids"]),
            bad_words: c["bad_words"].as_array().map_or(vec![], |words| words.iter().map(ids).collect()),
            min_tokens: c["min_tokens"].as_u64().unwrap_or(0) as usize,
            stop_ids: ids(&c["stop_ids"]),
            generated_ids: ids(&c["generated_ids"]),
        })
        .collect()
}

#[test]
fn run_with_penalties_matches_transformers() {
    let dir = golden_dir("tiny").join("hf");
    for case in penalty_cases().into_iter().filter(PenaltyCase::runs_on_the_cli) {
        let p = &case.params;
        let prompt = case.prompt_ids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
        let new_tokens = case.generated_ids.len().to_string();
        let penalties = [p.repetition_penalty, p.frequency_penalty, p.presence_penalty].map(|x| x.to_string());
        let bias: Vec<String> = case.logit_bias.iter().map(|(id, b)| format!("{id}:{b}")).collect();
        let bias = bias.join(",");
        for backend in ["interp", "pjrt"] {
            let mut args = vec!["run", dir.to_str().unwrap(), "--prompt-ids", &prompt, "--max-new-tokens", &new_tokens];
            args.extend(["--ignore-eos", "--json", "--context", "64", "--backend", backend]);
            args.extend(["--repetition-penalty", &penalties[0], "--frequency-penalty", &penalties[1]]);
            args.extend(["--presence-penalty", &penalties[2]]);
            if !bias.is_empty() {
                args.extend(["--logit-bias", &bias]);
            }
            let out = g4c(&args);
            assert!(out.status.success(), "{backend} {}: {}", case.name, String::from_utf8_lossy(&out.stderr));
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let got: Vec<u32> =
                json["generated_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(got, case.generated_ids, "{backend} {}", case.name);
        }
    }
}

#[test]
fn batched_sequences_with_penalties_match_transformers() {
    let mut engine = crate::batching::engine(8);
    let cases = penalty_cases();
    let running: Vec<_> = cases
        .iter()
        .map(|case| {
            let options = GenerateOptions {
                max_new_tokens: case.generated_ids.len(),
                ignore_eos: true,
                sampling: case.params,
                logit_bias: case.logit_bias.clone(),
                allowed_token_ids: case.allowed_token_ids.clone(),
                bad_words: case.bad_words.clone(),
                min_tokens: case.min_tokens,
                stop_ids: case.stop_ids.clone(),
                ..Default::default()
            };
            admit(&mut engine, SequenceRequest { prompt: case.prompt_ids.clone(), options })
        })
        .collect();
    // Beside them, a golden case without penalties: the call reads logits for the penalized rows,
    // and this row must still take plain greedy tokens.
    let plain = &golden_cases("tiny")[0];
    let options = GenerateOptions { max_new_tokens: plain.generated_ids.len(), ignore_eos: true, ..Default::default() };
    let beside = admit(&mut engine, SequenceRequest { prompt: plain.prompt_ids.clone(), options });
    drain(&mut engine);
    for (case, recorder) in cases.iter().zip(&running) {
        assert_eq!(recorder.tokens(), case.generated_ids, "{}", case.name);
        if !case.stop_ids.is_empty() {
            let stopped = Some(&SequenceEvent::Finished(StopReason::StopId));
            assert_eq!(recorder.events().last(), stopped, "{} ends at its stop id", case.name);
        }
    }
    assert_eq!(beside.tokens(), plain.generated_ids, "{} without penalties", plain.name);
}

#[test]
fn penalties_out_of_range_are_refused() {
    let dir = golden_dir("tiny").join("hf");
    let dir = dir.to_str().unwrap();
    for (flag, value, expected) in [
        ("--repetition-penalty", "0", "expected a number > 0"),
        ("--frequency-penalty", "2.5", "expected a number from -2 to 2"),
        ("--presence-penalty", "-3", "expected a number from -2 to 2"),
        ("--logit-bias", "17:-101", "expected ID:BIAS with BIAS from -100 to 100, found `17:-101`"),
        ("--logit-bias", "17", "found `17`"),
        ("--logit-bias", "512:1", "token id 512 is not in the vocabulary"),
    ] {
        let out = g4c(&["run", dir, "--prompt-ids", "2", flag, value]);
        crate::common::assert_one_line_error(&out, &[flag, expected]);
    }
}
