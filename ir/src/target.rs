//! Target descriptions as data. Passes, codegen and the runtime read these properties; none of them
//! tests a target by its name. Every figure cites where it comes from:
//!
//! - [G]: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
//!   (docs.nvidia.com/cuda/cuda-c-programming-guide, §"Features and Technical Specifications"), and
//!   its "Shared Memory" sections for compute capabilities 7.x, 8.x and 9.0.
//! - [P]: PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions" (`mma`, target ISA notes) and
//!   `cp.async` (docs.nvidia.com/cuda/parallel-thread-execution).
//! - Per-product datasheets and architecture whitepapers, named at each target.

use crate::DType;

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

/// One warp-level matrix multiply-accumulate shape (`mma.sync.aligned.mMnNkK`) and its input type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub input: DType,
}

impl MmaShape {
    pub fn name(&self) -> String {
        format!("m{}n{}k{}.{}", self.m, self.n, self.k, self.input)
    }
}

/// What the CUDA backend's fusion and tiling must fit in: the limits of one SM and one block.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuLimits {
    /// CUDA compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    /// [G]: 32 on every compute capability.
    pub warp_size: u32,
    /// 32-bit registers per SM ([G]: 64 K on 7.5 to 9.0).
    pub registers_per_sm: u32,
    /// [G]: 255 on 7.5 to 9.0.
    pub registers_per_thread: u32,
    /// [G]: 1024 on 7.5 to 9.0.
    pub threads_per_block: u32,
    /// Shared memory per block without and with the `MaxDynamicSharedMemorySize` opt-in, in bytes
    /// ([G]: static shared memory stops at 48 KiB; above it only dynamic shared memory, opted in).
    pub smem_per_block: u32,
    pub smem_per_block_optin: u32,
    /// Shared memory per SM in bytes ([G]).
    pub smem_per_sm: u32,
    pub l2_bytes: u64,
    /// Asynchronous global-to-shared copies (`cp.async`): sm_80 and later ([P]).
    pub cp_async: bool,
    /// The `mma.sync` shapes worth using for the float and int8 types this GPU computes in ([P]).
    pub mma: &'static [MmaShape],
}

#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub name: &'static str,
    pub description: &'static str,
    pub platform: Platform,
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
    /// The limits CUDA kernels must fit (CUDA targets only).
    pub gpu: Option<GpuLimits>,
}

const KIB: u32 = 1024;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const GB: u64 = 1_000_000_000;

/// [G]: a block's static shared memory (`__shared__` arrays, whose bytes ptxas sees) stops at 48
/// KiB on every compute capability; beyond it a kernel declares its array `extern` and is launched
/// with the bytes as dynamic shared memory, after opting in to them
/// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`), up to `GpuLimits::smem_per_block_optin`.
pub const STATIC_SMEM_PER_BLOCK: u32 = 48 * KIB;

const CPU_MATH: &[DType] = &[DType::F32, DType::I32, DType::I8];
const TPU_MATH: &[DType] = &[DType::F32, DType::BF16, DType::I32, DType::I8, DType::I4];
/// Turing (sm_75) has f16 tensor cores and no bf16 arithmetic at all; 4-bit integers it multiplies in
/// its tensor cores ([P]: `mma` `.s4` `m8n8k32`) and unpacks in registers.
const TURING_MATH: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I8, DType::I4];
const AMPERE_PLUS_MATH: &[DType] = &[DType::F32, DType::BF16, DType::F16, DType::I32, DType::I8, DType::I4];

const fn mma(m: u32, n: u32, k: u32, input: DType) -> MmaShape {
    MmaShape { m, n, k, input }
}

/// [P], sm_75: f16 `m16n8k8` (`m8n8k4` exists but is tuned for sm_70 and slow elsewhere), int8
/// `m8n8k16`; no bf16.
const TURING_MMA: &[MmaShape] = &[mma(16, 8, 8, DType::F16), mma(8, 8, 16, DType::I8)];
/// [P], sm_80 and later: f16 and bf16 `m16n8k8` and `m16n8k16` (bf16 accumulates in f32 only),
/// int8 `m16n8k16` and `m16n8k32`.
const AMPERE_PLUS_MMA: &[MmaShape] = &[
    mma(16, 8, 8, DType::F16),
    mma(16, 8, 16, DType::F16),
    mma(16, 8, 8, DType::BF16),
    mma(16, 8, 16, DType::BF16),
    mma(16, 8, 16, DType::I8),
    mma(16, 8, 32, DType::I8),
];

/// The per-compute-capability figures of [G] and [P]; the per-product ones are arguments.
const fn gpu(
    name: &'static str,
    description: &'static str,
    cc: (u32, u32),
    sm_count: u32,
    l2_bytes: u64,
    memory: u64,
    bandwidth_gb_s: u64,
) -> Target {
    let turing = cc.0 == 7 && cc.1 == 5;
    // [G]: shared memory per SM is 64 KiB on 7.5, 164 KiB on 8.0, 100 KiB on 8.6 and 8.9, 228 KiB on
    // 9.0; a block may opt in to all of it on 7.5 and to all but 1 KiB (reserved) from 8.0 on.
    let smem_per_sm = match cc {
        (7, 5) => 64 * KIB,
        (8, 0) => 164 * KIB,
        (8, _) => 100 * KIB,
        _ => 228 * KIB,
    };
    Target {
        name,
        description,
        platform: Platform::Cuda,
        memory_bytes: Some(memory),
        bandwidth_bytes_per_s: Some(bandwidth_gb_s * GB),
        math_dtypes: if turing { TURING_MATH } else { AMPERE_PLUS_MATH },
        compute_dtype: if turing { DType::F16 } else { DType::BF16 },
        weights_in_major: false,
        gpu: Some(GpuLimits {
            compute_capability: cc,
            sm_count,
            warp_size: 32,
            registers_per_sm: 64 * KIB,
            registers_per_thread: 255,
            threads_per_block: 1024,
            smem_per_block: STATIC_SMEM_PER_BLOCK,
            smem_per_block_optin: if turing { smem_per_sm } else { smem_per_sm - KIB },
            smem_per_sm,
            l2_bytes,
            cp_async: !turing,
            mma: if turing { TURING_MMA } else { AMPERE_PLUS_MMA },
        }),
    }
}

const fn tpu(name: &'static str, description: &'static str, memory: u64, bandwidth_gb_s: u64) -> Target {
    Target {
        name,
        description,
        platform: Platform::Tpu,
        memory_bytes: Some(memory),
        bandwidth_bytes_per_s: Some(bandwidth_gb_s * GB),
        math_dtypes: TPU_MATH,
        compute_dtype: DType::BF16,
        weights_in_major: false,
        gpu: None,
    }
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "cpu",
        description: "host CPU through the PJRT CPU plugin",
        platform: Platform::Cpu,
        memory_bytes: None,
        bandwidth_bytes_per_s: None,
        math_dtypes: CPU_MATH,
        compute_dtype: DType::F32,
        weights_in_major: true,
        gpu: None,
    },
    // Google Cloud TPU documentation, "TPU v5e" and "TPU v6e" system architecture pages.
    tpu("tpu-v5e", "Google TPU v5e (16 GiB HBM2e) through libtpu", 16 * GIB, 819),
    tpu("tpu-v6e", "Google TPU v6e Trillium (32 GiB HBM) through libtpu", 32 * GIB, 1640),
    // T4 datasheet (16 GB GDDR6, 320 GB/s; the product page says "320+"); 40 SMs and 4 MiB of L2 as
    // deviceQuery reports them. The T4G of AWS G5g instances is the same part.
    gpu("t4g", "NVIDIA T4G (AWS G5g, Graviton host), Turing", (7, 5), 40, 4 * MIB, 16 * GIB, 320),
    gpu("t4", "NVIDIA T4, Turing", (7, 5), 40, 4 * MIB, 16 * GIB, 320),
    // A10G: an AWS-only GA102 part with no NVIDIA datasheet; 24 GB at 600 GB/s as the A10, 80 SMs as
    // measured on AWS G5, and 6 MiB of L2, the most any GA102 has (GA102 whitepaper); not measured.
    gpu("a10g", "NVIDIA A10G (AWS G5), Ampere", (8, 6), 80, 6 * MIB, 24 * GIB, 600),
    // L4 datasheet (24 GB GDDR6, 300 GB/s); 58 SMs and 48 MiB of L2 as deviceQuery reports them.
    gpu("l4", "NVIDIA L4, Ada Lovelace", (8, 9), 58, 48 * MIB, 24 * GIB, 300),
    // A100 datasheet (80 GB HBM2e SXM: 2,039 GB/s) and Ampere whitepaper (108 SMs, 40 MB of L2).
    gpu("a100", "NVIDIA A100 80GB SXM, Ampere", (8, 0), 108, 40 * MIB, 80 * GIB, 2039),
    // H100 datasheet (80 GB HBM3 SXM: 3.35 TB/s) and "NVIDIA Hopper Architecture In-Depth"
    // (132 SMs, 50 MB of L2).
    gpu("h100", "NVIDIA H100 80GB SXM, Hopper", (9, 0), 132, 50 * MIB, 80 * GIB, 3350),
    // H200 datasheet (141 GB HBM3e, 4.8 TB/s). It states neither SMs nor L2: the die is H100's
    // (132 SMs); its L2 is taken as H100's 50 MB, though GH200, with the same HBM3e, reports 60 MiB.
    gpu("h200", "NVIDIA H200 141GB SXM, Hopper", (9, 0), 132, 50 * MIB, 141 * GB, 4800),
];

impl Target {
    /// Looks a target up by name; the error lists the known ones.
    pub fn by_name(name: &str) -> Result<&'static Target, String> {
        TARGETS.iter().find(|t| t.name == name).ok_or_else(|| {
            let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            format!("unknown target `{name}` (expected one of {})", known.join(", "))
        })
    }

    pub fn computes_natively(&self, dtype: DType) -> bool {
        self.math_dtypes.contains(&dtype)
    }

    /// Every property, for `g4c targets --json`, compile reports and artifact manifests.
    pub fn to_json(&self) -> serde_json::Value {
        let gpu = self.gpu.as_ref().map(|g| {
            serde_json::json!({
                "compute_capability": format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
                "sm_count": g.sm_count,
                "warp_size": g.warp_size,
                "registers_per_sm": g.registers_per_sm,
                "registers_per_thread": g.registers_per_thread,
                "threads_per_block": g.threads_per_block,
                "smem_per_block": g.smem_per_block,
                "smem_per_block_optin": g.smem_per_block_optin,
                "smem_per_sm": g.smem_per_sm,
                "l2_bytes": g.l2_bytes,
                "cp_async": g.cp_async,
                "mma": g.mma.iter().map(MmaShape::name).collect::<Vec<_>>(),
            })
        });
        serde_json::json!({
            "name": self.name,
            "description": self.description,
            "platform": self.platform.name(),
            "memory_bytes": self.memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "math_dtypes": self.math_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
            "compute_dtype": self.compute_dtype.name(),
            "weights_in_major": self.weights_in_major,
            "gpu": gpu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compute_dtype_is_native_and_turing_has_no_bf16() {
        for t in TARGETS {
            assert!(t.computes_natively(t.compute_dtype), "{}", t.name);
            let Some(gpu) = &t.gpu else { continue };
            assert!(gpu.mma.iter().all(|m| t.computes_natively(m.input)), "{}: an MMA of a type it lacks", t.name);
            if gpu.compute_capability == (7, 5) {
                assert!(!t.computes_natively(DType::BF16), "{}", t.name);
            }
        }
        assert!(Target::by_name("t5").unwrap_err().contains("t4g"));
    }

    /// The GPU figures against the CUDA Programming Guide's table of compute capabilities and the
    /// vendors' datasheets, written out here rather than derived the way `gpu()` derives them.
    #[test]
    fn gpu_limits_match_the_datasheets() {
        // name, compute capability, SMs, opt-in shared memory per block (KiB), per SM (KiB), L2 (MiB), cp.async
        let sheet = [
            ("t4g", (7, 5), 40, 64, 64, 4, false),
            ("t4", (7, 5), 40, 64, 64, 4, false),
            ("a10g", (8, 6), 80, 99, 100, 6, true),
            ("l4", (8, 9), 58, 99, 100, 48, true),
            ("a100", (8, 0), 108, 163, 164, 40, true),
            ("h100", (9, 0), 132, 227, 228, 50, true),
            ("h200", (9, 0), 132, 227, 228, 50, true),
        ];
        let cuda: Vec<&str> = TARGETS.iter().filter(|t| t.gpu.is_some()).map(|t| t.name).collect();
        assert_eq!(cuda, sheet.iter().map(|s| s.0).collect::<Vec<_>>(), "every CUDA target is in the table");
        for (name, cc, sms, optin_kib, per_sm_kib, l2_mib, cp_async) in sheet {
            let t = Target::by_name(name).unwrap();
            assert_eq!(t.platform, Platform::Cuda, "{name}");
            let g = t.gpu.as_ref().unwrap();
            let got = (g.compute_capability, g.sm_count, g.smem_per_block_optin, g.smem_per_sm, g.l2_bytes, g.cp_async);
            let want = (cc, sms, optin_kib * KIB, per_sm_kib * KIB, l2_mib * MIB, cp_async);
            assert_eq!(got, want, "{name}");
        }
    }
}
