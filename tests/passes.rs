//! Passes on the tiny model: each preserves its output exactly, narrow targets stay as close to the
//! f32 goldens as transformers' own narrow runs, and snapshots of the IR after the passes that
//! change it. Each pass on small hand-written IR is a filetest (`tests/filetests/<pass>/`).

use crate::common::{assert_matches_golden, golden_cases, golden_dir, run_transformed, Backend};
use g4c_frontend::{Model, Shapes};
use g4c_ir::Target;
use g4c_ir::{print_module, Module};
use g4c_passes::{ConstantFold, Cse, Dce, Pass, Pipeline};

type Transform = Box<dyn Fn(&mut Module)>;

fn cpu() -> &'static Target {
    Target::by_name("cpu").unwrap()
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

/// `split-attention` (a GPU target's pass) changes a long cache's softmax into chunks combined
/// afterwards: in f32 the tiny model's tokens stay the same and its logits within f32 rounding
/// (1e-4 of their scale, exponentials rounded at other points), with caches of 1100 slots (18 chunks of 64 on t4g, the last padded).
#[test]
fn split_attention_preserves_the_tiny_model() {
    use crate::common::long_context_generate;
    let dir = golden_dir("tiny").join("hf");
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "long").unwrap();
    let n = case.generated_ids.len();
    let t4g = Target::by_name("t4g").unwrap();
    let generate = |split: bool| {
        let transform = |m: &mut Module| {
            if split {
                let concats = |m: &Module| print_module(m).matches("= concat").count();
                let before = concats(m);
                g4c_passes::SplitAttention.run(m, t4g).unwrap();
                assert!(concats(m) > before, "split-attention found nothing to split");
            }
        };
        long_context_generate(Backend::Interp, None, &dir, &case.prompt_ids, n, None, 1100, &transform)
    };
    let (want, got) = (generate(false), generate(true));
    assert_eq!(got.generated_ids, want.generated_ids);
    for (step, (a, b)) in got.logits.iter().zip(&want.logits).enumerate() {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-4 * scale, "step {step}: logits differ by {worst} (scale {scale})");
    }
    assert_matches_golden("split-attention", &got, &case);
}

/// Chunks whose every slot is masked: with `-inf` scores (a mask written so, or one rounded to a
/// narrow type) a chunk's maximum would be `-inf` and its exponentials `exp(-inf - -inf)`, NaN, had
/// `split-attention` not floored it; with Gemma's `-1e30` they weigh nothing either. The split
/// softmax equals the unsplit one within f32 rounding, here with only 3 of 1100 slots visible.
#[test]
fn split_attention_leaves_masked_chunks_out() {
    use g4c_runtime::{Interpreter, NoWeights, Tensor};
    use std::sync::Arc;
    let text = "module @m {
  func @f(
    %q: f32[1,2,16],
    %k: f32[1,1100,16],
    %mask: f32[1,2,1100],
    %v: f32[1,1100,8]
  ) -> (
    o: f32[1,2,8]
  ) {
    %d = dot_general %q, %k {lhs_batch = [0], rhs_batch = [0], lhs_contract = [2], rhs_contract = [2]} : f32[1,2,1100]
    %s = add %d, %mask : f32[1,2,1100]
    %m = reduce %s {kind = max, axes = [2]} : f32[1,2]
    %mb = broadcast %m {dims = [0, 1]} : f32[1,2,1100]
    %x = sub %s, %mb : f32[1,2,1100]
    %e = exp %x : f32[1,2,1100]
    %l = reduce %e {kind = sum, axes = [2]} : f32[1,2]
    %lb = broadcast %l {dims = [0, 1]} : f32[1,2,1100]
    %p = div %e, %lb : f32[1,2,1100]
    %o = dot_general %p, %v {lhs_batch = [0], rhs_batch = [0], lhs_contract = [2], rhs_contract = [1]} : f32[1,2,8]
    return %o
  }
}
";
    let unsplit = g4c_ir::parse_module(text).unwrap();
    let mut split = unsplit.clone();
    g4c_passes::SplitAttention.run(&mut split, Target::by_name("t4g").unwrap()).unwrap();
    g4c_ir::verify_module(&split).unwrap();
    assert!(print_module(&split).contains(".split.chunks"), "split-attention split nothing");
    let run = |m: &Module, inputs: &[Tensor]| {
        let mut interp = Interpreter::new(Arc::new(m.clone()), Arc::new(NoWeights));
        interp.call("f", inputs.to_vec()).unwrap()[0].as_f32().unwrap().to_vec()
    };
    let numbers = |n: usize, seed: usize| (0..n).map(|i| ((i * 37 + seed) % 101) as f32 / 50.0 - 1.0).collect();
    for masked in [f32::NEG_INFINITY, -1e30] {
        let mut mask = vec![masked; 2 * 1100];
        (mask[5], mask[700], mask[1100 + 1099]) = (0.0, 0.0, 0.0);
        let inputs = [
            Tensor::f32([1, 2, 16], numbers(2 * 16, 1)),
            Tensor::f32([1, 1100, 16], numbers(1100 * 16, 2)),
            Tensor::f32([1, 2, 1100], mask),
            Tensor::f32([1, 1100, 8], numbers(1100 * 8, 3)),
        ];
        let (want, got) = (run(&unsplit, &inputs), run(&split, &inputs));
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "masked with {masked}: {got:?} where unsplit {want:?}");
        }
        // A row that sees no slot (a padding row) gives 0, where unsplit it averages every value
        // (or, masked with `-inf`, is NaN): its chunks' maxima are floored, so nothing counts.
        let mut inputs = inputs;
        inputs[2] = Tensor::f32([1, 2, 1100], vec![masked; 2 * 1100]);
        assert_eq!(run(&split, &inputs), vec![0.0; 2 * 8], "masked with {masked}, nothing visible");
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
            // Kernel plans only for t4g (a TPU has none); its CUDA kernels, emulated on the host, on
            // the tiny model only (they are slow there).
            let plan = (target == "t4g").then_some(Backend::Plan);
            let kernels = (target == "t4g" && model == "tiny").then_some(Backend::CudaHost);
            for backend in [Backend::Interp, Backend::Pjrt].into_iter().chain(plan).chain(kernels) {
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

/// Turing's overflow policy end to end: a tiny model whose attention logits leave f16's range (its
/// q and k norms 64 times larger: logits up to ~10^5 from operands below 130) still generates on
/// t4g, every logit finite and near f32's.
#[test]
fn t4g_keeps_attention_logits_beyond_f16_range() {
    use crate::common::{published_copy, run_generate, target_generate};
    use crate::frontend_errors::rewrite;
    let dir = published_copy("tiny");
    rewrite(dir.path(), |name, dtype, shape, bytes| {
        let factor: f32 = match name.rsplit('.').nth(1) {
            Some("q_norm" | "k_norm") => 64.0,
            _ => return Some((dtype, shape, bytes)),
        };
        let scaled = bytes
            .chunks(2)
            .flat_map(|b| half::bf16::from_f32(half::bf16::from_le_bytes([b[0], b[1]]).to_f32() * factor).to_le_bytes())
            .collect();
        Some((dtype, shape, scaled))
    });
    let t4g = Target::by_name("t4g").unwrap();
    let prompt = [2, 17, 99, 300, 41];
    let reference = run_generate(Backend::Interp, dir.path(), &prompt, 3, None);
    let pipeline = |m: &mut Module| {
        Pipeline::for_target(t4g).run_all(m).unwrap();
    };
    let scale = reference.logits[0].iter().fold(0f32, |a, x| a.max(x.abs()));
    // The legalized module, its kernel plan, and the plan's CUDA kernels (emulated on the host).
    for backend in [Backend::Interp, Backend::Plan, Backend::CudaHost] {
        let on_t4g = match backend {
            Backend::Interp => run_transformed(backend, dir.path(), &prompt, 3, None, &pipeline),
            _ => target_generate(backend, "t4g", dir.path(), &prompt, 3, None, &pipeline),
        };
        for (step, (ours, theirs)) in on_t4g.logits.iter().zip(&reference.logits).enumerate() {
            assert!(ours.iter().all(|x| x.is_finite()), "{backend:?} step {step}: t4g logits are not finite");
            let error = ours.iter().zip(theirs).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(error <= 0.05 * scale, "{backend:?} step {step}: t4g is {error} from f32 (logit scale {scale})");
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
        // Norm statistics and softmax sums are f32 reductions (the greedy token's is over i32 ids).
        let float_reduce = |l: &&str| l.contains("= reduce ") && !l.contains(": i32[");
        assert!(text.lines().filter(float_reduce).all(|l| l.contains(": f32[")), "{}", target.name);
        // Matmuls multiply in the compute type; on f16 (range 65504) they sum and return f32.
        let dot_result = if c == "f16" { "f32" } else { c };
        assert!(
            text.lines().filter(|l| l.contains("= dot_general ")).all(|l| l.contains(&format!(": {dot_result}["))),
            "{}",
            target.name
        );
        if c == "f16" {
            // The overflow policy: no sum, product or scaling is computed in f16 (the embedding
            // scale, the residual stream and the attention logits included); f16 is only stored.
            let arithmetic =
                ["add", "sub", "mul", "div", "max", "pow", "reduce", "dot_general"].map(|op| format!("= {op} "));
            let narrow: Vec<&str> = text
                .lines()
                .filter(|l| arithmetic.iter().any(|a| l.contains(a.as_str())) && l.contains(": f16["))
                .collect();
            assert!(narrow.is_empty(), "{narrow:#?}");
        }
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
