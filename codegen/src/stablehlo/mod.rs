//! Lowers one IR entry point to a StableHLO module whose `@main` XLA compiles, built with melior in
//! generic op form (MLIR 22 has no StableHLO dialect; PJRT's compiler is the semantic verifier).
//!
//! Signature of `@main`: the entry point's call arguments (`Function::call_args`: its parameters in
//! order, then one argument per weight it reads, in order of first use), so the runtime uploads
//! weights once and passes them every call. Results are the entry point's results. Each state
//! parameter is donated to its next value (`Function::donations`, as `tf.aliasing_output`), so
//! caches are updated in place.

mod text;

use crate::CodegenError;
use g4c_ir::{
    BinaryOp, CallArg, CompareDir, DType, Function, Literal, Module, Op, ReduceKind, TensorType, UnaryOp, ValueId,
};
use melior::ir::attribute::{ArrayAttribute, DictionaryAttribute, StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationBuilder, OperationLike, OperationPrintingFlags, OperationRef};
use melior::ir::r#type::FunctionType;
use melior::ir::{Attribute, Block, Identifier, Location, Module as MlirModule, Region, RegionLike, Type, Value};
use melior::Context;
use std::collections::HashMap;
use text::{dense_attr, i64_array, int_list, tensor_type};

type LResult<T> = Result<T, String>;

/// The StableHLO module (generic-form MLIR text) of entry point `entry`.
pub fn lower_entry(module: &Module, entry: &str) -> Result<String, CodegenError> {
    let f = module
        .function(entry)
        .ok_or_else(|| CodegenError::Lowering { function: entry.to_string(), message: "no such function".into() })?;
    lower_function(module, f).map_err(|message| CodegenError::Lowering { function: f.name.clone(), message })
}

fn lower_function(module: &Module, f: &Function) -> LResult<String> {
    let ctx = Context::new();
    ctx.set_allow_unregistered_dialects(true);
    let loc = Location::unknown(&ctx);
    let ty = |t: &TensorType| -> LResult<Type> {
        Type::parse(&ctx, &tensor_type(t)).ok_or_else(|| format!("MLIR rejected type {}", tensor_type(t)))
    };

    let mut input_types: Vec<TensorType> = vec![];
    let mut weight_arg: HashMap<&str, usize> = HashMap::new();
    for (i, arg) in f.call_args().into_iter().enumerate() {
        input_types.push(match arg {
            CallArg::Param(p) => f.ty(f.params[p].value).clone(),
            CallArg::Weight(name) => {
                weight_arg.insert(name, i);
                module.weight(name).ok_or_else(|| format!("no weight @{name}"))?.ty.clone()
            }
        });
    }
    let donated = f.donations();

    let arg_types: Vec<Type> = input_types.iter().map(ty).collect::<LResult<_>>()?;
    let result_types: Vec<Type> = f.results.iter().map(|r| ty(f.ty(r.value))).collect::<LResult<_>>()?;
    let block = Block::new(&arg_types.iter().map(|t| (*t, loc)).collect::<Vec<_>>());
    {
        let mut lowering = FunctionLowering { ctx: &ctx, loc, block: &block, values: HashMap::new() };
        for (i, p) in f.params.iter().enumerate() {
            lowering.values.insert(p.value, block.argument(i).map_err(|e| e.to_string())?.into());
        }
        for instr in &f.body {
            let v = match &instr.op {
                Op::Weight { name } => block.argument(weight_arg[name.as_str()]).map_err(|e| e.to_string())?.into(),
                op => lowering.lower(f, op, f.ty(instr.result))?,
            };
            lowering.values.insert(instr.result, v);
        }
        let results: Vec<Value> = f.results.iter().map(|r| lowering.values[&r.value]).collect();
        block.append_operation(
            OperationBuilder::new("func.return", loc).add_operands(&results).build().map_err(|e| e.to_string())?,
        );
    }
    let region = Region::new();
    region.append_block(block);

    let arg_attrs: Vec<Attribute> = (0..input_types.len())
        .map(|i| {
            let entries: Vec<(Identifier, Attribute)> = donated
                .iter()
                .filter(|(a, _)| *a == i)
                .map(|(_, o)| {
                    Ok((Identifier::new(&ctx, "tf.aliasing_output"), parse_attr(&ctx, &format!("{o} : i32"))?))
                })
                .collect::<LResult<_>>()?;
            Ok(DictionaryAttribute::new(&ctx, &entries).into())
        })
        .collect::<LResult<_>>()?;
    let function_type = FunctionType::new(&ctx, &arg_types, &result_types);
    let func = OperationBuilder::new("func.func", loc)
        .add_attributes(&[
            (Identifier::new(&ctx, "sym_name"), StringAttribute::new(&ctx, "main").into()),
            (Identifier::new(&ctx, "function_type"), TypeAttribute::new(function_type.into()).into()),
            (Identifier::new(&ctx, "arg_attrs"), ArrayAttribute::new(&ctx, &arg_attrs).into()),
        ])
        .add_regions([region])
        .build()
        .map_err(|e| e.to_string())?;
    let mlir_module = MlirModule::new(loc);
    mlir_module.body().append_operation(func);
    if !mlir_module.as_operation().verify() {
        return Err("the generated module does not verify".into());
    }
    mlir_module
        .as_operation()
        .to_string_with_flags(OperationPrintingFlags::new().print_generic_operation_form())
        .map_err(|e| e.to_string())
}

fn parse_attr<'c>(ctx: &'c Context, text: &str) -> LResult<Attribute<'c>> {
    Attribute::parse(ctx, text).ok_or_else(|| format!("MLIR rejected attribute `{text}`"))
}

struct FunctionLowering<'c, 'b> {
    ctx: &'c Context,
    loc: Location<'c>,
    block: &'b Block<'c>,
    values: HashMap<ValueId, Value<'c, 'b>>,
}

impl<'c, 'b> FunctionLowering<'c, 'b> {
    fn ty(&self, t: &TensorType) -> LResult<Type<'c>> {
        Type::parse(self.ctx, &tensor_type(t)).ok_or_else(|| format!("MLIR rejected type {}", tensor_type(t)))
    }

    /// Appends `name(operands) {attrs}` with one result of type `result` (and optional regions).
    fn emit_in(
        &self,
        block: &Block<'c>,
        name: &str,
        operands: &[Value<'c, '_>],
        attrs: &[(&str, String)],
        result: &TensorType,
        regions: Vec<Region<'c>>,
    ) -> LResult<Value<'c, 'b>> {
        let attrs: Vec<(Identifier, Attribute)> = attrs
            .iter()
            .map(|(k, v)| Ok((Identifier::new(self.ctx, k), parse_attr(self.ctx, v)?)))
            .collect::<LResult<_>>()?;
        let op = OperationBuilder::new(name, self.loc)
            .add_operands(operands)
            .add_attributes(&attrs)
            .add_results(&[self.ty(result)?])
            .add_regions_vec(regions)
            .build()
            .map_err(|e| format!("{name}: {e}"))?;
        let op: OperationRef<'c, 'b> = block.append_operation(op);
        Ok(op.result(0).map_err(|e| e.to_string())?.into())
    }

    fn emit(
        &self,
        name: &str,
        operands: &[Value<'c, 'b>],
        attrs: &[(&str, String)],
        result: &TensorType,
    ) -> LResult<Value<'c, 'b>> {
        self.emit_in(self.block, name, operands, attrs, result, vec![])
    }

    fn constant(&self, lit: &Literal, ty: &TensorType) -> LResult<Value<'c, 'b>> {
        self.emit("stablehlo.constant", &[], &[("value", dense_attr(lit, ty))], ty)
    }

    /// A region with one block of two scalar arguments of `dtype`, returning `body(a, b)`.
    fn scalar_region(
        &self,
        dtype: DType,
        body: impl FnOnce(&Self, &Block<'c>, Value<'c, 'b>, Value<'c, 'b>) -> LResult<Value<'c, 'b>>,
    ) -> LResult<Region<'c>> {
        let scalar = TensorType::scalar(dtype);
        let t = self.ty(&scalar)?;
        let block = Block::new(&[(t, self.loc), (t, self.loc)]);
        let a: Value<'c, 'b> = block.argument(0).map_err(|e| e.to_string())?.into();
        let b: Value<'c, 'b> = block.argument(1).map_err(|e| e.to_string())?.into();
        let out = body(self, &block, a, b)?;
        block.append_operation(
            OperationBuilder::new("stablehlo.return", self.loc)
                .add_operands(&[out])
                .build()
                .map_err(|e| e.to_string())?,
        );
        let region = Region::new();
        region.append_block(block);
        Ok(region)
    }

    fn lower(&self, f: &Function, op: &Op, out: &TensorType) -> LResult<Value<'c, 'b>> {
        let v = |id: &ValueId| self.values[id];
        let t = |id: &ValueId| f.ty(*id);
        match op {
            Op::Weight { .. } => unreachable!("weights are function arguments"),
            Op::Constant { literal } => self.constant(literal, out),
            Op::Iota { dim } => self.emit("stablehlo.iota", &[], &[("iota_dimension", format!("{dim} : i64"))], out),
            Op::Unary { op, x } => {
                let name = match op {
                    UnaryOp::Neg => "stablehlo.negate",
                    UnaryOp::Abs => "stablehlo.abs",
                    UnaryOp::Exp => "stablehlo.exponential",
                    UnaryOp::Log => "stablehlo.log",
                    UnaryOp::Tanh => "stablehlo.tanh",
                    UnaryOp::Sqrt => "stablehlo.sqrt",
                    UnaryOp::Rsqrt => "stablehlo.rsqrt",
                    UnaryOp::Sign => "stablehlo.sign",
                    UnaryOp::Sin => "stablehlo.sine",
                    UnaryOp::Cos => "stablehlo.cosine",
                    UnaryOp::Not => "stablehlo.not",
                };
                self.emit(name, &[v(x)], &[], out)
            }
            Op::Binary { op, lhs, rhs } => self.emit(binary_name(*op), &[v(lhs), v(rhs)], &[], out),
            Op::Compare { lhs: x, rhs: y, dir } => {
                let dir = match dir {
                    CompareDir::Eq => "EQ",
                    CompareDir::Ne => "NE",
                    CompareDir::Lt => "LT",
                    CompareDir::Le => "LE",
                    CompareDir::Gt => "GT",
                    CompareDir::Ge => "GE",
                };
                let kind = match t(x).dtype {
                    d if d.is_float() => "FLOAT",
                    DType::Bool => "UNSIGNED",
                    _ => "SIGNED",
                };
                self.emit(
                    "stablehlo.compare",
                    &[v(x), v(y)],
                    &[
                        ("comparison_direction", format!("#stablehlo<comparison_direction {dir}>")),
                        ("compare_type", format!("#stablehlo<comparison_type {kind}>")),
                    ],
                    out,
                )
            }
            Op::Select { cond, on_true, on_false } => {
                self.emit("stablehlo.select", &[v(cond), v(on_true), v(on_false)], &[], out)
            }
            Op::Convert { x } => self.emit("stablehlo.convert", &[v(x)], &[], out),
            Op::Reduce { kind, input, axes } => {
                let dtype = out.dtype;
                let init = match (kind, dtype.is_float()) {
                    (ReduceKind::Sum, _) => 0.0,
                    (ReduceKind::Max, true) => f64::NEG_INFINITY,
                    (ReduceKind::Min, true) => f64::INFINITY,
                    (ReduceKind::Max, false) => g4c_ir::scalar::int_range(dtype).0 as f64,
                    (ReduceKind::Min, false) => g4c_ir::scalar::int_range(dtype).1 as f64,
                };
                let init = self.constant(&Literal::Splat(init), &TensorType::scalar(dtype))?;
                let combine = match kind {
                    ReduceKind::Sum => "stablehlo.add",
                    ReduceKind::Max => "stablehlo.maximum",
                    ReduceKind::Min => "stablehlo.minimum",
                };
                let region = self.scalar_region(dtype, |s, block, a, b| {
                    s.emit_in(block, combine, &[a, b], &[], &TensorType::scalar(dtype), vec![])
                })?;
                self.emit_in(self.block, "stablehlo.reduce", &[v(input), init], &[("dimensions", i64_array(axes))], out, vec![region])
            }
            Op::Reshape { x } => self.emit("stablehlo.reshape", &[v(x)], &[], out),
            Op::Transpose { input, perm } => {
                self.emit("stablehlo.transpose", &[v(input)], &[("permutation", i64_array(perm))], out)
            }
            Op::Broadcast { input, dims } => {
                self.emit("stablehlo.broadcast_in_dim", &[v(input)], &[("broadcast_dimensions", i64_array(dims))], out)
            }
            Op::Slice { input, start, limit } => self.emit(
                "stablehlo.slice",
                &[v(input)],
                &[
                    ("start_indices", i64_array(start)),
                    ("limit_indices", i64_array(limit)),
                    ("strides", i64_array(&vec![1; start.len()])),
                ],
                out,
            ),
            Op::Concat { inputs, axis } => {
                let vals: Vec<Value> = inputs.iter().map(v).collect();
                self.emit("stablehlo.concatenate", &vals, &[("dimension", format!("{axis} : i64"))], out)
            }
            Op::DotGeneral { lhs, rhs, dims } => self.emit(
                "stablehlo.dot_general",
                &[v(lhs), v(rhs)],
                &[(
                    "dot_dimension_numbers",
                    format!(
                        "#stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
                        int_list(&dims.lhs_batch),
                        int_list(&dims.rhs_batch),
                        int_list(&dims.lhs_contract),
                        int_list(&dims.rhs_contract)
                    ),
                )],
                out,
            ),
            Op::Gather { table, indices } => {
                let (tt, it) = (t(table), t(indices));
                let idx_rank = it.rank();
                let offset_dims: Vec<usize> = (idx_rank..idx_rank + tt.rank() - 1).collect();
                let mut slice_sizes = tt.shape.clone();
                slice_sizes[0] = 1;
                self.emit(
                    "stablehlo.gather",
                    &[v(table), v(indices)],
                    &[
                        (
                            "dimension_numbers",
                            format!(
                                "#stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {idx_rank}>",
                                int_list(&offset_dims)
                            ),
                        ),
                        ("slice_sizes", i64_array(&slice_sizes)),
                        ("indices_are_sorted", "false".into()),
                    ],
                    out,
                )
            }
            Op::UpdateSlots { operand, slots, updates, axis } => self.update_slots(f, v(operand), *slots, v(updates), *axis, out),
            Op::Dequantize { q, scale, group } => self.dequantize(v(q), t(q), v(scale), t(scale), *group, out),
        }
    }

    /// `dequantize` as `q` and the scales converted to f32, the values viewed as `[..., groups,
    /// group]`, multiplied by the scales broadcast along each group, and the product converted to the
    /// result type.
    fn dequantize(
        &self,
        q: Value<'c, 'b>,
        q_ty: &TensorType,
        scale: Value<'c, 'b>,
        scale_ty: &TensorType,
        group: usize,
        out: &TensorType,
    ) -> LResult<Value<'c, 'b>> {
        let rank = q_ty.rank();
        let mut grouped = scale_ty.shape.clone();
        grouped.push(group);
        let f32_of = |shape: &[usize]| TensorType::new(DType::F32, shape.to_vec());
        let qf = self.emit("stablehlo.convert", &[q], &[], &f32_of(&q_ty.shape))?;
        let qg = self.emit("stablehlo.reshape", &[qf], &[], &f32_of(&grouped))?;
        let sf = self.emit("stablehlo.convert", &[scale], &[], &f32_of(&scale_ty.shape))?;
        let dims: Vec<usize> = (0..rank).collect();
        let sg = self.emit(
            "stablehlo.broadcast_in_dim",
            &[sf],
            &[("broadcast_dimensions", i64_array(&dims))],
            &f32_of(&grouped),
        )?;
        let product = self.emit("stablehlo.multiply", &[qg, sg], &[], &f32_of(&grouped))?;
        let flat = self.emit("stablehlo.reshape", &[product], &[], &f32_of(&q_ty.shape))?;
        if out.dtype == DType::F32 {
            return Ok(flat);
        }
        self.emit("stablehlo.convert", &[flat], &[], out)
    }

    /// `update_slots` as a scatter whose index vectors are `(row, slot)`. Negative slots are out of
    /// bounds, and XLA skips out-of-bounds scatter updates, so padding writes nothing.
    fn update_slots(
        &self,
        f: &Function,
        operand: Value<'c, 'b>,
        slots: ValueId,
        updates: Value<'c, 'b>,
        axis: usize,
        out: &TensorType,
    ) -> LResult<Value<'c, 'b>> {
        let st = f.ty(slots);
        let (b, t) = (st.shape[0], st.shape[1]);
        let column = TensorType::new(DType::I32, [b, t, 1]);
        let rows = self.emit("stablehlo.iota", &[], &[("iota_dimension", "0 : i64".into())], &column)?;
        let slot_column = self.emit("stablehlo.reshape", &[self.values[&slots]], &[], &column)?;
        let index = self.emit(
            "stablehlo.concatenate",
            &[rows, slot_column],
            &[("dimension", "2 : i64".into())],
            &TensorType::new(DType::I32, [b, t, 2]),
        )?;
        let window: Vec<usize> = (1..out.rank()).filter(|&d| d != axis).collect();
        let region = self.scalar_region(out.dtype, |_, _, _, update| Ok(update))?;
        self.emit_in(
            self.block,
            "stablehlo.scatter",
            &[operand, index, updates],
            &[
                (
                    "scatter_dimension_numbers",
                    format!(
                        "#stablehlo.scatter<update_window_dims = {}, inserted_window_dims = [0, {axis}], scatter_dims_to_operand_dims = [0, {axis}], index_vector_dim = 2>",
                        int_list(&window)
                    ),
                ),
                ("indices_are_sorted", "false".into()),
                ("unique_indices", "false".into()),
            ],
            out,
            vec![region],
        )
    }
}

fn binary_name(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "stablehlo.add",
        BinaryOp::Sub => "stablehlo.subtract",
        BinaryOp::Mul => "stablehlo.multiply",
        BinaryOp::Div => "stablehlo.divide",
        BinaryOp::Max => "stablehlo.maximum",
        BinaryOp::Min => "stablehlo.minimum",
        BinaryOp::Pow => "stablehlo.power",
        BinaryOp::Rem => "stablehlo.remainder",
        BinaryOp::And => "stablehlo.and",
        BinaryOp::Or => "stablehlo.or",
    }
}
