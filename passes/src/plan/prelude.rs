//! Preludes: the small reductions a kernel reads (a norm's statistics, a softmax's maximum and
//! sum), computed by each of its blocks into shared memory before the kernel's body.
//!
//! Fusion gives such a reduction a kernel of its own, since each of its elements is read many
//! times. In a decode step that kernel reduces one row of 1536 values, or eight heads of a few
//! hundred: it is a launch, a dependency and a round trip through memory, far more than the work.
//! `merge` moves it into the prelude of every kernel that reads it, whose blocks recompute it from
//! values they mostly read anyway (a matvec stages the whole normalized row), as long as what all
//! those blocks recompute stays within budget: E2B's decode step goes from 801 kernels to 544. A
//! block reading one output of each reduction (a head's probabilities) computes that one alone
//! (`staged_row_of`, `element_row_of`).

use super::fusion::Group;
use super::kernel_function;
use super::kind::{classify, own_reductions, reduction_of, rows_sharing_rhs};
use super::launch::{launch, smem_limit};
use g4c_ir::plan::{KernelKind, Prelude, ReduceSplit};
use g4c_ir::{DType, Function, GpuLimits, Instr, Op, ValueId};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A prelude reduction has at most this many outputs, all of which each block holds.
const MAX_OUTPUTS: usize = 256;
/// Input elements one block's prelude may reduce (each reduction's outputs × extent, summed).
const BLOCK_WORK_LIMIT: usize = 16384;
/// Input elements the blocks of a reduction's readers may reduce again in their preludes, in place
/// of its one kernel, per SM of the target. The blocks on one SM read the same few kilobytes, from
/// L1 after the first, so the cost is the SM's arithmetic: 48K elements at a few ops each take an
/// SM about the 1–2 µs a dependent launch costs (Turing's 64 FP32 lanes at 1.6 GHz, Hopper's 128
/// at 1.8 GHz). E2B on t4g (40 SMs) then kept the norms its 12288-wide gate/up projections read
/// (1536 blocks each) as kernels, which h200 (132 SMs) recomputed; with their blocks striding over
/// the columns (77 and 256 blocks, `Tile::strided`), both recompute them. A guess until
/// `scripts/device-check` measures it.
const WORK_PER_SM_LIMIT: usize = 48 * 1024;

/// A reduction of a kernel computed in its prelude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreludeReduction {
    pub reduction: ValueId,
    pub outputs: usize,
    /// Input elements each output combines.
    pub extent: usize,
}

/// The reductions of kernel `k` its prelude computes, in body order (so one may read another):
/// every `reduce` but those the kernel's template computes (`own_reductions`), when small enough
/// to hold in shared memory, of floats or ints. Another is computed at each element that reads it.
pub fn prelude_of(k: &Function) -> Vec<PreludeReduction> {
    let own = own_reductions(k);
    k.body
        .iter()
        .filter(|i| !own.contains(&i.result))
        .filter_map(|i| match &i.op {
            Op::Reduce { input, axes, .. } => Some(PreludeReduction {
                reduction: i.result,
                outputs: k.ty(i.result).numel(),
                extent: axes.iter().map(|&a| k.ty(*input).shape[a]).product(),
            }),
            _ => None,
        })
        // Shared arrays of 4-byte `float` or `int` (`prelude_footprint`).
        .filter(|p| p.outputs <= MAX_OUTPUTS && k.ty(p.reduction).dtype != DType::Bool)
        .collect()
}

impl PreludeReduction {
    /// Whether the whole block computes each output, its warps' results combined through shared
    /// memory (fewer outputs than warps), rather than a warp each.
    pub fn block_per_output(&self, block: u32) -> bool {
        self.outputs < block as usize / 32
    }
}

/// The launch's account of a prelude computing `reductions` in blocks of `block` threads, each
/// block one output of each (`one_row`, the whole block on it) or all of them.
pub fn prelude_launch(reductions: &[PreludeReduction], block: u32, one_row: bool) -> Option<Prelude> {
    (!reductions.is_empty()).then(|| Prelude {
        reductions: reductions.len() as u32,
        outputs: reductions.iter().map(|r| r.outputs as u32).sum(),
        block_combined: reductions.iter().filter(|r| one_row || r.block_per_output(block)).count() as u32,
        one_row,
    })
}

/// The row of its product's left-hand side that each block of `k`, split as `split`, stages, where
/// that row's index is the index of the one output of each prelude reduction the block reads, so
/// that it need compute that one alone (`Prelude::one_row`): a `WarpsPerExtent` block over
/// `rows_sharing_rhs`, whose `(rows, cols)` it returns. The left-hand side is `[rows..,
/// contracted..]` (its batch and free axes leading, in order) and reaches the reductions as
/// `reads_one_row` says. A decode step's weighted sum of values, whose block reads one head's
/// probabilities, computes that head's softmax maximum and sum alone.
pub fn staged_row_of(k: &Function, split: ReduceSplit) -> Option<(usize, usize)> {
    let ReduceSplit::WarpsPerExtent { staged } = split else { return None };
    let own = reduction_of(k)?;
    let op = &k.body.iter().find(|i| i.result == own.reduction)?.op;
    let Op::DotGeneral { lhs, rhs, dims } = op else { return None };
    let shape = &k.ty(*lhs).shape;
    let rows = shape.len() - dims.lhs_contract.len();
    let leading = dims.lhs_batch.iter().chain(&dims.lhs_free(shape.len())).copied().eq(0..rows);
    // The product reads the rows on its left-hand side alone.
    let into_product = |user: &Instr, v: ValueId| user.result == own.reduction && *lhs == v && *rhs != v;
    let one_row = staged > 0 && leading && reads_one_row(k, shape, rows, into_product);
    one_row.then(|| rows_sharing_rhs(k, op)).flatten()
}

/// The elements of a row of `k`'s root, where `k` runs a thread per element of its root and each
/// block's threads lie in one row whose index is the index of the one output of each prelude
/// reduction the block reads (`Prelude::one_row`): the root is `[rows.., row..]`, the row's elements
/// a multiple of the block's, and it is computed from the reductions as `reads_one_row` says. A
/// decode step's residual kernel of several sequences, whose block writes 256 features of one
/// sequence, computes that sequence's norm statistics alone.
pub fn element_row_of(k: &Function, block: u32) -> Option<usize> {
    let root = k.results[0].value;
    let shape = &k.ty(root).shape;
    let trailing = k.body.iter().find_map(|i| match &i.op {
        Op::Reduce { axes, .. } if prelude_of(k).iter().any(|p| p.reduction == i.result) => Some(axes.len()),
        _ => None,
    })?;
    let rows = shape.len().checked_sub(trailing)?;
    let len: usize = shape[rows..].iter().product();
    let one_row = len.is_multiple_of(block as usize) && reads_one_row(k, shape, rows, |_, _| false);
    one_row.then_some(len)
}

/// Whether every reduction of `k`'s prelude reduces a value of `shape` over its axes after the
/// first `rows`, and whatever is computed from a reduction is computed element for element, of a
/// row (elementwise ops of the reductions' shape) or of `shape` (those broadcast along the reduced
/// axes, elementwise ops), up to another reduction of the prelude, the kernel's root, or a use
/// `ends` accepts: so an element of `shape` reads each reduction at the index of its first `rows`
/// axes, its row.
fn reads_one_row(k: &Function, shape: &[usize], rows: usize, ends: impl Fn(&Instr, ValueId) -> bool) -> bool {
    let prelude = prelude_of(k);
    let reductions: HashSet<ValueId> = prelude.iter().map(|p| p.reduction).collect();
    let of_rows = k.body.iter().filter(|i| reductions.contains(&i.result)).all(|i| match &i.op {
        Op::Reduce { input, axes, .. } => k.ty(*input).shape == shape && axes.iter().copied().eq(rows..shape.len()),
        _ => false,
    });
    if prelude.is_empty() || !of_rows {
        return false;
    }
    let (mut stack, mut seen) = (reductions.iter().copied().collect::<Vec<_>>(), HashSet::new());
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        for user in k.body.iter().filter(|i| i.op.operands().contains(&v)) {
            if ends(user, v) {
                continue;
            }
            // An element of `shape`, or of a row (a reduction's statistic, its reciprocal root).
            let (elementwise, of_row) = (k.ty(user.result).shape == shape, k.ty(user.result).shape == shape[..rows]);
            let row_preserving = match &user.op {
                Op::Broadcast { input, dims } => {
                    k.ty(*input).shape == shape[..rows] && dims.iter().copied().eq(0..rows) && elementwise
                }
                Op::Unary { .. } | Op::Binary { .. } | Op::Compare { .. } | Op::Select { .. } | Op::Convert { .. } => {
                    elementwise || of_row
                }
                Op::Reduce { .. } => reductions.contains(&user.result),
                _ => false,
            };
            if !row_preserving {
                return false;
            }
            stack.push(user.result);
        }
    }
    true
}

/// Shared memory of a prelude in blocks of `block` threads: each reduction's outputs, and a
/// partial result per warp for each one a block combines (4 bytes each: `float` or `int`).
pub fn prelude_footprint(prelude: &Prelude, block: u32) -> u64 {
    (prelude.outputs as u64 + prelude.block_combined as u64 * (block as u64 / 32)) * 4
}

/// Input elements a block of `k`, whose launch has `prelude`, reduces in it.
fn block_work(k: &Function, prelude: Option<Prelude>) -> usize {
    let one_row = prelude.is_some_and(|p| p.one_row);
    prelude_of(k).iter().map(|p| if one_row { p.extent } else { p.outputs * p.extent }).sum()
}

/// Moves each reduction kernel into the prelude of every kernel reading it, where that keeps each
/// reader's template and launch, fits `BLOCK_WORK_LIMIT` and `WORK_PER_SM_LIMIT`, and reads no
/// cache after it was written in place. Later kernels first, so a softmax's sum and then its
/// maximum (which the sum reads) both move into the kernel reading the probabilities.
pub(crate) fn merge(f: &Function, mut groups: Vec<Group>, gpu: &GpuLimits) -> Vec<Group> {
    let def: HashMap<ValueId, usize> = f.body.iter().enumerate().map(|(i, instr)| (instr.result, i)).collect();
    let results: BTreeSet<ValueId> = f.results.iter().map(|r| r.value).collect();
    // Removing group `r` shifts only the later ones, which have been visited.
    for r in (0..groups.len()).rev() {
        let reduction = &groups[r];
        if results.contains(&reduction.root) {
            continue;
        }
        let function = kernel_function(f, reduction, "prelude".into());
        // A reduction kernel holds no product, so its own reduction is a `reduce`.
        let Some(own) = reduction_of(&function) else { continue };
        if classify(&function) != KernelKind::Reduce || own.outputs > MAX_OUTPUTS {
            continue;
        }
        let readers: Vec<usize> =
            (r + 1..groups.len()).filter(|&g| groups[g].inputs.contains(&reduction.root)).collect();
        if merge_into_readers(f, &def, &mut groups, r, &readers, gpu) {
            groups.remove(r);
        }
    }
    groups
}

/// Makes each of `readers` (groups after `producer`, in order) compute group `producer` inside it
/// (`merged_reader`), if each can, no cache that `producer` reads is written in place before the
/// last of them (it would be read new), and what all their blocks then reduce more stays within
/// `WORK_PER_SM_LIMIT`; returns whether it did.
pub(super) fn merge_into_readers(
    f: &Function,
    def: &HashMap<ValueId, usize>,
    groups: &mut [Group],
    producer: usize,
    readers: &[usize],
    gpu: &GpuLimits,
) -> bool {
    let (before, after) = groups.split_at_mut(producer + 1);
    let (producer, after_first) = (&before[producer], producer + 1);
    let Some(&last) = readers.last() else { return false };
    let overwritten = after[..=last - after_first].iter().any(|g| match &f.body[def[&g.root]].op {
        Op::UpdateSlots { operand, .. } => producer.inputs.contains(operand),
        _ => false,
    });
    if overwritten {
        return false;
    }
    let merged: Option<Vec<(Group, usize)>> =
        readers.iter().map(|&g| merged_reader(f, def, &after[g - after_first], producer, gpu)).collect();
    let Some(merged) = merged else { return false };
    if merged.iter().map(|(_, added)| added).sum::<usize>() > WORK_PER_SM_LIMIT * gpu.sm_count as usize {
        return false;
    }
    for (&g, (group, _)) in readers.iter().zip(merged) {
        after[g - after_first] = group;
    }
    true
}

/// `reader` computing `producer`'s kernel inside it (its reductions in the prelude), and the input
/// elements all its blocks then reduce beyond what they did; `None` if that changes its template
/// or launch, or exceeds `BLOCK_WORK_LIMIT` or the target's shared memory.
fn merged_reader(
    f: &Function,
    def: &HashMap<ValueId, usize>,
    reader: &Group,
    producer: &Group,
    gpu: &GpuLimits,
) -> Option<(Group, usize)> {
    let instrs: BTreeSet<usize> = reader.instrs.iter().chain(&producer.instrs).copied().collect();
    let group = Group::collect(f, reader.root, |v| def.get(&v).copied().filter(|i| instrs.contains(i)));
    let (before, after) = (kernel_function(f, reader, "before".into()), kernel_function(f, &group, "after".into()));
    let (kind, own) = (classify(&before), |k: &Function| reduction_of(k).map(|r| (r.outputs, r.extent, r.contiguous)));
    let (old, new) = (launch(&before, kind, gpu), launch(&after, kind, gpu));
    let same_body = classify(&after) == kind
        && own(&before) == own(&after)
        && (old.grid, old.block, old.tile, old.split, old.slots)
            == (new.grid, new.block, new.tile, new.split, new.slots)
        && every_reduction_placed(&after);
    let work = block_work(&after, new.prelude);
    let fits = new.smem_bytes <= smem_limit(&new, gpu) && work <= BLOCK_WORK_LIMIT;
    (same_body && fits).then(|| (group, new.grid as usize * work.saturating_sub(block_work(&before, old.prelude))))
}

/// Whether every reduction of `k` is computed once: by its template or in its prelude.
fn every_reduction_placed(k: &Function) -> bool {
    let own = own_reductions(k);
    let prelude = prelude_of(k);
    k.body
        .iter()
        .filter(|i| matches!(i.op, Op::Reduce { .. }))
        .all(|i| own.contains(&i.result) || prelude.iter().any(|p| p.reduction == i.result))
}
