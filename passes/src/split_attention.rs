//! Splits a decode step's attention over a long cache into chunks of slots, for GPU targets
//! (flash-decoding): `softmax(S) · V` over `N` slots becomes, per chunk `c` of `L` slots, its
//! maximum `m_c`, `e_c = exp(S_c - m_c)`, `l_c = Σ e_c` and `A_c = e_c · V_c`, then the
//! chunks combined: `O = Σ_c w_c A_c / Σ_c w_c l_c` with `w_c = exp(m_c - max_c m_c)`.
//!
//! The kernel plan computes each chunk in one block, for every query head at once
//! (`KernelKind::Attention`): the scores of its slots, their maximum and sum, and the weighted
//! sum of its values, so each key and value row is read once for all heads, and the chunks spread
//! the cache over the GPU. Unsplit, the softmax's maximum and sum over a long row are kernels of
//! their own, and the weighted sum reads the value cache once per head. The chunks' results go to
//! memory as one array, `[.., C, heads.., features + 2]` (the weighted sums, then `m_c` and
//! `l_c`), which a second kernel combines.
//!
//! The slots are padded to whole chunks: scores with `-inf` (their `e` is 0, whatever the chunk's
//! maximum: a chunk of padding alone cannot occur), values with 0.
//!
//! A chunk's maximum is clamped from below at `MAX_FLOOR`, under any real score and far above a
//! masked one (the frontend masks with `-1e30`). A chunk whose every slot is masked (at a short
//! context, most chunks of a long cache) then has `e_c = 0`, `l_c = 0` and `A_c = 0` exactly, and
//! `w_c = 0`: nothing it holds counts, so its block need not read its keys or values (the attention
//! kernel reads neither). Unclamped it would have `e_c = 1` and `A_c` the sum of its values, which
//! `w_c = 0` also drops, but only after they were read. A row that sees no slot at all (a padding
//! row) gets 0, where the unsplit softmax averages its `N` values (or, masked with `-inf`, is NaN).
//!
//! Sliding-window caches (a few hundred slots) are left whole: the scores' matvec and the weighted
//! sum already spread them over enough blocks, and a split would not save a launch. So are products
//! of more than 8 rows of heads (a prefill of more than a token or two; its last-token attention in
//! the layers that share another's cache is split), and those with batch axes longer than 1 (several
//! sequences per call; several key-value heads, GQA): the template takes one cache and at most a
//! block's warps of heads.

use crate::plan::{attention_footprint, scores_product};
use crate::{Pass, PassError};
use g4c_ir::plan::{SlotSplit, MATVEC_MAX_ROWS};
use g4c_ir::{
    infer_type, BinaryOp, DType, DotDims, Function, GpuLimits, Instr, Literal, Module, Op, ReduceKind, Target,
    TensorType, UnaryOp, ValueId,
};
use std::collections::HashMap;

pub struct SplitAttention;

/// Caches of at least this many slots are split.
const MIN_SLOTS: usize = 1024;
/// The fewest slots in a chunk. A chunk's results (a float per head and feature) are then at most
/// an eighth of the key and value bytes it reads, for 8 heads.
const MIN_CHUNK: usize = 64;
/// Shared memory a chunk's block keeps free for its prelude.
const PRELUDE_ROOM: u64 = 4096;
/// The least a chunk's maximum is taken to be: far below any score of a real slot (a dot product
/// of normalized queries and keys), and so far above the frontend's masked score (`-1e30`) that a
/// masked score's exponential from it, `exp(-1e30 + 1e20)`, is 0. A finite floor also keeps a
/// chunk of `-inf` scores (a mask written so, or rounded to a narrow type) from `exp(-inf - -inf)`,
/// NaN.
const MAX_FLOOR: f32 = -1e20;

impl Pass for SplitAttention {
    fn name(&self) -> &'static str {
        "split-attention"
    }

    fn is_enabled(&self, target: &Target) -> bool {
        target.gpu.is_some()
    }

    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError> {
        let Some(gpu) = target.gpu.as_ref() else { return Ok(()) };
        for f in &mut module.functions {
            let def: HashMap<ValueId, usize> = f.body.iter().enumerate().map(|(i, x)| (x.result, i)).collect();
            let found: HashMap<usize, Softmax> =
                (0..f.body.len()).filter_map(|i| Some((i, softmax_product(f, &def, i, gpu)?))).collect();
            if found.is_empty() {
                continue;
            }
            let old_body = std::mem::take(&mut f.body);
            for (i, instr) in old_body.into_iter().enumerate() {
                match found.get(&i) {
                    Some(s) => {
                        let instrs = split(f, s, instr.result);
                        f.body.extend(instrs);
                    }
                    None => f.body.push(instr),
                }
            }
        }
        Ok(())
    }
}

/// `softmax(scores) · values` in a decode step, as the frontend writes it.
struct Softmax {
    /// `[batch.., heads.., N]`, f32, the softmax over the last axis.
    scores: ValueId,
    values: ValueId,
    /// The probabilities' type where the product reads them.
    probs: DType,
    dims: DotDims,
    chunk: usize,
}

/// The softmax product of instruction `i`: `dot(convert?(e / Σe), values)` with `e = exp(S - max S)`
/// over `S`'s last axis, which it contracts with one axis of `values`, whose other free axis is its
/// last; batch axes of size 1 and at most `MATVEC_MAX_ROWS` rows of heads (a decode step of one
/// sequence); a long row; and the chunk's block within the target's shared memory.
fn softmax_product(f: &Function, def: &HashMap<ValueId, usize>, i: usize, gpu: &GpuLimits) -> Option<Softmax> {
    let op = |v: ValueId| def.get(&v).map(|&i| &f.body[i].op);
    let Op::DotGeneral { lhs, rhs, dims } = &f.body[i].op else { return None };
    let (probs, p) = match op(*lhs)? {
        Op::Convert { x } => (f.ty(*lhs).dtype, *x),
        _ => (f.ty(*lhs).dtype, *lhs),
    };
    let Op::Binary { op: BinaryOp::Div, lhs: e, rhs: sum_b } = op(p)? else { return None };
    let Op::Broadcast { input: sum, dims: sum_dims } = op(*sum_b)? else { return None };
    let Op::Reduce { input, kind: ReduceKind::Sum, axes } = op(*sum)? else { return None };
    let Op::Unary { op: UnaryOp::Exp, x } = op(*e)? else { return None };
    let Op::Binary { op: BinaryOp::Sub, lhs: scores, rhs: max_b } = op(*x)? else { return None };
    let Op::Broadcast { input: max, dims: max_dims } = op(*max_b)? else { return None };
    let Op::Reduce { input: max_input, kind: ReduceKind::Max, axes: max_axes } = op(*max)? else { return None };
    let (st, vt) = (f.ty(*scores), f.ty(*rhs));
    let last = st.rank() - 1;
    let batch_of_one = |shape: &[usize], axes: &[usize]| axes.iter().all(|&a| shape[a] == 1);
    let heads: usize = dims.lhs_free(st.rank()).iter().map(|&a| st.shape[a]).product();
    let rhs_free = dims.rhs_free(vt.rank());
    // Narrow targets convert the scores to f32 twice, once for each reader, until `cse`; this
    // pass runs before `split-reductions`, which would split a softmax over 8192 slots or more,
    // and so before the cleanup.
    let same = |a: ValueId, b: ValueId| match (op(a), op(b)) {
        _ if a == b => true,
        (Some(Op::Convert { x }), Some(Op::Convert { x: y })) => x == y && f.ty(a) == f.ty(b),
        _ => false,
    };
    let shaped = input == e
        && same(*max_input, *scores)
        && axes[..] == [last]
        && max_axes[..] == [last]
        && sum_dims.iter().copied().eq(0..last)
        && max_dims.iter().copied().eq(0..last)
        && st.dtype == DType::F32
        && dims.lhs_contract == [last]
        && dims.rhs_contract.len() == 1
        && rhs_free == [vt.rank() - 1]
        && batch_of_one(&st.shape, &dims.lhs_batch)
        && batch_of_one(&vt.shape, &dims.rhs_batch)
        && heads <= MATVEC_MAX_ROWS;
    let slots = st.shape[last];
    if !shaped || slots < MIN_SLOTS {
        return None;
    }
    // The kernel plan's template needs the scores from one matvec of the queries and the keys.
    let queries = scores_product(f, &op, *scores)?;
    let depth = queries.depth.max(vt.shape[vt.rank() - 1]) as u32;
    // Chunks enough for every SM, each fitting a block's shared memory beside its prelude (the
    // queries' norm); more, smaller chunks for caches too long for that.
    let fits = |chunk: usize| {
        let split = SlotSplit { heads: heads as u32, slots: chunk as u32, depth };
        attention_footprint(&split) + PRELUDE_ROOM <= gpu.smem_per_block as u64
    };
    let mut chunk = MIN_CHUNK.max(slots.div_ceil(gpu.sm_count as usize).next_power_of_two());
    while !fits(chunk) && chunk > MIN_CHUNK {
        chunk /= 2;
    }
    (fits(chunk) && slots.div_ceil(chunk) >= 2).then(|| Softmax {
        scores: *scores,
        values: *rhs,
        probs,
        dims: dims.clone(),
        chunk,
    })
}

/// Instructions appended to a function's new body, their values named after the product's.
struct Emit<'f> {
    f: &'f mut Function,
    body: Vec<Instr>,
    stem: Option<String>,
}

impl Emit<'_> {
    /// Appends `op` as value `what`, typed as `declared` says or as its operands imply.
    fn push(&mut self, op: Op, declared: Option<TensorType>, what: &str) -> ValueId {
        let operands = op.operands();
        let ty = infer_type(&op, &|i| self.f.ty(operands[i]).clone(), &|_| None, declared.as_ref())
            .unwrap_or_else(|e| panic!("split-attention built an ill-typed `{}`: {e}", op.mnemonic()));
        let result = self.f.new_value(ty, self.stem.as_ref().map(|s| format!("{s}.{what}")));
        self.body.push(Instr { result, op });
        result
    }

    fn ty(&self, v: ValueId) -> TensorType {
        self.f.ty(v).clone()
    }

    /// `x` padded along `axis` to `len` with `value`.
    fn pad(&mut self, x: ValueId, axis: usize, len: usize, value: f64, what: &str) -> ValueId {
        let ty = self.ty(x);
        if ty.shape[axis] == len {
            return x;
        }
        let mut shape = ty.shape.clone();
        shape[axis] = len - ty.shape[axis];
        let splat = Op::Constant { literal: Literal::Splat(value) };
        let pad = self.push(splat, Some(TensorType::new(ty.dtype, shape)), &format!("{what}.pad"));
        self.push(Op::Concat { inputs: vec![x, pad], axis }, None, &format!("{what}.padded"))
    }

    /// `x` with `axis` split into `(chunks, chunk)`.
    fn chunked(&mut self, x: ValueId, axis: usize, chunk: usize, what: &str) -> ValueId {
        let ty = self.ty(x);
        let mut shape = ty.shape.clone();
        shape.splice(axis..=axis, [ty.shape[axis] / chunk, chunk]);
        self.push(Op::Reshape { x }, Some(TensorType::new(ty.dtype, shape)), what)
    }

    fn reshape(&mut self, x: ValueId, shape: Vec<usize>, what: &str) -> ValueId {
        let dtype = self.ty(x).dtype;
        self.push(Op::Reshape { x }, Some(TensorType::new(dtype, shape)), what)
    }

    fn reduce(&mut self, kind: ReduceKind, input: ValueId, axis: usize, what: &str) -> ValueId {
        self.push(Op::Reduce { input, kind, axes: vec![axis] }, None, what)
    }

    fn binary(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId, what: &str) -> ValueId {
        self.push(Op::Binary { op, lhs, rhs }, None, what)
    }

    fn exp(&mut self, x: ValueId, what: &str) -> ValueId {
        self.push(Op::Unary { op: UnaryOp::Exp, x }, None, what)
    }

    /// `x` broadcast to `like`'s shape, its axes in order skipping `missing`.
    fn broadcast_skipping(&mut self, x: ValueId, like: ValueId, missing: &[usize]) -> ValueId {
        let ty = self.ty(like);
        let dims: Vec<usize> = (0..ty.rank()).filter(|d| !missing.contains(d)).collect();
        let declared = TensorType::new(self.ty(x).dtype, ty.shape);
        let what = format!("{}.b", self.f.value_name(x).and_then(|n| n.rsplit('.').next()).unwrap_or("x"));
        self.push(Op::Broadcast { input: x, dims }, Some(declared), &what)
    }
}

/// The chunked attention and its combination, replacing the product whose value is `result` (its
/// last instruction defines `result`, so the product's readers are unchanged).
fn split(f: &mut Function, s: &Softmax, result: ValueId) -> Vec<Instr> {
    let stem = f.value_name(result).map(|n| format!("{n}.split"));
    let out = &mut Emit { f, body: Vec::new(), stem };
    let (st, vt) = (out.ty(s.scores), out.ty(s.values));
    let (rank, slots, chunk) = (st.rank(), st.shape[st.rank() - 1], s.chunk);
    let chunks = slots.div_ceil(chunk);
    let padded = chunks * chunk;
    let slot_axis = s.dims.rhs_contract[0];

    // Per chunk: `[batch.., heads.., C, L]`.
    let scores = out.pad(s.scores, rank - 1, padded, f64::NEG_INFINITY, "scores");
    let scores = out.chunked(scores, rank - 1, chunk, "scores");
    let max = out.reduce(ReduceKind::Max, scores, rank, "max");
    // A chunk whose every slot is masked: its exponentials 0, not `exp(0)` (see `MAX_FLOOR`).
    let floor = out.push(Op::Constant { literal: Literal::Splat(MAX_FLOOR as f64) }, Some(out.ty(max)), "max.floor");
    let max = out.binary(BinaryOp::Max, max, floor, "max.floored");
    let max_b = out.broadcast_skipping(max, scores, &[rank]);
    let shifted = out.binary(BinaryOp::Sub, scores, max_b, "shifted");
    let e = out.exp(shifted, "exp");
    let sum = out.reduce(ReduceKind::Sum, e, rank, "sum");
    let probs = match s.probs {
        DType::F32 => e,
        dtype => out.push(Op::Convert { x: e }, Some(out.ty(e).with_dtype(dtype)), "probs"),
    };
    let values = out.pad(s.values, slot_axis, padded, 0.0, "values");
    let values = out.chunked(values, slot_axis, chunk, "values");
    // The chunk axis is one more batch axis: `[batch.., C, heads.., features]`.
    let shift = |d: &usize| if *d > slot_axis { d + 1 } else { *d };
    let dims = DotDims {
        lhs_batch: s.dims.lhs_batch.iter().copied().chain([rank - 1]).collect(),
        rhs_batch: s.dims.rhs_batch.iter().map(shift).chain([slot_axis]).collect(),
        lhs_contract: vec![rank],
        rhs_contract: vec![slot_axis + 1],
    };
    let mut weighted_shape: Vec<usize> = s.dims.lhs_batch.iter().map(|&d| st.shape[d]).collect();
    let chunk_at = weighted_shape.len();
    weighted_shape.push(chunks);
    weighted_shape.extend(s.dims.lhs_free(rank).iter().map(|&d| st.shape[d]));
    let features = vt.shape[vt.rank() - 1];
    weighted_shape.push(features);
    let declared = TensorType::new(DType::F32, weighted_shape.clone());
    let weighted = out.push(Op::DotGeneral { lhs: probs, rhs: values, dims }, Some(declared), "weighted");

    // `m` and `l` as `[batch.., C, heads.., 1]`, after the weighted sums along the last axis.
    let order: Vec<usize> = s.dims.lhs_batch.iter().copied().chain([rank - 1]).chain(s.dims.lhs_free(rank)).collect();
    let mut one_shape = weighted_shape.clone();
    *one_shape.last_mut().expect("features") = 1;
    let mut as_column = |x: ValueId, what: &str| {
        let x = match order.iter().copied().eq(0..rank) {
            true => x,
            false => out.push(Op::Transpose { input: x, perm: order.clone() }, None, &format!("{what}.t")),
        };
        out.reshape(x, one_shape.clone(), &format!("{what}.column"))
    };
    let (max_c, sum_c) = (as_column(max, "max"), as_column(sum, "sum"));
    let last = weighted_shape.len() - 1;
    let results = out.push(Op::Concat { inputs: vec![weighted, max_c, sum_c], axis: last }, None, "chunks");

    // Combined: `[batch.., heads.., features]`.
    let mut part = |from: usize, to: usize, what: &str| {
        let mut start = vec![0; weighted_shape.len()];
        let mut limit = weighted_shape.clone();
        (start[last], limit[last]) = (from, to);
        out.push(Op::Slice { input: results, start, limit }, None, what)
    };
    let weighted = part(0, features, "chunk.weighted");
    let (max, sum) = (part(features, features + 1, "chunk.max"), part(features + 1, features + 2, "chunk.sum"));
    let per_chunk: Vec<usize> = weighted_shape[..last].to_vec();
    let (max, sum) = (out.reshape(max, per_chunk.clone(), "chunk.m"), out.reshape(sum, per_chunk, "chunk.l"));
    let overall = out.reduce(ReduceKind::Max, max, chunk_at, "overall");
    let overall_b = out.broadcast_skipping(overall, max, &[chunk_at]);
    let from_top = out.binary(BinaryOp::Sub, max, overall_b, "from_top");
    let scale = out.exp(from_top, "scale");
    let scale_b = out.broadcast_skipping(scale, weighted, &[last]);
    let scaled = out.binary(BinaryOp::Mul, weighted, scale_b, "scaled");
    let numerator = out.reduce(ReduceKind::Sum, scaled, chunk_at, "numerator");
    let scaled_sum = out.binary(BinaryOp::Mul, sum, scale, "scaled_sum");
    let denominator = out.reduce(ReduceKind::Sum, scaled_sum, chunk_at, "denominator");
    // At least 1 for a row that sees a slot (its top chunk's sum holds `exp(0)`); 0 for one that
    // sees none, whose numerator is 0 too: 0, not NaN.
    let least = out.push(
        Op::Constant { literal: Literal::Splat(f32::MIN_POSITIVE as f64) },
        Some(out.ty(denominator)),
        "denominator.least",
    );
    let denominator = out.binary(BinaryOp::Max, denominator, least, "denominator.positive");
    let denominator_b = out.broadcast_skipping(denominator, numerator, &[last - 1]);
    let out_ty = out.ty(result);
    let divide = Op::Binary { op: BinaryOp::Div, lhs: numerator, rhs: denominator_b };
    let last_op = match out_ty.dtype {
        DType::F32 => divide,
        _ => Op::Convert { x: out.push(divide, None, "combined") },
    };
    out.body.push(Instr { result, op: last_op });
    std::mem::take(&mut out.body)
}
