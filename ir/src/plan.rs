//! Kernel plans: how a GPU backend runs an entry point, as data. An entry point is split into
//! kernels (fused groups of ops); each kernel is itself an IR function (its inputs are parameters,
//! its one output a result), so the interpreter can run a plan kernel by kernel and codegen lowers
//! each kernel from IR it already knows. Between kernels, values live in the entry's parameters
//! (inputs and state, which update-in-place kernels write) or in scratch buffers, reused once their
//! value is dead. The text form (`print_plan`) shows each kernel's ops, launch and budget.

use crate::target::STATIC_SMEM_PER_BLOCK;
use crate::{print_function, MmaShape, Module};
use std::fmt::Write;

/// Where a value lives between kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// Parameter `i` of the entry point (an input, or state updated in place).
    Param(usize),
    /// Scratch buffer `i` of the entry's plan.
    Scratch(usize),
}

impl Slot {
    pub fn label(&self) -> String {
        match self {
            Slot::Param(i) => format!("p{i}"),
            Slot::Scratch(i) => format!("b{i}"),
        }
    }
}

/// What a kernel computes, which decides the code template and tiling it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A matrix product with a 4-bit weight dequantized inside, for at most `MATVEC_MAX_ROWS` rows
    /// (decode): bound by reading the weight once.
    MatvecW4,
    /// The same for more rows (prefill): tensor-core tiles.
    GemmW4,
    /// A matrix product with a 16- or 32-bit weight, few rows.
    Matvec,
    /// The same, more rows.
    Gemm,
    /// A product of two activations (attention scores, attention-weighted values).
    Dot,
    /// A decode step's attention over one chunk of cache slots per block, for every query head:
    /// scores, their maximum and sum, and the weighted sum of values (`split-attention`).
    Attention,
    /// Rows reduced (norm statistics, softmax sums), with the ops around them.
    Reduce,
    /// Rows of a table selected by indices (embeddings).
    Gather,
    /// Cache slots written in place.
    Scatter,
    /// Elementwise ops and index maps (and any reductions in its prelude).
    Loop,
}

/// Decode steps multiply at most this many rows; beyond it a matrix product is a GEMM.
pub const MATVEC_MAX_ROWS: usize = 8;

impl KernelKind {
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::MatvecW4 => "matvec_w4",
            KernelKind::GemmW4 => "gemm_w4",
            KernelKind::Matvec => "matvec",
            KernelKind::Gemm => "gemm",
            KernelKind::Dot => "dot",
            KernelKind::Attention => "attention",
            KernelKind::Reduce => "reduce",
            KernelKind::Gather => "gather",
            KernelKind::Scatter => "scatter",
            KernelKind::Loop => "loop",
        }
    }
}

/// A tile of a matrix-product kernel: `rows × cols` outputs per block, the contraction walked `k`
/// at a time through `stages` shared-memory buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub rows: u32,
    pub cols: u32,
    pub k: u32,
    pub stages: u32,
    /// The tensor-core instruction of a GEMM tile (`None`: a matvec, on the CUDA cores).
    pub mma: Option<MmaShape>,
    /// Weights multiplied with the same activation in one kernel (GELU(gate)·up: 2).
    pub products: u32,
    /// A matvec of 4-bit weights packed 8 to a word: the block's threads split the contraction
    /// among them a word at a time, each reading a word of every column of the block, rather than
    /// a warp per column reading the whole contraction (see `g4c_codegen`'s `packed_matvec`).
    pub packed: bool,
    /// Blocks a GEMM tile's contraction is split over (1: none), each adding its own range of
    /// steps; the last of them to finish adds their partial sums (`KernelCall::split_sums`) and
    /// applies the epilogue. A prefill GEMM of few tiles would otherwise leave most SMs idle. A
    /// strided packed matvec's too, each block taking a share `k` deep (staged once, in one step)
    /// for every group of its stride: its blocks would otherwise each stage the whole contraction.
    pub splits: u32,
    /// A matvec's blocks stride over its groups of `cols` columns (as many blocks as groups at
    /// most): each stages its activations once for all of its groups and keeps its partial sums
    /// apart from them (see `g4c_codegen`'s `matvec`); with `k` short of the contraction (4-bit
    /// weights), a step at a time, each step once for all of its groups, whose sums it adds up
    /// over the steps. Otherwise a block takes one group.
    pub strided: bool,
}

/// The block of an attention kernel: `slots` consecutive cache slots for `heads` query heads of up
/// to `depth` elements (the queries' and the values' head dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotSplit {
    pub heads: u32,
    pub slots: u32,
    pub depth: u32,
}

/// How a kernel is launched, and what it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    pub grid: u32,
    pub block: u32,
    /// Shared memory per block, from the kernel's footprint function.
    pub smem_bytes: u32,
    /// Registers per thread the kernel may use: what keeps `block` threads within the SM's file.
    pub registers: u32,
    pub tile: Option<Tile>,
    /// How threads share each output's reduction (`None`: a thread computes an output alone).
    pub split: Option<ReduceSplit>,
    /// An attention kernel's chunk of slots per block.
    pub slots: Option<SlotSplit>,
    /// Reductions each block computes into shared memory before the kernel's body.
    pub prelude: Option<Prelude>,
}

impl Launch {
    /// Whether the kernel's threads synchronize (barriers, warp shuffles).
    pub fn synchronizes(&self) -> bool {
        self.tile.is_some() || self.split.is_some() || self.slots.is_some() || self.prelude.is_some()
    }
}

/// The reductions a kernel's body reads (a norm's statistics, a softmax's maximum and sum), which
/// every block computes once into shared memory before the body, where a kernel of their own would
/// cost a launch and a round trip through memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prelude {
    pub reductions: u32,
    /// Their output elements, each block's array holding all of them.
    pub outputs: u32,
    /// Those of them whose outputs each take the whole block, which combines its warps' results
    /// through shared memory.
    pub block_combined: u32,
    /// Whether each block computes one output of each reduction, the only one it reads (the row of
    /// its product's left-hand side it stages, or of the elements it writes), rather than all.
    pub one_row: bool,
}

/// How the threads of a reducing kernel share the reduction of each output element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceSplit {
    /// A warp per output: its lanes stride the reduced row, contiguous in memory, and combine
    /// with shuffles (norm statistics, attention scores).
    WarpPerOutput,
    /// A block per output: its threads stride the row, shuffles and then shared memory combine
    /// (few long rows, which a warp each would leave most SMs idle for: a decode step's softmax
    /// statistics over 4096 slots, a norm over 1536 features).
    BlockPerOutput,
    /// A lane per output, a block per 32 adjacent outputs: the block's warps split the reduced
    /// extent and combine through shared memory. For reductions along a strided axis, where
    /// adjacent outputs read adjacent inputs (attention's weighted sum of values over cache slots;
    /// the blocks of the heads reading the same 32 features of the cache run one after another).
    /// A product whose block's outputs share a row of its left-hand side (a head's probabilities)
    /// computes `staged` of that row's elements at a time into shared memory for its warps (a
    /// multiple of the block); other reductions stage nothing (0).
    WarpsPerExtent { staged: u32 },
}

/// One kernel launch of an entry point.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCall {
    /// The kernel's function in the plan's module.
    pub kernel: String,
    pub kind: KernelKind,
    /// Where each parameter of the kernel's function is read from.
    pub inputs: Vec<Slot>,
    /// Where its result is written; an input's slot when it updates that input in place.
    pub output: Slot,
    pub launch: Launch,
    /// Whether it runs in the launch of the call before it, on the blocks after that call's (or,
    /// a `tail`, on one of them): the calls of one launch neither read what another writes nor
    /// write what another reads, but that a tail reads its own call's output, and take the same
    /// block size (`EntryPlan::launches`).
    pub side_by_side: bool,
    /// Where a GEMM split over blocks (`Tile::splits`) keeps its partial sums and its tiles'
    /// counts of finished blocks, or where a `tail` counts its call's: the entry's split-sums
    /// buffer, which holds no value.
    pub split_sums: Option<SplitSums>,
    /// Whether it is the tail of the call before it: it runs in that call's launch (so it is also
    /// `side_by_side`), on the last of that call's blocks to finish, once all have, as one block
    /// (`launch.grid` is 1). It reads what that call wrote without a launch between (a cache
    /// write of the key a projection just computed).
    pub tail: bool,
}

/// A call's parts of its entry's split-sums buffer, which holds every launch's counts first and
/// then every launch's partial sums, so that no count lies where a launch before left partial sums:
/// from `counts`, a count of finished blocks per tile of a split GEMM, per stride of groups of a
/// split matvec, or of a tail's host's (`u32`, zero between launches: the last block resets it);
/// from `partials`, a split GEMM's or matvec's blocks' partial sums (`f32`; a tail has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitSums {
    pub buffer: Slot,
    pub counts: u64,
    pub partials: u64,
}

/// The plan of one entry point.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryPlan {
    pub entry: String,
    /// Bytes of each scratch buffer.
    pub buffers: Vec<u64>,
    pub calls: Vec<KernelCall>,
    /// Where each result of the entry point is when the last kernel has run.
    pub results: Vec<Slot>,
}

impl EntryPlan {
    pub fn scratch_bytes(&self) -> u64 {
        self.buffers.iter().sum()
    }

    /// The kernel launches, in order: each the calls that run side by side in it.
    pub fn launches(&self) -> impl Iterator<Item = &[KernelCall]> {
        self.calls.chunk_by(|_, next| next.side_by_side)
    }
}

/// The most pointers a launch passes (its calls' inputs, weights and outputs): what the host
/// emulator calls a kernel with (`G4C_MAX_ARGS`); a GPU takes 4 KB of them.
pub const MAX_LAUNCH_ARGS: usize = 64;

/// A launch's grid: its calls' grids, one after the other (a tail runs on a block of its call's).
pub fn launch_grid(calls: &[KernelCall]) -> u32 {
    calls.iter().filter(|c| !c.tail).map(|c| c.launch.grid).sum()
}

/// A launch's shared memory: one region, which each block uses for its own call's arrays (a block
/// runs one call), as large as the largest call's, in whole 16 bytes: a module that declares a
/// dynamic region (`SharedRegion`), which starts after the static ones at its 16-byte alignment,
/// pads every kernel's static shared memory to that, as ptxas reports.
pub fn launch_smem_bytes(calls: &[KernelCall]) -> u32 {
    calls.iter().map(|c| c.launch.smem_bytes).max().unwrap_or(0).next_multiple_of(16)
}

/// Where a launch's region is declared: a static array (which ptxas counts) up to
/// `STATIC_SMEM_PER_BLOCK`, beyond it an `extern` one whose bytes the launch passes as dynamic
/// shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedRegion {
    Static(u32),
    Dynamic(u32),
}

impl SharedRegion {
    pub fn of(calls: &[KernelCall]) -> SharedRegion {
        match launch_smem_bytes(calls) {
            bytes if bytes > STATIC_SMEM_PER_BLOCK => SharedRegion::Dynamic(bytes),
            bytes => SharedRegion::Static(bytes),
        }
    }

    /// The bytes ptxas reports for the launch's function.
    pub fn static_bytes(self) -> u32 {
        match self {
            SharedRegion::Static(bytes) => bytes,
            SharedRegion::Dynamic(_) => 0,
        }
    }

    /// The bytes the launch passes (`sharedMemBytes`), and its function opts in to.
    pub fn dynamic_bytes(self) -> u32 {
        match self {
            SharedRegion::Static(_) => 0,
            SharedRegion::Dynamic(bytes) => bytes,
        }
    }
}

/// Every entry point's plan, over one module of kernel functions and the weights they read.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelPlan {
    pub target: &'static str,
    pub kernels: Module,
    pub entries: Vec<EntryPlan>,
}

impl KernelPlan {
    pub fn entry(&self, name: &str) -> Option<&EntryPlan> {
        self.entries.iter().find(|e| e.entry == name)
    }
}

/// The plan in text form: per entry its buffers, then one line per kernel (`+`: in the launch of
/// the line before; `>`: the tail of the line before; `prelude r/o`: r reductions of o outputs in
/// all computed before the body, `a row` where a block computes one output of each); with `bodies`,
/// each kernel's function after its line.
pub fn print_plan(plan: &KernelPlan, bodies: bool) -> String {
    let mut out = String::new();
    for e in &plan.entries {
        let sizes: Vec<String> = e.buffers.iter().enumerate().map(|(i, b)| format!("b{i} {b}")).collect();
        writeln!(
            out,
            "plan @{} for {}: {} kernels in {} launches, scratch {} B",
            e.entry,
            plan.target,
            e.calls.len(),
            e.launches().count(),
            e.scratch_bytes()
        )
        .unwrap();
        writeln!(out, "  buffers: {}", sizes.join(", ")).unwrap();
        for c in &e.calls {
            let f = plan.kernels.function(&c.kernel).expect("a plan's kernels are in its module");
            let inputs: Vec<String> = c.inputs.iter().map(Slot::label).collect();
            let l = &c.launch;
            let mut tile = l
                .tile
                .map(|t| {
                    let mma = t.mma.map(|m| format!(" mma {}", m.name())).unwrap_or_default();
                    let packed = if t.packed { " packed" } else { "" };
                    let splits = if t.splits > 1 { format!(" split {}", t.splits) } else { String::new() };
                    let strided = if t.strided { " strided" } else { "" };
                    format!(" tile {}x{}x{}/{}{mma}{packed}{splits}{strided}", t.rows, t.cols, t.k, t.stages)
                })
                .unwrap_or_default();
            match l.split {
                Some(ReduceSplit::WarpPerOutput) => tile.push_str(" warp/output"),
                Some(ReduceSplit::BlockPerOutput) => tile.push_str(" block/output"),
                Some(ReduceSplit::WarpsPerExtent { staged }) => {
                    write!(tile, " lane/output extent/{}", l.block / 32).unwrap();
                    if staged > 0 {
                        write!(tile, " staged {staged}").unwrap();
                    }
                }
                None => {}
            }
            if let Some(s) = l.slots {
                write!(tile, " slots {}/block heads {} depth {}", s.slots, s.heads, s.depth).unwrap();
            }
            if let Some(p) = l.prelude {
                write!(tile, " prelude {}/{}", p.reductions, p.outputs).unwrap();
                if p.one_row {
                    tile.push_str(" a row");
                }
            }
            match c.split_sums {
                Some(s) if c.tail => write!(tile, " count {}+{}", s.buffer.label(), s.counts).unwrap(),
                Some(s) => write!(tile, " sums {}+{},{}", s.buffer.label(), s.counts, s.partials).unwrap(),
                None => {}
            }
            let placement = match (c.tail, c.side_by_side) {
                (true, _) => " >",
                (false, true) => " +",
                (false, false) => "  ",
            };
            writeln!(
                out,
                "{placement} {} {} ({}) -> {} : {}  grid {} block {} smem {} regs {}{tile}  ops {}",
                c.kernel,
                c.kind.name(),
                inputs.join(", "),
                c.output.label(),
                f.ty(f.results[0].value),
                l.grid,
                l.block,
                l.smem_bytes,
                l.registers,
                f.body.len(),
            )
            .unwrap();
            if bodies {
                out.push_str(&print_function(f));
            }
        }
        let results: Vec<String> = e.results.iter().map(Slot::label).collect();
        writeln!(out, "  results: {}", results.join(", ")).unwrap();
    }
    out
}
