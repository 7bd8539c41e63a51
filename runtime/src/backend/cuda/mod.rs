//! Kernel plans on a device: `DeviceExecutor` runs a plan's kernels over device buffers (weights
//! uploaded once, state kept on the device and written in place, scratch buffers as the plan
//! assigns them), as one fixed `LaunchSequence` per entry point, on any `Device`: a CUDA GPU through
//! the driver API (`CudaDevice`, which records each sequence once as a CUDA graph and replays it),
//! or the host (`Emulator`), which compiles the same CUDA C with the host C++ compiler (each buffer
//! ending at a page no kernel may touch, `guarded`), so the
//! kernels, their arguments and the executor are checked against the goldens without a GPU.

mod device;
mod driver;
mod emulator;
mod executor;
mod guarded;
mod staging;

pub use device::{launch_bindings, launch_of, Buffer, Device, DeviceProgram, KernelBinding, Launch, LaunchSequence};
pub use driver::{
    cuda_device_capability, cuda_driver_problem, cuda_memory_bandwidth, ptx_isa_supported, ptx_isa_version,
    ptx_kernels_waiting, CudaDevice,
};
pub use emulator::{build_for_host, emulator_header, host_build_in, Emulator};
pub use executor::DeviceExecutor;
