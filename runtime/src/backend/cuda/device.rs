//! What a device offers the plan executor: zeroed buffers, copies, and kernel launches by symbol.

use crate::error::Result;

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
    pub symbol: String,
    /// Weights passed after the kernel's inputs, by name.
    pub weights: Vec<String>,
}

/// One launch: which program's kernel, its grid and block, its dynamic shared memory, and whether
/// its threads synchronize (barriers, warp shuffles).
pub struct LaunchSpec<'a> {
    pub program: &'a str,
    pub symbol: &'a str,
    pub grid: u32,
    pub block: u32,
    pub synchronizes: bool,
}

pub trait Device: Send {
    /// A zeroed buffer of `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<Buffer>;
    fn upload(&mut self, buffer: Buffer, bytes: &[u8]) -> Result<()>;
    fn download(&mut self, buffer: Buffer, bytes: usize) -> Result<Vec<u8>>;
    fn copy(&mut self, dst: Buffer, src: Buffer, bytes: usize) -> Result<()>;
    /// Launches a kernel whose every parameter is a buffer's address.
    fn launch(&mut self, launch: &LaunchSpec, args: &[Buffer]) -> Result<()>;
}
