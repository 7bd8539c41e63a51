//! Kernel plans for CUDA targets (fusion, scratch buffers, in-place cache writes, launches), run on
//! the CPU kernel by kernel by the interpreter: checked against transformers' goldens, against the
//! module they were made from, and for fitting the target.

use crate::common::{
    assert_matches_golden, golden_cases, golden_dir, long_context_generate, run_transformed, target_generate, Backend,
};
use g4c_frontend::{Model, Shapes};
use g4c_ir::plan::{launch_smem_bytes, print_plan, KernelKind, Slot};
use g4c_ir::{GpuLimits, Target};
use g4c_passes::{plan_module, Pass, Pipeline, PipelineOptions, PlanError};

fn w4a16(group: usize) -> PipelineOptions {
    PipelineOptions { quantize_group: Some(group), ..Default::default() }
}

/// The f32 modules (as the frontend emits them) planned for t4g, against the goldens with the
/// interpreter's tolerance: plain and pack-quantized (QAT) checkpoints, in both layouts; and with
/// long caches, their decode attention split.
#[test]
fn plans_on_the_cpu_match_the_goldens() {
    for model in ["tiny", "gqa", "keqv", "moe", "tiny-qat", "gqa-qat"] {
        for layout in ["hf", "published"] {
            for case in golden_cases(model) {
                let dir = golden_dir(model).join(layout);
                let got = target_generate(
                    Backend::Plan,
                    "t4g",
                    &dir,
                    &case.prompt_ids,
                    case.generated_ids.len(),
                    None,
                    &|_| {},
                );
                assert_matches_golden(&format!("plan {model}/{layout}/{}", case.name), &got, &case);
            }
        }
    }
    // With 1100-slot caches, whose decode attention `split-attention` splits (attention kernels).
    let t4g = Target::by_name("t4g").unwrap();
    let split = |m: &mut g4c_ir::Module| {
        g4c_passes::SplitAttention.run(m, t4g).unwrap();
        g4c_passes::Dce.run(m, t4g).unwrap();
    };
    for model in ["tiny", "tiny-qat"] {
        for case in golden_cases(model) {
            let (dir, n) = (golden_dir(model).join("hf"), case.generated_ids.len());
            let got = long_context_generate(Backend::Plan, Some("t4g"), &dir, &case.prompt_ids, n, None, 1100, &split);
            assert_matches_golden(&format!("plan {model}/{}, 1100-slot caches", case.name), &got, &case);
        }
    }
}

/// After each CUDA target's whole pipeline (f16 on t4g, bf16 on h200, weights quantized to 4 bits),
/// the plan computes exactly what the interpreter computes from the module it was made from, also
/// with the prompt padded into a longer prefill (whose products are GEMMs, not matvecs), and with
/// 1100-slot caches (whose decode attention is split into chunks: attention kernels).
#[test]
fn a_plan_computes_exactly_what_its_module_does() {
    let case = golden_cases("tiny").into_iter().find(|c| c.name == "long").unwrap();
    let dir = golden_dir("tiny").join("hf");
    let (prompt, n) = (&case.prompt_ids, case.generated_ids.len());
    for target in ["t4g", "h200"] {
        let t = Target::by_name(target).unwrap();
        let pipeline = |m: &mut g4c_ir::Module| drop(Pipeline::new(t, &w4a16(8)).run_all(m).unwrap());
        let runs = [
            ("one prefill call", None, None),
            ("a padded 16-token prefill", Some(16), None),
            ("1100-slot caches", None, Some(1100)),
        ];
        for (what, prefill, context) in runs {
            let (want, got) = match context {
                None => (
                    run_transformed(Backend::Interp, &dir, prompt, n, prefill, &pipeline),
                    target_generate(Backend::Plan, target, &dir, prompt, n, prefill, &pipeline),
                ),
                Some(c) => (
                    long_context_generate(Backend::Interp, None, &dir, prompt, n, None, c, &pipeline),
                    long_context_generate(Backend::Plan, Some(target), &dir, prompt, n, None, c, &pipeline),
                ),
            };
            assert_eq!(got.generated_ids, want.generated_ids, "{target}, {what}");
            assert_eq!(got.logits, want.logits, "{target}, {what}: logits differ");
        }
    }
}

fn tiny_plan(target: &'static Target) -> Result<g4c_ir::plan::KernelPlan, PlanError> {
    tiny_planned(target, Shapes { batch: 1, prefill_len: 16, context: 24 }).1
}

/// The tiny model for `shapes` after `target`'s pipeline (W4A16 in groups of 8), and its plan.
fn tiny_planned(
    target: &'static Target,
    shapes: Shapes,
) -> (g4c_ir::Module, Result<g4c_ir::plan::KernelPlan, PlanError>) {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    let mut m = model.module(&shapes).unwrap();
    Pipeline::new(target, &w4a16(8)).run_all(&mut m).unwrap();
    let plan = plan_module(&m, target);
    (m, plan)
}

/// The plan of the tiny model on t4g, W4A16: which ops each kernel fuses, its buffers and launch.
#[test]
fn tiny_plan_on_t4g() {
    let plan = tiny_plan(Target::by_name("t4g").unwrap()).unwrap();
    insta::assert_snapshot!("tiny_w4a16_t4g_plan", print_plan(&plan, false));
}

/// Fusion's promises, read off the plan: decode products are tiled matvecs with the dequantization
/// inside, GELU(gate)·up is one kernel reading both projections, cache writes are in place, and
/// scratch buffers are reused (far fewer buffers than materialized values).
#[test]
fn the_plan_fuses_and_reuses() {
    let plan = tiny_plan(Target::by_name("t4g").unwrap()).unwrap();
    let decode = plan.entry("decode").unwrap();
    let dots = |name: &str| {
        plan.kernels
            .function(name)
            .unwrap()
            .body
            .iter()
            .filter(|i| matches!(i.op, g4c_ir::Op::DotGeneral { .. }))
            .count()
    };
    let matvecs: Vec<_> = decode.calls.iter().filter(|c| c.kind == KernelKind::MatvecW4).collect();
    assert!(!matvecs.is_empty());
    assert!(matvecs.iter().any(|c| c.launch.tile.is_some()));
    assert!(decode.calls.iter().any(|c| c.kind == KernelKind::MatvecW4 && dots(&c.kernel) == 2), "GELU(gate)·up");
    let dequantized = |name: &str| {
        plan.kernels.function(name).unwrap().body.iter().any(|i| matches!(i.op, g4c_ir::Op::Dequantize { .. }))
    };
    assert!(matvecs.iter().all(|c| dequantized(&c.kernel)), "dequantization is inside the matvec");
    for c in decode.calls.iter().filter(|c| c.kind == KernelKind::Scatter) {
        assert!(matches!(c.output, Slot::Param(_)) && c.inputs.contains(&c.output), "{} writes in place", c.kernel);
    }
    let scratch_writes = decode.calls.iter().filter(|c| matches!(c.output, Slot::Scratch(_))).count();
    assert!(decode.buffers.len() * 4 < scratch_writes, "{} buffers for {scratch_writes} values", decode.buffers.len());
    let prefill = plan.entries.iter().find(|e| e.entry.starts_with("prefill")).unwrap();
    assert!(prefill.calls.iter().any(|c| c.kind == KernelKind::GemmW4), "a 16-token prefill multiplies 16 rows: GEMM");
}

/// A decode step's small reductions (norm statistics, softmax maximum and sum) run in the preludes
/// of the kernels reading them rather than as kernels of their own (the softmax's in attention's
/// weighted sum of values, which computes the probabilities it reads): in the tiny model's decode the
/// only reduction kernel left is the greedy token, a result. Every reduction inside a kernel is
/// its template's own or in its prelude, none computed again at each element reading it.
#[test]
fn small_reductions_run_in_their_readers_preludes() {
    let plan = tiny_plan(Target::by_name("t4g").unwrap()).unwrap();
    let decode = plan.entry("decode").unwrap();
    let reductions: Vec<_> = decode.calls.iter().filter(|c| c.kind == KernelKind::Reduce).collect();
    assert_eq!(reductions.len(), 1, "reduction kernels left");
    assert!(decode.results.contains(&reductions[0].output), "the one left is a result: the greedy token");
    let in_prelude = |c: &g4c_ir::plan::KernelCall| c.launch.prelude.map_or(0, |p| p.reductions as usize);
    let normalized = decode.calls.iter().filter(|c| c.kind == KernelKind::MatvecW4 && in_prelude(c) > 0).count();
    assert!(normalized >= 3, "q, k and v projections with their norm's statistics in the prelude");
    assert!(
        decode.calls.iter().any(|c| c.kind == KernelKind::Dot && in_prelude(c) == 2),
        "softmax: maximum and sum in the prelude of the weighted sum of values, which normalizes"
    );
    for e in &plan.entries {
        for c in &e.calls {
            let f = plan.kernels.function(&c.kernel).unwrap();
            let reduces = f.body.iter().filter(|i| matches!(i.op, g4c_ir::Op::Reduce { .. })).count();
            let own = usize::from(c.kind == KernelKind::Reduce);
            assert_eq!(reduces, own + in_prelude(c), "{}: reductions outside the template and prelude", c.kernel);
        }
    }
}

/// Kernels that do not depend on each other share a launch, each on its own blocks: a decode
/// layer's q, k and v projections (one launch reading the normed activation), with the key and
/// value cache writes on the last blocks of their projections (tails). No call of a launch reads or
/// writes what another writes, but that a tail reads its host's output once the host is done
/// (`plans_on_the_cpu_match_the_goldens` runs each launch's calls reading before any writes, as a
/// GPU may, and then its tails), they share a block size, and their shared memory fits together.
#[test]
fn independent_kernels_run_side_by_side() {
    let t4g = Target::by_name("t4g").unwrap();
    let plan = tiny_plan(t4g).unwrap();
    for e in &plan.entries {
        for calls in e.launches() {
            for (n, c) in calls.iter().enumerate() {
                let others = calls.iter().enumerate().filter(|&(m, _)| m != n);
                for (m, o) in others {
                    // A tail reads its host's output (the call before it) only after the host.
                    let hosts = |tail: usize, host: usize| calls[tail].tail && tail == host + 1;
                    let reads = c.inputs.contains(&o.output) && !hosts(n, m);
                    let read = o.inputs.contains(&c.output) && !hosts(m, n);
                    assert!(!reads && !read && c.output != o.output, "{} beside {}", c.kernel, o.kernel);
                }
                assert_eq!(c.launch.block, calls[0].launch.block, "{}", c.kernel);
            }
            assert!(launch_smem_bytes(calls) <= t4g.gpu.as_ref().unwrap().smem_per_block, "{}", calls[0].kernel);
        }
    }
    let decode = plan.entry("decode").unwrap();
    let projections = decode.launches().find(|calls| {
        let called: Vec<_> = calls.iter().filter(|c| !c.tail).collect();
        called.len() >= 3 && called.iter().all(|c| c.kind == KernelKind::MatvecW4)
    });
    let projections = projections.expect("a launch of q, k and v projections");
    let called: Vec<_> = projections.iter().filter(|c| !c.tail).collect();
    assert!(called.iter().all(|c| c.inputs == called[0].inputs), "one activation read by all three");
    // The key and value cache writes run on the last blocks of their projections, as tails.
    let tails: Vec<_> = projections.windows(2).filter(|w| w[1].tail).collect();
    assert_eq!(tails.len(), 2, "{}", print_plan(&plan, false));
    for w in tails {
        assert!(
            w[1].kind == KernelKind::Scatter && w[1].inputs.contains(&w[0].output),
            "{} writes {}",
            w[1].kernel,
            w[0].kernel
        );
    }
}

/// A decode step's queries are normed and rotated (RoPE) where the scores' matvec stages them,
/// once per block, with their norm's statistics in its prelude: no kernel of their own. The
/// rotation's cosines and sines are computed once per step, each table by a kernel of its own,
/// which every layer's scores (and keys) read.
#[test]
fn queries_are_normed_and_rotated_in_the_scores_matvec() {
    use g4c_ir::{Op, UnaryOp};
    let plan = tiny_plan(Target::by_name("t4g").unwrap()).unwrap();
    let decode = plan.entry("decode").unwrap();
    let computes = |c: &g4c_ir::plan::KernelCall, u: UnaryOp| {
        let f = plan.kernels.function(&c.kernel).unwrap();
        f.body.iter().any(|i| matches!(i.op, Op::Unary { op, .. } if op == u))
    };
    let cosines: Vec<_> = decode.calls.iter().filter(|c| computes(c, UnaryOp::Cos)).collect();
    let sines: Vec<_> = decode.calls.iter().filter(|c| computes(c, UnaryOp::Sin)).collect();
    // One table per RoPE (the sliding and the full layers'), a kernel each.
    for trig in [&cosines, &sines] {
        assert!((1..=2).contains(&trig.len()), "{:?}", trig.iter().map(|c| &c.kernel).collect::<Vec<_>>());
        assert!(trig.iter().all(|c| c.kind == KernelKind::Loop), "elementwise kernels");
    }
    assert!(cosines.iter().all(|c| !computes(c, UnaryOp::Sin)), "a table per kernel");
    let reads = |c: &g4c_ir::plan::KernelCall, tables: &[&g4c_ir::plan::KernelCall]| {
        tables.iter().any(|t| c.inputs.contains(&t.output))
    };
    // The scores: a matvec over a cache, the queries rotated as it stages them.
    let scores: Vec<_> = decode
        .calls
        .iter()
        .filter(|c| c.kind == KernelKind::Matvec && reads(c, &cosines) && reads(c, &sines))
        .collect();
    let layers = decode.calls.iter().filter(|c| c.kind == KernelKind::Dot).count();
    assert!(layers > 0 && scores.len() == layers, "{} scores matvecs for {layers} layers", scores.len());
    for c in scores {
        assert!(c.launch.prelude.is_some_and(|p| p.reductions >= 1), "{}: the queries' norm statistics", c.kernel);
    }
}

/// With 1100-slot caches, each full-attention layer's decode attention is one kernel
/// (`split-attention`): a block per chunk of 64 slots (18, the last padded) computes the scores of
/// every head, reading each key and value row once, the queries normed and rotated as it stages
/// them; the softmax's statistics have no kernels of their own. The sliding layers (131 slots)
/// keep the scores' matvec and the weighted sum.
#[test]
fn decode_attention_over_a_long_cache_is_one_kernel_per_chunk() {
    let t4g = Target::by_name("t4g").unwrap();
    let (m, plan) = tiny_planned(t4g, Shapes { batch: 1, prefill_len: 16, context: 1100 });
    let plan = plan.unwrap();
    let decode = plan.entry("decode").unwrap();
    let attention: Vec<_> = decode.calls.iter().filter(|c| c.kind == KernelKind::Attention).collect();
    let f = m.function("decode").unwrap();
    let full_layers = f.params.iter().filter(|p| {
        matches!(p.role, g4c_ir::ParamRole::KvCache { part: g4c_ir::KvPart::Key, .. }) && f.ty(p.value).shape[2] == 1100
    });
    assert!(!attention.is_empty() && attention.len() >= full_layers.count(), "{}", print_plan(&plan, false));
    for c in &attention {
        let slots = c.launch.slots.unwrap();
        assert_eq!((c.launch.grid, slots.slots), (18, 64), "{}", c.kernel);
        assert!(c.launch.prelude.is_some_and(|p| p.reductions == 1), "{}: the queries' norm in its prelude", c.kernel);
        let caches = c.inputs.iter().filter(|s| matches!(s, Slot::Param(p) if decode_cache(&m, *p))).count();
        assert_eq!(caches, 2, "{}: its key and value caches", c.kernel);
    }
    let reductions = decode.calls.iter().filter(|c| c.kind == KernelKind::Reduce).count();
    let sliding = decode.calls.iter().filter(|c| c.kind == KernelKind::Dot).count();
    assert!(sliding > 0, "the sliding layers' weighted sums of values");
    assert!(reductions <= attention.len(), "at most a kernel combining each attention's chunks: {reductions}");
}

fn decode_cache(m: &g4c_ir::Module, param: usize) -> bool {
    matches!(m.function("decode").unwrap().params[param].role, g4c_ir::ParamRole::KvCache { .. })
}

/// A kernel that does not fit is a compile-time error naming it, what it needs and the limit: here
/// a GPU whose blocks have less shared memory than one GEMM tile (the prefill's, planned first) or
/// one 32-wide matvec step of one row needs.
#[test]
fn a_kernel_that_cannot_fit_is_an_error_naming_it() {
    let t4g = Target::by_name("t4g").unwrap();
    let gpu = GpuLimits { smem_per_block: 64, smem_per_block_optin: 64, ..t4g.gpu.clone().unwrap() };
    let small: &'static Target = Box::leak(Box::new(Target { name: "t4g-64", gpu: Some(gpu), ..t4g.clone() }));
    let Err(err) = tiny_plan(small).map(|_| ()) else { panic!("a plan for 64 bytes of shared memory") };
    let err = err.to_string();
    let gemm = err.contains("gemm_w4") && err.contains("needs bytes of shared memory 10240");
    let matvec = err.contains("matvec_w4") && err.contains("needs bytes of shared memory 128");
    assert!(gemm || matvec, "{err}");
    assert!(err.contains("t4g-64's limit of 64"), "{err}");
    assert!(err.contains("kernel decode.k") || err.contains("kernel prefill"), "{err}");
}

/// Targets without CUDA have no kernel plan, and say so.
#[test]
fn only_cuda_targets_have_plans() {
    let Err(err) = tiny_plan(Target::by_name("cpu").unwrap()).map(|_| ()) else { panic!("a plan for cpu") };
    let err = err.to_string();
    assert_eq!(err, "target cpu has no kernel plan: kernel plans are for CUDA targets");
}

/// A cache write whose updates read the cache it writes cannot run in place (other threads may
/// already have stored): the plan refuses it, naming both.
#[test]
fn an_in_place_write_that_reads_its_own_cache_is_refused() {
    let text = "module @m {
  func @decode(
    %c: f32[1,4] state(0.0),
    %s: i32[1,1]
  ) -> (
    c: f32[1,4]
  ) {
    %x = slice %c {start = [0, 1], limit = [1, 2]} : f32[1,1]
    %c.next = update_slots %c, %s, %x {axis = 1} : f32[1,4]
    return %c.next
  }
}
";
    let m = g4c_ir::parse_module(text).unwrap();
    let Err(err) = plan_module(&m, Target::by_name("t4g").unwrap()).map(|_| ()) else { panic!("planned") };
    assert_eq!(err.to_string(), "kernel plan of @decode: %c is read while %c.next writes it in place");
}

/// A reduction of a cache that a later kernel reads after the cache was written in place stays a
/// kernel of its own, run before the write (not beside it): in that reader's prelude it would read
/// the new cache.
#[test]
fn a_reduction_of_a_cache_stays_before_the_cache_is_written() {
    let text = "module @m {
  func @decode(
    %c: f32[1,4] state(0.0),
    %s: i32[1,1],
    %u: f32[1,1]
  ) -> (
    y: f32[1,4],
    c: f32[1,4]
  ) {
    %r = reduce %c {kind = sum, axes = [1]} : f32[1]
    %c.next = update_slots %c, %s, %u {axis = 1} : f32[1,4]
    %r.4 = broadcast %r {dims = [0]} : f32[1,4]
    %y = add %c.next, %r.4 : f32[1,4]
    return %y, %c.next
  }
}
";
    let m = g4c_ir::parse_module(text).unwrap();
    let plan = plan_module(&m, Target::by_name("t4g").unwrap()).unwrap();
    let decode = plan.entry("decode").unwrap();
    // Nor does the write run side by side with the reduction reading the old cache; the sum reads
    // the new cache on the write's last block, as its tail.
    let launches: Vec<Vec<(KernelKind, bool)>> =
        decode.launches().map(|calls| calls.iter().map(|c| (c.kind, c.tail)).collect()).collect();
    let want = [vec![(KernelKind::Reduce, false)], vec![(KernelKind::Scatter, false), (KernelKind::Loop, true)]];
    assert_eq!(launches, want, "{}", print_plan(&plan, false));
}

/// A decode step's traffic counts, of each attention chunk kernel's key and value caches, the
/// chunks up to the step's position, which are all the kernel reads: on t4g the tiny model's
/// 1100-slot cache is 18 chunks of 64, so at position 10 one chunk of each, at 1099 all of them.
#[test]
fn plan_traffic_counts_the_attention_chunks_up_to_the_position() {
    use g4c_runtime::bench::PlanTraffic;
    let t4g = Target::by_name("t4g").unwrap();
    let (m, plan) = tiny_planned(t4g, Shapes { batch: 1, prefill_len: 2, context: 1100 });
    let plan = plan.unwrap();
    let calls = plan.entry("decode").unwrap().calls.iter().filter(|c| c.kind == KernelKind::Attention).count();
    assert!(calls > 0, "no attention kernel");
    let kv = |position| PlanTraffic::of(&plan, &m, position).unwrap().bytes.kv_bytes;
    // A key or a value cache: 1100 slots of 64 f16 features.
    let cache = 1100 * 64 * 2;
    assert_eq!(kv(None) - kv(Some(10)), calls as u64 * 2 * (cache - cache / 18));
    assert_eq!(kv(Some(1099)), kv(None));
}
