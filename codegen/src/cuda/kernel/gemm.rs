//! The tensor-core GEMM of a prefill: a tile of outputs per block, its steps staged in shared
//! memory, optionally split over blocks whose partial sums the last one adds (`add_split_sums`).

use super::packed::{packed_loads, packed_value};
use super::{activation_at, clamped, reads_only_weights, store_root, Edges, SPLIT_SUMS};
use crate::cuda::elemental::Emitter;
use crate::cuda::loops::unrolled;
use crate::cuda::CudaError;
use g4c_ir::plan::{SplitSums, Tile};
use g4c_ir::{DType, ValueId};
use g4c_passes::{footprint, Matvec, PackedWeight};

/// The tensor-core GEMM: a block computes `tile.rows × tile.cols` outputs. Per `tile.k` step it
/// stages the activation rows (the prologue computed once per element) and each product's weight
/// rows (dequantized; a packed 4-bit weight 8 values per thread from one word and one scale) as
/// 16-bit MMA operands in shared memory; each of the 8 warps then multiplies a 16 × 32 block of
/// them with `mma.sync` (m16n8k8 on Turing, m16n8k16 after), f32 accumulators in the fragment
/// layout of the PTX ISA, and applies the epilogue to its accumulators' elements.
///
/// A thread loads the next step's elements into registers between this step's first barrier and
/// its products, and stores them to shared memory after the step's closing barrier
/// (`StepStaging`): each step's memory latency overlaps the step before's MMAs, where a step
/// waited out its loads and then multiplied (on the H200, 32-deep steps took about 3 µs each,
/// mostly waiting). Registers rather than a second stage of shared memory, which would halve the
/// tile's depth within Turing's shared memory, and Turing has no asynchronous copies.
/// `split`: a split GEMM's parts of the split-sums buffer.
pub(super) fn gemm(
    em: &mut Emitter,
    (tile, threads): (&Tile, u32),
    m: &Matvec,
    root: ValueId,
    split: Option<SplitSums>,
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
    let place = |em: &mut Emitter| {
        em.line(format!("const int tile = block / {splits}, split = block % {splits};"));
        em.line(format!(
            "const int m0 = tile / {} * {bm}, n0 = tile % {} * {bn};",
            cols.div_ceil(bn),
            cols.div_ceil(bn)
        ));
        em.line(format!(
            "const int k_first = split * {steps} / {splits} * {bk}, k_end = (split + 1) * {steps} / {splits} * {bk};"
        ));
    };
    let staging = StepStaging::new(em, (tile, threads), m, to_word)?;
    // The first step's weights, read from weights alone, load before the block waits for the
    // kernel before it (`Emitter::ahead`): with programmatic dependent launch their latency
    // overlaps that kernel's tail.
    let weights_ahead = staging.weights_only(em);
    if weights_ahead {
        em.ahead(|em| {
            place(em);
            staging.declare_weights(em);
            em.open("/* the block's first step's weights */");
            em.line("const int k0 = k_first;");
            staging.load_weights(em)?;
            em.close();
            Ok::<(), CudaError>(())
        })?;
    } else {
        place(em);
        staging.declare_weights(em);
    }
    em.line(format!("float acc[{products}][4][4];"));
    em.line("#pragma unroll");
    em.line(format!("for (int j = 0; j < {products}; ++j) for (int f = 0; f < 4; ++f) for (int r = 0; r < 4; ++r) acc[j][f][r] = 0.f;"));
    staging.declare_activations(em);
    em.open("/* the block's first step */");
    em.line("const int k0 = k_first;");
    staging.load_activations(em)?;
    if !weights_ahead {
        staging.load_weights(em)?;
    }
    em.close();
    em.open(format!("for (int k_step = k_first; k_step < k_end; k_step += {bk})"));
    staging.store(em)?;
    em.line("__syncthreads();");
    // The next step's loads, issued before this step's products: their latency overlaps the MMAs.
    em.open(format!("if (k_step + {bk} < k_end)"));
    em.line(format!("const int k0 = k_step + {bk};"));
    staging.load(em)?;
    em.close();
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
    if let Some(sums) = split {
        add_split_sums(em, (tile, threads), sums)?;
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

/// A split GEMM's blocks each leave their partial sums in the split-sums buffer (its tiles' counts
/// of finished blocks from `sums.counts`, the sums from `sums.partials`, thread-minor so a block's
/// stores coalesce); the last of a tile's blocks to count itself finished adds all of them, in
/// split order whichever finished last, and goes on to the epilogue, while the others return
/// (`last_block_of`, which also resets the count for the next launch); the sums are read past L1
/// (`__ldcg`), which other SMs wrote.
fn add_split_sums(em: &mut Emitter, (tile, threads): (&Tile, u32), sums: SplitSums) -> Result<(), CudaError> {
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
    em.line(format!("unsigned* const count = reinterpret_cast<unsigned*>({SPLIT_SUMS} + {}) + tile;", sums.counts));
    em.line(format!(
        "float* const partial = reinterpret_cast<float*>({SPLIT_SUMS} + {}) + tile * {} + threadIdx.x;",
        sums.partials,
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
    em.line(format!("if (!last_block_of(count, {splits})) return;"));
    each(
        em,
        &format!(
            "float sum = 0.f; for (int p = 0; p < {splits}; ++p) sum += __ldcg(partial + (p * {per_thread} + e) * {threads}); acc[j][f][r] = sum;"
        ),
    );
    Ok(())
}

/// What each thread of a GEMM block stages per step, held in registers from the step's loads to
/// its stores to shared memory: its elements `e = threadIdx.x + e_u · threads` of the activation
/// rows (`bm × bk`, the prologue computed, as 16-bit words, two to a register) and of each
/// product's weight rows (`bn × bk` 16-bit words likewise, or `bn × bk / 8` packed words with their
/// scales, dequantized when stored). Past the edges a thread reads the nearest element inside and
/// stages 0. Every count is a whole number per thread (even, for words two to a register), so
/// each array is indexed by unrolled loops alone: registers, not local memory.
struct StepStaging<'m> {
    m: &'m Matvec,
    /// Each product's weight, when packed.
    packed: Vec<Option<PackedWeight>>,
    tile: Tile,
    threads: usize,
    to_word: &'static str,
}

impl<'m> StepStaging<'m> {
    fn new(
        em: &Emitter,
        (tile, threads): (&Tile, u32),
        m: &'m Matvec,
        to_word: &'static str,
    ) -> Result<Self, CudaError> {
        let packed: Vec<_> = m.dots.iter().map(|&(_, w)| PackedWeight::of(em.k, w)).collect();
        let staging = StepStaging { m, packed, tile: *tile, threads: threads as usize, to_word };
        let (bm, bn, bk) = staging.tile_dims();
        // Elements of the step, and whether a thread keeps them two to a register.
        let mut counts = vec![(bm * bk, true)];
        counts.extend(staging.packed.iter().map(|p| match p {
            Some(_) => (bn * staging.words(), false),
            None => (bn * bk, true),
        }));
        let uneven = |&&(c, paired): &&(usize, bool)| {
            !c.is_multiple_of(staging.threads) || paired && !staging.each(c).is_multiple_of(2)
        };
        if let Some((c, _)) = counts.iter().find(uneven) {
            return Err(CudaError::Unsupported(format!(
                "{}: a GEMM step stages {c} elements of a {bm}x{bn}x{bk} tile, not a whole (even) number for each of {threads} threads",
                em.k.name
            )));
        }
        Ok(staging)
    }

    fn tile_dims(&self) -> (usize, usize, usize) {
        (self.tile.rows as usize, self.tile.cols as usize, self.tile.k as usize)
    }

    /// Packed words of a weight row's step.
    fn words(&self) -> usize {
        self.tile.k as usize / 8
    }

    /// Elements of `n` a thread stages.
    fn each(&self, n: usize) -> usize {
        n / self.threads
    }

    fn declare_activations(&self, em: &mut Emitter) {
        let (bm, _, bk) = self.tile_dims();
        em.line(format!("unsigned a_st[{}];", self.each(bm * bk) / 2));
    }

    fn declare_weights(&self, em: &mut Emitter) {
        let (_, bn, bk) = self.tile_dims();
        for (j, p) in self.packed.iter().enumerate() {
            match p {
                Some(_) => {
                    em.line(format!("unsigned q{j}_st[{n}]; float s{j}_st[{n}];", n = self.each(bn * self.words())))
                }
                None => em.line(format!("unsigned w{j}_st[{}];", self.each(bn * bk) / 2)),
            }
        }
    }

    /// Whether every weight the step stages is computed from weights alone (a packed weight's
    /// scales too), which no kernel writes: what a block may load before it waits for the kernel
    /// before.
    fn weights_only(&self, em: &Emitter) -> bool {
        self.packed.iter().zip(&self.m.dots).all(|(p, &(_, w))| match p {
            Some(p) => reads_only_weights(em.k, p.scale),
            None => reads_only_weights(em.k, w),
        })
    }

    /// `body` for each of a thread's `n` elements, unrolled (`e`, and its place `e_u`).
    fn each_element(
        &self,
        em: &mut Emitter,
        n: usize,
        body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        unrolled(em, "e", ("threadIdx.x", &self.threads.to_string()), self.each(n) as u32, body)
    }

    /// Loads the step from `k0` (a C variable) into the registers.
    fn load(&self, em: &mut Emitter) -> Result<(), CudaError> {
        self.load_activations(em)?;
        self.load_weights(em)
    }

    fn load_activations(&self, em: &mut Emitter) -> Result<(), CudaError> {
        let ((bm, _, bk), to_word) = (self.tile_dims(), self.to_word);
        let edges = Edges::of_tiles((self.m.rows, bm), (self.m.depth, bk));
        self.each_element(em, bm * bk, &mut |em| {
            em.line(format!("const int r = m0 + e / {bk}, kk = k0 + e % {bk};"));
            activation_at(em, self.m, "a", ("r", "kk"), edges)?;
            em.line(pack_word("a_st", &format!("{to_word}(a)")));
            Ok(())
        })
    }

    fn load_weights(&self, em: &mut Emitter) -> Result<(), CudaError> {
        let ((_, bn, bk), to_word, words) = (self.tile_dims(), self.to_word, self.words());
        let (cols, depth) = (self.m.cols, self.m.depth);
        let edges = Edges::of_tiles((cols, bn), (depth, bk));
        for (j, (p, &(_, w))) in self.packed.iter().zip(&self.m.dots).enumerate() {
            match p {
                Some(p) => self.each_element(em, bn * words, &mut |em| {
                    em.line(format!("const int n = n0 + e / {words}, kk = k0 + e % {words} * 8;"));
                    let (inside, n, kk) = clamped(em, ("n", cols), ("kk", depth), 8, edges);
                    let (word, scale) = packed_loads(em, p, &n, &kk, depth)?;
                    let word = em.var("unsigned", "q", &word);
                    // Outside, a word of zeros scaled by 0: +0 for each of its 8 values.
                    em.line(format!("q{j}_st[e_u] = {};", inside.select(&word, "0u")));
                    em.line(format!("s{j}_st[e_u] = {};", inside.select(&scale, "0.f")));
                    Ok(())
                })?,
                None => self.each_element(em, bn * bk, &mut |em| {
                    em.line(format!("const int n = n0 + e / {bk}, kk = k0 + e % {bk};"));
                    let (inside, n, kk) = clamped(em, ("n", cols), ("kk", depth), 1, edges);
                    let x = em.value(w, &[n, kk])?;
                    em.line(pack_word(&format!("w{j}_st"), &inside.select(&format!("{to_word}({x})"), "0")));
                    Ok(())
                })?,
            }
        }
        Ok(())
    }

    /// Stores the registers into the staged arrays `as_` and `ws_`.
    fn store(&self, em: &mut Emitter) -> Result<(), CudaError> {
        let ((bm, bn, bk), to_word, words) = (self.tile_dims(), self.to_word, self.words());
        let stride = footprint(&self.tile).row_stride;
        self.each_element(em, bm * bk, &mut |em| {
            em.line(format!("as_[e / {bk} * {stride} + e % {bk}] = {};", unpack_word("a_st")));
            Ok(())
        })?;
        for (j, p) in self.packed.iter().enumerate() {
            let staged = j * bn * stride as usize;
            match p {
                Some(p) => self.each_element(em, bn * words, &mut |em| {
                    em.line(format!("u16* const dst = ws_ + {staged} + e / {words} * {stride} + e % {words} * 8;"));
                    let value = packed_value(em, p, &format!("q{j}_st[e_u]"), &format!("s{j}_st[e_u]"));
                    em.line(format!("for (int i = 0; i < 8; ++i) dst[i] = {to_word}({value});"));
                    Ok(())
                })?,
                None => self.each_element(em, bn * bk, &mut |em| {
                    let word = unpack_word(&format!("w{j}_st"));
                    em.line(format!("ws_[{staged} + e / {bk} * {stride} + e % {bk}] = {word};"));
                    Ok(())
                })?,
            }
        }
        Ok(())
    }
}

/// Stores 16-bit word `word` as element `e_u` (an unrolled loop's index) of `array`, two to each
/// of its 32-bit elements: a register holds two, where a `u16` would take one of its own (E2B's
/// per-layer gate GEMM, 7 reads for each of 32 activations, spilled on sm_90 with them unpacked).
fn pack_word(array: &str, word: &str) -> String {
    format!("{array}[e_u >> 1] = (e_u & 1) ? ({array}[e_u >> 1] | (unsigned)({word}) << 16) : (unsigned)({word});")
}

/// Element `e_u` of an array `pack_word` filled.
fn unpack_word(array: &str) -> String {
    format!("(u16)({array}[e_u >> 1] >> (e_u & 1) * 16)")
}
