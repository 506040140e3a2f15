//! [`block_on`]: run a future to completion on the calling thread, parking
//! it while the future waits. Used by the synchronous engine API (whose
//! device futures are ready at once) and by tests.
//!
//! On an executor thread `block_on` blocks the executor: ring operations
//! cannot complete meanwhile, so [`crate::on_runtime`] answers false inside
//! it and IO backends use synchronous system calls instead.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

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
    let mut fut = std::pin::pin!(fut);
    WAKER.with(|(tw, waker)| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            while !tw.woken.swap(false, Acquire) {
                std::thread::park();
            }
        }
    })
}
