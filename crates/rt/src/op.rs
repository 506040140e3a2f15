//! Ring operations that own their buffers until the kernel is done.
//!
//! An [`Op`] is created with its SQE and the resources the SQE points into
//! (buffers, socket addresses), which must live on the heap so that moving
//! the `Op` does not move them. Its slot in the executor's operation slab
//! records the state: waiting (with the waker of the task to wake), done
//! (with the result), or orphaned. Dropping an `Op` before its completion
//! orphans it: the resources move into the slot, an `AsyncCancel` is
//! submitted, and they are freed only when the completion arrives. So no
//! buffer the kernel may still read or write is ever freed or reused.

use std::any::Any;
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, squeue, types};

use crate::executor::{with_executor, Executor, CANCEL_USER_DATA};
use crate::slab::Key;

pub(crate) enum OpSlot {
    Waiting(Option<Waker>),
    Done(i32),
    /// Its future was dropped: the memory it lent the kernel, kept until
    /// the completion, and whether that completion's result is a new
    /// descriptor (an accept's), which nobody will take and is closed.
    Orphaned(#[allow(dead_code)] Box<dyn Any>, bool),
}

/// Memory an operation may hand to the kernel.
///
/// # Safety
///
/// `stable_ptr` must return a pointer valid for reads and writes of
/// `buf_len()` bytes for as long as the value lives, and the same pointer
/// after the value is moved (heap memory owned by the value). While an
/// operation owns the value nothing else can reach it. The bytes may be
/// uninitialised only when the value goes to an operation the kernel
/// writes and nothing reads (a receive on a plain socket, a file read);
/// code that reads them or makes a slice of them (a send, a TLS receive)
/// must be given initialised memory.
pub unsafe trait IoBuf: Unpin + 'static {
    fn stable_ptr(&mut self) -> *mut u8;
    fn buf_len(&self) -> usize;
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved; an empty
// Vec's dangling pointer is never dereferenced for a zero-length operation.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn buf_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: as for Vec<u8>.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn buf_len(&self) -> usize {
        self.len()
    }
}

/// Whether an `io_uring_enter` error only says "not now": the completion
/// queue is full (EBUSY), a signal came (EINTR), or the kernel lacked
/// memory or request slots for the moment (EAGAIN). The SQEs stay queued;
/// reaping and entering again goes on.
pub(crate) fn retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EINTR) | Some(libc::EAGAIN))
}

/// Queue an SQE on `ex`'s ring, submitting first if the queue is full.
///
/// # Safety
///
/// Every pointer in `sqe` must stay valid until its completion is reaped.
pub(crate) unsafe fn push_sqe(ex: &Executor, sqe: &squeue::Entry) {
    loop {
        {
            let mut ring = ex.ring.borrow_mut();
            // SAFETY: forwarded to the caller.
            if unsafe { ring.submission().push(sqe) }.is_ok() {
                ex.shared.counters.sqes.fetch_add(1, Relaxed);
                return;
            }
            ex.shared.counters.enters.fetch_add(1, Relaxed);
            match ring.submit() {
                Ok(_) => continue,
                Err(e) if retryable(&e) => {}
                Err(e) => panic!("io_uring submit failed: {e}"),
            }
        }
        // The completion queue is full: make room.
        ex.reap();
    }
}

/// A completion arrived for operation `key`.
pub(crate) fn complete(ex: &Executor, key: Key, res: i32) {
    let waker = {
        let mut ops = ex.ops.borrow_mut();
        match ops.get_mut(key) {
            Some(slot) => match slot {
                OpSlot::Waiting(w) => {
                    let w = w.take();
                    *slot = OpSlot::Done(res);
                    w
                }
                OpSlot::Orphaned(_, gives_fd) => {
                    if *gives_fd && res >= 0 {
                        // SAFETY: the kernel made this descriptor for the
                        // dropped operation; nothing else has it.
                        unsafe { libc::close(res) };
                    }
                    ops.remove(key);
                    None
                }
                OpSlot::Done(_) => None,
            },
            None => None,
        }
    };
    if let Some(w) = waker {
        w.wake();
    }
}

/// Drop the slots of completed operations (shutdown, once every task was
/// dropped: a completed operation still held is one whose future went to
/// another thread, and will never be polled here).
pub(crate) fn forget_done(ex: &Executor) {
    let mut ops = ex.ops.borrow_mut();
    for k in ops.keys() {
        if matches!(ops.get_mut(k), Some(OpSlot::Done(_))) {
            ops.remove(k);
        }
    }
}

/// Ask the kernel to cancel every operation in flight (shutdown).
pub(crate) fn cancel_all(ex: &Executor) {
    let keys = ex.ops.borrow().keys();
    for k in keys {
        let sqe = opcode::AsyncCancel::new(k.to_u64()).build().user_data(CANCEL_USER_DATA);
        // SAFETY: a cancel SQE carries no buffer.
        unsafe { push_sqe(ex, &sqe) };
    }
}

/// An operation in flight owning `T` (its buffers). Must be polled on the
/// executor that created it (tasks never migrate): polled on another it
/// panics; dropped on another thread (a future sent elsewhere) it leaks
/// its buffers, since only its own executor can cancel it and the kernel
/// may still write into them.
pub(crate) struct Op<T: 'static> {
    key: Option<Key>,
    /// [`Executor::serial`] of the executor whose ring has it.
    owner: u64,
    /// Its result is a new descriptor ([`Op::submit_fd`]).
    gives_fd: bool,
    data: Option<T>,
}

impl<T: 'static> Op<T> {
    /// Submit `sqe` (queued; sent with the executor's next submission).
    ///
    /// # Safety
    ///
    /// Every pointer in `sqe` must point into heap memory owned by `data`
    /// (or be null/zero-length). Panics off a runtime thread.
    pub(crate) unsafe fn submit(sqe: squeue::Entry, data: T) -> Op<T> {
        let (key, owner) = with_executor(|ex| {
            let key = ex.ops.borrow_mut().insert(OpSlot::Waiting(None));
            // SAFETY: the pointers live in `data`, which the Op (or, once
            // orphaned, its slot) keeps until the completion is reaped.
            unsafe { push_sqe(ex, &sqe.user_data(key.to_u64())) };
            (key, ex.serial)
        })
        .expect("io_uring operation submitted outside a runtime thread");
        Op { key: Some(key), owner, gives_fd: false, data: Some(data) }
    }

    /// [`Op::submit`] of an operation whose result is a new descriptor
    /// (an accept): if the future is dropped and the operation completes
    /// anyway, the descriptor is closed, not leaked.
    ///
    /// # Safety
    ///
    /// As [`Op::submit`].
    pub(crate) unsafe fn submit_fd(sqe: squeue::Entry, data: T) -> Op<T> {
        // SAFETY: forwarded to the caller.
        let mut op = unsafe { Op::submit(sqe, data) };
        op.gives_fd = true;
        op
    }
}

impl<T: Unpin + 'static> Future for Op<T> {
    type Output = (i32, T);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(i32, T)> {
        let key = self.key.expect("Op polled after completion");
        let owner = self.owner;
        let res = with_executor(|ex| {
            // Another executor's slab may hold the same key for another
            // operation: never look there.
            assert_eq!(ex.serial, owner, "io_uring operation polled on another executor");
            let mut ops = ex.ops.borrow_mut();
            match ops.get_mut(key) {
                Some(OpSlot::Done(res)) => {
                    let res = *res;
                    ops.remove(key);
                    Some(res)
                }
                Some(OpSlot::Waiting(w)) => {
                    if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *w = Some(cx.waker().clone());
                    }
                    None
                }
                _ => panic!("io_uring operation polled on another executor"),
            }
        })
        .expect("io_uring operation polled outside a runtime thread");
        match res {
            Some(res) => {
                self.key = None;
                Poll::Ready((res, self.data.take().expect("data present until completion")))
            }
            None => Poll::Pending,
        }
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut data = Some(self.data.take());
        let owner = self.owner;
        let handled = with_executor(|ex| {
            if ex.serial != owner {
                return false;
            }
            let mut ops = ex.ops.borrow_mut();
            match ops.get_mut(key) {
                Some(OpSlot::Done(res)) => {
                    // A new descriptor no one will take: closed, not leaked.
                    if self.gives_fd && *res >= 0 {
                        // SAFETY: the completed operation's descriptor is
                        // this slot's alone; nothing else holds it.
                        unsafe { libc::close(*res) };
                    }
                    ops.remove(key);
                }
                Some(slot @ OpSlot::Waiting(_)) => {
                    *slot = OpSlot::Orphaned(Box::new(data.take()), self.gives_fd);
                    drop(ops);
                    let sqe = opcode::AsyncCancel::new(key.to_u64()).build().user_data(CANCEL_USER_DATA);
                    // SAFETY: a cancel SQE carries no buffer.
                    unsafe { push_sqe(ex, &sqe) };
                    // Submitted now, the operation has its file before the
                    // caller can close the descriptor it named: queued
                    // until the next round, it would run on whatever the
                    // kernel gave that number to meanwhile.
                    if let Err(e) = ex.submit_all() {
                        tracing::warn!(error = %e, "io_uring submit of a dropped operation failed");
                    }
                }
                _ => {}
            }
            true
        });
        if handled != Some(true) {
            std::mem::forget(data.take());
            // Not on its executor (thread-local teardown, or a future sent
            // to another thread): the kernel may still use the buffer, so
            // it must never be freed.
            tracing::error!("io_uring operation dropped off its executor; leaking its buffer");
        }
    }
}

pub(crate) fn result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// Whether an IO on `[ptr, ptr + len)` can use the registered arena (fixed
/// buffer 0) on this executor's ring; counts it if so.
fn fixed(ptr: *const u8, len: u32) -> bool {
    with_executor(|ex| {
        let yes = ex.fixed.get() && crate::arena::get().is_some_and(|a| a.contains(ptr, len as usize));
        if yes {
            ex.shared.counters.fixed_ops.fetch_add(1, Relaxed);
        }
        yes
    })
    .unwrap_or(false)
}

/// Read up to `buf.buf_len()` bytes at `offset` of `fd` into `buf`; returns
/// the count (short at end of file). On an executor thread only. A buffer
/// inside the registered arena is read with READ_FIXED.
pub async fn read_at<B: IoBuf>(fd: RawFd, mut buf: B, offset: u64) -> (io::Result<usize>, B) {
    let len = u32::try_from(buf.buf_len()).expect("IO larger than 4 GiB");
    let ptr = buf.stable_ptr();
    let sqe = if fixed(ptr, len) {
        opcode::ReadFixed::new(types::Fd(fd), ptr, len, 0).offset(offset).build()
    } else {
        opcode::Read::new(types::Fd(fd), ptr, len).offset(offset).build()
    };
    let _io = crate::executor::FileIo::start();
    // SAFETY: the SQE points into buf's heap memory, owned by the Op.
    let (res, buf) = unsafe { Op::submit(sqe, buf) }.await;
    (result(res), buf)
}

/// Write `buf` at `offset` of `fd`; returns the count written (may be
/// short). On an executor thread only.
pub async fn write_at<B: IoBuf>(fd: RawFd, mut buf: B, offset: u64) -> (io::Result<usize>, B) {
    let len = u32::try_from(buf.buf_len()).expect("IO larger than 4 GiB");
    let ptr = buf.stable_ptr();
    let sqe = if fixed(ptr, len) {
        opcode::WriteFixed::new(types::Fd(fd), ptr, len, 0).offset(offset).build()
    } else {
        opcode::Write::new(types::Fd(fd), ptr, len).offset(offset).build()
    };
    let _io = crate::executor::FileIo::start();
    // SAFETY: as in read_at.
    let (res, buf) = unsafe { Op::submit(sqe, buf) }.await;
    (result(res), buf)
}

/// Make every completed write to `fd` durable, as fdatasync(2) does
/// (IORING_OP_FSYNC with IORING_FSYNC_DATASYNC), without holding the
/// executor: its other tasks run while the device flushes. It covers the
/// writes whose completions were seen before the call, not those still in
/// flight. On an executor thread only.
pub async fn fdatasync(fd: RawFd) -> io::Result<()> {
    let sqe = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build();
    let _io = crate::executor::FileIo::start();
    // SAFETY: an fsync SQE carries no buffer.
    let (res, ()) = unsafe { Op::submit(sqe, ()) }.await;
    result(res).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_not_now_errors_are_retried() {
        for e in [libc::EBUSY, libc::EINTR, libc::EAGAIN] {
            assert!(retryable(&io::Error::from_raw_os_error(e)), "{e}");
        }
        for e in [libc::EINVAL, libc::EBADF, libc::EFAULT, libc::ENXIO] {
            assert!(!retryable(&io::Error::from_raw_os_error(e)), "{e}");
        }
    }
}
