//! Namespaces: named, independent key spaces in one store, each with its
//! own options (mode, default TTL, quotas) and figures, dropped or emptied
//! in O(1).
//!
//! **Catalog.** The namespaces live in one record, the engine's reserved key
//! [`CATALOG_KEY`]: every namespace's name, id and options, and the next id
//! to give. A change (create, drop, truncate) writes a whole new catalog
//! (one record, a few bytes a namespace) under [`Namespaces::change`], and
//! takes effect in DRAM only once that record is written: a crash leaves
//! the old catalog or the new one.
//!
//! **Ids.** A namespace's keys are stored under its id
//! ([`crate::nskey`]). Ids are never given twice (the catalog keeps the
//! next one), so dropping a namespace is removing its entry: its keys can
//! never be read again, whatever is still on the device or in the index.
//! Truncating gives the namespace a new id. GC drops the records of an id
//! no longer in the catalog instead of relocating them
//! ([`crate::nskey::NsTable::is_dead`]), which frees their space and their
//! index entries; until then they cost space, not correctness. The default
//! namespace (id 0, the keys of stores written before namespaces) cannot be
//! dropped; truncating it is `flush_all`.
//!
//! **Counts.** Each namespace's values and their bytes are counted as they
//! change ([`crate::counters`]). A checkpoint's items do not say their
//! namespace, so a store with namespaces writes every namespace's counts
//! ([`TOTALS_KEY`]) at its clean close, just before the clean checkpoint,
//! and an open that loads that checkpoint with nothing to replay takes them;
//! any other open of such a store rebuilds its index by a log scan, which
//! counts exactly (see `open`).

use crate::counters::NsCounters;
use crate::error::{Error, Result};
use crate::nskey::DEFAULT_NS;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// The reserved key holding the catalog.
pub(crate) const CATALOG_KEY: &[u8] = b"\0granary.catalog";
/// The reserved key holding the counts written at a clean close.
pub(crate) const TOTALS_KEY: &[u8] = b"\0granary.ns_totals";

/// The default namespace's name.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Longest namespace name, in bytes.
pub const NAMESPACE_NAME_MAX: usize = 64;
/// Most namespaces a store holds besides the default one.
pub const NAMESPACES_MAX: usize = 4096;

/// What a namespace does when it, or the store, is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceMode {
    /// Its values may be evicted (in a store opened in cache mode,
    /// [`crate::OpenOptions::evict`]): GC drops them with their segment.
    #[default]
    Cache,
    /// Its values are never evicted: GC relocates them, and writes are
    /// refused once the store has no room.
    Store,
}

impl NamespaceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NamespaceMode::Cache => "cache",
            NamespaceMode::Store => "store",
        }
    }

    fn code(self) -> u8 {
        match self {
            NamespaceMode::Cache => 0,
            NamespaceMode::Store => 1,
        }
    }

    fn from_code(c: u8) -> Option<NamespaceMode> {
        match c {
            0 => Some(NamespaceMode::Cache),
            1 => Some(NamespaceMode::Store),
            _ => None,
        }
    }
}

impl std::str::FromStr for NamespaceMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cache" => Ok(NamespaceMode::Cache),
            "store" => Ok(NamespaceMode::Store),
            _ => Err(format!("mode {s:?}: expected cache or store")),
        }
    }
}

/// A namespace's options, fixed at creation (truncate keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NamespaceOptions {
    pub mode: NamespaceMode,
    /// Seconds a value written with no expiry time lives (0: for ever).
    pub default_ttl_secs: u32,
    /// Most bytes of values (whole records) it holds; a write past it is
    /// refused ([`Error::QuotaExceeded`]).
    pub max_bytes: Option<u64>,
    /// Most values it holds, likewise.
    pub max_keys: Option<u64>,
}

impl NamespaceOptions {
    /// Whether a write must be checked against a quota.
    pub fn has_quota(&self) -> bool {
        self.max_bytes.is_some() || self.max_keys.is_some()
    }
}

/// A namespace's options and figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceStats {
    pub name: String,
    /// Its current id (a truncate gives it a new one).
    pub id: u32,
    pub options: NamespaceOptions,
    /// Values it holds, and their records' bytes.
    pub keys: u64,
    pub value_bytes: u64,
    /// Since the store was opened: GETs, those that found a value, and
    /// those that did not.
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    /// Writes that stored, deletes that removed a value.
    pub sets: u64,
    pub deletes: u64,
    /// Values GC evicted, and values it found expired.
    pub evictions: u64,
    pub expirations: u64,
}

/// Check a namespace name: 1 to [`NAMESPACE_NAME_MAX`] bytes of ASCII
/// letters, digits, `_`, `-` and `.`.
pub fn check_name(name: &str) -> Result<()> {
    let why = if name.is_empty() || name.len() > NAMESPACE_NAME_MAX {
        format!("a name is 1 to {NAMESPACE_NAME_MAX} bytes")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        "a name holds only ASCII letters, digits, '_', '-' and '.'".to_string()
    } else {
        return Ok(());
    };
    Err(Error::BadNamespace { name: name.into(), why })
}

/// One namespace of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CatalogEntry {
    pub id: u32,
    pub options: NamespaceOptions,
    pub created_unix_ms: u64,
}

/// The catalog: every namespace but the default one, and the next id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub next_id: u32,
    pub entries: BTreeMap<String, CatalogEntry>,
    /// A namespace was dropped or truncated and GC has not swept the log
    /// for its records since (an open sweeps again).
    pub sweep_pending: bool,
}

impl Default for Catalog {
    fn default() -> Catalog {
        Catalog { next_id: 1, entries: BTreeMap::new(), sweep_pending: false }
    }
}

/// Catalog flag: [`Catalog::sweep_pending`].
const CATALOG_SWEEP_PENDING: u16 = 1;

/// "GNSC" as a little-endian u32.
const CATALOG_MAGIC: u32 = u32::from_le_bytes(*b"GNSC");
const CATALOG_VERSION: u16 = 1;
/// "GNST" as a little-endian u32.
const TOTALS_MAGIC: u32 = u32::from_le_bytes(*b"GNST");
const TOTALS_VERSION: u16 = 1;

/// Reads little-endian fields off a byte slice, failing with the field's
/// name when it runs out.
struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(self.bad(format!("ends inside {field}")));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, field)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, field)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, field)?.try_into().expect("8 bytes")))
    }

    fn bad(&self, detail: String) -> Error {
        Error::Corruption { offset: 0, detail: format!("the namespace {} {detail}", self.what) }
    }

    /// The header: magic, a version this build reads, and flags of
    /// `known` only; returns the flags.
    fn header(&mut self, magic: u32, version: u16, known: u16) -> Result<u16> {
        if self.u32("magic")? != magic {
            return Err(self.bad("has the wrong magic".into()));
        }
        let v = self.u16("version")?;
        if v != version {
            return Err(self.bad(format!("has version {v}; this build reads version {version}")));
        }
        let flags = self.u16("flags")?;
        if flags & !known != 0 {
            return Err(self.bad(format!("has unknown flags {flags:#x}")));
        }
        Ok(flags)
    }

    fn end(&self) -> Result<()> {
        match self.b.len() {
            0 => Ok(()),
            n => Err(self.bad(format!("has {n} bytes past its end"))),
        }
    }
}

impl Catalog {
    /// Layout (docs/FORMAT.md, "Namespaces"): magic `GNSC`, version u16,
    /// flags u16 (bit 0: sweep pending), next_id u32, count u32, then per
    /// namespace: id u32,
    /// mode u8, reserved u8, name_len u16, default_ttl_secs u32, max_bytes
    /// u64 (0: none), max_keys u64 (0: none), created_unix_ms u64, name.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.entries.len() * 48);
        b.extend_from_slice(&CATALOG_MAGIC.to_le_bytes());
        b.extend_from_slice(&CATALOG_VERSION.to_le_bytes());
        let flags = if self.sweep_pending { CATALOG_SWEEP_PENDING } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (name, e) in &self.entries {
            b.extend_from_slice(&e.id.to_le_bytes());
            b.push(e.options.mode.code());
            b.push(0);
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(&e.options.default_ttl_secs.to_le_bytes());
            b.extend_from_slice(&e.options.max_bytes.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&e.options.max_keys.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&e.created_unix_ms.to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Catalog> {
        let mut r = Reader { b, what: "catalog" };
        let flags = r.header(CATALOG_MAGIC, CATALOG_VERSION, CATALOG_SWEEP_PENDING)?;
        let next_id = r.u32("next_id")?;
        let count = r.u32("count")? as usize;
        if count > NAMESPACES_MAX {
            return Err(r.bad(format!("lists {count} namespaces, more than {NAMESPACES_MAX}")));
        }
        let mut entries = BTreeMap::new();
        let mut ids = std::collections::HashSet::new();
        for _ in 0..count {
            let id = r.u32("id")?;
            let mode = r.u8("mode")?;
            let mode = NamespaceMode::from_code(mode).ok_or_else(|| r.bad(format!("has an unknown mode {mode}")))?;
            if r.u8("reserved")? != 0 {
                return Err(r.bad("has reserved bits set".into()));
            }
            let name_len = r.u16("name_len")? as usize;
            let default_ttl_secs = r.u32("default_ttl")?;
            let some = |n: u64| (n != 0).then_some(n);
            let max_bytes = some(r.u64("max_bytes")?);
            let max_keys = some(r.u64("max_keys")?);
            let created_unix_ms = r.u64("created")?;
            let name = std::str::from_utf8(r.take(name_len, "name")?)
                .map_err(|_| r.bad("holds a name that is not UTF-8".into()))?
                .to_string();
            check_name(&name).map_err(|e| r.bad(e.to_string()))?;
            if id == DEFAULT_NS || id >= next_id || !ids.insert(id) {
                return Err(r.bad(format!("gives namespace {name:?} the id {id}, which is not free")));
            }
            let options = NamespaceOptions { mode, default_ttl_secs, max_bytes, max_keys };
            if entries.insert(name.clone(), CatalogEntry { id, options, created_unix_ms }).is_some() {
                return Err(r.bad(format!("lists {name:?} twice")));
            }
        }
        r.end()?;
        Ok(Catalog { next_id, entries, sweep_pending: flags & CATALOG_SWEEP_PENDING != 0 })
    }
}

/// Every namespace's counts at a clean close, and the session that wrote
/// them (the one whose clean checkpoint follows them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Totals {
    pub session: u64,
    /// (id, values, value bytes), the default namespace's included.
    pub counts: Vec<(u32, u64, u64)>,
}

impl Totals {
    /// Magic `GNST`, version u16, reserved u16, session u64, count u32,
    /// then per namespace: id u32, values u64, value bytes u64.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20 + self.counts.len() * 20);
        b.extend_from_slice(&TOTALS_MAGIC.to_le_bytes());
        b.extend_from_slice(&TOTALS_VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.session.to_le_bytes());
        b.extend_from_slice(&(self.counts.len() as u32).to_le_bytes());
        for &(id, keys, bytes) in &self.counts {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&keys.to_le_bytes());
            b.extend_from_slice(&bytes.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Totals> {
        let mut r = Reader { b, what: "totals" };
        r.header(TOTALS_MAGIC, TOTALS_VERSION, 0)?;
        let session = r.u64("session")?;
        let count = r.u32("count")? as usize;
        if count > NAMESPACES_MAX + 1 {
            return Err(r.bad(format!("lists {count} namespaces")));
        }
        let mut counts = Vec::with_capacity(count);
        for _ in 0..count {
            counts.push((r.u32("id")?, r.u64("values")?, r.u64("bytes")?));
        }
        r.end()?;
        Ok(Totals { session, counts })
    }
}

/// A namespace as the store runs it: its name and options, and its current
/// id with that id's counters (a truncate replaces both).
pub(crate) struct NsState {
    pub name: String,
    pub options: NamespaceOptions,
    current: RwLock<(u32, Arc<NsCounters>)>,
    dropped: AtomicBool,
    /// The default namespace's counters: its id never changes and it is
    /// never dropped, so its calls read them with no lock.
    fixed: Option<Arc<NsCounters>>,
}

/// A namespace's counters as a call holds them: borrowed where they
/// cannot change, shared otherwise.
pub(crate) enum NsRef<'a> {
    Fixed(&'a NsCounters),
    Shared(Arc<NsCounters>),
}

impl std::ops::Deref for NsRef<'_> {
    type Target = NsCounters;

    fn deref(&self) -> &NsCounters {
        match self {
            NsRef::Fixed(c) => c,
            NsRef::Shared(c) => c,
        }
    }
}

impl NsState {
    pub(crate) fn new(name: &str, id: u32, options: NamespaceOptions, counters: Arc<NsCounters>) -> NsState {
        let fixed = (id == DEFAULT_NS).then(|| counters.clone());
        NsState {
            name: name.into(),
            options,
            current: RwLock::new((id, counters)),
            dropped: AtomicBool::new(false),
            fixed,
        }
    }

    /// [`NsState::current`] for a call: no lock for the default namespace.
    pub(crate) fn current_ref(&self) -> Result<(u32, NsRef<'_>)> {
        if let Some(c) = &self.fixed {
            return Ok((DEFAULT_NS, NsRef::Fixed(c)));
        }
        self.current().map(|(id, c)| (id, NsRef::Shared(c)))
    }

    /// Its id and counters now; `NoSuchNamespace` once dropped.
    pub(crate) fn current(&self) -> Result<(u32, Arc<NsCounters>)> {
        if self.dropped.load(Relaxed) {
            return Err(Error::NoSuchNamespace { name: self.name.clone() });
        }
        Ok(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    pub(crate) fn set_current(&self, id: u32, counters: Arc<NsCounters>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (id, counters);
    }

    pub(crate) fn mark_dropped(&self) {
        self.dropped.store(true, Relaxed);
    }

    pub(crate) fn is_dropped(&self) -> bool {
        self.dropped.load(Relaxed)
    }

    pub(crate) fn stats(&self) -> Result<NamespaceStats> {
        let (id, c) = self.current()?;
        let gets = c.gets.load(Relaxed);
        let hits = c.hits.load(Relaxed);
        Ok(NamespaceStats {
            name: self.name.clone(),
            id,
            options: self.options,
            keys: c.keys.load(Relaxed),
            value_bytes: c.value_bytes.load(Relaxed),
            gets,
            hits,
            misses: gets.saturating_sub(hits),
            sets: c.sets.load(Relaxed),
            deletes: c.deletes.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            expirations: c.expirations.load(Relaxed),
        })
    }
}

/// The namespaces of an open store.
pub(crate) struct Namespaces {
    /// Serialises catalog changes; holds the catalog as last written.
    pub change: async_lock::Mutex<Catalog>,
    /// Every namespace by name, the default one included.
    pub by_name: RwLock<BTreeMap<String, Arc<NsState>>>,
    pub default: Arc<NsState>,
}

impl Namespaces {
    pub(crate) fn new(default_mode: NamespaceMode, counters: Arc<NsCounters>) -> Namespaces {
        let options = NamespaceOptions { mode: default_mode, ..Default::default() };
        let default = Arc::new(NsState::new(DEFAULT_NAMESPACE, DEFAULT_NS, options, counters));
        let by_name = RwLock::new(BTreeMap::from([(DEFAULT_NAMESPACE.to_string(), default.clone())]));
        Namespaces { change: async_lock::Mutex::new(Catalog::default()), by_name, default }
    }

    pub(crate) fn get(&self, name: &str) -> Result<Arc<NsState>> {
        self.by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NoSuchNamespace { name: name.into() })
    }

    pub(crate) fn all(&self) -> Vec<Arc<NsState>> {
        self.by_name.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Catalog {
        let mut c = Catalog { next_id: 9, entries: BTreeMap::new(), sweep_pending: true };
        let o = NamespaceOptions {
            mode: NamespaceMode::Store,
            default_ttl_secs: 60,
            max_bytes: Some(1 << 30),
            max_keys: None,
        };
        c.entries.insert("users".into(), CatalogEntry { id: 3, options: o, created_unix_ms: 1_700_000_000_000 });
        c.entries.insert("s".into(), CatalogEntry { id: 8, options: Default::default(), created_unix_ms: 5 });
        c
    }

    #[test]
    fn catalog_round_trips_and_refuses_what_it_does_not_understand() {
        let c = sample();
        let b = c.encode();
        assert_eq!(Catalog::decode(&b).unwrap(), c);
        assert_eq!(Catalog::decode(&Catalog::default().encode()).unwrap(), Catalog::default());
        let err = |b: &[u8]| Catalog::decode(b).unwrap_err().to_string();
        let mut v = b.clone();
        v[4] = 2;
        assert!(err(&v).contains("version 2"), "{}", err(&v));
        assert!(err(&b[..b.len() - 1]).contains("ends inside name"));
        let mut long = b.clone();
        long.push(0);
        assert!(err(&long).contains("past its end"));
        // The first entry ("s", id 8): its mode byte at 16 + 4.
        let mut mode = b.clone();
        mode[20] = 7;
        assert!(err(&mode).contains("unknown mode 7"));
        // An id at or past next_id.
        let mut id = b.clone();
        id[16..20].copy_from_slice(&9u32.to_le_bytes());
        assert!(err(&id).contains("not free"), "{}", err(&id));
        let mut flags = b.clone();
        flags[6] = 2;
        assert!(err(&flags).contains("unknown flags 0x2"), "{}", err(&flags));
        let mut magic = b;
        magic[0] ^= 1;
        assert!(err(&magic).contains("magic"));
    }

    #[test]
    fn totals_round_trip() {
        let t = Totals { session: 42, counts: vec![(0, 10, 5120), (3, 1, 512)] };
        assert_eq!(Totals::decode(&t.encode()).unwrap(), t);
        assert!(Totals::decode(&t.encode()[..30]).is_err());
    }

    #[test]
    fn names() {
        for ok in ["a", "users", "A-b_c.9", &"x".repeat(NAMESPACE_NAME_MAX)] {
            check_name(ok).unwrap();
        }
        for bad in ["", "a b", "é", "a/b", &"x".repeat(NAMESPACE_NAME_MAX + 1)] {
            assert!(matches!(check_name(bad), Err(Error::BadNamespace { .. })), "{bad:?}");
        }
    }
}
