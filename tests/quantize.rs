//! The `quantize` pass (W4A16 of a float checkpoint) against compressed-tensors: the tiny model
//! quantized by g4c holds exactly the values and scales compressed-tensors wrote for it
//! (tests/goldens/tiny-qat), and so reproduces transformers' goldens of that checkpoint; with `+head`
//! the LM head too, against transformers with its head replaced by compressed-tensors' 4-bit copy of
//! the embedding table (tests/goldens/tiny-qat-head).

use crate::common::{assert_matches_golden, g4c, golden_cases, golden_dir, run_case, run_transformed, Backend};
use g4c_frontend::{Model, Shapes};
use g4c_ir::{SourceLayout, Target};
use g4c_passes::{Pass, PipelineOptions, Quantize};
use g4c_runtime::WeightStore;

fn quantize_tiny(m: &mut g4c_ir::Module) {
    Quantize { group: 8, head: false }.run(m, Target::by_name("cpu").unwrap()).unwrap();
}

#[test]
fn quantize_reproduces_compressed_tensors_bit_for_bit() {
    let float = Model::open(&golden_dir("tiny").join("hf")).unwrap();
    let packed = Model::open(&golden_dir("tiny-qat").join("hf")).unwrap();
    let shapes = Shapes { batch: 1, prefill_len: 4, context: 8 };
    let mut ours = float.module(&shapes).unwrap();
    quantize_tiny(&mut ours);
    g4c_ir::verify_module(&ours).unwrap();
    let theirs = packed.module(&shapes).unwrap();
    let mut compared = 0;
    for decl in ours
        .weights
        .iter()
        .filter(|w| matches!(w.layout, SourceLayout::QuantizedValues { .. } | SourceLayout::QuantizedScales { .. }))
    {
        let other =
            theirs.weight(&decl.name).unwrap_or_else(|| panic!("compressed-tensors did not quantize @{}", decl.name));
        assert_eq!(decl.ty, other.ty, "@{}", decl.name);
        let (a, b) = (float.checkpoint.bytes(decl).unwrap(), packed.checkpoint.bytes(other).unwrap());
        assert!(a == b, "@{}: g4c's quantization differs from compressed-tensors'", decl.name);
        compared += 1;
    }
    // Every linear of the tiny model: 2 PLE projections per layer + q, o, gate, up, down, and k, v on
    // the 5 layers that own a cache, plus the model-level PLE projection; values and scales each.
    assert_eq!(compared, 2 * (10 * 7 + 5 * 2 + 1));
    let linears_left = theirs.weights.iter().filter(|w| w.layout == SourceLayout::PackedInt4).count();
    assert_eq!(compared / 2, linears_left, "g4c quantizes what compressed-tensors quantizes");
}

/// A mixture of experts' router stays float; its MLP's and attention's linears are quantized.
#[test]
fn quantize_leaves_the_routers_of_a_mixture() {
    let model = Model::open(&golden_dir("moe").join("hf")).unwrap();
    let mut module = model.module(&Shapes { batch: 1, prefill_len: 4, context: 8 }).unwrap();
    quantize_tiny(&mut module);
    let quantized = |name: &str| module.weight(&g4c_ir::quantized_names(name).0).is_some();
    for layer in 0..4 {
        let y = |s: &str| format!("layers.{layer}.{s}");
        assert!(!quantized(&y("router.proj")) && module.weight(&y("router.proj")).is_some(), "layer {layer}");
        assert!(quantized(&y("mlp.down_proj")) && quantized(&y("self_attn.k_proj")), "layer {layer}");
    }
}

/// Every case of golden `golden`, generated from the checkpoint in `dir` after `transform`, on the
/// interpreter and through PJRT.
fn assert_every_case_matches(golden: &str, dir: &std::path::Path, what: &str, transform: &dyn Fn(&mut g4c_ir::Module)) {
    for case in golden_cases(golden) {
        let n = case.generated_ids.len();
        for backend in [Backend::Interp, Backend::Pjrt] {
            let got = run_transformed(backend, dir, &case.prompt_ids, n, None, transform);
            assert_matches_golden(&format!("{backend:?} {what}/{}", case.name), &got, &case);
        }
    }
}

#[test]
fn the_quantized_tiny_model_matches_the_qat_goldens() {
    assert_every_case_matches("tiny-qat", &golden_dir("tiny").join("hf"), "tiny quantized by g4c", &quantize_tiny);
    // And through the command line, the whole cpu pipeline after it.
    let case = golden_cases("tiny-qat").into_iter().find(|c| c.name == "long").unwrap();
    let (got, _) = run_case(&g4c, &golden_dir("tiny").join("published"), &case, &["--quantize", "w4a16:g8"]);
    assert_matches_golden("g4c run --quantize w4a16:g8", &got, &case);
}

/// `+head`: the head reads a 4-bit copy of the embedding table (quantized at load), the embedding
/// lookup the table itself. On the QAT checkpoint, whose linears are 4-bit already, the pass
/// quantizes the head alone; from the float checkpoint, through the command line, everything.
#[test]
fn a_quantized_head_matches_its_goldens() {
    let quantize_head = |m: &mut g4c_ir::Module| {
        Quantize { group: 8, head: true }.run(m, Target::by_name("cpu").unwrap()).unwrap();
        let table = |name: &str| m.weight(name).unwrap_or_else(|| panic!("@{name} declared"));
        assert_eq!(table("embed_tokens.q").layout, SourceLayout::QuantizedValues { group: 8 });
        assert_eq!(table("embed_tokens").layout, SourceLayout::Stored, "the lookup keeps the table");
    };
    let dir = golden_dir("tiny-qat").join("hf");
    assert_every_case_matches("tiny-qat-head", &dir, "tiny-qat, head quantized", &quantize_head);
    let case = golden_cases("tiny-qat-head").into_iter().find(|c| c.name == "long").unwrap();
    let args = ["--quantize", "w4a16:g8+head"];
    let (got, _) = run_case(&g4c, &golden_dir("tiny").join("published"), &case, &args);
    assert_matches_golden("g4c run --quantize w4a16:g8+head", &got, &case);
}

/// `+head` on a model with no head tied to a table (every matrix a linear's weight) is an error
/// saying so, not a quiet no-op.
#[test]
fn a_quantized_head_needs_a_tied_head() {
    let mut module = g4c_ir::parse_module(
        r#"
module @untied {
  weight @w : bf16[16, 8] = "w"
  func @decode(
    %ids: i32[1,1] token_ids,
    %pos: i32[1,1] positions
  ) -> (
    logits: f32[1,16] logits
  ) {
    %id = convert %ids : f32[1,1]
    %x = broadcast %id {dims = [0, 1]} : f32[1,8]
    %w = weight @w : bf16[16,8]
    %w.f32 = convert %w : f32[16,8]
    %y = dot_general %x, %w.f32 {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : f32[1,16]
    return %y
  }
}
"#,
    )
    .unwrap();
    let error = Quantize { group: 8, head: true }.run(&mut module, Target::by_name("cpu").unwrap()).unwrap_err();
    assert!(
        error.to_string().contains("+head: no weight is read both as a linear layer's weight and otherwise"),
        "{error}"
    );
}

/// `--quantize` without `+head` on a QAT checkpoint, whose linears are 4-bit already, is an error
/// saying so, not a quiet no-op that would run the checkpoint's groups rather than the ones asked
/// for.
#[test]
fn quantizing_a_qat_checkpoint_again_is_refused() {
    let dir = golden_dir("tiny-qat").join("hf");
    let run = |scheme: &str| {
        let args =
            ["run", dir.to_str().unwrap(), "--quantize", scheme, "--prompt-ids", "2,17", "--max-new-tokens", "1"];
        g4c(&args)
    };
    crate::common::assert_one_line_error(
        &run("w4a16:g16"),
        &["pass `quantize`", "4-bit already (a QAT export)", "+head"],
    );
    let head = run("w4a16:g8+head");
    assert!(head.status.success(), "{}", String::from_utf8_lossy(&head.stderr));
}

/// `--quantize` names the scheme and its group, and `+head`, as it is spelled; reports and artifacts
/// record that spelling.
#[test]
fn quantize_options_round_trip() {
    for text in ["w4a16:g32", "w4a16:g8+head", "w4a16:g128+head"] {
        let options = PipelineOptions::from_quantize(Some(text)).unwrap();
        assert_eq!(options.describe(), text);
    }
    let head = PipelineOptions::from_quantize(Some("w4a16+head")).unwrap();
    assert_eq!(head, PipelineOptions { quantize_group: Some(32), quantize_head: true });
    for bad in ["w4a16+tail", "+head", "w4a16:g8+head+head", "w4a16:+head"] {
        let error = PipelineOptions::from_quantize(Some(bad)).unwrap_err();
        assert!(error.contains(&format!("found `{bad}`")) && error.contains("+head"), "{error}");
    }
}

#[test]
fn quantize_names_a_linear_the_group_does_not_divide() {
    let out = g4c(&["ir", golden_dir("tiny").join("hf").to_str().unwrap(), "--target", "cpu", "--quantize", "w4a16"]);
    crate::common::assert_one_line_error(
        &out,
        &["pass `quantize`", "per_layer_projection has 8 inputs", "group size 32"],
    );
    let out =
        g4c(&["run", golden_dir("tiny").join("hf").to_str().unwrap(), "--prompt-ids", "2", "--quantize", "w4a16:g12"]);
    crate::common::assert_one_line_error(&out, &["--quantize", "w4a16:g12", "multiple of 8"]);
}

/// An artifact of the quantized model stores its 4-bit values as its target uses them (`cpu`: one to a
/// byte; a TPU: packed, in compressed-tensors' words), records how it was quantized, reproduces the
/// goldens without the checkpoint, and refuses to be run as another quantization.
#[test]
fn quantized_artifacts_run_without_their_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiny-w4.g4c");
    let model = golden_dir("tiny").join("published");
    let args =
        ["compile", model.to_str().unwrap(), "--prefill-len", "16", "--context", "40", "-o", out.to_str().unwrap()];
    let compiled = g4c(&[&args[..], &["--quantize", "w4a16:g8"]].concat());
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["options"], "w4a16:g8");
    assert_eq!(manifest["passes"][0], "quantize");
    let module = std::fs::read_to_string(out.join("module.g4c")).unwrap();
    assert!(module.contains("weight @layers.0.mlp.up_proj.q : i8[128,64] = \"layers.0.mlp.up_proj.q\"\n"), "{module}");
    let case = golden_cases("tiny-qat").into_iter().find(|c| c.name == "long").unwrap();
    let (got, _) = run_case(&g4c, &out, &case, &[]);
    assert_matches_golden("quantized artifact", &got, &case);
    let other = g4c(&["run", out.to_str().unwrap(), "--prompt-ids", "2", "--quantize", "w4a16:g16"]);
    crate::common::assert_one_line_error(&other, &["compiled with w4a16:g8, not w4a16:g16"]);

    let tpu = tmp.path().join("tiny-w4-tpu.g4c");
    let args = [
        "compile",
        model.to_str().unwrap(),
        "--target",
        "tpu-v6e",
        "--quantize",
        "w4a16:g8",
        "-o",
        tpu.to_str().unwrap(),
    ];
    let compiled = g4c(&args);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let module = std::fs::read_to_string(tpu.join("module.g4c")).unwrap();
    assert!(
        module.contains("weight @layers.0.mlp.up_proj.q : i4[128,64] = \"layers.0.mlp.up_proj.q\" packed_int4"),
        "{module}"
    );
    let mlir = std::fs::read_to_string(tpu.join("stablehlo/decode.mlir")).unwrap();
    assert!(mlir.contains("tensor<128x64xi4>"), "StableHLO carries int4 on a TPU");
}
