//! Every launch of a kernel plan on random inputs, on a device (a GPU, or the host emulator) and in
//! the reference interpreter, each of its kernels' outputs compared: a disagreement names the launch,
//! its kernels and the elements, where a whole model's run only shows logits that differ.

use super::compare::{outputs, Tolerance};
use anyhow::{anyhow, Result};
use g4c_ir::plan::{KernelPlan, Slot};
use g4c_ir::{DType, Function, Module, Op, ParamRole, ReduceKind, TensorType};
use g4c_runtime::backend::cuda::{launch_bindings, launch_of, Buffer, Device, DeviceProgram, LaunchSequence};
use g4c_runtime::weights::WeightStore;
use g4c_runtime::{Interpreter, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
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

/// The narrowest float type, narrower than the kernel's output, that it rounds a sum to (a
/// reduction's or a product's result). Where the kernel's order of summing and the interpreter's
/// fall on either side of one of that type's values, what is computed from the sum differs by that
/// type's last place, not the output's: E2B's LM head rounds its products to bf16 and soft-caps
/// them in f32, and over 262144 logits one such pair is to be expected.
fn narrowest_rounded_sum(k: &Function) -> Option<DType> {
    let output = k.ty(k.results[0].value).dtype;
    let sums =
        k.body.iter().filter(|i| matches!(i.op, Op::DotGeneral { .. } | Op::Reduce { kind: ReduceKind::Sum, .. }));
    sums.map(|i| k.ty(i.result).dtype).filter(|d| d.is_float() && d.bits() < output.bits()).min_by_key(|d| d.bits())
}

/// `t`'s values (a float tensor's, held as f32) compared in units of `dtype`'s last place.
fn counted_in(t: Tensor, dtype: DType) -> Tensor {
    let ty = TensorType::new(dtype, t.ty.shape.clone());
    Tensor::of_type(ty, t.data)
}

/// Random contents for a parameter of type `ty` (`role`: the entry point's parameter it reads, if
/// it reads one): floats uniform in [-1, 1]. Integers count up along the last axis from a random
/// start below 64, so that they stay valid as token ids, positions (distinct in a prefill, as a
/// cache write needs) and slot positions, and a decode's position sees some slots and not others;
/// a last index is the last token's; other integers (a kernel's indices into its chunks) count
/// from 0. Predicates are false.
fn random_bytes(ty: &TensorType, role: Option<&ParamRole>, rng: &mut impl Rng) -> Vec<u8> {
    let n = ty.numel();
    let along = ty.shape.last().copied().unwrap_or(1).max(1);
    let counting = |start: usize| (0..n).flat_map(move |i| ((start + i % along) as i32).to_le_bytes()).collect();
    match (ty.dtype, role) {
        (DType::F32, _) => (0..n).flat_map(|_| rng.random_range(-1.0f32..=1.0).to_le_bytes()).collect(),
        (DType::BF16, _) => {
            (0..n).flat_map(|_| half::bf16::from_f32(rng.random_range(-1.0..=1.0)).to_le_bytes()).collect()
        }
        (DType::F16, _) => {
            (0..n).flat_map(|_| half::f16::from_f32(rng.random_range(-1.0..=1.0)).to_le_bytes()).collect()
        }
        (DType::I32, Some(ParamRole::LastIndex)) => counting(along - 1),
        (DType::I32, Some(ParamRole::TokenIds | ParamRole::Positions | ParamRole::SlotPositions(_))) => {
            counting(rng.random_range(0..64))
        }
        (DType::I32, _) => counting(0),
        _ => Tensor::filled(ty.clone(), 0.0).to_bytes(),
    }
}

/// Random attention chunk results (`[.., features + 2]`, f32: the weighted sums, the chunk's
/// maximum, its sum of exponentials) with each sum made positive, as a chunk computes it. With
/// random signs the combining kernel's denominator, the sums' weighted total, may be negative or
/// cancel to almost nothing; its floor (the least normal float) then makes each quotient about
/// 1e37, and two orders of summing the numerator, both right, differ in more than its last units.
fn sums_made_positive(bytes: &mut [u8], ty: &TensorType) {
    if ty.dtype != DType::F32 {
        return;
    }
    let row = 4 * ty.shape.last().copied().unwrap_or(1).max(1);
    for sum in bytes.chunks_exact_mut(row).map(|r| &mut r[row - 4..]) {
        let positive = f32::from_le_bytes(sum.try_into().expect("4 bytes")).abs();
        sum.copy_from_slice(&positive.to_le_bytes());
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
        // Per slot, whether the call that wrote it last (so far) is an attention chunk's.
        let mut chunk_results: HashMap<Slot, bool> = HashMap::new();
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
                            let role = match slot {
                                Slot::Param(i) => Some(&f.params[i].role),
                                Slot::Scratch(_) => None,
                            };
                            let mut bytes = random_bytes(ty, role, &mut rng);
                            if chunk_results.get(&slot) == Some(&true) {
                                sums_made_positive(&mut bytes, ty);
                            }
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
            chunk_results.extend(calls.iter().map(|c| (c.output, c.launch.slots.is_some())));
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
                    let want = interp.call(&call.kernel, args.collect::<Result<Vec<_>>>()?)?.remove(0);
                    let got = on_device(device, buffers[&call.output].0, k.ty(k.results[0].value))?;
                    let tolerance = tolerance(&want);
                    let (want, got) = match narrowest_rounded_sum(k) {
                        Some(dtype) => (counted_in(want, dtype), counted_in(got, dtype)),
                        None => (want, got),
                    };
                    Ok(outputs(&[vec![want]], &[got], tolerance, false))
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
