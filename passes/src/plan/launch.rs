//! Tiling and the fit proof: each kernel's launch from its kind and the target's limits, and the
//! check that what the launch asks for fits one block of the target. The shared memory a kernel
//! needs comes from one function, `footprint`, which codegen also sizes its shared arrays
//! with, so the proof and the code cannot disagree.

use super::attention::attention_of;
use super::kind::{matvec_of, reads_per_element, reduction_of, rows_sharing_rhs, Matvec, PackedWeight, Reduction};
use super::prelude::{element_row_of, prelude_footprint, prelude_launch, prelude_of, staged_row_of};
use g4c_ir::plan::{KernelKind, Launch, ReduceSplit, SlotSplit, Tile};
use g4c_ir::{DType, Function, GpuLimits, MmaShape, Op};

/// Threads per block of every kernel: 8 warps.
const BLOCK: u32 = 256;
/// Warps per block.
const WARPS: usize = BLOCK as usize / 32;
/// Output columns of a matvec block: one per warp (a packed one's at most, every thread reading
/// a word of each).
const MATVEC_COLS: u32 = WARPS as u32;
/// A matvec warp's 32 lanes each read one weight per step (a packed matvec's threads a word of 8):
/// the contraction is staged in multiples of this.
const MATVEC_K_STEP: u32 = 32;
/// The most sums a thread of a packed matvec keeps (`products × cols × rows`): its columns are as
/// many as this allows, up to `MATVEC_COLS`.
const PACKED_SUMS: u32 = 16;
/// Blocks of a kernel that its register budget leaves room for on an SM (128 registers a thread
/// on every GPU g4c targets). A decode step's kernels are chains of latencies (a prelude, a
/// staging, the weights, the sums) with little work between them; a second block's chain overlaps
/// one's. Given the whole file, ptxas spent it on a packed matvec's first words loaded ahead of
/// its staging (`kernel/matvec.rs`): 160 registers on h200, one block an SM. The tensor-core GEMM,
/// the attention chunk (a block alone on its SM either way) and matvecs of more than
/// `SHARED_FILE_MAX_ROWS` rows take the whole file.
const BLOCKS_PER_SM: u32 = 2;
/// The most rows a matvec has to take `BLOCKS_PER_SM` blocks' share of the register file: a
/// decode step of up to 4 sequences (`g4c serve`'s batches), whose packed matvecs keep 16 sums a
/// thread whatever their rows (fewer columns a block for more rows) and fit 128 registers on t4g,
/// a100 and h200 without spilling (82–128 in E2B's decode of 4). E2B's decode of 8 spills 116–348
/// bytes on t4g at 128 (none on a100 or h200); more rows take the whole file, one block an SM.
const SHARED_FILE_MAX_ROWS: usize = 4;
/// Shared memory a matvec of many rows keeps free in the static limit for a prelude joining it
/// later (`prelude::merge`), beyond which it strides: a norm's statistics for 8 rows take 32
/// bytes.
const PRELUDE_ROOM: u32 = 256;
/// The most elements of a reduced extent a `WarpsPerExtent` thread stages (`staged_extent`): 4 KB
/// of shared memory a block.
const STAGED_PER_THREAD: u32 = 4;

/// A GEMM block's output tile: rows (tokens) and columns (output features); 8 warps of 16 × 32.
const GEMM_ROWS: u32 = 64;
const GEMM_COLS: u32 = 64;
/// The contractions a GEMM block may stage at a time, longest first: it takes the longest its
/// shared memory fits (beside its prelude) and its depth fills, at least the last. Each step costs
/// a round trip to memory and two barriers with little else to overlap them (the H200 profile had
/// 32-deep steps at about 3 µs each, a 6144-deep product of 48 blocks at 562 µs).
const GEMM_KS: [u32; 3] = [128, 64, 32];
/// The most memory reads a GEMM thread makes to load a step's activations into registers: its
/// `rows × k / BLOCK` elements, each counted as `reads_per_element` counts its prologue (every
/// value it reads, a norm weight the thread's elements share included, a prelude's statistic as
/// what the statistic reads). The step's `k` is shortened until they fit. The loads of a step are
/// issued together and held until the products, so their values share the thread's registers with
/// its accumulators and the step's staged words. E2B's per-layer gate GEMM reads 7 values for each
/// activation (the residual stream's three terms, two norms' statistics, two norm weights): at `k`
/// 128, 32 activations a thread and 224 reads, it spilled 16–104 bytes at 255 registers on t4g,
/// a100 and h200; at `k` 64, 112 reads, it takes 208 on t4g and spills none. Its q, k and v
/// projections read 4 for each (128 at `k` 128) and fit.
const STAGED_READS: u32 = 128;
/// 16-bit elements each staged GEMM row is padded by, so the fragment loads of a warp's 8 row
/// groups fall in distinct shared-memory banks (a row of `k + 8` elements, `k` a multiple of 32,
/// is `k / 2 + 4` words: consecutive rows start 4 banks apart, so 8 rows cover every bank once
/// per 4 lanes).
const GEMM_ROW_PAD: u32 = 8;
/// Steps (of its tile's `k`) each block of a split GEMM adds at least: with fewer, writing and
/// reading back the partial sums would take a large share of a block's work.
const MIN_SPLIT_STEPS: u32 = 2;
/// What splitting costs a block, in steps: writing its partial sums, counting itself finished, and
/// for the last block of a tile reading every block's sums back.
const SPLIT_COST_STEPS: u32 = 2;

/// What one block of a kernel holds in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The activation rows staged for the tile's `k`, per stage: f32 after the prologue for a
    /// matvec, 16-bit MMA operands for a GEMM.
    pub staged_activations: u64,
    /// The weight rows staged per stage (a GEMM's, 16-bit; a matvec streams its weights).
    pub staged_weights: u64,
    /// Elements from one staged GEMM row to the next.
    pub row_stride: u64,
    pub smem_bytes: u64,
}

/// Shared memory of a tile. A matvec: `stages` copies of `rows × k` f32 activations; the weights
/// are read once per block and never staged (a packed one's warps' partial sums, a float per warp
/// and sum of a thread, go in the same array after the last step, which is at least as large as
/// them; after the activations where a block strides over several groups of columns, whose
/// activations are the same). A GEMM: `stages` copies of its `rows` activation rows and
/// `products × cols` weight rows of `k` 16-bit elements, each row padded.
pub fn footprint(tile: &Tile) -> Footprint {
    let (rows, cols, k, stages) = (tile.rows as u64, tile.cols as u64, tile.k as u64, tile.stages as u64);
    if tile.mma.is_some() {
        let row_stride = k + GEMM_ROW_PAD as u64;
        let (activations, weights) = (rows * row_stride * 2, tile.products as u64 * cols * row_stride * 2);
        return Footprint {
            staged_activations: activations,
            staged_weights: weights,
            row_stride,
            smem_bytes: (activations + weights) * stages,
        };
    }
    let staged = rows * k * 4;
    let partials = match tile.packed {
        true => WARPS as u64 * tile.products as u64 * cols * rows * 4,
        false => 0,
    };
    let smem_bytes = match tile.strided {
        true => staged * stages + partials,
        false => (staged * stages).max(partials),
    };
    Footprint { staged_activations: staged, staged_weights: 0, row_stride: k, smem_bytes }
}

/// The shared arrays of an attention chunk's block, in floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionArrays {
    /// The queries of every head, staged; then the chunk's weighted sums of values.
    pub staged: u64,
    /// The chunk's scores.
    pub scores: u64,
    /// Their exponentials; then the probabilities as the weighted sums read them.
    pub exps: u64,
    /// Each head's maximum, and each head's sum (two arrays).
    pub per_head: u64,
    /// Two flags (ints): whether some slot of the chunk is visible, whether some probability is
    /// not 0.
    pub flags: u64,
}

pub fn attention_arrays(split: &SlotSplit) -> AttentionArrays {
    let (heads, slots, depth) = (split.heads as u64, split.slots as u64, split.depth as u64);
    AttentionArrays { staged: heads * depth, scores: heads * slots, exps: heads * slots, per_head: heads, flags: 2 }
}

/// Shared memory of an attention chunk's block: its arrays (`attention_arrays`), 4-byte floats and
/// ints.
pub fn attention_footprint(split: &SlotSplit) -> u64 {
    let a = attention_arrays(split);
    (a.staged + a.scores + a.exps + 2 * a.per_head + a.flags) * 4
}

/// The tensor-core shape a GEMM of `operand`s uses on `gpu`: its `m16n8` shape of the largest `k`.
fn gemm_mma(gpu: &GpuLimits, operand: DType) -> Option<MmaShape> {
    gpu.mma.iter().filter(|s| s.m == 16 && s.n == 8 && s.input == operand).max_by_key(|s| s.k).copied()
}

/// The launch of a kernel: prefill products of 16-bit operands a tensor-core GEMM tile; matvec
/// kernels the template applies to a tile whose `k` is the largest step multiple that fits the
/// target's static shared memory (at least one step, or the fit check fails), or to the whole
/// contraction where its blocks stride over their columns; reductions split
/// over a warp per output or the warps of a block (`ReduceSplit`); every other kernel one thread per
/// element it writes. Each has its prelude's shared memory besides.
pub(crate) fn launch(k: &Function, kind: KernelKind, gpu: &GpuLimits) -> Launch {
    let (registers, whole_file) = (registers_per_thread(gpu, BLOCK * BLOCKS_PER_SM), registers_per_thread(gpu, BLOCK));
    let prelude = prelude_launch(&prelude_of(k), BLOCK, false);
    let prelude_bytes = prelude.map_or(0, |p| prelude_footprint(&p, BLOCK)) as u32;
    // A decode step's attention: a block per chunk of slots, for every head.
    if let Some(a) = (kind == KernelKind::Attention).then(|| attention_of(k)).flatten() {
        let depth = a.scores.depth.max(a.features) as u32;
        let split = SlotSplit { heads: a.heads as u32, slots: a.slots as u32, depth };
        return Launch {
            grid: a.chunks as u32,
            block: BLOCK,
            smem_bytes: attention_footprint(&split) as u32 + prelude_bytes,
            registers: whole_file,
            tile: None,
            split: None,
            slots: Some(split),
            prelude,
        };
    }
    // A prefill product of 16-bit operands: tensor cores, a block per 64 × 64 outputs.
    let gemm = matches!(kind, KernelKind::GemmW4 | KernelKind::Gemm).then(|| matvec_of(k)).flatten();
    if let Some((m, mma)) = gemm.and_then(|m| {
        let operand = k.ty(m.lhs).dtype;
        let same = m.dots.iter().all(|&(_, w)| k.ty(w).dtype == operand);
        same.then(|| gemm_mma(gpu, operand)).flatten().map(|mma| (m, mma))
    }) {
        let tile_of = |k: u32| Tile {
            rows: GEMM_ROWS,
            cols: GEMM_COLS,
            k,
            stages: 1,
            mma: Some(mma),
            products: m.dots.len() as u32,
            packed: false,
            splits: 1,
            strided: false,
        };
        let fits = |k: u32| footprint(&tile_of(k)).smem_bytes + prelude_bytes as u64 <= gpu.smem_per_block as u64;
        let shortest = GEMM_KS[GEMM_KS.len() - 1];
        let filled = |k: u32| k <= (m.depth as u32).next_multiple_of(shortest);
        let reads = reads_per_element(k, m.lhs);
        let loaded = |k: u32| GEMM_ROWS * k / BLOCK * reads <= STAGED_READS;
        // Each test that holds for a `k` holds for the shorter ones: where none holds, the shortest
        // is the nearest (and the fit proof checks `fits` again).
        let k = GEMM_KS.into_iter().find(|&k| fits(k) && filled(k) && loaded(k)).unwrap_or(shortest);
        let tiles = (m.rows as u32).div_ceil(GEMM_ROWS) * (m.cols as u32).div_ceil(GEMM_COLS);
        let splits = gemm_splits(tiles, (m.depth as u32).div_ceil(k), gpu);
        let tile = Tile { splits, ..tile_of(k) };
        return Launch {
            grid: tiles * splits,
            block: BLOCK,
            smem_bytes: footprint(&tile).smem_bytes as u32 + prelude_bytes,
            registers: whole_file,
            tile: Some(tile),
            split: None,
            slots: None,
            prelude,
        };
    }
    let matvec = matches!(kind, KernelKind::MatvecW4 | KernelKind::Matvec).then(|| matvec_of(k)).flatten();
    if let Some(m) = matvec {
        let registers = if m.rows <= SHARED_FILE_MAX_ROWS { registers } else { whole_file };
        let (rows, products) = (m.rows as u32, m.dots.len() as u32);
        let packed = kind == KernelKind::MatvecW4 && PackedWeight::all_of(k, &m).is_some();
        let cols = match packed {
            true => (PACKED_SUMS / (rows * products)).clamp(1, MATVEC_COLS),
            false => MATVEC_COLS,
        };
        let whole = (m.depth as u32).div_ceil(MATVEC_K_STEP) * MATVEC_K_STEP;
        let fitting = (gpu.smem_per_block.saturating_sub(prelude_bytes) / (rows * 4) / MATVEC_K_STEP) * MATVEC_K_STEP;
        let k = whole.min(fitting).max(MATVEC_K_STEP);
        let groups = (m.cols as u32).div_ceil(cols);
        let tile = Tile { rows, cols, k, stages: 1, mma: None, products, packed, splits: 1, strided: false };
        // More groups than blocks fit the GPU at once: one wave of blocks, each striding over
        // groups. A block's staging (its prelude and its prologue included) was repeated for each
        // group, its weights' loads waited while it summed and stored; now it stages once, and
        // loads a group's words while it sums the group before. A block strides where the GPU
        // holds as many of its blocks at once as of the unstrided tile's (whose activations may
        // be staged a step at a time, and whose partial sums share their array): a block's
        // staging must not cost the SM blocks in flight. Its shared memory may go past the static
        // 48 KiB, up to the opt-in (a dynamic region): t4g's 12288-deep down projection stages 48
        // KiB of activations and its partial sums take 256 bytes more, and an SM holds one block
        // of either.
        //
        // Where the whole contraction does not fit the opt-in, a packed block stages it a step
        // (the unstrided tile's `k`) at a time, each step once for all of its groups, and adds
        // each group's sums up over the steps. E2B's 12288-deep down projection for 8 sequences
        // (384 KiB of activations) was 768 blocks, each staging all of them: 300 MB through L2
        // for 10 MB of weights.
        let unstrided_resident = resident_blocks(gpu, registers, footprint(&tile).smem_bytes as u32 + prelude_bytes);
        let strided = [whole, k]
            .into_iter()
            .filter(|&k| k == whole || packed)
            .map(|k| Tile { k, strided: true, ..tile })
            .map(|t| (t, footprint(&t).smem_bytes as u32 + prelude_bytes))
            .filter(|&(_, smem)| smem <= gpu.smem_per_block_optin)
            .map(|(t, smem)| (t, resident_blocks(gpu, registers, smem)))
            .find(|&(_, resident)| resident >= unstrided_resident);
        // A matvec of more rows than `SHARED_FILE_MAX_ROWS` takes the whole register file, one
        // block an SM by the plan; ptxas may use far fewer registers (82 for a sliding layer's
        // scores of 8 heads on t4g), and the GPU then holds more blocks than a strided grid
        // would have. It strides where its staging is large: where the static limit leaves its
        // whole contraction no room for a prelude (a norm's statistics, which would cut it into
        // two steps), even with a group a block. A decode of 8 sequences stages 8 rows of 1536
        // activations, 48 KiB: unstrided, each of a 6144-wide gate/up projection's 6144 blocks (a
        // column each) staged them, 300 MB through L2 for 9 MB of weights.
        let many_rows = rows as usize > SHARED_FILE_MAX_ROWS;
        let crowded = many_rows
            && footprint(&Tile { k: whole, ..tile }).smem_bytes as u32 + prelude_bytes + PRELUDE_ROOM
                > gpu.smem_per_block;
        let (tile, grid) = match strided {
            // As many groups a block as the wave needs, spread over as few blocks as that takes:
            // the same time, fewer stagings.
            Some((strided, resident)) if (groups > resident && !many_rows) || crowded => {
                (strided, groups.div_ceil(groups.div_ceil(resident)))
            }
            _ => (tile, groups),
        };
        let (tile, grid) = match tile.strided && packed {
            true => split_contraction(&m, (tile, grid), (registers, prelude_bytes), gpu),
            false => (tile, grid),
        };
        return Launch {
            grid,
            block: BLOCK,
            smem_bytes: footprint(&tile).smem_bytes as u32 + prelude_bytes,
            registers,
            tile: Some(tile),
            split: None,
            slots: None,
            prelude,
        };
    }
    let work = elements_written(k) as u32;
    let reduces = matches!(kind, KernelKind::Reduce | KernelKind::Dot | KernelKind::Gemm | KernelKind::GemmW4);
    let split = reduces.then(|| reduction_of(k)).flatten().and_then(|r| match r.contiguous {
        // Rows of at least a warp's width are reduced by a warp each: one thread summing a
        // 1536-wide norm row (or a head's scores over 4096 slots) alone is a long chain of
        // dependent adds, and threads each walking their own row read memory 32 rows apart.
        // Fewer rows than would fill the SMs a warp each are reduced by a block each, when at
        // least two of its warps get work.
        true if r.outputs.div_ceil(WARPS) < gpu.sm_count as usize && r.extent >= 64 => {
            Some((ReduceSplit::BlockPerOutput, r.outputs))
        }
        // At most a wave of blocks, striding over the outputs: a 128-token prefill's scores over
        // a 4096-slot cache are 4.2 M warps' work, most of it a masked slot's mask test, which
        // half a million blocks would spend more time being scheduled than working.
        true => (r.extent >= 32).then_some((ReduceSplit::WarpPerOutput, r.outputs.div_ceil(WARPS).min(wave(gpu)))),
        // Along a strided axis, adjacent threads already read adjacent inputs; what a thread per
        // output lacks is parallelism (E2B's 2048 weighted sums of values over 4096 slots would
        // be 8 blocks of threads each walking every slot): the block's warps split the extent.
        false => {
            let staged = staged_extent(k, &r);
            (r.extent >= WARPS).then_some((ReduceSplit::WarpsPerExtent { staged }, r.outputs.div_ceil(32)))
        }
    });
    if let Some((split, blocks)) = split {
        let prelude = prelude_launch(&prelude_of(k), BLOCK, staged_row_of(k, split).is_some());
        let prelude_bytes = prelude.map_or(0, |p| prelude_footprint(&p, BLOCK)) as u32;
        return Launch {
            grid: (blocks as u32).max(1),
            block: BLOCK,
            smem_bytes: split_footprint(split, BLOCK) as u32 + prelude_bytes,
            registers,
            tile: None,
            split: Some(split),
            slots: None,
            prelude,
        };
    }
    let prelude = prelude_launch(&prelude_of(k), BLOCK, element_row_of(k, BLOCK).is_some());
    Launch {
        grid: work.div_ceil(BLOCK).max(1),
        block: BLOCK,
        smem_bytes: prelude.map_or(0, |p| prelude_footprint(&p, BLOCK)) as u32,
        registers,
        tile: None,
        split: None,
        slots: None,
        prelude,
    }
}

/// The shallowest share of a contraction a block of a split matvec (`split_contraction`) takes:
/// 192 words a column, for 256 threads taking a word each (as a 1536-deep matvec's do).
const MIN_SPLIT_DEPTH: u32 = 1536;

/// A strided packed matvec whose blocks each stage the whole contraction for all their groups, and
/// together stage more bytes than its weights hold, splits the contraction over blocks
/// (`Tile::splits`): each stages a share `k` deep once, for every group of its stride, and the
/// last to finish of the blocks taking the same groups adds their partial sums
/// (`KernelCall::split_sums`). Of the splits that fit the opt-in and still fill the wave, the
/// fewest whose stagings weigh no more than the weights, else the most. E2B's 12288-deep down projection for 8 sequences on an H200
/// staged 8 × 12288 activations in each of 128 blocks: 50 MB through L2 for 9.4 MB of weights.
fn split_contraction(
    m: &Matvec,
    (tile, grid): (Tile, u32),
    (registers, prelude_bytes): (u32, u32),
    gpu: &GpuLimits,
) -> (Tile, u32) {
    let (depth, rows) = (m.depth as u32, u64::from(tile.rows));
    // The 4-bit values (their scales add an eighth).
    let weights = u64::from(depth) * m.cols as u64 * u64::from(tile.products) / 2;
    // The activations a grid's blocks stage, `k` each.
    let staged = |k: u32, grid: u32| u64::from(grid) * rows * u64::from(k) * 4;
    let groups = (m.cols as u32).div_ceil(tile.cols);
    let mut chosen = (tile, grid);
    if staged(depth, grid) <= weights {
        return chosen;
    }
    for splits in 2..=depth / MIN_SPLIT_DEPTH {
        let k = depth.div_ceil(splits).next_multiple_of(MATVEC_K_STEP);
        let split = Tile { k, splits: depth.div_ceil(k), ..tile };
        let smem = footprint(&split).smem_bytes as u32 + prelude_bytes;
        let per_split = resident_blocks(gpu, registers, smem) / split.splits;
        if smem > gpu.smem_per_block_optin || per_split == 0 {
            continue;
        }
        let grid = groups.div_ceil(groups.div_ceil(per_split)) * split.splits;
        chosen = (split, grid);
        if staged(k, grid) <= weights {
            break;
        }
    }
    chosen
}

/// Blocks each of a GEMM's `tiles` splits its contraction of `steps` over: the split whose blocks
/// take the fewest steps in all, in waves of one block per SM (what a GEMM block's register budget
/// leaves room for), each split block costing `SPLIT_COST_STEPS` more; each adds at least
/// `MIN_SPLIT_STEPS` steps. E2B's 128-token prefill has 1536-wide products of 48 tiles, 48 steps
/// deep: on an H200's 132 SMs 2 splits take one wave of 26 steps against 48; on a T4's 40 SMs 48
/// blocks take two waves of 48, the second a fifth full, where 3 splits take 4 waves of 18.
fn gemm_splits(tiles: u32, steps: u32, gpu: &GpuLimits) -> u32 {
    let time = |splits: u32| {
        let waves = (tiles * splits).div_ceil(gpu.sm_count);
        waves * (steps.div_ceil(splits) + if splits > 1 { SPLIT_COST_STEPS } else { 0 })
    };
    let candidates = 1..=(steps / MIN_SPLIT_STEPS).max(1);
    let best = candidates.clone().map(time).min().unwrap_or(0);
    // The model is rough: of splits within a tenth of the best, the fewest.
    candidates.into_iter().find(|&splits| time(splits) * 10 <= best * 11).unwrap_or(1)
}

/// A split GEMM's or matvec's part of its entry's split-sums buffer (`SplitSums`), in bytes: the
/// counts of finished blocks (a `u32` each, padded to 16 bytes) of a GEMM's tiles or of a
/// matvec's strides of groups of columns (the blocks taking the same groups), then every block's
/// partial sums (`f32`): of its tile's `rows × cols` outputs for each product, a matvec block's
/// for each of its groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitSumsBytes {
    pub counts: u64,
    pub partials: u64,
}

/// `SplitSumsBytes` of kernel `k` launched as `launch`, where its tile is split.
pub fn split_sums_bytes(k: &Function, launch: &Launch) -> Option<SplitSumsBytes> {
    let tile = launch.tile.filter(|t| t.splits > 1)?;
    let groups_per_block = match (tile.mma, matvec_of(k)) {
        (None, Some(m)) => groups_per_block(&m, &tile, launch.grid),
        _ => 1,
    };
    let per_block = u64::from(tile.rows * tile.cols * tile.products) * groups_per_block as u64;
    Some(SplitSumsBytes {
        counts: (u64::from(launch.grid / tile.splits) * 4).next_multiple_of(16),
        partials: u64::from(launch.grid) * per_block * 4,
    })
}

/// The most groups of `tile.cols` columns of matvec `m` a block of a grid of `grid` takes: one
/// unless the tile strides, where the blocks taking each share of the contraction
/// (`Tile::splits`) stride over all of them. Codegen sizes a block's arrays of per-group sums with
/// it, and `split_sums_bytes` the partial sums.
pub fn groups_per_block(m: &Matvec, tile: &Tile, grid: u32) -> usize {
    match tile.strided {
        true => m.cols.div_ceil(tile.cols as usize).div_ceil((grid / tile.splits) as usize),
        false => 1,
    }
}

/// Blocks of `BLOCK` threads, of `registers` each and `smem_bytes` of shared memory, that the GPU
/// holds at once (each block's shared memory counted with the 1 KB the driver reserves for it on
/// sm_80 and later, so as not to count more than fit).
fn resident_blocks(gpu: &GpuLimits, registers: u32, smem_bytes: u32) -> u32 {
    let by_registers = gpu.registers_per_sm / (registers * BLOCK);
    let by_smem = gpu.smem_per_sm / (smem_bytes + 1024);
    gpu.sm_count * by_registers.min(by_smem).max(1)
}

/// Blocks of `BLOCK` threads that fill every SM at once, at 32 registers a thread: a grid that
/// size runs in one wave.
fn wave(gpu: &GpuLimits) -> usize {
    resident_blocks(gpu, 32, 0) as usize
}

/// Shared memory of a split reduction's block of `block` threads: a warp per output combines
/// with shuffles (none); a block per output each warp's result; warps splitting the extent each
/// thread's (results are `float` or `int`, 4 bytes).
pub fn split_footprint(split: ReduceSplit, block: u32) -> u64 {
    match split {
        ReduceSplit::WarpPerOutput => 0,
        ReduceSplit::BlockPerOutput => block as u64 / 32 * 4,
        ReduceSplit::WarpsPerExtent { staged } => block.max(staged) as u64 * 4,
    }
}

/// Elements of the reduced extent a `WarpsPerExtent` block of `k` stages at a time: for a product
/// whose block's outputs share a row of its left-hand side (`rows_sharing_rhs`), the whole extent
/// in whole blocks, up to `STAGED_PER_THREAD` a thread; else none. A sliding layer's weighted sum
/// stages its 639 probabilities at once (768), where chunks of a block's 256 took three rounds of
/// a score load, a barrier and a value load.
fn staged_extent(k: &Function, r: &Reduction) -> u32 {
    let op = k.body.iter().find(|i| i.result == r.reduction).map(|i| &i.op);
    match op.and_then(|op| rows_sharing_rhs(k, op)) {
        Some(_) => BLOCK * (r.extent as u32).div_ceil(BLOCK).min(STAGED_PER_THREAD),
        None => 0,
    }
}

/// Elements a one-thread-per-element kernel writes: its root's, or a cache write's updates.
pub fn elements_written(k: &Function) -> usize {
    let root = k.results[0].value;
    match k.body.iter().find(|i| i.result == root).map(|i| &i.op) {
        Some(Op::UpdateSlots { updates, .. }) => k.ty(*updates).numel(),
        _ => k.ty(root).numel(),
    }
}

/// The registers each thread may use so that a block of `block` threads fits the SM's file.
fn registers_per_thread(gpu: &GpuLimits, block: u32) -> u32 {
    ((gpu.registers_per_sm / block) / 8 * 8).min(gpu.registers_per_thread)
}

/// The most shared memory a block of `launch` may take: a strided matvec's, the GPU's opt-in
/// (beyond the static 48 KiB a dynamic array, `SharedRegion`); any other's, the static limit
/// (bigger tiles there would trade blocks an SM for fewer steps, unmeasured).
pub(crate) fn smem_limit(launch: &Launch, gpu: &GpuLimits) -> u32 {
    match launch.tile.is_some_and(|t| t.strided) {
        true => gpu.smem_per_block_optin,
        false => gpu.smem_per_block,
    }
}

/// The fit proof of one kernel: shared memory (its template's and its prelude's) within the
/// block's static limit (an array ptxas sees too), or, for a strided matvec, the opt-in (beyond 48
/// KiB a dynamic array, `SharedRegion`); threads within the block's limit, and registers × threads
/// within the SM's file. On failure: what, how much it needs, and the limit.
pub(crate) fn check_fit(launch: &Launch, gpu: &GpuLimits) -> Result<(), (&'static str, u64, u64)> {
    let body = match (&launch.tile, launch.split, &launch.slots) {
        (Some(tile), _, _) => footprint(tile).smem_bytes,
        (None, Some(split), _) => split_footprint(split, launch.block),
        (None, None, Some(slots)) => attention_footprint(slots),
        (None, None, None) => 0,
    };
    let smem = body + launch.prelude.map_or(0, |p| prelude_footprint(&p, launch.block));
    let limit = smem_limit(launch, gpu);
    if smem != launch.smem_bytes as u64 || smem > limit as u64 {
        return Err(("bytes of shared memory", smem, limit as u64));
    }
    if launch.block > gpu.threads_per_block {
        return Err(("threads per block", launch.block as u64, gpu.threads_per_block as u64));
    }
    if launch.registers > gpu.registers_per_thread || launch.registers * launch.block > gpu.registers_per_sm {
        return Err(("registers per block", (launch.registers * launch.block) as u64, gpu.registers_per_sm as u64));
    }
    Ok(())
}
