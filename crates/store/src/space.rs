//! Space: segments of grains, the open segment of each stream, free
//! segments, per-segment live bytes, and the hand-off between writers that
//! need space and the garbage collector that makes it.
//!
//! Owns the state of every segment (free, open, closed), the sequential
//! allocator of each stream's open segment (user writes and GC relocations
//! never share a segment, so hot and cold data do not mix), and per-segment
//! figures read without the lock: live bytes (grains of records the index
//! points at), the stamp and the full alloc_seq of the segment's current use.
//!
//! Invariants:
//! - Opening a segment writes its header before any record is allocated in
//!   it, so a record on the device always sits in a segment whose header is
//!   there already.
//! - With GC on, user PUTs never take the last [`RESERVED_SEGMENTS`] free
//!   segments (one more with hot/cold relocation, whose two GC streams may
//!   each need a fresh segment, three more with SepBIT placement's four:
//!   GC needs somewhere to relocate live data to), and DELETEs never take the very last one (see [`Purpose`]).
//! - A writer that needs space does not hold a key stripe while it waits
//!   ([`Space::await_room`]), because GC takes stripes to relocate.
//! - A segment goes back to the free list only after its header was
//!   rewritten as free (kept alloc_seq) on the device; in zoned mode, only
//!   after its zones were reset (a free segment's zones are empty, so its
//!   header lands at the write pointer), and a closed segment's zones are
//!   finished once no write to it is in flight.

use crate::error::{Error, Result};
use crate::options::{Durability, GcPolicy, Watermark};
use granary_format::limits::SUPERBLOCK_OFFSETS;
use granary_format::segment::{SegmentHeader, SegmentKind, Stream};
use granary_format::summary;
use granary_format::Superblock;
use granary_io::{AlignedBuf, Device};
use std::collections::BTreeSet;
use std::sync::atomic::{
    AtomicU32, AtomicU64, AtomicU8, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A GC victim must free at least this fraction (1/N) of a segment.
pub const GC_MIN_GAIN_DIVISOR: u64 = 16;

/// SepBIT's lifetime threshold averages about this many of the latest
/// reclaimed short-lived segments (an exponential average, weight 1/N).
const SHORT_LIFETIME_WINDOW: u64 = 16;

/// [`Watermark::Compact`] compacts only segments at most this share
/// live (4/5): each reclaim frees at least a fifth of a segment, so the
/// room it makes costs at most four segments relocated per segment freed
/// (on `granary-bench churn --burst`, compacting segments up to 15/16
/// live wrote about a third more for no lower latency, and up to half
/// live left too little room).
pub const COMPACT_LIVE_NUMERATOR: u64 = 4;
pub const COMPACT_LIVE_DENOMINATOR: u64 = 5;

/// Free segments only GC may take (see the module invariants); stores of
/// fewer than 8 segments reserve one.
pub const RESERVED_SEGMENTS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegState {
    Free,
    Open,
    Closed,
    /// Holds the current index checkpoint.
    Index,
}

/// Where a record was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub pba: u64,
    pub seg: u32,
    pub stamp: u32,
    pub grains: u64,
}

/// An allocation whose write has ended: released with [`Space::done`] when
/// dropped, so a write whose future is dropped while it indexes its
/// records still releases its segment.
#[must_use]
pub(crate) struct Held<'a> {
    space: &'a Space,
    loc: Loc,
}

impl<'a> Held<'a> {
    pub(crate) fn new(space: &'a Space, loc: Loc) -> Held<'a> {
        Held { space, loc }
    }

    pub(crate) fn loc(&self) -> Loc {
        self.loc
    }

    /// The allocation, no longer released by this guard: the caller calls
    /// [`Space::done`] itself (tests that place records by hand).
    #[cfg(test)]
    pub(crate) fn keep(self) -> Loc {
        let loc = self.loc;
        std::mem::forget(self);
        loc
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.space.done(self.loc.seg);
    }
}

#[derive(Debug)]
struct OpenSeg {
    seg: u32,
    /// Next free grain, counted from the segment's start (grain 0 is the header).
    next: u64,
    stamp: u32,
    /// Bytes of summary entries the records allocated so far need (room
    /// for the summary is kept at the segment's end), or None: this
    /// segment gets no summary.
    listed: Option<u64>,
}

/// The summary of a segment being written: the entries of the records
/// written into it, in the order they were written ([`Space::summarize`]).
struct Gather {
    stamp: u32,
    /// Encoded entries (`granary_format::summary` layout), unsorted.
    entries: Vec<u8>,
    /// Where its records end, once the segment is closed.
    end: Option<u64>,
    /// A written buffer did not parse as records: no summary.
    spoiled: bool,
}

/// Why space is allocated: decides the stream and how much of GC's reserve
/// may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// User PUTs: never touch the reserve.
    Put,
    /// User PUTs expected to die young ([`Space::put_purpose`]): as
    /// `Put`, in the short-lived user stream.
    PutShort,
    /// User DELETEs, and the engine's records that empty a namespace (a
    /// drop's or truncate's catalog, a flush floor) or that a close or a
    /// repair writes (`Core::write_item`'s `room`): may use all of the
    /// reserve but one segment, so a store full of live data can still be
    /// emptied (each delete makes garbage that GC then reclaims with the
    /// last reserved segment).
    Delete,
    /// GC relocation: may use everything.
    Relocate,
    /// GC cleaning a cache's victim (relocating its live values instead of
    /// evicting them): may use all free segments but one, which stays for
    /// evictions. Evicting a victim writes at most a segment (a tombstone
    /// or kept record is never larger than the record it stands for) and
    /// then frees it, so with that one segment left a cache can always
    /// evict. Cleanings that fail half-way must not spend it, or no
    /// eviction could write its tombstones and the cache would refuse writes.
    Clean,
}

impl Purpose {
    pub(crate) fn stream(self) -> Stream {
        match self {
            Purpose::Put | Purpose::Delete => Stream::User,
            Purpose::PutShort => Stream::UserShort,
            Purpose::Relocate | Purpose::Clean => Stream::Relocation,
        }
    }
}

/// What the GC thread should do next.
pub(crate) enum GcWork {
    /// Reclaim one victim; answer requests up to this number if none is found.
    Reclaim(u64),
    /// Sweep one segment (its alloc_seq when queued) for the records of
    /// dropped namespaces ([`Space::request_sweep`]).
    Sweep(u32, u64),
    /// [`Watermark::Compact`]: reclaim a segment at most 4/5 live by
    /// relocating its live data, never evicting (free space is below the
    /// compaction target and no burst is on).
    Compact,
    Exit,
}

struct Inner {
    state: Vec<SegState>,
    /// When each closed segment was closed (a counter): GC's age.
    closed_at: Vec<u64>,
    closes: u64,
    free: BTreeSet<u32>,
    open: [Option<OpenSeg>; 6],
    /// The stream each segment in use was opened for.
    stream: Vec<Stream>,
    next_alloc_seq: u64,
    /// GC on: user writes respect the reserve and wait for GC.
    gc: bool,
    /// The store was opened with GC: checkpoints leave the reserve alone
    /// even once GC has stopped (a clean close), for the next open's GC.
    gc_opened: bool,
    /// Writers' requests for space (a counter); the last request GC has
    /// served (free space rose above the reserve, or it gave up); the last
    /// one it gave up on, finding nothing to reclaim. A writer fails with
    /// NoSpace only on the latter: space it was served can be taken again.
    requested: u64,
    served: u64,
    gave_up: u64,
    /// GC found no victim and nothing changed since.
    stuck: bool,
    /// GC is between its low and high watermark.
    collecting: bool,
    /// [`Watermark::Compact`]: compaction found no victim (or no room to
    /// relocate to) and no segment closed since.
    compact_stuck: bool,
    /// Segments GC failed on and leaves alone.
    pinned: Vec<bool>,
    /// Where the watermarks are.
    provision: Provision,
    shutdown: bool,
    /// Segments (and their alloc_seq) still to sweep for dropped
    /// namespaces' records.
    sweep: std::collections::VecDeque<(u32, u64)>,
}

pub(crate) struct Space {
    dev: Arc<dyn Device>,
    sb: Superblock,
    durability: Durability,
    live: Box<[AtomicU64]>,
    stamps: Box<[AtomicU32]>,
    alloc_seqs: Box<[AtomicU64]>,
    /// Allocations in each segment whose record is not yet written and
    /// indexed ([`Space::done`]); GC never picks a segment with any.
    inflight: Box<[AtomicU32]>,
    /// Zoned mode: per segment, the write coalescer's groups placed in it
    /// whose device write has not ended ([`Space::group_placed`]). A
    /// closed segment of a coalesced stream whose groups are all written
    /// takes no more writes: its zones are finished then, not once its
    /// records are indexed too (which may take a while, and the stream
    /// meanwhile opens further zones: three open in one stream went past
    /// the two per stream the store asks of the device).
    writing: Box<[AtomicU32]>,
    /// Cache mode's LRU clock: the close counter when each segment was last
    /// read from (or closed). `tick` mirrors `Inner::closes` for lock-free
    /// reads, so a hit costs a load and at most one store.
    touched: Box<[AtomicU64]>,
    tick: AtomicU64,
    inner: Mutex<Inner>,
    cond: Condvar,
    /// Wakes writers waiting for room (async or parked in block_on); the
    /// condvar wakes the GC thread. Both are signalled under `inner`.
    room: event_listener::Event,
    /// The fixed low watermark (index checkpoints leave this many free
    /// segments to GC, whatever the watermark policy).
    low_watermark: usize,
    reserve: usize,
    policy: GcPolicy,
    hot_cold: bool,
    sepbit: bool,
    /// SepBIT's clock: the highest next sequence number an allocation
    /// was made at (sequence numbers count user writes).
    seq_clock: AtomicU64,
    /// The next sequence number when each segment in use was opened
    /// (its header's `first_seq`).
    first_seqs: Box<[AtomicU64]>,
    /// `Inner::stream` of each segment (its [`stream_index`]), readable
    /// without the lock.
    seg_streams: Box<[AtomicU8]>,
    /// SepBIT's lifetime threshold, in sequence numbers: the average
    /// lifetime (opened to freed) of the short-lived user stream's segments
    /// GC reclaimed lately; `u64::MAX` until one was.
    short_lifetime: AtomicU64,
    /// Segments opened for the short-lived user stream.
    short_opened: AtomicU64,
    /// User writes that waited for GC to make room, and the microseconds
    /// they waited, together.
    room_waits: AtomicU64,
    room_wait_us: AtomicU64,
    /// Discard freed segments; cleared at the first discard that fails
    /// (a device or filesystem without discard says so once).
    discard: std::sync::atomic::AtomicBool,
    /// Zoned mode (the device is zoned): each segment is whole zones, a
    /// closed segment's zones are finished once its writes are done, a
    /// freed one's reset (docs/ARCHITECTURE.md, "Zoned mode").
    zoned: Option<granary_io::ZoneGeometry>,
    /// Zoned mode: segments recovery found a torn record in, which it
    /// cannot clear in place; the open reclaims them.
    torn: Mutex<Vec<u32>>,
    /// Torn records recovery left in place (`OpenOptions::clear_torn`
    /// off), as (segment, grain): `verify` counts them as torn.
    kept_torn: Mutex<Vec<(u32, u64)>>,
    /// The record checksum seed (summaries are checksummed with it).
    seed: u32,
    /// Superblock feature flags turned on ([`Space::enable_feature`]).
    features: Mutex<u32>,
    /// Summaries being gathered, by segment: open segments, and closed
    /// ones with writes in flight. None: summaries are off.
    summaries: Option<Mutex<std::collections::HashMap<u32, Gather>>>,
    /// Set when a segment with a summary being gathered closes (see
    /// [`Space::done`]).
    closing: Box<[std::sync::atomic::AtomicBool]>,
    /// Whether a summary is being gathered for each segment (the map
    /// holds it): writers to a segment without one skip the parse.
    gathering: Box<[std::sync::atomic::AtomicBool]>,
    /// The largest summary region, in grains.
    summary_max: u64,
    /// Summaries written, and their bytes.
    summaries_written: AtomicU64,
    summary_bytes: AtomicU64,
}

/// Bytes of the summary entries of records with `keys`: what
/// [`Space::alloc`] keeps room for. A key no summary can list counts as
/// more than any summary holds, so its segment gets none.
pub(crate) fn listed_bytes<'k>(keys: impl IntoIterator<Item = &'k [u8]>) -> u64 {
    keys.into_iter().map(|k| summary::entry_bytes(k.len()).unwrap_or(u64::MAX)).fold(0, u64::saturating_add)
}

/// How good a victim a segment is under `policy` (higher is better):
/// `live` of `usable` bytes live, closed `age` segment closes ago.
///
/// Greedy: the fewest live bytes. Cost-benefit (LFS): reclaiming costs
/// reading the segment and writing its live share `u` (`1 + u`), and gains
/// `1 - u` of free space, for as long as it stays free, which the
/// segment's age predicts (data not overwritten for long will likely stay
/// so): `(1 - u) * age / (1 + u)`. Age is counted in segments closed
/// since (any stream's), a clock that runs with the writes; a segment of
/// relocated data is as old as its relocation, not its records (measured
/// on `granary-bench churn`, counting its records' own age instead
/// cleaned the relocated data more often and amplified more). After a
/// restart the segments found close in alloc_seq order, so their ages
/// keep their order.
pub(crate) fn victim_score(policy: GcPolicy, live: u64, usable: u64, age: u64) -> f64 {
    match policy {
        GcPolicy::Greedy => -(live as f64),
        GcPolicy::CostBenefit => {
            let u = (live as f64 / usable as f64).min(1.0);
            (1.0 - u) * (age as f64 + 1.0) / (1.0 + u)
        }
    }
}

/// What recovery found about one segment.
pub(crate) struct SegmentFound {
    pub seg: u32,
    pub alloc_seq: u64,
    pub stream: Stream,
    /// Its header's `first_seq`.
    pub first_seq: u64,
}

fn stream_index(s: Stream) -> usize {
    match s {
        Stream::User => 0,
        Stream::Relocation => 1,
        Stream::Cold => 2,
        Stream::UserShort => 3,
        Stream::Older => 4,
        Stream::Oldest => 5,
    }
}

/// How GC picks victims ([`Space::new`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GcConfig {
    pub gc: bool,
    pub policy: GcPolicy,
    /// Old records GC relocates go to the cold stream.
    pub hot_cold: bool,
    /// User PUTs expected to die young go to the short-lived user stream
    /// (SepBIT placement, [`Space::put_purpose`]).
    pub sepbit: bool,
    pub watermark: Watermark,
    /// Discard the records of each segment freed.
    pub discard: bool,
    /// Write a summary at the end of each KV segment
    /// ([`granary_format::summary`]).
    pub summaries: bool,
}

/// Weight of each new sample in the averaged rates of [`Provision`]: of
/// each reclaim's time, and of each [`FILL_TICK`] of the fill rate (so a
/// burst's rate is remembered for a few seconds after it ends, and a
/// quiet minute brings it to nothing).
const RATE_EWMA: f64 = 0.2;

/// The fill rate is counted over windows of this many seconds at least.
const FILL_TICK: f64 = 1.0;

/// User writes that open a segment at least every this many reclaims'
/// time are a burst ([`Provision::bursting`])...
const BURST_RECLAIMS: f64 = 4.0;

/// ...or at least every this many seconds: a burst on a disk whose
/// writes stall now and then (a few milliseconds) is one burst, not
/// several with compaction's IO between them.
const BURST_GAP_MIN: f64 = 0.05;

/// GC's watermarks: fixed, or following the write rate ([`Watermark`]).
/// Time is passed in, so the model is tested with made-up clocks.
#[derive(Debug)]
pub(crate) struct Provision {
    mode: Watermark,
    min: usize,
    max: usize,
    low: usize,
    /// User segments filled per second (averaged over windows of
    /// [`FILL_TICK`]), and the window being counted: since when, how many.
    lambda: Option<f64>,
    window: Option<(Instant, u64)>,
    /// Averaged seconds GC took to reclaim a segment.
    reclaim_secs: Option<f64>,
    /// A writer waited for GC since GC last reached the high watermark.
    waited: bool,
    /// When user writes last opened a segment ([`Provision::bursting`]).
    last_fill: Option<Instant>,
    /// Segments user writes opened in the current run (each less than
    /// [`Provision::burst_gap`] after the one before), and the largest
    /// run of late (each new run's end weighs it down by a quarter).
    run: usize,
    peak: Option<usize>,
    /// [`Watermark::Compact`]'s largest target: half of the segments.
    ceiling: usize,
}

impl Provision {
    /// Watermarks for a store of `segments` (the fixed low one: `fixed`)
    /// whose writers keep `reserve` segments for GC: the low watermark
    /// stays two above the reserve, so GC starts before writers wait.
    pub(crate) fn new(mode: Watermark, segments: usize, fixed: usize, reserve: usize) -> Provision {
        let min = (reserve + 2).min(fixed);
        let max = (segments / 4).max(fixed);
        let low = if matches!(mode, Watermark::Fixed | Watermark::Compact) { fixed } else { min };
        Provision {
            mode,
            min,
            max,
            low,
            lambda: None,
            window: None,
            reclaim_secs: None,
            waited: false,
            last_fill: None,
            run: 0,
            peak: None,
            ceiling: (segments / 2).max(fixed),
        }
    }

    pub(crate) fn low(&self) -> usize {
        self.low
    }

    /// The high watermark: GC, once started, goes on until this many
    /// segments are free (hysteresis).
    pub(crate) fn high(&self) -> usize {
        self.low + (self.low / 2).max(2)
    }

    /// [`Watermark::Compact`]: GC compacts (reclaims segments by
    /// relocating, never evicting) while fewer than this many segments
    /// are free: none during a burst ([`Provision::bursting`]), else the
    /// high watermark plus the largest burst of late (a quarter of the
    /// segments before any), so the next burst finds its room free; at
    /// most half of the segments. Zero (never) for the other policies.
    pub(crate) fn compact_target(&self, now: Instant) -> usize {
        if self.mode != Watermark::Compact || self.bursting(now) {
            return 0;
        }
        let burst = match self.peak {
            Some(p) => p.max(self.run),
            None if self.run >= 2 => self.run,
            None => self.max,
        };
        (self.high() + burst).min(self.ceiling)
    }

    /// The longest time between two segments user writes open that still
    /// counts as a burst: [`BURST_RECLAIMS`] reclaims (writes that fill
    /// segments faster than that would meet compaction's IO on most of
    /// their segments), at least [`BURST_GAP_MIN`].
    fn burst_gap(&self) -> f64 {
        self.reclaim_secs.map_or(BURST_GAP_MIN, |r| (r * BURST_RECLAIMS).max(BURST_GAP_MIN))
    }

    /// Whether user writes are in a burst at `now`: they opened a segment
    /// less than [`Provision::burst_gap`] ago (a burst ends as soon as that
    /// much time passes with no segment filled).
    pub(crate) fn bursting(&self, now: Instant) -> bool {
        let Some(last) = self.last_fill else { return false };
        now.saturating_duration_since(last).as_secs_f64() < self.burst_gap()
    }

    /// While a burst holds compaction off: how long until it ends if no
    /// segment is filled meanwhile (GC looks again then).
    pub(crate) fn burst_ends_in(&self, now: Instant) -> Option<Duration> {
        if self.mode != Watermark::Compact || !self.bursting(now) {
            return None;
        }
        let since = now.saturating_duration_since(self.last_fill?).as_secs_f64();
        Some(Duration::from_secs_f64((self.burst_gap() - since).max(0.0)))
    }

    /// User writes opened a new segment at `now`: counted in the fill
    /// rate, and in the current burst if the last one was opened less than
    /// [`Provision::burst_gap`] ago (else that burst has ended: it becomes
    /// the largest of late if it is larger than that one, weighed down).
    pub(crate) fn filled(&mut self, now: Instant) {
        self.tick(now);
        if self.bursting(now) {
            self.run += 1;
        } else {
            if self.run >= 2 {
                let decayed = self.peak.map_or(0, |p| p - p / 4);
                self.peak = Some(self.run.max(decayed));
            }
            self.run = 1;
        }
        self.last_fill = Some(now);
        match &mut self.window {
            Some((_, n)) => *n += 1,
            None => self.window = Some((now, 1)),
        }
    }

    /// Fold the window into the fill rate if it is [`FILL_TICK`] old: its
    /// rate weighs [`RATE_EWMA`] per tick it spans (a long quiet window
    /// weighs as the quiet ticks it stands for).
    fn tick(&mut self, now: Instant) {
        let Some((start, n)) = self.window else { return };
        let secs = now.saturating_duration_since(start).as_secs_f64();
        if secs < FILL_TICK {
            return;
        }
        let rate = n as f64 / secs;
        let w = 1.0 - (1.0 - RATE_EWMA).powf(secs / FILL_TICK);
        self.lambda = Some(self.lambda.map_or(rate, |l| l + w * (rate - l)));
        self.window = Some((now, 0));
    }

    /// GC reclaimed a segment in `secs`.
    pub(crate) fn reclaimed(&mut self, secs: f64) {
        self.reclaim_secs = Some(self.reclaim_secs.map_or(secs, |r| r + RATE_EWMA * (secs - r)));
    }

    /// A writer found no room and waits for GC.
    pub(crate) fn writer_waited(&mut self) {
        if self.mode == Watermark::Doubling && !self.waited {
            self.low = (self.low * 2).clamp(self.min, self.max);
        }
        self.waited = true;
    }

    /// GC reached the high watermark and stops.
    pub(crate) fn reached_high(&mut self) {
        if self.mode == Watermark::Doubling && !self.waited {
            self.low = self.low.saturating_sub(1).max(self.min);
        }
        self.waited = false;
    }

    /// Segments filled and reclaimed per second (lambda, mu), as of the
    /// last [`Provision::update`]. None until both were measured.
    pub(crate) fn rates(&self) -> Option<(f64, f64)> {
        Some((self.lambda?, 1.0 / self.reclaim_secs?.max(1e-9)))
    }

    /// Recompute the low watermark at `now` (the M/M/1 model: the
    /// expected queue `lambda / (mu - lambda)`; all it may be when writes
    /// outrun GC).
    pub(crate) fn update(&mut self, now: Instant) -> usize {
        self.tick(now);
        if self.mode == Watermark::Queue {
            self.low = match self.rates() {
                None => self.min,
                Some((lambda, mu)) if lambda >= mu => self.max,
                Some((lambda, mu)) => {
                    let queue = (lambda / (mu - lambda)).round();
                    (queue.min(self.max as f64) as usize + self.min).min(self.max)
                }
            };
        }
        self.low
    }
}

impl Space {
    /// Space with every segment free, `next_alloc_seq` 1.
    pub(crate) fn new(dev: Arc<dyn Device>, sb: Superblock, seed: u32, durability: Durability, cfg: GcConfig) -> Space {
        let gc = cfg.gc;
        let n = sb.segment_count as usize;
        let zoned = dev.zones();
        // Zoned mode keeps to three streams (the device's open zones).
        let sepbit = cfg.sepbit && zoned.is_none();
        // SepBIT separates GC's relocations by age too.
        let hot_cold = cfg.hot_cold || sepbit;
        // GC relocating into two streams (hot/cold) may need a fresh
        // segment in each at once: one more segment is kept for it.
        // SepBIT's four GC streams, one more each.
        let reserve = match (n >= 8, sepbit) {
            (false, _) => 1,
            (true, true) => RESERVED_SEGMENTS + 3,
            (true, false) => RESERVED_SEGMENTS + usize::from(hot_cold),
        };
        // GC starts two segments above the reserve (a PUT opens a segment
        // only above it: a watermark at or below it is never reached).
        let low = (n / 32).clamp(RESERVED_SEGMENTS + 2, 64).max(reserve + 2);
        let provision = Provision::new(cfg.watermark, n, low, reserve);
        Space {
            dev,
            durability,
            live: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stamps: (0..n).map(|_| AtomicU32::new(0)).collect(),
            alloc_seqs: (0..n).map(|_| AtomicU64::new(0)).collect(),
            inflight: (0..n).map(|_| AtomicU32::new(0)).collect(),
            writing: (0..n).map(|_| AtomicU32::new(0)).collect(),
            touched: (0..n).map(|_| AtomicU64::new(0)).collect(),
            tick: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                state: vec![SegState::Free; n],
                closed_at: vec![0; n],
                closes: 0,
                free: (0..n as u32).collect(),
                open: Default::default(),
                stream: vec![Stream::User; n],
                next_alloc_seq: 1,
                gc,
                gc_opened: gc,
                requested: 0,
                served: 0,
                gave_up: 0,
                stuck: false,
                collecting: false,
                compact_stuck: false,
                pinned: vec![false; n],
                provision,
                shutdown: false,
                sweep: Default::default(),
            }),
            cond: Condvar::new(),
            room: event_listener::Event::new(),
            low_watermark: low,
            reserve,
            policy: cfg.policy,
            hot_cold,
            sepbit,
            seq_clock: AtomicU64::new(0),
            first_seqs: (0..n).map(|_| AtomicU64::new(0)).collect(),
            seg_streams: (0..n).map(|_| AtomicU8::new(0)).collect(),
            short_lifetime: AtomicU64::new(u64::MAX),
            short_opened: AtomicU64::new(0),
            room_waits: AtomicU64::new(0),
            room_wait_us: AtomicU64::new(0),
            // A zone reset is the discard in zoned mode.
            discard: (cfg.discard && zoned.is_none()).into(),
            // Zoned mode writes each zone in order, so a summary could not
            // be put at a segment's end after its records.
            summaries: (cfg.summaries && zoned.is_none()).then(Default::default),
            zoned,
            torn: Mutex::new(Vec::new()),
            kept_torn: Mutex::new(Vec::new()),
            seed,
            features: Mutex::new(sb.flags),
            closing: (0..n).map(|_| Default::default()).collect(),
            gathering: (0..n).map(|_| Default::default()).collect(),
            summary_max: summary::region_grains_max(sb.segment_bytes, sb.grain_bytes),
            summaries_written: AtomicU64::new(0),
            summary_bytes: AtomicU64::new(0),
            sb,
        }
    }

    /// Whether superblock feature `flag` is on.
    pub(crate) fn has_feature(&self, flag: u32) -> bool {
        *self.features.lock().unwrap_or_else(|e| e.into_inner()) & flag != 0
    }

    /// Run `f` on the superblock as the device holds it now (the one the
    /// store opened with, or, once a feature was turned on, that one
    /// rewritten with the flags turned on so far), no feature being turned
    /// on meanwhile (`f` may read the copies).
    pub(crate) fn with_superblock_now<R>(&self, f: impl FnOnce(&Superblock) -> R) -> R {
        let on = self.features.lock().unwrap_or_else(|e| e.into_inner());
        match *on == self.sb.flags {
            true => f(&self.sb),
            false => f(&self.superblock_with(*on)),
        }
    }

    /// The superblock rewritten with feature `flags` (version 2).
    fn superblock_with(&self, flags: u32) -> Superblock {
        let mut sb = self.sb.clone();
        sb.version = granary_format::superblock::SUPERBLOCK_VERSION;
        sb.flags = flags;
        sb
    }

    /// Turn on a superblock feature flag (once): copy A, flush, copy B,
    /// flush. A crash in between leaves copy A, which readers take first,
    /// with the flag. Serialised by the features lock; the flags written
    /// are every one turned on so far.
    pub(crate) fn enable_feature(&self, flag: u32) -> Result<()> {
        let mut on = self.features.lock().unwrap_or_else(|e| e.into_inner());
        if *on & flag == flag {
            return Ok(());
        }
        write_superblocks(self.dev.as_ref(), &self.superblock_with(*on | flag))?;
        *on |= flag;
        let what = match flag {
            granary_format::superblock::FLAG_NAMESPACES => "namespaces",
            granary_format::superblock::FLAG_BATCHES => "atomic batches",
            granary_format::superblock::FLAG_STREAMS => "SepBIT's segment streams",
            _ => "segment summaries",
        };
        tracing::info!("{what} turned on: this store now needs a build that knows them");
        Ok(())
    }

    /// Whether the store runs in zoned mode.
    pub(crate) fn zoned(&self) -> bool {
        self.zoned.is_some()
    }

    /// Recovery left the torn record at `grain` of `seg` in place.
    pub(crate) fn keep_torn(&self, seg: u32, grain: u64) {
        self.kept_torn.lock().unwrap_or_else(|e| e.into_inner()).push((seg, grain));
    }

    /// Whether recovery left a torn record at `grain` of `seg` in place.
    pub(crate) fn is_kept_torn(&self, seg: u32, grain: u64) -> bool {
        self.kept_torn.lock().unwrap_or_else(|e| e.into_inner()).contains(&(seg, grain))
    }

    /// Zoned mode: recovery found a torn record in `seg`.
    pub(crate) fn note_torn(&self, seg: u32) {
        let mut t = self.torn.lock().unwrap_or_else(|e| e.into_inner());
        if !t.contains(&seg) {
            t.push(seg);
        }
    }

    /// Zoned mode: whether recovery found a torn record in `seg`.
    pub(crate) fn is_torn(&self, seg: u32) -> bool {
        self.torn.lock().unwrap_or_else(|e| e.into_inner()).contains(&seg)
    }

    /// Zoned mode: the segments recovery found torn records in.
    pub(crate) fn take_torn(&self) -> Vec<u32> {
        std::mem::take(&mut *self.torn.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Zoned mode: why index checkpoints are not written, if they are
    /// not. A checkpoint writes its segments one at a time, each finished
    /// before the next (`checkpoint::write_zoned`), so it needs one open
    /// and active zone beyond the two per segment stream
    /// (`Store::check_zones`), which writers may hold meanwhile.
    pub(crate) fn checkpoints_refused(&self) -> Option<String> {
        let z = self.zoned?;
        let need = 2 * if self.hot_cold { 3 } else { 2 } + 1;
        (z.max_open < need || z.max_active < need).then(|| {
            format!(
                "index checkpoints are not written in zoned mode on a device allowing {} open and {} active \
                 zones: they need {need}, one beyond the two per segment stream (an open scans the log)",
                z.max_open, z.max_active
            )
        })
    }

    /// Zoned mode: finish a checkpoint's segment once written, so that it
    /// no longer counts against the device's open and active zones.
    pub(crate) fn finish_index_segment(&self, seg: u32) {
        self.finish_zones_of(seg);
    }

    /// Zoned mode: finish `seg`'s zones (closed, its writes done), so it
    /// no longer counts against the device's open and active zones. A
    /// failure is logged: it costs an open zone, not data.
    fn finish_zones_of(&self, seg: u32) {
        let offset = self.sb.segment_offset(seg);
        if let Err(e) = self.dev.finish_zones(offset, self.sb.segment_bytes) {
            tracing::warn!(segment = seg, error = %e, "finishing a closed segment's zones failed");
        }
    }

    /// Zoned mode: reset `seg`'s zones unless its first zone is empty
    /// (what a free segment must be before its header is written).
    fn reset_zones_of(&self, seg: u32) -> Result<()> {
        let offset = self.sb.segment_offset(seg);
        let io = |source| Error::Io { op: "zone reset", offset, source };
        let z = self.zoned.map_or(self.sb.segment_bytes, |z| z.zone_bytes);
        let wps = (0..self.sb.segment_bytes / z)
            .map(|i| self.dev.write_pointer(offset + i * z).map(|wp| wp != offset + i * z))
            .collect::<std::io::Result<Vec<bool>>>()
            .map_err(io)?;
        if wps.into_iter().any(|written| written) {
            self.dev.reset_zones(offset, self.sb.segment_bytes).map_err(io)?;
        }
        Ok(())
    }

    /// Zoned mode, at open (recovery done, tails resumed): free segments
    /// are reset (a header a crash left, a torn write), used ones that are
    /// not open finished (zones a crash left open), so the open writes at
    /// write pointers within the device's zone limits.
    pub(crate) fn settle_zones(&self) -> Result<()> {
        if self.zoned.is_none() {
            return Ok(());
        }
        let inner = self.lock();
        for (i, st) in inner.state.iter().enumerate() {
            match st {
                SegState::Free => self.reset_zones_of(i as u32)?,
                SegState::Closed | SegState::Index => self.finish_zones_of(i as u32),
                SegState::Open => {}
            }
        }
        Ok(())
    }

    fn wake_all(&self) {
        self.cond.notify_all();
        self.room.notify(usize::MAX);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Install what recovery found: `used` KV segments (sorted by
    /// alloc_seq) are closed, `index` segments hold the checkpoint in use;
    /// `max_alloc_seq` covers free headers. No segment is open: writes
    /// start a new one unless recovery reopens one ([`Space::reopen`]).
    pub(crate) fn install(&self, used: &[SegmentFound], index: &[u32], max_alloc_seq: u64) {
        let mut inner = self.lock();
        for &seg in index {
            inner.state[seg as usize] = SegState::Index;
            inner.free.remove(&seg);
        }
        for s in used {
            let i = s.seg as usize;
            inner.state[i] = SegState::Closed;
            inner.free.remove(&s.seg);
            inner.closes += 1;
            inner.closed_at[i] = inner.closes;
            inner.stream[i] = s.stream;
            self.seg_streams[i].store(stream_index(s.stream) as u8, Relaxed);
            self.touched[i].store(inner.closes, Relaxed);
            self.tick.store(inner.closes, Relaxed);
            self.stamps[i].store(s.alloc_seq as u32, Relaxed);
            self.alloc_seqs[i].store(s.alloc_seq, Relaxed);
            self.first_seqs[i].store(s.first_seq, Relaxed);
            self.seq_clock.fetch_max(s.first_seq, Relaxed);
        }
        inner.next_alloc_seq = inner.next_alloc_seq.max(max_alloc_seq + 1);
    }

    /// Make `seg`, installed closed, the open segment of `stream` again,
    /// with its next record at grain `next` (recovery's `resume_tails`).
    pub(crate) fn reopen(&self, seg: u32, stream: Stream, next: u64) {
        let mut inner = self.lock();
        let si = stream_index(stream);
        debug_assert!(inner.open[si].is_none() && inner.state[seg as usize] == SegState::Closed);
        debug_assert!(next >= 1 && next < self.sb.segment_grains());
        inner.state[seg as usize] = SegState::Open;
        inner.stream[seg as usize] = stream;
        self.seg_streams[seg as usize].store(stream_index(stream) as u8, Relaxed);
        // Its records before the crash are not in a summary being gathered.
        inner.open[si] = Some(OpenSeg { seg, next, stamp: self.stamps[seg as usize].load(Relaxed), listed: None });
    }

    /// Wait (with no key stripe held) until a user write of `grains`
    /// (`listed`: its summary entries' bytes, [`listed_bytes`]) is likely
    /// to find room: the open user segment has room with its summary's
    /// room kept (or may give that up, [`Space::may_take_summary_room`]),
    /// or a free segment beyond the reserve exists. Asks GC for space and
    /// fails with `NoSpace` once GC has nothing left to reclaim.
    pub(crate) async fn await_room(&self, purpose: Purpose, grains: u64, listed: u64) -> Result<()> {
        let mut asked = None;
        let mut since: Option<Instant> = None;
        loop {
            let listener = {
                let mut inner = self.lock();
                if let Some(r) = self.room_or_ask(&mut inner, purpose, grains, listed, &mut asked) {
                    if let Some(t) = since {
                        self.waited_for_room(t);
                    }
                    return r;
                }
                // Registered under the lock: no wake-up can slip in between.
                self.room.listen()
            };
            since.get_or_insert_with(Instant::now);
            listener.await;
        }
    }

    /// A user write waited for GC's room from `since` until now.
    pub(crate) fn waited_for_room(&self, since: Instant) {
        self.room_waits.fetch_add(1, Relaxed);
        self.room_wait_us.fetch_add(since.elapsed().as_micros() as u64, Relaxed);
    }

    /// User writes that waited for GC's room so far, and the microseconds
    /// they waited together.
    pub(crate) fn room_waits(&self) -> (u64, u64) {
        (self.room_waits.load(Relaxed), self.room_wait_us.load(Relaxed))
    }

    /// [`Space::await_room`] without the wait, for a writer that runs GC
    /// itself ([`crate::Background::Manual`]): `Some` when done, else GC
    /// has been asked for room and the caller runs it, then asks again.
    pub(crate) fn room_now(
        &self,
        purpose: Purpose,
        grains: u64,
        listed: u64,
        asked: &mut Option<u64>,
    ) -> Option<Result<()>> {
        self.room_or_ask(&mut self.lock(), purpose, grains, listed, asked)
    }

    /// One check of [`Space::await_room`]: `Some` when done, else the caller
    /// waits (having asked GC for room if it had not yet).
    fn room_or_ask(
        &self,
        inner: &mut Inner,
        purpose: Purpose,
        grains: u64,
        listed: u64,
        asked: &mut Option<u64>,
    ) -> Option<Result<()>> {
        if inner.shutdown {
            return Some(Err(Error::Poisoned { cause: "the store is closing".into() }));
        }
        // Room `alloc_in` will find: with the open segment's summary room
        // kept, or taking it where that is allowed.
        let open_room = inner.open[stream_index(purpose.stream())].as_ref().is_some_and(|o| {
            self.room_kept(o, grains, listed)
                || (o.next + grains <= self.sb.segment_grains() && self.may_take_summary_room(inner, purpose))
        });
        if open_room || inner.free.len() > self.reserve_for(inner, purpose) {
            return Some(Ok(()));
        }
        if !inner.gc {
            return Some(Err(self.no_space(grains)));
        }
        match *asked {
            Some(req) if inner.gave_up >= req => return Some(Err(self.no_space(grains))),
            Some(req) if inner.served < req => {}
            // Not asked yet, or served and the space taken again: ask.
            _ => {
                inner.provision.writer_waited();
                inner.requested += 1;
                *asked = Some(inner.requested);
                self.wake_all();
            }
        }
        None
    }

    fn no_space(&self, grains: u64) -> Error {
        Error::NoSpace { needed_bytes: grains * self.sb.grain_bytes as u64, segments: self.sb.segment_count }
    }

    /// Allocate `grains` contiguous grains in `stream`'s open segment,
    /// opening a new one (and writing its header) when it is too full.
    /// `listed`: bytes of the summary entries of the records they will
    /// hold ([`listed_bytes`]), for which room is kept at the segment's
    /// end. Every successful allocation must be followed by
    /// [`Space::done`] once its record is written and indexed (or has
    /// failed), and the records by [`Space::summarize`] before that.
    /// Never waits: `NoSpace` when no segment may be taken (a user writer
    /// then drops its stripe and calls [`Self::await_room`] again).
    pub(crate) fn alloc(&self, purpose: Purpose, grains: u64, listed: u64, next_seq: u64) -> Result<Loc> {
        self.alloc_in(purpose, purpose.stream(), grains, listed, next_seq)
    }

    /// Whether `grains` more grains, with `listed` bytes of summary
    /// entries, fit in `open`, and what its summary then needs (None:
    /// past [`summary::SUMMARY_SHARE`] of the segment, it gets none and
    /// its records may use the whole segment).
    fn room_in(&self, open: &OpenSeg, grains: u64, listed: u64) -> (bool, Option<u64>) {
        let seg_grains = self.sb.segment_grains();
        let end = open.next + grains;
        let Some(have) = open.listed else { return (end <= seg_grains, None) };
        let want = have.saturating_add(listed);
        let region = summary::region_grains(want, self.sb.grain_bytes);
        // Past the share, or records so large that even an empty segment
        // could not hold them and their summary.
        let alone = (1 + grains).saturating_add(summary::region_grains(listed, self.sb.grain_bytes));
        if region > self.summary_max || alone > seg_grains {
            return (end <= seg_grains, None);
        }
        (end.saturating_add(region) <= seg_grains, Some(want))
    }

    /// Whether an allocation of at most `grains` with at most `listed`
    /// bytes of summary entries finds room in `open` with its summary's
    /// room kept, whatever the exact figures: [`Space::room_in`] allows
    /// more once the summary would pass its share (the segment then goes
    /// without), so a writer that states an upper bound (a batch, whose
    /// conditions decide under its stripes which keys it writes) is let
    /// through only where the smaller allocation fits too. Otherwise
    /// `await_room` could let it through again and again where the
    /// allocator refuses it, without asking GC.
    fn room_kept(&self, open: &OpenSeg, grains: u64, listed: u64) -> bool {
        let end = open.next + grains;
        match open.listed {
            None => end <= self.sb.segment_grains(),
            Some(have) => {
                let region = summary::region_grains(have.saturating_add(listed), self.sb.grain_bytes);
                end.saturating_add(region.min(self.summary_max)) <= self.sb.segment_grains()
            }
        }
    }

    /// [`Space::alloc`] in `stream` (GC puts old records in the cold one).
    pub(crate) fn alloc_in(
        &self,
        purpose: Purpose,
        stream: Stream,
        grains: u64,
        listed: u64,
        next_seq: u64,
    ) -> Result<Loc> {
        let seg_grains = self.sb.segment_grains();
        assert!(grains >= 1 && grains < seg_grains, "record larger than a segment reached the allocator");
        debug_assert!(stream.is_user() == purpose.stream().is_user());
        let si = stream_index(stream);
        let mut inner = self.lock();
        if self.seq_clock.load(Relaxed) < next_seq {
            self.seq_clock.store(next_seq, Relaxed); // under the lock: no lost update
        }
        if let Some(open) = &inner.open[si] {
            let mut room = self.room_in(open, grains, listed);
            if !room.0
                && open.next + grains <= seg_grains
                && inner.free.len() <= self.reserve_for(&inner, purpose)
                && self.may_take_summary_room(&inner, purpose)
            {
                // No segment may be opened, and the record fits if the
                // segment goes without a summary: it does (as
                // `room_or_ask` counts room, so a writer it lets through
                // finds it).
                room = (true, None);
            }
            if let (true, now_listed) = room {
                let (seg, dropped) = (open.seg, open.listed.is_some() && now_listed.is_none());
                let open = inner.open[si].as_mut().expect("checked above");
                let loc = Loc { pba: self.pba(open.seg, open.next), seg: open.seg, stamp: open.stamp, grains };
                open.next += grains;
                open.listed = now_listed;
                self.inflight[loc.seg as usize].fetch_add(1, Relaxed);
                if dropped {
                    self.forget_summary(seg);
                }
                return Ok(loc);
            }
        }
        if inner.free.len() <= self.reserve_for(&inner, purpose) {
            return Err(self.no_space(grains));
        }
        if let Some(open) = inner.open[si].take() {
            self.close(&mut inner, &open);
        }
        let seg = inner.free.pop_first().expect("checked above");
        let alloc_seq = inner.next_alloc_seq;
        inner.next_alloc_seq += 1;
        if let Err(e) = self.write_header(seg, SegmentKind::Kv, stream, alloc_seq, next_seq) {
            inner.free.insert(seg);
            return Err(e);
        }
        let stamp = alloc_seq as u32;
        self.stamps[seg as usize].store(stamp, Relaxed);
        self.alloc_seqs[seg as usize].store(alloc_seq, Relaxed);
        self.first_seqs[seg as usize].store(next_seq, Relaxed);
        self.live[seg as usize].store(0, Relaxed);
        inner.state[seg as usize] = SegState::Open;
        inner.stream[seg as usize] = stream;
        self.seg_streams[seg as usize].store(stream_index(stream) as u8, Relaxed);
        let mut open = OpenSeg { seg, next: 1, stamp, listed: self.summaries.is_some().then_some(0) };
        let (fits, listed) = self.room_in(&open, grains, listed);
        debug_assert!(fits, "a record smaller than a segment fits in an empty one");
        open.next += grains;
        open.listed = listed;
        if let (Some(s), Some(_)) = (&self.summaries, listed) {
            self.closing[seg as usize].store(false, SeqCst);
            let gather = Gather { stamp, entries: Vec::new(), end: None, spoiled: false };
            s.lock().unwrap_or_else(|e| e.into_inner()).insert(seg, gather);
            self.gathering[seg as usize].store(true, Relaxed);
        }
        inner.open[si] = Some(open);
        self.inflight[seg as usize].fetch_add(1, Relaxed);
        if stream.is_user() {
            inner.provision.filled(Instant::now());
        }
        if stream == Stream::UserShort {
            self.short_opened.fetch_add(1, Relaxed);
        }
        if inner.free.len() < inner.provision.low() {
            self.wake_all(); // wake GC
        }
        Ok(Loc { pba: self.pba(seg, 1), seg, stamp, grains })
    }

    /// If an allocation of `grains` (and `listed`, see [`Space::alloc`])
    /// for `purpose` now would close the open segment of its stream and
    /// open another: that open segment.
    pub(crate) fn would_roll(&self, purpose: Purpose, grains: u64, listed: u64) -> Option<u32> {
        let inner = self.lock();
        let open = inner.open[stream_index(purpose.stream())].as_ref()?;
        (!self.room_in(open, grains, listed).0).then_some(open.seg)
    }

    /// Whether a write of `purpose` that finds no segment it may open can
    /// take the room kept for the open segment's summary (the segment then
    /// gets none): GC's own writes can (they must not wait for
    /// themselves), and writes of `Delete` (tombstones of deletes and of a
    /// quota's evictions, which free room and write without waiting for it,
    /// and the few engine records written so); a user write only when
    /// GC cannot make room (it is off, or found nothing to reclaim). While
    /// GC can, the writer waits for it instead: a segment without a
    /// summary costs its reclaim a read of every record, so giving
    /// summaries up whenever writers outpace GC would slow GC down further
    /// just when it is behind.
    fn may_take_summary_room(&self, inner: &Inner, purpose: Purpose) -> bool {
        !purpose.stream().is_user() || purpose == Purpose::Delete || !inner.gc || inner.stuck
    }

    /// Free segments `purpose` must leave to GC.
    fn reserve_for(&self, inner: &Inner, purpose: Purpose) -> usize {
        match (inner.gc, purpose) {
            (false, _) | (_, Purpose::Relocate) => 0,
            (true, Purpose::Clean) => 1,
            (true, Purpose::Put | Purpose::PutShort) => self.reserve,
            // Never the very last segment, even when the reserve is one.
            (true, Purpose::Delete) => (self.reserve - 1).max(1),
        }
    }

    /// The allocation in `seg` is written and indexed (or abandoned).
    pub(crate) fn done(&self, seg: u32) {
        // SeqCst with `close`'s store of `closing` and its load of
        // `inflight`: of a last write ending and the segment closing, at
        // least one sees the other, and so writes the summary.
        let prev = self.inflight[seg as usize].fetch_sub(1, SeqCst);
        debug_assert!(prev > 0, "done without an allocation in segment {seg}");
        if prev == 1 && self.zoned.is_some() {
            // The last write of a segment closed meanwhile: finish it.
            let inner = self.lock();
            self.finish_if_done(&inner, seg);
        }
        if prev == 1 && self.closing[seg as usize].load(SeqCst) {
            // Under `inner`, as `close` writes it: GC frees a segment and a
            // writer reopens it only under `inner` too, so the region is
            // written before the segment can be reused (a reopened
            // segment's new gather, with its new stamp, is not taken).
            let _inner = self.lock();
            self.write_summary(seg);
        }
    }

    /// Drop the summary being gathered for `seg` (it will have none).
    fn forget_summary(&self, seg: u32) {
        if let Some(s) = &self.summaries {
            self.gathering[seg as usize].store(false, Relaxed);
            s.lock().unwrap_or_else(|e| e.into_inner()).remove(&seg);
        }
    }

    /// Note the records of `bytes`, about to be written at grain address
    /// `pba` (whole records, one after the other), in the summary of
    /// their segment. Called between their allocation and its
    /// [`Space::done`].
    pub(crate) fn summarize(&self, pba: u64, bytes: &[u8]) {
        let Some(s) = &self.summaries else { return };
        let g = self.sb.grain_bytes as u64;
        let seg = self.sb.segment_of(pba);
        if !self.gathering[seg as usize].load(Relaxed) {
            return;
        }
        let first = pba - self.pba(seg, 0);
        let mut entries = Vec::new();
        let mut at = 0usize;
        let mut spoiled = false;
        while at < bytes.len() {
            let Ok(h) = granary_format::RecordHeader::decode(&bytes[at..]) else {
                spoiled = true;
                break;
            };
            let key = granary_format::record::key_of(&h, &bytes[at..]);
            let grain = first + at as u64 / g;
            if summary::entry_bytes(key.len()).is_none() || grain > u32::MAX as u64 {
                spoiled = true;
                break;
            }
            entries.extend_from_slice(&(grain as u32).to_le_bytes());
            entries.extend_from_slice(&(key.len() as u16).to_le_bytes());
            entries.extend_from_slice(key);
            at += (h.grains(self.sb.grain_bytes) * g) as usize;
        }
        let mut map = s.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gather) = map.get_mut(&seg) {
            debug_assert_eq!(gather.stamp, self.stamps[seg as usize].load(Relaxed));
            gather.entries.extend_from_slice(&entries);
            gather.spoiled |= spoiled;
        }
    }

    /// Write the summary of closed segment `seg` if its last write has
    /// ended and no one has written it yet. The caller holds `inner`. A
    /// summary is a hint: one that cannot be written is left out, with a
    /// warning.
    fn write_summary(&self, seg: u32) {
        let Some(s) = &self.summaries else { return };
        let gather = {
            let mut map = s.lock().unwrap_or_else(|e| e.into_inner());
            let i = seg as usize;
            match map.get(&seg) {
                Some(gth)
                    if gth.end.is_some()
                        && gth.stamp == self.stamps[i].load(Relaxed)
                        && self.inflight[i].load(SeqCst) == 0 =>
                {
                    self.gathering[seg as usize].store(false, Relaxed);
                    map.remove(&seg)
                }
                _ => None,
            }
        };
        let Some(gather) = gather else { return };
        let end = gather.end.expect("checked above");
        if gather.spoiled {
            return;
        }
        // Entries in grain order.
        let mut at = Vec::new();
        let mut i = 0;
        let e = &gather.entries;
        while i < e.len() {
            let grain = u32::from_le_bytes(e[i..i + 4].try_into().expect("4 bytes"));
            let len = u16::from_le_bytes(e[i + 4..i + 6].try_into().expect("2 bytes")) as usize;
            at.push((grain, i + 6, len));
            i += 6 + len;
        }
        at.sort_unstable_by_key(|a| a.0);
        let entries: Vec<summary::Entry<'_>> =
            at.iter().map(|&(grain, from, len)| summary::Entry { grain, key: &e[from..from + len] }).collect();
        let g = self.sb.grain_bytes;
        let seg_grains = self.sb.segment_grains();
        let region = summary::encode(self.seed, gather.stamp, end as u32, &entries, g);
        let region_grains = region.len() as u64 / g as u64;
        if end + region_grains > seg_grains || entries.windows(2).any(|w| w[0].grain == w[1].grain) {
            debug_assert!(false, "the summary of segment {seg} does not fit where room was kept");
            return;
        }
        if let Err(e) = self.enable_feature(granary_format::superblock::FLAG_SUMMARIES) {
            tracing::warn!(segment = seg, error = %e, "segment summaries could not be turned on");
            return;
        }
        let offset = self.sb.segment_offset(seg) + (seg_grains - region_grains) * g as u64;
        let mut buf = AlignedBuf::zeroed(region.len());
        buf.copy_from_slice(&region);
        match self.dev.write_at(buf, offset) {
            (_, Ok(())) => {
                self.summaries_written.fetch_add(1, Relaxed);
                self.summary_bytes.fetch_add(region.len() as u64, Relaxed);
            }
            (_, Err(e)) => {
                tracing::warn!(segment = seg, error = %e, "the summary of a segment could not be written; GC reads its records instead");
            }
        }
    }

    /// Summaries written since open, and their bytes.
    pub(crate) fn summaries_written(&self) -> (u64, u64) {
        (self.summaries_written.load(Relaxed), self.summary_bytes.load(Relaxed))
    }

    /// Zoned mode: finish `seg` if it is closed with no write in flight
    /// (checked under `inner`: a closed segment takes no new allocation).
    /// Finishing twice (by `close` and by `done`) is harmless. A segment
    /// of a coalesced (user) stream is done once its groups are written
    /// (every write into it goes through the coalescer); others once
    /// their allocations are indexed.
    fn finish_if_done(&self, inner: &Inner, seg: u32) {
        if self.zoned.is_some() && inner.state[seg as usize] == SegState::Closed {
            let coalesced = inner.stream[seg as usize].is_user();
            let done = if coalesced {
                self.writing[seg as usize].load(Acquire) == 0
            } else {
                self.inflight[seg as usize].load(Acquire) == 0
            };
            if done {
                self.finish_zones_of(seg);
            }
        }
    }

    /// Zoned mode: the coalescer placed a group in `seg` (under its lock,
    /// as the allocation that may close the segment).
    pub(crate) fn group_placed(&self, seg: u32) {
        if self.zoned.is_some() {
            self.writing[seg as usize].fetch_add(1, AcqRel);
        }
    }

    /// Zoned mode: a group placed in `seg` has ended its device write (or
    /// was abandoned); the last of a closed segment finishes its zones.
    pub(crate) fn group_written(&self, seg: u32) {
        if self.zoned.is_some() && self.writing[seg as usize].fetch_sub(1, AcqRel) == 1 {
            let inner = self.lock();
            self.finish_if_done(&inner, seg);
        }
    }

    fn close(&self, inner: &mut Inner, open: &OpenSeg) {
        let seg = open.seg;
        if let (Some(s), Some(_)) = (&self.summaries, open.listed) {
            if let Some(gather) = s.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&seg) {
                gather.end = Some(open.next);
            }
            self.closing[seg as usize].store(true, SeqCst);
            if self.inflight[seg as usize].load(SeqCst) == 0 {
                self.write_summary(seg);
            }
        }
        inner.state[seg as usize] = SegState::Closed;
        inner.closes += 1;
        inner.closed_at[seg as usize] = inner.closes;
        self.tick.store(inner.closes, Relaxed);
        self.touched[seg as usize].store(inner.closes, Relaxed);
        inner.stuck = false; // a new candidate for GC
        inner.compact_stuck = false;
        self.finish_if_done(inner, seg);
    }

    /// Cache mode: a value in `seg` was read (segment-level LRU).
    pub(crate) fn touch(&self, seg: u32) {
        let t = self.tick.load(Relaxed);
        let slot = &self.touched[seg as usize];
        if slot.load(Relaxed) < t {
            slot.store(t, Relaxed);
        }
    }

    fn write_header(&self, seg: u32, kind: SegmentKind, stream: Stream, alloc_seq: u64, first_seq: u64) -> Result<()> {
        if matches!(stream, Stream::UserShort | Stream::Older | Stream::Oldest) {
            // Before the first header that names one: a build without
            // these streams then refuses the store instead of taking such
            // a segment for free.
            self.enable_feature(granary_format::superblock::FLAG_STREAMS)?;
        }
        let buf = header_buf(&self.sb, seg, kind, stream, alloc_seq, first_seq);
        let offset = self.sb.segment_offset(seg);
        if self.durability == Durability::Direct && kind == SegmentKind::Kv {
            // What was written before the stream moves on reaches the
            // media first: a write never flushed then lies only in its
            // stream's two newest segments, the ones recovery reads a
            // record that fails its checksum in as torn (ignored). A power
            // cut could otherwise tear one in an older segment, where it is
            // taken for damage and indexed over the version `Store::sync`
            // made durable. One flush per KV segment opened, under the
            // allocation's lock (writers that need a segment wait for it).
            self.dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })?;
        }
        let (_, r) = self.dev.write_at(buf, offset);
        r.map_err(|source| Error::Io { op: "write of a segment header", offset, source })?;
        if self.durability == Durability::Flush {
            self.dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })?;
        }
        Ok(())
    }

    /// Mark a reclaimed segment free: first on the device (a free header
    /// that keeps its alloc_seq), then in memory. Wakes waiting writers.
    ///
    /// In `Direct` mode the device is flushed first: the copies GC made of
    /// the segment's live records, the tombstones it wrote, and the free
    /// headers of earlier victims must reach the media before this header
    /// can. Otherwise a drive that reorders its write-back could keep the
    /// free header and lose a copy at a power loss, losing a value that
    /// [`Store::sync`](crate::Store::sync) had made durable (or bringing a
    /// deleted one back). One flush per reclaimed segment; in `Flush` mode
    /// all of those were flushed as they were written.
    ///
    /// Zoned mode: the flush, then a reset of the segment's zones instead
    /// of the free header and the discard (it reads as zeros: free).
    ///
    /// `released` runs once the segment reads as free on the device and
    /// before it is on the free list: what must forget the segment's old
    /// records does so before a writer can allocate it and record new
    /// ones.
    pub(crate) fn free_segment(&self, seg: u32, released: impl FnOnce()) -> Result<()> {
        if self.durability == Durability::Direct || self.zoned.is_some() {
            let offset = self.sb.segment_offset(seg);
            self.dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })?;
        }
        if self.zoned.is_some() {
            let offset = self.sb.segment_offset(seg);
            self.dev.reset_zones(offset, self.sb.segment_bytes).map_err(|source| Error::Io {
                op: "zone reset",
                offset,
                source,
            })?;
        } else {
            let alloc_seq = self.alloc_seqs[seg as usize].load(Relaxed);
            self.write_header(seg, SegmentKind::Free, Stream::User, alloc_seq, 0)?;
            self.discard_records(seg);
        }
        released();
        let mut inner = self.lock();
        debug_assert_eq!(inner.state[seg as usize], SegState::Closed);
        if self.sepbit && inner.stream[seg as usize] == Stream::UserShort {
            let lived = self.seq_clock.load(Relaxed).saturating_sub(self.first_seqs[seg as usize].load(Relaxed));
            let avg = match self.short_lifetime.load(Relaxed) {
                u64::MAX => lived,
                l => l - l / SHORT_LIFETIME_WINDOW + lived / SHORT_LIFETIME_WINDOW,
            };
            self.short_lifetime.store(avg, Relaxed);
        }
        inner.state[seg as usize] = SegState::Free;
        inner.free.insert(seg);
        self.alloc_seqs[seg as usize].store(0, Relaxed);
        self.wake_all();
        Ok(())
    }

    /// Discard the records of `seg`, whose free header is written: all but
    /// its first grain. Every live record it held was copied (and, in
    /// `Direct` mode, flushed) first, so a crash before the free header is
    /// durable leaves the old header over records that read as zeros or as
    /// they were: either way nothing the index needs. Advisory: a failure
    /// turns discards off, with one warning.
    fn discard_records(&self, seg: u32) {
        if !self.discard.load(Relaxed) {
            return;
        }
        let g = self.sb.grain_bytes as u64;
        let offset = self.sb.segment_offset(seg) + g;
        if let Err(e) = self.dev.discard(offset, self.sb.segment_bytes - g) {
            if self.discard.swap(false, Relaxed) {
                tracing::warn!(segment = seg, device = %self.dev.describe(), error = %e, "discard of a freed segment failed: discards turned off");
            }
        }
    }

    /// The segments [`Space::pick_victim`] may evict, least recently used
    /// first, without `except` (cache mode: the ones to try when evicting
    /// its victim needs room to write that the device does not have).
    pub(crate) fn eviction_order(&self, age: u64, except: u32) -> Vec<u32> {
        let inner = self.lock();
        let mut c: Vec<(u64, u64, u32)> = (0..inner.state.len())
            .filter(|&i| {
                i != except as usize
                    && inner.state[i] == SegState::Closed
                    && !inner.pinned[i]
                    && inner.closed_at[i] + age <= inner.closes
                    && self.inflight[i].load(Acquire) == 0
            })
            .map(|i| (self.touched[i].load(Relaxed), inner.closed_at[i], i as u32))
            .collect();
        c.sort_unstable();
        c.into_iter().map(|(_, _, i)| i).collect()
    }

    /// Every segment holding records (open or closed, not pinned) with its
    /// alloc_seq, in the order a namespace at its quota evicts from them
    /// (`crate::quota`): the closed ones least recently touched first, as
    /// [`Space::eviction_order`] has them, then the open ones.
    pub(crate) fn quota_eviction_order(&self) -> Vec<(u32, u64)> {
        let inner = self.lock();
        let mut c: Vec<(bool, u64, u64, u32)> = (0..inner.state.len())
            .filter(|&i| matches!(inner.state[i], SegState::Open | SegState::Closed) && !inner.pinned[i])
            .map(|i| {
                let open = inner.state[i] == SegState::Open;
                (open, self.touched[i].load(Relaxed), inner.closed_at[i], i as u32)
            })
            .collect();
        c.sort_unstable();
        c.into_iter().map(|(_, _, _, i)| (i, self.alloc_seq(i))).collect()
    }

    /// GC's victim and whether to evict it (cache mode) rather than
    /// relocate its live data.
    ///
    /// Relocation: among all closed segments but the `age` most recently
    /// closed ones, those whose reclaim gains at least
    /// 1/[`GC_MIN_GAIN_DIVISOR`] of a segment (a smaller gain is no gain:
    /// the relocation segment wastes a tail too, so reclaiming nearly-full
    /// segments would consume as much space as it frees), the best by the
    /// policy ([`victim_score`]; the oldest on ties).
    ///
    /// With `evict`, that victim is taken only while at most half of it is
    /// live (cleaning it is cheap and keeps every item: DIDACache's
    /// space-based cleaning); otherwise the least recently used of the same
    /// candidates is evicted whole (its quick clean), with no minimum gain.
    pub(crate) fn pick_victim(&self, age: u64, evict: bool) -> Option<(u32, bool)> {
        self.pick(age, evict, false)
    }

    /// The victim of [`Watermark::Compact`]'s compaction: among the
    /// candidates of [`Space::pick_victim`] at most
    /// [`COMPACT_LIVE_NUMERATOR`]/[`COMPACT_LIVE_DENOMINATOR`] live, the
    /// best by the policy. Compaction relocates it, never evicts.
    pub(crate) fn pick_compaction_victim(&self, age: u64) -> Option<u32> {
        self.pick(age, false, true).map(|(v, _)| v)
    }

    fn pick(&self, age: u64, evict: bool, compacting: bool) -> Option<(u32, bool)> {
        let inner = self.lock();
        let usable = (self.sb.segment_grains() - 1) * self.sb.grain_bytes as u64;
        let min_gain = (usable / GC_MIN_GAIN_DIVISOR).max(self.sb.grain_bytes as u64);
        // Compaction's victims free a fifth of a segment or more.
        let max_live = if compacting {
            usable * COMPACT_LIVE_NUMERATOR / COMPACT_LIVE_DENOMINATOR
        } else {
            usable.saturating_sub(min_gain)
        };
        let candidates = || {
            (0..inner.state.len())
                .filter(|&i| {
                    inner.state[i] == SegState::Closed && !inner.pinned[i] && inner.closed_at[i] + age <= inner.closes
                })
                // A writer may still be writing or indexing a record there.
                .filter(|&i| self.inflight[i].load(Acquire) == 0)
        };
        let best = candidates()
            .map(|i| (self.live[i].load(Relaxed), inner.closed_at[i], i as u32))
            .filter(|&(live, _, _)| live <= max_live)
            .map(|(live, closed_at, i)| {
                let score = victim_score(self.policy, live, usable, inner.closes - closed_at);
                (score, std::cmp::Reverse(closed_at), live, i)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, _, live, i)| (live, i));
        if !evict || compacting {
            return best.map(|(_, i)| (i, false));
        }
        if let Some((live, i)) = best {
            if live <= usable / 2 {
                return Some((i, false));
            }
        }
        candidates()
            .map(|i| (self.touched[i].load(Relaxed), inner.closed_at[i], i as u32))
            .min()
            .map(|(_, _, i)| (i, true))
    }

    /// Whether GC keeps cold relocations apart (the cold stream).
    pub(crate) fn hot_cold(&self) -> bool {
        self.hot_cold
    }

    /// Whether segment `seg` was last opened for `stream`.
    pub(crate) fn is_of_stream(&self, seg: u32, stream: Stream) -> bool {
        self.seg_streams[seg as usize].load(Relaxed) as usize == stream_index(stream)
    }

    /// Whether this open writes to `stream`: users and GC's relocations
    /// always; the cold stream with hot/cold separation or SepBIT; the
    /// short-lived, older and oldest streams with SepBIT.
    pub(crate) fn writes_to(&self, stream: Stream) -> bool {
        match stream {
            Stream::User | Stream::Relocation => true,
            Stream::Cold => self.hot_cold || self.sepbit,
            Stream::UserShort | Stream::Older | Stream::Oldest => self.sepbit,
        }
    }

    /// Segments opened for the short-lived user stream so far.
    pub(crate) fn short_segments_opened(&self) -> u64 {
        self.short_opened.load(Relaxed)
    }

    /// The purpose of a user PUT replacing the version at `prior` (its
    /// pba, or the index's candidates for it; none for a new key):
    /// SepBIT's placement (Wang et al., FAST '22). A key's next version is
    /// likely to live about as long as the one it replaces, so an
    /// overwrite of a version younger than the short-lived stream's recent
    /// segment lifetime goes to that stream ([`Purpose::PutShort`]); a new
    /// key, or an older version's replacement, to the user stream. The
    /// version's age is taken from its segment without reading it: user
    /// writes since the segment was opened. A version GC relocated has
    /// outlived a collection: old. Without `sepbit`: `Put`.
    pub(crate) fn put_purpose(&self, prior: impl IntoIterator<Item = u64>) -> Purpose {
        if !self.sepbit {
            return Purpose::Put;
        }
        let threshold = self.short_lifetime.load(Relaxed);
        let now = self.seq_clock.load(Relaxed);
        // Of several candidates (rare: a fingerprint collision), the youngest.
        let young = prior.into_iter().any(|pba| {
            let seg = self.sb.segment_of(pba) as usize;
            let user = self.seg_streams.get(seg).is_some_and(|s| {
                let s = s.load(Relaxed) as usize;
                s == stream_index(Stream::User) || s == stream_index(Stream::UserShort)
            });
            user && now.saturating_sub(self.first_seqs[seg].load(Relaxed)) < threshold
        });
        if young {
            Purpose::PutShort
        } else {
            Purpose::Put
        }
    }

    /// SepBIT's stream for a record of sequence number `seq` that GC
    /// relocates out of `victim` (None without `sepbit`): survivors of
    /// short-lived user segments to the relocation stream; others by age,
    /// in multiples of the short-lived segments' lifetime: under 4 to the
    /// cold stream, under 16 to the older one, else the oldest.
    pub(crate) fn relocation_stream(&self, victim: u32, seq: u64) -> Option<Stream> {
        if !self.sepbit {
            return None;
        }
        if self.seg_streams[victim as usize].load(Relaxed) as usize == stream_index(Stream::UserShort) {
            return Some(Stream::Relocation);
        }
        let l = self.short_lifetime.load(Relaxed);
        let age = self.seq_clock.load(Relaxed).saturating_sub(seq);
        Some(if age < l.saturating_mul(4) {
            Stream::Cold
        } else if age < l.saturating_mul(16) {
            Stream::Older
        } else {
            Stream::Oldest
        })
    }

    /// GC thread: wait for work. Work starts when free segments fall below
    /// the low watermark and goes on until the high one, or when a writer
    /// asked for space.
    pub(crate) fn gc_wait(&self) -> GcWork {
        let mut inner = self.lock();
        loop {
            if let Some(work) = self.gc_work(&mut inner) {
                return work;
            }
            // Compaction held off by a burst resumes when it ends.
            let wait = Duration::from_millis(500);
            let wait = inner.provision.burst_ends_in(Instant::now()).map_or(wait, |d| d.min(wait));
            inner = self.cond.wait_timeout(inner, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// [`Space::gc_wait`] without the wait, for GC run by the caller
    /// ([`crate::Background::Manual`]): the work due now, if any.
    pub(crate) fn gc_poll(&self) -> Option<GcWork> {
        self.gc_work(&mut self.lock())
    }

    fn gc_work(&self, inner: &mut Inner) -> Option<GcWork> {
        if inner.shutdown {
            return Some(GcWork::Exit);
        }
        let free = inner.free.len();
        if free > self.reserve {
            // Every waiting writer can proceed: their requests are served.
            inner.served = inner.requested;
        }
        inner.provision.update(Instant::now());
        if free < inner.provision.low() {
            inner.collecting = true;
        }
        if free >= inner.provision.high() {
            if inner.collecting {
                inner.provision.reached_high();
            }
            inner.collecting = false;
        }
        if inner.requested > inner.served || (inner.collecting && !inner.stuck) {
            return Some(GcWork::Reclaim(inner.requested));
        }
        if let Some((seg, alloc)) = inner.sweep.pop_front() {
            return Some(GcWork::Sweep(seg, alloc));
        }
        let target = inner.provision.compact_target(Instant::now());
        (free < target && !inner.compact_stuck && !inner.stuck).then_some(GcWork::Compact)
    }

    /// Tests: the burst is over, whatever the clock says.
    #[cfg(test)]
    pub(crate) fn end_burst(&self) {
        self.lock().provision.last_fill = None;
    }

    /// [`Watermark::Compact`]: compaction found no victim; it waits for a
    /// segment to close.
    pub(crate) fn compact_found_nothing(&self) {
        self.lock().compact_stuck = true;
    }

    /// Queue every segment holding records (open or closed) for GC to
    /// sweep for the records of dropped namespaces: their index entries go
    /// and their bytes stop counting as live, so GC picks those segments
    /// as victims as it would any with that much garbage. A sweep runs when
    /// no reclaim is due; a new request restarts it.
    pub(crate) fn request_sweep(&self) {
        let mut inner = self.lock();
        let segs: Vec<(u32, u64)> = (0..inner.state.len() as u32)
            .filter(|&s| matches!(inner.state[s as usize], SegState::Open | SegState::Closed))
            .map(|s| (s, self.alloc_seq(s)))
            .collect();
        inner.sweep = segs.into();
        // A GC that found nothing to do may now.
        inner.stuck = false;
        drop(inner);
        self.wake_all();
    }

    /// Whether a sweep is queued.
    pub(crate) fn sweep_pending(&self) -> bool {
        !self.lock().sweep.is_empty()
    }

    /// Whether `seg` still holds the records it held at `alloc_seq`.
    pub(crate) fn holds(&self, seg: u32, alloc_seq: u64) -> bool {
        let inner = self.lock();
        matches!(inner.state[seg as usize], SegState::Open | SegState::Closed) && self.alloc_seq(seg) == alloc_seq
    }

    /// Leave segment `seg` out of GC from now on.
    pub(crate) fn pin(&self, seg: u32) {
        self.lock().pinned[seg as usize] = true;
    }

    /// Whether a writer waits for GC to make room.
    pub(crate) fn writers_waiting(&self) -> bool {
        let inner = self.lock();
        inner.requested > inner.served
    }

    /// GC found nothing to reclaim: give up on writers' requests up to `req`.
    pub(crate) fn gc_found_nothing(&self, req: u64) {
        let mut inner = self.lock();
        inner.stuck = true;
        inner.served = inner.served.max(req);
        inner.gave_up = inner.gave_up.max(req);
        self.wake_all();
    }

    /// The GC thread is gone: writers no longer wait for it or keep a reserve.
    pub(crate) fn gc_gone(&self) {
        self.lock().gc = false;
        self.wake_all();
    }

    /// Stop the GC thread and fail waiting writers.
    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.wake_all();
    }

    /// After [`Space::shutdown`], once GC has stopped: let the closing
    /// store write its last records (with no GC: `NoSpace` when full).
    pub(crate) fn writes_after_gc(&self) {
        let mut inner = self.lock();
        inner.shutdown = false;
        inner.gc = false;
    }

    pub(crate) fn pba(&self, seg: u32, grain: u64) -> u64 {
        self.sb.segment_offset(seg) / self.sb.grain_bytes as u64 + grain
    }

    pub(crate) fn add_live(&self, seg: u32, bytes: u64) {
        self.live[seg as usize].fetch_add(bytes, Relaxed);
    }

    /// [`Space::add_live`] and [`Space::sub_live`] for the log scan, where
    /// parallel scanners may subtract a segment's bytes before its own
    /// scanner added them (the counter wraps meanwhile; it is exact once
    /// every scanner is done).
    pub(crate) fn add_live_wrapping(&self, seg: u32, bytes: u64) {
        self.live[seg as usize].fetch_add(bytes, Relaxed);
    }

    pub(crate) fn sub_live_wrapping(&self, seg: u32, bytes: u64) {
        self.live[seg as usize].fetch_sub(bytes, Relaxed);
    }

    pub(crate) fn sub_live(&self, seg: u32, bytes: u64) {
        let prev = self.live[seg as usize].fetch_sub(bytes, Relaxed);
        debug_assert!(prev >= bytes, "live bytes of segment {seg} went negative");
    }

    /// The stamp records of segment `seg`'s current use carry.
    pub(crate) fn stamp(&self, seg: u32) -> u32 {
        self.stamps[seg as usize].load(Relaxed)
    }

    /// A tombstone's horizon: the highest alloc_seq handed out so far, so at
    /// least that of every segment in use.
    pub(crate) fn horizon(&self) -> u64 {
        self.lock().next_alloc_seq - 1
    }

    /// The lowest alloc_seq of the segments in use other than `except`
    /// (`u64::MAX` if none). A tombstone in `except` whose horizon is below
    /// it has no older version of its key left anywhere else.
    pub(crate) fn oldest_in_use_except(&self, except: u32) -> u64 {
        self.alloc_seqs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i as u32 != except)
            .map(|(_, a)| a.load(Relaxed))
            .filter(|&a| a != 0)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The alloc_seq of segment `seg`'s current use (0: not in use).
    pub(crate) fn alloc_seq(&self, seg: u32) -> u64 {
        self.alloc_seqs[seg as usize].load(Relaxed)
    }

    pub(crate) fn live_of(&self, seg: u32) -> u64 {
        self.live[seg as usize].load(Relaxed)
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live.iter().map(|x| x.load(Relaxed)).sum()
    }

    /// (free, open, closed, index) segment counts.
    pub(crate) fn counts(&self) -> (u64, u64, u64, u64) {
        let inner = self.lock();
        let mut c = (0, 0, 0, 0);
        for s in &inner.state {
            match s {
                SegState::Free => c.0 += 1,
                SegState::Open => c.1 += 1,
                SegState::Closed => c.2 += 1,
                SegState::Index => c.3 += 1,
            }
        }
        c
    }

    /// Segments that hold records, in no particular order.
    pub(crate) fn used_segments(&self) -> Vec<u32> {
        let inner = self.lock();
        (0..inner.state.len() as u32)
            .filter(|&s| matches!(inner.state[s as usize], SegState::Open | SegState::Closed))
            .collect()
    }

    /// What a checkpoint beginning now must record: the alloc_seq from
    /// which KV segments are to be replayed after it, the next alloc_seq,
    /// and the alloc_seq of every KV segment in use (0 for the others).
    ///
    /// Records in a segment below `replay_from` were all indexed before
    /// this call (no open segment, no allocation in flight there), so a
    /// walk of the index that starts after it sees them or what replaced
    /// them. With `quiesced` (a clean close: no writer runs any more) the
    /// open segments need no replay either.
    pub(crate) fn capture_for_checkpoint(&self, quiesced: bool) -> (u64, u64, Vec<u64>) {
        let inner = self.lock();
        let mut replay_from = inner.next_alloc_seq;
        let mut seg_alloc = vec![0; inner.state.len()];
        for (i, st) in inner.state.iter().enumerate() {
            let a = self.alloc_seqs[i].load(Relaxed);
            match st {
                SegState::Open | SegState::Closed => seg_alloc[i] = a,
                SegState::Free | SegState::Index => continue,
            }
            let busy = self.inflight[i].load(Acquire) > 0;
            if busy || (*st == SegState::Open && !quiesced) {
                replay_from = replay_from.min(a);
            }
        }
        (replay_from, inner.next_alloc_seq, seg_alloc)
    }

    /// Take `n` free segments for an index checkpoint (never GC's reserve,
    /// not even at a clean close, once GC has stopped: a close that took
    /// the last free segments left the next open's GC with nowhere to
    /// write, and a cache refusing writes), writing their headers: kind
    /// index, `first_seq` = the checkpoint id, which is the alloc_seq of
    /// the first. Returns `(segment, alloc_seq)`.
    pub(crate) fn take_index_segments(&self, n: usize) -> Result<Vec<(u32, u64)>> {
        let mut inner = self.lock();
        let reserve = if inner.gc_opened { self.reserve } else { 0 };
        let keep = reserve + if inner.gc { self.low_watermark } else { 0 };
        if inner.free.len() < n + keep {
            return Err(Error::NoSpace {
                needed_bytes: n as u64 * self.sb.segment_bytes,
                segments: self.sb.segment_count,
            });
        }
        let id = inner.next_alloc_seq;
        let mut taken = Vec::with_capacity(n);
        for _ in 0..n {
            let seg = inner.free.pop_first().expect("checked above");
            let alloc_seq = inner.next_alloc_seq;
            inner.next_alloc_seq += 1;
            inner.state[seg as usize] = SegState::Index;
            taken.push((seg, alloc_seq));
        }
        drop(inner);
        if self.zoned.is_some() {
            // Each header is written just before its segment's body, at
            // its zone's write pointer (`write_index_header`).
            return Ok(taken);
        }
        for &(seg, alloc_seq) in &taken {
            if let Err(e) = self.write_header(seg, SegmentKind::Index, Stream::User, alloc_seq, id) {
                self.release_index_segments(&taken.iter().map(|t| t.0).collect::<Vec<_>>()).ok();
                return Err(e);
            }
        }
        Ok(taken)
    }

    /// Zoned mode: the header of a checkpoint's segment taken by
    /// [`Space::take_index_segments`] (`id`: the checkpoint's id).
    pub(crate) fn write_index_header(&self, seg: u32, alloc_seq: u64, id: u64) -> Result<()> {
        self.write_header(seg, SegmentKind::Index, Stream::User, alloc_seq, id)
    }

    /// Give segments of a checkpoint no longer needed back: a free header
    /// on the device first (zoned mode: a reset of their zones, after
    /// which they read as zeros, free), then the free list.
    pub(crate) fn release_index_segments(&self, segs: &[u32]) -> Result<()> {
        let mut first_err = None;
        for &seg in segs {
            // The alloc_seq of a free header only has to be at most the
            // highest one handed out; keep allocation sequences growing.
            let alloc_seq = self.horizon();
            let freed = match self.zoned {
                Some(_) => self.reset_zones_of(seg),
                None => self.write_header(seg, SegmentKind::Free, Stream::User, alloc_seq, 0),
            };
            match freed {
                Ok(()) => {
                    let mut inner = self.lock();
                    debug_assert_eq!(inner.state[seg as usize], SegState::Index);
                    inner.state[seg as usize] = SegState::Free;
                    inner.free.insert(seg);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.wake_all();
        first_err.map_or(Ok(()), Err)
    }

    /// GC's configuration in effect.
    pub(crate) fn settings(&self) -> crate::GcSettings {
        crate::GcSettings {
            policy: self.policy,
            hot_cold: self.hot_cold,
            sepbit: self.sepbit,
            watermark: self.lock().provision.mode,
            discard: self.discard.load(Relaxed),
        }
    }

    /// (low, high) free-segment watermarks of GC.
    pub(crate) fn watermarks(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.provision.low(), inner.provision.high())
    }

    /// GC reclaimed a segment in `secs` (the reclaim rate of
    /// [`Watermark::Queue`]).
    pub(crate) fn reclaimed(&self, secs: f64) {
        self.lock().provision.reclaimed(secs);
    }

    /// (lambda, mu) of [`Provision::rates`], segments per second.
    pub(crate) fn rates(&self) -> Option<(f64, f64)> {
        self.lock().provision.rates()
    }
}

/// The header grain of segment `seg` of the store `sb` describes.
pub(crate) fn header_buf(
    sb: &Superblock,
    seg: u32,
    kind: SegmentKind,
    stream: Stream,
    alloc_seq: u64,
    first_seq: u64,
) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(sb.grain_bytes as usize);
    SegmentHeader {
        kind,
        stream,
        alloc_seq,
        uuid: sb.uuid,
        grain_bytes: sb.grain_bytes,
        segment_index: seg,
        segment_bytes: sb.segment_bytes,
        first_seq,
    }
    .encode(&mut buf);
    buf
}

/// Write both superblock copies of `sb`: copy A, flush, copy B, flush. A
/// crash in between leaves copy A, which readers take first.
pub(crate) fn write_superblocks(dev: &dyn Device, sb: &Superblock) -> Result<()> {
    SUPERBLOCK_OFFSETS.iter().try_for_each(|&offset| write_superblock_at(dev, sb, offset))
}

/// Write the superblock copy of `sb` at `offset`, then flush.
pub(crate) fn write_superblock_at(dev: &dyn Device, sb: &Superblock, offset: u64) -> Result<()> {
    let mut buf = AlignedBuf::zeroed(4096);
    sb.encode(&mut buf);
    let (_, r) = dev.write_at(buf, offset);
    r.map_err(|source| Error::Io { op: "write of the superblock", offset, source })?;
    dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })
}

#[cfg(test)]
mod room_tests {
    use super::*;
    use crate::{CreateOptions, OpenOptions, Store};

    /// `await_room`'s check lets a write through only where the
    /// allocator then finds room: for every smaller allocation (fewer
    /// grains, fewer listed bytes: a batch states an upper bound) that
    /// `room_kept` admits, `room_in` fits it with its summary's room kept.
    /// `room_in` itself is not such a check: past the summary's share it
    /// admits what a smaller allocation within the share does not fit (a
    /// batch would be let through and refused in turn without GC being asked).
    #[test]
    fn room_kept_admits_only_what_every_smaller_allocation_fits() {
        let dev = Arc::new(granary_io::MemDevice::new(8 << 20));
        let create =
            CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), ..CreateOptions::default() };
        let s = Store::create(dev, &create, &OpenOptions::default()).unwrap();
        let sp = &s.core.space;
        let seg = sp.sb.segment_grains();
        let listed = [0u64, 10, 100, 300, 700, 1000, 2000, 5000];
        let mut room_in_wrong = false;
        for next in (1..seg).step_by(3) {
            for have in [None, Some(0), Some(200), Some(600), Some(900)] {
                let open = OpenSeg { seg: 1, next, stamp: 1, listed: have };
                for grains in 1..8 {
                    for &upper in &listed {
                        for &actual in listed.iter().filter(|&&l| l <= upper) {
                            for fewer in 1..=grains {
                                let fits = sp.room_in(&open, fewer, actual).0;
                                if sp.room_kept(&open, grains, upper) {
                                    assert!(fits, "next {next} have {have:?}: admitted {grains} grains listing {upper}, refused {fewer} listing {actual}");
                                }
                                room_in_wrong |= sp.room_in(&open, grains, upper).0 && !fits;
                            }
                        }
                    }
                }
            }
        }
        assert!(room_in_wrong, "room_in, as the check, admits no allocation it then refuses: the test shows nothing");
    }

    /// GC's low watermark stays two segments above the writers' reserve,
    /// whatever the streams and watermark mode: a PUT opens a segment only
    /// above the reserve, so a watermark at or below it (SepBIT's reserve
    /// of 5 against a low watermark of 4 on 64 segments) is never reached
    /// and GC never works ahead of writers.
    #[test]
    fn the_low_watermark_is_above_the_reserve() {
        for (hot_cold, sepbit) in [(false, false), (true, false), (false, true)] {
            for watermark in [crate::Watermark::Fixed, crate::Watermark::Queue, crate::Watermark::Doubling] {
                let dev = Arc::new(granary_io::MemDevice::new((1 << 20) + (64 << 16)));
                let create =
                    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), ..CreateOptions::default() };
                let opts = OpenOptions {
                    gc_hot_cold: hot_cold,
                    gc_sepbit: sepbit,
                    gc_watermark: watermark,
                    ..OpenOptions::default()
                };
                let s = Store::create(dev, &create, &opts).unwrap();
                let sp = &s.core.space;
                let low = sp.lock().provision.low();
                assert!(
                    sp.low_watermark >= sp.reserve + 2 && low >= sp.reserve + 2,
                    "hot/cold {hot_cold}, SepBIT {sepbit}, {watermark:?}: low {} (now {low}), reserve {}",
                    sp.low_watermark,
                    sp.reserve
                );
            }
        }
    }
}

#[cfg(test)]
mod provision_tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// Fill a segment every `gap_ms` from `from_ms`, `n` times; returns
    /// the time of the last.
    fn fill(p: &mut Provision, base: Instant, from_ms: u64, gap_ms: u64, n: u64) -> u64 {
        for i in 0..n {
            p.filled(at(base, from_ms + i * gap_ms));
        }
        from_ms + (n - 1) * gap_ms
    }

    #[test]
    fn fixed_never_moves() {
        let base = Instant::now();
        let mut p = Provision::new(Watermark::Fixed, 1024, 32, RESERVED_SEGMENTS);
        let t = fill(&mut p, base, 0, 1, 3000);
        p.reclaimed(0.5);
        p.writer_waited();
        assert_eq!((p.update(at(base, t)), p.high()), (32, 48));
    }

    #[test]
    fn queue_follows_lambda_over_mu_minus_lambda() {
        let base = Instant::now();
        let mut p = Provision::new(Watermark::Queue, 1024, 32, RESERVED_SEGMENTS);
        // Nothing measured yet: the minimum.
        assert_eq!(p.update(base), RESERVED_SEGMENTS + 2);
        // 100 segments/s filled for 5 s, 117.6 reclaimed: lambda/(mu-lambda)
        // = 5.7, so 6 segments beyond the minimum.
        let t = fill(&mut p, base, 0, 10, 501);
        for _ in 0..50 {
            p.reclaimed(0.0085);
        }
        assert_eq!(p.update(at(base, t)), 6 + RESERVED_SEGMENTS + 2);
        let (lambda, mu) = p.rates().unwrap();
        assert!((lambda - 100.0).abs() < 1.0 && (mu - 117.6).abs() < 1.0, "{lambda} {mu}");
        assert!(p.high() > p.low());
    }

    #[test]
    fn queue_is_capped_when_writes_outrun_gc_and_drops_to_the_minimum_when_quiet() {
        let base = Instant::now();
        let mut p = Provision::new(Watermark::Queue, 1024, 32, RESERVED_SEGMENTS);
        let t = fill(&mut p, base, 0, 5, 1001);
        p.reclaimed(0.01); // mu 100 < lambda 200
        assert_eq!(p.update(at(base, t)), 256, "a quarter of the segments");
        // A second of quiet: the rate is remembered, a little lower.
        p.update(at(base, t + 1000));
        let lambda = p.rates().unwrap().0;
        assert!(lambda > 100.0 && lambda < 200.0, "{lambda}");
        // A quiet minute: nothing is filling, the minimum.
        assert_eq!(p.update(at(base, t + 61_000)), RESERVED_SEGMENTS + 2);
    }

    #[test]
    fn doubling_doubles_on_waits_and_steps_down_when_quiet() {
        let mut p = Provision::new(Watermark::Doubling, 1024, 32, RESERVED_SEGMENTS);
        assert_eq!(p.low(), 4);
        p.writer_waited();
        assert_eq!(p.low(), 8);
        // One doubling per GC cycle, however many writers wait.
        p.writer_waited();
        assert_eq!(p.low(), 8);
        p.reached_high();
        p.writer_waited();
        assert_eq!(p.low(), 16);
        for _ in 0..10 {
            p.writer_waited();
            p.reached_high();
        }
        assert_eq!(p.low(), 256, "capped at a quarter of the segments");
        p.reached_high();
        assert_eq!(p.low(), 255);
        for _ in 0..1000 {
            p.reached_high();
        }
        assert_eq!(p.low(), 4);
    }

    #[test]
    fn compact_holds_off_during_bursts_and_aims_above_the_largest_of_late() {
        let base = Instant::now();
        let mut p = Provision::new(Watermark::Compact, 1024, 32, RESERVED_SEGMENTS);
        // The fixed watermarks; before any burst, a quarter of the
        // segments above the high one.
        assert_eq!((p.update(base), p.high()), (32, 48));
        assert_eq!(p.compact_target(base), 48 + 256);
        p.reclaimed(0.02); // a burst: segments closer than 4 reclaims (80 ms)
        let t = fill(&mut p, base, 1000, 2, 40);
        assert!(p.bursting(at(base, t + 2)));
        assert_eq!(p.compact_target(at(base, t + 2)), 0, "no compaction during a burst");
        let left = p.burst_ends_in(at(base, t + 2)).unwrap();
        assert!(left > Duration::from_millis(77) && left <= Duration::from_millis(78), "{left:?}");
        // 80 ms with no segment filled: over; room for a burst as large.
        assert!(!p.bursting(at(base, t + 81)));
        assert_eq!(p.burst_ends_in(at(base, t + 81)), None);
        assert_eq!(p.compact_target(at(base, t + 81)), 48 + 40);
        // A smaller burst: the larger one is still remembered...
        let t = fill(&mut p, base, 5000, 2, 10);
        assert_eq!(p.compact_target(at(base, t + 100)), 48 + 40);
        // ...and weighs less after each burst that follows.
        let t = fill(&mut p, base, 8000, 2, 10);
        assert_eq!(p.compact_target(at(base, t + 100)), 48 + 30);
        // A trickle (a segment every 100 ms) is no burst: compaction goes
        // on (the third burst ended at its first segment: 30 - 30/4).
        let t = fill(&mut p, base, 10_000, 100, 50);
        assert!(!p.bursting(at(base, t + 90)));
        assert_eq!(p.compact_target(at(base, t + 90)), 48 + 23);
        // At most half of the segments.
        let t = fill(&mut p, base, 20_000, 1, 1000);
        assert_eq!(p.compact_target(at(base, t + 100)), 512);
        assert_eq!(p.update(at(base, t + 100)), 32, "the low watermark stays fixed");
    }

    /// Reclaims faster than a disk's stalls: a burst is still one burst
    /// while segments come less than [`BURST_GAP_MIN`] apart.
    #[test]
    fn a_burst_outlasts_short_stalls() {
        let base = Instant::now();
        let mut p = Provision::new(Watermark::Compact, 1024, 32, RESERVED_SEGMENTS);
        p.reclaimed(0.001);
        let t = fill(&mut p, base, 0, 40, 10);
        assert!(p.bursting(at(base, t + 40)));
        assert!(!p.bursting(at(base, t + 51)));
        assert_eq!(p.compact_target(at(base, t + 51)), 48 + 10, "one burst of 10 segments");
    }

    #[test]
    fn only_compact_compacts() {
        let base = Instant::now();
        for mode in [Watermark::Fixed, Watermark::Queue, Watermark::Doubling] {
            let mut p = Provision::new(mode, 1024, 32, RESERVED_SEGMENTS);
            let t = fill(&mut p, base, 0, 2, 40);
            assert_eq!(p.burst_ends_in(at(base, t + 2)), None, "{mode:?}");
            assert_eq!(p.compact_target(at(base, t + 1000)), 0, "{mode:?}");
        }
    }

    #[test]
    fn small_stores_keep_their_fixed_bounds() {
        let p = Provision::new(Watermark::Queue, 16, 4, RESERVED_SEGMENTS);
        assert_eq!((p.min, p.max, p.low), (4, 4, 4));
    }
}
