//! Properties the code relies on, over random well-typed IR (proptest): print → parse → print is the
//! identity, and every pass of every target's pipeline leaves what the interpreter computes unchanged
//! on random inputs, bit for bit: against the module as built for every pass up to `dtype-legalize`
//! (which rounds to the target's compute type on purpose), and against the legalized module after it.
//! Programs mix elementwise ops, splat constants (for constant folding), repeated subexpressions (for
//! CSE), values no result reads (for DCE), reductions, broadcasts, transposes, comparisons and
//! selects, and conversions; `G4C_FUZZ_CASES` sets how many (default 100), `G4C_FUZZ_SEED` which.

use g4c_ir::{BinaryOp, CompareDir, DType, FunctionBuilder, Module, ReduceKind, ResultRole, TensorType, UnaryOp};
use g4c_runtime::{Interpreter, NoWeights, Tensor};
use proptest::prelude::*;
use std::sync::Arc;

const SHAPE: [usize; 2] = [2, 3];

/// One instruction of a random program; operands index the values made so far (modulo their count).
#[derive(Clone, Debug)]
enum Step {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Splat(f64),
    /// Reduce over the last axis and broadcast back.
    ReduceBack(usize, usize),
    /// Transpose there and back.
    TransposeTwice(usize),
    Select(usize, usize, usize, usize, usize),
    /// Through a narrower float type and back.
    RoundTrip(usize, usize),
}

const NARROW: [DType; 2] = [DType::BF16, DType::F16];
const FLOAT_UNARY: [UnaryOp; 10] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Tanh,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Sign,
];
const FLOAT_BINARY: [BinaryOp; 8] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
    BinaryOp::Rem,
];

fn step() -> impl Strategy<Value = Step> {
    let v = || 0usize..64;
    prop_oneof![
        (0..FLOAT_UNARY.len(), v()).prop_map(|(o, a)| Step::Unary(o, a)),
        (0..FLOAT_BINARY.len(), v(), v()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        prop_oneof![Just(0.0), Just(-0.0), Just(1.0), Just(0.5), Just(-2.0), Just(3.0e38), Just(1e-40)]
            .prop_map(Step::Splat),
        (0..ReduceKind::ALL.len(), v()).prop_map(|(k, a)| Step::ReduceBack(k, a)),
        v().prop_map(Step::TransposeTwice),
        (0..CompareDir::ALL.len(), v(), v(), v(), v()).prop_map(|(d, a, b, c, e)| Step::Select(d, a, b, c, e)),
        (0..NARROW.len(), v()).prop_map(|(t, a)| Step::RoundTrip(t, a)),
    ]
}

/// The program as a module with one function `@f(%x, %y) -> (r0, r1)`: the last value and one
/// chosen earlier (everything else is dead).
fn build(steps: &[Step], kept: usize) -> Module {
    let mut module = Module::new("random");
    let mut b = FunctionBuilder::new("f", &module.weights);
    let ty = TensorType::new(DType::F32, SHAPE);
    let mut values = vec![b.input("x", ty.clone()), b.input("y", ty.clone())];
    for s in steps {
        let at = |i: usize| values[i % values.len()];
        let v = match *s {
            Step::Unary(o, a) => b.unary(FLOAT_UNARY[o], at(a)),
            Step::Binary(o, a, c) => b.binary(FLOAT_BINARY[o], at(a), at(c)),
            Step::Splat(x) => b.splat(x, ty.clone()),
            Step::ReduceBack(k, a) => {
                let r = b.reduce(ReduceKind::ALL[k], at(a), &[1]);
                b.broadcast(r, &SHAPE, &[0])
            }
            Step::TransposeTwice(a) => {
                let t = b.transpose(at(a), &[1, 0]);
                b.transpose(t, &[1, 0])
            }
            Step::Select(d, p, q, t, f) => {
                let c = b.compare(CompareDir::ALL[d], at(p), at(q));
                b.select(c, at(t), at(f))
            }
            Step::RoundTrip(n, a) => {
                let narrow = b.convert(at(a), NARROW[n]);
                b.convert(narrow, DType::F32)
            }
        };
        values.push(v);
    }
    let last = *values.last().unwrap();
    let other = values[kept % values.len()];
    let f = b.finish(vec![("r0", last, ResultRole::Output), ("r1", other, ResultRole::Output)]);
    module.functions.push(f);
    module
}

fn run(module: &Module, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut interp = Interpreter::new(Arc::new(module.clone()), Arc::new(NoWeights));
    interp.call("f", inputs.to_vec()).expect("a verified module runs")
}

/// Equal bit for bit, except that any NaN equals any NaN.
fn same_bits(a: &[Tensor], b: &[Tensor]) -> Result<(), String> {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.ty != y.ty) {
        let types = |ts: &[Tensor]| ts.iter().map(|t| t.ty.to_string()).collect::<Vec<_>>().join(", ");
        return Err(format!("results ({}) became ({})", types(a), types(b)));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
        if let Some(j) = (0..x.len()).find(|&j| x[j].to_bits() != y[j].to_bits() && !(x[j].is_nan() && y[j].is_nan())) {
            return Err(format!("result {i} element {j}: {} before, {} after", x[j], y[j]));
        }
    }
    Ok(())
}

fn inputs() -> impl Strategy<Value = Vec<Tensor>> {
    let n = SHAPE.iter().product::<usize>();
    let value = prop_oneof![-4.0f32..4.0, Just(0.0), Just(-0.0), Just(f32::INFINITY), Just(f32::NAN), Just(1e-42)];
    prop::collection::vec(prop::collection::vec(value, n), 2)
        .prop_map(|v| v.into_iter().map(|d| Tensor::f32(SHAPE, d)).collect())
}

#[test]
fn random_ir_prints_parses_and_prints_the_same() {
    let mut runner = crate::common::fuzz_runner();
    let strategy = (prop::collection::vec(step(), 1..40), any::<usize>());
    runner
        .run(&strategy, |(steps, kept)| {
            let module = build(&steps, kept);
            g4c_ir::verify_module(&module).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = g4c_ir::print_module(&module);
            let parsed = g4c_ir::parse_module(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            prop_assert_eq!(g4c_ir::print_module(&parsed), text);
            Ok(())
        })
        .unwrap();
}

/// After every pass the results are the same bits as before it, except across `dtype-legalize`,
/// whose rounding tests/passes.rs measures on the model against transformers.
#[test]
fn every_pass_preserves_what_the_interpreter_computes() {
    let mut runner = crate::common::fuzz_runner();
    let strategy = (prop::collection::vec(step(), 1..40), any::<usize>(), inputs());
    runner
        .run(&strategy, |(steps, kept, inputs)| {
            let module = build(&steps, kept);
            let want = run(&module, &inputs);
            for target in g4c_ir::TARGETS {
                let pipeline = g4c_passes::Pipeline::for_target(target);
                let mut m = module.clone();
                let mut failure = None;
                let mut baseline = want.clone();
                pipeline
                    .run(&mut m, None, &mut |pass, after| {
                        let got = run(after, &inputs);
                        if pass == "dtype-legalize" {
                            baseline = got;
                        } else if let (None, Err(e)) = (&failure, same_bits(&baseline, &got)) {
                            failure = Some(format!("{} after `{pass}`: {e}", target.name));
                        }
                    })
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(f) = failure {
                    return Err(TestCaseError::fail(format!("{f}\n{}", g4c_ir::print_module(&module))));
                }
            }
            Ok(())
        })
        .unwrap();
}

/// A cache entry with any one byte changed, or cut short anywhere, is rejected, never loaded.
#[test]
fn every_damaged_cache_entry_is_rejected() {
    use g4c_runtime::cache::entry::{decode, encode, EntryMeta};
    let mut runner = crate::common::fuzz_runner();
    let strategy = (
        prop::collection::btree_map("[a-z_]{1,12}", "[ -~]{0,24}", 0..6),
        prop::collection::vec(any::<u8>(), 0..512),
        any::<prop::sample::Index>(),
        1u8..=255,
        any::<prop::sample::Index>(),
    );
    runner
        .run(&strategy, |(meta, body, at, xor, cut)| {
            let meta = EntryMeta(meta.into_iter().map(|(k, v)| (k, v.into())).collect());
            let good = encode(&meta, &body);
            prop_assert!(decode(&good).is_ok());
            let mut changed = good.clone();
            changed[at.index(good.len())] ^= xor;
            prop_assert!(decode(&changed).is_err(), "a changed byte at {} was accepted", at.index(good.len()));
            prop_assert!(decode(&good[..cut.index(good.len())]).is_err(), "a truncation was accepted");
            Ok(())
        })
        .unwrap();
}
