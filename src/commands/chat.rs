//! `g4c chat`: a conversation on the terminal, as llama.cpp's `llama-cli -cnv` and MLC's `mlc_llm
//! chat` hold one. Each line read is a user's message; the reply streams out as it is generated.
//! The conversation lives in one row of the batching engine, whose caches keep the turns before,
//! and in the tokens the model read and generated: a turn adds its own tokens to them (through the
//! chat template), so it prefills only those, and the model reads its replies as it wrote them.

use crate::ui::{ui, with_feedback};
use anyhow::{bail, Result};
use clap::Args;
use g4c_driver::Session;
use g4c_frontend::{ChatMessage, ChatTemplate, TextTokenizer};
use g4c_runtime::{
    BatchEngine, GenerateOptions, ModelShape, PromptProblem, SequenceEvent, SequenceRequest, SequenceSink, StopReason,
};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

#[derive(Args)]
pub struct ChatArgs {
    /// Checkpoint directory (with tokenizer.json and a chat template) or artifact
    pub model_dir: PathBuf,
    #[command(flatten)]
    pub execution: super::ExecutionArgs,
    /// A system message before the conversation
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens of each reply (at least 1)
    #[arg(long, default_value_t = 1024, value_parser = super::sizes::positions)]
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
    // On a terminal Ctrl-C stops a reply; piped, it ends the program as it ends the others.
    let interactive = std::io::stdin().is_terminal();
    let (replying, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    match interactive {
        true => crate::interrupt::stop_replies_on_ctrl_c(replying.clone(), stop.clone()),
        false => crate::interrupt::remove_temporaries_on_signal(),
    }
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
    let logit_bias = args.sampling.logit_bias(session.source.config.vocab_size)?;
    let source = &session.source;
    let context = source.context(args.context, DEFAULT_CONTEXT)?;
    // One row: a conversation is one sequence.
    let shapes = super::engine_shapes(source, (None, 1), (args.prefill_len, DEFAULT_PREFILL), context)?;
    let module = session.module(&shapes)?;
    let shape = ModelShape::of(&module)?;
    let ready = with_feedback(|feedback| session.executor(module, feedback))?;
    let mut engine = BatchEngine::new(ready.executor, session.source.config.sliding_window)?;
    let (events, received) = channel();
    // A reply ends at EOS, or where the model ends its turn.
    let (eos_ids, turn_end) = (session.source.config.eos_token_ids.clone(), tokenizer.turn_end());
    let ends: Vec<u32> = eos_ids.iter().copied().chain(turn_end).collect();

    let system = args.system.iter().filter(|text| !text.trim().is_empty());
    let mut conversation = Conversation {
        messages: system.map(|text| ChatMessage { role: "system".into(), content: text.clone() }).collect(),
        tokens: vec![],
        tokenizer: &tokenizer,
        template: &template,
    };
    if interactive {
        ui().note("one message a line; Ctrl-C stops a reply, /clear starts anew, /help, Ctrl-D or /exit ends");
    }
    let mut stdin = std::io::stdin().lock();
    let mut line = vec![];
    let mut turn = 0u64;
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        line.clear();
        if stdin.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.pop_if(|c| *c == b'\n').is_none() && interactive {
            // Ended by Ctrl-D rather than Enter: the reply starts on a line of its own all the same.
            eprintln!();
        }
        let read = String::from_utf8(std::mem::take(&mut line))
            .map_err(|_| anyhow::anyhow!("the message is not UTF-8 text"))
            .map(|text| text.trim_end_matches('\r').to_string());
        let prompt = match read.and_then(|text| Line::of(text, &mut conversation, &shape)) {
            Ok(Line::Prompt((prompt, dropped))) => {
                if dropped > 0 {
                    ui().note(&format!("the context is full: the conversation's first {dropped} turns were dropped"));
                }
                prompt
            }
            Ok(Line::Nothing) => continue,
            Ok(Line::Command(Command::Exit)) => break,
            Ok(Line::Command(Command::Clear)) => {
                if interactive {
                    ui().note("a new conversation");
                }
                continue;
            }
            Ok(Line::Command(Command::Help)) => {
                eprintln!("{}", Command::HELP);
                continue;
            }
            // On a terminal one message's fault costs that message; piped, the conversation.
            Err(e) if interactive => {
                eprintln!("g4c: error: {e:#}");
                continue;
            }
            Err(e) => bail!("message {}: {e:#}", turn + 1),
        };
        turn += 1;
        let mut options = GenerateOptions {
            max_new_tokens: args.max_new_tokens,
            eos_ids: eos_ids.clone(),
            // Each turn draws its own numbers, the conversation still repeatable from --seed.
            sampling: g4c_runtime::SamplingParams { seed: sampling.seed.wrapping_add(turn - 1), ..sampling },
            logit_bias: logit_bias.clone(),
            ..Default::default()
        };
        options.end_turn_at(turn_end);
        stop.store(false, Ordering::SeqCst);
        let sink = Events { events: events.clone(), stop: stop.clone() };
        engine.admit(SequenceRequest { prompt: prompt.clone(), options }, Box::new(sink))?;
        replying.store(true, Ordering::SeqCst);
        let mut printer = super::printer::StreamPrinter::new(Some(&tokenizer), !args.json);
        let reply = Reply::collect(&mut engine, &received, &mut |token| printer.push(token));
        replying.store(false, Ordering::SeqCst);
        let reply = reply?;
        printer.finish()?;
        let text = tokenizer.decode(&reply.generated)?;
        if args.json {
            let stop_reason = reply.stop.map_or("interrupted", StopReason::name);
            let out = serde_json::json!({
                "prompt_ids": prompt, "cached_tokens": reply.cached_tokens, "generated_ids": reply.generated,
                "text": text, "stop_reason": stop_reason,
            });
            if writeln!(std::io::stdout(), "{out}").is_err() {
                // Whoever read the output has gone (`| head`): so has the conversation.
                return Ok(());
            }
        }
        conversation.answered(prompt, &reply.generated, text, &ends);
    }
    if interactive {
        eprintln!();
    }
    Ok(())
}

/// The conversation so far: its messages, and the tokens the model read and wrote for them.
struct Conversation<'t> {
    messages: Vec<ChatMessage>,
    tokens: Vec<u32>,
    tokenizer: &'t TextTokenizer,
    template: &'t ChatTemplate,
}

/// Stands for the last reply in a rendering, where the text after it is the next turn's.
const REPLY: &str = "\u{e000}g4c reply\u{e000}";

impl Conversation<'_> {
    /// The prompt for the user's `text`: the tokens so far, then what the template adds for it (the
    /// end of the last reply's turn, the message, the start of the model's turn). Where the
    /// template does not write the last reply as it is, the whole conversation rendered anew. Where
    /// the context is full, the oldest turns are dropped (as Ollama trims a conversation) until a
    /// quarter of it is free again; how many is the second value.
    fn ask(&mut self, text: String, shape: &ModelShape) -> Result<(Vec<u32>, usize)> {
        let before = (self.messages.clone(), self.tokens.clone());
        self.messages.push(ChatMessage { role: "user".into(), content: text });
        let mut dropped = 0;
        let asked = loop {
            let prompt = match self.prompt() {
                Ok(prompt) => prompt,
                Err(e) => break Err(e),
            };
            let checked = shape.check_prompt(&prompt, 1);
            let full = matches!(checked, Err(PromptProblem::TooLong { .. }));
            let trimming = dropped > 0 && prompt.len() > shape.context * 3 / 4;
            if (full || trimming) && self.drop_oldest_turn() {
                dropped += 1;
                continue;
            }
            break checked.map(|()| (prompt, dropped)).map_err(|problem| anyhow::anyhow!("{problem}"));
        };
        if asked.is_err() {
            (self.messages, self.tokens) = before;
        }
        asked
    }

    /// Drops the oldest turn (a user's message and the reply to it; system messages stay) but the
    /// last message; whether there was one.
    fn drop_oldest_turn(&mut self) -> bool {
        let Some(first) = self.messages.iter().position(|m| m.role != "system") else { return false };
        if first + 1 >= self.messages.len() {
            return false;
        }
        let reply =
            self.messages.get(first + 1).is_some_and(|m| m.role == "assistant") && first + 2 < self.messages.len();
        self.messages.drain(first..first + 1 + reply as usize);
        // The tokens kept are no longer the conversation's: it is rendered anew.
        self.tokens.clear();
        true
    }

    fn prompt(&self) -> Result<Vec<u32>> {
        let whole = || -> Result<Vec<u32>> { Ok(self.tokenizer.encode(&self.template.render(&self.messages)?)?) };
        let n = self.messages.len();
        if self.tokens.is_empty() || n < 2 || self.messages[n - 2].role != "assistant" {
            return whole();
        }
        let mut probe = self.messages.clone();
        probe[n - 2].content = REPLY.into();
        let rendered = self.template.render(&probe)?;
        match rendered.split_once(REPLY) {
            Some((_, next)) if !next.contains(REPLY) => {
                Ok(self.tokens.iter().copied().chain(self.tokenizer.encode_continuation(next)?).collect())
            }
            _ => whole(),
        }
    }

    /// Forgets every turn; a system message stays.
    fn clear(&mut self) {
        self.messages.retain(|m| m.role == "system");
        self.tokens.clear();
    }

    /// Records the reply to the last message: `generated` after `prompt`, less a last token that
    /// ended the turn (the template writes the end of the turn itself).
    fn answered(&mut self, prompt: Vec<u32>, generated: &[u32], text: String, ends: &[u32]) {
        let kept = match generated.last() {
            Some(last) if ends.contains(last) => &generated[..generated.len() - 1],
            _ => generated,
        };
        self.tokens = prompt.into_iter().chain(kept.iter().copied()).collect();
        self.messages.push(ChatMessage { role: "assistant".into(), content: text });
    }
}

/// What a line read is.
enum Line {
    /// A message: the prompt that asks it, and how many of the oldest turns were dropped for it.
    Prompt((Vec<u32>, usize)),
    /// A blank line.
    Nothing,
    /// A command, done as far as the conversation goes (`/clear` has cleared it).
    Command(Command),
}

impl Line {
    fn of(text: String, conversation: &mut Conversation, shape: &ModelShape) -> Result<Line> {
        Ok(match Command::of(&text)? {
            Some(command) => {
                if command == Command::Clear {
                    conversation.clear();
                }
                Line::Command(command)
            }
            None if text.trim().is_empty() => Line::Nothing,
            None => Line::Prompt(conversation.ask(text, shape)?),
        })
    }
}

/// A line that is a command rather than a message, as in llama.cpp's and Ollama's chats.
#[derive(Debug, PartialEq)]
enum Command {
    Clear,
    Exit,
    Help,
}

impl Command {
    const HELP: &str = "/clear  forget the conversation (a --system message stays)\n\
                        /exit   end the conversation (also Ctrl-D)\n\
                        /help   this list\n\
                        any other line starting with / (a path, a sentence) is a message";

    /// The command `line` is, if it is `/` and a word of letters (or `/?`); an unknown one is an
    /// error. Anything else (`/etc/hosts`, `/clear the table`) is a message.
    fn of(line: &str) -> Result<Option<Command>> {
        let word = line.trim();
        let name = word.strip_prefix('/').unwrap_or_default();
        if !(name == "?" || !name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic())) {
            return Ok(None);
        }
        Ok(Some(match word {
            "/clear" => Command::Clear,
            "/exit" | "/quit" | "/bye" => Command::Exit,
            "/help" | "/?" => Command::Help,
            _ => bail!("unknown command `{word}`: /help lists the commands"),
        }))
    }
}

/// A sequence's events, sent on to the conversation's loop; gone once Ctrl-C stops the reply.
struct Events {
    events: Sender<SequenceEvent>,
    stop: Arc<AtomicBool>,
}

impl SequenceSink for Events {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.events.send(event).is_ok() && !self.is_gone()
    }

    fn is_gone(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// One reply, as the engine generated it.
struct Reply {
    cached_tokens: usize,
    generated: Vec<u32>,
    /// `None`: stopped by Ctrl-C.
    stop: Option<StopReason>,
}

impl Reply {
    /// Steps `engine` until the one sequence in it ends or is stopped, passing each token to
    /// `on_token`.
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
                    SequenceEvent::Token(token, _) => {
                        generated.push(token);
                        on_token(token);
                    }
                    SequenceEvent::Finished(stop) => return Ok(Reply { cached_tokens, generated, stop: Some(stop) }),
                    SequenceEvent::Failed(message) => bail!("{message}"),
                }
            }
            if stepped.is_none() {
                return Ok(Reply { cached_tokens, generated, stop: None });
            }
        }
    }
}
