//! The reference interpreter: executes any IR function on the CPU, one op at a time, in f32 (narrower
//! floats are rounded to their dtype after every op). It is the oracle later passes and backends are
//! checked against, so it favours obviously-correct code over speed.

mod executor;
mod kernels;

pub(crate) use executor::host_tensors;
pub use executor::InterpExecutor;

use crate::error::{invalid, Result, RuntimeError};
use crate::tensor::Tensor;
use crate::weights::WeightStore;
use g4c_ir::{Function, Module, Op, TensorType, ValueId, ValueNames};
use std::collections::HashMap;
use std::sync::Arc;

pub struct Interpreter {
    module: Arc<Module>,
    store: Arc<dyn WeightStore>,
    /// Weights loaded so far; they stay resident across calls.
    loaded: HashMap<String, Tensor>,
    /// Each module function's last uses, worked out (and its memory checked) at its first call:
    /// a kernel plan calls its small functions hundreds of times a step.
    last_uses: HashMap<String, Arc<[Option<usize>]>>,
}

impl Interpreter {
    pub fn new(module: Arc<Module>, store: Arc<dyn WeightStore>) -> Self {
        Interpreter { module, store, loaded: HashMap::new(), last_uses: HashMap::new() }
    }

    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }

    pub fn store(&self) -> &dyn WeightStore {
        self.store.as_ref()
    }

    /// Runs `function` on `inputs` (in parameter order) and returns its results in order.
    pub fn call(&mut self, function: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let module = self.module.clone();
        let Some(f) = module.function(function) else {
            return invalid(format!("the module has no function @{function}"));
        };
        let last_use = match self.last_uses.get(function) {
            Some(known) => known.clone(),
            None => {
                let found: Arc<[Option<usize>]> = last_uses(f).into();
                check_memory(f, &found)?;
                self.last_uses.insert(function.to_string(), found.clone());
                found
            }
        };
        self.run_with(f, inputs, &last_use)
    }

    /// Runs `f`, a function of this module or one like it (its weights this module's), on `inputs`.
    pub fn run(&mut self, f: &Function, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let last_use = last_uses(f);
        check_memory(f, &last_use)?;
        self.run_with(f, inputs, &last_use)
    }

    fn run_with(&mut self, f: &Function, inputs: Vec<Tensor>, last_use: &[Option<usize>]) -> Result<Vec<Tensor>> {
        let function = &f.name;
        if inputs.len() != f.params.len() {
            return invalid(format!("@{function} takes {} inputs, {} given", f.params.len(), inputs.len()));
        }
        let mut values: Vec<Option<Tensor>> = vec![None; f.values.len()];
        for (p, t) in f.params.iter().zip(inputs) {
            if &t.ty != f.ty(p.value) {
                return invalid(format!(
                    "@{function}: input %{} must be {}, got {}",
                    f.param_name(p),
                    f.ty(p.value),
                    t.ty
                ));
            }
            values[p.value.index()] = Some(t);
        }
        for (i, instr) in f.body.iter().enumerate() {
            let out = self.eval(&instr.op, &values, f.ty(instr.result)).map_err(|message| RuntimeError::Op {
                function: f.name.clone(),
                value: ValueNames::new(f).get(instr.result),
                op: instr.op.mnemonic().to_string(),
                message,
            })?;
            values[instr.result.index()] = Some(out);
            for v in instr.op.operands() {
                if last_use[v.index()] == Some(i) {
                    values[v.index()] = None;
                }
            }
        }
        Ok(f.results.iter().map(|r| values[r.value.index()].clone().expect("results are defined")).collect())
    }

    fn eval(&mut self, op: &Op, values: &[Option<Tensor>], ty: &TensorType) -> std::result::Result<Tensor, String> {
        let v = |id: ValueId| values[id.index()].as_ref().expect("operand computed before use");
        Ok(match op {
            Op::Weight { name } => self.weight(name)?,
            Op::Constant { literal } => kernels::constant(literal, ty),
            Op::Iota { dim } => kernels::iota(*dim, ty),
            Op::Unary { op, x } => kernels::unary(*op, v(*x))?,
            Op::Binary { op, lhs, rhs } => kernels::binary(*op, v(*lhs), v(*rhs))?,
            Op::Compare { lhs, rhs, dir } => kernels::compare(*dir, v(*lhs), v(*rhs))?,
            Op::Select { cond, on_true, on_false } => kernels::select(v(*cond), v(*on_true), v(*on_false))?,
            Op::Convert { x } => kernels::convert(v(*x), ty.dtype)?,
            Op::Reduce { kind, input, axes } => kernels::reduce(*kind, v(*input), axes, ty)?,
            Op::Reshape { x } => kernels::reshape(v(*x), ty),
            Op::Transpose { input, perm } => kernels::transpose(v(*input), perm, ty),
            Op::Broadcast { input, dims } => kernels::broadcast(v(*input), dims, ty),
            Op::Slice { input, start, .. } => kernels::slice(v(*input), start, ty),
            Op::Concat { inputs, axis } => {
                let xs: Vec<&Tensor> = inputs.iter().map(|x| v(*x)).collect();
                kernels::concat(&xs, *axis, ty)?
            }
            Op::DotGeneral { lhs, rhs, dims } => kernels::dot_general(v(*lhs), v(*rhs), dims, ty)?,
            Op::Gather { table, indices } => kernels::gather(v(*table), v(*indices), ty)?,
            Op::Dequantize { q, scale, group } => kernels::dequantize(v(*q), v(*scale), *group, ty)?,
            Op::UpdateSlots { operand, slots, updates, axis } => {
                kernels::update_slots(v(*operand), v(*slots), v(*updates), *axis)?
            }
        })
    }

    fn weight(&mut self, name: &str) -> std::result::Result<Tensor, String> {
        if let Some(t) = self.loaded.get(name) {
            return Ok(t.clone());
        }
        let decl = self.module.weight(name).ok_or_else(|| format!("no weight @{name}"))?;
        let t = self.store.load(decl).map_err(|e| e.to_string())?;
        self.loaded.insert(name.to_string(), t.clone());
        Ok(t)
    }
}

/// Refuses a call whose new values would not fit in memory at once (a long prompt's attention
/// scores grow with its square): running out would abort the process rather than return an error.
/// Every value the call makes is held as 4-byte elements until its last use. Not counted: the
/// inputs (in memory already), weights (loaded once), values that share their operand's data (a
/// reshape, a conversion that keeps f32 storage), and operations' own temporaries.
fn check_memory(f: &Function, last_use: &[Option<usize>]) -> Result<()> {
    let shared: std::collections::HashSet<ValueId> = f
        .body
        .iter()
        .filter(|i| match &i.op {
            Op::Weight { .. } | Op::Reshape { .. } => true,
            Op::Convert { x } => {
                let (from, to) = (f.ty(*x).dtype, f.ty(i.result).dtype);
                from == to
                    || (to == g4c_ir::DType::F32 && crate::tensor::storage_of(from) == crate::tensor::Storage::F32)
            }
            _ => false,
        })
        .map(|i| i.result)
        .chain(f.params.iter().map(|p| p.value))
        .collect();
    let size = |v: ValueId| if shared.contains(&v) { 0 } else { f.ty(v).numel() as u64 * 4 };
    let mut live: u64 = 0;
    let (mut peak, mut largest) = (live, None::<ValueId>);
    for (i, instr) in f.body.iter().enumerate() {
        live += size(instr.result);
        peak = peak.max(live);
        if largest.is_none_or(|l| size(instr.result) > size(l)) {
            largest = Some(instr.result);
        }
        let mut freed = instr.op.operands();
        freed.retain(|v| last_use[v.index()] == Some(i));
        freed.sort_by_key(|v| v.index());
        freed.dedup();
        live -= freed.into_iter().map(size).sum::<u64>();
    }
    // Smaller calls are let be: a process with less than this left is short of memory for reasons
    // of its own, and refusing them would name a value that is not the cause.
    const ALWAYS_FITS: u64 = 1 << 30;
    if peak < ALWAYS_FITS {
        return Ok(());
    }
    match (g4c_util::memory::available(), largest) {
        (Some(available), Some(largest)) if peak > available => invalid(format!(
            "@{}: the interpreter would hold {} of values at once (the largest {}: {}, {}), more than the {} of memory available",
            f.name,
            g4c_util::memory::fmt_bytes(peak),
            ValueNames::new(f).get(largest),
            f.ty(largest),
            g4c_util::memory::fmt_bytes(size(largest)),
            g4c_util::memory::fmt_bytes(available)
        )),
        _ => Ok(()),
    }
}

/// Index of the last instruction reading each value (`None`: never read, or a result).
fn last_uses(f: &Function) -> Vec<Option<usize>> {
    let mut last = vec![None; f.values.len()];
    for (i, instr) in f.body.iter().enumerate() {
        for v in instr.op.operands() {
            last[v.index()] = Some(i);
        }
    }
    for r in &f.results {
        last[r.value.index()] = None;
    }
    last
}
