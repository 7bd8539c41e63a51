//! The programs a backend compiles, from codegen.

use anyhow::Result;
use g4c_ir::Module;
use g4c_runtime::Program;

/// Every entry point of `module` lowered to StableHLO, for the PJRT backend.
pub fn stablehlo_programs(module: &Module) -> Result<Vec<Program>> {
    module
        .functions
        .iter()
        .map(|f| Ok(Program { entry: f.name.clone(), text: g4c_codegen::stablehlo::lower_entry(module, &f.name)? }))
        .collect()
}
