//! The verifier: every operand defined before use, every result type equal to what its op implies,
//! weights declared once with the type functions read them at, and state threaded through results.

use crate::{
    abi::check_param_type, infer_type, print::ValueNames, DType, Function, Module, ParamRole, ResultRole, TensorType,
    ValueId,
};
use std::collections::HashSet;
use std::fmt;

/// All problems found in a module, each naming the function, the op and the mismatch.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyError {
    pub problems: Vec<String>,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IR verification failed ({} problem(s)): {}", self.problems.len(), self.problems.join("; "))
    }
}

impl std::error::Error for VerifyError {}

pub fn verify_module(m: &Module) -> Result<(), VerifyError> {
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for w in &m.weights {
        if !seen.insert(&w.name) {
            problems.push(format!("weight @{} declared twice", w.name));
        }
        if let Err(e) = w.check_layout() {
            problems.push(e);
        }
    }
    let mut fnames = HashSet::new();
    for f in &m.functions {
        if !fnames.insert(&f.name) {
            problems.push(format!("function @{} defined twice", f.name));
        }
        problems.extend(check_function(m, f));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(VerifyError { problems })
    }
}

pub fn verify_function(m: &Module, f: &Function) -> Result<(), VerifyError> {
    let problems = check_function(m, f);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(VerifyError { problems })
    }
}

fn check_function(m: &Module, f: &Function) -> Vec<String> {
    let names = ValueNames::new(f);
    let mut problems = Vec::new();
    let mut defined = vec![false; f.values.len()];
    let define = |v: ValueId, defined: &mut Vec<bool>, problems: &mut Vec<String>| {
        if v.index() >= defined.len() {
            problems.push(format!("@{}: value #{} has no type", f.name, v.0));
        } else if std::mem::replace(&mut defined[v.index()], true) {
            problems.push(format!("@{}: {} defined twice", f.name, names.get(v)));
        }
    };
    for p in &f.params {
        define(p.value, &mut defined, &mut problems);
    }
    for instr in &f.body {
        let ops = instr.op.operands();
        let undefined: Vec<_> = ops.iter().filter(|v| !defined.get(v.index()).copied().unwrap_or(false)).collect();
        let here = || format!("@{}: {} = {}", f.name, names.get(instr.result), instr.op.mnemonic());
        if !undefined.is_empty() {
            let list: Vec<String> = undefined.iter().map(|v| names.get(**v)).collect();
            problems.push(format!("{}: operand(s) {} used before definition", here(), list.join(", ")));
        } else {
            let declared = f.ty(instr.result);
            match infer_type(
                &instr.op,
                &|i| f.ty(ops[i]).clone(),
                &|n| m.weight(n).map(|w| w.ty.clone()),
                Some(declared),
            ) {
                Ok(ty) if &ty == declared => {}
                Ok(ty) => problems.push(format!("{}: result type is {declared}, op produces {ty}", here())),
                Err(e) => problems.push(format!("{}: {e}", here())),
            }
        }
        define(instr.result, &mut defined, &mut problems);
    }
    let mut rnames = HashSet::new();
    for r in &f.results {
        if !rnames.insert(&r.name) {
            problems.push(format!("@{}: result `{}` returned twice", f.name, r.name));
        }
        if !defined.get(r.value.index()).copied().unwrap_or(false) {
            problems.push(format!("@{}: result `{}` is never defined", f.name, r.name));
        }
    }
    problems.extend(check_abi(m, f, &names));
    problems
}

/// Roles (`abi`): each model role at most once and of its type, host gathers over declared tables
/// with integer indices, every state returned as a `NextState` result of its type, and the converse.
fn check_abi(m: &Module, f: &Function, names: &ValueNames) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, p) in f.params.iter().enumerate() {
        let pname = names.get(p.value);
        let singleton = !matches!(p.role, ParamRole::Input | ParamRole::State { .. } | ParamRole::HostGather { .. });
        if let Some(earlier) = f.params[..i].iter().find(|q| singleton && q.role == p.role) {
            let earlier = names.get(earlier.value);
            problems.push(format!("@{}: {pname} has role {:?} like the earlier {earlier}", f.name, p.role));
        }
        if let Err(e) = check_param_type(&p.role, f.ty(p.value)) {
            problems.push(format!("@{}: {pname} {e}", f.name));
        }
        if let ParamRole::HostGather { table, indices } = &p.role {
            let Some(decl) = m.weight(table) else {
                problems.push(format!("@{}: {pname} gathers from @{table}, which is not declared", f.name));
                continue;
            };
            let index_param = f.params.iter().find(|q| q.value == *indices);
            let Some(idx) = index_param.filter(|q| q.role.is_input()) else {
                let what = names.get(*indices);
                problems.push(format!("@{}: {pname} gathers with {what}, which is not an input parameter", f.name));
                continue;
            };
            let idx_ty = f.ty(idx.value);
            let mut shape = idx_ty.shape.clone();
            shape.extend_from_slice(decl.ty.shape.get(1..).unwrap_or(&[]));
            // Rows may arrive in another float type than the table's: the caller converts them.
            let got = f.ty(p.value);
            let dtype_ok = got.dtype == decl.ty.dtype || (got.dtype.is_float() && decl.ty.dtype.is_float());
            if !idx_ty.dtype.is_int() || got.shape != shape || !dtype_ok {
                let expected = decl.ty.with_shape(shape);
                problems.push(format!(
                    "@{}: {pname} must be {expected} (rows of @{table} at {}), found {got}",
                    f.name,
                    names.get(*indices)
                ));
            }
        }
        if p.role.is_state() {
            let name = f.param_name(p);
            match f.results.iter().find(|r| r.name == name) {
                None => problems.push(format!("@{}: state {pname} has no result of the same name", f.name)),
                Some(r) if r.role != ResultRole::NextState => {
                    problems.push(format!("@{}: result `{name}` of state {pname} is not its next state", f.name))
                }
                Some(r) if f.ty(r.value) != f.ty(p.value) => problems.push(format!(
                    "@{}: state {pname} is {} but its result is {}",
                    f.name,
                    f.ty(p.value),
                    f.ty(r.value)
                )),
                _ => {}
            }
        }
    }
    for r in &f.results {
        let state = f.param(&r.name).filter(|p| p.role.is_state());
        if r.role == ResultRole::NextState && state.is_none() {
            problems.push(format!("@{}: result `{}` is a next state, but no state has its name", f.name, r.name));
        }
    }
    for (role, word) in [(ResultRole::Logits, "logits"), (ResultRole::GreedyTokens, "greedy_tokens")] {
        if f.results.iter().filter(|r| r.role == role).count() > 1 {
            problems.push(format!("@{}: more than one result is `{word}`", f.name));
        }
    }
    // Greedy tokens are the argmax of the logits along the vocabulary: i32, one per row of logits.
    if let Some(g) = f.result_with(ResultRole::GreedyTokens) {
        let ty = f.ty(g.value);
        match f.result_with(ResultRole::Logits).map(|r| f.ty(r.value)) {
            None => problems.push(format!("@{}: `greedy_tokens` without a `logits` result", f.name)),
            Some(logits) => {
                let want = TensorType::new(DType::I32, logits.shape[..logits.rank().saturating_sub(1)].to_vec());
                if *ty != want {
                    problems.push(format!("@{}: `greedy_tokens` must be {want}, found {ty}", f.name));
                }
            }
        }
    }
    problems
}
