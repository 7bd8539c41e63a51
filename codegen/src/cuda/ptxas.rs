//! ptxas (PyPI `nvidia-cuda-nvcc-cu12`, or `G4C_PTXAS`): PTX to a cubin for one `sm_XY`, and what
//! each kernel uses: registers, static shared memory and spills, to check the plan's fit proof
//! against. It optimizes a module's kernels on every core where it can (`--split-compile 0`): an
//! E2B prefill's 85 kernels took 9.9 s on one core of this 2-core machine and take 6.1 s, and the
//! cubin is byte for byte the same.

use super::CudaError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const VENV_PTXAS: &str = "nvidia/cuda_nvcc/bin/ptxas";

/// Where ptxas is: `G4C_PTXAS`, else the one `scripts/setup` installed into `.venv`.
pub fn find_ptxas() -> Result<PathBuf, CudaError> {
    g4c_util::env::path_var("G4C_PTXAS")
        .or_else(|| g4c_util::env::venv_file(VENV_PTXAS))
        .ok_or_else(|| CudaError::NoPtxas(format!(".venv/lib/python3*/site-packages/{VENV_PTXAS}")))
}

/// What ptxas reports for one kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub registers: u32,
    pub smem_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

pub struct Cubin {
    pub bytes: Vec<u8>,
    /// Per kernel symbol.
    pub kernels: BTreeMap<String, KernelResources>,
}

/// Assembles `ptx` for `sm_{major}{minor}` and reads `ptxas -v`'s report.
pub fn assemble(ptx: &str, sm: (u32, u32)) -> Result<Cubin, CudaError> {
    let ptxas = find_ptxas()?;
    let arch = format!("sm_{}{}", sm.0, sm.1);
    let fail = |message: String| CudaError::Ptxas { arch: arch.clone(), message };
    let dir = tempfile::tempdir().map_err(|e| fail(format!("a temporary folder: {e}")))?;
    let (input, output) = (dir.path().join("k.ptx"), dir.path().join("k.cubin"));
    std::fs::write(&input, ptx).map_err(|e| fail(format!("writing {}: {e}", input.display())))?;
    let mut command = Command::new(&ptxas);
    if splits_compilation(&ptxas) {
        command.args(["--split-compile", "0"]);
    }
    let out = command
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| fail(format!("running {}: {e}", ptxas.display())))?;
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        // Its error lines, else whatever it said first (a fatal message, a crash's last words).
        let errors: Vec<&str> = report.lines().filter(|l| l.contains("error")).take(3).collect();
        let said: Vec<&str> = match errors.is_empty() {
            true => report.lines().map(str::trim).filter(|l| !l.is_empty()).take(3).collect(),
            false => errors,
        };
        let said = if said.is_empty() { "nothing on stdout or stderr".to_string() } else { said.join(" | ") };
        return Err(fail(format!("{} exited with {}: {said}", ptxas.display(), out.status)));
    }
    let bytes = std::fs::read(&output).map_err(|e| fail(format!("reading {}: {e}", output.display())))?;
    Ok(Cubin { bytes, kernels: parse_report(&report) })
}

/// Whether `ptxas` can spread its optimizations over threads (`--split-compile`, which older
/// releases lack), asked once per process.
fn splits_compilation(ptxas: &Path) -> bool {
    static SPLITS: OnceLock<bool> = OnceLock::new();
    *SPLITS.get_or_init(|| {
        let help = Command::new(ptxas).arg("--help").output();
        help.is_ok_and(|h| String::from_utf8_lossy(&h.stdout).contains("--split-compile"))
    })
}

/// Reads `ptxas -v`: "Compiling entry function 'NAME'", then "N bytes spill stores, M bytes spill
/// loads" and "Used R registers, ... S bytes smem".
fn parse_report(report: &str) -> BTreeMap<String, KernelResources> {
    let mut kernels = BTreeMap::new();
    let mut current: Option<String> = None;
    let number_before = |line: &str, unit: &str| -> Option<u32> {
        let at = line.find(unit)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.insert(name.clone(), KernelResources::default());
            current = Some(name);
            continue;
        }
        let Some(k) = current.as_ref().and_then(|c| kernels.get_mut(c)) else { continue };
        if line.contains("spill stores") {
            k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_resources_ptxas_reports() {
        let report = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'g4c_loop_ab' for 'sm_75'\n\
            ptxas info    : Function properties for g4c_loop_ab\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, 1024 bytes smem, 380 bytes cmem[0]\n";
        let k = super::parse_report(report)["g4c_loop_ab"];
        assert_eq!((k.registers, k.smem_bytes, k.spill_stores, k.spill_loads), (40, 1024, 4, 12));
    }
}
