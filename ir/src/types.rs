//! Statically shaped tensor types, written `f32[2,3]` (scalar: `f32[]`).

use crate::DType;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType { dtype, shape: shape.into() }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType { dtype, shape: vec![] }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes this tensor occupies in its own dtype (int4 rounded up to whole bytes).
    pub fn byte_size(&self) -> u64 {
        (self.numel() as u64 * self.dtype.bits()).div_ceil(8)
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType { dtype, shape: self.shape.clone() }
    }

    pub fn with_shape(&self, shape: impl Into<Vec<usize>>) -> Self {
        TensorType { dtype: self.dtype, shape: shape.into() }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
