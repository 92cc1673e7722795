//! A counting global allocator: net bytes allocated by this process, for
//! the bytes-per-node rows, and gross bytes requested.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

static NET: AtomicI64 = AtomicI64::new(0);
/// Bytes ever requested (a `realloc` counts its new size).
static GROSS: AtomicI64 = AtomicI64::new(0);

/// The system allocator, counting.
pub(crate) struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged (upholding `GlobalAlloc`'s contract by delegation) and only adds
// a relaxed atomic counter update.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        NET.fetch_add(layout.size() as i64, Relaxed);
        GROSS.fetch_add(layout.size() as i64, Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NET.fetch_sub(layout.size() as i64, Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        NET.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
        GROSS.fetch_add(new_size as i64, Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Bytes requested so far, freed or not.
pub(crate) fn requested() -> i64 {
    GROSS.load(Relaxed)
}

/// Net bytes allocated so far.
pub(crate) fn allocated() -> i64 {
    NET.load(Relaxed)
}
