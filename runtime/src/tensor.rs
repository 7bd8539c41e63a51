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

/// Rounds an f32 to the nearest value of a float dtype (round-to-nearest-even).
pub fn round_float(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use super::round_float;
    use g4c_ir::DType;

    #[test]
    fn rounding_to_narrow_floats_is_nearest_even() {
        assert_eq!(round_float(DType::BF16, 39.191835), 39.25);
        assert_eq!(round_float(DType::BF16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_float(DType::F16, 65519.0), 65504.0);
        assert_eq!(round_float(DType::F16, 70000.0), f32::INFINITY);
        assert_eq!(round_float(DType::F32, 0.1), 0.1);
    }
}
