//! The node's heap: jemalloc for the many small blocks an event loop allocates and frees in
//! every turn, glibc's malloc for large ones.
//!
//! Under glibc's malloc alone the small blocks (futures, frames, replies, log entries) cost a
//! cluster node about a tenth of its CPU per replicated check more than under jemalloc. Large
//! blocks (the store's partitions and key index, a big client's buffers) stay with glibc, one
//! mapping each: a mapping grows in place (`mremap`) and goes back to the kernel whole when
//! freed, where jemalloc keeps a grown block's old pages until they decay, and a million
//! buckets held about 6 bytes of RSS each more.

use std::alloc::{GlobalAlloc, Layout, System};
use tikv_jemallocator::Jemalloc;

/// Blocks of this size and up come from glibc, which maps each one on its own (see
/// [`tune_glibc`]).
const LARGE: usize = 128 << 10;

pub(crate) struct Heap;

fn large(size: usize) -> bool {
    size >= LARGE
}

// SAFETY: every block is freed, grown or shrunk by the allocator that made it: Rust hands
// `dealloc` and `realloc` the layout the block was allocated (or last reallocated) with, and
// its size alone picks the allocator. A block that crosses the line on `realloc` is moved.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe {
            if large(layout.size()) {
                System.alloc(layout)
            } else {
                Jemalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if large(layout.size()) {
                System.alloc_zeroed(layout)
            } else {
                Jemalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the allocator its layout's size picks (see above).
        unsafe {
            if large(layout.size()) {
                System.dealloc(ptr, layout)
            } else {
                Jemalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; a block that changes sides is copied (the smaller of the
        // two sizes) into a new one from the other allocator, and the old one freed.
        unsafe {
            match (large(layout.size()), large(new_size)) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => Jemalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}

/// Keeps glibc's malloc from handing memory back to the kernel after every burst, and gives
/// every large block a mapping of its own. Fixing the trim threshold also fixes the mmap
/// threshold, which glibc would otherwise raise as large blocks are freed; it stays at
/// [`LARGE`], so large buffers (the store's partitions) keep their own mappings, which grow
/// without copying and leave no holes in the heap (a 1 MiB threshold cost 6 bytes of RSS per
/// bucket).
pub(crate) fn tune_glibc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's settings; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TOP_PAD, 1 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE as libc::c_int);
    }
}

/// Hands the free pages of every jemalloc arena back to the operating system (the node
/// trims glibc's heap itself).
pub(crate) fn purge_jemalloc() {
    // MALLCTL_ARENAS_ALL: every arena at once.
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: `arena.<i>.purge` reads and writes nothing (all pointers null, length 0); the
    // name is a NUL-terminated string that outlives the call.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A block keeps its bytes whichever way it moves between the two allocators, and each
    /// side frees what it made (a mismatch would abort the test process).
    #[test]
    fn blocks_keep_their_bytes_across_the_line_between_allocators() {
        let heap = Heap;
        let sizes = [24, LARGE - 1, LARGE, 3 * LARGE, 100, 2 * LARGE, 40, 8];
        let layout = Layout::from_size_align(sizes[0], 8).expect("layout");
        // SAFETY: every pointer is checked, written within its current size and freed once,
        // with the layout of its last allocation.
        unsafe {
            let mut ptr = heap.alloc(layout);
            assert!(!ptr.is_null());
            let mut size = sizes[0];
            std::ptr::copy_nonoverlapping(filled(size).as_ptr(), ptr, size);
            for &next in &sizes[1..] {
                ptr = heap.realloc(ptr, Layout::from_size_align(size, 8).expect("layout"), next);
                assert!(!ptr.is_null(), "realloc {size} -> {next}");
                let kept = size.min(next);
                assert_eq!(
                    std::slice::from_raw_parts(ptr, kept),
                    &filled(kept)[..],
                    "{size} -> {next}"
                );
                size = next;
                std::ptr::copy_nonoverlapping(filled(size).as_ptr(), ptr, size);
            }
            heap.dealloc(ptr, Layout::from_size_align(size, 8).expect("layout"));

            for size in [16, LARGE + 5] {
                let layout = Layout::from_size_align(size, 64).expect("layout");
                let zeroed = heap.alloc_zeroed(layout);
                assert!(!zeroed.is_null());
                assert_eq!(zeroed as usize % 64, 0, "alignment kept at {size}");
                assert!(
                    std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0)
                );
                heap.dealloc(zeroed, layout);
            }
        }
        purge_jemalloc();
    }
}
