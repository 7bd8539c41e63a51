//! `g4c compile`: the report states what the IR after the pipeline holds, and the StableHLO of a TPU
//! target is well-formed enough for the CPU plugin to compile.

use crate::common::{g4c, golden_dir};
use g4c_frontend::synth::Preset;
use g4c_frontend::Shapes;
use g4c_ir::Target;
use g4c_passes::{compile_report, Pipeline};

#[test]
fn tiny_report_and_tpu_stablehlo_compiles_on_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = golden_dir("tiny").join("published");
    let out = g4c(&[
        "compile",
        dir.to_str().unwrap(),
        "--target",
        "tpu-v6e",
        "--prefill-len",
        "128",
        "--context",
        "4096",
        "--check-on-cpu",
        "--json",
        "-o",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["target"]["name"], "tpu-v6e");
    assert_eq!(report["kv_layers"], 5);
    // bf16 caches: 4 sliding layers × K,V × 32 + 1 full × K,V × 64 elements, 2 bytes each.
    assert_eq!(report["kv_bytes_per_token"], (4 * 2 * 32 + 2 * 64) * 2);
    let names: Vec<&str> = report["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["prefill", "decode"]);
    assert_eq!(
        report["converts"],
        converts_in_text(&tmp.path().join("module.g4c")),
        "converts, counted in the IR text"
    );
    for file in ["stablehlo/prefill.mlir", "stablehlo/decode.mlir", "module.g4c", "weights.safetensors"] {
        assert!(tmp.path().join(file).exists(), "{file}");
    }
    let mlir = std::fs::read_to_string(tmp.path().join("stablehlo/decode.mlir")).unwrap();
    assert!(mlir.contains("tf.aliasing_output"), "caches are donated");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["report"], report, "the manifest carries the compile report");
    assert_eq!(manifest["executables_environment"], serde_json::Value::Null, "no TPU plugin here");
}

/// `convert` instructions per function of a printed module, counted in its text.
fn converts_in_text(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    let mut counts = serde_json::Map::new();
    let mut function = None;
    for line in text.lines() {
        if let Some(name) = line.trim().strip_prefix("func @") {
            function = Some(name.trim_end_matches('(').to_string());
            counts.insert(function.clone().unwrap(), 0.into());
        } else if line.contains(" = convert ") {
            let n = &mut counts[function.as_deref().unwrap()];
            *n = (n.as_u64().unwrap() + 1).into();
        }
    }
    serde_json::Value::Object(counts)
}

/// The E2B module (weights declared from the config, bf16 as published) after `target`'s pipeline.
fn e2b_report(target: &str) -> serde_json::Value {
    preset_report(Preset::E2b, target)
}

fn preset_report(preset: Preset, target: &str) -> serde_json::Value {
    let mut m = preset.declared_module(&Shapes { batch: 1, prefill_len: 128, context: 4096 }).unwrap();
    let target = Target::by_name(target).unwrap();
    let pipeline = Pipeline::for_target(target);
    pipeline.run_all(&mut m).unwrap();
    compile_report(&m, target, &pipeline.names())
}

/// On `cpu` (f32 compute, weights stored in f32 by `weight-dtype`) only two kinds of convert are
/// left: positions to f32 for the RoPE angles, and the host-gathered bf16 PLE rows to f32. Prefill
/// converts its positions twice: once for all T tokens, once for the returned token that the
/// KV-shared layers run on.
#[test]
fn cpu_keeps_only_the_converts_of_positions_and_host_rows() {
    let report = e2b_report("cpu");
    assert_eq!(report["converts"], serde_json::json!({"prefill": 3, "decode": 2}));
}

#[test]
fn e2b_on_tpu_v6e_has_18_kib_of_bf16_kv_per_token() {
    let report = e2b_report("tpu-v6e");
    assert_eq!(report["kv_layers"], 15);
    assert_eq!(report["kv_bytes_per_token"], 18 * 1024);
    let ple = 262_144u64 * 8_960;
    assert_eq!(report["host_weight_bytes"], 2 * ple);
    assert_eq!(report["device_weight_bytes"], 2 * (4_628_569_379u64 - ple), "bf16 weights as published");
    // Legalization adds converts: every matmul takes its activation in bf16 and its output widens
    // back into the f32 residual math, at least one each way per matmul (35 layers × 7 linears).
    let converts = report["converts"]["decode"].as_u64().unwrap();
    assert!(converts >= 2 * 35 * 7, "{converts} converts");
}

#[test]
fn e2b_report_counts_fifteen_kv_layers() {
    let report = e2b_report("cpu");
    assert_eq!(report["kv_layers"], 15);
    // 12 sliding × 2 × 256 + 3 full × 2 × 512 elements per token, in f32 caches: 36 KiB (18 KiB in bf16).
    assert_eq!(report["kv_bytes_per_token"], 36 * 1024);
    // 4,628,569,379 parameters. The PLE table (262,144 × 8,960, bf16) stays on the host
    // (`host-tables`); on `cpu` (f32 compute) `weight-dtype` stores everything else in f32.
    let ple = 262_144u64 * 8_960;
    assert_eq!(report["host_weight_bytes"], 2 * ple);
    assert_eq!(report["device_weight_bytes"], 4 * (4_628_569_379u64 - ple));
}

/// E2B as the QAT export publishes it: on a bf16 target the device holds the linears as 4-bit
/// values (half a byte each) with one bf16 scale per 32, and everything else but the host-side PLE
/// table in bf16: 1.86 GB, counted here from the config, independently of the IR the report reads.
#[test]
fn e2b_qat_on_tpu_v6e_holds_4_bit_linears() {
    use g4c_frontend::expected_tensors;
    let report = preset_report(Preset::E2bQat, "tpu-v6e");
    let cfg = Preset::E2bQat.config().unwrap();
    let size = |t: &g4c_frontend::ExpectedTensor| t.shape.iter().product::<usize>() as u64;
    let tensors = expected_tensors(&cfg);
    let linear: u64 = tensors.iter().filter(|t| t.linear).map(size).sum();
    let other: u64 = tensors.iter().filter(|t| !t.linear).map(size).sum();
    let ple = 262_144u64 * 8_960;
    assert_eq!(report["device_weight_bytes"], linear / 2 + linear / 32 * 2 + 2 * (other - ple));
    assert_eq!(report["host_weight_bytes"], 2 * ple);
    assert_eq!(report["device_weight_bytes"], 1_861_589_574u64);
}
