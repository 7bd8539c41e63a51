//! Which weights are linear layers' weights: read only as the right operand of `dot_general`s with
//! no batch dimensions that contract the weight's dimension 1 (`[out, in]`, as `nn.Linear` stores
//! it). The passes that change how such a weight is stored (`quantize`, `weight-layout`) may do so
//! only then.

use g4c_ir::{Function, Module, Op, ValueId};
use std::collections::BTreeSet;

/// Whether `module` reads weight `name` at least once and every read is a linear layer's. With
/// `through_converts`, a read may first be converted to a float type on its way to the matmul.
pub(crate) fn read_only_as_linear(module: &Module, name: &str, through_converts: bool) -> bool {
    let read = module.functions.iter().any(|f| f.weight_reads().any(|(_, n)| n == name));
    read && module.functions.iter().all(|f| reads_in(f, name, through_converts))
}

fn reads_in(f: &Function, name: &str, through_converts: bool) -> bool {
    let reads: BTreeSet<ValueId> = f.weight_reads().filter(|(_, n)| *n == name).map(|(v, _)| v).collect();
    let converts: BTreeSet<ValueId> = match through_converts {
        true => f
            .body
            .iter()
            .filter(|i| matches!(&i.op, Op::Convert { x } if reads.contains(x)))
            .map(|i| i.result)
            .collect(),
        false => BTreeSet::new(),
    };
    let weight = |v: &ValueId| reads.contains(v) || converts.contains(v);
    !f.results.iter().any(|r| weight(&r.value))
        && f.body.iter().all(|i| match &i.op {
            Op::Convert { .. } if converts.contains(&i.result) => f.ty(i.result).dtype.is_float(),
            Op::DotGeneral { lhs, rhs, dims } if weight(rhs) => {
                !weight(lhs) && dims.rhs_batch.is_empty() && dims.rhs_contract == [1]
            }
            op => !op.operands().iter().any(weight),
        })
}
