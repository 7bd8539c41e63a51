//! Dead-code elimination: drops instructions whose results nothing reads. IR ops have no side
//! effects, so liveness flows back from the function results alone.

use crate::{Pass, PassError};
use g4c_ir::Module;
use g4c_ir::Target;

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        for f in &mut module.functions {
            let mut live = vec![false; f.values.len()];
            for r in &f.results {
                live[r.value.index()] = true;
            }
            for instr in f.body.iter().rev() {
                if live[instr.result.index()] {
                    for v in instr.op.operands() {
                        live[v.index()] = true;
                    }
                }
            }
            f.body.retain(|instr| live[instr.result.index()]);
        }
        Ok(())
    }
}
