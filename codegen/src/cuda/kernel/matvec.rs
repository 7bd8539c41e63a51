//! The tiled matvec: activations staged in shared memory, the weight streamed once; a warp per
//! output column for 16-bit weights (`matvec`), the block's threads splitting the contraction a
//! word at a time for 4-bit ones (`packed_matvec`).

use super::ahead::{prefetch_group, prefetch_weights, Share};
use super::packed::{packed_loads, packed_value};
use super::{activation_at, reads_only_weights, store_root, Edges, SPLIT_SUMS};
use crate::cuda::elemental::Emitter;
use crate::cuda::loops::{batched_loop, batched_loop_of, loads_at_once, thread_loop, trip_length, LOADS_IN_FLIGHT};
use crate::cuda::CudaError;
use g4c_ir::plan::{SplitSums, Tile};
use g4c_ir::{DType, ValueId};
use g4c_passes::{footprint, groups_per_block, reads_per_element, Matvec, PackedWeight};

/// The tiled matvec: per `k` step the block stages `rows × k` activations (the prologue computed
/// once per block), each warp multiplies them by its column of every weight (lanes striding `k`),
/// then reduces across lanes; lane 0 applies the epilogue to the products and stores. A block takes
/// `cols` columns, or strides over groups of them (`open_groups`). A packed 4-bit one is
/// `packed_matvec`, which may split the contraction over blocks (`split`: their parts of the
/// split-sums buffer).
pub(super) fn matvec(
    em: &mut Emitter,
    (tile, warps, grid): (&Tile, u32, u32),
    m: &Matvec,
    root: ValueId,
    split: Option<SplitSums>,
) -> Result<(), CudaError> {
    prefetch_weights(em, tile, m, &Share::of(tile, grid));
    if tile.packed {
        let unsupported = || CudaError::Unsupported(format!("{}: a packed tile of weights not packed", em.k.name));
        let weights = PackedWeight::all_of(em.k, m).ok_or_else(unsupported)?;
        return packed_matvec(em, (tile, warps, grid), m, &weights, (root, split));
    }
    let (rows, kt, cols) = (tile.rows, tile.k, tile.cols);
    let (n_total, products) = (m.cols, m.dots.len());
    if stepped(tile, m) || tile.splits > 1 {
        return Err(CudaError::Unsupported(format!(
            "{}: a strided tile of 16-bit weights staged a step at a time or split",
            em.k.name
        )));
    }
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    open_groups(em, (tile, grid), m, warps * 32)?;
    em.line(format!("const int n = g * {cols} + warp;"));
    em.line(format!("float acc[{products}][{rows}];"));
    em.line("#pragma unroll");
    em.line(format!("for (int j = 0; j < {products}; ++j) for (int r = 0; r < {rows}; ++r) acc[j][r] = 0.f;"));
    open_steps(em, tile, m, warps * 32)?;
    em.open(format!("if (n < {n_total})"));
    match stored_rows(em, m, kt) {
        Some(rows_of) => sixteen_bit_rows(em, (rows, kt), m, &rows_of)?,
        None => value_by_value(em, (rows, kt), m)?,
    }
    em.close();
    close_steps(em, tile);
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
    close_groups(em, tile, m);
    Ok(())
}

/// Whether a strided tile stages its contraction a step at a time (`k` short of the depth, not
/// split over blocks), each step once for all of the block's groups.
fn stepped(tile: &Tile, m: &Matvec) -> bool {
    tile.strided && tile.splits == 1 && (tile.k as usize) < m.depth
}

/// Opens the block's work on its groups of `cols` columns, the C variable `g` each group. A block
/// of a strided tile (`Tile::strided`) whose contraction is one step stages its activations once
/// (`k0` 0), then takes groups `block`, `block + grid`, …, asking L2 for each next group's
/// weights as it starts one; a block of a split tile likewise its share of the contraction, for
/// its groups (`Share`, the C variable `gi` counting them); a stepped one (`stepped`) stages each
/// step, then takes its groups (`gi` too), step after step; any other block takes group `block`.
fn open_groups(em: &mut Emitter, (tile, grid): (&Tile, u32), m: &Matvec, threads: u32) -> Result<(), CudaError> {
    if !tile.strided {
        em.open("/* the block's group of columns */");
        em.line("const int g = block;");
        return Ok(());
    }
    let groups = m.cols.div_ceil(tile.cols as usize);
    if stepped(tile, m) {
        em.open(format!("for (int k0 = 0; k0 < {}; k0 += {})", m.depth, tile.k));
        stage_activations(em, m, (tile.rows, tile.k), threads)?;
        em.open(format!("for (int g = block, gi = 0; g < {groups}; g += {grid}, ++gi)"));
        return Ok(());
    }
    let share = Share::of(tile, grid);
    em.line(format!("const int k0 = {};", share.k0));
    stage_activations(em, m, (tile.rows, tile.k), threads)?;
    match tile.splits {
        1 => em.open(format!("for (int g = block; g < {groups}; g += {grid})")),
        _ => em.open(format!("for (int g = {}, gi = 0; g < {groups}; g += {}, ++gi)", share.first, share.stride)),
    }
    prefetch_group(em, tile, m, &format!("(g + {})", share.stride), &share);
    Ok(())
}

/// Closes `open_groups`.
fn close_groups(em: &mut Emitter, tile: &Tile, m: &Matvec) {
    em.close();
    if stepped(tile, m) {
        em.close();
    }
}

/// Opens the loop over the contraction's steps of the tile's `k`, each staged first: a strided
/// block's steps are `open_groups`'.
fn open_steps(em: &mut Emitter, tile: &Tile, m: &Matvec, threads: u32) -> Result<(), CudaError> {
    if tile.strided {
        em.open("/* the one step, staged */");
        return Ok(());
    }
    em.open(format!("for (int k0 = 0; k0 < {}; k0 += {})", m.depth, tile.k));
    stage_activations(em, m, (tile.rows, tile.k), threads)
}

/// Closes `open_steps`: a step's barrier before the next one's staging overwrites its activations.
fn close_steps(em: &mut Emitter, tile: &Tile) {
    if !tile.strided {
        em.line("__syncthreads();");
    }
    em.close();
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
        activation_at(em, m, "a", ("r", "kk"), Edges::ANY)?;
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
/// at once, a trip of up to `WORDS_IN_FLIGHT` loads), every column is spread over all 256 threads
/// however deep the contraction, and shared memory is read once per `cols × products` words. A warp
/// per column read its column's words 8 at a time per lane, 8 KB in flight per block, and 4 bytes
/// of shared memory per weight: the 4-bit matvecs stayed under 10% of the H200's bandwidth. Each
/// thread's sums are combined over its warp, then over the warps through `part` (in `act`, or after
/// the activations where the block strides); thread `o` applies the epilogue to output `o` of the
/// group (row `o % rows` of column `o / rows`). Columns past the last are read as the last one,
/// and not stored: no branch around the loads.
///
/// Where the tile holds the whole contraction (a decode step's matvecs) and the scales are computed
/// from weights alone (`reads_only_weights`, the GEMM's rule too), a thread loads its first trip of
/// words and scales ahead (`Emitter::ahead`), before the block waits for the kernel before it and
/// stages the activations: the weights' memory latency and the activations' overlap, where the
/// loads waited for the staging's barrier. The trips after load in the loop. A strided block loads
/// its next group's first trip after its last products of a group, before it combines the sums:
/// the loads' latency and the combining overlap. A block of a split tile (`Tile::splits`) does all
/// this for its share of the contraction, and leaves each group's sums in the split-sums buffer
/// for the last of the blocks taking its groups to add up and store (`add_split_partials`).
fn packed_matvec(
    em: &mut Emitter,
    (tile, warps, grid): (&Tile, u32, u32),
    m: &Matvec,
    weights: &[PackedWeight],
    (root, split): (ValueId, Option<SplitSums>),
) -> Result<(), CudaError> {
    let (rows, kt, cols) = (tile.rows, tile.k, tile.cols);
    let (n_total, depth, products) = (m.cols, m.depth, weights.len() as u32);
    let (sums, steps) = (products * cols * rows, (WORDS_IN_FLIGHT / (cols * products)).max(1));
    // The partial sums after the activations where a block strides (`footprint`), else in them.
    let part = if tile.strided { rows * kt } else { 0 };
    // The footprint sized `act` for the plan's 8 warps' partial sums.
    if u64::from((part + warps * sums) * 4) > footprint(tile).smem_bytes {
        return Err(CudaError::Unsupported(format!(
            "{}: {warps} warps' partial sums do not fit the tile's shared memory",
            em.k.name
        )));
    }
    let trip = PackedTrip { weights, steps, cols, n_total, depth };
    let share = Share::of(tile, grid);
    let groups_per_block = groups_per_block(m, tile, grid);
    let partials = split.map(|sums| SplitPartials { sums, tile, groups_per_block });
    // A block whose contraction is one step (its share of it, where split).
    let one_step = depth <= kt as usize || tile.splits > 1;
    let first_trip_ahead = one_step && weights.iter().all(|w| reads_only_weights(em.k, w.scale));
    if first_trip_ahead {
        em.ahead(|em| {
            trip.declare(em);
            em.open("/* the thread's first trip */");
            match tile.splits {
                1 => em.line(format!("const int k0 = 0, wd0 = threadIdx.x, words = {};", depth / 8)),
                _ => em.line(format!(
                    "const int k0 = {}, wd0 = threadIdx.x, words = min({kt}, {depth} - k0) >> 3;",
                    share.k0
                )),
            }
            trip.load(em, &share.first)?;
            em.close();
            Ok::<(), CudaError>(())
        })?;
    }
    em.line("const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;");
    let stepped = stepped(tile, m);
    if stepped {
        // Each of the block's groups' sums over the steps so far, for the thread of its output.
        em.line(format!("float summed[{groups_per_block}][{products}];"));
    }
    open_groups(em, (tile, grid), m, warps * 32)?;
    em.line(format!("float acc[{products}][{cols}][{rows}] = {{}};"));
    open_steps(em, tile, m, warps * 32)?;
    em.line(format!("const int words = min({kt}, {depth} - k0) >> 3;"));
    em.open(format!("for (int wd0 = threadIdx.x; wd0 < words; wd0 += {steps} * blockDim.x)"));
    // The words and scales of the trip first, then the products: two loops, so that the loads
    // come first as written rather than as the compiler would schedule one.
    match first_trip_ahead {
        true => {
            em.open("if (wd0 != threadIdx.x)");
            trip.load(em, "g")?;
            em.close();
        }
        false => {
            trip.declare(em);
            trip.load(em, "g")?;
        }
    }
    each_word(em, steps);
    em.line(format!("float a[{rows}][8];"));
    em.line("#pragma unroll");
    em.line(format!("for (int r = 0; r < {rows}; ++r) ld8(act + r * {kt} + 8 * wd, a[r]);"));
    each_column(em, cols);
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
    if tile.strided && first_trip_ahead {
        // The next group's first trip, in flight while this group's sums are combined and stored.
        em.open(format!("if ((g + {}) * {cols} < {n_total})", share.stride));
        em.line("const int wd0 = threadIdx.x;");
        trip.load(em, &format!("(g + {})", share.stride))?;
        em.close();
    }
    close_steps(em, tile);
    // Over the warp, then over the warps, through `part`: after the activations where the block
    // strides, else in them (the last step's barrier is behind).
    em.line(format!("float* const part = act + {part};"));
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
    em.line(format!("const int c = threadIdx.x / {rows}, r = threadIdx.x % {rows}, n = g * {cols} + c;"));
    em.open(format!("if (n < {n_total})"));
    em.line(format!("float sum[{products}];"));
    em.open(format!("for (int j = 0; j < {products}; ++j)"));
    em.line("sum[j] = 0.f;");
    em.line(format!("for (int w = 0; w < {}; ++w) sum[j] += part[w * {sums} + (j * {cols} + c) * {rows} + r];", warps));
    em.close();
    if stepped {
        em.line(format!(
            "for (int j = 0; j < {products}; ++j) summed[gi][j] = (k0 == 0 ? 0.f : summed[gi][j]) + sum[j];"
        ));
        em.open(format!("if (k0 + {kt} >= {depth})"));
        store_products(em, m, &|j| format!("summed[gi][{j}]"), root)?;
        em.close();
    } else if let Some(partials) = &partials {
        em.line(format!("float* const partial = {};", partials.of_output("block", "gi", "threadIdx.x")));
        em.line(format!("for (int j = 0; j < {products}; ++j) partial[j] = sum[j];"));
    } else {
        store_products(em, m, &|j| format!("sum[{j}]"), root)?;
    }
    em.close();
    em.close();
    if tile.strided {
        // The next group's partial sums wait until these are read (and a stepped block's next
        // step's staging until every group's words of this one are).
        em.line("__syncthreads();");
    }
    close_groups(em, tile, m);
    if let Some(partials) = &partials {
        add_split_partials(em, (tile, &share), m, partials, root)?;
    }
    Ok(())
}

/// A split matvec block's partial sums in the split-sums buffer (`SplitSums`): for each of the
/// grid's blocks, of each of its `groups_per_block` groups, each output's (`rows × cols` of them,
/// thread-major) sum of each product, so that a thread's are adjacent.
struct SplitPartials<'t> {
    sums: SplitSums,
    tile: &'t Tile,
    groups_per_block: usize,
}

impl SplitPartials<'_> {
    /// The first of the partial sums of block `block` for its group `gi` and output `output` (C
    /// expressions).
    fn of_output(&self, block: &str, gi: &str, output: &str) -> String {
        let Tile { rows, cols, products, .. } = *self.tile;
        format!(
            "reinterpret_cast<float*>({SPLIT_SUMS} + {}) + (({block} * {} + {gi}) * {} + {output}) * {products}",
            self.sums.partials,
            self.groups_per_block,
            rows * cols
        )
    }

    /// Floats from a block's partial sums to the next block's.
    fn per_block(&self) -> usize {
        let Tile { rows, cols, products, .. } = *self.tile;
        self.groups_per_block * (rows * cols * products) as usize
    }
}

/// After a split matvec block has left its partial sums for each of its groups, the last of the
/// blocks taking the same groups (their count in the split-sums buffer, `last_block_of`) adds
/// theirs up, in the order of their shares whichever finished last, and applies the epilogue, its
/// threads taking the outputs of all its groups in turn; the sums are read past L1 (`__ldcg`),
/// which other SMs wrote.
fn add_split_partials(
    em: &mut Emitter,
    (tile, share): (&Tile, &Share),
    m: &Matvec,
    partials: &SplitPartials,
    root: ValueId,
) -> Result<(), CudaError> {
    let (rows, cols, splits, products) = (tile.rows, tile.cols, tile.splits, tile.products);
    let first = &share.first;
    em.line(format!(
        "unsigned* const count = reinterpret_cast<unsigned*>({SPLIT_SUMS} + {}) + {first};",
        partials.sums.counts
    ));
    em.open(format!("if (last_block_of(count, {splits}))"));
    let outputs = cols * rows;
    em.open(format!(
        "for (int o = threadIdx.x; o < {}; o += blockDim.x)",
        partials.groups_per_block * outputs as usize
    ));
    em.line(format!("const int gi = o / {outputs}, g = {first} + gi * {};", share.stride));
    em.line(format!("const int c = o % {outputs} / {rows}, r = o % {rows}, n = g * {cols} + c;"));
    em.open(format!("if (n < {})", m.cols));
    em.line(format!(
        "const float* const partial = {};",
        partials.of_output(&format!("({first} * {splits})"), "gi", &format!("(o % {outputs})"))
    ));
    em.line(format!("float sum[{products}];"));
    em.open(format!("for (int j = 0; j < {products}; ++j)"));
    em.line("sum[j] = 0.f;");
    em.line(format!(
        "for (int sp = 0; sp < {splits}; ++sp) sum[j] += __ldcg(partial + sp * {} + j);",
        partials.per_block()
    ));
    em.close();
    store_products(em, m, &|j| format!("sum[{j}]"), root)?;
    em.close();
    em.close();
    em.close();
    Ok(())
}

/// A packed matvec thread's trip: `steps` words of every column of the block (`cols`) and every
/// product, with their scales, in `q[steps][products][cols]` and `s[..]`.
struct PackedTrip<'w> {
    weights: &'w [PackedWeight],
    steps: u32,
    cols: u32,
    n_total: usize,
    depth: usize,
}

impl PackedTrip<'_> {
    fn declare(&self, em: &mut Emitter) {
        let (steps, products, cols) = (self.steps, self.weights.len(), self.cols);
        em.line(format!("unsigned q[{steps}][{products}][{cols}];"));
        em.line(format!("float s[{steps}][{products}][{cols}];"));
    }

    /// Loads the trip of words from `wd0` on of column group `group` (a C expression; C variables
    /// `k0`, `wd0` and `words`: the step's first value, the thread's first word and the step's
    /// words).
    fn load(&self, em: &mut Emitter, group: &str) -> Result<(), CudaError> {
        each_word(em, self.steps);
        each_column(em, self.cols);
        em.line(format!("const int n = min({group} * {} + c, {});", self.cols, self.n_total - 1));
        for (j, w) in self.weights.iter().enumerate() {
            let (word, scale) = packed_loads(em, w, "n", "(k0 + 8 * wd)", self.depth)?;
            em.line(format!("q[u][{j}][c] = {word};"));
            em.line(format!("s[u][{j}][c] = {scale};"));
        }
        em.close();
        em.close();
        em.close();
        Ok(())
    }
}

/// Opens the loop over a trip's words (`u`, word `wd` of the step), and the branch of those within
/// the step.
fn each_word(em: &mut Emitter, steps: u32) {
    em.line("#pragma unroll");
    em.open(format!("for (int u = 0; u < {steps}; ++u)"));
    em.line("const int wd = wd0 + u * blockDim.x;");
    em.open("if (wd < words)");
}

/// Opens the loop over the block's columns (`c`).
fn each_column(em: &mut Emitter, cols: u32) {
    em.line("#pragma unroll");
    em.open(format!("for (int c = 0; c < {cols}; ++c)"));
}
