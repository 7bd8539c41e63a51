//! Opens an artifact for running: manifest checked, IR parsed and verified, weights mapped.

use super::files;
use super::manifest::{Manifest, FORMAT_VERSION};
use crate::backend::Program;
use crate::error::{Result, RuntimeError};
use g4c_frontend::Checkpoint;
use g4c_ir::Module;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Artifact {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub module: Module,
    /// `weights.safetensors`, mapped; its tensors are already in the dtype and layout the IR declares.
    pub weights: Arc<Checkpoint>,
}

fn bad(dir: &Path, message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Invalid(format!("artifact {}: {message}", dir.display()))
}

impl Artifact {
    pub fn open(dir: &Path) -> Result<Artifact> {
        let manifest = Artifact::read_manifest(dir)?;
        let module_path = dir.join(files::MODULE);
        let text =
            g4c_util::files::read_to_string(&module_path).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        let module = g4c_ir::parse_module(&text).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        g4c_ir::verify_module(&module).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        let weights_path = dir.join(&manifest.model.weights.file);
        let found = std::fs::metadata(&weights_path).map(|m| m.len()).unwrap_or(0);
        if found != manifest.model.weights.bytes {
            return Err(bad(
                dir,
                format!(
                    "{} has {found} bytes, the manifest says {} (truncated or replaced)",
                    manifest.model.weights.file, manifest.model.weights.bytes
                ),
            ));
        }
        let weights = Arc::new(Checkpoint::open_file(&weights_path).map_err(|e| bad(dir, e))?);
        Ok(Artifact { dir: dir.to_path_buf(), manifest, module, weights })
    }

    pub fn read_manifest(dir: &Path) -> Result<Manifest> {
        let path = dir.join(files::MANIFEST);
        let text = g4c_util::files::read_to_string(&path).map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?;
        let version = serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?["format_version"]
            .as_u64();
        if version != Some(FORMAT_VERSION as u64) {
            return Err(bad(
                dir,
                format!(
                    "format version {}, this g4c reads {FORMAT_VERSION}; compile it again with this g4c",
                    version.map_or("missing".into(), |v| v.to_string())
                ),
            ));
        }
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?;
        // The only backend whose programs an artifact holds today; another is a future g4c's.
        let known = crate::backend::pjrt::PROGRAM_FORMAT.backend;
        if manifest.backend != known {
            return Err(bad(dir, format!("holds programs for backend `{}`, this g4c runs {known}", manifest.backend)));
        }
        Ok(manifest)
    }

    /// Where the artifact's serialized executables are.
    pub fn executables_dir(&self) -> PathBuf {
        self.dir.join(files::EXECUTABLES)
    }

    /// Checks that the IR, lowered by this g4c, gives the programs the artifact recorded: a mismatch
    /// means a damaged artifact or a g4c whose lowering changed.
    pub fn check_programs(&self, programs: &[Program]) -> Result<()> {
        for p in programs {
            let entry = self.manifest.entries.iter().find(|e| e.name == p.entry);
            let Some(entry) = entry else { return Err(bad(&self.dir, format!("the manifest lists no @{}", p.entry))) };
            let recorded = g4c_util::files::read_to_string(&self.dir.join(&entry.program))
                .map_err(|e| bad(&self.dir, format!("{}: {e}", entry.program)))?;
            if recorded != p.text {
                return Err(bad(
                    &self.dir,
                    format!(
                        "{} differs from the lowering of {} (damaged, or from another g4c version)",
                        entry.program,
                        files::MODULE
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that every executable the manifest lists is there and passes its header and checksum
    /// checks (an artifact is never modified: nothing is removed).
    pub fn verify_executables(&self) -> Result<()> {
        for entry in &self.manifest.entries {
            if let Some(rel) = &entry.executable {
                if !self.dir.join(rel).is_file() {
                    return Err(bad(&self.dir, format!("{rel}, the executable of @{}, is missing", entry.name)));
                }
            }
        }
        let verified = crate::cache::ExecutableCache::at(self.executables_dir(), false).verify()?;
        match verified.bad.first() {
            Some(first) => Err(bad(&self.dir, first)),
            None => Ok(()),
        }
    }

    /// Hashes the weights file and compares it with the manifest's content hash.
    pub fn verify_weights(&self) -> Result<()> {
        let path = self.dir.join(&self.manifest.model.weights.file);
        let hash = crate::cache::file_hash(&path)?;
        if hash != self.manifest.model.weights.blake3 {
            return Err(bad(
                &self.dir,
                format!("{} does not match its content hash in the manifest", self.manifest.model.weights.file),
            ));
        }
        Ok(())
    }
}
