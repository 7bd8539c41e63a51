//! The host as a device: each program's CUDA C compiled by the host C++ compiler (`c++`, with
//! `emulator.h` standing in for CUDA's built-ins) into a shared library, buffers in host memory,
//! launches run by `g4c_emulate`. Slow, and only as exact as the host's libm, but it runs the very
//! source NVRTC compiles, so a kernel's indexing, fusion and arguments are checked on any machine.

use super::device::{Buffer, Device, DeviceProgram, Launch, LaunchSequence};
use super::guarded::GuardedBuffer;
use crate::error::{invalid, Result, RuntimeError};
use g4c_ir::plan::MAX_LAUNCH_ARGS;
use g4c_ir::TARGETS;
use std::collections::HashMap;
use std::ffi::c_void;
use std::process::Command;

const EMULATOR_H: &str = include_str!("emulator.h");

type Emulate = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *const u64, i32, u32, u32, i32, u32) -> i32;

/// The most dynamic shared memory the emulator gives a launch (`G4C_MAX_DYNAMIC_SMEM`): the
/// largest opt-in of any GPU target.
fn max_dynamic_smem() -> u32 {
    let gpus = TARGETS.iter().filter_map(|t| t.gpu.as_ref());
    gpus.map(|g| g.smem_per_block_optin).max().unwrap_or(0)
}

/// `emulator.h` as the host compiler reads it: the CUDA built-ins' stand-ins, after the bounds it
/// takes from the targets' table.
pub fn emulator_header() -> String {
    format!("#define G4C_MAX_DYNAMIC_SMEM {}\n{EMULATOR_H}", max_dynamic_smem())
}

pub struct Emulator {
    /// Per program (entry point): its library. Kept loaded while kernels may run.
    libraries: HashMap<String, libloading::Library>,
    /// Each ending at a page no kernel may touch (`GuardedBuffer`).
    buffers: Vec<GuardedBuffer>,
    _dir: tempfile::TempDir,
}

impl Emulator {
    /// Compiles every program for the host.
    pub fn new(programs: &[DeviceProgram]) -> Result<Emulator> {
        let fail = |m: String| RuntimeError::Invalid(format!("the CUDA host emulator: {m}"));
        let dir = tempfile::tempdir().map_err(|e| fail(format!("a temporary folder: {e}")))?;
        std::fs::write(dir.path().join("emulator.h"), emulator_header()).map_err(|e| fail(e.to_string()))?;
        let mut libraries = HashMap::new();
        for p in programs {
            let source = dir.path().join(format!("{}.cpp", p.entry));
            let library = dir.path().join(format!("lib{}.so", p.entry));
            std::fs::write(&source, format!("#include \"emulator.h\"\n{}", p.source))
                .map_err(|e| fail(e.to_string()))?;
            let out = Command::new("c++")
                // No fused multiply-adds the source does not ask for, as NVRTC compiles it
                // (`fmad=false`): clang on AArch64 would contract `a * b + c` otherwise.
                .args(["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread", "-w", "-o"])
                .arg(&library)
                .arg(&source)
                .output()
                .map_err(|e| fail(format!("running c++: {e}")))?;
            if !out.status.success() {
                let log = String::from_utf8_lossy(&out.stderr);
                let first: Vec<&str> = log.lines().filter(|l| l.contains("error")).take(3).collect();
                return Err(fail(format!("c++ failed on @{}: {}", p.entry, first.join(" | "))));
            }
            // SAFETY: a library just built from g4c's own kernels and emulator.h; loading runs no
            // initializer beyond the C++ runtime's.
            let lib = unsafe { libloading::Library::new(&library) }.map_err(|e| fail(e.to_string()))?;
            libraries.insert(p.entry.clone(), lib);
        }
        Ok(Emulator { libraries, buffers: Vec::new(), _dir: dir })
    }

    fn bytes_mut(&mut self, b: Buffer) -> &mut [u8] {
        self.buffers[b].bytes_mut()
    }
}

impl Device for Emulator {
    fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        self.buffers.push(GuardedBuffer::new(bytes)?);
        Ok(self.buffers.len() - 1)
    }

    fn upload(&mut self, buffer: Buffer, bytes: &[u8]) -> Result<()> {
        self.bytes_mut(buffer)[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn download(&mut self, buffer: Buffer, bytes: usize) -> Result<Vec<u8>> {
        Ok(self.bytes_mut(buffer)[..bytes].to_vec())
    }

    fn copy(&mut self, dst: Buffer, src: Buffer, bytes: usize) -> Result<()> {
        let from = self.bytes_mut(src)[..bytes].to_vec();
        self.bytes_mut(dst)[..bytes].copy_from_slice(&from);
        Ok(())
    }

    /// Launch by launch: the host has nothing to record a sequence into.
    fn run(&mut self, sequence: &LaunchSequence) -> Result<()> {
        let Some(lib) = self.libraries.get(&sequence.program) else {
            return invalid(format!("the host emulator has no program @{}", sequence.program));
        };
        // SAFETY: `g4c_emulate` is the launcher the library was built with.
        let emulate: libloading::Symbol<Emulate> =
            unsafe { lib.get(b"g4c_emulate") }.map_err(|e| RuntimeError::Invalid(e.to_string()))?;
        for launch in &sequence.launches {
            emulate_launch(lib, &emulate, &mut self.buffers, launch)?;
        }
        Ok(())
    }
}

fn emulate_launch(
    lib: &libloading::Library,
    emulate: &Emulate,
    buffers: &mut [GuardedBuffer],
    launch: &Launch,
) -> Result<()> {
    // SAFETY: the symbol is a kernel the library was built with; it takes `args.len()` pointers to
    // buffers this emulator owns, sized by the plan, and as many byte counts.
    let rc = unsafe {
        let kernel: libloading::Symbol<*mut c_void> = lib
            .get(launch.symbol.as_bytes())
            .map_err(|e| RuntimeError::Invalid(format!("kernel {}: {e}", launch.symbol)))?;
        let mut pointers: Vec<*mut c_void> = launch.args.iter().map(|&b| buffers[b].as_mut_ptr()).collect();
        let bytes: Vec<u64> = launch.args.iter().map(|&b| buffers[b].bytes() as u64).collect();
        emulate(
            *kernel,
            pointers.as_mut_ptr(),
            bytes.as_ptr(),
            pointers.len() as i32,
            launch.grid,
            launch.block,
            launch.synchronizes as i32,
            launch.dynamic_smem_bytes,
        )
    };
    if rc == 3 {
        return invalid(format!(
            "kernel {}: its dynamic shared-memory region is larger than the {} bytes the launch passed",
            launch.symbol, launch.dynamic_smem_bytes
        ));
    }
    if rc == 2 {
        return invalid(format!(
            "kernel {}: a block prefetched bytes outside every buffer the launch was given",
            launch.symbol
        ));
    }
    if rc != 0 {
        return invalid(format!(
            "kernel {}: the emulator refused a launch of {} arguments, {} threads and {} bytes of dynamic shared memory (at most {MAX_LAUNCH_ARGS}, 1024 and {})",
            launch.symbol,
            launch.args.len(),
            launch.block,
            launch.dynamic_smem_bytes,
            max_dynamic_smem()
        ));
    }
    Ok(())
}
