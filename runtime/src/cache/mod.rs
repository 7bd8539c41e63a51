//! A content-addressed directory of compiled executables, one file per (program, environment):
//! the user's cache (`$G4C_CACHE_DIR`, else `$XDG_CACHE_HOME/g4c`, else `~/.cache/g4c`) or an
//! artifact's `executables/`.
//! Entries are written atomically (temporary file, then rename), so concurrent compiles of one model
//! leave one valid entry; an entry that fails its header or checksum is reported, removed and rebuilt.

pub mod entry;
mod key;

pub use entry::{EntryError, EntryMeta};
pub use key::{file_hash, Environment, ProgramKey, G4C_VERSION};

use key::file_name;

use crate::error::{Result, RuntimeError};
use g4c_util::atomic::write_atomic;
use std::path::{Path, PathBuf};

pub const EXTENSION: &str = "g4cx";

pub struct ExecutableCache {
    dir: PathBuf,
    /// Corrupt entries are removed only from a writable cache (not from an artifact being run).
    writable: bool,
}

/// The outcome of looking up one program.
pub enum Lookup {
    Hit { path: PathBuf, body: Vec<u8> },
    Miss(Miss),
}

/// Why a lookup found nothing usable.
#[derive(Clone, Debug, PartialEq)]
pub enum Miss {
    Absent,
    /// Entries of the same program exist, compiled for another environment; what differs.
    OtherEnvironment(Vec<String>),
    /// The entry exists but failed its checks; it was removed if the cache is writable.
    Corrupt {
        path: PathBuf,
        error: String,
        removed: bool,
    },
}

impl Miss {
    /// How much a miss says: a corrupt entry matters more than a foreign one, which matters more
    /// than none at all.
    pub fn rank(&self) -> u8 {
        match self {
            Miss::Absent => 0,
            Miss::OtherEnvironment(_) => 1,
            Miss::Corrupt { .. } => 2,
        }
    }
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::Absent => write!(f, "not cached"),
            Miss::OtherEnvironment(diffs) => write!(f, "cached only for another environment ({})", diffs.join(", ")),
            Miss::Corrupt { path, error, removed } => {
                write!(f, "cache entry {} is corrupt ({error})", path.display())?;
                if *removed {
                    write!(f, " and was removed")?;
                }
                Ok(())
            }
        }
    }
}

/// What `verify` found.
pub struct Verified {
    pub good: usize,
    /// Entries that failed a check (each says whether it was removed).
    pub bad: Vec<Miss>,
    /// Temporaries of writers that no longer run, removed.
    pub stale_removed: Vec<PathBuf>,
}

/// One entry as `g4c cache ls` shows it.
pub struct Listed {
    pub path: PathBuf,
    pub bytes: u64,
    pub meta: std::result::Result<EntryMeta, EntryError>,
}

impl ExecutableCache {
    pub fn at(dir: impl Into<PathBuf>, writable: bool) -> ExecutableCache {
        ExecutableCache { dir: dir.into(), writable }
    }

    /// The user's cache: `$G4C_CACHE_DIR`, else `$XDG_CACHE_HOME/g4c`, else `~/.cache/g4c`.
    pub fn user() -> Result<ExecutableCache> {
        use g4c_util::env::path_var;
        let root = match (path_var("G4C_CACHE_DIR"), path_var("XDG_CACHE_HOME"), path_var("HOME")) {
            (Some(dir), _, _) => dir,
            (None, Some(xdg), _) => xdg.join("g4c"),
            (None, None, Some(home)) => home.join(".cache/g4c"),
            (None, None, None) => {
                return Err(RuntimeError::Invalid("no cache directory: set G4C_CACHE_DIR or HOME".into()))
            }
        };
        Ok(ExecutableCache::at(root.join("executables"), true))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether an entry file for `program` is here: found, not read (nor checked).
    pub fn holds(&self, program: &ProgramKey, env: &Environment) -> bool {
        self.dir.join(file_name(program, &env.digest())).metadata().is_ok_and(|m| m.is_file())
    }

    pub fn lookup(&self, program: &ProgramKey, env: &Environment) -> Lookup {
        let path = self.dir.join(file_name(program, &env.digest()));
        // Only a regular file is read: a FIFO in its place would block for ever.
        let bytes = match g4c_util::files::read(&path) {
            Ok(bytes) => bytes,
            // Not a regular file; another error (a permission, a passing I/O fault) is a miss, the
            // entry perhaps good.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Lookup::Miss(self.corrupt(path, e.to_string()))
            }
            Err(_) => return Lookup::Miss(self.foreign_entries(program, env)),
        };
        match entry::decode(&bytes) {
            Ok((meta, body)) if meta.str("program") == program.0 && meta.str("environment") == env.digest() => {
                Lookup::Hit { path, body: body.to_vec() }
            }
            Ok(_) => Lookup::Miss(self.corrupt(path, "its key does not match its file name".into())),
            Err(e) => Lookup::Miss(self.corrupt(path, e.to_string())),
        }
    }

    /// Reports an entry that failed its checks, removing it where this cache may be written.
    pub fn corrupt(&self, path: PathBuf, error: String) -> Miss {
        let removed = self.writable && std::fs::remove_file(&path).is_ok();
        Miss::Corrupt { path, error, removed }
    }

    /// Holds the turn to compile `program` into this cache until dropped: another
    /// process compiling the same program waits, then finds the entry. `None` where this cache is
    /// not written or the lock cannot be had (then both compile, as without a lock).
    pub fn compile_turn(&self, program: &ProgramKey, env: &Environment) -> Option<g4c_util::lock::FileLock> {
        if !self.writable || std::fs::create_dir_all(&self.dir).is_err() {
            return None;
        }
        let name = file_name(program, &env.digest());
        g4c_util::lock::FileLock::exclusive(&self.dir.join(format!("{name}.lock"))).ok()
    }

    /// Whether entries can be stored here: the directory is made if missing, and a file created in
    /// it and removed.
    pub fn check_writable(&self) -> Result<()> {
        let cannot = |e: std::io::Error| {
            RuntimeError::Invalid(format!("the executable cache {} cannot be written: {e}", self.dir.display()))
        };
        if !self.writable {
            return Err(cannot(std::io::Error::other("it is read-only here")));
        }
        std::fs::create_dir_all(&self.dir).map_err(cannot)?;
        // A temporary, never committed: dropping it removes it.
        g4c_util::atomic::AtomicFile::create(&self.dir.join("writable")).map_err(cannot)?;
        Ok(())
    }

    /// Stores a serialized executable; `meta` describes it for listings (model, entry, target, …).
    pub fn store(
        &self,
        program: &ProgramKey,
        env: &Environment,
        mut meta: serde_json::Map<String, serde_json::Value>,
        body: &[u8],
    ) -> Result<PathBuf> {
        let io = |what: &str, p: &Path, e: std::io::Error| {
            RuntimeError::Invalid(format!("executable cache: {what} {}: {e}", p.display()))
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
        meta.insert("program".into(), program.0.clone().into());
        meta.insert("environment".into(), env.digest().into());
        for (field, value) in env.to_json().as_object().unwrap() {
            meta.insert(field.clone(), value.clone());
        }
        let path = self.dir.join(file_name(program, &env.digest()));
        write_atomic(&path, &entry::encode(&EntryMeta(meta), body)).map_err(|e| io("writing", &path, e))?;
        Ok(path)
    }

    /// Every entry (and stray file) in the cache, with metadata read from its header only.
    pub fn list(&self) -> Result<Vec<Listed>> {
        let mut out = vec![];
        for path in self.files()? {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let meta = read_prefix(&path, entry::peek_len(64 << 10))
                .map_err(|e| EntryError::Metadata(format!("cannot read the file: {e}")))
                .and_then(|prefix| entry::peek_meta(&prefix));
            out.push(Listed { path, bytes, meta });
        }
        Ok(out)
    }

    /// Reads every entry in full and checks it; removes (when writable) and returns those that fail.
    /// Temporaries left by killed writers are removed too.
    pub fn verify(&self) -> Result<Verified> {
        let stale_removed = match self.writable {
            true => g4c_util::atomic::remove_stale_temporaries(&self.dir),
            false => vec![],
        };
        let mut good = 0;
        let mut bad = vec![];
        for path in self.files()? {
            let checked = g4c_util::files::read(&path).map_err(|e| e.to_string()).and_then(|bytes| {
                let (meta, _) = entry::decode(&bytes).map_err(|e| e.to_string())?;
                let expected = format!(
                    "{}-{}.{EXTENSION}",
                    meta.str("program").get(..32).unwrap_or(""),
                    meta.str("environment").get(..16).unwrap_or("")
                );
                let found = path.file_name().unwrap_or_default().to_string_lossy();
                if found == expected {
                    Ok(())
                } else {
                    Err(format!("its key names the file {expected}, not {found}"))
                }
            });
            match checked {
                Ok(()) => good += 1,
                Err(error) => bad.push(self.corrupt(path, error)),
            }
        }
        Ok(Verified { good, bad, stale_removed })
    }

    /// Removes every entry and leftover temporary; returns how many files and bytes. Fails, naming
    /// the first, if any could not be removed.
    pub fn clear(&self) -> Result<(usize, u64)> {
        let mut removed = (0, 0);
        let mut failed = vec![];
        let leftovers = self.temporaries().into_iter().map(|(path, _)| path).chain(self.lock_files());
        for path in self.files()?.into_iter().chain(leftovers) {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    removed.0 += 1;
                    removed.1 += bytes;
                }
                Err(e) => failed.push(format!("{}: {e}", path.display())),
            }
        }
        if let Some(first) = failed.first() {
            return Err(RuntimeError::Invalid(format!(
                "could not remove {} of {} from {} (first: {first})",
                failed.len(),
                match failed.len() + removed.0 {
                    1 => "1 file".to_string(),
                    n => format!("{n} files"),
                },
                self.dir.display()
            )));
        }
        Ok(removed)
    }

    /// Entries of `program` for other environments, and what differs in the first of them.
    fn foreign_entries(&self, program: &ProgramKey, env: &Environment) -> Miss {
        let prefix = format!("{}-", &program.0[..32]);
        let found = self.files().unwrap_or_default().into_iter().find_map(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            if !name.starts_with(&prefix) {
                return None;
            }
            let prefix = read_prefix(&p, entry::peek_len(64 << 10)).ok()?;
            entry::peek_meta(&prefix).ok()
        });
        match found {
            Some(meta) => Miss::OtherEnvironment(env.differences(&meta.0)),
            None => Miss::Absent,
        }
    }

    fn files(&self) -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(dir) => dir
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == EXTENSION) && !is_temporary(p))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(RuntimeError::Invalid(format!("reading {}: {e}", self.dir.display()))),
        };
        files.sort();
        Ok(files)
    }

    /// Files being written, each with whether its writer is gone (killed before it could remove it).
    pub fn temporaries(&self) -> Vec<(PathBuf, bool)> {
        let stale = g4c_util::atomic::stale_temporaries(&self.dir);
        let mut found: Vec<(PathBuf, bool)> = self
            .paths()
            .filter(|p| is_temporary(p))
            .map(|p| {
                let gone = stale.contains(&p);
                (p, gone)
            })
            .collect();
        found.sort();
        found
    }

    /// Lock files left by a process killed while it compiled (`compile_turn`).
    fn lock_files(&self) -> Vec<PathBuf> {
        self.paths().filter(|p| p.extension().is_some_and(|e| e == "lock")).collect()
    }

    fn paths(&self) -> impl Iterator<Item = PathBuf> {
        std::fs::read_dir(&self.dir).into_iter().flatten().flatten().map(|e| e.path())
    }
}

fn is_temporary(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(g4c_util::atomic::TEMP_PREFIX))
}

fn read_prefix(path: &Path, len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(len);
    g4c_util::files::open(path)?.take(len as u64).read_to_end(&mut buf)?;
    Ok(buf)
}
