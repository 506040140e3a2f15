//! Work that, once started, runs to its end even if the future waiting for
//! it is dropped (a caller's timeout or `select!`): a group write with its
//! flush, a record's write outside the coalescer, an atomic batch, a
//! namespace catalog change or flush floor (`catalog.rs`).
//! Dropped, such work is *handed on*; this module says to whom.
//!
//! [`Finish`] holds such work as a boxed future that owns what it needs (an
//! `Arc` of the engine, its buffers). Polled, it is that future. Dropped
//! before the work has ended, it hands the work on:
//!
//! - on an executor's thread ([`granary_rt::current_core`], also inside a
//!   `block_on` there), to a task of its own on that executor (its IO is on
//!   that executor's ring);
//! - elsewhere (a `block_on` on a plain thread), to a thread of its own.
//!   Off an executor every device IO is synchronous (it completes within
//!   the poll that makes it), so the work holds no IO of this thread's;
//!   what it may still wait for is other writers: a group ahead of it, a
//!   key's lock. Run in the drop instead, it could wait for a writer of the
//!   same `block_on` that is dropped after it, or not polled meanwhile.
//!
//! Where the work's output needs someone who is no longer there (the
//! allocation a write holds, released once its IO has ended), the work is
//! given a function for that ([`Finish::new`]'s `orphaned`).
//!
//! Each hand-off is counted in [`Detached`] until the work ends. Closing
//! or dropping the store off an executor's thread waits until every
//! handed-on work has ended, so none lands on its device after the store
//! is gone (see `Store::stop_gc`; a [`crate::Namespace`]'s calls still
//! running then are the caller's to finish first). On an executor's
//! thread it waits for none (the works handed to that executor run only
//! once the thread is back in its loop): they run on after the close.
//!
//! Invariants: the engine never drops a device IO of its own midway (a
//! dropped io_uring operation may still complete: the allocation it writes
//! could not be released safely, nor its outcome told). A work polled on
//! an executor (outside a `block_on`, where its IO goes through the ring)
//! is handed on only on that executor's thread (the IO belongs to that
//! thread's ring); a [`Finish`] dropped on another thread drops the work,
//! whose own last guard then runs. A runtime that shuts down drops the
//! tasks it still holds the same way. A work dropped with its IO in
//! flight poisons the store, as does, in zoned mode, a group write dropped
//! before its IO (its unwritten grains are a hole before the zone's write
//! pointer); one dropped before its IO otherwise fails its members still
//! waiting. Once the store is poisoned, releasing the allocations such
//! work held is harmless (nothing allocates and GC stops): a group's
//! members release theirs as on any failed write, while a write outside
//! the coalescer keeps its own.

use crate::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};

/// A boxed work: `Send` (the futures that await it are) and `'static` (it
/// may outlive them).
pub(crate) type Work<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The error that poisons a store whose work was dropped unfinished at
/// `offset` (`what` says how).
pub(crate) fn dropped(offset: u64, what: &'static str) -> Error {
    Error::Io { op: "write", offset, source: std::io::Error::new(std::io::ErrorKind::Interrupted, what) }
}

/// What becomes of a handed-on work's output: the engine's part of it
/// (an allocation to release), as its caller would have done.
pub(crate) type Orphaned<E, T> = fn(&E, T);

/// The engine a work belongs to (`store::Core`): shared by an `Arc`, and
/// counting its handed-on works.
pub(crate) trait Shared: Send + Sync + 'static {
    /// Its `Arc` (None before it is shared: during its open).
    fn shared(&self) -> Option<Arc<Self>>;
    fn detached(&self) -> &Detached;
}

/// `$call` (an async call on `$core`, the engine `$me` shared) run to its
/// end even if the future awaiting it is dropped ([`Finish`]), its
/// captures moved into the work; before the engine is shared (its open)
/// it runs inline.
macro_rules! to_the_end {
    ($me:expr, |$core:ident| $call:expr) => {{
        let me = $me;
        match $crate::detach::Shared::shared(me) {
            Some($core) => $crate::detach::Finish::new(me, Box::pin(async move { $call.await }), None).await,
            None => {
                let $core = me;
                $call.await
            }
        }
    }};
}
pub(crate) use to_the_end;

/// A work that runs to its end ([module docs](self)).
pub(crate) struct Finish<'c, E: Shared, T: Send + 'static> {
    core: &'c E,
    work: Option<Work<T>>,
    orphaned: Option<Orphaned<E, T>>,
    /// The executor thread that polled it, whose ring its IO may be on (0:
    /// never polled on an executor).
    thread: usize,
}

/// An address unique to the calling thread while it lives.
fn this_thread() -> usize {
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|m| m as *const u8 as usize)
}

impl<'c, E: Shared, T: Send + 'static> Finish<'c, E, T> {
    pub(crate) fn new(core: &'c E, work: Work<T>, orphaned: Option<Orphaned<E, T>>) -> Self {
        Finish { core, work: Some(work), orphaned, thread: 0 }
    }
}

impl<E: Shared, T: Send + 'static> Future for Finish<'_, E, T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        if this.thread == 0 && granary_rt::on_runtime() {
            this.thread = this_thread();
        }
        let work = this.work.as_mut().expect("Finish polled after completion");
        let out = std::task::ready!(work.as_mut().poll(cx));
        this.work = None;
        Poll::Ready(out)
    }
}

impl<E: Shared, T: Send + 'static> Drop for Finish<'_, E, T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        if self.thread != 0 && self.thread != this_thread() {
            return; // see the module docs: dropped off its executor's thread
        }
        let orphaned = self.orphaned;
        let Some(core) = self.core.shared() else {
            // An engine not shared yet (its open): nothing else can wait
            // for this work, and nothing runs it but this thread.
            let out = granary_rt::block_on(work);
            if let Some(f) = orphaned {
                f(self.core, out);
            }
            return;
        };
        // Counted from the hand-off, before the task first runs.
        let running = Running::start(core);
        let run = async move {
            let running = running;
            let out = work.await;
            if let Some(f) = orphaned {
                f(&running.0, out);
            }
        };
        if granary_rt::current_core().is_some() {
            drop(granary_rt::spawn(run)); // detached: the task runs on
            return;
        }
        // Sent once the thread exists, so a thread that cannot be made
        // leaves the work here, to run in the drop after all.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Work<()>>(1);
        let thread = std::thread::Builder::new().name("granary-finish".into()).spawn(move || {
            if let Ok(run) = rx.recv() {
                granary_rt::block_on(run);
            }
        });
        let run: Work<()> = Box::pin(run);
        let left = match thread {
            Ok(_) => tx.send(run).err().map(|e| e.0),
            Err(e) => {
                tracing::warn!(error = %e, "no thread to finish a dropped write on: finishing it in the drop");
                Some(run)
            }
        };
        if let Some(run) = left {
            granary_rt::block_on(run);
        }
    }
}

/// A handed-on work in progress, counted in its engine's [`Detached`]
/// from its hand-off until it ends or is dropped.
struct Running<E: Shared>(Arc<E>);

impl<E: Shared> Running<E> {
    fn start(core: Arc<E>) -> Running<E> {
        *core.detached().n.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Running(core)
    }
}

impl<E: Shared> Drop for Running<E> {
    fn drop(&mut self) {
        let d = self.0.detached();
        let mut n = d.n.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            d.idle.notify_all();
        }
    }
}

/// The handed-on works of one engine still running.
#[derive(Default)]
pub(crate) struct Detached {
    n: Mutex<usize>,
    idle: Condvar,
}

impl Detached {
    /// Block until no handed-on work is running. Not on an executor
    /// thread: a work handed to that executor could not run meanwhile.
    pub(crate) fn wait_idle(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}
