//! The entry-point ABI: what each parameter of an entry point carries, what each result is, and how
//! a backend calls it. The frontend states it as it emits, passes keep it, and the verifier checks it;
//! backends, the generation loop and the compile report read roles, never parameter names.
//!
//! An entry point of a model is a `prefill` (it has a `last_index` input) or a `decode` (it has
//! none), both over token ids and positions:
//!
//! ```text
//! func @decode(
//!   %ids: i32[1,1] token_ids,
//!   %pos: i32[1,1] positions,
//!   %cache.sliding.pos: i32[1,8] slot_positions(sliding),
//!   %cache.l0.k: f32[1,1,8,32] kv_cache(0, k),
//!   %embed_tokens_per_layer.rows: bf16[1,1,80] host_gather(@embed_tokens_per_layer, %ids)
//! ) -> (
//!   logits: f32[1,512] logits,
//!   greedy: i32[1] greedy_tokens,
//!   cache.sliding.pos: i32[1,8],
//!   cache.l0.k: f32[1,1,8,32]
//! )
//! ```
//!
//! State parameters are threaded through calls: the result of the same name is the state's next
//! value. A backend calls an entry point with its parameters in order, then every weight it reads in
//! order of first use (`call_args`), and may update each state in place (`donations`).

use crate::named_enum::named_enum;
use crate::{Function, Module, Op, TensorType, ValueId};

named_enum!(
    /// The attention kinds of Gemma 4: sliding-window layers and full (global) layers. Each kind has
    /// its own caches and its own record of the position stored in each slot.
    AttentionKind "attention kind" { Sliding = "sliding", Full = "full" }
);

named_enum!(
    /// Which half of a layer's KV cache.
    KvPart "cache part" { Key = "k", Value = "v" }
);

/// What a function parameter carries.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamRole {
    /// Token ids of this call, `i32[B, T]`.
    TokenIds,
    /// The absolute position of each token, `i32[B, T]`; `-1` marks padding, which writes no cache
    /// slot and is attended to by nothing.
    Positions,
    /// Which of the `T` tokens of each sequence a prefill returns the logits of, `i32[B]`.
    LastIndex,
    /// State: the keys or values of layer `layer`'s cache, `[B, Hkv, S, d]`, initially zero.
    KvCache { layer: usize, part: KvPart },
    /// State: the absolute position held by each slot of the caches of one attention kind,
    /// `i32[B, S]`, initially `-1` (empty). Masks are computed from it, never from slot indices.
    SlotPositions(AttentionKind),
    /// Rows of weight `table` selected by the integer input parameter `indices`, gathered by the
    /// caller on the host: a table too large for device memory that a call reads only a few rows of
    /// (E2B's 4.7 GB per-layer-embedding table).
    HostGather { table: String, indices: ValueId },
    /// Any other per-call input (hand-written IR; executors of models refuse it).
    Input,
    /// Any other state, every element `init` before the first call.
    State { init: f64 },
}

impl ParamRole {
    /// The value every element of a state parameter holds before the first call; `None` for
    /// per-call inputs.
    pub fn initial_value(&self) -> Option<f64> {
        match self {
            ParamRole::KvCache { .. } => Some(0.0),
            ParamRole::SlotPositions(_) => Some(-1.0),
            ParamRole::State { init } => Some(*init),
            _ => None,
        }
    }

    pub fn is_state(&self) -> bool {
        self.initial_value().is_some()
    }

    /// Whether the caller passes this parameter itself each call (not state, not gathered rows).
    pub fn is_input(&self) -> bool {
        matches!(self, ParamRole::TokenIds | ParamRole::Positions | ParamRole::LastIndex | ParamRole::Input)
    }
}

/// What a function result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultRole {
    /// The next-token logits of each sequence, `f32[B, V]`.
    Logits,
    /// The id of each sequence's largest logit, the lowest on ties: its greedy next token, `i32[B]`,
    /// computed where the logits are so that a greedy call copies back `B` ids, not `B × V` logits.
    /// -1 (no token) where a logit of the sequence is not finite.
    GreedyTokens,
    /// The next value of the state parameter of the same name.
    NextState,
    /// Anything else (hand-written IR).
    Output,
}

/// The two kinds of model entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// Runs `tokens` tokens per sequence and returns the logits of the one at `last_index`.
    Prefill { tokens: usize },
    /// Runs one token per sequence.
    Decode,
    /// Runs `tokens` tokens per sequence and returns the logits of every one (`f32[B, T, V]`), for
    /// teacher-forced scoring.
    Score { tokens: usize },
}

/// One argument of an entry point as a backend calls it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallArg<'f> {
    /// Parameter `i` of the function.
    Param(usize),
    /// A module weight the function reads (uploaded once, passed to every call).
    Weight(&'f str),
}

impl Function {
    /// The parameter with `role`.
    pub fn param_with(&self, role: &ParamRole) -> Option<&crate::Param> {
        self.params.iter().find(|p| &p.role == role)
    }

    /// The result with `role` (the first, for `Output`).
    pub fn result_with(&self, role: ResultRole) -> Option<&crate::FuncResult> {
        self.results.iter().find(|r| r.role == role)
    }

    /// State parameters in declaration order.
    pub fn state_params(&self) -> impl Iterator<Item = &crate::Param> {
        self.params.iter().filter(|p| p.role.is_state())
    }

    /// What kind of model entry point this is, read off its roles: token ids and positions, and a
    /// last index for a prefill; logits for every token (`[B, T, V]`) for scoring. `None` for other
    /// functions.
    pub fn entry_kind(&self) -> Option<EntryKind> {
        let ids = self.param_with(&ParamRole::TokenIds)?;
        self.param_with(&ParamRole::Positions)?;
        let tokens = *self.ty(ids.value).shape.get(1)?;
        let logits = self.result_with(ResultRole::Logits)?;
        Some(match self.param_with(&ParamRole::LastIndex) {
            Some(_) => EntryKind::Prefill { tokens },
            None if self.ty(logits.value).rank() == 3 => EntryKind::Score { tokens },
            None => EntryKind::Decode,
        })
    }

    /// The arguments a backend passes, in order: every parameter, then every weight the function
    /// reads in order of first use.
    pub fn call_args(&self) -> Vec<CallArg<'_>> {
        let mut args: Vec<CallArg> = (0..self.params.len()).map(CallArg::Param).collect();
        for instr in &self.body {
            if let Op::Weight { name } = &instr.op {
                let arg = CallArg::Weight(name.as_str());
                if !args.contains(&arg) {
                    args.push(arg);
                }
            }
        }
        args
    }

    /// `(parameter index, result index)` of every state parameter and the result that is its next
    /// value: a backend may update the state's buffer in place.
    pub fn donations(&self) -> Vec<(usize, usize)> {
        self.params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.role.is_state())
            .filter_map(|(i, p)| {
                let name = self.param_name(p);
                self.results.iter().position(|r| r.role == ResultRole::NextState && r.name == name).map(|j| (i, j))
            })
            .collect()
    }
}

impl Module {
    /// The scoring entry point.
    pub fn scorer(&self) -> Option<&Function> {
        self.functions.iter().find(|f| matches!(f.entry_kind(), Some(EntryKind::Score { .. })))
    }

    /// The decode entry point.
    pub fn decode(&self) -> Option<&Function> {
        self.functions.iter().find(|f| f.entry_kind() == Some(EntryKind::Decode))
    }

    /// The prefill entry points with their tokens per call, shortest first.
    pub fn prefills(&self) -> Vec<(usize, &Function)> {
        let mut out: Vec<(usize, &Function)> = self
            .functions
            .iter()
            .filter_map(|f| match f.entry_kind() {
                Some(EntryKind::Prefill { tokens }) => Some((tokens, f)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|(t, _)| *t);
        out
    }
}

/// Checks a parameter's type against its role; the message names what is wrong.
pub(crate) fn check_param_type(role: &ParamRole, ty: &TensorType) -> Result<(), String> {
    let i32_of_rank = |rank: usize| ty.dtype == crate::DType::I32 && ty.rank() == rank;
    let ok = match role {
        ParamRole::TokenIds | ParamRole::Positions | ParamRole::SlotPositions(_) => i32_of_rank(2),
        ParamRole::LastIndex => i32_of_rank(1),
        ParamRole::KvCache { .. } => ty.dtype.is_float() && ty.rank() == 4,
        ParamRole::HostGather { .. } | ParamRole::Input | ParamRole::State { .. } => true,
    };
    let expected = match role {
        ParamRole::LastIndex => "i32[B]",
        ParamRole::KvCache { .. } => "a float [B, Hkv, S, d]",
        ParamRole::SlotPositions(_) => "i32[B, S]",
        _ => "i32[B, T]",
    };
    if ok {
        Ok(())
    } else {
        Err(format!("must be {expected}, found {ty}"))
    }
}
