//! Stores matmul weights in the layout the target's matmuls read best. A rank-2 weight that is only
//! ever the right operand of `dot_general` contracting its dimension 1 (an HF linear weight
//! `[out, in]`, computing `x · Wᵀ`) is declared transposed, `[in, out]`, contracting dimension 0;
//! the loader transposes it once. Values do not change. Enabled on targets with
//! `Target::weights_in_major` (XLA's CPU backend otherwise re-lays out every `[out, in]` matrix
//! inside every call: 7.5 GB per decoded token on E2B).

use crate::linear_reads::read_only_as_linear;
use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{Module, Op, ParamRole, SourceLayout, ValueId};
use std::collections::HashSet;

pub struct WeightLayout;

impl Pass for WeightLayout {
    fn name(&self) -> &'static str {
        "weight-layout"
    }

    fn is_enabled(&self, target: &Target) -> bool {
        target.weights_in_major
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        let candidates: HashSet<String> = module
            .weights
            .iter()
            .filter(|w| w.ty.rank() == 2 && w.layout == SourceLayout::Stored && only_linear_rhs(module, &w.name))
            .map(|w| w.name.clone())
            .collect();
        for w in module.weights.iter_mut().filter(|w| candidates.contains(&w.name)) {
            w.ty.shape.reverse();
            w.layout = SourceLayout::Transposed;
        }
        for f in &mut module.functions {
            let swapped: HashSet<ValueId> =
                f.weight_reads().filter(|(_, name)| candidates.contains(*name)).map(|(v, _)| v).collect();
            for v in &swapped {
                f.values[v.index()].ty.shape.reverse();
            }
            for instr in &mut f.body {
                if let Op::DotGeneral { rhs, dims, .. } = &mut instr.op {
                    if swapped.contains(rhs) {
                        dims.rhs_contract = vec![0];
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether weight `name` is a linear layer's (`read_only_as_linear`) and not a host table.
fn only_linear_rhs(module: &Module, name: &str) -> bool {
    let host_table = module
        .functions
        .iter()
        .flat_map(|f| &f.params)
        .any(|p| matches!(&p.role, ParamRole::HostGather { table, .. } if table == name));
    !host_table && read_only_as_linear(module, name, false)
}
