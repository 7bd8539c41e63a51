//! Artifacts: `g4c compile -o` then `g4c run ARTIFACT` reproduces the goldens on a clean cache, with
//! the checkpoint gone; an artifact for another target, or a damaged one, is refused or repaired.

use crate::common::{assert_matches_golden, assert_one_line_error, g4c_with_cache, golden_cases, golden_dir, run_case};
use std::path::Path;

/// A copy of a golden checkpoint (so that it can be moved away).
fn checkpoint_copy(model: &str, layout: &str, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden_dir(model).join(layout).join(f), into.join(f)).unwrap();
    }
}

fn compile(cache: &Path, checkpoint: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["compile", checkpoint.to_str().unwrap(), "-o", out.to_str().unwrap(), "--context", "64"];
    if !extra.contains(&"--prefill-buckets") {
        args.extend(["--prefill-len", "8"]);
    }
    args.extend(extra);
    let compiled = g4c_with_cache(cache, &args);
    let stderr = String::from_utf8_lossy(&compiled.stderr);
    assert!(compiled.status.success(), "{stderr}");
    assert!(!stderr.contains('\r') && !stderr.contains('\x1b'), "no progress bars when piped: {stderr:?}");
}

#[test]
fn compiled_artifacts_reproduce_the_goldens_without_their_checkpoint() {
    // tiny: prefill entry points of 2, 4 and 8 tokens (prompts of 1, 3, 4 and 11 tokens use 2; 4; 4;
    // 8 + 4); gqa: one of 8 tokens.
    for (model, layout, extra) in [("tiny", "hf", &["--prefill-buckets", "2,4,8"][..]), ("gqa", "published", &[])] {
        let tmp = tempfile::tempdir().unwrap();
        let (checkpoint, artifact) = (tmp.path().join("checkpoint"), tmp.path().join("artifact"));
        checkpoint_copy(model, layout, &checkpoint);
        compile(&tmp.path().join("compile-cache"), &checkpoint, &artifact, extra);
        std::fs::remove_dir_all(&checkpoint).unwrap();
        // A clean cache: the executables come from the artifact itself.
        let cache = tmp.path().join("run-cache");
        let runner = |args: &[&str]| g4c_with_cache(&cache, args);
        for case in golden_cases(model) {
            let (generation, _) = run_case(&runner, &artifact, &case, &[]);
            assert_matches_golden(&format!("artifact {model}/{layout} {}", case.name), &generation, &case);
        }
        assert!(!cache.join("executables").exists(), "nothing was compiled");
        // The reference interpreter runs the artifact's IR and weights too.
        let case = golden_cases(model).into_iter().find(|c| c.name == "long").unwrap();
        let (generation, _) = run_case(&runner, &artifact, &case, &["--backend", "interp"]);
        assert_matches_golden(&format!("artifact {model}/{layout} interp"), &generation, &case);
    }
}

#[test]
fn an_artifact_keeps_its_target_and_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let artifact = tmp.path().join("tpu");
    // No TPU plugin here: the artifact holds StableHLO and bf16 weights, no executables.
    compile(&cache, &golden_dir("tiny").join("hf"), &artifact, &["--target", "tpu-v6e"]);
    let a = artifact.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", a, "--prompt-ids", "2,10"];
        args.extend(extra);
        g4c_with_cache(&cache, &args)
    };
    assert_one_line_error(&run(&[]), &["compiled for target tpu-v6e", "runs on cpu"]);
    assert_one_line_error(&run(&["--target", "cpu"]), &["compiled for target tpu-v6e, not cpu"]);
    let inspect = g4c_with_cache(&cache, &["inspect", a]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("tpu-v6e") && text.contains("compute bf16") && text.contains("no executables"), "{text}");

    let cpu = tmp.path().join("cpu");
    compile(&cache, &golden_dir("tiny").join("hf"), &cpu, &[]);
    let c = cpu.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", c, "--prompt-ids", "2,10"];
        args.extend(extra);
        g4c_with_cache(&cache, &args)
    };
    assert_one_line_error(&run(&["--context", "128"]), &["compiled for a context of 64"]);
    assert_one_line_error(&run(&["--prefill-buckets", "16"]), &["prefill lengths [8]"]);
    // serve (and chat, through the same check) take the artifact's batch and prefill length.
    let serve = g4c_with_cache(&cache, &["serve", c, "--port", "0", "--max-batch", "3"]);
    assert_one_line_error(&serve, &["--max-batch 3", "compiled for batch 1"]);
    let serve = g4c_with_cache(&cache, &["serve", c, "--port", "0", "--prefill-len", "16"]);
    assert_one_line_error(&serve, &["--prefill-len 16", "prefill lengths [8]"]);
}

#[test]
fn damaged_artifacts_are_refused_or_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let artifact = tmp.path().join("artifact");
    compile(&cache, &golden_dir("tiny").join("hf"), &artifact, &[]);
    let a = artifact.to_str().unwrap();
    let run = || g4c_with_cache(&cache, &["run", a, "--prompt-ids", "2,10,20", "--max-new-tokens", "4", "--stats"]);
    let good = run();
    assert!(good.status.success());

    // A damaged executable inside the artifact: reported, left alone, compiled into the user's cache
    // and loaded from there by later runs.
    let exe = std::fs::read_dir(artifact.join("executables")).unwrap().flatten().next().unwrap().path();
    let mut bytes = std::fs::read(&exe).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&exe, &bytes).unwrap();
    assert!(!cache.join("executables").exists(), "compile -o stages the artifact's executables, not the cache's");
    let repaired = run();
    let stderr = String::from_utf8_lossy(&repaired.stderr);
    assert!(repaired.status.success(), "{stderr}");
    assert!(stderr.contains("checksum mismatch") && stderr.contains("compiled 1 of 2"), "{stderr}");
    assert!(!stderr.contains("was removed"), "an artifact is never modified by running it: {stderr}");
    assert_eq!(repaired.stdout, good.stdout);
    // The artifact still holds the damaged entry; the next run says where it loads instead.
    let again = run();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(
        stderr.contains("checksum mismatch") && stderr.contains("instead") && stderr.contains("cached"),
        "{stderr}"
    );
    assert!(!stderr.contains("again"), "nothing is compiled again: {stderr}");
    assert_eq!(again.stdout, good.stdout);
    assert_one_line_error(&g4c_with_cache(&cache, &["inspect", a, "--verify"]), &["checksum mismatch"]);
    bytes[last] ^= 0x10;
    std::fs::write(&exe, &bytes).unwrap();
    assert!(g4c_with_cache(&cache, &["inspect", a, "--verify"]).status.success());

    // A manifest whose shapes are not the module's (the flags a run takes are checked against the
    // manifest), and a config that is not the one compiled: refused by `run` and by `--verify`.
    let manifest_path = artifact.join("manifest.json");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    let mut edited: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    edited["shapes"]["context"] = serde_json::json!(edited["shapes"]["context"].as_u64().unwrap() * 2);
    std::fs::write(&manifest_path, edited.to_string()).unwrap();
    assert_one_line_error(&run(), &["manifest.json records", "context", "damaged"]);
    assert_one_line_error(&g4c_with_cache(&cache, &["inspect", a, "--verify"]), &["manifest.json records"]);
    // Any other edit of the manifest (a target, an entry's input types) changes its digest.
    for edit in [(|m: &mut serde_json::Value| m["target"]["name"] = "h200".into()) as fn(&mut serde_json::Value), |m| {
        m["entries"][0]["inputs"][0] = "ids: i32[1,9]".into()
    }] {
        let mut edited: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        edit(&mut edited);
        std::fs::write(&manifest_path, edited.to_string()).unwrap();
        assert_one_line_error(&run(), &["manifest.json does not match its digest"]);
        assert_one_line_error(&g4c_with_cache(&cache, &["inspect", a, "--verify"]), &["does not match its digest"]);
    }
    std::fs::write(&manifest_path, &manifest).unwrap();
    let config_path = artifact.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replacen("\"vocab_size\": 512", "\"vocab_size\": 1000", 1)).unwrap();
    assert_ne!(std::fs::read_to_string(&config_path).unwrap(), config, "the edit took");
    assert_one_line_error(&g4c_with_cache(&cache, &["inspect", a, "--verify"]), &["config.json differs"]);
    std::fs::write(&config_path, &config).unwrap();
    assert!(g4c_with_cache(&cache, &["inspect", a, "--verify"]).status.success());

    // Damaged weights: caught by size at open, by content hash with `inspect --verify`.
    let weights = artifact.join("weights.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&weights, &bytes).unwrap();
    assert_one_line_error(
        &g4c_with_cache(&cache, &["inspect", a, "--verify"]),
        &["weights.safetensors", "content hash"],
    );
    bytes.truncate(middle);
    std::fs::write(&weights, &bytes).unwrap();
    assert_one_line_error(&run(), &["weights.safetensors", "truncated"]);

    // A damaged manifest, and a directory that is not an artifact, are refused.
    std::fs::write(artifact.join("manifest.json"), "{").unwrap();
    assert_one_line_error(&run(), &["manifest.json"]);
    let not_artifact = tmp.path().join("not-an-artifact");
    std::fs::create_dir_all(&not_artifact).unwrap();
    std::fs::write(not_artifact.join("notes.txt"), "mine").unwrap();
    let out = g4c_with_cache(
        &cache,
        &["compile", golden_dir("tiny").join("hf").to_str().unwrap(), "-o", not_artifact.to_str().unwrap()],
    );
    assert_one_line_error(&out, &["is not a g4c artifact"]);
    assert!(not_artifact.join("notes.txt").exists());
}
