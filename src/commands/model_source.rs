//! What `run` and `bench` execute: a checkpoint directory (emitted and put through the target's
//! pipeline for the shapes asked for) or a compiled artifact (shapes, target and passes fixed when it
//! was compiled).

use anyhow::{bail, Result};
use g4c_frontend::{Checkpoint, Gemma4Config, Model, Shapes, TextTokenizer};
use g4c_ir::Module;
use g4c_ir::Target;
use g4c_passes::Pipeline;
use g4c_runtime::artifact::{is_artifact, Artifact, ShapeInfo};
use std::path::Path;

pub struct Opened {
    pub config: Gemma4Config,
    pub tokenizer: Option<TextTokenizer>,
    pub target: &'static Target,
    /// Names the model in cache listings.
    pub label: String,
    kind: Kind,
}

enum Kind {
    Checkpoint(Box<Model>),
    Artifact(Box<Artifact>),
}

impl Opened {
    /// Opens `path`; `target` is the `--target` flag (default `cpu` for checkpoints; an artifact
    /// refuses any target but its own).
    pub fn open(path: &Path, target: Option<&str>) -> Result<Opened> {
        let label = path.display().to_string();
        let config = Gemma4Config::from_dir(path)?;
        let tokenizer = TextTokenizer::open(path, config.bos_token_id)?;
        if !is_artifact(path) {
            let target = Target::by_name(target.unwrap_or("cpu")).map_err(anyhow::Error::msg)?;
            let model = Model::open(path)?;
            return Ok(Opened { config, tokenizer, target, label, kind: Kind::Checkpoint(Box::new(model)) });
        }
        let artifact = Artifact::open(path)?;
        let compiled_for = artifact.manifest.target_name().to_string();
        if let Some(asked) = target.filter(|t| *t != compiled_for) {
            bail!(
                "artifact {label} was compiled for target {compiled_for}, not {asked}; compile the checkpoint again with --target {asked}"
            );
        }
        let target = Target::by_name(&compiled_for).map_err(anyhow::Error::msg)?;
        Ok(Opened { config, tokenizer, target, label, kind: Kind::Artifact(Box::new(artifact)) })
    }

    /// An artifact's shapes (a checkpoint has none until asked).
    pub fn fixed_shapes(&self) -> Option<ShapeInfo> {
        self.artifact().map(|a| a.manifest.shapes.clone())
    }

    /// The context to run with: an artifact's own (refusing another), else `asked` or `default`,
    /// capped at the model's `max_position_embeddings`.
    pub fn context(&self, asked: Option<usize>, default: usize) -> Result<usize> {
        match (self.fixed_shapes(), asked) {
            (Some(s), Some(c)) if c != s.context => {
                bail!("--context {c}: artifact {} was compiled for a context of {}", self.label, s.context)
            }
            (Some(s), _) => Ok(s.context),
            (None, c) => Ok(c.unwrap_or(default).min(self.config.max_position_embeddings)),
        }
    }

    pub fn artifact(&self) -> Option<&Artifact> {
        match &self.kind {
            Kind::Artifact(a) => Some(a),
            Kind::Checkpoint(_) => None,
        }
    }

    /// The module after the target's passes, for `shapes` (an artifact only has its own).
    pub fn module(&self, shapes: &Shapes) -> Result<Module> {
        match &self.kind {
            Kind::Checkpoint(model) => {
                let mut module = model.module(shapes)?;
                g4c_ir::verify_module(&module)?;
                Pipeline::for_target(self.target).run_all(&mut module, self.target)?;
                Ok(module)
            }
            Kind::Artifact(a) => {
                let s = &a.manifest.shapes;
                if (s.batch, s.longest_prefill(), s.context) != (shapes.batch, shapes.prefill_len, shapes.context) {
                    bail!(
                        "artifact {} has batch {}, longest prefill {} and context {}; asked for {}, {} and {}",
                        self.label,
                        s.batch,
                        s.longest_prefill(),
                        s.context,
                        shapes.batch,
                        shapes.prefill_len,
                        shapes.context
                    );
                }
                Ok(a.module.clone())
            }
        }
    }

    /// The weights: the checkpoint (converted at load as the IR declares) or the artifact's own.
    pub fn weights(&self) -> &Checkpoint {
        match &self.kind {
            Kind::Checkpoint(model) => &model.checkpoint,
            Kind::Artifact(a) => &a.weights,
        }
    }
}
