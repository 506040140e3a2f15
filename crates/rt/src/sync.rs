//! Synchronisation between the tasks of one executor (not `Send`: tasks
//! never migrate, so a `Cell` does what an atomic would elsewhere).

use std::cell::{Cell, RefCell};
use std::task::{Poll, Waker};

/// A wake-up between tasks of one executor, for one waiter at a time: a
/// [`notify`](Notify::notify) sets a flag and wakes the task waiting, if
/// any; [`wait`](Notify::wait) returns at once when the flag is set (and
/// clears it), else once a `notify` comes. Notifications do not add up:
/// several before a `wait` end one wait. A second task that waits while
/// one already does replaces its waker, so the first is not woken.
#[derive(Default)]
pub struct Notify {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    /// Set the flag and wake the waiting task, if any.
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Wait until the flag is set, and clear it.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Run two futures on this task at once; both outputs when both are done.
/// Neither is polled again once it is ready.
pub async fn join2<A: std::future::Future, B: std::future::Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.is_some(), rb.is_some()) {
            (true, true) => Poll::Ready((ra.take().expect("ready"), rb.take().expect("ready"))),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_notify_ends_one_wait() {
        let n = Notify::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        {
            let mut w = pin!(n.wait());
            assert!(w.as_mut().poll(&mut cx).is_pending());
            n.notify();
            assert_eq!(count.0.load(Ordering::Relaxed), 1, "the waiter is woken");
            assert!(w.as_mut().poll(&mut cx).is_ready());
        }
        // Two notifications before a wait end that wait, not the next.
        n.notify();
        n.notify();
        assert!(pin!(n.wait()).poll(&mut cx).is_ready());
        assert!(pin!(n.wait()).poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::Relaxed), 1, "no waiter, no wake");
    }
}
