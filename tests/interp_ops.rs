//! Interpreter ops against results worked out by hand.

use g4c_ir::{parse_module, verify_module};
use g4c_runtime::{Interpreter, NoWeights, Tensor};

/// Runs the single function `@f` whose signature and body are given.
fn run(sig: &str, body: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    let text = format!("module @m {{\n  func @f{sig} {{\n{body}\n  }}\n}}\n");
    let m = parse_module(&text).map_err(|e| e.to_string())?;
    verify_module(&m).map_err(|e| e.to_string())?;
    let mut interp = Interpreter::new(std::sync::Arc::new(m), std::sync::Arc::new(NoWeights));
    interp.call("f", inputs).map_err(|e| e.to_string())
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().to_vec()
}

#[test]
fn batched_dot_general() {
    // [2 batches] x ([2,3] · [3,2]).
    let out = run(
        "(%a: f32[2,2,3], %b: f32[2,3,2]) -> (c: f32[2,2,2])",
        "    %0 = dot_general %a, %b {lhs_batch = [0], rhs_batch = [0], lhs_contract = [2], rhs_contract = [1]} : f32[2,2,2]\n    return %0",
        vec![
            Tensor::f32([2, 2, 3], vec![1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.]),
            Tensor::f32([2, 3, 2], vec![1., 0., 0., 1., 1., 1., 7., 8., 9., 10., 11., 12.]),
        ],
    )
    .unwrap();
    assert_eq!(f32s(&out[0]), vec![4., 5., 10., 11., 7., 8., 9., 10.]);
}

#[test]
fn dot_general_against_a_linear_weight() {
    // x [1,2] · Wᵀ with W [3,2] (HF layout): contract dim 1 of both.
    let out = run(
        "(%x: f32[1,2], %w: f32[3,2]) -> (y: f32[1,3])",
        "    %0 = dot_general %x, %w {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : f32[1,3]\n    return %0",
        vec![Tensor::f32([1, 2], vec![1., 2.]), Tensor::f32([3, 2], vec![1., 1., 0., 1., -1., 0.5])],
    )
    .unwrap();
    assert_eq!(f32s(&out[0]), vec![3., 2., 0.]);
}

#[test]
fn layout_ops() {
    let x = || Tensor::f32([2, 3], vec![0., 1., 2., 3., 4., 5.]);
    let t = run(
        "(%x: f32[2,3]) -> (y: f32[3,2])",
        "    %0 = transpose %x {perm = [1, 0]} : f32[3,2]\n    return %0",
        vec![x()],
    )
    .unwrap();
    assert_eq!(f32s(&t[0]), vec![0., 3., 1., 4., 2., 5.]);
    let s = run(
        "(%x: f32[2,3]) -> (y: f32[2,2])",
        "    %0 = slice %x {start = [0, 1], limit = [2, 3]} : f32[2,2]\n    return %0",
        vec![x()],
    )
    .unwrap();
    assert_eq!(f32s(&s[0]), vec![1., 2., 4., 5.]);
    let c = run(
        "(%x: f32[2,3]) -> (y: f32[2,6])",
        "    %0 = concat %x, %x {axis = 1} : f32[2,6]\n    return %0",
        vec![x()],
    )
    .unwrap();
    assert_eq!(f32s(&c[0]), vec![0., 1., 2., 0., 1., 2., 3., 4., 5., 3., 4., 5.]);
    let b = run(
        "(%v: f32[3]) -> (y: f32[2,3])",
        "    %0 = broadcast %v {dims = [1]} : f32[2,3]\n    return %0",
        vec![Tensor::f32([3], vec![7., 8., 9.])],
    )
    .unwrap();
    assert_eq!(f32s(&b[0]), vec![7., 8., 9., 7., 8., 9.]);
    let b = run(
        "(%v: f32[2,1]) -> (y: f32[2,3])",
        "    %0 = broadcast %v {dims = [0, 1]} : f32[2,3]\n    return %0",
        vec![Tensor::f32([2, 1], vec![1., 2.])],
    )
    .unwrap();
    assert_eq!(f32s(&b[0]), vec![1., 1., 1., 2., 2., 2.]);
    let r = run(
        "(%x: f32[2,3]) -> (y: f32[3])",
        "    %0 = reduce %x {kind = sum, axes = [0]} : f32[3]\n    return %0",
        vec![x()],
    )
    .unwrap();
    assert_eq!(f32s(&r[0]), vec![3., 5., 7.]);
    let r = run(
        "(%x: f32[2,3]) -> (y: f32[2])",
        "    %0 = reduce %x {kind = max, axes = [1]} : f32[2]\n    return %0",
        vec![x()],
    )
    .unwrap();
    assert_eq!(f32s(&r[0]), vec![2., 5.]);
    let i = run("() -> (y: i32[2,3])", "    %0 = iota {dim = 1} : i32[2,3]\n    return %0", vec![]).unwrap();
    assert_eq!(i[0].as_i32().unwrap(), &[0, 1, 2, 0, 1, 2]);
}

#[test]
fn converts_round_like_stablehlo() {
    // 1 + 2^-8 is halfway between two bf16 values and rounds to even (1.0); 1 + 3·2^-8 rounds up.
    let out = run(
        "(%x: f32[4]) -> (y: bf16[4], z: i32[4])",
        "    %0 = convert %x : bf16[4]\n    %1 = convert %x : i32[4]\n    return %0, %1",
        vec![Tensor::f32([4], vec![1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.7, 65504.0])],
    )
    .unwrap();
    assert_eq!(f32s(&out[0]), vec![1.0, 1.015625, -2.703125, 65536.0]);
    assert_eq!(out[1].as_i32().unwrap(), &[1, 1, -2, 65504]);
}

#[test]
fn gather_out_of_range_is_an_error() {
    let e = run(
        "(%t: f32[3,2], %i: i32[2]) -> (y: f32[2,2])",
        "    %0 = gather %t, %i : f32[2,2]\n    return %0",
        vec![Tensor::f32([3, 2], vec![0.; 6]), Tensor::i32([2], vec![1, 3])],
    )
    .unwrap_err();
    assert!(e.contains("%0 = gather") && e.contains("index 3 out of range for a table of 3 rows"), "{e}");
}

#[test]
fn update_slots_skips_padding_and_rejects_collisions() {
    let sig = "(%c: f32[1,4,2], %s: i32[1,3], %u: f32[1,3,2]) -> (y: f32[1,4,2])";
    let body = "    %0 = update_slots %c, %s, %u {axis = 1} : f32[1,4,2]\n    return %0";
    let upd = || Tensor::f32([1, 3, 2], vec![1., 1., 2., 2., 3., 3.]);
    let out =
        run(sig, body, vec![Tensor::f32([1, 4, 2], vec![0.; 8]), Tensor::i32([1, 3], vec![3, -1, 0]), upd()]).unwrap();
    assert_eq!(f32s(&out[0]), vec![3., 3., 0., 0., 0., 0., 1., 1.]);
    let e = run(sig, body, vec![Tensor::f32([1, 4, 2], vec![0.; 8]), Tensor::i32([1, 3], vec![2, 2, 0]), upd()])
        .unwrap_err();
    assert!(e.contains("slot 2 written twice"), "{e}");
}

#[test]
fn inputs_are_checked_against_the_signature() {
    let e = run("(%x: f32[2]) -> (y: f32[2])", "    return %x", vec![Tensor::f32([3], vec![0.; 3])]).unwrap_err();
    assert!(e.contains("input %x must be f32[2], got f32[3]"), "{e}");
}
