//! Launch scheduling: kernels that do not depend on each other run side by side in one launch, each
//! on its own blocks, so a step waits on fewer dependent launches (on a GPU each costs about a
//! microsecond even replayed from a graph). A decode layer's query, key and value projections read
//! the same normed activation; the key and value cache writes then read one projection each.
//!
//! Each kernel gets a level, one past the latest of the kernels it must follow: those computing a
//! value it reads, and those reading the old contents of a cache it writes in place. Kernels run
//! level by level (as early as they can), each level in as few launches as fit a block. A small
//! call reading what one call of the launch before wrote runs at that launch's end, as its tail.

use super::fusion::Group;
use super::launch::smem_limit;
use g4c_ir::plan::{launch_smem_bytes, KernelCall, MAX_LAUNCH_ARGS};
use g4c_ir::{Function, GpuLimits, ValueId};
use std::collections::HashMap;

/// The groups in level order (stable: a level keeps the groups' order), each with its level.
/// `in_place`: the state parameter each cache write's root updates. Every reader of a cache
/// written in place comes before the write in `groups` (`plan_entry` checks it first), so one pass
/// over them finds every level.
pub(crate) fn by_level(
    f: &Function,
    groups: Vec<Group>,
    in_place: &HashMap<ValueId, usize>,
) -> (Vec<Group>, Vec<usize>) {
    let mut level_of_root: HashMap<ValueId, usize> = HashMap::new();
    let mut levels = Vec::with_capacity(groups.len());
    for (k, g) in groups.iter().enumerate() {
        let written_in_place = in_place.get(&g.root).map(|&p| f.params[p].value);
        let after_readers = groups[..k]
            .iter()
            .zip(&levels)
            .filter(|(earlier, _)| written_in_place.is_some_and(|c| earlier.inputs.contains(&c)))
            .map(|(_, &l)| l + 1);
        let after_writers = g.inputs.iter().filter_map(|v| level_of_root.get(v)).map(|&l| l + 1);
        let level = after_readers.chain(after_writers).max().unwrap_or(0);
        level_of_root.insert(g.root, level);
        levels.push(level);
    }
    let mut leveled: Vec<(usize, Group)> = levels.into_iter().zip(groups).collect();
    leveled.sort_by_key(|&(level, _)| level);
    leveled.into_iter().map(|(level, g)| (g, level)).unzip()
}

/// Marks each call that runs in the launch before it: one of the same level (so independent of
/// every call there) and block size, whose shared memory still fits a block and whose arguments
/// (`args`, per call) the launch can still pass, and that leaves every strided matvec its register
/// budget (`strided_budgets_kept`).
pub(crate) fn side_by_side(calls: &mut [KernelCall], args: &[usize], levels: &[usize], gpu: &GpuLimits) {
    let mut first = 0;
    for k in 1..calls.len() {
        let (launch, next) = (&calls[first..k], &calls[k]);
        // A strided matvec's region may pass the static limit: the launch's, its calls' largest.
        let limit = calls[first..=k].iter().map(|c| smem_limit(&c.launch, gpu)).max().unwrap_or(0);
        let fits = levels[k] == levels[first]
            && next.launch.block == launch[0].launch.block
            && launch_smem_bytes(&calls[first..=k]) <= limit
            && args[first..=k].iter().sum::<usize>() <= MAX_LAUNCH_ARGS
            && strided_budgets_kept(&calls[first..=k]);
        calls[k].side_by_side = fits;
        if !fits {
            first = k;
        }
    }
}

/// Whether no strided matvec of `launch` (`Tile::strided`) has a smaller register budget than
/// another call: a launch takes the largest (`share_register_budgets`), and a strided call's grid
/// is the blocks that its own budget fits on the GPU at once. With fewer fitting, the rest would
/// wait for a second wave, each block a share of the groups long.
fn strided_budgets_kept(launch: &[KernelCall]) -> bool {
    let most = launch.iter().map(|c| c.launch.registers).max().unwrap_or(0);
    launch.iter().all(|c| !c.launch.tile.is_some_and(|t| t.strided) || c.launch.registers == most)
}

/// The most blocks a grid-stride call may have been planned with to become a tail, which runs them
/// on one: E2B's cache writes of a key or value row take 1 or 2.
const TAIL_MOST_BLOCKS: u32 = 4;

/// Makes tails (`KernelCall::tail`): a launch of small calls (of one block, or grid-stride over a
/// few), each reading the output of one call of the launch before and nothing else written there,
/// moves into that launch, each call to run on its host call's last block once the host is done.
/// E2B's decode layers wrote their key and value rows a launch after projecting them, and its final
/// norm's statistics and greedy token were each a launch of one block. A launch is moved whole or
/// not at all: a tail alone would not save its launch, only put its work after its host's instead
/// of beside it. `args`: per call, as `side_by_side` takes them (a tail passes one more, its count).
pub(crate) fn tails(calls: &mut Vec<KernelCall>, args: &mut Vec<usize>) {
    let mut start = 0;
    while start < calls.len() {
        let len = 1 + calls[start + 1..].iter().take_while(|c| c.side_by_side).count();
        // Moving a call leaves the indices of the calls after it as they were.
        let (mut moved, mut moved_args) = (calls.clone(), args.clone());
        if (start..start + len).all(|s| make_tail(&mut moved, &mut moved_args, s)) {
            (*calls, *args) = (moved, moved_args);
        }
        start += len;
    }
}

/// Makes call `s` the tail of its host in the launch before, if it has one (`tail_host`).
fn make_tail(calls: &mut Vec<KernelCall>, args: &mut Vec<usize>, s: usize) -> bool {
    let Some(host) = tail_host(calls, args, s) else { return false };
    let mut tail = calls.remove(s);
    let passes = args.remove(s) + 1;
    // The call after it starts its launch now, if it did.
    if !tail.side_by_side && s < calls.len() {
        calls[s].side_by_side = false;
    }
    (tail.side_by_side, tail.tail, tail.launch.grid) = (true, true, 1);
    calls.insert(host + 1, tail);
    args.insert(host + 1, passes);
    true
}

/// The call that call `s` can be the tail of: the one call of the launch before writing what `s`
/// reads, neither a tail nor with one yet, of the same block size, not a split GEMM (whose output
/// is not its last argument), in a launch with room for `s`'s arguments and already asking as much
/// shared memory and as many registers as `s` needs; no other call there may write what `s`
/// reads, or read or write what `s` writes.
fn tail_host(calls: &[KernelCall], args: &[usize], s: usize) -> Option<usize> {
    let (call, l) = (&calls[s], &calls[s].launch);
    // Templates index by the call's block (from 0) and loop over the grid they were planned for;
    // a grid-stride one covers a smaller grid as well, unless its prelude computes its blocks' rows
    // alone (`Prelude::one_row`).
    let one_row = l.prelude.is_some_and(|p| p.one_row);
    let grid_stride = l.tile.is_none() && l.split.is_none() && l.slots.is_none() && !one_row;
    if call.tail || !(l.grid == 1 || grid_stride && l.grid <= TAIL_MOST_BLOCKS) {
        return None;
    }
    let start_of =
        |end: usize| (0..=end).rev().find(|&i| !calls[i].side_by_side).expect("the first call starts a launch");
    let own = start_of(s);
    let before = start_of(own.checked_sub(1)?)..own;
    let writers: Vec<usize> = before.clone().filter(|&i| call.inputs.contains(&calls[i].output)).collect();
    let &[host] = writers.as_slice() else { return None };
    let h = &calls[host];
    let free = !h.tail && !calls[host + 1..own].first().is_some_and(|next| next.tail);
    let split = h.launch.tile.is_some_and(|t| t.splits > 1);
    let touches = before.clone().any(|i| calls[i].output == call.output || calls[i].inputs.contains(&call.output));
    // What the launch asks of an SM stays as it is: a tail must not cost its host blocks.
    let registers = calls[before.clone()].iter().map(|c| c.launch.registers).max().unwrap_or(0);
    let smem = launch_smem_bytes(&calls[before.clone()]);
    let passed: usize = args[before].iter().sum::<usize>() + args[s] + 1;
    let fits = l.smem_bytes <= smem && l.registers <= registers && h.launch.block == l.block;
    (free && !split && !touches && fits && passed <= MAX_LAUNCH_ARGS).then_some(host)
}

/// Checks what `side_by_side` and `tails` promise of each launch, independently of how they chose:
/// no call reads or writes what another writes, but that a tail reads its host's output (the call
/// before it), which it follows in the launch on one block of the same size.
pub(crate) fn check_launches(calls: &[KernelCall]) -> Result<(), String> {
    for launch in calls.chunk_by(|_, next| next.side_by_side) {
        for (n, c) in launch.iter().enumerate() {
            if c.tail
                && (n == 0 || launch[n - 1].tail || c.launch.grid != 1 || c.launch.block != launch[n - 1].launch.block)
            {
                return Err(format!("{} is a tail without a call of its block size before it to run on", c.kernel));
            }
            for (m, o) in launch.iter().enumerate().filter(|&(m, _)| m != n) {
                let host = c.tail && m + 1 == n;
                if (c.inputs.contains(&o.output) && !host) || c.output == o.output {
                    return Err(format!("{} reads or writes what {} writes, in the same launch", c.kernel, o.kernel));
                }
            }
        }
    }
    Ok(())
}

/// A launch's calls get the largest register budget among them (a launch has one).
pub(crate) fn share_register_budgets(calls: &mut [KernelCall]) {
    for launch in calls.chunk_by_mut(|_, next| next.side_by_side) {
        let budget = launch.iter().map(|c| c.launch.registers).max().expect("a launch has a call");
        launch.iter_mut().for_each(|c| c.launch.registers = budget);
    }
}

/// The pointers a kernel takes: its inputs, each weight it reads, its output unless it writes an
/// input in place, and a split GEMM's split sums.
pub(crate) fn arguments(k: &Function, call: &KernelCall) -> usize {
    let weights: std::collections::BTreeSet<&str> = k.weight_reads().map(|(_, name)| name).collect();
    let split = call.launch.tile.is_some_and(|t| t.splits > 1);
    call.inputs.len() + weights.len() + usize::from(!call.inputs.contains(&call.output)) + usize::from(split)
}
