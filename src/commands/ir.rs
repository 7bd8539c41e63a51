use super::ShapeArgs;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use g4c_frontend::Model;
use std::path::PathBuf;

#[derive(Args)]
pub struct IrArgs {
    /// Checkpoint directory (config.json + safetensors)
    pub model_dir: PathBuf,
    /// Print only this entry point (with the weight declarations it reads)
    #[arg(long, value_enum)]
    pub entry: Option<EntryArg>,
    #[command(flatten)]
    pub shapes: ShapeArgs,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum EntryArg {
    Prefill,
    Decode,
}

pub fn run(args: IrArgs) -> Result<()> {
    let model = Model::open(&args.model_dir)?;
    let mut module = model.module(&args.shapes.shapes())?;
    g4c_ir::verify_module(&module)?;
    if let Some(entry) = args.entry {
        let name = match entry {
            EntryArg::Prefill => "prefill",
            EntryArg::Decode => "decode",
        };
        module.functions.retain(|f| f.name == name);
        if module.functions.is_empty() {
            bail!("no entry point `{name}`");
        }
    }
    super::write_stdout(&g4c_ir::print_module(&module))
}
