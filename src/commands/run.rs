use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use g4c_frontend::{Model, Shapes, TextTokenizer};
use g4c_runtime::pjrt::{find_cpu_plugin, Api, Client};
use g4c_runtime::{generate, GenerateOptions, Generation, InterpExecutor, Interpreter, PjrtExecutor};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct RunArgs {
    /// Checkpoint directory (config.json + safetensors [+ tokenizer.json])
    pub model_dir: PathBuf,
    /// Execution backend
    #[arg(long, value_enum, default_value = "interp")]
    pub backend: Backend,
    /// Prompt as comma-separated token ids, e.g. `2,17,301` (used as given: add BOS yourself)
    #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
    pub prompt_ids: Option<String>,
    /// Prompt as text, tokenized with the checkpoint's tokenizer.json (BOS is added)
    #[arg(long)]
    pub prompt: Option<String>,
    /// Most tokens to generate
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Keep generating after an end-of-sequence token
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (prompt_ids, generated_ids, text, stop_reason) instead of streaming
    #[arg(long)]
    pub json: bool,
    /// Write the logits of every generated token to FILE (safetensors, F32 `logits` [N, vocab])
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// PJRT plugin shared object (default: $G4C_PJRT_PLUGIN, else the CPU plugin scripts/setup installed)
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Tokens per prefill call (default: the whole prompt in one call); longer prompts are prefilled in chunks
    #[arg(long)]
    pub prefill_len: Option<usize>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Backend {
    /// The reference interpreter (f32, op by op)
    Interp,
    /// StableHLO compiled and run by a PJRT plugin
    Pjrt,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Interp => "interp",
            Backend::Pjrt => "pjrt",
        }
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    let model = Model::open(&args.model_dir)?;
    let tokenizer = TextTokenizer::open(&args.model_dir, model.config.bos_token_id)?;
    let prompt = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) => parse_ids(ids)?,
        (None, Some(text)) => match &tokenizer {
            Some(t) => t.encode(text)?,
            None => bail!(
                "--prompt needs {}/tokenizer.json, which does not exist; use --prompt-ids",
                args.model_dir.display()
            ),
        },
        (None, None) => unreachable!("clap requires one of --prompt-ids and --prompt"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty: give at least one token id");
    }
    let shapes = Shapes {
        batch: 1,
        prefill_len: args.prefill_len.unwrap_or(prompt.len()).max(1),
        context: prompt.len() + args.max_new_tokens,
    };
    let module = model.module(&shapes)?;
    g4c_ir::verify_module(&module)?;
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        eos_ids: model.config.eos_token_ids.clone(),
        ignore_eos: args.ignore_eos,
    };

    let mut printer =
        StreamPrinter { tokenizer: tokenizer.as_ref(), enabled: !args.json, ids: vec![], printed: String::new() };
    let generation = match args.backend {
        Backend::Interp => {
            let mut exec = InterpExecutor::new(Interpreter::new(&module, &model.checkpoint));
            generate(&mut exec, &prompt, &opts, &mut |t| printer.push(t))?
        }
        Backend::Pjrt => {
            let plugin = match args.plugin.clone().or_else(find_cpu_plugin) {
                Some(p) => p,
                None => bail!("no PJRT plugin: pass --plugin PATH, set G4C_PJRT_PLUGIN, or run scripts/setup to install the CPU plugin"),
            };
            if !plugin.exists() {
                bail!("PJRT plugin {} does not exist", plugin.display());
            }
            let client = Client::new(Api::load(&plugin)?)?;
            let mut exec = PjrtExecutor::new(&module, &model.checkpoint, client)?;
            generate(&mut exec, &prompt, &opts, &mut |t| printer.push(t))?
        }
    };
    printer.finish();

    if let Some(path) = &args.logits_out {
        write_logits(path, &generation)?;
    }
    if args.json {
        let text = match &tokenizer {
            Some(t) => Some(t.decode(&generation.generated_ids)?),
            None => None,
        };
        let out = serde_json::json!({
            "prompt_ids": generation.prompt_ids,
            "generated_ids": generation.generated_ids,
            "text": text,
            "stop_reason": generation.stop.name(),
            "backend": args.backend.name(),
        });
        println!("{out}");
    }
    Ok(())
}

fn parse_ids(text: &str) -> Result<Vec<u32>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("--prompt-ids: `{s}` is not a token id (expected a non-negative integer)"))
        })
        .collect()
}

/// Streams generated tokens to stdout: text when there is a tokenizer, else ids.
struct StreamPrinter<'t> {
    tokenizer: Option<&'t TextTokenizer>,
    enabled: bool,
    ids: Vec<u32>,
    printed: String,
}

impl StreamPrinter<'_> {
    fn push(&mut self, token: u32) {
        if !self.enabled {
            return;
        }
        self.ids.push(token);
        let mut out = std::io::stdout().lock();
        match self.tokenizer.and_then(|t| t.decode(&self.ids).ok()) {
            // Decode the whole sequence and print what is new, so multi-token characters come out whole.
            Some(text) => {
                if let Some(new) = text.strip_prefix(self.printed.as_str()) {
                    let _ = write!(out, "{new}");
                    self.printed = text;
                }
            }
            None => {
                let _ = write!(out, "{}{token}", if self.ids.len() > 1 { " " } else { "" });
            }
        }
        let _ = out.flush();
    }

    fn finish(&self) {
        if self.enabled {
            println!();
        }
    }
}

/// Writes `logits` `[N, vocab]` F32 atomically (temporary file, then rename).
fn write_logits(path: &Path, g: &Generation) -> Result<()> {
    let vocab = g.logits.first().map_or(0, |r| r.len());
    let bytes: Vec<u8> = g.logits.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![g.logits.len(), vocab], &bytes)
        .context("building the logits tensor")?;
    let data = safetensors::serialize([("logits", view)], None).context("serializing logits")?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}
