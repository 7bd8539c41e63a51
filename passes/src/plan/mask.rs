//! Masks: where a kernel's result is `select(visible, x, c)` with `c` a constant and `visible`
//! not computed from the product or reduction `x` comes from, the kernel need not compute that
//! product where `visible` is false (attention scores of slots a query does not see).

use g4c_ir::{Function, Op, ValueId};

/// The condition of `select(visible, x, c)` with `c` a constant, `x` computed from `product` and
/// `visible` not, when `scores` is that select through ops of one operand (conversions): where
/// `visible` is false, the score is the same whatever the product.
pub(crate) fn mask_of<'f>(
    f: &'f Function,
    op: &dyn Fn(ValueId) -> Option<&'f Op>,
    scores: ValueId,
    product: ValueId,
) -> Option<ValueId> {
    let mut v = scores;
    let (cond, on_false) = loop {
        match op(v)? {
            Op::Convert { x } | Op::Unary { x, .. } => v = *x,
            Op::Select { cond, on_false, .. } => break (*cond, *on_false),
            _ => return None,
        }
    };
    let shaped = f.ty(cond).shape == f.ty(scores).shape && f.ty(v).shape == f.ty(scores).shape;
    let constant = matches!(op(on_false), Some(Op::Constant { .. }));
    (shaped && constant && !reads(op, cond, product)).then_some(cond)
}

/// Whether `v` is computed from `from`.
fn reads<'f>(op: &dyn Fn(ValueId) -> Option<&'f Op>, v: ValueId, from: ValueId) -> bool {
    let (mut stack, mut seen) = (vec![v], std::collections::BTreeSet::new());
    while let Some(v) = stack.pop() {
        if v == from {
            return true;
        }
        if seen.insert(v) {
            stack.extend(op(v).map(Op::operands).unwrap_or_default());
        }
    }
    false
}
