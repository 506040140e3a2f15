//! The embedded engine from Python: `Store` (a store open in this
//! process), `Namespace` (a handle on one of its namespaces, with the same
//! key calls) and `Batch` (operations committed all or nothing).
//!
//! Invariants: the engine's store lives in `Store::inner` until `close`
//! takes it out. A Python `Namespace` (and a `Batch` operation given one)
//! holds the engine's handle on its namespace, which keeps the engine's
//! memory but not its device lock: a closed store lets go of its file's
//! lock while such objects live on (its calls then raise `granary.Closed`),
//! and an in-memory store's memory goes with the last of them. Every call, the store's and its
//! namespaces' and batches', holds that lock's read side for its whole
//! duration, so `close` (the write side) waits for calls under way and
//! later calls fail with `granary.Closed`. The lock is taken with the
//! interpreter released, so a thread waiting for it never holds up the
//! others.
//!
//! Values are returned as `bytes`: one copy, from the engine's read buffer
//! ([`granary_store::ValueBuf`]) into the new object. A `memoryview` over
//! the engine's buffer would need the buffer protocol, which the stable ABI
//! offers only from CPython 3.11, and this module targets 3.9.

use crate::{keys_of, Data, Fail, Mode, Result};
use granary_store::io::{IoBackend, MemDevice, OpenMode};
use granary_store::{
    BatchOp, BatchOutcome, Cond, CreateOptions, Durability, IfPresent, ItemMeta, NamespaceOptions, NamespaceStats,
    NewStore, OpenOptions, PutMode, PutOutcome, Site, ValueBuf, DEFAULT_NAMESPACE,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// Keys a `keys()` scan page aims for.
const SCAN_PAGE_KEYS: usize = 1024;

/// A key's value as a new `bytes` object (the one copy of a read).
fn to_bytes<'py>(py: Python<'py>, v: &ValueBuf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, v.value())
}

/// What `put` writes: a mode, or a CAS value that must still be current.
fn put_cond(mode: Option<&str>, cas: Option<u64>) -> Result<Cond> {
    let mode = mode.map(Mode::parse).transpose()?.unwrap_or(Mode::Set);
    match (mode, cas) {
        (Mode::Set, Some(c)) => Ok(Cond::Cas(c)),
        (_, Some(_)) => Err(Fail::Invalid("cas= is given with mode \"set\" only".into())),
        (Mode::Set, None) => Ok(Cond::Always),
        (Mode::Add, None) => Ok(Cond::Absent),
        (Mode::Replace, None) => Ok(Cond::Present),
    }
}

/// The key calls, the same on a store (its default namespace) and on a
/// namespace: generated once for both classes, each with a `run` that
/// calls its engine handle with the interpreter released, and the
/// class's own methods (`$extra`).
macro_rules! key_methods {
    ($ty:ty, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            /// The value of `key` as `bytes`, or None if it holds none.
            fn get<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Option<Bound<'py, PyBytes>>> {
                let k: &[u8] = &key;
                let v = self.run(py, |s| s.get_buf(k))?;
                Ok(v.map(|v| to_bytes(py, &v)))
            }

            /// The value of `key` and its CAS value (which changes with
            /// every write of the key), or None if it holds none.
            fn get_cas<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Option<(Bound<'py, PyBytes>, u64)>> {
                let k: &[u8] = &key;
                let v = self.run(py, |s| s.get_buf(k))?;
                Ok(v.map(|v| (to_bytes(py, &v), v.cas)))
            }

            /// The values of several keys, in order (None where a key holds
            /// none), read with the interpreter released once for all.
            fn get_many<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
                let keys = keys_of(keys)?;
                let vs = self.run(py, |s| keys.iter().map(|k| s.get_buf(k)).collect::<granary_store::Result<Vec<_>>>())?;
                PyList::new(py, vs.iter().map(|v| v.as_ref().map(|v| to_bytes(py, v))))
            }

            /// Write `value` under `key`. `mode`: "set" (insert or
            /// overwrite, the default), "add" (only if the key holds no
            /// value) or "replace" (only if it holds one); `cas`: only if
            /// the key's value still has this CAS value (`get_cas`).
            /// Returns whether it wrote.
            #[pyo3(signature = (key, value, *, mode = None, cas = None))]
            fn put(&self, py: Python<'_>, key: Data<'_>, value: Data<'_>, mode: Option<String>, cas: Option<u64>) -> PyResult<bool> {
                let cond = put_cond(mode.as_deref(), cas)?;
                let (k, v): (&[u8], &[u8]) = (&key, &value);
                let stored = match cond {
                    Cond::Always => self.run(py, |s| s.put(k, v)).map(|()| true)?,
                    Cond::Absent => self.run(py, |s| s.put_with(k, v, PutMode::CreateOnly))? == PutOutcome::Stored,
                    Cond::Present => self.run(py, |s| s.put_with(k, v, PutMode::ReplaceOnly))? == PutOutcome::Stored,
                    c @ Cond::Cas(_) => self.run(py, |s| s.put_item(k, v, ItemMeta::default(), c))?.0 == PutOutcome::Stored,
                };
                Ok(stored)
            }

            /// Delete `key`; returns whether it deleted a value. With `cas`,
            /// only if the key's value still has this CAS value (`get_cas`):
            /// False if it holds no value or another one.
            #[pyo3(signature = (key, *, cas = None))]
            fn delete(&self, py: Python<'_>, key: Data<'_>, cas: Option<u64>) -> PyResult<bool> {
                let k: &[u8] = &key;
                Ok(match cas {
                    None => self.run(py, |s| s.delete(k))?,
                    // Checked and deleted under the key's lock.
                    Some(cas) => self.run(py, |s| {
                        s.update(k, |it| match it {
                            Some(it) if it.cas == cas => (granary_store::Change::Delete, true),
                            _ => (granary_store::Change::Keep, false),
                        })
                        .map(|(deleted, _)| deleted)
                    })?,
                })
            }

            /// Every key (as `bytes`, in no particular order). Keys
            /// written or deleted during the call may or may not be listed.
            fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
                let all = self.run(py, |s| {
                    let mut all = Vec::new();
                    let mut cursor = 0;
                    loop {
                        let page = s.scan(cursor, SCAN_PAGE_KEYS)?;
                        all.extend(page.keys);
                        if page.cursor == 0 {
                            return Ok(all);
                        }
                        cursor = page.cursor;
                    }
                })?;
                PyList::new(py, all.iter().map(|k| PyBytes::new(py, k)))
            }

            /// Iterating gives the keys, as `keys()` lists them (read when
            /// the iteration starts).
            fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
                self.keys(py)?.try_iter()
            }

            /// The largest value a key of `key_len` bytes may hold here.
            #[pyo3(signature = (key_len = 16))]
            fn max_value_size(&self, py: Python<'_>, key_len: usize) -> PyResult<u64> {
                Ok(self.run(py, |s| Ok(s.value_bytes_max(key_len)))?)
            }

            fn __contains__(&self, py: Python<'_>, key: Data<'_>) -> PyResult<bool> {
                let k: &[u8] = &key;
                Ok(self.run(py, |s| s.get_buf(k))?.is_some())
            }

            fn __getitem__<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Bound<'py, PyBytes>> {
                let k: &[u8] = &key;
                match self.run(py, |s| s.get_buf(k))? {
                    Some(v) => Ok(to_bytes(py, &v)),
                    None => Err(crate::raise(py, "NotFound", format!("no value for key {:?}", String::from_utf8_lossy(k)))),
                }
            }

            fn __setitem__(&self, py: Python<'_>, key: Data<'_>, value: Data<'_>) -> PyResult<()> {
                let (k, v): (&[u8], &[u8]) = (&key, &value);
                Ok(self.run(py, |s| s.put(k, v))?)
            }

            fn __delitem__(&self, py: Python<'_>, key: Data<'_>) -> PyResult<()> {
                let k: &[u8] = &key;
                match self.run(py, |s| s.delete(k))? {
                    true => Ok(()),
                    false => Err(crate::raise(py, "NotFound", format!("no value for key {:?}", String::from_utf8_lossy(k)))),
                }
            }

            $($extra)*
        }
    };
}

/// A Granary store open in this process.
///
/// Make one with `Store.create(path, size=...)`, `Store.open(path)` or
/// `Store.memory(size)`; use it as a context manager (or call `close`) so
/// that it closes cleanly: a store closed cleanly reopens at once, one
/// that was not is recovered from its log on the next open (nothing
/// acknowledged is lost either way). Share it between threads freely:
/// every call releases the interpreter while the engine works.
#[pyclass(module = "granary", frozen, mapping)]
pub struct Store {
    inner: RwLock<Option<Open>>,
    /// `close` has taken the store (read without waiting for the lock,
    /// which a close holds while it waits for calls under way).
    closed: AtomicBool,
    path: String,
    /// The process that opened it: a child made by `fork` shares its
    /// device but not its threads (GC, checkpoints), so there it is
    /// neither used nor closed.
    pid: u32,
}

/// An open store and the engine's handles on its namespaces, by name (the
/// newest handle of each name `Store.namespace` gave).
struct Open {
    store: granary_store::Store,
    namespaces: RwLock<HashMap<String, granary_store::Namespace>>,
}

impl Open {
    /// The engine's handle on namespace `name` (the one of that name now:
    /// a remembered handle whose namespace was dropped is looked up again).
    fn namespace(&self, name: &str) -> granary_store::Result<granary_store::Namespace> {
        if let Some(ns) = self.namespaces.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            if !ns.is_dropped() {
                return Ok(ns.clone());
            }
        }
        let ns = self.store.namespace(name)?;
        self.remember(ns.clone());
        Ok(ns)
    }

    fn remember(&self, ns: granary_store::Namespace) {
        self.namespaces.write().unwrap_or_else(|e| e.into_inner()).insert(ns.name().to_string(), ns);
    }
}

impl Store {
    /// `f` on the open store, with the interpreter released.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&granary_store::Store) -> granary_store::Result<R> + Send,
    ) -> Result<R> {
        self.run_open(py, |o| f(&o.store))
    }

    /// `f` on the open store and its namespaces, with the interpreter
    /// released.
    fn run_open<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&Open) -> granary_store::Result<R> + Send) -> Result<R> {
        if std::process::id() != self.pid {
            return Err(Fail::Forked);
        }
        py.detach(|| {
            let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
            f(g.as_ref().ok_or(Fail::Closed)?).map_err(Fail::Store)
        })
    }

    fn new(store: granary_store::Store, path: String) -> Store {
        let open = Open { store, namespaces: RwLock::default() };
        Store { inner: RwLock::new(Some(open)), closed: AtomicBool::new(false), path, pid: std::process::id() }
    }
}

/// Open options from the Python arguments.
fn open_options(durability: Option<&str>) -> Result<OpenOptions> {
    let durability = match durability.unwrap_or("direct") {
        "direct" => Durability::Direct,
        "flush" => Durability::Flush,
        d => return Err(Fail::Invalid(format!("durability {d:?}: expected \"direct\" or \"flush\""))),
    };
    Ok(OpenOptions { durability, ..OpenOptions::default() })
}

fn open_mode(direct_io: bool) -> OpenMode {
    if direct_io {
        OpenMode::Direct
    } else {
        OpenMode::Buffered
    }
}

/// A size argument: positive.
fn positive(what: &str, n: i64) -> Result<u64> {
    match u64::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Fail::Invalid(format!("{what} must be positive, got {n}"))),
    }
}

/// Put a dict's entries.
fn set_all(d: &Bound<'_, PyDict>, entries: &[(&str, u64)]) -> PyResult<()> {
    for (k, v) in entries {
        d.set_item(*k, *v)?;
    }
    Ok(())
}

fn namespace_dict<'py>(py: Python<'py>, s: &NamespaceStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &s.name)?;
    set_all(
        &d,
        &[
            ("id", s.id.into()),
            ("keys", s.keys),
            ("value_bytes", s.value_bytes),
            ("gets", s.gets),
            ("hits", s.hits),
            ("misses", s.misses),
            ("sets", s.sets),
            ("deletes", s.deletes),
            ("evictions", s.evictions),
            ("expirations", s.expirations),
        ],
    )?;
    d.set_item("max_bytes", s.options.max_bytes)?;
    d.set_item("max_keys", s.options.max_keys)?;
    Ok(d)
}

key_methods!(Store, {
    /// Create a store in a new file of `size` bytes (its folders are
    /// created). Refused if `path` exists (`granary.Exists`).
    /// `durability`: "direct" (a write is acknowledged once it is on the
    /// device: it survives a crash of the process) or "flush" (after an
    /// fdatasync too: it survives power loss). `direct_io`: O_DIRECT (the
    /// default), or False for file systems without it (tmpfs).
    /// `segment_size`: the unit of allocation and GC, a power of two
    /// (default: 1/64 of the device, 1 MiB to 1 GiB); a value must fit in
    /// one segment.
    #[classmethod]
    #[pyo3(signature = (path, size, *, durability = None, direct_io = true, segment_size = None))]
    fn create(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: PathBuf,
        size: i64,
        durability: Option<String>,
        direct_io: bool,
        segment_size: Option<i64>,
    ) -> PyResult<Store> {
        let size = positive("size", size)?;
        let segment_bytes = segment_size.map(|s| positive("segment_size", s)).transpose()?;
        let opts = open_options(durability.as_deref())?;
        let shown = path.display().to_string();
        let store = py.detach(|| {
            let new = NewStore {
                size_bytes: size,
                stripe_bytes: granary_store::io::stripe::STRIPE_BYTES_DEFAULT,
                create: CreateOptions { segment_bytes, ..CreateOptions::default() },
                fill_progress: &|_, _| Ok(()),
            };
            Site::inspect(&path, IfPresent::Refuse)
                .and_then(|site| site.create(open_mode(direct_io), IoBackend::Sync, &new, &opts))
                .map(|p| p.store)
                .map_err(Fail::Store)
        })?;
        Ok(Store::new(store, shown))
    }

    /// Open the store at `path` (recovering it if it was not closed
    /// cleanly). `durability` and `direct_io` as for `create`.
    #[classmethod]
    #[pyo3(signature = (path, *, durability = None, direct_io = true))]
    fn open(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: PathBuf,
        durability: Option<String>,
        direct_io: bool,
    ) -> PyResult<Store> {
        let opts = open_options(durability.as_deref())?;
        let shown = path.display().to_string();
        let store = py.detach(|| {
            granary_store::provision(&path, open_mode(direct_io), IoBackend::Sync, IfPresent::Open, None, &opts, &opts)
                .map(|p| p.store)
                .map_err(Fail::Store)
        })?;
        Ok(Store::new(store, shown))
    }

    /// A store in memory of `size` bytes, gone when closed (for tests and
    /// caches).
    #[classmethod]
    #[pyo3(signature = (size, *, segment_size = None))]
    fn memory(_cls: &Bound<'_, PyType>, py: Python<'_>, size: i64, segment_size: Option<i64>) -> PyResult<Store> {
        let size = positive("size", size)?;
        let segment_bytes = segment_size.map(|s| positive("segment_size", s)).transpose()?;
        let store = py.detach(|| {
            let dev = Arc::new(MemDevice::try_new(size).map_err(|e| match e.kind() {
                std::io::ErrorKind::OutOfMemory => Fail::NoMemory(e.to_string()),
                _ => Fail::Invalid(e.to_string()),
            })?);
            let create = CreateOptions { segment_bytes, ..CreateOptions::default() };
            granary_store::Store::create(dev, &create, &OpenOptions::default()).map_err(Fail::Store)
        })?;
        Ok(Store::new(store, ":memory:".into()))
    }

    /// Close the store: wait for calls under way, write a checkpoint (so
    /// the next open is fast) and flush. Later calls raise
    /// `granary.Closed`; closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if std::process::id() != self.pid {
            return Err(Fail::Forked.into());
        }
        // The engine's close runs holding the lock: a second close (or a
        // call) waits for it, and returns once the store is closed.
        py.detach(|| {
            let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
            let r = match inner.take() {
                Some(o) => o.store.close().map_err(Fail::Store),
                None => Ok(()),
            };
            self.closed.store(true, Relaxed);
            r
        })?;
        Ok(())
    }

    /// Whether the store is closed (a `close` under way: once it returns),
    /// or this is a forked child's copy, whose calls raise `Closed` too.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Relaxed) || std::process::id() != self.pid
    }

    /// The path it was opened on (":memory:" for `Store.memory`).
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " closed" } else { "" };
        format!("<granary.Store {:?}{state}>", self.path)
    }

    /// A handle on namespace `name` (with the same key calls), created
    /// first if it does not exist and `create` is true; "default" is the
    /// store's own keys. A namespace created here is durable at once.
    #[pyo3(signature = (name, *, create = true))]
    fn namespace(slf: &Bound<'_, Self>, py: Python<'_>, name: String, create: bool) -> PyResult<Namespace> {
        let handle = slf.get().run_open(py, |o| {
            let s = &o.store;
            let ns = match s.namespace(&name) {
                Err(granary_store::Error::NoSuchNamespace { .. }) if create => {
                    match s.create_namespace(&name, NamespaceOptions::default()) {
                        // Another thread made it meanwhile.
                        Err(granary_store::Error::NamespaceExists { .. }) => s.namespace(&name),
                        r => r,
                    }
                }
                r => r,
            }?;
            o.remember(ns.clone());
            Ok(ns)
        })?;
        Ok(Namespace { store: slf.clone().unbind(), name, handle })
    }

    /// The names of the namespaces ("default" first).
    fn list_namespaces(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.run(py, |s| Ok(s.namespaces().into_iter().map(|n| n.name).collect()))?)
    }

    /// Drop namespace `name` and every key in it, at once (GC frees the
    /// space later). Handles on it raise `granary.NotFound` from then on.
    fn drop_namespace(&self, py: Python<'_>, name: String) -> PyResult<()> {
        Ok(self.run(py, |s| s.drop_namespace(&name))?)
    }

    /// A new atomic batch: use it as a context manager (`with
    /// store.batch() as b:`), which commits it at the end of the block,
    /// or discards it if the block raises; or call `commit` yourself.
    fn batch(slf: &Bound<'_, Self>) -> Batch {
        Batch { store: slf.clone().unbind(), ops: Vec::new(), done: false }
    }

    /// Make every acknowledged write durable against power loss (one
    /// flush of the device); with durability "flush" they are already.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.run(py, |s| s.sync())?)
    }

    /// Write an index checkpoint now (a later recovery replays only the
    /// log written after it).
    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.run(py, |s| s.checkpoint().map(|_| ()))?)
    }

    /// The store's figures, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.run(py, |s| Ok(s.stats()))?;
        let d = PyDict::new(py);
        d.set_item("device", &s.device)?;
        set_all(
            &d,
            &[
                ("device_bytes", s.device_bytes),
                ("grain_bytes", s.grain_bytes.into()),
                ("segment_bytes", s.segment_bytes),
                ("segments", s.segments),
                ("segments_free", s.segments_free),
                ("segments_open", s.segments_open),
                ("segments_closed", s.segments_closed),
                ("keys", s.keys),
                ("tombstones", s.tombstones),
                ("live_bytes", s.live_bytes),
                ("user_bytes_written", s.user_bytes_written),
                ("gets", s.gets),
                ("get_hits", s.get_hits),
                ("puts", s.puts),
                ("deletes", s.deletes),
                ("value_bytes_max", s.value_bytes_max),
                ("index_entries", s.index.entries),
                ("index_memory_bytes", s.index.memory_bytes),
                ("gc_victims", s.gc.victims),
                ("gc_bytes_relocated", s.gc.bytes_relocated),
                ("checkpoint_id", s.recovery.checkpoint_id),
                ("recovery_millis", s.recovery.millis),
                ("write_groups", s.write_groups),
                ("grouped_records", s.grouped_records),
                ("combined_puts", s.combined_puts),
                ("combined_updates", s.combined_updates),
                ("device_reads", s.io.reads),
                ("device_writes", s.io.writes),
                ("device_flushes", s.io.flushes),
            ],
        )?;
        d.set_item("clean_shutdown", s.recovery.clean_shutdown)?;
        d.set_item("write_amplification", s.write_amplification())?;
        Ok(d)
    }

    /// Check every index entry against its record and scan every segment.
    /// Returns a dict: "clean" (bool), "errors" (the first errors, one line
    /// each), and counts. Raises only if the check itself cannot run.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.run(py, |s| s.verify())?;
        let d = PyDict::new(py);
        d.set_item("clean", r.is_clean())?;
        d.set_item("errors", &r.errors)?;
        set_all(
            &d,
            &[
                ("error_count", r.error_count),
                ("entries_checked", r.entries_checked),
                ("values", r.values),
                ("tombstones", r.tombstones),
                ("segments_scanned", r.segments_scanned),
                ("records_scanned", r.records_scanned),
                ("damaged_records", r.damaged_records),
                ("millis", r.millis),
            ],
        )?;
        Ok(d)
    }
});

impl Drop for Store {
    /// A store dropped without `close` (a forgotten context manager) is
    /// closed here, so the next open does not recover it.
    fn drop(&mut self) {
        let Some(o) = self.inner.get_mut().unwrap_or_else(|e| e.into_inner()).take() else { return };
        if std::process::id() != self.pid {
            // A forked child's copy: closing would wait for threads the
            // child does not have and write into its parent's store.
            std::mem::forget(o);
            return;
        }
        // The close (a checkpoint, a flush) runs with the interpreter
        // released, as every call's engine work does.
        Python::attach(|py| {
            py.detach(|| {
                if let Err(e) = o.store.close() {
                    warn_close_failed(&e);
                }
            })
        });
    }
}

/// Say on stderr that a close during garbage collection failed (nothing
/// can raise there).
fn warn_close_failed(e: &granary_store::Error) {
    eprintln!("granary: closing a store on garbage collection failed: {e}");
}

/// A namespace of a store: the store's key calls on its own keys
/// (`Store.namespace`).
#[pyclass(module = "granary", frozen, mapping)]
pub struct Namespace {
    store: Py<Store>,
    name: String,
    /// The engine's handle: on this namespace, not on one created later
    /// under its name (its calls then raise `granary.NotFound`).
    handle: granary_store::Namespace,
}

impl Namespace {
    /// `f` on the namespace while its store is open, with the interpreter
    /// released.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&granary_store::Namespace) -> granary_store::Result<R> + Send,
    ) -> Result<R> {
        self.store.get().run_open(py, |_| f(&self.handle))
    }
}

key_methods!(Namespace, {
    /// Its name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Its figures, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.run(py, |n| n.stats())?;
        namespace_dict(py, &s)
    }

    /// Drop it and every key in it (`Store.drop_namespace`);
    /// `granary.NotFound` if it was dropped already (a namespace created
    /// since under its name is another one, left alone).
    fn drop(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.run(py, |n| n.drop_namespace())?)
    }

    /// Delete every key in it, at once, keeping the namespace.
    fn truncate(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.run(py, |n| n.truncate())?)
    }

    fn __repr__(&self) -> String {
        format!("<granary.Namespace {:?} of {:?}>", self.name, self.store.get().path)
    }
});

/// The namespace of a batch's operation.
enum Target {
    /// The store's own keys.
    Default,
    /// The namespace of that name at the commit.
    Name(String),
    /// A `Namespace`'s: that namespace (the commit raises
    /// `granary.NotFound` if it was dropped).
    Handle(granary_store::Namespace),
}

/// An atomic batch (`Store.batch`): puts and deletes over keys of any
/// namespaces of one store, committed all or nothing, durable when the
/// commit returns. Operations are only collected until then; reads do not
/// see them.
#[pyclass(module = "granary")]
pub struct Batch {
    store: Py<Store>,
    /// Each operation's namespace, key and operation.
    ops: Vec<(Target, Vec<u8>, BatchOp)>,
    /// Committed or discarded: it takes no more operations.
    done: bool,
}

impl Batch {
    /// The namespace an operation names: a `Namespace` of this store, a
    /// name, or None for the default one.
    fn target(&self, ns: Option<&Bound<'_, PyAny>>) -> PyResult<Target> {
        let Some(ns) = ns else { return Ok(Target::Default) };
        if let Ok(n) = ns.cast::<Namespace>() {
            let n = n.get();
            if !n.store.is(&self.store) {
                return Err(Fail::Invalid("the namespace belongs to another store".into()).into());
            }
            return Ok(Target::Handle(n.handle.clone()));
        }
        Ok(Target::Name(ns.extract()?))
    }

    fn push(&mut self, ns: Target, key: &[u8], op: BatchOp) -> Result<()> {
        if self.done {
            return Err(Fail::Invalid("the batch was committed or discarded already".into()));
        }
        self.ops.push((ns, key.to_vec(), op));
        Ok(())
    }
}

#[pymethods]
impl Batch {
    /// Add a put of `value` under `key` (in `namespace`: a `Namespace` or
    /// a name; default: the store's own keys). `mode` and `cas` as for
    /// `Store.put`: a condition that fails at the commit fails the whole
    /// batch (`granary.ConditionFailed`).
    #[pyo3(signature = (key, value, *, namespace = None, mode = None, cas = None))]
    fn put(
        &mut self,
        key: Data<'_>,
        value: Data<'_>,
        namespace: Option<&Bound<'_, PyAny>>,
        mode: Option<String>,
        cas: Option<u64>,
    ) -> PyResult<()> {
        let value = value.to_vec();
        let meta = ItemMeta::default();
        let op = match put_cond(mode.as_deref(), cas)? {
            Cond::Always => BatchOp::Put { value, meta },
            Cond::Absent => BatchOp::PutAbsent { value, meta },
            Cond::Present => BatchOp::PutPresent { value, meta },
            Cond::Cas(cas) => BatchOp::Cas { cas, value, meta },
        };
        let ns = self.target(namespace)?;
        Ok(self.push(ns, &key, op)?)
    }

    /// Add a delete of `key` (nothing to do if it holds no value); with
    /// `cas`, only if its value still has that CAS value.
    #[pyo3(signature = (key, *, namespace = None, cas = None))]
    fn delete(&mut self, key: Data<'_>, namespace: Option<&Bound<'_, PyAny>>, cas: Option<u64>) -> PyResult<()> {
        let op = match cas {
            Some(cas) => BatchOp::DeleteCas { cas },
            None => BatchOp::Delete,
        };
        let ns = self.target(namespace)?;
        Ok(self.push(ns, &key, op)?)
    }

    /// Add a condition alone: commit only if `key`'s value has CAS value
    /// `cas` (or, with `cas=None`, if it holds no value).
    #[pyo3(signature = (key, cas, *, namespace = None))]
    fn check(&mut self, key: Data<'_>, cas: Option<u64>, namespace: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let ns = self.target(namespace)?;
        Ok(self.push(ns, &key, BatchOp::Check { cas })?)
    }

    fn __len__(&self) -> usize {
        self.ops.len()
    }

    /// Apply every operation or none; returns each operation's new CAS
    /// value (0 for deletes and checks). Raises `granary.ConditionFailed`
    /// (with `op`, the failed operation's index) when a condition does not
    /// hold, `granary.InvalidArgument` for a batch the engine does not
    /// take (too many operations, a key twice, too large).
    fn commit(&mut self, py: Python<'_>) -> PyResult<Vec<u64>> {
        if self.done {
            return Err(Fail::Invalid("the batch was committed or discarded already".into()).into());
        }
        self.done = true;
        let ops = std::mem::take(&mut self.ops);
        let outcome = self.store.get().run_open(py, move |o| {
            let default = o.namespace(DEFAULT_NAMESPACE)?;
            let mut b = o.store.batch();
            for (ns, key, op) in ops {
                let handle = match ns {
                    Target::Handle(h) => h,
                    Target::Name(name) => o.namespace(&name)?,
                    Target::Default => default.clone(),
                };
                b.op(&handle, &key, op);
            }
            b.commit()
        })?;
        match outcome {
            BatchOutcome::Committed { cas } => Ok(cas),
            BatchOutcome::ConditionFailed { op, outcome } => {
                let detail = match outcome {
                    PutOutcome::Exists => "found the key holding a value (or another CAS value)",
                    _ => "found the key holding no value",
                };
                Err(Fail::Condition { op, detail: detail.into() }.into())
            }
        }
    }

    /// Drop the operations collected; nothing is written.
    fn discard(&mut self) {
        self.ops.clear();
        self.done = true;
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Commit if the block ended normally; discard if it raised (the
    /// exception goes on).
    #[pyo3(signature = (exc_type, _exc, _tb))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        crate::exit_batch(exc_type.is_some(), self.done, self, |b| b.commit(py), Self::discard)
    }
}

/// For `granary.bench`: nanoseconds per GET of `key` through the engine's
/// Rust API (`Store::get`, which returns the value in a new `Vec`), `n`
/// times in a loop on this thread: the baseline the Python `get` is
/// compared with.
#[pyfunction]
pub fn _rust_get_loop(py: Python<'_>, store: &Bound<'_, Store>, key: Data<'_>, n: u64) -> PyResult<f64> {
    let k: &[u8] = &key;
    let n = positive("n", i64::try_from(n).unwrap_or(i64::MAX))?;
    Ok(store.get().run(py, |s| {
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(s.get(std::hint::black_box(k))?);
        }
        Ok(t.elapsed().as_nanos() as f64 / n as f64)
    })?)
}
