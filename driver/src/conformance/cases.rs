//! The cases: every op of the table in every element type its type rule accepts among those asked
//! for, on edge values where they mean something and on seeded random values, with empty axes where
//! an op has axes. Each case states its tolerance:
//!
//! - moves (`reshape`, `transpose`, `broadcast`, `slice`, `concat`, `gather`, `update_slots`,
//!   `select`), `constant`, `iota`, comparisons, conversions, integer and predicate ops, and the
//!   correctly rounded float ops (`neg`, `abs`, `add`, `sub`, `mul`, `div`, `max`, `min`, `rem`) are
//!   exact (float `max` and `min`, and their reductions, where the reference is not NaN: see
//!   `Tolerance::ExactWhereNotNan`);
//! - transcendental ops (`exp`, `log`, `tanh`, `sqrt`, `rsqrt`, `sin`, `cos`, `pow`) are within a few
//!   units in the last place of the result type (backends use their own approximations);
//! - sums (`reduce sum`, `dot_general`) are within a bound proportional to the sum of the magnitudes
//!   of their terms (backends add in their own order).
//!
//! What StableHLO leaves to the implementation is not compared: integer division by zero, and
//! conversion to an integer of NaN, infinities or values out of the integer's range.

use super::{Case, Tolerance};
use g4c_ir::scalar::round_float;
use g4c_ir::{
    infer_type, BinaryOp, CompareDir, DType, DotDims, FunctionBuilder, Literal, Module, Op, ReduceKind, ResultRole,
    TensorType, UnaryOp, ValueId,
};
use g4c_runtime::{Data, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Float edge values (each rounded to the type it is used in): signed zeros, f32 and f16
/// subnormals, infinities, NaN, f16's largest finite value and what rounds to it or past it.
const FLOAT_EDGES: [f32; 18] = [
    0.0,
    -0.0,
    1e-40,
    -1e-40,
    6e-8,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    65504.0,
    -65504.0,
    65519.0,
    65520.0,
    1.0,
    -1.0,
    0.5,
    -2.5,
    1e30,
    -7e-3,
];

const INT_EDGES: [i64; 18] =
    [0, 1, -1, 2, -2, 7, -7, 100, -100, i32::MAX as i64, i32::MIN as i64, 3, 5, -3, 11, 127, -128, 64];

/// Elementwise cases use `[2, 9]` (18 edge values), `[3, 5]` (random) and `[0, 4]` (empty).
const EDGE_SHAPE: [usize; 2] = [2, 9];
const RANDOM_SHAPE: [usize; 2] = [3, 5];
const EMPTY_SHAPE: [usize; 2] = [0, 4];

/// What values an input holds.
#[derive(Clone, Copy, PartialEq)]
enum Values {
    /// The edge values of its type (floats, integers wrapped into the type, alternating predicates).
    Edge,
    /// The float edge values without the subnormals (as `+1e-20` and `-1e-20`).
    EdgeNormal,
    /// Seeded random values: floats around ±4, integers in ±100, predicates.
    Random,
    /// Random floats in (0.1, 4): a domain every transcendental op accepts.
    Positive,
    /// Random integers in ±100 but never 0 (divisors).
    NonZero,
    /// Floats whose conversion to any integer type is defined (within ±100).
    Convertible,
}

struct Gen {
    rng: ChaCha8Rng,
}

impl Gen {
    fn tensor(&mut self, ty: &TensorType, values: Values) -> Tensor {
        let n = ty.numel();
        let d = ty.dtype;
        let data = if d.is_float() {
            let raw: Vec<f32> = (0..n)
                .map(|i| match values {
                    Values::Edge => FLOAT_EDGES[i % FLOAT_EDGES.len()],
                    Values::EdgeNormal => match FLOAT_EDGES[i % FLOAT_EDGES.len()] {
                        x if x != 0.0 && x.abs() < f32::MIN_POSITIVE => 1e-20f32.copysign(x),
                        x => x,
                    },
                    Values::Positive => self.rng.random_range(0.1..4.0),
                    Values::Convertible => self.rng.random_range(-100.0..100.0),
                    _ => self.rng.random_range(-4.0..4.0),
                })
                .collect();
            Data::F32(raw.into_iter().map(|x| round_float(d, x)).collect())
        } else if d == DType::Bool {
            Data::Bool((0..n).map(|i| if values == Values::Edge { i % 3 == 0 } else { self.rng.random() }).collect())
        } else {
            let raw: Vec<i64> = (0..n)
                .map(|i| match values {
                    Values::Edge => INT_EDGES[i % INT_EDGES.len()],
                    Values::NonZero => {
                        let v: i64 = self.rng.random_range(1..100);
                        if self.rng.random() {
                            v
                        } else {
                            -v
                        }
                    }
                    _ => self.rng.random_range(-100..100),
                })
                .collect();
            Data::I32(raw.into_iter().map(|v| g4c_ir::scalar::wrap_int(d, v)).collect())
        };
        Tensor::of_type(ty.clone(), data)
    }
}

/// A case builder: parameters of the given types, one op built on them, its result returned.
fn case(
    name: String,
    params: Vec<TensorType>,
    inputs: Vec<Tensor>,
    tolerance: Tolerance,
    build: impl FnOnce(&mut FunctionBuilder, &[ValueId]) -> ValueId,
) -> Case {
    let mut module = Module::new("conformance");
    let mut b = FunctionBuilder::new("case", &module.weights);
    let args: Vec<ValueId> = params.into_iter().enumerate().map(|(i, t)| b.input(&format!("x{i}"), t)).collect();
    let out = build(&mut b, &args);
    let f = b.finish(vec![("out", out, ResultRole::Output)]);
    module.functions.push(f);
    Case { name, module, inputs, tolerance }
}

/// Whether the type rule of `op` accepts operands of `operands` (no declared result type needed).
fn accepts(op: &Op, operands: &[TensorType]) -> bool {
    infer_type(op, &|i| operands[i].clone(), &|_| None, None).is_ok()
}

/// Every case for `dtypes` (element types; `bool` is included by the caller when wanted).
pub fn cases(dtypes: &[DType]) -> Vec<Case> {
    let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(0x67_34_63) };
    let mut out = vec![];
    let ty = |d: DType, shape: &[usize]| TensorType::new(d, shape.to_vec());
    let shapes = [
        (EDGE_SHAPE, Values::Edge, "edge"),
        (RANDOM_SHAPE, Values::Random, "random"),
        (EMPTY_SHAPE, Values::Random, "empty"),
    ];

    for &d in dtypes {
        // constant and iota.
        for (shape, values, what) in shapes {
            let t = ty(d, &shape);
            let dense = g.tensor(&t, values);
            let literal = Literal::Dense(dense_values(&dense));
            out.push(case(format!("constant {t} {what}"), vec![], vec![], Tolerance::Exact, |b, _| {
                b.op(Op::Constant { literal }, Some(t.clone()))
            }));
        }
        let splat = if d == DType::Bool {
            1.0
        } else if d.is_float() {
            -2.5
        } else {
            -2.0
        };
        let t = ty(d, &RANDOM_SHAPE);
        out.push(case(format!("constant splat {t}"), vec![], vec![], Tolerance::Exact, |b, _| {
            b.splat(splat, t.clone())
        }));
        if d != DType::Bool {
            for dim in 0..2 {
                let t = ty(d, &[4, 7]);
                out.push(case(format!("iota {t} dim {dim}"), vec![], vec![], Tolerance::Exact, |b, _| {
                    b.iota(dim, t.clone())
                }));
            }
        }

        // Unary ops.
        let x = ValueId(0);
        let scalar = [TensorType::scalar(d), TensorType::scalar(d)];
        for &op in UnaryOp::ALL.iter().filter(|&&op| accepts(&Op::Unary { op, x }, &scalar)) {
            let tolerance =
                if op.is_transcendental() { Tolerance::Ulps { ulps: 4, abs: 0.0 } } else { Tolerance::Exact };
            let mut inputs = shapes.to_vec();
            if op.is_transcendental() {
                inputs.push((RANDOM_SHAPE, Values::Positive, "positive"));
            }
            for (shape, values, what) in inputs {
                let t = ty(d, &shape);
                let x = g.tensor(&t, values);
                out.push(case(format!("{op} {t} {what}"), vec![t.clone()], vec![x], tolerance, |b, a| {
                    b.unary(op, a[0])
                }));
            }
        }

        // Binary ops.
        for &op in BinaryOp::ALL.iter().filter(|&&op| accepts(&Op::Binary { op, lhs: x, rhs: x }, &scalar)) {
            let divides = matches!(op, BinaryOp::Div | BinaryOp::Rem) && !d.is_float();
            let tolerance = match op {
                BinaryOp::Pow => Tolerance::Ulps { ulps: 4, abs: 0.0 },
                BinaryOp::Max | BinaryOp::Min if d.is_float() => Tolerance::ExactWhereNotNan,
                _ => Tolerance::Exact,
            };
            // XLA's CPU `pow` of a subnormal base is neither the power nor that of zero (2.8e-30 for
            // 1e-40 to the 0.75th, which is 6.6e-27): the base's edge values are normal ones.
            let edge_base = if op == BinaryOp::Pow { Values::EdgeNormal } else { Values::Edge };
            let mut inputs: Vec<([usize; 2], Values, Values, &str)> = vec![
                (EDGE_SHAPE, edge_base, Values::Random, "edge, random"),
                (EDGE_SHAPE, Values::Random, Values::Edge, "random, edge"),
                (RANDOM_SHAPE, Values::Random, Values::Random, "random"),
                (EMPTY_SHAPE, Values::Random, Values::Random, "empty"),
            ];
            if divides {
                // Integer division by zero is the implementation's to define: divisors are never 0.
                inputs = vec![
                    (EDGE_SHAPE, Values::Edge, Values::NonZero, "edge, non-zero"),
                    (RANDOM_SHAPE, Values::Random, Values::NonZero, "random, non-zero"),
                ];
            }
            if op == BinaryOp::Pow {
                inputs.push((RANDOM_SHAPE, Values::Positive, Values::Random, "positive, random"));
            }
            for (shape, lhs, rhs, what) in inputs {
                let t = ty(d, &shape);
                let (x, y) = (g.tensor(&t, lhs), g.tensor(&t, rhs));
                out.push(case(
                    format!("{op} {t} {what}"),
                    vec![t.clone(), t.clone()],
                    vec![x, y],
                    tolerance,
                    |b, a| b.binary(op, a[0], a[1]),
                ));
            }
        }

        // Comparisons and select.
        for &dir in CompareDir::ALL {
            for (shape, values, what) in shapes {
                let t = ty(d, &shape);
                let (x, y) = (g.tensor(&t, values), g.tensor(&t, Values::Random));
                out.push(case(
                    format!("compare {dir} {t} {what}"),
                    vec![t.clone(), t.clone()],
                    vec![x.clone(), x],
                    Tolerance::Exact,
                    |b, a| b.compare(dir, a[0], a[1]),
                ));
                let x = g.tensor(&t, values);
                out.push(case(
                    format!("compare {dir} {t} {what}, random"),
                    vec![t.clone(), t.clone()],
                    vec![x, y],
                    Tolerance::Exact,
                    |b, a| b.compare(dir, a[0], a[1]),
                ));
            }
        }
        for (shape, values, what) in shapes {
            let t = ty(d, &shape);
            let c = ty(DType::Bool, &shape);
            let inputs = vec![g.tensor(&c, Values::Random), g.tensor(&t, values), g.tensor(&t, Values::Random)];
            out.push(case(
                format!("select {t} {what}"),
                vec![c, t.clone(), t.clone()],
                inputs,
                Tolerance::Exact,
                |b, a| b.select(a[0], a[1], a[2]),
            ));
        }

        // Conversions to every other type.
        for &to in dtypes.iter().filter(|&&to| to != d) {
            // A float converted to an integer must be in range and not NaN or infinite: StableHLO
            // leaves the rest to the implementation.
            let float_to_int = d.is_float() && to != DType::Bool && !to.is_float();
            let inputs =
                if float_to_int { vec![(RANDOM_SHAPE, Values::Convertible, "in range")] } else { shapes.to_vec() };
            for (shape, values, what) in inputs {
                let t = ty(d, &shape);
                let x = g.tensor(&t, values);
                out.push(case(
                    format!("convert {t} to {to} {what}"),
                    vec![t.clone()],
                    vec![x],
                    Tolerance::Exact,
                    |b, a| b.convert(a[0], to),
                ));
            }
        }

        // Reductions.
        if d != DType::Bool {
            for &kind in ReduceKind::ALL {
                for (shape, values, what) in shapes {
                    for axes in [vec![1], vec![0], vec![0, 1]] {
                        let t = ty(d, &shape);
                        let x = g.tensor(&t, values);
                        let tolerance = match kind {
                            ReduceKind::Sum if d.is_float() => sum_tolerance(d, &x),
                            ReduceKind::Max | ReduceKind::Min if d.is_float() => Tolerance::ExactWhereNotNan,
                            _ => Tolerance::Exact,
                        };
                        out.push(case(
                            format!("reduce {kind} {t} axes {axes:?} {what}"),
                            vec![t.clone()],
                            vec![x],
                            tolerance,
                            |b, a| b.reduce(kind, a[0], &axes),
                        ));
                    }
                }
            }
        }

        // Moves: reshape, transpose, broadcast, slice, concat.
        for (shape, values, what) in shapes {
            let t = ty(d, &shape);
            let x = g.tensor(&t, values);
            let flat = [shape[0] * shape[1]];
            out.push(case(
                format!("reshape {t} {what}"),
                vec![t.clone()],
                vec![x.clone()],
                Tolerance::Exact,
                |b, a| b.reshape(a[0], &flat),
            ));
            out.push(case(
                format!("transpose {t} {what}"),
                vec![t.clone()],
                vec![x.clone()],
                Tolerance::Exact,
                |b, a| b.transpose(a[0], &[1, 0]),
            ));
            let wide = [shape[0], 3, shape[1]];
            out.push(case(
                format!("broadcast {t} {what}"),
                vec![t.clone()],
                vec![x.clone()],
                Tolerance::Exact,
                |b, a| b.broadcast(a[0], &wide, &[0, 2]),
            ));
            let (lo, hi) = ([0, 1], [shape[0], shape[1] - 1]);
            out.push(case(format!("slice {t} {what}"), vec![t.clone()], vec![x.clone()], Tolerance::Exact, |b, a| {
                b.slice(a[0], &lo, &hi)
            }));
            let y = g.tensor(&t, Values::Random);
            for axis in 0..2 {
                out.push(case(
                    format!("concat {t} axis {axis} {what}"),
                    vec![t.clone(), t.clone()],
                    vec![x.clone(), y.clone()],
                    Tolerance::Exact,
                    |b, a| b.concat(&[a[0], a[1]], axis),
                ));
            }
        }
        let t = ty(d, &[1, 4]);
        let x = g.tensor(&t, Values::Random);
        out.push(case(format!("broadcast {t} size-1 dim"), vec![t.clone()], vec![x], Tolerance::Exact, |b, a| {
            b.broadcast(a[0], &[3, 4], &[0, 1])
        }));

        // gather and update_slots.
        let table = ty(d, &[6, 3]);
        let idx = ty(DType::I32, &[2, 2]);
        let inputs = vec![g.tensor(&table, Values::Edge), Tensor::i32([2, 2], vec![5, 0, 3, 3])];
        out.push(case(format!("gather {table}"), vec![table.clone(), idx], inputs, Tolerance::Exact, |b, a| {
            b.gather(a[0], a[1])
        }));
        let cache = ty(d, &[2, 5, 3]);
        let upd = ty(d, &[2, 2, 3]);
        let slots = ty(DType::I32, &[2, 2]);
        // Row 0 writes slots 4 and 0; row 1 writes slot 2 and skips a padding token (-1).
        let inputs = vec![
            g.tensor(&cache, Values::Random),
            Tensor::i32([2, 2], vec![4, 0, -1, 2]),
            g.tensor(&upd, Values::Edge),
        ];
        out.push(case(format!("update_slots {cache}"), vec![cache, slots, upd], inputs, Tolerance::Exact, |b, a| {
            b.update_slots(a[0], a[1], a[2], 1)
        }));

        // dequantize: i4 and i8 values in groups of 8 along [4, 16] (and an empty [0, 16]), scales and
        // results of this float type.
        if d.is_float() {
            for q_dtype in [DType::I4, DType::I8] {
                for (rows, what) in [(4, "edge"), (0, "empty")] {
                    let (qt, st) = (ty(q_dtype, &[rows, 16]), ty(d, &[rows, 2]));
                    let q = g.tensor(&qt, Values::Edge);
                    let s = g.tensor(&st, Values::Edge);
                    for out_dtype in [DType::F32, d] {
                        out.push(case(
                            format!("dequantize {qt} by {st} to {out_dtype} {what}"),
                            vec![qt.clone(), st.clone()],
                            vec![q.clone(), s.clone()],
                            Tolerance::Exact,
                            |b, a| b.dequantize(a[0], a[1], 8, out_dtype),
                        ));
                    }
                }
            }
        }

        // dot_general: a matmul, a batched one, and an empty contraction.
        if d.is_float() {
            let plain = DotDims { lhs_contract: vec![1], rhs_contract: vec![1], ..Default::default() };
            let batched =
                DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
            for (l, r, dims, what) in [
                (vec![3, 16], vec![5, 16], plain.clone(), "matmul"),
                (vec![2, 3, 8], vec![2, 8, 4], batched, "batched"),
                (vec![3, 0], vec![5, 0], plain, "empty contraction"),
            ] {
                let (lt, rt) = (ty(d, &l), ty(d, &r));
                let (x, y) = (g.tensor(&lt, Values::Random), g.tensor(&rt, Values::Random));
                let tolerance = dot_tolerance(d, &x, &y);
                out.push(case(
                    format!("dot_general {lt} x {rt} {what}"),
                    vec![lt, rt],
                    vec![x, y],
                    tolerance,
                    |b, a| b.dot_general(a[0], a[1], dims),
                ));
            }
        }
    }
    out
}

fn dense_values(t: &Tensor) -> Vec<f64> {
    match &t.data {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
    }
}

/// The unit roundoff of f32, in which sums are accumulated.
const F32_EPSILON: f32 = f32::EPSILON;

/// A sum may differ by the order of its terms: at most (terms × unit roundoff) × Σ|x|; a narrow
/// result may also be accumulated in its own type (XLA's CPU backend does for bf16), which costs up
/// to one unit in its last place per term.
fn sum_tolerance(dtype: DType, x: &Tensor) -> Tolerance {
    let v = x.as_f32().unwrap_or(&[]);
    let magnitude: f32 = v.iter().filter(|x| x.is_finite()).map(|x| x.abs()).sum();
    let abs = magnitude * F32_EPSILON * v.len().max(1) as f32;
    Tolerance::Ulps { ulps: if dtype == DType::F32 { 0 } else { v.len() as u32 }, abs }
}

/// As `sum_tolerance`, over the products of a dot.
fn dot_tolerance(dtype: DType, x: &Tensor, y: &Tensor) -> Tolerance {
    let max = |t: &Tensor| t.as_f32().unwrap_or(&[]).iter().fold(0f32, |m, x| m.max(x.abs()));
    let k = x.shape().last().copied().unwrap_or(0).max(1) as f32;
    let abs = k * k * max(x) * max(y) * F32_EPSILON;
    Tolerance::Ulps { ulps: if dtype == DType::F32 { 0 } else { 1 }, abs }
}
