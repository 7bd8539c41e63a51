//! One kernel call's CUDA C from its IR function and launch, a device function that a launch's
//! kernel calls on the call's blocks (`launch_code`), in one of six forms: one thread per element
//! written (`elementwise`), one thread per cache slot written (`scatter`, in place), a reduction
//! split over a warp or a block per output, or over a block's warps (`split_reduce`, with the
//! prelude), the tiled matvec (`matvec`: activations staged in shared memory, the weight streamed
//! once, a warp per output column; 4-bit weights `packed_matvec`, the block's threads splitting the
//! contraction a word at a time), the tensor-core GEMM (`gemm`), or a decode step's attention over
//! one chunk of cache slots per block (`attention`). The first two are `pointwise`, the reductions
//! `reduce`, the others modules of their names; `packed` reads 4-bit weights for the matvec and
//! the GEMM. The reducing forms but the last apply the kernel's epilogue to their sums
//! (`store_root`).

mod ahead;
mod attention;
mod gemm;
mod matvec;
mod packed;
mod pointwise;
mod reduce;

use attention::{attention, attention_shared_arrays};
use gemm::gemm;
use matvec::matvec;
use pointwise::{elementwise, scatter};
use reduce::{prelude, split_reduce};

use super::elemental::{rounded, storage_type, store, unlinear, value_type, write_lines, Emitter};
use super::shared::{SharedArrays, REGION};
use super::CudaError;
use g4c_ir::plan::{KernelCall, KernelKind, SharedRegion, SplitSums, Tile};
use g4c_ir::{DType, Function, Op, ValueId};
use g4c_passes::{attention_of, footprint, matvec_of, reduction_of, split_footprint, Matvec};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Stands for the kernel's symbol until its code is hashed.
pub(crate) const NAME: &str = "__KERNEL__";

/// The name of a split GEMM's split-sums parameter.
const SPLIT_SUMS: &str = "sums";

/// The CUDA C of one kernel call, as a device function `name` its launch calls with the call's
/// block index (from 0, a launch may run calls side by side), and the weights it takes after its
/// inputs.
pub(crate) struct KernelCode {
    pub code: String,
    /// The C type of each parameter, in order (its inputs, weights, then output), the block
    /// index aside.
    pub params: Vec<String>,
    pub weights: Vec<String>,
    /// Whether it takes its launch's shared region (after the block index).
    pub shared: bool,
}

/// `bf16_math`: the GPU computes in bf16 (sm_80 and later).
pub(crate) fn kernel_code(
    k: &Function,
    call: &KernelCall,
    name: &str,
    bf16_math: bool,
) -> Result<KernelCode, CudaError> {
    let root = k.results[0].value;
    let root_op = k.body.iter().find(|i| i.result == root).map(|i| &i.op);
    let mut em = Emitter::new(k, name);
    em.bf16_math = bf16_math;
    let mut in_place = None;
    // A split GEMM takes its entry's split-sums buffer after its output.
    let mut split_sums = false;
    // Every block of a launch runs one call, which waits for the kernel before it once, after
    // what its template does ahead (`Emitter::ahead`; a matvec asks for its weights).
    // After the template's arrays, which are 16-byte aligned, so none is padded.
    let prelude_arrays = match call.launch.prelude {
        Some(_) => prelude(&mut em, call)?,
        None => SharedArrays::default(),
    };
    let grid = call.launch.grid;
    let mut shared = SharedArrays::default();
    match (root_op, call.launch.tile, matvec_of(k)) {
        (Some(Op::UpdateSlots { operand, slots, updates, axis }), _, _) => {
            in_place = k.params.iter().position(|p| p.value == *operand);
            let j = in_place
                .ok_or_else(|| CudaError::Unsupported("a cache write of a value that is not an input".into()))?;
            scatter(&mut em, grid, j, *operand, *slots, *updates, *axis)?;
        }
        _ if call.kind == KernelKind::Attention => {
            let unsupported =
                || CudaError::Unsupported(format!("{}: an attention kernel's plan is not its own", k.name));
            let (split, a) = (call.launch.slots.ok_or_else(unsupported)?, attention_of(k).ok_or_else(unsupported)?);
            attention_shared_arrays(&mut shared, &split);
            attention(&mut em, &split, &a, root, call.launch.block / 32)?;
        }
        (_, Some(tile), Some(m)) if tile.mma.is_some() => {
            let f = footprint(&tile);
            shared.aligned("u16", "as_", f.staged_activations / 2);
            shared.aligned("u16", "ws_", f.staged_weights / 2);
            let split = split_sums_of(call, &tile, &k.name)?;
            gemm(&mut em, (&tile, call.launch.block), &m, root, split)?;
            split_sums = split.is_some();
        }
        (_, Some(tile), Some(m)) => {
            // 16-byte aligned for the 128-bit loads of packed products; a packed matvec's partial
            // sums after the activations.
            shared.aligned("float", "act", footprint(&tile).smem_bytes / 4);
            let split = split_sums_of(call, &tile, &k.name)?;
            matvec(&mut em, (&tile, call.launch.block / 32, grid), &m, root, split)?;
            split_sums = split.is_some();
        }
        (_, Some(_), None) => return Err(CudaError::Unsupported(format!("{}: a tile but no matvec", k.name))),
        (_, None, _) => match call.launch.split {
            Some(split) => {
                // Partial results in the accumulator's type (`float` or `int`: 4 bytes either way).
                let partials = split_footprint(split, call.launch.block) / 4;
                let acc = reduction_of(k).map_or("float", |r| value_type(k.ty(r.reduction).dtype));
                if partials > 0 {
                    shared.array(acc, "part", partials);
                }
                split_reduce(&mut em, root, split, (call.launch.block / 32, grid))?
            }
            None => elementwise(&mut em, grid, root)?,
        },
    }
    shared.append(prelude_arrays);
    // The fit proof's bytes are the kernel's: the arrays must fit what the plan gave the call.
    if shared.bytes() > u64::from(call.launch.smem_bytes) {
        return Err(CudaError::Unsupported(format!(
            "{}: shared arrays of {} bytes where the plan gives {}",
            k.name,
            shared.bytes(),
            call.launch.smem_bytes
        )));
    }
    // (C type, name) of each parameter.
    let mut params: Vec<(String, String)> = k
        .params
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let st = storage_type(k.ty(p.value).dtype);
            let ty = match in_place == Some(j) {
                true => format!("{st}*"),
                false => format!("const {st}* __restrict__"),
            };
            (ty, format!("in{j}"))
        })
        .collect();
    // What a kernel before may write or read: all but the weights, which the wait names.
    let mut written: Vec<String> = params.iter().map(|(_, n)| n.clone()).collect();
    for (j, w) in em.weights.iter().enumerate() {
        let dtype = weight_dtype(k, w).expect("a weight the kernel reads");
        params.push((format!("const {}* __restrict__", storage_type(dtype)), format!("w{j}")));
    }
    if in_place.is_none() {
        params.push((format!("{}* __restrict__", storage_type(k.ty(root).dtype)), "out".into()));
        written.push("out".into());
    }
    if split_sums {
        params.push(("unsigned char* __restrict__".into(), SPLIT_SUMS.into()));
        written.push(SPLIT_SUMS.into());
    }
    // A tail runs after its call, which waited.
    let wait = match call.tail {
        true => "written_in_this_kernel",
        false => "await_previous_kernel",
    };
    let lines = em.take_lines(&format!("{wait}({});", written.join(", ")));
    let declared: Vec<String> = params.iter().map(|(t, n)| format!("{t} {n}")).collect();
    let mut code = String::new();
    for c in &em.constants {
        writeln!(code, "{c}").unwrap();
    }
    // With shared arrays, the body takes them as parameters of its own (`SharedArrays::params`),
    // and the call's function carves them out of the launch's region.
    let body = match shared.is_empty() {
        true => name.to_string(),
        false => format!("{name}_arrays"),
    };
    let arrays: String = shared.params().iter().map(|p| format!(", {p}")).collect();
    writeln!(
        code,
        "static __device__ __forceinline__ void {body}({}, const int block{arrays}) {{",
        declared.join(", ")
    )
    .unwrap();
    write_lines(&mut code, &lines);
    code.push_str("}\n");
    if !shared.is_empty() {
        let names: Vec<&str> = params.iter().map(|(_, n)| n.as_str()).collect();
        writeln!(
            code,
            "static __device__ __forceinline__ void {name}({}, const int block, unsigned char* const {REGION}) {{\n  \
             {body}({}, block, {});\n}}",
            declared.join(", "),
            names.join(", "),
            shared.args().join(", ")
        )
        .unwrap();
    }
    Ok(KernelCode {
        code,
        params: params.into_iter().map(|(t, _)| t).collect(),
        weights: em.weights,
        shared: !shared.is_empty(),
    })
}

/// The CUDA C of one launch, named `NAME`: each call's device function (`{NAME}_{n}`), then the
/// kernel, whose blocks run the calls' one after the other, each call's block index from 0, and a
/// call's tail on its last block to finish (`last_block_of`, counting in the tail's part of the
/// split-sums buffer, its last argument). It lets the next kernel start (`let_next_kernel_start`,
/// for programmatic dependent launch); each call waits for the kernel before it (`kernel_code`).
pub(crate) fn launch_code(calls: &[KernelCall], parts: &[KernelCode], registers_per_sm: u32) -> String {
    let mut code: String = parts.iter().map(|p| p.code.as_str()).collect();
    let mut params = Vec::new();
    let mut branches: Vec<(u32, String)> = Vec::new();
    let mut first_block = 0;
    for (n, (call, part)) in calls.iter().zip(parts).enumerate() {
        let args: Vec<String> = (params.len()..params.len() + part.params.len()).map(|a| format!("a{a}")).collect();
        // A tail reads its host's output, which the host writes: neither pointer is the only one
        // to that buffer in the kernel (an output in place is not `__restrict__` already).
        let hosting = calls.get(n + 1).is_some_and(|next| next.tail);
        let output = call.inputs.len() + part.weights.len();
        let aliased = |j: usize| match call.tail {
            true => call.inputs.get(j) == Some(&calls[n - 1].output),
            false => hosting && j == output,
        };
        params.extend(part.params.iter().zip(&args).enumerate().map(|(j, (t, a))| match aliased(j) {
            true => format!("{} {a}", t.replace(" __restrict__", "")),
            false => format!("{t} {a}"),
        }));
        let region = match part.shared {
            true => format!(", {REGION}"),
            false => String::new(),
        };
        if call.tail {
            let (count, host) = (format!("a{}", params.len()), &calls[n - 1]);
            params.push(format!("unsigned char* __restrict__ {count}"));
            let offset = call.split_sums.expect("a tail has its count's place").counts;
            let (_, host_call) = branches.last_mut().expect("a tail follows its call");
            *host_call = format!(
                "{{ {host_call} if (last_block_of(reinterpret_cast<unsigned*>({count} + {offset}), {})) {NAME}_{n}({}, 0{region}); }}",
                host.launch.grid,
                args.join(", ")
            );
            continue;
        }
        let block = match first_block {
            0 => "blockIdx.x".to_string(),
            b => format!("blockIdx.x - {b}"),
        };
        branches.push((first_block + call.launch.grid, format!("{NAME}_{n}({}, {block}{region});", args.join(", "))));
        first_block += call.launch.grid;
    }
    // The blocks per SM that the register budget the plan gives each thread leaves room for:
    // ptxas keeps to that budget (without it, ptxas aims at more resident blocks and spills a
    // tensor-core kernel at 32 registers).
    let launch = &calls[0].launch;
    writeln!(
        code,
        "extern \"C\" __global__ void __launch_bounds__({}, {}) {NAME}({}) {{",
        launch.block,
        (registers_per_sm / (launch.block * launch.registers)).max(1),
        params.join(", ")
    )
    .unwrap();
    code.push_str("  let_next_kernel_start();\n");
    // One region for the launch: each block runs one call, and uses that call's arrays only.
    if parts.iter().any(|p| p.shared) {
        let line = match SharedRegion::of(calls) {
            SharedRegion::Static(bytes) => format!("STATIC_REGION({REGION}, {bytes})"),
            SharedRegion::Dynamic(bytes) => format!("DYNAMIC_REGION({REGION}, {bytes})"),
        };
        writeln!(code, "  {line};").unwrap();
    }
    let last = branches.len() - 1;
    for (n, (end, call)) in branches.iter().enumerate() {
        let line = match (n, n == last) {
            (0, true) => format!("  {call}"),
            (0, false) => format!("  if (blockIdx.x < {end}) {call}"),
            (_, false) => format!("  else if (blockIdx.x < {end}) {call}"),
            (_, true) => format!("  else {call}"),
        };
        writeln!(code, "{line}").unwrap();
    }
    code.push_str("}\n");
    code
}

/// A split tile's parts of its entry's split-sums buffer (`None` where the tile is not split).
fn split_sums_of(call: &KernelCall, tile: &Tile, kernel: &str) -> Result<Option<SplitSums>, CudaError> {
    match (tile.splits > 1, call.split_sums) {
        (false, _) => Ok(None),
        (true, Some(sums)) => Ok(Some(sums)),
        (true, None) => Err(CudaError::Unsupported(format!("{kernel}: a split tile without its split sums"))),
    }
}

fn weight_dtype(k: &Function, name: &str) -> Option<DType> {
    k.body.iter().find_map(|i| match &i.op {
        Op::Weight { name: n } if n == name => Some(k.ty(i.result).dtype),
        _ => None,
    })
}

/// Stores the root's element `i` (a C variable), with each of `sums` (a reduction or product of
/// the kernel, and the f32 expression of its element `i`) rounded to its type and bound, so the
/// epilogue from it to the root is computed on it.
fn store_root(em: &mut Emitter, sums: &[(ValueId, String)], root: ValueId) -> Result<(), CudaError> {
    for (v, sum) in sums {
        let dtype = em.k.ty(*v).dtype;
        let value = em.var(value_type(dtype), "d", &rounded(dtype, sum));
        em.bound.insert(*v, value);
    }
    let root_ty = em.k.ty(root).clone();
    let x = em.value(root, &unlinear("i", &root_ty.shape))?;
    em.line(store(root_ty.dtype, "out", "i", &x));
    Ok(())
}

/// Declares `float {name}`: the activation of a matrix product at row `row` and contraction index
/// `kk` (C expressions), its prologue computed, or 0 past the `rows × depth` edges those `edges`
/// say the index may cross.
fn activation_at(
    em: &mut Emitter,
    m: &Matvec,
    name: &str,
    (row, kk): (&str, &str),
    edges: Edges,
) -> Result<(), CudaError> {
    let (rows, depth) = (m.rows, m.depth);
    let lhs_shape = em.k.ty(m.lhs).shape.clone();
    let (inside, row, kk) = clamped(em, (row, rows), (kk, depth), 1, edges);
    let lin = em.var("int", "l", &format!("{row} * {depth} + {kk}"));
    let x = em.value(m.lhs, &unlinear(&lin, &lhs_shape))?;
    em.line(format!("const float {name} = {};", inside.select(&x, "0.f")));
    Ok(())
}

/// Which edges of a staged `rows × depth` operand a template's index may run past: those of a
/// partial tile. A GEMM whose rows (or columns) and depth are whole tiles never does, and then
/// reads at its indices as they are. On t4g, E2B's prefill of 4 prompts of 128 tokens (`g4c
/// serve`'s 8 of 64 alike) spilled 16–104 bytes with each of a thread's 32 activation rows a step
/// clamped by a `min` of its own; without the clamps, the GEMMs reading the most values an
/// activation spilled at one prompt instead, which `STAGED_READS` (`launch.rs`) keeps within.
#[derive(Clone, Copy, Debug)]
pub(super) struct Edges {
    /// Past the last row (of a weight: the last output column).
    pub rows: bool,
    /// Past the end of the contraction.
    pub depth: bool,
}

impl Edges {
    /// The edges of a tile of `tile_rows × tile_depth` over `rows × depth` that are partial.
    pub(super) fn of_tiles((rows, tile_rows): (usize, usize), (depth, tile_depth): (usize, usize)) -> Edges {
        Edges { rows: !rows.is_multiple_of(tile_rows), depth: !depth.is_multiple_of(tile_depth) }
    }

    /// Both edges: a template whose index may run past either (one that does not stage whole tiles).
    pub(super) const ANY: Edges = Edges { rows: true, depth: true };
}

/// Whether a clamped index was inside its operand: a C condition, or none where it always is.
pub(super) struct Inside(Option<String>);

impl Inside {
    /// `x` inside, `outside` past an edge: a C expression.
    pub(super) fn select(&self, x: &str, outside: &str) -> String {
        match &self.0 {
            Some(inside) => format!("{inside} ? {x} : {outside}"),
            None => x.to_string(),
        }
    }
}

/// Whether `(row, kk)` (C expressions) lies inside `rows × depth`, and the nearest index inside it
/// (`kk` kept a multiple of `align`, which divides `depth`), along the `edges` it may cross: a C
/// variable or none, and two C expressions. Staging loops read at the clamped index and select 0
/// outside, rather than branch around the reads: a branch per element keeps the compiler from
/// issuing the next elements' loads before this one's arrive, so each element would wait out a
/// memory latency (the prefill GEMMs' 32-deep steps took about 3 µs on the H200, eight such waits).
fn clamped(
    em: &mut Emitter,
    (row, rows): (&str, usize),
    (kk, depth): (&str, usize),
    align: usize,
    edges: Edges,
) -> (Inside, String, String) {
    let crossed = [(row, rows, edges.rows), (kk, depth, edges.depth)].into_iter().filter(|&(.., c)| c);
    let tests: Vec<String> = crossed.map(|(x, len, _)| format!("{x} < {len}")).collect();
    let inside = (!tests.is_empty()).then(|| em.var("bool", "within", &tests.join(" && ")));
    let mut clamp = |x: &str, stem: &str, last: usize, crossed: bool| match crossed {
        true => em.var("int", stem, &format!("min({x}, {last})")),
        false => x.to_string(),
    };
    let (row, kk) = (clamp(row, "rc", rows - 1, edges.rows), clamp(kk, "kc", depth - align, edges.depth));
    (Inside(inside), row, kk)
}

/// Whether `v` in kernel `k` is computed from weights (and constants) alone, elementwise: no
/// kernel input, which the kernel before may write, and no reduction, which a prelude computes
/// after the wait. What a block may compute before it waits for the kernel before it.
fn reads_only_weights(k: &Function, v: ValueId) -> bool {
    let def: HashMap<ValueId, &Op> = k.body.iter().map(|i| (i.result, &i.op)).collect();
    let (mut stack, mut seen) = (vec![v], HashSet::new());
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        match def.get(&v) {
            None | Some(Op::Reduce { .. } | Op::DotGeneral { .. }) => return false,
            Some(op) => stack.extend(op.operands()),
        }
    }
    true
}
