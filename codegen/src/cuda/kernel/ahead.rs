//! What a kernel call's blocks do before they await the kernel before them: ask L2 for the weight
//! rows they will read.
//!
//! Launched with programmatic dependent launch (sm_90, `G4C_CUDA_PDL`), a kernel's blocks start
//! while the kernel before it still runs, and each waits for it to finish before touching memory
//! (`await_previous_kernel`). No kernel writes a weight, so a block may fetch its weights before
//! that wait. A decode step's matvecs read a few megabytes, a few kilobytes per block, each once:
//! after the wait, a block's first loads waited out the DRAM latency with little else in flight.
//! Fetched ahead, they wait out only L2's, and the DRAM reads overlap the previous kernel's tail and
//! the gap between the two. Launched without it, the prefetch comes just before the loads it
//! serves: a few instructions, no bytes more.
//!
//! A matvec's block reads whole rows of each weight, those of its `cols` columns, contiguous in
//! the weights' row-major layout: a 4-bit weight's words and its scales, or a 16-bit weight. A
//! GEMM's tiles are not fetched ahead (a GEMM loads its first step's weights ahead itself, into
//! registers: `gemm.rs`), nor are an attention's caches and everything written by a kernel.
//!
//! A block striding over a matvec's groups of columns (`Tile::strided`) asks, as it starts each
//! group, for the next one's rows (`prefetch_group`), on every GPU: there the request comes a whole
//! group's work before the loads it serves.

use super::Emitter;
use g4c_ir::plan::Tile;
use g4c_ir::{TensorType, ValueId};
use g4c_passes::{Matvec, PackedWeight};

/// Emits, ahead of the wait (`Emitter::ahead`), the prefetches of the weight rows a block of
/// matvec `m` tiled by `tile` reads for its first group of columns (`share.first`).
pub(super) fn prefetch_weights(em: &mut Emitter, tile: &Tile, m: &Matvec, share: &Share) {
    let rows = rows_read(em, tile, m);
    if !rows.is_empty() {
        em.ahead(|em| prefetch_rows(em, &rows, (tile, m), ("prefetch_l2", &share.first), share));
    }
}

/// Emits the prefetches of the weight rows of column group `group` (a C expression) of matvec `m`,
/// if there is such a group: a block striding over groups asks for its next group's while it
/// works on one.
pub(super) fn prefetch_group(em: &mut Emitter, tile: &Tile, m: &Matvec, group: &str, share: &Share) {
    let rows = rows_read(em, tile, m);
    if !rows.is_empty() {
        em.open(format!("if ({group} * {} < {})", tile.cols, m.cols));
        prefetch_rows(em, &rows, (tile, m), ("prefetch_l2_lines", group), share);
        em.close();
    }
}

/// The weight rows a block of matvec `m` reads, those whose block's bytes count in 32 bits.
fn rows_read(em: &mut Emitter, tile: &Tile, m: &Matvec) -> Vec<WeightRows> {
    m.dots
        .iter()
        .flat_map(|&(_, w)| weight_rows(em, m, w))
        .filter(|r| r.row_bytes * u64::from(tile.cols) <= u64::from(u32::MAX))
        .collect()
}

/// Prefetches of `rows` for the `tile.cols` columns of `group` (of `m.cols`), by the prelude's
/// function `prefetch`: whole rows, contiguous for the group, or a split tile's block's share of
/// each (`Share::k0`), a row at a time.
fn prefetch_rows(
    em: &mut Emitter,
    rows: &[WeightRows],
    (tile, m): (&Tile, &Matvec),
    (prefetch, group): (&str, &str),
    share: &Share,
) {
    let (cols, n_total, depth) = (tile.cols, m.cols, m.depth);
    em.line(format!("const int ahead_first = {group} * {cols}, ahead_rows = min({cols}, {n_total} - ahead_first);"));
    if tile.splits == 1 {
        for WeightRows { array, row_bytes } in rows {
            em.line(format!(
                "{prefetch}((const u8*){array} + (unsigned long long)ahead_first * {row_bytes}, ahead_rows * {row_bytes}u);"
            ));
        }
        return;
    }
    // A row's bytes are proportional to the contraction (words, scales or 16-bit values): the
    // share's are those from its first value's byte to its end's, rounded out.
    em.line(format!(
        "const unsigned long long ahead_k0 = {}, ahead_end = min({} + {}, {depth});",
        share.k0, share.k0, tile.k
    ));
    em.open("for (int ahead_c = 0; ahead_c < ahead_rows; ++ahead_c)");
    for WeightRows { array, row_bytes } in rows {
        em.open("/* the share of a row */");
        em.line(format!(
            "const unsigned long long from = ahead_k0 * {row_bytes} / {depth}, to = (ahead_end * {row_bytes} + {}) / {depth};",
            depth - 1
        ));
        em.line(format!(
            "{prefetch}((const u8*){array} + (unsigned long long)(ahead_first + ahead_c) * {row_bytes} + from, (unsigned)(to - from));"
        ));
        em.close();
    }
    em.close();
}

/// Where a block of a matvec tile works (C expressions): its first group of columns, the stride to
/// its next (`Tile::strided`), and the first value of its share of the contraction, which a split
/// tile's blocks (`Tile::splits`) take in turn: block `b` the groups from `b / splits`, share
/// `b % splits`.
pub(super) struct Share {
    pub first: String,
    pub stride: u32,
    pub k0: String,
}

impl Share {
    pub fn of(tile: &Tile, grid: u32) -> Share {
        match tile.splits {
            1 => Share { first: "block".into(), stride: grid, k0: "0".into() },
            splits => Share {
                first: format!("(block / {splits})"),
                stride: grid / splits,
                k0: format!("(block % {splits} * {})", tile.k),
            },
        }
    }
}

/// A weight stored as `N` rows (the matvec's columns) of `row_bytes` each.
struct WeightRows {
    array: String,
    row_bytes: u64,
}

/// The arrays matvec `m`'s product with weight `w` reads by rows: a 4-bit weight's words and its
/// scales (when a weight `[N, groups]`), or a weight `[1.., N, depth]` read as stored.
fn weight_rows(em: &mut Emitter, m: &Matvec, w: ValueId) -> Vec<WeightRows> {
    let Some(packed) = PackedWeight::of(em.k, w) else {
        return weight_as_rows(em, w, m).into_iter().collect();
    };
    let words = WeightRows { array: em.weight_arg(&packed.q), row_bytes: m.depth as u64 / 2 };
    std::iter::once(words).chain(weight_as_rows(em, packed.scale, m)).collect()
}

/// Weight `v` as rows of the matvec's columns, when it is a weight `[1.., N, D]` read as stored.
fn weight_as_rows(em: &mut Emitter, v: ValueId, m: &Matvec) -> Option<WeightRows> {
    let name = em.weight_name(v)?;
    let TensorType { shape, dtype } = em.k.ty(v);
    let rank = shape.len();
    let rows = rank >= 2 && shape[rank - 2] == m.cols && shape[..rank - 2].iter().all(|&d| d == 1);
    let row_bits = shape.last().map(|&d| d as u64 * dtype.bits())?;
    (rows && row_bits % 8 == 0).then(|| WeightRows { array: em.weight_arg(name), row_bytes: row_bits / 8 })
}
