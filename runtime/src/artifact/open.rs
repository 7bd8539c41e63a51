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

/// The manifest's shapes are what `run` checks flags against and sizes its calls by, and the
/// module's are what runs: they must be the same, or the manifest is damaged.
fn check_shapes(dir: &Path, manifest: &Manifest, module: &Module) -> Result<()> {
    let shape = crate::generate::ModelShape::of(module).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
    let prefill_lens: Vec<usize> = shape.prefills.iter().map(|(t, _)| *t).collect();
    let recorded = &manifest.shapes;
    if (recorded.batch, &recorded.prefill_lens, recorded.context) != (shape.batch, &prefill_lens, shape.context) {
        return Err(bad(
            dir,
            format!(
                "{} records batch {}, prefill lengths {:?} and context {}, but {} has batch {}, {:?} and {} \
                 (a damaged manifest)",
                files::MANIFEST,
                recorded.batch,
                recorded.prefill_lens,
                recorded.context,
                files::MODULE,
                shape.batch,
                prefill_lens,
                shape.context
            ),
        ));
    }
    Ok(())
}

/// `config.json`, which a run reads the model's settings from, must be the config the manifest
/// recorded when compiling.
fn check_config(dir: &Path, manifest: &Manifest) -> Result<()> {
    let text = g4c_util::files::read_to_string(&dir.join(files::CONFIG))
        .map_err(|e| bad(dir, format!("{}: {e}", files::CONFIG)))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(dir, format!("{}: {e}", files::CONFIG)))?;
    if config != manifest.model.config {
        return Err(bad(
            dir,
            format!(
                "{} differs from the config {} recorded when compiling (one of them damaged or replaced)",
                files::CONFIG,
                files::MANIFEST
            ),
        ));
    }
    Ok(())
}

/// The manifest must be as g4c wrote it: any other edit of it (those the checks above do not
/// catch by what they compare) changes its digest.
fn check_digest(dir: &Path, manifest: &Manifest) -> Result<()> {
    if manifest.digest != manifest.content_digest() {
        return Err(bad(
            dir,
            format!("{} does not match its digest (edited or damaged); compile it again", files::MANIFEST),
        ));
    }
    Ok(())
}

impl Artifact {
    pub fn open(dir: &Path) -> Result<Artifact> {
        let manifest = Artifact::read_manifest(dir)?;
        let module_path = dir.join(files::MODULE);
        let text =
            g4c_util::files::read_to_string(&module_path).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        let module = g4c_ir::parse_module(&text).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        g4c_ir::verify_module(&module).map_err(|e| bad(dir, format!("{}: {e}", files::MODULE)))?;
        check_shapes(dir, &manifest, &module)?;
        check_config(dir, &manifest)?;
        check_digest(dir, &manifest)?;
        let weights_path = dir.join(&manifest.model.weights.file);
        let found = match std::fs::metadata(&weights_path) {
            Ok(m) if m.is_file() => m.len(),
            Ok(_) => return Err(bad(dir, format!("{} is not a regular file", manifest.model.weights.file))),
            Err(e) => return Err(bad(dir, format!("{}: {e}", manifest.model.weights.file))),
        };
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
        if !path.exists() && dir.join(files::CONFIG).is_file() {
            return Err(bad(dir, "is a checkpoint, not an artifact (no manifest.json); `g4c compile -o` makes one"));
        }
        let text = g4c_util::files::read_to_string(&path).map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?;
        let version = serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?["format_version"]
            .clone();
        if !version.is_null() && !version.is_u64() {
            return Err(bad(dir, format!("{}: format_version is {version}, expected a number", files::MANIFEST)));
        }
        if version.as_u64() != Some(FORMAT_VERSION as u64) {
            let found = if version.is_null() { "missing".into() } else { version.to_string() };
            return Err(bad(
                dir,
                format!("format version {found}, this g4c reads {FORMAT_VERSION}; compile it again with this g4c"),
            ));
        }
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| bad(dir, format!("{}: {e}", files::MANIFEST)))?;
        if let Some(outside) = manifest.file_outside() {
            return Err(bad(dir, format!("{} names {outside}, outside the artifact", files::MANIFEST)));
        }
        if manifest.target["platform"] == "cuda" && manifest.cuda.is_none() {
            return Err(bad(
                dir,
                format!(
                    "{} says target {} (CUDA) but lists no CUDA kernels (`cuda` is missing)",
                    files::MANIFEST,
                    manifest.target_name()
                ),
            ));
        }
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
