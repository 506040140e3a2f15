//! Write coalescing (group commit; DIDACache's slab buffer): PUTs and
//! DELETEs that land next to each other in the open user segment share one
//! device write, and in `Flush` mode one fdatasync.
//!
//! At most one write of a joinable group of the user stream is in flight.
//! A writer allocates its grains and encodes its record into the *open
//! group* when its grains follow the group's last ones; otherwise it starts
//! a new group and leads it. A leader waits until no such write is in
//! flight, seals its group (nothing joins after that), writes it with one
//! IO (and one flush in `Flush` mode), and wakes the members. Every writer
//! returns only once the write holding its record has completed, so a
//! record is on the device before it is indexed and acknowledged, as
//! without coalescing.
//!
//! Under light load a group holds one record and costs what a direct write
//! does; under load, records arriving while a write is in flight form the
//! next group, so the IO count falls as the load rises, with no timer.
//!
//! A group of its own (an atomic batch, a run's piece, a record built in
//! its own buffer; nothing can join it, so waiting would merge nothing) is
//! written as soon as its leader has it, beside the writes in flight
//! (except in ordered mode, below): a run of many pieces keeps several
//! device writes in flight instead of one.
//!
//! A crash tears what was in flight: every record there is unacknowledged
//! and carries its own checksums (docs/FORMAT.md, "Recovery", on torn and
//! damaged records). Record writes are pending only in the two newest
//! segments of the stream (a writer that would open a segment waits while
//! an older one than the open one has a group to write; a segment summary,
//! written once its segment's last write ended, may be in flight in an
//! older one, but a torn summary fails its checks and is never used), where
//! recovery forgives torn records, and its scan steps over a torn or
//! unwritten record to the intact ones after it, so writes in flight
//! together may complete in any order.
//!
//! In zoned mode ([`Coalescer::ordered`]) groups are written in the order
//! their grains were allocated, so each write lands at its zone's write
//! pointer: a leader waits until the groups before it are written. Atomic
//! batches and runs of PUTs, which encode their own records, are allocated
//! and queued here too, each as a group of its own
//! ([`Coalescer::write_own`]).
//!
//! A group, once placed, is written even if futures waiting for it are
//! dropped: a leader whose future is dropped hands its write on
//! ([`crate::detach`]), and a member whose future is dropped leaves its
//! allocation to the group, which releases it once written
//! (`Group::orphan`). Only a runtime shutting down, which drops what was
//! handed to it, stops a group unwritten: its members still waiting fail,
//! and the store is poisoned where the group's IO was in flight or, in
//! zoned mode, where its unwritten grains leave a hole in the zone.
//!
//! Limits: the sync API must not be called on an executor thread (as
//! everywhere in the engine: it blocks the executor, and here other
//! writers with it).

use crate::detach::{Finish, Shared};
use crate::error::{Error, Result};
use crate::options::Durability;
use crate::space::{listed_bytes, Held, Loc, Purpose, Space};
use granary_format::record::RecordHeader;
use granary_io::{AlignedBuf, Device};
use std::sync::{Arc, Mutex, OnceLock};

/// Largest group, in bytes: a writer that would pass it starts a new group.
pub const GROUP_BYTES_MAX: usize = 256 * 1024;

/// A record built in its own buffer ([`crate::PutBuf`]) up to this size is
/// copied into a group (joining one under way, or starting one that others
/// join); a larger one is written from its own buffer, uncopied, as a group
/// of its own.
pub const OWNED_JOIN_BYTES_MAX: usize = 16 * 1024;

/// A group's records: encoded into a growing buffer that later writers
/// join, or one record in its own aligned buffer (not joinable).
enum Bytes {
    Shared(Vec<u8>),
    Owned(AlignedBuf),
}

type Failure = (&'static str, std::io::ErrorKind, String);

/// One group write.
struct Group {
    seg: u32,
    /// First pba of the group.
    start: u64,
    /// Encoded records, contiguous from `start`; taken when sealed.
    bytes: Mutex<Option<Bytes>>,
    /// The write's outcome; an error as (operation, kind, text), which
    /// each member turns into its own `Error::Io`.
    result: OnceLock<std::result::Result<(), Failure>>,
    done: event_listener::Event,
    /// Members whose futures were dropped before the outcome was known:
    /// their allocations are released once it is (`Group::finish`).
    orphans: Mutex<u32>,
}

impl Group {
    fn new(seg: u32, start: u64, bytes: Option<Bytes>) -> Group {
        Group {
            seg,
            start,
            bytes: Mutex::new(bytes),
            result: OnceLock::new(),
            done: event_listener::Event::new(),
            orphans: Mutex::new(0),
        }
    }

    /// Set the write's outcome (the first one set stands), wake the
    /// members and release the allocations of those no longer waiting.
    fn finish(&self, r: std::result::Result<(), Failure>, space: &Space) {
        if self.result.set(r).is_err() {
            return;
        }
        self.done.notify(usize::MAX);
        // After the outcome is set: a member that leaves later sees it.
        let n = std::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()));
        for _ in 0..n {
            space.done(self.seg);
        }
    }

    /// A writer's part of the group's outcome (set): its allocation, held
    /// while it indexes its record, or the write's error (the allocation
    /// released).
    fn outcome<'s>(&self, space: &'s Space, loc: Loc, grain: u64) -> Result<Held<'s>> {
        match self.result.get().expect("set by the leader") {
            Ok(()) => Ok(Held::new(space, loc)),
            Err((op, kind, msg)) => {
                space.done(loc.seg);
                Err(Error::Io { op, offset: self.start * grain, source: std::io::Error::new(*kind, msg.clone()) })
            }
        }
    }

    /// A member's future was dropped: its allocation is released now if
    /// the outcome is known, else by [`Group::finish`] (the group's write
    /// goes on: its records may land, so the grains stay held until then).
    fn orphan(&self, space: &Space) {
        let mut n = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        if self.result.get().is_some() {
            drop(n);
            space.done(self.seg);
        } else {
            *n += 1;
        }
    }
}

/// A writer's hold on its record in a group until it has the group's
/// outcome; dropped before (its future was), [`Group::orphan`], and the
/// writer's [`Stray`] is told the segment its record may land in.
struct Claim<'a> {
    group: &'a Group,
    space: &'a Space,
    waiting: bool,
    stray: Stray<'a>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.waiting {
            if let Some(list) = self.stray {
                list(self.group.seg);
            }
            self.group.orphan(self.space);
        }
    }
}

/// What a writer does with the segment its records may land in without
/// being indexed (its future dropped while they are written): list them
/// as versions of their keys the index does not point at (under the
/// keys' stripes, which the writer still holds as its future drops).
pub(crate) type Stray<'a> = Option<&'a (dyn Fn(u32) + Sync)>;

/// What a group write needs of the engine that owns the coalescer
/// (`store::Core`). A trait because `coalesce` lies below `store` in the
/// crate's layers, and a handed-on lead owns the engine by an `Arc`.
pub(crate) trait WriteEngine: Shared {
    fn coalescer(&self) -> &Coalescer;
    fn space(&self) -> &Space;
    fn device(&self) -> &dyn Device;
    fn durability(&self) -> Durability;
    /// Refuse writes from now on (a write's outcome is unknown).
    fn poison(&self, err: Error);
}

#[derive(Default)]
struct Inner {
    /// The group new writers may join.
    open: Option<Arc<Group>>,
    /// A write of a joinable group (in ordered mode: of any group) is in
    /// flight.
    busy: bool,
    /// Groups not yet written, per segment.
    pending: std::collections::HashMap<u32, usize>,
    /// With [`Coalescer::ordered`]: the groups not yet written, in the
    /// order their first grains were allocated; only the first may write.
    queue: std::collections::VecDeque<Arc<Group>>,
}

impl Inner {
    fn finished(&mut self, seg: u32) {
        if let Some(n) = self.pending.get_mut(&seg) {
            *n -= 1;
            if *n == 0 {
                self.pending.remove(&seg);
            }
        }
    }
}

/// What one placement attempt gave.
enum Placed {
    /// The group, whether this writer leads it, and the record's place.
    Done(Result<(Arc<Group>, bool, Loc)>),
    /// Wait for a group write to finish, then try again.
    Wait(event_listener::EventListener),
}

#[derive(Default)]
pub(crate) struct Coalescer {
    inner: Mutex<Inner>,
    idle: event_listener::Event,
    /// Group writes issued and records written by them (stats).
    pub groups: std::sync::atomic::AtomicU64,
    pub records: std::sync::atomic::AtomicU64,
    /// Groups are written in allocation order, one at a time (zoned mode:
    /// each write must land at its zone's write pointer). Otherwise the
    /// first leader to find the stream idle writes.
    pub ordered: std::sync::atomic::AtomicBool,
}

impl Coalescer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocate and encode one user record, then return once the group
    /// write holding it has completed, with its allocation (released when
    /// the caller is done with it). `hdr.seg_stamp` is set here. `self` is
    /// `core`'s coalescer.
    ///
    /// Dropped midway, the write still ends (the group is written, its
    /// leader's part handed on: [`crate::detach`]); the record may then
    /// land or not, and its allocation is released once the group is.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write<'s, E: WriteEngine>(
        &self,
        core: &'s E,
        purpose: Purpose,
        seed: u32,
        grain: u64,
        next_seq: u64,
        mut hdr: RecordHeader,
        key: &[u8],
        mut value: Payload<'_>,
        stray: Stray<'_>,
    ) -> Result<Held<'s>> {
        let space = core.space();
        let (group, leader, loc) = loop {
            // Either the placed record, or a listener to wait on (the lock
            // is released before waiting).
            let wait = match self.place(space, purpose, seed, grain, next_seq, &mut hdr, key, value.reborrow()) {
                Placed::Done(r) => break r?,
                Placed::Wait(l) => l,
            };
            wait.await;
        };
        let mut claim = Claim { group: &group, space, waiting: true, stray };
        self.records.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if leader {
            lead_to_end(core, &group, grain).await;
        } else {
            loop {
                let l = group.done.listen();
                if group.result.get().is_some() {
                    break;
                }
                l.await;
            }
        }
        claim.waiting = false;
        group.outcome(space, loc, grain)
    }

    /// One attempt to allocate and encode a record under the lock.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        space: &Space,
        purpose: Purpose,
        seed: u32,
        grain: u64,
        next_seq: u64,
        hdr: &mut RecordHeader,
        key: &[u8],
        value: Payload<'_>,
    ) -> Placed {
        let grains = hdr.grains(grain as u32);
        let bytes = (grains * grain) as usize;
        let mut inner = self.lock();
        let loc = match self.alloc_locked(&inner, space, purpose, grains, listed_bytes([key]), next_seq) {
            Ok(loc) => loc,
            Err(placed) => return placed,
        };
        hdr.seg_stamp = loc.stamp;
        let joins = match &value {
            Payload::Slice(_) => true,
            Payload::Owned { .. } => bytes <= OWNED_JOIN_BYTES_MAX,
        };
        let joinable = inner.open.as_ref().filter(|g| {
            let b = g.bytes.lock().unwrap_or_else(|e| e.into_inner());
            joins
                && g.seg == loc.seg
                && matches!(b.as_ref(), Some(Bytes::Shared(b))
                    if g.start + (b.len() as u64 / grain) == loc.pba && b.len() + bytes <= GROUP_BYTES_MAX)
        });
        if let Some(g) = joinable {
            let g = g.clone();
            let mut b = g.bytes.lock().unwrap_or_else(|e| e.into_inner());
            let Some(Bytes::Shared(v)) = b.as_mut() else { unreachable!("checked joinable under the lock") };
            let at = v.len();
            v.resize(at + bytes, 0);
            encode(hdr, seed, key, value, &mut v[at..]);
            drop(b);
            return Placed::Done(Ok((g, false, loc)));
        }
        let (b, joinable) = match value {
            Payload::Owned { buf, .. } if !joins => {
                let mut b = buf.take().expect("a record buffer");
                hdr.encode_in_place(seed, &mut b);
                (Bytes::Owned(b), false)
            }
            // A small record, even one built in its own buffer, starts a
            // group that later writers can join: alone in a group of its own
            // it would hold the stream for a whole write, and concurrent
            // small PUTs would be written one at a time.
            value => {
                let mut v = vec![0u8; bytes];
                encode(hdr, seed, key, value, &mut v);
                (Bytes::Shared(v), true)
            }
        };
        let g = Arc::new(Group::new(loc.seg, loc.pba, Some(b)));
        // A group in its own buffer takes no one; the open group (if any)
        // no longer ends where the next record starts either.
        inner.open = joinable.then(|| g.clone());
        if self.ordered.load(std::sync::atomic::Ordering::Relaxed) {
            inner.queue.push_back(g.clone());
        }
        *inner.pending.entry(loc.seg).or_default() += 1;
        space.group_placed(loc.seg);
        Placed::Done(Ok((g, true, loc)))
    }

    /// Allocate `grains` for records a caller encodes itself (`encode`,
    /// given their place: an atomic batch, a run of PUTs; `records` user
    /// records, counted as a group's), and write them as a group of their
    /// own, which no one joins; returns once it is written. The allocation
    /// is made under the coalescer's lock and the group queued as any
    /// other, so in ordered (zoned) mode it is written in allocation order
    /// among the single writes' groups, at its zone's write pointer. On success the caller indexes the records, holding
    /// the allocation (released when it is dropped), and has the buffer
    /// back to reuse; on failure the allocation was released. Dropped
    /// midway, the write still ends, as [`Coalescer::write`]'s does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_own<'s, E: WriteEngine>(
        &self,
        core: &'s E,
        purpose: Purpose,
        grain: u64,
        next_seq: u64,
        grains: u64,
        listed: u64,
        records: u64,
        encode: impl FnOnce(&Loc) -> AlignedBuf,
        stray: Stray<'_>,
    ) -> Result<(Held<'s>, Option<AlignedBuf>)> {
        let space = core.space();
        let (group, loc) = loop {
            let wait = match self.place_own(space, purpose, grains, listed, next_seq) {
                Placed::Done(r) => break r.map(|(g, _, loc)| (g, loc))?,
                Placed::Wait(l) => l,
            };
            wait.await;
        };
        // No await between the placement and `lead_to_end`, which writes the
        // group to its end: the queued group always gets its bytes and a
        // result.
        let mut claim = Claim { group: &group, space, waiting: true, stray };
        self.records.fetch_add(records, std::sync::atomic::Ordering::Relaxed);
        let buf = encode(&loc);
        *group.bytes.lock().unwrap_or_else(|e| e.into_inner()) = Some(Bytes::Owned(buf));
        lead_to_end(core, &group, grain).await;
        claim.waiting = false;
        let held = group.outcome(space, loc, grain)?;
        let buf = match group.bytes.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(Bytes::Owned(b)) => Some(b),
            _ => None,
        };
        Ok((held, buf))
    }

    /// Space for `grains` in `purpose`'s stream, allocated under the
    /// coalescer's lock (`inner`), or what the placing writer returns
    /// instead. Writes may be pending only in the two newest segments of
    /// the stream (recovery forgives torn records there and reports them as
    /// corruption elsewhere): a writer that would open a new segment waits
    /// while a segment older than the open one still has a group to write.
    fn alloc_locked(
        &self,
        inner: &Inner,
        space: &Space,
        purpose: Purpose,
        grains: u64,
        listed: u64,
        next_seq: u64,
    ) -> std::result::Result<Loc, Placed> {
        if let Some(open_seg) = space.would_roll(purpose, grains, listed) {
            // The rule is per stream (recovery's torn-write rule is): a
            // group pending in another stream's segment (SepBIT's two user
            // streams share this coalescer) does not hold this one back.
            let stream = purpose.stream();
            if inner.pending.keys().any(|&s| s != open_seg && space.is_of_stream(s, stream)) {
                return Err(Placed::Wait(self.idle.listen()));
            }
        }
        space.alloc(purpose, grains, listed, next_seq).map_err(|e| Placed::Done(Err(e)))
    }

    /// [`Coalescer::place`] for [`Coalescer::write_own`]: the group is
    /// queued with no bytes yet (its leader fills them before leading).
    fn place_own(&self, space: &Space, purpose: Purpose, grains: u64, listed: u64, next_seq: u64) -> Placed {
        let mut inner = self.lock();
        let loc = match self.alloc_locked(&inner, space, purpose, grains, listed, next_seq) {
            Ok(loc) => loc,
            Err(placed) => return placed,
        };
        let g = Arc::new(Group::new(loc.seg, loc.pba, None));
        inner.open = None;
        if self.ordered.load(std::sync::atomic::Ordering::Relaxed) {
            inner.queue.push_back(g.clone());
        }
        *inner.pending.entry(loc.seg).or_default() += 1;
        space.group_placed(loc.seg);
        Placed::Done(Ok((g, true, loc)))
    }
}

/// Lead `group`'s write ([`lead`]) to its end, even if this future is
/// dropped: the write is then handed on ([`crate::detach`]).
async fn lead_to_end<E: WriteEngine>(core: &E, group: &Arc<Group>, grain: u64) {
    match core.shared() {
        Some(shared) => Finish::new(core, Box::pin(lead(shared, group.clone(), grain)), None).await,
        None => lead(core, group.clone(), grain).await,
    }
}

/// Wait for the stream to be idle (a group of its own, unordered: not even
/// that), seal `group`, write it, wake its members. If this future itself
/// is dropped before the write completes (a runtime shutting down drops a
/// handed-on lead), the members are told the write failed (they were not
/// acknowledged) and the stream is released; dropped with its IO in
/// flight, it first poisons the store: that IO may still land, so no
/// segment it writes may be reused (a poisoned store allocates nothing and
/// GC stops). In ordered (zoned) mode a group dropped before its IO
/// poisons it too: its grains, never written, leave a hole before the
/// zone's write pointer, which every later write of the stream would meet.
async fn lead<E: WriteEngine, C: std::ops::Deref<Target = E>>(core: C, group: Arc<Group>, grain: u64) {
    struct Abandon<'a, E: WriteEngine> {
        core: &'a E,
        group: &'a Arc<Group>,
        grain: u64,
        busy: bool,
        /// Its IO was submitted.
        in_flight: bool,
    }
    impl<E: WriteEngine> Drop for Abandon<'_, E> {
        fn drop(&mut self) {
            let (c, space) = (self.core.coalescer(), self.core.space());
            if self.group.result.get().is_none() {
                let what = match (self.in_flight, c.ordered.load(std::sync::atomic::Ordering::Relaxed)) {
                    (true, _) => {
                        Some("a group write was dropped in flight (its runtime shut down): its outcome is unknown")
                    }
                    (false, true) => Some(
                        "a zoned group write was dropped before its IO (its runtime shut down): its zone holds a hole",
                    ),
                    (false, false) => None,
                };
                if let Some(what) = what {
                    self.core.poison(crate::detach::dropped(self.group.start * self.grain, what));
                }
            }
            // First close the group to joiners (under the lock that
            // joining takes), then fail whoever joined before (nothing if
            // the write ended: its outcome was set).
            let mut inner = c.lock();
            if inner.open.as_ref().is_some_and(|g| Arc::ptr_eq(g, self.group)) {
                inner.open = None;
            }
            if self.busy {
                inner.busy = false;
            }
            inner.queue.retain(|g| !Arc::ptr_eq(g, self.group));
            inner.finished(self.group.seg);
            drop(inner);
            space.group_written(self.group.seg);
            let cancelled = ("write", std::io::ErrorKind::Interrupted, "the leading write was cancelled".into());
            self.group.finish(Err(cancelled), space);
            c.idle.notify(usize::MAX);
        }
    }
    let (c, space, dev, durability) = (core.coalescer(), core.space(), core.device(), core.durability());
    let group = &group;
    let mut guard = Abandon { core: &*core, group, grain, busy: false, in_flight: false };
    // A group of its own (its bytes, set before it is led, are its
    // record's own buffer) holds no joiners to wait for; in ordered
    // mode it still waits its turn (`first`) and for the write before
    // it to end.
    let own = !c.ordered.load(std::sync::atomic::Ordering::Relaxed)
        && matches!(group.bytes.lock().unwrap_or_else(|e| e.into_inner()).as_ref(), Some(Bytes::Owned(_)));
    let bytes = loop {
        let listener = {
            let mut inner = c.lock();
            let first = inner.queue.front().is_none_or(|g| Arc::ptr_eq(g, group));
            if (own || !inner.busy) && first {
                if !own {
                    inner.busy = true;
                    guard.busy = true;
                }
                if inner.open.as_ref().is_some_and(|g| Arc::ptr_eq(g, group)) {
                    inner.open = None;
                }
                break group.bytes.lock().unwrap_or_else(|e| e.into_inner()).take().expect("sealed once");
            }
            c.idle.listen()
        };
        listener.await;
    };
    let (buf, owned) = match bytes {
        Bytes::Shared(v) => {
            let mut buf = AlignedBuf::zeroed(v.len());
            buf.copy_from_slice(&v);
            (buf, false)
        }
        Bytes::Owned(b) => (b, true),
    };
    let offset = group.start * grain;
    space.summarize(group.start, &buf);
    guard.in_flight = true;
    let (buf, r) = dev.write_at_async(buf, offset).await;
    if owned {
        // Back to its owner (`write_own`'s caller may reuse it); a
        // sealed group is never read again.
        *group.bytes.lock().unwrap_or_else(|e| e.into_inner()) = Some(Bytes::Owned(buf));
    }
    let r = match (r, durability) {
        (Err(e), _) => Err(("write", e.kind(), e.to_string())),
        // On an executor the flush goes through its ring: the
        // executor serves its other tasks meanwhile.
        (Ok(()), Durability::Flush) => dev.flush_async().await.map_err(|e| ("flush", e.kind(), e.to_string())),
        (Ok(()), Durability::Direct) => Ok(()),
    };
    group.finish(r, space);
    c.groups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    drop(guard); // releases the stream
}

/// Encode a record into `out` (a group's buffer): from its parts, or by
/// copying a record built in its own buffer and setting its header there.
fn encode(hdr: &RecordHeader, seed: u32, key: &[u8], value: Payload<'_>, out: &mut [u8]) {
    match value {
        Payload::Slice(value) => hdr.encode(seed, key, value, out),
        Payload::Owned { buf, .. } => {
            let b = buf.as_ref().expect("a record buffer");
            out.copy_from_slice(&b[..out.len()]);
            hdr.encode_in_place(seed, out);
        }
    }
}

/// The value of a record to write: borrowed bytes, encoded (copied) into
/// the write buffer; or a record already built in place in an aligned
/// buffer ([`crate::PutBuf`]): up to [`OWNED_JOIN_BYTES_MAX`] copied into
/// a group's buffer, larger taken from its option once the write has its
/// room (a refusal for room, the only error a retry follows, comes
/// before) and written as it is, as a group of its own; not given back.
pub(crate) enum Payload<'a> {
    Slice(&'a [u8]),
    Owned { buf: &'a mut Option<AlignedBuf>, value_len: u64 },
}

impl Payload<'_> {
    pub fn value_len(&self) -> u64 {
        match self {
            Payload::Slice(v) => v.len() as u64,
            Payload::Owned { value_len, .. } => *value_len,
        }
    }
    pub fn reborrow(&mut self) -> Payload<'_> {
        match self {
            Payload::Slice(v) => Payload::Slice(v),
            Payload::Owned { buf, value_len } => Payload::Owned { buf, value_len: *value_len },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Background, CreateOptions, OpenOptions, Store};

    /// SepBIT's two user streams share the coalescer: a group pending in
    /// the short-lived stream's segment must not hold back a user write
    /// that opens the user stream's next segment (the wait before a roll
    /// is for the writer's own stream; waiting for the other would starve
    /// the user stream under steady short-lived load).
    #[test]
    fn a_group_pending_in_one_stream_does_not_hold_back_a_roll_of_another() {
        let dev = std::sync::Arc::new(granary_io::MemDevice::new(8 << 20));
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
        let o = OpenOptions { gc_sepbit: true, background: Background::Manual, ..OpenOptions::default() };
        let s = Store::create(dev, &c, &o).unwrap();
        s.put(b"k", b"v1").unwrap();
        s.put(b"k", b"v2").unwrap();
        assert_eq!(s.stats().short_segments_opened, 1, "the overwrite went to the short-lived stream");
        let (core, space) = (&s.core, &s.core.space);
        let next_seq = core.log.next_seq.load(std::sync::atomic::Ordering::Relaxed);
        // A short-lived group placed and not yet written: pending.
        let Placed::Done(Ok((_short, _, at))) = core.coalescer.place_own(space, Purpose::PutShort, 1, 0, next_seq)
        else {
            panic!("the short-lived group is placed")
        };
        assert!(space.is_of_stream(at.seg, granary_format::segment::Stream::UserShort));
        // A user write of a whole segment: the user stream must roll.
        let whole = core.log.sb.segment_grains() - 1;
        assert!(space.would_roll(Purpose::Put, whole, 0).is_some());
        match core.coalescer.place_own(space, Purpose::Put, whole, 0, next_seq) {
            Placed::Done(Ok((_, _, loc))) => {
                assert!(space.is_of_stream(loc.seg, granary_format::segment::Stream::User))
            }
            Placed::Done(Err(e)) => panic!("{e}"),
            Placed::Wait(_) => panic!("the user stream's roll waited for the short-lived stream's group"),
        }
    }
}
