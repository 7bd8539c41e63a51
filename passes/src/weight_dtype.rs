//! Stores each weight in the element type the program converts it to, so the conversion happens once
//! when weights are loaded rather than inside every call. A weight qualifies when it is converted
//! whole at least once (it feeds a matmul), and every read of it is a `convert` to one float type,
//! no narrower than it and computed natively by the target, or a `gather` whose rows are only read
//! through that same convert. It is then declared in that type and those converts disappear.
//! Widening is exact; the same-width bf16 → f16 conversion of Turing targets (which have no bf16)
//! rounds exactly as the in-graph convert did, only once. Tables that are only gathered keep their
//! stored type: converting the few rows a call reads costs nothing. Rows of a retyped table may also
//! be widened further (Turing's f32 embedding scale reads the f16-stored tied embedding): they pass
//! through the new type first, which holds every bf16 value between 6.1e-5 and 65504 exactly, and
//! the tied matmul reads the same rounded table anyway.
//!
//! On `cpu`, which computes in f32, this turns the per-call bf16 → f32 conversion of every matrix
//! into one conversion at load.

use crate::{Pass, PassError};
use g4c_ir::Target;
use g4c_ir::{DType, Function, Module, Op, Substitution, ValueId};
use std::collections::HashMap;

pub struct WeightDtype;

impl Pass for WeightDtype {
    fn name(&self) -> &'static str {
        "weight-dtype"
    }

    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError> {
        // Per weight, over every read in every function: the one type it is converted to (`None` once
        // a read disqualifies it), and whether any read converts it whole.
        let mut wanted: HashMap<String, (Option<DType>, bool)> = HashMap::new();
        for f in &module.functions {
            let users = users(f);
            for (v, name) in f.weight_reads() {
                let stored = module.weight(name).expect("verified module").ty.dtype;
                let read = widened_to(f, &users, v);
                let to = read
                    .map(|(d, _)| d)
                    .filter(|&d| d.is_float() && stored.is_float() && d.bits() >= stored.bits())
                    .filter(|&d| target.computes_natively(d));
                let whole = read.is_some_and(|(_, whole)| whole);
                let entry = wanted.entry(name.to_string()).or_insert((to, false));
                if entry.0 != to {
                    entry.0 = None;
                }
                entry.1 |= whole;
            }
        }
        let retyped: HashMap<String, DType> = wanted
            .into_iter()
            .filter_map(|(n, (d, whole))| d.filter(|_| whole).map(|d| (n, d)))
            .filter(|(n, d)| *d != module.weight(n).unwrap().ty.dtype)
            .collect();
        if retyped.is_empty() {
            return Ok(());
        }
        for w in &mut module.weights {
            if let Some(&d) = retyped.get(&w.name) {
                w.ty = w.ty.with_dtype(d);
            }
        }
        for f in &mut module.functions {
            let mut changed: HashMap<ValueId, ()> = HashMap::new();
            let mut replace = Substitution::default();
            for i in 0..f.body.len() {
                replace.apply_to_op(&mut f.body[i].op);
                let result = f.body[i].result;
                let new_dtype = match &f.body[i].op {
                    Op::Weight { name } => retyped.get(name).copied(),
                    Op::Gather { table, .. } if changed.contains_key(table) => Some(f.values[table.index()].ty.dtype),
                    Op::Convert { x } if changed.contains_key(x) && f.ty(*x).dtype == f.ty(result).dtype => {
                        replace.insert(result, *x);
                        None
                    }
                    _ => None,
                };
                if let Some(d) = new_dtype {
                    f.values[result.index()].ty = f.values[result.index()].ty.with_dtype(d);
                    changed.insert(result, ());
                }
            }
            replace.apply_to_results(&mut f.results);
            f.body.retain(|i| !replace.replaces(i.result));
        }
        Ok(())
    }
}

/// Instructions reading each value.
fn users(f: &Function) -> HashMap<ValueId, Vec<&Op>> {
    let mut users: HashMap<ValueId, Vec<&Op>> = HashMap::new();
    for instr in &f.body {
        for v in instr.op.operands() {
            users.entry(v).or_default().push(&instr.op);
        }
    }
    users
}

/// The element type `v` is converted to, if every read of `v` is a convert to it or a gather of rows
/// that are themselves only converted to it or to a wider float (and `v` is not returned); and
/// whether it is converted whole.
fn widened_to(f: &Function, users: &HashMap<ValueId, Vec<&Op>>, v: ValueId) -> Option<(DType, bool)> {
    if f.results.iter().any(|r| r.value == v) {
        return None;
    }
    let result_of = |op: &Op| f.body.iter().find(|i| std::ptr::eq(&i.op, op)).map(|i| i.result);
    let mut to: Option<DType> = None;
    let mut converted_whole = false;
    // The type each read of gathered rows converts them to (`None`: a read that is not a convert).
    let mut row_converts: Vec<Option<DType>> = Vec::new();
    let mut agree = |d: DType| match to {
        None => {
            to = Some(d);
            true
        }
        Some(t) => t == d,
    };
    for op in users.get(&v).map(|u| u.as_slice()).unwrap_or(&[]) {
        let ok = match op {
            Op::Convert { .. } => {
                converted_whole = true;
                agree(f.ty(result_of(op)?).dtype)
            }
            Op::Gather { table, .. } if *table == v => {
                let rows = result_of(op)?;
                if f.results.iter().any(|r| r.value == rows) {
                    return None;
                }
                let row_users = users.get(&rows).map(|u| u.as_slice()).unwrap_or(&[]);
                row_converts.extend(
                    row_users
                        .iter()
                        .map(|u| matches!(u, Op::Convert { .. }).then(|| f.ty(result_of(u).unwrap()).dtype)),
                );
                !row_users.is_empty()
            }
            _ => false,
        };
        if !ok {
            return None;
        }
    }
    // Whole converts decide the type; rows may go there or wider. Without a whole convert, rows alone.
    let to = match to {
        Some(d) => d,
        None => row_converts.first().copied().flatten()?,
    };
    let row_ok = |r: &Option<DType>| r.is_some_and(|r| r == to || (r.is_float() && r.bits() > to.bits()));
    row_converts.iter().all(row_ok).then_some((to, converted_whole))
}
