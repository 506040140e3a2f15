//! [`FileDevice`]: synchronous pread/pwrite on a regular file or a block
//! device, with O_DIRECT by default (no page cache).
//!
//! Short transfers are continued and EINTR is retried, so a call transfers
//! the whole buffer or returns an error. A filesystem that refuses O_DIRECT
//! (tmpfs, some FUSE and network filesystems) is reported when the device is
//! opened, with the way out (buffered mode), not at the first write.
//! An open device holds an exclusive `flock`, so a second process (or a
//! second open in one process) is refused instead of corrupting the store.
//! A block device opened for writing also holds the kernel's exclusive
//! claim (a descriptor opened with `O_EXCL`, kept beside the data one and
//! let go with the lock): a flock covers one device node, while the claim
//! also keeps out a mount, `mkfs`, another claim through another node of
//! the same device, and a claim of the whole disk while one of its
//! partitions is held (or the other way round).

use crate::buf::Tail;
use crate::{check_range, AlignedBuf, Device, IoCounters, IoFuture, IoResult};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;

/// How the file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// O_DIRECT: bypass the page cache (the default).
    Direct,
    /// Through the page cache; for filesystems without O_DIRECT. Writes are
    /// durable only after `flush`.
    Buffered,
}

/// Which system interface performs the IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// pread/pwrite on the calling thread (the default; simple embedding,
    /// one thread per in-flight request).
    #[default]
    Sync,
    /// io_uring: the asynchronous operations go to the calling executor's
    /// ring (granary-rt); synchronous calls, and calls off an executor, go
    /// to the calling thread's private ring (`granary_rt::sync_ring`), one
    /// operation at a time.
    Uring,
}

/// `BLKDISCARD`, `_IO(0x12, 119)` (linux/fs.h; the libc crate does not
/// name it).
const BLKDISCARD: u64 = 0x1277;

pub struct FileDevice {
    file: File,
    backend: IoBackend,
    path: PathBuf,
    mode: OpenMode,
    size: u64,
    block: u32,
    is_block_device: bool,
    counters: IoCounters,
    /// Operations under way, and [`RELEASED`] once [`Device::release`]
    /// has begun: no operation starts after it, and the lock goes only
    /// when those under way have ended.
    uses: Arc<AtomicU64>,
    /// The process that opened it (a child made by `fork` shares the
    /// lock: its release must not let go of its parent's).
    pid: u32,
    /// Held by a release (its wait and its unlock) and a claim: a store
    /// opened on the device while an earlier one lets go of it waits, and
    /// is never left running without the lock.
    turn: std::sync::Mutex<()>,
    /// Opened for reading only ([`FileDevice::open_read_only`]): the file
    /// descriptor cannot write, and the lock is shared.
    read_only: bool,
    /// A block device opened for writing: a descriptor of its own opened
    /// with `O_EXCL`, the kernel's exclusive claim, held from the open to
    /// [`Device::release`] and taken again by [`Device::claim`] (the
    /// claim belongs to an open file, so it could not go with the data
    /// descriptor while handles on a closed store keep that open).
    exclusive: std::sync::Mutex<Option<File>>,
}

/// [`FileDevice::uses`]' flag: released.
const RELEASED: u64 = 1 << 63;

/// How long [`Device::release`] waits for a [`FileDevice`]'s operations
/// under way to end before it lets go of the lock anyway.
pub const RELEASE_WAIT_MS: u64 = 5000;

/// One operation of a [`FileDevice`] under way ([`FileDevice::enter`]).
struct Use<'a>(&'a AtomicU64);

impl Drop for Use<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// [`Use`] that owns its count: it travels with a ring operation's
/// buffer, which the runtime keeps until the kernel completes the
/// operation even when its future is dropped, so a release waits for a
/// dropped write that may still land.
struct OwnedUse(Arc<AtomicU64>);

impl Drop for OwnedUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// A ring operation's buffer with the count of its operation (held, not
/// read: dropped with the buffer).
struct Counted(Tail, #[allow(dead_code)] OwnedUse);

// SAFETY: delegates to `Tail`, whose pointer is stable while it lives; the
// count beside it holds no memory the kernel uses.
unsafe impl granary_rt::IoBuf for Counted {
    fn stable_ptr(&mut self) -> *mut u8 {
        granary_rt::IoBuf::stable_ptr(&mut self.0)
    }
    fn buf_len(&self) -> usize {
        granary_rt::IoBuf::buf_len(&self.0)
    }
}

fn annotate(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

fn refuses_direct(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "the filesystem holding {} refuses direct IO (O_DIRECT); put the data on a local \
             filesystem such as ext4 or xfs, or open it in buffered mode (--buffered)",
            path.display()
        ),
    )
}

/// Bytes per write of the zero fill that [`FileDevice::create`] gives a new
/// direct-IO file.
pub const ZERO_FILL_CHUNK_BYTES: usize = 8 << 20;

/// The first bytes of a file [`FileDevice::create`] made, until the store
/// (or a stripe label) is written over them: a file that still starts
/// with them is one whose creation was interrupted before it held
/// anything (docs/FORMAT.md, "What a crash at each step leaves behind").
/// See [`is_unfinished`] and [`crate::DeviceSpec::remove_unfinished`].
pub const UNFINISHED_MAGIC: [u8; 8] = *b"GRNYNEW\0";

/// The block [`FileDevice::create`] writes at offset 0 before anything
/// else: [`UNFINISHED_MAGIC`], then zeros.
const UNFINISHED_BLOCK_BYTES: usize = 4096;

/// Whether the file at `path` starts with [`UNFINISHED_MAGIC`] (read
/// through the page cache, which direct writes keep coherent).
pub fn is_unfinished(path: &Path) -> io::Result<bool> {
    let file = File::open(path).map_err(|e| annotate(e, "cannot open", path))?;
    starts_unfinished(&file, path)
}

fn starts_unfinished(file: &File, path: &Path) -> io::Result<bool> {
    let mut head = [0u8; UNFINISHED_MAGIC.len()];
    match read_full(file, &mut head, 0, false) {
        Ok(()) => Ok(head == UNFINISHED_MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(annotate(e, "cannot read", path)),
    }
}

/// [`is_unfinished`] for a file this process may remove: the file, locked
/// (the lock is held until it is dropped), if it is unfinished and no one
/// else holds its lock (a creation still running, or a store in use: left
/// to the caller's open, which reports it).
pub(crate) fn lock_if_unfinished(path: &Path) -> io::Result<Option<File>> {
    let file = File::open(path).map_err(|e| annotate(e, "cannot open", path))?;
    match lock_exclusive(&file, path) {
        Ok(()) => Ok(starts_unfinished(&file, path)?.then_some(file)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

impl FileDevice {
    /// Create a new file of `size_bytes` (preallocated; in direct mode
    /// written once with zeros, see [`FileDevice::create_with_progress`])
    /// and open it. Fails if the file exists.
    pub fn create(path: &Path, size_bytes: u64, mode: OpenMode) -> io::Result<FileDevice> {
        Self::create_with_progress(path, size_bytes, mode, &|_, _| Ok(()))
    }

    /// [`FileDevice::create`], reporting the zero fill's progress as
    /// `progress(bytes_done, bytes_total)`, once before the first write and
    /// after each write of [`ZERO_FILL_CHUNK_BYTES`]. An error from
    /// `progress` stops the fill (a caller's way to cancel it, e.g. on
    /// SIGINT): the file is removed and the error returned as it is.
    ///
    /// The new file is locked (`flock`, as [`FileDevice::open`] does) from
    /// the moment it exists, on the one descriptor that fills it and that
    /// the device keeps, so a second process that finds the file while it
    /// is being filled is refused as "in use" instead of opening a file
    /// that holds no store yet.
    ///
    /// The blocks are preallocated (fallocate), so the store never meets
    /// ENOSPC from the filesystem later. A direct-IO file is then written
    /// once from end to end with zeros: a filesystem keeps preallocated
    /// blocks as unwritten extents, and ext4 converts one on the first
    /// direct write into it under the inode lock taken exclusively, so
    /// until every block had been written once, a write into a new region
    /// would stall every other read and write of the file, and io_uring
    /// would hand those to its worker threads (under `granary serve`, a
    /// good share of the reads and most of the writes; docs/BENCHMARKS-HISTORY.md).
    /// The fill runs at the disk's sequential write speed. Buffered files
    /// are left as preallocated: their writes
    /// reach the disk in writeback, off the request path.
    pub fn create_with_progress(
        path: &Path,
        size_bytes: u64,
        mode: OpenMode,
        progress: &dyn Fn(u64, u64) -> io::Result<()>,
    ) -> io::Result<FileDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| annotate(e, "cannot create", path))?;
        // A second descriptor of the same open file shares its lock: it
        // keeps the lock held until a failed file is removed, so no other
        // process can lock the file in between and then lose it.
        let held = match file.try_clone() {
            Ok(held) => held,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(annotate(e, "cannot create", path));
            }
        };
        let made = lock_exclusive(&file, path)
            .and_then(|()| Self::prepare(&file, path, size_bytes, mode, progress))
            .and_then(|()| FileDevice::from_locked(file, path, mode, false));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        drop(held);
        made
    }

    /// Preallocate a new file's blocks and, in direct mode, switch `file`
    /// to O_DIRECT and write the blocks once.
    fn prepare(
        file: &File,
        path: &Path,
        size_bytes: u64,
        mode: OpenMode,
        progress: &dyn Fn(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        // SAFETY: fallocate on a valid fd with plain integer arguments.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                // In direct mode the zero fill below still allocates every
                // block; a buffered file stays sparse.
                Some(libc::EOPNOTSUPP) => file.set_len(size_bytes)?,
                _ => return Err(annotate(err, "cannot preallocate", path)),
            }
        }
        // First of all, the mark of an unfinished creation, so that a kill
        // from here until the store is written leaves a file that says so
        // (written through the page cache, before the descriptor goes
        // direct; the final sync takes it to the disk).
        let mut mark = [0u8; UNFINISHED_BLOCK_BYTES];
        mark[..UNFINISHED_MAGIC.len()].copy_from_slice(&UNFINISHED_MAGIC);
        let marked = (size_bytes >= UNFINISHED_BLOCK_BYTES as u64) as u64 * UNFINISHED_BLOCK_BYTES as u64;
        if marked > 0 {
            write_full(file, &mark, 0, false).map_err(|e| annotate(e, "cannot write", path))?;
        }
        if mode == OpenMode::Buffered {
            return file.sync_all().map_err(|e| annotate(e, "cannot sync", path));
        }
        // The same descriptor goes direct (a second open would be a second
        // open file description, which the first one's flock excludes).
        // SAFETY: fcntl on a valid fd with integer arguments only.
        let set = unsafe {
            let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            if flags < 0 {
                -1
            } else {
                libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_DIRECT)
            }
        };
        if set != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(refuses_direct(path));
            }
            return Err(annotate(e, "cannot switch to direct IO", path));
        }
        zero_fill(file, path, marked, size_bytes, progress)?;
        file.sync_all().map_err(|e| annotate(e, "cannot sync", path))
    }

    /// Open an existing file or block device.
    pub fn open(path: &Path, mode: OpenMode) -> io::Result<FileDevice> {
        Self::open_as(path, mode, false)
    }

    /// Open an existing file or block device for reading only (inspections:
    /// `granary stat`, `verify`, `get`): a read-only descriptor, so a file
    /// on a read-only mount or without write permission opens, and a
    /// shared lock, so inspections run side by side while a writer (which
    /// takes the lock exclusively) still keeps them out, and they it.
    /// Writes and discards fail; a flush does nothing.
    pub fn open_read_only(path: &Path, mode: OpenMode) -> io::Result<FileDevice> {
        Self::open_as(path, mode, true)
    }

    fn open_as(path: &Path, mode: OpenMode, read_only: bool) -> io::Result<FileDevice> {
        let meta = std::fs::metadata(path).map_err(|e| annotate(e, "cannot open", path))?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a regular file nor a block device", path.display()),
            ));
        }
        let exclusive = match is_block_device && !read_only {
            true => Some(claim_settled(path)?),
            false => None,
        };
        let mut opts = OpenOptions::new();
        opts.read(true).write(!read_only);
        if mode == OpenMode::Direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = match opts.open(path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && mode == OpenMode::Direct => {
                return Err(refuses_direct(path))
            }
            Err(e) => return Err(annotate(e, "cannot open", path)),
        };
        lock_settled(&file, path, !read_only)?;
        let mut dev = Self::from_locked(file, path, mode, is_block_device)?;
        dev.read_only = read_only;
        dev.exclusive = std::sync::Mutex::new(exclusive);
        Ok(dev)
    }

    /// The device on `file`, opened in `mode` and locked by this process.
    fn from_locked(mut file: File, path: &Path, mode: OpenMode, is_block_device: bool) -> io::Result<FileDevice> {
        let size = file.seek(SeekFrom::End(0)).map_err(|e| annotate(e, "cannot size", path))?;
        let mut dev = FileDevice {
            backend: IoBackend::Sync,
            file,
            path: path.to_owned(),
            mode,
            size,
            block: 512,
            is_block_device,
            counters: IoCounters::default(),
            uses: Arc::new(AtomicU64::new(0)),
            pid: std::process::id(),
            turn: std::sync::Mutex::new(()),
            read_only: false,
            exclusive: std::sync::Mutex::new(None),
        };
        dev.block = dev.probe_block_size()?;
        dev.size -= dev.size % dev.block as u64;
        Ok(dev)
    }

    /// Find the smallest direct-IO alignment the file accepts (512 or 4096)
    /// by reading one block; buffered files accept 512.
    fn probe_block_size(&self) -> io::Result<u32> {
        if self.size < 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is too small ({} bytes)", self.path.display(), self.size),
            ));
        }
        if self.mode == OpenMode::Buffered {
            return Ok(512);
        }
        for bs in [512u32, 4096] {
            let mut buf = AlignedBuf::zeroed(bs as usize);
            match pread_full(&self.file, &mut buf, bs as u64) {
                Ok(()) => return Ok(bs),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
                Err(e) => return Err(annotate(e, "cannot read", &self.path)),
            }
        }
        Err(refuses_direct(&self.path))
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    /// Choose the backend of the asynchronous operations.
    pub fn with_backend(mut self, backend: IoBackend) -> FileDevice {
        self.backend = backend;
        self
    }

    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    fn uring(&self) -> bool {
        self.backend == IoBackend::Uring && granary_rt::on_runtime()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

/// Transfer all of `buf` at `offset` through the executor's ring,
/// continuing short transfers and retrying EINTR/EAGAIN.
async fn uring_full(dir: Dir, fd: i32, buf: AlignedBuf, offset: u64, u: OwnedUse) -> IoResult {
    let mut op = Counted(Tail::new(buf, 0), u);
    loop {
        let tail = &op.0;
        if tail.1 == tail.0.len() {
            return (op.0 .0, Ok(()));
        }
        let at = offset + tail.1 as u64;
        let (r, o) = match dir {
            Dir::Read => granary_rt::read_at(fd, op, at).await,
            Dir::Write => granary_rt::write_at(fd, op, at).await,
        };
        op = o;
        let tail = &mut op.0;
        match r {
            Ok(0) => {
                let e = match dir {
                    Dir::Read => io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the device"),
                    Dir::Write => io::Error::new(io::ErrorKind::WriteZero, "device accepted no bytes"),
                };
                return (op.0 .0, Err(e));
            }
            Ok(n) => tail.1 += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(e) => return (op.0 .0, Err(e)),
        }
    }
}

impl FileDevice {
    /// A write or discard: refused on a device opened read-only.
    fn check_writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is open for reading only", self.path.display()),
            ));
        }
        Ok(())
    }

    /// Count an operation under way; refused once the device is released
    /// (its store closed: another process may own the file now).
    fn enter(&self) -> io::Result<Use<'_>> {
        if self.uses.fetch_add(1, SeqCst) & RELEASED != 0 {
            self.uses.fetch_sub(1, SeqCst);
            return Err(io::Error::other(format!(
                "{}: its store was closed (the device was let go)",
                self.path.display()
            )));
        }
        Ok(Use(&self.uses))
    }

    /// [`FileDevice::enter`] for a ring operation ([`OwnedUse`]).
    fn enter_owned(&self) -> io::Result<OwnedUse> {
        let u = self.enter()?;
        std::mem::forget(u);
        Ok(OwnedUse(self.uses.clone()))
    }

    /// Operations under way (tests).
    #[cfg(test)]
    fn under_way(&self) -> u64 {
        self.uses.load(SeqCst) & !RELEASED
    }

    /// The async form of an operation: through the ring on an executor with
    /// the io_uring backend, else the synchronous call.
    fn async_op(&self, dir: Dir, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if !self.uring() {
            return IoFuture::ready(match dir {
                Dir::Read => self.read_at(buf, offset),
                Dir::Write => self.write_at(buf, offset),
            });
        }
        if let Err(e) = check_range(self, buf.len(), offset) {
            return IoFuture::ready((buf, Err(e)));
        }
        if dir == Dir::Write {
            if let Err(e) = self.check_writable() {
                return IoFuture::ready((buf, Err(e)));
            }
        }
        let u = match self.enter_owned() {
            Ok(u) => u,
            Err(e) => return IoFuture::ready((buf, Err(e))),
        };
        let fd = self.file.as_raw_fd();
        let start = Instant::now();
        IoFuture::Pending(Box::pin(async move {
            // Counted until the kernel completes the operation, even if
            // this future is dropped first (the count travels with the
            // buffer the runtime keeps): a release waits for it. Where the
            // runtime cannot keep the buffer it leaks it, and the count
            // with it (an operation dropped off its executor's thread, one
            // still in flight past a runtime's teardown, an executor torn
            // down by a panic): a release then waits out its bound.
            let (buf, r) = uring_full(dir, fd, buf, offset, u).await;
            if r.is_ok() {
                match dir {
                    Dir::Read => self.counters.read(buf.len(), start),
                    Dir::Write => self.counters.write(buf.len(), start),
                }
            }
            (buf, r)
        }))
    }
}

/// How long [`FileDevice::open`] waits for the lock of a store that another
/// process holds before it reports the store in use.
pub const OPEN_LOCK_WAIT_MS: u64 = 1000;

/// [`lock_exclusive`], retried for up to [`OPEN_LOCK_WAIT_MS`] while another
/// process holds the lock. A process that has just exited (a crash, a
/// second stop signal) may still hold it for a moment: the kernel tears
/// down its io_uring rings after the exit, and IO still in flight there
/// keeps the file, and so its lock, open until it is cancelled. A restart
/// right after such an exit waits for that instead of failing as "in use";
/// a store really in use is reported a second later.
fn lock_settled(file: &File, path: &Path, exclusive: bool) -> io::Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_millis(OPEN_LOCK_WAIT_MS);
    loop {
        match lock(file, path, exclusive) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// The kernel's exclusive claim on block device `path`: a descriptor
/// opened with `O_EXCL` (read-only: the claim does not depend on the
/// access mode). Retried for [`OPEN_LOCK_WAIT_MS`] as [`lock_settled`]
/// is, since the claim of a process that just exited may linger as its
/// lock does.
fn claim_settled(path: &Path) -> io::Result<File> {
    let deadline = Instant::now() + std::time::Duration::from_millis(OPEN_LOCK_WAIT_MS);
    loop {
        match OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(path) {
            Ok(f) => return Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use: mounted, or held by another program (a store, a filesystem tool, or a \
                         claim on the same disk through another partition or node)",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(annotate(e, "cannot open", path)),
        }
    }
}

/// One process at a time: a second opener would corrupt the log. The lock
/// belongs to `file`'s open file description and goes with it.
pub(crate) fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    lock(file, path, true)
}

/// `flock` exclusively (a writer) or shared (readers, which keep writers
/// out but not each other).
fn lock(file: &File, path: &Path, exclusive: bool) -> io::Result<()> {
    let how = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: flock on a valid fd with constant flags.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use by another process (it holds the store's lock)", path.display()),
            ));
        }
        return Err(annotate(e, "cannot lock", path));
    }
    Ok(())
}

/// Write zeros over `[from, size)` of a file opened with O_DIRECT (`from`
/// a multiple of 4 KiB), in [`ZERO_FILL_CHUNK_BYTES`] writes (4
/// KiB-aligned, which every direct-IO file accepts); `progress`'s error
/// stops it. A tail shorter than 4 KiB (a size that is not a multiple of 4
/// KiB) is left as preallocated: with 512-byte blocks the device uses up
/// to 3.5 KiB of it, whose first write may still be converted under the
/// inode lock once.
fn zero_fill(
    file: &File,
    path: &Path,
    from: u64,
    size: u64,
    progress: &dyn Fn(u64, u64) -> io::Result<()>,
) -> io::Result<()> {
    let end = size - size % 4096;
    let zeros = AlignedBuf::zeroed_heap(ZERO_FILL_CHUNK_BYTES.min(end as usize).max(4096));
    let mut at = from.min(end);
    progress(0, size)?;
    while at < end {
        // Chunks end on multiples of the chunk size (the first one is
        // shorter by `from`), so progress reads the same either way.
        let n = (end - at).min(zeros.len() as u64 - at % zeros.len() as u64) as usize;
        write_full(file, &zeros[..n], at, false).map_err(|e| annotate(e, "cannot write zeros to", path))?;
        at += n as u64;
        progress(if at == end { size } else { at }, size)?;
    }
    Ok(())
}

fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    read_full(file, buf, offset, false)
}

/// A system call's result: the count, or the error in errno.
fn syscall_count(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Transfer `len` bytes with `op(done)` (which moves bytes from `done` on
/// and says how many), continuing short transfers and retrying EINTR and
/// EAGAIN; a transfer of nothing is `at_end`'s error.
fn transfer_full(
    len: usize,
    at_end: fn() -> io::Error,
    mut op: impl FnMut(usize) -> io::Result<usize>,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        match op(done) {
            Ok(0) => return Err(at_end()),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read all of `buf` at `offset`: pread, or the thread's private ring.
fn read_full(file: &File, buf: &mut [u8], offset: u64, ring: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let at_end = || io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the device");
    transfer_full(buf.len(), at_end, |done| {
        let (rest, at) = (&mut buf[done..], offset + done as u64);
        if ring {
            return granary_rt::sync_ring::read_at(fd, rest, at);
        }
        // SAFETY: rest is a valid writable region of rest.len() bytes.
        syscall_count(unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), at as libc::off_t) })
    })
}

/// Write all of `buf` at `offset`: pwrite, or the thread's private ring.
fn write_full(file: &File, buf: &[u8], offset: u64, ring: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let at_end = || io::Error::new(io::ErrorKind::WriteZero, "device accepted no bytes");
    transfer_full(buf.len(), at_end, |done| {
        let (rest, at) = (&buf[done..], offset + done as u64);
        if ring {
            return granary_rt::sync_ring::write_at(fd, rest, at);
        }
        // SAFETY: rest is a valid readable region of rest.len() bytes.
        syscall_count(unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), at as libc::off_t) })
    })
}

impl Device for FileDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let _use = match self.enter() {
            Ok(u) => u,
            Err(e) => return (buf, Err(e)),
        };
        let start = Instant::now();
        let r = read_full(&self.file, &mut buf, offset, self.backend == IoBackend::Uring);
        if r.is_ok() {
            self.counters.read(buf.len(), start);
        }
        (buf, r)
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset).and_then(|()| self.check_writable()) {
            return (buf, Err(e));
        }
        let _use = match self.enter() {
            Ok(u) => u,
            Err(e) => return (buf, Err(e)),
        };
        let start = Instant::now();
        let r = write_full(&self.file, &buf, offset, self.backend == IoBackend::Uring);
        if r.is_ok() {
            self.counters.write(buf.len(), start);
        }
        (buf, r)
    }

    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.async_op(Dir::Read, buf, offset)
    }

    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.async_op(Dir::Write, buf, offset)
    }

    /// BLKDISCARD on a block device; on a file, a punched hole (the size
    /// kept). EOPNOTSUPP where the device or filesystem has neither.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, len as usize, offset)?;
        if offset + len > self.size {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "discard past the end of the device"));
        }
        self.check_writable()?;
        let _use = self.enter()?;
        let fd = self.file.as_raw_fd();
        let rc = if self.is_block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 (start, length) from the
            // pointer, which points at `range`, alive for the call.
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
        } else {
            // SAFETY: fallocate takes the fd and plain integers.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc != 0 {
            // The errno as it is (EOPNOTSUPP: no hole punching here), for
            // callers that tell "not supported" from a failure; they name
            // the device.
            return Err(io::Error::last_os_error());
        }
        self.counters.discard(len);
        Ok(())
    }

    fn discards_by_default(&self) -> bool {
        self.is_block_device
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            // Nothing was written through it.
            return Ok(());
        }
        let _use = self.enter()?;
        let start = Instant::now();
        let r = self.file.sync_data();
        self.counters.flush(start);
        r
    }

    fn flush_async(&self) -> crate::FlushFuture<'_> {
        if !self.uring() || self.read_only {
            return Box::pin(std::future::ready(self.flush()));
        }
        let fd = self.file.as_raw_fd();
        let u = match self.enter() {
            Ok(u) => u,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        Box::pin(async move {
            let _use = u;
            let start = Instant::now();
            let r = granary_rt::fdatasync(fd).await;
            self.counters.flush(start);
            r
        })
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn block_bytes(&self) -> u32 {
        self.block
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    /// No operation starts from now on (they fail); once those under way
    /// have ended, the lock goes, so another process opening the file
    /// never meets a write of this one. The wait is bounded by
    /// [`RELEASE_WAIT_MS`] (an operation of a future this thread holds
    /// unpolled would never end): past it the lock goes all the same,
    /// with a warning. Not in a child made by `fork`, which shares its
    /// parent's lock.
    fn release(&self) {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        self.uses.fetch_or(RELEASED, SeqCst);
        let deadline = Instant::now() + std::time::Duration::from_millis(RELEASE_WAIT_MS);
        loop {
            let under_way = self.uses.load(SeqCst) & !RELEASED;
            if under_way == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(path = %self.path.display(), under_way, "letting go of the device's lock with operations still under way");
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if std::process::id() != self.pid {
            return;
        }
        // SAFETY: flock on the device's own open fd with constant flags.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
        self.exclusive.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn claim(&self) -> io::Result<()> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        if self.uses.load(SeqCst) & RELEASED == 0 {
            return Ok(());
        }
        let exclusive = match self.is_block_device && !self.read_only {
            true => Some(claim_settled(&self.path)?),
            false => None,
        };
        lock(&self.file, &self.path, !self.read_only)?;
        *self.exclusive.lock().unwrap_or_else(|e| e.into_inner()) = exclusive;
        self.uses.fetch_and(!RELEASED, SeqCst);
        Ok(())
    }

    fn describe(&self) -> String {
        let kind = if self.is_block_device { "block device" } else { "file" };
        let mode = match self.mode {
            OpenMode::Direct => "direct",
            OpenMode::Buffered => "buffered",
        };
        let backend = match self.backend {
            IoBackend::Sync => "pread/pwrite",
            IoBackend::Uring => "io_uring",
        };
        format!("{kind} {} ({mode} IO via {backend}, {}-byte blocks)", self.path.display(), self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block device opened for writing is claimed (`O_EXCL`): another
    /// exclusive open of it, as `mount` and `mkfs` make, fails while the
    /// device is open and succeeds once it is closed; a read-only open
    /// (an inspection) makes no claim. Before, only the flock held it,
    /// which those never ask for. Needs root and a free loop device; else
    /// skipped, saying why.
    #[test]
    fn a_block_device_opened_for_writing_is_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("disk.img");
        File::create(&backing).unwrap().set_len(4 << 20).unwrap();
        let node = match crate::testdev::LoopDevice::attach(&backing) {
            Ok(d) => d,
            Err(why) => return eprintln!("a_block_device_opened_for_writing_is_claimed: skipped: {why}"),
        };
        let path = Path::new(node.node());
        let claim = || OpenOptions::new().read(true).write(true).custom_flags(libc::O_EXCL).open(path);
        let dev = FileDevice::open(path, OpenMode::Buffered).unwrap();
        let e = claim().expect_err("claimed while the device is open");
        assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
        // A closed store's device lets the claim go with its lock, though
        // handles may keep the device itself open, and takes it back.
        dev.release();
        drop(claim().expect("released"));
        dev.claim().unwrap();
        assert_eq!(claim().expect_err("claimed again").raw_os_error(), Some(libc::EBUSY));
        drop(dev);
        let inspect = FileDevice::open_read_only(path, OpenMode::Buffered).unwrap();
        drop(claim().expect("an inspection claims nothing, and the device's claim went with it"));
        drop(inspect);
        // Held by another claim (a mount, mkfs), the device is not opened.
        let other = claim().unwrap();
        let e = FileDevice::open(path, OpenMode::Buffered).err().expect("refused");
        assert!(e.to_string().contains("is in use"), "{e}");
        drop(other);
    }

    /// The extents of `file` as (logical start, length, unwritten) from the
    /// FS_IOC_FIEMAP ioctl; None where the filesystem does not answer it.
    fn extents(file: &File) -> Option<Vec<(u64, u64, bool)>> {
        // struct fiemap (32 bytes) followed by struct fiemap_extent (56
        // bytes each), <linux/fiemap.h>.
        const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
        const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
        const N: usize = 512;
        #[repr(C)]
        struct Extent {
            logical: u64,
            physical: u64,
            length: u64,
            reserved64: [u64; 2],
            flags: u32,
            reserved: [u32; 3],
        }
        #[repr(C)]
        struct Map {
            start: u64,
            length: u64,
            flags: u32,
            mapped: u32,
            count: u32,
            reserved: u32,
            extents: [Extent; N],
        }
        // SAFETY: Map is plain integers, for which all zeros is valid.
        let mut m: Box<Map> = Box::new(unsafe { std::mem::zeroed() });
        m.length = u64::MAX;
        m.count = N as u32;
        // SAFETY: FS_IOC_FIEMAP on a valid fd with a struct fiemap that
        // has room for `count` extents, as the ioctl expects.
        if unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, &mut *m as *mut Map) } != 0 {
            return None;
        }
        let n = (m.mapped as usize).min(N);
        Some(m.extents[..n].iter().map(|e| (e.logical, e.length, e.flags & FIEMAP_EXTENT_UNWRITTEN != 0)).collect())
    }

    /// A new direct-IO file is written once over its whole length, so no
    /// preallocated extent is left for the filesystem to convert under
    /// its inode lock at the first write; the fill reports its progress
    /// to the end.
    #[test]
    fn create_leaves_no_unwritten_extent() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let size = 3 * ZERO_FILL_CHUNK_BYTES as u64 + 12288;
        let seen = std::sync::Mutex::new(Vec::new());
        let dev = FileDevice::create_with_progress(&path, size, OpenMode::Direct, &|d, t| {
            seen.lock().unwrap().push((d, t));
            Ok(())
        })
        .unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.first(), Some(&(0, size)));
        assert_eq!(seen.last(), Some(&(size, size)));
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "progress only grows: {seen:?}");
        let Some(ext) = extents(&dev.file) else {
            eprintln!("skipped: the filesystem under {} does not answer FIEMAP", dir.path().display());
            return;
        };
        assert!(ext.iter().all(|e| !e.2), "unwritten extents left: {ext:?}");
        assert_eq!(ext.iter().map(|e| e.1).sum::<u64>(), size, "every block allocated: {ext:?}");
        drop(dev);
        // The check itself can fail: a file only preallocated has them.
        let raw = dir.path().join("raw");
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(&raw).unwrap();
        // SAFETY: fallocate on a valid fd with plain integer arguments.
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) }, 0);
        assert!(extents(&f).unwrap().iter().any(|e| e.2), "fallocate leaves unwritten extents on this filesystem");
    }

    /// While a new file is being filled, a second open (another process
    /// finding the file, or this one) is refused as "in use"; once created,
    /// the device keeps the lock.
    #[test]
    fn a_new_file_is_locked_from_the_start_of_its_fill() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let size = 2 * ZERO_FILL_CHUNK_BYTES as u64;
        for mode in [OpenMode::Direct, OpenMode::Buffered] {
            let refused = std::cell::Cell::new(0);
            let dev = FileDevice::create_with_progress(&path, size, OpenMode::Direct, &|_, _| {
                let e = FileDevice::open(&path, mode).err().expect("a file being filled is locked");
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                assert!(e.to_string().contains("in use by another process"), "{e}");
                refused.set(refused.get() + 1);
                Ok(())
            })
            .unwrap();
            assert_eq!(refused.get(), 3, "asked before the fill and after each of its 2 writes");
            assert_eq!(FileDevice::open(&path, mode).err().map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
            assert_eq!(dev.size_bytes(), size);
            drop(dev);
            FileDevice::open(&path, mode).unwrap();
            std::fs::remove_file(&path).unwrap();
        }
    }

    /// An error from the progress callback (how the CLI cancels the fill
    /// on SIGINT/SIGTERM) stops the fill, removes the file and comes back
    /// unchanged.
    #[test]
    fn a_progress_error_cancels_the_fill_and_removes_the_file() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let size = 4 * ZERO_FILL_CHUNK_BYTES as u64;
        // (A buffered file has no fill to cancel.)
        {
            let last = std::cell::Cell::new(0);
            let e = FileDevice::create_with_progress(&path, size, OpenMode::Direct, &|done, _| {
                last.set(done);
                if done >= ZERO_FILL_CHUNK_BYTES as u64 {
                    return Err(io::Error::new(io::ErrorKind::Interrupted, "stopped by the test"));
                }
                Ok(())
            })
            .err()
            .expect("the callback's error stops the creation");
            assert_eq!((e.kind(), e.to_string()), (io::ErrorKind::Interrupted, "stopped by the test".into()));
            assert_eq!(last.get(), ZERO_FILL_CHUNK_BYTES as u64, "no write after the error");
            assert!(!path.exists(), "the partial file is removed");
        }
    }

    #[test]
    fn discard_punches_a_hole_that_reads_as_zeros() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 1 << 20, OpenMode::Direct).unwrap();
        assert!(!dev.discards_by_default(), "files do not discard by default");
        let mut w = AlignedBuf::zeroed(65536);
        w.fill(5);
        dev.write_at(w, 65536).1.unwrap();
        match dev.discard(65536, 65536) {
            Ok(()) => {
                let (r, res) = dev.read_at(AlignedBuf::zeroed(65536), 65536);
                res.unwrap();
                assert!(r.iter().all(|&b| b == 0));
                assert_eq!(dev.counters().snapshot().discarded_bytes, 65536);
                assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20, "the size is kept");
            }
            // A filesystem without hole punching says so.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        assert!(dev.discard(1 << 20, 4096).is_err(), "past the end");
    }

    #[test]
    fn direct_round_trip_on_a_real_file() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 1 << 20, OpenMode::Direct).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        let mut w = AlignedBuf::zeroed(8192);
        w[..5].copy_from_slice(b"hello");
        w[8191] = 9;
        let (_, r) = dev.write_at(w, 4096);
        r.unwrap();
        let (r, res) = dev.read_at(AlignedBuf::zeroed(8192), 4096);
        res.unwrap();
        assert_eq!(&r[..5], b"hello");
        assert_eq!(r[8191], 9);
        dev.flush().unwrap();
        let c = dev.counters().snapshot();
        assert_eq!((c.writes, c.written_bytes, c.flushes), (1, 8192, 1));
        assert!(dev.describe().contains("direct"));
    }

    #[test]
    fn uring_round_trip_on_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = std::sync::Arc::new(
            FileDevice::create(&path, 1 << 20, OpenMode::Direct).unwrap().with_backend(IoBackend::Uring),
        );
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let d = dev.clone();
        let got = rt
            .block_on(async move {
                let mut b = AlignedBuf::zeroed(8192);
                b.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 251) as u8);
                let fut = d.write_at_async(b, 4096);
                assert!(matches!(fut, IoFuture::Pending(_)), "on an executor the ring is used");
                let (_, r) = fut.await;
                r.unwrap();
                let (b, r) = d.read_at_async(AlignedBuf::zeroed(8192), 4096).await;
                r.unwrap();
                let (_, past) = d.read_at_async(AlignedBuf::zeroed(4096), 1 << 20).await;
                // A heap buffer (not registered) goes out as a plain read.
                let (h, r) = d.read_at_async(AlignedBuf::zeroed_heap(8192), 4096).await;
                r.unwrap();
                assert!(b.is_registered() && !h.is_registered());
                assert_eq!(&h[..], &b[..]);
                (b.to_vec(), past.unwrap_err().kind())
            })
            .unwrap();
        assert!(got.0.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        assert_eq!(got.1, io::ErrorKind::InvalidInput);
        let st = &rt.stats()[0];
        if st.fixed_registered {
            assert_eq!(
                st.fixed_ops, 2,
                "the write and the read of arena buffers used fixed buffers; the heap read did not"
            );
        } else {
            // Without CAP_IPC_LOCK and above RLIMIT_MEMLOCK registration fails:
            // every operation must then be an unfixed one.
            eprintln!("note: the arena could not be registered here; checked the unfixed fallback");
            assert_eq!(st.fixed_ops, 0);
        }
        assert_eq!(dev.counters().snapshot().reads, 2);
        // Off an executor the same calls are synchronous.
        let fut = dev.read_at_async(AlignedBuf::zeroed(4096), 4096);
        assert!(matches!(fut, IoFuture::Ready(_)));
        let (b, r) = granary_rt::block_on(fut);
        r.unwrap();
        assert_eq!(b[1], 1);
    }

    /// A flush on an executor goes through its ring: while it is in flight
    /// the executor runs another task (a synchronous fdatasync would hold
    /// it until the flush returned). A task that yields in a loop counts
    /// its turns; the flush must see it run.
    #[test]
    fn uring_flush_lets_the_executor_run_other_tasks() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let dev = Arc::new(
            FileDevice::create(&dir.path().join("dev"), 1 << 20, OpenMode::Direct)
                .unwrap()
                .with_backend(IoBackend::Uring),
        );
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let (turns, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let d = dev.clone();
        let (before, after) = rt
            .block_on(async move {
                let (t, s) = (turns.clone(), stop.clone());
                let spinner = granary_rt::spawn(async move {
                    while !s.load(SeqCst) {
                        t.fetch_add(1, SeqCst);
                        granary_rt::yield_now().await;
                    }
                });
                granary_rt::yield_now().await; // the spinner is running
                let (_, r) = d.write_at_async(AlignedBuf::zeroed(4096), 0).await;
                r.unwrap();
                let before = turns.load(SeqCst);
                d.flush_async().await.unwrap();
                let after = turns.load(SeqCst);
                stop.store(true, SeqCst);
                spinner.await.unwrap();
                (before, after)
            })
            .unwrap();
        assert!(after > before, "the executor ran nothing while the flush was in flight ({before} turns both times)");
        assert_eq!(dev.counters().snapshot().flushes, 1);
        // Off an executor the same call is the synchronous flush.
        granary_rt::block_on(dev.flush_async()).unwrap();
        assert_eq!(dev.counters().snapshot().flushes, 2);
    }

    /// Reads into arena chunks, dropped while the kernel still performs them,
    /// must not hand their chunks back: the arena's free lists are LIFO, so a
    /// chunk freed too early would be the next allocation's, and the read
    /// would overwrite the sentinel written there.
    #[test]
    fn dropped_reads_keep_their_arena_chunks_until_completion() {
        const READS: usize = 64;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dev = std::sync::Arc::new(
            FileDevice::create(&dir.path().join("dev"), 1 << 20, OpenMode::Direct)
                .unwrap()
                .with_backend(IoBackend::Uring),
        );
        let mut fill = AlignedBuf::zeroed_heap(1 << 20);
        fill.fill(0x55);
        let (_, r) = dev.write_at(fill, 0);
        r.unwrap();
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let d = dev.clone();
        let (pending, registered, intact) = rt
            .block_on(async move {
                let mut pending = 0;
                let mut registered = 0;
                for i in 0..READS {
                    let buf = AlignedBuf::zeroed(4096);
                    registered += buf.is_registered() as usize;
                    let mut fut = Box::pin(d.read_at_async(buf, (i as u64 % 256) * 4096));
                    let waker = std::task::Waker::noop();
                    if std::future::Future::poll(fut.as_mut(), &mut std::task::Context::from_waker(waker)).is_pending()
                    {
                        pending += 1;
                    }
                    drop(fut);
                }
                let sentinels: Vec<AlignedBuf> = (0..READS * 2)
                    .map(|_| {
                        let mut b = AlignedBuf::zeroed(4096);
                        b.fill(0xAA);
                        b
                    })
                    .collect();
                for _ in 0..20 {
                    granary_rt::sleep(std::time::Duration::from_millis(1)).await;
                }
                let intact = sentinels.iter().all(|s| s.iter().all(|&b| b == 0xAA));
                (pending, registered, intact)
            })
            .unwrap();
        assert_eq!(pending, READS, "every read was in flight when dropped");
        assert_eq!(registered, READS, "the buffers were arena chunks");
        assert!(intact, "an arena chunk was reused while the kernel still wrote into it");
    }

    /// A ring write whose future is dropped in flight stays counted until
    /// the kernel completes it (the count travels with the buffer the
    /// runtime keeps), so a release waits for it: it was uncounted at the
    /// drop, and the lock could go while the write might still land.
    #[test]
    fn a_dropped_ring_write_stays_counted_until_it_completes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dev = std::sync::Arc::new(
            FileDevice::create(&dir.path().join("dev"), 8 << 20, OpenMode::Direct)
                .unwrap()
                .with_backend(IoBackend::Uring),
        );
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let d = dev.clone();
        let (at_drop, settled) = rt
            .block_on(async move {
                let mut fut = Box::pin(d.write_at_async(AlignedBuf::zeroed_heap(4 << 20), 0));
                let waker = std::task::Waker::noop();
                let pending =
                    std::future::Future::poll(fut.as_mut(), &mut std::task::Context::from_waker(waker)).is_pending();
                assert!(pending, "a ring write is in flight once polled");
                drop(fut);
                // This task has not yielded: the executor has not reaped
                // the write's completion yet.
                let at_drop = d.under_way();
                let mut settled = false;
                for _ in 0..5000 {
                    granary_rt::sleep(std::time::Duration::from_millis(1)).await;
                    if d.under_way() == 0 {
                        settled = true;
                        break;
                    }
                }
                (at_drop, settled)
            })
            .unwrap();
        assert_eq!(at_drop, 1, "the dropped write is still counted");
        assert!(settled, "the count ends when the write completes");
    }

    #[test]
    fn rejects_unaligned_and_out_of_range() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dev = FileDevice::create(&dir.path().join("dev"), 1 << 16, OpenMode::Direct).unwrap();
        let (_, r) = dev.read_at(AlignedBuf::zeroed(100), 0);
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let (_, r) = dev.write_at(AlignedBuf::zeroed(4096), 1 << 16);
        assert!(r.unwrap_err().to_string().contains("past the end"));
    }

    #[test]
    fn second_open_is_refused_while_the_first_is_held() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let first = FileDevice::create(&path, 1 << 16, OpenMode::Direct).unwrap();
        let err = FileDevice::open(&path, OpenMode::Direct).err().unwrap();
        assert!(err.to_string().contains("in use by another process"), "{err}");
        drop(first);
        FileDevice::open(&path, OpenMode::Direct).unwrap();
    }

    /// Read-only opens share the lock with each other, not with a writer;
    /// they read, refuse writes and discards (before the kernel would),
    /// and their flush does nothing.
    #[test]
    fn read_only_opens_share_the_lock_and_refuse_writes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let w = FileDevice::create(&path, 1 << 16, OpenMode::Direct).unwrap();
        let mut b = AlignedBuf::zeroed(4096);
        b.fill(7);
        w.write_at(b, 4096).1.unwrap();
        let err = FileDevice::open_read_only(&path, OpenMode::Direct).err().unwrap();
        assert!(err.to_string().contains("in use by another process"), "{err}");
        drop(w);
        let a = FileDevice::open_read_only(&path, OpenMode::Direct).unwrap();
        let b = FileDevice::open_read_only(&path, OpenMode::Buffered).unwrap();
        let (r, res) = a.read_at(AlignedBuf::zeroed(4096), 4096);
        res.unwrap();
        assert!(r.iter().all(|&x| x == 7));
        let (_, res) = b.write_at(AlignedBuf::zeroed(4096), 0);
        let e = res.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("for reading only"), "{e}");
        assert_eq!(a.discard(0, 4096).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        a.flush().unwrap();
        let err = FileDevice::open(&path, OpenMode::Direct).err().unwrap();
        assert!(err.to_string().contains("in use by another process"), "{err}");
        drop((a, b));
        FileDevice::open(&path, OpenMode::Direct).unwrap();
    }

    /// A released device refuses new operations and lets the lock go (a
    /// second open succeeds while the first device lives); claimed back
    /// (its lock free again), it works again; a claim while another holds
    /// the lock is refused.
    #[test]
    fn a_released_device_refuses_operations_and_lets_its_lock_go() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        let first = FileDevice::create(&path, 1 << 16, OpenMode::Direct).unwrap();
        first.release();
        let (_, r) = first.write_at(AlignedBuf::zeroed(4096), 0);
        assert!(r.unwrap_err().to_string().contains("let go"));
        assert!(first.flush().is_err());
        let second = FileDevice::open(&path, OpenMode::Direct).unwrap();
        let err = first.claim().unwrap_err();
        assert!(err.to_string().contains("in use by another process"), "{err}");
        drop(second);
        first.claim().unwrap();
        let (_, r) = first.write_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        first.flush().unwrap();
        let err = FileDevice::open(&path, OpenMode::Direct).err().unwrap();
        assert!(err.to_string().contains("in use by another process"), "{err}");
    }

    #[test]
    fn create_refuses_existing_file() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("dev");
        FileDevice::create(&path, 1 << 16, OpenMode::Direct).unwrap();
        let err = FileDevice::create(&path, 1 << 16, OpenMode::Direct).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn tmpfs_direct_io_refusal_is_explained() {
        // /dev/shm is tmpfs on Linux and refuses O_DIRECT; skip where absent.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let path = dir.path().join("dev");
        match FileDevice::create(&path, 1 << 16, OpenMode::Direct) {
            Err(e) => assert!(e.to_string().contains("refuses direct IO"), "{e}"),
            Ok(dev) => assert_eq!(dev.mode(), OpenMode::Direct), // tmpfs with O_DIRECT support (Linux >= 6.6)
        }
        let dev = FileDevice::open(&path, OpenMode::Buffered).unwrap();
        assert_eq!(dev.block_bytes(), 512);
    }
}
