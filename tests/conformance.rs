//! Every op, in every element type the targets compute in, on the PJRT CPU plugin against the
//! reference interpreter (`g4c_driver::conformance`).

use g4c_driver::conformance::{cases, check, InterpBackend, PjrtBackend};
use g4c_ir::{DType, TARGETS};

/// The element types some target computes in, and predicates.
fn target_dtypes() -> Vec<DType> {
    let mut dtypes: Vec<DType> = DType::ALL
        .into_iter()
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
    let mut pjrt = PjrtBackend::open(None).unwrap_or_else(|e| panic!("{e:#}"));
    let problems = check(&mut InterpBackend, &mut pjrt, &cases);
    assert!(problems.is_empty(), "{} of {} cases disagree:\n{}", problems.len(), cases.len(), problems.join("\n"));
}
