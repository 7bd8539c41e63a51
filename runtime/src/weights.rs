//! Where weights come from: anything that can produce the tensor a `WeightDecl` names. Implement
//! `bytes` (raw little-endian bytes in the declared dtype, which backends upload as they are) or
//! `load` (a host tensor); each has a default in terms of the other.

use crate::error::{Result, RuntimeError};
use crate::tensor::Tensor;
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
    /// The tensor's bytes straight from the mmap, or converted to the declared float type when a pass
    /// chose to store the weight in its compute type (`weight-dtype`: never narrower).
    fn bytes(&self, decl: &WeightDecl) -> Result<Cow<'_, [u8]>> {
        let t =
            Checkpoint::bytes(self, &decl.source).ok_or_else(|| weight_error(decl, "not in the checkpoint".into()))?;
        let widening = t.dtype.is_float() && decl.ty.dtype.is_float() && decl.ty.dtype.bits() >= t.dtype.bits();
        if t.shape != decl.ty.shape.as_slice() || (t.dtype != decl.ty.dtype && !widening) {
            let found = format!("checkpoint has {}{:?}, the IR expects {}", t.dtype, t.shape, decl.ty);
            return Err(weight_error(decl, found));
        }
        if t.dtype == decl.ty.dtype {
            return Ok(Cow::Borrowed(t.bytes));
        }
        let stored = Tensor::from_bytes(decl.ty.with_dtype(t.dtype), t.bytes).map_err(|m| weight_error(decl, m))?;
        Ok(Cow::Owned(Tensor::of_type(decl.ty.clone(), stored.data).to_bytes()))
    }

    fn release(&self, decl: &WeightDecl) {
        Checkpoint::release(self, &decl.source);
    }
}
