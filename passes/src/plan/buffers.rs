//! Scratch buffers: every materialized value that is not a parameter, nor state written in place,
//! gets one for as long as a kernel may read it; a buffer is reused once its value is dead.

use super::fusion::Group;
use super::launch::{split_sums_bytes, SplitSumsBytes};
use g4c_ir::plan::{KernelCall, Slot, SplitSums};
use g4c_ir::{Function, ValueId};
use std::collections::HashMap;

pub(crate) struct Scratch {
    /// The buffer of each materialized value.
    pub slot: HashMap<ValueId, usize>,
    /// Bytes of each buffer: the largest value it ever holds.
    pub bytes: Vec<u64>,
}

/// Assigns buffers greedily in kernel order (`levels` non-decreasing, a kernel's level in the
/// schedule): a value takes the smallest free buffer that holds it, else grows the largest free
/// one, else gets a new one. A buffer is free from the level after the last one reading its value:
/// kernels of a level may run side by side, and none may write a buffer another reads. Results
/// stay live.
pub(crate) fn assign(
    f: &Function,
    groups: &[Group],
    levels: &[usize],
    in_place: &HashMap<ValueId, usize>,
    results: &[ValueId],
) -> Scratch {
    let mut last_read: HashMap<ValueId, usize> = HashMap::new();
    for (g, &level) in groups.iter().zip(levels) {
        for &v in &g.inputs {
            last_read.insert(v, level);
        }
    }
    let mut slot = HashMap::new();
    let mut bytes: Vec<u64> = Vec::new();
    // (buffer, the last level that reads it)
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    for (g, &level) in groups.iter().zip(levels) {
        busy.retain(|&(b, end)| {
            let done = end < level;
            if done {
                free.push(b);
            }
            !done
        });
        let v = g.root;
        if in_place.contains_key(&v) {
            continue;
        }
        let need = f.ty(v).byte_size();
        let fitting = free.iter().enumerate().filter(|(_, &b)| bytes[b] >= need).min_by_key(|(_, &b)| bytes[b]);
        let largest = free.iter().enumerate().max_by_key(|(_, &b)| bytes[b]);
        let b = match fitting.or(largest).map(|(i, _)| i) {
            Some(i) => free.swap_remove(i),
            None => {
                bytes.push(0);
                bytes.len() - 1
            }
        };
        bytes[b] = bytes[b].max(need);
        let end = if results.contains(&v) { usize::MAX } else { last_read.get(&v).copied().unwrap_or(level) };
        busy.push((b, end));
        slot.insert(v, b);
    }
    Scratch { slot, bytes }
}

/// Gives the split GEMMs and matvecs (`Tile::splits`) and the tails their parts of one more
/// buffer, which holds no value and starts zeroed: the calls of a launch run at once, so each takes
/// its own parts; every launch reads and writes its parts after the launch before has finished (its
/// blocks wait for it before anything but weights), and leaves its counts at zero, so the next
/// reuses the parts. The counts of every launch come first, then the partial sums: a count must
/// start at zero, and a partial sum a launch before left is not. `kernels` are the calls'
/// functions, in their order.
pub(crate) fn split_sums(calls: &mut [KernelCall], kernels: &[Function], buffers: &mut Vec<u64>) {
    // Each call with its parts' bytes.
    let mut parts: Vec<(&mut KernelCall, Option<SplitSumsBytes>)> = calls
        .iter_mut()
        .zip(kernels)
        .map(|(call, k)| {
            let bytes = split_sums_bytes(k, &call.launch);
            let bytes = bytes.or(call.tail.then_some(SplitSumsBytes { counts: 4, partials: 0 }));
            (call, bytes)
        })
        .collect();
    let same_launch = |_: &(&mut KernelCall, _), (next, _): &(&mut KernelCall, _)| next.side_by_side;
    let counts_of = |launch: &[(&mut KernelCall, Option<SplitSumsBytes>)]| -> u64 {
        launch.iter().filter_map(|(_, b)| *b).map(|b| b.counts.next_multiple_of(16)).sum()
    };
    let counts = parts.chunk_by(same_launch).map(counts_of).max().unwrap_or(0);
    let buffer = Slot::Scratch(buffers.len());
    let mut end = counts;
    for launch in parts.chunk_by_mut(same_launch) {
        let (mut count, mut partial) = (0, counts);
        for (call, bytes) in launch {
            let Some(bytes) = bytes else { continue };
            call.split_sums = Some(SplitSums { buffer, counts: count, partials: partial });
            count += bytes.counts.next_multiple_of(16);
            partial += bytes.partials.next_multiple_of(16);
        }
        end = end.max(partial);
    }
    if end > 0 {
        buffers.push(end);
    }
}
