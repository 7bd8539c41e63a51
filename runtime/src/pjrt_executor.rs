//! Runs a module through a PJRT plugin: every entry point's executable (compiled or loaded by a
//! `Compiler`), weights uploaded once in their stored dtype, state kept in device buffers that each
//! call donates and gets back updated in place.

use crate::compiler::EntryExecutable;
use crate::error::{invalid, Result};
use crate::executor::{gather_args, initial_state, Arg, Executor};
use crate::pjrt::{Buffer, Client};
use crate::progress::{Progress, Unit};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use g4c_codegen::stablehlo::Input;
use g4c_ir::Module;
use std::collections::HashMap;

pub struct PjrtExecutor<'m> {
    module: &'m Module,
    /// Kept for tables gathered on the host (`host_gather` parameters).
    store: &'m dyn WeightStore,
    entries: HashMap<String, EntryExecutable>,
    weights: HashMap<String, Buffer>,
    state: HashMap<String, Buffer>,
    /// Declared last so it is dropped last: executables and buffers must go before their client.
    client: Client,
}

impl<'m> PjrtExecutor<'m> {
    /// Takes the executable of every function of `module` and uploads the weights they read.
    pub fn new(
        module: &'m Module,
        store: &'m dyn WeightStore,
        client: Client,
        executables: Vec<EntryExecutable>,
        progress: &dyn Progress,
    ) -> Result<Self> {
        let mut uploads: Vec<&str> = vec![];
        for entry in &executables {
            for input in &entry.lowered.inputs {
                if let Input::Weight(name) = input {
                    if !uploads.contains(&name.as_str()) {
                        uploads.push(name);
                    }
                }
            }
        }
        let decls: Vec<_> = uploads
            .iter()
            .map(|name| module.weight(name).ok_or_else(|| crate::RuntimeError::Invalid(format!("no weight @{name}"))))
            .collect::<Result<_>>()?;
        progress.begin("uploading weights", decls.iter().map(|d| d.ty.byte_size()).sum(), Unit::Bytes);
        let mut weights = HashMap::new();
        let mut scratch = Vec::new();
        for decl in decls {
            let bytes = store.bytes_in(decl, &mut scratch)?;
            weights.insert(decl.name.clone(), client.buffer(decl.ty.dtype, &decl.ty.shape, bytes)?);
            store.release(decl);
            progress.advance(decl.ty.byte_size());
        }
        progress.end();
        let entries = executables.into_iter().map(|e| (e.lowered.entry.clone(), e)).collect();
        Ok(PjrtExecutor { module, store, entries, weights, state: HashMap::new(), client })
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
        let EntryExecutable { lowered, executable } = &self.entries[function];
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
