use crate::ui::{ui, with_feedback};
use anyhow::{bail, Result};
use clap::Args;
use g4c_driver::{BackendKind, ModelSource, Session, SessionOptions};
use g4c_frontend::Shapes;
use g4c_runtime::bench::{read_bandwidth, run_once, BenchRun, DecodeTraffic, PlanTraffic};
use serde_json::json;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint directory or artifact
    pub model: PathBuf,
    /// Prompt lengths to measure, comma-separated (default 128; checkpoints compile one prefill of
    /// each length, an artifact uses its own prefill lengths)
    #[arg(long, value_name = "LIST")]
    pub prompt_len: Option<String>,
    /// Tokens generated per run (the first comes from prefill, the rest from decode steps)
    #[arg(long, default_value_t = 32, value_parser = super::sizes::positions)]
    pub gen: usize,
    /// Sequences per call
    #[arg(long, default_value_t = 1, value_parser = super::sizes::batch)]
    pub batch: usize,
    /// Timed runs per prompt length (after one untimed warm-up run)
    #[arg(long, default_value_t = 3, value_parser = super::sizes::repetitions)]
    pub reps: usize,
    /// Positions a sequence may reach (sizes the full-attention caches; default 4096 or the artifact's)
    #[arg(long, value_parser = super::sizes::positions)]
    pub context: Option<usize>,
    /// Execution backend (default: `cuda` for an artifact compiled for a CUDA target, else `pjrt`)
    #[arg(long, value_enum)]
    pub backend: Option<BenchedBackend>,
    /// Target (see `g4c targets`; default `cpu`, or the artifact's own)
    #[arg(long)]
    pub target: Option<String>,
    /// PJRT plugin (default: $G4C_PJRT_PLUGIN, else the CPU plugin scripts/setup installed)
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,
    /// Run nothing: print the decode roofline the CUDA kernel plan implies on each CUDA target's
    /// datasheet bandwidth (bytes per step of weights, KV and activations, and tok/s), for t4g and
    /// h200, or --target, or an artifact's own target
    #[arg(long)]
    pub project: bool,
    #[command(flatten)]
    pub pipeline: super::PipelineArgs,
}

/// Mean and sample standard deviation.
fn stats(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Startup of one configuration, split into its parts.
struct Startup {
    /// Compiling every entry point with no cache (the first run ever).
    cold_compile: f64,
    /// Loading every entry point from the cache (every later run).
    warm_load: f64,
    /// Loading and uploading the weights.
    weights: f64,
}

/// The bytes one decode step moves, by part (JSON key, what it is, bytes): what the roofline divides
/// the memory bandwidth by.
#[derive(Default)]
struct StepBytes(Vec<(&'static str, &'static str, u64)>);

impl StepBytes {
    fn total(&self) -> u64 {
        self.0.iter().map(|p| p.2).sum()
    }

    /// What the StableHLO module reads: its weights, caches and host rows (PJRT).
    fn of_module(t: DecodeTraffic) -> StepBytes {
        StepBytes(vec![
            ("weight_bytes", "weights", t.weight_bytes),
            ("state_bytes", "KV caches and positions", t.state_bytes),
            ("host_row_bytes", "host rows", t.host_row_bytes),
        ])
    }

    /// What the kernel plan's launches move, activations between kernels included (CUDA).
    fn of_plan(t: PlanTraffic) -> StepBytes {
        StepBytes(vec![
            ("weight_bytes", "weights", t.bytes.weight_bytes),
            ("state_bytes", "KV caches and positions", t.bytes.kv_bytes),
            ("activation_bytes", "activations", t.bytes.activation_bytes),
        ])
    }
}

/// The backends `bench` measures: the others (the interpreter, and the CUDA kernels' checks on the
/// CPU) are for checking what is computed, not how fast.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum BenchedBackend {
    /// StableHLO compiled and run by a PJRT plugin
    Pjrt,
    /// A CUDA target's kernels on GPU 0 through the CUDA driver
    Cuda,
}

impl BenchedBackend {
    fn backend(self) -> super::Backend {
        match self {
            BenchedBackend::Pjrt => super::Backend::Pjrt,
            BenchedBackend::Cuda => super::Backend::Cuda,
        }
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.project {
        return project(&args);
    }
    let backend = super::backend_for(args.backend.map(BenchedBackend::backend), &args.model)?;
    super::note_cpu_emulation(backend, args.target.as_deref(), args.plugin.is_some());
    let options = SessionOptions {
        backend,
        target: args.target.clone(),
        plugin: args.plugin.clone(),
        pipeline: args.pipeline.options()?,
        ..Default::default()
    };
    let session = Session::open(&args.model, options)?;
    let source = &session.source;
    let lengths: Vec<usize> = args
        .prompt_lens()
        .split(',')
        .map(super::sizes::positions)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--prompt-len `{}`: {e}", args.prompt_lens()))?;
    if let Some(twice) = lengths.iter().enumerate().find_map(|(i, l)| lengths[..i].contains(l).then_some(l)) {
        bail!("--prompt-len `{}`: {twice} is given twice; each length is measured once", args.prompt_lens());
    }
    let fixed = source.fixed_shapes();
    if let Some(s) = &fixed {
        if args.batch != s.batch {
            bail!("--batch {}: artifact {} was compiled for batch {}", args.batch, source.label, s.batch);
        }
    }
    let context = source.context(args.context, 4096)?;
    // The runs' decode steps' mean position, which bounds what a CUDA plan's attention reads.
    let decode_position = lengths.iter().map(|&l| l + args.gen.saturating_sub(1) / 2).sum::<usize>() / lengths.len();

    let mut rows = vec![];
    let mut roofline = None;
    // Whether the host ran it (the CPU plugin runs other targets' modules too): then its memory
    // bandwidth bounds decode, not the target's datasheet.
    let mut on_host = false;
    for &prompt_len in &lengths {
        // Both are at most MAX_CONTEXT (sizes::positions), so the sum cannot overflow.
        if prompt_len + args.gen > context {
            let given = if args.prompt_len.is_some() { "" } else { " (the default; give a shorter one)" };
            bail!("--prompt-len {prompt_len}{given} plus --gen {} exceeds the context of {context}", args.gen);
        }
        let prefill_len = fixed.as_ref().map_or(prompt_len, |s| s.longest_prefill());
        let module = session.module(&Shapes { batch: args.batch, prefill_len, context })?;
        ui().note(&format!("prompt length {prompt_len}: measuring startup"));
        let mut ready = with_feedback(|feedback| session.executor(module.clone(), feedback))?;
        // A CUDA artifact's kernels are compiled ahead: every start loads them the same way.
        let (cold_compile, warm_load) = match backend {
            BackendKind::Pjrt => session.compile_times(&module)?,
            _ => {
                let load = ready.total_seconds - ready.weights_seconds;
                (load, load)
            }
        };
        let startup = Startup { cold_compile, warm_load, weights: ready.weights_seconds };
        ui().note(&format!("prompt length {prompt_len}: {} timed runs", args.reps));
        let exec = ready.executor.as_mut();
        run_once(exec, prompt_len, args.gen, 0)?; // warm-up
        let runs: Vec<BenchRun> =
            (0..args.reps).map(|r| run_once(exec, prompt_len, args.gen, r as u64 + 1)).collect::<Result<_, _>>()?;
        if roofline.is_none() {
            roofline = match backend {
                BackendKind::Cuda => {
                    let plan = g4c_driver::kernel_plan(&module, source.target)?;
                    PlanTraffic::of(&plan, &module, Some(decode_position)).map(StepBytes::of_plan)
                }
                _ => DecodeTraffic::of(&module).map(StepBytes::of_module),
            };
        }
        on_host = ready.platform.eq_ignore_ascii_case("cpu");
        rows.push((prompt_len, runs, startup));
    }
    // Before the bandwidth probe, whose buffer would count.
    let peak = super::peak_memory();
    let traffic = roofline.unwrap_or_default();
    // On a GPU, its own bandwidth: a t4g artifact may run on an H200.
    let gpu = matches!(backend, BackendKind::Cuda).then(g4c_runtime::backend::cuda::cuda_memory_bandwidth).flatten();
    let (bandwidth, bandwidth_source) = match (gpu, source.target.bandwidth_bytes_per_s) {
        (Some(b), _) => (b, "GPU 0's memory clock × bus width"),
        (None, Some(b)) if !on_host => (b as f64, "datasheet"),
        _ => {
            ui().note("measuring host memory bandwidth");
            (read_bandwidth(1 << 30, 5), "measured (1 GiB read, all cores)")
        }
    };
    // A kernel plan's attention reads what the position reaches; XLA's reads every slot.
    let position = matches!(backend, BackendKind::Cuda).then_some(decode_position);
    let report = Report { args: &args, backend, source, rows, traffic, position, bandwidth, bandwidth_source, peak };
    if args.json {
        super::write_stdout(&format!("{}\n", report.json()))
    } else {
        super::write_stdout(&report.table())
    }
}

struct Report<'a> {
    args: &'a BenchArgs,
    backend: BackendKind,
    source: &'a ModelSource,
    rows: Vec<(usize, Vec<BenchRun>, Startup)>,
    traffic: StepBytes,
    /// The decode position the traffic's KV bytes are counted at, where they depend on it.
    position: Option<usize>,
    bandwidth: f64,
    bandwidth_source: &'static str,
    peak: Option<u64>,
}

impl Report<'_> {
    fn decode_rate(&self) -> f64 {
        let all: Vec<f64> =
            self.rows.iter().flat_map(|(_, runs, _)| runs.iter().map(|r| r.decode_tokens_per_second())).collect();
        stats(&all).0
    }

    fn roofline_rate(&self) -> f64 {
        self.bandwidth / self.traffic.total().max(1) as f64 * self.args.batch as f64
    }

    fn table(&self) -> String {
        let a = self.args;
        let mut s = String::new();
        s += &format!(
            "model {} | target {} | backend {} | batch {} | {} runs each\n\n",
            self.source.label,
            self.source.target.name,
            self.backend.name(),
            a.batch,
            a.reps
        );
        let mut table = vec![[
            "test".to_string(),
            "tok/s".into(),
            "time to first token".into(),
            "cold start".into(),
            "warm start".into(),
        ]];
        for (prompt_len, runs, st) in &self.rows {
            let (pp, pp_sd) = stats(&runs.iter().map(BenchRun::prefill_tokens_per_second).collect::<Vec<_>>());
            let (tg, tg_sd) = stats(&runs.iter().map(BenchRun::decode_tokens_per_second).collect::<Vec<_>>());
            let (ttft, ttft_sd) = stats(&runs.iter().map(|r| r.prefill_seconds * 1e3).collect::<Vec<_>>());
            table.push([
                format!("pp{prompt_len}"),
                format!("{pp:.1} ± {pp_sd:.1}"),
                format!("{ttft:.1} ± {ttft_sd:.1} ms"),
                format!("{:.2} s", st.cold_compile + st.weights),
                format!("{:.2} s", st.warm_load + st.weights),
            ]);
            table.push([
                format!("tg{}", a.gen),
                format!("{tg:.2} ± {tg_sd:.2}"),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        let widths: Vec<usize> =
            (0..5).map(|c| table.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        for (i, row) in table.iter().enumerate() {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, &w))| if c == 0 { format!("{cell:<w$}") } else { format!("{cell:>w$}") })
                .collect();
            s += &format!("| {} |\n", cells.join(" | "));
            if i == 0 {
                let rules: Vec<String> = widths
                    .iter()
                    .enumerate()
                    .map(|(c, &w)| if c == 0 { "-".repeat(w) } else { format!("{}:", "-".repeat(w - 1)) })
                    .collect();
                s += &format!("| {} |\n", rules.join(" | "));
            }
        }
        let rate = self.decode_rate();
        let max = self.roofline_rate();
        // What a start is made of.
        let startup = match self.backend {
            BackendKind::Pjrt => "cold = compile with no cache + weights, warm = load from the cache + weights",
            _ => "the kernel plan, its programs (an artifact's compiled ahead, a checkpoint's by NVRTC: cold and warm alike) and the device's modules (PTX for another GPU JIT-compiled by the driver) + weights",
        };
        s += &format!(
            "\nstartup: {startup} ({} for weights)\n",
            self.rows.first().map_or("?".into(), |(_, _, st)| format!("{:.2} s", st.weights))
        );
        let parts: Vec<String> =
            self.traffic.0.iter().map(|(_, what, bytes)| format!("{} {what}", super::fmt_bytes(*bytes))).collect();
        let at = self.position.map_or(String::new(), |p| format!(" at position {p}"));
        s += &format!(
            "decode roofline: {} per step{at} ({}) / {:.1} GB/s {} = {max:.2} tok/s at most; measured {rate:.2} tok/s = {:.0}% of it\n",
            super::fmt_bytes(self.traffic.total()),
            parts.join(" + "),
            self.bandwidth / 1e9,
            self.bandwidth_source,
            100.0 * rate / max,
        );
        s += &format!("peak memory: {}\n", self.peak.map_or("unknown".into(), super::fmt_bytes));
        s
    }

    fn json(&self) -> serde_json::Value {
        let ms = |xs: Vec<f64>| {
            let (mean, std) = stats(&xs);
            json!({"mean": mean, "std": std})
        };
        let results: Vec<_> = self
            .rows
            .iter()
            .map(|(prompt_len, runs, st)| {
                json!({
                    "prompt_len": prompt_len,
                    "gen": self.args.gen,
                    "prefill_tok_s": ms(runs.iter().map(BenchRun::prefill_tokens_per_second).collect()),
                    "decode_tok_s": ms(runs.iter().map(BenchRun::decode_tokens_per_second).collect()),
                    "ttft_ms": ms(runs.iter().map(|r| r.prefill_seconds * 1e3).collect()),
                    "startup": {
                        "cold_s": st.cold_compile + st.weights,
                        "warm_s": st.warm_load + st.weights,
                        "compile_s": st.cold_compile,
                        "cache_load_s": st.warm_load,
                        "weights_s": st.weights,
                    },
                })
            })
            .collect();
        let mut roofline = serde_json::Map::new();
        roofline.insert("bytes_per_step".into(), json!(self.traffic.total()));
        if let Some(p) = self.position {
            roofline.insert("kv_position".into(), json!(p));
        }
        for (key, _, bytes) in &self.traffic.0 {
            roofline.insert(key.to_string(), json!(bytes));
        }
        roofline.insert("bandwidth_bytes_per_s".into(), json!(self.bandwidth));
        roofline.insert("bandwidth_source".into(), json!(self.bandwidth_source));
        roofline.insert("max_decode_tok_s".into(), json!(self.roofline_rate()));
        roofline.insert("decode_tok_s".into(), json!(self.decode_rate()));
        roofline.insert("fraction".into(), json!(self.decode_rate() / self.roofline_rate()));
        json!({
            "model": self.source.label,
            "target": self.source.target.name,
            "backend": self.backend.name(),
            "batch": self.args.batch,
            "reps": self.args.reps,
            "results": results,
            "peak_memory_bytes": self.peak,
            "roofline": roofline,
        })
    }
}

impl BenchArgs {
    /// `--prompt-len`, or its default.
    fn prompt_lens(&self) -> &str {
        self.prompt_len.as_deref().unwrap_or("128")
    }
}

/// `--project`: per CUDA target, the plan's bytes per decode step and the tok/s its bandwidth allows.
fn project(args: &BenchArgs) -> Result<()> {
    let targets: Vec<String> = match (&args.target, g4c_runtime::artifact::is_artifact(&args.model)) {
        (Some(t), _) => vec![t.clone()],
        (None, true) => vec![g4c_runtime::artifact::Artifact::read_manifest(&args.model)?.target_name().to_string()],
        (None, false) => vec!["t4g".into(), "h200".into()],
    };
    let prefill_len =
        args.prompt_lens().split(',').next().map(super::sizes::positions).transpose().map_err(anyhow::Error::msg)?;
    let mut rows = Vec::new();
    for name in &targets {
        let source = ModelSource::open(&args.model, Some(name), args.pipeline.options()?)?;
        let target = source.target;
        let Some(bandwidth) = target.bandwidth_bytes_per_s.filter(|_| target.gpu.is_some()) else {
            bail!("--project: target {name} is not a CUDA target with a datasheet bandwidth");
        };
        let shapes = match source.fixed_shapes() {
            Some(s) => Shapes { batch: s.batch, prefill_len: s.longest_prefill(), context: s.context },
            None => {
                let (prefill_len, context) = (prefill_len.unwrap_or(128), args.context.unwrap_or(4096));
                if prefill_len > context {
                    bail!("--prompt-len {prefill_len} (the prefill length, which sizes the sliding caches) exceeds --context {context}");
                }
                Shapes { batch: args.batch, prefill_len, context }
            }
        };
        let module = source.module(&shapes)?;
        let plan = g4c_driver::kernel_plan(&module, target)?;
        let traffic = PlanTraffic::of(&plan, &module, None)
            .ok_or_else(|| anyhow::anyhow!("the module has no decode entry point"))?;
        let tok_s = bandwidth as f64 / traffic.total().max(1) as f64 * shapes.batch as f64;
        rows.push((name.clone(), bandwidth, shapes, traffic, tok_s));
    }
    if args.json {
        let out: Vec<_> = rows
            .iter()
            .map(|(name, bw, s, t, tok_s)| {
                json!({"target": name, "bandwidth_bytes_per_s": bw, "batch": s.batch, "context": s.context,
                       "weight_bytes": t.bytes.weight_bytes, "kv_bytes": t.bytes.kv_bytes, "activation_bytes": t.bytes.activation_bytes,
                       "bytes_per_step": t.total(), "launches": t.launches, "tokens_per_s": tok_s})
            })
            .collect();
        return super::write_stdout(&format!("{}\n", json!({"projection": out})));
    }
    let mut text =
        String::from("decode roofline of the CUDA kernel plan (DRAM bytes per step at the context's end, every KV chunk read; L2 hits not modelled)\n");
    text.push_str("target   bandwidth   weights    KV         activations  per step   launches  tok/s\n");
    for (name, bw, s, t, tok_s) in &rows {
        let b = |x: u64| super::fmt_bytes(x);
        text.push_str(&format!(
            "{name:<8} {:>9}/s {:>9}  {:>9}  {:>11}  {:>9}  {:>8}  {tok_s:.1} (batch {}, context {})\n",
            b(*bw),
            b(t.bytes.weight_bytes),
            b(t.bytes.kv_bytes),
            b(t.bytes.activation_bytes),
            b(t.total()),
            t.launches,
            s.batch,
            s.context
        ));
    }
    super::write_stdout(&text)
}
