//! Bytes one decode call must move, read off the IR: every device weight it reads, every cache it
//! reads (static shapes: attention reads all slots, filled or not), and the host-gathered rows.
//! Divided by memory bandwidth, this bounds decode speed from above (the roofline).

use g4c_ir::{Module, ParamRole};

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeTraffic {
    pub weight_bytes: u64,
    pub state_bytes: u64,
    pub host_row_bytes: u64,
}

impl DecodeTraffic {
    pub fn of(module: &Module) -> Option<DecodeTraffic> {
        let decode = module.decode()?;
        let mut t = DecodeTraffic::default();
        let mut seen = std::collections::BTreeSet::new();
        for (_, name) in decode.weight_reads() {
            if seen.insert(name) {
                t.weight_bytes += module.weight(name)?.ty.byte_size();
            }
        }
        for p in &decode.params {
            let bytes = decode.ty(p.value).byte_size();
            match p.role {
                ParamRole::HostGather { .. } => t.host_row_bytes += bytes,
                ref role if role.is_state() => t.state_bytes += bytes,
                _ => {}
            }
        }
        Some(t)
    }

    pub fn total(&self) -> u64 {
        self.weight_bytes + self.state_bytes + self.host_row_bytes
    }
}

/// The bytes one decode step of a kernel plan moves through device memory, launch by launch: the
/// sum of its calls' `CallTraffic`. L2 hits are not modelled: this is the DRAM bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanTraffic {
    pub bytes: CallTraffic,
    pub launches: usize,
}

impl PlanTraffic {
    /// At decode position `position` (`None`: the context's end, where every chunk of a cache is
    /// read).
    pub fn of(plan: &g4c_ir::plan::KernelPlan, module: &Module, position: Option<usize>) -> Option<PlanTraffic> {
        let decode = module.decode()?;
        let entry = plan.entry(&decode.name)?;
        let mut bytes = CallTraffic::default();
        for call in &entry.calls {
            bytes += CallTraffic::of(plan, decode, call, position)?;
        }
        Some(PlanTraffic { bytes, launches: entry.launches().count() })
    }

    pub fn total(&self) -> u64 {
        self.bytes.total()
    }
}

/// The bytes one kernel call of entry point `entry`'s plan moves through device memory: the
/// weights it reads (a table it only gathers from, a row per index), the KV caches and slot
/// positions it reads or writes (a cache write counts what it writes; an attention chunk kernel
/// reads keys and values only in the chunks up to the step's position), and activations (inputs,
/// scratch buffers, logits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTraffic {
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub activation_bytes: u64,
}

impl std::ops::AddAssign for CallTraffic {
    fn add_assign(&mut self, other: CallTraffic) {
        self.weight_bytes += other.weight_bytes;
        self.kv_bytes += other.kv_bytes;
        self.activation_bytes += other.activation_bytes;
    }
}

impl CallTraffic {
    /// At decode position `position` (`None`: every chunk of a cache read).
    pub fn of(
        plan: &g4c_ir::plan::KernelPlan,
        entry: &g4c_ir::Function,
        call: &g4c_ir::plan::KernelCall,
        position: Option<usize>,
    ) -> Option<CallTraffic> {
        use g4c_ir::plan::{KernelKind, Slot};
        use g4c_ir::Op;
        let is_state = |slot: &Slot| matches!(slot, Slot::Param(i) if entry.params[*i].role.is_state());
        let mut t = CallTraffic::default();
        let k = plan.kernels.function(&call.kernel)?;
        let root = k.results[0].value;
        let written = match k.body.iter().find(|i| i.result == root).map(|i| &i.op) {
            Some(Op::UpdateSlots { updates, .. }) => k.ty(*updates).byte_size(),
            _ => k.ty(root).byte_size(),
        };
        let in_place = call.inputs.contains(&call.output);
        for (p, slot) in k.params.iter().zip(&call.inputs) {
            if in_place && *slot == call.output {
                continue;
            }
            let mut bytes = k.ty(p.value).byte_size();
            // The chunks a query at `position` sees: slots 0 ..= position of a cache as long as
            // the context (a full-attention layer's, the one kind split into chunks).
            let cache = matches!(slot, Slot::Param(i) if matches!(entry.params[*i].role, ParamRole::KvCache { .. }));
            if let (KernelKind::Attention, true, Some(split), Some(at)) =
                (call.kind, cache, call.launch.slots, position)
            {
                let chunks = call.launch.grid as u64;
                bytes = bytes * (at as u64 / split.slots as u64 + 1).min(chunks) / chunks;
            }
            if is_state(slot) {
                t.kv_bytes += bytes;
            } else {
                t.activation_bytes += bytes;
            }
        }
        match is_state(&call.output) {
            true => t.kv_bytes += written,
            false => t.activation_bytes += written,
        }
        for (value, name) in k.weight_reads() {
            let decl = plan.kernels.weight(name)?;
            // A table only gathered from is read a row per index, not whole (the embedding).
            let users: Vec<&Op> = k.body.iter().map(|i| &i.op).filter(|op| op.operands().contains(&value)).collect();
            let gathered: Option<u64> = users
                .iter()
                .map(|op| match op {
                    Op::Gather { table, indices } if *table == value => {
                        let rows = k.ty(*indices).numel() as u64;
                        Some(rows * decl.ty.byte_size() / decl.ty.shape[0].max(1) as u64)
                    }
                    _ => None,
                })
                .sum();
            t.weight_bytes += gathered.unwrap_or(decl.ty.byte_size());
        }
        Some(t)
    }

    pub fn total(&self) -> u64 {
        self.weight_bytes + self.kv_bytes + self.activation_bytes
    }
}
