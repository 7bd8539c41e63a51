//! Runs a kernel plan on a device. Weights are uploaded once; state stays on the device between
//! calls (cache writes update it in place); per-call inputs are uploaded into the same buffers every
//! call, so each entry point's launches are one fixed `LaunchSequence`, built on its first call;
//! only the logits are copied back.

use super::device::{launch_bindings, launch_of, Buffer, Device, DeviceProgram, KernelBinding, Launch, LaunchSequence};
use crate::bench::CallTraffic;
use crate::error::{invalid, Result, RuntimeError};
use crate::executor::{bind_args, initial_rows, initial_state, missing_output, Arg, Executor, StepInputs, StepOutput};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use g4c_ir::plan::{EntryPlan, KernelPlan, Slot};
use g4c_ir::{Module, ResultRole};
use std::collections::HashMap;
use std::sync::Arc;

/// The buffers of one entry point: its per-call inputs (by parameter) and its scratch buffers; and
/// its launch sequence with the parameter buffers it was built over.
struct EntryBuffers {
    inputs: HashMap<usize, Buffer>,
    scratch: Vec<Buffer>,
    sequence: Option<(Vec<Buffer>, Arc<LaunchSequence>)>,
}

impl EntryBuffers {
    /// The buffer behind `slot` in a call over parameter buffers `params`.
    fn buffer(&self, slot: Slot, params: &[Buffer]) -> Buffer {
        match slot {
            Slot::Param(i) => params[i],
            Slot::Scratch(b) => self.scratch[b],
        }
    }
}

pub struct DeviceExecutor<D: Device> {
    module: Arc<Module>,
    plan: Arc<KernelPlan>,
    /// Per entry point, each launch's symbol and weights (shared, so a step takes no copy).
    kernels: HashMap<String, Arc<[KernelBinding]>>,
    store: Arc<dyn WeightStore>,
    device: D,
    weights: HashMap<String, Buffer>,
    /// The state a step is handed (`bind_args` takes it out, the step puts it back).
    state: HashMap<String, Buffer>,
    /// Every state's buffer, for good: a step that fails midway leaves `state` short, and `reset`
    /// refills the same buffers rather than allocating new ones.
    state_buffers: HashMap<String, Buffer>,
    entries: HashMap<String, EntryBuffers>,
}

impl<D: Device> DeviceExecutor<D> {
    /// Uploads every weight a kernel reads.
    pub fn new(
        module: Arc<Module>,
        plan: Arc<KernelPlan>,
        programs: &[DeviceProgram],
        store: Arc<dyn WeightStore>,
        mut device: D,
    ) -> Result<Self> {
        let mut kernels = HashMap::new();
        let mut weights = HashMap::new();
        let mut scratch = Vec::new();
        for p in programs {
            let Some(entry) = plan.entry(&p.entry) else { return invalid(format!("the plan has no @{}", p.entry)) };
            if entry.calls.len() != p.kernels.len() {
                return invalid(format!(
                    "@{}: the plan launches {} kernels, the program has {}",
                    p.entry,
                    entry.calls.len(),
                    p.kernels.len()
                ));
            }
            for name in p.kernels.iter().flat_map(|k| &k.weights) {
                if weights.contains_key(name) {
                    continue;
                }
                let decl =
                    plan.kernels.weight(name).ok_or_else(|| RuntimeError::Invalid(format!("no weight @{name}")))?;
                let bytes = store.bytes_in(decl, &mut scratch)?;
                let b = device.alloc(bytes.len())?;
                device.upload(b, bytes)?;
                store.release(decl);
                weights.insert(name.clone(), b);
            }
            kernels.insert(p.entry.clone(), Arc::from(p.kernels.as_slice()));
        }
        Ok(DeviceExecutor {
            module,
            plan,
            kernels,
            store,
            device,
            weights,
            state: HashMap::new(),
            state_buffers: HashMap::new(),
            entries: HashMap::new(),
        })
    }

    fn entry_buffers(&mut self, entry: &str) -> Result<&mut EntryBuffers> {
        if !self.entries.contains_key(entry) {
            let plan = self.plan.entry(entry).ok_or_else(|| RuntimeError::Invalid(format!("no plan for @{entry}")))?;
            let scratch = plan.buffers.iter().map(|&b| self.device.alloc(b as usize)).collect::<Result<_>>()?;
            self.entries.insert(entry.to_string(), EntryBuffers { inputs: HashMap::new(), scratch, sequence: None });
        }
        Ok(self.entries.get_mut(entry).expect("inserted"))
    }

    /// The buffer per-call input `param` of `entry` is uploaded into (its size never changes).
    fn input_buffer(&mut self, entry: &str, param: usize, bytes: usize) -> Result<Buffer> {
        if let Some(&b) = self.entry_buffers(entry)?.inputs.get(&param) {
            return Ok(b);
        }
        let b = self.device.alloc(bytes)?;
        self.entry_buffers(entry)?.inputs.insert(param, b);
        Ok(b)
    }

    /// The launch sequence of `entry` over parameter buffers `params`: built on the first call and
    /// kept while they stay the same, which they do (inputs, state, scratch and weights never move);
    /// a change builds a new sequence rather than replaying one over the wrong buffers.
    fn sequence(&mut self, entry: &str, ep: &EntryPlan, params: &[Buffer]) -> Result<Arc<LaunchSequence>> {
        if let Some((built_over, sequence)) = &self.entry_buffers(entry)?.sequence {
            if built_over == params {
                return Ok(sequence.clone());
            }
        }
        let bindings =
            self.kernels.get(entry).ok_or_else(|| RuntimeError::Invalid(format!("no kernels for @{entry}")))?;
        let buffers = &self.entries[entry];
        let buffer = |slot: Slot| buffers.buffer(slot, params);
        let f = self.module.function(entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{entry}")))?;
        let launches = launch_bindings(ep, bindings)
            .map(|(calls, parts)| Launch {
                bytes: calls.iter().filter_map(|c| CallTraffic::of(&self.plan, f, c, None)).map(|t| t.total()).sum(),
                ..launch_of(calls, parts, buffer, |w| self.weights[w])
            })
            .collect();
        let sequence = Arc::new(LaunchSequence::new(entry, launches));
        self.entry_buffers(entry)?.sequence = Some((params.to_vec(), sequence.clone()));
        Ok(sequence)
    }

    /// Builds every entry point's launch sequence over the buffers its calls will use and has the
    /// device record it (`Device::prepare`: a CUDA device captures and instantiates its graph), so
    /// that the first call of each takes its own time, not the recording's.
    pub fn prepare(&mut self) -> Result<()> {
        if self.state_buffers.is_empty() {
            self.reset()?;
        }
        let (module, plan) = (self.module.clone(), self.plan.clone());
        for ep in &plan.entries {
            let f = module.function(&ep.entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{}", ep.entry)))?;
            let mut params = Vec::with_capacity(f.params.len());
            for (i, p) in f.params.iter().enumerate() {
                // As `step` binds them: a state's own buffer, else the input's, sized by its type.
                let name = f.param_name(p);
                params.push(match self.state_buffers.get(name) {
                    Some(&b) if p.role.is_state() => b,
                    _ => self.input_buffer(&ep.entry, i, f.ty(p.value).byte_size() as usize)?,
                });
            }
            let sequence = self.sequence(&ep.entry, ep, &params)?;
            self.device.prepare(&sequence)?;
        }
        Ok(())
    }
}

impl<D: Device> Executor for DeviceExecutor<D> {
    fn module(&self) -> &Module {
        &self.module
    }

    fn reset(&mut self) -> Result<()> {
        for (name, t) in initial_state(&self.module)? {
            let bytes = t.to_bytes();
            let b = match self.state_buffers.get(&name) {
                Some(&b) => b,
                None => self.device.alloc(bytes.len())?,
            };
            self.device.upload(b, &bytes)?;
            self.state_buffers.insert(name.clone(), b);
            self.state.insert(name, b);
        }
        Ok(())
    }

    /// The row's initial bytes are uploaded into each state's own buffer (which the recorded graphs
    /// read) at the row's offset; the other rows are not touched.
    fn reset_row(&mut self, row: usize) -> Result<()> {
        for r in initial_rows(&self.module, row)? {
            let Some(&b) = self.state.get(&r.name) else {
                return invalid(format!("state {} is not there yet", r.name));
            };
            self.device.upload_at(b, r.bytes.start, &r.initial)?;
        }
        Ok(())
    }

    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> Result<Tensor> {
        let module = self.module.clone();
        let plan = self.plan.clone();
        let f = module.function(entry).ok_or_else(|| RuntimeError::Invalid(format!("no @{entry}")))?;
        let Some(ep) = plan.entry(entry) else { return invalid(format!("the kernel plan has no @{entry}")) };
        let args = bind_args(&module, self.store.as_ref(), f, inputs, &mut self.state)?;
        let mut params = Vec::with_capacity(args.len());
        for (i, arg) in args.into_iter().enumerate() {
            let bytes = match arg {
                Arg::State(b) => {
                    params.push(b);
                    continue;
                }
                Arg::Input(t) => t.to_bytes(),
                Arg::Rows(_, bytes) => bytes,
            };
            let b = self.input_buffer(entry, i, bytes.len())?;
            self.device.upload_queued(b, &bytes)?;
            params.push(b);
        }
        let sequence = self.sequence(entry, ep, &params)?;
        self.device.run(&sequence)?;
        let mut wanted = None;
        for (r, &slot) in f.results.iter().zip(&ep.results) {
            let ty = f.ty(r.value);
            let b = self.entries[entry].buffer(slot, &params);
            match r.role {
                ResultRole::NextState => {
                    // The state's own buffer: written in place, or copied from where the plan left it.
                    let p = f.params.iter().position(|p| f.param_name(p) == r.name).ok_or_else(|| {
                        RuntimeError::Invalid(format!("@{entry}: result {} names no state parameter", r.name))
                    })?;
                    if b != params[p] {
                        self.device.copy(params[p], b, ty.byte_size() as usize)?;
                    }
                    self.state.insert(r.name.clone(), params[p]);
                }
                role if role == output.role() => {
                    let bytes = self.device.download(b, ty.byte_size() as usize)?;
                    wanted = Some(Tensor::from_bytes(ty.clone(), &bytes).map_err(RuntimeError::Invalid)?);
                }
                _ => {}
            }
        }
        wanted.ok_or_else(|| missing_output(f, output))
    }
}
