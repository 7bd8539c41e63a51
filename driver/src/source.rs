//! What `run`, `bench` and a server execute: a checkpoint directory (emitted and put through the
//! target's pipeline for the shapes asked for) or a compiled artifact (shapes, target and passes fixed
//! when it was compiled).

use crate::compile::{emit, run_passes};
use anyhow::{bail, Result};
use g4c_frontend::{emit_scoring_module, Gemma4Config, Model, Shapes, TextTokenizer};
use g4c_ir::{Module, Target};
use g4c_passes::PipelineOptions;
use g4c_runtime::artifact::{is_artifact, Artifact, ShapeInfo};
use g4c_runtime::WeightStore;
use std::path::Path;
use std::sync::Arc;

/// The checkpoint in `dir`, which an artifact (or an artifact that lost its manifest) is not.
pub fn open_checkpoint(dir: &Path) -> Result<Model> {
    use g4c_runtime::artifact::files::{MANIFEST, MODULE, WEIGHTS};
    if is_artifact(dir) {
        let source = Artifact::read_manifest(dir).map_or_else(|_| "its checkpoint".to_string(), |m| m.model.source);
        bail!("{} is an artifact, compiled already; this command reads a checkpoint ({source})", dir.display());
    }
    if dir.join(MODULE).exists() && dir.join(WEIGHTS).exists() {
        bail!(
            "{} holds an artifact's {MODULE} and {WEIGHTS} but no {MANIFEST}: a damaged artifact; compile it again",
            dir.display()
        );
    }
    Ok(Model::open(dir)?)
}

pub struct ModelSource {
    pub config: Gemma4Config,
    pub tokenizer: Option<TextTokenizer>,
    pub target: &'static Target,
    /// What its pipeline is asked for beyond the target (an artifact: what it was compiled with).
    pub options: PipelineOptions,
    /// Names the model in messages and cache listings.
    pub label: String,
    kind: Kind,
}

enum Kind {
    Checkpoint(Box<Model>),
    Artifact(Box<Artifact>),
}

impl ModelSource {
    /// Opens `path`; `target` is the `--target` flag (default `cpu` for checkpoints; an artifact
    /// refuses any target but its own) and `options` what else the pipeline is asked for (an artifact
    /// refuses any but its own, unless none is asked for).
    pub fn open(path: &Path, target: Option<&str>, options: PipelineOptions) -> Result<ModelSource> {
        let label = path.display().to_string();
        let config = Gemma4Config::from_dir(path)?;
        let tokenizer = TextTokenizer::open(path, config.bos_token_id, config.eos_token_ids.first().copied())?;
        if !is_artifact(path) {
            let target = Target::by_name(target.unwrap_or("cpu")).map_err(anyhow::Error::msg)?;
            let model = open_checkpoint(path)?;
            return Ok(ModelSource {
                config,
                tokenizer,
                target,
                options,
                label,
                kind: Kind::Checkpoint(Box::new(model)),
            });
        }
        let artifact = Artifact::open(path)?;
        let compiled_for = artifact.manifest.target_name().to_string();
        if let Some(asked) = target.filter(|t| *t != compiled_for) {
            bail!(
                "artifact {label} was compiled for target {compiled_for}, not {asked}; compile the checkpoint again with --target {asked}"
            );
        }
        let target = Target::by_name(&compiled_for)
            .map_err(|e| anyhow::anyhow!("artifact {label}: its manifest's target: {e}"))?;
        // The manifest records the options as `describe` names them: empty, or a `--quantize` value.
        let recorded = &artifact.manifest.options;
        let own = PipelineOptions::from_quantize(Some(recorded.as_str()).filter(|o| !o.is_empty()))
            .map_err(|e| anyhow::anyhow!("artifact {label}: manifest options: {e}"))?;
        if options != PipelineOptions::default() && options != own {
            let theirs = if recorded.is_empty() { "no options" } else { recorded };
            bail!(
                "artifact {label} was compiled with {theirs}, not {}; compile the checkpoint again with those",
                options.describe()
            );
        }
        let options = own;
        Ok(ModelSource { config, tokenizer, target, options, label, kind: Kind::Artifact(Box::new(artifact)) })
    }

    /// An artifact's shapes (a checkpoint has none until asked).
    pub fn fixed_shapes(&self) -> Option<ShapeInfo> {
        self.artifact().map(|a| a.manifest.shapes.clone())
    }

    /// The context to run with: an artifact's own (refusing another), else `asked` (refused beyond the
    /// model's `max_position_embeddings`) or `default` (capped there).
    pub fn context(&self, asked: Option<usize>, default: usize) -> Result<usize> {
        match (self.fixed_shapes(), asked) {
            (Some(s), Some(c)) if c != s.context => {
                bail!("--context {c}: artifact {} was compiled for a context of {}", self.label, s.context)
            }
            (Some(s), _) => Ok(s.context),
            (None, Some(c)) if c > self.config.max_position_embeddings => bail!(
                "--context {c}: expected at most the model's max_position_embeddings ({})",
                self.config.max_position_embeddings
            ),
            (None, c) => Ok(c.unwrap_or(default).min(self.config.max_position_embeddings)),
        }
    }

    pub fn artifact(&self) -> Option<&Artifact> {
        match &self.kind {
            Kind::Artifact(a) => Some(a),
            Kind::Checkpoint(_) => None,
        }
    }

    /// A checkpoint's module for `shapes` as the frontend emits it, before any pass (an artifact has
    /// only its compiled one).
    pub fn emit(&self, shapes: &Shapes) -> Result<Module> {
        match &self.kind {
            Kind::Checkpoint(model) => emit(model, shapes, &[]),
            Kind::Artifact(_) => bail!("artifact {} holds its compiled module only", self.label),
        }
    }

    /// A checkpoint's scoring module (`score`, `chunk` tokens a call, for a sequence of `context`
    /// tokens) after the target's passes; artifacts are compiled for generation, not scoring.
    pub fn scoring_module(&self, chunk: usize, context: usize) -> Result<Arc<Module>> {
        let Kind::Checkpoint(model) = &self.kind else {
            bail!("artifact {} holds generation entry points only; evaluate its checkpoint", self.label)
        };
        let shapes = Shapes { batch: 1, prefill_len: chunk, context };
        let module = emit_scoring_module(&model.config, model.weights.clone(), &shapes)?;
        g4c_ir::verify_module(&module)?;
        self.prepared(module)
    }

    /// The module after the target's passes, for `shapes` (an artifact only has its own).
    pub fn module(&self, shapes: &Shapes) -> Result<Arc<Module>> {
        match &self.kind {
            Kind::Checkpoint(_) => self.prepared(self.emit(shapes)?),
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
                Ok(Arc::new(a.module.clone()))
            }
        }
    }

    /// A verified module after the target's passes.
    fn prepared(&self, mut module: Module) -> Result<Arc<Module>> {
        run_passes(&mut module, self.target, &self.options, None, &mut |_, _| {})?;
        Ok(Arc::new(module))
    }

    /// The weights: the checkpoint (converted at load as the IR declares) or the artifact's own.
    pub fn weights(&self) -> Arc<dyn WeightStore> {
        match &self.kind {
            Kind::Checkpoint(model) => model.checkpoint.clone(),
            Kind::Artifact(a) => a.weights.clone(),
        }
    }
}
