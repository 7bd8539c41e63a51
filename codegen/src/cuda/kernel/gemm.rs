//! The tensor-core GEMM of a prefill: a tile of outputs per block, its steps staged in shared
//! memory, optionally split over blocks whose partial sums the last one adds (`add_split_sums`).

use super::packed::packed_values;
use super::{activation_at, clamped, reads_per_element, store_root, SPLIT_SUMS};
use crate::cuda::elemental::Emitter;
use crate::cuda::loops::{batched_loop_of, thread_loop, LOADS_IN_FLIGHT};
use crate::cuda::CudaError;
use g4c_ir::plan::Tile;
use g4c_ir::{DType, ValueId};
use g4c_passes::{footprint, Matvec, PackedWeight, SplitSumsBytes};

/// The tensor-core GEMM: a block computes `tile.rows × tile.cols` outputs. Per `tile.k` step it
/// stages the activation rows (the prologue computed once per element) and each product's weight
/// rows (dequantized; a packed 4-bit weight 8 values per thread from one word and one scale) as
/// 16-bit MMA operands in shared memory; each of the 8 warps then multiplies a 16 × 32 block of
/// them with `mma.sync` (m16n8k8 on Turing, m16n8k16 after), f32 accumulators in the fragment
/// layout of the PTX ISA, and applies the epilogue to its accumulators' elements.
/// `split`: the offset and sizes of a split GEMM's part of the split-sums buffer.
pub(super) fn gemm(
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
