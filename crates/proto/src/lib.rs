//! Granary's native protocol on the wire, with no IO: the handshake, the
//! frame header, request and response bodies, their encoders and decoders,
//! status codes and limits. `docs/PROTOCOL.md` is the prose version of this
//! crate; the server (`granary-native`) and the client (`granary-client`)
//! both speak through it.
//!
//! Everything is little-endian. Decoders reject what they do not understand
//! (wrong magic, unknown opcode, flag or status, reserved bytes that are not
//! zero, lengths that overrun the frame or exceed a limit, trailing bytes)
//! with a [`ProtoError`] naming the field; they never panic and never
//! allocate more than the bytes they were given justify.

use std::fmt;

/// First bytes of both hellos.
pub const MAGIC: [u8; 4] = *b"GRNY";
/// The protocol version this build speaks (the only one so far).
pub const VERSION: u16 = 1;
/// Bytes of the client's hello.
pub const CLIENT_HELLO_BYTES: usize = 16;
/// Bytes of the server's hello.
pub const SERVER_HELLO_BYTES: usize = 24;
/// Bytes of every frame header, requests and responses alike.
pub const HEADER_BYTES: usize = 16;
/// The native listener's default TCP port.
pub const DEFAULT_PORT: u16 = 43345;
/// Longest key (the engine's limit).
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Most keys in one MGET and most operations in one BATCH.
pub const MULTI_OPS_MAX: usize = 4096;
/// Frame bodies are never limited below this (so MGET of many keys and
/// STATS always fit), whatever the largest value.
pub const FRAME_BYTES_FLOOR: u32 = 16 << 20;
/// Largest value the protocol can carry at all (lengths are u32; the
/// server announces its own, lower, limit in its hello).
pub const VALUE_BYTES_LIMIT: u32 = 1 << 30;

/// The largest frame body for a server whose largest value is `value_max`:
/// one PUT of a maximal key and value, or [`FRAME_BYTES_FLOOR`].
pub fn frame_bytes_max(value_max: u32) -> u32 {
    (value_max as u64 + KEY_BYTES_MAX as u64 + 64).max(FRAME_BYTES_FLOOR as u64).min(u32::MAX as u64) as u32
}

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ProtoError> {
    Err(ProtoError(msg.into()))
}

/// Request opcodes (echoed in responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    Get = 1,
    Put = 2,
    Delete = 3,
    MultiGet = 4,
    Batch = 5,
    Nop = 6,
    Stats = 7,
}

impl Op {
    pub fn from_u8(b: u8) -> Result<Op, ProtoError> {
        Ok(match b {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::Delete,
            4 => Op::MultiGet,
            5 => Op::Batch,
            6 => Op::Nop,
            7 => Op::Stats,
            _ => return err(format!("unknown opcode {b}")),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Put => "PUT",
            Op::Delete => "DELETE",
            Op::MultiGet => "MGET",
            Op::Batch => "BATCH",
            Op::Nop => "NOP",
            Op::Stats => "STATS",
        }
    }
}

/// How a PUT treats an existing key (the request's flags byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(u8)]
pub enum PutMode {
    /// Insert or overwrite.
    #[default]
    Upsert = 0,
    /// Only if absent; else `Exists`.
    CreateOnly = 1,
    /// Only if present; else `NotFound`.
    ReplaceOnly = 2,
}

impl PutMode {
    pub fn from_u8(b: u8) -> Result<PutMode, ProtoError> {
        Ok(match b {
            0 => PutMode::Upsert,
            1 => PutMode::CreateOnly,
            2 => PutMode::ReplaceOnly,
            _ => return err(format!("unknown PUT mode {b}")),
        })
    }
}

/// Response status codes. Codes from [`Status::KeyInvalid`] up are errors
/// whose body is a UTF-8 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// GET/DELETE of an absent key; PUT ReplaceOnly of an absent key.
    NotFound = 1,
    /// PUT CreateOnly of a present key.
    Exists = 2,
    /// The key is empty, longer than the limit, or in the engine's
    /// reserved namespace.
    KeyInvalid = 3,
    /// The value exceeds the server's largest value.
    ValueTooLarge = 4,
    /// The store is full (store mode), or the index cannot take another key.
    NoSpace = 5,
    /// The store refuses writes after a device failure; reads work.
    ReadOnly = 6,
    /// The device failed the operation.
    IoError = 7,
    /// Data read back failed its checks.
    Corruption = 8,
    /// The frame was malformed; the server closes the connection.
    BadFrame = 9,
    /// The frame's length exceeds the limit; the server closes the connection.
    FrameTooLarge = 10,
    /// Hello only: no common protocol version.
    UnsupportedVersion = 11,
    /// Hello only: the server is at its connection limit.
    Busy = 12,
    /// Anything else that went wrong on the server.
    Internal = 13,
}

impl Status {
    pub fn from_u8(b: u8) -> Result<Status, ProtoError> {
        Ok(match b {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Exists,
            3 => Status::KeyInvalid,
            4 => Status::ValueTooLarge,
            5 => Status::NoSpace,
            6 => Status::ReadOnly,
            7 => Status::IoError,
            8 => Status::Corruption,
            9 => Status::BadFrame,
            10 => Status::FrameTooLarge,
            11 => Status::UnsupportedVersion,
            12 => Status::Busy,
            13 => Status::Internal,
            _ => return err(format!("unknown status {b}")),
        })
    }
    /// True for the codes whose body is an error message.
    pub fn is_error(self) -> bool {
        (self as u8) >= Status::KeyInvalid as u8
    }
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NotFound => "NOT_FOUND",
            Status::Exists => "EXISTS",
            Status::KeyInvalid => "KEY_INVALID",
            Status::ValueTooLarge => "VALUE_TOO_LARGE",
            Status::NoSpace => "NO_SPACE",
            Status::ReadOnly => "READ_ONLY",
            Status::IoError => "IO_ERROR",
            Status::Corruption => "CORRUPTION",
            Status::BadFrame => "BAD_FRAME",
            Status::FrameTooLarge => "FRAME_TOO_LARGE",
            Status::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Status::Busy => "BUSY",
            Status::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A length as u32; lengths beyond u32 cannot be framed (callers check
/// limits first, so this only guards against misuse).
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("length exceeds the protocol's u32 fields")
}

// ---------------------------------------------------------------- hellos

/// The client's hello: the range of versions it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHello {
    pub min_version: u16,
    pub max_version: u16,
}

impl Default for ClientHello {
    fn default() -> Self {
        ClientHello { min_version: VERSION, max_version: VERSION }
    }
}

impl ClientHello {
    pub fn encode(&self) -> [u8; CLIENT_HELLO_BYTES] {
        let mut b = [0u8; CLIENT_HELLO_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.min_version.to_le_bytes());
        b[6..8].copy_from_slice(&self.max_version.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; CLIENT_HELLO_BYTES]) -> Result<ClientHello, ProtoError> {
        if b[0..4] != MAGIC {
            return err("not a Granary native protocol client (bad magic)");
        }
        if b[8..].iter().any(|&x| x != 0) {
            return err("client hello: reserved bytes are not zero");
        }
        let h = ClientHello { min_version: get_u16(b, 4), max_version: get_u16(b, 6) };
        if h.min_version == 0 || h.min_version > h.max_version {
            return err(format!("client hello: bad version range {}..={}", h.min_version, h.max_version));
        }
        Ok(h)
    }
    /// The version both sides speak, if any.
    pub fn agree(&self) -> Option<u16> {
        (self.min_version..=self.max_version).contains(&VERSION).then_some(VERSION)
    }
}

/// The server's hello: the version chosen (or why none) and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerHello {
    pub version: u16,
    /// `Ok`, `UnsupportedVersion` or `Busy`; the server closes unless `Ok`.
    pub status: Status,
    pub key_bytes_max: u32,
    pub value_bytes_max: u32,
    /// Largest frame body the server accepts.
    pub frame_bytes_max: u32,
}

impl ServerHello {
    pub fn encode(&self) -> [u8; SERVER_HELLO_BYTES] {
        let mut b = [0u8; SERVER_HELLO_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6] = self.status as u8;
        b[8..12].copy_from_slice(&self.key_bytes_max.to_le_bytes());
        b[12..16].copy_from_slice(&self.value_bytes_max.to_le_bytes());
        b[16..20].copy_from_slice(&self.frame_bytes_max.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; SERVER_HELLO_BYTES]) -> Result<ServerHello, ProtoError> {
        if b[0..4] != MAGIC {
            return err("not a Granary native protocol server (bad magic)");
        }
        if b[7] != 0 || b[20..].iter().any(|&x| x != 0) {
            return err("server hello: reserved bytes are not zero");
        }
        Ok(ServerHello {
            version: get_u16(b, 4),
            status: Status::from_u8(b[6])?,
            key_bytes_max: get_u32(b, 8),
            value_bytes_max: get_u32(b, 12),
            frame_bytes_max: get_u32(b, 16),
        })
    }
}

// ---------------------------------------------------------------- header

/// The 16-byte header before every frame body.
///
/// ```text
/// 0  u32 len    body bytes after the header
/// 4  u8  op     opcode (responses echo the request's)
/// 5  u8  flags  request: PUT mode (0 otherwise); response: status
/// 6  u16 0      reserved
/// 8  u64 id     chosen by the client, echoed by the response
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub op: Op,
    pub flags: u8,
    pub id: u64,
}

impl Header {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.len);
        out.push(self.op as u8);
        out.push(self.flags);
        put_u16(out, 0);
        out.extend_from_slice(&self.id.to_le_bytes());
    }
    /// Decode and check against the largest body accepted. The id of a
    /// header with a bad opcode is still wanted for the error reply: see
    /// [`Header::peek_id`].
    pub fn decode(b: &[u8], frame_max: u32) -> Result<Header, ProtoError> {
        if b.len() < HEADER_BYTES {
            return err("truncated frame header");
        }
        let len = get_u32(b, 0);
        if len > frame_max {
            return err(format!("frame body of {len} bytes exceeds the limit of {frame_max}"));
        }
        if get_u16(b, 6) != 0 {
            return err("frame header: reserved bytes are not zero");
        }
        Ok(Header { len, op: Op::from_u8(b[4])?, flags: b[5], id: get_u64(b, 8) })
    }
    /// The id field of a (possibly invalid) header.
    pub fn peek_id(b: &[u8]) -> u64 {
        if b.len() >= HEADER_BYTES {
            get_u64(b, 8)
        } else {
            0
        }
    }
    /// The length field of a (possibly invalid) header.
    pub fn peek_len(b: &[u8]) -> u32 {
        if b.len() >= 4 {
            get_u32(b, 0)
        } else {
            0
        }
    }
}

// ---------------------------------------------------------------- requests

/// One operation of a BATCH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp<'a> {
    Get(&'a [u8]),
    Put { key: &'a [u8], value: &'a [u8], mode: PutMode },
    Delete(&'a [u8]),
}

impl<'a> BatchOp<'a> {
    pub fn key(&self) -> &'a [u8] {
        match self {
            BatchOp::Get(k) | BatchOp::Delete(k) => k,
            BatchOp::Put { key, .. } => key,
        }
    }
    pub fn is_write(&self) -> bool {
        !matches!(self, BatchOp::Get(_))
    }
}

/// A request, borrowing its keys and values from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Get(&'a [u8]),
    Put {
        key: &'a [u8],
        value: &'a [u8],
        mode: PutMode,
    },
    Delete(&'a [u8]),
    MultiGet(Vec<&'a [u8]>),
    Batch(Vec<BatchOp<'a>>),
    /// A barrier: answered after every earlier request of the connection.
    Nop,
    Stats,
}

fn check_key(k: &[u8], what: &str) -> Result<(), ProtoError> {
    if k.len() > KEY_BYTES_MAX {
        return err(format!("{what}: key of {} bytes exceeds {KEY_BYTES_MAX}", k.len()));
    }
    Ok(())
}

/// Cursor over a body; every read checks the bytes left.
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Rd<'a> {
    fn u8(&mut self) -> Result<u8, ProtoError> {
        let v = *self.b.get(self.at).ok_or_else(|| ProtoError(format!("{}: truncated", self.what)))?;
        self.at += 1;
        Ok(v)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.b.len() - self.at < n {
            return err(format!("{}: length {n} overruns the frame", self.what));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.at..];
        self.at = self.b.len();
        s
    }
    fn end(&self) -> Result<(), ProtoError> {
        if self.at != self.b.len() {
            return err(format!("{}: {} trailing bytes", self.what, self.b.len() - self.at));
        }
        Ok(())
    }
    /// A count of entries, each at least `min_entry` bytes: bounded by the
    /// limit and by the bytes left (so no allocation is unjustified).
    fn count(&mut self, min_entry: usize) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > MULTI_OPS_MAX {
            return err(format!("{}: {n} entries exceed the limit of {MULTI_OPS_MAX}", self.what));
        }
        if n.saturating_mul(min_entry) > self.b.len() - self.at {
            return err(format!("{}: {n} entries overrun the frame", self.what));
        }
        Ok(n)
    }
}

impl<'a> Request<'a> {
    pub fn op(&self) -> Op {
        match self {
            Request::Get(_) => Op::Get,
            Request::Put { .. } => Op::Put,
            Request::Delete(_) => Op::Delete,
            Request::MultiGet(_) => Op::MultiGet,
            Request::Batch(_) => Op::Batch,
            Request::Nop => Op::Nop,
            Request::Stats => Op::Stats,
        }
    }

    /// Bytes of the body [`Request::encode`] writes.
    pub fn body_len(&self) -> usize {
        match self {
            Request::Get(k) | Request::Delete(k) => k.len(),
            Request::Put { key, value, .. } => 4 + key.len() + value.len(),
            Request::MultiGet(keys) => 4 + keys.iter().map(|k| 4 + k.len()).sum::<usize>(),
            Request::Batch(ops) => {
                4 + ops
                    .iter()
                    .map(|o| {
                        10 + o.key().len()
                            + match o {
                                BatchOp::Put { value, .. } => value.len(),
                                _ => 0,
                            }
                    })
                    .sum::<usize>()
            }
            Request::Nop | Request::Stats => 0,
        }
    }

    /// Append the frame (header and body) with this id. Lengths must fit
    /// the protocol's limits (the client checks them first).
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let flags = match self {
            Request::Put { mode, .. } => *mode as u8,
            _ => 0,
        };
        Header { len: len32(self.body_len()), op: self.op(), flags, id }.encode(out);
        match self {
            Request::Get(k) | Request::Delete(k) => out.extend_from_slice(k),
            Request::Put { key, value, .. } => {
                put_u32(out, len32(key.len()));
                out.extend_from_slice(key);
                out.extend_from_slice(value);
            }
            Request::MultiGet(keys) => {
                put_u32(out, len32(keys.len()));
                for k in keys {
                    put_u32(out, len32(k.len()));
                    out.extend_from_slice(k);
                }
            }
            Request::Batch(ops) => {
                put_u32(out, len32(ops.len()));
                for o in ops {
                    let (op, flags, value): (Op, u8, &[u8]) = match o {
                        BatchOp::Get(_) => (Op::Get, 0, &[]),
                        BatchOp::Put { value, mode, .. } => (Op::Put, *mode as u8, value),
                        BatchOp::Delete(_) => (Op::Delete, 0, &[]),
                    };
                    out.push(op as u8);
                    out.push(flags);
                    put_u32(out, len32(o.key().len()));
                    put_u32(out, len32(value.len()));
                    out.extend_from_slice(o.key());
                    out.extend_from_slice(value);
                }
            }
            Request::Nop | Request::Stats => {}
        }
    }

    /// Decode a request body under its (already checked) header.
    pub fn decode(h: &Header, body: &'a [u8]) -> Result<Request<'a>, ProtoError> {
        if body.len() != h.len as usize {
            return err("body length differs from the header's");
        }
        if h.op != Op::Put && h.flags != 0 {
            return err(format!("{}: flags must be zero", h.op.name()));
        }
        let mut r = Rd { b: body, at: 0, what: h.op.name() };
        let req = match h.op {
            Op::Get => Request::Get(r.rest()),
            Op::Delete => Request::Delete(r.rest()),
            Op::Put => {
                let mode = PutMode::from_u8(h.flags)?;
                let kl = r.u32()? as usize;
                let key = r.bytes(kl)?;
                Request::Put { key, value: r.rest(), mode }
            }
            Op::MultiGet => {
                let n = r.count(4)?;
                let mut keys = Vec::with_capacity(n);
                for _ in 0..n {
                    let kl = r.u32()? as usize;
                    keys.push(r.bytes(kl)?);
                }
                Request::MultiGet(keys)
            }
            Op::Batch => {
                let n = r.count(10)?;
                let mut ops = Vec::with_capacity(n);
                for _ in 0..n {
                    let op = Op::from_u8(r.u8()?)?;
                    let flags = r.u8()?;
                    let kl = r.u32()? as usize;
                    let vl = r.u32()? as usize;
                    let key = r.bytes(kl)?;
                    let value = r.bytes(vl)?;
                    let o = match op {
                        Op::Put => BatchOp::Put { key, value, mode: PutMode::from_u8(flags)? },
                        Op::Get | Op::Delete if flags != 0 || vl != 0 => {
                            return err(format!("BATCH: {} with flags or a value", op.name()))
                        }
                        Op::Get => BatchOp::Get(key),
                        Op::Delete => BatchOp::Delete(key),
                        _ => return err(format!("BATCH: {} cannot be batched", op.name())),
                    };
                    ops.push(o);
                }
                Request::Batch(ops)
            }
            Op::Nop | Op::Stats => {
                if h.op == Op::Nop {
                    Request::Nop
                } else {
                    Request::Stats
                }
            }
        };
        r.end()?;
        match &req {
            Request::Get(k) | Request::Delete(k) | Request::Put { key: k, .. } => check_key(k, h.op.name())?,
            Request::MultiGet(keys) => keys.iter().try_for_each(|k| check_key(k, "MGET"))?,
            Request::Batch(ops) => ops.iter().try_for_each(|o| check_key(o.key(), "BATCH"))?,
            Request::Nop | Request::Stats => {}
        }
        Ok(req)
    }
}

// ---------------------------------------------------------------- responses

/// Append a response frame: header, then `body`.
pub fn encode_response(out: &mut Vec<u8>, op: Op, status: Status, id: u64, body: &[u8]) {
    Header { len: len32(body.len()), op, flags: status as u8, id }.encode(out);
    out.extend_from_slice(body);
}

/// Append a response header whose body (of `len` bytes) the caller writes next.
pub fn encode_response_header(out: &mut Vec<u8>, op: Op, status: Status, id: u64, len: usize) {
    Header { len: len32(len), op, flags: status as u8, id }.encode(out);
}

/// Append one entry of an MGET or BATCH response body: status, length,
/// bytes (the value if `Ok` with one, an error message, or nothing).
pub fn encode_entry(out: &mut Vec<u8>, status: Status, bytes: &[u8]) {
    out.push(status as u8);
    put_u32(out, len32(bytes.len()));
    out.extend_from_slice(bytes);
}

/// Start an MGET/BATCH response body with its entry count.
pub fn encode_count(out: &mut Vec<u8>, n: usize) {
    put_u32(out, len32(n));
}

/// One entry of an MGET or BATCH response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub status: Status,
    /// The value (GET hit), an error message, or empty.
    pub bytes: Vec<u8>,
}

/// Decode an MGET/BATCH response body.
pub fn decode_entries(body: &[u8]) -> Result<Vec<Entry>, ProtoError> {
    let mut r = Rd { b: body, at: 0, what: "entries" };
    let n = r.count(5)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let status = Status::from_u8(r.u8()?)?;
        let l = r.u32()? as usize;
        v.push(Entry { status, bytes: r.bytes(l)?.to_vec() });
    }
    r.end()?;
    Ok(v)
}

/// Encode a STATS response body: (name, value) text pairs.
pub fn encode_stats(out: &mut Vec<u8>, pairs: &[(String, String)]) {
    put_u32(out, len32(pairs.len()));
    for (k, v) in pairs {
        let k = &k.as_bytes()[..k.len().min(u16::MAX as usize)];
        let v = &v.as_bytes()[..v.len().min(u16::MAX as usize)];
        put_u16(out, k.len() as u16);
        out.extend_from_slice(k);
        put_u16(out, v.len() as u16);
        out.extend_from_slice(v);
    }
}

/// Decode a STATS response body.
pub fn decode_stats(body: &[u8]) -> Result<Vec<(String, String)>, ProtoError> {
    let mut r = Rd { b: body, at: 0, what: "STATS" };
    let n = r.count(4)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let kl = r.u16()? as usize;
        let k = String::from_utf8(r.bytes(kl)?.to_vec()).map_err(|_| ProtoError("STATS: name not UTF-8".into()))?;
        let vl = r.u16()? as usize;
        let val = String::from_utf8(r.bytes(vl)?.to_vec()).map_err(|_| ProtoError("STATS: value not UTF-8".into()))?;
        v.push((k, val));
    }
    r.end()?;
    Ok(v)
}

/// A whole response frame, as a client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub id: u64,
    pub op: Op,
    pub status: Status,
    pub body: Vec<u8>,
}

impl Response {
    /// Decode a response header (the body follows separately).
    pub fn decode_header(b: &[u8], frame_max: u32) -> Result<(Header, Status), ProtoError> {
        let h = Header::decode(b, frame_max)?;
        let s = Status::from_u8(h.flags)?;
        Ok((h, s))
    }
}

#[cfg(test)]
mod tests;
