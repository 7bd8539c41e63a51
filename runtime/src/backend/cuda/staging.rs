//! Page-locked host memory that a step's inputs are copied through. A copy from pageable memory
//! first waits for everything queued on the stream before it, then for the driver to stage the
//! bytes ("API synchronization behavior" in the driver API's documentation): a step's few small
//! uploads (token ids, positions, per-layer-embedding rows) were as many round trips to the GPU
//! before its launches. A copy from page-locked memory is queued, and the host goes on.

use cudarc::driver::{result, CudaContext, DriverError};
use std::sync::Arc;

/// A page-locked region filled front to back by queued copies, free again once the stream they
/// were queued on has been waited for (`reuse`).
pub(super) struct PinnedStaging {
    /// Held so that the region is freed while its context lives.
    context: Arc<CudaContext>,
    ptr: *mut u8,
    capacity: usize,
    used: usize,
}

// SAFETY: the region is this staging's alone, reached only through `&mut self`.
unsafe impl Send for PinnedStaging {}

impl PinnedStaging {
    /// No region yet: the first `grow` allocates one.
    pub(super) fn new(context: Arc<CudaContext>) -> PinnedStaging {
        PinnedStaging { context, ptr: std::ptr::null_mut(), capacity: 0, used: 0 }
    }

    /// Whether `bytes` more fit behind what is staged.
    pub(super) fn has_room(&self, bytes: usize) -> bool {
        self.used + bytes <= self.capacity
    }

    /// Bytes staged since the region was last free.
    pub(super) fn staged(&self) -> usize {
        self.used
    }

    /// A new region, where `has_room` said there was none, of twice `wanted` (what was staged and
    /// asked together, `staged` read before the wait that freed the region), never smaller than
    /// the one it replaces: so the region comes to hold a whole step's inputs after a few steps,
    /// and a step then waits for none of them. Everything staged must have been copied: the
    /// stream was waited for.
    pub(super) fn grow(&mut self, wanted: usize) -> Result<(), DriverError> {
        let capacity = grown_capacity(self.capacity, wanted);
        self.free()?;
        // SAFETY: a new allocation, which only this staging refers to.
        self.ptr = unsafe { result::malloc_host(capacity, 0) }? as *mut u8;
        self.capacity = capacity;
        Ok(())
    }

    /// Copies `bytes` behind what is staged (`has_room` said they fit) and returns them there.
    pub(super) fn stage(&mut self, bytes: &[u8]) -> &[u8] {
        assert!(self.has_room(bytes.len()), "staging {} bytes without room", bytes.len());
        // SAFETY: within the region (`has_room`), past every staged byte a queued copy may still
        // read; the region is valid for `capacity` bytes.
        let staged = unsafe {
            let at = self.ptr.add(self.used);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            std::slice::from_raw_parts(at, bytes.len())
        };
        self.used += bytes.len();
        staged
    }

    /// Everything staged has been copied (the stream was waited for): the region is free again.
    pub(super) fn reuse(&mut self) {
        self.used = 0;
    }

    fn free(&mut self) -> Result<(), DriverError> {
        if self.ptr.is_null() {
            return Ok(());
        }
        // An error an earlier release left on the context is taken first, so that binding it
        // (which would return that error instead) does not leave the region allocated.
        let earlier = self.context.check_err();
        self.context.bind_to_thread()?;
        // SAFETY: allocated by `malloc_host`, freed once; no queued copy reads it any more.
        unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) }?;
        (self.ptr, self.capacity, self.used) = (std::ptr::null_mut(), 0, 0);
        earlier
    }
}

/// A region's bytes after one of `capacity` could not hold `wanted`: twice that, never less than
/// before, and at least 64 KiB (a step's token ids and positions alone are a few bytes).
fn grown_capacity(capacity: usize, wanted: usize) -> usize {
    (2 * wanted).max(capacity).max(64 * 1024)
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

#[cfg(test)]
mod tests {
    use super::grown_capacity;

    #[test]
    fn a_region_grows_to_twice_what_was_asked_and_never_shrinks() {
        assert_eq!(grown_capacity(0, 10), 64 * 1024);
        assert_eq!(grown_capacity(64 * 1024, 70 * 1024), 140 * 1024);
        // 70 KiB staged and 20 more asked of an 80 KiB region: 180 KiB, not the 40 of the input
        // alone (counted after the wait that frees the region, as it once was).
        assert_eq!(grown_capacity(80 * 1024, 90 * 1024), 180 * 1024);
        assert_eq!(grown_capacity(1 << 20, 20 * 1024), 1 << 20);
    }
}
