//! W4A16 quantization of a float checkpoint: every matrix used only as a linear layer's weight
//! (read whole, perhaps converted to another float type, and the right operand of a `dot_general`
//! contracting its dimension 1, as the frontend emits `x · Wᵀ`) becomes 4-bit values and one bf16
//! scale per group of `group` inputs, made at load (`SourceLayout::QuantizedValues` /
//! `QuantizedScales`: round to nearest, symmetric, as compressed-tensors quantizes, see
//! `g4c_runtime::quantize`), and its read becomes an f32 `dequantize` of those (converts of it to
//! f32 disappear). On Gemma 4 that is what the QAT exports quantize: q/k/v/o, gate/up/down and the
//! three per-layer-embedding projections; the embeddings (gathered), norms (not matrices), a mixture
//! of experts' router and its experts (3-D, not linear layers' weights) stay.
//! A linear whose inputs the group does not divide is an error naming it, and so is a module with
//! no float linear to quantize (a QAT export's are 4-bit already) unless its head is asked for.
//!
//! With `head`, the LM head is quantized too: Gemma ties it to the embedding table, a weight also
//! gathered, which stays as it is for the gather while the head's `dot_general` reads a 4-bit copy
//! of it (made at load, like the linears'). That is llama.cpp's `--output-tensor-type` and
//! MLC-LLM's quantized head; compressed-tensors and the QAT exports leave the head in 16 bits. On
//! E2B it takes the head from 0.81 GB of f16 a decode step to 0.23 GB.

use crate::linear_reads::read_only_as_linear;
use crate::{Pass, PassError};
use g4c_ir::{
    quantized_names, DType, Function, Instr, Module, Op, SourceLayout, Substitution, Target, TensorType, ValueId,
    WeightDecl,
};
use std::collections::{BTreeSet, HashMap};

/// A mixture of experts' router projection (`layers.N.router.proj`) stays in its float type, as
/// compressed-tensors' MoE exports keep their routers: rounded to 4 bits it could pick other experts.
fn is_router(name: &str) -> bool {
    name.ends_with(".router.proj")
}

pub struct Quantize {
    /// Inputs per scale.
    pub group: usize,
    /// Whether to quantize the LM head as well (`--quantize w4a16+head`).
    pub head: bool,
}

impl Pass for Quantize {
    fn name(&self) -> &'static str {
        "quantize"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        let linears: BTreeSet<String> = module
            .weights
            .iter()
            .filter(|w| w.ty.dtype.is_float() && w.ty.rank() == 2 && w.layout == SourceLayout::Stored)
            .filter(|w| read_only_as_linear(module, &w.name, true) && !is_router(&w.name))
            .map(|w| w.name.clone())
            .collect();
        // A QAT export's linears are 4-bit already: a scheme asked for them would be dropped
        // unsaid (their groups are the checkpoint's), so it is refused; its head is still float.
        if linears.is_empty() && !self.head {
            return Err(PassError::Failed {
                pass: "quantize",
                message: "no linear layer's weight is float: the checkpoint's are 4-bit already (a QAT export); \
                          `+head` (as in `--quantize w4a16+head`) quantizes its LM head"
                    .into(),
            });
        }
        let group = self.group;
        let tied: BTreeSet<String> = match self.head {
            true => tied_heads(module, &linears),
            false => BTreeSet::new(),
        };
        if self.head && tied.is_empty() {
            return Err(PassError::Failed {
                pass: "quantize",
                message: "+head: no weight is read both as a linear layer's weight and otherwise \
                          (the LM head tied to the embedding table)"
                    .into(),
            });
        }
        let mut weights = Vec::with_capacity(module.weights.len() + linears.len() + tied.len());
        for w in std::mem::take(&mut module.weights) {
            if linears.contains(&w.name) {
                weights.extend(quantized_decls(&w, group)?);
            } else if tied.contains(&w.name) {
                let copy = quantized_decls(&w, group)?;
                weights.push(w);
                weights.extend(copy);
            } else {
                weights.push(w);
            }
        }
        module.weights = weights;
        for f in &mut module.functions {
            dequantize_reads(f, &linears, group, &module.weights);
            dequantize_head_reads(f, &tied, group, &module.weights);
        }
        Ok(())
    }
}

/// The 4-bit values and scales declared for float matrix `w`, quantized from its source at load.
fn quantized_decls(w: &WeightDecl, group: usize) -> Result<[WeightDecl; 2], PassError> {
    let [rows, cols] = w.ty.shape[..] else { unreachable!("a matrix") };
    if group == 0 || !cols.is_multiple_of(group) {
        return Err(PassError::Failed {
            pass: "quantize",
            message: format!("@{} has {cols} inputs, which the group size {group} does not divide", w.name),
        });
    }
    let (values_name, scales_name) = quantized_names(&w.name);
    let mut values = WeightDecl::new(values_name, TensorType::new(DType::I4, [rows, cols]), &w.source);
    values.layout = SourceLayout::QuantizedValues { group };
    let mut scales = WeightDecl::new(scales_name, TensorType::new(DType::BF16, [rows, cols / group]), &w.source);
    scales.layout = SourceLayout::QuantizedScales { group };
    Ok([values, scales])
}

/// The float matrices read as a linear layer's weight somewhere and otherwise elsewhere: an LM head
/// tied to the embedding table.
fn tied_heads(module: &Module, linears: &BTreeSet<String>) -> BTreeSet<String> {
    let candidates: BTreeSet<String> = module
        .weights
        .iter()
        .filter(|w| w.ty.dtype.is_float() && w.ty.rank() == 2 && w.layout == SourceLayout::Stored)
        .filter(|w| !linears.contains(&w.name))
        .map(|w| w.name.clone())
        .collect();
    module.functions.iter().flat_map(|f| head_reads(f, &candidates).into_values()).collect()
}

/// The `dot_general`s of `f` reading one of the `weights` as a linear layer's weight (their right
/// operand, a read of the weight or its convert to f32, contracting its dimension 1, no batch
/// dimensions): each one's instruction index, and the weight's name.
fn head_reads(f: &Function, weights: &BTreeSet<String>) -> HashMap<usize, String> {
    let mut reads: HashMap<ValueId, &str> = f.weight_reads().filter(|(_, n)| weights.contains(*n)).collect();
    let converts: Vec<(ValueId, &str)> = f
        .body
        .iter()
        .filter_map(|i| match &i.op {
            Op::Convert { x } if f.ty(i.result).dtype == DType::F32 => Some((i.result, *reads.get(x)?)),
            _ => None,
        })
        .collect();
    reads.extend(converts);
    f.body
        .iter()
        .enumerate()
        .filter_map(|(i, instr)| {
            let Op::DotGeneral { lhs, rhs, dims } = &instr.op else { return None };
            let name = reads.get(rhs)?;
            let linear = !reads.contains_key(lhs) && dims.rhs_batch.is_empty() && dims.rhs_contract == [1];
            linear.then(|| (i, name.to_string()))
        })
        .collect()
}

/// Each head product of a tied weight reads an f32 `dequantize` of its 4-bit copy instead; the
/// weight's other reads are left as they are.
fn dequantize_head_reads(f: &mut Function, tied: &BTreeSet<String>, group: usize, weights: &[WeightDecl]) {
    let decl_ty = |name: &str| weights.iter().find(|w| w.name == name).expect("declared above").ty.clone();
    let heads = head_reads(f, tied);
    let mut body = Vec::with_capacity(f.body.len() + 3 * heads.len());
    for (i, mut instr) in std::mem::take(&mut f.body).into_iter().enumerate() {
        if let (Some(name), Op::DotGeneral { rhs, .. }) = (heads.get(&i), &mut instr.op) {
            let ty = decl_ty(name).with_dtype(DType::F32);
            let result = f.new_value(ty, Some(format!("{name}.head")));
            body.extend(dequantized(f, name, (group, weights), result, true));
            *rhs = result;
        }
        body.push(instr);
    }
    f.body = body;
}

/// Each read of a quantized weight becomes an f32 `dequantize` of reads of its values and scales
/// (the same value, retyped); converts of it to f32 are dropped and their uses read it directly.
fn dequantize_reads(f: &mut Function, linears: &BTreeSet<String>, group: usize, weights: &[WeightDecl]) {
    let mut read: BTreeSet<ValueId> = BTreeSet::new();
    let mut replace = Substitution::default();
    let mut body = Vec::with_capacity(f.body.len() + 2 * linears.len());
    for mut instr in std::mem::take(&mut f.body) {
        replace.apply_to_op(&mut instr.op);
        match &instr.op {
            Op::Weight { name } if linears.contains(name) => {
                let ty = &mut f.values[instr.result.index()].ty;
                *ty = ty.with_dtype(DType::F32);
                body.extend(dequantized(f, name, (group, weights), instr.result, false));
                read.insert(instr.result);
            }
            Op::Convert { x } if read.contains(x) && f.ty(instr.result).dtype == DType::F32 => {
                replace.insert(instr.result, *x);
            }
            _ => body.push(instr),
        }
    }
    f.body = body;
    replace.apply_to_results(&mut f.results);
}

/// The reads of weight `name`'s 4-bit values and scales (new values, named after them or not) and
/// their f32 `dequantize` as `result`.
fn dequantized(
    f: &mut Function,
    name: &str,
    (group, weights): (usize, &[WeightDecl]),
    result: ValueId,
    named: bool,
) -> [Instr; 3] {
    let decl_ty = |name: &str| weights.iter().find(|w| w.name == name).expect("declared above").ty.clone();
    let (values, scales) = quantized_names(name);
    let q = f.new_value(decl_ty(&values), named.then(|| values.clone()));
    let scale = f.new_value(decl_ty(&scales), named.then(|| scales.clone()));
    [
        Instr { result: q, op: Op::Weight { name: values } },
        Instr { result: scale, op: Op::Weight { name: scales } },
        Instr { result, op: Op::Dequantize { q, scale, group } },
    ]
}
