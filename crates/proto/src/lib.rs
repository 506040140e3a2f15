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
//!
//! Versions: this build speaks 1 to 3 ([`VERSION_MIN`]..=[`VERSION`]).
//! Version 2 is version 1 plus namespaces: a request frame names its
//! namespace (header byte 6, [`Header::ns_len`], then the name at the start
//! of the body; none = the default namespace, so a version 1 frame is a
//! version 2 frame in the default namespace), and the `NS_*` opcodes and
//! their status codes, and the atomic `TXN` ([`Request::Txn`]: operations
//! over keys of any namespaces, committed all or none). A header is decoded
//! for the version its connection negotiated ([`Header::decode`]).
//! Version 3 is version 2 plus two opcodes for optimistic concurrency on
//! one key: GETS ([`Request::Gets`]: a GET whose reply carries the value's
//! CAS value, flags and expiry, [`ItemInfo`]) and DELETE_CAS
//! ([`Request::DeleteCas`]: a delete only if the value still has a CAS
//! value), and the same delete as a TXN operation ([`TxnWrite::DeleteCas`],
//! kind 6; a server checks a decoded request's version with
//! [`Request::check_version`]); every version 2 frame is unchanged.
//!
//! Namespace kinds (a key space, or an export: a block device) live inside
//! version 2, laid out so that a key space's frames are the ones a version
//! 2 peer without kinds sends and reads: NS_CREATE's kind section is an
//! optional tail of its body (absent: a key space), and the namespace
//! record's kind is a byte that was reserved (0: a key space), with an
//! export's geometry only in an export's record. A peer without kinds
//! refuses an export's NS_CREATE or record as malformed, never misreads it.

use std::fmt;
use std::num::NonZeroU64;

/// First bytes of both hellos.
pub const MAGIC: [u8; 4] = *b"GRNY";
/// The highest protocol version this build speaks.
pub const VERSION: u16 = 3;
/// The lowest protocol version this build speaks: a server speaks every
/// version from this one to [`VERSION`].
pub const VERSION_MIN: u16 = 1;
/// The first version whose requests name a namespace, with the `NS_*`
/// opcodes.
pub const VERSION_NAMESPACES: u16 = 2;
/// The first version with GETS and DELETE_CAS (a key's CAS value over the
/// wire outside TXN).
pub const VERSION_CAS: u16 = 3;
/// Bytes of a GETS reply's [`ItemInfo`], before the value.
pub const ITEM_INFO_BYTES: usize = 16;
/// Bytes of DELETE_CAS's body before the key: the expected CAS value.
pub const DELETE_CAS_BYTES: usize = 8;
/// Bytes of the client's hello.
pub const CLIENT_HELLO_BYTES: usize = 16;
/// Longest token a client hello may carry ([`ClientHello::decode_with_token`]).
pub const HELLO_TOKEN_BYTES_MAX: usize = 1024;
/// The client hello's flag (byte 8) saying a token follows it.
pub const HELLO_FLAG_TOKEN: u8 = 1;
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
/// Longest namespace name a frame carries (the engine's limit,
/// `granary_store::namespace::NAMESPACE_NAME_MAX`).
pub const NAMESPACE_NAME_MAX: usize = 64;
/// Most namespaces a server holds besides the default one (the engine's
/// `NAMESPACES_MAX`): an NS_LIST response lists at most one more.
pub const NAMESPACES_MAX: usize = 4096;
/// The default namespace's name. A request naming no namespace (an empty
/// name) is in it too.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Most operations in one TXN (the engine's `BATCH_OPS_MAX`).
pub const TXN_OPS_MAX: usize = 1024;
/// Bytes of a TXN operation's fixed fields, before its namespace name, key
/// and value ([`TxnOp`]).
pub const TXN_OP_BYTES: usize = 20;

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
    /// Version 2 on: the namespace operations.
    NsCreate = 8,
    NsDrop = 9,
    NsTruncate = 10,
    NsList = 11,
    NsStats = 12,
    /// Version 2 on: an atomic transaction over keys of any namespaces.
    Txn = 13,
    /// Version 3 on: a GET whose reply carries the value's CAS value,
    /// flags and expiry ([`ItemInfo`]) before it.
    Gets = 14,
    /// Version 3 on: delete only if the value's CAS value is the one given.
    DeleteCas = 15,
}

impl Op {
    /// Every opcode, in numeric order.
    pub const ALL: [Op; 15] = [
        Op::Get,
        Op::Put,
        Op::Delete,
        Op::MultiGet,
        Op::Batch,
        Op::Nop,
        Op::Stats,
        Op::NsCreate,
        Op::NsDrop,
        Op::NsTruncate,
        Op::NsList,
        Op::NsStats,
        Op::Txn,
        Op::Gets,
        Op::DeleteCas,
    ];

    pub fn from_u8(b: u8) -> Result<Op, ProtoError> {
        Ok(match b {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::Delete,
            4 => Op::MultiGet,
            5 => Op::Batch,
            6 => Op::Nop,
            7 => Op::Stats,
            8 => Op::NsCreate,
            9 => Op::NsDrop,
            10 => Op::NsTruncate,
            11 => Op::NsList,
            12 => Op::NsStats,
            13 => Op::Txn,
            14 => Op::Gets,
            15 => Op::DeleteCas,
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
            Op::NsCreate => "NS_CREATE",
            Op::NsDrop => "NS_DROP",
            Op::NsTruncate => "NS_TRUNCATE",
            Op::NsList => "NS_LIST",
            Op::NsStats => "NS_STATS",
            Op::Txn => "TXN",
            Op::Gets => "GETS",
            Op::DeleteCas => "DELETE_CAS",
        }
    }
    /// The first protocol version with this opcode.
    pub fn since(self) -> u16 {
        if (self as u8) < Op::NsCreate as u8 {
            1
        } else if (self as u8) < Op::Gets as u8 {
            VERSION_NAMESPACES
        } else {
            VERSION_CAS
        }
    }
    /// Whether the frame's namespace may be named (every opcode but NOP,
    /// STATS, NS_LIST and TXN): the keys' namespace, or the one an `NS_*`
    /// operation acts on. A TXN's operations name their namespaces each.
    pub fn names_namespace(self) -> bool {
        !matches!(self, Op::Nop | Op::Stats | Op::NsList | Op::Txn)
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
    /// Version 2 on: the namespace named does not exist (or was dropped).
    NoSuchNamespace = 14,
    /// NS_CREATE of a namespace that exists.
    NamespaceExists = 15,
    /// A namespace name or option the server does not take (a bad name,
    /// a limit of 0, dropping the default namespace, too many namespaces).
    BadNamespace = 16,
    /// The write would take the namespace past its `max_bytes` or
    /// `max_keys`; nothing was written.
    QuotaExceeded = 17,
    /// A TXN the engine does not take (a key twice, records larger than a
    /// segment); nothing was applied.
    BadBatch = 18,
    /// Hello only: the server requires a token and the hello carried none,
    /// or another one (docs/SECURITY.md).
    Unauthorized = 19,
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
            14 => Status::NoSuchNamespace,
            15 => Status::NamespaceExists,
            16 => Status::BadNamespace,
            17 => Status::QuotaExceeded,
            18 => Status::BadBatch,
            19 => Status::Unauthorized,
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
            Status::NoSuchNamespace => "NO_SUCH_NAMESPACE",
            Status::NamespaceExists => "NAMESPACE_EXISTS",
            Status::BadNamespace => "BAD_NAMESPACE",
            Status::QuotaExceeded => "QUOTA_EXCEEDED",
            Status::BadBatch => "BAD_BATCH",
            Status::Unauthorized => "UNAUTHORIZED",
        }
    }
    /// The first protocol version with this status code (a server never
    /// sends a later one on an older connection).
    pub fn since(self) -> u16 {
        // UNAUTHORIZED is a hello's status, sent before any version is
        // chosen.
        if (self as u8) < Status::NoSuchNamespace as u8 || self == Status::Unauthorized {
            1
        } else {
            VERSION_NAMESPACES
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a namespace does when it, or the store, is full (NS_CREATE's flags
/// byte; the engine's `NamespaceMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(u8)]
pub enum NamespaceMode {
    /// Its values may be evicted (in a server that evicts).
    #[default]
    Cache = 0,
    /// Its values are never evicted; writes fail with `NO_SPACE` once the
    /// store is full.
    Store = 1,
}

impl NamespaceMode {
    pub fn from_u8(b: u8) -> Result<NamespaceMode, ProtoError> {
        Ok(match b {
            0 => NamespaceMode::Cache,
            1 => NamespaceMode::Store,
            _ => return err(format!("unknown namespace mode {b}")),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            NamespaceMode::Cache => "cache",
            NamespaceMode::Store => "store",
        }
    }
}

/// What a namespace's keys are (NS_CREATE's kind section, the namespace
/// record's kind byte; the engine's `NamespaceKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum NamespaceKind {
    /// A key space (kind 0).
    #[default]
    Kv,
    /// An export: a block device of `size_bytes` in blocks of
    /// `block_bytes`, block `n` under its 8-byte big-endian number (kind 1).
    Block { size_bytes: u64, block_bytes: u32 },
}

impl NamespaceKind {
    /// The kind byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            NamespaceKind::Kv => 0,
            NamespaceKind::Block { .. } => 1,
        }
    }
    /// `kv` or `block`.
    pub fn name(self) -> &'static str {
        match self {
            NamespaceKind::Kv => "kv",
            NamespaceKind::Block { .. } => "block",
        }
    }
}

/// A namespace's options (NS_CREATE's body; the engine's
/// `NamespaceOptions`). A limit is at least 1: on the wire 0 means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct NamespaceOptions {
    pub mode: NamespaceMode,
    /// Seconds a value written with no expiry time lives (0: for ever).
    pub default_ttl_secs: u32,
    /// Most bytes of values (whole records) it holds.
    pub max_bytes: Option<NonZeroU64>,
    /// Most values it holds.
    pub max_keys: Option<NonZeroU64>,
    /// A key space or an export. Sent only when not `Kv` (NS_CREATE's
    /// optional kind section), so a `Kv` NS_CREATE is the frame a server
    /// that predates kinds takes.
    pub kind: NamespaceKind,
}

impl NamespaceOptions {
    /// An export's options: mode `store`, no limit, no default TTL (what
    /// the server requires of one).
    pub fn export(size_bytes: u64, block_bytes: u32) -> NamespaceOptions {
        NamespaceOptions {
            mode: NamespaceMode::Store,
            kind: NamespaceKind::Block { size_bytes, block_bytes },
            ..Default::default()
        }
    }
}

/// A namespace's options and figures: NS_STATS's body, and each entry of
/// NS_LIST's (the engine's `NamespaceStats`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceStats {
    pub name: String,
    /// Its id on that server (a truncate gives it a new one).
    pub id: u32,
    pub options: NamespaceOptions,
    /// Values it holds, and their records' bytes.
    pub keys: u64,
    pub value_bytes: u64,
    /// Since the server's store was opened.
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub sets: u64,
    pub deletes: u64,
    pub evictions: u64,
    pub expirations: u64,
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
    /// Every version this build speaks.
    fn default() -> Self {
        ClientHello { min_version: VERSION_MIN, max_version: VERSION }
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
    /// The hello announcing a token of `token_len` bytes (1 to
    /// [`HELLO_TOKEN_BYTES_MAX`]), sent right after it: flag
    /// [`HELLO_FLAG_TOKEN`] in byte 8, the length (u16) at bytes 10..12.
    pub fn encode_with_token(&self, token_len: usize) -> [u8; CLIENT_HELLO_BYTES] {
        assert!((1..=HELLO_TOKEN_BYTES_MAX).contains(&token_len), "a hello token is 1 to 1024 bytes");
        let mut b = self.encode();
        b[8] = HELLO_FLAG_TOKEN;
        b[10..12].copy_from_slice(&(token_len as u16).to_le_bytes());
        b
    }
    /// A hello without a token ([`ClientHello::decode_with_token`] reads
    /// one with).
    pub fn decode(b: &[u8; CLIENT_HELLO_BYTES]) -> Result<ClientHello, ProtoError> {
        match ClientHello::decode_with_token(b)? {
            (h, 0) => Ok(h),
            _ => err("client hello: a token where none is expected"),
        }
    }
    /// A hello and the length of the token that follows it (0: none).
    pub fn decode_with_token(b: &[u8; CLIENT_HELLO_BYTES]) -> Result<(ClientHello, usize), ProtoError> {
        if b[0..4] != MAGIC {
            return err("not a Granary native protocol client (bad magic)");
        }
        let token = b[8] == HELLO_FLAG_TOKEN;
        let token_len = get_u16(b, 10) as usize;
        if (b[8] != 0 && !token) || b[9] != 0 || b[12..].iter().any(|&x| x != 0) || (!token && token_len != 0) {
            return err("client hello: reserved bytes are not zero");
        }
        if token && !(1..=HELLO_TOKEN_BYTES_MAX).contains(&token_len) {
            return err(format!("client hello: token of {token_len} bytes (1 to {HELLO_TOKEN_BYTES_MAX})"));
        }
        let h = ClientHello { min_version: get_u16(b, 4), max_version: get_u16(b, 6) };
        if h.min_version == 0 || h.min_version > h.max_version {
            return err(format!("client hello: bad version range {}..={}", h.min_version, h.max_version));
        }
        Ok((h, token_len))
    }
    /// The highest version both sides speak, if any (this build speaks
    /// [`VERSION_MIN`]..=[`VERSION`]).
    pub fn agree(&self) -> Option<u16> {
        let v = self.max_version.min(VERSION);
        (v >= self.min_version.max(VERSION_MIN)).then_some(v)
    }
}

/// The server's hello: the version chosen (or why none) and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerHello {
    pub version: u16,
    /// `Ok`, `UnsupportedVersion`, `Busy` or `Unauthorized`; the server
    /// closes unless `Ok`.
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
        let h = ServerHello {
            version: get_u16(b, 4),
            status: Status::from_u8(b[6])?,
            key_bytes_max: get_u32(b, 8),
            value_bytes_max: get_u32(b, 12),
            frame_bytes_max: get_u32(b, 16),
        };
        // Limits no server of this protocol announces are refused: a
        // client sizes its buffers by them (a response's body is reserved
        // from its header, up to the frame limit).
        if h.key_bytes_max as usize > KEY_BYTES_MAX
            || h.value_bytes_max > VALUE_BYTES_LIMIT
            || !(FRAME_BYTES_FLOOR..=frame_bytes_max(VALUE_BYTES_LIMIT)).contains(&h.frame_bytes_max)
        {
            return err("server hello: limits out of range");
        }
        Ok(h)
    }
}

// ---------------------------------------------------------------- header

/// The 16-byte header before every frame body.
///
/// ```text
/// 0  u32 len     body bytes after the header (the namespace name included)
/// 4  u8  op      opcode (responses echo the request's)
/// 5  u8  flags   request: PUT mode, NS_CREATE namespace mode (0 otherwise);
///                response: status
/// 6  u8  ns_len  request, version 2: bytes of the namespace name that
///                starts the body (0: the default namespace); otherwise 0
/// 7  u8  0       reserved
/// 8  u64 id      chosen by the client, echoed by the response
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub op: Op,
    pub flags: u8,
    /// Bytes of the namespace name at the start of the body (version 2
    /// requests; 0 in version 1 and in responses).
    pub ns_len: u8,
    pub id: u64,
}

impl Header {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.len);
        out.push(self.op as u8);
        out.push(self.flags);
        out.push(self.ns_len);
        out.push(0);
        out.extend_from_slice(&self.id.to_le_bytes());
    }
    /// Decode a request header of protocol `version` and check it against
    /// the largest body accepted: the length first, then the reserved byte,
    /// the opcode (one of `version`) and the namespace name's length (0
    /// before version 2, at most [`NAMESPACE_NAME_MAX`]). The id of a
    /// header with a bad opcode is still wanted for the error reply: see
    /// [`Header::peek_id`].
    pub fn decode(b: &[u8], frame_max: u32, version: u16) -> Result<Header, ProtoError> {
        if b.len() < HEADER_BYTES {
            return err("truncated frame header");
        }
        let len = get_u32(b, 0);
        if len > frame_max {
            return err(format!("frame body of {len} bytes exceeds the limit of {frame_max}"));
        }
        let ns_len = b[6];
        if b[7] != 0 || (ns_len != 0 && version < VERSION_NAMESPACES) {
            return err("frame header: reserved bytes are not zero");
        }
        let op = Op::from_u8(b[4])?;
        if op.since() > version {
            return err(format!("opcode {} ({}) needs protocol version {}", op as u8, op.name(), op.since()));
        }
        if ns_len as usize > NAMESPACE_NAME_MAX {
            return err(format!("namespace name of {ns_len} bytes exceeds {NAMESPACE_NAME_MAX}"));
        }
        Ok(Header { len, op, flags: b[5], ns_len, id: get_u64(b, 8) })
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

/// What one operation of a TXN writes, and its condition (checked at
/// commit, with every other operation's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnWrite<'a> {
    /// Insert or overwrite (kind 1).
    Put(&'a [u8]),
    /// Only if the key holds no value; else the TXN fails `EXISTS` (kind 2).
    PutAbsent(&'a [u8]),
    /// Only if the key holds a value; else the TXN fails `NOT_FOUND` (kind 3).
    PutPresent(&'a [u8]),
    /// Only if the key holds a value whose CAS value is `cas`; else the TXN
    /// fails `NOT_FOUND` (no value) or `EXISTS` (another CAS value) (kind 4).
    Cas { cas: u64, value: &'a [u8] },
    /// Delete; no condition (nothing to do if the key holds nothing) (kind 5).
    Delete,
    /// Delete only if the key holds a value whose CAS value is `cas`; else
    /// the TXN fails `NOT_FOUND` (no value) or `EXISTS` (another CAS
    /// value) (kind 6, protocol version 3: [`VERSION_CAS`]).
    DeleteCas(u64),
}

impl<'a> TxnWrite<'a> {
    /// The operation's kind byte on the wire.
    pub fn kind(&self) -> u8 {
        match self {
            TxnWrite::Put(_) => 1,
            TxnWrite::PutAbsent(_) => 2,
            TxnWrite::PutPresent(_) => 3,
            TxnWrite::Cas { .. } => 4,
            TxnWrite::Delete => 5,
            TxnWrite::DeleteCas(_) => 6,
        }
    }
    /// The first protocol version with this kind.
    pub fn since(&self) -> u16 {
        match self {
            TxnWrite::DeleteCas(_) => VERSION_CAS,
            _ => VERSION_NAMESPACES,
        }
    }
    /// The value written (empty for a delete).
    pub fn value(&self) -> &'a [u8] {
        match self {
            TxnWrite::Put(v) | TxnWrite::PutAbsent(v) | TxnWrite::PutPresent(v) | TxnWrite::Cas { value: v, .. } => v,
            TxnWrite::Delete | TxnWrite::DeleteCas(_) => &[],
        }
    }
    /// The expected CAS value (0 unless `Cas` or `DeleteCas`).
    pub fn cas(&self) -> u64 {
        match self {
            TxnWrite::Cas { cas, .. } | TxnWrite::DeleteCas(cas) => *cas,
            _ => 0,
        }
    }
    /// `put`, `put_absent`, `put_present`, `cas`, `delete` or `delete_cas`.
    pub fn name(&self) -> &'static str {
        match self {
            TxnWrite::Put(_) => "put",
            TxnWrite::PutAbsent(_) => "put_absent",
            TxnWrite::PutPresent(_) => "put_present",
            TxnWrite::Cas { .. } => "cas",
            TxnWrite::Delete => "delete",
            TxnWrite::DeleteCas(_) => "delete_cas",
        }
    }
}

/// One operation of a TXN: the namespace its key is in (empty, or
/// `"default"`: the default namespace), the key, and what it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnOp<'a> {
    pub ns: &'a [u8],
    pub key: &'a [u8],
    pub write: TxnWrite<'a>,
}

impl<'a> TxnOp<'a> {
    /// Insert or overwrite `key` of namespace `ns`.
    pub fn put(ns: &'a str, key: &'a [u8], value: &'a [u8]) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::Put(value) }
    }
    /// Write `key` only if it holds no value.
    pub fn put_absent(ns: &'a str, key: &'a [u8], value: &'a [u8]) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::PutAbsent(value) }
    }
    /// Write `key` only if it holds a value.
    pub fn put_present(ns: &'a str, key: &'a [u8], value: &'a [u8]) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::PutPresent(value) }
    }
    /// Write `key` only if it holds a value whose CAS value is `cas`.
    pub fn cas(ns: &'a str, key: &'a [u8], cas: u64, value: &'a [u8]) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::Cas { cas, value } }
    }
    /// Delete `key`.
    pub fn delete(ns: &'a str, key: &'a [u8]) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::Delete }
    }
    /// Delete `key` only if it holds a value whose CAS value is `cas`
    /// (protocol version 3).
    pub fn delete_cas(ns: &'a str, key: &'a [u8], cas: u64) -> TxnOp<'a> {
        TxnOp { ns: ns.as_bytes(), key, write: TxnWrite::DeleteCas(cas) }
    }
    /// Bytes of the operation in a TXN body.
    pub fn encoded_len(&self) -> usize {
        TXN_OP_BYTES + self.ns.len() + self.key.len() + self.write.value().len()
    }
}

/// A request, borrowing its keys and values from the frame. Its namespace
/// is the frame's ([`Request::encode_in`], [`Request::decode`]): where a key
/// request's keys are, or the namespace an `NS_*` request acts on.
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
    /// Version 2: create the frame's namespace with these options.
    NsCreate(NamespaceOptions),
    /// Version 2: drop the frame's namespace (its keys are gone at once).
    NsDrop,
    /// Version 2: empty the frame's namespace, keeping it and its options.
    NsTruncate,
    /// Version 2: every namespace with its figures.
    NsList,
    /// Version 2: the frame's namespace's options and figures.
    NsStats,
    /// Version 2: operations over keys of any namespaces (each names its
    /// own; the frame names none), committed atomically: all or none.
    Txn(Vec<TxnOp<'a>>),
    /// Version 3: the key's value with its [`ItemInfo`] (the reply's body:
    /// the info, then the value).
    Gets(&'a [u8]),
    /// Version 3: delete the key only if its value's CAS value is `cas`
    /// (`EXISTS`: another CAS value; `NOT_FOUND`: no value).
    DeleteCas {
        key: &'a [u8],
        cas: u64,
    },
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
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(get_u64(self.bytes(8)?, 0))
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
        self.count_max(min_entry, MULTI_OPS_MAX)
    }
    fn count_max(&mut self, min_entry: usize, max: usize) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > max {
            return err(format!("{}: {n} entries exceed the limit of {max}", self.what));
        }
        if n.saturating_mul(min_entry) > self.b.len() - self.at {
            return err(format!("{}: {n} entries overrun the frame", self.what));
        }
        Ok(n)
    }
}

/// Bytes of NS_CREATE's body after the name: default_ttl_secs u32,
/// max_bytes u64, max_keys u64; then, optionally, the kind section.
const NS_CREATE_BYTES: usize = 20;
/// Bytes of NS_CREATE's optional kind section: kind u8, 3 reserved bytes
/// (0), block_bytes u32, size_bytes u64 (both 0 for kind 0). Absent: kind 0
/// (`Kv`), the body of servers and clients that predate kinds.
pub const NS_CREATE_KIND_BYTES: usize = 16;
/// Bytes of a namespace record's export section (kind 1 only), between
/// its fixed fields and its name: size_bytes u64, block_bytes u32, 4
/// reserved bytes (0).
pub const NAMESPACE_EXPORT_BYTES: usize = 16;

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
            Request::NsCreate(_) => Op::NsCreate,
            Request::NsDrop => Op::NsDrop,
            Request::NsTruncate => Op::NsTruncate,
            Request::NsList => Op::NsList,
            Request::NsStats => Op::NsStats,
            Request::Txn(_) => Op::Txn,
            Request::Gets(_) => Op::Gets,
            Request::DeleteCas { .. } => Op::DeleteCas,
        }
    }

    /// The first protocol version with this request: its opcode's, or a
    /// later one for a TXN with an operation of a later kind (delete_cas).
    pub fn since(&self) -> u16 {
        match self {
            Request::Txn(ops) => ops.iter().map(|o| o.write.since()).fold(self.op().since(), u16::max),
            _ => self.op().since(),
        }
    }

    /// Whether a connection of protocol `version` carries this request:
    /// an error naming what needs a later version (the opcode, or a TXN
    /// operation's kind) if not. [`Header::decode`] checks the opcode; a
    /// server checks the rest with this once the body is decoded, and a
    /// client before sending.
    pub fn check_version(&self, version: u16) -> Result<(), ProtoError> {
        let op = self.op();
        if op.since() > version {
            return err(format!("opcode {} ({}) needs protocol version {}", op as u8, op.name(), op.since()));
        }
        if let Request::Txn(ops) = self {
            if let Some((i, w)) = ops.iter().map(|o| o.write).enumerate().find(|(_, w)| w.since() > version) {
                return err(format!(
                    "TXN: operation {i}: kind {} ({}) needs protocol version {}",
                    w.kind(),
                    w.name(),
                    w.since()
                ));
            }
        }
        Ok(())
    }

    /// Bytes of the body [`Request::encode`] writes (with
    /// [`Request::encode_in`], the namespace name's bytes come on top).
    pub fn body_len(&self) -> usize {
        match self {
            Request::Get(k) | Request::Delete(k) | Request::Gets(k) => k.len(),
            Request::DeleteCas { key, .. } => DELETE_CAS_BYTES + key.len(),
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
            Request::NsCreate(o) => match o.kind {
                NamespaceKind::Kv => NS_CREATE_BYTES,
                NamespaceKind::Block { .. } => NS_CREATE_BYTES + NS_CREATE_KIND_BYTES,
            },
            Request::Txn(ops) => 4 + ops.iter().map(TxnOp::encoded_len).sum::<usize>(),
            Request::Nop
            | Request::Stats
            | Request::NsDrop
            | Request::NsTruncate
            | Request::NsList
            | Request::NsStats => 0,
        }
    }

    /// Append the frame (header and body) with this id, in the default
    /// namespace (a version 1 frame, for a version 1 opcode). Lengths must
    /// fit the protocol's limits (the client checks them first).
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        self.encode_in(b"", id, out)
    }

    /// Append the frame naming namespace `ns` (version 2; empty: the
    /// default namespace): the header's `ns_len`, then the name, then the
    /// body. `ns` is at most [`NAMESPACE_NAME_MAX`] bytes, and empty for
    /// the opcodes that name none ([`Op::names_namespace`]).
    pub fn encode_in(&self, ns: &[u8], id: u64, out: &mut Vec<u8>) {
        let flags = match self {
            Request::Put { mode, .. } => *mode as u8,
            Request::NsCreate(o) => o.mode as u8,
            _ => 0,
        };
        assert!(ns.len() <= NAMESPACE_NAME_MAX, "namespace name of {} bytes", ns.len());
        let len = len32(ns.len() + self.body_len());
        Header { len, op: self.op(), flags, ns_len: ns.len() as u8, id }.encode(out);
        out.extend_from_slice(ns);
        match self {
            Request::Get(k) | Request::Delete(k) | Request::Gets(k) => out.extend_from_slice(k),
            Request::DeleteCas { key, cas } => {
                out.extend_from_slice(&cas.to_le_bytes());
                out.extend_from_slice(key);
            }
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
            Request::NsCreate(o) => {
                put_u32(out, o.default_ttl_secs);
                out.extend_from_slice(&o.max_bytes.map_or(0, NonZeroU64::get).to_le_bytes());
                out.extend_from_slice(&o.max_keys.map_or(0, NonZeroU64::get).to_le_bytes());
                if let NamespaceKind::Block { size_bytes, block_bytes } = o.kind {
                    out.extend_from_slice(&[o.kind.code(), 0, 0, 0]);
                    put_u32(out, block_bytes);
                    out.extend_from_slice(&size_bytes.to_le_bytes());
                }
            }
            Request::Txn(ops) => {
                put_u32(out, len32(ops.len()));
                for o in ops {
                    assert!(o.ns.len() <= NAMESPACE_NAME_MAX, "namespace name of {} bytes", o.ns.len());
                    let value = o.write.value();
                    out.push(o.write.kind());
                    out.push(o.ns.len() as u8);
                    put_u16(out, 0);
                    put_u32(out, len32(o.key.len()));
                    put_u32(out, len32(value.len()));
                    out.extend_from_slice(&o.write.cas().to_le_bytes());
                    out.extend_from_slice(o.ns);
                    out.extend_from_slice(o.key);
                    out.extend_from_slice(value);
                }
            }
            Request::Nop
            | Request::Stats
            | Request::NsDrop
            | Request::NsTruncate
            | Request::NsList
            | Request::NsStats => {}
        }
    }

    /// Decode a request body under its (already checked) header: the
    /// namespace it names (empty: the default one) and the request.
    pub fn decode(h: &Header, body: &'a [u8]) -> Result<(&'a [u8], Request<'a>), ProtoError> {
        if body.len() != h.len as usize {
            return err("body length differs from the header's");
        }
        let what = h.op.name();
        if !matches!(h.op, Op::Put | Op::NsCreate) && h.flags != 0 {
            return err(format!("{what}: flags must be zero"));
        }
        let nl = h.ns_len as usize;
        if nl != 0 && !h.op.names_namespace() {
            return err(format!("{what}: names no namespace"));
        }
        if nl > body.len() {
            return err(format!("{what}: namespace name of {nl} bytes overruns the frame"));
        }
        let (ns, body) = body.split_at(nl);
        let mut r = Rd { b: body, at: 0, what };
        let req = match h.op {
            Op::Get => Request::Get(r.rest()),
            Op::Delete => Request::Delete(r.rest()),
            Op::Gets => Request::Gets(r.rest()),
            Op::DeleteCas => {
                let cas = r.u64()?;
                Request::DeleteCas { key: r.rest(), cas }
            }
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
            Op::NsCreate => {
                let mode = NamespaceMode::from_u8(h.flags)?;
                let default_ttl_secs = r.u32()?;
                let max_bytes = NonZeroU64::new(r.u64()?);
                let max_keys = NonZeroU64::new(r.u64()?);
                let kind = if r.at == r.b.len() { NamespaceKind::Kv } else { decode_kind_section(&mut r)? };
                Request::NsCreate(NamespaceOptions { mode, default_ttl_secs, max_bytes, max_keys, kind })
            }
            Op::Nop => Request::Nop,
            Op::Stats => Request::Stats,
            Op::NsDrop => Request::NsDrop,
            Op::NsTruncate => Request::NsTruncate,
            Op::NsList => Request::NsList,
            Op::NsStats => Request::NsStats,
            Op::Txn => {
                let n = r.count_max(TXN_OP_BYTES, TXN_OPS_MAX)?;
                let mut ops = Vec::with_capacity(n);
                for i in 0..n {
                    ops.push(decode_txn_op(&mut r, i)?);
                }
                Request::Txn(ops)
            }
        };
        r.end()?;
        match &req {
            Request::Get(k)
            | Request::Delete(k)
            | Request::Gets(k)
            | Request::DeleteCas { key: k, .. }
            | Request::Put { key: k, .. } => check_key(k, what)?,
            Request::MultiGet(keys) => keys.iter().try_for_each(|k| check_key(k, "MGET"))?,
            Request::Batch(ops) => ops.iter().try_for_each(|o| check_key(o.key(), "BATCH"))?,
            Request::Txn(ops) => ops.iter().try_for_each(|o| check_key(o.key, "TXN"))?,
            _ => {}
        }
        Ok((ns, req))
    }
}

/// NS_CREATE's kind section ([`NS_CREATE_KIND_BYTES`]). Kind 0 carries
/// zeros; an unknown kind is malformed (never taken for another). Whether
/// the geometry is one the server takes is the engine's to say
/// (`BAD_NAMESPACE`).
fn decode_kind_section(r: &mut Rd) -> Result<NamespaceKind, ProtoError> {
    let kind = r.u8()?;
    if r.bytes(3)? != [0, 0, 0] {
        return err("NS_CREATE: reserved bytes are not zero");
    }
    let block_bytes = r.u32()?;
    let size_bytes = r.u64()?;
    match kind {
        0 if block_bytes == 0 && size_bytes == 0 => Ok(NamespaceKind::Kv),
        0 => err("NS_CREATE: a size or block size for kind 0 (kv)"),
        1 => Ok(NamespaceKind::Block { size_bytes, block_bytes }),
        k => err(format!("NS_CREATE: unknown namespace kind {k}")),
    }
}

/// One TXN operation (the `i`th):
///
/// ```text
/// 0   u8  kind       1 put, 2 put_absent, 3 put_present, 4 cas, 5 delete,
///                    6 delete_cas (version 3: [`Request::since`])
/// 1   u8  ns_len     0..=64 (0: the default namespace)
/// 2   u16 0          reserved
/// 4   u32 key_len
/// 8   u32 value_len  0 for a delete or delete_cas
/// 12  u64 cas        the expected CAS value of a cas or delete_cas; 0 for
///                    the others
/// 20  ns_len bytes of namespace name, key_len of key, value_len of value
/// ```
fn decode_txn_op<'a>(r: &mut Rd<'a>, i: usize) -> Result<TxnOp<'a>, ProtoError> {
    let kind = r.u8()?;
    let nl = r.u8()? as usize;
    if r.u16()? != 0 {
        return err(format!("TXN: operation {i}: reserved bytes are not zero"));
    }
    let kl = r.u32()? as usize;
    let vl = r.u32()? as usize;
    let cas = r.u64()?;
    if nl > NAMESPACE_NAME_MAX {
        return err(format!("TXN: operation {i}: namespace name of {nl} bytes exceeds {NAMESPACE_NAME_MAX}"));
    }
    let ns = r.bytes(nl)?;
    let key = r.bytes(kl)?;
    let value = r.bytes(vl)?;
    let write = match kind {
        1 => TxnWrite::Put(value),
        2 => TxnWrite::PutAbsent(value),
        3 => TxnWrite::PutPresent(value),
        4 => TxnWrite::Cas { cas, value },
        5 if vl != 0 => return err(format!("TXN: operation {i}: a delete with a value")),
        5 => TxnWrite::Delete,
        6 if vl != 0 => return err(format!("TXN: operation {i}: a delete_cas with a value")),
        6 => TxnWrite::DeleteCas(cas),
        _ => return err(format!("TXN: operation {i}: unknown kind {kind}")),
    };
    if !matches!(kind, 4 | 6) && cas != 0 {
        return err(format!("TXN: operation {i}: a CAS value on a {}", write.name()));
    }
    Ok(TxnOp { ns, key, write })
}

// ---------------------------------------------------------------- responses

/// Append a response frame: header, then `body`.
pub fn encode_response(out: &mut Vec<u8>, op: Op, status: Status, id: u64, body: &[u8]) {
    Header { len: len32(body.len()), op, flags: status as u8, ns_len: 0, id }.encode(out);
    out.extend_from_slice(body);
}

/// Append a response header whose body (of `len` bytes) the caller writes next.
pub fn encode_response_header(out: &mut Vec<u8>, op: Op, status: Status, id: u64, len: usize) {
    Header { len: len32(len), op, flags: status as u8, ns_len: 0, id }.encode(out);
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

/// What a TXN did: the response's status says which (`OK`, or `EXISTS` /
/// `NOT_FOUND` for a failed condition) and its body the details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every operation applied, durably; each one's new CAS value, in
    /// request order (0 for a delete). Status `OK`; body `count u32`, then
    /// `count` u64s.
    Committed { cas: Vec<u64> },
    /// Operation `op`'s condition failed (`status`: `EXISTS`, the key holds
    /// a value or, for a cas, another CAS value; `NOT_FOUND`, it holds
    /// none); nothing applied. Body `op u32`.
    ConditionFailed { op: usize, status: Status },
}

impl TxnOutcome {
    /// Append the response body; the status the response carries.
    pub fn encode(&self, out: &mut Vec<u8>) -> Status {
        match self {
            TxnOutcome::Committed { cas } => {
                put_u32(out, len32(cas.len()));
                for c in cas {
                    out.extend_from_slice(&c.to_le_bytes());
                }
                Status::Ok
            }
            TxnOutcome::ConditionFailed { op, status } => {
                put_u32(out, len32(*op));
                *status
            }
        }
    }

    /// Decode the body of a TXN response of status `status` (`OK`,
    /// `EXISTS` or `NOT_FOUND`; the error statuses carry a message).
    pub fn decode(status: Status, body: &[u8]) -> Result<TxnOutcome, ProtoError> {
        let mut r = Rd { b: body, at: 0, what: "TXN response" };
        let o = match status {
            Status::Ok => {
                let n = r.count_max(8, TXN_OPS_MAX)?;
                let mut cas = Vec::with_capacity(n);
                for _ in 0..n {
                    cas.push(r.u64()?);
                }
                TxnOutcome::Committed { cas }
            }
            Status::Exists | Status::NotFound => {
                let op = r.u32()? as usize;
                if op >= TXN_OPS_MAX {
                    return err(format!("TXN response: operation {op} of at most {TXN_OPS_MAX}"));
                }
                TxnOutcome::ConditionFailed { op, status }
            }
            s => return err(format!("TXN response: status {s} carries no outcome")),
        };
        r.end()?;
        Ok(o)
    }
}

/// A value's CAS value and metadata: what a GETS reply carries before the
/// value (status `OK`; `NOT_FOUND` carries nothing).
///
/// ```text
/// 0   u64 cas       the value's CAS value (unique in the store, new at
///                   every write of the key)
/// 8   u32 flags     the Memcache flags stored with it (0 from a native PUT)
/// 12  u32 expires   Unix seconds from which it reads as absent; 0: never
/// 16  the value (the rest of the body)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ItemInfo {
    pub cas: u64,
    pub flags: u32,
    pub expires: u32,
}

impl ItemInfo {
    /// Append the info (the value follows it in the body).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.cas.to_le_bytes());
        put_u32(out, self.flags);
        put_u32(out, self.expires);
    }

    /// Decode the body of a GETS reply of status `OK`: the info and the
    /// value.
    pub fn decode_reply(body: &[u8]) -> Result<(ItemInfo, &[u8]), ProtoError> {
        let mut r = Rd { b: body, at: 0, what: "GETS response" };
        let cas = r.u64()?;
        let flags = r.u32()?;
        let expires = r.u32()?;
        Ok((ItemInfo { cas, flags, expires }, r.rest()))
    }
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
    /// Decode a response header (the body follows separately). A response
    /// names no namespace: its byte 6 is reserved, 0.
    pub fn decode_header(b: &[u8], frame_max: u32) -> Result<(Header, Status), ProtoError> {
        let h = Header::decode(b, frame_max, VERSION)?;
        if h.ns_len != 0 {
            return err("response header: reserved bytes are not zero");
        }
        let s = Status::from_u8(h.flags)?;
        Ok((h, s))
    }
}

/// Bytes of a [`NamespaceStats`] record before its name.
pub const NAMESPACE_STATS_BYTES: usize = 100;

/// Append one namespace's record (NS_STATS's whole body; one entry of
/// NS_LIST's):
///
/// ```text
/// 0   u8  name_len (1..=64)     1  u8  mode (0 cache, 1 store)
/// 2   u8  kind (0 kv, 1 block)  3  u8  0 (reserved)
/// 4   u32 id
/// 8   u32 default_ttl_secs
/// 12  u64 max_bytes (0: none)   20  u64 max_keys (0: none)
/// 28  u64 keys                  36  u64 value_bytes
/// 44  u64 gets                  52  u64 hits
/// 60  u64 misses                68  u64 sets
/// 76  u64 deletes               84  u64 evictions
/// 92  u64 expirations
/// 100 kind 1 only: u64 size_bytes, u32 block_bytes, u32 0 (reserved)
/// 100 (kind 0) or 116 (kind 1): name
/// ```
///
/// A kind 0 record is the record of servers that predate kinds (byte 2
/// was reserved, 0); a decoder that predates them refuses a kind 1 record
/// (reserved bytes not zero) rather than misread it.
pub fn encode_namespace_stats(out: &mut Vec<u8>, s: &NamespaceStats) {
    let name = &s.name.as_bytes()[..s.name.len().min(NAMESPACE_NAME_MAX)];
    out.push(name.len() as u8);
    out.push(s.options.mode as u8);
    out.push(s.options.kind.code());
    out.push(0);
    put_u32(out, s.id);
    put_u32(out, s.options.default_ttl_secs);
    let limit = |l: Option<NonZeroU64>| l.map_or(0, NonZeroU64::get);
    for v in [
        limit(s.options.max_bytes),
        limit(s.options.max_keys),
        s.keys,
        s.value_bytes,
        s.gets,
        s.hits,
        s.misses,
        s.sets,
        s.deletes,
        s.evictions,
        s.expirations,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    if let NamespaceKind::Block { size_bytes, block_bytes } = s.options.kind {
        out.extend_from_slice(&size_bytes.to_le_bytes());
        put_u32(out, block_bytes);
        put_u32(out, 0);
    }
    out.extend_from_slice(name);
}

fn decode_namespace_record(r: &mut Rd) -> Result<NamespaceStats, ProtoError> {
    let what = r.what;
    let name_len = r.u8()? as usize;
    if name_len == 0 || name_len > NAMESPACE_NAME_MAX {
        return err(format!("{what}: a namespace name of {name_len} bytes"));
    }
    let mode = NamespaceMode::from_u8(r.u8()?)?;
    let kind = r.u8()?;
    if r.u8()? != 0 {
        return err(format!("{what}: reserved bytes are not zero"));
    }
    let id = r.u32()?;
    let default_ttl_secs = r.u32()?;
    let max_bytes = NonZeroU64::new(r.u64()?);
    let max_keys = NonZeroU64::new(r.u64()?);
    let mut n = [0u64; 9];
    for x in &mut n {
        *x = r.u64()?;
    }
    let kind = match kind {
        0 => NamespaceKind::Kv,
        1 => {
            let size_bytes = r.u64()?;
            let block_bytes = r.u32()?;
            if r.u32()? != 0 {
                return err(format!("{what}: reserved bytes are not zero"));
            }
            NamespaceKind::Block { size_bytes, block_bytes }
        }
        k => return err(format!("{what}: unknown namespace kind {k}")),
    };
    let name = String::from_utf8(r.bytes(name_len)?.to_vec())
        .map_err(|_| ProtoError(format!("{what}: a namespace name that is not UTF-8")))?;
    let [keys, value_bytes, gets, hits, misses, sets, deletes, evictions, expirations] = n;
    Ok(NamespaceStats {
        name,
        id,
        options: NamespaceOptions { mode, default_ttl_secs, max_bytes, max_keys, kind },
        keys,
        value_bytes,
        gets,
        hits,
        misses,
        sets,
        deletes,
        evictions,
        expirations,
    })
}

/// Decode an NS_STATS response body: one record
/// ([`encode_namespace_stats`]).
pub fn decode_namespace_stats(body: &[u8]) -> Result<NamespaceStats, ProtoError> {
    let mut r = Rd { b: body, at: 0, what: "NS_STATS" };
    let s = decode_namespace_record(&mut r)?;
    r.end()?;
    Ok(s)
}

/// Append an NS_LIST response body: `count u32`, then the records.
pub fn encode_namespace_list(out: &mut Vec<u8>, list: &[NamespaceStats]) {
    put_u32(out, len32(list.len()));
    for s in list {
        encode_namespace_stats(out, s);
    }
}

/// Decode an NS_LIST response body (at most [`NAMESPACES_MAX`] + 1
/// records: the default namespace and the others).
pub fn decode_namespace_list(body: &[u8]) -> Result<Vec<NamespaceStats>, ProtoError> {
    let mut r = Rd { b: body, at: 0, what: "NS_LIST" };
    let n = r.count_max(NAMESPACE_STATS_BYTES + 1, NAMESPACES_MAX + 1)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(decode_namespace_record(&mut r)?);
    }
    r.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests;
