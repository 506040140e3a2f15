//! What a command sees of the keyspace ([`Keys`]), in two forms:
//!
//! - [`Direct`]: one namespace of the engine, each call on its own: a
//!   read is a GET, a read-modify-write runs under the key's lock
//!   (`Namespace::update`), so single-key commands are atomic as in Redis;
//! - [`Txn`]: an overlay of the keys a transaction (EXEC, or one
//!   multi-key command such as MSET or RENAME) reads and writes, over any
//!   databases. Nothing reaches the engine until [`Overlay::commit`] turns
//!   it into one atomic batch: each key written is conditioned on the
//!   version the transaction read (or, if it never read it, written
//!   blindly), and each key only read is checked unchanged. A batch whose
//!   condition fails wrote nothing; the caller runs the transaction again.
//!
//! Invariants: a value whose millisecond expiry has passed reads as absent
//! in both; a record the engine still holds past its expiry is deleted by
//! the next write of its key that leaves it alone (Redis's lazy expiry).

use crate::value::{now_ms, Rec};
use granary_store::{BatchOp, BatchOutcome, Change, Cond, Error, Item, Namespace, Store};

/// What a command decides to write to one key.
#[derive(Debug)]
pub(crate) enum Write {
    Keep,
    /// A new value: with no expiry (0), it gets the database's default
    /// TTL, if its namespace has one, as a SET does.
    Set(Rec),
    /// The key's live value changed (APPEND, INCR, PERSIST, HSET...): its
    /// expiry exactly as given, 0 being none, never the database's default
    /// TTL; a `Set` when the key has no live value.
    Derive(Rec),
    Delete,
}

/// A command's view of the keyspace.
#[allow(async_fn_in_trait)] // used with concrete types only, on one executor
pub(crate) trait Keys {
    /// The database commands address now.
    fn db(&self) -> &Namespace;
    /// Address another database (SELECT).
    fn use_db(&mut self, ns: Namespace);
    /// The database, when reads go straight to it (no transaction's
    /// overlay in between), so several may run at once.
    fn reads_direct(&self) -> Option<&Namespace> {
        None
    }
    /// The live value of `key`.
    async fn get(&mut self, key: &[u8]) -> Result<Option<Rec>, Error>;
    /// Read-modify-write of `key`: `f` sees its live value and decides.
    /// `f` may run more than once, and on another write's thread; its last
    /// answer counts. Every caller awaits the future in place, in its
    /// connection's task, and never leaks it: `f` borrows the command's
    /// arguments, and `Direct` passes that promise on to the engine
    /// (`Namespace::update_borrowing_async`).
    async fn update<R: Send>(
        &mut self,
        key: &[u8],
        f: impl FnMut(Option<&Rec>) -> (Write, R) + Send,
    ) -> Result<R, Error>;
    /// Overwrite `key` whatever it holds, with a new value (as `Write::Set`).
    async fn set(&mut self, key: &[u8], rec: Rec) -> Result<(), Error>;
    /// Overwrite `key` whatever it holds, with a value carried from another
    /// key (RENAME): its expiry exactly as given, 0 being none, never the
    /// database's default TTL.
    async fn set_carried(&mut self, key: &[u8], rec: Rec) -> Result<(), Error>;
    /// Delete `key`; whether it held a live value.
    async fn del(&mut self, key: &[u8]) -> Result<bool, Error> {
        self.update(key, |r| (Write::Delete, r.is_some())).await
    }
}

/// The live value of `key` in `ns`, read from the engine.
pub(crate) async fn read_direct(ns: &Namespace, key: &[u8]) -> Result<Option<Rec>, Error> {
    let item = ns.get_item_async(key).await?;
    Ok(item.map(Rec::from_item).filter(|r| !r.expired(now_ms())))
}

/// One database of the engine, each call on its own.
pub(crate) struct Direct {
    pub ns: Namespace,
    /// When Some, the keys changed are noted here (for the connection's
    /// WATCH: see `Client::touch`).
    pub wrote: Option<Vec<Vec<u8>>>,
}

impl Keys for Direct {
    fn db(&self) -> &Namespace {
        &self.ns
    }

    fn use_db(&mut self, ns: Namespace) {
        self.ns = ns;
    }

    fn reads_direct(&self) -> Option<&Namespace> {
        Some(&self.ns)
    }

    async fn get(&mut self, key: &[u8]) -> Result<Option<Rec>, Error> {
        read_direct(&self.ns, key).await
    }

    async fn update<R: Send>(
        &mut self,
        key: &[u8],
        mut f: impl FnMut(Option<&Rec>) -> (Write, R) + Send,
    ) -> Result<R, Error> {
        let now = now_ms();
        // SAFETY: `f` borrows the command's arguments, which live in the
        // connection's task; every caller of `Keys::update` awaits it there
        // in place and never leaks it (the trait's rule).
        let (r, _) = unsafe {
            self.ns.update_borrowing_async(key, |item| {
                let rec = item.map(Rec::of_item);
                let stale = rec.as_ref().is_some_and(|r| r.expired(now));
                let (w, r) = f(rec.as_ref().filter(|_| !stale));
                // Removing a record whose expiry has passed changes nothing a
                // client can see (it read as absent already): it does not
                // count as a write of the key for WATCH, as in Redis.
                let (change, changed) = match w {
                    Write::Derive(rec) if item.is_some() && !stale => {
                        (Change::Derive { meta: rec.meta(), value: rec.value, cas: None }, true)
                    }
                    Write::Set(rec) | Write::Derive(rec) => (Change::Put { meta: rec.meta(), value: rec.value }, true),
                    Write::Delete if item.is_some() => (Change::Delete, !stale),
                    Write::Keep if stale => (Change::Delete, false),
                    Write::Delete | Write::Keep => (Change::Keep, false),
                };
                (change, (r, changed))
            })
        }
        .await?;
        let (r, changed) = r;
        if changed {
            if let Some(w) = &mut self.wrote {
                w.push(key.to_vec());
            }
        }
        Ok(r)
    }

    async fn set(&mut self, key: &[u8], rec: Rec) -> Result<(), Error> {
        self.ns.put_item_async(key, &rec.value, rec.meta(), Cond::Always).await?;
        if let Some(w) = &mut self.wrote {
            w.push(key.to_vec());
        }
        Ok(())
    }

    async fn set_carried(&mut self, key: &[u8], rec: Rec) -> Result<(), Error> {
        let (meta, value) = (rec.meta(), rec.value);
        // A Derive is written with its metadata as given, whatever the key
        // held (the engine's rule for a value derived from another).
        self.ns.update_async(key, move |_| (Change::Derive { meta, value: value.clone(), cas: None }, ())).await?;
        if let Some(w) = &mut self.wrote {
            w.push(key.to_vec());
        }
        Ok(())
    }
}

/// `rec`, a new value of a key of `ns`, with the database's default TTL
/// when it has no expiry, as the engine gives a PUT: a transaction's
/// overlay holds every value as it will be written, so its batch writes
/// each one's expiry exactly ([`Overlay::commit`]).
fn with_default_ttl(ns: &Namespace, mut rec: Rec) -> Rec {
    let ttl = ns.options().default_ttl_secs;
    if rec.expire_ms == 0 && ttl != 0 {
        rec.expire_ms = u64::from(ns.now().saturating_add(ttl)) * 1000;
    }
    rec
}

/// What a transaction knows of one key.
struct Entry {
    ns: Namespace,
    key: Vec<u8>,
    /// The engine version it read: None if it has not read the key;
    /// Some(None) if the key held nothing; Some(Some(cas)) if it held the
    /// version `cas` (live, or expired to the millisecond but still held).
    read: Option<Option<u64>>,
    /// What it read was a live value (not nothing, nor an expired record).
    read_live: bool,
    /// The key's value as the transaction sees it now.
    now: Option<Rec>,
    written: bool,
    /// A WATCHed key: its condition failing aborts instead of retrying.
    watched: bool,
}

/// The keys a transaction read and wrote, in the order first touched.
#[derive(Default)]
pub(crate) struct Overlay {
    entries: Vec<Entry>,
    /// Each entry's position by (database, key): an EXEC or MSET of many
    /// keys finds each in constant time (it is refused past
    /// `BATCH_OPS_MAX` keys only once it has run).
    by_key: std::collections::HashMap<(String, Vec<u8>), usize>,
}

/// How a commit ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Commit {
    Done,
    /// A key read changed meanwhile: run the transaction again.
    Retry,
    /// A WATCHed key changed: abort (EXEC answers null).
    Aborted,
}

impl Overlay {
    fn find(&self, ns: &Namespace, key: &[u8]) -> Option<usize> {
        // (A lookup by a borrowed pair would need a key type of its own;
        // the name and key are short.)
        self.by_key.get(&(ns.name().to_string(), key.to_vec())).copied()
    }

    /// Add `e` (of a key not in the overlay); its index.
    fn push(&mut self, e: Entry) -> usize {
        let i = self.entries.len();
        self.by_key.insert((e.ns.name().to_string(), e.key.clone()), i);
        self.entries.push(e);
        i
    }

    /// Keys touched so far.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The keys the transaction changes: written, and not left absent
    /// where it read them absent (holding nothing, or an expired record
    /// that removing changes nothing a client can see, as in Redis).
    pub(crate) fn changed(&self) -> impl Iterator<Item = &[u8]> {
        self.entries
            .iter()
            .filter(|e| e.written && (e.now.is_some() || e.read.is_none() || e.read_live))
            .map(|e| &e.key[..])
    }

    /// Read `key` into the overlay (once); its entry's index.
    async fn load(&mut self, ns: &Namespace, key: &[u8]) -> Result<usize, Error> {
        if let Some(i) = self.find(ns, key) {
            if self.entries[i].read.is_some() || self.entries[i].written {
                return Ok(i);
            }
        }
        let item = ns.get_item_async(key).await?;
        let now = item.as_ref().map(Rec::of_item).filter(|r| !r.expired(now_ms()));
        let read = Some(item.map(|i| i.cas));
        Ok(match self.find(ns, key) {
            Some(i) => {
                let e = &mut self.entries[i];
                e.read = read;
                e.read_live = now.is_some();
                e.now = now;
                i
            }
            None => self.push(Entry {
                ns: ns.clone(),
                key: key.to_vec(),
                read,
                read_live: now.is_some(),
                now,
                written: false,
                watched: false,
            }),
        })
    }

    /// The version of a key as WATCH sees it: its engine version if it
    /// holds a live value, None if it holds nothing or an expired value.
    pub(crate) fn live_version(item: Option<&Item>) -> Option<u64> {
        item.filter(|i| !Rec::of_item(i).expired(now_ms())).map(|i| i.cas)
    }

    /// Condition the commit on `key` still at the version `cas` that WATCH
    /// read ([`Overlay::live_version`]).
    pub(crate) fn watch(&mut self, ns: &Namespace, key: &[u8], cas: Option<u64>) {
        match self.find(ns, key) {
            Some(i) => self.entries[i].watched = true,
            None => {
                self.push(Entry {
                    ns: ns.clone(),
                    key: key.to_vec(),
                    read: Some(cas),
                    read_live: cas.is_some(),
                    now: None,
                    written: false,
                    watched: true,
                });
            }
        }
    }

    /// Whether a WATCHed key's version differs from what WATCH read (then
    /// the transaction is aborted before it runs). As in Redis, a key live
    /// at WATCH that has expired since counts as changed; one that had
    /// expired already and is now absent does not.
    pub(crate) async fn watched_changed(&mut self) -> Result<bool, Error> {
        for e in self.entries.iter_mut().filter(|e| e.watched) {
            let item = e.ns.get_item_async(&e.key).await?;
            if e.read != Some(Overlay::live_version(item.as_ref())) {
                return Ok(true);
            }
            // The commit is conditioned on the record as it is now.
            e.read = Some(item.as_ref().map(|i| i.cas));
            e.now = item.as_ref().map(Rec::of_item).filter(|r| !r.expired(now_ms()));
            e.read_live = e.now.is_some();
        }
        Ok(false)
    }

    /// Write everything as one atomic batch.
    pub(crate) async fn commit(&self, store: &Store) -> Result<Commit, Error> {
        let mut batch = store.batch();
        let mut of_op = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let op = match (e.written, &e.now, e.read) {
                (true, Some(r), Some(Some(cas))) => BatchOp::Cas { cas, value: r.value.clone(), meta: r.meta() },
                (true, Some(r), Some(None)) => BatchOp::PutAbsent { value: r.value.clone(), meta: r.meta() },
                (true, Some(r), None) => BatchOp::Put { value: r.value.clone(), meta: r.meta() },
                (true, None, Some(Some(cas))) => BatchOp::DeleteCas { cas },
                (true, None, None) => BatchOp::Delete,
                (_, _, Some(read)) => BatchOp::Check { cas: read },
                (false, _, None) => continue,
            };
            // Each value's expiry is final in the overlay (the default TTL
            // given to new values there).
            batch.op_exact(&e.ns, &e.key, op);
            of_op.push(i);
        }
        if batch.is_empty() {
            return Ok(Commit::Done);
        }
        Ok(match batch.commit_async().await? {
            BatchOutcome::Committed { .. } => Commit::Done,
            BatchOutcome::ConditionFailed { op, .. } if self.entries[of_op[op]].watched => Commit::Aborted,
            BatchOutcome::ConditionFailed { .. } => Commit::Retry,
        })
    }
}

/// An [`Overlay`] with the database commands address now.
pub(crate) struct Txn<'o> {
    pub overlay: &'o mut Overlay,
    pub ns: Namespace,
}

impl Keys for Txn<'_> {
    fn db(&self) -> &Namespace {
        &self.ns
    }

    fn use_db(&mut self, ns: Namespace) {
        self.ns = ns;
    }

    async fn get(&mut self, key: &[u8]) -> Result<Option<Rec>, Error> {
        let i = self.overlay.load(&self.ns, key).await?;
        let e = &self.overlay.entries[i];
        Ok(e.now.clone().filter(|r| !r.expired(now_ms())))
    }

    async fn update<R: Send>(
        &mut self,
        key: &[u8],
        mut f: impl FnMut(Option<&Rec>) -> (Write, R) + Send,
    ) -> Result<R, Error> {
        let i = self.overlay.load(&self.ns, key).await?;
        let e = &mut self.overlay.entries[i];
        let live = e.now.clone().filter(|r| !r.expired(now_ms()));
        let (w, r) = f(live.as_ref());
        match w {
            Write::Keep => {}
            Write::Derive(rec) if live.is_some() => {
                e.now = Some(rec);
                e.written = true;
            }
            Write::Set(rec) | Write::Derive(rec) => {
                e.now = Some(with_default_ttl(&e.ns, rec));
                e.written = true;
            }
            Write::Delete => {
                e.now = None;
                e.written = true;
            }
        }
        Ok(r)
    }

    async fn set(&mut self, key: &[u8], rec: Rec) -> Result<(), Error> {
        let rec = with_default_ttl(&self.ns, rec);
        self.set_carried(key, rec).await
    }

    async fn set_carried(&mut self, key: &[u8], rec: Rec) -> Result<(), Error> {
        let ns = self.ns.clone();
        match self.overlay.find(&ns, key) {
            Some(i) => {
                let e = &mut self.overlay.entries[i];
                e.now = Some(rec);
                e.written = true;
            }
            None => {
                self.overlay.push(Entry {
                    ns,
                    key: key.to_vec(),
                    read: None,
                    read_live: false,
                    now: Some(rec),
                    written: true,
                    watched: false,
                });
            }
        }
        Ok(())
    }
}
