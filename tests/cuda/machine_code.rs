//! What ptxas makes of the kernels, read with `nvdisasm` (as `scripts/setup` installs it): how many
//! loads a loop issues before it waits for one.

use super::products::{bf16_plan_for_h200, deep_matvec_module, Products};
use super::*;
use g4c_runtime::backend::cuda::launch_bindings;

/// The down projection's shape on h200 (12288 deep, 4-bit, bf16): in the machine code ptxas makes
/// of the packed matvec, its main loop issues 16 word loads (and their scales) before the first
/// multiply-add that waits for one. The rate a matvec streams its weight at is bounded by the
/// bytes its threads keep in flight; a warp per column issued 8 (`nvdisasm`, as `scripts/setup`
/// installs it, reads the cubin).
#[test]
fn the_packed_matvec_keeps_16_word_loads_in_flight() {
    let module = g4c_ir::parse_module(&deep_matvec_module("bf16", "bf16", 12288)).unwrap();
    let target = Target::by_name("h200").unwrap();
    let plan = plan_module(&module, target).unwrap();
    let loads = word_loads_before_a_multiply_add(&sass_of(&plan, target));
    assert!(loads >= 16, "the packed matvec's main loop issues {loads} word loads before it waits for one");
}

/// A matvec of 16-bit weights read as they are (E2B's LM head) loads 8 of a row's values at a
/// time, 16 bytes a lane: for a 1536-deep row all 6 of a lane's loads issue together, 3 KB a warp.
/// A lane read one 2-byte value per iteration, 512 bytes a warp per 8 iterations, and the H200
/// profile had the head at 75% of the bandwidth.
#[test]
fn the_16_bit_matvec_loads_16_bytes_a_lane_6_at_once() {
    let product = Products { entry: "decode", rows: 1, cols: 40, depth: 1536, products: 1, four_bit: false };
    let (plan, target) = bf16_plan_for_h200(product);
    assert_eq!(plan.entries[0].calls.iter().map(|c| c.kind.name()).collect::<Vec<_>>(), ["matvec"]);
    let loads = most_loads_without_a_branch(&sass_of(&plan, target), "LDG.E.128");
    assert!(loads >= 6, "the matvec issues at most {loads} 128-bit loads before a branch");
}

/// A decode matvec stages its activations through a norm's prologue, whose statistics (in the
/// block's shared memory, from its prelude) and their reciprocal square root, with its slow-path
/// branches, are the same for every element: ptxas computes them once, before the loop, only if it
/// can tell that the staged array does not overlap the statistics' (the arrays are `__restrict__`
/// parameters of the call's body). Pointers carved out of one region left it recomputing them per
/// element, a branch between every two elements' loads: E2B's per-layer-input gate staged 2 or 3
/// loads at a time. Now the stagings issue a thread's 16-bit loads at once: 24 to 30 (6 elements
/// of 1536, 4 or 5 loads each), where a main loop issues 16 (its scales).
#[test]
fn the_matvec_staging_computes_its_norm_once() {
    let sass = e2b_decode_sass_on_h200();
    let loads = most_loads_without_a_branch(&functions_named(sass, "g4c_matvec_w4_"), "LDG.E.U16");
    assert!(loads >= 24, "the 4-bit matvecs issue at most {loads} 16-bit loads before a branch");
}

/// A sliding layer's weighted sum of values computes its head's softmax statistics over the 639
/// slots' scores in its prelude, the whole block on each (`Prelude::one_row`): 2 or 3 a thread,
/// and both loops (the maximum's, the sum's) issue a thread's 3 loads at once, the last clamped for
/// threads with 2 (`reduction_loop`). When a warp took each of the 8 heads, 19 or 20 a lane, the
/// loops issued 20 at once; in trips of 8 they had waited out 5 or 6 latencies. (The staging of
/// the probabilities, 3 scores a thread too, comes a load between branches, each load's division
/// behind it: `[3, 3, 1, 1, 1]` on sm_90 with ptxas 12.)
#[test]
fn the_softmax_statistics_issue_a_lanes_loads_together() {
    let sass = e2b_decode_sass_on_h200();
    // The scores are f32 (`LDG.E`), the value cache bf16 (`LDG.E.U16`).
    let stretches = loads_between_branches(&functions_named(sass, "g4c_dot_"), "LDG.E R");
    let whole = stretches.iter().filter(|&&n| n >= 3).count();
    assert!(whole >= 2, "the weighted sum's score loads between branches: {stretches:?}");
}

/// A sliding layer's weighted sum of values stages all 639 probabilities of its head at once (the
/// plan's `staged 768`), so each warp reads its 80 slots' values in two trips of 48 loads: in
/// chunks of 256 slots, three rounds of 32 each waited out a score load, a barrier and a value
/// load.
#[test]
fn the_sliding_weighted_sum_reads_its_values_in_two_trips() {
    let (plan, _, sass) = e2b_decode_on_h200();
    let staged: Vec<u32> = plan.entries[0]
        .calls
        .iter()
        .filter(|c| c.kind == g4c_ir::plan::KernelKind::Dot)
        .filter_map(|c| match c.launch.split {
            Some(g4c_ir::plan::ReduceSplit::WarpsPerExtent { staged }) => Some(staged),
            _ => None,
        })
        .collect();
    assert!(!staged.is_empty() && staged.iter().all(|&s| s == 768), "the weighted sums stage {staged:?}");
    let loads = most_loads_without_a_branch(&functions_named(sass, "g4c_dot_"), "LDG.E.U16");
    assert!(loads >= 48, "the weighted sum issues at most {loads} value loads before a branch");
}

/// A full-attention chunk's warps read two slots' key rows at once, 16 loads a lane each (512-deep
/// bf16 keys), where a branch around each slot's loads (some head sees it) kept the second slot's
/// waiting: two stretches of 32 or more 16-bit loads, the keys' and the values' (64 slots at once).
#[test]
fn the_attention_chunk_reads_two_key_rows_at_once() {
    let sass = functions_named(e2b_decode_sass_on_h200(), "g4c_attention_");
    let stretches = loads_between_branches(&sass, "LDG.E.U16");
    let long = stretches.iter().filter(|&&n| n >= 32).count();
    assert!(long >= 2, "the attention chunk's 16-bit loads between branches: {stretches:?}");
}

/// A decode step's matvecs ask L2 for their blocks' weight rows before they wait for the kernel
/// before them (`ACQBULK`, programmatic dependent launch's wait): no kernel writes a weight, so
/// launched so, their weights' DRAM latency overlaps the previous kernel's tail. On h200 every wait
/// in E2B's 4-bit matvec kernels (one per call of a launch) comes after a prefetch (`CCTL.E.PF2`).
/// (The attention scores' matvecs read a cache, which the kernel before them writes.)
#[test]
fn the_matvecs_prefetch_their_weights_before_they_wait() {
    let sass = functions_named(e2b_decode_sass_on_h200(), "g4c_matvec_w4");
    let waits = prefetched_before_each_wait(&sass);
    assert!(waits.len() >= 2, "the matvecs' waits: {waits:?}");
    assert!(waits.iter().all(|&p| p), "a matvec waits before it prefetches: {waits:?}");
}

/// For each wait for the previous kernel (`ACQBULK`) in `sass`, whether an L2 prefetch comes
/// before it, since the start of its function or the wait before it.
fn prefetched_before_each_wait(sass: &str) -> Vec<bool> {
    let (mut waits, mut prefetched) = (Vec::new(), false);
    for line in sass.lines() {
        let text = line.split_once("*/").map_or("", |(_, t)| t);
        if line.trim().starts_with(".text.") {
            prefetched = false;
        } else if text.contains("CCTL.E.PF2") {
            prefetched = true;
        } else if text.contains("ACQBULK") {
            waits.push(std::mem::take(&mut prefetched));
        }
    }
    waits
}

/// With programmatic dependent launch a kernel's blocks run while the kernel before it still
/// writes, so what a kernel may write (a call's inputs) must be read after the wait
/// (`griddepcontrol.wait`), and not through the non-coherent path (`ld.global.nc`), which declares
/// the data unchanged for the kernel's whole life: ptxas moved such loads of a 4-bit matvec's
/// staging above the wait. NVVM reads a `__restrict__` input that way when nothing in the kernel
/// may write it; the wait now takes the inputs' pointers. In the PTX of E2B's decode kernels for
/// h200 (launches of one call), every load through an input's pointer is coherent and after the
/// wait.
#[test]
fn no_kernel_reads_its_inputs_before_it_waits() {
    let (plan, program, _) = e2b_decode_on_h200();
    assert!(inputs_read_after_the_wait(plan, program) > 100, "launches checked");
    // A prefill GEMM loads its first step's weights before it waits, its activations after.
    for four_bit in [true, false] {
        let product = Products { entry: "prefill", rows: 64, cols: 256, depth: 2048, products: 1, four_bit };
        let (plan, target) = bf16_plan_for_h200(product);
        let program = g4c_driver::cuda_programs(&plan, target, true).unwrap().programs.remove(0);
        assert_eq!(inputs_read_after_the_wait(&plan, &program), 1, "the GEMM's launch checked");
    }
}

/// Asserts that in `program` (the PTX of `plan`'s first entry) every load through an input's
/// pointer of a launch of one call is coherent and after the wait; returns the launches checked.
fn inputs_read_after_the_wait(plan: &g4c_ir::plan::KernelPlan, program: &DeviceProgram) -> usize {
    let ptx = program.ptx.as_deref().expect("NVRTC made PTX");
    let mut bindings = program.kernels.iter();
    let mut checked = 0;
    for calls in plan.entries[0].launches() {
        let symbol = &bindings.nth(calls.len() - 1).unwrap().symbol;
        if calls.len() > 1 {
            continue;
        }
        let inputs = plan.kernels.function(&calls[0].kernel).unwrap().params.len();
        let loads = param_loads(ptx_entry(ptx, symbol), |p| p < inputs);
        let early: Vec<_> = loads.iter().filter(|(load, waited)| !waited || load.contains(".nc")).collect();
        assert!(early.is_empty(), "{symbol} ({}) may read an input before its writer ends: {early:?}", calls[0].kernel);
        checked += 1;
    }
    checked
}

/// The PTX of entry `symbol` in `ptx`.
fn ptx_entry<'p>(ptx: &'p str, symbol: &str) -> &'p str {
    let start = ptx.find(&format!(".entry {symbol}(")).unwrap_or_else(|| panic!("no entry {symbol}"));
    let rest = &ptx[start..];
    &rest[..rest[1..].find(".entry ").map_or(rest.len(), |e| e + 1)]
}

/// A tail reads its host's output, which the host's blocks wrote during the same kernel, so never
/// through the non-coherent path (`ld.global.nc`, for data no thread of the kernel writes). In the
/// PTX of the tiny model's decode for t4g (whose kernels do not wait for the one before, which
/// otherwise keeps their inputs off that path) and for h200, every load through a tail's inputs is
/// coherent; without `written_in_this_kernel`, t4g's went through that path.
#[test]
fn a_tail_reads_its_hosts_output_coherently() {
    for target in ["t4g", "h200"] {
        let mut plan = tiny_plan(target, 4);
        plan.entries.retain(|e| e.entry == "decode");
        let program =
            g4c_driver::cuda_programs(&plan, Target::by_name(target).unwrap(), true).unwrap().programs.remove(0);
        let ptx = program.ptx.as_deref().expect("NVRTC made PTX");
        let mut checked = 0;
        for (calls, bindings) in launch_bindings(&plan.entries[0], &program.kernels) {
            let entry = ptx_entry(ptx, &bindings[0].symbol);
            // Each call's parameters follow the ones before (`launch_of`).
            let mut first = 0;
            for (call, binding) in calls.iter().zip(bindings) {
                let inputs = first..first + call.inputs.len();
                if call.tail {
                    let loads = param_loads(entry, |p| inputs.contains(&p));
                    assert!(!loads.is_empty(), "{target}: {} loads no input", call.kernel);
                    let nc: Vec<_> = loads.iter().filter(|(load, _)| load.contains(".nc")).collect();
                    assert!(
                        nc.is_empty(),
                        "{target}: {} reads its inputs through the non-coherent path: {nc:?}",
                        call.kernel
                    );
                    checked += 1;
                }
                let output = usize::from(!call.inputs.contains(&call.output));
                first += call.inputs.len() + binding.weights.len() + output + usize::from(call.split_sums.is_some());
            }
        }
        assert!(checked >= 2, "{target}: {checked} tails checked");
    }
}

/// The global loads in `entry` (PTX) whose address is computed from one of the `params` (registers
/// loaded from them, and every register computed from such a register), each with whether a
/// `griddepcontrol.wait` comes before it.
fn param_loads(entry: &str, params: impl Fn(usize) -> bool) -> Vec<(String, bool)> {
    let mut from_input = std::collections::HashSet::new();
    // Again until no register is added: a loop's registers may be used above where they are set.
    loop {
        let (known, mut loads, mut waited) = (from_input.len(), Vec::new(), false);
        for line in entry.lines().map(str::trim) {
            waited |= line.starts_with("griddepcontrol.wait");
            let Some((op, operands)) = line.strip_suffix(';').and_then(|l| l.split_once(char::is_whitespace)) else {
                continue;
            };
            let registers: Vec<&str> = operands
                .split(|c: char| !(c.is_alphanumeric() || c == '%' || c == '_'))
                .filter(|r| r.starts_with('%'))
                .collect();
            let Some((dest, sources)) = registers.split_first() else { continue };
            let computed_from_input = sources.iter().any(|r| from_input.contains(*r));
            if op.starts_with("ld.param") {
                let param =
                    operands.rsplit("_param_").next().and_then(|p| p.trim_end_matches(']').parse::<usize>().ok());
                if param.is_some_and(&params) {
                    from_input.insert(dest.to_string());
                }
            } else if op.starts_with("ld.global") && computed_from_input {
                loads.push((line.to_string(), waited));
            } else if !op.starts_with("st.") && computed_from_input {
                from_input.insert(dest.to_string());
            }
        }
        if from_input.len() == known {
            return loads;
        }
    }
}

/// The machine code of E2B's decode kernels for h200, made once for the tests reading it.
fn e2b_decode_sass_on_h200() -> &'static str {
    &e2b_decode_on_h200().2
}

/// E2B's decode plan for h200, its program (with PTX and a cubin) and the cubin's machine code,
/// made once for the tests reading them.
fn e2b_decode_on_h200() -> &'static (g4c_ir::plan::KernelPlan, DeviceProgram, String) {
    static DECODE: std::sync::OnceLock<(g4c_ir::plan::KernelPlan, DeviceProgram, String)> = std::sync::OnceLock::new();
    DECODE.get_or_init(|| {
        let target = Target::by_name("h200").unwrap();
        let mut plan = e2b_plan(target);
        plan.entries.retain(|e| e.entry == "decode");
        let program = g4c_driver::cuda_programs(&plan, target, true).unwrap().programs.remove(0);
        let sass = disassemble(&program);
        (plan, program, sass)
    })
}

/// The functions of `sass` (`nvdisasm -c`) whose symbols start with `prefix`.
fn functions_named(sass: &str, prefix: &str) -> String {
    let mut keep = false;
    let mut out = String::new();
    for line in sass.lines() {
        if let Some(symbol) = line.trim().strip_prefix(".text.").and_then(|l| l.strip_suffix(':')) {
            keep = symbol.starts_with(prefix);
        }
        if keep {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// A prefill GEMM stages its tile's elements without a branch around each (it reads at clamped
/// indices and selects 0 past the edges), so the loads of a step's staged elements issue
/// together; guarded, each element's loads were a branch of their own and waited out a memory
/// latency each (the H200 profile had 32-deep steps at about 3 µs).
#[test]
fn the_prefill_gemm_issues_its_staging_loads_together() {
    let product = Products { entry: "prefill", rows: 64, cols: 256, depth: 2048, products: 1, four_bit: true };
    let (plan, target) = bf16_plan_for_h200(product);
    let launch = plan.entries[0].launches().next().unwrap();
    assert!(launch[0].launch.tile.is_some_and(|t| t.mma.is_some()), "the product is a tensor-core GEMM");
    let loads = most_loads_without_a_branch(&sass_of(&plan, target), "LDG");
    assert!(loads >= 16, "the GEMM issues at most {loads} global loads before a branch");
}

/// A prefill GEMM loads its next step's elements between this step's barrier and its products
/// (`StepStaging`), so their memory latency overlaps the MMAs: in the machine code, the main loop
/// issues its global loads after its first barrier and before its first MMA. The loads came
/// first, then the barrier, then the MMAs: each step waited out its loads and then multiplied.
#[test]
fn the_prefill_gemm_loads_the_next_step_before_its_products() {
    for four_bit in [true, false] {
        let product = Products { entry: "prefill", rows: 64, cols: 256, depth: 2048, products: 1, four_bit };
        let (plan, target) = bf16_plan_for_h200(product);
        let loads = loads_between_a_barrier_and_an_mma(&sass_of(&plan, target));
        // 72 loads with 4-bit weights, 96 with 16-bit ones (none before).
        assert!(loads >= 16, "4-bit {four_bit}: the GEMM's loop issues {loads} loads between its barrier and its MMAs");
    }
}

/// Of the loops in `sass` with tensor-core MMAs (`HMMA`), the most global loads one issues after
/// its first barrier (`BAR.SYNC`) and before its first MMA.
fn loads_between_a_barrier_and_an_mma(sass: &str) -> usize {
    let (labels, instructions) = labelled_instructions(sass);
    let mut most = 0;
    for (end, i) in instructions.iter().enumerate() {
        let Some(top) = backward_branch_target(i, &labels).filter(|&top| top <= end) else { continue };
        let body = &instructions[top..end];
        let Some(mma) = body.iter().position(|i| i.contains("HMMA")) else { continue };
        let Some(barrier) = body[..mma].iter().position(|i| i.contains("BAR.SYNC")) else { continue };
        most = most.max(body[barrier..mma].iter().filter(|i| i.contains("LDG")).count());
    }
    most
}

/// The machine code (`nvdisasm -c`, as `scripts/setup` installs it) of the first program of `plan`.
fn sass_of(plan: &g4c_ir::plan::KernelPlan, target: &'static Target) -> String {
    disassemble(&g4c_driver::cuda_programs(plan, target, true).unwrap().programs.remove(0))
}

/// The machine code of `program`'s cubin.
fn disassemble(program: &DeviceProgram) -> String {
    let (_, cubin) = program.cubin.as_ref().expect("ptxas made a cubin");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.cubin");
    std::fs::write(&path, cubin).unwrap();
    let nvdisasm = g4c_util::env::path_var("G4C_NVDISASM")
        .or_else(|| g4c_util::env::venv_file("nvidia/cu13/bin/nvdisasm"))
        .expect("nvdisasm in .venv: run scripts/setup");
    let out = std::process::Command::new(nvdisasm).arg("-c").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The most global loads of kind `load` (`LDG`, `LDG.E.128`) in `sass` between two labels or
/// branches.
fn most_loads_without_a_branch(sass: &str, load: &str) -> usize {
    loads_between_branches(sass, load).into_iter().max().unwrap_or(0)
}

/// The global loads of kind `load` in each stretch of `sass` between two labels or branches that
/// has any, in order.
fn loads_between_branches(sass: &str, load: &str) -> Vec<usize> {
    let (mut stretches, mut loads) = (Vec::new(), 0);
    for line in sass.lines() {
        let text = line.split_once("*/").map_or("", |(_, t)| t);
        if line.starts_with(".L_x_") || text.contains("BRA") || text.contains("CALL") {
            stretches.extend((loads > 0).then_some(loads));
            loads = 0;
        } else if text.contains(load) {
            loads += 1;
        }
    }
    stretches.extend((loads > 0).then_some(loads));
    stretches
}

/// Of the loops in `sass` (`nvdisasm -c`: instructions, and labels a backward branch may return
/// to), the most 32-bit global loads (`LDG.E`, not the scales' `LDG.E.U16`) one issues from its
/// top before its first `FFMA`.
fn word_loads_before_a_multiply_add(sass: &str) -> usize {
    let (labels, instructions) = labelled_instructions(sass);
    let mut most = 0;
    for (end, i) in instructions.iter().enumerate() {
        let Some(top) = backward_branch_target(i, &labels).filter(|&top| top <= end) else { continue };
        let body = instructions[top..end].iter().take_while(|i| !i.contains("FFMA"));
        most = most.max(body.filter(|i| i.contains("LDG.E") && !i.contains("LDG.E.U16")).count());
    }
    most
}

/// The instructions of `sass` (`nvdisasm -c`) in order, and the index each label comes before.
fn labelled_instructions(sass: &str) -> (std::collections::HashMap<String, usize>, Vec<String>) {
    let (mut labels, mut instructions) = (std::collections::HashMap::new(), Vec::new());
    for line in sass.lines() {
        if let Some(label) = line.strip_suffix(':').filter(|l| l.starts_with(".L_x_")) {
            labels.insert(label.to_string(), instructions.len());
        } else if let Some((_, text)) = line.split_once("*/") {
            instructions.push(text.trim().to_string());
        }
    }
    (labels, instructions)
}

/// The index of the instruction branch `i` goes to, if it is a branch to a label.
fn backward_branch_target(i: &str, labels: &std::collections::HashMap<String, usize>) -> Option<usize> {
    let target = i.split("BRA `(").nth(1).and_then(|t| t.split(')').next())?;
    labels.get(target).copied()
}
