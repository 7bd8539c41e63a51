//! What the generation loop drives: something that runs a module's entry points and keeps the state
//! (caches and slot positions) between calls, where it lives: in host memory for the interpreter, in
//! device buffers for PJRT.

use crate::error::{invalid, Result};
use crate::interp::Interpreter;
use crate::tensor::{convert_float_bytes, Tensor};
use crate::weights::WeightStore;
use g4c_ir::{Function, Module, ParamRole, TensorType};
use std::collections::HashMap;

pub trait Executor {
    fn module(&self) -> &Module;
    /// Puts every state parameter back to its initial value (empty caches).
    fn reset(&mut self) -> Result<()>;
    /// Runs `function` with the named per-call inputs and the current state, keeps the next state,
    /// and returns the `logits` result.
    fn step(&mut self, function: &str, inputs: HashMap<&str, Tensor>) -> Result<Tensor>;
}

/// A function's arguments in parameter order: per-call inputs taken from `inputs`, state taken from
/// `state`, and host-gathered rows read from `store`.
pub fn gather_args<T>(
    module: &Module,
    store: &dyn WeightStore,
    f: &Function,
    inputs: HashMap<&str, Tensor>,
    state: &mut HashMap<String, T>,
) -> Result<Vec<Arg<T>>> {
    let mut args = Vec::with_capacity(f.params.len());
    for p in &f.params {
        let name = f.param_name(p);
        let arg = match &p.role {
            // Cloned, not moved: a host gather may still read the same input (its indices).
            ParamRole::Input => inputs.get(name).cloned().map(Arg::Input),
            ParamRole::State { .. } => state.remove(name).map(Arg::State),
            ParamRole::HostGather { table, indices } => {
                let Some(ids) = inputs.get(indices.as_str()) else {
                    return invalid(format!("@{}: %{name} needs input %{indices}", f.name));
                };
                let ty = f.ty(p.value).clone();
                Some(Arg::Rows(ty.clone(), host_rows(module, store, table, ids, &ty)?))
            }
        };
        args.push(
            arg.ok_or_else(|| crate::RuntimeError::Invalid(format!("@{}: no value for parameter %{name}", f.name)))?,
        );
    }
    Ok(args)
}

pub enum Arg<T> {
    Input(Tensor),
    State(T),
    /// Rows gathered on the host, as little-endian bytes of the given type.
    Rows(TensorType, Vec<u8>),
}

/// Rows of weight `table` at `ids`, copied from the store's bytes (the checkpoint's mmap) and
/// converted to the element type of `ty` when it differs from the table's.
fn host_rows(module: &Module, store: &dyn WeightStore, table: &str, ids: &Tensor, ty: &TensorType) -> Result<Vec<u8>> {
    let decl = module.weight(table).ok_or_else(|| crate::RuntimeError::Invalid(format!("no weight @{table}")))?;
    let bytes = store.bytes(decl)?;
    let rows = decl.ty.shape[0];
    let row_bytes = bytes.len() / rows.max(1);
    let Some(ids) = ids.as_i32() else { return invalid(format!("rows of @{table} need integer indices")) };
    let mut out = Vec::with_capacity(ids.len() * row_bytes);
    for &id in ids {
        if id < 0 || id as usize >= rows {
            return invalid(format!("index {id} out of range for the {rows} rows of @{table}"));
        }
        out.extend_from_slice(&bytes[id as usize * row_bytes..(id as usize + 1) * row_bytes]);
    }
    if ty.dtype == decl.ty.dtype {
        return Ok(out);
    }
    convert_float_bytes(decl.ty.dtype, ty.dtype, &out).map_err(crate::RuntimeError::Invalid)
}

/// The state parameters of `f` with their initial contents.
pub fn initial_state(f: &Function) -> impl Iterator<Item = (String, Tensor)> + '_ {
    f.params.iter().filter_map(|p| match p.role {
        ParamRole::State { init } => Some((f.param_name(p).to_string(), Tensor::filled(f.ty(p.value).clone(), init))),
        _ => None,
    })
}

/// The reference interpreter with host-resident state.
pub struct InterpExecutor<'m> {
    interp: Interpreter<'m>,
    state: HashMap<String, Tensor>,
}

impl<'m> InterpExecutor<'m> {
    pub fn new(interp: Interpreter<'m>) -> Self {
        InterpExecutor { interp, state: HashMap::new() }
    }
}

impl Executor for InterpExecutor<'_> {
    fn module(&self) -> &Module {
        self.interp.module()
    }

    fn reset(&mut self) -> Result<()> {
        let Some(decode) = self.interp.module().function("decode") else { return invalid("the module has no @decode") };
        self.state = initial_state(decode).collect();
        Ok(())
    }

    fn step(&mut self, function: &str, inputs: HashMap<&str, Tensor>) -> Result<Tensor> {
        let module = self.interp.module();
        let f = module.function(function).ok_or_else(|| crate::RuntimeError::Invalid(format!("no @{function}")))?;
        let args = gather_args(module, self.interp.store(), f, inputs, &mut self.state)?
            .into_iter()
            .map(|a| match a {
                Arg::Input(t) | Arg::State(t) => Ok(t),
                Arg::Rows(ty, bytes) => Tensor::from_bytes(ty, &bytes).map_err(crate::RuntimeError::Invalid),
            })
            .collect::<Result<_>>()?;
        let outputs = self.interp.call(function, args)?;
        let mut logits = None;
        for (r, value) in f.results.iter().zip(outputs) {
            if r.name == "logits" {
                logits = Some(value);
            } else {
                self.state.insert(r.name.clone(), value);
            }
        }
        logits.ok_or_else(|| crate::RuntimeError::Invalid(format!("@{function} returns no `logits`")))
    }
}
