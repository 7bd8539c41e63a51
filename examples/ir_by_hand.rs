//! Builds a small IR function with the builder, prints its text form, parses it back and runs it in
//! the reference interpreter: RMSNorm of a vector, the building block of every Gemma 4 layer.
//!
//!     cargo run --example ir_by_hand

use g4c_ir::{
    parse_module, print_module, verify_module, BinaryOp, DType, FunctionBuilder, Module, ReduceKind, ResultRole,
    TensorType, UnaryOp,
};
use g4c_runtime::{Interpreter, NoWeights, Tensor};
use std::sync::Arc;

fn main() {
    let mut module = Module::new("example");
    let mut b = FunctionBuilder::new("rms_norm", &module.weights);
    let x = b.input("x", TensorType::new(DType::F32, [1, 4]));
    let sq = b.binary(BinaryOp::Mul, x, x);
    let sum = b.reduce(ReduceKind::Sum, sq, &[1]);
    let mean = b.binary_scalar(BinaryOp::Div, sum, 4.0);
    let shifted = b.binary_scalar(BinaryOp::Add, mean, 1e-6);
    let inv = b.unary(UnaryOp::Rsqrt, shifted);
    let inv = b.broadcast(inv, &[1, 4], &[0]);
    let y = b.binary(BinaryOp::Mul, x, inv);
    let f = b.finish(vec![("y", y, ResultRole::Output)]);
    module.functions.push(f);

    let text = print_module(&module);
    print!("{text}");
    let parsed = parse_module(&text).expect("the printed text parses");
    verify_module(&parsed).expect("and verifies");

    let mut interp = Interpreter::new(Arc::new(parsed), Arc::new(NoWeights));
    let out = interp.call("rms_norm", vec![Tensor::f32([1, 4], vec![1.0, 2.0, 3.0, 4.0])]).expect("runs");
    println!("rms_norm([1, 2, 3, 4]) = {:?}", out[0].as_f32().unwrap());
}
