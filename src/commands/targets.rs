use anyhow::Result;
use clap::Args;
use g4c_ir::TARGETS;

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
        "{:<9} {:<5} {:>5} {:>4} {:>10} {:>10} {:>8} {:>9} {:>10}  {:<7} {}\n",
        "target", "kind", "sm", "SMs", "smem/blk", "opt-in", "L2", "memory", "bandwidth", "compute", "math dtypes"
    );
    for t in TARGETS {
        let gpu = t.gpu.as_ref();
        let kib = |f: fn(&g4c_ir::GpuLimits) -> u32| gpu.map_or("-".into(), |g| format!("{} KiB", f(g) / 1024));
        out += &format!(
            "{:<9} {:<5} {:>5} {:>4} {:>10} {:>10} {:>8} {:>9} {:>10}  {:<7} {}\n",
            t.name,
            t.platform.name(),
            gpu.map_or("-".into(), |g| format!("{}.{}", g.compute_capability.0, g.compute_capability.1)),
            gpu.map_or("-".into(), |g| g.sm_count.to_string()),
            kib(|g| g.smem_per_block),
            kib(|g| g.smem_per_block_optin),
            gpu.map_or("-".into(), |g| format!("{} MiB", g.l2_bytes >> 20)),
            t.memory_bytes.map_or("host".into(), |b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64)),
            t.bandwidth_bytes_per_s.map_or("measured".into(), |b| format!("{} GB/s", b / 1_000_000_000)),
            t.compute_dtype.name(),
            t.math_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
        );
    }
    super::write_stdout(&out)
}
