//! Compiled artifacts: a directory that runs without the checkpoint it came from.
//!
//! ```text
//! manifest.json          what it is (Manifest)
//! module.g4c             the IR after the target's passes, weights bound to weights.safetensors
//! stablehlo/<entry>.mlir each entry point lowered
//! weights.safetensors    every weight in the dtype and layout the target uses
//! executables/*.g4cx     serialized executables (cache-entry format), when a plugin was present
//! config.json            the checkpoint's config; tokenizer.json when it had one
//! ```

mod manifest;
mod open;
mod write;

pub use manifest::{EntryInfo, Manifest, ModelInfo, ShapeInfo, WeightsInfo, FORMAT_VERSION};
pub use open::Artifact;
pub use write::{check_output_dir, write_artifact, ArtifactSource};

use std::path::Path;

/// File names inside an artifact.
pub mod files {
    pub const MANIFEST: &str = "manifest.json";
    pub const MODULE: &str = "module.g4c";
    pub const STABLEHLO: &str = "stablehlo";
    pub const WEIGHTS: &str = "weights.safetensors";
    pub const EXECUTABLES: &str = "executables";
    pub const CONFIG: &str = "config.json";
    pub const TOKENIZER: &str = "tokenizer.json";
}

/// Whether `dir` is an artifact (rather than a checkpoint directory).
pub fn is_artifact(dir: &Path) -> bool {
    dir.join(files::MANIFEST).is_file()
}
