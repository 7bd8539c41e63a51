//! Where weights come from: anything that can produce the tensor a `WeightDecl` names.

use crate::error::{Result, RuntimeError};
use crate::tensor::{Data, Tensor};
use g4c_frontend::Checkpoint;
use g4c_ir::{DType, WeightDecl};

pub trait WeightStore {
    fn load(&self, decl: &WeightDecl) -> Result<Tensor>;
}

impl WeightStore for Checkpoint {
    fn load(&self, decl: &WeightDecl) -> Result<Tensor> {
        let err = |message: String| RuntimeError::Weight {
            name: decl.name.clone(),
            source_key: decl.source.clone(),
            message,
        };
        let t = self.bytes(&decl.source).ok_or_else(|| err("not in the checkpoint".into()))?;
        if t.dtype != decl.ty.dtype || t.shape != decl.ty.shape.as_slice() {
            return Err(err(format!("checkpoint has {}{:?}, the IR expects {}", t.dtype, t.shape, decl.ty)));
        }
        decode(decl, t.bytes).map_err(err)
    }
}

/// Decodes little-endian tensor bytes of `decl`'s dtype into a host tensor.
pub fn decode(decl: &WeightDecl, bytes: &[u8]) -> std::result::Result<Tensor, String> {
    let ty = &decl.ty;
    if bytes.len() as u64 != ty.byte_size() {
        return Err(format!("{} bytes, {} needs {}", bytes.len(), ty, ty.byte_size()));
    }
    let words2 = || bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    let data = match ty.dtype {
        DType::F32 => Data::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        DType::BF16 => Data::F32(words2().map(|w| half::bf16::from_bits(w).to_f32()).collect()),
        DType::F16 => Data::F32(words2().map(|w| half::f16::from_bits(w).to_f32()).collect()),
        DType::I32 => Data::I32(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
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
    Ok(Tensor::of_type(ty.clone(), data))
}
