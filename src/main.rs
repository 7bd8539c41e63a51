//! `g4c`: the command line. It only wires the pipeline crates together.

mod commands;
mod interrupt;
mod ui;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "g4c", version, about = "Compile and run Gemma 4 checkpoints", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print no progress bars or notes (errors and warnings still go to stderr)
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Print details (for commands that compile: where each executable came from and how long getting
    /// it took)
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    verbose: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Measure prefill and decode speed, startup and memory, against the decode roofline (--project: a CUDA plan's roofline, running nothing)
    Bench(commands::bench::BenchArgs),
    /// List, clear or verify the executable cache
    Cache(commands::cache::CacheArgs),
    /// Hold a conversation: each line of stdin is a message, answered through the chat template, the turns before kept in the caches
    Chat(commands::chat::ChatArgs),
    /// Run a target's pass pipeline, lower to StableHLO (and for CUDA targets plan the kernels and compile them to PTX and cubins), and compile the executables: into the executable cache, or with -o into an artifact
    Compile(commands::compile::CompileArgs),
    /// Score a token sequence (teacher forced): perplexity, and divergence from a reference's logits
    Eval(commands::eval::EvalArgs),
    /// Print an artifact's manifest in readable form
    Inspect(commands::inspect::InspectArgs),
    /// Print the IR of a checkpoint's entry points
    Ir(commands::ir::IrArgs),
    /// Generate tokens from a checkpoint or an artifact
    Run(commands::run::RunArgs),
    /// Serve a checkpoint or an artifact over HTTP with OpenAI's API, batching requests continuously
    Serve(commands::serve::ServeArgs),
    /// Write a synthetic checkpoint in the published Gemma 4 layout
    Synth(commands::synth::SynthArgs),
    /// List the compilation targets and their properties
    Targets(commands::targets::TargetsArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    return ExitCode::SUCCESS;
                }
                // `g4c` alone asked for nothing: help, on stderr, and a failure.
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    return ExitCode::from(2);
                }
                _ => {}
            }
            eprintln!("g4c: error: {} (see `g4c --help`)", clap_error_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    ui::init(ui::Ui { quiet: cli.quiet, verbose: cli.verbose });
    if !matches!(cli.command, Command::Serve(_) | Command::Chat(_)) {
        interrupt::remove_temporaries_on_signal();
    }
    let result = match cli.command {
        Command::Bench(args) => commands::bench::run(args),
        Command::Cache(args) => commands::cache::run(args),
        Command::Compile(args) => commands::compile::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Ir(args) => commands::ir::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::Targets(args) => commands::targets::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("g4c: error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// clap's error in one line: what was wrong, the missing arguments, possible values and "did you
/// mean" tips; not the usage block or the pointer to --help that follow them.
fn clap_error_line(rendered: &str) -> String {
    let detail: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .filter(|l| !l.is_empty())
        .collect();
    one_line(&detail.join(" "))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
