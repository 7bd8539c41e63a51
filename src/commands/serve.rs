use crate::ui::with_feedback;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use g4c_driver::Session;
use g4c_frontend::ChatTemplate;
use g4c_runtime::BatchEngine;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    /// Checkpoint directory or artifact
    pub model_dir: PathBuf,
    #[command(flatten)]
    pub execution: super::ExecutionArgs,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the log line says which)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together: the batch the entry points are compiled for (default 8; an artifact
    /// has its own)
    #[arg(long, value_parser = super::sizes::batch)]
    pub max_batch: Option<usize>,
    /// Positions a sequence may reach, prompt included (default 4096, at most the model's
    /// max_position_embeddings; an artifact has its own)
    #[arg(long, value_parser = super::sizes::positions)]
    pub context: Option<usize>,
    /// Prompt tokens per row in one prefill call: joining prompts are prefilled in chunks of this
    /// many, between decode calls (default 64; an artifact has its own prefill lengths)
    #[arg(long, value_parser = super::sizes::positions)]
    pub prefill_len: Option<usize>,
    /// Sequences (a request's choices, for each of its prompts) that may wait for a row; a request
    /// whose sequences do not all fit is answered 429 with Retry-After
    #[arg(long, default_value_t = 64, value_parser = super::sizes::positions)]
    pub max_queue: usize,
    /// The model's name in /v1/models and in requests (default: the directory's name)
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Seconds requests in flight may take to finish after SIGTERM or Ctrl-C before they are cancelled
    #[arg(long, default_value_t = 30, allow_negative_numbers = true)]
    pub shutdown_grace: u64,
    /// Web origins whose pages may call the server from a browser (CORS), comma-separated, e.g.
    /// `http://localhost:3000`: `*` any (as vLLM's and llama.cpp's servers), `none` no page
    #[arg(long, value_name = "LIST", default_value = "*")]
    pub allowed_origins: String,
}

const DEFAULT_BATCH: usize = 8;
const DEFAULT_PREFILL: usize = 64;

pub fn run(args: ServeArgs) -> Result<()> {
    if args.served_model_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
        bail!("--served-model-name: expected a name clients can send, found an empty one");
    }
    let listener = g4c_serve::bind(&args.host, args.port).map_err(anyhow::Error::msg)?;
    let mut session = Session::open(&args.model_dir, args.execution.session_options(&args.model_dir)?)?;
    g4c_serve::prepare::check_sampling_defaults(&session.source.config.sampling_defaults)
        .map_err(|e| anyhow!("{}: generation_config.json: {e}", args.model_dir.display()))?;
    let source = &session.source;
    let context = source.context(args.context, 4096)?;
    let shapes =
        super::engine_shapes(source, (args.max_batch, DEFAULT_BATCH), (args.prefill_len, DEFAULT_PREFILL), context)?;
    let module = session.module(&shapes)?;
    let ready = with_feedback(|feedback| session.executor(module, feedback))?;
    let engine = BatchEngine::new(ready.executor, session.source.config.sliding_window)?;

    let tokenizer = session.source.tokenizer.take().map(Arc::new);
    let chat_template = match &tokenizer {
        Some(t) => ChatTemplate::open(&args.model_dir, t)?,
        None => None,
    };
    let turn_end = tokenizer.as_ref().and_then(|t| t.turn_end());
    let name = match &args.served_model_name {
        Some(name) => name.clone(),
        None => args
            .model_dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .ok_or_else(|| anyhow!("{}: cannot name the model; give --served-model-name", args.model_dir.display()))?,
    };
    let config = &session.source.config;
    let model = g4c_serve::ModelInfo {
        name,
        tokenizer,
        chat_template,
        eos_ids: config.eos_token_ids.clone(),
        turn_end,
        shape: engine.shape().clone(),
        sampling_defaults: config.sampling_defaults,
        grammars: Default::default(),
    };
    let options = g4c_serve::ServeOptions {
        listener,
        max_queue: args.max_queue,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        allowed_origins: g4c_serve::AllowedOrigins::parse(&args.allowed_origins)
            .map_err(|e| anyhow::anyhow!("--allowed-origins: {e}"))?,
    };
    g4c_serve::serve(engine, model, options).map_err(anyhow::Error::msg)
}
