//! The compile report: facts about a module after its target's pipeline, read off the IR itself.

use g4c_ir::Target;
use g4c_ir::{Function, Module, Op, ParamRole};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// `target`, `passes`, `entries` (inputs and outputs with types), `kv_layers`,
/// `kv_bytes_per_token`, `device_weight_bytes`, `host_weight_bytes`, `converts` per entry.
pub fn compile_report(module: &Module, target: &Target, passes: &[&str]) -> Value {
    let entries: Vec<Value> = module.functions.iter().map(entry_json).collect();
    let converts: serde_json::Map<String, Value> = module
        .functions
        .iter()
        .map(|f| (f.name.clone(), json!(f.body.iter().filter(|i| matches!(i.op, Op::Convert { .. })).count())))
        .collect();
    let read: BTreeSet<&str> = module.functions.iter().flat_map(|f| f.weight_reads().map(|(_, n)| n)).collect();
    let device_weight_bytes: u64 =
        module.weights.iter().filter(|w| read.contains(w.name.as_str())).map(|w| w.ty.byte_size()).sum();
    let host: BTreeSet<&str> = module
        .functions
        .iter()
        .flat_map(|f| f.params.iter())
        .filter_map(|p| match &p.role {
            ParamRole::HostGather { table, .. } => Some(table.as_str()),
            _ => None,
        })
        .collect();
    let host_weight_bytes: u64 =
        module.weights.iter().filter(|w| host.contains(w.name.as_str())).map(|w| w.ty.byte_size()).sum();
    let (kv_layers, kv_bytes_per_token) = module.decode().map(kv_facts).unwrap_or((0, 0));
    json!({
        "target": target.to_json(),
        "passes": passes,
        "entries": entries,
        "kv_layers": kv_layers,
        "kv_bytes_per_token": kv_bytes_per_token,
        "device_weight_bytes": device_weight_bytes,
        "host_weight_bytes": host_weight_bytes,
        "converts": converts,
    })
}

fn entry_json(f: &Function) -> Value {
    let inputs: Vec<Value> = f
        .params
        .iter()
        .map(|p| json!({"name": f.param_name(p), "type": f.ty(p.value).to_string(), "state": p.role.is_state()}))
        .collect();
    let outputs: Vec<Value> =
        f.results.iter().map(|r| json!({"name": r.name, "type": f.ty(r.value).to_string()})).collect();
    json!({"name": f.name, "inputs": inputs, "outputs": outputs})
}

/// Layers with K/V cache state (`kv_cache` roles), and the bytes one token adds to all of them:
/// a K and a V row of `Hkv × d` elements per layer, in the caches' element type.
fn kv_facts(decode: &Function) -> (usize, u64) {
    let mut layers = BTreeSet::new();
    let mut bytes = 0;
    for p in &decode.params {
        if let ParamRole::KvCache { layer, .. } = p.role {
            let ty = decode.ty(p.value);
            // [B, Hkv, S, d]: one token is Hkv × d elements.
            bytes += (ty.shape[1] * ty.shape[3]) as u64 * ty.dtype.bits() / 8;
            layers.insert(layer);
        }
    }
    (layers.len(), bytes)
}
