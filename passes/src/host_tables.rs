//! Keeps lookup tables in host memory: a weight that every function only reads through `gather`
//! with an input parameter as indices (E2B's 4.7 GB per-layer-embedding table) is not uploaded; the
//! gather becomes a `host_gather` parameter that the runtime fills with the rows a call needs.
//! Tables that are also read otherwise (the tied embedding, also the LM head) stay on the device.

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{Module, Op, Param, ParamRole, Substitution, ValueId};
use std::collections::{HashMap, HashSet};

pub struct HostTables;

impl Pass for HostTables {
    fn name(&self) -> &'static str {
        "host-tables"
    }

    fn run(&self, module: &mut Module, _: &Target) -> Result<(), PassError> {
        let tables = host_tables(module);
        for f in &mut module.functions {
            let weight_of: HashMap<ValueId, String> = f
                .weight_reads()
                .filter(|(_, name)| tables.contains(*name))
                .map(|(v, name)| (v, name.to_string()))
                .collect();
            let mut replace = Substitution::default();
            let mut added: HashMap<(String, ValueId), ValueId> = HashMap::new();
            for i in 0..f.body.len() {
                let Op::Gather { table, indices } = f.body[i].op.clone() else { continue };
                let Some(name) = weight_of.get(&table) else { continue };
                let rows = f.body[i].result;
                let param = match added.get(&(name.clone(), indices)) {
                    Some(&p) => p,
                    None => {
                        let value = f.new_value(f.ty(rows).clone(), Some(format!("{name}.rows")));
                        f.params.push(Param { value, role: ParamRole::HostGather { table: name.clone(), indices } });
                        added.insert((name.clone(), indices), value);
                        value
                    }
                };
                replace.insert(rows, param);
            }
            for instr in &mut f.body {
                replace.apply_to_op(&mut instr.op);
            }
            replace.apply_to_results(&mut f.results);
            f.body.retain(|i| !replace.replaces(i.result) && !weight_of.contains_key(&i.result));
        }
        Ok(())
    }
}

/// Weights that every function reads only as the table of a `gather` indexed by an input parameter.
fn host_tables(module: &Module) -> HashSet<String> {
    let mut ok: HashMap<String, bool> = HashMap::new();
    for f in &module.functions {
        let inputs: HashSet<ValueId> = f.params.iter().filter(|p| p.role.is_input()).map(|p| p.value).collect();
        for (v, name) in f.weight_reads() {
            ok.entry(name.to_string()).or_insert(true);
            let returned = f.results.iter().any(|r| r.value == v);
            let all_gathers = f.body.iter().all(|i| match &i.op {
                Op::Gather { table, indices } if *table == v => inputs.contains(indices),
                op => !op.operands().contains(&v),
            });
            if returned || !all_gathers {
                ok.insert(name.to_string(), false);
            }
        }
    }
    ok.into_iter().filter(|(_, host)| *host).map(|(n, _)| n).collect()
}
