//! Entry points for the fuzz targets (`crates/fuzz`, `fuzz/`): the
//! namespace catalog and the clean-close totals, which the store reads
//! back from the device, decoded from untrusted bytes. Not part of the
//! crate's API.
//!
//! Invariants checked: decoding never panics (a corrupted device gives an
//! error); what decodes encodes to bytes that decode to the same value
//! (the totals to the very same bytes).

use crate::namespace::{Catalog, CatalogEntry, NamespaceKind, NamespaceMode, NamespaceOptions, Totals};
use std::collections::BTreeMap;

/// Decode a catalog; one that decodes survives an encode and a decode.
/// Whether it decoded.
pub fn catalog(data: &[u8]) -> bool {
    let Ok(c) = Catalog::decode(data) else { return false };
    assert_eq!(Catalog::decode(&c.encode()).expect("an encoded catalog decodes"), c);
    true
}

/// Decode clean-close totals; those that decode encode to the same bytes.
/// Whether they decoded.
pub fn totals(data: &[u8]) -> bool {
    let Ok(t) = Totals::decode(data) else { return false };
    assert_eq!(t.encode(), data);
    true
}

/// Named encodings, for seed corpora.
pub type Named = Vec<(&'static str, Vec<u8>)>;

/// Catalogs and totals as the store writes them, for seed corpora:
/// (name, bytes) of catalog encodings, then of totals encodings.
pub fn seeds() -> (Named, Named) {
    let kv = NamespaceOptions {
        mode: NamespaceMode::Store,
        default_ttl_secs: 60,
        max_bytes: Some(1 << 30),
        max_keys: Some(1000),
        kind: NamespaceKind::Kv,
    };
    let export = NamespaceOptions {
        mode: NamespaceMode::Store,
        kind: NamespaceKind::Block { size_bytes: 1 << 30, block_bytes: 4096 },
        ..NamespaceOptions::default()
    };
    let mut entries = BTreeMap::new();
    entries.insert("users".to_string(), CatalogEntry { id: 3, options: kv, created_unix_ms: 1_700_000_000_000 });
    let kv_only = Catalog { next_id: 9, entries: entries.clone(), sweep_pending: true };
    entries.insert("disk".to_string(), CatalogEntry { id: 5, options: export, created_unix_ms: 7 });
    let with_export = Catalog { next_id: 9, entries, sweep_pending: false };
    let catalogs =
        vec![("empty", Catalog::default().encode()), ("kv", kv_only.encode()), ("export", with_export.encode())];
    let totals = vec![
        ("none", Totals { session: 1, counts: vec![] }.encode()),
        ("three", Totals { session: 42, counts: vec![(0, 10, 1000), (3, 2, 64), (5, 0, 0)] }.encode()),
    ];
    (catalogs, totals)
}
