//! Namespaces: named, independent key spaces in one store, each with its
//! own options (mode, default TTL, quotas, kind) and figures, dropped or
//! emptied in O(1).
//!
//! **Kinds.** A namespace is a plain key space ([`NamespaceKind::Kv`]) or
//! the blocks of a block device ([`NamespaceKind::Block`]: an *export*, a
//! size and a block size, its keys the block numbers of [`crate::block`]).
//! The engine stores an export's blocks as it stores any value; the kind
//! tells a block server (NBD) the device's geometry, and fixes what an
//! export may be: never evicted (mode `store`), no quota or default TTL (a
//! device does not lose blocks), a block that fits one value
//! ([`check_options`]).
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
//! ([`crate::nskey::NsTable::fate`]), which frees their space and their
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
pub(crate) use crate::nskey::{RESERVED_ID, TOTALS_KEY};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// The reserved key holding the catalog.
pub(crate) const CATALOG_KEY: &[u8] = b"\0granary.catalog";

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

/// Smallest block of an export, in bytes (a disk sector).
pub const BLOCK_BYTES_MIN: u32 = 512;
/// Largest block of an export, in bytes.
pub const BLOCK_BYTES_MAX: u32 = 64 << 10;
/// The block size an export gets when none is asked for (a page, and what
/// Linux's NBD client uses).
pub const BLOCK_BYTES_DEFAULT: u32 = 4096;
/// Largest export, in bytes: 2^63, so a byte offset into it fits an `i64`
/// (the `off_t` of the clients reading it).
pub const EXPORT_BYTES_MAX: u64 = 1 << 63;

/// What a namespace's keys are (see the module doc, "Kinds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NamespaceKind {
    /// Keys and values as the user gives them.
    #[default]
    Kv,
    /// An export: a block device of `size_bytes` in blocks of
    /// `block_bytes`, block `n` under the key [`crate::block::block_key`]`(n)`.
    Block { size_bytes: u64, block_bytes: u32 },
}

impl NamespaceKind {
    /// `kv` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            NamespaceKind::Kv => "kv",
            NamespaceKind::Block { .. } => "block",
        }
    }

    /// Whether it is an export.
    pub fn is_block(self) -> bool {
        matches!(self, NamespaceKind::Block { .. })
    }

    /// An export's blocks: its size over its block size (0 for `Kv`).
    pub fn blocks(self) -> u64 {
        match self {
            NamespaceKind::Kv => 0,
            NamespaceKind::Block { size_bytes, block_bytes } => size_bytes / block_bytes as u64,
        }
    }

    fn code(self) -> u8 {
        match self {
            NamespaceKind::Kv => 0,
            NamespaceKind::Block { .. } => 1,
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
    /// A key space or an export.
    pub kind: NamespaceKind,
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
    /// Of the evicted and the expired values, those never read (a GET's
    /// read, with access tracking: [`crate::OpenOptions::track_access`])
    /// since they were written or the store was opened; without access
    /// tracking every one counts (memcached's `evicted_unfetched` and
    /// `expired_unfetched`).
    pub evicted_unfetched: u64,
    pub expired_unfetched: u64,
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

/// Check the options a namespace is created with, whatever its kind:
/// limits of at least 1; for an export, a block size that is a power of two
/// in [`BLOCK_BYTES_MIN`]`..=`[`BLOCK_BYTES_MAX`] and at most `value_max`
/// (the largest value the store holds under a block's key: one block is
/// one value), a size that is a positive multiple of the block size and at
/// most [`EXPORT_BYTES_MAX`], mode `store` (a block the store evicted
/// would read back as zeros: silent data loss), and no quota or default
/// TTL (a device does not refuse or forget a block it was given). Every
/// refusal is `BadNamespace` saying which rule.
pub fn check_options(name: &str, o: &NamespaceOptions, value_max: u64) -> Result<()> {
    let bad = |why: String| Err(Error::BadNamespace { name: name.into(), why });
    if o.max_bytes == Some(0) || o.max_keys == Some(0) {
        return bad("a limit is at least 1 (leave it unset for none)".into());
    }
    let NamespaceKind::Block { size_bytes, block_bytes } = o.kind else { return Ok(()) };
    if !block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes) {
        return bad(format!(
            "block size {block_bytes}: an export's block size is a power of two from {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX} bytes"
        ));
    }
    if block_bytes as u64 > value_max {
        return bad(format!(
            "block size {block_bytes}: this store holds values up to {value_max} bytes under a block's key \
             (a block is one value; use smaller blocks or a store with larger segments)"
        ));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(block_bytes as u64) {
        return bad(format!(
            "size {size_bytes}: an export's size is a positive multiple of its block size {block_bytes}"
        ));
    }
    if size_bytes > EXPORT_BYTES_MAX {
        return bad(format!("size {size_bytes}: an export holds at most {EXPORT_BYTES_MAX} bytes (2^63)"));
    }
    if o.mode != NamespaceMode::Store {
        return bad("an export is never evicted: its mode is store".into());
    }
    if o.has_quota() || o.default_ttl_secs != 0 {
        return bad("an export has no quota and no default TTL".into());
    }
    Ok(())
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

impl Catalog {
    /// Give out the next id, skipping [`RESERVED_ID`]; None once every id
    /// was given out.
    pub(crate) fn take_id(&mut self) -> Option<u32> {
        let mut id = self.next_id;
        if id == RESERVED_ID {
            id = id.checked_add(1)?;
        }
        self.next_id = id.checked_add(1)?;
        Some(id)
    }
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
/// The catalog of namespaces that are all `Kv`: the layout of builds that
/// predate kinds, so a store with no export stays readable by them.
const CATALOG_VERSION_KV: u16 = 1;
/// The catalog with kinds: the reserved byte after the mode is the kind,
/// and an export's entry carries its size and block size.
const CATALOG_VERSION_KINDS: u16 = 2;
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

    /// The header: magic, a version this build reads (`versions`), and
    /// flags of `known` only; returns the version and the flags.
    fn header(&mut self, magic: u32, versions: std::ops::RangeInclusive<u16>, known: u16) -> Result<(u16, u16)> {
        if self.u32("magic")? != magic {
            return Err(self.bad("has the wrong magic".into()));
        }
        let v = self.u16("version")?;
        if !versions.contains(&v) {
            let (lo, hi) = (versions.start(), versions.end());
            let reads = if lo == hi { format!("version {lo}") } else { format!("versions {lo} to {hi}") };
            return Err(self.bad(format!("has version {v}; this build reads {reads}")));
        }
        let flags = self.u16("flags")?;
        if flags & !known != 0 {
            return Err(self.bad(format!("has unknown flags {flags:#x}")));
        }
        Ok((v, flags))
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
    /// namespace: id u32, mode u8, kind u8 (version 1: reserved, 0),
    /// name_len u16, default_ttl_secs u32, max_bytes u64 (0: none),
    /// max_keys u64 (0: none), created_unix_ms u64, for an export (kind 1)
    /// size_bytes u64 and block_bytes u32, then the name. Version 1 when
    /// every namespace is `Kv` (what builds before kinds read), else 2.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let kinds = self.entries.values().any(|e| e.options.kind.is_block());
        let version = if kinds { CATALOG_VERSION_KINDS } else { CATALOG_VERSION_KV };
        let mut b = Vec::with_capacity(16 + self.entries.len() * 60);
        b.extend_from_slice(&CATALOG_MAGIC.to_le_bytes());
        b.extend_from_slice(&version.to_le_bytes());
        let flags = if self.sweep_pending { CATALOG_SWEEP_PENDING } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (name, e) in &self.entries {
            b.extend_from_slice(&e.id.to_le_bytes());
            b.push(e.options.mode.code());
            b.push(e.options.kind.code());
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(&e.options.default_ttl_secs.to_le_bytes());
            b.extend_from_slice(&e.options.max_bytes.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&e.options.max_keys.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&e.created_unix_ms.to_le_bytes());
            if let NamespaceKind::Block { size_bytes, block_bytes } = e.options.kind {
                b.extend_from_slice(&size_bytes.to_le_bytes());
                b.extend_from_slice(&block_bytes.to_le_bytes());
            }
            b.extend_from_slice(name.as_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Catalog> {
        let mut r = Reader { b, what: "catalog" };
        let (version, flags) =
            r.header(CATALOG_MAGIC, CATALOG_VERSION_KV..=CATALOG_VERSION_KINDS, CATALOG_SWEEP_PENDING)?;
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
            let kind = r.u8("kind")?;
            if version == CATALOG_VERSION_KV && kind != 0 {
                return Err(r.bad("has reserved bits set".into()));
            }
            let name_len = r.u16("name_len")? as usize;
            let default_ttl_secs = r.u32("default_ttl")?;
            let some = |n: u64| (n != 0).then_some(n);
            let max_bytes = some(r.u64("max_bytes")?);
            let max_keys = some(r.u64("max_keys")?);
            let created_unix_ms = r.u64("created")?;
            let kind = match kind {
                0 => NamespaceKind::Kv,
                1 => NamespaceKind::Block { size_bytes: r.u64("size_bytes")?, block_bytes: r.u32("block_bytes")? },
                k => return Err(r.bad(format!("has an unknown namespace kind {k}"))),
            };
            let name = std::str::from_utf8(r.take(name_len, "name")?)
                .map_err(|_| r.bad("holds a name that is not UTF-8".into()))?
                .to_string();
            check_name(&name).map_err(|e| r.bad(e.to_string()))?;
            if id == DEFAULT_NS || id >= next_id || !ids.insert(id) {
                return Err(r.bad(format!("gives namespace {name:?} the id {id}, which is not free")));
            }
            let options = NamespaceOptions { mode, default_ttl_secs, max_bytes, max_keys, kind };
            // Every rule but the store's value size (which a catalog read
            // alone does not know; it was checked at creation).
            check_options(&name, &options, u64::MAX).map_err(|e| r.bad(e.to_string()))?;
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
        r.header(TOTALS_MAGIC, TOTALS_VERSION..=TOTALS_VERSION, 0)?;
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
    /// In an export (a block namespace), a key must be a block's
    /// ([`crate::block::block_key`] of a block below the export's count):
    /// a key written through a KV protocol would sit in the export unseen
    /// by its block server.
    pub(crate) fn check_block_key(&self, key: &[u8]) -> Result<()> {
        let kind = self.options.kind;
        if !kind.is_block() || crate::block::block_of(key).is_some_and(|n| n < kind.blocks()) {
            return Ok(());
        }
        Err(Error::BadNamespace {
            name: self.name.clone(),
            why: format!(
                "an export takes only its blocks' keys (8 bytes, a block number below {}), not a key of {} bytes",
                kind.blocks(),
                key.len()
            ),
        })
    }

    /// In an export, a value must be a whole block.
    pub(crate) fn check_block_value(&self, len: usize) -> Result<()> {
        match self.options.kind {
            NamespaceKind::Block { block_bytes, .. } if len != block_bytes as usize => Err(Error::BadNamespace {
                name: self.name.clone(),
                why: format!("an export's values are whole {block_bytes}-byte blocks, not {len} bytes"),
            }),
            _ => Ok(()),
        }
    }

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
            keys: crate::counters::not_below_zero(c.keys.load(Relaxed)),
            value_bytes: crate::counters::not_below_zero(c.value_bytes.load(Relaxed)),
            gets,
            hits,
            misses: gets.saturating_sub(hits),
            sets: c.sets.load(Relaxed),
            deletes: c.deletes.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            expirations: c.expirations.load(Relaxed),
            evicted_unfetched: c.evicted_unfetched.load(Relaxed),
            expired_unfetched: c.expired_unfetched.load(Relaxed),
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
    /// The catalog held is not the one on the device: the open raised its
    /// `next_id` past ids a lost record gave out (`Core::load_catalog`),
    /// to be written once the store runs (`Core::write_repaired_catalog`).
    pub repair_pending: AtomicBool,
}

impl Namespaces {
    pub(crate) fn new(default_mode: NamespaceMode, counters: Arc<NsCounters>) -> Namespaces {
        let options = NamespaceOptions { mode: default_mode, ..Default::default() };
        let default = Arc::new(NsState::new(DEFAULT_NAMESPACE, DEFAULT_NS, options, counters));
        let by_name = RwLock::new(BTreeMap::from([(DEFAULT_NAMESPACE.to_string(), default.clone())]));
        Namespaces {
            change: async_lock::Mutex::new(Catalog::default()),
            by_name,
            default,
            repair_pending: AtomicBool::new(false),
        }
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

    #[test]
    fn ids_are_given_out_in_turn_skipping_the_reserved_one() {
        let mut c = Catalog::default();
        assert_eq!((c.take_id(), c.take_id(), c.next_id), (Some(1), Some(2), 3));
        c.next_id = RESERVED_ID - 1;
        assert_eq!(
            (c.take_id(), c.take_id(), c.next_id),
            (Some(RESERVED_ID - 1), Some(RESERVED_ID + 1), RESERVED_ID + 2)
        );
        c.next_id = u32::MAX - 1;
        assert_eq!((c.take_id(), c.take_id(), c.next_id), (Some(u32::MAX - 1), None, u32::MAX));
    }

    fn sample() -> Catalog {
        let mut c = Catalog { next_id: 9, entries: BTreeMap::new(), sweep_pending: true };
        let o = NamespaceOptions {
            mode: NamespaceMode::Store,
            default_ttl_secs: 60,
            max_bytes: Some(1 << 30),
            max_keys: None,
            kind: NamespaceKind::Kv,
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
        v[4] = 3;
        assert!(err(&v).contains("version 3; this build reads versions 1 to 2"), "{}", err(&v));
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

    /// A catalog of version 1 (builds before kinds), written out field by
    /// field: it decodes with every namespace `Kv`, and one of only `Kv`
    /// namespaces is still written so.
    #[test]
    fn a_version_1_catalog_decodes_as_kv() {
        let mut b = Vec::new();
        b.extend_from_slice(b"GNSC");
        b.extend_from_slice(&1u16.to_le_bytes()); // version
        b.extend_from_slice(&0u16.to_le_bytes()); // flags
        b.extend_from_slice(&5u32.to_le_bytes()); // next_id
        b.extend_from_slice(&1u32.to_le_bytes()); // count
        b.extend_from_slice(&4u32.to_le_bytes()); // id
        b.extend_from_slice(&[1, 0]); // mode store, reserved
        b.extend_from_slice(&5u16.to_le_bytes()); // name_len
        b.extend_from_slice(&30u32.to_le_bytes()); // default_ttl_secs
        b.extend_from_slice(&0u64.to_le_bytes()); // max_bytes
        b.extend_from_slice(&7u64.to_le_bytes()); // max_keys
        b.extend_from_slice(&99u64.to_le_bytes()); // created_unix_ms
        b.extend_from_slice(b"users");
        let c = Catalog::decode(&b).unwrap();
        let e = &c.entries["users"];
        let want = NamespaceOptions {
            mode: NamespaceMode::Store,
            default_ttl_secs: 30,
            max_bytes: None,
            max_keys: Some(7),
            kind: NamespaceKind::Kv,
        };
        assert_eq!((e.id, e.options, e.created_unix_ms, c.next_id), (4, want, 99, 5));
        assert_eq!(c.encode(), b, "no export: still written as version 1");
        // Version 1's reserved byte is not a kind.
        let mut kind = b.clone();
        kind[21] = 1;
        let err = Catalog::decode(&kind).unwrap_err().to_string();
        assert!(err.contains("reserved bits set"), "{err}");
    }

    #[test]
    fn a_version_2_catalog_round_trips_exports_and_refuses_unknown_kinds() {
        let mut c = sample();
        let block = |size_bytes, block_bytes| NamespaceOptions {
            mode: NamespaceMode::Store,
            kind: NamespaceKind::Block { size_bytes, block_bytes },
            ..Default::default()
        };
        // "disk" sorts first: its entry starts at 16, its kind byte at 21,
        // its size at 52 and its block size at 60.
        c.entries.insert("disk".into(), CatalogEntry { id: 2, options: block(1 << 40, 4096), created_unix_ms: 7 });
        c.entries.insert("tiny".into(), CatalogEntry { id: 5, options: block(512, 512), created_unix_ms: 8 });
        let b = c.encode();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 2, "an export needs version 2");
        assert_eq!(b[21], 1);
        assert_eq!(Catalog::decode(&b).unwrap(), c);
        let err = |b: &[u8]| Catalog::decode(b).unwrap_err().to_string();
        let mut kind = b.clone();
        kind[21] = 2;
        assert!(err(&kind).contains("unknown namespace kind 2"), "{}", err(&kind));
        let mut size = b.clone();
        size[52..60].copy_from_slice(&1000u64.to_le_bytes());
        assert!(err(&size).contains("positive multiple of its block size"), "{}", err(&size));
        let mut bs = b.clone();
        bs[60..64].copy_from_slice(&3000u32.to_le_bytes());
        assert!(err(&bs).contains("power of two"), "{}", err(&bs));
        let mut mode = b.clone();
        mode[20] = 0;
        assert!(err(&mode).contains("its mode is store"), "{}", err(&mode));
        assert!(err(&b[..55]).contains("ends inside size_bytes"), "{}", err(&b[..55]));
        // Dropping the exports writes version 1 again.
        c.entries.retain(|_, e| !e.options.kind.is_block());
        assert_eq!(u16::from_le_bytes([c.encode()[4], c.encode()[5]]), 1);
    }

    #[test]
    fn export_options_are_checked() {
        let max = 1 << 20;
        let block = |size_bytes, block_bytes| NamespaceOptions {
            mode: NamespaceMode::Store,
            kind: NamespaceKind::Block { size_bytes, block_bytes },
            ..Default::default()
        };
        let why = |o: NamespaceOptions, max| match check_options("e", &o, max) {
            Err(Error::BadNamespace { why, .. }) => why,
            r => panic!("{o:?}: {r:?}"),
        };
        check_options("e", &block(512, 512), max).unwrap();
        check_options("e", &block(EXPORT_BYTES_MAX, BLOCK_BYTES_MAX), max).unwrap();
        check_options("e", &block(1 << 30, BLOCK_BYTES_DEFAULT), max).unwrap();
        for bs in [0, 256, 1000, 4097, 128 << 10] {
            assert!(why(block(1 << 20, bs), max).contains("power of two from 512 to 65536"), "{bs}");
        }
        assert!(why(block(1 << 20, 65536), 65000).contains("values up to 65000 bytes"));
        assert!(why(block(0, 4096), max).contains("positive multiple"));
        assert!(why(block(4096 + 512, 4096), max).contains("positive multiple"));
        assert!(why(block(EXPORT_BYTES_MAX + 4096, 4096), max).contains("at most 9223372036854775808 bytes"));
        assert!(
            why(NamespaceOptions { mode: NamespaceMode::Cache, ..block(4096, 4096) }, max).contains("mode is store")
        );
        for o in [
            NamespaceOptions { max_keys: Some(1), ..block(4096, 4096) },
            NamespaceOptions { max_bytes: Some(1), ..block(4096, 4096) },
            NamespaceOptions { default_ttl_secs: 1, ..block(4096, 4096) },
        ] {
            assert!(why(o, max).contains("no quota and no default TTL"), "{o:?}");
        }
        assert!(why(NamespaceOptions { max_keys: Some(0), ..Default::default() }, max).contains("at least 1"));
        assert_eq!(block(1 << 30, 4096).kind.blocks(), 1 << 18);
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
