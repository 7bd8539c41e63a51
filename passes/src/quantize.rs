//! W4A16 quantization of a float checkpoint: every matrix used only as a linear layer's weight
//! (read whole, perhaps converted to another float type, and the right operand of a `dot_general`
//! contracting its dimension 1, as the frontend emits `x · Wᵀ`) becomes 4-bit values and one bf16
//! scale per group of `group` inputs, made at load (`SourceLayout::QuantizedValues` /
//! `QuantizedScales`: round to nearest, symmetric, as compressed-tensors quantizes, see
//! `g4c_runtime::quantize`), and its read becomes an f32 `dequantize` of those (converts of it to
//! f32 disappear). On Gemma 4 that is what the QAT exports quantize: q/k/v/o, gate/up/down and the
//! three per-layer-embedding projections; the embeddings (gathered) and norms (not matrices) stay.
//! A linear whose inputs the group does not divide is an error naming it.

use crate::linear_reads::read_only_as_linear;
use crate::{Pass, PassError};
use g4c_ir::{
    quantized_names, DType, Function, Instr, Module, Op, SourceLayout, Substitution, Target, TensorType, ValueId,
    WeightDecl,
};
use std::collections::BTreeSet;

pub struct Quantize {
    /// Inputs per scale.
    pub group: usize,
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
            .filter(|w| read_only_as_linear(module, &w.name, true))
            .map(|w| w.name.clone())
            .collect();
        let group = self.group;
        let mut weights = Vec::with_capacity(module.weights.len() + linears.len());
        for w in std::mem::take(&mut module.weights) {
            if !linears.contains(&w.name) {
                weights.push(w);
                continue;
            }
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
            let mut scales =
                WeightDecl::new(scales_name, TensorType::new(DType::BF16, [rows, cols / group]), &w.source);
            scales.layout = SourceLayout::QuantizedScales { group };
            weights.extend([values, scales]);
        }
        module.weights = weights;
        for f in &mut module.functions {
            dequantize_reads(f, &linears, group, &module.weights);
        }
        Ok(())
    }
}

/// Each read of a quantized weight becomes an f32 `dequantize` of reads of its values and scales
/// (the same value, retyped); converts of it to f32 are dropped and their uses read it directly.
fn dequantize_reads(f: &mut Function, linears: &BTreeSet<String>, group: usize, weights: &[WeightDecl]) {
    let decl_ty = |name: &str| weights.iter().find(|w| w.name == name).expect("declared above").ty.clone();
    let mut dequantized: BTreeSet<ValueId> = BTreeSet::new();
    let mut replace = Substitution::default();
    let mut body = Vec::with_capacity(f.body.len() + 2 * linears.len());
    for mut instr in std::mem::take(&mut f.body) {
        replace.apply_to_op(&mut instr.op);
        match &instr.op {
            Op::Weight { name } if linears.contains(name) => {
                let (values, scales) = quantized_names(name);
                let q = f.new_value(decl_ty(&values), None);
                let scale = f.new_value(decl_ty(&scales), None);
                body.push(Instr { result: q, op: Op::Weight { name: values } });
                body.push(Instr { result: scale, op: Op::Weight { name: scales } });
                let ty = &mut f.values[instr.result.index()].ty;
                *ty = ty.with_dtype(DType::F32);
                body.push(Instr { result: instr.result, op: Op::Dequantize { q, scale, group } });
                dequantized.insert(instr.result);
            }
            Op::Convert { x } if dequantized.contains(x) && f.ty(instr.result).dtype == DType::F32 => {
                replace.insert(instr.result, *x);
            }
            _ => body.push(instr),
        }
    }
    f.body = body;
    replace.apply_to_results(&mut f.results);
}
