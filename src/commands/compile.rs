use super::ShapeArgs;
use crate::ui::ui;
use anyhow::{Context, Result};
use clap::Args;
use g4c_frontend::{emit_module_with_prefills, Model};
use g4c_ir::{Platform, Target};
use g4c_passes::{compile_report, Pipeline};
use g4c_runtime::artifact::{check_output_dir, write_artifact, ArtifactSource, ShapeInfo};
use g4c_runtime::pjrt::find_cpu_plugin;
use g4c_runtime::{lower_module, Compiler};
use std::path::PathBuf;

#[derive(Args)]
pub struct CompileArgs {
    /// Checkpoint directory (config.json + safetensors)
    pub model_dir: PathBuf,
    /// Target (see `g4c targets`)
    #[arg(long, default_value = "cpu")]
    pub target: String,
    #[command(flatten)]
    pub shapes: ShapeArgs,
    /// Prefill lengths to compile, increasing: one entry point each (`prefill` for the longest,
    /// `prefill_{T}` for the others), so short prompts are not padded to the longest
    #[arg(long, value_name = "LIST", conflicts_with = "prefill_len")]
    pub prefill_buckets: Option<String>,
    /// Write an artifact to DIR: manifest, IR, StableHLO, weights in the target's dtype and layout,
    /// and the compiled executables when the target's plugin is here (`g4c run DIR` runs it)
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// PJRT plugin that compiles the executables (default for `cpu`: $G4C_PJRT_PLUGIN, else the CPU
    /// plugin scripts/setup installed; other targets compile only with --plugin)
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Also compile every entry point with the PJRT CPU plugin (for other targets: a well-formedness check)
    #[arg(long)]
    pub check_on_cpu: bool,
    /// Print the compile report as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let target = Target::by_name(&args.target).map_err(anyhow::Error::msg)?;
    if let Some(out) = &args.out {
        check_output_dir(out)?;
    }
    let model = Model::open(&args.model_dir)?;
    let mut shapes = args.shapes.shapes();
    let prefill_lens = match &args.prefill_buckets {
        Some(list) => super::parse_buckets(list, shapes.context)?,
        None => vec![shapes.prefill_len],
    };
    let (longest, shorter) = prefill_lens.split_last().expect("at least one length");
    shapes.prefill_len = *longest;
    let mut module = emit_module_with_prefills(&model.config, model.weights.clone(), &shapes, shorter)?;
    g4c_ir::verify_module(&module)?;
    let pipeline = Pipeline::for_target(target);
    pipeline.run_all(&mut module, target)?;
    let lowered = lower_module(&module)?;
    let plugin = args.plugin.clone().or_else(|| (target.platform == Platform::Cpu).then(find_cpu_plugin).flatten());
    if args.check_on_cpu && target.platform != Platform::Cpu {
        let client = super::pjrt::open_client(None)?;
        let compiler = Compiler::new(&client, target.name, "check", None)?;
        for l in &lowered {
            compiler.executable(l).with_context(|| format!("the CPU plugin rejected @{}", l.entry))?;
        }
    }
    let label = args.model_dir.display().to_string();
    let (executables, environment) = match plugin {
        Some(path) => {
            let client = super::pjrt::open_client(Some(path))?;
            super::pjrt::check_platform(&client, target, "compiling for")?;
            let (_, summary) = super::pjrt::executables(&client, lowered.clone(), target.name, &label, None)?;
            ui().note(&format!("executables: {}", summary.describe()));
            let files: Vec<(String, PathBuf)> =
                summary.events.iter().filter_map(|e| e.cache_file().map(|f| (e.entry.clone(), f.clone()))).collect();
            (files, Some(summary.environment.to_json()))
        }
        None => {
            ui().note(&format!(
                "no PJRT plugin for platform {} here: StableHLO only; executables are compiled where it runs",
                target.platform.name()
            ));
            (vec![], None)
        }
    };
    let report = compile_report(&module, target, &pipeline.names());
    if let Some(out) = &args.out {
        let source = ArtifactSource {
            module: &module,
            store: &model.checkpoint,
            model_dir: &args.model_dir,
            lowered: &lowered,
            executables,
            executables_environment: environment,
            target: target.to_json(),
            passes: pipeline.names().iter().map(|p| p.to_string()).collect(),
            report: report.clone(),
            shapes: ShapeInfo { batch: shapes.batch, prefill_lens, context: shapes.context },
        };
        let manifest = write_artifact(out, &source, &ui().progress())?;
        ui().note(&format!(
            "wrote artifact {} ({} of weights)",
            out.display(),
            super::fmt_bytes(manifest.model.weights.bytes)
        ));
    }
    if args.json {
        super::write_stdout(&format!("{report}\n"))
    } else {
        let kib = report["kv_bytes_per_token"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let bytes = |k: &str| super::fmt_bytes(report[k].as_u64().unwrap_or(0));
        let entries: Vec<String> = lowered.iter().map(|l| l.entry.clone()).collect();
        super::write_stdout(&format!(
            "compiled {} for {}: entries {}; {} KV layers, {kib:.1} KiB KV per token; weights {} on device, {} on host\n",
            args.model_dir.display(),
            target.name,
            entries.join(", "),
            report["kv_layers"],
            bytes("device_weight_bytes"),
            bytes("host_weight_bytes"),
        ))
    }
}
