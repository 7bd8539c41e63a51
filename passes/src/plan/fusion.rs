//! Fusion: which values of an entry point are materialized (written to memory by a kernel) and which
//! are computed inside the kernels that read them, as XLA's loop and input fusion decide it.
//!
//! A kernel computes one materialized value (its root) element by element; every value it needs
//! that is not materialized is computed inside it, at the elements it is read at. So:
//!
//! - results and cache writes (`update_slots`, in place) are always materialized;
//! - weights, constants, `iota` and anything computed from them alone are never materialized (a
//!   dequantized 4-bit weight is dequantized inside the matrix product reading it);
//! - a matrix product, reduction or gather is computed inside its reader only if each of its
//!   elements is then computed once: its readers are elementwise (epilogue fusion: a residual add,
//!   GELU(gate)·up with both products in one kernel; a matrix product's only at its own index, as
//!   its templates apply an epilogue, not through a concatenation or transpose); otherwise it is
//!   materialized, and so is one a reduction reads (inside it, whole inner reductions would run
//!   one after another in the threads the outer one is split over: `split-reductions` makes such
//!   pairs to spread one long row over the GPU);
//! - a value read more than once is materialized when products reach it through elementwise ops
//!   only, so that they are computed once, inside its kernel, as its epilogue;
//! - other elementwise ops and index maps are computed wherever they are read (a norm's scaling
//!   inside the next matrix product's prologue), unless that recomputes more than
//!   `RECOMPUTE_LIMIT` arithmetic ops per element, a sine or cosine counting `TRIG_COST` (the
//!   residual stream is then materialized, not recomputed through every layer; so are RoPE's
//!   tables, computed once per step), or `RECOMPUTE_LIMIT_IN_ATTENTION` inside a product of two
//!   activations (a query's norm and RoPE would be recomputed for every cache slot), unless the
//!   product is a matvec, which stages its activation once per block (a decode step's queries
//!   against the key cache), or reads each activation element once per warp (the probabilities of
//!   attention's weighted sum of values, for 32 of a head's features at a time); a value read only
//!   into a matvec's staged activation is computed once per block and element, so it may take up
//!   to `RECOMPUTE_LIMIT_STAGED` (a decode step's queries, normed and rotated where the scores'
//!   matvec stages them).

use super::attention::attention_at;
use super::kind::{lhs_warp_uniform, matvec_shaped};
use g4c_ir::plan::MATVEC_MAX_ROWS;
use g4c_ir::{DotDims, Function, Op, UnaryOp, ValueId};
use std::collections::{BTreeSet, HashMap};

/// Arithmetic ops a value may take to be recomputed at each of its reads.
const RECOMPUTE_LIMIT: usize = 8;
/// The same for an operand of a product of two activations (attention), which recomputes it for
/// every element of the other side (every cache slot): a matvec's activation is staged once per
/// block, a cache is not.
const RECOMPUTE_LIMIT_IN_ATTENTION: usize = 2;
/// The same for a value read only into a matvec's staged activation, computed once per block and
/// element (a decode step's queries: their norm and RoPE, in the scores' matvec), however many
/// columns read it.
const RECOMPUTE_LIMIT_STAGED: usize = 32;

/// A kernel: its root, the instructions it computes (in body order) and the values it reads.
pub(crate) struct Group {
    pub root: ValueId,
    pub instrs: Vec<usize>,
    /// Parameters of the entry point and materialized values, in order of first read.
    pub inputs: Vec<ValueId>,
}

fn is_heavy(op: &Op) -> bool {
    matches!(op, Op::DotGeneral { .. } | Op::Reduce { .. } | Op::Gather { .. })
}

/// Whether `op` reads operand `pos` at its own element's index.
fn reads_aligned(op: &Op, pos: usize) -> bool {
    match op {
        Op::Unary { .. } | Op::Binary { .. } | Op::Compare { .. } | Op::Select { .. } | Op::Convert { .. } => true,
        Op::Reshape { .. } => true,
        Op::Dequantize { .. } => pos == 0,
        // A cache write iterates over its updates.
        Op::UpdateSlots { .. } => pos == 2,
        _ => false,
    }
}

/// Whether `op` reads each element of operand `pos` at most once over all its own elements.
fn reads_once(op: &Op, pos: usize) -> bool {
    // A reduction reads each input element for exactly one output element.
    reads_aligned(op, pos)
        || matches!(op, Op::Transpose { .. } | Op::Slice { .. } | Op::Concat { .. } | Op::Reduce { .. })
}

/// What a sine or cosine costs against an arithmetic op: a range reduction and a polynomial, tens
/// of instructions, behind a branch to a slow path (which also keeps a kernel's loads from being
/// issued ahead of it). RoPE's are computed once per step (from the positions alone) and read by
/// every layer's queries and keys: recomputed, every block of every attention kernel took its
/// own sines and cosines of every element it staged.
const TRIG_COST: usize = 16;

/// Ops that cost arithmetic per element (index maps and conversions cost none).
fn arithmetic(op: &Op) -> usize {
    match op {
        Op::Unary { op: UnaryOp::Sin | UnaryOp::Cos, .. } => TRIG_COST,
        Op::Unary { .. } | Op::Binary { .. } | Op::Compare { .. } | Op::Select { .. } | Op::Dequantize { .. } => 1,
        _ => 0,
    }
}

/// Facts about the values of one function that fusion decides from.
struct Graph<'f> {
    f: &'f Function,
    /// The instruction defining each value (`None`: a parameter).
    def: Vec<Option<usize>>,
    /// Each value's readers: (instruction, operand position).
    users: Vec<Vec<(usize, usize)>>,
    is_result: Vec<bool>,
    /// Values computed from weights, constants and iotas alone.
    free: Vec<bool>,
    /// Values a matrix product, reduction or gather reaches through aligned reads only: it could be
    /// computed inside the value's kernel, as an epilogue.
    epilogue_of_heavy: Vec<bool>,
}

impl<'f> Graph<'f> {
    fn new(f: &'f Function) -> Self {
        let n = f.values.len();
        let mut def = vec![None; n];
        let mut users: Vec<Vec<(usize, usize)>> = vec![vec![]; n];
        for (i, instr) in f.body.iter().enumerate() {
            def[instr.result.index()] = Some(i);
            for (pos, v) in instr.op.operands().into_iter().enumerate() {
                users[v.index()].push((i, pos));
            }
        }
        let mut is_result = vec![false; n];
        f.results.iter().for_each(|r| is_result[r.value.index()] = true);
        let mut free = vec![false; n];
        let mut epilogue_of_heavy = vec![false; n];
        for instr in &f.body {
            let v = instr.result.index();
            free[v] = match &instr.op {
                Op::Weight { .. } | Op::Constant { .. } | Op::Iota { .. } => true,
                op if is_heavy(op) || matches!(op, Op::UpdateSlots { .. }) => false,
                op => op.operands().iter().all(|o| free[o.index()]),
            };
            if is_heavy(&instr.op) || free[v] {
                continue;
            }
            epilogue_of_heavy[v] = instr.op.operands().iter().enumerate().any(|(pos, o)| {
                let producer = def[o.index()].map(|i| &f.body[i].op);
                reads_aligned(&instr.op, pos)
                    && (producer.is_some_and(is_heavy) || (epilogue_of_heavy[o.index()] && !free[o.index()]))
            });
        }
        Graph { f, def, users, is_result, free, epilogue_of_heavy }
    }

    /// Backwards: which kernels read each value, whether each of its elements is computed once
    /// there (`once`) and at the index of the kernel's own element (`aligned`), and so whether it is
    /// materialized. A value read more than once that products reach as an epilogue is materialized
    /// (unless in `no_epilogue`), so that they are computed once inside its kernel (GELU(gate)·up
    /// before the down projection). Returns the materialized values and the `once` ones.
    fn decide(&self, no_epilogue: &BTreeSet<ValueId>) -> (Vec<bool>, Vec<bool>) {
        let n = self.f.values.len();
        let mut materialized = vec![false; n];
        let mut kernels: Vec<BTreeSet<ValueId>> = vec![BTreeSet::new(); n];
        let mut aligned = vec![false; n];
        let mut once = vec![false; n];
        for instr in self.f.body.iter().rev() {
            let v = instr.result;
            let mut ks = BTreeSet::new();
            let (mut all_aligned, mut single_once) = (true, false);
            for &(u, pos) in &self.users[v.index()] {
                let user = &self.f.body[u];
                ks.extend(kernels[user.result.index()].iter().copied());
                all_aligned &= aligned[user.result.index()] && reads_aligned(&user.op, pos);
                single_once = once[user.result.index()] && reads_once(&user.op, pos);
            }
            let one_kernel = ks.len() == 1;
            let al = one_kernel && all_aligned;
            let on = al || (one_kernel && self.users[v.index()].len() == 1 && single_once);
            let epilogue_root = self.epilogue_of_heavy[v.index()] && !no_epilogue.contains(&v);
            let reduced = self.users[v.index()].iter().any(|&(u, _)| matches!(self.f.body[u].op, Op::Reduce { .. }));
            // A matrix product's templates apply its kernel's ops at each output they compute
            // (an epilogue): one read through an index map (a concatenation, a transpose) is
            // materialized, since no template computes it there.
            let product = matches!(instr.op, Op::DotGeneral { .. });
            let root = self.is_result[v.index()]
                || matches!(instr.op, Op::UpdateSlots { .. })
                || (is_heavy(&instr.op) && (!on || reduced || (product && !al)) && !self.free[v.index()])
                || (epilogue_root && !on);
            materialized[v.index()] = root;
            kernels[v.index()] = if root { BTreeSet::from([v]) } else { ks };
            aligned[v.index()] = root || al;
            once[v.index()] = root || on;
        }
        (materialized, once)
    }

    /// Whether the kernel of `root` would compute a matrix product, reduction or gather.
    fn computes_heavy(&self, root: ValueId, materialized: &[bool]) -> bool {
        let mut stack: Vec<ValueId> = self.f.body[self.def[root.index()].expect("an instruction")].op.operands();
        while let Some(v) = stack.pop() {
            let Some(i) = self.def[v.index()] else { continue };
            if materialized[v.index()] {
                continue;
            }
            if is_heavy(&self.f.body[i].op) {
                return true;
            }
            stack.extend(self.f.body[i].op.operands());
        }
        false
    }
}

/// The kernels of `f`, in the order they run.
pub(crate) fn partition(f: &Function) -> Vec<Group> {
    let g = Graph::new(f);
    let n = f.values.len();
    let (def, free) = (&g.def, &g.free);
    // A value materialized for an epilogue whose products were materialized anyway (read elsewhere
    // too) gains nothing: decide again without it, until every such value keeps one.
    let mut no_epilogue = BTreeSet::new();
    let (mut materialized, mut once) = loop {
        let (materialized, once) = g.decide(&no_epilogue);
        let pointless: Vec<ValueId> = f
            .body
            .iter()
            .map(|i| i.result)
            .filter(|v| {
                materialized[v.index()]
                    && g.epilogue_of_heavy[v.index()]
                    && !g.is_result[v.index()]
                    && !no_epilogue.contains(v)
                    && !g.computes_heavy(*v, &materialized)
            })
            .collect();
        if pointless.is_empty() {
            break (materialized, once);
        }
        no_epilogue.extend(pointless);
    };

    // A chunk of attention (`split-attention`) is one kernel, from the scores' product to the
    // chunk's results: each of its blocks computes its chunk's scores, their maximum, sum and
    // exponentials once, in shared memory, and its weighted sums in registers.
    // Only where the template applies: the key cache read from memory, and every value of the
    // chunk read inside it.
    let index: HashMap<ValueId, usize> = f.body.iter().enumerate().map(|(i, x)| (x.result, i)).collect();
    for instr in f.body.iter().filter(|i| matches!(i.op, Op::Concat { .. })) {
        let Some(a) = attention_at(f, &index, instr.result) else { continue };
        let keys = a.scores.dots[0].1;
        let values = chunk_values(f, def, instr.result, a.scores.dots[0].0);
        let inside = |v: &ValueId| {
            *v == instr.result || g.users[v.index()].iter().all(|&(u, _)| values.contains(&f.body[u].result))
        };
        if !(def[keys.index()].is_none() || materialized[keys.index()]) || !values.iter().all(inside) {
            continue;
        }
        for v in &values {
            (materialized[v.index()], once[v.index()]) = (false, true);
        }
        materialized[instr.result.index()] = true;
    }

    // Whether a product is a matvec, which stages `lhs` once per block: the matvec's shape, and a
    // matrix read from memory (a weight, or a kernel's input), not computed inside.
    let stages_lhs = |lhs: ValueId, rhs: ValueId, dims: &DotDims, materialized: &[bool]| {
        let lt = f.ty(lhs);
        let rows = lt.numel() / lt.shape.last().copied().unwrap_or(1).max(1);
        let read = def[rhs.index()].is_none() || materialized[rhs.index()] || free[rhs.index()];
        read && !free[lhs.index()] && rows <= MATVEC_MAX_ROWS && matvec_shaped(lt, f.ty(rhs), dims)
    };

    // Backwards: values read only into a matvec's staged activation (through other ops computed
    // there): each block computes each staged element once, whatever the product's size.
    let mut staged = vec![false; n];
    for instr in f.body.iter().rev() {
        let v = instr.result.index();
        staged[v] = !g.users[v].is_empty()
            && g.users[v].iter().all(|&(u, pos)| match &f.body[u].op {
                Op::DotGeneral { lhs, rhs, dims } => pos == 0 && stages_lhs(*lhs, *rhs, dims, &materialized),
                op => !is_heavy(op) && !materialized[f.body[u].result.index()] && staged[f.body[u].result.index()],
            });
    }

    // Forwards: materialize what would be recomputed at too high a cost.
    let mut cost = vec![0usize; n];
    for instr in &f.body {
        let v = instr.result.index();
        if materialized[v] || free[v] {
            continue;
        }
        let inherited: usize = instr
            .op
            .operands()
            .iter()
            .filter(|o| def[o.index()].is_some() && !materialized[o.index()] && !free[o.index()])
            .map(|o| cost[o.index()])
            .sum();
        cost[v] = arithmetic(&instr.op) + inherited;
        let in_attention = g.users[v].iter().any(|&(u, pos)| match &f.body[u].op {
            Op::DotGeneral { lhs, rhs, dims } => {
                let staged = pos == 0 && stages_lhs(*lhs, *rhs, dims, &materialized);
                let uniform = pos == 0 && lhs_warp_uniform(f.ty(*rhs), dims);
                !free[[*rhs, *lhs][pos].index()] && !staged && !uniform
            }
            _ => false,
        });
        let limit = match (staged[v], in_attention) {
            (true, _) => RECOMPUTE_LIMIT_STAGED,
            (false, true) => RECOMPUTE_LIMIT_IN_ATTENTION,
            (false, false) => RECOMPUTE_LIMIT,
        };
        if !once[v] && cost[v] > limit {
            materialized[v] = true;
            cost[v] = 0;
        }
    }

    // Each materialized value's kernel: what it computes, down to materialized values and params.
    f.body
        .iter()
        .filter(|instr| materialized[instr.result.index()])
        .map(|instr| {
            let root = instr.result;
            Group::collect(f, root, |v| def[v.index()].filter(|_| v == root || !materialized[v.index()]))
        })
        .collect()
}

/// The values of an attention chunk computed from its scores' product, up to its results `root`.
fn chunk_values(f: &Function, def: &[Option<usize>], root: ValueId, scores: ValueId) -> BTreeSet<ValueId> {
    // Forwards: what the scores' product reaches (a value's operands come before it).
    let mut reached = vec![false; f.values.len()];
    reached[scores.index()] = true;
    for instr in &f.body {
        reached[instr.result.index()] |= instr.op.operands().iter().any(|o| reached[o.index()]);
    }
    // Backwards from the root, through what it reaches.
    let (mut values, mut stack) = (BTreeSet::new(), vec![root]);
    while let Some(v) = stack.pop() {
        if !reached[v.index()] || !values.insert(v) || v == scores {
            continue;
        }
        let i = def[v.index()].expect("computed from the product");
        stack.extend(f.body[i].op.operands());
    }
    values
}

impl Group {
    /// The kernel of `root`: the instructions reached from it through the values it computes
    /// (`computed`: their instruction), and the other values it reads, in order of first read.
    pub fn collect(f: &Function, root: ValueId, computed: impl Fn(ValueId) -> Option<usize>) -> Group {
        let mut inside = BTreeSet::new();
        let mut inputs = Vec::new();
        let mut stack = vec![root];
        while let Some(v) = stack.pop() {
            match computed(v) {
                Some(i) => {
                    if inside.insert(i) {
                        // Reverse, so that inputs are found in operand order.
                        stack.extend(f.body[i].op.operands().into_iter().rev());
                    }
                }
                None => {
                    if !inputs.contains(&v) {
                        inputs.push(v);
                    }
                }
            }
        }
        Group { root, instrs: inside.into_iter().collect(), inputs }
    }
}
