//! Running one request against the store and encoding its response, and
//! what a request touches (its [`Flight`]), from which the connection
//! decides which requests may run at once.
//!
//! Invariants:
//! - every request gets exactly one response frame, with its opcode and
//!   id; a store error becomes the response's status and message, never a
//!   closed connection;
//! - a response never exceeds the frame limit: a GET/GETS of a value
//!   larger than a frame (written under a larger limit) is answered
//!   `VALUE_TOO_LARGE`, and an MGET/BATCH entry that would take it past is
//!   replaced by a `VALUE_TOO_LARGE` entry;
//! - two requests conflict when one writes a key the other touches (a key
//!   is its namespace and itself; a TXN touches the key of each of its
//!   operations, in the namespace each names), or either is a barrier (NOP,
//!   and the namespace changes NS_CREATE, NS_DROP and NS_TRUNCATE); the
//!   connection starts a request only once every earlier conflicting one
//!   has ended (`conn::Conn::admit`), so the effects a connection observes
//!   follow the order it sent its requests;
//! - a request's namespace is resolved when it starts ([`Scope`]), so it
//!   sees the namespace changes sent before it (a TXN's, each of its
//!   operations'); a status a connection's version does not know is never
//!   sent on it;
//! - a TXN is one engine batch (`granary_store::Batch`): all of it is
//!   applied, durably, before `OK` is answered, or none of it.

use crate::limits::{MULTI_GET_READS, NS_HANDLES_MAX, ZERO_COPY_MIN_BYTES};
use crate::parse::Limits;
use crate::{stats, NativeStats};
use granary_proto::{self as proto, Header, PutMode, Request, Status, TxnOutcome, TxnWrite};
use granary_store::{
    BatchOp as StoreBatchOp, BatchOutcome, Error as StoreError, ItemMeta, Namespace, PutBuf, PutOutcome, Store,
    ValueBuf, DEFAULT_NAMESPACE,
};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU64;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// What every connection of one server shares.
pub(crate) struct Ctx {
    pub store: Arc<Store>,
    pub limits: Limits,
    pub stats: Arc<NativeStats>,
    /// When the server started (STATS `uptime`).
    pub started: Instant,
    /// The token a hello must carry (`NativeConfig::token`).
    pub token: Option<Vec<u8>>,
}

/// Responses waiting to be sent: bytes, with large values spliced in at
/// offsets of them, sent from the buffers the device read them into.
#[derive(Default)]
pub(crate) struct Out {
    pub bytes: Vec<u8>,
    /// (offset in `bytes` the value goes before, value), in order.
    pub values: VecDeque<(usize, ValueBuf)>,
    value_bytes: usize,
}

impl Out {
    pub fn len(&self) -> usize {
        self.bytes.len() + self.value_bytes
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Memory held (the values' bytes, the byte buffer's capacity).
    pub fn memory(&self) -> usize {
        self.bytes.capacity() + self.value_bytes
    }
    fn push_value(&mut self, v: ValueBuf) {
        self.value_bytes += v.len();
        self.values.push_back((self.bytes.len(), v));
    }
    /// Append another response queue after this one.
    pub fn append(&mut self, o: Out) {
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&o.bytes);
        self.value_bytes += o.value_bytes;
        self.values.extend(o.values.into_iter().map(|(at, v)| (base + at, v)));
    }
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.values.clear();
        self.value_bytes = 0;
    }
}

/// Whether `name` names the default namespace (no name, or its own).
pub(crate) fn is_default(name: &[u8]) -> bool {
    name.is_empty() || name == DEFAULT_NAMESPACE.as_bytes()
}

/// One connection's view of the namespaces: the protocol version it
/// speaks, and a handle on each namespace its requests named, so resolving
/// a name is a lookup in the connection's own map, not in the store's
/// shared one. A handle whose namespace was dropped is looked up anew (a
/// namespace may have been created since under its name); a truncated
/// namespace keeps its handle.
pub(crate) struct Scope {
    pub version: u16,
    default: Rc<Namespace>,
    handles: RefCell<HashMap<Box<[u8]>, Rc<Namespace>>>,
}

impl Scope {
    pub fn new(store: &Store, version: u16) -> Scope {
        let default = store.namespace(DEFAULT_NAMESPACE).expect("the default namespace always exists");
        Scope { version, default: Rc::new(default), handles: RefCell::new(HashMap::new()) }
    }

    /// The namespace `name` names (empty, or "default": the default one).
    pub fn resolve(&self, store: &Store, name: &[u8]) -> Result<Rc<Namespace>, StoreError> {
        if is_default(name) {
            return Ok(self.default.clone());
        }
        if let Some(ns) = self.handles.borrow().get(name).filter(|ns| !ns.is_dropped()) {
            return Ok(ns.clone());
        }
        let found = match std::str::from_utf8(name) {
            Ok(n) => store.namespace(n),
            Err(_) => Err(StoreError::NoSuchNamespace { name: String::from_utf8_lossy(name).into_owned() }),
        };
        let mut handles = self.handles.borrow_mut();
        match found {
            Ok(ns) => {
                // Bounded: a client naming many namespaces in turn only
                // costs lookups in the store's map.
                if handles.len() >= NS_HANDLES_MAX {
                    handles.clear();
                }
                let ns = Rc::new(ns);
                handles.insert(name.into(), ns.clone());
                Ok(ns)
            }
            Err(e) => {
                handles.remove(name);
                Err(e)
            }
        }
    }
}

/// A request being executed: what later requests must not overtake.
pub(crate) struct Flight {
    /// The request's place in its connection.
    pub seq: u64,
    /// Hashes of the keys it touches, sorted, without duplicates.
    keys: Vec<u64>,
    write: bool,
    /// Conflicts with everything (NOP: answered after every earlier request).
    barrier: bool,
    /// Request body bytes it holds while it runs.
    pub body_bytes: usize,
}

impl Flight {
    /// What `req` (the `seq`th request, of `body_bytes`, naming namespace
    /// `ns`) touches.
    pub fn of(req: &Request, ns: &[u8], seq: u64, body_bytes: usize) -> Flight {
        let tag = ns_tag(ns);
        let h = |k: &[u8]| key_hash(k) ^ tag;
        let (keys, write, barrier) = match req {
            Request::Get(k) | Request::Gets(k) => (vec![h(k)], false, false),
            Request::Put { key, .. } => (vec![h(key)], true, false),
            Request::Delete(k) | Request::DeleteCas { key: k, .. } => (vec![h(k)], true, false),
            Request::MultiGet(ks) => (ks.iter().map(|k| h(k)).collect(), false, false),
            Request::Batch(ops) => (ops.iter().map(|o| h(o.key())).collect(), ops.iter().any(|o| o.is_write()), false),
            // Ordered per key, as PUTs are: each key in its operation's
            // namespace. Atomicity against other connections is the
            // engine's (it holds every key's lock while it commits).
            Request::Txn(ops) => (ops.iter().map(|o| key_hash(o.key) ^ ns_tag(o.ns)).collect(), true, false),
            Request::Stats | Request::NsList | Request::NsStats => (Vec::new(), false, false),
            // A namespace change touches every key of its namespace, and
            // changes what later requests' names resolve to.
            Request::Nop | Request::NsCreate(_) | Request::NsDrop | Request::NsTruncate => (Vec::new(), false, true),
        };
        let mut keys = keys;
        keys.sort_unstable();
        keys.dedup();
        Flight { seq, keys, write, barrier, body_bytes }
    }

    /// A PUT of `key` in namespace `ns` whose value (`value_bytes`) is in a
    /// record buffer.
    pub fn put(ns: &[u8], key: &[u8], seq: u64, value_bytes: usize) -> Flight {
        let keys = vec![key_hash(key) ^ ns_tag(ns)];
        Flight { seq, keys, write: true, barrier: false, body_bytes: value_bytes }
    }

    /// Whether one of the two must wait for the other. Keys are sorted: a
    /// check costs (smaller count) x log(larger count).
    pub fn conflicts(&self, o: &Flight) -> bool {
        if self.barrier || o.barrier {
            return true;
        }
        if !(self.write || o.write) {
            return false;
        }
        let (small, large) = if self.keys.len() <= o.keys.len() { (self, o) } else { (o, self) };
        small.keys.iter().any(|k| large.keys.binary_search(k).is_ok())
    }
}

fn key_hash(k: &[u8]) -> u64 {
    granary_format::hash::key_hash(k)
}

/// What a key's hash is mixed with for its namespace: 0 in the default
/// one, so its keys hash alike however it is named. Two keys of different
/// namespaces whose mixed hashes meet only make requests wait needlessly.
fn ns_tag(ns: &[u8]) -> u64 {
    if is_default(ns) {
        0
    } else {
        key_hash(ns).rotate_left(17)
    }
}

/// A PUT whose value was received straight into the record buffer the
/// device writes, built for namespace `ns` when it had id `id`.
pub(crate) struct LargePut {
    pub pb: PutBuf,
    pub mode: PutMode,
    pub ns: Rc<Namespace>,
    pub id: u32,
    /// The namespace's name and the key, as the frame gave them (to build
    /// the buffer anew if the namespace changed meanwhile).
    pub name: Box<[u8]>,
    pub key: Box<[u8]>,
}

/// What a started request executes: a whole frame's body, or a large PUT.
pub(crate) enum Job {
    Frame(Vec<u8>),
    Put(LargePut),
}

/// Run `job` (the request of header `h`, on a connection of `scope`) and
/// append its response to `resp`.
pub(crate) async fn run(ctx: &Ctx, scope: &Scope, h: Header, job: Job, resp: &mut Out) {
    match job {
        Job::Frame(body) => execute(ctx, scope, h, &body, resp).await,
        Job::Put(p) => {
            let (s, b) = do_put_buf(ctx, scope, p).await;
            proto::encode_response(&mut resp.bytes, h.op, s, h.id, &b);
        }
    }
}

/// The status a store error maps to.
fn status_of(e: &StoreError) -> Status {
    match e {
        StoreError::KeyLength { .. } | StoreError::ReservedKey => Status::KeyInvalid,
        StoreError::ValueTooLarge { .. } => Status::ValueTooLarge,
        StoreError::NoSpace { .. } | StoreError::IndexFull(_) => Status::NoSpace,
        StoreError::Poisoned { .. } => Status::ReadOnly,
        StoreError::Io { .. } | StoreError::Device(_) => Status::IoError,
        StoreError::Corruption { .. } => Status::Corruption,
        StoreError::NoSuchNamespace { .. } => Status::NoSuchNamespace,
        StoreError::NamespaceExists { .. } => Status::NamespaceExists,
        StoreError::BadNamespace { .. } => Status::BadNamespace,
        StoreError::QuotaExceeded { .. } => Status::QuotaExceeded,
        StoreError::BadBatch(_) => Status::BadBatch,
        _ => Status::Internal,
    }
}

/// Outcome of one key operation: status and bytes (value or message).
type Outcome = (Status, Vec<u8>);

fn failed(ctx: &Ctx, scope: &Scope, e: StoreError) -> Outcome {
    let mut s = status_of(&e);
    // Not reachable from the default namespace; never sent to a client
    // that does not know the code.
    if s.since() > scope.version {
        s = Status::Internal;
    }
    if matches!(s, Status::IoError | Status::Corruption | Status::Internal | Status::ReadOnly) {
        tracing::warn!(error = %e, "native request failed");
    }
    ctx.stats.errors.fetch_add(1, Relaxed);
    (s, e.to_string().into_bytes())
}

async fn do_get(ctx: &Ctx, scope: &Scope, ns: &Namespace, key: &[u8]) -> Outcome {
    ctx.stats.gets.fetch_add(1, Relaxed);
    match ns.get_async(key).await {
        Ok(Some(v)) => {
            ctx.stats.get_hits.fetch_add(1, Relaxed);
            (Status::Ok, v)
        }
        Ok(None) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, scope, e),
    }
}

async fn do_put(ctx: &Ctx, scope: &Scope, ns: &Namespace, key: &[u8], value: &[u8], mode: PutMode) -> Outcome {
    ctx.stats.puts.fetch_add(1, Relaxed);
    let max = ctx.limits.value_bytes_max;
    if value.len() > max as usize {
        ctx.stats.errors.fetch_add(1, Relaxed);
        let msg = format!("value of {} bytes exceeds the server's limit of {max}", value.len());
        return (Status::ValueTooLarge, msg.into_bytes());
    }
    let m = match mode {
        PutMode::Upsert => granary_store::PutMode::Upsert,
        PutMode::CreateOnly => granary_store::PutMode::CreateOnly,
        PutMode::ReplaceOnly => granary_store::PutMode::ReplaceOnly,
    };
    match ns.put_with_async(key, value, m).await {
        Ok(granary_store::PutOutcome::Stored) => (Status::Ok, Vec::new()),
        Ok(granary_store::PutOutcome::Exists) => (Status::Exists, Vec::new()),
        Ok(granary_store::PutOutcome::NotFound) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, scope, e),
    }
}

/// A PUT whose value was received into its record buffer.
async fn do_put_buf(ctx: &Ctx, scope: &Scope, mut p: LargePut) -> Outcome {
    ctx.stats.puts.fetch_add(1, Relaxed);
    ctx.stats.zero_copy_puts.fetch_add(1, Relaxed);
    let cond = match p.mode {
        PutMode::Upsert => granary_store::Cond::Always,
        PutMode::CreateOnly => granary_store::Cond::Absent,
        PutMode::ReplaceOnly => granary_store::Cond::Present,
    };
    // The buffer holds the key as stored under the namespace's id when the
    // frame arrived, and its namespace handle. If the namespace was
    // dropped (and perhaps created anew under its name), that handle's
    // writes are refused: build the buffer again for what the name names
    // now (one copy of the value). A truncate keeps the handle, and the
    // engine rewrites the key under the namespace's new id itself
    // (`Store::put_buf`); this check catches it too, at the cost of the
    // copy.
    let (ns, pb) = if p.ns.stats().is_ok_and(|s| s.id == p.id) {
        (p.ns, p.pb)
    } else {
        let again = scope.resolve(&ctx.store, &p.name).and_then(|ns| {
            let mut pb = ns.new_put_buf(&p.key, p.pb.value_len())?;
            pb.fill_from(p.pb.value_mut());
            Ok((ns, pb))
        });
        match again {
            Ok(x) => x,
            Err(e) => return failed(ctx, scope, e),
        }
    };
    match ns.put_buf_async(pb, granary_store::ItemMeta::default(), cond).await {
        Ok((granary_store::PutOutcome::Stored, _)) => (Status::Ok, Vec::new()),
        Ok((granary_store::PutOutcome::Exists, _)) => (Status::Exists, Vec::new()),
        Ok((granary_store::PutOutcome::NotFound, _)) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, scope, e),
    }
}

async fn do_delete(ctx: &Ctx, scope: &Scope, ns: &Namespace, key: &[u8]) -> Outcome {
    ctx.stats.deletes.fetch_add(1, Relaxed);
    match ns.delete_async(key).await {
        Ok(true) => (Status::Ok, Vec::new()),
        Ok(false) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, scope, e),
    }
}

/// DELETE_CAS: delete only if the value's CAS value is `cas`, as a
/// one-operation engine batch (the engine checks the CAS value under the
/// key's lock, with the delete).
async fn do_delete_cas(ctx: &Ctx, scope: &Scope, ns: &Namespace, key: &[u8], cas: u64) -> Outcome {
    ctx.stats.deletes.fetch_add(1, Relaxed);
    let mut batch = ctx.store.batch();
    batch.delete_cas(ns, key, cas);
    match batch.commit_async().await {
        Ok(BatchOutcome::Committed { .. }) => (Status::Ok, Vec::new()),
        Ok(BatchOutcome::ConditionFailed { outcome: PutOutcome::NotFound, .. }) => (Status::NotFound, Vec::new()),
        Ok(BatchOutcome::ConditionFailed { .. }) => (Status::Exists, Vec::new()),
        Err(e) => failed(ctx, scope, e),
    }
}

/// Run a TXN: every operation's namespace resolved (now, so the namespace
/// changes sent before it are seen) and value checked against the
/// server's limit, then one atomic engine batch. Its status and body
/// ([`TxnOutcome`], or an error message naming the operation where one is
/// to blame).
async fn do_txn(ctx: &Ctx, scope: &Scope, ops: &[proto::TxnOp<'_>]) -> Outcome {
    let s = &ctx.stats;
    s.txns.fetch_add(1, Relaxed);
    let max = ctx.limits.value_bytes_max as usize;
    let mut batch = ctx.store.batch();
    for (i, o) in ops.iter().enumerate() {
        let value = o.write.value();
        if value.len() > max {
            s.errors.fetch_add(1, Relaxed);
            let msg = format!("operation {i}: value of {} bytes exceeds the server's limit of {max}", value.len());
            return (Status::ValueTooLarge, msg.into_bytes());
        }
        let ns = match scope.resolve(&ctx.store, o.ns) {
            Ok(ns) => ns,
            Err(e) => {
                let (st, msg) = failed(ctx, scope, e);
                let mut m = format!("operation {i}: ").into_bytes();
                m.extend_from_slice(&msg);
                return (st, m);
            }
        };
        let meta = ItemMeta::default();
        let op = match o.write {
            TxnWrite::Put(v) => StoreBatchOp::Put { value: v.to_vec(), meta },
            TxnWrite::PutAbsent(v) => StoreBatchOp::PutAbsent { value: v.to_vec(), meta },
            TxnWrite::PutPresent(v) => StoreBatchOp::PutPresent { value: v.to_vec(), meta },
            TxnWrite::Cas { cas, value } => StoreBatchOp::Cas { cas, value: value.to_vec(), meta },
            TxnWrite::Delete => StoreBatchOp::Delete,
            TxnWrite::DeleteCas(cas) => StoreBatchOp::DeleteCas { cas },
        };
        batch.op(&ns, o.key, op);
    }
    let outcome = match batch.commit_async().await {
        Ok(BatchOutcome::Committed { cas }) => TxnOutcome::Committed { cas },
        Ok(BatchOutcome::ConditionFailed { op, outcome }) => {
            s.txn_condition_failed.fetch_add(1, Relaxed);
            let status = match outcome {
                PutOutcome::NotFound => Status::NotFound,
                _ => Status::Exists,
            };
            TxnOutcome::ConditionFailed { op, status }
        }
        Err(e) => return failed(ctx, scope, e),
    };
    let mut b = Vec::with_capacity(4 + 8 * ops.len());
    let status = outcome.encode(&mut b);
    (status, b)
}

/// The engine's options for NS_CREATE's (the engine checks them: an
/// export's geometry, its mode, its lack of limits).
fn options_of(o: &proto::NamespaceOptions) -> granary_store::NamespaceOptions {
    granary_store::NamespaceOptions {
        mode: match o.mode {
            proto::NamespaceMode::Cache => granary_store::NamespaceMode::Cache,
            proto::NamespaceMode::Store => granary_store::NamespaceMode::Store,
        },
        default_ttl_secs: o.default_ttl_secs,
        max_bytes: o.max_bytes.map(NonZeroU64::get),
        max_keys: o.max_keys.map(NonZeroU64::get),
        kind: match o.kind {
            proto::NamespaceKind::Kv => granary_store::NamespaceKind::Kv,
            proto::NamespaceKind::Block { size_bytes, block_bytes } => {
                granary_store::NamespaceKind::Block { size_bytes, block_bytes }
            }
        },
    }
}

/// A namespace's figures as NS_STATS and NS_LIST carry them.
fn stats_of(s: &granary_store::NamespaceStats) -> proto::NamespaceStats {
    proto::NamespaceStats {
        name: s.name.clone(),
        id: s.id,
        options: proto::NamespaceOptions {
            mode: match s.options.mode {
                granary_store::NamespaceMode::Cache => proto::NamespaceMode::Cache,
                granary_store::NamespaceMode::Store => proto::NamespaceMode::Store,
            },
            default_ttl_secs: s.options.default_ttl_secs,
            max_bytes: s.options.max_bytes.and_then(NonZeroU64::new),
            max_keys: s.options.max_keys.and_then(NonZeroU64::new),
            kind: match s.options.kind {
                granary_store::NamespaceKind::Kv => proto::NamespaceKind::Kv,
                granary_store::NamespaceKind::Block { size_bytes, block_bytes } => {
                    proto::NamespaceKind::Block { size_bytes, block_bytes }
                }
            },
        },
        keys: s.keys,
        value_bytes: s.value_bytes,
        gets: s.gets,
        hits: s.hits,
        misses: s.misses,
        sets: s.sets,
        deletes: s.deletes,
        evictions: s.evictions,
        expirations: s.expirations,
    }
}

/// A namespace name as the engine takes it (NS_CREATE: a name that is not
/// UTF-8 is not one the engine would take).
fn name_str(name: &[u8]) -> Result<&str, StoreError> {
    std::str::from_utf8(name).map_err(|_| StoreError::BadNamespace {
        name: String::from_utf8_lossy(name).into_owned(),
        why: "a name holds only ASCII letters, digits, '_', '-' and '.'".into(),
    })
}

/// Run an `NS_*` request on namespace `name`: its status and body.
async fn namespace_op(ctx: &Ctx, scope: &Scope, req: &Request<'_>, name: &[u8]) -> Outcome {
    let s = &ctx.stats;
    let ok = |body: Vec<u8>| (Status::Ok, body);
    let r: Result<Outcome, StoreError> = match req {
        Request::NsCreate(o) => {
            s.ns_creates.fetch_add(1, Relaxed);
            match name_str(name) {
                Ok(n) => ctx.store.create_namespace_async(n, options_of(o)).await.map(|_| ok(Vec::new())),
                Err(e) => Err(e),
            }
        }
        Request::NsDrop => {
            s.ns_drops.fetch_add(1, Relaxed);
            // No name is the default namespace (which the engine refuses
            // to drop); a name that is not UTF-8 names no namespace.
            let n = match std::str::from_utf8(name) {
                Ok("") => Ok(DEFAULT_NAMESPACE),
                Ok(n) => Ok(n),
                Err(_) => Err(StoreError::NoSuchNamespace { name: String::from_utf8_lossy(name).into_owned() }),
            };
            match n {
                Ok(n) => ctx.store.drop_namespace_async(n).await.map(|_| ok(Vec::new())),
                Err(e) => Err(e),
            }
        }
        Request::NsTruncate => {
            s.ns_truncates.fetch_add(1, Relaxed);
            // On a handle, flush_all is the namespace's truncate (the
            // default namespace's: its flush floor).
            match scope.resolve(&ctx.store, name) {
                Ok(ns) => ns.flush_all_async().await.map(|_| ok(Vec::new())),
                Err(e) => Err(e),
            }
        }
        Request::NsStats => {
            s.ns_stats.fetch_add(1, Relaxed);
            scope.resolve(&ctx.store, name).and_then(|ns| ns.stats()).map(|st| {
                let mut b = Vec::with_capacity(proto::NAMESPACE_STATS_BYTES + st.name.len());
                proto::encode_namespace_stats(&mut b, &stats_of(&st));
                ok(b)
            })
        }
        Request::NsList => {
            s.ns_lists.fetch_add(1, Relaxed);
            let all: Vec<proto::NamespaceStats> = ctx.store.namespaces().iter().map(stats_of).collect();
            let mut b = Vec::new();
            proto::encode_namespace_list(&mut b, &all);
            Ok(ok(b))
        }
        _ => unreachable!("not a namespace request"),
    };
    r.unwrap_or_else(|e| failed(ctx, scope, e))
}

/// Count a request that failed before it ran (its namespace did not
/// resolve) under its opcode.
fn count_op(s: &NativeStats, req: &Request) {
    let c = match req {
        Request::Get(_) | Request::Gets(_) => &s.gets,
        Request::Put { .. } => &s.puts,
        Request::Delete(_) | Request::DeleteCas { .. } => &s.deletes,
        Request::MultiGet(_) => &s.multi_gets,
        Request::Batch(_) => &s.batches,
        _ => return,
    };
    c.fetch_add(1, Relaxed);
}

/// Execute one request (its frame already checked by `parse::request`)
/// and append its response.
async fn execute(ctx: &Ctx, scope: &Scope, h: Header, body: &[u8], resp: &mut Out) {
    let (name, req) = match Request::decode(&h, body) {
        Ok(r) => r,
        // Decoded once already by the reader; cannot fail here.
        Err(e) => return proto::encode_response(&mut resp.bytes, h.op, Status::Internal, h.id, e.0.as_bytes()),
    };
    let single = |out: &mut Vec<u8>, (s, b): Outcome| proto::encode_response(out, h.op, s, h.id, &b);
    if matches!(req, Request::NsCreate(_) | Request::NsDrop | Request::NsTruncate | Request::NsList | Request::NsStats)
    {
        let outcome = namespace_op(ctx, scope, &req, name).await;
        return single(&mut resp.bytes, outcome);
    }
    // Each operation names its namespace; the frame names none.
    if let Request::Txn(ops) = &req {
        let outcome = do_txn(ctx, scope, ops).await;
        return single(&mut resp.bytes, outcome);
    }
    // A key request's namespace, resolved now that every earlier request
    // it might depend on (a namespace change is a barrier) has run.
    let ns = match req {
        Request::Nop | Request::Stats => None,
        _ => match scope.resolve(&ctx.store, name) {
            Ok(ns) => Some(ns),
            Err(e) => {
                count_op(&ctx.stats, &req);
                return single(&mut resp.bytes, failed(ctx, scope, e));
            }
        },
    };
    let ns = ns.as_deref().unwrap_or(&scope.default);
    match req {
        Request::Get(k) | Request::Gets(k) => {
            // The value is sent from the buffer it was read into when it
            // is large enough for that to beat a copy. GETS puts its
            // ItemInfo before it.
            ctx.stats.gets.fetch_add(1, Relaxed);
            match ns.get_buf_async(k).await {
                Ok(Some(v)) => {
                    let info = (h.op == proto::Op::Gets).then_some(proto::ItemInfo {
                        cas: v.cas,
                        flags: v.meta.flags,
                        expires: v.meta.expires,
                    });
                    let info_len = if info.is_some() { proto::ITEM_INFO_BYTES } else { 0 };
                    let max = ctx.limits.frame_max as usize;
                    if info_len + v.len() > max {
                        // Written under a larger limit (or by the embedded
                        // API): more than one response frame may carry.
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        let msg = format!(
                            "the value of {} bytes is larger than a response frame ({max} bytes); serve with a larger --max-item-size to read it",
                            v.len()
                        );
                        return single(&mut resp.bytes, (Status::ValueTooLarge, msg.into_bytes()));
                    }
                    ctx.stats.get_hits.fetch_add(1, Relaxed);
                    proto::encode_response_header(&mut resp.bytes, h.op, Status::Ok, h.id, info_len + v.len());
                    if let Some(info) = info {
                        info.encode(&mut resp.bytes);
                    }
                    if v.len() >= ZERO_COPY_MIN_BYTES {
                        resp.push_value(v);
                        ctx.stats.zero_copy_gets.fetch_add(1, Relaxed);
                    } else {
                        resp.bytes.extend_from_slice(v.value());
                    }
                }
                Ok(None) => single(&mut resp.bytes, (Status::NotFound, Vec::new())),
                Err(e) => single(&mut resp.bytes, failed(ctx, scope, e)),
            }
        }
        Request::Put { key, value, mode } => single(&mut resp.bytes, do_put(ctx, scope, ns, key, value, mode).await),
        Request::Delete(k) => single(&mut resp.bytes, do_delete(ctx, scope, ns, k).await),
        Request::DeleteCas { key, cas } => single(&mut resp.bytes, do_delete_cas(ctx, scope, ns, key, cas).await),
        Request::MultiGet(keys) => {
            ctx.stats.multi_gets.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_count(&mut b, keys.len());
            let n = keys.len();
            // The keys' reads run together (MULTI_GET_READS), answered in order.
            let mut reads = granary_rt::Window::new(MULTI_GET_READS, ctx.limits.frame_max as u64);
            let mut queued = keys.into_iter();
            let mut next = queued.next();
            let mut answered = 0;
            loop {
                while let Some(k) = next {
                    let hint = ns.value_size_hint(k).unwrap_or(0);
                    if !reads.has_room(hint) {
                        break;
                    }
                    reads.push(do_get(ctx, scope, ns, k), hint);
                    next = queued.next();
                }
                let Some((s, v)) = reads.next().await else { break };
                answered += 1;
                push_entry(ctx, &mut b, s, &v, n - answered);
            }
            proto::encode_response(&mut resp.bytes, h.op, Status::Ok, h.id, &b);
        }
        Request::Batch(ops) => {
            ctx.stats.batches.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_count(&mut b, ops.len());
            let n = ops.len();
            for (i, o) in ops.into_iter().enumerate() {
                let (s, v) = match o {
                    proto::BatchOp::Get(k) => do_get(ctx, scope, ns, k).await,
                    proto::BatchOp::Put { key, value, mode } => do_put(ctx, scope, ns, key, value, mode).await,
                    proto::BatchOp::Delete(k) => do_delete(ctx, scope, ns, k).await,
                };
                push_entry(ctx, &mut b, s, &v, n - i - 1);
            }
            proto::encode_response(&mut resp.bytes, h.op, Status::Ok, h.id, &b);
        }
        Request::Nop => {
            ctx.stats.nops.fetch_add(1, Relaxed);
            proto::encode_response(&mut resp.bytes, h.op, Status::Ok, h.id, &[]);
        }
        Request::Stats => {
            ctx.stats.stats.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            let pairs = stats::pairs(&ctx.stats, &ctx.store, ctx.started, ctx.limits.value_bytes_max);
            proto::encode_stats(&mut b, &pairs);
            proto::encode_response(&mut resp.bytes, h.op, Status::Ok, h.id, &b);
        }
        Request::NsCreate(_)
        | Request::NsDrop
        | Request::NsTruncate
        | Request::NsList
        | Request::NsStats
        | Request::Txn(_) => {
            unreachable!("answered above")
        }
    }
}

/// Append an MGET/BATCH entry, keeping room for the `after` entries still
/// to come (5 bytes each at least). A value that would take the response
/// past the frame limit is replaced by a `VALUE_TOO_LARGE` entry (fetch it
/// alone), whose message is dropped too if even that does not fit.
fn push_entry(ctx: &Ctx, body: &mut Vec<u8>, s: Status, v: &[u8], after: usize) {
    let max = ctx.limits.frame_max as usize;
    let room = |extra: usize| body.len() + 4 + 5 + extra + 5 * after <= max;
    if room(v.len()) {
        return proto::encode_entry(body, s, v);
    }
    ctx.stats.errors.fetch_add(1, Relaxed);
    let msg = format!("this value would take the response past the frame limit of {max} bytes; get it alone");
    let msg: &[u8] = if room(msg.len()) { msg.as_bytes() } else { &[] };
    proto::encode_entry(body, Status::ValueTooLarge, msg);
}
