use anyhow::Result;
use clap::Args;
use g4c_driver::ModelSource;
use g4c_runtime::artifact::{Artifact, Manifest};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct InspectArgs {
    /// Artifact directory (written by `g4c compile -o`)
    pub artifact: PathBuf,
    /// Print the manifest as JSON instead
    #[arg(long)]
    pub json: bool,
    /// Also hash the weights file against the manifest's content hash, check every executable's
    /// header and checksum, and a CUDA target's kernel files against theirs and against the plan
    #[arg(long)]
    pub verify: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    // First, so that a directory that is no artifact is named as such.
    let manifest = Artifact::read_manifest(&args.artifact)?;
    if args.verify {
        // Opened as `run` opens it: its config, tokenizer files, target and options read and checked.
        let source = ModelSource::open(&args.artifact, None, Default::default())?;
        let artifact = source.artifact().expect("a directory with a manifest opens as an artifact");
        artifact.verify_weights()?;
        artifact.check_programs(&g4c_driver::stablehlo_programs(&artifact.module)?)?;
        artifact.verify_executables()?;
        if artifact.manifest.cuda.is_some() {
            let plan = g4c_driver::kernel_plan(&artifact.module, source.target)?;
            artifact.cuda_programs(&g4c_driver::cuda_programs(&plan, source.target, false)?.programs)?;
        }
    }
    if args.json {
        return super::write_stdout(&(serde_json::to_string_pretty(&manifest)? + "\n"));
    }
    let mut out = describe(&args.artifact.display().to_string(), &manifest);
    if args.verify {
        out += "verified: the weights match their content hash, the programs the lowering of the IR, and \
                every executable is present and passes its checks\n";
        if manifest.cuda.is_some() {
            out += "verified: every CUDA file matches its content hash, and the CUDA C what this g4c emits \
                    for the kernel plan of the IR\n";
        }
    }
    super::write_stdout(&out)
}

fn describe(path: &str, m: &Manifest) -> String {
    let t = &m.target;
    let c = &m.model.config;
    // The multimodal form (what Gemma 4 publishes and `synth` writes) nests the text model's sizes.
    let text = c.get("text_config").filter(|t| t.is_object()).unwrap_or(c);
    let w = &m.model.weights;
    let r = &m.report;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "artifact  {path} (format {}, g4c {}, created {})",
        m.format_version,
        m.g4c_version,
        utc(m.created_unix)
    );
    let _ = writeln!(
        s,
        "target    {}: {} (compute {})",
        m.target_name(),
        t["description"].as_str().unwrap_or(""),
        t["compute_dtype"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "model     {} ({}, {} layers, hidden {}, vocab {})",
        m.model.source,
        c["model_type"].as_str().unwrap_or("?"),
        text["num_hidden_layers"],
        text["hidden_size"],
        text["vocab_size"]
    );
    let _ = writeln!(
        s,
        "weights   {}: {} tensors, {}, blake3 {}",
        w.file,
        w.tensors,
        super::fmt_bytes(w.bytes),
        &w.blake3[..16.min(w.blake3.len())]
    );
    let _ = writeln!(
        s,
        "shapes    batch {}, prefill lengths {:?}, context {}",
        m.shapes.batch, m.shapes.prefill_lens, m.shapes.context
    );
    let _ = writeln!(s, "passes    {}", m.passes.join(" → "));
    let _ = writeln!(
        s,
        "report    {} KV layers, {} of KV per token, {} of weights on the device, {} on the host",
        r["kv_layers"],
        super::fmt_bytes(r["kv_bytes_per_token"].as_u64().unwrap_or(0)),
        super::fmt_bytes(r["device_weight_bytes"].as_u64().unwrap_or(0)),
        super::fmt_bytes(r["host_weight_bytes"].as_u64().unwrap_or(0)),
    );
    match &m.executables_environment {
        Some(env) => {
            let _ = writeln!(
                s,
                "compiled  for platform {}, PJRT C API {}, plugin {}…",
                env["platform"].as_str().unwrap_or("?"),
                env["api_version"].as_str().unwrap_or("?"),
                env["plugin_hash"].as_str().unwrap_or("?").get(..12).unwrap_or("?"),
            );
        }
        None => {
            let _ = writeln!(s, "compiled  no executables (StableHLO only; compiled where it runs)");
        }
    }
    for e in &m.entries {
        let donated: Vec<&str> = e.donated.iter().filter_map(|d| d.split(" -> ").next()).collect();
        let per_call: Vec<&str> =
            e.inputs.iter().map(String::as_str).filter(|i| !i.starts_with('@') && !donated.contains(i)).collect();
        let weights = e.inputs.iter().filter(|i| i.starts_with('@')).count();
        let results: Vec<&str> = e
            .outputs
            .iter()
            .map(String::as_str)
            .filter(|o| {
                let name = o.split(':').next().unwrap_or("");
                !e.donated.iter().any(|d| d.ends_with(&format!("-> {name}")))
            })
            .collect();
        let _ = writeln!(s, "@{}  {}  {}", e.name, e.program, e.executable.as_deref().unwrap_or("(no executable)"));
        let _ =
            writeln!(s, "    inputs   {} + {} state buffers + {weights} weights", per_call.join(", "), donated.len());
        let _ =
            writeln!(s, "    outputs  {} + the {} state buffers, updated in place", results.join(", "), donated.len());
    }
    s
}

/// `YYYY-MM-DD HH:MM UTC` from Unix seconds (days to civil date: H. Hinnant's algorithm).
fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", secs / 3600, secs % 3600 / 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(super::utc(1_796_237_848), "2026-12-02 18:57 UTC");
    }
}
