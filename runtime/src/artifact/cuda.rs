//! The CUDA part of an artifact for a CUDA target, in `cuda/`: per entry point its kernels' CUDA C
//! (`<entry>.cu`), PTX (`<entry>.ptx`), a cubin for the target's SM when ptxas made one
//! (`<entry>.sm_XY.cubin`), and which symbol and weights each of the plan's launches uses; the
//! NVRTC version and PTX ISA are recorded, so a driver too old for the PTX is refused by name.

use super::open::Artifact;
use crate::backend::cuda::{DeviceProgram, KernelBinding};
use crate::error::{Result, RuntimeError};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const DIR: &str = "cuda";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaInfo {
    /// `major.minor` of the NVRTC that made the PTX.
    pub nvrtc: String,
    /// The PTX ISA version the PTX declares (`.version`): the driver must know it to JIT it.
    pub ptx_isa: String,
    /// `compute_XY` the PTX is for.
    pub compute: String,
    pub entries: Vec<CudaEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaEntry {
    pub name: String,
    pub source: String,
    pub ptx: String,
    /// `[major, minor]` of the SM the cubin is for, and its file; absent without ptxas.
    pub cubin: Option<((u32, u32), String)>,
    /// Per launch of the entry's plan: symbol, then the weights it takes.
    pub kernels: Vec<(String, Vec<String>)>,
}

/// What a CUDA target's artifact holds beyond the module: every entry point's kernels, the NVRTC
/// version that compiled them, and the target's compute capability.
pub struct CudaKernels<'a> {
    pub programs: &'a [DeviceProgram],
    pub nvrtc: (i32, i32),
    pub compute: (u32, u32),
}

/// Writes every program's files under `root/cuda` and describes them.
pub(crate) fn write(root: &Path, kernels: &CudaKernels) -> Result<CudaInfo> {
    let CudaKernels { programs, nvrtc, compute } = *kernels;
    let io = |p: &Path, e: std::io::Error| RuntimeError::Invalid(format!("writing {}: {e}", p.display()));
    let dir = root.join(DIR);
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let mut entries = Vec::new();
    let mut isa = String::new();
    for p in programs {
        let ptx = p.ptx.as_ref().ok_or_else(|| RuntimeError::Invalid(format!("@{}: no PTX to write", p.entry)))?;
        isa = crate::backend::cuda::ptx_isa_version(ptx).map(|(a, b)| format!("{a}.{b}")).unwrap_or_default();
        let files = [(format!("{}.cu", p.entry), p.source.as_bytes()), (format!("{}.ptx", p.entry), ptx.as_bytes())];
        for (name, bytes) in files {
            let path = dir.join(name);
            std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
        }
        let cubin = match &p.cubin {
            Some((sm, bytes)) => {
                let name = format!("{}.sm_{}{}.cubin", p.entry, sm.0, sm.1);
                let path = dir.join(&name);
                std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
                Some((*sm, format!("{DIR}/{name}")))
            }
            None => None,
        };
        entries.push(CudaEntry {
            name: p.entry.clone(),
            source: format!("{DIR}/{}.cu", p.entry),
            ptx: format!("{DIR}/{}.ptx", p.entry),
            cubin,
            kernels: p.kernels.iter().map(|k| (k.symbol.clone(), k.weights.clone())).collect(),
        });
    }
    Ok(CudaInfo {
        nvrtc: format!("{}.{}", nvrtc.0, nvrtc.1),
        ptx_isa: isa,
        compute: format!("compute_{}{}", compute.0, compute.1),
        entries,
    })
}

impl Artifact {
    /// The artifact's CUDA programs, read back; an error names what is missing.
    pub fn cuda_programs(&self) -> Result<Vec<DeviceProgram>> {
        let bad = |m: String| RuntimeError::Invalid(format!("artifact {}: {m}", self.dir.display()));
        let Some(info) = &self.manifest.cuda else {
            return Err(bad(format!("it holds no CUDA kernels (it was compiled for {})", self.manifest.target_name())));
        };
        let read = |rel: &str| std::fs::read(self.dir.join(rel)).map_err(|e| bad(format!("{rel}: {e}")));
        let text = |rel: &str| String::from_utf8(read(rel)?).map_err(|_| bad(format!("{rel}: not UTF-8")));
        info.entries
            .iter()
            .map(|e| {
                Ok(DeviceProgram {
                    entry: e.name.clone(),
                    source: text(&e.source)?,
                    ptx: Some(text(&e.ptx)?),
                    cubin: match &e.cubin {
                        Some((sm, rel)) => Some((*sm, read(rel)?)),
                        None => None,
                    },
                    kernels: e
                        .kernels
                        .iter()
                        .map(|(symbol, weights)| KernelBinding { symbol: symbol.clone(), weights: weights.clone() })
                        .collect(),
                })
            })
            .collect()
    }
}
