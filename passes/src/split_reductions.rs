//! Splits a reduction of few long rows in two, for GPU targets: `reduce(x)` over the innermost
//! axis of `[..., E]` becomes `reduce(reduce(reshape(x, [..., E / L, L])))`, chunks of `L`
//! elements reduced first, then each row's `E / L` partial results.
//!
//! The kernel plan gives a reduction with fewer rows than the GPU has SMs a block per row, so a row
//! is read by one SM: E2B's greedy token reads its 262,144 logits that way twice a step (1 MB by
//! one of a T4G's 40 SMs each time). Split, the first reduction has `E / L` times as many rows,
//! enough blocks for every SM, and the second reads `E / L` values per row. This is also how a
//! softmax over a long context's slots gets split over them.
//!
//! Max and min are exact either way; a sum adds in another order, as the kernels' warps already do.

use crate::{Pass, PassError};
use g4c_ir::{Function, Instr, Module, Op, Target, TensorType};

pub struct SplitReductions;

/// Rows at least this long are split (then into at least 8 chunks).
const MIN_EXTENT: usize = 8 * CHUNK;
/// The longest chunk: the largest power of two up to this that divides the row is taken, and a row
/// without one of at least `CHUNK / 4` is left whole.
const CHUNK: usize = 1024;

impl Pass for SplitReductions {
    fn name(&self) -> &'static str {
        "split-reductions"
    }

    fn is_enabled(&self, target: &Target) -> bool {
        target.gpu.is_some()
    }

    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError> {
        let sm_count = target.gpu.as_ref().map_or(0, |g| g.sm_count as usize);
        for f in &mut module.functions {
            let old_body = std::mem::take(&mut f.body);
            for instr in old_body {
                match split(f, &instr, sm_count) {
                    Some(instrs) => f.body.extend(instrs),
                    None => f.body.push(instr),
                }
            }
        }
        Ok(())
    }
}

/// `instr` as its chunks' reshape, their reduction and the partials' reduction, if it is one to split.
fn split(f: &mut Function, instr: &Instr, sm_count: usize) -> Option<[Instr; 3]> {
    let Op::Reduce { input, kind, ref axes } = instr.op else { return None };
    let shape = f.ty(input).shape.clone();
    let rank = shape.len();
    let rows: usize = shape[..rank.saturating_sub(1)].iter().product();
    let chunk = match axes[..] {
        [axis] if axis + 1 == rank && rows < sm_count => chunk_of(shape[axis])?,
        _ => return None,
    };
    let name = f.value_name(instr.result).unwrap_or("reduce").to_string();
    let mut chunked_shape = shape[..rank - 1].to_vec();
    chunked_shape.extend([shape[rank - 1] / chunk, chunk]);
    let chunked =
        f.new_value(TensorType::new(f.ty(input).dtype, chunked_shape.clone()), Some(format!("{name}.chunks")));
    let partial_ty = TensorType::new(f.ty(instr.result).dtype, chunked_shape[..rank].to_vec());
    let partial = f.new_value(partial_ty, Some(format!("{name}.partial")));
    Some([
        Instr { result: chunked, op: Op::Reshape { x: input } },
        Instr { result: partial, op: Op::Reduce { input: chunked, kind, axes: vec![rank] } },
        Instr { result: instr.result, op: Op::Reduce { input: partial, kind, axes: vec![rank - 1] } },
    ])
}

/// The chunk length a row of `extent` elements is split into, if it is split.
fn chunk_of(extent: usize) -> Option<usize> {
    if extent < MIN_EXTENT {
        return None;
    }
    let chunk = (0..=CHUNK.trailing_zeros()).rev().map(|p| 1 << p).find(|c| extent.is_multiple_of(*c))?;
    (chunk >= CHUNK / 4).then_some(chunk)
}
