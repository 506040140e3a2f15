//! [`FaultDevice`]: an in-memory device that injects the faults a real disk
//! and a real crash produce, driven by a seed, for crash simulation.
//!
//! Fault model:
//!
//! - **Crash point.** [`FaultDevice::plan_crash`] picks the write at which
//!   the process (or the machine) dies. That write is *torn*: a seeded
//!   prefix of its 512-byte sectors reaches the media, the rest does not.
//!   It and every later write and flush fail with EIO (the process is
//!   dead; an async write submitted before it may still land, below);
//!   reads keep answering from what was written, so a dying process can
//!   finish its bookkeeping without seeing impossible data.
//! - **What survives** is decided at [`FaultDevice::restart`]:
//!   - [`CrashKind::Process`] (the process was killed, the kernel and the
//!     drive went on): every write that completed before the crash point is
//!     there, plus the torn prefix; those not flushed are still only in the
//!     drive's cache, so a power cut in a later life may lose them as it
//!     may lose that life's own unflushed writes. A restart without a
//!     crash likewise keeps what was not flushed at risk.
//!   - [`CrashKind::Power`] (power loss on a drive with a volatile write
//!     cache): the media holds what the last successful flush covered; of
//!     the writes completed since, and the torn write's prefix, each one
//!     independently (seeded) survives whole, is dropped, or leaves an
//!     arbitrary subset of its sectors, which is what a drive that
//!     reorders its write-back may leave: a drive promises a sector (its
//!     atomic unit) whole, nothing about a multi-sector write. Where
//!     several unflushed writes cover one sector, the media holds the
//!     sector as the last one that left it wrote it (so any of their
//!     versions, or the flushed one). With a seed that drops them all,
//!     this is "every write not yet flushed is lost".
//! - **Writes in flight at the crash.** An async write submitted before
//!   the crash point that completes after it (with
//!   [`FaultDevice::reorder`], a write takes effect some polls after its
//!   submission) was in the device's queue when the process died: it lands
//!   whole, as a seeded prefix of its sectors, or not at all (seeded), and
//!   its caller sees EIO, as the dead process would have seen nothing. It
//!   then survives the restart as a completed write would (a power cut may
//!   drop it or keep part of it, as above). A write submitted after the
//!   crash, or before a restart and completed after it, fails with nothing
//!   written.
//! - **EIO on chosen operations.** [`FaultDevice::fail_nth`] makes the n-th
//!   read, write or flush from now fail with EIO (once, or from then on),
//!   without a crash.
//! - **Reordered completions.** With [`FaultDevice::reorder`], the async
//!   forms of read and write yield to the executor a seeded number of times
//!   before they take effect, so operations issued concurrently by tasks
//!   complete in an order other than their submission order.
//!
//! Not modelled: bit rot of data at rest (tests flip bytes themselves with
//! [`FaultDevice::with_bytes_mut`]), writes torn at a granularity finer
//! than a sector, misdirected writes, and an async write whose future is
//! dropped before it completes (here it never takes effect; a real queue
//! would still carry it out).

use crate::{check_range, AlignedBuf, Device, IoCounters, IoFuture, IoResult};
use rand::{Rng, RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

/// What kind of crash a plan simulates (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    Process,
    Power,
}

/// Which operations [`FaultDevice::fail_nth`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
}

/// One write or flush the device saw ([`FaultDevice::record_trace`]):
/// enough to tell whether two runs wrote the same bytes in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    pub op: OpKind,
    pub offset: u64,
    pub len: usize,
    /// CRC32C of the bytes written (of the surviving prefix, for the write
    /// a crash tore or one in flight at the crash that landed in part); 0
    /// for a flush.
    pub crc: u32,
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    writes_left: u64,
    kind: CrashKind,
}

#[derive(Debug, Clone, Copy)]
struct Failure {
    op: OpKind,
    left: u64,
    sticky: bool,
    fired: bool,
}

struct State {
    /// What reads see: every completed write applied.
    current: Vec<u8>,
    /// What the media holds for certain: the image at the last flush.
    durable: Vec<u8>,
    /// Writes completed since the last flush, in order (offset, bytes).
    unflushed: Vec<(u64, Vec<u8>)>,
    plan: Option<Plan>,
    /// The crash happened: the torn write (offset, surviving prefix).
    crashed: Option<(CrashKind, u64, Vec<u8>)>,
    failures: Vec<Failure>,
    rng: SimRng,
    reorder: bool,
    /// Writes and flushes, in order, while recording.
    trace: Option<Vec<TraceEvent>>,
    /// Discards, in order (offset, length).
    discards: Vec<(u64, u64)>,
    /// Answer [`Device::discards_by_default`] as a block device would.
    block_like: bool,
    /// Writes in flight at a crash that landed, whole or in part, since
    /// the device was made.
    landed_in_flight: u64,
    /// Restarts so far: a write submitted in an earlier life (by a process
    /// since gone) and polled after a restart fails with nothing written.
    life: u64,
}

impl State {
    fn traced(&mut self, op: OpKind, offset: u64, bytes: &[u8]) {
        if let Some(t) = &mut self.trace {
            let crc = if op == OpKind::Flush { 0 } else { crc32c::crc32c(bytes) };
            t.push(TraceEvent { op, offset, len: bytes.len(), crc });
        }
    }
}

/// The seeded generator of the fault device and of the simulations: it drives
/// every fault choice, and the crash tests drive their workloads from the same
/// seed. It is a `Pcg64Mcg`, whose output is specified, so a printed seed
/// replays the same run on every platform (`below` is value-stable within a
/// `rand` 0.x release line).
#[derive(Debug, Clone)]
pub struct SimRng(Pcg64Mcg);

impl SimRng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(Pcg64Mcg::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.random_range(0..n)
        }
    }
}

impl State {
    fn next(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// Whether an injected failure hits this operation.
    fn injected(&mut self, op: OpKind) -> bool {
        let mut hit = false;
        for f in self.failures.iter_mut().filter(|f| f.op == op) {
            if f.fired {
                hit |= f.sticky;
            } else if f.left == 0 {
                f.fired = true;
                hit = true;
            } else {
                f.left -= 1;
            }
        }
        hit
    }
}

/// A seeded fault-injecting device in DRAM (see the module doc).
pub struct FaultDevice {
    state: Mutex<State>,
    size: u64,
    counters: IoCounters,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl FaultDevice {
    /// A zeroed device of `size_bytes` (512-byte blocks); `seed` drives every
    /// random choice it makes.
    pub fn new(size_bytes: u64, seed: u64) -> FaultDevice {
        assert!(size_bytes.is_multiple_of(512));
        let n = size_bytes as usize;
        FaultDevice {
            state: Mutex::new(State {
                current: vec![0; n],
                durable: vec![0; n],
                unflushed: Vec::new(),
                plan: None,
                crashed: None,
                failures: Vec::new(),
                rng: SimRng::new(seed ^ 0x5EED_F00D_CAFE_BABE),
                reorder: false,
                trace: None,
                discards: Vec::new(),
                block_like: false,
                landed_in_flight: 0,
                life: 0,
            }),
            size: size_bytes,
            counters: IoCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Crash at the write after `writes` more successful writes.
    pub fn plan_crash(&self, writes: u64, kind: CrashKind) {
        self.lock().plan = Some(Plan { writes_left: writes, kind });
    }

    /// Whether the planned crash happened.
    pub fn crashed(&self) -> bool {
        self.lock().crashed.is_some()
    }

    /// Make the `n`-th operation of kind `op` from now (0: the next) fail
    /// with EIO; with `sticky`, every later one too.
    pub fn fail_nth(&self, op: OpKind, n: u64, sticky: bool) {
        self.lock().failures.push(Failure { op, left: n, sticky, fired: false });
    }

    /// How many writes in flight at a crash landed, whole or in part, since
    /// the device was made (see the module doc).
    pub fn landed_in_flight(&self) -> u64 {
        self.lock().landed_in_flight
    }

    /// Start recording every write and flush (see [`TraceEvent`]), from
    /// an empty trace.
    pub fn record_trace(&self) {
        self.lock().trace = Some(Vec::new());
    }

    /// The writes and flushes recorded since [`FaultDevice::record_trace`].
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.lock().trace.clone().unwrap_or_default()
    }

    /// The discards received so far (offset, length), in order.
    pub fn discards(&self) -> Vec<(u64, u64)> {
        self.lock().discards.clone()
    }

    /// Answer [`Device::discards_by_default`] as a block device (true) or
    /// a file (false, the default).
    pub fn act_as_block_device(&self, on: bool) {
        self.lock().block_like = on;
    }

    /// Delay async completions by a seeded number of executor yields.
    pub fn reorder(&self, on: bool) {
        self.lock().reorder = on;
    }

    /// Bring the device back as after a reboot: the media is what the
    /// crash left (see [`CrashKind`]); without a crash, what was written.
    pub fn restart(&self) {
        let mut st = self.lock();
        let st = &mut *st;
        match st.crashed.take() {
            None => {}
            Some((CrashKind::Process, torn_at, torn)) => {
                // Completed writes (and the torn prefix, already applied)
                // stay; not flushed, they are still in the drive's cache,
                // so a later power cut may lose them as any other.
                st.unflushed.push((torn_at, torn));
            }
            Some((CrashKind::Power, torn_at, torn)) => {
                let mut media = std::mem::take(&mut st.durable);
                let mut writes = std::mem::take(&mut st.unflushed);
                writes.push((torn_at, torn));
                for (off, bytes) in writes {
                    let at = off as usize;
                    match st.below(4) {
                        // Survives whole (half the writes), or is dropped.
                        0 | 1 => media[at..at + bytes.len()].copy_from_slice(&bytes),
                        2 => {}
                        // Some of its sectors reached the media, others not.
                        _ => {
                            for (i, sector) in bytes.chunks(512).enumerate() {
                                if st.next() & 1 == 1 {
                                    media[at + i * 512..at + i * 512 + sector.len()].copy_from_slice(sector);
                                }
                            }
                        }
                    }
                }
                st.current.clone_from(&media);
                st.durable = media;
                st.unflushed.clear();
            }
        }
        st.plan = None;
        st.failures.clear();
        st.life += 1;
    }

    /// Run `f` on the bytes reads see (tests: corrupt, inspect). The bytes
    /// it changes are on the media at once (and in the unflushed writes
    /// and the torn prefix over them, so a power loss cannot undo them);
    /// the rest stays as it was: writes not flushed are still at risk (an
    /// inspection makes nothing durable).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut st = self.lock();
        let st = &mut *st;
        let before = st.current.clone();
        let r = f(&mut st.current);
        let now = &st.current;
        // Sectors compared whole first: most are unchanged.
        for (i, (old, new)) in before.chunks(512).zip(now.chunks(512)).enumerate().filter(|(_, (o, n))| o != n) {
            let sector = i * 512..i * 512 + new.len();
            let torn = st.crashed.iter_mut().map(|(_, off, bytes)| (*off as usize, bytes));
            let over = st.unflushed.iter_mut().map(|(off, bytes)| (*off as usize, bytes)).chain(torn);
            let copies = std::iter::once((0, &mut st.durable)).chain(over);
            for (off, bytes) in copies {
                let (lo, hi) = (sector.start.max(off), sector.end.min(off + bytes.len()));
                for at in (lo..hi).filter(|&at| old[at - sector.start] != now[at]) {
                    bytes[at - off] = now[at];
                }
            }
        }
        r
    }

    /// A write submitted before the crash: if the crash has come since, it
    /// was in the queue then, and lands whole, as a prefix, or not at all
    /// (see the module doc), its caller seeing EIO; else an ordinary write.
    fn write_in_flight(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        let mut st = self.lock();
        if st.crashed.is_none() || check_range(self, buf.len(), offset).is_err() {
            drop(st);
            return self.write_at(buf, offset);
        }
        let sectors = (buf.len() / 512) as u64;
        let keep = match st.below(3) {
            0 => buf.len(),
            1 => st.below(sectors + 1) as usize * 512,
            _ => 0,
        };
        if keep > 0 {
            st.landed_in_flight += 1;
            let o = offset as usize;
            st.current[o..o + keep].copy_from_slice(&buf[..keep]);
            st.traced(OpKind::Write, offset, &buf[..keep]);
            st.unflushed.push((offset, buf[..keep].to_vec()));
        }
        (buf, Err(eio()))
    }

    fn delay(&self) -> u32 {
        let mut st = self.lock();
        if st.reorder {
            st.below(4) as u32
        } else {
            0
        }
    }
}

impl Device for FaultDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoResult {
        let start = Instant::now();
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let mut st = self.lock();
        if st.injected(OpKind::Read) {
            return (buf, Err(eio()));
        }
        let o = offset as usize;
        let n = buf.len();
        buf.copy_from_slice(&st.current[o..o + n]);
        drop(st);
        self.counters.read(n, start);
        (buf, Ok(()))
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        let start = Instant::now();
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let mut st = self.lock();
        if st.crashed.is_some() || st.injected(OpKind::Write) {
            return (buf, Err(eio()));
        }
        let o = offset as usize;
        let n = buf.len();
        if let Some(p) = st.plan.as_mut() {
            if p.writes_left == 0 {
                let kind = p.kind;
                let sectors = (n / 512) as u64;
                let keep = st.below(sectors + 1) as usize * 512;
                st.current[o..o + keep].copy_from_slice(&buf[..keep]);
                st.traced(OpKind::Write, offset, &buf[..keep]);
                st.crashed = Some((kind, offset, buf[..keep].to_vec()));
                return (buf, Err(eio()));
            }
            p.writes_left -= 1;
        }
        st.current[o..o + n].copy_from_slice(&buf);
        st.traced(OpKind::Write, offset, &buf);
        st.unflushed.push((offset, buf.to_vec()));
        drop(st);
        self.counters.write(n, start);
        (buf, Ok(()))
    }

    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        match self.delay() {
            0 => IoFuture::ready(self.read_at(buf, offset)),
            n => IoFuture::Pending(Box::pin(async move {
                Yields(n).await;
                self.read_at(buf, offset)
            })),
        }
    }

    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        let (alive, life) = {
            let st = self.lock();
            (st.crashed.is_none(), st.life)
        };
        match self.delay() {
            0 => IoFuture::ready(self.write_at(buf, offset)),
            n => IoFuture::Pending(Box::pin(async move {
                Yields(n).await;
                if self.lock().life != life {
                    // Submitted before a restart: its process is gone.
                    (buf, Err(eio()))
                } else if alive {
                    self.write_in_flight(buf, offset)
                } else {
                    self.write_at(buf, offset)
                }
            })),
        }
    }

    /// Recorded, and the range reads as zeros from now on; what the media
    /// keeps is left alone (a crash may bring the old bytes back, which a
    /// discard allows).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, len as usize, offset)?;
        let mut st = self.lock();
        if st.crashed.is_some() {
            return Err(eio());
        }
        st.current[offset as usize..(offset + len) as usize].fill(0);
        st.discards.push((offset, len));
        drop(st);
        self.counters.discard(len);
        Ok(())
    }

    fn discards_by_default(&self) -> bool {
        self.lock().block_like
    }

    fn flush(&self) -> io::Result<()> {
        let start = Instant::now();
        let mut st = self.lock();
        if st.crashed.is_some() || st.injected(OpKind::Flush) {
            return Err(eio());
        }
        let st = &mut *st;
        st.traced(OpKind::Flush, 0, &[]);
        for (off, bytes) in st.unflushed.drain(..) {
            st.durable[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
        }
        self.counters.flush(start);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn block_bytes(&self) -> u32 {
        512
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!("fault-injecting memory device ({} bytes)", self.size)
    }
}

/// A future that yields `n` times to its executor, then completes.
struct Yields(u32);

impl Future for Yields {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dev: &FaultDevice, fill: u8, offset: u64, len: usize) -> io::Result<()> {
        let mut b = AlignedBuf::zeroed(len);
        b.fill(fill);
        dev.write_at(b, offset).1
    }

    fn bytes(dev: &FaultDevice, offset: usize, len: usize) -> Vec<u8> {
        dev.with_bytes_mut(|b| b[offset..offset + len].to_vec())
    }

    #[test]
    fn process_crash_keeps_completed_writes_and_tears_one() {
        let mut prefixes = std::collections::BTreeSet::new();
        for seed in 0..32 {
            let dev = FaultDevice::new(1 << 16, seed);
            dev.plan_crash(1, CrashKind::Process);
            write(&dev, 0xAB, 0, 4096).unwrap();
            assert!(write(&dev, 0xCD, 8192, 4096).is_err());
            assert!(dev.crashed());
            assert!(write(&dev, 0xEE, 0, 512).is_err(), "dead after the crash");
            assert!(dev.flush().is_err());
            dev.restart();
            assert!(bytes(&dev, 0, 4096).iter().all(|&x| x == 0xAB), "seed {seed}: completed write kept");
            let torn = bytes(&dev, 8192, 4096);
            let kept = torn.iter().take_while(|&&x| x == 0xCD).count();
            assert_eq!(kept % 512, 0, "torn at a sector boundary");
            assert!(torn[kept..].iter().all(|&x| x == 0));
            prefixes.insert(kept);
            write(&dev, 1, 0, 512).unwrap();
        }
        assert!(prefixes.len() > 3, "seeds choose different tears: {prefixes:?}");
    }

    #[test]
    fn power_loss_drops_unflushed_writes_independently() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let dev = FaultDevice::new(1 << 16, seed);
            write(&dev, 1, 0, 512).unwrap();
            dev.flush().unwrap();
            write(&dev, 2, 512, 512).unwrap();
            write(&dev, 3, 1024, 512).unwrap();
            dev.plan_crash(0, CrashKind::Power);
            assert!(write(&dev, 4, 1536, 512).is_err());
            dev.restart();
            assert_eq!(bytes(&dev, 0, 1)[0], 1, "seed {seed}: flushed write survives");
            let got = (bytes(&dev, 512, 1)[0], bytes(&dev, 1024, 1)[0]);
            assert!(matches!(got.0, 0 | 2) && matches!(got.1, 0 | 3), "seed {seed}: {got:?}");
            outcomes.insert(got);
        }
        assert_eq!(outcomes.len(), 4, "every subset of unflushed writes occurs: {outcomes:?}");
    }

    /// A write a killed process completed but never flushed survives the
    /// kill, and a restart without a crash, yet a power cut in a later
    /// life may still lose it (it was only in the drive's cache), unless a
    /// flush came in between.
    #[test]
    fn unflushed_writes_stay_at_risk_across_a_process_crash_and_a_restart() {
        for flushed in [false, true] {
            let (mut lost, mut kept) = (0, 0);
            for seed in 0..64 {
                let dev = FaultDevice::new(1 << 16, seed);
                write(&dev, 2, 512, 512).unwrap();
                dev.plan_crash(0, CrashKind::Process);
                assert!(write(&dev, 9, 2048, 512).is_err());
                dev.restart();
                assert_eq!(bytes(&dev, 512, 1)[0], 2, "seed {seed}: the kill keeps a completed write");
                dev.restart(); // and a clean exit
                if flushed {
                    dev.flush().unwrap();
                }
                dev.plan_crash(0, CrashKind::Power);
                assert!(write(&dev, 6, 2560, 512).is_err());
                dev.restart();
                match bytes(&dev, 512, 1)[0] {
                    2 => kept += 1,
                    _ => lost += 1,
                }
            }
            if flushed {
                assert_eq!(lost, 0, "a flush covers the writes of earlier lives");
            } else {
                assert!(lost > 0 && kept > 0, "a power cut may lose an earlier life's unflushed write: {lost} {kept}");
            }
        }
    }

    /// A byte a test changes through `with_bytes_mut` is on the media at
    /// once, also under an unflushed write over it, which a power cut may
    /// still drop or keep in part; the write's other bytes stay at risk.
    #[test]
    fn a_change_survives_a_power_cut_and_leaves_unflushed_writes_at_risk() {
        let mut lost = 0;
        for seed in 0..64 {
            let dev = FaultDevice::new(1 << 16, seed);
            write(&dev, 2, 512, 1024).unwrap();
            dev.with_bytes_mut(|b| b[513] = 7);
            dev.plan_crash(0, CrashKind::Power);
            assert!(write(&dev, 6, 4096, 512).is_err());
            dev.restart();
            let got = bytes(&dev, 512, 2);
            assert_eq!(got[1], 7, "seed {seed}: the change was undone");
            lost += u32::from(got[0] == 0);
        }
        assert!(lost > 0, "the unflushed write was made durable by the change");
    }

    #[test]
    fn power_loss_may_keep_any_subset_of_a_writes_sectors() {
        let (mut whole, mut none, mut scattered) = (0, 0, 0);
        for seed in 0..64 {
            let dev = FaultDevice::new(1 << 16, seed);
            write(&dev, 7, 0, 8 * 512).unwrap();
            dev.plan_crash(0, CrashKind::Power);
            assert!(write(&dev, 9, 1 << 15, 512).is_err());
            dev.restart();
            let kept: Vec<bool> = (0..8).map(|i| bytes(&dev, i * 512, 512).iter().all(|&x| x == 7)).collect();
            for i in 0..8 {
                let sector = bytes(&dev, i * 512, 512);
                assert!(
                    sector.iter().all(|&x| x == 7) || sector.iter().all(|&x| x == 0),
                    "seed {seed}: sector {i} whole"
                );
            }
            match kept.iter().filter(|&&k| k).count() {
                8 => whole += 1,
                0 => none += 1,
                _ if kept.windows(2).any(|w| !w[0] && w[1]) => scattered += 1,
                _ => {}
            }
        }
        assert!(whole > 0 && none > 0 && scattered > 0, "whole {whole}, none {none}, not a prefix {scattered}");
    }

    /// Polls `f` to its end (the device's futures only yield).
    fn finish<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn a_write_in_flight_at_the_crash_lands_whole_in_part_or_not_at_all() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let dev = FaultDevice::new(1 << 16, seed);
            dev.reorder(true);
            let mut b = AlignedBuf::zeroed(4096);
            b.fill(0xAA);
            let in_flight = dev.write_at_async(b, 0);
            dev.plan_crash(0, CrashKind::Process);
            assert!(write(&dev, 0xCC, 8192, 512).is_err(), "seed {seed}: the crash");
            let mut b = AlignedBuf::zeroed(512);
            b.fill(0xDD);
            let late = dev.write_at_async(b, 16384);
            let landed_early = finish(in_flight).1.is_ok();
            assert!(finish(late).1.is_err(), "seed {seed}: a write submitted after the crash fails");
            dev.restart();
            assert!(bytes(&dev, 16384, 512).iter().all(|&x| x == 0), "seed {seed}: nothing of it is written");
            if landed_early {
                continue; // It took effect at submission, before the crash.
            }
            let a = bytes(&dev, 0, 4096);
            let kept = a.iter().take_while(|&&x| x == 0xAA).count();
            assert!(a[kept..].iter().all(|&x| x == 0) && kept % 512 == 0, "seed {seed}: a prefix of sectors");
            outcomes.insert(match kept {
                0 => "none",
                4096 => "whole",
                _ => "part",
            });
        }
        assert_eq!(outcomes.len(), 3, "seeds land it whole, in part and not at all: {outcomes:?}");
    }

    #[test]
    fn a_sector_several_unflushed_writes_covered_holds_one_of_their_versions() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let dev = FaultDevice::new(1 << 16, seed);
            write(&dev, 1, 0, 512).unwrap();
            dev.flush().unwrap();
            write(&dev, 2, 0, 1024).unwrap();
            write(&dev, 3, 0, 512).unwrap();
            dev.plan_crash(0, CrashKind::Power);
            assert!(write(&dev, 4, 4096, 512).is_err());
            dev.restart();
            let sector = bytes(&dev, 0, 512);
            assert!(sector.iter().all(|&x| x == sector[0]) && matches!(sector[0], 1..=3), "seed {seed}: {sector:?}");
            outcomes.insert(sector[0]);
            // The second sector only the 1024-byte write covered.
            let second = bytes(&dev, 512, 512);
            assert!(second.iter().all(|&x| x == second[0]) && matches!(second[0], 0 | 2), "seed {seed}: {second:?}");
        }
        assert_eq!(outcomes.len(), 3, "the flushed version and either later one: {outcomes:?}");
    }

    #[test]
    fn a_write_submitted_before_a_restart_does_not_land_after_it() {
        let dev = FaultDevice::new(1 << 16, 1);
        dev.reorder(true);
        let mut pending = None;
        for _ in 0..64 {
            let mut b = AlignedBuf::zeroed(512);
            b.fill(5);
            let f = dev.write_at_async(b, 0);
            if bytes(&dev, 0, 1)[0] == 0 {
                pending = Some(f); // Delayed: not yet written.
                break;
            }
            dev.with_bytes_mut(|b| b[..512].fill(0));
        }
        let f = pending.expect("some write is delayed");
        dev.restart();
        assert!(finish(f).1.is_err(), "its process is gone");
        assert_eq!(bytes(&dev, 0, 512), vec![0; 512]);
    }

    #[test]
    fn injected_eio_hits_the_chosen_operation() {
        let dev = FaultDevice::new(1 << 16, 7);
        dev.fail_nth(OpKind::Write, 2, false);
        write(&dev, 1, 0, 512).unwrap();
        write(&dev, 1, 512, 512).unwrap();
        assert_eq!(write(&dev, 1, 1024, 512).unwrap_err().raw_os_error(), Some(libc::EIO));
        write(&dev, 1, 1536, 512).unwrap();
        dev.fail_nth(OpKind::Flush, 0, true);
        assert!(dev.flush().is_err());
        assert!(dev.flush().is_err(), "sticky");
        dev.fail_nth(OpKind::Read, 0, false);
        assert!(dev.read_at(AlignedBuf::zeroed(512), 0).1.is_err());
        assert!(dev.read_at(AlignedBuf::zeroed(512), 0).1.is_ok());
    }

    #[test]
    fn reordered_completions_finish_out_of_submission_order() {
        let dev = FaultDevice::new(1 << 16, 3);
        dev.reorder(true);
        let order = Mutex::new(Vec::new());
        let futs: Vec<_> = (0..16u64)
            .map(|i| {
                let (dev, order) = (&dev, &order);
                async move {
                    let mut b = AlignedBuf::zeroed(512);
                    b.fill(i as u8);
                    dev.write_at_async(b, i * 512).await.1.unwrap();
                    order.lock().unwrap().push(i);
                }
            })
            .collect();
        // Poll all of them round-robin, like an executor would.
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
        let mut done = vec![false; futs.len()];
        while done.iter().any(|d| !d) {
            for (i, f) in futs.iter_mut().enumerate() {
                if !done[i] && f.as_mut().poll(&mut cx).is_ready() {
                    done[i] = true;
                }
            }
        }
        drop(futs);
        let order = order.into_inner().unwrap();
        assert_eq!(order.len(), 16);
        assert!(order.windows(2).any(|w| w[0] > w[1]), "completions reordered: {order:?}");
    }
}
