//! `cargo bench --bench cuda_host_step [-- MODEL_DIR [TARGET]]`: the host's share of a CUDA step.
//! The device executor drives a device that does nothing (`Idle`: buffers are numbers, uploads and
//! launches return at once, downloads are zeros), so what is timed is what the host does per call,
//! whatever the GPU: binding the inputs (the per-layer-embedding rows gathered on the host), the
//! launch sequence's bookkeeping, copying back the greedy token. A GPU's step can be no shorter.
//! The tiny golden model by default; E2B when given its directory (`g4c synth --preset e2b-qat`).
//! The weights are read and uploaded once, untimed.

use g4c_frontend::{Model, Shapes};
use g4c_ir::Target;
use g4c_passes::Pipeline;
use g4c_runtime::backend::cuda::{Buffer, Device, DeviceExecutor, LaunchSequence};
use g4c_runtime::{generate, GenerateOptions};
use std::path::PathBuf;
use std::sync::Arc;

const PROMPT: [u32; 4] = [2, 105, 236, 107];
const NEW_TOKENS: usize = 64;

/// A device that keeps nothing and runs nothing.
struct Idle {
    buffers: usize,
    launches: u64,
}

impl Device for Idle {
    fn alloc(&mut self, _: usize) -> g4c_runtime::Result<Buffer> {
        self.buffers += 1;
        Ok(self.buffers)
    }
    fn upload_at(&mut self, _: Buffer, _: usize, _: &[u8]) -> g4c_runtime::Result<()> {
        Ok(())
    }
    fn download(&mut self, _: Buffer, bytes: usize) -> g4c_runtime::Result<Vec<u8>> {
        Ok(vec![0; bytes])
    }
    fn copy(&mut self, _: Buffer, _: Buffer, _: usize) -> g4c_runtime::Result<()> {
        Ok(())
    }
    fn run(&mut self, sequence: &LaunchSequence) -> g4c_runtime::Result<()> {
        self.launches += sequence.launches.len() as u64;
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = match args.first() {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/tiny-qat/published"),
    };
    let target = Target::by_name(args.get(1).map_or("h200", String::as_str)).map_err(anyhow::Error::msg)?;
    let model = Model::open(&dir)?;
    let mut module = model.module(&Shapes { batch: 1, prefill_len: PROMPT.len(), context: 4096 })?;
    Pipeline::for_target(target).run_all(&mut module)?;
    let plan = Arc::new(g4c_driver::kernel_plan(&module, target)?);
    let programs = g4c_driver::cuda_programs(&plan, target, false)?.programs;
    let device = Idle { buffers: 0, launches: 0 };
    let mut exec = DeviceExecutor::new(Arc::new(module), plan.clone(), &programs, model.checkpoint.clone(), device)?;
    let opts = GenerateOptions { max_new_tokens: NEW_TOKENS, ignore_eos: true, ..Default::default() };
    generate(&mut exec, &PROMPT, &opts, &mut |_| {})?;
    let mut steps = Vec::new();
    for _ in 0..5 {
        let run = generate(&mut exec, &PROMPT, &opts, &mut |_| {})?;
        steps.push(run.timings.decode_seconds / (run.generated_ids.len() - 1) as f64);
    }
    steps.sort_by(f64::total_cmp);
    let launches = plan.entry("decode").map_or(0, |e| e.launches().count());
    println!(
        "{} on {}: host time per decode step {:.1} µs (median of 5 runs of {} steps; fastest {:.1} µs), {} launches a step",
        dir.display(),
        target.name,
        steps[2] * 1e6,
        NEW_TOKENS - 1,
        steps[0] * 1e6,
        launches
    );
    Ok(())
}
