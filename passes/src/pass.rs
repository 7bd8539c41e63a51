//! The pass trait and the ordered pipeline each target runs.

use crate::{ConstantFold, Cse, Dce, DtypeLegalize, HostTables, WeightDtype, WeightLayout};
use g4c_ir::Target;
use g4c_ir::{verify_module, Module};

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("pass `{pass}`: {message}")]
    Failed { pass: &'static str, message: String },
    #[error("pass `{pass}` produced invalid IR: {error}")]
    Invalid { pass: &'static str, error: g4c_ir::VerifyError },
    #[error("no pass named `{0}` in the pipeline (expected one of {1})")]
    UnknownPass(String, String),
}

/// An IR-to-IR transformation that preserves what the module computes (up to f32 rounding).
pub trait Pass {
    /// Name used by `g4c ir --after` and in dump file names.
    fn name(&self) -> &'static str;
    fn run(&self, module: &mut Module, target: &Target) -> Result<(), PassError>;
}

/// The passes a target runs, in order.
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
}

impl Pipeline {
    pub fn for_target(_target: &Target) -> Pipeline {
        Pipeline {
            passes: vec![
                Box::new(HostTables),
                Box::new(DtypeLegalize),
                Box::new(WeightDtype),
                Box::new(WeightLayout),
                Box::new(ConstantFold),
                Box::new(Cse),
                Box::new(Dce),
            ],
        }
    }

    pub fn passes(&self) -> impl Iterator<Item = &dyn Pass> {
        self.passes.iter().map(|p| p.as_ref())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass, verifying the module after each.
    pub fn run_all(&self, module: &mut Module, target: &Target) -> Result<(), PassError> {
        self.run(module, target, None, &mut |_, _| {})
    }

    /// Runs every pass, verifying the module after each, and shows `observe` the module before the
    /// first pass (as `"input"`) and after every pass. Stops after `stop_after` when given.
    pub fn run(
        &self,
        module: &mut Module,
        target: &Target,
        stop_after: Option<&str>,
        observe: &mut dyn FnMut(&str, &Module),
    ) -> Result<(), PassError> {
        if let Some(name) = stop_after {
            if !self.passes.iter().any(|p| p.name() == name) {
                return Err(PassError::UnknownPass(name.to_string(), self.names().join(", ")));
            }
        }
        observe("input", module);
        for pass in &self.passes {
            pass.run(module, target)?;
            verify_module(module).map_err(|error| PassError::Invalid { pass: pass.name(), error })?;
            observe(pass.name(), module);
            if stop_after == Some(pass.name()) {
                break;
            }
        }
        Ok(())
    }
}
