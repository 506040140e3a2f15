//! [`block_on`]: run a future to completion on the calling thread, parking
//! it while the future waits. Used by the synchronous engine API (whose
//! device futures are ready at once) and by tests.
//!
//! On an executor thread `block_on` blocks the executor: ring operations
//! cannot complete meanwhile, so [`crate::on_runtime`] answers false inside
//! it and IO backends use synchronous system calls instead.
//!
//! Timers: a [`crate::Sleep`] polled inside `block_on` asks for the thread
//! to be unparked by its deadline ([`wake_by`]) and stays pending, so the
//! future it is part of (a [`crate::timeout`]) is polled again when either
//! the deadline passes or something else wakes it. A deadline is kept
//! until it passes (a sleep dropped before then costs one spurious poll).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use crate::executor::BLOCK_DEPTH;

struct ThreadWaker {
    thread: Thread,
    woken: AtomicBool,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.woken.swap(true, Release) {
            self.thread.unpark();
        }
    }
}

thread_local! {
    static WAKER: (Arc<ThreadWaker>, Waker) = {
        let tw = Arc::new(ThreadWaker { thread: std::thread::current(), woken: AtomicBool::new(false) });
        (tw.clone(), Waker::from(tw))
    };
}

thread_local! {
    /// The earliest deadline a sleep inside the innermost `block_on` of
    /// this thread asked to be woken by.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Inside [`block_on`]: unpark this thread by `at` (if it is parked then)
/// and return true; false outside it (nothing would poll again).
pub(crate) fn wake_by(at: Instant) -> bool {
    if BLOCK_DEPTH.with(|d| d.get()) == 0 {
        return false;
    }
    DEADLINE.with(|d| d.set(Some(d.get().map_or(at, |x| x.min(at)))));
    true
}

struct DepthGuard;

impl DepthGuard {
    fn enter() -> DepthGuard {
        BLOCK_DEPTH.with(|d| d.set(d.get() + 1));
        DepthGuard
    }
}

impl Drop for DepthGuard {
    fn drop(&mut self) {
        BLOCK_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Poll `fut` on this thread until it completes.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let _depth = DepthGuard::enter();
    // A block_on nested in a future an outer one polls: the outer's
    // deadline is its own, given back when this one returns.
    let outer = DEADLINE.take();
    let mut fut = std::pin::pin!(fut);
    let nested = BLOCK_DEPTH.with(|d| d.get()) > 1;
    let v = WAKER.with(|(tw, waker)| {
        let mut cx = Context::from_waker(waker);
        // A wake-up this loop took: nested, it may have been the outer
        // future's (every depth shares the thread's waker), which then
        // polls again rather than park on it.
        let mut took = false;
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                if nested && took {
                    tw.woken.store(true, Release);
                }
                return v;
            }
            loop {
                if tw.woken.swap(false, Acquire) {
                    took = true;
                    break;
                }
                match DEADLINE.get() {
                    None => std::thread::park(),
                    Some(at) => {
                        let now = Instant::now();
                        if now >= at {
                            // Due: poll again (the sleep then completes).
                            DEADLINE.set(None);
                            break;
                        }
                        std::thread::park_timeout(at - now);
                    }
                }
            }
        }
    });
    DEADLINE.set(outer);
    v
}
