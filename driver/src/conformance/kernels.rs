//! Every launch of a kernel plan on random inputs, on a device (a GPU, or the host emulator) and in
//! the reference interpreter, each of its kernels' outputs compared: a disagreement names the launch,
//! its kernels and the elements, where a whole model's run only shows logits that differ.

use super::compare::{close, outputs, Tolerance};
use anyhow::{anyhow, Result};
use g4c_ir::plan::{KernelPlan, Slot};
use g4c_ir::{BinaryOp, DType, Function, Instr, Literal, Module, Op, ParamRole, ReduceKind, TensorType};
use g4c_runtime::backend::cuda::{launch_bindings, launch_of, Buffer, Device, DeviceProgram, LaunchSequence};
use g4c_runtime::weights::WeightStore;
use g4c_runtime::{Interpreter, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How one launch went: `Ok`, or each disagreeing kernel's mismatch.
pub struct LaunchCheck {
    pub entry: String,
    pub symbol: String,
    /// The plan's kernels it runs, side by side.
    pub kernels: Vec<String>,
    pub outcome: Result<(), String>,
}

/// Magnitudes from here on are no sum's: masked scores (`-1e30`) and the maxima of chunks with
/// nothing visible (floored at `-1e20`), which an attention chunk's results hold beside its sums.
const MASK_MAGNITUDE: f32 = 1e15;

/// The kernels' outputs may differ from the interpreter's by the order of their sums: within 2
/// units in the last place of the output's type, or a thousandth of the output's largest magnitude
/// (masks aside: with them in the scale, any sum would match).
fn tolerance(want: &Tensor) -> Tolerance {
    let scale = want.as_f32().map_or(0.0, |v| {
        v.iter().map(|x| x.abs()).filter(|&x| x.is_finite() && x < MASK_MAGNITUDE).fold(0f32, f32::max)
    });
    Tolerance::Ulps { ulps: 2, abs: 1e-3 * scale }
}

/// `got` (the device's output of kernel `k`) against `want` (the interpreter's, from `args`):
/// within `tolerance`, but for elements `within_rounded_sums` accounts for.
fn compared(
    interp: &mut Interpreter,
    k: &Function,
    args: Vec<Tensor>,
    want: &Tensor,
    got: &Tensor,
) -> Result<Result<(), String>> {
    let tolerance = tolerance(want);
    let compared = outputs(&[vec![want.clone()]], std::slice::from_ref(got), tolerance, false);
    if compared.is_err() && within_rounded_sums(interp, k, args, (want, got), tolerance)? {
        return Ok(Ok(()));
    }
    Ok(compared)
}

/// Whether each element of `got` (the device's) that is not within `tolerance` of `want` (the
/// interpreter's, from `args`) is within what a place or two of the kernel's 16-bit sums moves it,
/// and such elements are rare. A kernel sums in another order than the interpreter, and where the
/// two sums round to either side of one of the type's values, everything computed from that sum
/// differs: E2B's LM head rounds its products to bf16 and soft-caps them in f32 (one logit in
/// 262144 was off by a bf16 place, far more than 2 of f32's), and a gate·up projection's product of
/// two rounded sums, through GELU, was off by 3 bf16 places in 3 of 55296 elements. Each such sum
/// is raised and lowered in turn (`sum_moved`), and how far that moves each element, the farther
/// of the two ways and summed over the sums (with half as much again for curvature), is what an
/// element may differ by beyond `tolerance`. Both ways, since a sum may have rounded to either side
/// and what follows it need not move alike: GELU's cube in bf16 rounds again at every step.
/// A wrong index or a lost term moves an element by far more; a small error in every element (a
/// wrong scale, a sum kept in 16 bits) is not rare: at most one element in `ROUNDED_OTHERWISE`
/// may pass this way.
fn within_rounded_sums(
    interp: &mut Interpreter,
    k: &Function,
    args: Vec<Tensor>,
    (want, got): (&Tensor, &Tensor),
    tolerance: Tolerance,
) -> Result<bool> {
    let (Some(w), Some(g)) = (want.as_f32(), got.as_f32()) else { return Ok(false) };
    let is_sum = |op: &Op| matches!(op, Op::DotGeneral { .. } | Op::Reduce { kind: ReduceKind::Sum, .. });
    let sums = k.body.iter().enumerate().filter(|(_, i)| is_sum(&i.op));
    let mut moved = vec![0f32; w.len()];
    for (i, by) in sums.filter_map(|(i, instr)| Some((i, raise_by(k.ty(instr.result).dtype)?))) {
        let mut farther = vec![0f32; w.len()];
        for factor in [by, 2.0 - by] {
            let other = interp.run(&sum_moved(k, i, factor), args.clone())?.remove(0);
            let o = other.as_f32().expect("the same type as the kernel's output");
            farther.iter_mut().zip(w.iter().zip(o)).for_each(|(f, (a, b))| *f = f.max((a - b).abs()));
        }
        moved.iter_mut().zip(farther).for_each(|(m, f)| *m += f);
    }
    let beyond: Vec<usize> = (0..w.len()).filter(|&j| !close(want.ty.dtype, w[j], g[j], tolerance, false)).collect();
    // A sum raised past its type's largest value moves an element infinitely: no leeway there.
    let accounted = |j: usize| moved[j].is_finite() && (w[j] - g[j]).abs() <= 1.5 * moved[j];
    Ok(beyond.len() <= w.len().div_ceil(ROUNDED_OTHERWISE) && beyond.into_iter().all(accounted))
}

/// One element in this many may be a sum rounded the other way (`within_rounded_sums`).
const ROUNDED_OTHERWISE: usize = 1000;

/// What a sum rounded to `dtype` is multiplied by to raise it by 1 or 2 places (a normal value of
/// significand in [1, 2), times 1 + 2⁻ᵖ for p stored bits, moves by 1 to 2 places and rounds to one
/// of them), for the 16-bit floats.
fn raise_by(dtype: DType) -> Option<f64> {
    match dtype {
        DType::BF16 => Some(1.0 + 2f64.powi(-7)),
        DType::F16 => Some(1.0 + 2f64.powi(-10)),
        _ => None,
    }
}

/// `k` with the sum that its instruction `i` rounds to a 16-bit float times `factor` (`raise_by`
/// raises it by 1 or 2 places, 2 minus that lowers it as far) wherever it is read.
fn sum_moved(k: &Function, i: usize, factor: f64) -> Function {
    let mut f = k.clone();
    let sum = f.body[i].result;
    let ty = f.ty(sum).clone();
    let splat = Literal::Splat(factor);
    let (factor, raised) = (f.new_value(ty.clone(), None), f.new_value(ty, None));
    for later in &mut f.body[i + 1..] {
        later.op.map_operands(|v| if v == sum { raised } else { v });
    }
    f.results.iter_mut().filter(|r| r.value == sum).for_each(|r| r.value = raised);
    f.body.insert(i + 1, Instr { result: factor, op: Op::Constant { literal: splat } });
    f.body.insert(i + 2, Instr { result: raised, op: Op::Binary { op: BinaryOp::Mul, lhs: sum, rhs: factor } });
    f
}

/// What a launch's input holds, for its random contents: an entry point's parameter (its role), an
/// attention chunk's results, or another kernel's output.
#[derive(Clone, Copy)]
enum Holds<'a> {
    Param(&'a ParamRole),
    /// `[.., features + 2]`, f32: a chunk's weighted sums, its maximum and its sum of exponentials.
    AttentionChunks,
    Scratch,
}

/// Random contents of type `ty` for an input that `holds`: floats uniform in [-1, 1], but an
/// attention chunk's sums of exponentials in [0, 1], as a chunk's are at least 0. (With random
/// signs the combining kernel's denominator, the sums' weighted total, may be negative or cancel
/// to almost nothing; its floor, the least normal float, then makes each quotient about 1e37, and
/// two orders of summing the numerator, both right, differ in more than its last units.) Integers
/// count up along the last axis from a random start below 64, so that they stay valid as token ids,
/// positions (distinct in a prefill, as a cache write needs) and slot positions, and a decode's
/// position sees some slots and not others; a last index is the last token's; other integers (a
/// kernel's indices into its chunks) count from 0. Predicates are false.
fn random_bytes(ty: &TensorType, holds: Holds, rng: &mut impl Rng) -> Vec<u8> {
    let n = ty.numel();
    let along = ty.shape.last().copied().unwrap_or(1).max(1);
    let counting = |start: usize| (0..n).flat_map(move |i| ((start + i % along) as i32).to_le_bytes()).collect();
    match (ty.dtype, holds) {
        (DType::F32, Holds::AttentionChunks) => (0..n)
            .flat_map(|i| {
                let least = if i % along == along - 1 { 0.0 } else { -1.0 };
                rng.random_range(least..=1.0f32).to_le_bytes()
            })
            .collect(),
        (DType::F32, _) => (0..n).flat_map(|_| rng.random_range(-1.0f32..=1.0).to_le_bytes()).collect(),
        (DType::BF16, _) => {
            (0..n).flat_map(|_| half::bf16::from_f32(rng.random_range(-1.0..=1.0)).to_le_bytes()).collect()
        }
        (DType::F16, _) => {
            (0..n).flat_map(|_| half::f16::from_f32(rng.random_range(-1.0..=1.0)).to_le_bytes()).collect()
        }
        (DType::I32, Holds::Param(ParamRole::LastIndex)) => counting(along - 1),
        (DType::I32, Holds::Param(ParamRole::TokenIds | ParamRole::Positions | ParamRole::SlotPositions(_))) => {
            counting(rng.random_range(0..64))
        }
        (DType::I32, _) => counting(0),
        _ => Tensor::filled(ty.clone(), 0.0).to_bytes(),
    }
}

/// Runs each launch of every program's entry point on `device` over random inputs (the same for
/// the interpreter), with the plan's weights from `store`, and compares each kernel's output.
/// `module` is the one the plan was made from (its entry points' parameter roles shape the
/// inputs). Every output is filled with NaN bytes before the launch, so that an element a kernel
/// fails to write cannot match by chance.
pub fn check_kernels(
    module: &Module,
    plan: &KernelPlan,
    programs: &[DeviceProgram],
    store: Arc<dyn WeightStore>,
    device: &mut dyn Device,
    seed: u64,
) -> Result<Vec<LaunchCheck>> {
    let kernels = Arc::new(plan.kernels.clone());
    let mut interp = Interpreter::new(kernels.clone(), store.clone());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut weights: HashMap<String, Buffer> = HashMap::new();
    let mut scratch = Vec::new();
    let mut checks = Vec::new();
    for program in programs {
        let ep = plan.entry(&program.entry).ok_or_else(|| anyhow!("the plan has no @{}", program.entry))?;
        let f = module.function(&program.entry).ok_or_else(|| anyhow!("the module has no @{}", program.entry))?;
        // A buffer per slot, as large as its largest use, kept for the entry's launches.
        let mut buffers: HashMap<Slot, (Buffer, usize)> = HashMap::new();
        // The slots an attention chunk's call wrote last, so far.
        let mut chunk_results: HashSet<Slot> = HashSet::new();
        for (calls, parts) in launch_bindings(ep, &program.kernels) {
            let mut inputs: HashMap<Slot, Tensor> = HashMap::new();
            let mut sized: Vec<(Slot, usize)> = Vec::new();
            // A tail reads its call's output, which the launch computes before it.
            let computed = |n: usize, slot: Slot| calls[n].tail && calls[n - 1].output == slot;
            for (n, call) in calls.iter().enumerate() {
                let k = kernels.function(&call.kernel).ok_or_else(|| anyhow!("no kernel @{}", call.kernel))?;
                for (p, &slot) in k.params.iter().zip(&call.inputs) {
                    let ty = k.ty(p.value);
                    match inputs.get(&slot) {
                        _ if computed(n, slot) => {}
                        Some(t) if &t.ty != ty => {
                            return Err(anyhow!("@{}: one buffer read as {} and as {ty}", call.kernel, t.ty));
                        }
                        Some(_) => {}
                        None => {
                            let holds = match slot {
                                Slot::Param(i) => Holds::Param(&f.params[i].role),
                                _ if chunk_results.contains(&slot) => Holds::AttentionChunks,
                                Slot::Scratch(_) => Holds::Scratch,
                            };
                            let bytes = random_bytes(ty, holds, &mut rng);
                            inputs.insert(slot, Tensor::from_bytes(ty.clone(), &bytes).map_err(|e| anyhow!(e))?);
                        }
                    }
                    sized.push((slot, ty.byte_size() as usize));
                }
                sized.push((call.output, k.ty(k.results[0].value).byte_size() as usize));
                // Allocated zeroed, and left zeroed by every launch that runs to its end.
                if let Some(sums) = call.split_sums {
                    sized.push((sums.buffer, 0));
                }
            }
            for (slot, bytes) in sized {
                let bytes = match slot {
                    Slot::Scratch(b) => bytes.max(ep.buffers[b] as usize),
                    Slot::Param(_) => bytes,
                };
                if buffers.get(&slot).is_none_or(|&(_, size)| size < bytes) {
                    buffers.insert(slot, (device.alloc(bytes)?, bytes));
                }
            }
            for (slot, t) in &inputs {
                device.upload(buffers[slot].0, &t.to_bytes())?;
            }
            for call in calls.iter().filter(|c| !c.inputs.contains(&c.output)) {
                let (buffer, bytes) = buffers[&call.output];
                device.upload(buffer, &vec![0xFF; bytes])?;
            }
            for name in parts.iter().flat_map(|p| &p.weights) {
                if !weights.contains_key(name) {
                    let decl = plan.kernels.weight(name).ok_or_else(|| anyhow!("no weight @{name}"))?;
                    let bytes = store.bytes_in(decl, &mut scratch)?;
                    let b = device.alloc(bytes.len())?;
                    device.upload(b, bytes)?;
                    weights.insert(name.clone(), b);
                }
            }
            for call in calls {
                match call.launch.slots {
                    Some(_) => chunk_results.insert(call.output),
                    None => chunk_results.remove(&call.output),
                };
            }
            let launch = launch_of(calls, parts, |s| buffers[&s].0, |w| weights[w]);
            let symbol = launch.symbol.clone();
            let ran = device.run(&LaunchSequence::new(&program.entry, vec![launch])).map_err(|e| e.to_string());
            let mut problems = Vec::new();
            for (n, call) in calls.iter().enumerate() {
                let outcome = (|| -> Result<Result<(), String>> {
                    ran.clone().map_err(|e| anyhow!(e))?;
                    let k = kernels.function(&call.kernel).expect("looked up above");
                    // A tail is checked on what its host computed on the device (checked itself).
                    let args = k.params.iter().zip(&call.inputs).map(|(p, &s)| match computed(n, s) {
                        true => on_device(device, buffers[&s].0, k.ty(p.value)),
                        false => Ok(inputs[&s].clone()),
                    });
                    let args = args.collect::<Result<Vec<_>>>()?;
                    let want = interp.call(&call.kernel, args.clone())?.remove(0);
                    let got = on_device(device, buffers[&call.output].0, k.ty(k.results[0].value))?;
                    compared(&mut interp, k, args, &want, &got)
                })();
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(mismatch)) => problems.push(format!("@{}: {mismatch}", call.kernel)),
                    Err(e) => problems.push(format!("@{}: {e:#}", call.kernel)),
                }
            }
            checks.push(LaunchCheck {
                entry: program.entry.clone(),
                symbol,
                kernels: calls.iter().map(|c| c.kernel.clone()).collect(),
                outcome: if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) },
            });
        }
    }
    Ok(checks)
}

/// The tensor of type `ty` at the start of `buffer` on `device`.
fn on_device(device: &mut dyn Device, buffer: Buffer, ty: &TensorType) -> Result<Tensor> {
    let bytes = device.download(buffer, ty.byte_size() as usize)?;
    Tensor::from_bytes(ty.clone(), &bytes).map_err(|e| anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use g4c_runtime::weights::NoWeights;

    /// A bf16 tensor of `shape` holding `v`, rounded.
    fn bf16(shape: Vec<usize>, v: &[f32]) -> Tensor {
        let bytes: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
        Tensor::from_bytes(TensorType::new(DType::BF16, shape), &bytes).unwrap()
    }

    /// A sum cubed in bf16, rounding at each product, as E2B's GELU computes its gate's cube.
    const CUBED: &str = r#"module @m {
  func @k(
    %x: bf16[1,1],
    %w: bf16[1,1]
  ) -> (
    out: f32[1,1]
  ) {
    %p = dot_general %x, %w {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : bf16[1,1]
    %q = mul %p, %p : bf16[1,1]
    %c = mul %q, %p : bf16[1,1]
    %out = convert %c : f32[1,1]
    return %out
  }
}"#;

    /// Two logits soft-capped in f32 from products rounded to bf16, as E2B's LM head computes them.
    const CAPPED: &str = r#"module @m {
  func @k(
    %x: bf16[1,4],
    %w: bf16[2,4]
  ) -> (
    out: f32[1,2]
  ) {
    %p = dot_general %x, %w {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]} : bf16[1,2]
    %thirty = constant {value = 30.0} : bf16[1,2]
    %d = div %p, %thirty : bf16[1,2]
    %e = convert %d : f32[1,2]
    %t = tanh %e : f32[1,2]
    %cap = constant {value = 30.0} : f32[1,2]
    %out = mul %t, %cap : f32[1,2]
    return %out
  }
}"#;

    /// A device whose first product rounded to the bf16 value above the interpreter's passes the
    /// kernel check (its logit off by far more than 2 places of f32); one whose logit is 10% off
    /// does not, nor one whose every logit is 1% off (no rare rounding).
    #[test]
    fn a_product_rounded_the_other_way_passes_and_wrong_ones_do_not() {
        let module = g4c_ir::parse_module(CAPPED).unwrap();
        let k = module.function("k").unwrap().clone();
        let mut interp = Interpreter::new(Arc::new(module), Arc::new(NoWeights));
        let x = bf16(vec![1, 4], &[1.5, 2.25, 3.0, 0.75]);
        let args = vec![x, bf16(vec![2, 4], &[2.5, 1.25, 1.75, 3.5, -0.5, 2.0, 3.25, 1.0])];
        let want = interp.call("k", args.clone()).unwrap().remove(0);
        let w = want.as_f32().unwrap().to_vec();
        let raised = interp.run(&sum_moved(&k, 0, raise_by(DType::BF16).unwrap()), args.clone()).unwrap().remove(0);
        let logits = |v: Vec<f32>| Tensor::f32(vec![1, 2], v);
        let other_way = logits(vec![raised.as_f32().unwrap()[0], w[1]]);
        assert!(outputs(&[vec![want.clone()]], std::slice::from_ref(&other_way), tolerance(&want), false).is_err());
        let mut check = |got: &Tensor| compared(&mut interp, &k, args.clone(), &want, got).unwrap().is_ok();
        assert!(check(&other_way));
        assert!(!check(&logits(vec![w[0] * 1.1, w[1]])));
        assert!(!check(&logits(vec![w[0] * 1.01, w[1] * 1.01])));
    }

    /// A device whose sum rounded to the bf16 value below the interpreter's passes where lowering
    /// the sum moves the output twice as far as raising it: 1.4453125 cubes to 3.03125 in bf16, its
    /// place above to 3.0625 and its place below to 2.96875. Raising alone would not account for it.
    #[test]
    fn a_sum_rounded_down_passes_where_lowering_moves_the_output_farther() {
        let module = g4c_ir::parse_module(CUBED).unwrap();
        let k = module.function("k").unwrap().clone();
        let mut interp = Interpreter::new(Arc::new(module), Arc::new(NoWeights));
        let args = vec![bf16(vec![1, 1], &[1.4453125]), bf16(vec![1, 1], &[1.0])];
        let out = |f: &Function, interp: &mut Interpreter| {
            interp.run(f, args.clone()).unwrap().remove(0).as_f32().unwrap()[0]
        };
        let by = raise_by(DType::BF16).unwrap();
        let (want, raised, lowered) = (
            out(&k, &mut interp),
            out(&sum_moved(&k, 0, by), &mut interp),
            out(&sum_moved(&k, 0, 2.0 - by), &mut interp),
        );
        assert_eq!((want, raised, lowered), (3.03125, 3.0625, 2.96875));
        let got = Tensor::f32(vec![1, 1], vec![lowered]);
        assert!(compared(&mut interp, &k, args.clone(), &Tensor::f32(vec![1, 1], vec![want]), &got).unwrap().is_ok());
    }
}
