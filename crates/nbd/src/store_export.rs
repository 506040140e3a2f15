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
//!   the next handshake no longer finds it;
//! - with the runtime's [`Spawner`] ([`StoreExports::with_spawner`]), the
//!   runs of blocks a connection reads are spread over the executors in
//!   turn (a connection's requests otherwise all run on its one
//!   executor): a run read elsewhere fills a buffer of its own, copied
//!   into the reply once it has ended, so nothing the connection owns is
//!   lent to another thread. Writes stay on the connection's executor
//!   (see `write_blocks`).

use crate::export::{Export, ExportInfo, Exports};
use granary_rt::Spawner;
use granary_store::block::{block_key, BLOCK_KEY_BYTES};
use granary_store::{Change, Error, Item, ItemMeta, Namespace, NamespaceKind, Store};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The block namespaces of a store, as exports.
pub struct StoreExports {
    store: Arc<Store>,
    spread: Option<Arc<Spread>>,
}

/// The executors the runs of a read are spread over.
struct Spread {
    spawner: Spawner,
    /// The executor the next run goes to, modulo their count.
    next: AtomicUsize,
    /// Runs read on an executor other than the caller's.
    elsewhere: AtomicU64,
}

impl StoreExports {
    pub fn new(store: Arc<Store>) -> StoreExports {
        StoreExports { store, spread: None }
    }

    /// Spread the runs of blocks that reads ask for over `spawner`'s
    /// executors (the runtime the exports are served on).
    pub fn with_spawner(mut self, spawner: Spawner) -> StoreExports {
        self.spread = Some(Arc::new(Spread { spawner, next: AtomicUsize::new(0), elsewhere: AtomicU64::new(0) }));
        self
    }

    /// Runs of blocks read on an executor other than their connection's.
    pub fn runs_elsewhere(&self) -> u64 {
        self.spread.as_ref().map_or(0, |s| s.elsewhere.load(Relaxed))
    }
}

impl Spread {
    /// The executor the next run goes to, if not the caller's own.
    fn elsewhere(&self) -> Option<usize> {
        let core = self.next.fetch_add(1, Relaxed) % self.spawner.cores();
        granary_rt::current_core().is_some_and(|c| c != core).then_some(core)
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
        Some(Arc::new(StoreExport {
            store: self.store.clone(),
            ns,
            size_bytes,
            block_bytes,
            spread: self.spread.clone(),
        }))
    }
}

/// One block namespace, served.
pub struct StoreExport {
    store: Arc<Store>,
    ns: Namespace,
    size_bytes: u64,
    block_bytes: u32,
    spread: Option<Arc<Spread>>,
}

/// Read the blocks from `first` into `out` (whole blocks) with one engine
/// call; blocks never written stay as `out` has them.
async fn read_run(ns: &Namespace, block_bytes: usize, first: u64, out: &mut [u8]) -> io::Result<()> {
    let b = block_bytes;
    let keys: Vec<[u8; BLOCK_KEY_BYTES]> = (0..(out.len() / b) as u64).map(|i| block_key(first + i)).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    ns.get_many_async(&refs, |i, v| {
        let o = &mut out[i * b..(i + 1) * b];
        let n = v.len().min(b);
        o[..n].copy_from_slice(&v[..n]);
    })
    .await
    .map_err(io_error)
}

/// An engine error as an IO error whose errno the server maps to the
/// protocol's error values: a full store or namespace is `ENOSPC` (a
/// client's file system then reports a full disk), anything else `EIO`: a
/// device's own errno is not passed on (a full or read-only host file
/// system failed the store's write, which poisons it: neither a full
/// export, which a client may wait out, nor a request it may not make).
fn io_error(e: Error) -> io::Error {
    match e {
        Error::NoSpace { .. } | Error::QuotaExceeded { .. } | Error::IndexFull(_) => {
            tracing::warn!(error = %e, "NBD write refused: the store is full");
            io::Error::from_raw_os_error(libc::ENOSPC)
        }
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
        if let Some(sp) = &self.spread {
            if let Some(core) = sp.elsewhere() {
                let (ns, len) = (self.ns.clone(), out.len());
                let run = async move {
                    // Zeroes, as the caller's buffer: blocks never written
                    // read so.
                    let mut buf = vec![0u8; len];
                    let r = read_run(&ns, b, first, &mut buf).await;
                    (r, buf)
                };
                let (r, buf) = sp.spawner.spawn_on(core, run).await.map_err(io::Error::other)?;
                r?;
                sp.elsewhere.fetch_add(1, Relaxed);
                out.copy_from_slice(&buf);
                return Ok(());
            }
        }
        read_run(&self.ns, b, first, out).await
    }

    async fn write_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        // On the caller's executor: a run holds its blocks' key stripes
        // while its records are encoded, written and indexed, and the
        // blocks of one run (up to `WRITE_RUN_BYTES_MAX`) and of another
        // may share stripes, so runs elsewhere could wait for each other
        // and would add a copy of their data.
        let b = self.block_bytes as usize;
        let keys: Vec<[u8; BLOCK_KEY_BYTES]> = (0..(data.len() / b) as u64).map(|i| block_key(first + i)).collect();
        let items: Vec<(&[u8], &[u8])> = keys.iter().zip(data.chunks(b)).map(|(k, d)| (&k[..], d)).collect();
        self.ns.put_many_async(&items).await.map_err(io_error)
    }

    async fn update_block(&self, n: u64, at: usize, data: &[u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        // Owned (a copy of at most a block): the function may be called
        // by another write of the block while this one waits, so it must
        // not borrow the caller's buffer (`update_async`).
        let data: Box<[u8]> = data.into();
        // May run more than once (when the store waits for space); each
        // run starts again from the item it is given.
        let change = move |item: Option<&Item>| {
            let mut v = item.map(|i| i.value.clone()).unwrap_or_default();
            v.resize(b, 0);
            v[at..at + data.len()].copy_from_slice(&data);
            if v.iter().all(|&x| x == 0) {
                // All zeroes: no record needed to read so. A delete even
                // of an absent block: the engine writes a tombstone only
                // where a version it does not index may still be on the
                // device (which would come back after a crash), else
                // nothing.
                return (Change::Delete, ());
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

#[cfg(test)]
mod tests {
    use super::*;
    use granary_rt::{Runtime, RuntimeConfig};
    use granary_store::io::{MemDevice, SimRng};
    use granary_store::{CreateOptions, OpenOptions};

    /// A device's own errno (a read-only or full host file system) is an
    /// IO error to the client, not the errno's own NBD error value.
    #[test]
    fn a_device_errno_is_an_io_error() {
        for errno in [libc::EROFS, libc::ENOSPC, libc::EINVAL, libc::EPERM] {
            let e = Error::Io { op: "write", offset: 0, source: io::Error::from_raw_os_error(errno) };
            assert_eq!(crate::exec::error_value(&io_error(e)), crate::proto::EIO, "errno {errno}");
        }
        let full = Error::NoSpace { needed_bytes: 1, segments: 2 };
        assert_eq!(crate::exec::error_value(&io_error(full)), crate::proto::ENOSPC);
    }

    /// Runs read on either executor return what was written (by runs and
    /// by single blocks; zeroes for blocks never written), and some runs
    /// were read on the other executor.
    #[test]
    fn runs_read_on_other_executors_return_the_written_blocks() {
        let seed = 0x5eed_0001;
        let store = Arc::new(
            Store::create(Arc::new(MemDevice::new(32 << 20)), &CreateOptions::default(), &OpenOptions::default())
                .unwrap(),
        );
        store.create_export("disk", 4 << 20, 4096).unwrap();
        let rt = Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap();
        let exports = Arc::new(StoreExports::new(store.clone()).with_spawner(rt.spawner()));
        let disk = exports.open("disk").unwrap();
        let mut rng = SimRng::new(seed);
        // Blocks 0..1024: every third one left unwritten.
        let mut want = vec![0u8; 4 << 20];
        for run in 0..16u64 {
            let mut data = vec![0u8; 64 * 4096];
            for w in data.chunks_mut(8) {
                w.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            let first = run * 64;
            if run % 2 == 0 {
                // A run of blocks.
                let (d, copy) = (disk.clone(), data.clone());
                rt.block_on(async move { d.write_blocks(first, &copy).await }).unwrap().unwrap();
                want[(first as usize * 4096)..][..data.len()].copy_from_slice(&data);
                continue;
            }
            for (i, blk) in data.chunks(4096).enumerate() {
                if !(first + i as u64).is_multiple_of(3) {
                    rt.block_on({
                        let (d, blk) = (disk.clone(), blk.to_vec());
                        async move { d.write_block(first + i as u64, &blk).await }
                    })
                    .unwrap()
                    .unwrap();
                    want[((first as usize + i) * 4096)..][..4096].copy_from_slice(blk);
                }
            }
        }
        for round in 0..4 {
            let (d, want) = (disk.clone(), want.clone());
            rt.block_on(async move {
                for run in 0..16u64 {
                    let mut out = vec![0u8; 64 * 4096];
                    d.read_blocks(run * 64, &mut out).await.unwrap();
                    let at = (run * 64 * 4096) as usize;
                    assert!(out == want[at..at + out.len()], "seed {seed:#x}: round {round}, run {run} differs");
                }
            })
            .unwrap();
        }
        assert!(exports.runs_elsewhere() > 0, "no run was read on the other executor");
    }
}
