//! Target descriptions as data. Passes and codegen read these properties; none of them tests a target
//! by its name. Numbers are vendor datasheet figures.

use g4c_ir::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Cpu,
    Tpu,
    Cuda,
}

impl Platform {
    pub fn name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Tpu => "tpu",
            Platform::Cuda => "cuda",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub name: &'static str,
    pub description: &'static str,
    pub platform: Platform,
    /// CUDA compute capability `(major, minor)`.
    pub compute_capability: Option<(u32, u32)>,
    /// Shared memory per block without and with the `MaxDynamicSharedMemorySize` opt-in, in bytes.
    pub smem_per_block: Option<u32>,
    pub smem_per_block_optin: Option<u32>,
    /// Device memory in bytes (`None`: the host's, measured at run time).
    pub memory_bytes: Option<u64>,
    /// Peak memory bandwidth in bytes per second (`None`: measured at run time).
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Element types the hardware computes in natively (others are emulated or unavailable).
    pub math_dtypes: &'static [DType],
    /// The element type matmuls and activations are computed in after dtype legalization.
    pub compute_dtype: DType,
    /// Matmul weights are best stored contraction dimension first (`[in, out]`): XLA's CPU backend
    /// otherwise re-lays out every `[out, in]` matrix inside every call.
    pub weights_in_major: bool,
}

const KIB: u32 = 1024;
const GIB: u64 = 1 << 30;
const GB: u64 = 1_000_000_000;

const CPU_MATH: &[DType] = &[DType::F32, DType::I32, DType::I8];
const TPU_MATH: &[DType] = &[DType::F32, DType::BF16, DType::I32, DType::I8];
/// Turing (sm_75) has f16 tensor cores and no bf16 arithmetic at all.
const TURING_MATH: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I8];
const AMPERE_PLUS_MATH: &[DType] = &[DType::F32, DType::BF16, DType::F16, DType::I32, DType::I8];

const fn gpu(
    name: &'static str,
    description: &'static str,
    cc: (u32, u32),
    optin_kib: u32,
    memory: u64,
    bandwidth_gb_s: u64,
) -> Target {
    let turing = cc.0 == 7 && cc.1 == 5;
    Target {
        name,
        description,
        platform: Platform::Cuda,
        compute_capability: Some(cc),
        smem_per_block: Some(48 * KIB),
        smem_per_block_optin: Some(optin_kib * KIB),
        memory_bytes: Some(memory),
        bandwidth_bytes_per_s: Some(bandwidth_gb_s * GB),
        math_dtypes: if turing { TURING_MATH } else { AMPERE_PLUS_MATH },
        compute_dtype: if turing { DType::F16 } else { DType::BF16 },
        weights_in_major: false,
    }
}

const fn tpu(name: &'static str, description: &'static str, memory: u64, bandwidth_gb_s: u64) -> Target {
    Target {
        name,
        description,
        platform: Platform::Tpu,
        compute_capability: None,
        smem_per_block: None,
        smem_per_block_optin: None,
        memory_bytes: Some(memory),
        bandwidth_bytes_per_s: Some(bandwidth_gb_s * GB),
        math_dtypes: TPU_MATH,
        compute_dtype: DType::BF16,
        weights_in_major: false,
    }
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "cpu",
        description: "host CPU through the PJRT CPU plugin",
        platform: Platform::Cpu,
        compute_capability: None,
        smem_per_block: None,
        smem_per_block_optin: None,
        memory_bytes: None,
        bandwidth_bytes_per_s: None,
        math_dtypes: CPU_MATH,
        compute_dtype: DType::F32,
        weights_in_major: true,
    },
    tpu("tpu-v5e", "Google TPU v5e (16 GiB HBM2e) through libtpu", 16 * GIB, 819),
    tpu("tpu-v6e", "Google TPU v6e Trillium (32 GiB HBM) through libtpu", 32 * GIB, 1640),
    gpu("t4g", "NVIDIA T4G (AWS G5g, Graviton host), Turing", (7, 5), 64, 16 * GIB, 320),
    gpu("t4", "NVIDIA T4, Turing", (7, 5), 64, 16 * GIB, 320),
    gpu("a10g", "NVIDIA A10G (AWS G5), Ampere", (8, 6), 99, 24 * GIB, 600),
    gpu("l4", "NVIDIA L4, Ada Lovelace", (8, 9), 99, 24 * GIB, 300),
    gpu("a100", "NVIDIA A100 80GB SXM, Ampere", (8, 0), 163, 80 * GIB, 2039),
    gpu("h100", "NVIDIA H100 80GB SXM, Hopper", (9, 0), 227, 80 * GIB, 3350),
    gpu("h200", "NVIDIA H200 141GB SXM, Hopper", (9, 0), 227, 141 * GB, 4800),
];

impl Target {
    /// Looks a target up by name; the error lists the known ones.
    pub fn by_name(name: &str) -> Result<&'static Target, String> {
        TARGETS.iter().find(|t| t.name == name).ok_or_else(|| {
            let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            format!("unknown target `{name}` (expected one of {})", known.join(", "))
        })
    }

    /// Every property, for `g4c targets --json` and compile reports.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "description": self.description,
            "platform": self.platform.name(),
            "compute_capability": self.compute_capability.map(|(a, b)| format!("{a}.{b}")),
            "smem_per_block": self.smem_per_block,
            "smem_per_block_optin": self.smem_per_block_optin,
            "memory_bytes": self.memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "math_dtypes": self.math_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
            "compute_dtype": self.compute_dtype.name(),
            "weights_in_major": self.weights_in_major,
        })
    }

    pub fn computes_natively(&self, dtype: DType) -> bool {
        self.math_dtypes.contains(&dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compute_dtype_is_native_and_turing_has_no_bf16() {
        for t in TARGETS {
            assert!(t.computes_natively(t.compute_dtype), "{}", t.name);
            if t.compute_capability == Some((7, 5)) {
                assert!(!t.computes_natively(DType::BF16), "{}", t.name);
                assert_eq!(t.smem_per_block_optin, Some(64 * 1024), "{}", t.name);
            }
        }
        assert!(Target::by_name("t5").unwrap_err().contains("t4g"));
    }
}
