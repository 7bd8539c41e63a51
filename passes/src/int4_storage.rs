//! On targets that do not compute in 4 bits (`cpu`), 4-bit weight values are stored one to a byte
//! (`i8`, widened once at load): XLA's CPU backend unpacks `i4` with scalar code, 6× slower than it
//! dequantizes `i8`, which it fuses into a matrix-vector product that reads the bytes at memory
//! speed (`cargo bench --bench w4a16_cpu`, BENCHMARKS.md). Values do not change.

use crate::{Pass, PassError};
use g4c_ir::{DType, Module, Op, Target};
use std::collections::BTreeSet;

pub struct Int4Storage;

impl Pass for Int4Storage {
    fn name(&self) -> &'static str {
        "int4-storage"
    }

    fn is_enabled(&self, target: &Target) -> bool {
        !target.computes_natively(DType::I4)
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        let widened: BTreeSet<String> = module
            .weights
            .iter()
            .filter(|w| w.ty.dtype == DType::I4)
            .filter(|w| module.functions.iter().all(|f| only_dequantized(f, &w.name)))
            .map(|w| w.name.clone())
            .collect();
        for w in module.weights.iter_mut().filter(|w| widened.contains(&w.name)) {
            w.ty = w.ty.with_dtype(DType::I8);
        }
        for f in &mut module.functions {
            let reads: Vec<_> = f.weight_reads().filter(|(_, n)| widened.contains(*n)).map(|(v, _)| v).collect();
            for v in reads {
                f.values[v.index()].ty = f.values[v.index()].ty.with_dtype(DType::I8);
            }
        }
        Ok(())
    }
}

/// Whether every read of weight `name` in `f` is only the values of `dequantize`s.
fn only_dequantized(f: &g4c_ir::Function, name: &str) -> bool {
    let reads: BTreeSet<_> = f.weight_reads().filter(|(_, n)| *n == name).map(|(v, _)| v).collect();
    !f.results.iter().any(|r| reads.contains(&r.value))
        && f.body.iter().all(|i| match &i.op {
            Op::Dequantize { scale, .. } => !reads.contains(scale),
            op => !op.operands().iter().any(|v| reads.contains(v)),
        })
}
