//! Element types of tensor values.

use crate::named_enum::named_enum;

named_enum!(
    /// Element type of a tensor. `I4` is packed two to a byte (W4A16 weights); `Bool` is a predicate.
    DType "element type" { F32 = "f32", BF16 = "bf16", F16 = "f16", I32 = "i32", I8 = "i8", I4 = "i4", Bool = "bool" }
);

impl DType {
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I8 | DType::I4)
    }

    /// Storage size in bits of one element (`I4` packs two elements per byte).
    pub fn bits(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::BF16 | DType::F16 => 16,
            DType::I8 | DType::Bool => 8,
            DType::I4 => 4,
        }
    }
}
