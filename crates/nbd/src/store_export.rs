//! The exports of a store: each block namespace
//! (`NamespaceKind::Block { size_bytes, block_bytes }`) is an export of its
//! name, block `n` the namespace's key `block_key(n)` (8 bytes, big-endian,
//! so keys sort as blocks do). A block never written, or trimmed, has no
//! key and reads as zeroes without touching the device.
//!
//! Invariants:
//! - every block operation is one engine call on one key, or a run of
//!   blocks one call on their keys (`put_many`, `get_many`: one device IO
//!   for the run's records, each key written or read as a single call
//!   would), so it is atomic against every other write of the block (the
//!   engine's stripe lock),
//!   and a partial write is one `update` (read-modify-write under that
//!   lock): two partial writes of one block both land;
//! - an operation returns when the engine acknowledged it, i.e. durable
//!   under the store's durability rule, and visible to every connection;
//!   [`Export::sync`] is the store's fdatasync barrier, which covers every
//!   write acknowledged before it, on any namespace;
//! - a namespace dropped while served fails its operations (`NBD_EIO`);
//!   the next handshake no longer finds it.

use crate::export::{Export, ExportInfo, Exports};
use granary_store::block::{block_key, BLOCK_KEY_BYTES};
use granary_store::{Change, Error, Item, ItemMeta, Namespace, NamespaceKind, Store};
use std::io;
use std::sync::Arc;

/// The block namespaces of a store, as exports.
pub struct StoreExports {
    store: Arc<Store>,
}

impl StoreExports {
    pub fn new(store: Arc<Store>) -> StoreExports {
        StoreExports { store }
    }
}

impl Exports for StoreExports {
    type Export = StoreExport;

    fn list(&self) -> Vec<ExportInfo> {
        self.store
            .namespaces()
            .iter()
            .filter_map(|s| {
                let e = self.open(&s.name)?;
                Some(ExportInfo {
                    name: s.name.clone(),
                    size_bytes: e.size_bytes,
                    block_bytes: e.block_bytes,
                    description: e.description(),
                })
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<StoreExport>> {
        let ns = self.store.namespace(name).ok()?;
        let (size_bytes, block_bytes) = match ns.kind() {
            NamespaceKind::Block { size_bytes, block_bytes } => (size_bytes, block_bytes),
            _ => return None,
        };
        Some(Arc::new(StoreExport { store: self.store.clone(), ns, size_bytes, block_bytes }))
    }
}

/// One block namespace, served.
pub struct StoreExport {
    store: Arc<Store>,
    ns: Namespace,
    size_bytes: u64,
    block_bytes: u32,
}

/// An engine error as an IO error whose errno the server maps to the
/// protocol's error values: a full store or namespace is `ENOSPC` (a
/// client's file system then reports a full disk), anything else `EIO`.
fn io_error(e: Error) -> io::Error {
    match e {
        Error::NoSpace { .. } | Error::QuotaExceeded { .. } | Error::IndexFull(_) => {
            tracing::warn!(error = %e, "NBD write refused: the store is full");
            io::Error::from_raw_os_error(libc::ENOSPC)
        }
        Error::Io { source, .. } => source,
        e => io::Error::other(e.to_string()),
    }
}

impl Export for StoreExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn description(&self) -> String {
        format!("granary block namespace {}", self.ns.name())
    }

    async fn read_block(&self, n: u64) -> io::Result<Option<Vec<u8>>> {
        self.ns.get_async(&block_key(n)).await.map_err(io_error)
    }

    async fn write_block(&self, n: u64, data: &[u8]) -> io::Result<()> {
        self.ns.put_async(&block_key(n), data).await.map_err(io_error)
    }

    async fn read_blocks(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        let keys: Vec<[u8; BLOCK_KEY_BYTES]> = (0..(out.len() / b) as u64).map(|i| block_key(first + i)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        self.ns
            .get_many_async(&refs, |i, v| {
                let o = &mut out[i * b..(i + 1) * b];
                let n = v.len().min(b);
                o[..n].copy_from_slice(&v[..n]);
            })
            .await
            .map_err(io_error)
    }

    async fn write_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        let keys: Vec<[u8; BLOCK_KEY_BYTES]> = (0..(data.len() / b) as u64).map(|i| block_key(first + i)).collect();
        let items: Vec<(&[u8], &[u8])> = keys.iter().zip(data.chunks(b)).map(|(k, d)| (&k[..], d)).collect();
        self.ns.put_many_async(&items).await.map_err(io_error)
    }

    async fn update_block(&self, n: u64, at: usize, data: &[u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        // May run more than once (when the store waits for space); each
        // run starts again from the item it is given.
        let change = |item: Option<&Item>| {
            let mut v = item.map(|i| i.value.clone()).unwrap_or_default();
            v.resize(b, 0);
            v[at..at + data.len()].copy_from_slice(data);
            if v.iter().all(|&x| x == 0) {
                // All zeroes: no record needed to read so.
                return (if item.is_some() { Change::Delete } else { Change::Keep }, ());
            }
            (Change::Put { value: v, meta: ItemMeta::default() }, ())
        };
        self.ns.update_async(&block_key(n), change).await.map(|_| ()).map_err(io_error)
    }

    async fn trim_block(&self, n: u64) -> io::Result<()> {
        self.ns.delete_async(&block_key(n)).await.map(|_| ()).map_err(io_error)
    }

    async fn sync(&self) -> io::Result<()> {
        self.store.sync_async().await.map_err(io_error)
    }
}
