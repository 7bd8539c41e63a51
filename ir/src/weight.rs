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
    /// `i4[rows, cols]`, or `i8` to hold one value per byte.
    PackedInt4,
    /// The 4-bit values of a float matrix quantized per group of `group` inputs (the `quantize`
    /// pass: round to nearest, symmetric, as compressed-tensors computes it); declared `i4` or `i8`.
    QuantizedValues { group: usize },
    /// The per-group scales of that quantization, `[rows, cols / group]`; declared `bf16`.
    QuantizedScales { group: usize },
}

impl SourceLayout {
    /// The word after the source key in the text form (`None` for `Stored`).
    pub fn word(self) -> Option<String> {
        match self {
            SourceLayout::Stored => None,
            SourceLayout::Transposed => Some("transposed".into()),
            SourceLayout::PackedInt4 => Some("packed_int4".into()),
            SourceLayout::QuantizedValues { group } => Some(format!("quantized_int4({group})")),
            SourceLayout::QuantizedScales { group } => Some(format!("quantized_scales({group})")),
        }
    }

    /// The layout a word of the text form names, given the group in parentheses after it, if any.
    pub fn from_word(word: &str, group: Option<usize>) -> Option<SourceLayout> {
        Some(match (word, group) {
            ("transposed", None) => SourceLayout::Transposed,
            ("packed_int4", None) => SourceLayout::PackedInt4,
            ("quantized_int4", Some(group)) => SourceLayout::QuantizedValues { group },
            ("quantized_scales", Some(group)) => SourceLayout::QuantizedScales { group },
            _ => return None,
        })
    }

    /// Whether the word takes a group in parentheses.
    pub fn takes_group(word: &str) -> bool {
        matches!(word, "quantized_int4" | "quantized_scales")
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

/// The IR names of the two weights a quantized linear `name` becomes: its 4-bit values (`NAME.q`)
/// and its group scales (`NAME.scale`). One rule for the frontend (QAT checkpoints), the quantize
/// pass and the emitter that reads them.
pub fn quantized_names(name: &str) -> (String, String) {
    (format!("{name}.q"), format!("{name}.scale"))
}

impl WeightDecl {
    pub fn new(name: impl Into<String>, ty: TensorType, source: impl Into<String>) -> Self {
        WeightDecl { name: name.into(), ty, source: source.into(), layout: SourceLayout::Stored }
    }

    /// The element type and shape of the tensor in the checkpoint (a float's type is whatever the
    /// checkpoint has: floats widen on load, and a quantized weight's source is a float matrix).
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
            SourceLayout::QuantizedValues { .. } => ty.dtype = DType::F32,
            SourceLayout::QuantizedScales { group } => {
                ty.dtype = DType::F32;
                if let Some(cols) = ty.shape.last_mut() {
                    *cols *= group;
                }
            }
        }
        ty
    }

    /// Whether the layout fits the declared type; the problem otherwise.
    pub fn check_layout(&self) -> Result<(), String> {
        let matrix = self.ty.rank() == 2;
        let four_bit = matches!(self.ty.dtype, DType::I4 | DType::I8);
        let (ok, needs) = match self.layout {
            SourceLayout::Stored => (true, ""),
            SourceLayout::Transposed => (matrix, "matrix"),
            SourceLayout::PackedInt4 => {
                (four_bit && matrix && self.ty.shape[1].is_multiple_of(8), "i4 or i8 matrix of a multiple of 8 columns")
            }
            SourceLayout::QuantizedValues { group } => (
                four_bit && matrix && group > 0 && self.ty.shape[1].is_multiple_of(group),
                "i4 or i8 matrix of whole groups",
            ),
            SourceLayout::QuantizedScales { group } => {
                (self.ty.dtype == DType::BF16 && matrix && group > 0, "bf16 matrix")
            }
        };
        match ok {
            true => Ok(()),
            false => Err(format!(
                "weight @{} is {} but {} is not a {needs}",
                self.name,
                self.layout.word().unwrap_or_default(),
                self.ty
            )),
        }
    }
}
