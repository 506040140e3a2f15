//! [`StripedDevice`]: RAID-0, one logical device striped over several member
//! devices (files or block devices), behind the same [`Device`] trait, so
//! the engine runs on it unchanged.
//!
//! Layout (format version 1, documented in docs/FORMAT.md): each member
//! starts with a [`LABEL_BYTES`] label naming the set (a random id), the
//! member's index, the member count, the stripe unit and the data bytes per
//! member, protected by a CRC32C. Logical byte `x` lives in stripe
//! `s = x / stripe`, on member `s % n`, at member offset
//! `LABEL_BYTES + (s / n) * stripe + x % stripe`. The logical size is
//! `n * data_bytes_per_member`.
//!
//! An operation inside one stripe unit (most of the engine's: record reads,
//! group writes inside a stripe) is passed to its member with the caller's
//! buffer; a larger one is split at stripe boundaries into one operation per
//! piece, copied through a buffer of its own, and, with the asynchronous
//! API, the pieces run concurrently. A split write that a crash interrupts
//! may land on some members and not others: the engine already treats any
//! write that did not complete as torn (checksums, recovery's torn tail).
//!
//! Opening checks the labels: members may be named in any order; a missing
//! member, a duplicate, a member of another set, a label of an unknown
//! version or a damaged label is refused with an error naming the member.
//! `flush` flushes every member; `discard` reaches every member's share of
//! the range (a file member's punched hole, a block member's BLKDISCARD).

use crate::{check_range, AlignedBuf, Device, IoCounters, IoFuture, IoResult};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// Bytes reserved at the start of each member for its label.
pub const LABEL_BYTES: u64 = 4096;
/// Default stripe unit: large enough that a record read or a small group
/// write is one member's IO, small enough that a segment's scan or a large
/// group write spreads over the members.
pub const STRIPE_BYTES_DEFAULT: u32 = 128 * 1024;
/// Most members in one set.
pub const MEMBERS_MAX: usize = 64;

/// Refuse a stripe set of `members` members and a `stripe_bytes` unit
/// that [`StripedDevice::create`] would refuse, before any member is made
/// (a new file's zero fill takes a while): 2 to [`MEMBERS_MAX`] members,
/// a power of two of at least 4096 bytes.
pub fn check_settings(members: usize, stripe_bytes: u32) -> io::Result<()> {
    if !(2..=MEMBERS_MAX).contains(&members) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a stripe set has 2 to {MEMBERS_MAX} members, not {members} (use a single device directly)"),
        ));
    }
    if !stripe_bytes.is_power_of_two() || stripe_bytes < 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("stripe unit {stripe_bytes} must be a power of two of at least 4096 bytes"),
        ));
    }
    Ok(())
}
/// The label's version this code writes and reads.
pub const LABEL_VERSION: u32 = 1;
/// The first 8 bytes of a stripe member (its label).
pub const LABEL_MAGIC: [u8; 8] = *b"GRNSTRIP";
const MAGIC: [u8; 8] = LABEL_MAGIC;
const LABEL_CRC_AT: usize = 40;

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One member's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label {
    set_id: u64,
    index: u32,
    count: u32,
    stripe_bytes: u32,
    member_data_bytes: u64,
}

impl Label {
    fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(LABEL_BYTES as usize);
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&LABEL_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..20].copy_from_slice(&self.count.to_le_bytes());
        b[20..24].copy_from_slice(&self.stripe_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.set_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.member_data_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&b[..LABEL_CRC_AT]);
        b[LABEL_CRC_AT..LABEL_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8], who: &str) -> io::Result<Label> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if b[0..8] != MAGIC {
            return Err(invalid(format!("{who} is not a member of a stripe set (no stripe label)")));
        }
        let version = u32_at(8);
        if version != LABEL_VERSION {
            return Err(invalid(format!(
                "{who}: stripe label version {version} is not understood (this build reads version {LABEL_VERSION})"
            )));
        }
        if crc32c::crc32c(&b[..LABEL_CRC_AT]) != u32_at(LABEL_CRC_AT) {
            return Err(invalid(format!("{who}: the stripe label is damaged (checksum mismatch)")));
        }
        let l = Label {
            index: u32_at(12),
            count: u32_at(16),
            stripe_bytes: u32_at(20),
            set_id: u64_at(24),
            member_data_bytes: u64_at(32),
        };
        if l.count == 0 || l.count as usize > MEMBERS_MAX || l.index >= l.count {
            return Err(invalid(format!("{who}: stripe label names member {} of {}", l.index, l.count)));
        }
        if l.stripe_bytes == 0
            || !l.stripe_bytes.is_power_of_two()
            || !l.member_data_bytes.is_multiple_of(l.stripe_bytes as u64)
        {
            return Err(invalid(format!(
                "{who}: stripe label has a bad geometry (stripe {} bytes, {} data bytes)",
                l.stripe_bytes, l.member_data_bytes
            )));
        }
        Ok(l)
    }
}

/// The stripe label fuzz target's way in (granary-fuzz): decode `b` as a
/// member's label (zeros after it, up to [`LABEL_BYTES`]; cut there) as an
/// open reads one. A label that decodes encodes back to the same bytes
/// (its fields and checksum, the first 44); a panic is a decoder's bug.
/// Whether it decoded.
#[doc(hidden)]
pub fn fuzz_label(b: &[u8]) -> bool {
    let mut buf = vec![0u8; LABEL_BYTES as usize];
    let n = b.len().min(buf.len());
    buf[..n].copy_from_slice(&b[..n]);
    match Label::decode(&buf, "fuzz input") {
        Ok(l) => {
            assert_eq!(&l.encode()[..LABEL_CRC_AT + 4], &buf[..LABEL_CRC_AT + 4], "{l:?}");
            true
        }
        Err(_) => false,
    }
}

/// A random set id, without a dependency: the standard library's hasher is
/// seeded from the operating system's randomness.
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// RAID-0 over several devices. See the module doc.
pub struct StripedDevice {
    members: Vec<Arc<dyn Device>>,
    stripe: u64,
    member_data_bytes: u64,
    set_id: u64,
    block: u32,
    counters: IoCounters,
}

/// One piece of a logical operation: `len` bytes at `buf_at` in the caller's
/// buffer go to member `member` at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    member: usize,
    offset: u64,
    buf_at: usize,
    len: usize,
}

impl StripedDevice {
    /// Make a new stripe set of `members` (in this order) with a stripe unit
    /// of `stripe_bytes` (a power of two, a multiple of every member's block
    /// size): writes each member's label. The logical size is the member
    /// count times the smallest member's data bytes.
    pub fn create(members: Vec<Arc<dyn Device>>, stripe_bytes: u32) -> io::Result<StripedDevice> {
        let n = members.len();
        check_settings(n, stripe_bytes)?;
        let block = members.iter().map(|m| m.block_bytes()).max().unwrap_or(512);
        if !stripe_bytes.is_multiple_of(block) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("stripe unit {stripe_bytes} is not a multiple of the members' {block}-byte blocks"),
            ));
        }
        let smallest = members.iter().map(|m| m.size_bytes()).min().unwrap_or(0);
        let member_data_bytes = smallest.saturating_sub(LABEL_BYTES) / stripe_bytes as u64 * stripe_bytes as u64;
        if member_data_bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the smallest member ({smallest} bytes) holds no stripe of {stripe_bytes} bytes"),
            ));
        }
        let set_id = random_id();
        // On a failure the labels written so far go (best effort), so the
        // members are as they were for the next try.
        let unlabel = |written: &[Arc<dyn Device>]| {
            for w in written {
                if w.write_at(AlignedBuf::zeroed(LABEL_BYTES as usize), 0).1.is_ok() {
                    let _ = w.flush();
                }
            }
        };
        for (i, m) in members.iter().enumerate() {
            let l = Label { set_id, index: i as u32, count: n as u32, stripe_bytes, member_data_bytes };
            if let Err(e) = m.write_at(l.encode(), 0).1 {
                unlabel(&members[..i]);
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot write the stripe label of {}: {e}", m.describe()),
                ));
            }
        }
        for m in &members {
            if let Err(e) = m.flush() {
                unlabel(&members);
                return Err(io::Error::new(e.kind(), format!("cannot flush {}: {e}", m.describe())));
            }
        }
        Ok(StripedDevice {
            members,
            stripe: stripe_bytes as u64,
            member_data_bytes,
            set_id,
            block,
            counters: IoCounters::default(),
        })
    }

    /// Open an existing stripe set from its members, named in any order.
    pub fn open(members: Vec<Arc<dyn Device>>) -> io::Result<StripedDevice> {
        if members.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a stripe set needs its members"));
        }
        let mut labelled = Vec::with_capacity(members.len());
        for m in members {
            let who = m.describe();
            let (b, r) = m.read_at(AlignedBuf::zeroed(LABEL_BYTES as usize), 0);
            r.map_err(|e| io::Error::new(e.kind(), format!("cannot read the stripe label of {who}: {e}")))?;
            let l = Label::decode(&b, &who)?;
            if LABEL_BYTES + l.member_data_bytes > m.size_bytes() {
                return Err(invalid(format!(
                    "{who} is smaller ({} bytes) than its stripe label says ({} data bytes)",
                    m.size_bytes(),
                    l.member_data_bytes
                )));
            }
            labelled.push((l, m));
        }
        let first = labelled[0].0;
        let first_who = labelled[0].1.describe();
        for (l, m) in &labelled[1..] {
            if l.set_id != first.set_id {
                return Err(invalid(format!("{} and {first_who} belong to different stripe sets", m.describe())));
            }
            if (l.count, l.stripe_bytes, l.member_data_bytes)
                != (first.count, first.stripe_bytes, first.member_data_bytes)
            {
                return Err(invalid(format!("{}'s stripe label disagrees with {first_who}'s", m.describe())));
            }
        }
        labelled.sort_by_key(|(l, _)| l.index);
        for w in labelled.windows(2) {
            if w[0].0.index == w[1].0.index {
                return Err(invalid(format!(
                    "{} and {} are both member {} of the stripe set",
                    w[0].1.describe(),
                    w[1].1.describe(),
                    w[0].0.index
                )));
            }
        }
        if labelled.len() != first.count as usize {
            let have: Vec<u32> = labelled.iter().map(|(l, _)| l.index).collect();
            let missing: Vec<String> = (0..first.count).filter(|i| !have.contains(i)).map(|i| i.to_string()).collect();
            return Err(invalid(format!(
                "the stripe set has {} members and {} were given; missing member(s) {}",
                first.count,
                labelled.len(),
                missing.join(", ")
            )));
        }
        let members: Vec<Arc<dyn Device>> = labelled.into_iter().map(|(_, m)| m).collect();
        let block = members.iter().map(|m| m.block_bytes()).max().unwrap_or(512);
        if !(first.stripe_bytes as u64).is_multiple_of(block as u64) {
            return Err(invalid(format!(
                "stripe unit {} is not a multiple of the members' block size {block}",
                first.stripe_bytes
            )));
        }
        Ok(StripedDevice {
            members,
            stripe: first.stripe_bytes as u64,
            member_data_bytes: first.member_data_bytes,
            set_id: first.set_id,
            block,
            counters: IoCounters::default(),
        })
    }

    /// Members in set order.
    pub fn members(&self) -> &[Arc<dyn Device>] {
        &self.members
    }

    /// The stripe unit in bytes.
    pub fn stripe_bytes(&self) -> u32 {
        self.stripe as u32
    }

    /// The set's id, written in every member's label.
    pub fn set_id(&self) -> u64 {
        self.set_id
    }

    /// Where `len` bytes at logical `offset` go, piece by piece.
    fn pieces(&self, offset: u64, len: usize) -> Vec<Piece> {
        let n = self.members.len() as u64;
        let mut out = Vec::with_capacity(1 + len / self.stripe as usize);
        let mut at = 0usize;
        while at < len {
            let x = offset + at as u64;
            let s = x / self.stripe;
            let within = x % self.stripe;
            let take = ((self.stripe - within) as usize).min(len - at);
            out.push(Piece {
                member: (s % n) as usize,
                offset: LABEL_BYTES + (s / n) * self.stripe + within,
                buf_at: at,
                len: take,
            });
            at += take;
        }
        out
    }

    fn count(&self, write: bool, r: &IoResult, start: Instant) {
        if r.1.is_ok() {
            if write {
                self.counters.write(r.0.len(), start);
            } else {
                self.counters.read(r.0.len(), start);
            }
        }
    }

    /// A piece's own buffer: for a write, holding its bytes of `buf`.
    fn piece_buf(buf: &AlignedBuf, p: &Piece, write: bool) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(p.len);
        if write {
            b.copy_from_slice(&buf[p.buf_at..p.buf_at + p.len]);
        }
        b
    }

    fn op_sync(&self, write: bool, mut buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let start = Instant::now();
        let pieces = self.pieces(offset, buf.len());
        let r = if let [p] = pieces[..] {
            let m = &self.members[p.member];
            if write {
                m.write_at(buf, p.offset)
            } else {
                m.read_at(buf, p.offset)
            }
        } else {
            let mut res = Ok(());
            for p in &pieces {
                let m = &self.members[p.member];
                let pb = Self::piece_buf(&buf, p, write);
                let (pb, r) = if write { m.write_at(pb, p.offset) } else { m.read_at(pb, p.offset) };
                if let Err(e) = r {
                    res = Err(e);
                    break;
                }
                if !write {
                    buf[p.buf_at..p.buf_at + p.len].copy_from_slice(&pb);
                }
            }
            (buf, res)
        };
        self.count(write, &r, start);
        r
    }

    fn op_async(&self, write: bool, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return IoFuture::ready((buf, Err(e)));
        }
        let start = Instant::now();
        let pieces = self.pieces(offset, buf.len());
        if let [p] = pieces[..] {
            let m = &self.members[p.member];
            let fut = if write { m.write_at_async(buf, p.offset) } else { m.read_at_async(buf, p.offset) };
            return match fut {
                IoFuture::Ready(Some(r)) => {
                    self.count(write, &r, start);
                    IoFuture::ready(r)
                }
                fut => IoFuture::Pending(Box::pin(async move {
                    let r = fut.await;
                    self.count(write, &r, start);
                    r
                })),
            };
        }
        let futs: Vec<IoFuture<'_>> = pieces
            .iter()
            .map(|p| {
                let m = &self.members[p.member];
                let pb = Self::piece_buf(&buf, p, write);
                if write {
                    m.write_at_async(pb, p.offset)
                } else {
                    m.read_at_async(pb, p.offset)
                }
            })
            .collect();
        IoFuture::Pending(Box::pin(async move {
            let done = JoinAll::new(futs).await;
            let mut buf = buf;
            let mut res = Ok(());
            for (p, (pb, r)) in pieces.iter().zip(done) {
                match r {
                    Ok(()) if !write => buf[p.buf_at..p.buf_at + p.len].copy_from_slice(&pb),
                    Ok(()) => {}
                    Err(e) => {
                        if res.is_ok() {
                            res = Err(e);
                        }
                    }
                }
            }
            let r = (buf, res);
            self.count(write, &r, start);
            r
        }))
    }
}

/// Wait for every future; results in the futures' order.
struct JoinAll<F: Future + Unpin> {
    futs: Vec<Option<F>>,
    out: Vec<Option<F::Output>>,
}

impl<F: Future + Unpin> JoinAll<F> {
    fn new(futs: Vec<F>) -> Self {
        let out = futs.iter().map(|_| None).collect();
        JoinAll { futs: futs.into_iter().map(Some).collect(), out }
    }
}

impl<F: Future + Unpin> Future for JoinAll<F>
where
    F::Output: Unpin,
{
    type Output = Vec<F::Output>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<F::Output>> {
        let me = self.get_mut();
        let mut pending = false;
        for (f, o) in me.futs.iter_mut().zip(me.out.iter_mut()) {
            if let Some(fut) = f {
                match Pin::new(fut).poll(cx) {
                    Poll::Ready(r) => {
                        *o = Some(r);
                        *f = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(me.out.iter_mut().map(|o| o.take().expect("each future completed once")).collect())
    }
}

impl Device for StripedDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        self.op_sync(false, buf, offset)
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        self.op_sync(true, buf, offset)
    }

    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.op_async(false, buf, offset)
    }

    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.op_async(true, buf, offset)
    }

    /// Every member's share of the range, each as few discards as it
    /// takes: a member's pieces of consecutive stripes are adjacent on it
    /// (rows follow each other), so a range of whole stripe rows is one
    /// discard per member. Each member is tried, even after one fails; the
    /// first error is returned (discard is advisory: what a failed member
    /// keeps is only space, not data anyone reads).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, len as usize, offset)?;
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.members.len()];
        for p in self.pieces(offset, len as usize) {
            let r = &mut ranges[p.member];
            match r.last_mut() {
                Some((at, n)) if *at + *n == p.offset => *n += p.len as u64,
                _ => r.push((p.offset, p.len as u64)),
            }
        }
        let mut res = Ok(());
        for (m, rs) in self.members.iter().zip(ranges) {
            for (at, n) in rs {
                if let Err(e) = m.discard(at, n) {
                    if res.is_ok() {
                        // The member's error as it is (its errno kept:
                        // EOPNOTSUPP is "not supported", not a failure).
                        tracing::debug!(member = %m.describe(), error = %e, "discard failed");
                        res = Err(e);
                    }
                    break;
                }
            }
        }
        if res.is_ok() {
            self.counters.discard(len);
        }
        res
    }

    /// As its members: all of them must discard by default.
    fn discards_by_default(&self) -> bool {
        self.members.iter().all(|m| m.discards_by_default())
    }

    /// Flushes every member (all of them, even after one fails); the first
    /// error is returned.
    fn flush(&self) -> io::Result<()> {
        let start = Instant::now();
        let mut res = Ok(());
        for m in &self.members {
            if let Err(e) = m.flush() {
                if res.is_ok() {
                    res = Err(io::Error::new(e.kind(), format!("flush of {}: {e}", m.describe())));
                }
            }
        }
        self.counters.flush(start);
        res
    }

    /// Every member's flush at once (each through the executor's ring
    /// where its backend submits there), the first error reported.
    fn flush_async(&self) -> crate::FlushFuture<'_> {
        let start = Instant::now();
        let flushes = JoinAll::new(self.members.iter().map(|m| m.flush_async()).collect());
        Box::pin(async move {
            let done = flushes.await;
            self.counters.flush(start);
            let failed = self.members.iter().zip(done).find_map(|(m, r)| r.err().map(|e| (m, e)));
            match failed {
                Some((m, e)) => Err(io::Error::new(e.kind(), format!("flush of {}: {e}", m.describe()))),
                None => Ok(()),
            }
        })
    }

    fn size_bytes(&self) -> u64 {
        self.member_data_bytes * self.members.len() as u64
    }

    fn block_bytes(&self) -> u32 {
        self.block
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    fn release(&self) {
        for m in &self.members {
            m.release();
        }
    }

    /// Every member, or none: those claimed before one that fails are
    /// released again.
    fn claim(&self) -> io::Result<()> {
        for (i, m) in self.members.iter().enumerate() {
            if let Err(e) = m.claim() {
                self.members[..i].iter().for_each(|m| m.release());
                return Err(e);
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let members: Vec<String> = self.members.iter().map(|m| m.describe()).collect();
        format!("RAID-0 of {} members, {} KiB stripes: {}", self.members.len(), self.stripe / 1024, members.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    /// A member that cannot punch holes (a filesystem without them).
    struct NoHoles(MemDevice);

    impl Device for NoHoles {
        fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            self.0.flush()
        }
        fn discard(&self, _: u64, _: u64) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn block_bytes(&self) -> u32 {
            self.0.block_bytes()
        }
        fn counters(&self) -> &IoCounters {
            self.0.counters()
        }
        fn describe(&self) -> String {
            "a member without hole punching".into()
        }
    }

    /// A member's discard error reaches the caller with its errno, so
    /// "not supported" stays told apart from a failure.
    #[test]
    fn a_member_s_discard_error_keeps_its_errno() {
        let stripe = 64 << 10;
        let members: Vec<Arc<dyn Device>> =
            (0..2).map(|_| Arc::new(NoHoles(MemDevice::new(1 << 20))) as Arc<dyn Device>).collect();
        let d = StripedDevice::create(members, stripe).unwrap();
        let e = d.discard(0, 2 * u64::from(stripe)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    }

    fn mems(n: usize, size: u64) -> (Vec<Arc<MemDevice>>, Vec<Arc<dyn Device>>) {
        let raw: Vec<Arc<MemDevice>> = (0..n).map(|_| Arc::new(MemDevice::new(size))).collect();
        let devs = raw.iter().map(|m| m.clone() as Arc<dyn Device>).collect();
        (raw, devs)
    }

    /// A deterministic pattern so misplaced bytes show.
    fn pattern(len: usize, seed: u64) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len);
        let mut rng = crate::SimRng::new(seed);
        for c in b.chunks_mut(8) {
            let bytes = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&bytes[..c.len()]);
        }
        b
    }

    /// The async flush flushes every member, counts one flush of the
    /// set, and names the member whose flush failed.
    #[test]
    fn flush_async_flushes_every_member_and_names_a_failed_one() {
        let (raw, devs) = mems(2, LABEL_BYTES + 8 * 4096);
        let d = StripedDevice::create(devs, 4096).unwrap();
        let flushes = |m: &Arc<MemDevice>| m.counters().snapshot().flushes;
        let before: Vec<u64> = raw.iter().map(flushes).collect();
        let set_before = d.counters().snapshot().flushes;
        granary_rt::block_on(d.flush_async()).unwrap();
        assert!(raw.iter().zip(&before).all(|(m, b)| flushes(m) == b + 1));
        assert_eq!(d.counters().snapshot().flushes, set_before + 1);

        let bad = Arc::new(crate::FaultDevice::new(LABEL_BYTES + 8 * 4096, 1));
        let good = Arc::new(MemDevice::new(LABEL_BYTES + 8 * 4096));
        let d = StripedDevice::create(vec![good.clone() as Arc<dyn Device>, bad.clone()], 4096).unwrap();
        bad.fail_nth(crate::fault::OpKind::Flush, 0, false);
        let good_before = good.counters().snapshot().flushes;
        let e = granary_rt::block_on(d.flush_async()).unwrap_err();
        assert!(e.to_string().contains(&format!("flush of {}", bad.describe())), "{e}");
        assert_eq!(good.counters().snapshot().flushes, good_before + 1, "the other member was flushed too");
    }

    #[test]
    fn pieces_map_stripes_round_robin() {
        let (_, devs) = mems(3, LABEL_BYTES + 8 * 4096);
        let d = StripedDevice::create(devs, 4096).unwrap();
        assert_eq!(d.size_bytes(), 3 * 8 * 4096);
        // A write from the middle of stripe 2 into stripe 4: members 2, 0, 1.
        let p = d.pieces(2 * 4096 + 512, 2 * 4096 + 1024);
        let expect = [
            Piece { member: 2, offset: LABEL_BYTES + 512, buf_at: 0, len: 3584 },
            Piece { member: 0, offset: LABEL_BYTES + 4096, buf_at: 3584, len: 4096 },
            Piece { member: 1, offset: LABEL_BYTES + 4096, buf_at: 7680, len: 1536 },
        ];
        assert_eq!(p, expect);
    }

    #[test]
    fn bytes_land_where_the_layout_says() {
        let (raw, devs) = mems(2, LABEL_BYTES + 4 * 8192);
        let d = StripedDevice::create(devs, 8192).unwrap();
        let data = pattern(3 * 8192, 7);
        let (_, r) = d.write_at(data, 4096);
        r.unwrap();
        let data = pattern(3 * 8192, 7);
        // Logical 4096..8192 is stripe 0 (member 0, second half); 8192..16384
        // stripe 1 (member 1, row 0); 16384..24576 stripe 2 (member 0, row 1);
        // 24576..28672 stripe 3 (member 1, row 1, first half).
        raw[0].with_bytes_mut(|m| {
            let l = LABEL_BYTES as usize;
            assert_eq!(&m[l + 4096..l + 8192], &data[0..4096]);
            assert_eq!(&m[l + 8192..l + 16384], &data[12288..20480]);
        });
        raw[1].with_bytes_mut(|m| {
            let l = LABEL_BYTES as usize;
            assert_eq!(&m[l..l + 8192], &data[4096..12288]);
            assert_eq!(&m[l + 8192..l + 12288], &data[20480..24576]);
        });
        let (back, r) = d.read_at(AlignedBuf::zeroed(3 * 8192), 4096);
        r.unwrap();
        assert_eq!(&back[..], &data[..]);
        let c = d.counters().snapshot();
        assert_eq!((c.reads, c.read_bytes, c.writes, c.written_bytes), (1, 3 * 8192, 1, 3 * 8192));
    }

    #[test]
    fn random_io_matches_a_flat_model() {
        let (_, devs) = mems(3, LABEL_BYTES + 16 * 4096);
        let d = StripedDevice::create(devs, 4096).unwrap();
        let size = d.size_bytes() as usize;
        let mut model = vec![0u8; size];
        let mut rng = crate::SimRng::new(42);
        for i in 0..300 {
            let blocks = size / 512;
            let at = (rng.next_u64() as usize % blocks) * 512;
            let len = ((rng.next_u64() as usize % 40) + 1) * 512;
            let len = len.min(size - at);
            if i % 2 == 0 {
                let b = pattern(len, rng.next_u64());
                model[at..at + len].copy_from_slice(&b);
                let (_, r) = d.write_at(b, at as u64);
                r.unwrap();
            } else {
                let (b, r) = d.read_at(AlignedBuf::zeroed(len), at as u64);
                r.unwrap();
                assert_eq!(&b[..], &model[at..at + len], "read {len} at {at} (op {i})");
            }
        }
    }

    #[test]
    fn open_checks_the_labels() {
        let (raw, devs) = mems(3, LABEL_BYTES + 4 * 4096);
        let d = StripedDevice::create(devs.clone(), 4096).unwrap();
        let (_, r) = d.write_at(pattern(4096 * 5, 3), 0);
        r.unwrap();
        let id = d.set_id();
        drop(d);
        // Any order.
        let shuffled = vec![devs[2].clone(), devs[0].clone(), devs[1].clone()];
        let d = StripedDevice::open(shuffled).unwrap();
        assert_eq!(d.set_id(), id);
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096 * 5), 0);
        r.unwrap();
        assert_eq!(&b[..], &pattern(4096 * 5, 3)[..]);
        drop(d);
        // Missing, duplicated, foreign, damaged, unknown version.
        let e = StripedDevice::open(vec![devs[0].clone(), devs[2].clone()]).err().unwrap().to_string();
        assert!(e.contains("missing member(s) 1"), "{e}");
        let e = StripedDevice::open(vec![devs[0].clone(), devs[0].clone(), devs[2].clone()]).err().unwrap();
        assert!(e.to_string().contains("are both member 0"), "{e}");
        let (_, other) = mems(2, LABEL_BYTES + 4 * 4096);
        StripedDevice::create(other.clone(), 4096).unwrap();
        let e = StripedDevice::open(vec![devs[0].clone(), other[1].clone(), devs[2].clone()]).err().unwrap();
        assert!(e.to_string().contains("different stripe sets"), "{e}");
        raw[1].with_bytes_mut(|m| m[30] ^= 1);
        let e = StripedDevice::open(devs.clone()).err().unwrap().to_string();
        assert!(e.contains("damaged"), "{e}");
        raw[1].with_bytes_mut(|m| {
            m[30] ^= 1;
            m[8] = 9;
        });
        let e = StripedDevice::open(devs.clone()).err().unwrap().to_string();
        assert!(e.contains("version 9 is not understood"), "{e}");
        let (_, plain) = mems(1, 1 << 20);
        let e = StripedDevice::open(plain).err().unwrap().to_string();
        assert!(e.contains("not a member of a stripe set"), "{e}");
    }

    /// A creation whose label write fails on a later member zeroes the
    /// labels it wrote on the earlier ones, so the next try finds the
    /// members as they were. Before, the first members kept their labels
    /// (a retry over block devices said "already holds a Granary store").
    #[test]
    fn a_failed_creation_takes_back_the_labels_it_wrote() {
        let (raw, mut devs) = mems(3, 1 << 20);
        let failing = Arc::new(crate::InjectDevice::new(devs[2].clone()));
        failing.controls().set_write_eio(true);
        devs[2] = failing;
        let e = StripedDevice::create(devs, 64 << 10).err().expect("the third label fails").to_string();
        assert!(e.contains("cannot write the stripe label"), "{e}");
        for (i, m) in raw.iter().enumerate() {
            m.with_bytes_mut(|b| {
                assert!(b[..LABEL_BYTES as usize].iter().all(|&x| x == 0), "member {i} keeps a label")
            });
        }
    }

    #[test]
    fn create_refuses_bad_geometry() {
        let (_, one) = mems(1, 1 << 20);
        assert!(StripedDevice::create(one, 4096).is_err());
        let (_, two) = mems(2, 1 << 20);
        assert!(StripedDevice::create(two.clone(), 3 * 4096).is_err());
        assert!(StripedDevice::create(two, 2 << 20).is_err());
    }

    #[test]
    fn discard_reaches_every_members_share_and_nothing_else() {
        let (raw, devs) = mems(3, LABEL_BYTES + 8 * 4096);
        let d = StripedDevice::create(devs, 4096).unwrap();
        let size = d.size_bytes() as usize;
        let (_, r) = d.write_at(pattern(size, 5), 0);
        r.unwrap();
        // From the middle of stripe 1 to the middle of stripe 8: every
        // member, rows 0..3, partial stripes at both ends.
        let (at, len) = (4096 + 1024, 7 * 4096);
        d.discard(at as u64, len as u64).unwrap();
        let (b, r) = d.read_at(AlignedBuf::zeroed(size), 0);
        r.unwrap();
        let want = pattern(size, 5);
        for (i, (&got, &w)) in b.iter().zip(want.iter()).enumerate() {
            let expect = if (at..at + len).contains(&i) { 0 } else { w };
            assert_eq!(got, expect, "logical byte {i}");
        }
        // One discard per member: its pieces of consecutive stripes are adjacent.
        let per_member: Vec<(u64, u64)> = raw
            .iter()
            .map(|m| {
                let c = m.counters().snapshot();
                (c.discards, c.discarded_bytes)
            })
            .collect();
        assert_eq!(per_member.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(per_member.iter().map(|c| c.1).sum::<u64>(), len as u64);
        let c = d.counters().snapshot();
        assert_eq!((c.discards, c.discarded_bytes), (1, len as u64));
        assert!(!d.discards_by_default(), "memory members do not discard by default");
        assert!(d.discard(100, 512).is_err(), "misaligned");
        assert!(d.discard(size as u64 - 4096, 8192).is_err(), "past the end");
    }

    /// On files each member's share becomes a hole: its allocated blocks
    /// (`st_blocks`) drop by that share, and the rest reads back intact.
    #[test]
    fn discard_punches_holes_in_every_member_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let stripe = 64 * 1024;
        let member_bytes = LABEL_BYTES + 16 * stripe;
        let paths: Vec<_> = (0..3).map(|i| dir.path().join(format!("m{i}"))).collect();
        let members: Vec<Arc<dyn Device>> = paths
            .iter()
            .map(|p| {
                Arc::new(crate::FileDevice::create(p, member_bytes, crate::OpenMode::Direct).unwrap())
                    as Arc<dyn Device>
            })
            .collect();
        let d = StripedDevice::create(members, stripe as u32).unwrap();
        let size = d.size_bytes() as usize;
        let (_, r) = d.write_at(pattern(size, 9), 0);
        r.unwrap();
        d.flush().unwrap();
        let blocks = |p: &std::path::Path| std::fs::metadata(p).unwrap().blocks();
        let before: Vec<u64> = paths.iter().map(|p| blocks(p)).collect();
        // Six whole stripes from stripe 3: rows 1 and 2 of every member.
        let (at, len) = (3 * stripe as usize, 6 * stripe as usize);
        match d.discard(at as u64, len as u64) {
            Ok(()) => {}
            // A filesystem without hole punching says so.
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
                return;
            }
        }
        for (p, b) in paths.iter().zip(&before) {
            let after = blocks(p);
            assert_eq!(b - after, 2 * stripe / 512, "{}: {b} blocks before, {after} after", p.display());
            assert_eq!(std::fs::metadata(p).unwrap().len(), member_bytes, "the size is kept");
        }
        let (b, r) = d.read_at(AlignedBuf::zeroed(size), 0);
        r.unwrap();
        let want = pattern(size, 9);
        assert!(b[..at] == want[..at] && b[at + len..] == want[at + len..], "outside the range intact");
        assert!(b[at..at + len].iter().all(|&x| x == 0), "the holes read as zeros");
        for m in d.members() {
            assert_eq!(m.counters().snapshot().discarded_bytes, 2 * stripe, "{}", m.describe());
        }
    }

    #[test]
    fn async_split_io_on_the_ring() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let members: Vec<Arc<dyn Device>> = (0..3)
            .map(|i| {
                let f = crate::FileDevice::create(
                    &dir.path().join(format!("m{i}")),
                    LABEL_BYTES + (1 << 20),
                    crate::OpenMode::Direct,
                )
                .unwrap()
                .with_backend(crate::IoBackend::Uring);
                Arc::new(f) as Arc<dyn Device>
            })
            .collect();
        let d = Arc::new(StripedDevice::create(members, 4096 * 4).unwrap());
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let d2 = d.clone();
        let ok = rt
            .block_on(async move {
                // 100 KiB from an unaligned-to-stripe offset: 8 pieces, all in flight at once.
                let data = pattern(100 * 1024, 11);
                let fut = d2.write_at_async(data, 3 * 4096);
                assert!(matches!(fut, IoFuture::Pending(_)), "on an executor the ring is used");
                let (_, r) = fut.await;
                r.unwrap();
                let (b, r) = d2.read_at_async(AlignedBuf::zeroed(100 * 1024), 3 * 4096).await;
                r.unwrap();
                b[..] == pattern(100 * 1024, 11)[..]
            })
            .unwrap();
        assert!(ok);
        // And the synchronous path sees the same bytes.
        let (b, r) = d.read_at(AlignedBuf::zeroed(100 * 1024), 3 * 4096);
        r.unwrap();
        assert_eq!(&b[..], &pattern(100 * 1024, 11)[..]);
    }
}
