//! The host emulator's buffers: each one's bytes end where an inaccessible page begins, so a
//! kernel reading or writing past a buffer's end faults at once, where a GPU would go on with
//! whatever lies there (the next allocation) and only the numbers might show it. Before its bytes
//! lie words of NaN (as shared memory is filled: `emulator.h`), which a kernel reading before the
//! buffer's start computes with and one writing there changes (`front_restored`), and before those
//! another inaccessible page.

use crate::error::{Result, RuntimeError};
use std::ffi::c_void;

/// What a buffer's bytes are rounded up to before the guard: the alignment `cudaMalloc` gives, so
/// that an access a GPU keeps within its allocation (a 16-byte vector load of a row's last
/// elements) does not fault here either.
const ALIGN: usize = 256;

/// What each 32-bit word before a buffer's bytes holds: a NaN as a float, as either half an f16 or
/// bf16 NaN, and as an int the largest.
const FRONT_FILL: u32 = 0x7fff_ffff;

/// Zeroed host memory of `bytes` (rounded up to `ALIGN`) followed by a page that cannot be read or
/// written, after `FRONT_FILL` words and a page that cannot be read or written either.
pub(super) struct GuardedBuffer {
    mapping: *mut c_void,
    mapped: usize,
    /// Where the bytes start in the mapping, and how many there are (rounded).
    start: usize,
    len: usize,
    /// The bytes asked for.
    bytes: usize,
}

// SAFETY: the mapping is this buffer's alone, and only `&mut self` reaches its bytes.
unsafe impl Send for GuardedBuffer {}

impl GuardedBuffer {
    pub(super) fn new(bytes: usize) -> Result<GuardedBuffer> {
        let page = page_size();
        let len = bytes.max(1).next_multiple_of(ALIGN);
        // At least ALIGN bytes of front words.
        let pages = (len + ALIGN).next_multiple_of(page);
        let mapped = page + pages + page;
        let fail = |what: &str| {
            RuntimeError::Invalid(format!(
                "the CUDA host emulator: {what} for a buffer of {bytes} bytes: {}",
                std::io::Error::last_os_error()
            ))
        };
        // SAFETY: a new private anonymous mapping, which nothing else refers to; mmap zeroes it.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(fail("mapping memory"));
        }
        let mut buffer = GuardedBuffer { mapping, mapped, start: page + pages - len, len, bytes };
        for guard in [0, page + pages] {
            // SAFETY: the first or the last page of the mapping just made.
            if unsafe { libc::mprotect(mapping.cast::<u8>().add(guard).cast(), page, libc::PROT_NONE) } != 0 {
                return Err(fail("protecting a guard page"));
            }
        }
        buffer.front_restored();
        Ok(buffer)
    }

    /// The words between the first guard page and the bytes.
    fn front_mut(&mut self) -> &mut [u8] {
        let page = page_size();
        // SAFETY: `start - page` readable and writable bytes after the first page, borrowed through
        // `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.mapping.cast::<u8>().add(page), self.start - page) }
    }

    /// Whether the words before the bytes held `FRONT_FILL` (no kernel wrote before the buffer's
    /// start); they do again.
    pub(super) fn front_restored(&mut self) -> bool {
        let fill = FRONT_FILL.to_ne_bytes();
        let front = self.front_mut();
        let intact = front.chunks_exact(4).all(|w| w == fill);
        front.chunks_exact_mut(4).for_each(|w| w.copy_from_slice(&fill));
        intact
    }

    /// The first byte, as a kernel argument.
    pub(super) fn as_mut_ptr(&mut self) -> *mut c_void {
        // SAFETY: `start` lies within the mapping.
        unsafe { self.mapping.cast::<u8>().add(self.start).cast() }
    }

    /// The bytes asked for (fewer than `bytes_mut` holds, which are rounded up).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` readable and writable bytes from `start`, borrowed through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl Drop for GuardedBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.mapping, self.mapped) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_zeroed_and_ends_at_its_guard() {
        let mut b = GuardedBuffer::new(1000).unwrap();
        assert_eq!((b.bytes(), b.bytes_mut().len()), (1000, 1024));
        assert!(b.bytes_mut().iter().all(|&x| x == 0));
        b.bytes_mut()[1023] = 7;
        let end = b.as_mut_ptr() as usize + 1024;
        assert_eq!(end % page_size(), 0, "the bytes end where a page begins");
        // That page is mapped with no access (Linux lists it so in /proc/self/maps).
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let guard = maps.lines().find(|line| {
            let range = line.split(' ').next().unwrap();
            let (from, to) = range.split_once('-').unwrap();
            let (from, to) = (usize::from_str_radix(from, 16).unwrap(), usize::from_str_radix(to, 16).unwrap());
            (from..to).contains(&end)
        });
        let perms = guard.and_then(|line| line.split(' ').nth(1));
        assert_eq!(perms, Some("---p"), "{guard:?}");
    }

    #[test]
    fn a_buffer_starts_after_nan_words_that_show_a_write() {
        let mut b = GuardedBuffer::new(1000).unwrap();
        let first = b.as_mut_ptr().cast::<f32>();
        // SAFETY: the word before the bytes lies within the mapping (the front words).
        let before = unsafe { first.sub(1) };
        assert!(unsafe { before.read() }.is_nan());
        assert!(b.front_restored());
        unsafe { before.write(1.0) };
        assert!(!b.front_restored());
        assert!(b.front_restored() && unsafe { before.read() }.is_nan());
        // A buffer of whole pages has front words too.
        let mut pages = GuardedBuffer::new(2 * page_size()).unwrap();
        assert!(unsafe { pages.as_mut_ptr().cast::<f32>().sub(ALIGN / 4).read() }.is_nan());
    }
}
