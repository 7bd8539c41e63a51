//! `cargo bench --bench w4a16_cpu`: how XLA's CPU backend (the PJRT CPU plugin) executes one E2B
//! linear layer (`[rows, 1536] · W[6144, 1536]ᵀ`, the MLP's gate/up shape) for each way of writing a
//! 4-bit weight in the IR, against the float ways; for decode (1 row) and prefill (64 rows). Prints
//! the median time per call and the weight bytes per second that implies, so that the formulation
//! g4c lowers W4A16 to on `cpu` is chosen by measurement (BENCHMARKS.md). Set `XLA_FLAGS=
//! --xla_dump_to=DIR` to read the optimized HLO of each.

use g4c_driver::pjrt::open_client;
use g4c_driver::stablehlo_programs;
use g4c_ir::{BinaryOp, DType, DotDims, FunctionBuilder, Module, ReduceKind, ResultRole, TensorType, ValueId};
use g4c_runtime::backend::pjrt::{Buffer, Client};
use g4c_runtime::Tensor;
use std::time::{Duration, Instant};

const OUT: usize = 6144;
const IN: usize = 1536;
const GROUP: usize = 32;
const RUNS: usize = 15;

/// How the weight is stored and how `x · Wᵀ` is written.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// f32 `[in, out]` (what `cpu` stores today), one dot.
    F32,
    /// bf16 `[in, out]`, the activations converted to bf16, one dot.
    Bf16,
    /// 4-bit (`dtype`: i4 or i8) values and bf16 group scales `[out, in / 32]`, dequantized whole to f32,
    /// then one dot.
    DequantizeDot(DType),
    /// The values stored `[in, out]` (scales `[in / 32, out]`), dequantized in that layout (what
    /// XLA's CPU dot wants: contraction dimension first), then one dot.
    DequantizeDotInMajor(DType),
    /// The same weights dequantized whole to bf16, the activations converted to bf16, one dot.
    DequantizeDotBf16(DType),
    /// The same weights, dequantized, multiplied by the broadcast activations and summed over the
    /// inputs (a reduction XLA can fuse with the dequantization: no f32 weight in memory).
    DequantizeReduce(DType),
    /// Per group of 32 inputs, a dot of the integer values converted to f32, then the scales.
    GroupDot(DType),
}

impl Form {
    fn weight_bytes(self) -> u64 {
        let n = (OUT * IN) as u64;
        match self {
            Form::F32 => 4 * n,
            Form::Bf16 => 2 * n,
            Form::DequantizeDot(d)
            | Form::DequantizeDotInMajor(d)
            | Form::DequantizeDotBf16(d)
            | Form::DequantizeReduce(d)
            | Form::GroupDot(d) => n * d.bits() / 8 + n / GROUP as u64 * 2,
        }
    }
}

/// The module computing `x[rows, IN] · Wᵀ` in form `form`, and its weights as inputs after `x`.
fn module(form: Form, rows: usize) -> (Module, Vec<TensorType>) {
    let f32 = |shape: &[usize]| TensorType::new(DType::F32, shape.to_vec());
    let mut m = Module::new("w4a16_cpu");
    let weights: Vec<TensorType> = match form {
        Form::F32 => vec![f32(&[IN, OUT])],
        Form::Bf16 => vec![TensorType::new(DType::BF16, [IN, OUT])],
        Form::DequantizeDotInMajor(d) => {
            vec![TensorType::new(d, [IN, OUT]), TensorType::new(DType::BF16, [IN / GROUP, OUT])]
        }
        Form::DequantizeDot(d) | Form::DequantizeDotBf16(d) | Form::DequantizeReduce(d) | Form::GroupDot(d) => {
            vec![TensorType::new(d, [OUT, IN]), TensorType::new(DType::BF16, [OUT, IN / GROUP])]
        }
    };
    let mut b = FunctionBuilder::new("main", &m.weights);
    let x = b.input("x", f32(&[rows, IN]));
    let w: Vec<ValueId> = weights.iter().enumerate().map(|(i, t)| b.input(&format!("w{i}"), t.clone())).collect();
    let in_major = DotDims { lhs_contract: vec![1], rhs_contract: vec![0], ..Default::default() };
    let y = match form {
        Form::F32 => b.dot_general(x, w[0], in_major),
        Form::Bf16 => {
            let xb = b.convert(x, DType::BF16);
            let y = b.op(g4c_ir::Op::DotGeneral { lhs: xb, rhs: w[0], dims: in_major }, Some(f32(&[rows, OUT])));
            b.convert(y, DType::F32)
        }
        Form::DequantizeDot(_) => {
            let wf = b.dequantize(w[0], w[1], GROUP, DType::F32);
            b.dot_general(x, wf, DotDims { lhs_contract: vec![1], rhs_contract: vec![1], ..Default::default() })
        }
        Form::DequantizeDotInMajor(_) => {
            let groups = IN / GROUP;
            let q = b.convert(w[0], DType::F32);
            let q = b.reshape(q, &[groups, GROUP, OUT]);
            let s = b.convert(w[1], DType::F32);
            let s = b.broadcast(s, &[groups, GROUP, OUT], &[0, 2]);
            let wf = b.binary(BinaryOp::Mul, q, s);
            let wf = b.reshape(wf, &[IN, OUT]);
            b.dot_general(x, wf, in_major)
        }
        Form::DequantizeDotBf16(_) => {
            let wb = b.dequantize(w[0], w[1], GROUP, DType::BF16);
            let xb = b.convert(x, DType::BF16);
            let dims = DotDims { lhs_contract: vec![1], rhs_contract: vec![1], ..Default::default() };
            let y = b.op(g4c_ir::Op::DotGeneral { lhs: xb, rhs: wb, dims }, Some(f32(&[rows, OUT])));
            b.convert(y, DType::F32)
        }
        Form::DequantizeReduce(_) => {
            let wf = b.dequantize(w[0], w[1], GROUP, DType::F32);
            let wb = b.broadcast(wf, &[rows, OUT, IN], &[1, 2]);
            let xb = b.broadcast(x, &[rows, OUT, IN], &[0, 2]);
            let p = b.binary(BinaryOp::Mul, xb, wb);
            b.reduce(ReduceKind::Sum, p, &[2])
        }
        Form::GroupDot(_) => {
            let groups = IN / GROUP;
            let q = b.convert(w[0], DType::F32);
            let q = b.reshape(q, &[OUT, groups, GROUP]);
            let xg = b.reshape(x, &[rows, groups, GROUP]);
            // [groups, rows, OUT]: per group, the dot of the activations with the integer values.
            let dims = DotDims { lhs_batch: vec![1], rhs_batch: vec![1], lhs_contract: vec![2], rhs_contract: vec![2] };
            let partial = b.dot_general(xg, q, dims);
            let s = b.convert(w[1], DType::F32);
            let s = b.transpose(s, &[1, 0]);
            let s = b.broadcast(s, &[groups, rows, OUT], &[0, 2]);
            let scaled = b.binary(BinaryOp::Mul, partial, s);
            b.reduce(ReduceKind::Sum, scaled, &[0])
        }
    };
    let f = b.finish(vec![("y", y, ResultRole::Output)]);
    m.functions.push(f);
    (m, weights)
}

fn random(ty: &TensorType, seed: u64) -> Tensor {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match ty.dtype {
        DType::I4 | DType::I8 => Tensor::of_type(
            ty.clone(),
            g4c_runtime::Data::I32((0..ty.numel()).map(|_| (next() % 16) as i32 - 8).collect()),
        ),
        d => {
            let values = (0..ty.numel())
                .map(|_| g4c_ir::scalar::round_float(d, (next() % 2000) as f32 / 1000.0 - 1.0) * 0.03)
                .collect();
            Tensor::of_type(ty.clone(), g4c_runtime::Data::F32(values))
        }
    }
}

fn time(client: &Client, form: Form, rows: usize) -> Duration {
    let (m, weights) = module(form, rows);
    g4c_ir::verify_module(&m).expect("a valid module");
    let program = stablehlo_programs(&m).expect("lowers").remove(0);
    let exe = client.compile(program.text.as_bytes()).expect("compiles");
    let upload = |t: &Tensor| client.buffer(t.ty.dtype, &t.ty.shape, &t.to_bytes()).expect("uploads");
    let x = upload(&random(&TensorType::new(DType::F32, [rows, IN]), 1));
    let w: Vec<Buffer> = weights.iter().enumerate().map(|(i, t)| upload(&random(t, 2 + i as u64))).collect();
    let args: Vec<&Buffer> = std::iter::once(&x).chain(&w).collect();
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            exe.execute(&args).expect("runs");
            started.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn main() {
    let client = open_client(None).expect("the PJRT CPU plugin (scripts/setup)");
    println!("[rows, {IN}] · W[{OUT}, {IN}]ᵀ on the PJRT CPU plugin; median of {RUNS} calls\n");
    println!("| form | weight bytes | decode (1 row) | GB/s | prefill (64 rows) |");
    println!("|---|---:|---:|---:|---:|");
    let forms = [
        Form::F32,
        Form::Bf16,
        Form::DequantizeDot(DType::I4),
        Form::DequantizeDot(DType::I8),
        Form::DequantizeDotInMajor(DType::I4),
        Form::DequantizeDotInMajor(DType::I8),
        Form::DequantizeDotBf16(DType::I4),
        Form::DequantizeDotBf16(DType::I8),
        Form::DequantizeReduce(DType::I4),
        Form::DequantizeReduce(DType::I8),
        Form::GroupDot(DType::I4),
        Form::GroupDot(DType::I8),
    ];
    for form in forms {
        let decode = time(&client, form, 1);
        let prefill = time(&client, form, 64);
        let bytes = form.weight_bytes();
        println!(
            "| {form:?} | {:.1} MB | {:.3} ms | {:.1} | {:.2} ms |",
            bytes as f64 / 1e6,
            decode.as_secs_f64() * 1e3,
            bytes as f64 / decode.as_secs_f64() / 1e9,
            prefill.as_secs_f64() * 1e3
        );
    }
}
