//! Launch scheduling: kernels that do not depend on each other run side by side in one launch, each
//! on its own blocks, so a step waits on fewer dependent launches (on a GPU each costs about a
//! microsecond even replayed from a graph). A decode layer's query, key and value projections read
//! the same normed activation; the key and value cache writes then read one projection each.
//!
//! Each kernel gets a level, one past the latest of the kernels it must follow: those computing a
//! value it reads, and those reading the old contents of a cache it writes in place. Kernels run
//! level by level (as early as they can), each level in as few launches as fit a block.

use super::fusion::Group;
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
/// (`args`, per call) the launch can still pass. A launch's calls get the largest register budget
/// among them (a launch has one).
pub(crate) fn side_by_side(calls: &mut [KernelCall], args: &[usize], levels: &[usize], gpu: &GpuLimits) {
    let mut first = 0;
    for k in 1..calls.len() {
        let (launch, next) = (&calls[first..k], &calls[k]);
        let fits = levels[k] == levels[first]
            && next.launch.block == launch[0].launch.block
            && launch_smem_bytes(&calls[first..=k]) <= gpu.smem_per_block
            && args[first..=k].iter().sum::<usize>() <= MAX_LAUNCH_ARGS;
        calls[k].side_by_side = fits;
        if !fits {
            first = k;
        }
    }
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
