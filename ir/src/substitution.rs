//! Replacing values by other values: what a pass records when it finds that one value can stand in
//! for another (CSE, folding, dropped converts), applied to operands as instructions are visited in
//! order and to the function's results at the end.

use crate::{FuncResult, Op, ValueId};
use std::collections::HashMap;

#[derive(Default, Debug, Clone)]
pub struct Substitution {
    map: HashMap<ValueId, ValueId>,
}

impl Substitution {
    /// Uses of `old` become uses of `new` from now on.
    pub fn insert(&mut self, old: ValueId, new: ValueId) {
        self.map.insert(old, new);
    }

    pub fn get(&self, v: ValueId) -> ValueId {
        *self.map.get(&v).unwrap_or(&v)
    }

    /// Whether `v` was replaced (its defining instruction is now dead).
    pub fn replaces(&self, v: ValueId) -> bool {
        self.map.contains_key(&v)
    }

    pub fn apply_to_op(&self, op: &mut Op) {
        op.map_operands(|v| self.get(v));
    }

    pub fn apply_to_results(&self, results: &mut [FuncResult]) {
        for r in results {
            r.value = self.get(r.value);
        }
    }
}
