//! Reductions split over threads (`split_reduce`: a warp or a block per output, or a block's warps
//! over one output's extent), and the prelude: the small reductions a kernel reads, computed once
//! per block into shared memory before its body.

use super::store_root;
use crate::cuda::elemental::{reduce_combine, reduce_init, rounded, unlinear, value_type, Emitter, Index};
use crate::cuda::loops::{batched_loop_of, loads_at_once, reduction_loop, thread_loop, trip_length};
use crate::cuda::shared::SharedArrays;
use crate::cuda::CudaError;
use g4c_ir::plan::{KernelCall, ReduceSplit};
use g4c_ir::{DotDims, Op, ReduceKind, ValueId};
use g4c_passes::{
    element_row_of, prelude_launch, prelude_of, reads_per_element, reduction_of, rows_sharing_rhs, staged_row_of,
};

/// A reduction split over threads: a warp per output (`WarpPerOutput`: its lanes stride the row,
/// shuffles combine their partial results, lane 0 stores; the grid's blocks stride the outputs),
/// a block per output (`BlockPerOutput`: shuffles, then thread 0 combines the warps' results
/// through shared memory), or a lane per output and the block's warps over the extent
/// (`WarpsPerExtent`: warp 0 combines the partial results through shared memory). The storing
/// thread applies the epilogue.
pub(super) fn split_reduce(
    em: &mut Emitter,
    root: ValueId,
    split: ReduceSplit,
    (warps, grid): (u32, u32),
) -> Result<(), CudaError> {
    let unsupported = || CudaError::Unsupported(format!("{}: a split reduction but no reduction", em.k.name));
    let r = reduction_of(em.k).ok_or_else(unsupported)?;
    let op = em.k.body.iter().find(|i| i.result == r.reduction).map(|i| i.op.clone()).ok_or_else(unsupported)?;
    let idx = unlinear("i", &em.k.ty(r.reduction).shape);
    let kind = match &op {
        Op::Reduce { kind, .. } => *kind,
        _ => ReduceKind::Sum,
    };
    let dtype = em.k.ty(r.reduction).dtype;
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    // Rows of the left-hand side whose block's threads stage its elements before its warps multiply.
    let shared_rows = match split {
        ReduceSplit::WarpsPerExtent { staged } => rows_sharing_rhs(em.k, &op).map(|rows| (rows, staged)),
        _ => None,
    };
    let (first, stride) = match split {
        ReduceSplit::WarpPerOutput => {
            // A grid of at most a wave of blocks strides over the outputs: a prefill's attention
            // scores are millions of warps' work, most of them a masked slot's few cycles.
            let blocks = r.outputs.div_ceil(warps as usize);
            em.open(format!("for (int ob = block; ob < {blocks}; ob += {grid})"));
            em.line(format!("const int i = ob * {warps} + warp;"));
            ("lane", 32)
        }
        ReduceSplit::BlockPerOutput => {
            em.line("const int i = block;");
            ("threadIdx.x", warps * 32)
        }
        ReduceSplit::WarpsPerExtent { .. } => {
            match shared_rows.map(|(rows, _)| rows) {
                // Blocks of the rows reading the same 32 columns of the right-hand side (a decode
                // step's query heads, reading the same features of the value cache) run next to
                // each other, so that the later ones may find those columns in L2 rather than
                // read the cache from memory once per head (on t4g, a full-attention layer's
                // value cache is as large as its L2).
                Some((rows, cols)) => {
                    em.line(format!("const int q = block / {rows}, row = {};", staged_row((rows, cols))));
                    em.line(format!("const int i = row * {cols} + (q % {}) * 32 + lane;", cols / 32));
                }
                None => em.line("const int i = block * 32 + lane;"),
            }
            ("warp", warps)
        }
    };
    em.line(format!("{} acc = {};", value_type(dtype), reduce_init(kind, dtype)));
    match (&op, shared_rows) {
        (Op::DotGeneral { lhs, rhs, dims }, Some((_, staged))) => {
            staged_dot(em, (*lhs, *rhs, dims), &idx, (r.outputs, r.extent), (warps * 32, staged))?
        }
        _ => {
            em.open(format!("if (i < {})", r.outputs));
            // Where the root selects a constant whatever the reduction (a slot the query does not
            // see), the warp or block of that output reads none of its inputs. The condition is
            // the same for all the threads sharing the output, so control flow stays uniform.
            let masked = match split {
                ReduceSplit::WarpPerOutput | ReduceSplit::BlockPerOutput => r.visible,
                ReduceSplit::WarpsPerExtent { .. } => None,
            };
            if let Some(mask) = masked {
                let visible = em.value(mask, &idx)?;
                em.open(format!("if ({visible})"));
            }
            let reads = op.operands().iter().map(|&v| reads_per_element(em.k, v)).sum();
            reduction_loop(em, "c", (first, r.extent, stride), loads_at_once(reads), "acc", &mut |em| match &op {
                Op::Reduce { input, kind, axes } => em.reduce_step(*input, *kind, axes, &idx, "c", "acc"),
                Op::DotGeneral { lhs, rhs, dims } => em.dot_step(*lhs, *rhs, dims, &idx, "c", "acc"),
                _ => Err(unsupported()),
            })?;
            if masked.is_some() {
                em.close();
            }
            em.close();
        }
    }
    match split {
        ReduceSplit::WarpPerOutput => {
            // Every lane of every warp shuffles, in or out of range: the warp's control flow stays
            // uniform.
            em.line(format!("acc = warp_{}(acc);", kind.name()));
            em.open(format!("if (lane == 0 && i < {})", r.outputs));
        }
        ReduceSplit::BlockPerOutput => {
            em.line(format!("acc = warp_{}(acc);", kind.name()));
            em.line("if (lane == 0) part[warp] = acc;");
            em.line("__syncthreads();");
            em.open(format!("if (threadIdx.x == 0 && i < {})", r.outputs));
            let step = reduce_combine(kind, "acc", "part[w]");
            em.line(format!("for (int w = 1; w < {warps}; ++w) acc = {step};"));
        }
        ReduceSplit::WarpsPerExtent { .. } => {
            em.line("part[threadIdx.x] = acc;");
            em.line("__syncthreads();");
            em.open(format!("if (warp == 0 && i < {})", r.outputs));
            let step = reduce_combine(kind, "acc", "part[w * 32 + lane]");
            em.line(format!("for (int w = 1; w < {warps}; ++w) acc = {step};"));
        }
    }
    store_root(em, &[(r.reduction, "acc".into())], root)?;
    em.close();
    if split == ReduceSplit::WarpPerOutput {
        em.close();
    }
    Ok(())
}

/// The products of a block whose threads' outputs share one row of the left-hand side (a head's
/// probabilities), its warps splitting the `extent` contracted elements: per `staged` of them (the
/// plan's, a multiple of the block's `threads`), the block computes that row's elements into
/// `part` (a few a thread, at once), then each warp multiplies its elements of the chunk by the
/// right-hand side's. So each element of the row is computed once per block, not once per warp
/// and iteration, and the warps' loop reads shared memory and the right-hand side alone, whose
/// loads it then issues together (computing a softmax's probability in the loop, a division's slow
/// path kept every iteration waiting for its load). A sliding layer's 639 slots are one chunk of
/// 768: in chunks of the block's 256, each of three waited out a score load, a barrier and a value
/// load. Each warp takes the same elements in the same order as without the staging, and skips a
/// chunk whose staged elements are all 0.
fn staged_dot(
    em: &mut Emitter,
    (lhs, rhs, dims): (ValueId, ValueId, &DotDims),
    idx: &Index,
    (outputs, extent): (usize, usize),
    (threads, staged): (u32, u32),
) -> Result<(), CudaError> {
    if staged == 0 || !staged.is_multiple_of(threads) {
        return Err(CudaError::Unsupported(format!("{}: {staged} staged elements for {threads} threads", em.k.name)));
    }
    em.open(format!("for (int chunk = 0; chunk < {extent}; chunk += {staged})"));
    em.line("bool nonzero = false;");
    thread_loop(em, "s", ("threadIdx.x", staged as usize, threads), staged / threads, &mut |em| {
        em.line("const int cs = chunk + s;");
        if !extent.is_multiple_of(staged as usize) {
            em.line("part[s] = 0.f;");
        }
        em.open(format!("if (i < {outputs} && cs < {extent})"));
        let (li, _) = em.dot_operands_at(lhs, rhs, dims, idx, "cs");
        let a = em.value(lhs, &li)?;
        em.line(format!("part[s] = {a};"));
        em.line(format!("nonzero = nonzero || {a} != 0.f;"));
        em.close();
        Ok(())
    })?;
    // A chunk of zeros (the probabilities of slots no query sees) adds nothing, its right-hand
    // side being finite (values in a cache): the block reads none of it. The vote is a barrier,
    // taken by every thread.
    em.open(format!("if (__syncthreads_or(nonzero) && i < {outputs})"));
    // A warp's elements of the chunk in as few trips as `VALUES_AT_ONCE` loads allow: past the
    // extent, the right-hand side is read at its last element (finite) and multiplied by the
    // staged 0.
    let (warps, end) = (threads / 32, format!("chunk + {staged}"));
    let per_warp = (staged / warps) as usize;
    let at_once = trip_length((per_warp, per_warp), VALUES_AT_ONCE);
    batched_loop_of(em, "c", ("chunk + warp", &end, &warps.to_string()), at_once, &mut |em| {
        em.line(format!("const int cc = min(c, {});", extent - 1));
        let (_, ri) = em.dot_operands_at(lhs, rhs, dims, idx, "cc");
        let b = em.value(rhs, &ri)?;
        em.line(format!("acc = fmaf(part[c - chunk], {b}, acc);"));
        Ok(())
    })?;
    em.close();
    em.line("__syncthreads();");
    em.close();
    Ok(())
}

/// The row of the left-hand side that block `block` of a staged product (`rows_sharing_rhs`: `rows`
/// per batch element, `cols` columns) reads, as a C expression: blocks `q * rows` to `q * rows +
/// rows - 1` take the rows of one batch element, each the same 32 columns `q % (cols / 32)`.
fn staged_row((rows, cols): (usize, usize)) -> String {
    format!("(block / {rows} / {}) * {rows} + block % {rows}", cols / 32)
}

/// The most right-hand side loads a warp of a staged product issues before it waits for one.
const VALUES_AT_ONCE: u32 = 64;

/// The prelude: each reduction the body reads, computed once per block into the shared array
/// `pre{n}` and read from there by the body (and by later reductions of the prelude). Returns the
/// arrays' declarations. A reduction of at least a warp per output takes a warp per output; one of
/// fewer the whole block per output, its warps' results combined through `pre{n}_part`; where the
/// block reads one output of each (`Prelude::one_row`), the whole block computes that one alone,
/// at its index in the array. Every thread runs every shuffle and barrier (uniform control flow,
/// which the host emulator needs).
pub(super) fn prelude(em: &mut Emitter, call: &KernelCall) -> Result<SharedArrays, CudaError> {
    let reductions = prelude_of(em.k);
    let warps = call.launch.block as usize / 32;
    // The one row of each reduction a block reads: the row its product stages, or the row its
    // threads' elements lie in.
    let block = call.launch.block;
    let row = match (call.launch.split, call.launch.tile, call.launch.slots) {
        (Some(split), _, _) => staged_row_of(em.k, split).map(staged_row),
        (None, None, None) => element_row_of(em.k, block).map(|len| format!("block * {block} / {len}")),
        _ => None,
    };
    if call.launch.prelude != prelude_launch(&reductions, block, row.is_some()) {
        return Err(CudaError::Unsupported(format!("{}: the plan's prelude is not the kernel's", em.k.name)));
    }
    if let Some(row) = &row {
        em.line(format!("const int prow = {row};"));
    }
    let mut shared = SharedArrays::default();
    for (n, r) in reductions.iter().enumerate() {
        let op = em.k.body.iter().find(|i| i.result == r.reduction).map(|i| i.op.clone());
        let Some(Op::Reduce { input, kind, axes }) = op else { unreachable!("prelude_of returns reductions") };
        let dtype = em.k.ty(r.reduction).dtype;
        let acc = value_type(dtype);
        let (array, part) = (format!("pre{n}"), format!("pre{n}_part"));
        shared.array(acc, array.clone(), r.outputs as u64);
        let shape = em.k.ty(r.reduction).shape.clone();
        if row.is_none() && !r.block_per_output(call.launch.block) {
            let per_output = WarpPerOutput { outputs: r.outputs, extent: r.extent, warps, array: &array };
            per_output.emit(em, r.reduction, &|o| unlinear(o, &shape))?;
            em.share(r.reduction, &array);
            continue;
        }
        shared.array(acc, part.clone(), warps as u64);
        match row {
            Some(_) => {
                em.open("");
                em.line("const int po = prow;");
            }
            None => em.open(format!("for (int po = 0; po < {}; ++po)", r.outputs)),
        }
        em.line(format!("{acc} pacc = {};", reduce_init(kind, dtype)));
        let at_once = loads_at_once(reads_per_element(em.k, input));
        reduction_loop(em, "pc", ("threadIdx.x", r.extent, call.launch.block), at_once, "pacc", &mut |em| {
            em.reduce_step(input, kind, &axes, &unlinear("po", &shape), "pc", "pacc")
        })?;
        em.line(format!("pacc = warp_{}(pacc);", kind.name()));
        em.line(format!("if ((threadIdx.x & 31) == 0) {part}[threadIdx.x >> 5] = pacc;"));
        em.line("__syncthreads();");
        em.open("if (threadIdx.x == 0)");
        let step = reduce_combine(kind, "pacc", &format!("{part}[w]"));
        em.line(format!("for (int w = 1; w < {warps}; ++w) pacc = {step};"));
        em.line(format!("{array}[po] = {};", rounded(dtype, "pacc")));
        em.close();
        em.line("__syncthreads();");
        em.close();
        em.line("__syncthreads();");
        em.share(r.reduction, &array);
    }
    Ok(shared)
}

/// A reduction computed a warp per output into a shared array: warp `w` takes outputs `w`, `w +
/// warps`, …, its lanes striding the `extent` reduced elements, and lane 0 stores. Every warp runs
/// every shuffle, in or out of range, and the block meets a barrier after.
pub(super) struct WarpPerOutput<'a> {
    pub(super) outputs: usize,
    pub(super) extent: usize,
    pub(super) warps: usize,
    pub(super) array: &'a str,
}

impl WarpPerOutput<'_> {
    /// Emits `reduction` (a `reduce` of the kernel) into the array, `index` giving the index of
    /// its output `po` (a C variable).
    pub(super) fn emit(
        &self,
        em: &mut Emitter,
        reduction: ValueId,
        index: &dyn Fn(&str) -> Index,
    ) -> Result<(), CudaError> {
        let op = em.k.body.iter().find(|i| i.result == reduction).map(|i| i.op.clone());
        let Some(Op::Reduce { input, kind, axes }) = op else {
            return Err(CudaError::Unsupported(format!("{}: a warp per output of no reduction", em.k.name)));
        };
        let (Self { outputs, extent, warps, array }, dtype) = (self, em.k.ty(reduction).dtype);
        em.open(format!("for (int p0 = 0; p0 < {outputs}; p0 += {warps})"));
        em.line("const int po = p0 + (threadIdx.x >> 5);");
        em.line(format!("{} pacc = {};", value_type(dtype), reduce_init(kind, dtype)));
        em.open(format!("if (po < {outputs})"));
        let at_once = loads_at_once(reads_per_element(em.k, input));
        reduction_loop(em, "pc", ("threadIdx.x & 31", *extent, 32), at_once, "pacc", &mut |em| {
            em.reduce_step(input, kind, &axes, &index("po"), "pc", "pacc")
        })?;
        em.close();
        em.line(format!("pacc = warp_{}(pacc);", kind.name()));
        em.line(format!("if ((threadIdx.x & 31) == 0 && po < {outputs}) {array}[po] = {};", rounded(dtype, "pacc")));
        em.close();
        em.line("__syncthreads();");
        Ok(())
    }
}
