//! Element types of tensor values.

use std::fmt;
use std::str::FromStr;

/// Element type of a tensor. `I4` is packed two to a byte (W4A16 weights); `Bool` is a predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I8,
    I4,
    Bool,
}

impl DType {
    pub const ALL: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I8, DType::I4, DType::Bool];

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

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::I4 => "i4",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown element type `{s}` (expected one of f32, bf16, f16, i32, i8, i4, bool)"))
    }
}
