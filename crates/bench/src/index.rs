//! `granary-bench index`: the DRAM index against its peers.
//!
//! Workload (in the style of the uDepot paper's evaluation): `items`
//! random keys of 8–32 bytes, hashed with Granary's key hash; insert them
//! all, then look each one up in a
//! shuffled order (the hashes laid out in that order beforehand, so that,
//! as for the inserts, the structure's are the only random reads), with 1
//! and 2 threads, once into a structure pre-sized for all items and once
//! into one that starts small and grows. Every structure maps the 64-bit key
//! hash to a 64-bit location, as an index does; Granary's index keeps 8
//! bytes per slot (tag, size, location) and returns tag-matching candidates,
//! which the store disambiguates by reading records. A lookup asks each
//! structure whether the key maps to its location: `get` and compare for
//! the peers, [`Index::contains`] for Granary's (GC's liveness question;
//! it does not gather the candidates that a GET's `Index::lookup` does).
//!
//! Peers: `dashmap` and `RwLock<hashbrown::HashMap>` split into
//! [`SHARDS`] shards, both with a multiply-mix hasher over the hash.
//! Lookups run twice: one key at a time, and in batches of [`BATCH`] keys
//! whose hashes are gathered first, then each is prefetched (Granary's
//! [`Index::prefetch`]; the peers have no such call and skip it), then each
//! is looked up: the way a caller with many keys at hand (a log scan, a
//! multi-key get) can overlap their cache misses. The batch loop is the same
//! for every structure.
//! Every structure of a mode and thread count is built first (its inserts
//! timed), then the lookups run in [`IndexBenchOptions::rounds`] rounds, each
//! round looking every key up in every structure, starting with the next
//! structure each round; each structure reports its median round. A shared
//! machine's speed can move by tens of percent over minutes, and measuring
//! one structure after another would put such a phase on one of them only
//! (see docs/BENCHMARKS-HISTORY.md).
//! Reported per run: inserts/s, lookups/s, resident bytes per key and insert
//! latency percentiles. Bytes per key are measured, not computed: the
//! process RSS with the structure built minus the RSS once it is dropped
//! (after `malloc_trim` returns freed heap), divided by the items.
//!
//! A `floor` row per thread count gives the lookups/s of whole-neighbourhood
//! memory reads alone: per key, in the same order, the neighbourhood scan
//! ([`granary_index::table::hood_mask`]) over the 32 slots of a random
//! home in a table of the pre-sized index's size, on huge pages like the
//! index's, with nothing else (no lock versions, no stash, no candidates).
//! It is what a lookup that reads every line of a neighbourhood, as the
//! paper's does, costs at best; Granary's lookups read only the lines
//! their home's hop hint names, so they may beat it.

use crate::mem::{rss_bytes, trim, wait_for_quiet, STALL};
use granary_index::{Index, IndexConfig};
use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Lookup rounds by default (see [`IndexBenchOptions::rounds`]).
pub const DEFAULT_ROUNDS: usize = 3;
/// Shards of the `RwLock<hashbrown::HashMap>` peer.
pub const SHARDS: usize = 64;
/// Target occupancy of Granary's pre-sized index: the load at which it
/// grows (sizing above it would make the pre-sized index double at the end).
const PRESIZED_OCCUPANCY: f64 = granary_index::directory::GROW_LOAD_PERCENT as f64 / 100.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct IndexBenchOptions {
    pub items: u64,
    pub threads: Vec<usize>,
    /// Lookup rounds per mode and thread count, alternating between the
    /// structures; each structure reports its median round.
    pub rounds: usize,
    /// Longest wait for a quiet machine before each timed phase
    /// ([`SETTLE_LIMIT`] by default; zero: no wait).
    pub settle: Duration,
    /// Print progress lines to stderr.
    pub progress: bool,
}

impl Default for IndexBenchOptions {
    fn default() -> Self {
        IndexBenchOptions {
            items: 50_000_000,
            threads: vec![1, 2],
            rounds: DEFAULT_ROUNDS,
            settle: SETTLE_LIMIT,
            progress: true,
        }
    }
}

/// One structure, one mode, one thread count.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub structure: &'static str,
    pub mode: &'static str,
    pub threads: usize,
    pub inserts_per_s: f64,
    /// The median of `lookup_rounds`.
    pub lookups_per_s: f64,
    /// Lookups in batches of [`BATCH`] (hashes gathered, prefetched where
    /// the structure offers it, then looked up): the median of
    /// `batched_rounds`.
    pub batched_lookups_per_s: f64,
    /// Lookups/s of each round, in round order.
    pub lookup_rounds: Vec<f64>,
    pub batched_rounds: Vec<f64>,
    pub bytes_per_key: f64,
    /// Insert latency percentiles in nanoseconds: p50, p99, p99.9, p99.99, max.
    pub insert_ns: [u64; 5],
    pub grows: u64,
}

/// A hasher for keys that are already 64-bit hashes: one multiply mixes the
/// bits so the tables' bucket and control bits are independent.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type MixState = BuildHasherDefault<Mix>;

trait Map: Sync {
    fn insert(&self, h: u64, v: u64);
    fn contains(&self, h: u64, v: u64) -> bool;
    /// Ask for `h`'s lookup to start loading (a structure with no such API
    /// does nothing).
    fn prefetch(&self, _h: u64) {}
    fn grows(&self) -> u64 {
        0
    }
}

impl Map for Index {
    fn insert(&self, h: u64, v: u64) {
        Index::insert(self, h, 1, v).expect("index sized for the benchmark");
    }
    fn contains(&self, h: u64, v: u64) -> bool {
        Index::contains(self, h, v)
    }
    fn prefetch(&self, h: u64) {
        Index::prefetch(self, h);
    }
    fn grows(&self) -> u64 {
        self.stats().grows
    }
}

impl Map for dashmap::DashMap<u64, u64, MixState> {
    fn insert(&self, h: u64, v: u64) {
        dashmap::DashMap::insert(self, h, v);
    }
    fn contains(&self, h: u64, v: u64) -> bool {
        self.get(&h).is_some_and(|x| *x == v)
    }
}

struct Sharded(Vec<RwLock<hashbrown::HashMap<u64, u64, MixState>>>);

impl Sharded {
    fn shard(&self, h: u64) -> &RwLock<hashbrown::HashMap<u64, u64, MixState>> {
        &self.0[(h.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 58) as usize % SHARDS]
    }
}

impl Map for Sharded {
    fn insert(&self, h: u64, v: u64) {
        self.shard(h).write().unwrap_or_else(|e| e.into_inner()).insert(h, v);
    }
    fn contains(&self, h: u64, v: u64) -> bool {
        self.shard(h).read().unwrap_or_else(|e| e.into_inner()).get(&h) == Some(&v)
    }
}

/// Key `i`: 8 to 32 pseudo-random bytes, hashed like the store hashes keys.
fn key_hash(i: u64) -> u64 {
    let mut rng = Pcg64Mcg::seed_from_u64(i);
    let len = rng.random_range(8..33);
    let mut key = [0u8; 32];
    for chunk in key[..len].chunks_mut(8) {
        chunk.copy_from_slice(&rng.random::<u64>().to_le_bytes()[..chunk.len()]);
    }
    granary_format::hash::key_hash(&key[..len])
}

/// The workload, generated once for every run: key hashes in insertion
/// order, a shuffled lookup order, and the hashes again in that order.
///
/// Both phases stream their keys: inserts read `hashes` front to back,
/// lookups read `order` and `probes` front to back, so each operation's
/// only random memory access is the structure's own, as for a server
/// whose request's key is in cache when it is hashed. (Reading
/// `hashes[order[i]]` instead would be a random read of a 400 MB array on
/// 4 KiB pages, a cache and TLB miss that every structure would pay on
/// top of its own.)
pub struct Workload {
    hashes: Vec<u64>,
    order: Vec<u32>,
    probes: Vec<u64>,
}

impl Workload {
    pub fn new(items: u64) -> Workload {
        assert!(items <= u32::MAX as u64, "at most 2^32 items");
        let hashes: Vec<u64> = (0..items).map(key_hash).collect();
        let mut order: Vec<u32> = (0..items as u32).collect();
        order.shuffle(&mut Pcg64Mcg::seed_from_u64(0x5EED));
        let probes = order.iter().map(|&j| hashes[j as usize]).collect();
        Workload { hashes, order, probes }
    }
}

/// Insert every key, timing each insert; returns the phase's time and the
/// latency histogram of all threads.
fn insert_phase<M: Map + ?Sized>(map: &M, w: &Workload, threads: usize) -> (Duration, Histogram<u64>) {
    let items = w.hashes.len();
    let per = items.div_ceil(threads);
    let started = Instant::now();
    let hists: Vec<Histogram<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
                    // One clock read per insert: an insert's latency is the
                    // time from the previous one's end to its own (the
                    // loop's own steps included). Two reads per insert,
                    // before and after, would add a fixed cost that is a
                    // large share of an insert, the same for every
                    // structure, and so narrow every ratio.
                    let mut prev = Instant::now();
                    for i in t * per..((t + 1) * per).min(items) {
                        map.insert(w.hashes[i], i as u64);
                        let now = Instant::now();
                        hist.saturating_record((now - prev).as_nanos() as u64);
                        prev = now;
                    }
                    hist
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("insert thread")).collect()
    });
    let took = started.elapsed();
    let all = hists.into_iter().reduce(|mut a, b| {
        a.add(b).expect("same bounds");
        a
    });
    (took, all.expect("at least one thread"))
}

/// Look every key up once, one at a time (`batched` false) or in batches
/// of [`BATCH`]: the hashes gathered first, each prefetched (where the
/// structure can), then each looked up. Panics if a key is missing.
fn lookup_phase<M: Map + ?Sized>(map: &M, w: &Workload, threads: usize, batched: bool) -> Duration {
    let items = w.hashes.len();
    let per = items.div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut lost = 0u64;
                let span = t * per..((t + 1) * per).min(items);
                let (probes, order) = (&w.probes[span.clone()], &w.order[span]);
                if !batched {
                    for (&h, &j) in probes.iter().zip(order) {
                        lost += !map.contains(h, j as u64) as u64;
                    }
                } else {
                    for (ps, js) in probes.chunks(BATCH).zip(order.chunks(BATCH)) {
                        let mut hs = [0u64; BATCH];
                        hs[..ps.len()].copy_from_slice(ps);
                        for &h in &hs[..js.len()] {
                            map.prefetch(h);
                        }
                        for (&h, &j) in hs.iter().zip(js) {
                            lost += !map.contains(h, j as u64) as u64;
                        }
                    }
                }
                assert_eq!(lost, 0, "keys lost");
            });
        }
    });
    started.elapsed()
}

/// The median of `xs` (the mean of the middle two for an even count; 0
/// for none).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Keys per batch of the batched lookups.
pub const BATCH: usize = 16;

fn granary_index(items: u64, presized: bool) -> Index {
    // Tables sized so that 16 of them hold every item at 85% occupancy: the
    // pre-sized index starts with all 16, the growing one with one and
    // doubles four times. With 16 tables, 4 of the tag's 8 bits pick the
    // table and 4, with the entry's 4 fp bits, filter candidates (each
    // extra candidate is a device read in the store).
    let homes = ((items as f64 / 16.0 / PRESIZED_OCCUPANCY) as u64 + 1).clamp(64, 1 << 27) as u32;
    Index::new(IndexConfig::with_tables(homes, if presized { 4 } else { 0 }))
}

/// The `floor` row's lookup time (see the module doc).
fn memory_floor(w: &Workload, threads: usize) -> Duration {
    use granary_index::NEIGHBOURHOOD as H;
    use std::sync::atomic::AtomicU64;
    const HUGE: usize = granary_index::table::HUGE_PAGE_BYTES;
    let items = w.hashes.len();
    let homes = (items as f64 / PRESIZED_OCCUPANCY) as usize + 1;
    let len = homes + H - 1;
    // Zeroed: a fresh mapping from the allocator, untouched, so huge pages
    // requested now back it when the fill below first touches it.
    let mut raw: Vec<u64> = vec![0; len];
    let base = raw.as_ptr() as usize;
    let (lo, hi) = (base.next_multiple_of(HUGE), (base + len * 8) & !(HUGE - 1));
    if hi > lo {
        // SAFETY: [lo, hi) lies inside `raw`'s allocation and is
        // page-aligned; the advice changes no contents.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
    let mut rng = Pcg64Mcg::seed_from_u64(0);
    for x in raw.iter_mut() {
        *x = rng.random::<u64>() | 1;
    }
    // SAFETY: AtomicU64 has the size, alignment and bit validity of u64 (std
    // documents it); `raw` is borrowed mutably for the slice's whole life.
    let slots: &[AtomicU64] = unsafe { std::slice::from_raw_parts(raw.as_mut_ptr().cast::<AtomicU64>(), len) };
    let per = items.div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut hits = 0u64;
                for &h in &w.probes[t * per..((t + 1) * per).min(items)] {
                    let home = granary_index::home_of(h, homes as u32);
                    let hood: &[AtomicU64; H] = slots[home..home + H].try_into().expect("H slots");
                    hits += granary_index::table::hood_mask(hood, granary_format::hash::key_tag(h)).count_ones() as u64;
                }
                std::hint::black_box(hits);
            });
        }
    });
    let took = started.elapsed();
    drop(raw);
    took
}

/// Longest wait for a quiet machine ([`wait_for_quiet`]) before a timed
/// phase. Phases free gigabytes at 50 M keys (each structure's drop, the
/// growing peers' old tables), and the kernel's work on freed memory can
/// take whole CPUs for tens of milliseconds at a time for seconds
/// afterwards, which would show as a timed phase's maximum insert latency.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// [`wait_for_quiet`] for at most `limit`, saying so when it saw stalls.
fn settle(limit: Duration, progress: bool) {
    let q = wait_for_quiet(limit);
    if progress && q.stalls > 0 {
        eprintln!(
            "bench index: waited {:.1} s for the machine to be quiet ({} stalls over {} ms, the longest {:.0} ms)",
            q.waited.as_secs_f64(),
            q.stalls,
            STALL.as_millis(),
            q.longest.as_secs_f64() * 1e3
        );
    }
}

/// The structures measured, in the order they are built.
const STRUCTURES: [&str; 3] = ["granary", "dashmap", "rwlock-hashbrown"];

/// An empty `structure`, pre-sized for `items` or left to grow.
fn new_map(structure: &str, items: u64, presized: bool) -> Box<dyn Map> {
    match (structure, presized) {
        ("granary", p) => Box::new(granary_index(items, p)),
        ("dashmap", true) => Box::new(dashmap::DashMap::with_capacity_and_hasher(items as usize, MixState::default())),
        ("dashmap", false) => Box::new(dashmap::DashMap::with_hasher(MixState::default())),
        (_, p) => Box::new(Sharded(
            (0..SHARDS)
                .map(|_| {
                    let cap = if p { (items as usize).div_ceil(SHARDS) } else { 0 };
                    RwLock::new(hashbrown::HashMap::with_capacity_and_hasher(cap, MixState::default()))
                })
                .collect(),
        )),
    }
}

/// Run every structure, mode and thread count.
pub fn run(opts: &IndexBenchOptions) -> Vec<RunResult> {
    let mut out = Vec::new();
    let items = opts.items;
    if opts.progress {
        eprintln!("bench index: generating {items} keys ...");
    }
    let w = Workload::new(items);
    for &threads in &opts.threads {
        if opts.progress {
            eprintln!("bench index: memory floor {threads} thread(s), {items} keys ...");
        }
        settle(opts.settle, opts.progress);
        let look = memory_floor(&w, threads);
        trim();
        out.push(RunResult {
            structure: "floor",
            mode: "presized",
            threads,
            inserts_per_s: 0.0,
            lookups_per_s: items as f64 / look.as_secs_f64(),
            batched_lookups_per_s: 0.0,
            lookup_rounds: Vec::new(),
            batched_rounds: Vec::new(),
            bytes_per_key: 0.0,
            insert_ns: [0; 5],
            grows: 0,
        });
        for presized in [true, false] {
            let mode = if presized { "presized" } else { "resize" };
            // Every structure is built (its inserts timed) and kept, then
            // the lookups run in rounds that alternate between them, so a
            // phase of a shared machine's speed falls on all of them
            // instead of on whichever ran then.
            let mut built = Vec::new();
            for structure in STRUCTURES {
                if opts.progress {
                    eprintln!("bench index: {structure} {mode} {threads} thread(s), {items} inserts ...");
                }
                let map = new_map(structure, items, presized);
                settle(opts.settle, opts.progress);
                let (ins, hist) = insert_phase(map.as_ref(), &w, threads);
                built.push((structure, map, ins, hist));
            }
            let n = built.len();
            let mut rounds = vec![(Vec::new(), Vec::new()); n];
            settle(opts.settle, opts.progress);
            for round in 0..opts.rounds.max(1) {
                if opts.progress {
                    eprintln!(
                        "bench index: {mode} {threads} thread(s), lookup round {} of {} ...",
                        round + 1,
                        opts.rounds
                    );
                }
                // Each round starts with the next structure.
                for k in 0..n {
                    let i = (round + k) % n;
                    let map = built[i].1.as_ref();
                    let plain = lookup_phase(map, &w, threads, false);
                    let batched = lookup_phase(map, &w, threads, true);
                    rounds[i].0.push(items as f64 / plain.as_secs_f64());
                    rounds[i].1.push(items as f64 / batched.as_secs_f64());
                }
            }
            // Bytes per key: what dropping each structure gives back.
            for ((structure, map, ins, hist), (plain, batched)) in built.into_iter().zip(rounds) {
                trim();
                let with = rss_bytes();
                let grows = map.grows();
                drop(map);
                trim();
                let bytes = with.saturating_sub(rss_bytes());
                let q = |p: f64| hist.value_at_quantile(p);
                out.push(RunResult {
                    structure,
                    mode,
                    threads,
                    inserts_per_s: items as f64 / ins.as_secs_f64(),
                    lookups_per_s: median(&plain),
                    batched_lookups_per_s: median(&batched),
                    lookup_rounds: plain,
                    batched_rounds: batched,
                    bytes_per_key: bytes as f64 / items as f64,
                    insert_ns: [q(0.5), q(0.99), q(0.999), q(0.9999), hist.max()],
                    grows,
                });
            }
        }
    }
    out
}

/// Granary's figure divided by a peer's, for the same mode and threads.
pub fn ratio(results: &[RunResult], peer: &str, threads: usize, mode: &str, f: fn(&RunResult) -> f64) -> Option<f64> {
    let find = |s: &str| results.iter().find(|r| r.structure == s && r.threads == threads && r.mode == mode);
    Some(f(find("granary")?) / f(find(peer)?))
}

/// The human table.
pub fn render(results: &[RunResult]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<17} {:<9} {:>3} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "structure",
        "mode",
        "thr",
        "inserts/s",
        "lookups/s",
        "batched/s",
        "B/key",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "p99.99us",
        "max us"
    ));
    for r in results {
        let us = |ns: u64| ns as f64 / 1000.0;
        if r.structure == "floor" {
            s.push_str(&format!(
                "{:<17} {:<9} {:>3} {:>12} {:>12.0}\n",
                r.structure, "-", r.threads, "-", r.lookups_per_s
            ));
            continue;
        }
        s.push_str(&format!(
            "{:<17} {:<9} {:>3} {:>12.0} {:>12.0} {:>12.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.1} {:>9.1}\n",
            r.structure,
            r.mode,
            r.threads,
            r.inserts_per_s,
            r.lookups_per_s,
            r.batched_lookups_per_s,
            r.bytes_per_key,
            us(r.insert_ns[0]),
            us(r.insert_ns[1]),
            us(r.insert_ns[2]),
            us(r.insert_ns[3]),
            us(r.insert_ns[4])
        ));
    }
    s.push_str("\nlookup rounds, M/s (one key at a time | batched), median reported:\n");
    for r in results.iter().filter(|r| r.structure != "floor") {
        let m = |xs: &[f64]| xs.iter().map(|x| format!("{:.1}", x / 1e6)).collect::<Vec<_>>().join(" ");
        s.push_str(&format!(
            "  {:<17} {:<9} {} thr: {} | {}\n",
            r.structure,
            r.mode,
            r.threads,
            m(&r.lookup_rounds),
            m(&r.batched_rounds)
        ));
    }
    s.push_str("\ngranary / peer (same mode and threads):\n");
    let mut seen = Vec::new();
    for r in results {
        if r.structure == "floor" || seen.contains(&(r.mode, r.threads)) {
            continue;
        }
        seen.push((r.mode, r.threads));
        let floor = results.iter().find(|x| x.structure == "floor" && x.threads == r.threads);
        let granary = results.iter().find(|x| x.structure == "granary" && x.threads == r.threads && x.mode == r.mode);
        if let (Some(f), Some(g)) = (floor, granary) {
            s.push_str(&format!(
                "  vs the memory floor  {:<9} {} thr: lookups {:.2}x\n",
                r.mode,
                r.threads,
                g.lookups_per_s / f.lookups_per_s
            ));
        }
        for peer in ["dashmap", "rwlock-hashbrown"] {
            let l = ratio(results, peer, r.threads, r.mode, |x| x.lookups_per_s);
            let i = ratio(results, peer, r.threads, r.mode, |x| x.inserts_per_s);
            let b = ratio(results, peer, r.threads, r.mode, |x| x.batched_lookups_per_s);
            let m = ratio(results, peer, r.threads, r.mode, |x| x.bytes_per_key);
            if let (Some(l), Some(b), Some(i), Some(m)) = (l, b, i, m) {
                s.push_str(&format!(
                    "  vs {peer:<17} {:<9} {} thr: lookups {l:.2}x  batched {b:.2}x  inserts {i:.2}x  memory {m:.2}x\n",
                    r.mode, r.threads
                ));
            }
        }
    }
    s
}

/// Machine-readable results.
pub fn to_json(opts: &IndexBenchOptions, results: &[RunResult]) -> serde_json::Value {
    let runs: Vec<_> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "structure": r.structure,
                "mode": r.mode,
                "threads": r.threads,
                "inserts_per_s": r.inserts_per_s,
                "lookups_per_s": r.lookups_per_s,
                "batched_lookups_per_s": r.batched_lookups_per_s,
                "lookup_rounds": r.lookup_rounds,
                "batched_rounds": r.batched_rounds,
                "bytes_per_key": r.bytes_per_key,
                "insert_latency_ns": {
                    "p50": r.insert_ns[0], "p99": r.insert_ns[1], "p99_9": r.insert_ns[2],
                    "p99_99": r.insert_ns[3], "max": r.insert_ns[4],
                },
                "grows": r.grows,
            })
        })
        .collect();
    serde_json::json!({
        "benchmark": "index", "items": opts.items, "threads": opts.threads, "rounds": opts.rounds, "runs": runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark runs end to end on a small item count and every
    /// structure finds every key (the lookups assert it).
    #[test]
    fn small_run_reports_every_structure() {
        let opts = IndexBenchOptions {
            items: 20_000,
            threads: vec![1, 2],
            rounds: 2,
            settle: Duration::ZERO,
            progress: false,
        };
        let r = run(&opts);
        assert_eq!(r.len(), 14);
        for x in r.iter().filter(|x| x.structure != "floor") {
            assert_eq!((x.lookup_rounds.len(), x.batched_rounds.len()), (2, 2), "{} {}", x.structure, x.mode);
            assert_eq!(x.lookups_per_s, median(&x.lookup_rounds));
            assert_eq!(x.batched_lookups_per_s, median(&x.batched_rounds));
        }
        assert!(r.iter().all(|x| x.lookups_per_s > 0.0));
        assert!(r.iter().filter(|x| x.structure != "floor").all(|x| x.batched_lookups_per_s > 0.0));
        assert!(r.iter().filter(|x| x.structure != "floor").all(|x| x.inserts_per_s > 0.0));
        assert_eq!(r.iter().filter(|x| x.structure == "floor").count(), 2);
        let grown = r.iter().find(|x| x.structure == "granary" && x.mode == "resize").unwrap();
        assert!(grown.grows >= 4, "the growing index reaches at least 16 tables: {}", grown.grows);
        assert!(ratio(&r, "dashmap", 2, "resize", |x| x.lookups_per_s).is_some());
        let text = render(&r);
        assert!(text.contains("vs dashmap"));
        assert!(text.contains("batched"));
        assert!(text.contains("lookup rounds"));
        assert!(text.contains("vs the memory floor"));
        let j = to_json(&opts, &r);
        assert_eq!(j["runs"].as_array().unwrap().len(), 14);
        assert_eq!(j["runs"][1]["lookup_rounds"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn median_takes_the_middle_round() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[9.0, 1.0, 4.0]), 4.0);
        assert_eq!(median(&[9.0, 1.0, 4.0, 2.0]), 3.0);
    }
}
