use super::ShapeArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use g4c_ir::Target;
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
    /// Run this target's pass pipeline (see `g4c targets`); without it, print the frontend's IR
    #[arg(long)]
    pub target: Option<String>,
    /// With --target: print the IR after this pass instead of after the whole pipeline
    #[arg(long, value_name = "PASS", requires = "target")]
    pub after: Option<String>,
    /// With --target: write the IR before the first pass and after every pass into DIR
    #[arg(long, value_name = "DIR", requires = "target")]
    pub dump_dir: Option<PathBuf>,
    /// With --target: print each pass's time (and the verification after it) to stderr
    #[arg(long, requires = "target")]
    pub timings: bool,
    /// With a CUDA --target: print the kernel plan (fusion, buffers, launches, with each kernel's
    /// function) instead of the IR
    #[arg(long, requires = "target", conflicts_with = "after")]
    pub plan: bool,
    /// With a CUDA --target: print the CUDA C of the plan's kernels (one translation unit per entry
    /// point) instead of the IR
    #[arg(long, requires = "target", conflicts_with_all = ["after", "plan"])]
    pub cuda: bool,
    #[command(flatten)]
    pub pipeline: super::PipelineArgs,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum EntryArg {
    Prefill,
    Decode,
}

pub fn run(args: IrArgs) -> Result<()> {
    if args.pipeline.quantize.is_some() && args.target.is_none() {
        bail!("--quantize is a pass of a target's pipeline: give --target too");
    }
    if let Some(dir) = args.dump_dir.as_ref().filter(|d| d.exists() && !d.is_dir()) {
        bail!("--dump-dir {} is not a directory (expected a directory, made if missing)", dir.display());
    }
    let model = g4c_driver::open_checkpoint(&args.model_dir)?;
    let mut module = g4c_driver::emit(&model, &args.shapes.shapes(), &[])?;
    if let Some(name) = &args.target {
        let target = Target::by_name(name).map_err(anyhow::Error::msg)?;
        let mut dumps = Vec::new();
        let options = args.pipeline.options()?;
        let (_, timings) =
            g4c_driver::run_passes(&mut module, target, &options, args.after.as_deref(), &mut |stage, m| {
                if args.dump_dir.is_some() {
                    dumps.push((format!("{:02}-{stage}.g4c", dumps.len()), g4c_ir::print_module(m)));
                }
            })?;
        if args.timings {
            for t in &timings {
                eprintln!("{:<16} {:>9.2} ms   verify {:>8.2} ms", t.pass, t.seconds * 1e3, t.verify_seconds * 1e3);
            }
            let total: f64 = timings.iter().map(|t| t.seconds + t.verify_seconds).sum();
            eprintln!("{:<16} {:>9.2} ms   (passes and verification)", "total", total * 1e3);
        }
        if let Some(dir) = &args.dump_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (file, text) in dumps {
                let path = dir.join(file);
                std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
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
    if args.plan || args.cuda {
        let target = Target::by_name(args.target.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
        let plan = g4c_passes::plan_module(&module, target)?;
        if args.plan {
            return super::write_stdout(&g4c_ir::plan::print_plan(&plan, true));
        }
        let mut text = String::new();
        for entry in &plan.entries {
            text.push_str(&g4c_codegen::cuda::emit_entry(&plan, entry)?.source);
        }
        return super::write_stdout(&text);
    }
    super::write_stdout(&g4c_ir::print_module(&module))
}
