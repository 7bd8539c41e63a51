use crate::ui::with_feedback;
use anyhow::{anyhow, bail, Result};
use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::Args;
use g4c_driver::Session;
use g4c_frontend::{ChatMessage, ChatTemplate, Shapes};
use g4c_ir::Target;
use g4c_runtime::constraint::{Grammar, Grammars};
use g4c_runtime::{generate, GenerateOptions, Generation, ModelShape};
use std::path::PathBuf;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("prompt_given").args(["prompt_ids", "prompt"]).required(true)))]
pub struct RunArgs {
    /// Checkpoint directory (config.json + safetensors [+ tokenizer.json]), or an artifact that
    /// `g4c compile -o` wrote
    pub model_dir: PathBuf,
    #[command(flatten)]
    pub execution: super::ExecutionArgs,
    /// Prompt as comma-separated token ids, e.g. `2,17,301` (used as given: add BOS yourself)
    #[arg(long, conflicts_with = "prompt", allow_negative_numbers = true)]
    pub prompt_ids: Option<String>,
    /// Prompt as text, tokenized with the checkpoint's tokenizer.json (BOS is added)
    #[arg(long, value_parser = OsStringValueParser::new().try_map(utf8_text))]
    pub prompt: Option<String>,
    /// With --prompt: the prompt is a user's message, rendered through the checkpoint's chat
    /// template as `g4c serve`'s chat completions are, and generation ends with the model's turn
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate
    #[arg(long, default_value_t = 32, value_parser = super::sizes::new_tokens)]
    pub max_new_tokens: usize,
    /// Keep generating after an end-of-sequence token
    #[arg(long)]
    pub ignore_eos: bool,
    /// Keep the generated text to this JSON schema, given as JSON (`{"type": "object"}`: any JSON
    /// object); generation ends where the text is complete
    #[arg(long, value_name = "SCHEMA", conflicts_with_all = ["regex", "ignore_eos"])]
    pub json_schema: Option<String>,
    /// Keep the generated text to this regular expression (Rust's regex syntax), which the whole text
    /// matches; generation ends where it may
    #[arg(long, value_name = "REGEX", conflicts_with = "ignore_eos")]
    pub regex: Option<String>,
    /// Comma-separated token ids that also end generation (even with --ignore-eos)
    #[arg(long, value_name = "LIST", allow_negative_numbers = true)]
    pub stop_ids: Option<String>,
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Print one JSON object (backend, prompt_ids, generated_ids, text (null without a tokenizer),
    /// stop_reason) instead of streaming
    #[arg(long)]
    pub json: bool,
    /// Write the logits of every generated token to FILE (safetensors, F32 `logits` [N, vocab])
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// Positions a sequence may reach, prompt included, at most the model's max_position_embeddings
    /// (default: 4096 for pjrt, whose executables are cached by shape; the prompt plus
    /// --max-new-tokens for the other backends, which build for the run's shapes; an artifact has
    /// its own); generation stops there (stop_reason `context`)
    #[arg(long, value_parser = super::sizes::positions)]
    pub context: Option<usize>,
    /// Prefill lengths to choose from, increasing (default for pjrt: the multiples of 128 up to the
    /// context, 128, 256, 384, …; for the other backends: the prompt's length; an artifact has its
    /// own). The prompt is prefilled in the smallest that holds it, or in chunks of the largest,
    /// right-padded.
    #[arg(long, value_name = "LIST")]
    pub prefill_buckets: Option<String>,
    /// Print timings and peak memory to stderr
    #[arg(long)]
    pub stats: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    // clap's `requires` does not hold a flag (--chat) to it.
    if args.chat && args.prompt.is_none() {
        bail!("--chat renders --prompt text through the chat template; --prompt-ids are used as given");
    }
    // Before generating, not after: a path that cannot be written would lose the run.
    if let Some(path) = &args.logits_out {
        super::check_output("--logits-out", path)?;
    }
    let session = Session::open(&args.model_dir, args.execution.session_options(&args.model_dir)?)?;
    let source = &session.source;
    let config = &source.config;
    let tokenizer = source.tokenizer.as_ref();
    let prompt = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) => super::parse_list(ids, "--prompt-ids", "a token id")?,
        (None, Some(text)) => match tokenizer {
            Some(t) if args.chat => {
                let Some(template) = ChatTemplate::open(&args.model_dir, t)? else {
                    bail!(
                        "--chat needs a chat template ({0}/chat_template.jinja, or tokenizer_config.json's \
                         chat_template), which {0} lacks",
                        args.model_dir.display()
                    )
                };
                t.encode(&template.render(&[ChatMessage { role: "user".into(), content: text.clone() }])?)?
            }
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
    // Before compiling: a grammar that does not compile fails at once.
    let mut opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        eos_ids: config.eos_token_ids.clone(),
        ignore_eos: args.ignore_eos,
        stop_ids: match &args.stop_ids {
            Some(list) => stop_ids(list, config.vocab_size)?,
            None => vec![],
        },
        sampling: args.sampling.params()?,
        keep_logits: args.logits_out.is_some(),
        logit_bias: args.sampling.logit_bias(config.vocab_size)?,
        ..Default::default()
    };
    if args.chat {
        opts.end_turn_at(tokenizer.and_then(|t| t.turn_end()));
    }
    if let Some((flag, grammar)) = structured_output(&args)? {
        let Some(tokenizer) = tokenizer else {
            bail!("{flag}: structured output needs the checkpoint's tokenizer.json")
        };
        let grammars = Grammars::of_tokenizer(tokenizer, config.vocab_size, &config.eos_token_ids)
            .map_err(|e| anyhow!("{flag}: {e}"))?;
        opts.constraint = Some(grammars.constraint(&grammar, &opts.ends()).map_err(|e| anyhow!("{flag}: {e}"))?);
    }
    let fixed = source.fixed_shapes();
    let fixed_shapes = session.backend == g4c_driver::BackendKind::Pjrt;
    // The backends but pjrt size their caches to the run; generation stops where the context ends.
    let context = source.context(args.context, if fixed_shapes { 4096 } else { prompt.len() + args.max_new_tokens })?;
    let requested = args.prefill_buckets.as_deref().map(|list| super::parse_buckets(list, context)).transpose()?;
    // A checkpoint is emitted with the one prefill length the prompt needs (the smallest bucket that
    // holds it, else the largest, in chunks); an artifact has all of its own.
    let prefill_len = match (&fixed, requested) {
        (Some(s), Some(b)) if b != s.prefill_lens => bail!(
            "--prefill-buckets: artifact {} was compiled with prefill lengths {:?}, found {b:?}",
            source.label,
            s.prefill_lens
        ),
        (Some(s), _) => s.longest_prefill(),
        (None, requested) => {
            let buckets = match requested {
                Some(b) => b,
                None if fixed_shapes => default_buckets(context),
                None => vec![prompt.len().min(context)],
            };
            buckets.iter().copied().find(|&b| b >= prompt.len()).unwrap_or(*buckets.last().unwrap())
        }
    };
    let batch = fixed.as_ref().map_or(1, |s| s.batch);
    let module = session.module(&Shapes { batch, prefill_len, context })?;

    let mut printer = super::printer::StreamPrinter::new(tokenizer, !args.json);
    let mut ready = with_feedback(|feedback| session.executor(module.clone(), feedback))?;
    let generation = generate(ready.executor.as_mut(), &prompt, &opts, &mut |t| printer.push(t))?;
    printer.finish()?;
    if args.stats {
        let compiled = ready.compiled.as_ref().map(|c| format!("compile: {}; ", c.describe()));
        eprintln!(
            "stats: {}weights {:.2} s; ready to run after {:.2} s",
            compiled.unwrap_or_default(),
            ready.weights_seconds,
            ready.total_seconds
        );
        print_stats(session.backend, source.target, &ModelShape::of(&module)?, &generation);
    }

    if let Some(path) = &args.logits_out {
        super::write_logits(path, &generation.logits, config.vocab_size, None)?;
    }
    if args.json {
        let text = match tokenizer {
            Some(t) => Some(t.decode(&generation.generated_ids)?),
            None => None,
        };
        let out = serde_json::json!({
            "prompt_ids": generation.prompt_ids,
            "generated_ids": generation.generated_ids,
            "text": text,
            "stop_reason": generation.stop.name(),
            "backend": session.backend.name(),
        });
        super::write_stdout(&format!("{out}\n"))?;
    }
    Ok(())
}

/// The grammar `--json-schema` or `--regex` asks for, with the flag that asked.
fn structured_output(args: &RunArgs) -> Result<Option<(&'static str, Grammar)>> {
    if let Some(schema) = &args.json_schema {
        let schema =
            serde_json::from_str(schema).map_err(|e| anyhow!("--json-schema: expected a JSON schema as JSON: {e}"))?;
        return Ok(Some(("--json-schema", Grammar::JsonSchema(schema))));
    }
    match &args.regex {
        Some(regex) if regex.is_empty() => bail!("--regex: expected a regular expression, found an empty one"),
        regex => Ok(regex.clone().map(|regex| ("--regex", Grammar::Regex(regex)))),
    }
}

/// `--prompt`'s text. clap's own check of a `String` flag refuses non-UTF-8 without naming the flag.
fn utf8_text(text: std::ffi::OsString) -> Result<String, String> {
    text.into_string().map_err(|_| "not UTF-8 text (the invalid bytes are shown as �)".to_string())
}

/// `--stop-ids`: token ids of the model's vocabulary (`vocab` of them).
fn stop_ids(list: &str, vocab: usize) -> Result<Vec<u32>> {
    let ids = super::parse_list(list, "--stop-ids", "a token id")?;
    if ids.is_empty() {
        bail!("--stop-ids: no token ids given (expected ids separated by commas)");
    }
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("--stop-ids: token id {bad} is outside the vocabulary (0..{vocab})");
    }
    Ok(ids)
}

/// 128, 256, … up to the context (the ladder grows in steps of 128, not by doubling, so padding never
/// costs more than 127 positions).
fn default_buckets(context: usize) -> Vec<usize> {
    let ladder: Vec<usize> = (1..).map(|i| i * 128).take_while(|&b| b <= context).collect();
    if ladder.is_empty() {
        vec![context]
    } else {
        ladder
    }
}

fn print_stats(backend: g4c_driver::BackendKind, target: &Target, shape: &ModelShape, g: &Generation) {
    let t = g.timings;
    let decoded = g.generated_ids.len().saturating_sub(1);
    let rate = if t.decode_seconds > 0.0 { decoded as f64 / t.decode_seconds } else { 0.0 };
    let calls: Vec<String> = shape.prefill_plan(g.prompt_ids.len()).iter().map(|(_, t, _)| t.to_string()).collect();
    eprintln!(
        "stats: backend {} (target {}), prefill {} (calls of {}) {:.1} ms, decode {} {:.2} tok/s, peak memory {}",
        backend.name(),
        target.name,
        super::count(g.prompt_ids.len(), "token", "tokens"),
        calls.join(" + "),
        t.prefill_seconds * 1e3,
        super::count(decoded, "token", "tokens"),
        rate,
        super::peak_memory().map_or("unknown".into(), super::fmt_bytes),
    );
}
