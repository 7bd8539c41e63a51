pub mod bench;
pub mod cache;
pub mod chat;
pub mod compile;
pub mod eval;
pub mod inspect;
pub mod ir;
pub mod printer;
pub mod run;
pub mod serve;
pub mod sizes;
pub mod synth;
pub mod targets;

use clap::Args;

/// Static shapes of the emitted entry points.
#[derive(Args, Clone, Debug)]
pub struct ShapeArgs {
    /// Sequences per call
    #[arg(long, default_value_t = 1, value_parser = sizes::batch)]
    pub batch: usize,
    /// Tokens per sequence in one prefill call (default: 128, or the context if shorter)
    #[arg(long, value_parser = sizes::positions)]
    pub prefill_len: Option<usize>,
    /// Positions a sequence may reach (sizes the full-attention caches)
    #[arg(long, default_value_t = 4096, value_parser = sizes::positions)]
    pub context: usize,
}

/// Tokens per prefill call unless a command is told otherwise.
const DEFAULT_PREFILL: usize = 128;

impl ShapeArgs {
    pub fn shapes(&self) -> g4c_frontend::Shapes {
        let prefill_len = self.prefill_len.unwrap_or(DEFAULT_PREFILL.min(self.context));
        g4c_frontend::Shapes { batch: self.batch, prefill_len, context: self.context }
    }
}

/// Where and how a model runs: backend, target, plugin and pipeline options (`run`, `chat`, `serve`,
/// `eval`).
#[derive(Args)]
pub struct ExecutionArgs {
    /// Execution backend (default: `cuda` for an artifact compiled for a CUDA target, else `pjrt`)
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Target whose pass pipeline prepares the IR (see `g4c targets`; default `cpu`, or the artifact's
    /// own); with `--backend interp` and a narrower target the interpreter emulates its rounding
    #[arg(long)]
    pub target: Option<String>,
    /// PJRT plugin shared object (default: $G4C_PJRT_PLUGIN, else the CPU plugin scripts/setup installed)
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

impl ExecutionArgs {
    /// The session's options for running `model` (a checkpoint or an artifact).
    pub fn session_options(&self, model: &std::path::Path) -> anyhow::Result<g4c_driver::SessionOptions> {
        let backend = backend_for(self.backend, model)?;
        if self.plugin.is_some() && backend != g4c_driver::BackendKind::Pjrt {
            anyhow::bail!(
                "--plugin: a PJRT plugin, but the backend is {} (PJRT plugins run `--backend pjrt`)",
                backend.name()
            );
        }
        note_cpu_emulation(backend, self.target.as_deref(), self.plugin.is_some());
        Ok(g4c_driver::SessionOptions {
            backend,
            target: self.target.clone(),
            plugin: self.plugin.clone(),
            use_cache: true,
            pipeline: self.pipeline.options()?,
        })
    }
}

/// Says so when another platform's target is run by the PJRT CPU plugin (a checkpoint with
/// `--target t4g`, and no `--plugin` or `G4C_PJRT_PLUGIN`): its pipeline's numerics, not its
/// kernels or its speed.
pub fn note_cpu_emulation(backend: g4c_driver::BackendKind, target: Option<&str>, plugin: bool) {
    let Some(target) = target.and_then(|t| g4c_ir::Target::by_name(t).ok()) else { return };
    let plugin = plugin || g4c_util::env::path_var("G4C_PJRT_PLUGIN").is_some();
    if backend == g4c_driver::BackendKind::Pjrt && !plugin && target.platform != g4c_ir::Platform::Cpu {
        let kernels = match target.platform {
            g4c_ir::Platform::Cuda => "; `--backend cuda` runs its kernels",
            _ => "; `--plugin` takes the platform's own plugin",
        };
        crate::ui::ui().note(&format!(
            "target {}'s pipeline runs on the PJRT CPU plugin here: its numerics, not its speed{kernels}",
            target.name
        ));
    }
}

/// `backend`, or the default for `model`: an artifact of a CUDA target runs its kernels.
pub fn backend_for(backend: Option<Backend>, model: &std::path::Path) -> anyhow::Result<g4c_driver::BackendKind> {
    if let Some(b) = backend {
        return Ok(b.kind());
    }
    let cuda_artifact = g4c_runtime::artifact::is_artifact(model)
        && g4c_runtime::artifact::Artifact::read_manifest(model)?.target["platform"] == "cuda";
    Ok(if cuda_artifact { g4c_driver::BackendKind::Cuda } else { g4c_driver::BackendKind::Pjrt })
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Backend {
    /// The reference interpreter (f32, op by op, on the frontend's IR)
    Interp,
    /// StableHLO compiled and run by a PJRT plugin
    Pjrt,
    /// A CUDA target's kernel plan run on the CPU, kernel by kernel, by the interpreter (a check of
    /// fusion and buffers; give a CUDA --target)
    Plan,
    /// A CUDA target's kernels on GPU 0 through the CUDA driver
    Cuda,
    /// A CUDA target's kernels compiled by the host C++ compiler and run on the CPU (slow; a check
    /// of the kernels without a GPU)
    CudaHost,
}

impl Backend {
    pub fn kind(self) -> g4c_driver::BackendKind {
        match self {
            Backend::Interp => g4c_driver::BackendKind::Interp,
            Backend::Pjrt => g4c_driver::BackendKind::Pjrt,
            Backend::Plan => g4c_driver::BackendKind::Plan,
            Backend::Cuda => g4c_driver::BackendKind::Cuda,
            Backend::CudaHost => g4c_driver::BackendKind::CudaHost,
        }
    }
}

/// The shapes of a batching engine's module (`serve`, `chat`): an artifact's own (refusing another
/// `--max-batch` or `--prefill-len`), else `batch` rows and prefill calls of `prefill_len` tokens,
/// each defaulting as given, in a context of `context` positions.
pub fn engine_shapes(
    source: &g4c_driver::ModelSource,
    (batch, default_batch): (Option<usize>, usize),
    (prefill_len, default_prefill): (Option<usize>, usize),
    context: usize,
) -> anyhow::Result<g4c_frontend::Shapes> {
    use anyhow::bail;
    Ok(match source.fixed_shapes() {
        Some(s) => {
            if let Some(b) = batch.filter(|&b| b != s.batch) {
                bail!("--max-batch {b}: artifact {} was compiled for batch {}", source.label, s.batch);
            }
            if let Some(p) = prefill_len.filter(|&p| p != s.longest_prefill()) {
                bail!(
                    "--prefill-len {p}: artifact {} was compiled with prefill lengths {:?}",
                    source.label,
                    s.prefill_lens
                );
            }
            g4c_frontend::Shapes { batch: s.batch, prefill_len: s.longest_prefill(), context }
        }
        None => {
            if let Some(p) = prefill_len.filter(|&p| p > context) {
                bail!("--prefill-len {p}: expected at most the context ({context} positions)");
            }
            let (batch, prefill_len) =
                (batch.unwrap_or(default_batch), prefill_len.unwrap_or(default_prefill.min(context)));
            g4c_frontend::Shapes { batch, prefill_len, context }
        }
    })
}

/// How the next token is chosen (`run`, `chat`).
#[derive(Args)]
pub struct SamplingArgs {
    /// Sampling temperature (0: greedy, the default)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all)
    #[arg(long, default_value_t = 0, value_parser = sizes::top_k)]
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to P (1: all)
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Sample among the tokens at least P times as likely as the most likely one (0: all)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Seed of the sampler: the same seed gives the same tokens
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Divide the positive logits of tokens the prompt or reply holds by R, multiply the negative
    /// ones (1: none; as vLLM's and transformers' repetition_penalty)
    #[arg(long, value_name = "R", default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    /// Subtract F from a token's logit for each time the reply holds it (-2 to 2; 0: none)
    #[arg(long, value_name = "F", default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Subtract P from the logit of each token the reply holds (-2 to 2; 0: none)
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Add BIAS (-100 to 100) to token ID's logit before the penalties, e.g. `17:-100,42:2.5`
    /// (as OpenAI's logit_bias)
    #[arg(long, value_name = "ID:BIAS,…")]
    pub logit_bias: Option<String>,
}

impl SamplingArgs {
    /// `--logit-bias` as (token id, bias) pairs; ids must be below `vocab`.
    pub fn logit_bias(&self, vocab: usize) -> anyhow::Result<Vec<(u32, f32)>> {
        let Some(list) = &self.logit_bias else { return Ok(vec![]) };
        list.split(',')
            .map(|item| {
                let bad =
                    || anyhow::anyhow!("--logit-bias: expected ID:BIAS with BIAS from -100 to 100, found `{item}`");
                let (id, bias) = item.trim().split_once(':').ok_or_else(bad)?;
                let (id, bias) =
                    (id.trim().parse::<u32>().map_err(|_| bad())?, bias.trim().parse::<f32>().map_err(|_| bad())?);
                if !(-100.0..=100.0).contains(&bias) {
                    return Err(bad());
                }
                if id as usize >= vocab {
                    anyhow::bail!("--logit-bias: token id {id} is not in the vocabulary (0..{vocab})");
                }
                Ok((id, bias))
            })
            .collect()
    }

    pub fn params(&self) -> anyhow::Result<g4c_runtime::SamplingParams> {
        let params = g4c_runtime::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
        };
        params.check().map_err(|(field, expected, found)| {
            anyhow::anyhow!("--{}: expected {expected}, found {found}", field.replace('_', "-"))
        })?;
        Ok(params)
    }
}

/// What the pass pipeline is asked for beyond the target.
#[derive(Args, Clone, Debug)]
pub struct PipelineArgs {
    /// Quantize linear weights to 4 bits with one bf16 scale per group of inputs (W4A16):
    /// `w4a16` (groups of 32) or `w4a16:g<N>` (N a multiple of 8), as compressed-tensors does; `+head`
    /// after either quantizes the LM head too (a 4-bit copy of the embedding table it is tied to)
    #[arg(long, value_name = "SCHEME")]
    pub quantize: Option<String>,
}

impl PipelineArgs {
    pub fn options(&self) -> anyhow::Result<g4c_passes::PipelineOptions> {
        g4c_passes::PipelineOptions::from_quantize(self.quantize.as_deref()).map_err(anyhow::Error::msg)
    }
}

/// Writes to stdout; a closed pipe (`g4c ir ... | head`) ends output quietly instead of failing.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("writing to stdout: {e}")),
        _ => Ok(()),
    }
}

/// Refuses, before any work, an output path that the command could not write at its end.
pub fn check_output(flag: &str, path: &std::path::Path) -> anyhow::Result<()> {
    g4c_util::atomic::check_destination(path).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// Writes a file atomically (`g4c_util::atomic`), naming the file in the error.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    g4c_util::atomic::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Writes logits as safetensors F32 `logits` `[rows, vocab]` (and, when given, the I32 `ids` they
/// score), atomically. `vocab` is explicit so that zero rows still have the model's width.
pub fn write_logits(
    path: &std::path::Path,
    logits: &[Vec<f32>],
    vocab: usize,
    ids: Option<&[u32]>,
) -> anyhow::Result<()> {
    use safetensors::{tensor::TensorView, Dtype};
    let data: Vec<u8> = logits.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
    let id_bytes: Vec<u8> = ids.unwrap_or_default().iter().flat_map(|&i| (i as i32).to_le_bytes()).collect();
    let mut views = vec![("logits", TensorView::new(Dtype::F32, vec![logits.len(), vocab], &data)?)];
    if let Some(ids) = ids {
        views.push(("ids", TensorView::new(Dtype::I32, vec![ids.len()], &id_bytes)?));
    }
    write_atomic(path, &safetensors::serialize(views, None)?)
}

/// `1 entry`, `2 entries`: a count with its noun in the right number.
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub use g4c_util::memory::fmt_bytes;

/// Peak resident set size of this process (Linux `VmHWM`).
pub fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Comma-separated non-negative integers, e.g. `--prompt-ids 2,17,301` (none for blank text, which
/// the caller judges); an empty entry (`2,,17`, `2,17,`) is an error, not skipped.
pub fn parse_list(text: &str, flag: &str, what: &str) -> anyhow::Result<Vec<u32>> {
    use anyhow::{bail, Context};
    if text.trim().is_empty() {
        return Ok(vec![]);
    }
    text.split(',')
        .map(str::trim)
        .map(|s| {
            if s.is_empty() {
                bail!("{flag}: an empty entry in `{text}` (expected {what} between each two commas)");
            }
            s.parse::<u32>().with_context(|| format!("{flag}: `{s}` is not {what} (expected a non-negative integer)"))
        })
        .collect()
}

/// `--prefill-buckets`: increasing lengths between 1 and the context.
pub fn parse_buckets(text: &str, context: usize) -> anyhow::Result<Vec<usize>> {
    use anyhow::bail;
    let buckets: Vec<usize> =
        parse_list(text, "--prefill-buckets", "a length")?.into_iter().map(|b| b as usize).collect();
    if buckets.is_empty() {
        bail!("--prefill-buckets: expected at least one length, found none");
    }
    if let Some(w) = buckets.windows(2).find(|w| w[0] >= w[1]) {
        bail!("--prefill-buckets: expected increasing lengths, found {} before {}", w[0], w[1]);
    }
    if buckets[0] == 0 || *buckets.last().unwrap() > context {
        bail!("--prefill-buckets: expected lengths between 1 and the context ({context}), found {buckets:?}");
    }
    Ok(buckets)
}
