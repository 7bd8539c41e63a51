//! What a device offers the plan executor: zeroed buffers, copies, and sequences of kernel launches.

use crate::error::Result;
use g4c_ir::plan::{launch_grid, EntryPlan, KernelCall, SharedRegion, Slot};
use std::sync::atomic::{AtomicU64, Ordering};

/// A buffer of one device, by index.
pub type Buffer = usize;

/// One entry point's compiled kernels, as codegen made them.
#[derive(Clone, Debug)]
pub struct DeviceProgram {
    pub entry: String,
    /// CUDA C of every kernel (what the host emulator compiles).
    pub source: String,
    /// PTX for the target's `compute_XY` (what a driver JIT-compiles).
    pub ptx: Option<String>,
    /// A cubin for exactly this `sm_XY`, when ptxas made one.
    pub cubin: Option<((u32, u32), Vec<u8>)>,
    /// Per kernel call of the entry's plan: its symbol and the weights it takes.
    pub kernels: Vec<KernelBinding>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelBinding {
    /// The kernel of its launch, which the calls side by side in it share.
    pub symbol: String,
    /// Weights passed after the kernel's inputs, by name.
    pub weights: Vec<String>,
}

/// Each launch of `entry`'s plan with the bindings of its calls (`bindings`: one per call of the
/// plan, in order, as a `DeviceProgram` holds them).
pub fn launch_bindings<'a>(
    entry: &'a EntryPlan,
    bindings: &'a [KernelBinding],
) -> impl Iterator<Item = (&'a [KernelCall], &'a [KernelBinding])> {
    let mut first = 0;
    entry.launches().map(move |calls| {
        let parts = &bindings[first..first + calls.len()];
        first += calls.len();
        (calls, parts)
    })
}

/// The launch of one launch's `calls` (with their bindings `parts`, as `launch_bindings` pairs
/// them) over the buffers `buffer` and `weight` name: each call's arguments one after the other,
/// its inputs, then its weights, then its output unless it updates an input in place, then a split
/// GEMM's split sums or a tail's count.
pub fn launch_of(
    calls: &[KernelCall],
    parts: &[KernelBinding],
    buffer: impl Fn(Slot) -> Buffer,
    weight: impl Fn(&str) -> Buffer,
) -> Launch {
    let mut args: Vec<Buffer> = Vec::new();
    for (call, k) in calls.iter().zip(parts) {
        args.extend(call.inputs.iter().map(|&s| buffer(s)));
        args.extend(k.weights.iter().map(|w| weight(w)));
        if !call.inputs.contains(&call.output) {
            args.push(buffer(call.output));
        }
        if let Some(sums) = call.split_sums {
            args.push(buffer(sums.buffer));
        }
    }
    Launch {
        symbol: parts[0].symbol.clone(),
        grid: launch_grid(calls),
        block: calls[0].launch.block,
        // A tail's block waits for its call's at a barrier.
        synchronizes: calls.iter().any(|c| c.launch.synchronizes() || c.tail),
        dynamic_smem_bytes: SharedRegion::of(calls).dynamic_bytes(),
        args,
        bytes: 0,
    }
}

/// One kernel launch: its symbol, grid and block, whether its threads synchronize (barriers, warp
/// shuffles), and its arguments, every one a buffer's address (each call's of the launch in turn).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub symbol: String,
    pub grid: u32,
    pub block: u32,
    pub synchronizes: bool,
    /// Its dynamic shared memory (`SharedRegion::dynamic_bytes`): 0 where its region is static.
    pub dynamic_smem_bytes: u32,
    pub args: Vec<Buffer>,
    /// The bytes its calls must move through device memory (`CallTraffic`, every cache chunk
    /// counted), which `G4C_CUDA_PROFILE` divides by its time; 0 where not counted.
    pub bytes: u64,
}

/// The launches of one call of an entry point, in order, over buffers that stay the same from call
/// to call: the same work every time, so a device may record it once and replay the recording
/// (a CUDA graph) instead of launching kernel by kernel. A sequence never changes; one over other
/// buffers is a new sequence with a new `id`.
#[derive(Debug)]
pub struct LaunchSequence {
    pub id: u64,
    /// The program (entry point) whose kernels it launches.
    pub program: String,
    pub launches: Vec<Launch>,
}

impl LaunchSequence {
    pub fn new(program: &str, launches: Vec<Launch>) -> LaunchSequence {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        LaunchSequence { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), program: program.to_string(), launches }
    }
}

pub trait Device: Send {
    /// A zeroed buffer of `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<Buffer>;
    /// Copies `bytes` into `buffer` from its byte `offset` on, and waits for the copy.
    fn upload_at(&mut self, buffer: Buffer, offset: usize, bytes: &[u8]) -> Result<()>;
    /// Copies `bytes` into the start of `buffer` and waits for the copy.
    fn upload(&mut self, buffer: Buffer, bytes: &[u8]) -> Result<()> {
        self.upload_at(buffer, 0, bytes)
    }
    /// Copies `bytes` into `buffer` after the operations before it and before those after it,
    /// without waiting for the copy: the device keeps the bytes until it is done. A step's inputs
    /// go so, queued ahead of its launches rather than each waited for on its own.
    fn upload_queued(&mut self, buffer: Buffer, bytes: &[u8]) -> Result<()> {
        self.upload(buffer, bytes)
    }
    /// Waits for the launches before it.
    fn download(&mut self, buffer: Buffer, bytes: usize) -> Result<Vec<u8>>;
    fn copy(&mut self, dst: Buffer, src: Buffer, bytes: usize) -> Result<()>;
    /// Runs a sequence's launches in order, after every operation before it and before every one
    /// after it.
    fn run(&mut self, sequence: &LaunchSequence) -> Result<()>;
    /// Readies `sequence` for `run` without running it (a CUDA device records its graph); a
    /// device that records nothing has nothing to do.
    fn prepare(&mut self, _sequence: &LaunchSequence) -> Result<()> {
        Ok(())
    }
}
