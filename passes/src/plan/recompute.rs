//! Recomputing rather than waiting: a matvec that reads an elementwise kernel's value, and waits for
//! nothing else, computes that value itself from what the kernel reads, where it stages its
//! activation, and so runs beside the kernel rather than after it.
//!
//! A decode layer ends with such a kernel: the residual stream, from the layer's input and its
//! three normed branches (attention, MLP, per-layer input; their norms' statistics in its prelude),
//! materialized for the later layers' residual adds. The next layer's q, k and v projections read
//! it only through their staged, normed activation: each block computes those 1536 elements once
//! anyway, and recomputing the residual there costs each block three more norm statistics (its
//! prelude) and a few operations per element. The projections then wait for what the residual
//! kernel waits for, and run in its launch: one dependent launch fewer per layer (E2B's decode step
//! on h200: 302 launches, where it was 336). The kernel stays for its other readers, which come
//! later anyway.
//!
//! Only where the matvec keeps its template and launch, and its blocks' prelude stays within the
//! preludes' budgets (`prelude::merge_into_readers`).

use super::fusion::Group;
use super::kernel_function;
use super::kind::classify;
use super::prelude::merge_into_readers;
use g4c_ir::plan::KernelKind;
use g4c_ir::{Function, GpuLimits, Op, ValueId};
use std::collections::{BTreeSet, HashMap};

/// `groups` with each matvec that waits only for an elementwise kernel computing that kernel's
/// value itself.
pub(crate) fn beside_producers(f: &Function, mut groups: Vec<Group>, gpu: &GpuLimits) -> Vec<Group> {
    let def: HashMap<ValueId, usize> = f.body.iter().enumerate().map(|(i, instr)| (instr.result, i)).collect();
    let params: BTreeSet<ValueId> = f.params.iter().map(|p| p.value).collect();
    let kind = |g: &Group| classify(&kernel_function(f, g, "kind".into()));
    for p in 0..groups.len() {
        let producer = &groups[p];
        if kind(producer) != KernelKind::Loop || matches!(f.body[def[&producer.root]].op, Op::UpdateSlots { .. }) {
            continue;
        }
        // Readers whose every input is the producer's value, one of its inputs, or a parameter.
        let waits_only_for_it = |r: &Group| {
            r.inputs.contains(&producer.root)
                && r.inputs.iter().all(|v| *v == producer.root || producer.inputs.contains(v) || params.contains(v))
        };
        let readers: Vec<usize> = (p + 1..groups.len())
            .filter(|&g| {
                waits_only_for_it(&groups[g]) && matches!(kind(&groups[g]), KernelKind::Matvec | KernelKind::MatvecW4)
            })
            .collect();
        merge_into_readers(f, &def, &mut groups, p, &readers, gpu);
    }
    groups
}
