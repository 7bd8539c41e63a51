//! What a kernel computes, read off its function.

use g4c_ir::plan::{KernelKind, MATVEC_MAX_ROWS};
use g4c_ir::{BinaryOp, DType, DotDims, Function, Op, ReduceKind, TensorType, UnaryOp, ValueId};
use std::collections::HashMap;

/// The kind of a kernel: its cache write, else its chunk of attention, else its matrix product,
/// else its reduction or gather.
pub(crate) fn classify(k: &Function) -> KernelKind {
    let def = |v: ValueId| k.body.iter().find(|i| i.result == v).map(|i| &i.op);
    let root = k.results[0].value;
    if let Some(Op::UpdateSlots { .. }) = def(root) {
        return KernelKind::Scatter;
    }
    if attention_of(k).is_some() {
        return KernelKind::Attention;
    }
    for instr in &k.body {
        let Op::DotGeneral { lhs, rhs, dims } = &instr.op else { continue };
        let (activation, weight, contract) = match (weight_of(k, *lhs), weight_of(k, *rhs)) {
            (None, Some(w)) => (*lhs, w, &dims.lhs_contract),
            (Some(w), None) => (*rhs, w, &dims.rhs_contract),
            // A decode step's attention scores over a cache: a matvec streaming the cache.
            _ if matvec_of(k).is_some_and(|m| m.rows <= MATVEC_MAX_ROWS) => return KernelKind::Matvec,
            _ => return KernelKind::Dot,
        };
        let shape = &k.ty(activation).shape;
        let depth: usize = contract.iter().map(|&d| shape[d]).product();
        let rows = k.ty(activation).numel() / depth.max(1);
        return match (weight, rows <= MATVEC_MAX_ROWS) {
            (WeightKind::Int4, true) => KernelKind::MatvecW4,
            (WeightKind::Int4, false) => KernelKind::GemmW4,
            (WeightKind::Plain, true) => KernelKind::Matvec,
            (WeightKind::Plain, false) => KernelKind::Gemm,
        };
    }
    // Reductions its body only reads (in its prelude, or per element) leave a kernel a loop.
    if reduction_of(k).is_some() {
        KernelKind::Reduce
    } else if k.body.iter().any(|i| matches!(i.op, Op::Gather { .. })) {
        KernelKind::Gather
    } else {
        KernelKind::Loop
    }
}

enum WeightKind {
    Int4,
    Plain,
}

/// Whether `v` is computed from weights alone, and whether a 4-bit one.
fn weight_of(k: &Function, v: ValueId) -> Option<WeightKind> {
    let instr = k.body.iter().find(|i| i.result == v)?;
    match &instr.op {
        Op::Weight { .. } => Some(WeightKind::Plain),
        Op::Dequantize { q, .. } if k.ty(*q).dtype == DType::I4 => weight_of(k, *q).map(|_| WeightKind::Int4),
        Op::Convert { x } | Op::Reshape { x } => weight_of(k, *x),
        Op::Transpose { input, .. } => weight_of(k, *input),
        _ => None,
    }
}

/// Matrix products the matvec template computes: `out_j[r, n] = Σ_k lhs[r, k] · w_j[n, k]` for one
/// or more matrices `w_j` of the same `[N, K]` shape read with the same activation (GELU(gate)·up
/// reads both projections), the activation's rows and the matrices' rows contiguous in `k`, and the
/// root an elementwise function of the products at the same element (an epilogue). A matrix is a
/// weight, or an input of the kernel: a decode step's attention scores are a matvec of the queries
/// of every head (the rows) with a layer's key cache, which each warp then reads once for all of
/// them (multi-query attention shares one cache between the heads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matvec {
    /// Each `dot_general` of the kernel's function, and the matrix it reads.
    pub dots: Vec<(ValueId, ValueId)>,
    pub lhs: ValueId,
    pub rows: usize,
    pub cols: usize,
    pub depth: usize,
}

/// The matvec of a kernel, when the template applies: no batch dimensions but of size 1 (so the
/// product is laid out as `[rows, N]`), one activation contracted on its last dimension, matrices
/// `[1.., N, K]` of one shape contracted on their last, and every path from a product to the root
/// through ops that keep the element's linear index.
pub fn matvec_of(k: &Function) -> Option<Matvec> {
    let mut dots = Vec::new();
    let mut lhs_of = None;
    let is_input = |v: ValueId| k.params.iter().any(|p| p.value == v);
    for instr in k.body.iter().filter(|i| matches!(i.op, Op::DotGeneral { .. })) {
        let Op::DotGeneral { lhs, rhs, dims } = &instr.op else { unreachable!() };
        let rt = k.ty(*rhs);
        let fits = matvec_shaped(k.ty(*lhs), rt, dims)
            && weight_of(k, *lhs).is_none()
            && (weight_of(k, *rhs).is_some() || is_input(*rhs))
            && *lhs_of.get_or_insert(*lhs) == *lhs
            && dots.first().is_none_or(|&(_, w): &(ValueId, ValueId)| k.ty(w) == rt);
        if !fits || !keeps_index_to_root(k, instr.result) {
            return None;
        }
        dots.push((instr.result, *rhs));
    }
    let (lhs, &(_, w)) = (lhs_of?, dots.first()?);
    let shape = &k.ty(w).shape;
    let (cols, depth) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    Some(Matvec { dots, lhs, rows: k.ty(lhs).numel() / depth, cols, depth })
}

/// Whether a product of `lhs` and `rhs` has the matvec template's shape: batch dimensions of size
/// 1, a matrix `rhs` `[1.., N, K]`, both contracted on their last dimension. Fusion reads it too: such
/// a product stages its activation once per block, not once per element of the other side.
pub(crate) fn matvec_shaped(lt: &TensorType, rt: &TensorType, dims: &DotDims) -> bool {
    let last_of = |rank: usize, contract: &[usize]| contract == [rank - 1];
    let unit = |shape: &[usize], axes: &[usize]| axes.iter().all(|&d| shape[d] == 1);
    let matrix = rt.rank() >= 2 && rt.shape[..rt.rank() - 2].iter().all(|&d| d == 1);
    unit(&lt.shape, &dims.lhs_batch)
        && unit(&rt.shape, &dims.rhs_batch)
        && matrix
        && last_of(lt.rank(), &dims.lhs_contract)
        && last_of(rt.rank(), &dims.rhs_contract)
}

/// Whether a product of some `lhs` and `rhs` contracts `rhs` along a strided axis with whole warps of
/// its free elements: the reducing template (`WarpsPerExtent`) then gives a warp's 32 lanes 32
/// adjacent outputs along `rhs`'s free axes, which all read the same `lhs` element at each step
/// (attention's weighted sum of values: the lanes are 32 features of one head, reading one
/// probability). Fusion reads it: an `lhs` computed inside is computed once per warp and step.
pub(crate) fn lhs_warp_uniform(rt: &TensorType, dims: &DotDims) -> bool {
    let strided = dims.rhs_contract != [rt.rank() - 1];
    let free: usize = dims.rhs_free(rt.rank()).iter().map(|&d| rt.shape[d]).product();
    strided && free.is_multiple_of(32)
}

/// A reduction the reducing templates compute: the root an elementwise function (an epilogue) of
/// one `reduce` or `dot_general` at the same element; each of its `outputs` elements combines
/// `extent` inputs, which lie along a contiguous row of each operand (`contiguous`: a reduce over
/// innermost axes, a product contracting both operands' innermost axis: norm statistics, attention
/// scores) or not (attention's weighted sum of values over cache slots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub reduction: ValueId,
    pub outputs: usize,
    pub extent: usize,
    pub contiguous: bool,
}

/// The reduction of a kernel, when the templates apply: exactly one reduce or product reaches the
/// root keeping its element's index (reductions it only reads are computed in its prelude, or per
/// element that reads them).
/// Float or integer: the kernels accumulate in `float` or `int`, 4 bytes either way.
pub fn reduction_of(k: &Function) -> Option<Reduction> {
    let mut to_root = k
        .body
        .iter()
        .filter(|i| matches!(i.op, Op::Reduce { .. } | Op::DotGeneral { .. }) && keeps_index_to_root(k, i.result));
    let (Some(instr), None) = (to_root.next(), to_root.next()) else { return None };
    let innermost = |rank: usize, axes: &[usize]| {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        axes.iter().copied().eq(rank - axes.len()..rank)
    };
    let (extent, contiguous) = match &instr.op {
        Op::Reduce { input, axes, .. } => {
            let it = k.ty(*input);
            (axes.iter().map(|&a| it.shape[a]).product(), innermost(it.rank(), axes))
        }
        Op::DotGeneral { lhs, rhs, dims } => {
            let (lt, rt) = (k.ty(*lhs), k.ty(*rhs));
            let extent = dims.lhs_contract.iter().map(|&d| lt.shape[d]).product();
            let one_axis = dims.lhs_contract.len() == 1;
            (extent, one_axis && innermost(lt.rank(), &dims.lhs_contract) && innermost(rt.rank(), &dims.rhs_contract))
        }
        _ => unreachable!("filtered"),
    };
    Some(Reduction { reduction: instr.result, outputs: k.ty(instr.result).numel(), extent, contiguous })
}

/// Whether every use of `v`, and of each value computed from it, up to the root, reads it at the
/// reader's own linear index (elementwise ops and reshapes).
fn keeps_index_to_root(k: &Function, v: ValueId) -> bool {
    keeps_index_to(k, v, k.results[0].value)
}

/// Whether every use of `v`, and of each value computed from it, up to `to`, reads it at the
/// reader's own linear index.
fn keeps_index_to(k: &Function, v: ValueId, to: ValueId) -> bool {
    if v == to {
        return true;
    }
    let users: Vec<&g4c_ir::Instr> = k.body.iter().filter(|i| i.op.operands().contains(&v)).collect();
    !users.is_empty()
        && users.iter().all(|u| {
            let aligned = matches!(
                u.op,
                Op::Unary { .. }
                    | Op::Binary { .. }
                    | Op::Compare { .. }
                    | Op::Select { .. }
                    | Op::Convert { .. }
                    | Op::Reshape { .. }
            ) && k.ty(u.result).numel() == k.ty(v).numel();
            aligned && keeps_index_to(k, u.result, to)
        })
}

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
    let scores = scores_matvec(f, &op, *chunked)?;
    let ct = f.ty(*chunked);
    let (chunks, slots) = (ct.shape[rank - 2], ct.shape[rank - 1]);
    let heads = ct.numel() / (chunks * slots);
    let features = *f.ty(weighted).shape.last()?;
    (heads == scores.rows).then(|| Attention {
        scores,
        chunked: *chunked,
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

/// The product of queries and keys the scores in chunks are computed from: `chunked` the scores
/// `[.., N]` padded or not along their last axis with constants, that axis split into chunks, and
/// the scores reading the product index for index (the mask and other operands aside).
fn scores_matvec<'f>(f: &'f Function, op: &dyn Fn(ValueId) -> Option<&'f Op>, chunked: ValueId) -> Option<Matvec> {
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
    (split_last && keeps_index_to(f, m.dots[0].0, scores)).then_some(m)
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

/// The reductions a kernel's template computes (the others are computed in its prelude, or per
/// element reading them): an attention chunk's maximum and sum, or the one reduction reaching
/// its root.
pub fn own_reductions(k: &Function) -> Vec<ValueId> {
    match attention_of(k) {
        Some(a) => vec![a.max, a.sum],
        None => reduction_of(k).map(|r| r.reduction).into_iter().collect(),
    }
}
