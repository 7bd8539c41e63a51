//! Runs a module through a PJRT plugin: every entry point lowered to StableHLO and compiled once,
//! weights uploaded once in their stored dtype, state kept in device buffers that each call donates
//! and gets back updated in place.

use crate::error::{invalid, Result};
use crate::executor::{gather_args, initial_state, Arg, Executor};
use crate::pjrt::{Buffer, Client, Executable};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use g4c_codegen::stablehlo::{lower_entry, Input, Lowered};
use g4c_ir::Module;
use std::collections::HashMap;

pub struct PjrtExecutor<'m> {
    module: &'m Module,
    /// Kept for tables gathered on the host (`host_gather` parameters).
    store: &'m dyn WeightStore,
    client: Client,
    entries: HashMap<String, (Lowered, Executable)>,
    weights: HashMap<String, Buffer>,
    state: HashMap<String, Buffer>,
}

impl<'m> PjrtExecutor<'m> {
    /// Lowers and compiles every function of `module`, and uploads the weights they read.
    pub fn new(module: &'m Module, store: &'m dyn WeightStore, client: Client) -> Result<Self> {
        let mut entries = HashMap::new();
        let mut weights = HashMap::new();
        for f in &module.functions {
            let lowered = lower_entry(module, &f.name).map_err(|e| crate::RuntimeError::Invalid(e.to_string()))?;
            let executable = client.compile(lowered.mlir.as_bytes())?;
            for input in &lowered.inputs {
                if let Input::Weight(name) = input {
                    if !weights.contains_key(name) {
                        let decl = module.weight(name).expect("lowering checked the weight exists");
                        let bytes = store.bytes(decl)?;
                        weights.insert(name.clone(), client.buffer(decl.ty.dtype, &decl.ty.shape, &bytes)?);
                        drop(bytes);
                        store.release(decl);
                    }
                }
            }
            entries.insert(f.name.clone(), (lowered, executable));
        }
        Ok(PjrtExecutor { module, store, client, entries, weights, state: HashMap::new() })
    }

    fn upload(&self, t: &Tensor) -> Result<Buffer> {
        self.client.buffer(t.ty.dtype, &t.ty.shape, &t.to_bytes())
    }
}

impl Executor for PjrtExecutor<'_> {
    fn module(&self) -> &Module {
        self.module
    }

    fn reset(&mut self) -> Result<()> {
        let Some(decode) = self.module.function("decode") else { return invalid("the module has no @decode") };
        let state: Vec<(String, Tensor)> = initial_state(decode).collect();
        self.state = state.iter().map(|(n, t)| Ok((n.clone(), self.upload(t)?))).collect::<Result<_>>()?;
        Ok(())
    }

    fn step(&mut self, function: &str, inputs: HashMap<&str, Tensor>) -> Result<Tensor> {
        let f =
            self.module.function(function).ok_or_else(|| crate::RuntimeError::Invalid(format!("no @{function}")))?;
        let (lowered, executable) = &self.entries[function];
        // Parameters in order (inputs uploaded now, state buffers handed over), then weights.
        let mut params = gather_args(self.module, self.store, f, inputs, &mut self.state)?.into_iter();
        let mut owned: Vec<Buffer> = Vec::new();
        let mut order: Vec<ArgSource> = Vec::new();
        for input in &lowered.inputs {
            match input {
                Input::Param(_) => {
                    let buffer = match params.next().expect("one argument per parameter") {
                        Arg::Input(t) => self.upload(&t)?,
                        Arg::State(b) => b,
                        Arg::Rows(ty, bytes) => self.client.buffer(ty.dtype, &ty.shape, &bytes)?,
                    };
                    order.push(ArgSource::Call(owned.len()));
                    owned.push(buffer);
                }
                Input::Weight(name) => order.push(ArgSource::Weight(name)),
            }
        }
        let args: Vec<&Buffer> = order
            .iter()
            .map(|o| match o {
                ArgSource::Call(i) => &owned[*i],
                ArgSource::Weight(name) => &self.weights[*name],
            })
            .collect();
        let outputs = executable.execute(&args)?;
        drop(args);
        drop(owned); // donated state buffers are consumed by the call
        let mut logits = None;
        for ((name, buffer), r) in lowered.outputs.iter().zip(outputs).zip(&f.results) {
            if name == "logits" {
                let bytes = buffer.to_host()?;
                logits = Some(Tensor::from_bytes(f.ty(r.value).clone(), &bytes).map_err(crate::RuntimeError::Pjrt)?);
            } else {
                self.state.insert(name.clone(), buffer);
            }
        }
        logits.ok_or_else(|| crate::RuntimeError::Invalid(format!("@{function} returns no `logits`")))
    }
}

/// Where one argument of `@main` comes from.
enum ArgSource<'a> {
    /// Uploaded or handed over for this call (index into the call's buffers).
    Call(usize),
    /// A resident weight.
    Weight(&'a str),
}
