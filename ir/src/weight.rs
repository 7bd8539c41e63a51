//! Module weights: what a function reads through `weight @name`, and how the loader makes it from a
//! checkpoint tensor.

use crate::{DType, TensorType};

/// How a weight's checkpoint tensor becomes the declared tensor when it is loaded. Passes choose
/// layouts a target prefers; the loader does the work once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceLayout {
    /// As stored (a float widens to the declared type).
    Stored,
    /// The stored matrix with its two dimensions swapped.
    Transposed,
    /// compressed-tensors `pack-quantized` 4-bit values of a `[rows, cols]` matrix: int32 words
    /// `[rows, cols / 8]`, eight offset-binary nibbles each (stored = q + 8), lowest first; declared
    /// `i4[rows, cols]`.
    PackedInt4,
}

impl SourceLayout {
    /// The word after the source key in the text form (`None` for `Stored`).
    pub fn word(self) -> Option<&'static str> {
        match self {
            SourceLayout::Stored => None,
            SourceLayout::Transposed => Some("transposed"),
            SourceLayout::PackedInt4 => Some("packed_int4"),
        }
    }

    pub fn from_word(word: &str) -> Option<SourceLayout> {
        [SourceLayout::Transposed, SourceLayout::PackedInt4].into_iter().find(|l| l.word() == Some(word))
    }
}

/// A checkpoint tensor the functions of a module read through `weight @name`.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightDecl {
    pub name: String,
    pub ty: TensorType,
    /// The tensor's key in the checkpoint it is loaded from.
    pub source: String,
    pub layout: SourceLayout,
}

impl WeightDecl {
    pub fn new(name: impl Into<String>, ty: TensorType, source: impl Into<String>) -> Self {
        WeightDecl { name: name.into(), ty, source: source.into(), layout: SourceLayout::Stored }
    }

    /// The element type and shape of the tensor in the checkpoint (its float type is whatever the
    /// checkpoint has: floats widen on load).
    pub fn source_type(&self) -> TensorType {
        let mut ty = self.ty.clone();
        match self.layout {
            SourceLayout::Stored => {}
            SourceLayout::Transposed => ty.shape.reverse(),
            SourceLayout::PackedInt4 => {
                ty.dtype = DType::I32;
                if let Some(cols) = ty.shape.last_mut() {
                    *cols /= 8;
                }
            }
        }
        ty
    }

    /// Whether the layout fits the declared type; the problem otherwise.
    pub fn check_layout(&self) -> Result<(), String> {
        let ok = match self.layout {
            SourceLayout::Stored => true,
            SourceLayout::Transposed => self.ty.rank() == 2,
            SourceLayout::PackedInt4 => {
                self.ty.dtype == DType::I4 && self.ty.rank() == 2 && self.ty.shape[1].is_multiple_of(8)
            }
        };
        match ok {
            true => Ok(()),
            false => Err(format!(
                "weight @{} is {} but {} is not a {}",
                self.name,
                self.layout.word().unwrap_or(""),
                self.ty,
                match self.layout {
                    SourceLayout::PackedInt4 => "i4 matrix of a multiple of 8 columns",
                    _ => "matrix",
                }
            )),
        }
    }
}
