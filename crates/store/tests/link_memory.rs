//! The DRAM a blind overwrite's link really takes, counted by a global
//! allocator, against what the store accounts for it
//! (`LINK_OVERHEAD_BYTES` plus the key): the cap on links
//! (`OpenOptions::blind_overwrite_bytes`) is only as good as that estimate.
//! Alone in its test binary, because it replaces the allocator.

use granary_store::{CreateOptions, OpenOptions, Store, LINK_OVERHEAD_BYTES};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;

/// Blind overwrites on (the in-memory device leaves them off by default).
const BLIND: Option<usize> = Some(granary_store::BLIND_OVERWRITE_BYTES_DEFAULT);

/// Bytes allocated and not freed, each block counted as the heap chunk
/// glibc gives it ([`chunk`]).
struct Counting;

/// The bytes of heap a block of `size` bytes takes with glibc on a 64-bit
/// machine: the request plus its 8-byte size word, rounded up to 16 bytes,
/// at least 32.
fn chunk(size: usize) -> isize {
    ((size + 8).div_ceil(16) * 16).max(32) as isize
}

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed through to the system allocator unchanged;
// the counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(l.size()), Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(chunk(l.size()), Relaxed);
        // SAFETY: `p` was allocated by `alloc` above with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(chunk(new) - chunk(l.size()), Relaxed);
        // SAFETY: `p` was allocated by this allocator with layout `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_link_costs_no_more_than_the_store_accounts() {
    // Just before the head map's growth, when its slots are fullest; the
    // per-link cost measured 161-171 bytes over 15,000-66,000 links.
    const KEYS: usize = 29_000;
    let dev = Arc::new(granary_io::MemDevice::new(96 << 20));
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None };
    let open = OpenOptions {
        blind_overwrite_bytes: BLIND,
        gc: false,
        checkpoint_interval: None,
        checkpoint_on_close: false,
        ..OpenOptions::default()
    };
    let s = Store::create(dev, &create, &open).unwrap();
    let key = |i: usize| format!("link-memory-key-{i:08}").into_bytes(); // 24 bytes
    for i in 0..KEYS {
        s.put(&key(i), b"first").unwrap();
    }
    let before = LIVE.load(Relaxed);
    for i in 0..KEYS {
        s.put(&key(i), b"second").unwrap();
    }
    let after = LIVE.load(Relaxed);
    let st = s.stats();
    // A key sharing its neighbourhood's fingerprint with another is read
    // first, not linked: a few.
    let links = st.unsettled_links as f64;
    assert!(links > KEYS as f64 * 0.95, "only {links} of {KEYS} overwrites were blind");
    let real = (after - before) as f64 / links;
    let accounted = st.link_bytes as f64 / links;
    assert_eq!(accounted, (LINK_OVERHEAD_BYTES + key(0).len()) as f64);
    eprintln!("a link of a 24-byte key: {real:.0} bytes of heap chunks, {accounted:.0} accounted");
    assert!(real <= accounted, "a link takes {real:.0} bytes, more than the {accounted:.0} the cap counts");
}
