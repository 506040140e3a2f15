//! [`AlignedBuf`]: a buffer aligned for direct IO, owned by whoever is
//! doing IO with it.
//!
//! Its memory comes from the runtime's registered-buffer arena
//! (`granary_rt::arena`) when one exists and has room, so that io_uring
//! reads and writes into it use fixed buffers; otherwise from the heap.
//! Heap buffers of one block ([`ALIGN_BYTES`], the size of most GETs)
//! are kept in a small per-thread cache when dropped and handed out again
//! (at most [`HEAP_CACHE_BUFFERS`] a thread), so that an embedding
//! without the runtime does not allocate and clear 4 KiB per GET.
//!
//! Invariants: the allocation is [`ALIGN_BYTES`]-aligned, at least
//! `ALIGN_BYTES` long, initialised (zeroed at allocation, except a read
//! buffer from [`AlignedBuf::for_read`], which holds a previous user's
//! bytes until the read overwrites them), and `len <= cap`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: enough for 512 B and 4 KiB logical blocks.
pub const ALIGN_BYTES: usize = 4096;

/// One-block heap buffers a thread keeps for reuse (see the module doc):
/// 64 KiB a thread at most.
pub const HEAP_CACHE_BUFFERS: usize = 16;

/// A thread's cached one-block heap allocations (initialised memory, each
/// owned by the cache alone until handed out).
struct HeapCache(Vec<NonNull<u8>>);

impl Drop for HeapCache {
    fn drop(&mut self) {
        for p in self.0.drain(..) {
            // SAFETY: every cached pointer was allocated with the one-block
            // layout, is owned by the cache alone and is freed once here.
            unsafe { dealloc(p.as_ptr(), one_block()) }
        }
    }
}

thread_local! {
    static HEAP_CACHE: RefCell<HeapCache> = const { RefCell::new(HeapCache(Vec::new())) };
}

/// The layout of a one-block buffer.
fn one_block() -> Layout {
    Layout::from_size_align(ALIGN_BYTES, ALIGN_BYTES).expect("one block is a valid layout")
}

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    /// The arena class when the memory is an arena chunk.
    arena_class: Option<u8>,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); moving it
// to another thread moves that ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8]; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes: an arena chunk when the arena has
    /// room, else a heap allocation. Only the `len` bytes are cleared (a
    /// 1.5 KiB record in a 4 KiB chunk clears 1.5 KiB); what lies beyond,
    /// up to the capacity, is unspecified (see [`AlignedBuf::set_len`]).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let (mut b, fresh) = Self::take(len);
        if !fresh {
            b.fill(0); // a fresh heap allocation comes zeroed already
        }
        b
    }

    /// A buffer of `len` bytes for a device read to fill: like
    /// [`AlignedBuf::zeroed`], but an arena chunk is handed out as it is,
    /// holding what its last user left (initialised bytes: the arena is
    /// zero-filled when mapped and only ever written with initialised
    /// bytes), which saves clearing 4 KiB per GET. Only for reads that
    /// overwrite the whole length or fail: a read that stops short returns
    /// an error (`UnexpectedEof`), never the buffer's old bytes.
    pub fn for_read(len: usize) -> AlignedBuf {
        Self::take(len).0
    }

    /// A buffer of `len` bytes and whether it is a fresh (zeroed) heap
    /// allocation: an arena chunk, else a cached one-block heap buffer,
    /// else a new heap allocation.
    fn take(len: usize) -> (AlignedBuf, bool) {
        if let Some(c) = granary_rt::arena::get().and_then(|a| a.alloc(len)) {
            return (AlignedBuf { ptr: c.ptr, len, cap: c.bytes, arena_class: Some(c.class) }, false);
        }
        Self::take_heap(len)
    }

    /// [`AlignedBuf::take`] from the heap: a cached one-block buffer, else
    /// a new allocation.
    fn take_heap(len: usize) -> (AlignedBuf, bool) {
        if len <= ALIGN_BYTES {
            let cached = HEAP_CACHE.try_with(|c| c.borrow_mut().0.pop()).ok().flatten();
            if let Some(ptr) = cached {
                return (AlignedBuf { ptr, len, cap: ALIGN_BYTES, arena_class: None }, false);
            }
        }
        (Self::zeroed_heap(len), true)
    }

    /// A zeroed buffer of `len` bytes from the heap (never the arena).
    pub fn zeroed_heap(len: usize) -> AlignedBuf {
        let cap = len.max(1).next_multiple_of(ALIGN_BYTES);
        let layout = Layout::from_size_align(cap, ALIGN_BYTES).expect("buffer size overflows");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap, arena_class: None }
    }

    /// Whether the memory is a chunk of the registered arena.
    pub fn is_registered(&self) -> bool {
        self.arena_class.is_some()
    }

    /// Allocated bytes (a multiple of [`ALIGN_BYTES`]).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Change the length within the capacity; new bytes keep whatever the
    /// memory held: zeros for a heap buffer never written, possibly a
    /// previous user's bytes for a reused arena chunk or cached heap
    /// buffer. Callers grow a buffer only to read into it.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "AlignedBuf::set_len beyond capacity");
        self.len = len;
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes (see the module doc) and
        // lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the allocation is owned by the AlignedBuf, lives until it is
// dropped, and does not move when the AlignedBuf is moved; len <= cap.
unsafe impl granary_rt::IoBuf for AlignedBuf {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn buf_len(&self) -> usize {
        self.len
    }
}

/// The bytes of an [`AlignedBuf`] from `from` on, for continuing a short
/// transfer through the ring.
pub(crate) struct Tail(pub AlignedBuf, pub usize);

// SAFETY: as for AlignedBuf; from <= len is checked at construction.
unsafe impl granary_rt::IoBuf for Tail {
    fn stable_ptr(&mut self) -> *mut u8 {
        // SAFETY: from <= len <= cap keeps the pointer within the allocation.
        unsafe { self.0.ptr.as_ptr().add(self.1) }
    }
    fn buf_len(&self) -> usize {
        self.0.len - self.1
    }
}

impl Tail {
    pub(crate) fn new(buf: AlignedBuf, from: usize) -> Tail {
        assert!(from <= buf.len, "Tail beyond the buffer");
        Tail(buf, from)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(class) = self.arena_class {
            let a = granary_rt::arena::get().expect("an arena chunk implies the arena");
            // SAFETY: the chunk came from this arena's alloc; this buffer owned
            // it exclusively, and an operation that lent it to the kernel
            // returned it only after the completion (granary-rt's Op).
            unsafe { a.free(granary_rt::arena::Chunk { ptr: self.ptr, bytes: self.cap, class }) };
            return;
        }
        if self.cap == ALIGN_BYTES {
            let ptr = self.ptr;
            let kept = HEAP_CACHE.try_with(|c| {
                let mut c = c.borrow_mut();
                (c.0.len() < HEAP_CACHE_BUFFERS).then(|| c.0.push(ptr)).is_some()
            });
            if kept == Ok(true) {
                return; // the cache owns the allocation now
            }
        }
        let layout = Layout::from_size_align(self.cap, ALIGN_BYTES).expect("layout was valid at allocation");
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len={}, cap={}, registered={})", self.len, self.cap, self.arena_class.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_resizable() {
        let mut b = AlignedBuf::zeroed(1000);
        assert_eq!(b.as_ptr() as usize % ALIGN_BYTES, 0);
        assert_eq!((b.len(), b.capacity()), (1000, 4096));
        assert!(b.iter().all(|&x| x == 0));
        b[999] = 7;
        b.set_len(4096);
        assert_eq!(b[999], 7);
        let e = AlignedBuf::zeroed(0);
        assert_eq!(e.len(), 0);
    }

    /// A dropped one-block heap buffer is reused by the thread, and
    /// `zeroed` still hands out zeros when it reuses one that was written.
    #[test]
    fn heap_buffers_are_reused_and_zeroed_again() {
        // On a thread of its own: the cache is per thread. Straight from the
        // heap (`take_heap`), whether or not a test set up the arena.
        std::thread::spawn(|| {
            let (mut a, fresh) = AlignedBuf::take_heap(4096);
            assert!(fresh && !a.is_registered() && a.iter().all(|&x| x == 0));
            a.fill(0xa5);
            let p = a.as_ptr();
            drop(a);
            let (r, fresh) = AlignedBuf::take_heap(512);
            assert!(!fresh);
            assert_eq!((r.as_ptr(), r.len(), r.capacity()), (p, 512, 4096), "the dropped buffer is reused");
            assert!(r.iter().all(|&x| x == 0xa5), "a read buffer keeps the bytes for the read to overwrite");
            drop(r);
            let z = AlignedBuf::zeroed(4096);
            if granary_rt::arena::get().is_none() {
                assert_eq!(z.as_ptr(), p, "zeroed reuses the cached buffer");
            }
            assert!(z.iter().all(|&x| x == 0), "zeroed clears a reused buffer");
            drop(z);
            // Larger buffers are not cached: a fresh allocation, zeroed.
            let (big, fresh) = AlignedBuf::take_heap(8192);
            assert!(fresh && big.iter().all(|&x| x == 0));
            // More buffers than the cache holds are freed, not kept.
            let many: Vec<_> = (0..HEAP_CACHE_BUFFERS + 4).map(|_| AlignedBuf::take_heap(4096).0).collect();
            drop(many);
            let kept = HEAP_CACHE.with(|c| c.borrow().0.len());
            assert_eq!(kept, HEAP_CACHE_BUFFERS);
        })
        .join()
        .expect("the test thread passes");
    }
}
