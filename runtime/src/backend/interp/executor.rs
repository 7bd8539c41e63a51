//! The reference interpreter as an executor: state in host memory.

use super::Interpreter;
use crate::error::{Result, RuntimeError};
use crate::executor::{bind_args, initial_state, keep_outputs, reset_host_row, Arg, Executor, StepInputs, StepOutput};
use crate::tensor::Tensor;
use g4c_ir::Module;
use std::collections::HashMap;

pub struct InterpExecutor {
    interp: Interpreter,
    state: HashMap<String, Tensor>,
}

impl InterpExecutor {
    pub fn new(interp: Interpreter) -> Self {
        InterpExecutor { interp, state: HashMap::new() }
    }
}

impl Executor for InterpExecutor {
    fn module(&self) -> &Module {
        self.interp.module()
    }

    fn reset(&mut self) -> Result<()> {
        self.state = initial_state(self.interp.module())?.into_iter().collect();
        Ok(())
    }

    fn reset_row(&mut self, row: usize) -> Result<()> {
        reset_host_row(self.interp.module(), &mut self.state, row)
    }

    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> Result<Tensor> {
        let module = self.interp.module().clone();
        let f = module.function(entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{entry}")))?;
        let args = host_tensors(bind_args(&module, self.interp.store(), f, inputs, &mut self.state)?)?;
        let outputs = self.interp.call(entry, args)?;
        keep_outputs(f, outputs, &mut self.state, output)
    }
}

/// Bound arguments as host tensors (host-gathered rows decoded from their bytes).
pub(crate) fn host_tensors(args: Vec<Arg<Tensor>>) -> Result<Vec<Tensor>> {
    args.into_iter()
        .map(|a| match a {
            Arg::Input(t) | Arg::State(t) => Ok(t),
            Arg::Rows(ty, bytes) => Tensor::from_bytes(ty, &bytes).map_err(RuntimeError::Invalid),
        })
        .collect()
}
