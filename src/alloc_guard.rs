//! Guards the process against allocation bombs in request decoding.
//!
//! Design notes: `docs/front-end.md`.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large are reserved lazily.
const RESERVE_ONLY: usize = 256 << 20;

#[derive(Debug)]
pub struct GuardedAllocator;

fn is_large(layout: &Layout) -> bool {
    layout.size() >= RESERVE_ONLY && layout.align() <= 4096
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure is reported as MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// SAFETY: large blocks come from `mmap` (page-aligned, which satisfies any alignment up to 4096) and
// go back with `munmap` of the same size; everything else is delegated to `System` unchanged.
unsafe impl GlobalAlloc for GuardedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            unsafe { map(layout.size()) } // anonymous mappings are zero-filled
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(&layout) {
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `layout.align()` is valid and `new_size` does not overflow.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_large(&layout) && !is_large(&new_layout) {
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_claimed_capacity_costs_nothing() {
        // 64 GiB: more than this machine has. The system allocator refuses it (and Rust would abort);
        // the guard hands out address space, usable where touched.
        let a = GuardedAllocator;
        let layout = Layout::array::<u64>(8 << 30).unwrap();
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write(7);
            assert_eq!(p.read(), 7);
            // Growing a small block past the threshold keeps its bytes.
            let small = Layout::from_size_align(16, 8).unwrap();
            let q = a.alloc(small);
            q.copy_from(b"0123456789abcdef".as_ptr(), 16);
            let q = a.realloc(q, small, RESERVE_ONLY);
            assert_eq!(std::slice::from_raw_parts(q, 16), b"0123456789abcdef");
            a.dealloc(q, Layout::from_size_align(RESERVE_ONLY, 8).unwrap());
            a.dealloc(p, layout);
        }
    }
}
