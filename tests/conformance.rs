//! Every op, in every element type the targets compute in, on the PJRT CPU plugin against the
//! reference interpreter (`g4c_driver::conformance`).

use g4c_driver::conformance::{cases, check, InterpBackend, PjrtBackend};
use g4c_ir::{DType, Op, TARGETS};
use std::collections::BTreeSet;

/// The element types some target computes in, and predicates. `i4` is computed in by TPUs and GPUs
/// (4-bit MMA operands) but in the IR it is only ever a weight read by `dequantize`, whose cases
/// cover it; no other op accepts it.
fn target_dtypes() -> Vec<DType> {
    let mut dtypes: Vec<DType> = DType::ALL
        .iter()
        .copied()
        .filter(|d| *d != DType::I4)
        .filter(|d| *d == DType::Bool || TARGETS.iter().any(|t| t.computes_natively(*d)))
        .collect();
    dtypes.sort();
    dtypes
}

#[test]
fn every_op_agrees_between_the_interpreter_and_pjrt() {
    let dtypes = target_dtypes();
    assert_eq!(dtypes, [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I8, DType::Bool]);
    let cases = cases(&dtypes);
    // Every op but `weight` (a module's checkpoint tensor: the goldens cover it) has cases.
    let covered: BTreeSet<&str> =
        cases.iter().filter_map(|c| c.module.functions[0].body.last()).map(|i| i.op.mnemonic()).collect();
    let missing: Vec<&str> =
        Op::all_mnemonics().into_iter().filter(|m| *m != "weight" && !covered.contains(m)).collect();
    assert!(missing.is_empty(), "no conformance case for {missing:?}");
    let mut pjrt = PjrtBackend::open(None).unwrap_or_else(|e| panic!("{e:#}"));
    let problems = check(&mut InterpBackend, &mut pjrt, &cases);
    assert!(problems.is_empty(), "{} of {} cases disagree:\n{}", problems.len(), cases.len(), problems.join("\n"));
}
