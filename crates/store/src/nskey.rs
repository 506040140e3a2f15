//! How a key of a namespace is stored: the namespace's id in a prefix of
//! the engine's reserved key space, then the user's key. Pure functions;
//! the catalog and the handles are `namespace`'s.
//!
//! A key of the default namespace (id 0) is stored as it is: stores written
//! before namespaces existed hold exactly those. A key of namespace `id`
//! (1 and up) is stored as [`NS_KEY_PREFIX`] ++ `id` (4 bytes, little
//! endian) ++ the user's key. User keys of the default namespace never start
//! with [`crate::RESERVED_KEY_PREFIX`] (every user call refuses them), so
//! the two kinds never collide, and the key hash (of the stored bytes) gives
//! the same user key in two namespaces two identities. The engine's own keys
//! (the flush floor, the catalog) are reserved keys outside every namespace.

use crate::types::RESERVED_KEY_PREFIX;

/// The prefix of every namespaced key: the reserved prefix, then `n`.
pub(crate) const NS_KEY_PREFIX: &[u8] = b"\0granary.n";

/// Bytes a namespaced key adds to the user's key.
pub const NS_KEY_OVERHEAD: usize = NS_KEY_PREFIX.len() + 4;

/// Id of the default namespace.
pub(crate) const DEFAULT_NS: u32 = 0;

/// Whose a stored key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A user key of namespace `id` (0: the default namespace).
    Ns(u32),
    /// One of the engine's own keys.
    Engine,
}

/// The reserved key holding the flush floor (see `Store::flush_all`), one
/// of the engine's own keys.
pub(crate) const FLUSH_FLOOR_KEY: &[u8] = b"\0granary.flush_floor";

/// The reserved key holding the namespaces' counts written at a clean
/// close (`crate::catalog`), one of the engine's own keys.
pub(crate) const TOTALS_KEY: &[u8] = b"\0granary.ns_totals";

/// The id never given out: its stored keys' prefix is [`TOTALS_KEY`]'s
/// start (`"\0granary.n"` then `"s_to"`), so one of its keys could be the
/// engine's own record. [`owner`] takes that key for the engine's.
pub(crate) const RESERVED_ID: u32 = u32::from_le_bytes(*b"s_to");

/// The owner of a stored key.
pub(crate) fn owner(stored: &[u8]) -> Owner {
    // The usual case, a default-namespace key, is decided by its first byte.
    if stored.first() != Some(&0) || !stored.starts_with(RESERVED_KEY_PREFIX) {
        return Owner::Ns(DEFAULT_NS);
    }
    // It starts as a key of namespace `RESERVED_ID` would, an id never
    // given out.
    if stored == TOTALS_KEY {
        return Owner::Engine;
    }
    match stored.strip_prefix(NS_KEY_PREFIX) {
        Some(rest) if rest.len() >= 4 => {
            let id = u32::from_le_bytes(rest[..4].try_into().expect("four bytes"));
            if id == DEFAULT_NS {
                Owner::Engine
            } else {
                Owner::Ns(id)
            }
        }
        _ => Owner::Engine,
    }
}

/// The stored form of `key` in namespace `id` (not the default one).
pub(crate) fn stored_key(id: u32, key: &[u8]) -> Vec<u8> {
    debug_assert_ne!(id, DEFAULT_NS);
    let mut k = Vec::with_capacity(NS_KEY_OVERHEAD + key.len());
    k.extend_from_slice(NS_KEY_PREFIX);
    k.extend_from_slice(&id.to_le_bytes());
    k.extend_from_slice(key);
    k
}

/// The user's key of a stored key of namespace `id`.
pub(crate) fn user_key(id: u32, stored: &[u8]) -> &[u8] {
    if id == DEFAULT_NS {
        stored
    } else {
        &stored[NS_KEY_OVERHEAD..]
    }
}

/// Which namespace ids are live, for GC: a record of an id given out and
/// no longer in the catalog is garbage. Until the catalog is read at open
/// no id counts as given out, so nothing is judged dead.
pub(crate) struct NsTable {
    /// Ids below this were given out.
    next_id: std::sync::atomic::AtomicU32,
    /// The live ids besides the default namespace, and whether each one's
    /// values may be evicted.
    live: std::sync::RwLock<std::collections::HashMap<u32, bool>>,
}

/// What GC may do with a record, by its key's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The engine's own key: kept, never evicted.
    Engine,
    /// A live namespace's key; whether its values may be evicted.
    Live { evictable: bool },
    /// A key of a dropped (or truncated) namespace: garbage.
    Dead,
}

impl NsTable {
    pub(crate) fn new() -> NsTable {
        NsTable { next_id: 0.into(), live: Default::default() }
    }

    /// The catalog as read or just written.
    pub(crate) fn set(&self, next_id: u32, live: impl IntoIterator<Item = (u32, bool)>) {
        let mut l = self.live.write().unwrap_or_else(|e| e.into_inner());
        *l = live.into_iter().collect();
        self.next_id.store(next_id, std::sync::atomic::Ordering::Release);
    }

    /// What GC may do with a record of stored key `key`.
    pub(crate) fn fate(&self, key: &[u8]) -> Fate {
        match owner(key) {
            Owner::Engine => Fate::Engine,
            Owner::Ns(DEFAULT_NS) => Fate::Live { evictable: true },
            Owner::Ns(id) => {
                // Read before the live set: an id created after this read
                // counts as live (never dead by mistake).
                let given = self.next_id.load(std::sync::atomic::Ordering::Acquire);
                match self.live.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
                    Some(&evictable) => Fate::Live { evictable },
                    None if id < given => Fate::Dead,
                    None => Fate::Live { evictable: false },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners() {
        assert_eq!(owner(b"plain"), Owner::Ns(0));
        assert_eq!(owner(b"\0other"), Owner::Ns(0));
        assert_eq!(owner(b"\0granary.flush_floor"), Owner::Engine);
        assert_eq!(owner(b"\0granary.catalog"), Owner::Engine);
        assert_eq!(owner(b"\0granary.n\x01\0"), Owner::Engine, "too short for an id");
        assert_eq!(owner(TOTALS_KEY), Owner::Engine, "the totals record");
        assert_eq!(&stored_key(RESERVED_ID, b"tals")[..], TOTALS_KEY, "why that id is never given out");
        let k = stored_key(7, b"abc");
        assert_eq!(owner(&k), Owner::Ns(7));
        assert_eq!(user_key(7, &k), b"abc");
        assert_eq!(owner(&stored_key(u32::MAX, b"")), Owner::Ns(u32::MAX));
        // Two namespaces, one user key: two stored keys.
        assert_ne!(stored_key(1, b"k"), stored_key(2, b"k"));
    }

    #[test]
    fn fates() {
        let t = NsTable::new();
        // Before the catalog is read nothing is dead.
        assert_eq!(t.fate(&stored_key(3, b"k")), Fate::Live { evictable: false });
        t.set(5, [(2, true), (4, false)]);
        assert_eq!(t.fate(b"k"), Fate::Live { evictable: true });
        assert_eq!(t.fate(b"\0granary.catalog"), Fate::Engine);
        assert_eq!(t.fate(&stored_key(2, b"k")), Fate::Live { evictable: true });
        assert_eq!(t.fate(&stored_key(4, b"k")), Fate::Live { evictable: false });
        assert_eq!(t.fate(&stored_key(3, b"k")), Fate::Dead);
        assert_eq!(t.fate(&stored_key(1, b"k")), Fate::Dead);
        // Created after the table was read: not dead.
        assert_eq!(t.fate(&stored_key(5, b"k")), Fate::Live { evictable: false });
    }
}
