//! The CUDA part of an artifact for a CUDA target, in `cuda/`: per entry point its kernels' CUDA C
//! (`<entry>.cu`), PTX (`<entry>.ptx`), a cubin for the target's SM when ptxas made one
//! (`<entry>.sm_XY.cubin`), and which symbol and weights each of the plan's launches uses; the
//! NVRTC version and PTX ISA are recorded, so a driver too old for the PTX is refused by name.
//! Each file's content hash is recorded too, and checked when the files are read back: a damaged
//! PTX or cubin would otherwise reach the driver, which may load it and compute something else.

use super::open::Artifact;
use crate::backend::cuda::{DeviceProgram, KernelBinding};
use crate::error::{Result, RuntimeError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    /// BLAKE3 of each of the files above, by path. Absent in artifacts of a g4c before it, which
    /// are refused: their files cannot be checked.
    #[serde(default)]
    pub blake3: BTreeMap<String, String>,
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
        let mut blake3 = BTreeMap::new();
        let mut put = |name: String, bytes: &[u8]| -> Result<String> {
            let path = dir.join(&name);
            std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
            let rel = format!("{DIR}/{name}");
            blake3.insert(rel.clone(), content_hash(bytes));
            Ok(rel)
        };
        let source = put(format!("{}.cu", p.entry), p.source.as_bytes())?;
        let ptx = put(format!("{}.ptx", p.entry), ptx.as_bytes())?;
        let cubin = match &p.cubin {
            Some((sm, bytes)) => Some((*sm, put(format!("{}.sm_{}{}.cubin", p.entry, sm.0, sm.1), bytes)?)),
            None => None,
        };
        entries.push(CudaEntry {
            name: p.entry.clone(),
            source,
            ptx,
            cubin,
            kernels: p.kernels.iter().map(|k| (k.symbol.clone(), k.weights.clone())).collect(),
            blake3,
        });
    }
    Ok(CudaInfo {
        nvrtc: format!("{}.{}", nvrtc.0, nvrtc.1),
        ptx_isa: isa,
        compute: format!("compute_{}{}", compute.0, compute.1),
        entries,
    })
}

fn content_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

impl Artifact {
    /// The artifact's CUDA programs, read back and checked: every file against its content hash,
    /// and every entry point's kernels and CUDA C against `planned`, what this g4c plans and emits
    /// for the artifact's module. An error names the file or entry point at fault.
    pub fn cuda_programs(&self, planned: &[DeviceProgram]) -> Result<Vec<DeviceProgram>> {
        let bad = |m: String| RuntimeError::Invalid(format!("artifact {}: {m}", self.dir.display()));
        let Some(info) = &self.manifest.cuda else {
            return Err(bad(format!("it holds no CUDA kernels (it was compiled for {})", self.manifest.target_name())));
        };
        let again = "compile it again with this g4c";
        if info.entries.len() != planned.len() {
            return Err(bad(format!(
                "{} CUDA programs, {} entry points planned; {again}",
                info.entries.len(),
                planned.len()
            )));
        }
        info.entries
            .iter()
            .zip(planned)
            .map(|(e, planned)| {
                let read = |rel: &str| {
                    let bytes = std::fs::read(self.dir.join(rel)).map_err(|err| bad(format!("{rel}: {err}")))?;
                    match e.blake3.get(rel) {
                        Some(hash) if *hash == content_hash(&bytes) => Ok(bytes),
                        Some(_) => Err(bad(format!("{rel} does not match its content hash in the manifest (damaged)"))),
                        None => Err(bad(format!("the manifest has no content hash for {rel}; {again}"))),
                    }
                };
                let text = |rel: &str| String::from_utf8(read(rel)?).map_err(|_| bad(format!("{rel}: not UTF-8")));
                let program = DeviceProgram {
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
                };
                if program.entry != planned.entry || program.kernels != planned.kernels {
                    return Err(bad(format!(
                        "the kernels of @{} differ from the ones this g4c plans for its module; {again}",
                        e.name
                    )));
                }
                if program.source != planned.source {
                    return Err(bad(format!(
                        "{} differs from the CUDA C this g4c emits for the plan of {} (from another g4c version); {again}",
                        e.source,
                        super::files::MODULE
                    )));
                }
                Ok(program)
            })
            .collect()
    }
}
