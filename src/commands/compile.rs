use super::ShapeArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use g4c_codegen::stablehlo::lower_entry;
use g4c_frontend::Model;
use g4c_passes::{compile_report, Pipeline, Target};
use g4c_runtime::pjrt::{find_cpu_plugin, Api, Client};
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
    /// Write the StableHLO of every entry point (`<entry>.mlir`) and `report.json` into DIR
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also compile every entry point with the PJRT CPU plugin (for other targets: a well-formedness check)
    #[arg(long)]
    pub check_on_cpu: bool,
    /// Print the compile report as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let target = Target::by_name(&args.target).map_err(anyhow::Error::msg)?;
    let model = Model::open(&args.model_dir)?;
    let mut module = model.module(&args.shapes.shapes())?;
    g4c_ir::verify_module(&module)?;
    let pipeline = Pipeline::for_target(target);
    pipeline.run_all(&mut module, target)?;
    let lowered: Vec<_> = module.functions.iter().map(|f| lower_entry(&module, &f.name)).collect::<Result<_, _>>()?;
    if args.check_on_cpu {
        let Some(plugin) = find_cpu_plugin() else {
            bail!("--check-on-cpu: no PJRT CPU plugin (run scripts/setup or set G4C_PJRT_PLUGIN)");
        };
        let client = Client::new(Api::load(&plugin)?)?;
        for l in &lowered {
            client.compile(l.mlir.as_bytes()).with_context(|| format!("the CPU plugin rejected @{}", l.entry))?;
        }
    }
    let report = compile_report(&module, target, &pipeline.names());
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for l in &lowered {
            super::write_atomic(&dir.join(format!("{}.mlir", l.entry)), l.mlir.as_bytes())?;
        }
        super::write_atomic(&dir.join("report.json"), format!("{report:#}\n").as_bytes())?;
    }
    if args.json {
        super::write_stdout(&format!("{report}\n"))
    } else {
        let kib = report["kv_bytes_per_token"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let gb = |k: &str| report[k].as_u64().unwrap_or(0) as f64 / 1e9;
        let entries: Vec<String> = lowered.iter().map(|l| l.entry.clone()).collect();
        super::write_stdout(&format!(
            "compiled {} for {}: entries {}; {} KV layers, {kib:.1} KiB KV per token; weights {:.2} GB on device, {:.2} GB on host\n",
            args.model_dir.display(),
            target.name,
            entries.join(", "),
            report["kv_layers"],
            gb("device_weight_bytes"),
            gb("host_weight_bytes"),
        ))
    }
}
