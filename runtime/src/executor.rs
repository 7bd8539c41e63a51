//! What the generation loop drives: something that runs a module's entry points and keeps the state
//! (caches and slot positions) between calls, where it lives: in host memory for the interpreter, in
//! device buffers for PJRT.

use crate::error::{invalid, Result};
use crate::interp::Interpreter;
use crate::tensor::Tensor;
use g4c_ir::{Function, Module, ParamRole};
use std::collections::HashMap;

pub trait Executor {
    fn module(&self) -> &Module;
    /// Puts every state parameter back to its initial value (empty caches).
    fn reset(&mut self) -> Result<()>;
    /// Runs `function` with the named per-call inputs and the current state, keeps the next state,
    /// and returns the `logits` result.
    fn step(&mut self, function: &str, inputs: HashMap<&str, Tensor>) -> Result<Tensor>;
}

/// Splits a function's parameters into per-call inputs taken from `inputs` and state taken from
/// `state`, in parameter order.
pub fn gather_args<T>(
    f: &Function,
    mut inputs: HashMap<&str, Tensor>,
    state: &mut HashMap<String, T>,
) -> Result<Vec<Arg<T>>> {
    f.params
        .iter()
        .map(|p| {
            let name = f.param_name(p);
            match p.role {
                ParamRole::Input => inputs.remove(name).map(Arg::Input),
                ParamRole::State { .. } => state.remove(name).map(Arg::State),
            }
            .ok_or_else(|| crate::RuntimeError::Invalid(format!("@{}: no value for parameter %{name}", f.name)))
        })
        .collect()
}

pub enum Arg<T> {
    Input(Tensor),
    State(T),
}

/// The state parameters of `f` with their initial contents.
pub fn initial_state(f: &Function) -> impl Iterator<Item = (String, Tensor)> + '_ {
    f.params.iter().filter_map(|p| match p.role {
        ParamRole::State { init } => Some((f.param_name(p).to_string(), Tensor::filled(f.ty(p.value).clone(), init))),
        ParamRole::Input => None,
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
        let args = gather_args(f, inputs, &mut self.state)?
            .into_iter()
            .map(|a| match a {
                Arg::Input(t) | Arg::State(t) => t,
            })
            .collect();
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
