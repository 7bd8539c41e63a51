//! What a kernel computes, read off its function.

use super::attention::attention_of;
use super::mask::mask_of;
use g4c_ir::plan::{KernelKind, MATVEC_MAX_ROWS};
use g4c_ir::{DType, DotDims, Function, Op, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

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

pub(crate) enum WeightKind {
    Int4,
    Plain,
}

/// Whether `v` is computed from weights alone, and whether a 4-bit one.
pub(crate) fn weight_of(k: &Function, v: ValueId) -> Option<WeightKind> {
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

/// A matvec weight that is `dequantize(q, scale)` of a 4-bit weight `q` `[N, K]` whose rows and
/// scale groups span whole 32-bit words (8 values): a thread then reads 8 consecutive values with
/// one 32-bit load and one scale, where reading value by value costs a byte load, a scale load and
/// the unpacking per value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedWeight {
    /// The 4-bit weight's name.
    pub q: String,
    pub scale: ValueId,
    /// Values per scale.
    pub group: usize,
    /// The dequantized values' type.
    pub dtype: DType,
}

impl PackedWeight {
    pub fn of(k: &Function, w: ValueId) -> Option<PackedWeight> {
        let def = |v: ValueId| k.body.iter().find(|i| i.result == v).map(|i| &i.op);
        let Some(&Op::Dequantize { q, scale, group }) = def(w) else { return None };
        let Some(Op::Weight { name }) = def(q) else { return None };
        let (qt, wt) = (k.ty(q), k.ty(w));
        let whole_words = wt.rank() == 2 && wt.shape[1] % 8 == 0 && group % 8 == 0;
        (qt.dtype == DType::I4 && qt.shape == wt.shape && whole_words).then(|| PackedWeight {
            q: name.clone(),
            scale,
            group,
            dtype: wt.dtype,
        })
    }

    /// Every weight of matvec `m`, when all are packed.
    pub fn all_of(k: &Function, m: &Matvec) -> Option<Vec<PackedWeight>> {
        m.dots.iter().map(|&(_, w)| PackedWeight::of(k, w)).collect()
    }
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
    /// The mask the root is selected by, shaped as the reduction: where it is false the result is
    /// a constant, whatever the reduction, whose inputs need not be read there (the prefill's
    /// attention scores of slots a query does not see).
    pub visible: Option<ValueId>,
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
    let op = |v: ValueId| k.body.iter().find(|i| i.result == v).map(|i| &i.op);
    let visible =
        mask_of(k, &op, k.results[0].value, instr.result).filter(|&mask| k.ty(mask).shape == k.ty(instr.result).shape);
    Some(Reduction { reduction: instr.result, outputs: k.ty(instr.result).numel(), extent, contiguous, visible })
}

/// Whether every use of `v`, and of each value computed from it, up to the root, reads it at the
/// reader's own linear index (elementwise ops and reshapes).
fn keeps_index_to_root(k: &Function, v: ValueId) -> bool {
    keeps_index_to(k, v, k.results[0].value)
}

/// Whether every use of `v`, and of each value computed from it, up to `to`, reads it at the
/// reader's own linear index.
pub(crate) fn keeps_index_to(k: &Function, v: ValueId, to: ValueId) -> bool {
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

/// The reductions a kernel's template computes (the others are computed in its prelude, or per
/// element reading them): an attention chunk's maximum and sum, or the one reduction reaching
/// its root.
pub fn own_reductions(k: &Function) -> Vec<ValueId> {
    match attention_of(k) {
        Some(a) => vec![a.max, a.sum],
        None => reduction_of(k).map(|r| r.reduction).into_iter().collect(),
    }
}

/// For a product whose output is `[batch.., rows.., cols..]` (the left side's free axes, then the
/// right side's), several rows, and whole warps of columns: (rows, cols), per batch element. A
/// `WarpsPerExtent` block of such a product reads one row of the left side (`staged`).
pub fn rows_sharing_rhs(k: &Function, op: &Op) -> Option<(usize, usize)> {
    let Op::DotGeneral { lhs, rhs, dims } = op else { return None };
    let (lt, rt) = (k.ty(*lhs), k.ty(*rhs));
    let rows: usize = dims.lhs_free(lt.rank()).iter().map(|&d| lt.shape[d]).product();
    let cols: usize = dims.rhs_free(rt.rank()).iter().map(|&d| rt.shape[d]).product();
    (rows > 1 && cols.is_multiple_of(32)).then_some((rows, cols))
}

/// The memory reads computing one element of `v` in kernel `k` takes: the kernel's inputs and
/// weights it is computed from (each read once per element).
pub fn reads_per_element(k: &Function, v: ValueId) -> u32 {
    let def: HashMap<ValueId, &Op> = k.body.iter().map(|i| (i.result, &i.op)).collect();
    let (mut stack, mut seen, mut reads) = (vec![v], HashSet::new(), 0);
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        match def.get(&v) {
            None | Some(Op::Weight { .. }) => reads += 1,
            Some(op) => stack.extend(op.operands()),
        }
    }
    reads
}
