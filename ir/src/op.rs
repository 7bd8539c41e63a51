//! The operations of the IR, defined once in the table at the end of this file. Each op yields
//! exactly one tensor value.
//!
//! Semantics follow StableHLO where an equivalent exists (so codegen is a direct mapping):
//! elementwise ops take operands of identical type (broadcasts are explicit), `dot_general`
//! names its batch and contracting dimensions, `broadcast` is `broadcast_in_dim`.
//!
//! The table (`ops!`, as Cranelift's meta and MLIR's ODS generate from declarations) gives each op its
//! fields, and from them the `Op` enum, mnemonics, operand lists, operand mapping, attributes and
//! parsing are generated, with no wildcard arm. Adding an op is a table row plus, in their own
//! files, its type rule (`infer.rs`), interpreter kernel (`g4c-runtime`), dtype policy
//! (`dtype-legalize`) and lowering (`g4c-codegen`): each of those matches on `Op` exhaustively, so
//! forgetting one fails to compile. A field is one of `operand`, `operands` (variadic, last),
//! `symbol` (`@name`), `family(T)` (the mnemonic names a `T`, e.g. `add` a `BinaryOp`) or `attr(T)`
//! (`T: OpAttr`).

use crate::ValueId;
use std::hash::{Hash, Hasher};

use crate::named_enum::named_enum;

/// Word enums are attributes as words (`{dir = gt}`).
macro_rules! word_attr {
    ($($name:ident),*) => {$(
        impl OpAttr for $name {
            fn write(&self, key: &'static str, out: &mut Vec<(&'static str, Attr)>) {
                out.push((key, Attr::Word(self.name().into())));
            }

            fn read(key: &'static str, attrs: &mut AttrReader) -> Result<Self, String> {
                attrs.word(key)?.parse().map_err(|e| format!("attribute `{key}`: {e}"))
            }
        }
    )*};
}

named_enum!(
    /// Elementwise ops of one operand.
    UnaryOp "unary op" {
        Neg = "neg", Abs = "abs", Exp = "exp", Log = "log", Tanh = "tanh", Sqrt = "sqrt",
        Rsqrt = "rsqrt", Sin = "sin", Cos = "cos", Not = "not", Sign = "sign",
    }
);

impl UnaryOp {
    /// Whether the op approximates a transcendental function: what it loses in a narrow type is
    /// much more than one rounding, so dtype legalization computes it in f32, and backends are held
    /// to it within a few units in the last place rather than exactly.
    pub fn is_transcendental(self) -> bool {
        match self {
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Tanh
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Sin
            | UnaryOp::Cos => true,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::Sign => false,
        }
    }
}

named_enum!(
    /// Elementwise ops of two operands of identical type.
    BinaryOp "binary op" {
        Add = "add", Sub = "sub", Mul = "mul", Div = "div", Max = "max", Min = "min",
        Pow = "pow", Rem = "rem", And = "and", Or = "or",
    }
);

named_enum!(
    /// Direction of an elementwise comparison; the result is `bool`.
    CompareDir "compare direction" { Eq = "eq", Ne = "ne", Lt = "lt", Le = "le", Gt = "gt", Ge = "ge" }
);

named_enum!(
    /// Reduction kinds.
    ReduceKind "reduce kind" { Sum = "sum", Max = "max", Min = "min" }
);

word_attr!(CompareDir, ReduceKind);

/// Dimension numbers of `dot_general`. The result is laid out as
/// `batch dims ++ lhs free dims ++ rhs free dims`, each in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// The left operand's free axes (neither batch nor contracted), in order, for its `rank`.
    pub fn lhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank).filter(|d| !self.lhs_batch.contains(d) && !self.lhs_contract.contains(d)).collect()
    }

    /// The right operand's free axes, in order, for its `rank`.
    pub fn rhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank).filter(|d| !self.rhs_batch.contains(d) && !self.rhs_contract.contains(d)).collect()
    }
}

impl OpAttr for DotDims {
    fn write(&self, _: &'static str, out: &mut Vec<(&'static str, Attr)>) {
        out.push(("lhs_batch", Attr::Ints(self.lhs_batch.clone())));
        out.push(("rhs_batch", Attr::Ints(self.rhs_batch.clone())));
        out.push(("lhs_contract", Attr::Ints(self.lhs_contract.clone())));
        out.push(("rhs_contract", Attr::Ints(self.rhs_contract.clone())));
    }

    fn read(_: &'static str, attrs: &mut AttrReader) -> Result<Self, String> {
        Ok(DotDims {
            lhs_batch: attrs.ints("lhs_batch")?,
            rhs_batch: attrs.ints("rhs_batch")?,
            lhs_contract: attrs.ints("lhs_contract")?,
            rhs_contract: attrs.ints("rhs_contract")?,
        })
    }
}

/// Literal tensor contents: one value broadcast to the whole type (`Splat`) or one value per element
/// in row-major order (`Dense`). Values are kept as f64, which holds every f32, bf16, f16, i32 and
/// bool exactly, so the text form round-trips. Literals are equal when their bits are: `0.0` and
/// `-0.0` differ, a NaN equals itself, so equal ops (CSE) compute the same bits.
#[derive(Clone, Debug)]
pub enum Literal {
    Splat(f64),
    Dense(Vec<f64>),
}

impl Literal {
    /// Whether it is a splat, and its values.
    fn parts(&self) -> (bool, &[f64]) {
        match self {
            Literal::Splat(v) => (true, std::slice::from_ref(v)),
            Literal::Dense(vs) => (false, vs),
        }
    }
}

impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        let ((splat, a), (other_splat, b)) = (self.parts(), other.parts());
        splat == other_splat && a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }
}

impl Eq for Literal {}

impl Hash for Literal {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (splat, values) = self.parts();
        splat.hash(state);
        values.iter().for_each(|v| v.to_bits().hash(state));
    }
}

impl OpAttr for Literal {
    fn write(&self, _: &'static str, out: &mut Vec<(&'static str, Attr)>) {
        match self {
            Literal::Splat(v) => out.push(("value", Attr::Float(*v))),
            Literal::Dense(vs) => out.push(("values", Attr::Floats(vs.clone()))),
        }
    }

    fn read(_: &'static str, attrs: &mut AttrReader) -> Result<Self, String> {
        if attrs.has("value") {
            Ok(Literal::Splat(attrs.float("value")?))
        } else {
            Ok(Literal::Dense(attrs.floats("values")?))
        }
    }
}

/// An attribute field of an op: how it is written as named text-form attributes and read back.
pub trait OpAttr: Sized {
    /// Appends the attribute(s) of this value; `key` is the field's name.
    fn write(&self, key: &'static str, out: &mut Vec<(&'static str, Attr)>);
    fn read(key: &'static str, attrs: &mut AttrReader) -> Result<Self, String>;
}

impl OpAttr for usize {
    fn write(&self, key: &'static str, out: &mut Vec<(&'static str, Attr)>) {
        out.push((key, Attr::Int(*self)));
    }

    fn read(key: &'static str, attrs: &mut AttrReader) -> Result<Self, String> {
        attrs.int(key)
    }
}

impl OpAttr for Vec<usize> {
    fn write(&self, key: &'static str, out: &mut Vec<(&'static str, Attr)>) {
        out.push((key, Attr::Ints(self.clone())));
    }

    fn read(key: &'static str, attrs: &mut AttrReader) -> Result<Self, String> {
        attrs.ints(key)
    }
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

/// Takes named attributes out of a parsed list, so that leftovers can be reported.
pub struct AttrReader {
    attrs: Vec<(String, Attr)>,
    op: String,
}

impl AttrReader {
    pub fn has(&self, key: &str) -> bool {
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

    pub fn int(&mut self, key: &str) -> Result<usize, String> {
        match self.take(key)? {
            Attr::Int(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected an integer, found {other:?}")),
        }
    }

    pub fn float(&mut self, key: &str) -> Result<f64, String> {
        match self.take(key)? {
            Attr::Float(v) => Ok(v),
            Attr::Int(v) => Ok(v as f64),
            other => Err(format!("attribute `{key}`: expected a number, found {other:?}")),
        }
    }

    pub fn ints(&mut self, key: &str) -> Result<Vec<usize>, String> {
        match self.take(key)? {
            Attr::Ints(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected a list of integers, found {other:?}")),
        }
    }

    pub fn floats(&mut self, key: &str) -> Result<Vec<f64>, String> {
        match self.take(key)? {
            Attr::Floats(v) => Ok(v),
            Attr::Ints(v) => Ok(v.into_iter().map(|x| x as f64).collect()),
            other => Err(format!("attribute `{key}`: expected a list of numbers, found {other:?}")),
        }
    }

    pub fn word(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            Attr::Word(v) => Ok(v),
            other => Err(format!("attribute `{key}`: expected a word, found {other:?}")),
        }
    }

    pub fn finish(self) -> Result<(), String> {
        match self.attrs.first() {
            None => Ok(()),
            Some((k, _)) => Err(format!("`{}` has no attribute `{k}`", self.op)),
        }
    }
}

/// Generates `Op` and everything the text form and passes need from one table of ops (the end of
/// this file). See the module documentation for the field kinds.
macro_rules! ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident $mnemonic:tt { $( $field:ident : $kind:ident $( ( $fty:ty ) )? ),* $(,)? }
    ),* $(,)?) => {
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum Op {
            $( $(#[$doc])* $variant { $( $field: op_field_type!($kind $( ($fty) )?) ),* }, )*
        }

        impl Op {
            /// The op's mnemonic in the text form.
            #[allow(unused_variables)]
            pub fn mnemonic(&self) -> &'static str {
                match self {
                    $( Op::$variant { $( $field ),* } => op_mnemonic!($mnemonic; $( $field: $kind, )*), )*
                }
            }

            /// The values the op reads, in order.
            #[allow(unused_variables)]
            pub fn operands(&self) -> Vec<ValueId> {
                let mut out = Vec::new();
                match self {
                    $( Op::$variant { $( $field ),* } => { $( op_read_operands!($kind, $field, out); )* } )*
                }
                out
            }

            /// Rewrites every operand through `f` (used by passes that replace values).
            #[allow(unused_variables)]
            pub fn map_operands(&mut self, mut f: impl FnMut(ValueId) -> ValueId) {
                match self {
                    $( Op::$variant { $( $field ),* } => { $( op_map_operands!($kind, $field, f); )* } )*
                }
            }

            /// Attributes in the order the text form prints them.
            #[allow(unused_variables)]
            pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
                let mut out = Vec::new();
                match self {
                    $( Op::$variant { $( $field ),* } => { $( op_write_attr!($kind, $field, out); )* } )*
                }
                out
            }

            /// Every mnemonic of the text form (each member of a family counts), in table order.
            pub fn all_mnemonics() -> Vec<&'static str> {
                let mut out = Vec::new();
                $( op_all_mnemonics!(out; $mnemonic; $( $kind $( ($fty) )?, )*); )*
                out
            }

            /// Builds an op from its text-form parts; the inverse of `mnemonic`, `operands` and `attrs`.
            pub fn from_parts(
                mnemonic: &str,
                symbol: Option<String>,
                operands: Vec<ValueId>,
                attrs: Vec<(String, Attr)>,
            ) -> Result<Op, String> {
                let mut symbol = symbol;
                let mut reader = AttrReader { attrs, op: mnemonic.to_string() };
                $(
                    let row = (|| -> Result<Option<Op>, String> {
                        op_check_mnemonic!($mnemonic, mnemonic);
                        $( op_check_family!($kind $( ($fty) )?, mnemonic); )*
                        let fixed = 0 $( + op_fixed_operands!($kind) )*;
                        let variadic = false $( || op_variadic!($kind) )*;
                        if operands.len() < fixed || (!variadic && operands.len() > fixed) {
                            let at_least = if variadic { "at least " } else { "" };
                            return Err(format!("`{mnemonic}` takes {at_least}{fixed} operand(s), found {}", operands.len()));
                        }
                        if symbol.is_some() && !(false $( || op_symbol!($kind) )*) {
                            return Err(format!("`{mnemonic}` takes no @symbol"));
                        }
                        #[allow(unused_mut, unused_variables)]
                        let mut operand_iter = operands.iter().copied();
                        Ok(Some(Op::$variant {
                            $( $field: op_field_value!(
                                $kind $( ($fty) )?, $field, mnemonic, operand_iter, symbol, reader
                            ), )*
                        }))
                    })()?;
                    if let Some(op) = row {
                        reader.finish()?;
                        return Ok(op);
                    }
                )*
                Err(format!("unknown op `{mnemonic}`"))
            }
        }
    };
}

macro_rules! op_field_type {
    (operand) => { ValueId };
    (operands) => { Vec<ValueId> };
    (symbol) => { String };
    (family($t:ty)) => { $t };
    (attr($t:ty)) => { $t };
}

macro_rules! op_mnemonic {
    ($m:literal; $($rest:tt)*) => { $m };
    (_; $f:ident: family, $($rest:tt)*) => { $f.name() };
    (_; $f:ident: $k:ident, $($rest:tt)*) => { op_mnemonic!(_; $($rest)*) };
}

macro_rules! op_all_mnemonics {
    ($out:ident; $m:literal; $($rest:tt)*) => { $out.push($m) };
    ($out:ident; _; family($t:ty), $($rest:tt)*) => { $out.extend(<$t>::ALL.iter().map(|v| v.name())) };
    ($out:ident; _; $k:ident $( ($t:ty) )?, $($rest:tt)*) => { op_all_mnemonics!($out; _; $($rest)*) };
}

macro_rules! op_read_operands {
    (operand, $f:ident, $out:ident) => {
        $out.push(*$f)
    };
    (operands, $f:ident, $out:ident) => {
        $out.extend($f.iter().copied())
    };
    ($k:ident, $f:ident, $out:ident) => {};
}

macro_rules! op_map_operands {
    (operand, $f:ident, $map:ident) => {
        *$f = $map(*$f)
    };
    (operands, $f:ident, $map:ident) => {
        $f.iter_mut().for_each(|x| *x = $map(*x))
    };
    ($k:ident, $f:ident, $map:ident) => {};
}

macro_rules! op_write_attr {
    (attr, $f:ident, $out:ident) => {
        OpAttr::write($f, stringify!($f), &mut $out)
    };
    ($k:ident, $f:ident, $out:ident) => {};
}

macro_rules! op_check_mnemonic {
    (_, $m:ident) => {};
    ($lit:literal, $m:ident) => {
        if $m != $lit {
            return Ok(None);
        }
    };
}

macro_rules! op_check_family {
    (family($t:ty), $m:ident) => {
        if $m.parse::<$t>().is_err() {
            return Ok(None);
        }
    };
    ($k:ident $( ($t:ty) )?, $m:ident) => {};
}

macro_rules! op_fixed_operands {
    (operand) => {
        1
    };
    ($k:ident) => {
        0
    };
}

macro_rules! op_variadic {
    (operands) => {
        true
    };
    ($k:ident) => {
        false
    };
}

macro_rules! op_symbol {
    (symbol) => {
        true
    };
    ($k:ident) => {
        false
    };
}

macro_rules! op_field_value {
    (operand, $f:ident, $m:ident, $ops:ident, $sym:ident, $r:ident) => {
        $ops.next().expect("arity checked")
    };
    (operands, $f:ident, $m:ident, $ops:ident, $sym:ident, $r:ident) => {
        $ops.by_ref().collect()
    };
    (symbol, $f:ident, $m:ident, $ops:ident, $sym:ident, $r:ident) => {
        $sym.take().ok_or_else(|| format!("`{}` needs a @{}", $m, stringify!($f)))?
    };
    (family($t:ty), $f:ident, $m:ident, $ops:ident, $sym:ident, $r:ident) => {
        $m.parse::<$t>().expect("checked")
    };
    (attr($t:ty), $f:ident, $m:ident, $ops:ident, $sym:ident, $r:ident) => {
        <$t as OpAttr>::read(stringify!($f), &mut $r)?
    };
}

ops! {
    /// A checkpoint tensor declared at module level (`weight @name`).
    Weight "weight" { name: symbol },
    Constant "constant" { literal: attr(Literal) },
    /// `iota` along `dim` of the result type: element value = its index along `dim`.
    Iota "iota" { dim: attr(usize) },
    /// An elementwise op of one operand, named by its `UnaryOp` (`exp %x`).
    Unary _ { op: family(UnaryOp), x: operand },
    /// An elementwise op of two operands of identical type, named by its `BinaryOp` (`add %a, %b`).
    Binary _ { op: family(BinaryOp), lhs: operand, rhs: operand },
    /// Elementwise comparison; the result is `bool`.
    Compare "compare" { lhs: operand, rhs: operand, dir: attr(CompareDir) },
    Select "select" { cond: operand, on_true: operand, on_false: operand },
    /// Element type conversion to the result type's dtype (round to nearest even for floats).
    Convert "convert" { x: operand },
    /// Reduces `axes` away (they disappear from the shape).
    Reduce "reduce" { input: operand, kind: attr(ReduceKind), axes: attr(Vec<usize>) },
    Reshape "reshape" { x: operand },
    /// Result dim `i` is input dim `perm[i]`.
    Transpose "transpose" { input: operand, perm: attr(Vec<usize>) },
    /// `broadcast_in_dim`: input dim `i` maps to result dim `dims[i]` (size equal or 1).
    Broadcast "broadcast" { input: operand, dims: attr(Vec<usize>) },
    /// Static slice `[start, limit)` per dimension, stride 1.
    Slice "slice" { input: operand, start: attr(Vec<usize>), limit: attr(Vec<usize>) },
    Concat "concat" { inputs: operands, axis: attr(usize) },
    DotGeneral "dot_general" { lhs: operand, rhs: operand, dims: attr(DotDims) },
    /// Rows of `table` (along axis 0) selected by integer `indices`:
    /// `[N, r...]` gathered by `[i...]` gives `[i..., r...]`. Out-of-range indices are an error.
    Gather "gather" { table: operand, indices: operand },
    /// Writes cache slots: `operand` is `[B, ..., S (at axis), ...]`, `slots` is `i32[B, T]`,
    /// `updates` equals `operand` with `S` replaced by `T`. For every `(b, t)` with
    /// `0 <= slots[b,t] < S`, slice `t` of `updates[b]` along `axis` is stored at slot `slots[b,t]`;
    /// negative slots (padding tokens) write nothing. Slots within one row must be distinct.
    UpdateSlots "update_slots" { operand: operand, slots: operand, updates: operand, axis: attr(usize) },
    /// Weights quantized per group along the last axis: `q` is `[..., n]` integers (`i4`, `i8`),
    /// `scale` is `[..., n / group]` floats, and element `[..., c]` of the result is
    /// `q[..., c] · scale[..., c / group]`, computed in f32 (exact: a 4- or 8-bit integer times a
    /// 16-bit float fits f32's mantissa) and rounded to the result's float type.
    Dequantize "dequantize" { q: operand, scale: operand, group: attr(usize) },
}
