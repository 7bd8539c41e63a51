//! One kernel call's CUDA C from its IR function and launch, a device function that a launch's
//! kernel calls on the call's blocks (`launch_code`), in one of six forms: one thread per
//! element written (`elementwise`), one thread per cache slot written (`scatter`, in place), a
//! reduction split over a warp or a block per output, or over a block's warps (`split_reduce`),
//! the tiled matvec (`matvec`: activations staged in shared memory, the weight streamed once, a
//! warp per output column; 4-bit weights `packed_matvec`, the block's threads splitting the
//! contraction a word at a time), the tensor-core GEMM (`gemm`), or a decode step's attention over one
//! chunk of cache slots per block (`attention`). The reducing forms but the last apply the
//! kernel's epilogue to their sums (`store_root`).

use super::elemental::{
    linear, reduce_combine, reduce_init, rounded, storage_type, store, unlinear, value_type, write_lines, Emitter,
    Index,
};
use super::loops::{batched_loop, batched_loop_of, loads_at_once, thread_loop, trip_length, LOADS_IN_FLIGHT};
use super::shared::{SharedArrays, REGION};
use super::CudaError;
use g4c_ir::plan::{launch_smem_bytes, KernelCall, KernelKind, ReduceSplit, SlotSplit, Tile};
use g4c_ir::{DType, DotDims, Function, Op, ReduceKind, ValueId};
use g4c_passes::{
    attention_arrays, attention_of, chunk_axis_of, footprint, matvec_of, prelude_launch, prelude_of, reduction_of,
    split_footprint, split_sums_bytes, Attention, Matvec, PackedWeight, SplitSumsBytes,
};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Stands for the kernel's symbol until its code is hashed.
pub(crate) const NAME: &str = "__KERNEL__";

/// The name of a split GEMM's split-sums parameter.
const SPLIT_SUMS: &str = "sums";

/// The CUDA C of one kernel call, as a device function `name` its launch calls with the call's
/// block index (from 0, a launch may run calls side by side), and the weights it takes after its
/// inputs.
pub(crate) struct KernelCode {
    pub code: String,
    /// The C type of each parameter, in order (its inputs, weights, then output), the block
    /// index aside.
    pub params: Vec<String>,
    pub weights: Vec<String>,
    /// Whether it takes its launch's shared region (after the block index).
    pub shared: bool,
}

/// `bf16_math`: the GPU computes in bf16 (sm_80 and later).
pub(crate) fn kernel_code(
    k: &Function,
    call: &KernelCall,
    name: &str,
    bf16_math: bool,
) -> Result<KernelCode, CudaError> {
    let root = k.results[0].value;
    let root_op = k.body.iter().find(|i| i.result == root).map(|i| &i.op);
    let mut em = Emitter::new(k, name);
    em.bf16_math = bf16_math;
    let mut in_place = None;
    // A split GEMM takes its entry's split-sums buffer after its output.
    let mut split_sums = false;
    // After the template's arrays, which are 16-byte aligned, so none is padded.
    let prelude_arrays = match call.launch.prelude {
        Some(_) => prelude(&mut em, call)?,
        None => SharedArrays::default(),
    };
    let grid = call.launch.grid;
    let mut shared = SharedArrays::default();
    match (root_op, call.launch.tile, matvec_of(k)) {
        (Some(Op::UpdateSlots { operand, slots, updates, axis }), _, _) => {
            in_place = k.params.iter().position(|p| p.value == *operand);
            let j = in_place
                .ok_or_else(|| CudaError::Unsupported("a cache write of a value that is not an input".into()))?;
            scatter(&mut em, grid, j, *operand, *slots, *updates, *axis)?;
        }
        _ if call.kind == KernelKind::Attention => {
            let unsupported =
                || CudaError::Unsupported(format!("{}: an attention kernel's plan is not its own", k.name));
            let (split, a) = (call.launch.slots.ok_or_else(unsupported)?, attention_of(k).ok_or_else(unsupported)?);
            attention_shared_arrays(&mut shared, &split);
            attention(&mut em, &split, &a, root, call.launch.block / 32)?;
        }
        (_, Some(tile), Some(m)) if tile.mma.is_some() => {
            let f = footprint(&tile);
            shared.aligned("u16", "as_", f.staged_activations / 2);
            shared.aligned("u16", "ws_", f.staged_weights / 2);
            let split = match (tile.splits > 1, call.split_sums) {
                (false, _) => None,
                (true, Some(sums)) => Some((sums.offset, split_sums_bytes(&tile, grid, call.launch.block))),
                (true, None) => {
                    return Err(CudaError::Unsupported(format!("{}: a split GEMM without its split sums", k.name)))
                }
            };
            gemm(&mut em, (&tile, call.launch.block), &m, root, split)?;
            split_sums = split.is_some();
        }
        (_, Some(tile), Some(m)) => {
            // 16-byte aligned for the 128-bit loads of packed products; a packed matvec's partial
            // sums after the activations.
            shared.aligned("float", "act", footprint(&tile).smem_bytes / 4);
            matvec(&mut em, (&tile, call.launch.block / 32), &m, root)?;
        }
        (_, Some(_), None) => return Err(CudaError::Unsupported(format!("{}: a tile but no matvec", k.name))),
        (_, None, _) => match call.launch.split {
            Some(split) => {
                // Partial results in the accumulator's type (`float` or `int`: 4 bytes either way).
                let partials = split_footprint(split, call.launch.block) / 4;
                let acc = reduction_of(k).map_or("float", |r| value_type(k.ty(r.reduction).dtype));
                if partials > 0 {
                    shared.array(acc, "part", partials);
                }
                split_reduce(&mut em, root, split, (call.launch.block / 32, grid))?
            }
            None => elementwise(&mut em, grid, root)?,
        },
    }
    shared.append(prelude_arrays);
    // The fit proof's bytes are the kernel's: the arrays must fit what the plan gave the call.
    if shared.bytes() > u64::from(call.launch.smem_bytes) {
        return Err(CudaError::Unsupported(format!(
            "{}: shared arrays of {} bytes where the plan gives {}",
            k.name,
            shared.bytes(),
            call.launch.smem_bytes
        )));
    }
    let lines = em.take_lines();
    // (C type, name) of each parameter.
    let mut params: Vec<(String, String)> = k
        .params
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let st = storage_type(k.ty(p.value).dtype);
            let ty = match in_place == Some(j) {
                true => format!("{st}*"),
                false => format!("const {st}* __restrict__"),
            };
            (ty, format!("in{j}"))
        })
        .collect();
    for (j, w) in em.weights.iter().enumerate() {
        let dtype = weight_dtype(k, w).expect("a weight the kernel reads");
        params.push((format!("const {}* __restrict__", storage_type(dtype)), format!("w{j}")));
    }
    if in_place.is_none() {
        params.push((format!("{}* __restrict__", storage_type(k.ty(root).dtype)), "out".into()));
    }
    if split_sums {
        params.push(("unsigned char* __restrict__".into(), SPLIT_SUMS.into()));
    }
    let declared: Vec<String> = params.iter().map(|(t, n)| format!("{t} {n}")).collect();
    let mut code = String::new();
    for c in &em.constants {
        writeln!(code, "{c}").unwrap();
    }
    // With shared arrays, the body takes them as parameters of its own (`SharedArrays::params`),
    // and the call's function carves them out of the launch's region.
    let body = match shared.is_empty() {
        true => name.to_string(),
        false => format!("{name}_arrays"),
    };
    let arrays: String = shared.params().iter().map(|p| format!(", {p}")).collect();
    writeln!(
        code,
        "static __device__ __forceinline__ void {body}({}, const int block{arrays}) {{",
        declared.join(", ")
    )
    .unwrap();
    write_lines(&mut code, &lines);
    code.push_str("}\n");
    if !shared.is_empty() {
        let names: Vec<&str> = params.iter().map(|(_, n)| n.as_str()).collect();
        writeln!(
            code,
            "static __device__ __forceinline__ void {name}({}, const int block, unsigned char* const {REGION}) {{\n  \
             {body}({}, block, {});\n}}",
            declared.join(", "),
            names.join(", "),
            shared.args().join(", ")
        )
        .unwrap();
    }
    Ok(KernelCode {
        code,
        params: params.into_iter().map(|(t, _)| t).collect(),
        weights: em.weights,
        shared: !shared.is_empty(),
    })
}

/// The CUDA C of one launch, named `NAME`: each call's device function (`{NAME}_{n}`), then the
/// kernel, whose blocks run the calls' one after the other, each call's block index from 0, once
/// the kernel before it has finished (`await_previous_kernel`, for programmatic dependent launch).
pub(crate) fn launch_code(calls: &[KernelCall], parts: &[KernelCode]) -> String {
    let mut code: String = parts.iter().map(|p| p.code.as_str()).collect();
    let mut params = Vec::new();
    let mut branches = Vec::new();
    let mut first_block = 0;
    for (n, (call, part)) in calls.iter().zip(parts).enumerate() {
        let args: Vec<String> = (params.len()..params.len() + part.params.len()).map(|a| format!("a{a}")).collect();
        params.extend(part.params.iter().zip(&args).map(|(t, a)| format!("{t} {a}")));
        let block = match first_block {
            0 => "blockIdx.x".to_string(),
            b => format!("blockIdx.x - {b}"),
        };
        let region = match part.shared {
            true => format!(", {REGION}"),
            false => String::new(),
        };
        branches.push((first_block + call.launch.grid, format!("{NAME}_{n}({}, {block}{region});", args.join(", "))));
        first_block += call.launch.grid;
    }
    // At least one block per SM: the register budget the plan gives each thread (ptxas otherwise
    // aims at more resident blocks and spills a tensor-core kernel at 32 registers).
    writeln!(
        code,
        "extern \"C\" __global__ void __launch_bounds__({}, 1) {NAME}({}) {{",
        calls[0].launch.block,
        params.join(", ")
    )
    .unwrap();
    code.push_str("  let_next_kernel_start();\n  await_previous_kernel();\n");
    // One region for the launch: each block runs one call, and uses that call's arrays only.
    let bytes = launch_smem_bytes(calls);
    if parts.iter().any(|p| p.shared) {
        writeln!(code, "  __shared__ __align__(16) unsigned char {REGION}[{bytes}];").unwrap();
    }
    let last = branches.len() - 1;
    for (n, (end, call)) in branches.iter().enumerate() {
        let line = match (n, n == last) {
            (0, true) => format!("  {call}"),
            (0, false) => format!("  if (blockIdx.x < {end}) {call}"),
            (_, false) => format!("  else if (blockIdx.x < {end}) {call}"),
            (_, true) => format!("  else {call}"),
        };
        writeln!(code, "{line}").unwrap();
    }
    code.push_str("}\n");
    code
}

fn weight_dtype(k: &Function, name: &str) -> Option<DType> {
    k.body.iter().find_map(|i| match &i.op {
        Op::Weight { name: n } if n == name => Some(k.ty(i.result).dtype),
        _ => None,
    })
}

/// Opens a loop of the call's threads over `i` in `0..n`, grid-stride over its `grid` blocks.
fn open_grid_stride(em: &mut Emitter, grid: u32, n: usize) {
    em.open(format!("for (int i = block * blockDim.x + threadIdx.x; i < {n}; i += {grid} * blockDim.x)"));
}

/// One thread per element of the root, grid-stride.
fn elementwise(em: &mut Emitter, grid: u32, root: ValueId) -> Result<(), CudaError> {
    let ty = em.k.ty(root).clone();
    open_grid_stride(em, grid, ty.numel());
    let x = em.value(root, &unlinear("i", &ty.shape))?;
    em.line(store(ty.dtype, "out", "i", &x));
    em.close();
    Ok(())
}

/// A reduction split over threads: a warp per output (`WarpPerOutput`: its lanes stride the row,
/// shuffles combine their partial results, lane 0 stores; the grid's blocks stride the outputs),
/// a block per output (`BlockPerOutput`: shuffles, then thread 0 combines the warps' results
/// through shared memory), or a lane per output and the block's warps over the extent
/// (`WarpsPerExtent`: warp 0 combines the partial results through shared memory). The storing
/// thread applies the epilogue.
fn split_reduce(
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
        ReduceSplit::WarpsPerExtent => rows_sharing_rhs(em.k, &op),
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
        ReduceSplit::WarpsPerExtent => {
            match shared_rows {
                // Blocks of the rows reading the same 32 columns of the right-hand side (a decode
                // step's query heads, reading the same features of the value cache) run next to
                // each other, so that the later ones may find those columns in L2 rather than
                // read the cache from memory once per head (on t4g, a full-attention layer's
                // value cache is as large as its L2).
                Some((rows, cols)) => {
                    let chunks = cols / 32;
                    em.line(format!("const int q = block / {rows}, row = (q / {chunks}) * {rows} + block % {rows};"));
                    em.line(format!("const int i = row * {cols} + (q % {chunks}) * 32 + lane;"));
                }
                None => em.line("const int i = block * 32 + lane;"),
            }
            ("warp", warps)
        }
    };
    em.line(format!("{} acc = {};", value_type(dtype), reduce_init(kind, dtype)));
    match (&op, shared_rows) {
        (Op::DotGeneral { lhs, rhs, dims }, Some(_)) => {
            staged_dot(em, (*lhs, *rhs, dims), &idx, r.outputs, r.extent, warps * 32)?
        }
        _ => {
            em.open(format!("if (i < {})", r.outputs));
            // Where the root selects a constant whatever the reduction (a slot the query does not
            // see), the warp or block of that output reads none of its inputs. The condition is
            // the same for all the threads sharing the output, so control flow stays uniform.
            let masked = match split {
                ReduceSplit::WarpPerOutput | ReduceSplit::BlockPerOutput => r.visible,
                ReduceSplit::WarpsPerExtent => None,
            };
            if let Some(mask) = masked {
                let visible = em.value(mask, &idx)?;
                em.open(format!("if ({visible})"));
            }
            let reads = op.operands().iter().map(|&v| reads_per_element(em.k, v)).sum();
            thread_loop(em, "c", (first, r.extent, stride), loads_at_once(reads), &mut |em| match &op {
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
        ReduceSplit::WarpsPerExtent => {
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
/// probabilities), its warps splitting the `extent` contracted elements: per `threads` of them,
/// the block computes that row's elements into `part` (a thread each), then each warp multiplies
/// its elements of the chunk by the right-hand side's. So each element of the row is computed
/// once per block, not once per warp and iteration, and the warps' loop reads shared memory and
/// the right-hand side alone, whose loads it then issues together, a warp's 32 of the chunk at
/// once (computing a softmax's probability in the loop, a division's slow path kept every
/// iteration waiting for its load; 8 at a time, a sliding layer's 639 slots took 12 trips, 8 of
/// them a single load in the last, short chunk). Each warp takes the same elements in the same
/// order as without the staging, and skips a chunk whose staged elements are all 0.
fn staged_dot(
    em: &mut Emitter,
    (lhs, rhs, dims): (ValueId, ValueId, &DotDims),
    idx: &Index,
    outputs: usize,
    extent: usize,
    threads: u32,
) -> Result<(), CudaError> {
    em.open(format!("for (int chunk = 0; chunk < {extent}; chunk += {threads})"));
    em.line("const int cs = chunk + threadIdx.x;");
    em.line("bool nonzero = false;");
    if !extent.is_multiple_of(threads as usize) {
        em.line("part[threadIdx.x] = 0.f;");
    }
    em.open(format!("if (i < {outputs} && cs < {extent})"));
    let (li, _) = em.dot_operands_at(lhs, rhs, dims, idx, "cs");
    let a = em.value(lhs, &li)?;
    em.line(format!("part[threadIdx.x] = {a};"));
    em.line(format!("nonzero = {a} != 0.f;"));
    em.close();
    // A chunk of zeros (the probabilities of slots no query sees) adds nothing, its right-hand
    // side being finite (values in a cache): the block reads none of it. The vote is a barrier,
    // taken by every thread.
    em.open(format!("if (__syncthreads_or(nonzero) && i < {outputs})"));
    // All of a warp's 32 elements of the chunk at once: past the extent, the right-hand side is
    // read at its last element (finite) and multiplied by the staged 0.
    let (warps, end) = (threads / 32, format!("chunk + {threads}"));
    batched_loop_of(em, "c", ("chunk + warp", &end, &warps.to_string()), threads / warps, &mut |em| {
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

/// The shared arrays of an attention chunk's block, as `attention_arrays` sizes them (so the fit
/// proof counts them): `act` (the staged queries, then the chunk's weighted sums), `sc` (scores),
/// `ex` (their exponentials, then the probabilities), `mx` and `sm` (each head's maximum and sum),
/// `flag` (some slot visible; some probability not 0) and `live` (each slot visible).
fn attention_shared_arrays(shared: &mut SharedArrays, s: &SlotSplit) {
    let a = attention_arrays(s);
    shared.aligned("float", "act", a.staged);
    shared.array("float", "sc", a.scores);
    shared.array("float", "ex", a.exps);
    shared.array("float", "mx", a.per_head);
    shared.array("float", "sm", a.per_head);
    shared.array("int", "flag", a.flags);
    shared.array("bool", "live", a.live);
}

/// A decode step's attention over one chunk of cache slots per block, for every query head
/// (`split-attention`). The block marks the slots some head sees in `live` (all, where the scores
/// have no mask the template recognizes); where none is, it stages no query, and reads no key
/// (a masked score does not depend on it). Else the block stages the queries (their prologue
/// computed once per block); each warp takes live slots of the chunk, reading a key row once for
/// all heads, and lane 0 stores
/// the scores (masked, padded) into `sc`; a warp per head takes their maximum into `mx`; the
/// block the exponentials into `ex`; a warp per head their sum into `sm`; the block rounds the
/// exponentials to the values' type in `ex`; each thread the weighted sums of one feature for
/// every head, reading each value row once, into `act` (0s without reading a value where every
/// probability is 0: a chunk of masked slots, whose maximum `split-attention` floors); then the block
/// stores the chunk's results (weighted sums, maximum and sum per head) from there. The arrays
/// hold the block's chunk only (`share_chunk`), so the elemental emitter reads them at any
/// element of it.
fn attention(em: &mut Emitter, s: &SlotSplit, a: &Attention, root: ValueId, warps: u32) -> Result<(), CudaError> {
    let (heads, slots, depth, features) = (a.heads, a.slots, a.scores.depth, a.features);
    let planned = (s.heads as usize, s.slots as usize, s.depth as usize) == (heads, slots, depth.max(features));
    if !planned || slots % warps as usize != 0 {
        return Err(CudaError::Unsupported(format!(
            "{}: {heads} heads, {slots} slots per chunk ({warps} warps), depth {}, where the plan has {s:?}",
            em.k.name,
            depth.max(features)
        )));
    }
    let (product, keys) = a.scores.dots[0];
    let chunked = em.k.ty(a.chunked).clone();
    let rank = chunked.rank();
    let heads_shape = chunked.shape[..rank - 2].to_vec();
    // An index of the scores in chunks `[heads.., C, L]` (or of `m` and `l`, without `L`) at head
    // `h`, the block's chunk and slot `jj` (C expressions).
    let at = |h: &str, jj: Option<&str>| -> Index {
        let mut idx = unlinear(h, &heads_shape);
        idx.push("block".into());
        idx.extend(jj.map(str::to_string));
        idx
    };
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");

    // The slots some head sees (padding slots none), and whether the chunk has any.
    let (cols, key_rank) = (a.scores.cols, em.k.ty(keys).rank());
    em.line("if (threadIdx.x == 0) flag[0] = flag[1] = 0;");
    em.line("__syncthreads();");
    em.open(format!("for (int jj = threadIdx.x; jj < {slots}; jj += blockDim.x)"));
    em.line(format!("const int j = block * {slots} + jj;"));
    em.line(format!("bool seen = j < {cols};"));
    if let Some(visible) = a.visible {
        em.open("if (seen)");
        let heads_seeing: Vec<String> = (0..heads)
            .map(|r| {
                em.value(
                    visible,
                    &unlinear(&r.to_string(), &heads_shape).into_iter().chain(["j".into()]).collect::<Vec<_>>(),
                )
            })
            .collect::<Result<_, _>>()?;
        em.line(format!("seen = {};", heads_seeing.join(" || ")));
        em.close();
    }
    em.line("live[jj] = seen;");
    em.line("if (seen) flag[0] = 1;");
    em.close();
    em.line("__syncthreads();");

    // The queries, staged.
    em.open("if (flag[0])");
    let at_once = loads_at_once(reads_per_element(em.k, a.scores.lhs));
    thread_loop(em, "e", ("threadIdx.x", heads * depth, warps * 32), at_once, &mut |em| {
        em.line(format!("const int r = e / {depth}, kk = e % {depth};"));
        activation_at(em, &a.scores, "q", "r", "kk")?;
        em.line(format!("act[r * {depth} + kk] = q;"));
        Ok(())
    })?;
    em.close();
    em.line("__syncthreads();");

    // Scores: a warp per slot, lanes along the key row; slots no head sees read no key.
    em.open(format!("for (int jj = warp; jj < {slots}; jj += {warps})"));
    em.line(format!("const int j = block * {slots} + jj;"));
    em.line(format!("float acc[{heads}];"));
    em.line("#pragma unroll");
    em.line(format!("for (int r = 0; r < {heads}; ++r) acc[r] = 0.f;"));
    em.open("if (live[jj])");
    let keys_in_flight = attention_loads_in_flight(depth.div_ceil(32));
    batched_loop_of(em, "kk", ("lane", &depth.to_string(), "32"), keys_in_flight, &mut |em| {
        let key_at: Index =
            std::iter::repeat_n("0".to_string(), key_rank - 2).chain(["j".into(), "kk".into()]).collect();
        let key = em.value(keys, &key_at)?;
        em.line("#pragma unroll");
        em.line(format!("for (int r = 0; r < {heads}; ++r) acc[r] = fmaf(act[r * {depth} + kk], {key}, acc[r]);"));
        Ok(())
    })?;
    em.close();
    em.line("#pragma unroll");
    em.line(format!("for (int r = 0; r < {heads}; ++r) acc[r] = warp_sum(acc[r]);"));
    em.open("if (lane == 0)");
    let product_dtype = em.k.ty(product).dtype;
    for r in 0..heads {
        em.open(format!("/* head {r} */"));
        let sum = em.var("float", "d", &rounded(product_dtype, &format!("acc[{r}]")));
        em.bound.insert(product, sum);
        let x = em.value(a.chunked, &at(&r.to_string(), Some("jj")))?;
        em.line(format!("sc[{} + jj] = {x};", r * slots));
        em.close();
    }
    em.bound.remove(&product);
    em.close();
    em.close();
    em.line("__syncthreads();");
    em.share_chunk(a.chunked, "sc", rank - 2);

    // Each head's maximum, then the exponentials, then their sum: a warp per head.
    let per_head = |array| WarpPerOutput { outputs: heads, extent: slots, warps: warps as usize, array };
    let head_index = |h: &str| at(h, None);
    per_head("mx").emit(em, a.max, &head_index)?;
    em.share_chunk(a.max, "mx", rank - 2);
    em.open(format!("for (int e = threadIdx.x; e < {}; e += blockDim.x)", heads * slots));
    let x = em.value(a.exp, &at(&format!("(e / {slots})"), Some(&format!("(e % {slots})"))))?;
    em.line(format!("ex[e] = {x};"));
    em.close();
    em.line("__syncthreads();");
    em.share_chunk(a.exp, "ex", rank - 2);
    per_head("sm").emit(em, a.sum, &head_index)?;
    em.share_chunk(a.sum, "sm", rank - 2);

    // The probabilities as the weighted sums read them (the exponentials rounded to the values'
    // type), in place of the exponentials, which nothing reads after their sum: each thread
    // rewrites the elements it reads. And whether any is not 0.
    let (lhs, rhs, dims) = (a.probs, a.values, &a.dims);
    em.open(format!("for (int e = threadIdx.x; e < {}; e += blockDim.x)", heads * slots));
    if lhs != a.exp {
        let x = em.value(lhs, &at(&format!("(e / {slots})"), Some(&format!("(e % {slots})"))))?;
        em.line(format!("ex[e] = {x};"));
    }
    em.line("if (ex[e] != 0.f) flag[1] = 1;");
    em.close();
    em.line("__syncthreads();");
    em.share_chunk(lhs, "ex", rank - 2);

    // The weighted sums: a thread per feature, each value row read once for every head.
    let weighted = em.k.ty(a.weighted).clone();
    let chunk_at = chunk_axis_of(dims, rank).expect("attention_of found the chunk axis");
    let free_shape = weighted.shape[dims.lhs_batch.len()..weighted.rank() - 1].to_vec();
    let weighted_at = |h: &str, f: &str| -> Index {
        let mut idx: Index =
            (0..dims.lhs_batch.len()).map(|b| if b == chunk_at { "block" } else { "0" }.into()).collect();
        idx.extend(unlinear(h, &free_shape));
        idx.push(f.into());
        idx
    };
    em.open(format!("for (int f = threadIdx.x; f < {features}; f += blockDim.x)"));
    em.line(format!("float acc[{heads}];"));
    em.line("#pragma unroll");
    em.line(format!("for (int r = 0; r < {heads}; ++r) acc[r] = 0.f;"));
    // Every product of a zero probability is 0 (the values are finite: a cache's slots start 0).
    em.open("if (flag[1])");
    batched_loop_of(em, "jj", ("0", &slots.to_string(), "1"), attention_loads_in_flight(slots), &mut |em| {
        for r in 0..heads {
            em.dot_step(lhs, rhs, dims, &weighted_at(&r.to_string(), "f"), "jj", &format!("acc[{r}]"))?;
        }
        Ok(())
    })?;
    em.close();
    let weighted_dtype = weighted.dtype;
    for r in 0..heads {
        em.line(format!("act[{} + f] = {};", r * features, rounded(weighted_dtype, &format!("acc[{r}]"))));
    }
    em.close();
    em.line("__syncthreads();");
    em.share_chunk(a.weighted, "act", chunk_at);

    // The chunk's results, laid out as the weighted sums (the chunk axis at the same place).
    let rt = em.k.ty(root).clone();
    let mut block_shape = rt.shape.clone();
    block_shape[chunk_at] = 1;
    em.open(format!("for (int e = threadIdx.x; e < {}; e += blockDim.x)", rt.numel() / a.chunks));
    let mut idx = unlinear("e", &block_shape);
    idx[chunk_at] = "block".into();
    let x = em.value(root, &idx)?;
    em.line(store(rt.dtype, "out", &linear(&idx, &rt.shape), &x));
    em.close();
    Ok(())
}

/// Iterations of an attention chunk's key and value loops (`trips` of them per thread) issued
/// together: all of them, up to 32. At a short context a few chunks' blocks do all the reading,
/// each a latency per trip (a lane's 16 key elements in one trip, not 2; a feature's 64 values in
/// 2, not 8).
fn attention_loads_in_flight(trips: usize) -> u32 {
    (trips as u32).clamp(1, 32)
}

/// For a product whose output is `[batch.., rows.., cols..]` (the left side's free axes, then the
/// right side's), several rows, and whole warps of columns: (rows, cols), per batch element.
fn rows_sharing_rhs(k: &Function, op: &Op) -> Option<(usize, usize)> {
    let Op::DotGeneral { lhs, rhs, dims } = op else { return None };
    let (lt, rt) = (k.ty(*lhs), k.ty(*rhs));
    let rows: usize = dims.lhs_free(lt.rank()).iter().map(|&d| lt.shape[d]).product();
    let cols: usize = dims.rhs_free(rt.rank()).iter().map(|&d| rt.shape[d]).product();
    (rows > 1 && cols.is_multiple_of(32)).then_some((rows, cols))
}

/// The prelude: each reduction the body reads, computed once per block into the shared array
/// `pre{n}` and read from there by the body (and by later reductions of the prelude). Returns the
/// arrays' declarations. A reduction of at least a warp per output takes a warp per output; one of
/// fewer the whole block per output, its warps' results combined through `pre{n}_part`. Every
/// thread runs every shuffle and barrier (uniform control flow, which the host emulator needs).
fn prelude(em: &mut Emitter, call: &KernelCall) -> Result<SharedArrays, CudaError> {
    let reductions = prelude_of(em.k);
    let warps = call.launch.block as usize / 32;
    if call.launch.prelude != prelude_launch(&reductions, call.launch.block) {
        return Err(CudaError::Unsupported(format!("{}: the plan's prelude is not the kernel's", em.k.name)));
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
        if !r.block_per_output(call.launch.block) {
            let per_output = WarpPerOutput { outputs: r.outputs, extent: r.extent, warps, array: &array };
            per_output.emit(em, r.reduction, &|o| unlinear(o, &shape))?;
            em.share(r.reduction, &array);
            continue;
        }
        shared.array(acc, part.clone(), warps as u64);
        em.open(format!("for (int po = 0; po < {}; ++po)", r.outputs));
        em.line(format!("{acc} pacc = {};", reduce_init(kind, dtype)));
        let at_once = loads_at_once(reads_per_element(em.k, input));
        thread_loop(em, "pc", ("threadIdx.x", r.extent, call.launch.block), at_once, &mut |em| {
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
struct WarpPerOutput<'a> {
    outputs: usize,
    extent: usize,
    warps: usize,
    array: &'a str,
}

impl WarpPerOutput<'_> {
    /// Emits `reduction` (a `reduce` of the kernel) into the array, `index` giving the index of
    /// its output `po` (a C variable).
    fn emit(&self, em: &mut Emitter, reduction: ValueId, index: &dyn Fn(&str) -> Index) -> Result<(), CudaError> {
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
        thread_loop(em, "pc", ("threadIdx.x & 31", *extent, 32), at_once, &mut |em| {
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

/// Stores the root's element `i` (a C variable), with each of `sums` (a reduction or product of
/// the kernel, and the f32 expression of its element `i`) rounded to its type and bound, so the
/// epilogue from it to the root is computed on it.
fn store_root(em: &mut Emitter, sums: &[(ValueId, String)], root: ValueId) -> Result<(), CudaError> {
    for (v, sum) in sums {
        let dtype = em.k.ty(*v).dtype;
        let value = em.var(value_type(dtype), "d", &rounded(dtype, sum));
        em.bound.insert(*v, value);
    }
    let root_ty = em.k.ty(root).clone();
    let x = em.value(root, &unlinear("i", &root_ty.shape))?;
    em.line(store(root_ty.dtype, "out", "i", &x));
    Ok(())
}

/// Declares `float {name}`: the activation of a matrix product at row `row` and contraction index
/// `kk` (C expressions), its prologue computed, or 0 past the `rows × depth` edges.
fn activation_at(em: &mut Emitter, m: &Matvec, name: &str, row: &str, kk: &str) -> Result<(), CudaError> {
    let (rows, depth) = (m.rows, m.depth);
    let lhs_shape = em.k.ty(m.lhs).shape.clone();
    let (inside, row, kk) = clamped(em, (row, rows), (kk, depth), 1);
    let lin = em.var("int", "l", &format!("{row} * {depth} + {kk}"));
    let x = em.value(m.lhs, &unlinear(&lin, &lhs_shape))?;
    em.line(format!("const float {name} = {inside} ? {x} : 0.f;"));
    Ok(())
}

/// Whether `(row, kk)` (C expressions) lies inside `rows × depth`, and the nearest index inside it
/// (`kk` kept a multiple of `align`, which divides `depth`): three C variables. Staging loops read
/// at the clamped index and select 0 outside, rather than branch around the reads: a branch per
/// element keeps the compiler from issuing the next elements' loads before this one's arrive, so
/// each element would wait out a memory latency (the prefill GEMMs' 32-deep steps took about 3 µs
/// on the H200, eight such waits).
fn clamped(
    em: &mut Emitter,
    (row, rows): (&str, usize),
    (kk, depth): (&str, usize),
    align: usize,
) -> (String, String, String) {
    let inside = em.var("bool", "within", &format!("{row} < {rows} && {kk} < {depth}"));
    let row = em.var("int", "rc", &format!("min({row}, {})", rows - 1));
    let kk = em.var("int", "kc", &format!("min({kk}, {})", depth - align));
    (inside, row, kk)
}

/// One thread per element of the updates: each is stored at its row's slot, in place; negative
/// (padding) slots write nothing.
fn scatter(
    em: &mut Emitter,
    grid: u32,
    target: usize,
    operand: ValueId,
    slots: ValueId,
    updates: ValueId,
    axis: usize,
) -> Result<(), CudaError> {
    let (ut, ot) = (em.k.ty(updates).clone(), em.k.ty(operand).clone());
    open_grid_stride(em, grid, ut.numel());
    let u = unlinear("i", &ut.shape);
    let slot = em.value(slots, &[u[0].clone(), u[axis].clone()])?;
    em.open(format!("if ({slot} >= 0 && {slot} < {})", ot.shape[axis]));
    let x = em.value(updates, &u)?;
    let mut o = u.clone();
    o[axis] = slot;
    em.line(store(ot.dtype, &format!("in{target}"), &linear(&o, &ot.shape), &x));
    em.close();
    em.close();
    Ok(())
}

/// The tiled matvec: per `k` step the block stages `rows × k` activations (the prologue computed
/// once per block), each warp multiplies them by its column of every weight (lanes striding `k`),
/// then reduces across lanes; lane 0 applies the epilogue to the products and stores. A packed
/// 4-bit one is `packed_matvec`.
fn matvec(em: &mut Emitter, (tile, warps): (&Tile, u32), m: &Matvec, root: ValueId) -> Result<(), CudaError> {
    if tile.packed {
        let unsupported = || CudaError::Unsupported(format!("{}: a packed tile of weights not packed", em.k.name));
        let weights = PackedWeight::all_of(em.k, m).ok_or_else(unsupported)?;
        return packed_matvec(em, (tile, warps), m, &weights, root);
    }
    let (rows, kt, cols) = (tile.rows, tile.k, tile.cols);
    let (n_total, depth, products) = (m.cols, m.depth, m.dots.len());
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    em.line(format!("const int n = block * {cols} + warp;"));
    em.line(format!("float acc[{products}][{rows}];"));
    em.line("#pragma unroll");
    em.line(format!("for (int j = 0; j < {products}; ++j) for (int r = 0; r < {rows}; ++r) acc[j][r] = 0.f;"));
    em.open(format!("for (int k0 = 0; k0 < {depth}; k0 += {kt})"));
    stage_activations(em, m, (rows, kt), warps * 32)?;
    em.open(format!("if (n < {n_total})"));
    match stored_rows(em, m, kt) {
        Some(rows_of) => sixteen_bit_rows(em, (rows, kt), m, &rows_of)?,
        None => value_by_value(em, (rows, kt), m)?,
    }
    em.close();
    em.line("__syncthreads();");
    em.close();
    em.line("#pragma unroll");
    em.line(format!(
        "for (int j = 0; j < {products}; ++j) for (int r = 0; r < {rows}; ++r) acc[j][r] = warp_sum(acc[j][r]);"
    ));
    em.open(format!("if (lane == 0 && n < {n_total})"));
    em.line("#pragma unroll");
    em.open(format!("for (int r = 0; r < {rows}; ++r)"));
    store_products(em, m, &|j| format!("acc[{j}][r]"), root)?;
    em.close();
    em.close();
    Ok(())
}

/// A matvec warp's loop over its column's step of weights, a value per lane and iteration.
fn value_by_value(em: &mut Emitter, (rows, kt): (u32, u32), m: &Matvec) -> Result<(), CudaError> {
    // The tile's `k` values, or those left of the depth.
    let end = format!("min({kt}, {} - k0)", m.depth);
    batched_loop(em, "kk", ("lane", &end, "32"), &mut |em| {
        for (j, &(_, w)) in m.dots.iter().enumerate() {
            // `[1.., N, K]`: leading dimensions of size 1.
            let rank = em.k.ty(w).rank();
            let at: Vec<String> =
                std::iter::repeat_n("0".to_string(), rank - 2).chain(["n".into(), "(k0 + kk)".into()]).collect();
            let w = em.value(w, &at)?;
            em.line("#pragma unroll");
            em.line(format!(
                "for (int r = 0; r < {rows}; ++r) acc[{j}][r] = fmaf(act[r * {kt} + kk], {w}, acc[{j}][r]);"
            ));
        }
        Ok(())
    })
}

/// Each product's weight as a 16-bit array read as stored, row `n` of it the column's `depth`
/// values (leading dimensions of size 1), when every product's is one and the rows and the tile's
/// `kt` hold whole 16-byte vectors: the C array and its type.
fn stored_rows(em: &mut Emitter, m: &Matvec, kt: u32) -> Option<Vec<(String, DType)>> {
    if !m.depth.is_multiple_of(8) || !kt.is_multiple_of(8) {
        return None;
    }
    m.dots
        .iter()
        .map(|&(_, w)| {
            let ty = em.k.ty(w);
            let rank = ty.rank();
            let rows = rank >= 2 && ty.shape[rank - 1] == m.depth && ty.shape[..rank - 2].iter().all(|&d| d == 1);
            let sixteen = matches!(ty.dtype, DType::BF16 | DType::F16);
            let dtype = ty.dtype;
            (rows && sixteen).then(|| em.stored_array(w)).flatten().map(|array| (array, dtype))
        })
        .collect()
}

/// A matvec warp's loop over its column's step of 16-bit weights (`rows_of`, per product), 8
/// values at a time: each lane loads 16 bytes of every product's row (one 128-bit load), the
/// matching 8 staged activations of each row (two), and adds the 8 products in order. A lane took
/// one 2-byte value per iteration, so a warp had 512 bytes of weights in flight per 8 iterations:
/// the H200 profile had the 16-bit LM head, a decode step's largest kernel, at 75% of the
/// bandwidth. Now a warp's loads are 512 contiguous bytes each, as many at once as the step's
/// vectors allow up to 8 (6 for E2B's 1536-deep head: 3 KB per warp).
fn sixteen_bit_rows(
    em: &mut Emitter,
    (rows, kt): (u32, u32),
    m: &Matvec,
    rows_of: &[(String, DType)],
) -> Result<(), CudaError> {
    let depth = m.depth;
    // A full step's vectors per lane, in trips that wait least.
    let vectors_per_step = kt as usize / 8;
    let at_once = trip_length((vectors_per_step / 32, vectors_per_step.div_ceil(32)), LOADS_IN_FLIGHT);
    let vectors = format!("min({kt}, {depth} - k0) >> 3");
    batched_loop_of(em, "kv", ("lane", &vectors, "32"), at_once, &mut |em| {
        em.line("const int kk = kv * 8;");
        for (j, (array, _)) in rows_of.iter().enumerate() {
            em.line(format!("unsigned wv{j}[4];"));
            em.line(format!("ld8_pairs({array} + n * {depth} + k0 + kk, wv{j});"));
        }
        em.line("#pragma unroll");
        em.open(format!("for (int r = 0; r < {rows}; ++r)"));
        em.line("float a[8];");
        em.line(format!("ld8(act + r * {kt} + kk, a);"));
        for (j, (_, dtype)) in rows_of.iter().enumerate() {
            let widen = if *dtype == DType::F16 { "h2f" } else { "b2f" };
            em.line("#pragma unroll");
            em.line(format!(
                "for (int i = 0; i < 8; ++i) acc[{j}][r] = fmaf(a[i], {widen}((u16)(wv{j}[i >> 1] >> (16 * (i & 1)))), acc[{j}][r]);"
            ));
        }
        em.close();
        Ok(())
    })
}

/// Stores a matvec's output at row `r` and column `n` (C variables), product `j`'s sum being
/// `sum(j)` (a C expression).
fn store_products(em: &mut Emitter, m: &Matvec, sum: &dyn Fn(usize) -> String, root: ValueId) -> Result<(), CudaError> {
    em.line(format!("const int i = r * {} + n;", m.cols));
    let sums: Vec<(ValueId, String)> = m.dots.iter().enumerate().map(|(j, &(dot, _))| (dot, sum(j))).collect();
    store_root(em, &sums, root)
}

/// Stages the `rows × kt` activations of the step from `k0` into `act` (the prologue computed
/// once per block of `threads`), then meets the block's barrier.
fn stage_activations(em: &mut Emitter, m: &Matvec, (rows, kt): (u32, u32), threads: u32) -> Result<(), CudaError> {
    let at_once = loads_at_once(reads_per_element(em.k, m.lhs));
    thread_loop(em, "e", ("threadIdx.x", (rows * kt) as usize, threads), at_once, &mut |em| {
        em.line(format!("const int r = e / {kt}, kk = k0 + e % {kt};"));
        activation_at(em, m, "a", "r", "kk")?;
        em.line("act[e] = a;");
        Ok(())
    })?;
    em.line("__syncthreads();");
    Ok(())
}

/// Word loads a thread of a packed matvec issues before it waits for any: 16 KB in flight per
/// block of 256 threads.
const WORDS_IN_FLIGHT: u32 = 16;

/// The 4-bit matvec, its weights packed 8 values to a word: per `k` step the block stages `rows ×
/// k` activations as `matvec` does; then its threads split the step's words among them, thread `t`
/// taking words `t`, `t + 256`, …, and multiply each word's 8 activations per row (read from shared
/// memory once, in two 128-bit loads) by that word of every column of the block and every product.
/// So a thread has `cols × products` independent word loads per word it takes (and takes several
/// at once, up to `WORDS_IN_FLIGHT` loads), every column is spread over all 256 threads however deep
/// the contraction, and shared memory is read once per `cols × products` words. A warp per column
/// read its column's words 8 at a time per lane, 8 KB in flight per block, and 4 bytes of shared
/// memory per weight: the 4-bit matvecs stayed under 10% of the H200's bandwidth. Each thread's
/// sums are combined over its warp, then over the warps through `part` (in `act`); thread `o`
/// applies the epilogue to output `o` of the block (row `o % rows` of column `o / rows`). Columns
/// past the last are read as the last one, and not stored: no branch around the loads.
fn packed_matvec(
    em: &mut Emitter,
    (tile, warps): (&Tile, u32),
    m: &Matvec,
    weights: &[PackedWeight],
    root: ValueId,
) -> Result<(), CudaError> {
    let (rows, kt, cols) = (tile.rows, tile.k, tile.cols);
    let (n_total, depth, products) = (m.cols, m.depth, weights.len() as u32);
    let (sums, steps) = (products * cols * rows, (WORDS_IN_FLIGHT / (cols * products)).max(1));
    // The footprint sized `act` for the plan's 8 warps' partial sums.
    if u64::from(warps * sums * 4) > footprint(tile).smem_bytes {
        return Err(CudaError::Unsupported(format!(
            "{}: {warps} warps' partial sums do not fit the tile's shared memory",
            em.k.name
        )));
    }
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    em.line(format!("float acc[{products}][{cols}][{rows}] = {{}};"));
    em.open(format!("for (int k0 = 0; k0 < {depth}; k0 += {kt})"));
    stage_activations(em, m, (rows, kt), warps * 32)?;
    em.line(format!("const int words = min({kt}, {depth} - k0) >> 3;"));
    em.open(format!("for (int wd0 = threadIdx.x; wd0 < words; wd0 += {steps} * blockDim.x)"));
    em.line(format!("unsigned q[{steps}][{products}][{cols}];"));
    em.line(format!("float s[{steps}][{products}][{cols}];"));
    // The words and scales of `steps` words of every column first, then the products: two loops,
    // so that the loads come first as written rather than as the compiler would schedule one.
    let each_word = |em: &mut Emitter| {
        em.line("#pragma unroll");
        em.open(format!("for (int u = 0; u < {steps}; ++u)"));
        em.line("const int wd = wd0 + u * blockDim.x;");
        em.open("if (wd < words)");
    };
    let each_column = |em: &mut Emitter| {
        em.line("#pragma unroll");
        em.open(format!("for (int c = 0; c < {cols}; ++c)"));
    };
    each_word(em);
    each_column(em);
    em.line(format!("const int n = min(block * {cols} + c, {});", n_total - 1));
    for (j, w) in weights.iter().enumerate() {
        let (word, scale) = packed_loads(em, w, "n", "(k0 + 8 * wd)", depth)?;
        em.line(format!("q[u][{j}][c] = {word};"));
        em.line(format!("s[u][{j}][c] = {scale};"));
    }
    em.close();
    em.close();
    em.close();
    each_word(em);
    em.line(format!("float a[{rows}][8];"));
    em.line("#pragma unroll");
    em.line(format!("for (int r = 0; r < {rows}; ++r) ld8(act + r * {kt} + 8 * wd, a[r]);"));
    each_column(em);
    let values: Vec<String> = weights
        .iter()
        .enumerate()
        .map(|(j, w)| packed_value(em, w, &format!("q[u][{j}][c]"), &format!("s[u][{j}][c]")))
        .collect();
    em.line("#pragma unroll");
    em.open("for (int i = 0; i < 8; ++i)");
    for (j, value) in values.iter().enumerate() {
        let value = em.var("float", "v", value);
        em.line("#pragma unroll");
        em.line(format!("for (int r = 0; r < {rows}; ++r) acc[{j}][c][r] = fmaf(a[r][i], {value}, acc[{j}][c][r]);"));
    }
    em.close();
    em.close();
    em.close();
    em.close();
    em.close();
    em.line("__syncthreads();");
    em.close();
    // Over the warp, then over the warps, through the activations' array (the last step's
    // barrier is behind).
    em.line("float* const part = act;");
    for (var, n) in [("j", products), ("c", cols), ("r", rows)] {
        em.line("#pragma unroll");
        em.open(format!("for (int {var} = 0; {var} < {n}; ++{var})"));
    }
    em.line("const float sum = warp_sum(acc[j][c][r]);");
    em.line(format!("if (lane == 0) part[warp * {sums} + (j * {cols} + c) * {rows} + r] = sum;"));
    em.close();
    em.close();
    em.close();
    em.line("__syncthreads();");
    em.open(format!("if (threadIdx.x < {})", cols * rows));
    em.line(format!("const int c = threadIdx.x / {rows}, r = threadIdx.x % {rows}, n = block * {cols} + c;"));
    em.open(format!("if (n < {n_total})"));
    em.line(format!("float sum[{products}];"));
    em.open(format!("for (int j = 0; j < {products}; ++j)"));
    em.line("sum[j] = 0.f;");
    em.line(format!("for (int w = 0; w < {}; ++w) sum[j] += part[w * {sums} + (j * {cols} + c) * {rows} + r];", warps));
    em.close();
    store_products(em, m, &|j| format!("sum[{j}]"), root)?;
    em.close();
    em.close();
    Ok(())
}

/// The tensor-core GEMM: a block computes `tile.rows × tile.cols` outputs. Per `tile.k` step it
/// stages the activation rows (the prologue computed once per element) and each product's weight
/// rows (dequantized; a packed 4-bit weight 8 values per thread from one word and one scale) as
/// 16-bit MMA operands in shared memory; each of the 8 warps then multiplies a 16 × 32 block of
/// them with `mma.sync` (m16n8k8 on Turing, m16n8k16 after), f32 accumulators in the fragment
/// layout of the PTX ISA, and applies the epilogue to its accumulators' elements.
/// `split`: the offset and sizes of a split GEMM's part of the split-sums buffer.
fn gemm(
    em: &mut Emitter,
    (tile, threads): (&Tile, u32),
    m: &Matvec,
    root: ValueId,
    split: Option<(u64, SplitSumsBytes)>,
) -> Result<(), CudaError> {
    let mma = tile.mma.expect("a GEMM tile");
    let (bm, bn, bk, stride) = (tile.rows as usize, tile.cols as usize, tile.k as usize, footprint(tile).row_stride);
    let (rows, cols, depth, products) = (m.rows, m.cols, m.depth, m.dots.len());
    let (splits, steps) = (tile.splits as usize, depth.div_ceil(bk));
    let operand = mma.input;
    let to_word = match operand {
        DType::F16 => "f2h",
        DType::BF16 => "f2b",
        d => return Err(CudaError::Unsupported(format!("a tensor-core GEMM of {d}"))),
    };
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    em.line("const int g = lane >> 2, t = lane & 3;");
    em.line("const int wm = (warp & 3) * 16, wn = (warp >> 2) * 32;");
    // Split `splits` ways: block `b` adds tile `b / splits`'s steps from `split · steps / splits`
    // to `(split + 1) · steps / splits`, `split` being `b % splits`.
    em.line(format!("const int tile = block / {splits}, split = block % {splits};"));
    em.line(format!("const int m0 = tile / {} * {bm}, n0 = tile % {} * {bn};", cols.div_ceil(bn), cols.div_ceil(bn)));
    em.line(format!("float acc[{products}][4][4];"));
    em.line("#pragma unroll");
    em.line(format!("for (int j = 0; j < {products}; ++j) for (int f = 0; f < 4; ++f) for (int r = 0; r < 4; ++r) acc[j][f][r] = 0.f;"));
    em.open(format!(
        "for (int k0 = split * {steps} / {splits} * {bk}; k0 < (split + 1) * {steps} / {splits} * {bk}; k0 += {bk})"
    ));
    // Stage the activations, then each product's weights, as 16-bit words; zeros past the edges.
    // As many activations at once as keep about `GEMM_STAGING_READS` reads in flight, in whole
    // trips (a power of two, as the elements per thread are) so that none is left to run alone.
    let per_thread = (bm * bk).div_ceil(threads as usize) as u32;
    let fitting = GEMM_STAGING_READS / reads_per_element(em.k, m.lhs).max(1);
    let power_of_two = 1 << fitting.max(1).ilog2();
    let at_once = power_of_two.clamp(LOADS_IN_FLIGHT, per_thread.max(LOADS_IN_FLIGHT));
    batched_loop_of(em, "e", ("threadIdx.x", &(bm * bk).to_string(), "blockDim.x"), at_once, &mut |em| {
        em.line(format!("const int r = m0 + e / {bk}, kk = k0 + e % {bk};"));
        activation_at(em, m, "a", "r", "kk")?;
        em.line(format!("as_[e / {bk} * {stride} + e % {bk}] = {to_word}(a);"));
        Ok(())
    })?;
    for (j, &(_, w)) in m.dots.iter().enumerate() {
        let staged = j * bn * stride as usize;
        if let Some(p) = PackedWeight::of(em.k, w) {
            // A packed 4-bit weight: a thread stages 8 values from one word and one scale.
            let words = bk / 8;
            thread_loop(em, "e", ("threadIdx.x", bn * words, threads), LOADS_IN_FLIGHT, &mut |em| {
                em.line(format!("const int n = n0 + e / {words}, kk = k0 + e % {words} * 8;"));
                em.line(format!("u16* const dst = ws_ + {staged} + e / {words} * {stride} + e % {words} * 8;"));
                let (inside, n, kk) = clamped(em, ("n", cols), ("kk", depth), 8);
                let value = packed_values(em, &p, &n, &kk, depth)?;
                em.line(format!("for (int i = 0; i < 8; ++i) dst[i] = {inside} ? {to_word}({value}) : 0;"));
                Ok(())
            })?;
            continue;
        }
        thread_loop(em, "e", ("threadIdx.x", bn * bk, threads), LOADS_IN_FLIGHT, &mut |em| {
            em.line(format!("const int n = n0 + e / {bk}, kk = k0 + e % {bk};"));
            let (inside, n, kk) = clamped(em, ("n", cols), ("kk", depth), 1);
            let x = em.value(w, &[n, kk])?;
            em.line(format!("ws_[{staged} + e / {bk} * {stride} + e % {bk}] = {inside} ? {to_word}({x}) : 0;"));
            Ok(())
        })?;
    }
    em.line("__syncthreads();");
    let (mk, regs_a, regs_b) = (mma.k as usize, mma.k as usize / 4, mma.k as usize / 8);
    let instruction = format!("mma_{operand}_k{mk}");
    em.line("#pragma unroll");
    em.open(format!("for (int kk = 0; kk < {bk}; kk += {mk})"));
    // A fragment: rows g and g + 8 of the warp's 16, elements 2t, 2t + 1 (and 8 further on for k16).
    em.line(format!("const u16* ap = as_ + (wm + g) * {stride} + kk + 2 * t;"));
    em.line(format!("unsigned a[{regs_a}];"));
    em.line(format!("a[0] = ld_pair(ap); a[1] = ld_pair(ap + 8 * {stride});"));
    if regs_a == 4 {
        em.line(format!("a[2] = ld_pair(ap + 8); a[3] = ld_pair(ap + 8 * {stride} + 8);"));
    }
    em.line("#pragma unroll");
    em.open("for (int f = 0; f < 4; ++f)");
    for j in 0..products {
        // B fragment: column g of the 8, k elements 2t, 2t + 1 (and 8 further on for k16).
        em.line(format!(
            "const u16* bp{j} = ws_ + {} + (wn + f * 8 + g) * {stride} + kk + 2 * t;",
            j * bn * stride as usize
        ));
        em.line(format!("unsigned b{j}[{regs_b}];"));
        em.line(format!("b{j}[0] = ld_pair(bp{j});"));
        if regs_b == 2 {
            em.line(format!("b{j}[1] = ld_pair(bp{j} + 8);"));
        }
        em.line(format!("{instruction}(acc[{j}][f], a, b{j});"));
    }
    em.close();
    em.close();
    em.line("__syncthreads();");
    em.close();
    if let Some((offset, bytes)) = split {
        add_split_sums(em, (tile, threads), offset, bytes)?;
    }
    // Accumulator r of n-tile f: row g (+ 8 for r >= 2), column 2t + (r & 1).
    em.line("#pragma unroll");
    em.open("for (int f = 0; f < 4; ++f)");
    em.line("#pragma unroll");
    em.open("for (int r = 0; r < 4; ++r)");
    em.line("const int row = m0 + wm + g + (r >> 1) * 8, col = n0 + wn + f * 8 + 2 * t + (r & 1);");
    em.open(format!("if (row < {rows} && col < {cols})"));
    em.line(format!("const int i = row * {cols} + col;"));
    let sums: Vec<(ValueId, String)> =
        m.dots.iter().enumerate().map(|(j, &(dot, _))| (dot, format!("acc[{j}][f][r]"))).collect();
    store_root(em, &sums, root)?;
    em.close();
    em.close();
    em.close();
    Ok(())
}

/// A split GEMM's blocks each leave their partial sums in the split-sums buffer (from `offset`: the
/// tiles' counts of finished blocks, then the sums, thread-minor so a block's stores coalesce); the
/// last of a tile's blocks to count itself finished adds all of them, in split order whichever
/// finished last, and goes on to the epilogue, while the others return. It also resets the count
/// for the next launch. The fences order each block's sums before its count (and the last block's
/// reads after every count); the sums are read past L1 (`__ldcg`), which other SMs wrote.
fn add_split_sums(
    em: &mut Emitter,
    (tile, threads): (&Tile, u32),
    offset: u64,
    bytes: SplitSumsBytes,
) -> Result<(), CudaError> {
    let (splits, products) = (tile.splits, tile.products);
    // The template's accumulators: 4 n-tiles of 4 per product (a warp's 16 × 32 outputs).
    let per_thread = products * 16;
    // `split_sums_bytes` sizes the partial sums as the tile's outputs over the block's threads.
    if tile.rows * tile.cols / threads != 16 {
        return Err(CudaError::Unsupported(format!(
            "a split GEMM tile of {}x{} over {threads} threads: the template keeps 16 sums a thread",
            tile.rows, tile.cols
        )));
    }
    em.line(format!("unsigned* const count = reinterpret_cast<unsigned*>({SPLIT_SUMS} + {offset}) + tile;"));
    em.line(format!(
        "float* const partial = reinterpret_cast<float*>({SPLIT_SUMS} + {}) + tile * {} + threadIdx.x;",
        offset + bytes.counts,
        splits * per_thread * threads
    ));
    let each = |em: &mut Emitter, body: &str| {
        em.line("#pragma unroll");
        em.open(format!(
            "for (int j = 0; j < {products}; ++j) for (int f = 0; f < 4; ++f) for (int r = 0; r < 4; ++r)"
        ));
        em.line("const int e = j * 16 + f * 4 + r;");
        em.line(body);
        em.close();
    };
    each(em, &format!("partial[(split * {per_thread} + e) * {threads}] = acc[j][f][r];"));
    em.line("__threadfence();");
    em.line("__syncthreads();");
    em.line(format!("if (!__syncthreads_or(threadIdx.x == 0 && atomicAdd(count, 1u) == {})) return;", splits - 1));
    em.line("__threadfence();");
    em.line("if (threadIdx.x == 0) *count = 0;");
    each(
        em,
        &format!(
            "float sum = 0.f; for (int p = 0; p < {splits}; ++p) sum += __ldcg(partial + (p * {per_thread} + e) * {threads}); acc[j][f][r] = sum;"
        ),
    );
    Ok(())
}

/// Reads a GEMM thread keeps in flight while staging its activations: all of a 128-deep step's 32
/// elements of an activation read as it is (the down projection's), 8 of those of a norm's
/// prologue (7 reads each, for 56).
const GEMM_STAGING_READS: u32 = 64;

/// The memory reads computing one element of `v` in kernel `k` takes: the kernel's inputs and
/// weights it is computed from (each read once per element).
fn reads_per_element(k: &Function, v: ValueId) -> u32 {
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

/// The loads of packed weight `w`'s word holding its 8 values from `(n, k)` on (`k` a multiple of
/// 8) and of their scale: two C expressions.
fn packed_loads(
    em: &mut Emitter,
    w: &PackedWeight,
    n: &str,
    k: &str,
    depth: usize,
) -> Result<(String, String), CudaError> {
    let array = em.weight_arg(&w.q);
    // Row `n` starts at word `n · depth / 8` (the depth is whole words): no product of `n` and
    // the depth, which a 4-bit matrix of 2^31 values would overflow.
    let word = format!("ld_word({array}, {n} * {} + ({k} >> 3))", depth / 8);
    let scale = em.value(w.scale, &[n.to_string(), format!("({k} / {})", w.group)])?;
    Ok((word, scale))
}

/// Value `i` (a C variable) of the 8 in `word`, dequantized exactly as `dequantize` does:
/// `(float)q · scale`, rounded to the weight's type. An f16 weight, and where the GPU has bf16
/// arithmetic a bf16 weight of bf16 scales, is dequantized 8 values at a time, two per
/// instruction, into an array declared here (`dequant8_f16`, `dequant8_bf16`: the same values);
/// any other value by value.
fn packed_value(em: &mut Emitter, w: &PackedWeight, word: &str, scale: &str) -> String {
    let pairs = match w.dtype {
        DType::F16 => Some("dequant8_f16"),
        DType::BF16 if em.bf16_math && em.k.ty(w.scale).dtype == DType::BF16 => Some("dequant8_bf16"),
        _ => None,
    };
    if let Some(dequantize) = pairs {
        let values = em.fresh("dq");
        em.line(format!("float {values}[8];"));
        em.line(format!("{dequantize}({word}, {scale}, {values});"));
        return format!("{values}[i]");
    }
    rounded(w.dtype, &format!("(float)nib({word}, i) * {scale}"))
}

/// Loads the word of packed weight `w` holding its 8 values from `(n, k)` on and their scale into
/// variables; returns the f32 expression of value `i` among them.
fn packed_values(em: &mut Emitter, w: &PackedWeight, n: &str, k: &str, depth: usize) -> Result<String, CudaError> {
    let (word, scale) = packed_loads(em, w, n, k, depth)?;
    let word = em.var("unsigned", "q", &word);
    let scale = em.var("float", "s", &scale);
    Ok(packed_value(em, w, &word, &scale))
}
