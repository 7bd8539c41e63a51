//! The g4c frontend: reads a Gemma 4 checkpoint (config + safetensors) and emits IR.

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod emit;
pub mod error;
pub mod generation_config;
pub mod quantization;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use checkpoint::{Checkpoint, TensorBytes};
pub use config::{AttentionKind, Gemma4Config, LayerSpec, Rope};
pub use emit::{emit_module, emit_module_with_prefills, emit_scoring_module, Entry, Shapes};
pub use error::{FrontendError, Result};
pub use generation_config::SamplingDefaults;
pub use quantization::WeightQuantization;
pub use tokenizer::{TextStream, TextTokenizer, TokenBytes};
pub use weights::{bind_weights, declared_weights, expected_tensors, ExpectedTensor};

use std::path::Path;
use std::sync::Arc;

/// A checkpoint directory opened and checked against its config.
pub struct Model {
    pub config: Gemma4Config,
    /// Shared with whatever runs the model (executors read weights from it).
    pub checkpoint: Arc<Checkpoint>,
    pub weights: Vec<g4c_ir::WeightDecl>,
}

impl Model {
    pub fn open(dir: &Path) -> Result<Model> {
        let config = Gemma4Config::from_dir(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        let weights = bind_weights(&config, &checkpoint)?;
        Ok(Model { config, checkpoint: Arc::new(checkpoint), weights })
    }

    pub fn module(&self, shapes: &Shapes) -> Result<g4c_ir::Module> {
        emit_module(&self.config, self.weights.clone(), shapes)
    }
}
