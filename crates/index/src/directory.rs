//! The directory of tables, key placement, region locks and the online,
//! incremental resize uDepot describes (the directory doubles its tables,
//! and entries move over one lock region at a time while lookups and
//! writes go on).
//!
//! **Placement.** A key's hash gives its tag (8 bits) and its home slot: the
//! 27 slot bits scaled to the table size (`(bits * homes) >> 27`), so tables
//! may have any number of homes, fixed when the index is created. The
//! directory has `2^d` tables (`d <= 8`); the tag's low `d` bits pick one.
//!
//! **Locks.** A fixed array of region locks, one per (table mod `L0`,
//! region), where `L0` is the number of tables the index started with and a
//! region is `2^region_log2` consecutive slots (by default sized for about
//! [`LOCKS_TARGET`] locks in all, between 128 and 8192 slots a region).
//! Table `t` and the
//! two tables it splits into, `t` and `t + n`, share the lock of every
//! region, so the same lock guards a region before, during and after a
//! resize. A writer locks the region of its home `b` and the next one: at
//! most two locks, always in increasing order, and it touches only slots in
//! the regions it holds. A region lock is a mutex plus a version (a
//! seqlock): writers make the version odd while they hold the mutex, and a
//! lookup takes no region lock: it reads the regions of `b` and `b + H - 1`
//! and retries if either version was odd or changed meanwhile (it takes the
//! table's stash mutex only when its region has stashed entries).
//!
//! **Resize.** The first insert that finds no room starts a grow: a new
//! directory of `2n` tables is published together with a *migration*
//! record: the old directory, one "migrated" flag per (old table, region)
//! and a countdown. The new directory's first `n` tables *are* the old
//! ones (shared, split in place); the other `n` are new, zeroed and lazily
//! allocated. From then on every writer first migrates the regions it holds
//! (moving each entry of old table `t` whose tag bit `d` is set to table
//! `t + n`, and each entry homed in the region toward its home; no key is
//! read) and then works on the new
//! directory; a lookup reads each slot from the old or the new directory
//! according to its region's flag. The writer that migrates the last region
//! publishes a state without the migration. No writer ever copies a whole
//! table, except an insert that finds its new neighbourhood full while a
//! migration is still running (rare: new tables are half as full), which
//! finishes the migration before growing again.
//!
//! **Reclamation.** Splitting in place means no table is ever freed while
//! the index lives: a grow only adds tables. What a grow replaces is the
//! small state record (the directory's table list and the migration's
//! flags, about a byte per region); replaced states are kept, unused, until
//! the index is dropped (at most two per grow, 16 in all: a few MiB at
//! most, for the largest tables' many regions). So a reader needs no protection at all for what it reads: no
//! epoch pin, no hazard pointer, no reference count. (An epoch pin per
//! lookup, `crossbeam-epoch`'s, costs about as much as an isolated lookup
//! itself; see docs/BENCHMARKS-HISTORY.md.) A state's address
//! is never reused while the index lives, so comparing state pointers
//! identifies states.
//! Growth is driven by load: an insert that finds no room grows the
//! directory only once the index holds [`GROW_LOAD_PERCENT`] of its
//! slots (or its table's stash is full). Below that, and at the largest
//! directory, the entry goes to its table's small stash (see `table`): one
//! dense neighbourhood must not double the whole index. A migration moves a
//! region's stashed entries with the region.
//!
//! **Validation.** An operation loads the state, takes its locks, then checks
//! that the state is still the one it loaded; if not, it retries. With its
//! locks held, no migration of its regions can start, so what it saw stays
//! true until it unlocks.

use crate::entry::Entry;
use crate::sync::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Mutex, MutexGuard};
use crate::table::{Span, Table};
use crate::{NEIGHBOURHOOD as H, REGION_SLOTS_LOG2_DEFAULT, TABLES_LOG2_MAX};
use granary_format::hash;
use granary_format::limits::PBA_MAX;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// The free slots of one region of the two tables a migration splits, one
/// bit each, while `Index::migrate_region` makes its single pass: the old
/// table's bits are set as the pass frees its slots (slots past the pass
/// are never asked), the new table's start all free.
struct FreeSlots {
    lo: usize,
    low: Vec<u64>,
    high: Vec<u64>,
}

impl FreeSlots {
    fn new(lo: usize, hi: usize) -> FreeSlots {
        let words = (hi - lo).div_ceil(64);
        FreeSlots { lo, low: vec![0; words], high: vec![!0; words] }
    }

    fn low_freed(&mut self, s: usize) {
        let i = s - self.lo;
        self.low[i / 64] |= 1 << (i % 64);
    }

    fn low_taken(&mut self, s: usize) {
        let i = s - self.lo;
        self.low[i / 64] &= !(1 << (i % 64));
    }

    fn high_taken(&mut self, s: usize) {
        let i = s - self.lo;
        self.high[i / 64] &= !(1 << (i % 64));
    }

    /// The first free slot in `[from, to)` of the new table (`high`) or the
    /// old one.
    fn first(&self, high: bool, from: usize, to: usize) -> Option<usize> {
        let bits = if high { &self.high } else { &self.low };
        let (mut i, end) = (from - self.lo, to - self.lo);
        while i < end {
            let w = bits[i / 64] >> (i % 64);
            if w != 0 {
                let f = i + w.trailing_zeros() as usize;
                return (f < end).then_some(f + self.lo);
            }
            i = (i / 64 + 1) * 64;
        }
        None
    }
}

/// Geometry of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Home slots per table (from the superblock), 1 ..= 2^27.
    pub table_homes: u32,
    /// log2 of the slots per lock region (>= 5: a region holds a neighbourhood).
    pub region_log2: u32,
    /// log2 of the number of tables to start with (also the lock array's
    /// multiple: more initial tables, more locks).
    pub initial_tables_log2: u32,
    /// An insert that finds no room grows the directory once the index
    /// holds this share of its slots (percent); below it, the entry is
    /// stashed. 0 grows at the first full neighbourhood.
    pub grow_load_percent: u64,
    /// Keep a 4-byte access word beside every slot (see [`Index::access`]);
    /// off by default: it costs 4 bytes per slot.
    pub access_words: bool,
}

impl IndexConfig {
    /// One table to start with; regions sized by [`Self::with_tables`].
    pub fn new(table_homes: u32) -> IndexConfig {
        IndexConfig::with_tables(table_homes, 0)
    }

    /// `2^initial_tables_log2` tables to start with, and regions sized so
    /// the index has about [`LOCKS_TARGET`] region locks in all (between 128
    /// and 8192 slots a region): enough that threads rarely meet on one,
    /// few enough that the lock array stays in cache.
    pub fn with_tables(table_homes: u32, initial_tables_log2: u32) -> IndexConfig {
        let slots = table_homes as u64 + H as u64 - 1;
        let per_table = (LOCKS_TARGET >> initial_tables_log2).max(1);
        let log2 = (63 - (slots / per_table).max(1).leading_zeros()).clamp(7, REGION_SLOTS_LOG2_DEFAULT);
        IndexConfig {
            table_homes,
            region_log2: log2,
            initial_tables_log2,
            grow_load_percent: GROW_LOAD_PERCENT,
            access_words: false,
        }
    }
}

/// Default of [`IndexConfig::grow_load_percent`].
pub const GROW_LOAD_PERCENT: u64 = 85;

/// Region locks an index aims for (see [`IndexConfig::with_tables`]).
pub const LOCKS_TARGET: u64 = 1024;

/// The home slot of hash `h` in a table of `homes` homes.
pub fn home_of(h: u64, homes: u32) -> usize {
    ((hash::slot_bits(h) * homes as u64) >> hash::SLOT_BITS) as usize
}

/// Why an insert failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexError {
    /// The directory is at its largest and the key's neighbourhood is full.
    Full { tables: usize, entries: u64 },
    /// [`H`] entries already share the key's home slot and key tag (its
    /// 39-bit fingerprint): no grow separates them, and a lookup's
    /// candidates hold no more. Keys chosen to collide get here; random
    /// ones practically never do.
    Crowded,
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::Full { tables, entries } => write!(
                f,
                "index full: {tables} tables hold {entries} entries and a key's neighbourhood has no \
                 free slot; recreate the store with a larger index (more home slots per table)"
            ),
            IndexError::Crowded => write!(
                f,
                "index: {H} keys already share this key's 39-bit hash fingerprint (home slot and key tag), \
                 the most one fingerprint may hold; keys chosen to collide?"
            ),
        }
    }
}

impl std::error::Error for IndexError {}

/// Tag-matching entries of one key hash: the candidates a reader checks.
#[derive(Clone, Copy)]
pub struct Candidates {
    n: usize,
    /// `e[..n]` are initialised. Left uninitialised past `n`: a lookup
    /// runs in a loop of many, where storing 32 free entries first would be
    /// a measurable share of its instructions.
    e: [MaybeUninit<Entry>; H],
}

impl Candidates {
    fn new() -> Candidates {
        Candidates { n: 0, e: [MaybeUninit::uninit(); H] }
    }

    /// Add `e`; past `H` candidates the rest are dropped (callers bound
    /// the candidates of one key tag and home to `H`).
    fn push(&mut self, e: Entry) {
        if let Some(slot) = self.e.get_mut(self.n) {
            slot.write(e);
            self.n += 1;
        }
    }

    pub fn as_slice(&self) -> &[Entry] {
        // SAFETY: `e[..n]` are initialised (`push` writes before counting),
        // and MaybeUninit<Entry> has Entry's layout.
        unsafe { std::slice::from_raw_parts(self.e.as_ptr().cast::<Entry>(), self.n) }
    }
}

/// Point-in-time index figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub entries: u64,
    pub tables: u64,
    pub slots: u64,
    /// Bytes of table memory allocated (the old tables too, during a resize).
    pub memory_bytes: u64,
    pub grows: u64,
    pub resizing: bool,
    /// Entries in the tables' stashes (their neighbourhoods were full).
    pub stashed: u64,
}

struct Dir {
    /// Shared with the directories before and after a grow (split in place).
    tables: Box<[Arc<Table>]>,
    log2: u32,
}

struct Migration {
    old: Arc<Dir>,
    /// One flag per (old table, region).
    done: Box<[AtomicBool]>,
    remaining: AtomicUsize,
}

struct State {
    /// +1 with every new state.
    gen: u64,
    cur: Arc<Dir>,
    mig: Option<Migration>,
}

#[derive(Clone, Copy)]
struct Place {
    table: usize,
    home: usize,
    /// The key tag (tag and fp) entries of this hash carry.
    ktag: u16,
}

/// One region's lock: writers hold the mutex and keep the version odd while
/// they do; readers check the version before and after reading.
struct RegionLock {
    mutex: Mutex<()>,
    version: AtomicU64,
}

impl RegionLock {
    fn write(&self) -> MutexGuard<'_, ()> {
        let g = lock(&self.mutex);
        self.version.fetch_add(1, Relaxed);
        // Readers that see slot writes made after this point also see the
        // odd version when they re-check it.
        fence(Release);
        g
    }

    /// The version to validate a read against; None while a writer is in.
    #[inline]
    fn read_begin(&self) -> Option<u64> {
        let v = self.version.load(Acquire);
        (v & 1 == 0).then_some(v)
    }
}

struct Held<'a> {
    a: (&'a RegionLock, MutexGuard<'a, ()>),
    b: Option<(&'a RegionLock, MutexGuard<'a, ()>)>,
    ra: usize,
    rb: usize,
    span: Span,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Even again: the slot writes are visible to a reader that sees it.
        if let Some((l, _)) = &self.b {
            l.version.fetch_add(1, Release);
        }
        self.a.0.version.fetch_add(1, Release);
    }
}

/// The entry count, striped over cache lines: one shared counter's line
/// would bounce between the cores on every insert. Each thread counts in a
/// stripe of its own (while there are no more threads than stripes):
/// stripes picked by key would still bounce, each thread's next stripe
/// being in the other core's cache half the time with two threads.
/// Stripes wrap (an entry may
/// be counted up in one and down in another); their wrapping sum is exact.
#[derive(Default)]
struct Counter {
    stripes: [Padded; COUNTER_STRIPES],
}

const COUNTER_STRIPES: usize = 32;

#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Counter {
    /// Add `n` (wrapping) in this thread's stripe.
    fn add(&self, n: u64) {
        self.stripes[Self::stripe()].0.fetch_add(n, Relaxed);
    }

    /// This thread's stripe: threads take stripes in turn as they first
    /// count.
    #[cfg(not(loom))]
    fn stripe() -> usize {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        std::thread_local!(static MINE: usize = NEXT.fetch_add(1, Relaxed) % COUNTER_STRIPES);
        MINE.with(|s| *s)
    }

    /// Under loom every stripe is the first (loom's threads are not std's).
    #[cfg(loom)]
    fn stripe() -> usize {
        0
    }

    /// The stripes' total; never below 0: an insert counts its entry only
    /// after releasing its locks, so a remove of that entry on another
    /// stripe may be counted first, and the wrapped total would read as
    /// about 2^64 for a moment (a debug build's `loaded` check overflowed
    /// on it, a release build grew the index for nothing).
    fn sum(&self) -> u64 {
        let total = self.stripes.iter().fold(0u64, |a, s| a.wrapping_add(s.0.load(Relaxed)));
        (total as i64).max(0) as u64
    }
}

/// The concurrent index.
pub struct Index {
    cfg: IndexConfig,
    /// Lock regions per table.
    regions: usize,
    locks: Box<[RegionLock]>,
    /// The current state: never null, never freed before the index.
    state: AtomicPtr<State>,
    /// Every state replaced so far, kept until the index is dropped (see
    /// "Reclamation" above). Raw pointers from `Box::into_raw`, made boxes
    /// again only in the index's drop: readers may still hold shared
    /// references into them, which a `Box` (unique) must not claim.
    retired: Mutex<Vec<Retired>>,
    entries: Counter,
    grows: AtomicU64,
    /// Serialises starting a grow and whole-index walks.
    grow_lock: Mutex<()>,
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // Entries are single atomic stores, so a panic under a lock leaves no
    // half-written state: a poisoned lock is safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Insert {
    Done,
    /// `insert_if_no_candidates` found these.
    Found(Box<Candidates>),
    Grow,
    Full,
    /// The key's fingerprint already has [`H`] entries.
    Crowded,
}

impl Index {
    pub fn new(cfg: IndexConfig) -> Index {
        assert!(cfg.table_homes >= 1 && cfg.table_homes <= 1 << hash::SLOT_BITS);
        assert!(cfg.initial_tables_log2 <= TABLES_LOG2_MAX);
        assert!((1usize << cfg.region_log2) >= H, "a region must hold a neighbourhood");
        let slots = cfg.table_homes as usize + H - 1;
        let regions = slots.div_ceil(1 << cfg.region_log2);
        let n = 1usize << cfg.initial_tables_log2;
        let dir = Dir {
            tables: (0..n)
                .map(|_| Arc::new(Table::new(cfg.table_homes as usize, cfg.region_log2, cfg.access_words)))
                .collect(),
            log2: cfg.initial_tables_log2,
        };
        // Fault the tables in here, not in the first inserts (see
        // `Table::populate`).
        dir.tables.iter().for_each(|t| t.populate());
        Index {
            cfg,
            regions,
            locks: (0..n * regions).map(|_| RegionLock { mutex: Mutex::new(()), version: AtomicU64::new(0) }).collect(),
            state: AtomicPtr::new(Box::into_raw(Box::new(State { gen: 0, cur: Arc::new(dir), mig: None }))),
            retired: Mutex::new(Vec::new()),
            entries: Counter::default(),
            grows: AtomicU64::new(0),
            grow_lock: Mutex::new(()),
        }
    }

    pub fn config(&self) -> IndexConfig {
        self.cfg
    }

    /// The current state, and its address (to compare with later loads).
    #[inline]
    fn load_state(&self) -> (*mut State, &State) {
        let sp = self.state.load(Acquire);
        // SAFETY: the state pointer is never null (set in `new`, replaced
        // only by other boxed states), and no state is freed before the
        // index is dropped (replaced ones go to `retired`), so it outlives
        // this borrow of the index.
        (sp, unsafe { &*sp })
    }

    /// Replace state `sp` by `next` (the caller is the only one that may:
    /// it holds the grow lock, or migrated the last region), keeping `sp`.
    fn replace_state(&self, sp: *mut State, next: State) {
        let next = Box::into_raw(Box::new(next));
        let swapped = self.state.compare_exchange(sp, next, AcqRel, Acquire);
        assert!(swapped.is_ok(), "states change only under the grow lock or by the last migrator");
        // `sp` is no longer the current state; it is kept, not freed (nor
        // made a box), so readers still holding it stay valid.
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(Retired(sp));
    }

    /// Home slot of a hash in this index.
    pub fn home(&self, h: u64) -> usize {
        home_of(h, self.cfg.table_homes)
    }

    #[inline]
    fn place(&self, log2: u32, h: u64) -> Place {
        let tag = hash::tag(h);
        Place { table: (tag as usize) & ((1 << log2) - 1), home: self.home(h), ktag: hash::key_tag(h) }
    }

    fn region(&self, slot: usize) -> usize {
        slot >> self.cfg.region_log2
    }

    fn lock_regions(&self, table: usize, ra: usize, rb: usize) -> Held<'_> {
        debug_assert!(ra <= rb && rb - ra <= 1 && rb < self.regions);
        let (la, lb) = self.region_locks(table, ra, rb);
        let a = (la, la.write());
        let b = (rb != ra).then(|| (lb, lb.write()));
        let slots = self.cfg.table_homes as usize + H - 1;
        let span = Span { lo: ra << self.cfg.region_log2, hi: ((rb + 1) << self.cfg.region_log2).min(slots) };
        Held { a, b, ra, rb, span }
    }

    #[inline]
    fn region_locks(&self, table: usize, ra: usize, rb: usize) -> (&RegionLock, &RegionLock) {
        let base = (table & ((1 << self.cfg.initial_tables_log2) - 1)) * self.regions;
        (&self.locks[base + ra], &self.locks[base + rb])
    }

    /// Run the read-only `f` on hash `h`'s neighbourhood without locking:
    /// retried until no writer touched its regions meanwhile.
    #[inline]
    fn optimistic<R>(&self, h: u64, mut f: impl FnMut(&State, Place) -> R) -> R {
        loop {
            let (sp, st) = self.load_state();
            let p = self.place(st.cur.log2, h);
            let (ra, rb) = (self.region(p.home), self.region(p.home + H - 1));
            let (la, lb) = self.region_locks(p.table, ra, rb);
            let (Some(va), Some(vb)) = (la.read_begin(), lb.read_begin()) else {
                crate::sync::spin_loop();
                continue;
            };
            let out = f(st, p);
            fence(Acquire);
            if la.version.load(Relaxed) == va && lb.version.load(Relaxed) == vb && self.state.load(Relaxed) == sp {
                return out;
            }
        }
    }

    /// Run the writer `f` with the state loaded and validated under the
    /// locks of hash `h`'s home region and the next, migrated if a resize runs.
    fn locked<R>(&self, h: u64, f: impl FnOnce(&State, Place, &Held<'_>) -> R) -> R {
        loop {
            let (sp, st) = self.load_state();
            let p = self.place(st.cur.log2, h);
            let ra = self.region(p.home);
            let rb = (ra + 1).min(self.regions - 1);
            let held = self.lock_regions(p.table, ra, rb);
            if self.state.load(Acquire) != sp {
                continue; // a resize started or finished: place again
            }
            if let Some(m) = &st.mig {
                let t_old = p.table & (m.old.tables.len() - 1);
                for r in held.ra..=held.rb {
                    self.migrate_region(sp, st, m, t_old, r);
                }
            }
            return f(st, p, &held);
        }
    }

    /// Split region `r` of old table `t_old` in place, once: its entries
    /// whose tag bit `d` is set move to table `t_old + n`, and each entry
    /// homed in the region lands, in its table, on the first free slot
    /// between its home and its old slot. The caller holds the region's
    /// lock. Without the moves toward the homes, the entries of a grown
    /// index kept the displacement they got at the growth load: in a 4
    /// M-key index grown to 16 tables, 11.7% of them lay beyond their
    /// home's first two lines against 6.1% in one pre-sized for 16, and a
    /// lookup reads the lines past those two only after another cache miss.
    fn migrate_region(&self, sp: *mut State, st: &State, m: &Migration, t_old: usize, r: usize) {
        let flag = &m.done[t_old * self.regions + r];
        if flag.load(Relaxed) {
            return;
        }
        let n_old = m.old.tables.len();
        let (low, high) = (&st.cur.tables[t_old], &st.cur.tables[t_old + n_old]);
        debug_assert!(Arc::ptr_eq(low, &m.old.tables[t_old]), "split in place");
        let moves = |e: Entry| (e.tag() >> m.old.log2) & 1 == 1;
        let lo = r << self.cfg.region_log2;
        let hi = ((r + 1) << self.cfg.region_log2).min(low.len());
        // One pass splits the region and compacts both halves: each entry
        // homed in the region goes, in the table its tag bit picks, to the
        // first free slot between its home and its old slot (entries only
        // move toward their homes, so every hop hint stays an upper bound;
        // the holes are free slots and the other table's entries), and
        // the hint each home needs in each table is gathered on the way.
        // Entries homed in the region before stay at their slots (in the
        // table their bit picks): their homes' hints belong to that
        // region's lock. The new table's slots of an unmigrated region are
        // all free: a writer migrates every region it holds before it
        // writes.
        let mut free = FreeSlots::new(lo, hi);
        let mut need = vec![(0u8, 0u8); hi - lo];
        for s in lo..hi {
            debug_assert!(high.get(s).is_free(), "a new table's slot of an unmigrated region is free");
            let e = low.get(s);
            if e.is_free() {
                free.low_freed(s);
                continue;
            }
            let up = moves(e);
            let off = e.neigh_off() as usize;
            if off > s - lo {
                // Homed in the region before.
                if up {
                    high.set(s, e);
                    high.set_aux(s, low.get_aux(s));
                    low.set(s, Entry::FREE);
                    low.set_aux(s, 0);
                    free.low_freed(s);
                    free.high_taken(s);
                }
                continue;
            }
            let home = s - off;
            let to = free.first(up, home, s).unwrap_or(s);
            if up || to != s {
                let dest = if up { high } else { low };
                dest.set(to, e.with_neigh_off((to - home) as u32));
                dest.set_aux(to, low.get_aux(s));
                low.set(s, Entry::FREE);
                low.set_aux(s, 0);
                free.low_freed(s);
                if up {
                    free.high_taken(to);
                } else {
                    free.low_taken(to);
                }
            }
            let n = &mut need[home - lo];
            let v = if up { &mut n.1 } else { &mut n.0 };
            *v = (*v).max(crate::table::hint_need(home, to) as u8);
        }
        // The hop hints of this region's homes: a home whose whole
        // neighbourhood lies in this region gets the exact hint of what
        // each table keeps (the old hint was set when the table was twice
        // as full). One whose neighbourhood runs into the next region keeps
        // the old hint in both tables, which bounds its entries there too
        // (they stay at their slots when that region migrates); until the
        // migration ends, lookups read every slot.
        for home in lo..hi {
            let (nl, nh) = need[home - lo];
            if home + H <= hi {
                low.set_hint(home, nl as u64);
                high.set_hint(home, nh as u64);
            } else {
                high.raise_hint(home, low.hint(home));
            }
        }
        // Stashed entries homed in this region go back into a neighbourhood
        // of their (now less full) table when it has room inside this
        // region, else to its stash.
        for (home, e, aux) in low.stash_take_region(r) {
            let dest = if moves(e) { high } else { low };
            let placed = home + H <= hi && dest.insert(Span { lo, hi }, home, e, aux);
            if !placed {
                dest.stash_push_always(home, e, aux);
            }
        }
        flag.store(true, Relaxed);
        if m.remaining.fetch_sub(1, AcqRel) == 1 {
            // Last region: publish the state without the migration.
            self.replace_state(sp, State { gen: st.gen + 1, cur: st.cur.clone(), mig: None });
        }
    }

    /// Finish a running migration, one region (one lock) at a time.
    fn complete_migration(&self) {
        let (sp, st) = self.load_state();
        let Some(m) = &st.mig else { return };
        for t_old in 0..m.old.tables.len() {
            for r in 0..self.regions {
                let _held = self.lock_regions(t_old, r, r);
                if self.state.load(Acquire) != sp {
                    return; // finished by others
                }
                self.migrate_region(sp, st, m, t_old, r);
            }
        }
    }

    /// Start a grow if the state is still generation `seen` (or finish the
    /// migration in the way).
    fn grow(&self, seen: u64) -> Result<(), IndexError> {
        let _g = lock(&self.grow_lock);
        let (sp, st) = self.load_state();
        if st.gen != seen {
            return Ok(()); // the state moved on: retry the insert
        }
        if st.mig.is_some() {
            drop(_g);
            self.complete_migration();
            return Ok(());
        }
        if st.cur.log2 >= TABLES_LOG2_MAX {
            return Err(IndexError::Full { tables: st.cur.tables.len(), entries: self.entries.sum() });
        }
        let n = st.cur.tables.len();
        // Left lazy: faulting them in here would stall this insert for the
        // whole size of the new tables; migrations fault in their pages.
        let fresh = (0..n)
            .map(|_| Arc::new(Table::new(self.cfg.table_homes as usize, self.cfg.region_log2, self.cfg.access_words)));
        let dir = Dir { tables: st.cur.tables.iter().cloned().chain(fresh).collect(), log2: st.cur.log2 + 1 };
        let regions = n * self.regions;
        let mig = Migration {
            old: st.cur.clone(),
            done: (0..regions).map(|_| AtomicBool::new(false)).collect(),
            remaining: AtomicUsize::new(regions),
        };
        self.replace_state(sp, State { gen: st.gen + 1, cur: Arc::new(dir), mig: Some(mig) });
        self.grows.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Ask the CPU to start loading `h`'s neighbourhood into its cache (a
    /// hint: nothing is read, nothing can fault). A caller with many keys
    /// to look up (a log scan) prefetches a batch, then looks each up, so
    /// their cache misses overlap instead of following one another.
    pub fn prefetch(&self, h: u64) {
        let (_, st) = self.load_state();
        let p = self.place(st.cur.log2, h);
        st.cur.tables[p.table].prefetch(p.home);
        let ra = self.region(p.home);
        let (la, _) = self.region_locks(p.table, ra, ra);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it never faults and changes no
        // memory. SSE is part of the x86-64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(la as *const RegionLock as *const i8)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = la;
    }

    /// Entries whose home and tag match `h`: the key's candidates.
    #[inline]
    pub fn lookup(&self, h: u64) -> Candidates {
        // Filled in place, not returned from the closure: a lookup runs in
        // loops of many, and moving the 264-byte result out of the closure
        // cost a `memmove` call each.
        let mut c = Candidates::new();
        self.optimistic(h, |st, p| {
            c.n = 0;
            self.each_candidate(st, p, |e| c.push(e));
        });
        c
    }

    /// Whether `h` has a candidate pointing at `pba`: [`Index::lookup`]
    /// followed by a search of its candidates for `pba` (what GC's
    /// liveness check and a reader's re-check ask), without gathering the
    /// candidates. Lookups run in loops of many whose cache misses overlap
    /// only while the CPU's instruction window holds more than one lookup,
    /// so the fewer instructions the better (docs/BENCHMARKS-HISTORY.md compares
    /// the two).
    #[inline]
    pub fn contains(&self, h: u64, pba: u64) -> bool {
        if pba > PBA_MAX {
            return false; // no entry points there (all ones is a free slot)
        }
        #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.contains_avx2(h, pba) };
        }
        self.contains_any(h, pba)
    }

    /// [`Index::contains`] on any state: candidates gathered one by one.
    #[cold]
    fn contains_any(&self, h: u64, pba: u64) -> bool {
        self.optimistic(h, |st, p| {
            let mut found = false;
            self.each_candidate(st, p, |e| found |= e.pba() == pba);
            found
        })
    }

    /// [`Index::contains`] while no resize runs and the key's region has
    /// no stashed entry (else [`Index::contains_any`]): every slot the hop
    /// hint names compared whole in vector registers
    /// ([`crate::table::holds_avx2`]), compiled with AVX2 so that it and
    /// the placement are one function without calls. About half the
    /// instructions of the general pass, which is what lets the CPU overlap
    /// the cache misses of successive lookups. A first pass without the
    /// region versions answers every key that is there (see below); a
    /// second, validated one, the rest.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    #[target_feature(enable = "avx2")]
    unsafe fn contains_avx2(&self, h: u64, pba: u64) -> bool {
        // First without the seqlock: a slot seen holding the entry proves
        // it (the slot was read whole, see `table::load_line`), so a key
        // that is there needs no version loads at all. Only a miss, which a
        // writer moving the entry meanwhile could cause, is asked again
        // below under the region versions.
        let (_, st) = self.load_state();
        if st.mig.is_none() && crate::table::aligned_16_byte_loads_are_atomic() {
            let p = self.place(st.cur.log2, h);
            // SAFETY: the CPU has AVX2 (this function's contract), and
            // `p.home` is a home of the table (as below).
            if unsafe { crate::table::holds_avx2(st.cur.tables[p.table].slots(), p.home, p.ktag, pba) } {
                return true;
            }
        }
        loop {
            let (sp, st) = self.load_state();
            if st.mig.is_some() {
                return self.contains_any(h, pba);
            }
            let p = self.place(st.cur.log2, h);
            let (ra, rb) = (self.region(p.home), self.region(p.home + H - 1));
            let (la, lb) = self.region_locks(p.table, ra, rb);
            let (va, vb) = (la.version.load(Acquire), lb.version.load(Acquire));
            let table = &st.cur.tables[p.table];
            // SAFETY: the CPU has AVX2 (this function's contract), and
            // `p.home` is a home of `table`, whose slots hold every home's
            // neighbourhood and the line after the home's line.
            let found = unsafe { crate::table::holds_avx2(table.slots(), p.home, p.ktag, pba) };
            let stashed = table.has_stashed(p.home);
            fence(Acquire);
            let unchanged = la.version.load(Relaxed) == va && lb.version.load(Relaxed) == vb;
            if (va | vb) & 1 == 0 && unchanged && self.state.load(Relaxed) == sp {
                if stashed && !found {
                    return self.contains_any(h, pba);
                }
                return found;
            }
            crate::sync::spin_loop();
        }
    }

    /// Call `f` on each candidate of place `p` in state `st` (an
    /// optimistic reader's pass: the caller validates afterwards).
    #[inline]
    fn each_candidate(&self, st: &State, p: Place, mut f: impl FnMut(Entry)) {
        let cur = &st.cur.tables[p.table];
        let Some(m) = &st.mig else {
            cur.scan(p.home, p.ktag, &mut f);
            cur.stash_matches(p.home, p.ktag, &mut f);
            return;
        };
        let t_old = p.table & (m.old.tables.len() - 1);
        // A stashed entry migrates with its home's region.
        let stash =
            if m.done[t_old * self.regions + self.region(p.home)].load(Relaxed) { cur } else { &m.old.tables[t_old] };
        for off in 0..H {
            let s = p.home + off;
            let e = if m.done[t_old * self.regions + self.region(s)].load(Relaxed) {
                cur.get(s)
            } else {
                m.old.tables[t_old].get(s)
            };
            if !e.is_free() && e.neigh_off() as usize == off && e.key_tag() == p.ktag {
                f(e);
            }
        }
        stash.stash_matches(p.home, p.ktag, &mut f);
    }

    /// Add an entry for a key not yet in the index; grows when the key's
    /// neighbourhood is full.
    pub fn insert(&self, h: u64, kv_size: u64, pba: u64) -> Result<(), IndexError> {
        self.insert_with(h, kv_size, pba, 0)
    }

    /// [`Index::insert`] giving the new entry the access word `aux`.
    pub fn insert_with(&self, h: u64, kv_size: u64, pba: u64, aux: u32) -> Result<(), IndexError> {
        self.insert_inner(h, kv_size, pba, aux, false).map(|_| ())
    }

    /// Insert an entry for `h` only if `h` has no candidates; else insert
    /// nothing and return them. One locked pass instead of a lookup and
    /// an insert, for a caller that inserts after finding no candidates and
    /// has nothing else to serialise against (the log scan holds the key's
    /// stripe).
    pub fn insert_if_no_candidates(&self, h: u64, kv_size: u64, pba: u64) -> Result<Option<Candidates>, IndexError> {
        self.insert_inner(h, kv_size, pba, 0, true)
    }

    fn insert_inner(
        &self,
        h: u64,
        kv_size: u64,
        pba: u64,
        aux: u32,
        unless_candidates: bool,
    ) -> Result<Option<Candidates>, IndexError> {
        // The neighbourhood's lines start loading while the lock's line
        // does: two cache misses overlapped instead of one after the other.
        self.prefetch(h);
        loop {
            let (outcome, seen) = self.locked(h, |st, p, held| {
                let table = &st.cur.tables[p.table];
                if unless_candidates {
                    // The regions are migrated: the current table has them.
                    let mut c = Candidates::new();
                    let mut push = |e| c.push(e);
                    table.scan(p.home, p.ktag, &mut push);
                    table.stash_matches(p.home, p.ktag, &mut push);
                    if c.n > 0 {
                        return (Insert::Found(Box::new(c)), st.gen);
                    }
                }
                let e = Entry::new(0, p.ktag, kv_size, pba);
                let can_grow = st.cur.log2 < TABLES_LOG2_MAX;
                let slots = (st.cur.tables.len() * st.cur.tables[0].len()) as u64;
                // Summed only when the neighbourhood is full (rare).
                let loaded = || self.entries.sum() * 100 >= slots * self.cfg.grow_load_percent;
                // With stashed entries in the region, a group may be full
                // while its neighbourhood has a free slot: checked first,
                // so that no group ever holds more than a lookup returns.
                let crowded = || table.group_len(p.home, p.ktag) >= H;
                let outcome = if table.has_stashed(p.home) && crowded() {
                    Insert::Crowded
                } else if table.insert(held.span, p.home, e, aux) {
                    Insert::Done
                } else if crowded() {
                    // No grow would help (the group stays together), and
                    // growing for it would fault in every new table.
                    Insert::Crowded
                } else if can_grow && loaded() {
                    Insert::Grow
                } else if table.stash_push(p.home, e, aux) {
                    // An isolated overflow below the growth load: stashed, so
                    // one dense neighbourhood never doubles the whole index.
                    // (`stash_push` refuses a 33rd entry of one home and tag,
                    // so a key's candidates always fit in a `Candidates`.)
                    Insert::Done
                } else if can_grow {
                    Insert::Grow
                } else {
                    Insert::Full
                };
                (outcome, st.gen)
            });
            match outcome {
                Insert::Done => {
                    self.entries.add(1);
                    return Ok(None);
                }
                Insert::Found(c) => return Ok(Some(*c)),
                Insert::Grow => self.grow(seen)?,
                Insert::Crowded => return Err(IndexError::Crowded),
                Insert::Full => {
                    let entries = self.entries.sum();
                    return Err(IndexError::Full { tables: 1 << TABLES_LOG2_MAX, entries });
                }
            }
        }
    }

    /// Point the entry of `h` that points at `old_pba` to a new record.
    /// Returns false if no such entry exists.
    /// The entry keeps its access word (a relocation moves the same item).
    pub fn replace(&self, h: u64, old_pba: u64, kv_size: u64, pba: u64) -> bool {
        self.replace_with(h, old_pba, kv_size, pba, |a| a)
    }

    /// [`Index::replace`] setting the access word to `aux(old word)`.
    pub fn replace_with(&self, h: u64, old_pba: u64, kv_size: u64, pba: u64, aux: impl FnOnce(u32) -> u32) -> bool {
        self.locked(h, |st, p, _held| {
            let new = Entry::new(0, p.ktag, kv_size, pba);
            st.cur.tables[p.table].update(p.home, p.ktag, old_pba, Some(new), aux)
        })
    }

    /// The access word of `h`'s entry that points at `pba`, replaced by
    /// `f(old)`; returns the old word, or None when the index keeps no
    /// access words or has no such entry (replaced or removed meanwhile).
    /// When `f` leaves the word as it is, no lock is taken: the word is
    /// read like a lookup reads.
    pub fn access(&self, h: u64, pba: u64, f: impl Fn(u32) -> u32) -> Option<u32> {
        if !self.cfg.access_words {
            return None;
        }
        let peek = self.optimistic(h, |st, p| {
            st.mig.is_none().then(|| st.cur.tables[p.table].peek_access(p.home, p.ktag, pba)).flatten()
        });
        if let Some(old) = peek {
            if f(old) == old {
                return Some(old);
            }
        }
        self.locked(h, |st, p, _held| st.cur.tables[p.table].access(p.home, p.ktag, pba, f))
    }

    /// Remove the entry of `h` that points at `pba`.
    pub fn remove(&self, h: u64, pba: u64) -> bool {
        let done = self.locked(h, |st, p, _held| st.cur.tables[p.table].update(p.home, p.ktag, pba, None, |a| a));
        if done {
            self.entries.add(u64::MAX); // wrapping: -1
        }
        done
    }

    /// Visit every entry exactly once with its home slot: `f(home, entry)`;
    /// returns the directory's tables (log2). Writers may run meanwhile (a
    /// checkpoint, verify): it finishes a running migration and holds off
    /// grows, and walks each table's regions hand over hand (region `r + 1`
    /// is locked before `r` is read and released), so no displacement
    /// (always from a region into the next) can move an entry past the
    /// walk: each entry present throughout is seen once, at one position,
    /// with one value.
    pub fn for_each(&self, mut f: impl FnMut(usize, Entry)) -> u32 {
        let _g = lock(&self.grow_lock);
        self.complete_migration();
        let (_, st) = self.load_state();
        debug_assert!(st.mig.is_none());
        let slots = self.cfg.table_homes as usize + H - 1;
        for (t, table) in st.cur.tables.iter().enumerate() {
            // Readers only: the mutexes exclude writers; versions stay as
            // they are so optimistic lookups are not disturbed.
            let mutex_of = |r: usize| &self.region_locks(t, r, r).0.mutex;
            let mut held = lock(mutex_of(0));
            for r in 0..self.regions {
                let next = (r + 1 < self.regions).then(|| lock(mutex_of(r + 1)));
                let lo = r << self.cfg.region_log2;
                let hi = ((r + 1) << self.cfg.region_log2).min(slots);
                for s in lo..hi {
                    let e = table.get(s);
                    if !e.is_free() {
                        f(s - e.neigh_off() as usize, e);
                    }
                }
                drop(std::mem::replace(
                    &mut held,
                    match next {
                        Some(n) => n,
                        None => break,
                    },
                ));
            }
            drop(held);
            for (home, e) in table.stash_entries() {
                f(home, e);
            }
        }
        st.cur.log2
    }

    /// Visit every entry, in every table, whose home slot is in `homes`,
    /// with its home: `f(home, entry)`. What a key scan pages through: a
    /// key's home is fixed for the index's life (a grow adds tables and
    /// moves entries between them, never to another home), so a walk of
    /// every range of homes, one after another, meets every key that stays
    /// put throughout.
    ///
    /// Each table's regions are walked hand over hand as in
    /// [`Index::for_each`], and besides, each home is seen whole at one
    /// instant: the region after a home's region stays locked from before
    /// the first of the home's slots is read until after the last one is,
    /// and the home's stashed entries are read meanwhile. Every writer of a
    /// home (an insert, replace or remove of one of its entries) holds that
    /// lock; other writers only displace the home's entries forward,
    /// holding both slots' regions, so never from a slot read to one not
    /// read yet. Grows are not held off (a walk of a few regions must not
    /// wait behind a checkpoint's walk of the whole index, which holds the
    /// grow lock): a running migration is finished first, and a walk that a
    /// grow overtook (the state changed meanwhile) is thrown away and made
    /// again, so `f` sees the entries of one walk in one directory. `f` is
    /// called once the walk is done, with no lock held.
    pub fn for_each_homed(&self, homes: std::ops::Range<usize>, mut f: impl FnMut(usize, Entry)) {
        let (lo, hi) = (homes.start, homes.end.min(self.cfg.table_homes as usize));
        if lo >= hi {
            return;
        }
        // The last slot a home of the range may have an entry in.
        let last = hi - 1 + H - 1;
        let (r_lo, r_hi) = (self.region(lo), self.region(last));
        let log2 = self.cfg.region_log2;
        let mut found = Vec::new();
        loop {
            self.complete_migration();
            let (sp, st) = self.load_state();
            if st.mig.is_some() {
                continue; // a grow started since: finish it too
            }
            found.clear();
            for (t, table) in st.cur.tables.iter().enumerate() {
                // Readers only, as in `for_each`: versions are left as they are.
                let mutex_of = |r: usize| &self.region_locks(t, r, r).0.mutex;
                let mut held = lock(mutex_of(r_lo));
                for r in r_lo..=r_hi {
                    let next = (r + 1 < self.regions).then(|| lock(mutex_of(r + 1)));
                    for s in (r << log2).max(lo)..((r + 1) << log2).min(last + 1) {
                        let e = table.get(s);
                        if e.is_free() {
                            continue;
                        }
                        let home = s - e.neigh_off() as usize;
                        if (lo..hi).contains(&home) {
                            found.push((home, e));
                        }
                    }
                    // The stashed entries of this region's homes, with the
                    // homes' writers still locked out.
                    if table.has_stashed(r << log2) {
                        for (home, e) in table.stash_entries() {
                            if self.region(home) == r && (lo..hi).contains(&home) {
                                found.push((home, e));
                            }
                        }
                    }
                    match next {
                        Some(n) => drop(std::mem::replace(&mut held, n)),
                        None => break,
                    }
                }
                drop(held);
            }
            // No grow started during the walk (a state's address is never
            // reused): what it read is one directory's.
            if self.state.load(Acquire) == sp {
                break;
            }
        }
        for (home, e) in found {
            f(home, e);
        }
    }

    /// Entries in the index now (a sum of per-thread counters: exact when
    /// no writer runs).
    pub fn entries(&self) -> u64 {
        self.entries.sum()
    }

    /// Put an entry from a checkpoint back: at the slot its walk found it
    /// in (`home + neigh_off` of the table its tag selects) when that slot is
    /// free and the directory has the checkpoint's tables, else by a normal
    /// insert. Much cheaper than [`Index::insert`] when loading an index
    /// walked in slot order into one of the same geometry.
    pub fn restore(&self, home: usize, e: Entry) -> Result<(), IndexError> {
        let h = self.hash_for(home, e.key_tag());
        let placed = self.locked(h, |st, p, held| {
            if st.mig.is_some() {
                return false;
            }
            let slot = p.home + e.neigh_off() as usize;
            let table = &st.cur.tables[p.table];
            if p.home != home || slot >= held.span.hi || !table.get(slot).is_free() {
                return false;
            }
            table.put(slot, e, 0);
            true
        });
        if placed {
            self.entries.add(1);
            Ok(())
        } else {
            self.insert(h, e.kv_size() as u64, e.pba())
        }
    }

    /// [`Index::restore`] for many entries in checkpoint (table, slot)
    /// order: each run of entries of one table and region is placed under
    /// one acquisition of its region locks.
    pub fn restore_batch(&self, items: &[(usize, Entry)]) -> Result<(), IndexError> {
        let (sp, st) = self.load_state();
        if st.mig.is_some() {
            return items.iter().try_for_each(|&(home, e)| self.restore(home, e));
        }
        let mask = st.cur.tables.len() - 1;
        let homes = self.cfg.table_homes as usize;
        // A home past the table's (a damaged checkpoint) is in the last
        // region's run and goes to the checked path, never to its slot.
        let region_of = |home: usize| self.region(home.min(homes - 1));
        let mut rest = Vec::new();
        let mut i = 0;
        while i < items.len() {
            let (home, e) = items[i];
            let t = e.tag() as usize & mask;
            let r = region_of(home);
            let held = self.lock_regions(t, r, (r + 1).min(self.regions - 1));
            // A grow since the pin: leave the run to the checked path. (A
            // grow after this check migrates these regions only once we
            // release them, copying what we placed.)
            let same = self.state.load(Acquire) == sp;
            let table = &st.cur.tables[t];
            let mut placed = 0;
            while i < items.len() {
                let (home, e) = items[i];
                if e.tag() as usize & mask != t || region_of(home) != r {
                    break;
                }
                let slot = home + e.neigh_off() as usize;
                if same && home < homes && slot < held.span.hi && table.get(slot).is_free() {
                    table.put(slot, e, 0);
                    placed += 1;
                } else {
                    rest.push((home, e));
                }
                i += 1;
            }
            drop(held);
            self.entries.add(placed);
        }
        rest.into_iter().try_for_each(|(home, e)| self.restore(home, e))
    }

    /// A hash that [`Index::insert`] places at `home` with `key_tag`: the
    /// fingerprint rebuilt from a checkpoint item (slot bits chosen so that
    /// [`home_of`] maps them back to `home`).
    pub fn hash_for(&self, home: usize, key_tag: u16) -> u64 {
        let homes = self.cfg.table_homes as u64;
        let slot = ((home as u64) << hash::SLOT_BITS).div_ceil(homes);
        hash::fingerprint(slot, key_tag)
    }

    pub fn stats(&self) -> IndexStats {
        let (_, st) = self.load_state();
        // The old directory's tables are the new one's first half.
        let mem = st.cur.tables.iter().map(|t| t.memory_bytes() as u64).sum::<u64>();
        IndexStats {
            entries: self.entries.sum(),
            tables: st.cur.tables.len() as u64,
            slots: st.cur.tables.iter().map(|t| t.len() as u64).sum(),
            memory_bytes: mem,
            grows: self.grows.load(Relaxed),
            resizing: st.mig.is_some(),
            stashed: st.cur.tables.iter().map(|t| t.stash_len() as u64).sum(),
        }
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread uses the index, so no borrow
        // of the current state is left; it came from `Box::into_raw` and is
        // freed once.
        drop(unsafe { Box::from_raw(crate::sync::take_ptr(&mut self.state)) });
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        for Retired(sp) in retired {
            // SAFETY: as above: each replaced state came from
            // `Box::into_raw`, is listed once, and no borrow of it is left.
            drop(unsafe { Box::from_raw(sp) });
        }
    }
}

/// A replaced state ([`Index::retired`]).
struct Retired(*mut State);

// SAFETY: a retired state is only read (through shared references readers
// took while it was current) until the index's drop frees it, on one
// thread; `State` is itself Send and Sync.
unsafe impl Send for Retired {}

#[cfg(all(test, loom))]
impl Index {
    /// Start a grow now, without filling a neighbourhood first (the loom
    /// tests: fewer entries, fewer interleavings).
    pub(crate) fn start_grow(&self) {
        let (_, st) = self.load_state();
        self.grow(st.gen).expect("the directory can grow");
    }
}

#[cfg(test)]
impl Index {
    /// The current tables (for tests that look at their memory).
    pub(crate) fn tables(&self) -> Vec<Arc<Table>> {
        self.load_state().1.cur.tables.to_vec()
    }

    /// Assert the hop-hint invariant of every table (see `table`): each
    /// entry's home hint covers its line. Finishes a running migration
    /// first (until then, new tables' hints are partial and lookups read
    /// every slot). For quiescent tests.
    pub(crate) fn check_hints(&self) {
        self.complete_migration();
        let (_, st) = self.load_state();
        for (t, table) in st.cur.tables.iter().enumerate() {
            for s in 0..table.len() {
                let e = table.get(s);
                if !e.is_free() {
                    let home = s - e.neigh_off() as usize;
                    let need = crate::table::hint_need(home, s);
                    assert!(
                        table.hint(home) >= need,
                        "table {t}: home {home} hint {} < {need} (entry at {s})",
                        table.hint(home)
                    );
                }
            }
        }
    }

    /// Homes (table, home) whose hint is above what their entries need.
    pub(crate) fn loose_hints(&self) -> Vec<(usize, usize)> {
        self.complete_migration();
        let (_, st) = self.load_state();
        let mut out = Vec::new();
        for (t, table) in st.cur.tables.iter().enumerate() {
            for home in 0..self.cfg.table_homes as usize {
                if table.hint(home) > table.hint_needed(home) {
                    out.push((t, home));
                }
            }
        }
        out
    }

    /// The hop hint of `h`'s home in its table.
    pub(crate) fn hint_of(&self, h: u64) -> u64 {
        let (_, st) = self.load_state();
        let p = self.place(st.cur.log2, h);
        st.cur.tables[p.table].hint(p.home)
    }
}

#[cfg(all(test, not(loom)))]
mod counter_tests {
    use super::*;

    #[test]
    fn a_remove_counted_before_its_insert_reads_as_zero() {
        let c = Counter { stripes: Default::default() };
        // The remove on this thread's stripe, the insert on another's not
        // yet counted.
        c.add(u64::MAX);
        assert_eq!(c.sum(), 0);
        c.stripes[(Counter::stripe() + 1) % COUNTER_STRIPES].0.fetch_add(1, Relaxed);
        assert_eq!(c.sum(), 0);
        c.add(5);
        assert_eq!(c.sum(), 5);
    }
}
