use super::ShapeArgs;
use crate::ui::{ui, with_feedback};
use anyhow::Result;
use clap::Args;
use g4c_driver::{compile, CompileRequest};
use g4c_ir::Target;
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
    #[command(flatten)]
    pub pipeline: super::PipelineArgs,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let target = Target::by_name(&args.target).map_err(anyhow::Error::msg)?;
    let shapes = args.shapes.shapes();
    let prefill_lens = match &args.prefill_buckets {
        Some(list) => super::parse_buckets(list, shapes.context)?,
        None => vec![shapes.prefill_len],
    };
    let request = CompileRequest {
        model_dir: &args.model_dir,
        target,
        batch: shapes.batch,
        context: shapes.context,
        prefill_lens,
        options: args.pipeline.options()?,
        plugin: args.plugin.clone(),
        check_on_cpu: args.check_on_cpu,
        out: args.out.as_deref(),
    };
    let compiled = with_feedback(|feedback| compile(&request, feedback))?;
    if let Some(check) = &compiled.cpu_check {
        ui().note(&format!("--check-on-cpu: the CPU plugin accepts every entry point ({})", check.describe()));
    }
    let kernels = &compiled.report["kernels"];
    for warning in spill_warnings(kernels) {
        ui().warn(&warning);
    }
    match (&compiled.executables, kernels.is_null()) {
        (Some(summary), _) => ui().note(&format!("executables: {}", summary.describe())),
        (None, false) => ui().note(&cuda_summary(kernels)),
        (None, true) => ui().note(&format!(
            "no PJRT plugin for platform {} here: StableHLO only; executables are compiled where it runs",
            target.platform.name()
        )),
    }
    if let (Some(out), Some(manifest)) = (&args.out, &compiled.artifact) {
        ui().note(&format!(
            "wrote artifact {} ({} of weights)",
            out.display(),
            super::fmt_bytes(manifest.model.weights.bytes)
        ));
    }
    let report = &compiled.report;
    if args.json {
        super::write_stdout(&format!("{report}\n"))
    } else {
        let bytes = |k: &str| super::fmt_bytes(report[k].as_u64().unwrap_or(0));
        let entries: Vec<&str> = compiled.programs.iter().map(|p| p.entry.as_str()).collect();
        super::write_stdout(&format!(
            "compiled {} for {}: entries {}; {} KV layers, {} KV per token; weights {} on device, {} on host\n",
            args.model_dir.display(),
            target.name,
            entries.join(", "),
            report["kv_layers"],
            bytes("kv_bytes_per_token"),
            bytes("device_weight_bytes"),
            bytes("host_weight_bytes"),
        ))
    }
}

/// One line on a CUDA target's kernels: launches and distinct kernels per entry point, what
/// compiled them, and the largest shared memory any launch needs beside the block's limit.
fn cuda_summary(kernels: &serde_json::Value) -> String {
    let entries: Vec<String> = kernels["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let launches = e["launches"].as_array().map_or(0, Vec::len);
            format!("@{} {launches} launches of {} kernels", e["entry"].as_str().unwrap_or("?"), e["functions"])
        })
        .collect();
    let smem = kernels["entries"].as_array().into_iter().flatten().filter_map(|e| e["max_smem_bytes"].as_u64()).max();
    let ptxas_checked = kernels["entries"][0]["launches"][0]["ptxas"].is_object();
    format!(
        "CUDA kernels: {}; PTX for {} by NVRTC {}{}; at most {} of shared memory per block (limit {})",
        entries.join(", "),
        kernels["compute"].as_str().unwrap_or("?"),
        kernels["nvrtc"].as_str().unwrap_or("?"),
        if ptxas_checked { ", cubins by ptxas" } else { " (no ptxas here: no cubins)" },
        super::fmt_bytes(smem.unwrap_or(0)),
        super::fmt_bytes(kernels["limits"]["smem_per_block_optin"].as_u64().unwrap_or(0)),
    )
}

/// One warning per entry point whose kernels ptxas found spilling registers to local memory. They
/// run, but slower than planned: the fit proof accounts for shared memory and each launch's
/// register budget, not for what ptxas makes of a kernel within that budget. ptxas reports a
/// launch's function, which runs every call of the launch: the first is named with its symbol.
fn spill_warnings(kernels: &serde_json::Value) -> Vec<String> {
    let entries = kernels["entries"].as_array().into_iter().flatten();
    entries
        .filter_map(|e| {
            let launches = e["launches"].as_array()?;
            let spilling: Vec<&serde_json::Value> =
                launches.iter().filter(|l| l["ptxas"]["spill_bytes"].as_u64().is_some_and(|b| b > 0)).collect();
            let first = spilling.first()?;
            let most = spilling.iter().filter_map(|l| l["ptxas"]["spill_bytes"].as_u64()).max().unwrap_or(0);
            Some(format!(
                "@{}: {} of {} launches spill registers to local memory (up to {most} bytes stored and loaded; the first, {}, runs {}); they run slower than planned",
                e["entry"].as_str().unwrap_or("?"),
                spilling.len(),
                launches.len(),
                first["symbol"].as_str().unwrap_or("?"),
                first["calls"][0]["kernel"].as_str().unwrap_or("?"),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_spilling_kernel_is_named_in_a_warning() {
        let launch = |kernel: &str, spill: u64| json!({"symbol": format!("g4c_{kernel}"), "calls": [{"kernel": kernel}], "ptxas": {"spill_bytes": spill}});
        let kernels = json!({"entries": [
            {"entry": "prefill", "launches": [launch("prefill.k8", 0), launch("prefill.k35", 104), launch("prefill.k36", 16)]},
            {"entry": "decode", "launches": [launch("decode.k2", 0)]},
        ]});
        let warnings = super::spill_warnings(&kernels);
        assert_eq!(
            warnings,
            ["@prefill: 2 of 3 launches spill registers to local memory (up to 104 bytes stored and loaded; the first, g4c_prefill.k35, runs prefill.k35); they run slower than planned"]
        );
        // Without ptxas, nothing is known and nothing is said.
        assert!(
            super::spill_warnings(&json!({"entries": [{"entry": "decode", "launches": [{"calls": []}]}]})).is_empty()
        );
    }
}
