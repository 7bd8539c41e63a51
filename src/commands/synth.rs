use crate::ui::ui;
use anyhow::{anyhow, Result};
use clap::Args;
use g4c_frontend::synth::{synthesize, total_bytes, Preset};
use g4c_runtime::{Progress, Unit};
use std::path::PathBuf;

#[derive(Args)]
pub struct SynthArgs {
    /// `tiny` (toy size, every E2B irregularity, with a tokenizer), `e2b` (real E2B shapes, bf16, ≈9.3 GB)
    /// or `e2b-qat` (E2B as the W4A16 QAT export publishes it, ≈6.6 GB)
    #[arg(long)]
    pub preset: String,
    /// Seed of the random weights
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (must not exist)
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
}

pub fn run(args: SynthArgs) -> Result<()> {
    let preset = Preset::parse(&args.preset)
        .ok_or_else(|| anyhow!("unknown preset `{}` (expected one of {})", args.preset, Preset::NAMES))?;
    let bars = ui().progress();
    bars.begin("writing tensors", total_bytes(preset)?, Unit::Bytes);
    synthesize(preset, args.seed, &args.out, &mut |n| bars.advance(n))?;
    bars.end();
    ui().note(&format!("wrote {}", args.out.display()));
    Ok(())
}
