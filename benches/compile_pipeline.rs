//! `cargo bench --bench compile_pipeline`: how long each compile step takes for the E2B module (weights
//! declared from the preset's config; no checkpoint needed): emitting the IR, every pass of the `cpu`
//! and `tpu-v6e` pipelines, printing and parsing the IR text, and lowering to StableHLO. XLA's own
//! compilation is measured by `g4c bench` (cold start). Prints the median of a few runs per step.

use g4c_frontend::synth::Preset;
use g4c_frontend::Shapes;
use g4c_ir::Target;
use g4c_passes::Pipeline;
use std::time::{Duration, Instant};

const RUNS: usize = 3;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn time<T>(f: impl Fn() -> T) -> Duration {
    median(
        (0..RUNS)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(f());
                started.elapsed()
            })
            .collect(),
    )
}

fn row(step: &str, d: Duration) {
    println!("{step:<32} {:>10.1} ms", d.as_secs_f64() * 1e3);
}

fn main() {
    let shapes = Shapes { batch: 1, prefill_len: 128, context: 4096 };
    let emit = || Preset::E2b.declared_module(&shapes).expect("the E2B preset emits");
    println!("E2B, prefill 128, context 4096; median of {RUNS} runs");
    row("emit (frontend)", time(emit));
    for name in ["cpu", "tpu-v6e"] {
        let target = Target::by_name(name).expect("a known target");
        let pipeline = Pipeline::for_target(target);
        let mut module = emit();
        for pass in pipeline.passes() {
            let before = module.clone();
            // Includes one clone of the module, as a pass runs in place.
            let took = time(|| {
                let mut m = before.clone();
                pass.run(&mut m, target).expect("the pass runs");
                m
            });
            row(&format!("{name}: {}", pass.name()), took);
            pass.run(&mut module, target).expect("the pass runs");
        }
        let text = g4c_ir::print_module(&module);
        row(&format!("{name}: print IR"), time(|| g4c_ir::print_module(&module)));
        row(&format!("{name}: parse IR"), time(|| g4c_ir::parse_module(&text).expect("parses")));
        row(&format!("{name}: lower to StableHLO"), time(|| g4c_driver::stablehlo_programs(&module).expect("lowers")));
    }
}
