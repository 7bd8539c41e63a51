//! Host tensors. Floats of every width are held as f32 values already rounded to their dtype, ints as
//! i32, predicates as bool; data is reference-counted so reshapes and no-op converts share it.

use g4c_ir::{DType, TensorType};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Arc<[f32]>),
    I32(Arc<[i32]>),
    Bool(Arc<[bool]>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub ty: TensorType,
    pub data: Data,
}

/// Which storage a dtype uses.
pub fn storage_of(dtype: DType) -> Storage {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Storage::F32,
        DType::I32 | DType::I8 | DType::I4 => Storage::I32,
        DType::Bool => Storage::Bool,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    I32,
    Bool,
}

impl Tensor {
    pub fn f32(shape: impl Into<Vec<usize>>, values: Vec<f32>) -> Tensor {
        Tensor::of_type(TensorType::new(DType::F32, shape), Data::F32(values.into()))
    }

    pub fn i32(shape: impl Into<Vec<usize>>, values: Vec<i32>) -> Tensor {
        Tensor::of_type(TensorType::new(DType::I32, shape), Data::I32(values.into()))
    }

    pub fn of_type(ty: TensorType, data: Data) -> Tensor {
        debug_assert_eq!(ty.numel(), data.len(), "{ty} with {} elements", data.len());
        Tensor { ty, data }
    }

    /// Every element set to `value` (rounded to the dtype).
    pub fn filled(ty: TensorType, value: f64) -> Tensor {
        let n = ty.numel();
        let data = match storage_of(ty.dtype) {
            Storage::F32 => Data::F32(vec![round_float(ty.dtype, value as f32); n].into()),
            Storage::I32 => Data::I32(vec![value as i32; n].into()),
            Storage::Bool => Data::Bool(vec![value != 0.0; n].into()),
        };
        Tensor { ty, data }
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Decodes little-endian, row-major bytes of `ty`'s dtype.
    pub fn from_bytes(ty: TensorType, bytes: &[u8]) -> Result<Tensor, String> {
        if bytes.len() as u64 != ty.byte_size() {
            return Err(format!("{} bytes, {} needs {}", bytes.len(), ty, ty.byte_size()));
        }
        let words2 = || bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        let words4 = || bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let data = match ty.dtype {
            DType::F32 => Data::F32(words4().map(f32::from_le_bytes).collect()),
            DType::BF16 => Data::F32(words2().map(|w| half::bf16::from_bits(w).to_f32()).collect()),
            DType::F16 => Data::F32(words2().map(|w| half::f16::from_bits(w).to_f32()).collect()),
            DType::I32 => Data::I32(words4().map(i32::from_le_bytes).collect()),
            DType::I8 => Data::I32(bytes.iter().map(|&b| b as i8 as i32).collect()),
            // Two's-complement nibbles, low nibble first.
            DType::I4 => Data::I32(
                bytes
                    .iter()
                    .flat_map(|&b| [(b & 0xF) as i32, (b >> 4) as i32])
                    .map(|n| (n ^ 8) - 8)
                    .take(ty.numel())
                    .collect(),
            ),
            DType::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
        };
        Ok(Tensor::of_type(ty, data))
    }

    /// Little-endian, row-major bytes in the tensor's dtype (the inverse of `from_bytes`).
    pub fn to_bytes(&self) -> Vec<u8> {
        match (&self.data, self.ty.dtype) {
            (Data::F32(v), DType::BF16) => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            (Data::F32(v), DType::F16) => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            (Data::F32(v), _) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            (Data::I32(v), DType::I8) => v.iter().map(|&x| x as i8 as u8).collect(),
            (Data::I32(v), DType::I4) => pack_i4(v),
            (Data::I32(v), _) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            (Data::Bool(v), _) => v.iter().map(|&b| b as u8).collect(),
        }
    }

    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.data {
            Data::I32(v) => Some(v),
            _ => None,
        }
    }
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub use g4c_ir::scalar::round_float;

/// 4-bit integers packed two to a byte, the first of each pair in the low nibble.
pub fn pack_i4(values: &[i32]) -> Vec<u8> {
    values.chunks(2).map(|p| (p[0] as u8 & 0xF) | ((p.get(1).copied().unwrap_or(0) as u8 & 0xF) << 4)).collect()
}

/// Little-endian float elements of type `from` re-encoded as `to` (rounded to nearest even when
/// narrowing), element by element without building a tensor.
pub fn convert_float_bytes(from: DType, to: DType, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    convert_float_bytes_into(from, to, bytes, &mut out)?;
    Ok(out)
}

/// The index of the first NaN or infinity in little-endian float `bytes` of `dtype` (none for
/// integer types): an all-ones exponent, tested on the bits without converting.
pub fn first_non_finite(dtype: DType, bytes: &[u8]) -> Option<usize> {
    fn scan<const N: usize>(bytes: &[u8], exponent: u32) -> Option<usize> {
        let bits = |c: &[u8]| c.iter().rev().fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
        // Any hit at all is rare: test whole blocks first (vectorizes), locate only in a bad one.
        let block = 4096 * N;
        bytes.chunks(block).enumerate().find_map(|(i, chunk)| {
            let bad = chunk.chunks_exact(N).fold(false, |any, c| any | (bits(c) & exponent == exponent));
            bad.then(|| i * 4096 + chunk.chunks_exact(N).position(|c| bits(c) & exponent == exponent).unwrap())
        })
    }
    match dtype {
        DType::F32 => scan::<4>(bytes, 0x7f80_0000),
        DType::BF16 => scan::<2>(bytes, 0x7f80),
        DType::F16 => scan::<2>(bytes, 0x7c00),
        _ => None,
    }
}

/// `convert_float_bytes` into `out` (cleared first), reusing its allocation.
pub fn convert_float_bytes_into(from: DType, to: DType, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let decode: fn(&[u8]) -> f32 = match from {
        DType::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        other => return Err(format!("cannot convert {other} elements as floats")),
    };
    let width = (from.bits() / 8) as usize;
    out.clear();
    out.reserve(bytes.len() / width * (to.bits() / 8) as usize);
    for chunk in bytes.chunks_exact(width) {
        let x = decode(chunk);
        match to {
            DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            other => return Err(format!("cannot convert floats to {other}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_float;
    use g4c_ir::DType;

    #[test]
    fn float_bytes_convert_exactly_when_widening_and_round_when_narrowing() {
        use super::convert_float_bytes;
        let bf16: Vec<u8> =
            [1.5f32, -39.25, 1e30].iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
        let f32s: Vec<f32> = convert_float_bytes(DType::BF16, DType::F32, &bf16)
            .unwrap()
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(f32s, [1.5, -39.25, half::bf16::from_f32(1e30).to_f32()]);
        // bf16 -> f16 (Turing): 1e30 is past f16's range.
        let f16s: Vec<f32> = convert_float_bytes(DType::BF16, DType::F16, &bf16)
            .unwrap()
            .chunks(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        assert_eq!(f16s, [1.5, -39.25, f32::INFINITY]);
        assert!(convert_float_bytes(DType::I32, DType::F32, &[0; 4]).is_err());
    }

    #[test]
    fn rounding_to_narrow_floats_is_nearest_even() {
        assert_eq!(round_float(DType::BF16, 39.191835), 39.25);
        assert_eq!(round_float(DType::BF16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_float(DType::F16, 65519.0), 65504.0);
        assert_eq!(round_float(DType::F16, 70000.0), f32::INFINITY);
        assert_eq!(round_float(DType::F32, 0.1), 0.1);
    }
}
