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
use std::path::{Path, PathBuf};
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
    /// Each ending at a page no kernel may touch, after words that show a write (`GuardedBuffer`).
    buffers: Vec<GuardedBuffer>,
    _dir: g4c_util::atomic::ScratchDir,
}

/// The compiler and flags of a host build. No fused multiply-adds the source does not ask for, as
/// NVRTC compiles it (`fmad=false`): clang on AArch64 would contract `a * b + c` otherwise.
const HOST_BUILD: &[&str] = &["c++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread", "-w"];

/// Writes `emulator.h` into `dir` and returns the command of a host build that includes it before
/// the kernels' source: what `build_for_host` runs, and what the tests' NVRTC stand-in runs.
pub fn host_build_in(dir: &Path) -> Result<Vec<String>> {
    let header = dir.join("emulator.h");
    std::fs::write(&header, emulator_header()).map_err(|e| emulator_error(format!("{}: {e}", header.display())))?;
    let mut command: Vec<String> = HOST_BUILD.iter().map(|s| s.to_string()).collect();
    command.extend(["-include".to_string(), header.display().to_string()]);
    Ok(command)
}

/// Compiles the kernels of entry point `entry` (their CUDA C, `source`) for the host into a shared
/// library in `dir` (beside a copy of `emulator.h`), whose `g4c_emulate` runs a launch of any of
/// them: what the emulator runs, and what the tests' stand-in CUDA driver runs a GPU's launches with.
pub fn build_for_host(entry: &str, source: &str, dir: &Path) -> Result<PathBuf> {
    let command = host_build_in(dir)?;
    let (cpp, library) = (dir.join(format!("{entry}.cpp")), dir.join(format!("lib{entry}.so")));
    std::fs::write(&cpp, source).map_err(|e| emulator_error(e.to_string()))?;
    let out = Command::new(&command[0])
        .args(&command[1..])
        .arg("-o")
        .arg(&library)
        .arg(&cpp)
        .output()
        .map_err(|e| emulator_error(format!("running c++: {e}")))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        let first: Vec<&str> = log.lines().filter(|l| l.contains("error")).take(3).collect();
        return Err(emulator_error(format!("c++ failed on @{entry}: {}", first.join(" | "))));
    }
    Ok(library)
}

/// An error of the host emulator (its build, its folder, its libraries).
fn emulator_error(m: String) -> RuntimeError {
    RuntimeError::Invalid(format!("the CUDA host emulator: {m}"))
}

impl Emulator {
    /// Compiles every program for the host.
    pub fn new(programs: &[DeviceProgram]) -> Result<Emulator> {
        let dir = g4c_util::atomic::ScratchDir::new("g4c-emulator-")
            .map_err(|e| emulator_error(format!("a temporary folder: {e}")))?;
        let mut libraries = HashMap::new();
        for p in programs {
            let library = build_for_host(&p.entry, &p.source, dir.path())?;
            // SAFETY: a library just built from g4c's own kernels and emulator.h; loading runs no
            // initializer beyond the C++ runtime's.
            let lib = unsafe { libloading::Library::new(&library) }.map_err(|e| emulator_error(e.to_string()))?;
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

    fn upload_at(&mut self, buffer: Buffer, offset: usize, bytes: &[u8]) -> Result<()> {
        let held = self.bytes_mut(buffer);
        let size = held.len();
        match offset.checked_add(bytes.len()).and_then(|end| held.get_mut(offset..end)) {
            Some(to) => to.copy_from_slice(bytes),
            None => return invalid(format!("an upload of {} bytes at {offset} into a buffer of {size}", bytes.len())),
        }
        Ok(())
    }

    fn download(&mut self, buffer: Buffer, bytes: usize) -> Result<Vec<u8>> {
        Ok(self.bytes_mut(buffer)[..bytes].to_vec())
    }

    fn copy(&mut self, dst: Buffer, src: Buffer, bytes: usize) -> Result<()> {
        let (to, from) = (self.bytes_mut(dst).len(), self.bytes_mut(src).len());
        if bytes > to.min(from) {
            return invalid(format!("a copy of {bytes} bytes from a buffer of {from} into one of {to}"));
        }
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
    // Every argument's front is checked and restored, so that no later launch is blamed.
    let mut damaged = None;
    for (i, &b) in launch.args.iter().enumerate() {
        if !buffers[b].front_restored() {
            damaged = damaged.or(Some(i));
        }
    }
    if let Some(i) = damaged {
        return invalid(format!("kernel {}: it wrote before the start of its argument {i}", launch.symbol));
    }
    // `g4c_emulate`'s codes, as its comment lists them.
    let refused = match rc {
        0 => return Ok(()),
        2 => "a block prefetched bytes outside every buffer the launch was given".to_string(),
        3 => format!(
            "its dynamic shared-memory region is larger than the {} bytes the launch passed",
            launch.dynamic_smem_bytes
        ),
        4 => "its threads met barriers apart (some of a warp's lanes at an exchange while others were at another exchange, at a block barrier or had returned, or some of a block's threads returned while others waited at a barrier), which a GPU does not allow".into(),
        5 => "it read an address that its load's width does not divide (a 16-byte `ld8`/`ld8_pairs`, a 4-byte `ld_word`/`ld_pair`/`__ldcg`/`atomicAdd`), where a GPU faults with a misaligned address".into(),
        6 => "a block wrote past the shared-memory region its launch declares, which on a GPU is another block's or out of range".into(),
        _ => format!(
            "the emulator refused a launch of {} blocks of {} threads, {} arguments and {} bytes of dynamic shared memory (at least 1 block of 1 thread; at most 1024 threads, {MAX_LAUNCH_ARGS} arguments and {} bytes)",
            launch.grid,
            launch.block,
            launch.args.len(),
            launch.dynamic_smem_bytes,
            max_dynamic_smem()
        ),
    };
    invalid(format!("kernel {}: {refused}", launch.symbol))
}

#[cfg(test)]
mod tests {
    use super::{Device, DeviceProgram, Emulator, Launch, LaunchSequence};

    const PRELUDE: &str = include_str!("../../../../codegen/src/cuda/prelude.cu");

    /// One launch shape of a test kernel.
    struct Shape {
        grid: u32,
        block: u32,
        synchronizes: bool,
    }

    /// Runs `kernel` (CUDA C after g4c's prelude, defining kernel `k(float* out)`) `times` times
    /// over one buffer of 64 floats, NaNs before each run: the outputs, or the first error.
    fn run(kernel: &str, shape: Shape, times: usize) -> Result<Vec<Vec<f32>>, String> {
        let source = format!("{PRELUDE}\n{kernel}");
        let program = DeviceProgram { entry: "test".into(), source, ptx: None, cubin: None, kernels: vec![] };
        let mut emulator = Emulator::new(&[program]).map_err(|e| e.to_string())?;
        let out = emulator.alloc(64 * 4).unwrap();
        let Shape { grid, block, synchronizes } = shape;
        let launch =
            Launch { symbol: "k".into(), grid, block, synchronizes, dynamic_smem_bytes: 0, args: vec![out], bytes: 0 };
        let sequence = LaunchSequence::new("test", vec![launch]);
        let nans: Vec<u8> = (0..64).flat_map(|_| f32::NAN.to_le_bytes()).collect();
        let mut outputs = Vec::new();
        for _ in 0..times {
            emulator.upload(out, &nans).unwrap();
            emulator.run(&sequence).map_err(|e| e.to_string())?;
            let bytes = emulator.download(out, 64 * 4).unwrap();
            outputs.push(bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect());
        }
        Ok(outputs)
    }

    /// A block of 64 threads that synchronizes.
    const BLOCK: Shape = Shape { grid: 1, block: 64, synchronizes: true };

    /// Each thread writes its index to shared memory, then reads its neighbour's (`t ^ apart`),
    /// with `between` in between.
    fn neighbours(apart: usize, between: &str) -> String {
        format!(
            "extern \"C\" __global__ void k(float* out) {{\n\
             STATIC_REGION(region, 256);\n\
             float* const s = (float*)region;\n\
             s[threadIdx.x] = threadIdx.x;\n\
             {between}\n\
             out[threadIdx.x] = s[threadIdx.x ^ {apart}];\n\
             }}\n"
        )
    }

    #[test]
    fn threads_reading_what_another_wrote_without_a_barrier_read_it_unwritten_in_some_order() {
        // Thread t reads the word of t ^ 1 (a lane of its warp) or of t ^ 32 (of the other warp):
        // in one order the lower thread reads first, in another the higher one, so each reads it
        // unwritten in some launch.
        for apart in [1, 32] {
            let raced = run(&neighbours(apart, ""), BLOCK, 4).unwrap();
            assert!((0..64).all(|t| raced.iter().any(|o| o[t].is_nan())), "{apart}: {raced:?}");
            for o in run(&neighbours(apart, "__syncthreads();"), BLOCK, 4).unwrap() {
                assert!(o.iter().enumerate().all(|(t, &v)| v == (t ^ apart) as f32), "{o:?}");
            }
        }
    }

    #[test]
    fn blocks_reading_what_another_block_writes_read_it_unwritten() {
        // Block b writes word b, then reads the words `d` above and below it (1 where there is
        // none) into words 16 + b and 32 + b: in one launch of 8 blocks, and in two of 2 (whose
        // blocks only ever run one way within a launch).
        for (grid, d, launches) in [(8, 1, 1), (8, 2, 1), (8, 3, 1), (2, 1, 2)] {
            let kernel = format!(
                "extern \"C\" __global__ void k(float* out) {{\n\
                 const unsigned b = blockIdx.x, d = {d};\n\
                 out[b] = 1.f;\n\
                 out[16 + b] = b + d < gridDim.x ? out[b + d] : 1.f;\n\
                 out[32 + b] = b >= d ? out[b - d] : 1.f;\n\
                 }}\n"
            );
            let outputs = run(&kernel, Shape { grid, block: 1, synchronizes: false }, launches).unwrap();
            let unwritten = |from: usize| outputs.iter().any(|o| (from..from + grid as usize).any(|i| o[i].is_nan()));
            assert!(unwritten(16) && unwritten(32), "{grid} blocks, distance {d}: {outputs:?}");
        }
    }

    #[test]
    fn a_kernel_reading_or_writing_before_its_buffer_is_caught() {
        let one_block = || Shape { grid: 1, block: 1, synchronizes: false };
        let read = "extern \"C\" __global__ void k(float* out) { out[0] = out[-1] + 1.f; }\n";
        assert!(run(read, one_block(), 1).unwrap()[0][0].is_nan());
        let write = "extern \"C\" __global__ void k(float* out) { out[-1] = 0.f; }\n";
        let e = run(write, one_block(), 1).unwrap_err();
        assert!(e.contains("wrote before the start of its argument 0"), "{e}");
    }

    #[test]
    fn a_launch_of_no_blocks_or_no_threads_is_refused() {
        let kernel = "extern \"C\" __global__ void k(float* out) { out[0] = 1.f; }\n";
        assert!(run(kernel, Shape { grid: 1, block: 1, synchronizes: false }, 1).is_ok());
        for (grid, block) in [(0, 1), (1, 0)] {
            let e = run(kernel, Shape { grid, block, synchronizes: false }, 1).unwrap_err();
            assert!(e.contains("at least 1 block of 1 thread"), "{e}");
        }
    }

    #[test]
    fn a_load_from_an_address_its_width_does_not_divide_is_refused() {
        let one_thread = || Shape { grid: 1, block: 1, synchronizes: false };
        let ld8 = |offset: usize| {
            format!(
                "extern \"C\" __global__ void k(float* out) {{ float v[8]; ld8(out + {offset}, v); out[0] = v[1]; }}\n"
            )
        };
        assert!(run(&ld8(8), one_thread(), 1).is_ok());
        let e = run(&ld8(2), one_thread(), 1).unwrap_err();
        assert!(e.contains("misaligned address"), "{e}");
        let pair = "extern \"C\" __global__ void k(float* out) { out[0] = ld_pair((const u16*)out + 1); }\n";
        let e = run(pair, one_thread(), 1).unwrap_err();
        assert!(e.contains("misaligned address"), "{e}");
    }

    #[test]
    fn a_block_writing_past_its_shared_memory_region_is_refused() {
        let write_at = |word: usize| {
            format!(
                "extern \"C\" __global__ void k(float* out) {{\n\
                 STATIC_REGION(region, 64);\n\
                 ((float*)region)[{word}] = 1.f;\n\
                 out[threadIdx.x] = ((float*)region)[{word}];\n\
                 }}\n"
            )
        };
        let two_blocks = || Shape { grid: 2, block: 1, synchronizes: false };
        assert!(run(&write_at(15), two_blocks(), 1).is_ok());
        let e = run(&write_at(16), two_blocks(), 1).unwrap_err();
        assert!(e.contains("wrote past the shared-memory region"), "{e}");
    }

    #[test]
    fn threads_that_meet_barriers_apart_are_refused() {
        // Half of the block returns before the barrier the other half waits at.
        let early_return = "extern \"C\" __global__ void k(float* out) {\n\
                            if (threadIdx.x >= 32) return;\n\
                            __syncthreads();\n\
                            out[threadIdx.x] = 1.f;\n\
                            }\n";
        let e = run(early_return, BLOCK, 1).unwrap_err();
        assert!(e.contains("met barriers apart"), "{e}");
        // Half of a warp's lanes take a butterfly the other half skip.
        let half_warp = "extern \"C\" __global__ void k(float* out) {\n\
                         float v = threadIdx.x;\n\
                         if (threadIdx.x % 32 < 16) v = warp_sum(v);\n\
                         __syncthreads();\n\
                         out[threadIdx.x] = v;\n\
                         }\n";
        let e = run(half_warp, BLOCK, 1).unwrap_err();
        assert!(e.contains("met barriers apart"), "{e}");
        // Half of a warp's lanes sum while the other half take the maximum.
        let two_butterflies = half_warp.replace("v = warp_sum(v);", "v = warp_sum(v); else v = warp_max(v);");
        let e = run(&two_butterflies, BLOCK, 1).unwrap_err();
        assert!(e.contains("met barriers apart"), "{e}");
        // Every lane at the butterfly is no divergence.
        let whole_warp = half_warp.replace("if (threadIdx.x % 32 < 16) ", "");
        let sums = run(&whole_warp, BLOCK, 1).unwrap();
        assert_eq!(sums[0][0], (0..32).sum::<u32>() as f32);
    }
}
