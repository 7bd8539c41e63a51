//! A kernel plan run on the CPU: each kernel's function by the interpreter, reading its inputs from
//! the slots the plan names and writing its output into the plan's slot, scratch buffers reused as
//! the plan reuses them and state updated in place; the kernels of one launch all read before any
//! writes, as side by side on a GPU they may, and then its tails likewise. What a GPU runs differs
//! only in the kernel bodies, so this checks fusion, buffer assignment and in-place writes against
//! the goldens before any GPU runs them.

use super::interp::host_tensors;
use crate::error::{invalid, Result, RuntimeError};
use crate::executor::{bind_args, initial_state, keep_outputs, reset_host_row, Executor, StepInputs, StepOutput};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use crate::Interpreter;
use g4c_ir::plan::{KernelCall, KernelPlan, Slot};
use g4c_ir::Module;
use std::collections::HashMap;
use std::sync::Arc;

pub struct PlanExecutor {
    module: Arc<Module>,
    plan: Arc<KernelPlan>,
    store: Arc<dyn WeightStore>,
    kernels: Interpreter,
    state: HashMap<String, Tensor>,
}

impl PlanExecutor {
    /// Runs `plan`, made from `module`, over the weights in `store`.
    pub fn new(module: Arc<Module>, plan: Arc<KernelPlan>, store: Arc<dyn WeightStore>) -> Self {
        let kernels = Interpreter::new(Arc::new(plan.kernels.clone()), store.clone());
        PlanExecutor { module, plan, store, kernels, state: HashMap::new() }
    }
}

impl Executor for PlanExecutor {
    fn module(&self) -> &Module {
        &self.module
    }

    fn reset(&mut self) -> Result<()> {
        self.state = initial_state(&self.module)?.into_iter().collect();
        Ok(())
    }

    fn reset_row(&mut self, row: usize) -> Result<()> {
        reset_host_row(&self.module, &mut self.state, row)
    }

    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> Result<Tensor> {
        let module = self.module.clone();
        let f = module.function(entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{entry}")))?;
        let Some(plan) = self.plan.entry(entry) else { return invalid(format!("the kernel plan has no @{entry}")) };
        let mut params = host_tensors(bind_args(&module, self.store.as_ref(), f, inputs, &mut self.state)?)?;
        let mut scratch: Vec<Option<Tensor>> = vec![None; plan.buffers.len()];
        let read = |slot: Slot, params: &[Tensor], scratch: &[Option<Tensor>]| match slot {
            Slot::Param(i) => Ok(params[i].clone()),
            Slot::Scratch(b) => {
                scratch[b].clone().ok_or_else(|| RuntimeError::Invalid(format!("buffer b{b} read before written")))
            }
        };
        // The calls of a launch run side by side: each reads what was there before any writes. Its
        // tails run after their calls, side by side too.
        let phases = plan.launches().flat_map(|calls| {
            let (tails, calls): (Vec<&KernelCall>, Vec<&KernelCall>) = calls.iter().partition(|c| c.tail);
            [calls, tails].into_iter().filter(|phase| !phase.is_empty())
        });
        for calls in phases {
            let mut outs = Vec::with_capacity(calls.len());
            for call in &calls {
                let args = call.inputs.iter().map(|&s| read(s, &params, &scratch)).collect::<Result<Vec<_>>>()?;
                outs.push(self.kernels.call(&call.kernel, args)?.remove(0));
            }
            for (call, out) in calls.iter().zip(outs) {
                match call.output {
                    Slot::Param(i) => params[i] = out,
                    Slot::Scratch(b) => {
                        let bytes = out.ty.byte_size();
                        if bytes > plan.buffers[b] {
                            return invalid(format!(
                                "{} writes {bytes} bytes into b{b} of {} bytes",
                                call.kernel, plan.buffers[b]
                            ));
                        }
                        scratch[b] = Some(out);
                    }
                }
            }
        }
        let outputs = plan.results.iter().map(|&s| read(s, &params, &scratch)).collect::<Result<Vec<_>>>()?;
        keep_outputs(f, outputs, &mut self.state, output)
    }
}
