//! Loops whose iterations read memory, emitted so that a thread has several reads in flight.
//!
//! A GPU issues a warp's instructions in order: in a plain loop whose body loads a value and then
//! uses it, each iteration waits out a whole memory latency (about a microsecond from HBM, less
//! from L2) before the next one's load is issued. On the H200, a 12288-deep matvec staging its
//! input 48 elements per thread, or a sliding layer's weighted sum walking 80 slots per warp,
//! took tens of microseconds that way for a few hundred kilobytes. `batched_loop` runs
//! `LOADS_IN_FLIGHT` iterations per trip, unrolled and unguarded, so the compiler issues their
//! loads together. `thread_loop`, for a loop over a block's threads or a warp's lanes, whose
//! counts per thread codegen knows, sizes its trips to them, and unrolls a share every thread
//! has alike whole.

use super::elemental::Emitter;
use super::CudaError;

/// Iterations of a loop reading memory that a thread issues before it waits for any of them.
pub(crate) const LOADS_IN_FLIGHT: u32 = 8;

/// A loop of `var` over `first`, `first + stride`, … below `end` (C expressions, evaluated once),
/// its statements emitted by `body`. Whole trips of `LOADS_IN_FLIGHT` values run unrolled with no
/// test between them, so nothing stops the compiler from issuing their loads together (a guarded
/// body becomes a branch, which it does not move loads across); the fewer values left after them
/// run one by one. The values run in the same order as in a plain loop, so a reduction in the
/// body combines its elements in the same order.
///
/// What is inside a body still counts: a division's or a sine's slow path is a branch too.
pub(crate) fn batched_loop(
    em: &mut Emitter,
    var: &str,
    range: (&str, &str, &str),
    body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    batched_loop_of(em, var, range, LOADS_IN_FLIGHT, body)
}

/// Memory reads a thread of a loop whose iterations read little keeps in flight: 32 iterations of
/// one read at once, 8 of four.
const READS_IN_FLIGHT: u32 = 32;

/// Iterations of a loop issued at once, each making `reads` memory reads: as many as keep about
/// `READS_IN_FLIGHT` reads in flight, at least `LOADS_IN_FLIGHT`. A small kernel's loops (a
/// sliding layer's softmax statistics over 639 slots, 20 a lane) wait a latency per trip, and it
/// has little else to hide them behind.
pub(crate) fn loads_at_once(reads: u32) -> u32 {
    (READS_IN_FLIGHT / reads.max(1)).max(LOADS_IN_FLIGHT)
}

/// A loop of `var` over `first`, `first + threads`, … below `extent`, where `first` is the
/// thread's index among `threads` (a block's threads, a warp's lanes): `batched_loop` in whole
/// trips of at most `cap`, as long as the threads' own iteration counts make best
/// (`trip_length`). A 1536-deep matvec staging its input on 256 threads gives each thread 6
/// elements: in trips of 8 it had no whole trip, and ran all 6 one at a time. Where every thread
/// runs the same iterations, at most `cap`, they are one unrolled run with no loop around it, so
/// that nothing but the body's own branches stands between them and the code after.
pub(crate) fn thread_loop(
    em: &mut Emitter,
    var: &str,
    (first, extent, threads): (&str, usize, u32),
    cap: u32,
    body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let t = threads as usize;
    let each = extent / t;
    if extent.is_multiple_of(t) && (1..=cap as usize).contains(&each) {
        em.open(format!("/* {var}: all {each} at once */"));
        unrolled(em, var, (&format!("({first})"), &threads.to_string()), each as u32, body)?;
        em.close();
        return Ok(());
    }
    let n = trip_length((each, extent.div_ceil(t)), cap);
    batched_loop_of(em, var, (first, &extent.to_string(), &threads.to_string()), n, body)
}

/// `thread_loop` for a loop whose body only combines into the accumulator `acc` (a C variable):
/// where the threads' counts differ by one (the extent is not a multiple of the threads) and the
/// most fit `cap`, one unrolled run of the most, an iteration past a thread's count reading the
/// last element (its index clamped) and leaving `acc` as it was. A sliding layer's softmax
/// statistics over 639 slots, 19 or 20 a lane, waited out a trip of 19 loads and then one more.
pub(crate) fn reduction_loop(
    em: &mut Emitter,
    var: &str,
    (first, extent, threads): (&str, usize, u32),
    cap: u32,
    acc: &str,
    body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let most = extent.div_ceil(threads as usize);
    // With fewer elements than threads, each thread waits for one load whichever way.
    if most < 2 || extent.is_multiple_of(threads as usize) || most > cap as usize {
        return thread_loop(em, var, (first, extent, threads), cap, body);
    }
    em.open(format!("/* {var}: all {most} at once, past the extent clamped */"));
    let x = format!("{var}_x");
    unrolled(em, &x, (&format!("({first})"), &threads.to_string()), most as u32, &mut |em| {
        em.line(format!("const int {var} = min({x}, {});", extent - 1));
        em.line(format!("const auto {var}_kept = {acc};"));
        body(em)?;
        em.line(format!("if ({x} >= {extent}) {acc} = {var}_kept;"));
        Ok(())
    })?;
    em.close();
    Ok(())
}

/// The iterations per whole trip, at most `cap`, that keep the threads of a loop waiting least,
/// its threads running between `fewest` and `most` iterations each: a thread waits out a memory
/// latency once per whole trip and once per iteration left after them, and a warp as long as its
/// slowest lane. Of trips that wait as little, the longest.
pub(crate) fn trip_length((fewest, most): (usize, usize), cap: u32) -> u32 {
    let waits = |n: usize| [fewest, most].iter().map(|c| c / n + c % n).max().unwrap_or(0);
    (1..=cap.max(1) as usize).rev().min_by_key(|&n| waits(n)).unwrap_or(1) as u32
}

/// `batched_loop` in whole trips of `n` iterations: for a loop whose trip count is known and
/// whose block has few other loads in flight (a decode step's attention chunk, one of a few
/// busy blocks at a short context), as many as there are, up to a register budget.
pub(crate) fn batched_loop_of(
    em: &mut Emitter,
    var: &str,
    (first, end, stride): (&str, &str, &str),
    n: u32,
    body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let (trip, last, step) = (format!("{var}_trip"), format!("{var}_end"), format!("{var}_stride"));
    em.open(format!("/* {var}: {n} at a time */"));
    // Signed, so that a trip's test cannot turn into an unsigned comparison (`blockDim.x`).
    em.line(format!("const int {last} = (int)({end}), {step} = (int)({stride});"));
    em.line(format!("int {trip} = {first};"));
    em.open(format!("for (; {trip} + {} * {step} < {last}; {trip} += {n} * {step})", n - 1));
    unrolled(em, var, (&trip, &step), n, body)?;
    em.close();
    // The rest one at a time: guarded, unrolled bodies would each be a branch all the same (the
    // compiler does not predicate bodies this large), for seven times the code.
    em.open(format!("for (; {trip} < {last}; {trip} += {step})"));
    em.line(format!("const int {var} = {trip};"));
    body(em)?;
    em.close();
    em.close();
    Ok(())
}

/// `n` iterations of `body`, unrolled: `var` is `start + u * step` (C expressions) in the `u`th,
/// `u` being the C variable `{var}_u`.
pub(crate) fn unrolled(
    em: &mut Emitter,
    var: &str,
    (start, step): (&str, &str),
    n: u32,
    body: &mut dyn FnMut(&mut Emitter) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    em.line("#pragma unroll");
    em.open(format!("for (int {var}_u = 0; {var}_u < {n}; ++{var}_u)"));
    em.line(format!("const int {var} = {start} + {var}_u * {step};"));
    body(em)?;
    em.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::trip_length;

    #[test]
    fn trips_fit_the_iterations_each_thread_runs() {
        // A 1536-deep staging on 256 threads: 6 each, one trip (in trips of 8, none whole).
        assert_eq!(trip_length((6, 6), 8), 6);
        // 1544 deep: 8 threads run a seventh, after the trip of 6.
        assert_eq!(trip_length((6, 7), 8), 6);
        // 12288 deep: 48 each, 6 trips of 8.
        assert_eq!(trip_length((48, 48), 8), 8);
        // 12 each: 2 trips of 6 rather than 8 and 4 one at a time.
        assert_eq!(trip_length((12, 12), 8), 6);
        // 9 each: a trip of 8 and one alone wait twice, as few as any.
        assert_eq!(trip_length((9, 9), 8), 8);
        // Fewer iterations than threads: any trip waits once.
        assert_eq!(trip_length((0, 1), 8), 8);
        assert_eq!(trip_length((6, 6), 4), 3);
    }
}
