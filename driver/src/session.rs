//! One place that turns a model source and a backend into a ready executor: the module (after the
//! target's passes) lowered, compiled through the caches and its weights uploaded, or handed to the
//! interpreter as it is.

use crate::pjrt::{check_platform, executables, open_client, Caches, CompileSummary};
use crate::source::ModelSource;
use crate::{cuda_programs, kernel_plan, stablehlo_programs, Feedback};
use anyhow::{bail, Result};
use g4c_frontend::Shapes;
use g4c_ir::Module;
use g4c_passes::PipelineOptions;
use g4c_runtime::backend::cuda::{cuda_driver_problem, CudaDevice, DeviceExecutor, Emulator};
use g4c_runtime::backend::pjrt::PjrtExecutor;
use g4c_runtime::backend::plan::PlanExecutor;
use g4c_runtime::{Executor, InterpExecutor, Interpreter};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The backends an executor can come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The reference interpreter: f32 op by op, any shapes, nothing to compile.
    Interp,
    /// StableHLO compiled and run by a PJRT plugin.
    Pjrt,
    /// The kernel plan for a CUDA target, run on the CPU kernel by kernel by the interpreter.
    Plan,
    /// The CUDA target's kernels on GPU 0, through the CUDA driver.
    Cuda,
    /// The CUDA target's kernels compiled by the host C++ compiler and run on the CPU (slow: a
    /// check of the kernels without a GPU).
    CudaHost,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Interp => "interp",
            BackendKind::Pjrt => "pjrt",
            BackendKind::Plan => "plan",
            BackendKind::Cuda => "cuda",
            BackendKind::CudaHost => "cuda-host",
        }
    }
}

pub struct SessionOptions {
    pub backend: BackendKind,
    /// `--target` (default `cpu`; an artifact refuses any but its own).
    pub target: Option<String>,
    /// The PJRT plugin (default: `$G4C_PJRT_PLUGIN`, else the CPU plugin `scripts/setup` installed).
    pub plugin: Option<PathBuf>,
    /// Look executables up in, and store them into, the user's cache (and an artifact's own).
    pub use_cache: bool,
    /// What the pipeline is asked for beyond the target (`--quantize`); an artifact has its own.
    pub pipeline: PipelineOptions,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            backend: BackendKind::Pjrt,
            target: None,
            plugin: None,
            use_cache: true,
            pipeline: PipelineOptions::default(),
        }
    }
}

/// A model source opened for one backend.
pub struct Session {
    pub source: ModelSource,
    pub backend: BackendKind,
    plugin: Option<PathBuf>,
    use_cache: bool,
}

/// An executor ready to run, and what getting it ready took.
pub struct Ready {
    pub executor: Box<dyn Executor>,
    /// How the executables were obtained (PJRT only).
    pub compiled: Option<CompileSummary>,
    /// Loading (and converting) the weights and uploading them.
    pub weights_seconds: f64,
    pub total_seconds: f64,
    /// The platform the executor runs on, as PJRT names it (`cpu` for the interpreter): a module
    /// prepared for a TPU may be run by the CPU plugin, and then host limits apply, not the target's.
    pub platform: String,
}

impl Session {
    pub fn open(path: &Path, options: SessionOptions) -> Result<Session> {
        let source = ModelSource::open(path, options.target.as_deref(), options.pipeline)?;
        Ok(Session { source, backend: options.backend, plugin: options.plugin, use_cache: options.use_cache })
    }

    /// The module for `shapes` after the target's passes (an artifact: its own, if the shapes match).
    pub fn module(&self, shapes: &Shapes) -> Result<Arc<Module>> {
        self.source.module(shapes)
    }

    fn caches(&self) -> Caches {
        match self.use_cache {
            true => Caches::User { artifact: self.source.artifact().map(|a| a.executables_dir()) },
            false => Caches::None,
        }
    }

    /// An executor of `module` (this session's, or any module over its weights) on the backend.
    pub fn executor(&self, module: Arc<Module>, feedback: &Feedback) -> Result<Ready> {
        let started = Instant::now();
        let weights = self.source.weights();
        match self.backend {
            BackendKind::Interp => Ok(Ready {
                executor: Box::new(InterpExecutor::new(Interpreter::new(module, weights))),
                compiled: None,
                weights_seconds: 0.0,
                total_seconds: started.elapsed().as_secs_f64(),
                platform: "cpu".into(),
            }),
            BackendKind::Cuda | BackendKind::CudaHost => {
                let target = self.source.target;
                let gpu = self.backend == BackendKind::Cuda;
                self.check_cuda_target()?;
                // Without a driver there is nothing to compile for: say so before compiling.
                if let (true, Some(problem)) = (gpu, cuda_driver_problem()) {
                    bail!("--backend cuda: {problem}; `g4c run --backend cuda-host` runs the same kernels on the CPU, slowly");
                }
                let plan = Arc::new(kernel_plan(&module, target)?);
                // An artifact's programs are checked against what this g4c plans (its CUDA C only,
                // not compiled again), whichever device runs them.
                let programs = match self.source.artifact() {
                    Some(artifact) => artifact.cuda_programs(&cuda_programs(&plan, target, false)?.programs)?,
                    None => cuda_programs(&plan, target, gpu)?.programs,
                };
                // The weights' time starts once the device has its modules (the driver's JIT of PTX
                // for another GPU, or the host compiler's build of the kernels).
                let (executor, weights_seconds): (Box<dyn Executor>, f64) = match gpu {
                    true => {
                        let device = CudaDevice::new(&programs)?;
                        let uploading = Instant::now();
                        let mut executor = DeviceExecutor::new(module, plan, &programs, weights, device)?;
                        let weights_seconds = uploading.elapsed().as_secs_f64();
                        // Each entry point's graph recorded now, not in its first call's time.
                        executor.prepare()?;
                        (Box::new(executor), weights_seconds)
                    }
                    false => {
                        let device = Emulator::new(&programs)?;
                        let uploading = Instant::now();
                        let executor = DeviceExecutor::new(module, plan, &programs, weights, device)?;
                        (Box::new(executor), uploading.elapsed().as_secs_f64())
                    }
                };
                Ok(Ready {
                    executor,
                    compiled: None,
                    weights_seconds,
                    total_seconds: started.elapsed().as_secs_f64(),
                    platform: if gpu { "cuda".into() } else { "cpu".into() },
                })
            }
            BackendKind::Plan => {
                self.check_cuda_target()?;
                let plan = Arc::new(kernel_plan(&module, self.source.target)?);
                Ok(Ready {
                    executor: Box::new(PlanExecutor::new(module, plan, weights)),
                    compiled: None,
                    weights_seconds: 0.0,
                    total_seconds: started.elapsed().as_secs_f64(),
                    platform: "cpu".into(),
                })
            }
            BackendKind::Pjrt => {
                let client = open_client(self.plugin.clone())?;
                let platform = client.platform_name()?;
                let programs = stablehlo_programs(&module)?;
                if let Some(artifact) = self.source.artifact() {
                    let what = format!("artifact {} was compiled for", self.source.label);
                    check_platform(&client, self.source.target, &what)?;
                    artifact.check_programs(&programs)?;
                }
                let (executables, compiled) =
                    executables(&client, &programs, self.source.target, &self.source.label, &self.caches(), feedback)?;
                let uploading = Instant::now();
                // Uploaded weights' pages are dropped as they are copied; host tables stay mapped.
                let exec = PjrtExecutor::new(module, weights, client, executables, feedback.progress)?;
                Ok(Ready {
                    executor: Box::new(exec),
                    compiled: Some(compiled),
                    weights_seconds: uploading.elapsed().as_secs_f64(),
                    total_seconds: started.elapsed().as_secs_f64(),
                    platform,
                })
            }
        }
    }

    /// The backends that run a kernel plan need a CUDA target.
    fn check_cuda_target(&self) -> Result<()> {
        let target = self.source.target;
        if target.platform == g4c_ir::Platform::Cuda {
            return Ok(());
        }
        let which = match self.source.artifact() {
            Some(_) => format!("artifact {} was compiled for {}", self.source.label, target.name),
            None => format!("the target is {} (give a CUDA --target: see `g4c targets`)", target.name),
        };
        bail!("--backend {} runs a CUDA target's kernels, and {which}", self.backend.name())
    }

    /// Seconds to get every executable of `module` by compiling with no cache (a cold start), and by
    /// loading from the caches a run reads (a warm start: what `executor` stored there).
    pub fn compile_times(&self, module: &Module) -> Result<(f64, f64)> {
        if self.backend != BackendKind::Pjrt {
            bail!("compile times are measured for the PJRT backend only");
        }
        let client = open_client(self.plugin.clone())?;
        let programs = stablehlo_programs(module)?;
        let (target, label) = (self.source.target, &self.source.label);
        let started = Instant::now();
        executables(&client, &programs, target, label, &Caches::None, &Feedback::silent())?;
        let cold = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let (_, warm) = executables(&client, &programs, target, label, &self.caches(), &Feedback::silent())?;
        if warm.compiled() > 0 {
            bail!("no cache kept the executables just compiled; cannot measure a warm start");
        }
        Ok((cold, started.elapsed().as_secs_f64()))
    }
}
