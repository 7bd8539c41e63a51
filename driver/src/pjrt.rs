//! The PJRT backend's part of the driver: finding and opening the plugin, checking it runs the
//! target's platform, and getting every entry point's executable through the caches.

use crate::Feedback;
use anyhow::{bail, Result};
use g4c_ir::Target;
use g4c_runtime::backend::pjrt::{find_cpu_plugin, Api, Client, CompileEvent, Compiler, EntryExecutable};
use g4c_runtime::cache::{Environment, ExecutableCache};
use g4c_runtime::Program;
use std::path::PathBuf;

/// `plugin`, else `$G4C_PJRT_PLUGIN`, else the CPU plugin `scripts/setup` installed.
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

/// Where executables are looked up and stored.
#[derive(Clone, Debug)]
pub enum Caches {
    /// Compile everything, cache nothing (tests that compile what they run, cold-start timing).
    None,
    /// Look in `artifact` (an artifact's `executables/`, never written) when given, then in the
    /// user's cache, and store what is compiled in the user's cache.
    User { artifact: Option<PathBuf> },
    /// Look in the user's cache (when there is one), and store what is compiled in `staging` only:
    /// an artifact's executables must not depend on the user's cache being writable.
    Staging { staging: PathBuf },
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

fn compiler<'c>(client: &'c Client, target: &Target, label: &str, caches: &Caches) -> Result<Compiler<'c>> {
    Ok(match caches {
        Caches::None => Compiler::new(client, target.name, label, None)?,
        Caches::User { artifact } => {
            let compiler = Compiler::new(client, target.name, label, Some(ExecutableCache::user()?))?;
            match artifact {
                Some(dir) => compiler.also_reading(ExecutableCache::at(dir, false)),
                None => compiler,
            }
        }
        Caches::Staging { staging } => {
            let compiler = Compiler::new(client, target.name, label, Some(ExecutableCache::at(staging, true)))?;
            match ExecutableCache::user() {
                Ok(user) => compiler.also_reading(ExecutableCache::at(user.dir(), false)),
                Err(_) => compiler,
            }
        }
    })
}

/// Whether `caches` hold every program's executable for this plugin and host already.
pub fn all_cached(client: &Client, programs: &[Program], target: &Target, caches: &Caches) -> Result<bool> {
    Ok(compiler(client, target, "", caches)?.has_all(programs))
}

/// Every program's executable: loaded from the caches when a valid entry exists for this plugin and
/// host, else compiled (and stored where `caches` says). Each event is reported as it happens.
pub fn executables(
    client: &Client,
    programs: &[Program],
    target: &Target,
    label: &str,
    caches: &Caches,
    feedback: &Feedback,
) -> Result<(Vec<EntryExecutable>, CompileSummary)> {
    let compiler = compiler(client, target, label, caches)?;
    let (executables, events) = compiler.all(programs, feedback.progress)?;
    for event in &events {
        (feedback.on_compile)(event);
    }
    Ok((executables, CompileSummary { events, environment: compiler.environment().clone() }))
}
