//! Common-subexpression elimination: an instruction equal to an earlier one (same op, operands,
//! attributes and result type) is replaced by it. The frontend emits, per layer, the same constants
//! and the same mask and RoPE broadcasts; this pass keeps one of each. Dead copies are left to `dce`.

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{Module, Substitution, ValueId};
use std::collections::HashMap;

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        for f in &mut module.functions {
            let mut replace = Substitution::default();
            // Keyed by the op's text-form parts and result type (f64 literals compared by bits).
            let mut seen: HashMap<String, ValueId> = HashMap::new();
            for instr in &mut f.body {
                replace.apply_to_op(&mut instr.op);
                let key = format!("{:?}|{}", instr.op, f.values[instr.result.index()].ty);
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
