//! Common-subexpression elimination: an instruction equal to an earlier one (same op, operands,
//! attributes and result type) is replaced by it. The frontend emits, per layer, the same constants
//! and the same mask and RoPE broadcasts; this pass keeps one of each. Dead copies are left to `dce`.

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{Module, Op, Substitution, TensorType, ValueId};
use std::collections::HashMap;

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        for f in &mut module.functions {
            let mut replace = Substitution::default();
            // Keyed by the op (literals compared by bits) and its result type.
            let mut seen: HashMap<(Op, TensorType), ValueId> = HashMap::new();
            for instr in &mut f.body {
                replace.apply_to_op(&mut instr.op);
                let key = (instr.op.clone(), f.values[instr.result.index()].ty.clone());
                match seen.get(&key) {
                    Some(&earlier) => {
                        replace.insert(instr.result, earlier);
                    }
                    None => {
                        seen.insert(key, instr.result);
                    }
                }
            }
            replace.apply_to_results(&mut f.results);
        }
        Ok(())
    }
}
