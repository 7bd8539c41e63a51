//! A memory-bandwidth probe for the host: the best of a few multi-threaded reads of a buffer far
//! larger than any cache. This is what a CPU decode step is up against (it reads every weight once).

use std::time::Instant;

/// Bytes per second read from memory, best of `reps` passes over `bytes` with one thread per core.
pub fn read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let words = (bytes / 8).max(threads);
    // Written first, so every page is resident before timing (untouched pages all map the zero page).
    let data: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let started = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = data.chunks(chunk).map(|part| s.spawn(move || sum(part))).collect();
            handles.into_iter().map(|h| h.join().expect("probe thread")).fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.min(started.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

/// Four independent accumulators, so the loop is bound by loads rather than by one add chain.
fn sum(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for i in 0..4 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (1..=10).collect();
        assert_eq!(super::sum(&words), 55);
    }
}
