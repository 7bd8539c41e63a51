//! IR-to-IR passes. Each pass is a small named type implementing `Pass`;
//! `Pipeline::for_target` lists, in order, the passes enabled for a target. The module is verified
//! after every pass.

mod constant_fold;
mod cse;
mod dce;
mod dtype_legalize;
mod host_tables;
mod int4_storage;
mod linear_reads;
mod pass;
mod plan;
mod quantize;
mod report;
mod split_attention;
mod split_reductions;
mod weight_dtype;
mod weight_layout;

pub use constant_fold::ConstantFold;
pub use cse::Cse;
pub use dce::Dce;
pub use dtype_legalize::DtypeLegalize;
pub use host_tables::HostTables;
pub use int4_storage::Int4Storage;
pub use pass::{pass_by_name, Pass, PassError, PassTiming, Pipeline, PipelineOptions};
pub use plan::{
    attention_arrays, attention_footprint, attention_of, chunk_axis_of, element_row_of, elements_written, footprint,
    groups_per_block, matvec_of, plan_module, prelude_footprint, prelude_launch, prelude_of, reads_per_element,
    reduction_of, rows_sharing_rhs, split_footprint, split_sums_bytes, staged_row_of, Attention, AttentionArrays,
    Footprint, Matvec, PackedWeight, PlanError, PreludeReduction, Reduction, SplitSumsBytes,
};
pub use quantize::Quantize;
pub use report::compile_report;
pub use split_attention::SplitAttention;
pub use split_reductions::SplitReductions;
pub use weight_dtype::WeightDtype;
pub use weight_layout::WeightLayout;
