//! Blocking reads and writes through io_uring for threads that are not
//! executors (GC, checkpoints, recovery, the synchronous engine API): each
//! such thread gets a small private ring on first use, submits one
//! operation and waits for its completion. An IO backend that is io_uring
//! stays io_uring on every thread.
//!
//! Buffer safety: the caller's slice is borrowed for the whole call, and
//! the call returns only after the kernel has posted the operation's
//! completion (an interrupted wait is simply resumed), so the kernel never
//! touches the memory after the borrow ends.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use io_uring::{opcode, types, IoUring};

/// Entries of a private ring: one operation is in flight at a time.
const RING_ENTRIES: u32 = 4;

static OPS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Operations performed through private rings in this process.
pub fn ops() -> u64 {
    OPS.load(Relaxed)
}

/// Submit `sqe` on this thread's private ring and wait for its result.
///
/// # Safety
///
/// Every pointer in `sqe` must be valid until this function returns.
unsafe fn run(sqe: io_uring::squeue::Entry) -> io::Result<usize> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(RING_ENTRIES)?);
        }
        let ring = slot.as_mut().expect("set above");
        // SAFETY: forwarded to the caller; the queue is empty (one
        // operation at a time, each waited for below).
        unsafe { ring.submission().push(&sqe.user_data(1)) }.map_err(|_| io::Error::other("private ring full"))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                // Transient (EINTR, EAGAIN, EBUSY): the operation stays
                // queued or in flight; wait again.
                Err(e) if crate::op::retryable(&e) => {}
                Err(e) => {
                    // The operation may still be queued or running: the
                    // buffer cannot be released, and a panic would unwind
                    // and free it (a caught panic would go on with the
                    // kernel writing into freed memory). No safe way on.
                    eprintln!("granary: private io_uring wait failed with an operation in flight: {e}");
                    std::process::abort();
                }
            }
            if let Some(cqe) = ring.completion().next() {
                // One operation at a time: its completion (user data 1).
                debug_assert_eq!(cqe.user_data(), 1);
                OPS.fetch_add(1, Relaxed);
                let res = cqe.result();
                return if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
            }
        }
    })
}

/// Read up to `buf.len()` bytes at `offset` of `fd`; the count read.
pub fn read_at(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let len = u32::try_from(buf.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "IO over 4 GiB"))?;
    let sqe = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset).build();
    // SAFETY: buf is borrowed mutably until `run` returns, after completion.
    unsafe { run(sqe) }
}

/// Write up to `buf.len()` bytes at `offset` of `fd`; the count written.
pub fn write_at(fd: RawFd, buf: &[u8], offset: u64) -> io::Result<usize> {
    let len = u32::try_from(buf.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "IO over 4 GiB"))?;
    let sqe = opcode::Write::new(types::Fd(fd), buf.as_ptr(), len).offset(offset).build();
    // SAFETY: buf is borrowed until `run` returns, after completion.
    unsafe { run(sqe) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn round_trip_on_a_private_ring() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &[0u8; 8192]).unwrap();
        let before = ops();
        assert_eq!(write_at(f.as_raw_fd(), b"hello ring", 100).unwrap(), 10);
        let mut back = [0u8; 10];
        assert_eq!(read_at(f.as_raw_fd(), &mut back, 100).unwrap(), 10);
        assert_eq!(&back, b"hello ring");
        // Past the end: a short read, not an error; a bad fd: its errno.
        assert_eq!(read_at(f.as_raw_fd(), &mut back, 8190).unwrap(), 2);
        assert_eq!(read_at(-1, &mut back, 0).unwrap_err().raw_os_error(), Some(libc::EBADF));
        assert!(ops() >= before + 4);
    }
}
