//! Turns lowered entry points into loaded executables: from the first cache that holds a valid entry
//! for this program and environment, else by compiling with the plugin and storing the result.

use super::{environment, Client, Executable, COMPILE_OPTIONS};
use crate::backend::Program;
use crate::cache::{Environment, ExecutableCache, Lookup, Miss, ProgramKey};
use crate::error::Result;
use crate::progress::{Progress, Unit};
use std::path::PathBuf;
use std::time::Instant;

/// An entry point with its loaded executable.
pub struct EntryExecutable {
    pub entry: String,
    pub executable: Executable,
}

/// Where an executable came from.
#[derive(Clone, Debug)]
pub enum Provenance {
    /// Deserialized from a cache entry; no XLA compilation happened.
    Loaded(PathBuf),
    /// Compiled by the plugin, because of `Miss`; stored at the path when there is a writable cache.
    Compiled(Miss, Option<PathBuf>),
}

/// What happened to one entry point.
#[derive(Clone, Debug)]
pub struct CompileEvent {
    pub entry: String,
    pub provenance: Provenance,
    pub seconds: f64,
    /// Corrupt entries met on the way (already removed from writable caches), to report.
    pub corrupt: Vec<Miss>,
    /// Why a compiled executable could not be stored in the cache, to report.
    pub not_stored: Option<String>,
    /// Seconds spent waiting for another process compiling the same program into the same cache.
    pub waited: f64,
}

impl CompileEvent {
    pub fn compiled(&self) -> bool {
        matches!(self.provenance, Provenance::Compiled(..))
    }

    /// The cache file now holding this executable, if any.
    pub fn cache_file(&self) -> Option<&PathBuf> {
        match &self.provenance {
            Provenance::Loaded(path) | Provenance::Compiled(_, Some(path)) => Some(path),
            Provenance::Compiled(_, None) => None,
        }
    }
}

pub struct Compiler<'c> {
    client: &'c Client,
    env: Environment,
    target: String,
    /// Searched in order; only `store` is written.
    read_only: Vec<ExecutableCache>,
    store: Option<ExecutableCache>,
    /// Describes entries for `g4c cache ls` (the model directory or artifact).
    label: String,
}

impl<'c> Compiler<'c> {
    /// `store`: the cache that compiled executables go to (`None`: compile every time, cache nothing).
    pub fn new(client: &'c Client, target: &str, label: &str, store: Option<ExecutableCache>) -> Result<Self> {
        Ok(Compiler {
            client,
            env: environment(client)?,
            target: target.into(),
            read_only: vec![],
            store,
            label: label.into(),
        })
    }

    /// Also looks in `cache` (searched before the writable one, never written).
    pub fn also_reading(mut self, cache: ExecutableCache) -> Self {
        self.read_only.push(cache);
        self
    }

    pub fn environment(&self) -> &Environment {
        &self.env
    }

    /// Whether a cache holds an entry file for every program already, so that none would be
    /// compiled (nor stored). The files are found, not read: a damaged one is compiled again later.
    pub fn has_all(&self, programs: &[Program]) -> bool {
        programs.iter().all(|p| {
            let program = ProgramKey::new(&self.target, &p.entry, &COMPILE_OPTIONS, &p.text);
            self.read_only.iter().chain(&self.store).any(|c| c.holds(&program, &self.env))
        })
    }

    /// The executable of every entry point's program, in order.
    pub fn all(
        &self,
        programs: &[Program],
        progress: &dyn Progress,
    ) -> Result<(Vec<EntryExecutable>, Vec<CompileEvent>)> {
        let mut executables = vec![];
        let mut events = vec![];
        progress.begin("compiling", programs.len() as u64, Unit::Items);
        for p in programs {
            let (executable, event) = self.executable(p)?;
            executables.push(EntryExecutable { entry: p.entry.clone(), executable });
            events.push(event);
            progress.advance(1);
        }
        progress.end();
        Ok((executables, events))
    }

    /// `program`'s executable from `cache`, or why not (a corrupt entry is reported and, where the
    /// cache is written, removed).
    fn load(&self, cache: &ExecutableCache, program: &ProgramKey) -> std::result::Result<(PathBuf, Executable), Miss> {
        match cache.lookup(program, &self.env) {
            Lookup::Hit { path, body } => match self.client.deserialize(&body) {
                Ok(executable) => Ok((path, executable)),
                Err(e) => Err(cache.corrupt(path, format!("the plugin could not load it: {e}"))),
            },
            Lookup::Miss(m) => Err(m),
        }
    }

    pub fn executable(&self, p: &Program) -> Result<(Executable, CompileEvent)> {
        let started = Instant::now();
        let program = ProgramKey::new(&self.target, &p.entry, &COMPILE_OPTIONS, &p.text);
        let mut corrupt = vec![];
        let mut miss = Miss::Absent;
        let loaded = |path: PathBuf, executable: Executable, corrupt: Vec<Miss>, waited: f64| {
            let provenance = Provenance::Loaded(path);
            let seconds = started.elapsed().as_secs_f64();
            let event = CompileEvent { entry: p.entry.clone(), provenance, seconds, corrupt, not_stored: None, waited };
            (executable, event)
        };
        for cache in self.read_only.iter().chain(&self.store) {
            match self.load(cache, &program) {
                Ok((path, executable)) => return Ok(loaded(path, executable, corrupt, 0.0)),
                Err(m @ Miss::Corrupt { .. }) => corrupt.push(m),
                Err(m) if m.rank() > miss.rank() => miss = m,
                Err(_) => {}
            }
        }
        if let Some(first) = corrupt.first() {
            miss = first.clone();
        }
        // Another process may be compiling this program into the same cache: wait for it, then
        // take what it stored rather than compiling again.
        let waiting = Instant::now();
        let turn = self.store.as_ref().and_then(|cache| cache.compile_turn(&program, &self.env));
        let waited = waiting.elapsed().as_secs_f64();
        if let (Some(_), Some(cache)) = (&turn, &self.store) {
            if let Ok((path, executable)) = self.load(cache, &program) {
                return Ok(loaded(path, executable, corrupt, waited));
            }
        }
        let executable = self.client.compile(p.text.as_bytes())?;
        let mut not_stored = None;
        let stored = match &self.store {
            Some(cache) => {
                let meta = serde_json::json!({
                    "entry": p.entry,
                    "target": self.target,
                    "model": self.label,
                    "created_unix": std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    "compile_seconds": started.elapsed().as_secs_f64(),
                });
                // A cache that cannot be written costs the next run a compile, not this run its result.
                let stored = executable
                    .serialize()
                    .and_then(|body| cache.store(&program, &self.env, meta.as_object().unwrap().clone(), &body));
                stored.map_err(|e| not_stored = Some(e.to_string())).ok()
            }
            None => None,
        };
        // The turn ends when `turn` is dropped, here or on any return above.
        drop(turn);
        let provenance = Provenance::Compiled(miss, stored);
        let event = CompileEvent {
            entry: p.entry.clone(),
            provenance,
            seconds: started.elapsed().as_secs_f64(),
            corrupt,
            not_stored,
            waited,
        };
        Ok((executable, event))
    }
}
