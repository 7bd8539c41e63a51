//! Tiling and the fit proof: each kernel's launch from its kind and the target's limits, and the
//! check that what the launch asks for fits one block of the target. The shared memory a kernel
//! needs comes from one function, `footprint`, which codegen also sizes its `__shared__` arrays
//! with, so the proof and the code cannot disagree.

use super::kind::{matvec_of, row_reduce_of};
use g4c_ir::plan::{KernelKind, Launch, Tile};
use g4c_ir::{Function, GpuLimits, Op};

/// Threads per block of every kernel: 8 warps.
const BLOCK: u32 = 256;
/// Output columns of a matvec block: one per warp.
const MATVEC_COLS: u32 = BLOCK / 32;
/// A matvec warp's 32 lanes each read one weight (or, packed 4-bit, one word of 8) per step: the
/// contraction is staged in multiples of this.
const MATVEC_K_STEP: u32 = 32;

/// What one block of a kernel holds in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The activation rows staged for the tile's `k`, as f32 (after the prologue), per stage.
    pub staged_activations: u64,
    pub smem_bytes: u64,
}

/// Shared memory of a matvec tile: `stages` copies of `rows × k` f32 activations. The weights are
/// read once per block and never staged.
pub fn footprint(tile: &Tile) -> Footprint {
    let staged = tile.rows as u64 * tile.k as u64 * 4;
    Footprint { staged_activations: staged, smem_bytes: staged * tile.stages as u64 }
}

/// The launch of a kernel: matvec kernels the template applies to get a tile whose `k` is the
/// largest step multiple that fits the target's static shared memory (at least one step, or the
/// fit check fails); every other kernel one thread per element it writes.
pub(crate) fn launch(k: &Function, kind: KernelKind, gpu: &GpuLimits) -> Launch {
    let registers = registers_per_thread(gpu, BLOCK);
    let matvec = matches!(kind, KernelKind::MatvecW4 | KernelKind::Matvec).then(|| matvec_of(k)).flatten();
    if let Some(m) = matvec {
        let rows = m.rows as u32;
        let whole = (m.depth as u32).div_ceil(MATVEC_K_STEP) * MATVEC_K_STEP;
        let fitting = (gpu.smem_per_block / (rows * 4) / MATVEC_K_STEP) * MATVEC_K_STEP;
        let tile = Tile { rows, cols: MATVEC_COLS, k: whole.min(fitting).max(MATVEC_K_STEP), stages: 1 };
        return Launch {
            grid: (m.cols as u32).div_ceil(MATVEC_COLS),
            block: BLOCK,
            smem_bytes: footprint(&tile).smem_bytes as u32,
            registers,
            tile: Some(tile),
            warp_per_output: false,
        };
    }
    let work = elements_written(k) as u32;
    // Rows of at least a warp's width are reduced by a warp each: one thread summing a 1536-wide
    // norm row (or a head's scores over 4096 slots) alone is a long chain of dependent adds, and
    // threads each walking their own cache row read memory 32 rows apart.
    let reduces = matches!(kind, KernelKind::Reduce | KernelKind::Dot | KernelKind::Gemm | KernelKind::GemmW4);
    let row_reduce = reduces.then(|| row_reduce_of(k)).flatten().filter(|r| r.extent >= 32);
    if let Some(r) = row_reduce {
        return Launch {
            grid: (r.outputs as u32).div_ceil(BLOCK / 32).max(1),
            block: BLOCK,
            smem_bytes: 0,
            registers,
            tile: None,
            warp_per_output: true,
        };
    }
    Launch {
        grid: work.div_ceil(BLOCK).max(1),
        block: BLOCK,
        smem_bytes: 0,
        registers,
        tile: None,
        warp_per_output: false,
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

/// The fit proof of one kernel: shared memory (static, so ptxas sees it too) within the block's
/// limit, threads within the block's, and registers × threads within the SM's file. On failure:
/// what, how much it needs, and the limit.
pub(crate) fn check_fit(launch: &Launch, gpu: &GpuLimits) -> Result<(), (&'static str, u64, u64)> {
    if let Some(tile) = &launch.tile {
        let smem = footprint(tile).smem_bytes;
        if smem != launch.smem_bytes as u64 || smem > gpu.smem_per_block as u64 {
            return Err(("bytes of static shared memory", smem, gpu.smem_per_block as u64));
        }
    }
    if launch.block > gpu.threads_per_block {
        return Err(("threads per block", launch.block as u64, gpu.threads_per_block as u64));
    }
    if launch.registers > gpu.registers_per_thread || launch.registers * launch.block > gpu.registers_per_sm {
        return Err(("registers per block", (launch.registers * launch.block) as u64, gpu.registers_per_sm as u64));
    }
    Ok(())
}
