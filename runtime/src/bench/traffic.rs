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

    /// The most decode steps per second `bandwidth` (bytes/s) allows.
    pub fn max_steps_per_second(&self, bandwidth: f64) -> f64 {
        bandwidth / self.total().max(1) as f64
    }
}
