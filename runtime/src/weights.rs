//! Where weights come from: anything that can produce the tensor a `WeightDecl` names. Implement
//! `bytes` (raw little-endian bytes in the declared dtype, which backends upload as they are) or
//! `load` (a host tensor); each has a default in terms of the other.

use crate::error::{Result, RuntimeError};
use crate::tensor::{convert_float_bytes, Tensor};
use g4c_frontend::Checkpoint;
use g4c_ir::WeightDecl;
use std::borrow::Cow;

pub trait WeightStore {
    fn bytes(&self, decl: &WeightDecl) -> Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.load(decl)?.to_bytes()))
    }

    fn load(&self, decl: &WeightDecl) -> Result<Tensor> {
        let bytes = self.bytes(decl)?;
        Tensor::from_bytes(decl.ty.clone(), &bytes).map_err(|message| weight_error(decl, message))
    }

    /// A hint that the caller is done with `decl`'s bytes (copied to a device, say).
    fn release(&self, _decl: &WeightDecl) {}
}

fn weight_error(decl: &WeightDecl, message: String) -> RuntimeError {
    RuntimeError::Weight { name: decl.name.clone(), source_key: decl.source.clone(), message }
}

impl WeightStore for Checkpoint {
    /// The tensor's bytes straight from the mmap; converted to the declared float type when a pass
    /// chose to store the weight in its compute type (`weight-dtype`: never narrower), and transposed
    /// when a pass chose the target's matmul layout (`weight-layout`).
    fn bytes(&self, decl: &WeightDecl) -> Result<Cow<'_, [u8]>> {
        let t = self.tensor(&decl.source).ok_or_else(|| weight_error(decl, "not in the checkpoint".into()))?;
        let widening = t.dtype.is_float() && decl.ty.dtype.is_float() && decl.ty.dtype.bits() >= t.dtype.bits();
        if t.shape != decl.source_shape().as_slice() || (t.dtype != decl.ty.dtype && !widening) {
            let found = format!("checkpoint has {}{:?}, the IR expects {}", t.dtype, t.shape, decl.ty);
            return Err(weight_error(decl, found));
        }
        let mut bytes = Cow::Borrowed(t.bytes);
        if t.dtype != decl.ty.dtype {
            let converted = convert_float_bytes(t.dtype, decl.ty.dtype, t.bytes).map_err(|m| weight_error(decl, m))?;
            bytes = Cow::Owned(converted);
        }
        if decl.transposed {
            let [rows, cols] = t.shape[..] else {
                return Err(weight_error(decl, "a transposed weight must be a matrix".into()));
            };
            bytes = Cow::Owned(transpose(&bytes, rows, cols, (decl.ty.dtype.bits() / 8) as usize));
        }
        Ok(bytes)
    }

    fn release(&self, decl: &WeightDecl) {
        Checkpoint::release(self, &decl.source);
    }
}

/// A row-major `rows × cols` matrix of `elem`-byte elements, transposed.
fn transpose(bytes: &[u8], rows: usize, cols: usize, elem: usize) -> Vec<u8> {
    match elem {
        1 => transpose_as::<1>(bytes, rows, cols),
        2 => transpose_as::<2>(bytes, rows, cols),
        4 => transpose_as::<4>(bytes, rows, cols),
        8 => transpose_as::<8>(bytes, rows, cols),
        _ => unreachable!("element types are 1, 2, 4 or 8 bytes"),
    }
}

/// Works in tiles so that both the reads and the writes stay within a few cache lines; the element
/// size is a constant so that each move is one load and one store.
fn transpose_as<const N: usize>(bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    const TILE: usize = 32;
    let mut out = vec![0u8; bytes.len()];
    let (src, _) = bytes.as_chunks::<N>();
    let (dst, _) = out.as_chunks_mut::<N>();
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_swaps_rows_and_columns() {
        // 2 × 3 matrix of u16: [[1, 2, 3], [4, 5, 6]].
        let m: Vec<u8> = [1u16, 2, 3, 4, 5, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t: Vec<u16> = super::transpose(&m, 2, 3, 2).chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(t, [1, 4, 2, 5, 3, 6]);
    }
}
