//! Compiled artifacts: a directory that runs without the checkpoint it came from.
//!
//! ```text
//! manifest.json          what it is (Manifest)
//! module.g4c             the IR after the target's passes, weights bound to weights.safetensors
//! stablehlo/<entry>.mlir each entry point's program, in a folder the backend names (PJRT: StableHLO)
//! weights.safetensors    every weight in the dtype and layout the target uses
//! executables/*.g4cx     serialized executables (cache-entry format), when a plugin was present
//! cuda/<entry>.{cu,ptx}  CUDA targets: each entry point's kernels, and `<entry>.sm_XY.cubin`;
//!                        their content hashes in the manifest
//! config.json            the checkpoint's config; and those of tokenizer.json, generation_config.json,
//!                        chat_template.jinja and tokenizer_config.json it had
//! ```

mod cuda;
mod manifest;
mod open;
mod write;

pub use cuda::{CudaEntry, CudaInfo, CudaKernels};
pub use manifest::{EntryInfo, Manifest, ModelInfo, ShapeInfo, WeightsInfo, FORMAT_VERSION};
pub use open::Artifact;
pub use write::{check_output_dir, ArtifactDraft, ArtifactSource};

/// Where a backend's programs go in an artifact, and what they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramFormat {
    /// The backend that compiles them (the manifest's `backend`).
    pub backend: &'static str,
    /// The folder holding one program per entry point.
    pub dir: &'static str,
    pub extension: &'static str,
}

impl ProgramFormat {
    /// The program file of `entry`, relative to the artifact.
    pub fn file(&self, entry: &str) -> String {
        format!("{}/{entry}.{}", self.dir, self.extension)
    }
}

use std::path::Path;

/// File names inside an artifact.
pub mod files {
    pub const MANIFEST: &str = "manifest.json";
    pub const MODULE: &str = "module.g4c";
    pub const WEIGHTS: &str = "weights.safetensors";
    pub const EXECUTABLES: &str = "executables";
    pub const CONFIG: &str = "config.json";
    pub const TOKENIZER: &str = "tokenizer.json";
    /// Extra EOS ids (the turn terminator of an instruction-tuned model).
    pub const GENERATION_CONFIG: &str = "generation_config.json";
    /// The chat template, on its own or inside the tokenizer config.
    pub const CHAT_TEMPLATE: &str = "chat_template.jinja";
    pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
    /// The checkpoint's files an artifact carries as they are, when the checkpoint has them.
    pub const COPIED: [&str; 5] = [CONFIG, TOKENIZER, GENERATION_CONFIG, CHAT_TEMPLATE, TOKENIZER_CONFIG];
}

/// Whether `dir` is an artifact (rather than a checkpoint directory).
pub fn is_artifact(dir: &Path) -> bool {
    dir.join(files::MANIFEST).is_file()
}
