//! Timers of one executor: a map from (deadline, sequence) to the waker of
//! the task sleeping until then. The executor fires due timers every round
//! and blocks in the kernel no longer than the earliest deadline.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::executor::with_executor;

#[derive(Default)]
pub(crate) struct Timers {
    map: BTreeMap<(Instant, u64), Waker>,
    seq: u64,
}

impl Timers {
    fn insert(&mut self, at: Instant, waker: Waker) -> u64 {
        self.seq += 1;
        self.map.insert((at, self.seq), waker);
        self.seq
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.map.keys().next().map(|k| k.0)
    }

    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next_deadline().is_some_and(|d| d <= now)
    }

    /// Remove and return the wakers of every timer due at `now`.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Waker> {
        let mut out = Vec::new();
        while let Some(e) = self.map.first_entry() {
            if e.key().0 > now {
                break;
            }
            out.push(e.remove());
        }
        out
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }
}

/// Completes at `at`. On an executor thread it uses the executor's timers;
/// inside [`crate::block_on`] it has `block_on` unpark the thread by `at`
/// (so a [`timeout`] there ends when its future does); polled anywhere
/// else it sleeps the thread until `at`.
pub struct Sleep {
    at: Instant,
    /// Its registration: the executor's serial and the key in that
    /// executor's timers (each executor numbers its own, so a key means
    /// nothing on another: a `Sleep` is `Send`, and may be polled or
    /// dropped on another executor than the one it registered on).
    reg: Option<(u64, (Instant, u64))>,
}

/// Sleep for `d`.
pub fn sleep(d: Duration) -> Sleep {
    let now = Instant::now();
    // A duration past what the clock can count (years on end) is a sleep
    // that does not end: a century from now, instead of an overflow.
    sleep_until(now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400)))
}

/// Sleep until `at`.
pub fn sleep_until(at: Instant) -> Sleep {
    Sleep { at, reg: None }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        let at = self.at;
        if now >= at {
            self.deregister();
            return Poll::Ready(());
        }
        let reg = crate::on_runtime().then(|| {
            with_executor(|ex| {
                let mut t = ex.timers.borrow_mut();
                if let Some((owner, k)) = self.reg {
                    // Registered elsewhere, it stays there until its time
                    // (a spurious wake of a task that moved on).
                    if owner == ex.serial {
                        t.map.remove(&k);
                    }
                }
                (ex.serial, (at, t.insert(at, cx.waker().clone())))
            })
        });
        let reg = reg.flatten();
        match reg {
            Some(k) => {
                self.reg = Some(k);
                Poll::Pending
            }
            None if crate::blocking::wake_by(at) => Poll::Pending,
            None => {
                // Neither on an executor nor in block_on: nothing will
                // poll again by `at`, so wait here.
                std::thread::sleep(at - now);
                Poll::Ready(())
            }
        }
    }
}

impl Sleep {
    fn deregister(&mut self) {
        if let Some((owner, k)) = self.reg.take() {
            with_executor(|ex| {
                if ex.serial == owner {
                    ex.timers.borrow_mut().map.remove(&k);
                }
            });
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// The deadline passed before the future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deadline elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// Run `fut` for at most `d`; on expiry it is dropped (cancelled).
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(sleep(d));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}
