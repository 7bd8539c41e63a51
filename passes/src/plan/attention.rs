//! A decode step's attention over a chunk of cache slots per block, read off a kernel's function
//! (or an entry point's, for fusion): the IR `split-attention` writes, and the layouts its
//! template assumes.

use super::kind::{keeps_index_to, matvec_shaped, weight_of, Matvec};
use super::mask::mask_of;
use g4c_ir::plan::MATVEC_MAX_ROWS;
use g4c_ir::{BinaryOp, DotDims, Function, Op, ReduceKind, UnaryOp, ValueId};
use std::collections::HashMap;

/// A decode step's attention over one chunk of cache slots per block, as `split-attention` writes
/// it: the root `concat(A, m', l')` along its last axis, of the chunks' weighted sums of values
/// `A = dot(convert?(e), values)` (the chunk axis a batch axis), with `e = exp(S - m)`, `m` and `l`
/// the maximum of `S` and the sum of `e` over each chunk's slots (the last axis of the scores in
/// chunks `S`, `[heads.., C, L]`), `m'` and `l'` them laid out as `[.., C, heads.., 1]`; and `S`,
/// up to padding and the reshape into chunks, computed index for index from one matvec-shaped
/// product of the queries (the rows, staged) and the key cache (the scores).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attention {
    /// The scores' product: queries by key cache, `cols` the real slots.
    pub scores: Matvec,
    /// The scores in chunks, `S`.
    pub chunked: ValueId,
    /// The mask the scores are selected by, `[heads.., N]` as they are before padding: where it is
    /// false a score is a constant, whatever the product, so that slot's key need not be read.
    pub visible: Option<ValueId>,
    /// The maximum of each chunk's scores, as reduced (before any clamp).
    pub max: ValueId,
    pub exp: ValueId,
    pub sum: ValueId,
    /// The chunks' weighted sums of values, `A`: the product of `probs` and `values` by `dims`.
    pub weighted: ValueId,
    pub probs: ValueId,
    pub values: ValueId,
    pub dims: DotDims,
    pub chunks: usize,
    /// Slots per chunk, `L`.
    pub slots: usize,
    pub heads: usize,
    /// Elements of each value row.
    pub features: usize,
}

/// The attention chunk kernel `k` computes, when the template applies: its key cache is one of its
/// inputs.
pub fn attention_of(k: &Function) -> Option<Attention> {
    let def: HashMap<ValueId, usize> = k.body.iter().enumerate().map(|(i, x)| (x.result, i)).collect();
    let a = attention_at(k, &def, k.results[0].value)?;
    let keys = a.scores.dots[0].1;
    k.params.iter().any(|p| p.value == keys).then_some(a)
}

/// The attention chunk whose results are `root`, in a function whose instructions `def` indexes.
pub(crate) fn attention_at(f: &Function, def: &HashMap<ValueId, usize>, root: ValueId) -> Option<Attention> {
    let op = |v: ValueId| def.get(&v).map(|&i| &f.body[i].op);
    let Op::Concat { inputs, axis } = op(root)? else { return None };
    let &[weighted, max_column, sum_column] = &inputs[..] else { return None };
    let Op::DotGeneral { lhs: probs, rhs: values, dims } = op(weighted)? else { return None };
    let exp = match op(*probs)? {
        Op::Convert { x } => *x,
        _ => *probs,
    };
    let Op::Unary { op: UnaryOp::Exp, x } = op(exp)? else { return None };
    let Op::Binary { op: BinaryOp::Sub, lhs: chunked, rhs: max_b } = op(*x)? else { return None };
    let Op::Broadcast { input: shift, .. } = op(*max_b)? else { return None };
    // The maximum the exponentials are taken from: clamped to a finite value, or not.
    let max = match op(*shift)? {
        Op::Binary { op: BinaryOp::Max, lhs, rhs } if matches!(op(*rhs), Some(Op::Constant { .. })) => *lhs,
        _ => *shift,
    };
    let rank = f.ty(*chunked).rank();
    let reduces = |v: ValueId, kind: ReduceKind, of: ValueId| matches!(op(v), Some(Op::Reduce { input, kind: k, axes }) if *input == of && *k == kind && axes[..] == [rank - 1]);
    let sum = column_of(f, &op, sum_column, *axis, rank)?;
    let laid_out = *axis + 1 == f.ty(root).rank()
        && column_of(f, &op, max_column, *axis, rank) == Some(*shift)
        && reduces(max, ReduceKind::Max, *chunked)
        && reduces(sum, ReduceKind::Sum, exp)
        && dims.lhs_contract == [rank - 1]
        && chunk_axis_of(dims, rank).is_some()
        && f.ty(weighted).shape[..*axis] == f.ty(root).shape[..*axis];
    if !laid_out {
        return None;
    }
    let (scores, unpadded) = scores_matvec(f, &op, *chunked)?;
    let visible = mask_of(f, &op, unpadded, scores.dots[0].0);
    let ct = f.ty(*chunked);
    let (chunks, slots) = (ct.shape[rank - 2], ct.shape[rank - 1]);
    let heads = ct.numel() / (chunks * slots);
    let features = *f.ty(weighted).shape.last()?;
    (heads == scores.rows).then(|| Attention {
        scores,
        chunked: *chunked,
        visible,
        max,
        exp,
        sum,
        weighted,
        probs: *probs,
        values: *values,
        dims: dims.clone(),
        chunks,
        slots,
        heads,
        features,
    })
}

/// Where the chunk axis (`rank - 2` of the scores in chunks, a batch axis of the weighted sums'
/// product) lies among the product's batch axes, so in the weighted sums and the results.
pub fn chunk_axis_of(dims: &DotDims, rank: usize) -> Option<usize> {
    dims.lhs_batch.iter().position(|&d| d == rank - 2)
}

/// The per-chunk value `[heads.., C]` that `column` (`[.., C, heads.., 1]`, laid out as the
/// weighted sums along `axis`) is, through reshapes and transposes, when each of its elements
/// reads that value at the same chunk and head: what the template, which holds a block's chunk
/// only, assumes.
fn column_of<'f>(
    f: &'f Function,
    op: &dyn Fn(ValueId) -> Option<&'f Op>,
    column: ValueId,
    axis: usize,
    rank: usize,
) -> Option<ValueId> {
    let mut chain = Vec::new();
    let mut v = column;
    while let Some(o @ (Op::Reshape { x: inner } | Op::Transpose { input: inner, .. })) = op(v) {
        chain.push((o, v));
        v = *inner;
    }
    // Follow every element of the column down the chain and compare its chunk and head. (Batch
    // axes are of size 1: the column's elements are its chunks' heads in order.)
    let (ct, vt) = (f.ty(column), f.ty(v));
    if vt.rank() != rank - 1 || ct.numel() != vt.numel() || ct.shape[axis] != 1 {
        return None;
    }
    for lin in 0..ct.numel() {
        let mut idx = unflatten(lin, &ct.shape);
        for &(o, at) in &chain {
            idx = match o {
                Op::Reshape { x } => unflatten(flatten(&idx, &f.ty(at).shape), &f.ty(*x).shape),
                Op::Transpose { perm, .. } => {
                    let mut input = vec![0; perm.len()];
                    perm.iter().zip(&idx).for_each(|(&p, &i)| input[p] = i);
                    input
                }
                _ => unreachable!("the chain holds reshapes and transposes"),
            };
        }
        // The column's element `lin` of chunk `c` and head `h` (in order) must read `[h.., c]`.
        let per_chunk = ct.numel() / vt.shape[rank - 2];
        let (c, h) = (lin / per_chunk, lin % per_chunk);
        let want = {
            let mut w = unflatten(h, &vt.shape[..rank - 2]);
            w.push(c);
            w
        };
        if idx != want {
            return None;
        }
    }
    Some(v)
}

fn flatten(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |lin, (&i, &d)| lin * d + i)
}

fn unflatten(mut lin: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        idx[i] = lin % d.max(1);
        lin /= d.max(1);
    }
    idx
}

/// The product of queries and keys the scores in chunks are computed from, and the scores before
/// padding: `chunked` the scores `[.., N]` padded or not along their last axis with constants, that
/// axis split into chunks, and the scores reading the product index for index (the mask and other
/// operands aside).
fn scores_matvec<'f>(
    f: &'f Function,
    op: &dyn Fn(ValueId) -> Option<&'f Op>,
    chunked: ValueId,
) -> Option<(Matvec, ValueId)> {
    let Op::Reshape { x } = op(chunked)? else { return None };
    let last = f.ty(*x).rank() - 1;
    let scores = match op(*x)? {
        Op::Concat { inputs, axis } if *axis == last => {
            let constants = inputs[1..].iter().all(|&p| matches!(op(p), Some(Op::Constant { .. })));
            constants.then_some(inputs[0])?
        }
        _ => *x,
    };
    let (padded, ct) = (f.ty(*x), f.ty(chunked));
    let split_last = ct.rank() == padded.rank() + 1
        && ct.shape[..last] == padded.shape[..last]
        && ct.shape[last] * ct.shape[last + 1] == padded.shape[last];
    let m = scores_product(f, op, scores)?;
    (split_last && keeps_index_to(f, m.dots[0].0, scores)).then_some((m, scores))
}

/// The one product of queries and keys that `scores` is computed from through ops other than
/// reductions and gathers (a mask aside), when it is matvec-shaped: the scores' matvec, `cols` the
/// cache's slots, `depth` the queries'. Whether `scores` reads it index for index is the caller's
/// to check.
pub(crate) fn scores_product<'f>(
    f: &'f Function,
    op: &dyn Fn(ValueId) -> Option<&'f Op>,
    scores: ValueId,
) -> Option<Matvec> {
    let (mut products, mut stack, mut seen) = (Vec::new(), vec![scores], std::collections::BTreeSet::new());
    while let Some(v) = stack.pop() {
        match op(v) {
            _ if !seen.insert(v) => {}
            Some(Op::DotGeneral { .. }) => products.push(v),
            Some(o) if !matches!(o, Op::Reduce { .. } | Op::Gather { .. }) => stack.extend(o.operands()),
            _ => {}
        }
    }
    let &[product] = &products[..] else { return None };
    let Op::DotGeneral { lhs, rhs, dims } = op(product)? else { return None };
    let (lt, rt) = (f.ty(*lhs), f.ty(*rhs));
    let depth = *rt.shape.last()?;
    let rows = lt.numel() / depth.max(1);
    let fits = matvec_shaped(lt, rt, dims) && rows <= MATVEC_MAX_ROWS && weight_of(f, *lhs).is_none();
    fits.then(|| Matvec { dots: vec![(product, *rhs)], lhs: *lhs, rows, cols: rt.shape[rt.rank() - 2], depth })
}
