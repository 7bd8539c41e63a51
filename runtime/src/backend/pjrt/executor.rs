//! Runs a module through a PJRT plugin: every entry point's executable (compiled or loaded by a
//! `Compiler`), weights uploaded once in their stored dtype, state kept in device buffers that each
//! call donates and gets back updated in place. Arguments go in the order of `Function::call_args`,
//! the order codegen gives `@main`.

use super::{Buffer, Client, EntryExecutable, Executable};
use crate::error::{invalid, Result, RuntimeError};
use crate::executor::{bind_args, initial_rows, initial_state, keep_outputs, Arg, Executor, StepInputs, StepOutput};
use crate::progress::{Progress, Unit};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use g4c_ir::{CallArg, Module};
use std::collections::HashMap;
use std::sync::Arc;

pub struct PjrtExecutor {
    module: Arc<Module>,
    /// Kept for tables gathered on the host (`host_gather` parameters).
    store: Arc<dyn WeightStore>,
    /// Per entry point: its executable and its arguments in call order (computed once, not per call).
    entries: HashMap<String, (Executable, Vec<Source>)>,
    weights: HashMap<String, Buffer>,
    state: HashMap<String, Buffer>,
    /// Declared last so it is dropped last: executables and buffers must go before their client.
    client: Client,
}

impl PjrtExecutor {
    /// Takes the executable of every entry point of `module` and uploads the weights they read.
    pub fn new(
        module: Arc<Module>,
        store: Arc<dyn WeightStore>,
        client: Client,
        executables: Vec<EntryExecutable>,
        progress: &dyn Progress,
    ) -> Result<Self> {
        let mut uploads: Vec<&str> = vec![];
        let mut entries = HashMap::new();
        for e in executables {
            let f = module.function(&e.entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{}", e.entry)))?;
            let mut sources = vec![];
            for arg in f.call_args() {
                sources.push(match arg {
                    CallArg::Param(i) => Source::Param(i),
                    CallArg::Weight(name) => {
                        if !uploads.contains(&name) {
                            uploads.push(name);
                        }
                        Source::Weight(name.to_string())
                    }
                });
            }
            entries.insert(e.entry, (e.executable, sources));
        }
        let decls: Vec<_> = uploads
            .iter()
            .map(|name| module.weight(name).ok_or_else(|| RuntimeError::Invalid(format!("no weight @{name}"))))
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
        Ok(PjrtExecutor { module, store, entries, weights, state: HashMap::new(), client })
    }

    fn upload(&self, t: &Tensor) -> Result<Buffer> {
        self.client.buffer(t.ty.dtype, &t.ty.shape, &t.to_bytes())
    }
}

impl Executor for PjrtExecutor {
    fn module(&self) -> &Module {
        &self.module
    }

    fn reset(&mut self) -> Result<()> {
        let state = initial_state(&self.module)?;
        self.state = state.iter().map(|(n, t)| Ok((n.clone(), self.upload(t)?))).collect::<Result<_>>()?;
        Ok(())
    }

    /// Through the host: the state comes down, has the row's initial bytes written in, and goes back
    /// up (a rare call: a sequence whose caches may hold non-finite values).
    fn reset_row(&mut self, row: usize) -> Result<()> {
        for r in initial_rows(&self.module, row)? {
            let Some(buffer) = self.state.get(&r.name) else {
                return invalid(format!("state {} is not there yet", r.name));
            };
            let mut bytes = buffer.to_host()?;
            r.reset_in(&mut bytes)?;
            let fresh = self.client.buffer(r.ty.dtype, &r.ty.shape, &bytes)?;
            self.state.insert(r.name, fresh);
        }
        Ok(())
    }

    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> Result<Tensor> {
        let module = self.module.clone();
        let f = module.function(entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{entry}")))?;
        let Some((executable, sources)) = self.entries.get(entry) else {
            let compiled: Vec<&str> = self.entries.keys().map(String::as_str).collect();
            return Err(RuntimeError::Invalid(format!(
                "no executable for @{entry} (compiled: {})",
                compiled.join(", ")
            )));
        };
        // Parameters (inputs uploaded now, state buffers handed over), then the resident weights.
        let params: Vec<Buffer> = bind_args(&module, self.store.as_ref(), f, inputs, &mut self.state)?
            .into_iter()
            .map(|a| match a {
                Arg::Input(t) => self.upload(&t),
                Arg::State(b) => Ok(b),
                Arg::Rows(ty, bytes) => self.client.buffer(ty.dtype, &ty.shape, &bytes),
            })
            .collect::<Result<_>>()?;
        let args: Vec<&Buffer> = sources
            .iter()
            .map(|s| match s {
                Source::Param(i) => &params[*i],
                Source::Weight(name) => &self.weights[name],
            })
            .collect();
        let outputs = executable.execute(&args)?;
        drop(args);
        drop(params); // donated state buffers are consumed by the call
        let wanted = keep_outputs(f, outputs, &mut self.state, output)?;
        let ty = f.ty(f.result_with(output.role()).expect("kept").value).clone();
        Tensor::from_bytes(ty, &wanted.to_host()?).map_err(RuntimeError::Pjrt)
    }
}

/// Where one argument of a call comes from (`Function::call_args`).
enum Source {
    /// The call's parameter `i`.
    Param(usize),
    /// A resident weight.
    Weight(String),
}
