//! Greedy tokens where the logits are (`ResultRole::GreedyTokens`): every entry point that returns
//! logits also returns their argmax, so greedy generation copies back `B` ids per call, not `B × V`
//! logits. Held to the host's own greedy pick (`sampling::argmax`, and its refusal of non-finite
//! logits) and to the transformers goldens, on every backend.

use crate::common::{golden_cases, golden_dir, greedy_generate, Backend};
use g4c_driver::{Feedback, Session, SessionOptions};
use g4c_ir::{DType, FunctionBuilder, Literal, Module, ParamRole, ResultRole, Target, TensorType};
use g4c_passes::Pipeline;
use g4c_runtime::sampling::argmax;
use g4c_runtime::{StepInputs, StepOutput};
use std::sync::Arc;

/// An entry point whose logits for token id `r` are `rows[r]` (a constant table gathered by the ids),
/// returning them and their greedy tokens.
fn table_module(rows: &[Vec<f32>]) -> Module {
    let (n, vocab) = (rows.len(), rows[0].len());
    let mut module = Module::new("greedy");
    let mut b = FunctionBuilder::new("decode", &module.weights);
    let ids = b.param("ids", TensorType::new(DType::I32, [n, 1]), ParamRole::TokenIds);
    b.param("pos", TensorType::new(DType::I32, [n, 1]), ParamRole::Positions);
    let values = rows.iter().flatten().map(|&x| x as f64).collect();
    let table =
        b.op(g4c_ir::Op::Constant { literal: Literal::Dense(values) }, Some(TensorType::new(DType::F32, [n, vocab])));
    let ids = b.reshape(ids, &[n]);
    let logits = b.gather(table, ids);
    let greedy = b.greedy_tokens(logits);
    module
        .functions
        .push(b.finish(vec![("logits", logits, ResultRole::Logits), ("greedy", greedy, ResultRole::GreedyTokens)]));
    g4c_ir::verify_module(&module).unwrap();
    module
}

/// Ties go to the lowest id (as `argmax` breaks them), and a row holding NaN, +inf or -inf anywhere
/// gives -1, which generation reports as non-finite logits, as it does when it reads the logits;
/// on the interpreter, PJRT, and t4g's kernel plan and CUDA kernels on the host, where rows of 8192
/// logits are reduced in chunks (`split-reductions`).
#[test]
fn greedy_tokens_are_the_hosts_greedy_pick() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let heads: [[f32; 8]; 8] = [
        [0.5, 2.0, -1.0, 2.0, 1.0, 0.0, -3.0, 1.5],
        [-3.0, -2.0, -2.5, -7.0, -2.0, -9.0, -2.0, -8.0],
        [0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0, -0.0],
        [-1e30, 3e29, -2.0, 1e30, 7.0, 1e30, 0.0, 1.0],
        [1.0, nan, 3.0, 0.0, 0.0, 1.0, 2.0, 0.5],
        [1.0, 2.0, 3.0, inf, 0.0, 1.0, 2.0, 0.5],
        [1.0, 2.0, 3.0, 0.0, -inf, 1.0, 2.0, 0.5],
        [nan, nan, nan, nan, nan, nan, nan, nan],
    ];
    // Each row: its head, then lower logits; the last row's maximum is in its last chunk.
    let vocab = 8192;
    let mut rows: Vec<Vec<f32>> = heads
        .iter()
        .map(|h| (0..vocab).map(|i| h.get(i).copied().unwrap_or(-10.0 - (i % 7) as f32)).collect())
        .collect();
    rows.push((0..vocab).map(|i| if i == vocab - 3 { 5.0 } else { (i % 5) as f32 }).collect());
    let want: Vec<i32> = rows
        .iter()
        .map(|r| match r.iter().all(|x| x.is_finite()) {
            true => argmax(r) as i32,
            false => -1,
        })
        .collect();
    assert_eq!(want, [1, 1, 0, 3, -1, -1, -1, -1, vocab as i32 - 3]);
    let module = table_module(&rows);
    let ids: Vec<u32> = (0..rows.len() as u32).collect();
    let fed: Vec<(usize, &[u32])> = ids.iter().map(|id| (0, std::slice::from_ref(id))).collect();
    let inputs = StepInputs::padded(1, &fed, false);
    let dir = golden_dir("tiny").join("published");
    for (backend, target) in
        [(Backend::Interp, None), (Backend::Pjrt, None), (Backend::Plan, Some("t4g")), (Backend::CudaHost, Some("t4g"))]
    {
        let options =
            SessionOptions { backend, target: target.map(str::to_string), use_cache: false, ..Default::default() };
        let session = Session::open(&dir, options).unwrap();
        let mut module = module.clone();
        if let Some(target) = target {
            Pipeline::for_target(Target::by_name(target).unwrap()).run_all(&mut module).unwrap();
            let reductions = module.functions[0].body.iter().filter(|i| i.op.mnemonic() == "reduce").count();
            assert_eq!(reductions, 4, "{target}: both reductions split in two");
        }
        let mut exec = session.executor(Arc::new(module), &Feedback::silent()).unwrap().executor;
        let got = exec.step("decode", &inputs, StepOutput::GreedyTokens).unwrap();
        assert_eq!(got.as_i32().unwrap(), want, "{}", backend.name());
    }
}

/// Greedy generation that reads nothing but the greedy tokens (as `g4c run` and the server generate)
/// gives transformers' tokens on every backend, and keeps no logits.
#[test]
fn generation_from_greedy_tokens_alone_matches_the_goldens() {
    let dir = golden_dir("tiny").join("published");
    for case in golden_cases("tiny") {
        for (backend, target) in [
            (Backend::Interp, None),
            (Backend::Pjrt, None),
            (Backend::Plan, Some("t4g")),
            (Backend::CudaHost, Some("t4g")),
        ] {
            let got = greedy_generate(backend, target, &dir, &case.prompt_ids, case.generated_ids.len());
            assert_eq!(got.generated_ids, case.generated_ids, "{} {}", backend.name(), case.name);
            assert!(got.logits.is_empty(), "{}: logits were kept", backend.name());
        }
    }
}
