use anyhow::Result;
use clap::Args;
use g4c_passes::TARGETS;

#[derive(Args)]
pub struct TargetsArgs {
    /// Print one JSON array with every property
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: TargetsArgs) -> Result<()> {
    if args.json {
        let all: Vec<serde_json::Value> = TARGETS.iter().map(|t| t.to_json()).collect();
        return super::write_stdout(&format!("{}\n", serde_json::Value::Array(all)));
    }
    let mut out = format!(
        "{:<9} {:<5} {:>5} {:>10} {:>10} {:>9} {:>10}  {:<7} {}\n",
        "target", "kind", "sm", "smem/blk", "opt-in", "memory", "bandwidth", "compute", "math dtypes"
    );
    let kib = |b: Option<u32>| b.map_or("-".into(), |b| format!("{} KiB", b / 1024));
    for t in TARGETS {
        out += &format!(
            "{:<9} {:<5} {:>5} {:>10} {:>10} {:>9} {:>10}  {:<7} {}\n",
            t.name,
            t.platform.name(),
            t.compute_capability.map_or("-".into(), |(a, b)| format!("{a}.{b}")),
            kib(t.smem_per_block),
            kib(t.smem_per_block_optin),
            t.memory_bytes.map_or("host".into(), |b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64)),
            t.bandwidth_bytes_per_s.map_or("measured".into(), |b| format!("{} GB/s", b / 1_000_000_000)),
            t.compute_dtype.name(),
            t.math_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
        );
    }
    super::write_stdout(&out)
}
