//! `manifest.json`: everything needed to know what an artifact is without loading it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bumped whenever the layout of an artifact directory changes incompatibly.
pub const FORMAT_VERSION: u32 = 3;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub g4c_version: String,
    pub created_unix: u64,
    /// The target's name and properties (`g4c targets --json`).
    pub target: Value,
    /// The backend whose programs and executables the artifact holds (`pjrt`).
    pub backend: String,
    pub model: ModelInfo,
    pub shapes: ShapeInfo,
    /// The pass pipeline the module went through, in order.
    pub passes: Vec<String>,
    /// What the pipeline was asked for beyond the target (`w4a16:g32`, or empty).
    #[serde(default)]
    pub options: String,
    pub entries: Vec<EntryInfo>,
    /// The environment the serialized executables were compiled for (absent: none were).
    pub executables_environment: Option<Value>,
    /// The compile report (`g4c compile --json`).
    pub report: Value,
    /// CUDA targets: the kernels' files, NVRTC version and PTX ISA.
    #[serde(default)]
    pub cuda: Option<super::CudaInfo>,
    /// blake3 of the manifest as g4c wrote it, with this field empty (`content_digest`): an edit of
    /// the manifest itself (a target's name, an entry's types) shows as the files' hashes show theirs.
    pub digest: String,
}

impl Manifest {
    /// What `digest` must be: the hash of the manifest serialized with `digest` empty.
    pub fn content_digest(&self) -> String {
        let unsealed = Manifest { digest: String::new(), ..self.clone() };
        let bytes = serde_json::to_vec(&unsealed).expect("manifests serialize");
        blake3::hash(&bytes).to_hex().to_string()
    }

    pub fn target_name(&self) -> &str {
        self.target["name"].as_str().unwrap_or("?")
    }

    /// Every file the manifest names, relative to the artifact.
    pub fn files(&self) -> Vec<&str> {
        let entries = self.entries.iter().flat_map(|e| std::iter::once(&e.program).chain(&e.executable));
        let cuda = self
            .cuda
            .iter()
            .flat_map(|c| &c.entries)
            .flat_map(|e| [&e.source, &e.ptx].into_iter().chain(e.cubin.as_ref().map(|(_, file)| file)));
        std::iter::once(&self.model.weights.file).chain(entries).chain(cuda).map(String::as_str).collect()
    }

    /// A named file outside the artifact (an absolute path, or one through `..`), if there is one:
    /// an artifact reads only what it holds.
    pub fn file_outside(&self) -> Option<&str> {
        use std::path::Component;
        self.files()
            .into_iter()
            .find(|f| !std::path::Path::new(f).components().all(|c| matches!(c, Component::Normal(_))))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Where the checkpoint was read from when compiling.
    pub source: String,
    /// The checkpoint's `config.json`.
    pub config: Value,
    pub weights: WeightsInfo,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WeightsInfo {
    pub file: String,
    pub bytes: u64,
    pub tensors: usize,
    /// BLAKE3 of the weights file as written: the content hash of the weights.
    pub blake3: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeInfo {
    pub batch: usize,
    /// The lengths of the prefill entry points, increasing; the last sizes the sliding rings.
    pub prefill_lens: Vec<usize>,
    pub context: usize,
}

impl ShapeInfo {
    pub fn longest_prefill(&self) -> usize {
        self.prefill_lens.last().copied().unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EntryInfo {
    pub name: String,
    /// The program the backend compiles (PJRT: StableHLO), relative to the artifact.
    pub program: String,
    /// `name: type` of every argument in call order (parameters, then weights).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Arguments whose buffers the call takes over and returns updated (`input -> output`).
    pub donated: Vec<String>,
    /// The serialized executable, relative to the artifact, if one was compiled.
    pub executable: Option<String>,
}
