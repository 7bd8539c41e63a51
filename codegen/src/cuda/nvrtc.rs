//! NVRTC, loaded from the project's `.venv` (PyPI `nvidia-cuda-nvrtc-cu12`) or `G4C_NVRTC`: CUDA C
//! to PTX for any `compute_XY` on a machine without a GPU or a CUDA install.

use super::CudaError;
use std::path::PathBuf;
use std::sync::OnceLock;

const VENV_NVRTC: &str = "nvidia/cuda_nvrtc/lib/libnvrtc.so.12";

/// The NVRTC library g4c loads: `G4C_NVRTC`, else the project's `.venv`'s.
pub fn nvrtc_path() -> Option<PathBuf> {
    g4c_util::env::path_var("G4C_NVRTC").or_else(|| g4c_util::env::venv_file(VENV_NVRTC))
}

/// Loads NVRTC once. cudarc opens it by soname (`libnvrtc.so.12`), which finds the copy loaded
/// here by path, so no `LD_LIBRARY_PATH` is needed.
fn load() -> Result<(), CudaError> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let path = nvrtc_path();
        let expected = path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!(".venv/lib/python3*/site-packages/{VENV_NVRTC}"));
        let Some(path) = path else { return Err(expected) };
        // SAFETY: loading a shared library runs its initializers; libnvrtc's are those of a C library.
        match unsafe { libloading::Library::new(&path) } {
            // Kept loaded for the life of the process, as cudarc's own handle is.
            Ok(lib) => std::mem::forget(lib),
            Err(e) => return Err(format!("{expected} ({e})")),
        }
        // SAFETY: only probes whether the library can be opened.
        match unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            true => Ok(()),
            false => Err(expected),
        }
    });
    loaded.clone().map_err(CudaError::NoNvrtc)
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    load()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded; the pointers are to live locals.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| CudaError::Nvrtc {
        what: "a version query".into(),
        arch: String::new(),
        log: format!("{e:?}"),
    })?;
    Ok((major, minor))
}

/// PTX for `compute_{major}{minor}` of CUDA C `source` (`what` names it in errors). Floating-point
/// contraction is off, so products and sums round as the interpreter's do.
pub fn compile_ptx(source: &str, compute: (u32, u32), what: &str) -> Result<String, CudaError> {
    load()?;
    let arch: &'static str = match compute {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (a, b) => return Err(CudaError::Unsupported(format!("compute capability {a}.{b}"))),
    };
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        fmad: Some(false),
        name: Some(format!("{what}.cu")),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options).map_err(|e| CudaError::Nvrtc {
        what: what.to_string(),
        arch: arch.to_string(),
        log: compile_log(e),
    })?;
    Ok(ptx.to_src())
}

fn compile_log(e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            let log = log.to_string_lossy();
            // The first errors say what is wrong; the rest follow from them.
            log.lines().filter(|l| l.contains("error")).take(5).collect::<Vec<_>>().join(" | ")
        }
        other => format!("{other:?}"),
    }
}
