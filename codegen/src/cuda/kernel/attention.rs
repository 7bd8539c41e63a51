//! A decode step's attention over one chunk of cache slots per block: scores, softmax statistics
//! and weighted sums of the chunk, for every head at once.

use super::reduce::WarpPerOutput;
use super::{activation_at, Edges};
use crate::cuda::elemental::{linear, rounded, store, unlinear, Emitter, Index};
use crate::cuda::loops::{batched_loop_of, loads_at_once, thread_loop};
use crate::cuda::shared::SharedArrays;
use crate::cuda::CudaError;
use g4c_ir::plan::SlotSplit;
use g4c_ir::ValueId;
use g4c_passes::{attention_arrays, chunk_axis_of, reads_per_element, Attention};

/// The shared arrays of an attention chunk's block, as `attention_arrays` sizes them (so the fit
/// proof counts them): `act` (the staged queries, then the chunk's weighted sums), `sc` (scores),
/// `ex` (their exponentials, then the probabilities), `mx` and `sm` (each head's maximum and sum),
/// and `flag` (some slot visible; some probability not 0).
pub(super) fn attention_shared_arrays(shared: &mut SharedArrays, s: &SlotSplit) {
    let a = attention_arrays(s);
    shared.aligned("float", "act", a.staged);
    shared.array("float", "sc", a.scores);
    shared.array("float", "ex", a.exps);
    shared.array("float", "mx", a.per_head);
    shared.array("float", "sm", a.per_head);
    shared.array("int", "flag", a.flags);
}

/// A decode step's attention over one chunk of cache slots per block, for every query head
/// (`split-attention`). The block finds whether some head sees a slot of the chunk (every chunk
/// does, where the scores have no mask the template recognizes); where none does, it stages no
/// query, and reads no key (a masked score does not depend on it). Else the block stages the
/// queries (their prologue computed once per block); each warp takes slots of the chunk, two at a
/// time, reading a key row once for all heads, and lane 0 stores the scores (masked, padded) into
/// `sc`; a warp per head takes their maximum into `mx`; the
/// block the exponentials into `ex`; a warp per head their sum into `sm`; the block rounds the
/// exponentials to the values' type in `ex`; each thread the weighted sums of one feature for
/// every head, reading each value row once, into `act` (0s without reading a value where every
/// probability is 0: a chunk of masked slots, whose maximum `split-attention` floors); then the block
/// stores the chunk's results (weighted sums, maximum and sum per head) from there. The arrays
/// hold the block's chunk only (`share_chunk`), so the elemental emitter reads them at any
/// element of it.
pub(super) fn attention(
    em: &mut Emitter,
    s: &SlotSplit,
    a: &Attention,
    root: ValueId,
    warps: u32,
) -> Result<(), CudaError> {
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

    // Whether some head sees a slot of the chunk (padding slots none sees).
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
    em.line("if (seen) flag[0] = 1;");
    em.close();
    em.line("__syncthreads();");

    // The queries, staged.
    em.open("if (flag[0])");
    let at_once = loads_at_once(reads_per_element(em.k, a.scores.lhs));
    thread_loop(em, "e", ("threadIdx.x", heads * depth, warps * 32), at_once, &mut |em| {
        em.line(format!("const int r = e / {depth}, kk = e % {depth};"));
        activation_at(em, &a.scores, "q", ("r", "kk"), Edges::ANY)?;
        em.line(format!("act[r * {depth} + kk] = q;"));
        Ok(())
    })?;
    em.close();
    em.line("__syncthreads();");

    // Scores: a warp per slot, lanes along the key row, `at_once` slots at a time; a chunk no head
    // sees reads no key. In a chunk some head sees, every slot's key is read (at the end of what is
    // written, a chunk's worth at most that no head sees): a branch around each slot's loads kept
    // the next slot's waiting for this one's products, a memory latency per slot.
    let at_once = if slots.is_multiple_of(2 * warps as usize) { 2 } else { 1 };
    let keys_in_flight = attention_loads_in_flight(depth.div_ceil(32));
    em.open(format!("for (int jj0 = warp; jj0 < {slots}; jj0 += {at_once} * {warps})"));
    em.line(format!("float acc[{at_once}][{heads}] = {{}};"));
    em.open("if (flag[0])");
    em.line("#pragma unroll");
    em.open(format!("for (int u = 0; u < {at_once}; ++u)"));
    // Padding slots past the cache read its last one (their scores are the padding's).
    em.line(format!("const int j = min(block * {slots} + jj0 + u * {warps}, {});", cols - 1));
    thread_loop(em, "kk", ("lane", depth, 32), keys_in_flight, &mut |em| {
        let key_at: Index =
            std::iter::repeat_n("0".to_string(), key_rank - 2).chain(["j".into(), "kk".into()]).collect();
        let key = em.value(keys, &key_at)?;
        em.line("#pragma unroll");
        em.line(format!(
            "for (int r = 0; r < {heads}; ++r) acc[u][r] = fmaf(act[r * {depth} + kk], {key}, acc[u][r]);"
        ));
        Ok(())
    })?;
    em.close();
    em.close();
    em.line("#pragma unroll");
    em.line(format!(
        "for (int u = 0; u < {at_once}; ++u) for (int r = 0; r < {heads}; ++r) acc[u][r] = warp_sum(acc[u][r]);"
    ));
    em.open("if (lane == 0)");
    em.line("#pragma unroll");
    em.open(format!("for (int u = 0; u < {at_once}; ++u)"));
    em.line(format!("const int jj = jj0 + u * {warps};"));
    let product_dtype = em.k.ty(product).dtype;
    for r in 0..heads {
        em.open(format!("/* head {r} */"));
        let sum = em.var("float", "d", &rounded(product_dtype, &format!("acc[u][{r}]")));
        em.bound.insert(product, sum);
        let x = em.value(a.chunked, &at(&r.to_string(), Some("jj")))?;
        em.line(format!("sc[{} + jj] = {x};", r * slots));
        em.close();
    }
    em.bound.remove(&product);
    em.close();
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
/// together: all of them, up to 64. At a short context a few chunks' blocks do all the reading,
/// and at any context a chunk's block is alone on its SM (64 blocks on an H200's 132 SMs, 32 on
/// a T4's 40), each waiting a latency per trip: a lane's 16 key elements in one trip, not 2; a
/// feature's 64 values in 1, not 8. The registers are there: a block per SM leaves a thread 255.
fn attention_loads_in_flight(trips: usize) -> u32 {
    (trips as u32).clamp(1, 64)
}
