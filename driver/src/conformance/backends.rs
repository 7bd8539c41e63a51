//! The backends the harness knows: the reference interpreter, and StableHLO through a PJRT plugin.

use super::OpBackend;
use crate::pjrt::open_client;
use crate::stablehlo_programs;
use anyhow::{ensure, Result};
use g4c_ir::Module;
use g4c_runtime::backend::pjrt::Client;
use g4c_runtime::{Interpreter, NoWeights, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

/// The reference interpreter.
pub struct InterpBackend;

/// Case modules declare no weights.
impl OpBackend for InterpBackend {
    fn name(&self) -> &str {
        "interp"
    }

    fn run(&mut self, module: &Module, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let entry = module.functions[0].name.clone();
        let mut interp = Interpreter::new(Arc::new(module.clone()), Arc::new(NoWeights));
        Ok(interp.call(&entry, inputs.to_vec())?)
    }
}

/// Each case lowered to StableHLO, compiled by the plugin (no cache), run on its first device.
pub struct PjrtBackend {
    client: Client,
}

impl PjrtBackend {
    /// `plugin`, else `$G4C_PJRT_PLUGIN`, else the CPU plugin `scripts/setup` installed.
    pub fn open(plugin: Option<PathBuf>) -> Result<PjrtBackend> {
        Ok(PjrtBackend { client: open_client(plugin)? })
    }
}

impl OpBackend for PjrtBackend {
    fn name(&self) -> &str {
        "pjrt"
    }

    /// XLA's CPU backend runs with flush-to-zero and denormals-are-zero (measured: `1e-40 · 3` is 0,
    /// `log(1e-40)` is -inf), as its GPU backend does.
    fn flushes_subnormals(&self) -> bool {
        true
    }

    fn run(&mut self, module: &Module, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let f = &module.functions[0];
        ensure!(f.call_args().len() == inputs.len(), "@{} takes {} inputs", f.name, f.params.len());
        let program = stablehlo_programs(module)?.remove(0);
        let executable = self.client.compile(program.text.as_bytes())?;
        let buffers = inputs
            .iter()
            .map(|t| self.client.buffer(t.ty.dtype, &t.ty.shape, &t.to_bytes()))
            .collect::<g4c_runtime::Result<Vec<_>>>()?;
        let outputs = executable.execute(&buffers.iter().collect::<Vec<_>>())?;
        f.results
            .iter()
            .zip(outputs)
            .map(|(r, b)| Tensor::from_bytes(f.ty(r.value).clone(), &b.to_host()?).map_err(anyhow::Error::msg))
            .collect()
    }
}
