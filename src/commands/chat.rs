//! `g4c chat`: a conversation on the terminal, as llama.cpp's `llama-cli -cnv` and MLC's `mlc_llm
//! chat` hold one. Each line read is a user's message, rendered with the turns before it through
//! the checkpoint's chat template; the reply streams out as it is generated. The conversation lives
//! in one row of the batching engine, whose caches keep the turns before: a turn prefills only what
//! its prompt adds to them.

use crate::ui::with_feedback;
use anyhow::{bail, Context, Result};
use clap::Args;
use g4c_driver::Session;
use g4c_frontend::{ChatMessage, ChatTemplate};
use g4c_runtime::{BatchEngine, GenerateOptions, ModelShape, SequenceEvent, SequenceRequest, SequenceSink, StopReason};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};

#[derive(Args)]
pub struct ChatArgs {
    /// Checkpoint directory (with tokenizer.json and a chat template) or artifact
    pub model_dir: PathBuf,
    #[command(flatten)]
    pub execution: super::ExecutionArgs,
    /// A system message before the conversation
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens of each reply
    #[arg(long, default_value_t = 1024, value_parser = super::sizes::new_tokens)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Positions the conversation may reach, at most the model's max_position_embeddings (default:
    /// 4096; an artifact has its own)
    #[arg(long, value_parser = super::sizes::positions)]
    pub context: Option<usize>,
    /// Tokens per prefill call (default: 64; an artifact has its own)
    #[arg(long, value_parser = super::sizes::positions)]
    pub prefill_len: Option<usize>,
    /// Print one JSON object a turn (prompt_ids, cached_tokens, generated_ids, text, stop_reason)
    /// instead of the replies' text
    #[arg(long)]
    pub json: bool,
}

const DEFAULT_CONTEXT: usize = 4096;
const DEFAULT_PREFILL: usize = 64;

pub fn run(args: ChatArgs) -> Result<()> {
    let mut session = Session::open(&args.model_dir, args.execution.session_options(&args.model_dir)?)?;
    let Some(tokenizer) = session.source.tokenizer.take() else {
        bail!("chat needs {}/tokenizer.json, which does not exist", args.model_dir.display());
    };
    let Some(template) = ChatTemplate::open(&args.model_dir, &tokenizer)? else {
        bail!(
            "chat needs a chat template ({0}/chat_template.jinja, or tokenizer_config.json's chat_template), \
             which {0} lacks",
            args.model_dir.display()
        );
    };
    let sampling = args.sampling.params()?;
    let source = &session.source;
    let context = source.context(args.context, DEFAULT_CONTEXT)?;
    // One row: a conversation is one sequence.
    let shapes = super::engine_shapes(source, (None, 1), (args.prefill_len, DEFAULT_PREFILL), context)?;
    let module = session.module(&shapes)?;
    let shape = ModelShape::of(&module)?;
    let ready = with_feedback(|feedback| session.executor(module, feedback))?;
    let mut engine = BatchEngine::new(ready.executor, session.source.config.sliding_window)?;
    let (events, received) = channel();
    let stop_ids: Vec<u32> = tokenizer.turn_end().into_iter().collect();
    let eos_ids = session.source.config.eos_token_ids.clone();

    let mut messages: Vec<ChatMessage> =
        args.system.iter().map(|text| ChatMessage { role: "system".into(), content: text.clone() }).collect();
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!("g4c chat: one message a line; Ctrl-D ends the conversation");
    }
    let mut lines = stdin.lock().lines();
    let mut turn = 0u64;
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading a message from stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        turn += 1;
        messages.push(ChatMessage { role: "user".into(), content: line });
        let prompt = tokenizer.encode(&template.render(&messages)?)?;
        if let Err(problem) = shape.check_prompt(&prompt, 1) {
            bail!("turn {turn}: {problem}; start a new conversation");
        }
        let options = GenerateOptions {
            max_new_tokens: args.max_new_tokens.min(context - prompt.len()),
            eos_ids: eos_ids.clone(),
            ignore_eos: false,
            stop_ids: stop_ids.clone(),
            // Each turn draws its own numbers, the conversation still repeatable from --seed.
            sampling: g4c_runtime::SamplingParams { seed: sampling.seed.wrapping_add(turn - 1), ..sampling },
            forced: vec![],
            keep_logits: false,
        };
        engine.admit(SequenceRequest { prompt: prompt.clone(), options }, Box::new(Events(events.clone())))?;
        let mut printer = super::printer::StreamPrinter::new(Some(&tokenizer), !args.json);
        let reply = Reply::collect(&mut engine, &received, &mut |token| printer.push(token))?;
        printer.finish();
        let text = tokenizer.decode(&reply.generated)?;
        if args.json {
            let out = serde_json::json!({
                "prompt_ids": prompt, "cached_tokens": reply.cached_tokens, "generated_ids": reply.generated,
                "text": text, "stop_reason": reply.stop.name(),
            });
            println!("{out}");
        }
        messages.push(ChatMessage { role: "assistant".into(), content: text });
    }
    Ok(())
}

/// A sequence's events, sent on to the conversation's loop.
struct Events(Sender<SequenceEvent>);

impl SequenceSink for Events {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_gone(&self) -> bool {
        false
    }
}

/// One reply, as the engine generated it.
struct Reply {
    cached_tokens: usize,
    generated: Vec<u32>,
    stop: StopReason,
}

impl Reply {
    /// Steps `engine` until the one sequence in it ends, passing each token to `on_token`.
    fn collect(
        engine: &mut BatchEngine,
        events: &Receiver<SequenceEvent>,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Reply> {
        let (mut cached_tokens, mut generated) = (0, vec![]);
        loop {
            let stepped = engine.step()?;
            for event in events.try_iter() {
                match event {
                    SequenceEvent::Admitted { cached_tokens: cached, .. } => cached_tokens = cached,
                    SequenceEvent::Token(token) => {
                        generated.push(token);
                        on_token(token);
                    }
                    SequenceEvent::Finished(stop) => return Ok(Reply { cached_tokens, generated, stop }),
                    SequenceEvent::Failed(message) => bail!("{message}"),
                }
            }
            if stepped.is_none() {
                bail!("the engine stopped before the reply ended");
            }
        }
    }
}
