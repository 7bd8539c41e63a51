//! What the generation loop drives, whatever the backend: something that runs a module's entry
//! points on the inputs their ABI names (`g4c_ir::abi`) and keeps the state (caches and slot
//! positions) between calls, where it lives: in host memory for the interpreter, in device buffers
//! for PJRT. Executors own what they need and are `Send`, so a server can run one on a worker thread.

use crate::error::{invalid, Result, RuntimeError};
use crate::tensor::{convert_float_bytes, Tensor};
use crate::weights::WeightStore;
use g4c_ir::{Function, Module, ParamRole, ResultRole, TensorType};
use std::collections::HashMap;

/// The per-call inputs of a model entry point, by role.
#[derive(Clone, Debug)]
pub struct StepInputs {
    /// `token_ids`: `i32[B, T]`.
    pub ids: Tensor,
    /// `positions`: `i32[B, T]`, `-1` for padding.
    pub pos: Tensor,
    /// `last_index`: `i32[B]`, prefill only.
    pub last: Option<Tensor>,
}

impl StepInputs {
    /// Inputs of `t` tokens per sequence: sequence `r` feeds `rows[r].1` at positions
    /// `rows[r].0..`, right-padded with token 0 at position -1 (which writes no cache slot and is
    /// seen by nothing); `last` for a prefill: the index of each sequence's last token (0 if none).
    pub fn padded(t: usize, rows: &[(usize, &[u32])], last: bool) -> StepInputs {
        let b = rows.len();
        let mut ids = vec![0i32; b * t];
        let mut pos = vec![-1i32; b * t];
        for (r, &(start, tokens)) in rows.iter().enumerate() {
            for (i, &id) in tokens.iter().enumerate() {
                ids[r * t + i] = id as i32;
                pos[r * t + i] = (start + i) as i32;
            }
        }
        let last =
            last.then(|| Tensor::i32([b], rows.iter().map(|(_, tokens)| tokens.len().max(1) as i32 - 1).collect()));
        StepInputs { ids: Tensor::i32([b, t], ids), pos: Tensor::i32([b, t], pos), last }
    }
}

/// Which result of an entry point a call copies back to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutput {
    /// The logits, `f32[B, V]`: what sampling and scoring read.
    Logits,
    /// Each sequence's greedy token, `i32[B]` (`ResultRole::GreedyTokens`): all that greedy
    /// decoding reads, `V` times smaller.
    GreedyTokens,
}

impl StepOutput {
    pub fn role(self) -> ResultRole {
        match self {
            StepOutput::Logits => ResultRole::Logits,
            StepOutput::GreedyTokens => ResultRole::GreedyTokens,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StepOutput::Logits => "logits",
            StepOutput::GreedyTokens => "greedy tokens",
        }
    }
}

pub trait Executor: Send {
    fn module(&self) -> &Module;
    /// Puts every state back to its initial value (empty caches).
    fn reset(&mut self) -> Result<()>;
    /// Puts row `row` of every state back to its initial value (that sequence's caches emptied),
    /// leaving the other rows as they are.
    fn reset_row(&mut self, row: usize) -> Result<()>;
    /// Runs entry point `entry` on `inputs` and the current state, keeps the next state, and returns
    /// its result of role `output.role()`.
    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> Result<Tensor>;
}

/// One argument of a call, in parameter order, as `bind_args` finds it.
pub enum Arg<T> {
    Input(Tensor),
    /// A state's current value, taken out of the executor's state (the call returns the next one).
    State(T),
    /// Rows gathered on the host, as little-endian bytes of the given type.
    Rows(TensorType, Vec<u8>),
}

/// The arguments of `f` in parameter order, bound by role: per-call inputs from `inputs`, state
/// taken from `state` (by the name that threads it through calls), host-gathered rows read from
/// `store`.
pub fn bind_args<T>(
    module: &Module,
    store: &dyn WeightStore,
    f: &Function,
    inputs: &StepInputs,
    state: &mut HashMap<String, T>,
) -> Result<Vec<Arg<T>>> {
    let input = |role: &ParamRole| -> Result<&Tensor> {
        match role {
            ParamRole::TokenIds => Ok(&inputs.ids),
            ParamRole::Positions => Ok(&inputs.pos),
            ParamRole::LastIndex => {
                inputs.last.as_ref().ok_or_else(|| RuntimeError::Invalid(format!("@{} needs a last index", f.name)))
            }
            other => invalid(format!("@{}: an executor cannot supply a parameter of role {other:?}", f.name)),
        }
    };
    let mut args = Vec::with_capacity(f.params.len());
    for p in &f.params {
        let name = f.param_name(p);
        let arg = match &p.role {
            ParamRole::HostGather { table, indices } => {
                let Some(index) = f.params.iter().find(|q| q.value == *indices) else {
                    return invalid(format!("@{}: %{name} gathers with a value that is not a parameter", f.name));
                };
                let index_role = &index.role;
                let ty = f.ty(p.value).clone();
                let rows = host_rows(module, store, table, input(index_role)?, &ty)?;
                Arg::Rows(ty, rows)
            }
            role if role.is_state() => Arg::State(
                state.remove(name).ok_or_else(|| RuntimeError::Invalid(format!("@{}: no state %{name}", f.name)))?,
            ),
            role => {
                let t = input(role)?;
                if &t.ty != f.ty(p.value) {
                    return invalid(format!("@{}: %{name} must be {}, got {}", f.name, f.ty(p.value), t.ty));
                }
                Arg::Input(t.clone())
            }
        };
        args.push(arg);
    }
    Ok(args)
}

/// Sorts `f`'s outputs: the next value of every state goes back into `state`, the result `output`
/// names is returned.
pub fn keep_outputs<T>(f: &Function, outputs: Vec<T>, state: &mut HashMap<String, T>, output: StepOutput) -> Result<T> {
    let mut wanted = None;
    for (r, value) in f.results.iter().zip(outputs) {
        match r.role {
            ResultRole::NextState => {
                state.insert(r.name.clone(), value);
            }
            role if role == output.role() => wanted = Some(value),
            _ => {}
        }
    }
    wanted.ok_or_else(|| missing_output(f, output))
}

/// The error for an entry point without the result a call asked for.
pub fn missing_output(f: &Function, output: StepOutput) -> RuntimeError {
    RuntimeError::Invalid(format!("@{} returns no {}", f.name, output.name()))
}

/// Rows of weight `table` at `ids`, copied from the store's bytes (the checkpoint's mmap) and
/// converted to the element type of `ty` when it differs from the table's.
fn host_rows(module: &Module, store: &dyn WeightStore, table: &str, ids: &Tensor, ty: &TensorType) -> Result<Vec<u8>> {
    let decl = module.weight(table).ok_or_else(|| RuntimeError::Invalid(format!("no weight @{table}")))?;
    let rows = decl.ty.shape[0];
    let Some(ids) = ids.as_i32() else { return invalid(format!("rows of @{table} need integer indices")) };
    if let Some(id) = ids.iter().find(|&&id| id < 0 || id as usize >= rows) {
        return invalid(format!("index {id} out of range for the {rows} rows of @{table}"));
    }
    let ids: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
    let out = store.rows(decl, &ids)?;
    if ty.dtype == decl.ty.dtype {
        return Ok(out);
    }
    convert_float_bytes(decl.ty.dtype, ty.dtype, &out).map_err(RuntimeError::Invalid)
}

/// The state of the module's entry points (they all share it), every element at its initial value.
pub fn initial_state(module: &Module) -> Result<Vec<(String, Tensor)>> {
    let decode = first_entry(module)?;
    Ok(decode
        .state_params()
        .map(|p| {
            let init = p.role.initial_value().expect("a state");
            (decode.param_name(p).to_string(), Tensor::filled(decode.ty(p.value).clone(), init))
        })
        .collect())
}

fn first_entry(module: &Module) -> Result<&Function> {
    module
        .functions
        .iter()
        .find(|f| f.entry_kind().is_some())
        .ok_or_else(|| RuntimeError::Invalid("the module has no entry point".into()))
}

/// One row of one state: where its bytes lie in the state's (states are `[B, …]`, row-major, as the
/// ABI has them) and what they hold initially.
pub struct StateRow {
    pub name: String,
    /// The whole state's type.
    pub ty: TensorType,
    pub bytes: std::ops::Range<usize>,
    pub initial: Vec<u8>,
}

impl StateRow {
    /// Writes the row's initial value into `state`, the whole state's bytes.
    pub fn reset_in(&self, state: &mut [u8]) -> Result<()> {
        match state.get_mut(self.bytes.clone()) {
            Some(row) => {
                row.copy_from_slice(&self.initial);
                Ok(())
            }
            None => invalid(format!(
                "state {} holds {} bytes, not the {} its rows take",
                self.name,
                state.len(),
                self.bytes.end
            )),
        }
    }
}

/// Row `row` of every state of `module`, at its initial value.
pub fn initial_rows(module: &Module, row: usize) -> Result<Vec<StateRow>> {
    let f = first_entry(module)?;
    let ids = f.params.iter().find(|p| p.role == ParamRole::TokenIds);
    let Some(batch) = ids.map(|p| f.ty(p.value).shape[0]) else {
        return invalid(format!("@{} has no token ids", f.name));
    };
    if row >= batch {
        return invalid(format!("row {row} is past the module's {batch} rows"));
    }
    f.state_params()
        .map(|p| {
            let (name, ty) = (f.param_name(p), f.ty(p.value));
            if ty.shape.first() != Some(&batch) {
                return invalid(format!("state {name} of type {ty} does not lead with the module's {batch} rows"));
            }
            let row_type = TensorType { shape: ty.shape[1..].to_vec(), ..ty.clone() };
            let initial = Tensor::filled(row_type, p.role.initial_value().expect("a state")).to_bytes();
            let start = row * initial.len();
            Ok(StateRow { name: name.to_string(), ty: ty.clone(), bytes: start..start + initial.len(), initial })
        })
        .collect()
}

/// Resets row `row` of a state kept as host tensors (`Executor::reset_row` of the host executors).
pub fn reset_host_row(module: &Module, state: &mut HashMap<String, Tensor>, row: usize) -> Result<()> {
    for r in initial_rows(module, row)? {
        let t = state
            .get_mut(&r.name)
            .ok_or_else(|| RuntimeError::Invalid(format!("state {} is not there yet", r.name)))?;
        let mut bytes = t.to_bytes();
        r.reset_in(&mut bytes)?;
        *t = Tensor::from_bytes(t.ty.clone(), &bytes).map_err(RuntimeError::Invalid)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{initial_state, reset_host_row};
    use crate::tensor::Tensor;
    use std::collections::HashMap;

    /// An entry point of 2 rows with a key cache and slot positions, written by hand.
    const MODULE: &str = r#"module @m {
  func @decode(
    %ids: i32[2,1] token_ids,
    %pos: i32[2,1] positions,
    %k: f32[2,1,3,2] kv_cache(0, k),
    %slots: i32[2,3] slot_positions(sliding)
  ) -> (
    logits: f32[2,4] logits,
    k: f32[2,1,3,2],
    slots: i32[2,3]
  ) {
    %zero = constant {value = 0.0} : f32[2,4]
    return %zero, %k, %slots
  }
}
"#;

    /// Row 1 of every state, the cache's keys (a NaN among them) as well as its slot positions, goes
    /// back to its initial value; row 0 keeps what it held.
    #[test]
    fn a_row_reset_writes_that_rows_initial_values_into_every_state() {
        let module = g4c_ir::parse_module(MODULE).unwrap();
        let mut state: HashMap<String, Tensor> = initial_state(&module).unwrap().into_iter().collect();
        state.insert("k".into(), Tensor::f32([2, 1, 3, 2], [vec![7.0; 6], vec![f32::NAN; 6]].concat()));
        state.insert("slots".into(), Tensor::i32([2, 3], vec![0, 1, 2, 3, 4, 5]));
        reset_host_row(&module, &mut state, 1).unwrap();
        assert_eq!(state["k"].as_f32().unwrap(), [vec![7.0; 6], vec![0.0; 6]].concat());
        assert_eq!(state["slots"].as_i32().unwrap(), [0, 1, 2, -1, -1, -1]);
        assert!(reset_host_row(&module, &mut state, 2).unwrap_err().to_string().contains("past the module's 2 rows"));
    }
}
