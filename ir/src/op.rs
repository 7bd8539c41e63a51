//! The operations of the IR. Each op yields exactly one tensor value.
//!
//! Semantics follow StableHLO where an equivalent exists (so codegen is a direct mapping):
//! elementwise ops take operands of identical type (broadcasts are explicit), `dot_general`
//! names its batch and contracting dimensions, `broadcast` is `broadcast_in_dim`.

use crate::ValueId;
use std::fmt;
use std::str::FromStr;

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or(())
            }
        }
    };
}

named_enum!(
    /// Elementwise ops of one operand.
    UnaryOp {
        Neg = "neg", Abs = "abs", Exp = "exp", Log = "log", Tanh = "tanh", Sqrt = "sqrt",
        Rsqrt = "rsqrt", Sin = "sin", Cos = "cos", Not = "not",
    }
);

named_enum!(
    /// Elementwise ops of two operands of identical type.
    BinaryOp {
        Add = "add", Sub = "sub", Mul = "mul", Div = "div", Max = "max", Min = "min",
        Pow = "pow", Rem = "rem", And = "and", Or = "or",
    }
);

named_enum!(
    /// Direction of an elementwise comparison; the result is `bool`.
    CompareDir { Eq = "eq", Ne = "ne", Lt = "lt", Le = "le", Gt = "gt", Ge = "ge" }
);

named_enum!(
    /// Reduction kinds.
    ReduceKind { Sum = "sum", Max = "max", Min = "min" }
);

/// Dimension numbers of `dot_general`. The result is laid out as
/// `batch dims ++ lhs free dims ++ rhs free dims`, each in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

/// Literal tensor contents: one value broadcast to the whole type (`Splat`) or one value per element
/// in row-major order (`Dense`). Values are kept as f64, which holds every f32, bf16, f16, i32 and
/// bool exactly, so the text form round-trips.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Splat(f64),
    Dense(Vec<f64>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A checkpoint tensor declared at module level (`weight @name`).
    Weight {
        name: String,
    },
    Constant(Literal),
    /// `iota` along `dim` of the result type: element value = its index along `dim`.
    Iota {
        dim: usize,
    },
    Unary(UnaryOp, ValueId),
    Binary(BinaryOp, ValueId, ValueId),
    Compare(CompareDir, ValueId, ValueId),
    Select {
        cond: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    /// Element type conversion to the result type's dtype (round to nearest even for floats).
    Convert(ValueId),
    /// Reduces `axes` away (they disappear from the shape).
    Reduce {
        kind: ReduceKind,
        input: ValueId,
        axes: Vec<usize>,
    },
    Reshape(ValueId),
    /// Result dim `i` is input dim `perm[i]`.
    Transpose {
        input: ValueId,
        perm: Vec<usize>,
    },
    /// `broadcast_in_dim`: input dim `i` maps to result dim `dims[i]` (size equal or 1).
    Broadcast {
        input: ValueId,
        dims: Vec<usize>,
    },
    /// Static slice `[start, limit)` per dimension, stride 1.
    Slice {
        input: ValueId,
        start: Vec<usize>,
        limit: Vec<usize>,
    },
    Concat {
        inputs: Vec<ValueId>,
        axis: usize,
    },
    DotGeneral {
        lhs: ValueId,
        rhs: ValueId,
        dims: DotDims,
    },
    /// Rows of `table` (along axis 0) selected by integer `indices`:
    /// `[N, r...]` gathered by `[i...]` gives `[i..., r...]`. Out-of-range indices are an error.
    Gather {
        table: ValueId,
        indices: ValueId,
    },
    /// Writes cache slots: `operand` is `[B, ..., S (at axis), ...]`, `slots` is `i32[B, T]`,
    /// `updates` equals `operand` with `S` replaced by `T`. For every `(b, t)` with
    /// `0 <= slots[b,t] < S`, slice `t` of `updates[b]` along `axis` is stored at slot `slots[b,t]`;
    /// negative slots (padding tokens) write nothing. Slots within one row must be distinct.
    UpdateSlots {
        operand: ValueId,
        slots: ValueId,
        updates: ValueId,
        axis: usize,
    },
}

/// An attribute value in the text form.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(usize),
    Float(f64),
    Ints(Vec<usize>),
    Floats(Vec<f64>),
    Word(String),
}

impl Op {
    /// The op's mnemonic in the text form.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Weight { .. } => "weight",
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u, _) => u.name(),
            Op::Binary(b, _, _) => b.name(),
            Op::Compare(..) => "compare",
            Op::Select { .. } => "select",
            Op::Convert(_) => "convert",
            Op::Reduce { .. } => "reduce",
            Op::Reshape(_) => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Broadcast { .. } => "broadcast",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::DotGeneral { .. } => "dot_general",
            Op::Gather { .. } => "gather",
            Op::UpdateSlots { .. } => "update_slots",
        }
    }

    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Op::Weight { .. } | Op::Constant(_) | Op::Iota { .. } => vec![],
            Op::Unary(_, x) | Op::Convert(x) | Op::Reshape(x) => vec![*x],
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => vec![*a, *b],
            Op::Select { cond, on_true, on_false } => vec![*cond, *on_true, *on_false],
            Op::Reduce { input, .. }
            | Op::Transpose { input, .. }
            | Op::Broadcast { input, .. }
            | Op::Slice { input, .. } => vec![*input],
            Op::Concat { inputs, .. } => inputs.clone(),
            Op::DotGeneral { lhs, rhs, .. } => vec![*lhs, *rhs],
            Op::Gather { table, indices } => vec![*table, *indices],
            Op::UpdateSlots { operand, slots, updates, .. } => vec![*operand, *slots, *updates],
        }
    }

    /// Rewrites every operand through `f` (used by passes that replace values).
    pub fn map_operands(&mut self, mut f: impl FnMut(ValueId) -> ValueId) {
        match self {
            Op::Weight { .. } | Op::Constant(_) | Op::Iota { .. } => {}
            Op::Unary(_, x) | Op::Convert(x) | Op::Reshape(x) => *x = f(*x),
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::Select { cond, on_true, on_false } => {
                *cond = f(*cond);
                *on_true = f(*on_true);
                *on_false = f(*on_false);
            }
            Op::Reduce { input, .. }
            | Op::Transpose { input, .. }
            | Op::Broadcast { input, .. }
            | Op::Slice { input, .. } => *input = f(*input),
            Op::Concat { inputs, .. } => inputs.iter_mut().for_each(|x| *x = f(*x)),
            Op::DotGeneral { lhs, rhs, .. } => {
                *lhs = f(*lhs);
                *rhs = f(*rhs);
            }
            Op::Gather { table, indices } => {
                *table = f(*table);
                *indices = f(*indices);
            }
            Op::UpdateSlots { operand, slots, updates, .. } => {
                *operand = f(*operand);
                *slots = f(*slots);
                *updates = f(*updates);
            }
        }
    }

    /// Attributes in the order the text form prints them.
    pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Op::Constant(Literal::Splat(v)) => vec![("value", Attr::Float(*v))],
            Op::Constant(Literal::Dense(vs)) => vec![("values", Attr::Floats(vs.clone()))],
            Op::Iota { dim } => vec![("dim", Attr::Int(*dim))],
            Op::Compare(dir, ..) => vec![("dir", Attr::Word(dir.name().into()))],
            Op::Reduce { kind, axes, .. } => {
                vec![("kind", Attr::Word(kind.name().into())), ("axes", Attr::Ints(axes.clone()))]
            }
            Op::Transpose { perm, .. } => vec![("perm", Attr::Ints(perm.clone()))],
            Op::Broadcast { dims, .. } => vec![("dims", Attr::Ints(dims.clone()))],
            Op::Slice { start, limit, .. } => {
                vec![("start", Attr::Ints(start.clone())), ("limit", Attr::Ints(limit.clone()))]
            }
            Op::Concat { axis, .. } | Op::UpdateSlots { axis, .. } => vec![("axis", Attr::Int(*axis))],
            Op::DotGeneral { dims, .. } => vec![
                ("lhs_batch", Attr::Ints(dims.lhs_batch.clone())),
                ("rhs_batch", Attr::Ints(dims.rhs_batch.clone())),
                ("lhs_contract", Attr::Ints(dims.lhs_contract.clone())),
                ("rhs_contract", Attr::Ints(dims.rhs_contract.clone())),
            ],
            _ => vec![],
        }
    }

    /// Builds an op from its text-form parts; the inverse of `mnemonic`/`operands`/`attrs`.
    pub fn from_parts(
        mnemonic: &str,
        symbol: Option<String>,
        operands: Vec<ValueId>,
        attrs: Vec<(String, Attr)>,
    ) -> Result<Op, String> {
        let mut attrs = AttrReader { attrs, op: mnemonic.to_string() };
        let arity = |n: usize| -> Result<(), String> {
            if operands.len() == n {
                Ok(())
            } else {
                Err(format!("`{mnemonic}` takes {n} operand(s), found {}", operands.len()))
            }
        };
        if mnemonic != "weight" && symbol.is_some() {
            return Err(format!("`{mnemonic}` takes no @symbol"));
        }
        let op = match mnemonic {
            "weight" => {
                arity(0)?;
                Op::Weight { name: symbol.ok_or("`weight` needs a @name")? }
            }
            "constant" => {
                arity(0)?;
                if attrs.has("value") {
                    Op::Constant(Literal::Splat(attrs.float("value")?))
                } else {
                    Op::Constant(Literal::Dense(attrs.floats("values")?))
                }
            }
            "iota" => {
                arity(0)?;
                Op::Iota { dim: attrs.int("dim")? }
            }
            "compare" => {
                arity(2)?;
                let dir = attrs.word("dir")?;
                let dir = dir.parse().map_err(|_| format!("unknown compare direction `{dir}`"))?;
                Op::Compare(dir, operands[0], operands[1])
            }
            "select" => {
                arity(3)?;
                Op::Select { cond: operands[0], on_true: operands[1], on_false: operands[2] }
            }
            "convert" => {
                arity(1)?;
                Op::Convert(operands[0])
            }
            "reduce" => {
                arity(1)?;
                let kind = attrs.word("kind")?;
                let kind = kind.parse().map_err(|_| format!("unknown reduce kind `{kind}`"))?;
                Op::Reduce { kind, input: operands[0], axes: attrs.ints("axes")? }
            }
            "reshape" => {
                arity(1)?;
                Op::Reshape(operands[0])
            }
            "transpose" => {
                arity(1)?;
                Op::Transpose { input: operands[0], perm: attrs.ints("perm")? }
            }
            "broadcast" => {
                arity(1)?;
                Op::Broadcast { input: operands[0], dims: attrs.ints("dims")? }
            }
            "slice" => {
                arity(1)?;
                Op::Slice { input: operands[0], start: attrs.ints("start")?, limit: attrs.ints("limit")? }
            }
            "concat" => Op::Concat { inputs: operands, axis: attrs.int("axis")? },
            "dot_general" => {
                arity(2)?;
                let dims = DotDims {
                    lhs_batch: attrs.ints("lhs_batch")?,
                    rhs_batch: attrs.ints("rhs_batch")?,
                    lhs_contract: attrs.ints("lhs_contract")?,
                    rhs_contract: attrs.ints("rhs_contract")?,
                };
                Op::DotGeneral { lhs: operands[0], rhs: operands[1], dims }
            }
            "gather" => {
                arity(2)?;
                Op::Gather { table: operands[0], indices: operands[1] }
            }
            "update_slots" => {
                arity(3)?;
                Op::UpdateSlots {
                    operand: operands[0],
                    slots: operands[1],
                    updates: operands[2],
                    axis: attrs.int("axis")?,
                }
            }
            other => {
                if let Ok(u) = other.parse::<UnaryOp>() {
                    arity(1)?;
                    Op::Unary(u, operands[0])
                } else if let Ok(b) = other.parse::<BinaryOp>() {
                    arity(2)?;
                    Op::Binary(b, operands[0], operands[1])
                } else {
                    return Err(format!("unknown op `{other}`"));
                }
            }
        };
        attrs.finish()?;
        Ok(op)
    }
}

/// Takes named attributes out of a parsed list, so that leftovers can be reported.
struct AttrReader {
    attrs: Vec<(String, Attr)>,
    op: String,
}

impl AttrReader {
    fn has(&self, key: &str) -> bool {
        self.attrs.iter().any(|(k, _)| k == key)
    }

    fn take(&mut self, key: &str) -> Result<Attr, String> {
        let i = self
            .attrs
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| format!("`{}` needs attribute `{key}`", self.op))?;
        Ok(self.attrs.remove(i).1)
    }

    fn int(&mut self, key: &str) -> Result<usize, String> {
        match self.take(key)? {
            Attr::Int(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected an integer, found {other:?}")),
        }
    }

    fn float(&mut self, key: &str) -> Result<f64, String> {
        match self.take(key)? {
            Attr::Float(v) => Ok(v),
            Attr::Int(v) => Ok(v as f64),
            other => Err(format!("attribute `{key}`: expected a number, found {other:?}")),
        }
    }

    fn ints(&mut self, key: &str) -> Result<Vec<usize>, String> {
        match self.take(key)? {
            Attr::Ints(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected a list of integers, found {other:?}")),
        }
    }

    fn floats(&mut self, key: &str) -> Result<Vec<f64>, String> {
        match self.take(key)? {
            Attr::Floats(v) => Ok(v),
            Attr::Ints(v) => Ok(v.into_iter().map(|x| x as f64).collect()),
            other => Err(format!("attribute `{key}`: expected a list of numbers, found {other:?}")),
        }
    }

    fn word(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            Attr::Word(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected a word, found {other:?}")),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.attrs.first() {
            None => Ok(()),
            Some((k, _)) => Err(format!("`{}` has no attribute `{k}`", self.op)),
        }
    }
}
