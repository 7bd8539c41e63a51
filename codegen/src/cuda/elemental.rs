//! The elemental emitter: CUDA C statements computing one element of an IR value at a given index,
//! recursing into its operands at the indices it reads them at (as XLA's elemental IR emitter
//! does). Every value of a kernel that is not materialized is computed this way, inside the kernel
//! that reads it. Values are f32 (`float`), `int` or `bool` in registers, rounded to their IR type
//! after every op, so a kernel computes what the interpreter computes op by op.

use super::CudaError;
use g4c_ir::scalar::round_float;
use g4c_ir::{BinaryOp, CompareDir, DType, DotDims, Function, Literal, Op, ReduceKind, TensorType, UnaryOp, ValueId};
use std::collections::HashMap;
use std::fmt::Write;

/// An index: one C `int` expression per dimension.
pub(crate) type Index = Vec<String>;

pub(crate) struct Emitter<'k> {
    pub k: &'k Function,
    def: HashMap<ValueId, usize>,
    /// Kernel parameters: value → argument `in{j}`.
    inputs: HashMap<ValueId, usize>,
    /// Weights read, in order of first read: argument `w{j}`.
    pub weights: Vec<String>,
    /// File-scope constant arrays this kernel needs.
    pub constants: Vec<String>,
    lines: Vec<String>,
    /// What the kernel's blocks do before they wait for the kernel before them (`ahead`).
    ahead: Vec<String>,
    depth: usize,
    /// Elements already computed, per scope (loop bodies and branches open one).
    scopes: Vec<HashMap<(ValueId, Index), String>>,
    /// Values whose element is already in a variable (a matvec's accumulated product).
    pub bound: HashMap<ValueId, String>,
    /// Values held in a shared array (a prelude's reductions, an attention chunk's scores), read
    /// at the element's index.
    shared: HashMap<ValueId, SharedArray>,
    next: usize,
    /// A prefix making constant names unique in a translation unit.
    prefix: String,
    /// The GPU computes in bf16 (sm_80 and later), so packed 4-bit weights may be dequantized
    /// in bf16 pairs.
    pub bf16_math: bool,
}

/// The C type an element of `dtype` is computed in.
pub(crate) fn value_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::I32 | DType::I8 | DType::I4 => "int",
        DType::Bool => "bool",
    }
}

/// The C type an element of `dtype` is stored as.
pub(crate) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "int",
        DType::I8 => "signed char",
        DType::I4 | DType::Bool => "u8",
    }
}

/// `x` (an f32 expression) rounded to `dtype`.
pub(crate) fn rounded(dtype: DType, x: &str) -> String {
    match dtype {
        DType::F16 => format!("rf16({x})"),
        DType::BF16 => format!("rbf16({x})"),
        _ => x.to_string(),
    }
}

/// The value a reduction of `kind` into `dtype` starts from, in the C type `value_type(dtype)`.
pub(crate) fn reduce_init(kind: ReduceKind, dtype: DType) -> &'static str {
    match (kind, dtype.is_float()) {
        (ReduceKind::Sum, true) => "0.f",
        (ReduceKind::Max, true) => "__int_as_float(0xff800000)",
        (ReduceKind::Min, true) => "__int_as_float(0x7f800000)",
        (ReduceKind::Sum, false) => "0",
        (ReduceKind::Max, false) => "(-2147483647 - 1)",
        (ReduceKind::Min, false) => "2147483647",
    }
}

/// `acc` and `a` combined by a reduction of `kind` (the prelude's `max_of` and `min_of` take
/// floats, propagating NaN, or ints; integers are summed in `int` and wrap to a narrower type when
/// stored, as the interpreter's do).
pub(crate) fn reduce_combine(kind: ReduceKind, acc: &str, a: &str) -> String {
    match kind {
        ReduceKind::Sum => format!("{acc} + {a}"),
        ReduceKind::Max => format!("max_of({acc}, {a})"),
        ReduceKind::Min => format!("min_of({acc}, {a})"),
    }
}

/// How many products each output element of a `dot_general` sums.
pub(crate) fn contracted_extent(lhs: &TensorType, dims: &DotDims) -> usize {
    dims.lhs_contract.iter().map(|&d| lhs.shape[d]).product()
}

/// How many input elements each output element of a reduction over `axes` combines.
pub(crate) fn reduced_extent(input: &TensorType, axes: &[usize]) -> usize {
    axes.iter().map(|&a| input.shape[a]).product()
}

/// An f32 literal that C reads back to the same bits.
pub(crate) fn float_literal(x: f32) -> String {
    if x.is_finite() {
        format!("{x:?}f")
    } else {
        format!("__int_as_float(0x{:08x})", x.to_bits())
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The row-major linear index of `idx` in `shape`.
pub(crate) fn linear(idx: &[String], shape: &[usize]) -> String {
    let terms: Vec<String> = idx
        .iter()
        .zip(strides(shape))
        .zip(shape)
        .filter(|((i, _), &d)| d != 1 && i.as_str() != "0")
        .map(|((i, s), _)| if s == 1 { i.clone() } else { format!("{i} * {s}") })
        .collect();
    if terms.is_empty() {
        "0".into()
    } else {
        format!("({})", terms.join(" + "))
    }
}

/// The index in `shape` of linear index `lin` (a variable name or a parenthesized expression).
pub(crate) fn unlinear(lin: &str, shape: &[usize]) -> Index {
    let st = strides(shape);
    shape
        .iter()
        .zip(st)
        .enumerate()
        .map(|(i, (&d, s))| match (d, s, i) {
            (1, _, _) => "0".into(),
            (_, 1, 0) => lin.to_string(),
            (_, 1, _) => format!("({lin} % {d})"),
            (_, s, 0) => format!("({lin} / {s})"),
            (_, s, _) => format!("({lin} / {s} % {d})"),
        })
        .collect()
}

/// How an element of `dtype` is loaded from array `array` at `lin`, as its value type.
pub(crate) fn load(dtype: DType, array: &str, lin: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 => format!("{array}[{lin}]"),
        DType::F16 => format!("h2f({array}[{lin}])"),
        DType::BF16 => format!("b2f({array}[{lin}])"),
        DType::I8 => format!("(int){array}[{lin}]"),
        DType::I4 => format!("ld_i4({array}, {lin})"),
        DType::Bool => format!("({array}[{lin}] != 0)"),
    }
}

/// How value `x` of `dtype` is stored into `array` at `lin`.
pub(crate) fn store(dtype: DType, array: &str, lin: &str, x: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 => format!("{array}[{lin}] = {x};"),
        DType::F16 => format!("{array}[{lin}] = f2h({x});"),
        DType::BF16 => format!("{array}[{lin}] = f2b({x});"),
        DType::I8 => format!("{array}[{lin}] = (signed char){x};"),
        DType::Bool => format!("{array}[{lin}] = {x} ? 1 : 0;"),
        DType::I4 => unreachable!("no kernel writes 4-bit values"),
    }
}

/// A shared array holding a value: whole, or only the block's chunk along one axis (an attention
/// chunk's scores), which its index then skips.
struct SharedArray {
    array: String,
    chunk_axis: Option<usize>,
}

impl SharedArray {
    fn element(&self, idx: &[String], shape: &[usize]) -> String {
        let (mut idx, mut shape) = (idx.to_vec(), shape.to_vec());
        if let Some(axis) = self.chunk_axis {
            (idx[axis], shape[axis]) = ("0".into(), 1);
        }
        format!("{}[{}]", self.array, linear(&idx, &shape))
    }
}

impl<'k> Emitter<'k> {
    /// Value `v` is read from shared array `array`, which holds it whole.
    pub fn share(&mut self, v: ValueId, array: &str) {
        self.shared.insert(v, SharedArray { array: array.to_string(), chunk_axis: None });
    }

    /// Value `v` is read from shared array `array`, which holds its elements of the block's chunk
    /// along `axis` (of whatever index the reads give there).
    pub fn share_chunk(&mut self, v: ValueId, array: &str, axis: usize) {
        self.shared.insert(v, SharedArray { array: array.to_string(), chunk_axis: Some(axis) });
    }

    /// An emitter for kernel `k`; `prefix` names its file-scope constants.
    pub fn new(k: &'k Function, prefix: &str) -> Self {
        let def = k.body.iter().enumerate().map(|(i, instr)| (instr.result, i)).collect();
        let inputs = k.params.iter().enumerate().map(|(j, p)| (p.value, j)).collect();
        Emitter {
            k,
            def,
            inputs,
            weights: Vec::new(),
            constants: Vec::new(),
            lines: Vec::new(),
            ahead: Vec::new(),
            depth: 1,
            scopes: vec![HashMap::new()],
            bound: HashMap::new(),
            shared: HashMap::new(),
            next: 0,
            prefix: prefix.to_string(),
            bf16_math: false,
        }
    }

    /// The statements emitted so far: those `ahead`, statement `wait` (for the kernel before,
    /// with programmatic dependent launch), then the others.
    pub fn take_lines(&mut self, wait: &str) -> Vec<String> {
        let mut lines = std::mem::take(&mut self.ahead);
        lines.push(format!("{}{wait}", "  ".repeat(self.depth)));
        lines.append(&mut self.lines);
        lines
    }

    /// Emits `f`'s statements where the kernel's blocks run them before they wait for the kernel
    /// before them: ahead of everything else, at the top level. They may read only what no kernel
    /// writes (weights). The C variables they declare stay in scope after (a GEMM's tile indices
    /// and first weights), but the values they compute are not reused from the emitter's cache.
    pub fn ahead<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let lines = std::mem::replace(&mut self.lines, std::mem::take(&mut self.ahead));
        let scopes = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        let depth = std::mem::replace(&mut self.depth, 1);
        let out = f(self);
        self.ahead = std::mem::replace(&mut self.lines, lines);
        (self.scopes, self.depth) = (scopes, depth);
        out
    }

    pub fn line(&mut self, text: impl AsRef<str>) {
        self.lines.push(format!("{}{}", "  ".repeat(self.depth), text.as_ref()));
    }

    pub fn open(&mut self, text: impl AsRef<str>) {
        self.line(format!("{} {{", text.as_ref()));
        self.depth += 1;
        self.scopes.push(HashMap::new());
    }

    pub fn close(&mut self) {
        self.scopes.pop();
        self.depth -= 1;
        self.line("}");
    }

    pub fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}{}", self.next)
    }

    /// Declares `ty name = expr;` and returns the name.
    pub fn var(&mut self, ty: &str, stem: &str, expr: &str) -> String {
        let name = self.fresh(stem);
        self.line(format!("{ty} {name} = {expr};"));
        name
    }

    /// A variable holding the linear index of `idx` in `shape`, for index maps to decompose.
    fn linear_var(&mut self, idx: &[String], shape: &[usize]) -> String {
        let lin = linear(idx, shape);
        if lin.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return lin;
        }
        self.var("int", "l", &lin)
    }

    pub(crate) fn weight_arg(&mut self, name: &str) -> String {
        let j = match self.weights.iter().position(|w| w == name) {
            Some(j) => j,
            None => {
                self.weights.push(name.to_string());
                self.weights.len() - 1
            }
        };
        format!("w{j}")
    }

    /// The name of the weight `v` is, if it is one.
    pub(crate) fn weight_name(&self, v: ValueId) -> Option<&'k str> {
        match &self.k.body[*self.def.get(&v)?].op {
            Op::Weight { name } => Some(name),
            _ => None,
        }
    }

    /// The C array holding `v` as stored, element by element, when `v` is a parameter or a weight
    /// read as it is: what a template may read in wider loads than `value`'s.
    pub(crate) fn stored_array(&mut self, v: ValueId) -> Option<String> {
        if self.bound.contains_key(&v) || self.shared.contains_key(&v) {
            return None;
        }
        match self.def.get(&v) {
            None => self.inputs.get(&v).map(|j| format!("in{j}")),
            Some(_) => self.weight_name(v).map(|name| self.weight_arg(name)),
        }
    }

    fn ty(&self, v: ValueId) -> &'k TensorType {
        self.k.ty(v)
    }

    /// A C expression (usually a variable) holding element `idx` of `v`.
    pub fn value(&mut self, v: ValueId, idx: &[String]) -> Result<String, CudaError> {
        if let Some(b) = self.bound.get(&v) {
            return Ok(b.clone());
        }
        let key = (v, idx.to_vec());
        if let Some(x) = self.scopes.iter().rev().find_map(|s| s.get(&key)) {
            return Ok(x.clone());
        }
        let ty = self.ty(v);
        let x = match self.def.get(&v) {
            _ if self.shared.contains_key(&v) => self.shared[&v].element(idx, &ty.shape),
            None => {
                let j = self.inputs[&v];
                let lin = linear(idx, &ty.shape);
                load(ty.dtype, &format!("in{j}"), &lin)
            }
            Some(&i) => self.op(&self.k.body[i].op, ty, idx)?,
        };
        let x = self.var(value_type(ty.dtype), "v", &x);
        self.scopes.last_mut().expect("a scope").insert(key, x.clone());
        Ok(x)
    }

    fn op(&mut self, op: &'k Op, ty: &'k TensorType, idx: &[String]) -> Result<String, CudaError> {
        let unsupported = |what: String| Err(CudaError::Unsupported(what));
        let float = ty.dtype.is_float();
        Ok(match op {
            Op::Weight { name } => {
                let w = self.weight_arg(name);
                load(ty.dtype, &w, &linear(idx, &ty.shape))
            }
            Op::Constant { literal: Literal::Splat(x) } => scalar_literal(ty.dtype, *x),
            Op::Constant { literal: Literal::Dense(values) } => {
                let name = format!("{}_c{}", self.prefix, self.constants.len());
                let at = linear(idx, &ty.shape);
                // Floats as their f32 bits: an initializer must be a constant expression, which
                // `__int_as_float` (how a NaN or an infinity is written) is not.
                let (c_type, items, element): (_, Vec<String>, _) = match float {
                    true => (
                        "unsigned",
                        values
                            .iter()
                            .map(|&x| format!("0x{:08x}u", round_float(ty.dtype, x as f32).to_bits()))
                            .collect(),
                        format!("__uint_as_float({name}[{at}])"),
                    ),
                    false => (
                        value_type(ty.dtype),
                        values.iter().map(|&x| scalar_literal(ty.dtype, x)).collect(),
                        format!("{name}[{at}]"),
                    ),
                };
                self.constants.push(format!(
                    "__device__ const {c_type} {name}[{}] = {{{}}};",
                    values.len(),
                    items.join(", ")
                ));
                element
            }
            Op::Iota { dim } => match float {
                true => rounded(ty.dtype, &format!("(float){}", idx[*dim])),
                false => idx[*dim].clone(),
            },
            Op::Unary { op, x } => {
                let a = self.value(*x, idx)?;
                let dt = self.ty(*x).dtype;
                match (dt.is_float(), dt == DType::Bool, op) {
                    (true, _, _) => rounded(ty.dtype, &unary_float(*op, &a)),
                    (_, true, UnaryOp::Not) => format!("!{a}"),
                    (false, false, UnaryOp::Neg) if dt == DType::I32 => format!("-{a}"),
                    (false, false, UnaryOp::Abs) if dt == DType::I32 => format!("abs({a})"),
                    (false, false, UnaryOp::Sign) => format!("isgn({a})"),
                    _ => return unsupported(format!("`{op}` on {dt}")),
                }
            }
            Op::Binary { op, lhs, rhs } => {
                let (a, b) = (self.value(*lhs, idx)?, self.value(*rhs, idx)?);
                match ty.dtype {
                    d if d.is_float() => rounded(d, &binary_float(*op, &a, &b)?),
                    DType::I32 => binary_int(*op, &a, &b)?,
                    DType::Bool if *op == BinaryOp::And => format!("({a} && {b})"),
                    DType::Bool if *op == BinaryOp::Or => format!("({a} || {b})"),
                    d => return unsupported(format!("`{op}` on {d}")),
                }
            }
            Op::Compare { lhs, rhs, dir } => {
                let (a, b) = (self.value(*lhs, idx)?, self.value(*rhs, idx)?);
                let c = match dir {
                    CompareDir::Eq => "==",
                    CompareDir::Ne => "!=",
                    CompareDir::Lt => "<",
                    CompareDir::Le => "<=",
                    CompareDir::Gt => ">",
                    CompareDir::Ge => ">=",
                };
                format!("({a} {c} {b})")
            }
            Op::Select { cond, on_true, on_false } => {
                let c = self.value(*cond, idx)?;
                let (a, b) = (self.value(*on_true, idx)?, self.value(*on_false, idx)?);
                format!("({c} ? {a} : {b})")
            }
            Op::Convert { x } => {
                let a = self.value(*x, idx)?;
                let from = self.ty(*x).dtype;
                convert(from, ty.dtype, &a)?
            }
            Op::Reshape { x } => {
                let lin = self.linear_var(idx, &ty.shape);
                let in_idx = unlinear(&lin, &self.ty(*x).shape);
                return self.value(*x, &in_idx);
            }
            Op::Transpose { input, perm } => {
                let mut in_idx = vec![String::new(); perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    in_idx[p] = idx[i].clone();
                }
                return self.value(*input, &in_idx);
            }
            Op::Broadcast { input, dims } => {
                let in_shape = &self.ty(*input).shape;
                let in_idx: Index = dims
                    .iter()
                    .enumerate()
                    .map(|(j, &d)| if in_shape[j] == 1 { "0".into() } else { idx[d].clone() })
                    .collect();
                return self.value(*input, &in_idx);
            }
            Op::Slice { input, start, .. } => {
                let in_idx: Index = idx
                    .iter()
                    .zip(start)
                    .map(|(i, &s)| if s == 0 { i.clone() } else { format!("({i} + {s})") })
                    .collect();
                return self.value(*input, &in_idx);
            }
            Op::Concat { inputs, axis } => return self.concat(inputs, *axis, ty, idx),
            Op::DotGeneral { lhs, rhs, dims } => {
                let acc_ty = if float { "float" } else { "int" };
                let acc = self.var(acc_ty, "acc", if float { "0.f" } else { "0" });
                let c = self.fresh("c");
                self.open(format!("for (int {c} = 0; {c} < {}; ++{c})", contracted_extent(self.ty(*lhs), dims)));
                self.dot_step(*lhs, *rhs, dims, idx, &c, &acc)?;
                self.close();
                rounded(ty.dtype, &acc)
            }
            Op::Reduce { input, kind, axes } => {
                let acc = self.var(value_type(ty.dtype), "acc", reduce_init(*kind, ty.dtype));
                let r = self.fresh("r");
                self.open(format!("for (int {r} = 0; {r} < {}; ++{r})", reduced_extent(self.ty(*input), axes)));
                self.reduce_step(*input, *kind, axes, idx, &r, &acc)?;
                self.close();
                rounded(ty.dtype, &acc)
            }
            Op::Gather { table, indices } => {
                let ni = self.ty(*indices).rank();
                let rows = self.ty(*table).shape[0];
                let row = self.value(*indices, &idx[..ni])?;
                // Out-of-range rows are clamped: a kernel cannot fail a call (the host checks ids).
                let row = self.var("int", "row", &format!("min(max({row}, 0), {})", rows - 1));
                let t_idx: Index = std::iter::once(row).chain(idx[ni..].iter().cloned()).collect();
                return self.value(*table, &t_idx);
            }
            Op::Dequantize { q, scale, group } => {
                let a = self.value(*q, idx)?;
                let mut s_idx = idx.to_vec();
                let last = s_idx.last_mut().expect("a quantized axis");
                *last = format!("({last} / {group})");
                let s = self.value(*scale, &s_idx)?;
                rounded(ty.dtype, &format!("(float){a} * {s}"))
            }
            Op::UpdateSlots { .. } => return unsupported("a cache write inside another kernel".into()),
        })
    }

    /// One step of a `dot_general` for the output element at `idx`: adds to `acc` the product of
    /// the operands' elements at linear position `c` of the contracted axes.
    pub(crate) fn dot_step(
        &mut self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
        idx: &[String],
        c: &str,
        acc: &str,
    ) -> Result<(), CudaError> {
        let (li, ri) = self.dot_operands_at(lhs, rhs, dims, idx, c);
        let a = self.value(lhs, &li)?;
        let b = self.value(rhs, &ri)?;
        self.line(format!("{acc} = fmaf({a}, {b}, {acc});"));
        Ok(())
    }

    /// The indices of the operands' elements that a `dot_general`'s output element at `idx`
    /// multiplies at linear position `c` of the contracted axes.
    pub(crate) fn dot_operands_at(
        &self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
        idx: &[String],
        c: &str,
    ) -> (Index, Index) {
        let (lt, rt) = (self.ty(lhs), self.ty(rhs));
        let depth: Vec<usize> = dims.lhs_contract.iter().map(|&d| lt.shape[d]).collect();
        let nb = dims.lhs_batch.len();
        let (lhs_free, rhs_free) = (dims.lhs_free(lt.rank()), dims.rhs_free(rt.rank()));
        let cidx = unlinear(c, &depth);
        let side = |rank: usize, batch: &[usize], contract: &[usize], free: &[usize], offset: usize| -> Index {
            (0..rank)
                .map(|d| {
                    if let Some(p) = batch.iter().position(|&b| b == d) {
                        idx[p].clone()
                    } else if let Some(q) = contract.iter().position(|&b| b == d) {
                        cidx[q].clone()
                    } else {
                        idx[offset + free.iter().position(|&f| f == d).expect("a free dim")].clone()
                    }
                })
                .collect()
        };
        let li = side(lt.rank(), &dims.lhs_batch, &dims.lhs_contract, &lhs_free, nb);
        let ri = side(rt.rank(), &dims.rhs_batch, &dims.rhs_contract, &rhs_free, nb + lhs_free.len());
        (li, ri)
    }

    /// One step of a reduction of `input` over `axes` for the output element at `idx`: combines
    /// into `acc` the input element at linear position `r` of the reduced axes.
    pub(crate) fn reduce_step(
        &mut self,
        input: ValueId,
        kind: ReduceKind,
        axes: &[usize],
        idx: &[String],
        r: &str,
        acc: &str,
    ) -> Result<(), CudaError> {
        let it = self.ty(input);
        let extents: Vec<usize> = axes.iter().map(|&a| it.shape[a]).collect();
        let ridx = unlinear(r, &extents);
        let mut kept = idx.iter();
        let in_idx: Index = (0..it.rank())
            .map(|d| match axes.iter().position(|&a| a == d) {
                Some(q) => ridx[q].clone(),
                None => kept.next().expect("a kept dim").clone(),
            })
            .collect();
        let a = self.value(input, &in_idx)?;
        self.line(format!("{acc} = {};", reduce_combine(kind, acc, &a)));
        Ok(())
    }

    fn concat(
        &mut self,
        inputs: &[ValueId],
        axis: usize,
        ty: &TensorType,
        idx: &[String],
    ) -> Result<String, CudaError> {
        let out = self.fresh("v");
        self.line(format!("{} {out};", value_type(ty.dtype)));
        let mut offset = 0;
        for (n, &x) in inputs.iter().enumerate() {
            let extent = self.ty(x).shape[axis];
            let mut in_idx = idx.to_vec();
            if offset > 0 {
                in_idx[axis] = format!("({} - {offset})", idx[axis]);
            }
            let test = format!("{} < {}", idx[axis], offset + extent);
            match (n, n + 1 == inputs.len()) {
                (0, true) => self.open("{"),
                (0, false) => self.open(format!("if ({test})")),
                (_, true) => {
                    self.depth -= 1;
                    self.scopes.pop();
                    self.line("} else {");
                    self.depth += 1;
                    self.scopes.push(HashMap::new());
                }
                _ => {
                    self.depth -= 1;
                    self.scopes.pop();
                    self.line(format!("}} else if ({test}) {{"));
                    self.depth += 1;
                    self.scopes.push(HashMap::new());
                }
            }
            let x = self.value(x, &in_idx)?;
            self.line(format!("{out} = {x};"));
            offset += extent;
        }
        self.close();
        Ok(out)
    }
}

fn scalar_literal(dtype: DType, x: f64) -> String {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => float_literal(round_float(dtype, x as f32)),
        DType::Bool => (if x != 0.0 { "true" } else { "false" }).into(),
        _ => format!("{}", x as i64),
    }
}

fn unary_float(op: UnaryOp, a: &str) -> String {
    match op {
        UnaryOp::Neg => format!("-{a}"),
        UnaryOp::Abs => format!("fabsf({a})"),
        UnaryOp::Exp => format!("expf({a})"),
        UnaryOp::Log => format!("logf({a})"),
        UnaryOp::Tanh => format!("tanhf({a})"),
        UnaryOp::Sqrt => format!("sqrtf({a})"),
        UnaryOp::Rsqrt => format!("(1.f / sqrtf({a}))"),
        UnaryOp::Sin => format!("sinf({a})"),
        UnaryOp::Cos => format!("cosf({a})"),
        UnaryOp::Sign => format!("sgn({a})"),
        UnaryOp::Not => unreachable!("`not` on floats is refused by the verifier"),
    }
}

fn binary_float(op: BinaryOp, a: &str, b: &str) -> Result<String, CudaError> {
    Ok(match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Max => format!("fmax_nan({a}, {b})"),
        BinaryOp::Min => format!("fmin_nan({a}, {b})"),
        BinaryOp::Pow => format!("powf({a}, {b})"),
        BinaryOp::Rem => format!("fmodf({a}, {b})"),
        BinaryOp::And | BinaryOp::Or => return Err(CudaError::Unsupported(format!("`{op}` on floats"))),
    })
}

/// Integer division and remainder truncate in C as in the interpreter; by zero is the caller's
/// error in both (the model divides by constants only).
fn binary_int(op: BinaryOp, a: &str, b: &str) -> Result<String, CudaError> {
    Ok(match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Rem => format!("({a} % {b})"),
        BinaryOp::Max => format!("max({a}, {b})"),
        BinaryOp::Min => format!("min({a}, {b})"),
        BinaryOp::And => format!("({a} & {b})"),
        BinaryOp::Or => format!("({a} | {b})"),
        BinaryOp::Pow => return Err(CudaError::Unsupported("`pow` on integers".into())),
    })
}

fn convert(from: DType, to: DType, a: &str) -> Result<String, CudaError> {
    Ok(match (value_type(from), value_type(to)) {
        ("float", "float") => rounded(to, a),
        ("float", "int") if to == DType::I32 => format!("(int)truncf({a})"),
        ("float", "bool") => format!("({a} != 0.f)"),
        ("int", "float") | ("bool", "float") => rounded(to, &format!("(float){a}")),
        ("int", "int") if to == DType::I32 => a.to_string(),
        ("int", "bool") => format!("({a} != 0)"),
        ("bool", "int") if to == DType::I32 => format!("(int){a}"),
        ("bool", "bool") => a.to_string(),
        _ => return Err(CudaError::Unsupported(format!("convert {from} to {to}"))),
    })
}

/// Writes `lines` (already indented) into `out`.
pub(crate) fn write_lines(out: &mut String, lines: &[String]) {
    for l in lines {
        writeln!(out, "{l}").unwrap();
    }
}
