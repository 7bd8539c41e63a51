//! Ahead-of-time compilation: a checkpoint's module emitted, put through the target's pipeline,
//! lowered, compiled where the target's plugin is present, and written as an artifact.

use crate::pjrt::{all_cached, check_platform, executables, open_client, Caches, CompileSummary};
use crate::{cuda_programs, kernel_plan, kernel_report, stablehlo_programs, CudaBuild, Feedback};
use anyhow::{bail, Context, Result};
use g4c_frontend::{emit_module_with_prefills, Model, Shapes};
use g4c_ir::plan::KernelPlan;
use g4c_ir::{Module, Platform, Target};
use g4c_passes::{compile_report, PassTiming, Pipeline, PipelineOptions};
use g4c_runtime::artifact::{check_output_dir, ArtifactDraft, ArtifactSource, CudaKernels, Manifest, ShapeInfo};
use g4c_runtime::backend::pjrt::{find_cpu_plugin, PROGRAM_FORMAT};
use g4c_runtime::cache::ExecutableCache;
use g4c_runtime::Program;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The checkpoint's module for `shapes` (the longest prefill) with one more prefill entry point per
/// length in `shorter`, verified.
pub fn emit(model: &Model, shapes: &Shapes, shorter: &[usize]) -> Result<Module> {
    let module = emit_module_with_prefills(&model.config, model.weights.clone(), shapes, shorter)?;
    g4c_ir::verify_module(&module)?;
    Ok(module)
}

/// Runs `target`'s pipeline on `module`, verifying after every pass; `observe` sees the module
/// before the first pass (`"input"`) and after each; stops after `stop_after` when given. Returns
/// the pipeline and each pass's time.
pub fn run_passes(
    module: &mut Module,
    target: &'static Target,
    options: &PipelineOptions,
    stop_after: Option<&str>,
    observe: &mut dyn FnMut(&str, &Module),
) -> Result<(Pipeline, Vec<PassTiming>)> {
    let pipeline = Pipeline::new(target, options);
    let timings = pipeline.run(module, stop_after, observe)?;
    Ok((pipeline, timings))
}

/// What `g4c compile` is asked to do.
pub struct CompileRequest<'a> {
    pub model_dir: &'a Path,
    pub target: &'static Target,
    /// Sequences per call.
    pub batch: usize,
    /// Positions a sequence may reach.
    pub context: usize,
    /// Every prefill length, increasing; the longest is the module's main prefill entry point.
    pub prefill_lens: Vec<usize>,
    /// What the pipeline is asked for beyond the target (`--quantize`).
    pub options: PipelineOptions,
    /// The PJRT plugin that compiles the executables (default for `cpu`: the CPU plugin; other
    /// targets compile only with one given).
    pub plugin: Option<PathBuf>,
    /// Also compile every entry point with the PJRT CPU plugin (for other targets: a check).
    pub check_on_cpu: bool,
    /// Write an artifact here.
    pub out: Option<&'a Path>,
}

/// What `g4c compile` did.
pub struct Compiled {
    pub programs: Vec<Program>,
    /// The compile report (`compile_report`).
    pub report: serde_json::Value,
    /// How the executables were obtained; `None` when no plugin for the target's platform was here.
    pub executables: Option<CompileSummary>,
    /// `--check-on-cpu` for another platform's target: how the CPU plugin's executables were had.
    pub cpu_check: Option<CompileSummary>,
    pub artifact: Option<Manifest>,
}

pub fn compile(req: &CompileRequest, feedback: &Feedback) -> Result<Compiled> {
    let target = req.target;
    if let Some(out) = req.out {
        check_output_dir(out)?;
    }
    let model = crate::source::open_checkpoint(req.model_dir)?;
    let (&longest, shorter) = req.prefill_lens.split_last().context("at least one prefill length")?;
    let shapes = Shapes { batch: req.batch, prefill_len: longest, context: req.context };
    let mut module = emit(&model, &shapes, shorter)?;
    let (pipeline, _) = run_passes(&mut module, target, &req.options, None, &mut |_, _| {})?;
    let programs = stablehlo_programs(&module)?;
    // A CUDA target's plan first, where a kernel that cannot fit is refused, before anything is
    // written.
    let plan = target.gpu.as_ref().map(|_| kernel_plan(&module, target)).transpose()?;
    // The artifact's module and weights need nothing the target's compile makes: they are written
    // while it runs (E2B on 2 cores: for cpu 30 s to 19 s, for h200 32 s to 27 s). A compile that
    // fails stops them at the next tensor rather than waiting for them all.
    let (store, abandoned) = (model.checkpoint.as_ref(), AtomicBool::new(false));
    let (built, draft) = std::thread::scope(|threads| {
        let draft = req.out.map(|out| {
            let (module, progress, abandoned) = (&module, feedback.progress, &abandoned);
            threads.spawn(move || {
                let draft = ArtifactDraft::begin(out, module, store, progress, abandoned);
                draft.with_context(|| format!("artifact {}", out.display()))
            })
        });
        let built = build_for_target(req, &programs, plan.as_ref(), feedback);
        abandoned.store(built.is_err(), Ordering::Relaxed);
        (built, draft.map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))))
    });
    // `_staging` holds the executables until the artifact has copied them.
    let (TargetBuild { cpu_check, executables, staging: _staging, cuda }, draft) = (built?, draft.transpose()?);
    let cuda = plan.zip(cuda).map(|(plan, build)| (kernel_report(&plan, &build, target), build));
    let mut report = compile_report(&module, target, &pipeline.names());
    if let Some((kernels, _)) = &cuda {
        report["kernels"] = kernels.clone();
    }
    let artifact = match (req.out, draft) {
        (Some(out), Some(draft)) => {
            let (files, environment) = match &executables {
                Some(summary) => (
                    summary
                        .events
                        .iter()
                        .filter_map(|e| e.cache_file().map(|f| (e.entry.clone(), f.clone())))
                        .collect(),
                    Some(summary.environment.to_json()),
                ),
                None => (vec![], None),
            };
            let source = ArtifactSource {
                model_dir: req.model_dir,
                programs: &programs,
                format: PROGRAM_FORMAT,
                executables: files,
                executables_environment: environment,
                target: target.to_json(),
                passes: pipeline.names().iter().map(|p| p.to_string()).collect(),
                options: req.options.describe(),
                report: report.clone(),
                shapes: ShapeInfo { batch: req.batch, prefill_lens: req.prefill_lens.clone(), context: req.context },
                cuda: cuda.as_ref().map(|(_, b)| CudaKernels {
                    programs: &b.programs,
                    nvrtc: b.nvrtc.expect("PTX was compiled"),
                    compute: target.gpu.as_ref().expect("a CUDA target").compute_capability,
                }),
            };
            // Errors name the artifact asked for, not only the temporary being filled.
            Some(draft.finish(&source).with_context(|| format!("artifact {}", out.display()))?)
        }
        _ => None,
    };
    Ok(Compiled { programs, report, executables, cpu_check, artifact })
}

/// What compiling the lowered module for its target made.
struct TargetBuild {
    /// `--check-on-cpu` for another platform's target: how the CPU plugin's executables were had.
    cpu_check: Option<CompileSummary>,
    /// How the executables were obtained; `None` when no plugin for the target's platform was here.
    executables: Option<CompileSummary>,
    /// Where an artifact's executables wait to be copied into it.
    staging: Option<g4c_util::atomic::ScratchDir>,
    /// A CUDA target's kernels.
    cuda: Option<CudaBuild>,
}

/// Compiles `programs` with the target's PJRT plugin where there is one (and the CPU plugin's
/// check when asked), and a CUDA target's `plan` to PTX (and cubins).
fn build_for_target(
    req: &CompileRequest,
    programs: &[Program],
    plan: Option<&KernelPlan>,
    feedback: &Feedback,
) -> Result<TargetBuild> {
    let target = req.target;
    let plugin = req.plugin.clone().or_else(|| (target.platform == Platform::Cpu).then(find_cpu_plugin).flatten());
    let client = match &plugin {
        Some(path) => {
            let client = open_client(Some(path.clone()))?;
            check_platform(&client, target, "compiling for")?;
            Some(client)
        }
        None => None,
    };
    // Before compiling anything: without -o the cache is where the work is kept, unless it holds
    // it all already.
    if let (Some(client), None) = (&client, req.out) {
        let user = Caches::User { artifact: None };
        // No user cache at all is said below, with the hint.
        if !all_cached(client, programs, target, &user).unwrap_or(false) {
            ExecutableCache::user()
                .and_then(|cache| cache.check_writable())
                .map_err(|e| anyhow::anyhow!("{e}; without -o, compile keeps its executables there (give -o DIR)"))?;
        }
    }
    // What the CPU plugin compiled for the check is cached like a run's executables (keyed by target
    // and plugin), so a second check of the same programs is a lookup; without a user cache, nothing is.
    let cpu_check = match req.check_on_cpu && target.platform != Platform::Cpu {
        true => {
            let client = open_client(None)?;
            let caches = match ExecutableCache::user() {
                Ok(_) => Caches::User { artifact: None },
                Err(_) => Caches::None,
            };
            let checked = executables(&client, programs, target, "check", &caches, feedback);
            Some(checked.context("the CPU plugin rejected the programs")?.1)
        }
        false => None,
    };
    let label = req.model_dir.display().to_string();
    // Executables for an artifact are staged apart from the user's cache (which may be read-only)
    // and every one must be there; without -o they only warm the user's cache.
    let staging = match req.out {
        Some(out) => Some(g4c_util::atomic::ScratchDir::new("g4c-executables-").map_err(|e| {
            anyhow::anyhow!(
                "artifact {}: staging its executables in {}: {e}",
                out.display(),
                std::env::temp_dir().display()
            )
        })?),
        None => None,
    };
    let caches = match &staging {
        Some(dir) => Caches::Staging { staging: dir.path().to_path_buf() },
        None => Caches::User { artifact: None },
    };
    let executables = match &client {
        Some(client) => Some(executables(client, programs, target, &label, &caches, feedback)?.1),
        None => None,
    };
    // Without -o, the executable cache is where a compile's work is kept: one it cannot write to
    // is a failure there, not the warning it is for `run`.
    if let Some(e) = executables.iter().flat_map(|s| &s.events).find(|e| e.cache_file().is_none()) {
        let why = e.not_stored.as_deref().unwrap_or("no file was written");
        match req.out {
            Some(out) => bail!("artifact {}: the executable of @{} could not be staged: {why}", out.display(), e.entry),
            None => bail!("@{} was compiled but could not be kept: {why}", e.entry),
        }
    }
    let cuda = plan.map(|plan| cuda_programs(plan, target, true)).transpose()?;
    Ok(TargetBuild { cpu_check, executables, staging, cuda })
}
