//! The pass trait and the pipeline each target runs, built as rustc builds its MIR phases: every pass
//! in one ordered list, each saying whether it is enabled for a target, so a target's pipeline holds
//! exactly the passes that do something there.

use crate::{
    ConstantFold, Cse, Dce, DtypeLegalize, HostTables, Int4Storage, Quantize, SplitAttention, SplitReductions,
    WeightDtype, WeightLayout,
};
use g4c_ir::{verify_module, Module, Target};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("pass `{pass}`: {message}")]
    Failed { pass: &'static str, message: String },
    #[error("pass `{pass}` produced invalid IR: {error}")]
    Invalid { pass: &'static str, error: g4c_ir::VerifyError },
    #[error("no pass named `{0}` (expected one of {1})")]
    UnknownPass(String, String),
    #[error("pass `{pass}` does not run for target {target} (its pipeline: {pipeline})")]
    NotInPipeline { pass: String, target: &'static str, pipeline: String },
}

/// An IR-to-IR transformation that preserves what the module computes (up to the target's rounding).
pub trait Pass {
    /// Name used by `g4c ir --after`, in dump file names and in filetest headers.
    fn name(&self) -> &'static str;
    /// Whether `target`'s pipeline runs this pass (a pass with nothing to do there is left out).
    fn is_enabled(&self, _target: &Target) -> bool {
        true
    }
    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError>;
}

/// What a user asks of a pipeline beyond its target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Quantize linear weights to 4 bits in groups of this many inputs (`--quantize w4a16[:gN]`).
    pub quantize_group: Option<usize>,
    /// Quantize the LM head too, a 4-bit copy of the embedding table it is tied to
    /// (`--quantize w4a16[:gN]+head`); only with `quantize_group`.
    pub quantize_head: bool,
}

impl PipelineOptions {
    /// The options `--quantize` asks for: `w4a16` (groups of 32) or `w4a16:g<N>`, either followed by
    /// `+head`; none without it.
    pub fn from_quantize(quantize: Option<&str>) -> Result<PipelineOptions, String> {
        let Some(text) = quantize else { return Ok(PipelineOptions::default()) };
        let (scheme, quantize_head) = match text.strip_suffix("+head") {
            Some(scheme) => (scheme, true),
            None => (text, false),
        };
        let group = match scheme.split_once(':') {
            None if scheme == "w4a16" => Some(32),
            Some(("w4a16", g)) => {
                g.strip_prefix('g').and_then(|n| n.parse().ok()).filter(|&n: &usize| n > 0 && n.is_multiple_of(8))
            }
            _ => None,
        };
        match group {
            Some(g) => Ok(PipelineOptions { quantize_group: Some(g), quantize_head }),
            None => Err(format!(
                "--quantize: expected w4a16 or w4a16:g<N> with N a multiple of 8 (e.g. w4a16:g64), \
                 optionally followed by +head, found `{text}`"
            )),
        }
    }

    /// How the options name themselves in reports and cache keys (`w4a16:g32`, `w4a16:g32+head`,
    /// or empty).
    pub fn describe(&self) -> String {
        self.quantize().unwrap_or_default()
    }

    /// The `--quantize` value that asks for these options, if any.
    pub fn quantize(&self) -> Option<String> {
        let head = if self.quantize_head { "+head" } else { "" };
        self.quantize_group.map(|g| format!("w4a16:g{g}{head}"))
    }
}

/// Every pass, in the order pipelines run them (`quantize` only when asked for).
fn all_passes(options: &PipelineOptions) -> Vec<Box<dyn Pass>> {
    let head = options.quantize_head;
    let quantize = options.quantize_group.map(|group| Box::new(Quantize { group, head }) as Box<dyn Pass>);
    quantize.into_iter().chain(passes_of_every_pipeline()).collect()
}

fn passes_of_every_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(HostTables),
        Box::new(DtypeLegalize),
        Box::new(WeightDtype),
        Box::new(Int4Storage),
        Box::new(WeightLayout),
        Box::new(SplitAttention),
        Box::new(SplitReductions),
        Box::new(ConstantFold),
        Box::new(Cse),
        Box::new(Dce),
    ]
}

/// The pass named `name` (`quantize` in groups of 32), enabled for some targets or not.
pub fn pass_by_name(name: &str) -> Result<Box<dyn Pass>, PassError> {
    let every = || all_passes(&PipelineOptions { quantize_group: Some(32), quantize_head: false });
    every().into_iter().find(|p| p.name() == name).ok_or_else(|| {
        let names: Vec<&str> = every().iter().map(|p| p.name()).collect();
        PassError::UnknownPass(name.to_string(), names.join(", "))
    })
}

/// How long one pass took, and the verification after it.
#[derive(Clone, Copy, Debug)]
pub struct PassTiming {
    pub pass: &'static str,
    pub seconds: f64,
    pub verify_seconds: f64,
}

/// The passes a target runs, in order.
pub struct Pipeline {
    target: &'static Target,
    passes: Vec<Box<dyn Pass>>,
}

impl Pipeline {
    pub fn for_target(target: &'static Target) -> Pipeline {
        Pipeline::new(target, &PipelineOptions::default())
    }

    pub fn new(target: &'static Target, options: &PipelineOptions) -> Pipeline {
        Pipeline { target, passes: all_passes(options).into_iter().filter(|p| p.is_enabled(target)).collect() }
    }

    pub fn passes(&self) -> impl Iterator<Item = &dyn Pass> {
        self.passes.iter().map(|p| p.as_ref())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass, verifying the module after each.
    pub fn run_all(&self, module: &mut Module) -> Result<Vec<PassTiming>, PassError> {
        self.run(module, None, &mut |_, _| {})
    }

    /// Runs every pass, verifying the module after each, and shows `observe` the module before the
    /// first pass (as `"input"`) and after every pass. Stops after `stop_after` when given.
    pub fn run(
        &self,
        module: &mut Module,
        stop_after: Option<&str>,
        observe: &mut dyn FnMut(&str, &Module),
    ) -> Result<Vec<PassTiming>, PassError> {
        if let Some(name) = stop_after {
            pass_by_name(name)?;
            if !self.passes.iter().any(|p| p.name() == name) {
                return Err(PassError::NotInPipeline {
                    pass: name.to_string(),
                    target: self.target.name,
                    pipeline: self.names().join(", "),
                });
            }
        }
        observe("input", module);
        let mut timings = vec![];
        for pass in &self.passes {
            let started = Instant::now();
            pass.run(module, self.target)?;
            let ran = started.elapsed().as_secs_f64();
            verify_module(module).map_err(|error| PassError::Invalid { pass: pass.name(), error })?;
            let verify_seconds = started.elapsed().as_secs_f64() - ran;
            timings.push(PassTiming { pass: pass.name(), seconds: ran, verify_seconds });
            observe(pass.name(), module);
            if stop_after == Some(pass.name()) {
                break;
            }
        }
        Ok(timings)
    }
}
