//! The text form. Printing is deterministic, and `parse(print(m))` prints back identically.
//!
//! ```text
//! module @gemma4_text {
//!   weight @embed_tokens : bf16[512,64] = "model.language_model.embed_tokens.weight"
//!
//!   func @decode(
//!     %ids: i32[1,1] token_ids,
//!     %pos: i32[1,1] positions,
//!     %cache.sliding.pos: i32[1,8] slot_positions(sliding),
//!     %ple.rows: bf16[1,1,80] host_gather(@embed_tokens_per_layer, %ids)
//!   ) -> (
//!     logits: f32[1,512] logits,
//!     cache.sliding.pos: i32[1,8]
//!   ) {
//!     %embed_tokens = weight @embed_tokens : bf16[512,64]
//!     %embed_tokens.1 = dot_general %h, %embed_tokens {lhs_batch = [], rhs_batch = [], lhs_contract = [2], rhs_contract = [1]} : f32[1,1,512]
//!     return %embed_tokens.1, %cache.sliding.pos.next
//!   }
//! }
//! ```

use crate::{Attr, Function, Module, ParamRole, ResultRole, ValueId};
use std::collections::HashSet;
use std::fmt::Write;

/// The printed name of every value. A named value prints its own name (the frontend names every value
/// it builds: `FunctionBuilder`); an unnamed one, such as a pass adds, is named after the nearest named
/// instruction before it (`%l3.q.2`: the second unnamed value after `%l3.q`), or numbered (`%0`)
/// before the first. So a diff of two dumps shows what changed, not a renumbering.
pub struct ValueNames(Vec<String>);

impl ValueNames {
    pub fn new(f: &Function) -> Self {
        let mut names: Vec<String> = f
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| match &v.name {
                Some(n) => n.clone(),
                None => format!("#{i}"),
            })
            .collect();
        let mut taken: HashSet<String> = f.values.iter().filter_map(|v| v.name.clone()).collect();
        let mut anchor: Option<&str> = None;
        let mut k = 0;
        for instr in &f.body {
            if let Some(name) = &f.values[instr.result.index()].name {
                anchor = Some(name);
                k = 0;
                continue;
            }
            let name = loop {
                k += 1;
                let candidate = match anchor {
                    Some(a) => format!("{a}.{k}"),
                    None => (k - 1).to_string(),
                };
                if !taken.contains(&candidate) {
                    break candidate;
                }
            };
            taken.insert(name.clone());
            names[instr.result.index()] = name;
        }
        ValueNames(names)
    }

    pub fn get(&self, v: ValueId) -> String {
        match self.0.get(v.index()) {
            Some(n) => format!("%{n}"),
            None => format!("%#{}", v.0),
        }
    }
}

pub fn print_module(m: &Module) -> String {
    let mut out = format!("module @{} {{\n", m.name);
    for w in &m.weights {
        let layout = w.layout.word().map(|word| format!(" {word}")).unwrap_or_default();
        writeln!(out, "  weight @{} : {} = {:?}{layout}", w.name, w.ty, w.source).unwrap();
    }
    for (i, f) in m.functions.iter().enumerate() {
        if i > 0 || !m.weights.is_empty() {
            out.push('\n');
        }
        print_function_into(&mut out, f);
    }
    out.push_str("}\n");
    out
}

pub fn print_function(f: &Function) -> String {
    let mut out = String::new();
    print_function_into(&mut out, f);
    out
}

fn print_function_into(out: &mut String, f: &Function) {
    let names = ValueNames::new(f);
    writeln!(out, "  func @{}(", f.name).unwrap();
    for (i, p) in f.params.iter().enumerate() {
        write!(out, "    {}: {}", names.get(p.value), f.ty(p.value)).unwrap();
        match &p.role {
            ParamRole::Input => {}
            ParamRole::TokenIds => out.push_str(" token_ids"),
            ParamRole::Positions => out.push_str(" positions"),
            ParamRole::LastIndex => out.push_str(" last_index"),
            ParamRole::KvCache { layer, part } => write!(out, " kv_cache({layer}, {})", part.name()).unwrap(),
            ParamRole::SlotPositions(kind) => write!(out, " slot_positions({})", kind.name()).unwrap(),
            ParamRole::HostGather { table, indices } => {
                write!(out, " host_gather(@{table}, {})", names.get(*indices)).unwrap()
            }
            ParamRole::State { init } => write!(out, " state({})", fmt_f64(*init)).unwrap(),
        }
        out.push_str(if i + 1 < f.params.len() { ",\n" } else { "\n" });
    }
    out.push_str("  ) -> (\n");
    for (i, r) in f.results.iter().enumerate() {
        write!(out, "    {}: {}", r.name, f.ty(r.value)).unwrap();
        match r.role {
            ResultRole::Logits => out.push_str(" logits"),
            ResultRole::GreedyTokens => out.push_str(" greedy_tokens"),
            ResultRole::NextState | ResultRole::Output => {}
        }
        out.push_str(if i + 1 < f.results.len() { ",\n" } else { "\n" });
    }
    out.push_str("  ) {\n");
    for instr in &f.body {
        write!(out, "    {} = {}", names.get(instr.result), instr.op.mnemonic()).unwrap();
        if let crate::Op::Weight { name } = &instr.op {
            write!(out, " @{name}").unwrap();
        }
        let operands: Vec<String> = instr.op.operands().iter().map(|v| names.get(*v)).collect();
        if !operands.is_empty() {
            write!(out, " {}", operands.join(", ")).unwrap();
        }
        let attrs = instr.op.attrs();
        if !attrs.is_empty() {
            let parts: Vec<String> = attrs.iter().map(|(k, a)| format!("{k} = {}", fmt_attr(a))).collect();
            write!(out, " {{{}}}", parts.join(", ")).unwrap();
        }
        writeln!(out, " : {}", f.ty(instr.result)).unwrap();
    }
    let rets: Vec<String> = f.results.iter().map(|r| names.get(r.value)).collect();
    writeln!(out, "    return {}", rets.join(", ")).unwrap();
    out.push_str("  }\n");
}

fn fmt_attr(a: &Attr) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    match a {
        Attr::Int(v) => v.to_string(),
        Attr::Float(v) => fmt_f64(*v),
        Attr::Ints(vs) => list(vs.iter().map(|v| v.to_string()).collect()),
        Attr::Floats(vs) => list(vs.iter().map(|v| fmt_f64(*v)).collect()),
        Attr::Word(w) => w.clone(),
    }
}

/// Shortest text that parses back to the same f64 (`1.0`, `-1e30`, `inf`, `nan`).
pub fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else {
        format!("{v:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::fmt_f64;

    #[test]
    fn floats_print_in_a_form_that_parses_back_exactly() {
        for v in
            [0.0, -1e30, 0.1, 1.0 / 3.0, f32::MIN_POSITIVE as f64, f64::INFINITY, -f64::INFINITY, 39.191835884530846]
        {
            assert_eq!(fmt_f64(v).parse::<f64>().unwrap().to_bits(), v.to_bits(), "{v}");
        }
        assert!(fmt_f64(f64::NAN).parse::<f64>().unwrap().is_nan());
    }
}
