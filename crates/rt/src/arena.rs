//! The registered-buffer arena: one process-wide region of page-aligned
//! memory that every executor registers with its ring as fixed buffer 0,
//! so that reads and writes into it use `IORING_OP_READ_FIXED` /
//! `WRITE_FIXED` and the kernel skips pinning the pages of each IO.
//!
//! It is created once, by the first [`crate::Runtime`] whose config asks for
//! it (`RuntimeConfig::registered_buffer_bytes`), and never freed (the rings
//! that registered it may outlive any one owner). Chunks are handed out in
//! power-of-two size classes from 4 KiB to [`CHUNK_BYTES_MAX`]: a free list
//! per class, refilled by a bump pointer; a freed chunk goes back to its
//! class's list (chunks are not merged). When the arena is exhausted, or a
//! request is larger than the largest class, [`Arena::alloc`] returns None
//! and callers use ordinary heap memory with ordinary (unfixed) operations.
//!
//! Each thread keeps up to [`THREAD_CACHE_CHUNKS`] free chunks of the
//! smallest class for itself, taken and returned without a lock (a GET of a
//! 4 KiB record allocates and frees one, and the class's mutex would be a
//! visible share of an in-memory GET); a thread's cached chunks go back to the shared list when
//! it exits. Chunks in a cache count as free, not in use.
//!
//! [`crate::read_at`] and [`crate::write_at`] choose the fixed form
//! themselves when the buffer lies inside the arena and the current
//! executor's registration succeeded; callers need not know. Registration
//! pins the whole arena (it counts against RLIMIT_MEMLOCK for a process
//! without CAP_IPC_LOCK); when it fails the executor logs a warning once and
//! uses unfixed operations.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// Smallest chunk.
pub const CHUNK_BYTES_MIN: usize = 4096;
/// Largest chunk: bigger buffers come from the heap.
pub const CHUNK_BYTES_MAX: usize = 1 << 20;
/// Default arena size (`RuntimeConfig::registered_buffer_bytes`).
pub const ARENA_BYTES_DEFAULT: usize = 32 << 20;
const CLASSES: usize = (CHUNK_BYTES_MAX / CHUNK_BYTES_MIN).trailing_zeros() as usize + 1;
/// Free smallest-class chunks a thread keeps without locking.
pub const THREAD_CACHE_CHUNKS: usize = 8;

/// A thread's free smallest-class chunks (offsets into the one arena).
struct ThreadCache(Vec<usize>);

impl Drop for ThreadCache {
    fn drop(&mut self) {
        if let Some(a) = get() {
            a.free[0].lock().unwrap_or_else(|e| e.into_inner()).append(&mut self.0);
        }
    }
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = const { RefCell::new(ThreadCache(Vec::new())) };
}

/// The arena. See the module doc.
pub struct Arena {
    base: NonNull<u8>,
    bytes: usize,
    bump: AtomicUsize,
    free: [Mutex<Vec<usize>>; CLASSES],
    in_use: AtomicUsize,
}

// SAFETY: the arena only hands out disjoint chunks; its own state is atomics
// and mutexes. The base pointer is never dereferenced by the arena itself.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

static ARENA: OnceLock<Option<Arena>> = OnceLock::new();

/// Create the arena with `bytes` (rounded up to the largest chunk) if no
/// arena exists yet; returns the arena, whatever its size. None if it could
/// not be mapped (logged) or `bytes` is zero on the first call.
pub fn init(bytes: usize) -> Option<&'static Arena> {
    ARENA
        .get_or_init(|| {
            if bytes == 0 {
                return None;
            }
            let bytes = bytes.next_multiple_of(CHUNK_BYTES_MAX);
            // SAFETY: an anonymous private mapping; no file, no fixed address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                tracing::warn!(bytes, error = %std::io::Error::last_os_error(), "cannot map the registered-buffer arena");
                return None;
            }
            Some(Arena {
                base: NonNull::new(p.cast()).expect("mmap returned a non-null address"),
                bytes,
                bump: AtomicUsize::new(0),
                free: std::array::from_fn(|_| Mutex::new(Vec::new())),
                in_use: AtomicUsize::new(0),
            })
        })
        .as_ref()
}

/// The arena, if one was created.
pub fn get() -> Option<&'static Arena> {
    ARENA.get().and_then(|a| a.as_ref())
}

/// A chunk of the arena: where it starts, its size, its class.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    pub ptr: NonNull<u8>,
    pub bytes: usize,
    pub class: u8,
}

impl Arena {
    /// Start and length, for registration.
    pub(crate) fn iovec(&self) -> libc::iovec {
        libc::iovec { iov_base: self.base.as_ptr().cast(), iov_len: self.bytes }
    }

    /// Total bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes in chunks handed out and not yet freed.
    pub fn bytes_in_use(&self) -> usize {
        self.in_use.load(Relaxed)
    }

    /// Whether `[ptr, ptr + len)` lies inside the arena.
    pub fn contains(&self, ptr: *const u8, len: usize) -> bool {
        let start = self.base.as_ptr() as usize;
        let p = ptr as usize;
        p >= start && p.checked_add(len).is_some_and(|end| end <= start + self.bytes)
    }

    /// A chunk of at least `len` bytes (contents unspecified), or None when
    /// `len` exceeds [`CHUNK_BYTES_MAX`] or the arena is exhausted.
    pub fn alloc(&self, len: usize) -> Option<Chunk> {
        if len > CHUNK_BYTES_MAX {
            return None;
        }
        let bytes = len.max(CHUNK_BYTES_MIN).next_power_of_two();
        let class = (bytes / CHUNK_BYTES_MIN).trailing_zeros() as usize;
        // The cache is only ever filled with chunks of the one arena (there
        // is no other: `init` makes it once), so any arena may take from it.
        let cached = || CACHE.try_with(|c| c.borrow_mut().0.pop()).ok().flatten();
        let shared = || self.free[class].lock().unwrap_or_else(|e| e.into_inner()).pop();
        let off = if class == 0 { cached().or_else(shared) } else { shared() };
        let off = off.or_else(|| {
            // Chunks are aligned to their size, so a chunk never straddles a
            // huge page it does not need and offsets stay page-aligned.
            let mut cur = self.bump.load(Relaxed);
            loop {
                let at = cur.next_multiple_of(bytes);
                let end = at.checked_add(bytes)?;
                if end > self.bytes {
                    return None;
                }
                match self.bump.compare_exchange_weak(cur, end, Relaxed, Relaxed) {
                    Ok(_) => return Some(at),
                    Err(now) => cur = now,
                }
            }
        })?;
        self.in_use.fetch_add(bytes, Relaxed);
        // SAFETY: off + bytes <= self.bytes, inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off)) };
        Some(Chunk { ptr, bytes, class: class as u8 })
    }

    /// Give a chunk back.
    ///
    /// # Safety
    ///
    /// `chunk` came from this arena's [`Arena::alloc`], is freed once, and
    /// nothing (the kernel included) uses its memory afterwards.
    pub unsafe fn free(&self, chunk: Chunk) {
        let off = chunk.ptr.as_ptr() as usize - self.base.as_ptr() as usize;
        self.in_use.fetch_sub(chunk.bytes, Relaxed);
        if chunk.class == 0 {
            let kept = CACHE.try_with(|c| {
                let mut c = c.borrow_mut();
                (c.0.len() < THREAD_CACHE_CHUNKS).then(|| c.0.push(off)).is_some()
            });
            if kept == Ok(true) {
                return;
            }
        }
        self.free[chunk.class as usize].lock().unwrap_or_else(|e| e.into_inner()).push(off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_reuse_and_exhaustion() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = init(ARENA_BYTES_DEFAULT).expect("arena maps");
        let c = a.alloc(100).unwrap();
        assert_eq!((c.bytes, c.class), (4096, 0));
        assert!(a.contains(c.ptr.as_ptr(), 4096));
        assert!(!a.contains(c.ptr.as_ptr(), a.bytes() + 1));
        let d = a.alloc(5000).unwrap();
        assert_eq!((d.bytes, d.class), (8192, 1));
        assert_eq!(d.ptr.as_ptr() as usize % 8192, a.base.as_ptr() as usize % 8192);
        assert!(a.alloc(CHUNK_BYTES_MAX + 1).is_none());
        let p = c.ptr;
        // SAFETY: c came from alloc and is not used again.
        unsafe { a.free(c) };
        // SAFETY: as above.
        unsafe { a.free(d) };
        // Other tests in this process may allocate concurrently, so only
        // check that a freed class-0 chunk can come back.
        let mut got = Vec::new();
        let mut reused = false;
        while let Some(c) = a.alloc(4096) {
            reused |= c.ptr == p;
            got.push(c);
            if reused {
                break;
            }
        }
        assert!(reused, "the freed chunk is handed out again");
        for c in got {
            // SAFETY: each came from alloc and is freed once.
            unsafe { a.free(c) };
        }
    }

    /// Chunks pass through the threads' caches without ever being handed
    /// out to two holders at once, and the chunks a thread kept go back to
    /// the shared list when it exits.
    #[test]
    fn thread_caches_hand_out_each_chunk_once_and_return_on_exit() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = init(ARENA_BYTES_DEFAULT).expect("arena maps");
        let held: Vec<Vec<usize>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u64)
                .map(|t| {
                    s.spawn(move || {
                        let mut seen = Vec::new();
                        for round in 0..200u64 {
                            let cs: Vec<Chunk> = (0..THREAD_CACHE_CHUNKS + 3).map(|_| a.alloc(4096).unwrap()).collect();
                            // Each holder marks its chunks; a chunk also held
                            // by another thread gets its mark overwritten.
                            let mark = (t << 32) | round;
                            for c in &cs {
                                // SAFETY: the chunk is 4 KiB of memory this
                                // thread holds until it frees it below.
                                unsafe { c.ptr.as_ptr().cast::<u64>().write_volatile(mark) };
                            }
                            std::thread::yield_now();
                            for c in &cs {
                                // SAFETY: as above.
                                let got = unsafe { c.ptr.as_ptr().cast::<u64>().read_volatile() };
                                assert_eq!(got, mark, "a chunk was held by two threads at once");
                            }
                            if round == 199 {
                                seen = cs.iter().map(|c| c.ptr.as_ptr() as usize).collect();
                            }
                            for c in cs {
                                // SAFETY: each came from alloc and is freed once.
                                unsafe { a.free(c) };
                            }
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // The exited threads' chunks are all on the shared list again:
        // allocating (bounded by the arena's size) finds every one.
        let mut want: std::collections::HashSet<usize> = held.into_iter().flatten().collect();
        let mut got = Vec::new();
        while !want.is_empty() {
            let Some(c) = a.alloc(4096) else { break };
            want.remove(&(c.ptr.as_ptr() as usize));
            got.push(c);
        }
        assert!(want.is_empty(), "{} chunks kept by exited threads", want.len());
        for c in got {
            // SAFETY: each came from alloc and is freed once.
            unsafe { a.free(c) };
        }
    }

    /// The arena is process-wide: its tests run one at a time, so one does
    /// not take the chunks another looks for.
    static SERIAL: Mutex<()> = Mutex::new(());
}
