//! The forms with a thread per element written: `elementwise` (grid-stride over the root) and
//! `scatter` (a cache write, in place, a thread per slot written).

use crate::cuda::elemental::{linear, store, unlinear, Emitter};
use crate::cuda::CudaError;
use g4c_ir::ValueId;

/// Opens a loop of the call's threads over `i` in `0..n`, grid-stride over its `grid` blocks.
fn open_grid_stride(em: &mut Emitter, grid: u32, n: usize) {
    em.open(format!("for (int i = block * blockDim.x + threadIdx.x; i < {n}; i += {grid} * blockDim.x)"));
}

/// One thread per element of the root, grid-stride.
pub(super) fn elementwise(em: &mut Emitter, grid: u32, root: ValueId) -> Result<(), CudaError> {
    let ty = em.k.ty(root).clone();
    open_grid_stride(em, grid, ty.numel());
    let x = em.value(root, &unlinear("i", &ty.shape))?;
    em.line(store(ty.dtype, "out", "i", &x));
    em.close();
    Ok(())
}

/// One thread per element of the updates: each is stored at its row's slot, in place; negative
/// (padding) slots write nothing.
pub(super) fn scatter(
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
