//! Passes: each on small hand-written IR with its expected output (the IR text form is the test
//! format), each preserving the tiny model's output exactly, and a snapshot of the tiny model's IR
//! after every pass of the `cpu` pipeline.

use crate::common::{assert_matches_golden, golden_cases, golden_dir, run_transformed, Backend};
use g4c_frontend::{Model, Shapes};
use g4c_ir::Target;
use g4c_ir::{parse_module, print_module, Module};
use g4c_passes::{ConstantFold, Cse, Dce, Pass, Pipeline};

type Transform = Box<dyn Fn(&mut Module)>;

fn cpu() -> &'static Target {
    Target::by_name("cpu").unwrap()
}

/// Runs `pass` on the function body given as text and returns the printed body.
fn apply(pass: &dyn Pass, sig: &str, body: &str) -> String {
    let text = format!("module @m {{\n  func @f{sig} {{\n{body}\n  }}\n}}\n");
    let mut m = parse_module(&text).unwrap_or_else(|e| panic!("{e}"));
    g4c_ir::verify_module(&m).unwrap();
    pass.run(&mut m, cpu()).unwrap();
    g4c_ir::verify_module(&m).unwrap();
    let printed = print_module(&m);
    let start = printed.find(") {\n").unwrap() + 4;
    let end = printed.rfind("  }\n}").unwrap();
    printed[start..end].to_string()
}

const SIG: &str = "(%x: f32[4]) -> (y: f32[4])";

#[test]
fn cse_merges_equal_instructions() {
    let out = apply(
        &Cse,
        SIG,
        "    %0 = constant {value = 2.0} : f32[4]\n    %1 = constant {value = 2.0} : f32[4]\n    %2 = mul %x, %0 : f32[4]\n    %3 = mul %x, %1 : f32[4]\n    %4 = add %2, %3 : f32[4]\n    return %4",
    );
    // %3 became %2 and %1 became %0; the duplicates stay until dce.
    assert!(out.contains("%4 = add %2, %2 : f32[4]"), "{out}");
}

#[test]
fn cse_keeps_different_attributes_and_types_apart() {
    let out = apply(
        &Cse,
        SIG,
        "    %0 = constant {value = 2.0} : f32[4]\n    %1 = constant {value = 3.0} : f32[4]\n    %2 = add %0, %1 : f32[4]\n    return %2",
    );
    assert!(out.contains("%2 = add %0, %1"), "{out}");
}

#[test]
fn dce_removes_what_no_result_reads() {
    let out = apply(
        &Dce,
        SIG,
        "    %0 = exp %x : f32[4]\n    %1 = tanh %0 : f32[4]\n    %2 = neg %x : f32[4]\n    return %2",
    );
    assert_eq!(out.trim(), "%0 = neg %x : f32[4]\n    return %0");
}

#[test]
fn constant_fold_folds_splat_chains_and_selects() {
    let out = apply(
        &ConstantFold,
        "(%x: f32[2,3], %a: i32[2,3], %b: i32[2,3]) -> (y: f32[2,3], z: i32[2,3])",
        "    %0 = constant {value = 4.0} : f32[3]\n    %1 = rsqrt %0 : f32[3]\n    %2 = broadcast %1 {dims = [1]} : f32[2,3]\n    %3 = mul %x, %2 : f32[2,3]\n    %4 = constant {value = 7} : i32[2,3]\n    %5 = constant {value = 0} : i32[2,3]\n    %6 = compare %4, %5 {dir = gt} : bool[2,3]\n    %7 = select %6, %a, %b : i32[2,3]\n    return %3, %7",
    );
    assert!(out.contains("%2 = constant {value = 0.5} : f32[2,3]"), "{out}");
    assert!(out.contains("%6 = constant {value = 1.0} : bool[2,3]"), "{out}");
    assert!(out.contains("return %3, %a"), "{out}");
}

/// Each pass alone, and the whole pipeline, leaves the tiny model's tokens and logits bit-identical.
#[test]
fn passes_preserve_the_tiny_model_exactly() {
    let dir = golden_dir("tiny").join("hf");
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "long").unwrap();
    let n = case.generated_ids.len();
    let reference = run_transformed(Backend::Interp, &dir, &case.prompt_ids, n, None, &|_| {});
    let passes: Vec<(&str, Transform)> = vec![
        ("constant-fold", Box::new(|m| ConstantFold.run(m, cpu()).unwrap())),
        ("cse", Box::new(|m| Cse.run(m, cpu()).unwrap())),
        ("dce", Box::new(|m| Dce.run(m, cpu()).unwrap())),
        ("weight-dtype", Box::new(|m| g4c_passes::WeightDtype.run(m, cpu()).unwrap())),
        ("host-tables", Box::new(|m| g4c_passes::HostTables.run(m, cpu()).unwrap())),
        ("weight-layout", Box::new(|m| g4c_passes::WeightLayout.run(m, cpu()).unwrap())),
        ("cpu pipeline", Box::new(|m| drop(Pipeline::for_target(cpu()).run_all(m).unwrap()))),
    ];
    for (name, transform) in passes {
        let got = run_transformed(Backend::Interp, &dir, &case.prompt_ids, n, None, transform.as_ref());
        assert_eq!(got.generated_ids, reference.generated_ids, "{name}");
        assert_eq!(got.logits, reference.logits, "{name}: logits changed");
        assert_matches_golden(name, &got, &case);
    }
}

/// The tiny model's decode IR after every pass of the `cpu` pipeline that changes it (a stage
/// identical to the one before it pins nothing and is not kept).
#[test]
fn tiny_ir_after_each_cpu_pass() {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    let mut m = model.module(&Shapes { batch: 1, prefill_len: 4, context: 12 }).unwrap();
    m.functions.retain(|f| f.name == "decode");
    let mut stages: Vec<(String, String)> = Vec::new();
    Pipeline::for_target(cpu())
        .run(&mut m, None, &mut |stage, m| stages.push((stage.to_string(), print_module(m))))
        .unwrap();
    for pair in stages.windows(2) {
        let ((_, before), (stage, after)) = (&pair[0], &pair[1]);
        if after != before {
            insta::assert_snapshot!(format!("tiny_decode_after_{stage}"), after);
        }
    }
}

#[test]
fn weight_dtype_stores_converted_weights_wide_and_leaves_gather_only_tables() {
    let text = "module @m {\n  weight @w : bf16[4,3] = \"w\"\n  weight @table : bf16[8,3] = \"t\"\n  weight @mixed : bf16[8,3] = \"m\"\n\n  func @f(\n    %x: f32[2,3],\n    %ids: i32[2]\n  ) -> (\n    y: f32[2,4],\n    r: f32[2,3],\n    s: f32[2,3]\n  ) {\n    %0 = weight @w : bf16[4,3]\n    %1 = convert %0 : f32[4,3]\n    %2 = dot_general %x, %1 {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : f32[2,4]\n    %3 = weight @table : bf16[8,3]\n    %4 = gather %3, %ids : bf16[2,3]\n    %5 = convert %4 : f32[2,3]\n    %6 = weight @mixed : bf16[8,3]\n    %7 = gather %6, %ids : bf16[2,3]\n    %8 = convert %7 : f32[2,3]\n    %9 = convert %6 : f32[8,3]\n    return %2, %5, %8\n  }\n}\n";
    let mut m = parse_module(text).unwrap();
    g4c_passes::WeightDtype.run(&mut m, cpu()).unwrap();
    g4c_ir::verify_module(&m).unwrap();
    let dtype = |n: &str| m.weight(n).unwrap().ty.dtype;
    assert_eq!(dtype("w"), g4c_ir::DType::F32, "a matmul weight is stored as it is computed");
    assert_eq!(dtype("table"), g4c_ir::DType::BF16, "a gather-only table keeps its type");
    assert_eq!(dtype("mixed"), g4c_ir::DType::F32, "gathered and converted whole: stored wide");
    let printed = print_module(&m);
    assert!(printed.contains("%1 = dot_general %x, %0"), "{printed}");
    assert!(printed.contains("%6 = gather %5, %ids : f32[2,3]"), "{printed}");
    assert!(printed.contains("return %1, %4, %6"), "{printed}");
    assert!(!printed.contains("convert %0"), "{printed}");
}

#[test]
fn host_tables_turn_gather_only_tables_into_host_gathered_parameters() {
    let text = "module @m {\n  weight @table : bf16[8,3] = \"t\"\n  weight @both : bf16[8,3] = \"b\"\n\n  func @f(\n    %ids: i32[2]\n  ) -> (\n    r: f32[2,3],\n    s: bf16[8,3]\n  ) {\n    %0 = weight @table : bf16[8,3]\n    %1 = gather %0, %ids : bf16[2,3]\n    %2 = convert %1 : f32[2,3]\n    %3 = weight @both : bf16[8,3]\n    %4 = gather %3, %ids : bf16[2,3]\n    return %2, %3\n  }\n}\n";
    let mut m = parse_module(text).unwrap();
    g4c_passes::HostTables.run(&mut m, cpu()).unwrap();
    g4c_ir::verify_module(&m).unwrap();
    let printed = print_module(&m);
    assert!(printed.contains("%table.rows: bf16[2,3] host_gather(@table, %ids)"), "{printed}");
    assert!(printed.contains("%0 = convert %table.rows : f32[2,3]"), "{printed}");
    assert!(printed.contains("weight @both"), "a table also read otherwise stays: {printed}");
    assert!(!printed.contains("host_gather(@both"), "{printed}");
    // The text form round-trips with the new parameter role.
    assert_eq!(print_module(&parse_module(&printed).unwrap()), printed);
}

/// Targets that compute in bf16 (tpu-v6e) or f16 (t4g), along the golden tokens (teacher forced):
/// averaged over a model's cases and steps, the legalized model's logits may be no further from the
/// f32 goldens than transformers' own run in that dtype. (These tiny models are chaotic enough that
/// single narrow-dtype steps are noise of the logit scale's order for transformers too; a wrong
/// policy is off by that much at every step.)
#[test]
fn narrow_targets_are_no_worse_than_transformers_in_that_dtype() {
    use crate::common::forced_logits;
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    for (target, dtype) in [("tpu-v6e", "bf16"), ("t4g", "f16")] {
        for model in ["tiny", "gqa"] {
            let cases = golden_cases(model);
            let theirs: Vec<f32> = cases
                .iter()
                .flat_map(|c| if dtype == "bf16" { c.bf16_error.clone() } else { c.f16_error.clone() })
                .collect();
            for backend in [Backend::Interp, Backend::Pjrt] {
                let mut ours = Vec::new();
                for case in &cases {
                    let rows = forced_logits(backend, &golden_dir(model).join("hf"), target, case);
                    ours.extend(
                        rows.iter()
                            .zip(&case.logits)
                            .map(|(r, g)| r.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)),
                    );
                }
                let what = format!("{target} ({dtype}) {model} {backend:?}");
                assert!(ours.iter().all(|x| x.is_finite()), "{what}: {ours:?}");
                assert!(
                    mean(&ours) <= mean(&theirs),
                    "{what}: mean error {} vs transformers {}",
                    mean(&ours),
                    mean(&theirs)
                );
            }
        }
    }
}

#[test]
fn legalized_ir_follows_the_policy() {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    for (target, c) in [("tpu-v6e", "bf16"), ("t4g", "f16")] {
        let target = Target::by_name(target).unwrap();
        let mut m = model.module(&Shapes { batch: 1, prefill_len: 4, context: 12 }).unwrap();
        Pipeline::for_target(target).run_all(&mut m).unwrap();
        let decode = m.function("decode").unwrap();
        for p in decode.state_params() {
            let ty = decode.ty(p.value);
            assert!(
                ty.dtype.name() == c || ty.dtype == g4c_ir::DType::I32,
                "{}: state %{} is {ty}",
                target.name,
                decode.param_name(p)
            );
        }
        assert_eq!(decode.ty(decode.result("logits").unwrap().value).dtype, g4c_ir::DType::F32);
        let text = print_module(&m);
        if target.name == "t4g" {
            // Turing has no bf16: only the host-side table's declaration may mention it.
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("bf16")).collect();
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].trim_start().starts_with("weight @embed_tokens_per_layer"), "{lines:?}");
        }
        // Norm statistics and softmax sums are f32 reductions.
        assert!(text.lines().filter(|l| l.contains("= reduce ")).all(|l| l.contains(": f32[")), "{}", target.name);
        // Matmuls run in the compute type.
        assert!(
            text.lines().filter(|l| l.contains("= dot_general ")).all(|l| l.contains(&format!(": {c}["))),
            "{}",
            target.name
        );
    }
}

#[test]
fn tiny_ir_after_dtype_legalization() {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    for target in ["tpu-v6e", "t4g"] {
        let target = Target::by_name(target).unwrap();
        let mut m = model.module(&Shapes { batch: 1, prefill_len: 4, context: 12 }).unwrap();
        m.functions.retain(|f| f.name == "decode");
        Pipeline::for_target(target).run(&mut m, Some("dtype-legalize"), &mut |_, _| {}).unwrap();
        insta::assert_snapshot!(format!("tiny_decode_{}_after_dtype-legalize", target.name), print_module(&m));
    }
}

#[test]
fn weight_layout_transposes_linear_weights_for_cpu_only() {
    let text = "module @m {\n  weight @w : f32[4,3] = \"w\"\n  weight @e : f32[8,3] = \"e\"\n\n  func @f(\n    %x: f32[2,3],\n    %ids: i32[2]\n  ) -> (\n    y: f32[2,4],\n    z: f32[2,8],\n    r: f32[2,3]\n  ) {\n    %0 = weight @w : f32[4,3]\n    %1 = dot_general %x, %0 {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : f32[2,4]\n    %2 = weight @e : f32[8,3]\n    %3 = dot_general %x, %2 {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : f32[2,8]\n    %4 = gather %2, %ids : f32[2,3]\n    return %1, %3, %4\n  }\n}\n";
    let mut m = parse_module(text).unwrap();
    assert!(!g4c_passes::WeightLayout.is_enabled(Target::by_name("tpu-v6e").unwrap()), "only targets that ask for it");
    g4c_passes::WeightLayout.run(&mut m, cpu()).unwrap();
    g4c_ir::verify_module(&m).unwrap();
    let printed = print_module(&m);
    assert!(printed.contains("weight @w : f32[3,4] = \"w\" transposed"), "{printed}");
    assert!(printed.contains("%1 = dot_general %x, %0 {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [0]} : f32[2,4]"), "{printed}");
    assert!(printed.contains("weight @e : f32[8,3] = \"e\"\n"), "also gathered: left as it is: {printed}");
    assert_eq!(print_module(&parse_module(&printed).unwrap()), printed, "`transposed` round-trips");
}
