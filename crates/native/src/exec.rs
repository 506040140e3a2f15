//! Running one request against the store and encoding its response, and
//! what a request touches (its [`Flight`]), from which the connection
//! decides which requests may run at once.
//!
//! Invariants:
//! - every request gets exactly one response frame, with its opcode and
//!   id; a store error becomes the response's status and message, never a
//!   closed connection;
//! - a response never exceeds the frame limit: an MGET/BATCH entry that
//!   would take it past is replaced by a `VALUE_TOO_LARGE` entry;
//! - two requests conflict when one writes a key the other touches, or
//!   either is a barrier (NOP); the connection starts a request only once
//!   every earlier conflicting one has ended (`conn::Conn::admit`), so the
//!   effects a connection observes follow the order it sent its requests.

use crate::limits::ZERO_COPY_MIN_BYTES;
use crate::parse::Limits;
use crate::{stats, NativeStats};
use granary_proto::{self as proto, Header, PutMode, Request, Status};
use granary_store::{Error as StoreError, PutBuf, Store, ValueBuf};
use std::collections::VecDeque;
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
    /// What `req` (the `seq`th request, of `body_bytes`) touches.
    pub fn of(req: &Request, seq: u64, body_bytes: usize) -> Flight {
        let (keys, write, barrier) = match req {
            Request::Get(k) => (vec![key_hash(k)], false, false),
            Request::Put { key, .. } => (vec![key_hash(key)], true, false),
            Request::Delete(k) => (vec![key_hash(k)], true, false),
            Request::MultiGet(ks) => (ks.iter().map(|k| key_hash(k)).collect(), false, false),
            Request::Batch(ops) => {
                (ops.iter().map(|o| key_hash(o.key())).collect(), ops.iter().any(|o| o.is_write()), false)
            }
            Request::Stats => (Vec::new(), false, false),
            Request::Nop => (Vec::new(), false, true),
        };
        let mut keys = keys;
        keys.sort_unstable();
        keys.dedup();
        Flight { seq, keys, write, barrier, body_bytes }
    }

    /// A PUT of `key` whose value (`value_bytes`) is in a record buffer.
    pub fn put(key: &[u8], seq: u64, value_bytes: usize) -> Flight {
        Flight { seq, keys: vec![key_hash(key)], write: true, barrier: false, body_bytes: value_bytes }
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

/// What a started request executes: a whole frame's body, or a PUT whose
/// value was received straight into the record buffer the device writes.
pub(crate) enum Job {
    Frame(Vec<u8>),
    Put { pb: PutBuf, mode: PutMode },
}

/// Run `job` (the request of header `h`) and append its response to `resp`.
pub(crate) async fn run(ctx: &Ctx, h: Header, job: Job, resp: &mut Out) {
    match job {
        Job::Frame(body) => execute(ctx, h, &body, resp).await,
        Job::Put { pb, mode } => {
            let (s, b) = do_put_buf(ctx, pb, mode).await;
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
        _ => Status::Internal,
    }
}

/// Outcome of one key operation: status and bytes (value or message).
type Outcome = (Status, Vec<u8>);

fn failed(ctx: &Ctx, e: StoreError) -> Outcome {
    let s = status_of(&e);
    if matches!(s, Status::IoError | Status::Corruption | Status::Internal | Status::ReadOnly) {
        tracing::warn!(error = %e, "native request failed");
    }
    ctx.stats.errors.fetch_add(1, Relaxed);
    (s, e.to_string().into_bytes())
}

async fn do_get(ctx: &Ctx, key: &[u8]) -> Outcome {
    ctx.stats.gets.fetch_add(1, Relaxed);
    match ctx.store.get_async(key).await {
        Ok(Some(v)) => {
            ctx.stats.get_hits.fetch_add(1, Relaxed);
            (Status::Ok, v)
        }
        Ok(None) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

async fn do_put(ctx: &Ctx, key: &[u8], value: &[u8], mode: PutMode) -> Outcome {
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
    match ctx.store.put_with_async(key, value, m).await {
        Ok(granary_store::PutOutcome::Stored) => (Status::Ok, Vec::new()),
        Ok(granary_store::PutOutcome::Exists) => (Status::Exists, Vec::new()),
        Ok(granary_store::PutOutcome::NotFound) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

/// A PUT whose value was received into its record buffer.
async fn do_put_buf(ctx: &Ctx, pb: PutBuf, mode: PutMode) -> Outcome {
    ctx.stats.puts.fetch_add(1, Relaxed);
    ctx.stats.zero_copy_puts.fetch_add(1, Relaxed);
    let cond = match mode {
        PutMode::Upsert => granary_store::Cond::Always,
        PutMode::CreateOnly => granary_store::Cond::Absent,
        PutMode::ReplaceOnly => granary_store::Cond::Present,
    };
    match ctx.store.put_buf_async(pb, granary_store::ItemMeta::default(), cond).await {
        Ok((granary_store::PutOutcome::Stored, _)) => (Status::Ok, Vec::new()),
        Ok((granary_store::PutOutcome::Exists, _)) => (Status::Exists, Vec::new()),
        Ok((granary_store::PutOutcome::NotFound, _)) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

async fn do_delete(ctx: &Ctx, key: &[u8]) -> Outcome {
    ctx.stats.deletes.fetch_add(1, Relaxed);
    match ctx.store.delete_async(key).await {
        Ok(true) => (Status::Ok, Vec::new()),
        Ok(false) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

/// Execute one request (its frame already checked by `parse::request`)
/// and append its response.
async fn execute(ctx: &Ctx, h: Header, body: &[u8], resp: &mut Out) {
    let req = match Request::decode(&h, body) {
        Ok(r) => r,
        // Decoded once already by the reader; cannot fail here.
        Err(e) => return proto::encode_response(&mut resp.bytes, h.op, Status::Internal, h.id, e.0.as_bytes()),
    };
    let single = |out: &mut Vec<u8>, (s, b): Outcome| proto::encode_response(out, h.op, s, h.id, &b);
    match req {
        Request::Get(k) => {
            // The value is sent from the buffer it was read into when it
            // is large enough for that to beat a copy.
            ctx.stats.gets.fetch_add(1, Relaxed);
            match ctx.store.get_buf_async(k).await {
                Ok(Some(v)) => {
                    ctx.stats.get_hits.fetch_add(1, Relaxed);
                    if v.len() >= ZERO_COPY_MIN_BYTES {
                        proto::encode_response_header(&mut resp.bytes, h.op, Status::Ok, h.id, v.len());
                        resp.push_value(v);
                        ctx.stats.zero_copy_gets.fetch_add(1, Relaxed);
                    } else {
                        proto::encode_response(&mut resp.bytes, h.op, Status::Ok, h.id, v.value());
                    }
                }
                Ok(None) => single(&mut resp.bytes, (Status::NotFound, Vec::new())),
                Err(e) => single(&mut resp.bytes, failed(ctx, e)),
            }
        }
        Request::Put { key, value, mode } => single(&mut resp.bytes, do_put(ctx, key, value, mode).await),
        Request::Delete(k) => single(&mut resp.bytes, do_delete(ctx, k).await),
        Request::MultiGet(keys) => {
            ctx.stats.multi_gets.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_count(&mut b, keys.len());
            let n = keys.len();
            for (i, k) in keys.into_iter().enumerate() {
                let (s, v) = do_get(ctx, k).await;
                push_entry(ctx, &mut b, s, &v, n - i - 1);
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
                    proto::BatchOp::Get(k) => do_get(ctx, k).await,
                    proto::BatchOp::Put { key, value, mode } => do_put(ctx, key, value, mode).await,
                    proto::BatchOp::Delete(k) => do_delete(ctx, k).await,
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
