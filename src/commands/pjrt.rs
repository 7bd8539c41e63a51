//! Shared by the commands that run StableHLO: finding the plugin, getting every entry point's
//! executable through the caches while telling the user what happened, and uploading the weights.

use super::model_source::Opened;
use crate::ui::ui;
use anyhow::{bail, Result};
use g4c_codegen::stablehlo::Lowered;
use g4c_ir::Module;
use g4c_ir::Target;
use g4c_runtime::cache::{Environment, ExecutableCache, Miss};
use g4c_runtime::pjrt::{find_cpu_plugin, Api, Client};
use g4c_runtime::{lower_module, CompileEvent, Compiler, EntryExecutable, PjrtExecutor, Provenance};
use std::path::PathBuf;
use std::time::Instant;

/// `--plugin`, else `$G4C_PJRT_PLUGIN`, else the CPU plugin `scripts/setup` installed.
pub fn open_client(plugin: Option<PathBuf>) -> Result<Client> {
    let Some(path) = plugin.or_else(find_cpu_plugin) else {
        bail!(
            "no PJRT plugin: pass --plugin PATH, set G4C_PJRT_PLUGIN, or run scripts/setup to install the CPU plugin"
        );
    };
    if !path.exists() {
        bail!("PJRT plugin {} does not exist", path.display());
    }
    Ok(Client::new(Api::load(&path)?)?)
}

/// Refuses a plugin that does not run on `target`'s platform; `what` starts the message.
pub fn check_platform(client: &Client, target: &Target, what: &str) -> Result<()> {
    let platform = client.platform_name()?;
    let wanted = target.platform.name();
    if !platform.eq_ignore_ascii_case(wanted) {
        bail!(
            "{what} target {} (platform {wanted}); the plugin {} runs on {platform}",
            target.name,
            client.api().path.display()
        );
    }
    Ok(())
}

/// What getting the executables took, for `--stats` and reports.
pub struct CompileSummary {
    pub events: Vec<CompileEvent>,
    /// The plugin and host they are for.
    pub environment: Environment,
}

impl CompileSummary {
    pub fn seconds(&self) -> f64 {
        self.events.iter().map(|e| e.seconds).sum()
    }

    pub fn compiled(&self) -> usize {
        self.events.iter().filter(|e| e.compiled()).count()
    }

    /// `cached` when no entry point was compiled, else how many were.
    pub fn describe(&self) -> String {
        match self.compiled() {
            0 => format!("cached ({} entry points loaded in {:.2} s)", self.events.len(), self.seconds()),
            n => format!("compiled {n} of {} entry points in {:.2} s", self.events.len(), self.seconds()),
        }
    }
}

/// A compiler that looks in `artifact_executables` (never written), then in the user's cache, and
/// stores what it compiles in the user's cache.
pub fn cached_compiler<'c>(
    client: &'c Client,
    target: &str,
    label: &str,
    artifact_executables: Option<PathBuf>,
) -> Result<Compiler<'c>> {
    let compiler = Compiler::new(client, target, label, Some(ExecutableCache::user()?))?;
    Ok(match artifact_executables {
        Some(dir) => compiler.also_reading(ExecutableCache::at(dir, false)),
        None => compiler,
    })
}

/// Every entry point's executable: loaded from `artifact_executables` or the user's cache when a valid
/// entry exists for this plugin and host, else compiled and stored in the user's cache.
pub fn executables(
    client: &Client,
    lowered: Vec<Lowered>,
    target: &str,
    label: &str,
    artifact_executables: Option<PathBuf>,
) -> Result<(Vec<EntryExecutable>, CompileSummary)> {
    let compiler = cached_compiler(client, target, label, artifact_executables)?;
    let (executables, events) = compiler.all(lowered, &ui().progress())?;
    for event in &events {
        report(event);
    }
    Ok((executables, CompileSummary { events, environment: compiler.environment().clone() }))
}

/// How an executor got ready.
pub struct Readiness {
    pub compiled: CompileSummary,
    /// Loading (and converting) the weights and uploading them.
    pub weights_seconds: f64,
    pub total_seconds: f64,
}

/// An executor for `module` (from `source`) on the plugin: executables through the caches, weights
/// uploaded.
pub fn executor<'m>(
    source: &'m Opened,
    module: &'m Module,
    plugin: Option<PathBuf>,
) -> Result<(PjrtExecutor<'m>, Readiness)> {
    let started = Instant::now();
    let client = open_client(plugin)?;
    let lowered = lower_module(module)?;
    if let Some(artifact) = source.artifact() {
        check_platform(&client, source.target, &format!("artifact {} was compiled for", source.label))?;
        artifact.check_lowering(&lowered)?;
    }
    let artifact_executables = source.artifact().map(|a| a.executables_dir());
    let (executables, compiled) =
        executables(&client, lowered, source.target.name, &source.label, artifact_executables)?;
    let uploading = Instant::now();
    // Uploaded weights' pages are dropped as they are copied; host tables stay mapped.
    let exec = PjrtExecutor::new(module, source.weights(), client, executables, &ui().progress())?;
    let weights_seconds = uploading.elapsed().as_secs_f64();
    Ok((exec, Readiness { compiled, weights_seconds, total_seconds: started.elapsed().as_secs_f64() }))
}

fn report(event: &CompileEvent) {
    let ui = ui();
    for corrupt in &event.corrupt {
        ui.warn(&format!("{corrupt}; compiling @{} again", event.entry));
    }
    if let Some(error) = &event.not_stored {
        ui.warn(&format!("@{} was compiled but not cached: {error}", event.entry));
    }
    match &event.provenance {
        Provenance::Loaded(path) => {
            ui.detail(&format!("@{}: loaded from {} in {:.2} s", event.entry, path.display(), event.seconds))
        }
        Provenance::Compiled(miss @ Miss::OtherEnvironment(_), _) => {
            ui.note(&format!("@{}: {miss}; compiled for this one in {:.1} s", event.entry, event.seconds))
        }
        Provenance::Compiled(miss, _) => {
            ui.detail(&format!("@{}: {miss}; compiled in {:.1} s", event.entry, event.seconds))
        }
    }
}
