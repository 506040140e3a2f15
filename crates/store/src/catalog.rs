//! The engine's side of namespaces ([`crate::namespace`]): changing the
//! catalog (create, drop, truncate), reading it at open, and the counts a
//! clean close leaves for the next open.
//!
//! A change holds the catalog lock, writes the new catalog (one record,
//! under the engine's reserved key, flushed whatever the durability), and
//! only then changes what readers, writers and GC see: a crash before the
//! record is on the device leaves the old catalog, one after it the new
//! one, and no write under a namespace id outlives the record that gave
//! the id out. A change runs to its end even if the future awaiting it is
//! dropped (a caller's timeout; but as [`crate::detach`] says, not when
//! dropped off its executor's thread or by a runtime shutting down): its record and what
//! DRAM holds never part (a record written but not applied would be taken
//! by the next crash's recovery, emptying a namespace the running store
//! kept acknowledging writes to). Changes that empty (drop, truncate, the
//! default namespace's flush floor) may take the room kept for deletes,
//! so a full store can still be emptied, as may the few records a close or
//! a repair writes (the sweep note, the totals, a repaired catalog); a
//! create may not.
//!
//! The first namespace created
//! in a store turns on the superblock's namespaces flag first, so a build
//! that does not know namespaces refuses the store instead of taking its
//! namespaced keys for the engine's own.

use crate::coalesce::Payload;
use crate::detach::to_the_end;
use crate::error::{Error, Result};
use crate::namespace::{
    check_name, check_options, Catalog, CatalogEntry, NamespaceMode, NamespaceOptions, NsState, Totals, CATALOG_KEY,
    DEFAULT_NAMESPACE, NAMESPACES_MAX, TOTALS_KEY,
};
use crate::nskey::{DEFAULT_NS, NS_KEY_OVERHEAD};
use crate::space::Purpose;
use crate::store::Core;
use crate::types::{Cond, ItemMeta};
use granary_format::superblock::FLAG_NAMESPACES;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Core {
    /// Create namespace `name`, its options checked first
    /// ([`check_options`]; an export's block is one value under a block's
    /// key in a namespace). Runs to its end once polled.
    pub(crate) async fn create_namespace(&self, name: &str, options: NamespaceOptions) -> Result<Arc<NsState>> {
        let name = name.to_string();
        to_the_end!(self, |core| core.create_namespace_now(&name, options))
    }

    async fn create_namespace_now(&self, name: &str, options: NamespaceOptions) -> Result<Arc<NsState>> {
        check_name(name)?;
        if name == DEFAULT_NAMESPACE {
            return Err(Error::NamespaceExists { name: name.into() });
        }
        check_options(name, &options, self.value_bytes_max(crate::block::BLOCK_KEY_BYTES + NS_KEY_OVERHEAD))?;
        let mut cat = self.namespaces.change.lock().await;
        self.log.check_writable()?;
        if cat.entries.contains_key(name) {
            return Err(Error::NamespaceExists { name: name.into() });
        }
        if cat.entries.len() >= NAMESPACES_MAX {
            let why = format!("this store holds {NAMESPACES_MAX} namespaces already; drop one first");
            return Err(Error::BadNamespace { name: name.into(), why });
        }
        let mut next = cat.clone();
        let Some(id) = next.take_id() else {
            let why = "every namespace id was given out".to_string();
            return Err(Error::BadNamespace { name: name.into(), why });
        };
        next.entries.insert(name.into(), CatalogEntry { id, options, created_unix_ms: self.clock.unix_ms() });
        // The catalog, and the totals a clean close writes (one entry a
        // namespace, the default's too), are one record each: on a store
        // of small segments they stop fitting before NAMESPACES_MAX.
        let n = next.entries.len() + 1;
        let totals = Totals { session: 0, counts: vec![(0, 0, 0); n] }.encode().len();
        let catalog = next.encode().len();
        let max = |key: &[u8]| self.value_bytes_max(key.len()) as usize;
        if catalog > max(CATALOG_KEY) || totals > max(TOTALS_KEY) {
            let why = format!(
                "{} namespaces no longer fit one record of this store's segments ({} bytes); drop one, or use \
                 larger segments",
                next.entries.len(),
                self.log.sb.segment_bytes
            );
            return Err(Error::BadNamespace { name: name.into(), why });
        }
        self.enable_feature(FLAG_NAMESPACES)?;
        self.write_catalog(&next, Purpose::Put).await?;
        *cat = next;
        let state = Arc::new(NsState::new(name, id, options, self.counters.ns_of(id)));
        self.namespaces.by_name.write().unwrap_or_else(|e| e.into_inner()).insert(name.into(), state.clone());
        self.publish(&cat);
        tracing::debug!(namespace = name, id, "namespace created");
        Ok(state)
    }

    /// Let go of the DRAM tier's items of namespace id `id` (dropped, or
    /// truncated away): nothing can read them again.
    fn drop_tier_items(&self, id: u32) {
        if let Some(t) = &self.keys.tier {
            t.drop_keys(|k| crate::nskey::owner(k) == crate::nskey::Owner::Ns(id));
        }
    }

    /// Whether `name` is still the namespace `only` (when given) is the
    /// state of: a handle's drop or truncate must not reach a namespace
    /// created since under its name. Checked under the catalog's lock.
    fn is_still(&self, name: &str, only: Option<&NsState>) -> Result<()> {
        let Some(only) = only else { return Ok(()) };
        let by_name = self.namespaces.by_name.read().unwrap_or_else(|e| e.into_inner());
        match by_name.get(name) {
            Some(s) if std::ptr::eq(Arc::as_ptr(s), only) && !only.is_dropped() => Ok(()),
            _ => Err(Error::NoSuchNamespace { name: name.into() }),
        }
    }

    /// Drop namespace `name` (only if it is still `only`'s, when given):
    /// its keys are gone at once; GC frees their space as it meets them.
    /// Runs to its end once polled.
    pub(crate) async fn drop_namespace(&self, name: &str, only: Option<&Arc<NsState>>) -> Result<()> {
        let (name, only) = (name.to_string(), only.cloned());
        to_the_end!(self, |core| core.drop_namespace_now(&name, only.as_deref()))
    }

    async fn drop_namespace_now(&self, name: &str, only: Option<&NsState>) -> Result<()> {
        if name == DEFAULT_NAMESPACE {
            let why = "the default namespace cannot be dropped (truncate empties it)".to_string();
            return Err(Error::BadNamespace { name: name.into(), why });
        }
        let mut cat = self.namespaces.change.lock().await;
        self.log.check_writable()?;
        self.is_still(name, only)?;
        let mut next = cat.clone();
        let Some(gone) = next.entries.remove(name) else { return Err(Error::NoSuchNamespace { name: name.into() }) };
        next.sweep_pending = true;
        self.write_catalog(&next, Purpose::Delete).await?;
        *cat = next;
        if let Some(state) = self.namespaces.by_name.write().unwrap_or_else(|e| e.into_inner()).remove(name) {
            state.mark_dropped();
        }
        self.publish(&cat);
        self.space.request_sweep();
        self.counters.ns.write().unwrap_or_else(|e| e.into_inner()).remove(&gone.id);
        self.drop_tier_items(gone.id);
        tracing::debug!(namespace = name, id = gone.id, "namespace dropped");
        Ok(())
    }

    /// Empty namespace `name` (only if it is still `only`'s, when given),
    /// keeping its options: it gets a new id. The default namespace is
    /// emptied by `flush_all`. Returns the new id (the default namespace's
    /// flush floor). Runs to its end once polled.
    pub(crate) async fn truncate_namespace(&self, name: &str, only: Option<&Arc<NsState>>) -> Result<u32> {
        let (name, only) = (name.to_string(), only.cloned());
        to_the_end!(self, |core| core.truncate_namespace_now(&name, only.as_deref()))
    }

    async fn truncate_namespace_now(&self, name: &str, only: Option<&NsState>) -> Result<u32> {
        if name == DEFAULT_NAMESPACE {
            let floor = self.raise_flush_floor().await?;
            return Ok(floor.min(u32::MAX as u64) as u32);
        }
        let mut cat = self.namespaces.change.lock().await;
        self.log.check_writable()?;
        self.is_still(name, only)?;
        let mut next = cat.clone();
        if !next.entries.contains_key(name) {
            return Err(Error::NoSuchNamespace { name: name.into() });
        }
        let Some(id) = next.take_id() else {
            let why = "every namespace id was given out".to_string();
            return Err(Error::BadNamespace { name: name.into(), why });
        };
        let entry = next.entries.get_mut(name).expect("checked above");
        let old = std::mem::replace(&mut entry.id, id);
        next.sweep_pending = true;
        self.write_catalog(&next, Purpose::Delete).await?;
        *cat = next;
        // The new generation's counters go on with the namespace's
        // operation counts (its values and bytes start at none).
        let counters = self.counters.ns_of(id);
        counters.carry_operations(&self.counters.ns_of(old));
        if let Ok(state) = self.namespaces.get(name) {
            state.set_current(id, counters);
        }
        self.publish(&cat);
        self.space.request_sweep();
        self.counters.ns.write().unwrap_or_else(|e| e.into_inner()).remove(&old);
        self.drop_tier_items(old);
        tracing::debug!(namespace = name, old, id, "namespace truncated");
        Ok(id)
    }

    /// Write `cat` as the catalog record, and flush it whatever the
    /// durability: no write under an id it gives out may survive a power
    /// cut that the catalog does not (with its record lost, the next open
    /// would give that id to another namespace, which would read those
    /// keys). The writes come after this returns, so after the flush.
    /// `room`: as for [`Core::write_item`].
    async fn write_catalog(&self, cat: &Catalog, room: Purpose) -> Result<()> {
        self.write_engine_key(CATALOG_KEY, &cat.encode(), room).await?;
        if self.log.durability != crate::options::Durability::Flush {
            self.sync_async().await?;
        }
        Ok(())
    }

    /// Write one of the engine's own keys, with the room of `room`
    /// ([`Core::write_item`]).
    async fn write_engine_key(&self, key: &[u8], value: &[u8], room: Purpose) -> Result<()> {
        let v = crate::write::engine_version(ItemMeta::default());
        self.write_item(key, Payload::Slice(value), v, Cond::Always, room).await.map(|_| ())
    }

    /// What GC sees: the live ids and whether each may be evicted.
    fn publish(&self, cat: &Catalog) {
        let live = cat.entries.values().map(|e| (e.id, e.options.mode == NamespaceMode::Cache));
        self.keys.ns.set(cat.next_id, live);
    }

    /// Whether superblock feature `flag` is on.
    pub(crate) fn has_feature(&self, flag: u32) -> bool {
        self.space.has_feature(flag)
    }

    /// Turn on a superblock feature flag (once, [`Space::enable_feature`]);
    /// a failure poisons the store.
    ///
    /// [`Space::enable_feature`]: crate::space::Space::enable_feature
    pub(crate) fn enable_feature(&self, flag: u32) -> Result<()> {
        self.space.enable_feature(flag).map_err(|e| self.log.poison(e))
    }

    /// Read the catalog at open (after recovery, before any GC), and make
    /// it what readers, writers and GC see. A catalog that cannot be read is
    /// an error: guessing would drop namespaces or bring dropped ones back.
    ///
    /// Ids a recovery counted at or past the catalog's `next_id` were given
    /// out by a catalog record that was lost (a power cut in direct mode,
    /// by a build that did not flush catalogs): `next_id` is raised past
    /// them, so that no namespace is given one again (it would read their
    /// keys) and they are swept as dropped. The raised catalog is written
    /// once the store runs ([`Core::write_repaired_catalog`]): not here,
    /// before GC, where a write that needs room could wait for good.
    pub(crate) async fn load_catalog(&self) -> Result<()> {
        let counted_max = self.counters.ns.read().unwrap_or_else(|e| e.into_inner()).keys().copied().max();
        let mut cat = match self.read_item(CATALOG_KEY).await? {
            Some(item) => Catalog::decode(&item.value)?,
            None if counted_max.is_none() => return Ok(()),
            None => Catalog::default(),
        };
        if let Some(max) = counted_max.filter(|&m| m >= cat.next_id) {
            tracing::warn!(
                next_id = cat.next_id,
                max,
                "the log holds values of namespace ids its catalog never gave out (a lost catalog record): \
                 they are swept, and those ids not given out again"
            );
            cat.next_id = max;
            if cat.take_id().is_none() {
                // Past the last id: none is given out again (creates are
                // refused, saying so).
                cat.next_id = u32::MAX;
            }
            cat.sweep_pending = true;
            self.namespaces.repair_pending.store(true, Relaxed);
        }
        {
            let mut by_name = self.namespaces.by_name.write().unwrap_or_else(|e| e.into_inner());
            for (name, e) in &cat.entries {
                by_name.insert(name.clone(), Arc::new(NsState::new(name, e.id, e.options, self.counters.ns_of(e.id))));
            }
        }
        // Ids a recovery counted that the catalog no longer has: values of
        // a dropped (or truncated) namespace, indexed again by a recovery
        // that met their records still on the device (a sweep had taken
        // them out of the index, but GC had not reclaimed their segments
        // yet), must be swept again.
        let live: std::collections::HashSet<u32> = cat.entries.values().map(|e| e.id).collect();
        let mut indexed_dead = false;
        self.counters.ns.write().unwrap_or_else(|e| e.into_inner()).retain(|id, c| {
            let keep = live.contains(id);
            indexed_dead |= !keep && c.keys.load(Relaxed) > 0;
            keep
        });
        self.publish(&cat);
        if cat.sweep_pending || indexed_dead {
            // The last sweep did not finish before the store closed, or its
            // work came back.
            self.space.request_sweep();
        }
        *self.namespaces.change.lock().await = cat;
        Ok(())
    }

    /// Write the catalog an open repaired ([`Core::load_catalog`]), once the
    /// store runs (GC can make room); a failure is logged, and the next open
    /// repairs it again from the log.
    pub(crate) async fn write_repaired_catalog(&self) {
        if !self.namespaces.repair_pending.swap(false, Relaxed) {
            return;
        }
        let cat = self.namespaces.change.lock().await;
        if let Err(e) = self.write_catalog(&cat, Purpose::Delete).await {
            tracing::warn!(error = %e, "could not write the repaired namespace catalog");
        }
    }

    /// At a clean close: record in the catalog that no sweep is pending,
    /// if one finished since the catalog said it was.
    pub(crate) async fn note_sweep_done(&self) -> Result<()> {
        let mut cat = self.namespaces.change.lock().await;
        if !cat.sweep_pending || self.space.sweep_pending() {
            return Ok(());
        }
        let mut next = cat.clone();
        next.sweep_pending = false;
        self.write_catalog(&next, Purpose::Delete).await?;
        *cat = next;
        Ok(())
    }

    /// Every namespace's counts, for a clean close (written just before
    /// its clean checkpoint).
    pub(crate) async fn write_totals(&self) -> Result<()> {
        let t = Totals { session: self.checkpoints.session, counts: self.counts() };
        self.write_engine_key(TOTALS_KEY, &t.encode(), Purpose::Delete).await
    }

    fn counts(&self) -> Vec<(u32, u64, u64)> {
        let of = |id: u32, c: &crate::counters::NsCounters| (id, c.keys.load(Relaxed), c.value_bytes.load(Relaxed));
        let mut counts = vec![of(DEFAULT_NS, &self.counters.default_ns)];
        for (id, c) in self.counters.ns.read().unwrap_or_else(|e| e.into_inner()).iter() {
            counts.push(of(*id, c));
        }
        counts
    }

    /// After a recovery that loaded a checkpoint of a store with
    /// namespaces: take the counts of the clean close that wrote it, if
    /// that is what was loaded (written by its session, nothing replayed,
    /// no item dropped as stale). False: the counts are unknown, and the
    /// store must be recovered by a log scan.
    pub(crate) async fn restore_totals(&self) -> Result<bool> {
        let report = self.recovery.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !report.clean_shutdown || report.checkpoint_dropped != 0 {
            return Ok(false);
        }
        let Some(item) = self.read_item(TOTALS_KEY).await? else { return Ok(false) };
        let Ok(t) = Totals::decode(&item.value) else { return Ok(false) };
        if t.session != report.checkpoint_session {
            return Ok(false);
        }
        let set = |c: &crate::counters::NsCounters, keys: u64, bytes: u64| {
            c.keys.store(keys, Relaxed);
            c.value_bytes.store(bytes, Relaxed);
        };
        set(&self.counters.default_ns, 0, 0);
        for c in self.counters.ns.read().unwrap_or_else(|e| e.into_inner()).values() {
            set(c, 0, 0);
        }
        for (id, keys, bytes) in t.counts {
            set(&self.counters.ns_of(id), keys, bytes);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::CATALOG_KEY;
    use crate::{Background, CreateOptions, NamespaceOptions, OpenOptions, Store};

    /// A catalog record lost while the keys written under the id it gave
    /// out survived (a power cut in direct mode, by a build that did not
    /// flush catalogs; here the older catalog is written again over it):
    /// the next open raises `next_id` past the ids the log holds, so a new
    /// namespace never gets one of them (it read their keys), and writes
    /// the raised catalog, so a later open does too.
    #[test]
    fn an_open_never_gives_out_again_an_id_whose_catalog_record_was_lost() {
        let dev = std::sync::Arc::new(granary_io::MemDevice::new(8 << 20));
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
        let o = OpenOptions { background: Background::Manual, ..OpenOptions::default() };
        let s = Store::create(dev.clone(), &c, &o).unwrap();
        let before = granary_rt::block_on(s.core.namespaces.change.lock()).clone();
        let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
        a.put(b"k", b"secret").unwrap();
        granary_rt::block_on(s.core.write_catalog(&before, crate::space::Purpose::Put)).unwrap();
        drop((a, s)); // a crash: the next open scans the log
        let s = Store::open(dev.clone(), &o).unwrap();
        assert!(s.namespace("a").is_err(), "the lost catalog record's namespace is not there");
        // The raised catalog is on the device once the open returns.
        let stored = granary_rt::block_on(s.core.read_item(CATALOG_KEY)).unwrap().expect("a catalog");
        let stored = crate::namespace::Catalog::decode(&stored.value).unwrap();
        assert!(stored.next_id > 1 && stored.sweep_pending, "the repaired catalog was not written");
        let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
        assert_eq!(b.get(b"k").unwrap(), None, "a new namespace read a lost one's key");
        assert!(b.stats().unwrap().id > 1);
        b.put(b"mine", b"1").unwrap();
        drop((b, s));
        let s = Store::open(dev.clone(), &o).unwrap();
        let c2 = s.create_namespace("c", NamespaceOptions::default()).unwrap();
        assert_eq!(c2.get(b"k").unwrap(), None);
        assert_eq!(s.namespace("b").unwrap().get(b"mine").unwrap().as_deref(), Some(&b"1"[..]));
    }
}
