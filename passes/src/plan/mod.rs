//! The kernel plan of a module for a CUDA target: fusion (`fusion`) splits each entry point into
//! kernels, small reductions move into the preludes of the kernels reading them (`prelude`), a
//! matvec waiting only for an elementwise kernel computes its value itself (`recompute`), kernels
//! are ordered by dependency level (`schedule`), each kernel becomes an IR function, values between
//! kernels get slots (`buffers`), each kernel a kind and a launch that fits the target (`launch`),
//! and independent kernels of a level share launches (`schedule`), a small kernel reading one
//! kernel's output in the launch before running on that kernel's last block (`schedule::tails`).

mod attention;
mod buffers;
mod fusion;
mod kind;
mod launch;
mod mask;
mod prelude;
mod recompute;
mod schedule;

pub(crate) use attention::scores_product;
pub use attention::{attention_of, chunk_axis_of, Attention};
pub use kind::{matvec_of, reads_per_element, reduction_of, rows_sharing_rhs, Matvec, PackedWeight, Reduction};
pub use launch::{
    attention_arrays, attention_footprint, elements_written, footprint, groups_per_block, split_footprint,
    split_sums_bytes, AttentionArrays, Footprint, SplitSumsBytes,
};
pub use prelude::{element_row_of, prelude_footprint, prelude_launch, prelude_of, staged_row_of, PreludeReduction};

use g4c_ir::plan::{EntryPlan, KernelCall, KernelPlan, Slot};
use g4c_ir::{FuncResult, Function, GpuLimits, Instr, Module, Op, Param, ParamRole, ResultRole, Target, ValueId};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("target {0} has no kernel plan: kernel plans are for CUDA targets")]
    NotCuda(&'static str),
    #[error("kernel plan of @{entry}: {message}")]
    Unsupported { entry: String, message: String },
    #[error(
        "kernel plan of @{entry}: kernel {kernel} ({kind}) needs {what} {need}, more than {target}'s limit of {limit}"
    )]
    DoesNotFit {
        entry: String,
        kernel: String,
        kind: &'static str,
        what: &'static str,
        need: u64,
        limit: u64,
        target: &'static str,
    },
}

/// The plan of every entry point of `module` (after `target`'s pipeline) on `target`.
pub fn plan_module(module: &Module, target: &'static Target) -> Result<KernelPlan, PlanError> {
    let gpu = target.gpu.as_ref().ok_or(PlanError::NotCuda(target.name))?;
    let mut kernels = Module::new(format!("{}_kernels", module.name));
    kernels.weights = module.weights.clone();
    let mut entries = Vec::new();
    for f in &module.functions {
        entries.push(plan_entry(f, gpu, target.name, &mut kernels)?);
    }
    Ok(KernelPlan { target: target.name, kernels, entries })
}

fn plan_entry(
    f: &Function,
    gpu: &GpuLimits,
    target: &'static str,
    kernels: &mut Module,
) -> Result<EntryPlan, PlanError> {
    let unsupported = |message: String| PlanError::Unsupported { entry: f.name.clone(), message };
    let names = g4c_ir::ValueNames::new(f);
    let groups = recompute::beside_producers(f, prelude::merge(f, fusion::partition(f), gpu), gpu);
    let param_index: HashMap<ValueId, usize> = f.params.iter().enumerate().map(|(i, p)| (p.value, i)).collect();

    // Cache writes update their state parameter in place; every other root gets a scratch buffer.
    let mut in_place: HashMap<ValueId, usize> = HashMap::new();
    for (k, g) in groups.iter().enumerate() {
        let Some(Op::UpdateSlots { operand, .. }) = f.body.iter().find(|i| i.result == g.root).map(|i| &i.op) else {
            continue;
        };
        let Some(&p) = param_index.get(operand) else {
            return Err(unsupported(format!(
                "{} updates {}, which is not a state parameter, so it cannot be written in place",
                names.get(g.root),
                names.get(*operand)
            )));
        };
        // The write races with any read of the old cache inside the same kernel (other threads may
        // already have stored), and a result that is the old cache would read the new one.
        let reads_inside =
            g.instrs.iter().any(|&i| f.body[i].result != g.root && f.body[i].op.operands().contains(operand));
        if reads_inside || f.results.iter().any(|r| r.value == *operand) {
            return Err(unsupported(format!(
                "{} is read while {} writes it in place",
                names.get(*operand),
                names.get(g.root)
            )));
        }
        if let Some(later) = groups[k + 1..].iter().find(|later| later.inputs.contains(operand)) {
            return Err(unsupported(format!(
                "{} is read by the kernel of {} after {} wrote it in place",
                names.get(*operand),
                names.get(later.root),
                names.get(g.root)
            )));
        }
        in_place.insert(g.root, p);
    }
    let (groups, levels) = schedule::by_level(f, groups, &in_place);
    let results: Vec<ValueId> = f.results.iter().map(|r| r.value).collect();
    let scratch = buffers::assign(f, &groups, &levels, &in_place, &results);
    let slot = |v: ValueId| match (param_index.get(&v), in_place.get(&v)) {
        (Some(&p), _) | (_, Some(&p)) => Slot::Param(p),
        _ => Slot::Scratch(scratch.slot[&v]),
    };

    let (mut calls, mut args) = (Vec::new(), Vec::new());
    for (k, g) in groups.iter().enumerate() {
        let function = kernel_function(f, g, format!("{}.k{k}", f.name));
        // Kernels index with 32-bit ints.
        if let Some(v) = function.values.iter().find(|v| v.ty.numel() > i32::MAX as usize) {
            return Err(unsupported(format!(
                "{} has a value of {} elements ({}), more than 32-bit indices reach",
                function.name,
                v.ty.numel(),
                v.ty
            )));
        }
        let kind = kind::classify(&function);
        let launch = launch::launch(&function, kind, gpu);
        launch::check_fit(&launch, gpu).map_err(|(what, need, limit)| PlanError::DoesNotFit {
            entry: f.name.clone(),
            kernel: function.name.clone(),
            kind: kind.name(),
            what,
            need,
            limit,
            target,
        })?;
        calls.push(KernelCall {
            kernel: function.name.clone(),
            kind,
            inputs: g.inputs.iter().map(|&v| slot(v)).collect(),
            output: slot(g.root),
            launch,
            side_by_side: false,
            split_sums: None,
            tail: false,
        });
        args.push(schedule::arguments(&function, calls.last().expect("pushed")));
        kernels.functions.push(function);
    }
    schedule::side_by_side(&mut calls, &args, &levels, gpu);
    schedule::tails(&mut calls, &mut args);
    schedule::check_launches(&calls).map_err(unsupported)?;
    schedule::share_register_budgets(&mut calls);
    number_in_launch_order(f, &mut calls, kernels);
    let mut buffers = scratch.bytes;
    let first = kernels.functions.len() - calls.len();
    buffers::split_sums(&mut calls, &kernels.functions[first..], &mut buffers);
    Ok(EntryPlan { entry: f.name.clone(), buffers, calls, results: results.iter().map(|&v| slot(v)).collect() })
}

/// Names the entry's kernels (the last of `kernels`, one per call) `{entry}.k{n}` in the order of
/// `calls` again, and orders them so: tails moved calls into earlier launches.
fn number_in_launch_order(f: &Function, calls: &mut [KernelCall], kernels: &mut Module) {
    let first = kernels.functions.len() - calls.len();
    let order: HashMap<String, usize> = calls.iter().enumerate().map(|(n, c)| (c.kernel.clone(), n)).collect();
    let functions = &mut kernels.functions[first..];
    functions.sort_by_key(|k| order[&k.name]);
    for (n, (k, call)) in functions.iter_mut().zip(calls).enumerate() {
        k.name = format!("{}.k{n}", f.name);
        call.kernel = k.name.clone();
    }
}

/// The group as a function: its inputs as parameters, its instructions, its root as the result.
fn kernel_function(f: &Function, g: &fusion::Group, name: String) -> Function {
    let mut k = Function::new(name);
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &v in &g.inputs {
        let nv = k.new_value(f.ty(v).clone(), f.value_name(v).map(str::to_string));
        k.params.push(Param { value: nv, role: ParamRole::Input });
        map.insert(v, nv);
    }
    for &i in &g.instrs {
        let instr = &f.body[i];
        let mut op = instr.op.clone();
        op.map_operands(|o| map[&o]);
        let nv = k.new_value(f.ty(instr.result).clone(), f.value_name(instr.result).map(str::to_string));
        map.insert(instr.result, nv);
        k.body.push(Instr { result: nv, op });
    }
    k.results.push(FuncResult { name: "out".into(), value: map[&g.root], role: ResultRole::Output });
    k
}
