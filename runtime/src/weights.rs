//! Where weights come from: anything that can produce the tensor a `WeightDecl` names. Implement
//! `bytes` (raw little-endian bytes in the declared dtype, which backends upload as they are) or
//! `load` (a host tensor); each has a default in terms of the other.

use crate::error::{Result, RuntimeError};
use crate::quantize;
use crate::tensor::{convert_float_bytes, convert_float_bytes_into, first_non_finite, pack_i4, Tensor};
use g4c_frontend::Checkpoint;
use g4c_ir::{DType, SourceLayout, WeightDecl};
use std::borrow::Cow;

/// Shared by executors that may run on another thread, hence `Send + Sync`.
pub trait WeightStore: Send + Sync {
    fn bytes(&self, decl: &WeightDecl) -> Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.load(decl)?.to_bytes()))
    }

    /// What `bytes` gives, built in `scratch` when it must be built: a caller going through many
    /// weights (an upload) passes the same buffer each time, so its pages are reused rather than
    /// freshly mapped and cleared by the kernel for every weight.
    fn bytes_in<'a>(&'a self, decl: &WeightDecl, scratch: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        match self.bytes(decl)? {
            Cow::Borrowed(b) => Ok(b),
            Cow::Owned(v) => {
                *scratch = v;
                Ok(scratch)
            }
        }
    }

    fn load(&self, decl: &WeightDecl) -> Result<Tensor> {
        let bytes = self.bytes(decl)?;
        Tensor::from_bytes(decl.ty.clone(), &bytes).map_err(|message| weight_error(decl, message))
    }

    /// A hint that the caller is done with `decl`'s bytes (copied to a device, say).
    fn release(&self, _decl: &WeightDecl) {}

    /// Rows `ids` (in range) of table `decl`, one after another, as `bytes` lays them out: what a
    /// host gather reads every step. This default builds the whole table.
    fn rows(&self, decl: &WeightDecl, ids: &[usize]) -> Result<Vec<u8>> {
        rows_of_whole_table(self, decl, ids)
    }
}

/// Rows `ids` of table `decl`, from all of its bytes.
fn rows_of_whole_table(store: &(impl WeightStore + ?Sized), decl: &WeightDecl, ids: &[usize]) -> Result<Vec<u8>> {
    let bytes = store.bytes(decl)?;
    Ok(gather_rows(&bytes, decl.ty.shape[0], ids))
}

/// Rows `ids` of a table of `rows` rows laid out in `bytes`, one after another.
fn gather_rows(bytes: &[u8], rows: usize, ids: &[usize]) -> Vec<u8> {
    let row_bytes = bytes.len() / rows.max(1);
    ids.iter().flat_map(|&id| &bytes[id * row_bytes..(id + 1) * row_bytes]).copied().collect()
}

/// The store of a module that declares no weights (op tests, conformance cases, examples): asking it
/// for one is an error naming the weight.
pub struct NoWeights;

impl WeightStore for NoWeights {
    fn load(&self, decl: &WeightDecl) -> Result<Tensor> {
        Err(weight_error(decl, "this module was given no weights".to_string()))
    }
}

fn weight_error(decl: &WeightDecl, message: String) -> RuntimeError {
    RuntimeError::Weight { name: decl.name.clone(), source_key: decl.source.clone(), message }
}

impl WeightStore for Checkpoint {
    /// The tensor's bytes straight from the mmap; converted to the declared float type when a pass
    /// chose to store the weight in its compute type (`weight-dtype`: never narrower), and transposed
    /// when a pass chose the target's matmul layout (`weight-layout`).
    fn bytes(&self, decl: &WeightDecl) -> Result<Cow<'_, [u8]>> {
        let mut built = Vec::new();
        Ok(match mapped_or_built(self, decl, &mut built)? {
            Some(mapped) => Cow::Borrowed(mapped),
            None => Cow::Owned(built),
        })
    }

    fn bytes_in<'a>(&'a self, decl: &WeightDecl, scratch: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        match mapped_or_built(self, decl, scratch)? {
            Some(mapped) => Ok(mapped),
            None => Ok(scratch),
        }
    }

    fn release(&self, decl: &WeightDecl) {
        Checkpoint::release(self, &decl.source);
    }

    /// A table stored as it is used (the per-layer embeddings: 4.7 GB in E2B) is read row by row
    /// from the mmap, and only those rows are checked and converted: `bytes` would scan all of it
    /// for non-finite numbers, which took longer than the rest of a decode step.
    fn rows(&self, decl: &WeightDecl, ids: &[usize]) -> Result<Vec<u8>> {
        if decl.layout != SourceLayout::Stored {
            return rows_of_whole_table(self, decl, ids);
        }
        let t = source_tensor(self, decl)?;
        let rows = gather_rows(t.bytes, decl.ty.shape[0], ids);
        if let Some(i) = first_non_finite(t.dtype, &rows) {
            let row_elements = decl.ty.numel() / decl.ty.shape[0].max(1);
            let element = ids[i / row_elements.max(1)] * row_elements + i % row_elements.max(1);
            return Err(non_finite(self, decl, element));
        }
        match t.dtype == decl.ty.dtype {
            true => Ok(rows),
            false => convert_float_bytes(t.dtype, decl.ty.dtype, &rows).map_err(|m| weight_error(decl, m)),
        }
    }
}

/// Element `element` of `decl`'s tensor is NaN or infinite: said with the file holding it (an
/// artifact's `weights.safetensors`, or a checkpoint's shard).
fn non_finite(ckpt: &Checkpoint, decl: &WeightDecl, element: usize) -> RuntimeError {
    let file = ckpt.file_of(&decl.source).map_or_else(|| ckpt.dir.display().to_string(), |f| f.display().to_string());
    weight_error(decl, format!("element {element} in {file} is NaN or infinite; expected finite numbers"))
}

/// `decl`'s tensor in the checkpoint, once its shape and dtype are checked against what the IR
/// expects (a float may be widened).
fn source_tensor<'c>(ckpt: &'c Checkpoint, decl: &WeightDecl) -> Result<g4c_frontend::TensorBytes<'c>> {
    let t = ckpt.tensor(&decl.source).ok_or_else(|| weight_error(decl, "not in the checkpoint".into()))?;
    let want = decl.source_type();
    let widening = t.dtype.is_float() && want.dtype.is_float() && want.dtype.bits() >= t.dtype.bits();
    if t.shape != want.shape.as_slice() || (t.dtype != want.dtype && !widening) {
        let found = format!("checkpoint has {}{:?}, the IR expects {want}", t.dtype, t.shape);
        return Err(weight_error(decl, found));
    }
    Ok(t)
}

/// `decl`'s bytes: the mapped ones when they are already in its dtype and layout (`Some`), else
/// built into `out` (`None`).
fn mapped_or_built<'c>(ckpt: &'c Checkpoint, decl: &WeightDecl, out: &mut Vec<u8>) -> Result<Option<&'c [u8]>> {
    let t = source_tensor(ckpt, decl)?;
    // Non-finite weights would only surface as NaN logits, far from their cause. A quantized linear's
    // scales come from the same source as its values (the quantize pass declares both), which are
    // scanned when they are built: once per tensor, not once per declaration.
    let scanned_with_values = matches!(decl.layout, SourceLayout::QuantizedScales { .. });
    if let Some(i) = if scanned_with_values { None } else { first_non_finite(t.dtype, t.bytes) } {
        return Err(non_finite(ckpt, decl, i));
    }
    let (from, to) = (t.dtype, decl.ty.dtype);
    match decl.layout {
        SourceLayout::Stored if from == to => Ok(Some(t.bytes)),
        SourceLayout::Stored => {
            convert_float_bytes_into(from, to, t.bytes, out).map_err(|m| weight_error(decl, m))?;
            Ok(None)
        }
        SourceLayout::Transposed => {
            let [rows, cols] = t.shape[..] else {
                return Err(weight_error(decl, "a transposed weight must be a matrix".into()));
            };
            out.clear();
            out.resize(decl.ty.byte_size() as usize, 0);
            // Widening to f32 happens inside the transpose: one pass, one buffer.
            match (from, to) {
                _ if from == to => transpose_into(t.bytes, rows, cols, out),
                (DType::BF16, DType::F32) => transpose_with(t.bytes, rows, cols, out, bf16_to_f32),
                (DType::F16, DType::F32) => transpose_with(t.bytes, rows, cols, out, f16_to_f32),
                _ => {
                    let wide = convert_float_bytes(from, to, t.bytes).map_err(|m| weight_error(decl, m))?;
                    transpose_into(&wide, rows, cols, out);
                }
            }
            Ok(None)
        }
        SourceLayout::QuantizedValues { group } | SourceLayout::QuantizedScales { group } => {
            let wide = convert_float_bytes(from, DType::F32, t.bytes).map_err(|m| weight_error(decl, m))?;
            let values: Vec<f32> = wide.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            let scales = quantize::int4_scales(&values, group);
            out.clear();
            if matches!(decl.layout, SourceLayout::QuantizedScales { .. }) {
                out.extend(scales.iter().flat_map(|&s| half::bf16::from_f32(s).to_le_bytes()));
            } else {
                let q = quantize::int4_values(&values, &scales, group);
                match decl.ty.dtype {
                    DType::I8 => out.extend(q.iter().map(|&v| v as i8 as u8)),
                    _ => out.extend(pack_i4(&q)),
                }
            }
            Ok(None)
        }
        SourceLayout::PackedInt4 => {
            // Little-endian int32 words of nibbles, lowest first, are i4 pairs in byte order already;
            // flipping each nibble's top bit turns offset-binary (q + 8) into two's complement.
            out.clear();
            match decl.ty.dtype {
                DType::I8 => {
                    out.extend(t.bytes.iter().flat_map(|&b| [(b & 0xF) as i8 - 8, (b >> 4) as i8 - 8]).map(|v| v as u8))
                }
                _ => out.extend(t.bytes.iter().map(|b| b ^ 0x88)),
            }
            Ok(None)
        }
    }
}

/// One bf16 as the f32 it widens to (exact: a bf16 is the upper half of an f32).
fn bf16_to_f32(b: [u8; 2]) -> [u8; 4] {
    (u32::from(u16::from_le_bytes(b)) << 16).to_le_bytes()
}

fn f16_to_f32(b: [u8; 2]) -> [u8; 4] {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32().to_le_bytes()
}

/// A row-major `rows × cols` matrix, transposed into `out` (of the same length); the element size is
/// `out.len() / (rows × cols)`.
fn transpose_into(bytes: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    match out.len() / (rows * cols).max(1) {
        1 => transpose_with(bytes, rows, cols, out, |x: [u8; 1]| x),
        2 => transpose_with(bytes, rows, cols, out, |x: [u8; 2]| x),
        4 => transpose_with(bytes, rows, cols, out, |x: [u8; 4]| x),
        8 => transpose_with(bytes, rows, cols, out, |x: [u8; 8]| x),
        _ => unreachable!("element types are 1, 2, 4 or 8 bytes"),
    }
}

/// A row-major `rows × cols` matrix of `I`-byte elements, transposed into `out`, each element
/// mapped to `O` bytes by `f`. Works in tiles so that both the reads and the writes stay within a
/// few cache lines; the element sizes are constants so that each move is one load and one store.
fn transpose_with<const I: usize, const O: usize>(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    out: &mut [u8],
    f: impl Fn([u8; I]) -> [u8; O],
) {
    const TILE: usize = 32;
    let (src, _) = bytes.as_chunks::<I>();
    let (dst, _) = out.as_chunks_mut::<O>();
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = f(src[r * cols + c]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use g4c_ir::DType;

    #[test]
    fn transpose_swaps_rows_and_columns() {
        // 2 × 3 matrix of u16: [[1, 2, 3], [4, 5, 6]].
        let m: Vec<u8> = [1u16, 2, 3, 4, 5, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = vec![0u8; m.len()];
        super::transpose_into(&m, 2, 3, &mut out);
        let t: Vec<u16> = out.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(t, [1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn widening_inside_the_transpose_equals_widening_then_transposing() {
        let values = [1.5f32, -2.25, 3.0e-3, 65504.0, -0.0, 7.0];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        for from in [DType::BF16, DType::F16] {
            let narrow = crate::tensor::convert_float_bytes(DType::F32, from, &f32_bytes).unwrap();
            let wide = crate::tensor::convert_float_bytes(from, DType::F32, &narrow).unwrap();
            let mut expected = vec![0u8; wide.len()];
            super::transpose_into(&wide, 2, 3, &mut expected);
            let widen = if from == DType::BF16 { super::bf16_to_f32 } else { super::f16_to_f32 };
            let mut fused = vec![0u8; wide.len()];
            super::transpose_with(&narrow, 2, 3, &mut fused, widen);
            assert_eq!(fused, expected, "{from}");
        }
    }
}
