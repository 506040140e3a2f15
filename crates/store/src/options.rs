//! Options for creating and opening a store, and the default geometry.

use granary_format::limits::*;
use granary_format::superblock::{INDEX_TABLE_HOMES_MAX, INDEX_TABLE_HOMES_MIN};
use granary_index::TABLES_LOG2_MAX;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// When the direct write completes: the record is on the device and
    /// survives a process crash; a drive with a volatile write cache and no
    /// power-loss protection may still lose it on power failure.
    #[default]
    Direct,
    /// After the write, an fdatasync: the record survives power loss too.
    Flush,
}

/// Geometry chosen when a store is created. `None` picks the default.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// 512 or 4096; default: the device's block size (at least 512).
    pub grain_bytes: Option<u32>,
    /// Power of two; default: 1/64 of the device, between 1 MiB and 1 GiB.
    pub segment_bytes: Option<u64>,
    /// Home slots per index table; default: enough for one record per grain
    /// of the device at 85% occupancy with 256 tables.
    pub index_table_homes: Option<u32>,
}

/// Called during recovery with (bytes of log scanned, bytes to scan).
#[derive(Clone)]
pub struct ProgressHook(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// The time source for expiry: unix seconds. Tests pass a manual clock so
/// expiry is checked without sleeping.
#[derive(Clone)]
pub struct Clock(pub Arc<dyn Fn() -> u32 + Send + Sync>);

impl Clock {
    /// The system's real-time clock, read coarsely: whole seconds are all
    /// expiry needs, and `CLOCK_REALTIME_COARSE` (the time of the last
    /// timer tick, a few milliseconds behind at most) costs a fraction of
    /// a precise read, on the path of every GET.
    pub fn system() -> Clock {
        Clock(Arc::new(|| {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `ts` is a valid timespec to write; the call has no
            // other effect.
            if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
                return (ts.tv_sec.max(0) as u64).min(u32::MAX as u64) as u32;
            }
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs().min(u32::MAX as u64) as u32)
                .unwrap_or(0)
        }))
    }

    /// Unix seconds now.
    pub fn now(&self) -> u32 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The time in unix milliseconds, as the on-device "created" stamps
    /// record it (whole seconds of this clock, so a simulated clock gives
    /// the same bytes on every run).
    pub(crate) fn unix_ms(&self) -> u64 {
        self.now() as u64 * 1000
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

/// Where the store's random numbers come from: the device's UUID and the
/// key hash's secret seed at creation, and each open's session id. The OS
/// by default; a seeded generator, shared by every open that is given a
/// clone of it, makes them the same on every run (deterministic
/// simulation). A seeded store's hash seed is as predictable as its seed:
/// never seed a store that untrusted clients write to.
#[derive(Clone, Default)]
pub struct Entropy(Option<Arc<std::sync::Mutex<granary_io::SimRng>>>);

impl Entropy {
    /// The operating system's random numbers (getrandom).
    pub fn system() -> Entropy {
        Entropy(None)
    }

    /// Numbers drawn from `seed`, one draw after another across every open
    /// sharing this value.
    pub fn seeded(seed: u64) -> Entropy {
        Entropy(Some(Arc::new(std::sync::Mutex::new(granary_io::SimRng::new(seed)))))
    }

    /// A random u64: the first 8 bytes of a [`Entropy::draw`].
    pub(crate) fn draw_u64(&self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.draw()?[..8].try_into().expect("8 bytes")))
    }

    /// 16 random bytes.
    pub(crate) fn draw(&self) -> std::io::Result<[u8; 16]> {
        let mut u = [0u8; 16];
        match &self.0 {
            Some(g) => {
                let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
                u[..8].copy_from_slice(&g.next_u64().to_le_bytes());
                u[8..].copy_from_slice(&g.next_u64().to_le_bytes());
            }
            None => {
                let mut got = 0;
                while got < u.len() {
                    // SAFETY: writes at most u.len() - got bytes into u[got..].
                    let n = unsafe { libc::getrandom(u[got..].as_mut_ptr().cast(), u.len() - got, 0) };
                    if n < 0 {
                        let e = std::io::Error::last_os_error();
                        if e.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        return Err(e);
                    }
                    got += n as usize;
                }
            }
        }
        Ok(u)
    }
}

impl fmt::Debug for Entropy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Entropy(seeded)" } else { "Entropy(system)" })
    }
}

/// Default of [`OpenOptions::checkpoint_interval`].
pub const CHECKPOINT_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// Who runs the store's background work: GC and periodic checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Background {
    /// A GC thread and (with [`OpenOptions::checkpoint_interval`]) a
    /// checkpoint thread (the default).
    #[default]
    Threads,
    /// No background thread: GC runs on a writer's own thread when that
    /// writer needs room, and when [`crate::Store::gc_step`] is called;
    /// checkpoints only when [`crate::Store::checkpoint`] is called (and at
    /// close). The engine's internal thread pools (checkpoints' link
    /// resolution, GC's sparse reads) use one thread. With one writer
    /// thread, the device then sees the same writes in the same order on
    /// every run: the crash simulation replays a seed exactly. For tests
    /// and simulation, not for executors (a writer may block on GC).
    Manual,
}

/// How GC chooses the segment to reclaim (see docs/ARCHITECTURE.md,
/// "Garbage collection").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GcPolicy {
    /// The segment with the fewest live bytes.
    Greedy,
    /// LFS's cost-benefit: the segment with the highest
    /// `(1 - u) * age / (1 + u)`, `u` its live share and `age` how many
    /// segments were closed since it was: an old segment is reclaimed at a
    /// higher utilisation than a young one, whose data is still dying.
    #[default]
    CostBenefit,
}

impl GcPolicy {
    /// The name `--gc-policy` takes.
    pub fn name(self) -> &'static str {
        match self {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
        }
    }

    /// Parse a name of [`GcPolicy::name`].
    pub fn parse(s: &str) -> Option<GcPolicy> {
        match s {
            "greedy" => Some(GcPolicy::Greedy),
            "cost-benefit" => Some(GcPolicy::CostBenefit),
            _ => None,
        }
    }
}

/// Where GC's low watermark (the free segments below which it starts)
/// sits: the over-provisioning kept free ahead of writers, which DIDACache
/// sizes to the write load (docs/ARCHITECTURE.md, "Adaptive low
/// watermark").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Watermark {
    /// A fixed share of the segments: clamp(segments/32, 4, 64).
    #[default]
    Fixed,
    /// DIDACache's M/M/1 model: `lambda / (mu - lambda)` free segments,
    /// lambda the rate user writes fill segments and mu the rate GC
    /// reclaims them (both measured online, averaged), so a burst finds
    /// the segments it fills already free; between 4 and a quarter of the
    /// segments, the most when writes outrun GC.
    Queue,
    /// DIDACache's feedback heuristic: doubled each time a writer has to
    /// wait for GC, lowered by one each time GC reaches the high watermark
    /// with no writer waiting; between the same bounds.
    Doubling,
    /// The fixed low watermark, and between bursts of writes GC
    /// compacts: it reclaims segments at most 4/5 live by relocating
    /// their live data (never evicting) until as many segments are free
    /// as the high watermark plus the largest burst of late (at most half
    /// of the segments), so the next burst finds its room made from
    /// garbage, at no cost in items, and while it lasts meets no GC.
    /// Costs relocation writes (docs/ARCHITECTURE.md, "Adaptive low
    /// watermark").
    Compact,
}

impl Watermark {
    /// The name `--gc-watermark` takes.
    pub fn name(self) -> &'static str {
        match self {
            Watermark::Fixed => "fixed",
            Watermark::Queue => "queue",
            Watermark::Doubling => "doubling",
            Watermark::Compact => "compact",
        }
    }

    /// Parse a name of [`Watermark::name`].
    pub fn parse(s: &str) -> Option<Watermark> {
        match s {
            "fixed" => Some(Watermark::Fixed),
            "queue" => Some(Watermark::Queue),
            "doubling" => Some(Watermark::Doubling),
            "compact" => Some(Watermark::Compact),
            _ => None,
        }
    }
}

/// Whether GC tells the device which segments it freed
/// ([`granary_io::Device::discard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Discard {
    /// On for block devices (BLKDISCARD: the drive's own GC stops copying
    /// what the store no longer holds), off for files, where a punched
    /// hole costs the next direct write into it an extent conversion.
    #[default]
    Auto,
    On,
    Off,
}

impl Discard {
    /// The name `--discard` takes.
    pub fn name(self) -> &'static str {
        match self {
            Discard::Auto => "auto",
            Discard::On => "on",
            Discard::Off => "off",
        }
    }

    /// Parse `auto`, `on` or `off`.
    pub fn parse(s: &str) -> Option<Discard> {
        match s {
            "auto" => Some(Discard::Auto),
            "on" => Some(Discard::On),
            "off" => Some(Discard::Off),
            _ => None,
        }
    }
}

/// Options for an open store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub durability: Durability,
    /// Background threads, or work driven by the caller (deterministic).
    pub background: Background,
    /// The source of the store's random numbers (the OS, or a seed;
    /// [`Entropy`]).
    pub entropy: Entropy,
    /// Run garbage collection in a background thread (default). Without it,
    /// overwritten space is never reclaimed and a full device is `NoSpace`.
    pub gc: bool,
    /// Load the newest valid index checkpoint on open (default). Off: scan
    /// the whole log (what `granary verify --scan` compares against).
    pub use_checkpoint: bool,
    /// Write an index checkpoint in the background this often, when the
    /// store changed since the last one (None: only at close).
    pub checkpoint_interval: Option<Duration>,
    /// Write a checkpoint at close, for a fast clean restart (default).
    pub checkpoint_on_close: bool,
    /// Mend what a crash left at open (the default): clear the torn
    /// records recovery finds in the newest segments (zero their first
    /// grain, so later scans ignore them too), and rewrite a superblock
    /// copy that lags behind the other or fails its checksum or magic
    /// (docs/FORMAT.md, "Superblock"). False mends nothing, for
    /// inspections that must not write (`granary verify`, `stat`, `get`,
    /// which also turn GC and checkpoints off): torn records are ignored
    /// all the same, and `verify` counts them as torn
    /// ([`crate::VerifyReport::torn_records`]) rather than damaged. Such
    /// an open takes no writes (they fail with `InvalidOptions`): what a
    /// crash left is still there for them to meet.
    pub clear_torn: bool,
    /// Threads that load the checkpoint and scan the log (0: one per core,
    /// at most 16).
    pub recovery_threads: usize,
    /// Recovery progress, for a progress bar.
    pub progress: Option<ProgressHook>,
    /// Cache mode: when space runs low, GC may evict the least recently
    /// used segment whole (its values leave the index, nothing is copied)
    /// instead of relocating live data. Off (store mode): nothing is ever
    /// dropped, and a full store refuses writes with `NoSpace`.
    pub evict: bool,
    /// The clock values' expiry times are compared with.
    pub clock: Clock,
    /// Write coalescing (default on): concurrent PUTs and DELETEs that land
    /// next to each other share one device write (and one flush in `Flush`
    /// mode); each is acknowledged when that write completes. Off, each
    /// write is its own IO and many may be in flight at once; nothing then
    /// keeps them within the user stream's two newest segments, so a crash
    /// during heavy concurrent writing can leave an unacknowledged record
    /// torn in an older segment, which recovery reports as damaged (its key
    /// reads as corrupt instead of as its previous value). Keep it on
    /// unless writes are issued one at a time.
    pub coalesce_writes: bool,
    /// Keep each item's access state (read since written, last access
    /// time, win token: [`crate::Access`]) in DRAM beside its index entry,
    /// for memcache's meta flags `h`, `l`, `W`/`Z`: 4 bytes per index slot
    /// (about 5 per key). Off by default; `granary serve` turns it on. Not
    /// persisted: after a restart every item reads as never read, last
    /// accessed at the open, token not sent.
    pub track_access: bool,
    /// DRAM for blind overwrites: an unconditional PUT of a key with one
    /// index candidate replaces it without reading the old record first,
    /// and keeps the displaced entry and its own key in DRAM
    /// ([`crate::LINK_OVERHEAD_BYTES`] plus the key) until GC, a checkpoint
    /// or a reader settles it. Past this many bytes, overwrites read the old
    /// version first, as uDepot does; `Some(0)` turns them off. None (the
    /// default): [`crate::BLIND_OVERWRITE_BYTES_DEFAULT`] on a device, 0 on
    /// an in-memory one, where the read is a copy and costs less than a link
    /// (`granary-bench device --backends mem` with and without
    /// `--blind-overwrite-mem 64M` compares the two).
    pub blind_overwrite_bytes: Option<usize>,
    /// GC's victim choice.
    pub gc_policy: GcPolicy,
    /// Hot/cold separation of GC's relocations: records older than the
    /// store has records (in sequence numbers: they outlived an average
    /// key's lifetime) are relocated to a segment stream of their own,
    /// apart from younger ones. Off by default: it gained little under
    /// Zipfian overwrites and cost a few percent under uniform ones
    /// (docs/BENCHMARKS.md, "Garbage collection").
    pub gc_hot_cold: bool,
    /// SepBIT placement (Wang et al., FAST '22): a user PUT that replaces
    /// a version younger than a recent short-lived segment's lifetime goes
    /// to a user stream of its own (such keys are likely rewritten soon
    /// again), and GC's relocations are separated by age as with
    /// `gc_hot_cold`, which it implies. Ignored in zoned mode (its open
    /// zones). Off by default (docs/BENCHMARKS.md, "Garbage collection").
    pub gc_sepbit: bool,
    /// How GC's low watermark is set.
    pub gc_watermark: Watermark,
    /// Write a summary (the key of each record) at the end of each KV
    /// segment once it is full (docs/FORMAT.md, "Segment summary"), so GC
    /// settles blind overwrites' links without reading the records they
    /// displaced. A summary takes at most 1/64 of its segment; a segment
    /// whose keys would need more gets none. On by default; ignored in
    /// zoned mode. Turning it on once marks the store as needing a build
    /// that knows summaries.
    pub segment_summaries: bool,
    /// Discard each segment GC frees (its records, not its header).
    pub discard: Discard,
    /// DRAM for a tier of hot values in front of the device
    /// ([`crate::TIER_ITEM_OVERHEAD_BYTES`] plus key and value per item,
    /// admitted and evicted by S3-FIFO): a GET it serves reads nothing from
    /// the device, and it never serves a value older than the device's.
    /// 0 (the default): off. `granary serve -m` sets it (64 MiB by default
    /// there). Starts empty at every open.
    pub dram_tier_bytes: u64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            durability: Durability::Direct,
            background: Background::Threads,
            // The unit tests' stores draw from one fixed seed: the key
            // hash's seed, and so which keys share an index neighbourhood,
            // is the same in every run (tests that count blind overwrites
            // or IOs depend on it). A test that needs the OS's numbers
            // asks for them.
            entropy: if cfg!(test) { Entropy::seeded(2) } else { Entropy::system() },
            gc: true,
            use_checkpoint: true,
            checkpoint_interval: Some(CHECKPOINT_INTERVAL_DEFAULT),
            checkpoint_on_close: true,
            clear_torn: true,
            recovery_threads: 0,
            progress: None,
            evict: false,
            clock: Clock::system(),
            coalesce_writes: true,
            track_access: false,
            blind_overwrite_bytes: None,
            gc_policy: GcPolicy::default(),
            gc_hot_cold: false,
            gc_sepbit: false,
            gc_watermark: Watermark::default(),
            segment_summaries: true,
            discard: Discard::default(),
            dram_tier_bytes: 0,
        }
    }
}

/// The largest value a store of `segment_bytes` segments in grains of
/// `grain_bytes` holds for a key of `key_len` bytes (stored form): a record
/// fills at most a segment less its header grain. 0 for a key no record
/// holds.
pub fn value_bytes_max_for(segment_bytes: u64, grain_bytes: u32, key_len: usize) -> u64 {
    use granary_format::limits::{RECORD_HEADER_BYTES, VALUE_BYTES_MAX};
    let record_max = (segment_bytes / grain_bytes as u64).saturating_sub(1) * grain_bytes as u64;
    record_max.saturating_sub((RECORD_HEADER_BYTES as u64).saturating_add(key_len as u64)).min(VALUE_BYTES_MAX)
}

/// Default segment size for a data area of `data_bytes`.
pub fn default_segment_bytes(data_bytes: u64) -> u64 {
    let target = (data_bytes / SEGMENT_COUNT_DEFAULT_MIN).max(1);
    let pow = 1u64 << (63 - target.leading_zeros());
    pow.clamp(1 << 20, SEGMENT_BYTES_DEFAULT_MAX)
}

/// Default home slots per index table for `data_bytes` of `grain_bytes`
/// grains: one record per grain at 85% occupancy with 256 tables.
pub fn default_index_table_homes(data_bytes: u64, grain_bytes: u32) -> u32 {
    let max_records = data_bytes / grain_bytes as u64;
    let per_table = (max_records >> TABLES_LOG2_MAX) * 100 / 85 + 1;
    per_table.clamp(INDEX_TABLE_HOMES_MIN as u64, INDEX_TABLE_HOMES_MAX as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scale_with_device() {
        assert_eq!(default_segment_bytes(1 << 30), 16 << 20);
        assert_eq!(default_segment_bytes(8 << 20), 1 << 20);
        assert_eq!(default_segment_bytes(1 << 50), 1 << 30);
        // 1 GiB of 512 B grains: 2 Mi records over 256 tables at 85%.
        assert_eq!(default_index_table_homes(1 << 30, 512), 9638);
        assert_eq!(default_index_table_homes(1 << 20, 4096), INDEX_TABLE_HOMES_MIN);
    }

    /// The coarse system clock is the wall clock in Unix seconds (a tick
    /// behind at most), not some other clock.
    #[test]
    fn system_clock_is_unix_time() {
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let ours = Clock::system().now() as u64;
        assert!(ours + 2 >= wall && ours <= wall + 1, "system clock {ours}, wall clock {wall}");
    }
}
