//! The engine's error type: what happened and what to do about it.

use granary_format::FormatError;
use granary_index::IndexError;
use std::fmt;
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The device failed an operation.
    Io { op: &'static str, offset: u64, source: io::Error },
    /// The device could not be opened or created.
    Device(io::Error),
    /// The device does not hold a Granary store, or one this build cannot read.
    NotAStore(FormatError),
    /// Options or device geometry make no sense.
    InvalidOptions(String),
    /// The key is empty or longer than the limit.
    KeyLength { len: usize, min: usize, max: usize },
    /// The key starts with [`crate::RESERVED_KEY_PREFIX`], the engine's own namespace.
    ReservedKey,
    /// The value is longer than this store can hold in one record.
    ValueTooLarge { len: u64, max: u64 },
    /// No free segment is left for new records.
    NoSpace { needed_bytes: u64, segments: u64 },
    /// The index cannot take another key.
    IndexFull(IndexError),
    /// Data read back from the device failed its checks.
    Corruption { offset: u64, detail: String },
    /// An earlier write or flush failed; the store refuses writes until reopened.
    Poisoned { cause: String },
    /// No namespace of this name (never created, or dropped).
    NoSuchNamespace { name: String },
    /// A namespace of this name exists already.
    NamespaceExists { name: String },
    /// A namespace name or option this store does not take.
    BadNamespace { name: String, why: String },
    /// A write would take the namespace past its quota; nothing was written.
    QuotaExceeded { name: String, what: &'static str, limit: u64 },
    /// The store was closed; a handle that outlived it refuses calls.
    Closed,
    /// An atomic batch this store does not take (too many operations, too
    /// large, a key twice); nothing was applied.
    BadBatch(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, offset, source } => write!(f, "device {op} failed at offset {offset}: {source}"),
            Error::Device(e) => write!(f, "{e}"),
            Error::ReservedKey => write!(f, "keys starting with {:?} are reserved for the engine", "\\0granary."),
            Error::NotAStore(e @ FormatError::BadMagic { found: 0, .. }) => write!(
                f,
                "not a usable Granary store: {e}; the superblock is zeros: a device never \
                 formatted, or a file whose creation was killed before the store was written \
                 (if so, remove it and create it again)"
            ),
            Error::NotAStore(e @ FormatError::BadMagic { found, .. })
                if *found == u64::from_le_bytes(granary_io::file::UNFINISHED_MAGIC) =>
            {
                write!(
                    f,
                    "not a usable Granary store: {e}; its creation was interrupted before the store \
                     was written, so it holds nothing: remove it and create it again (`granary serve` \
                     and `granary create --if-absent` do so themselves)"
                )
            }
            Error::NotAStore(e) => write!(f, "not a usable Granary store: {e}"),
            Error::InvalidOptions(s) => write!(f, "invalid options: {s}"),
            Error::KeyLength { len, min, max } => {
                write!(f, "key of {len} bytes rejected: keys must be {min} to {max} bytes")
            }
            Error::ValueTooLarge { len, max } => write!(
                f,
                "value of {len} bytes rejected: this store holds values up to {max} bytes \
                 (a record must fit in one segment; use larger segments for larger values)"
            ),
            Error::NoSpace { needed_bytes, segments } => write!(
                f,
                "no space: all {segments} segments are in use and {needed_bytes} more bytes are needed; \
                 delete or overwrite data, or use a larger device"
            ),
            Error::IndexFull(e) => write!(f, "{e}"),
            Error::Corruption { offset, detail } => {
                write!(f, "corruption at device offset {offset}: {detail}; run `granary verify`")
            }
            Error::Poisoned { cause } => write!(
                f,
                "store refuses writes after an earlier device failure ({cause}); reads still work; \
                 reopen the store once the device is healthy"
            ),
            Error::NoSuchNamespace { name } => write!(f, "no namespace {name:?} (list them with `granary ns list`)"),
            Error::Closed => write!(f, "the store was closed"),
            Error::BadBatch(why) => write!(f, "batch refused, nothing applied: {why}"),
            Error::NamespaceExists { name } => write!(f, "namespace {name:?} exists already"),
            Error::BadNamespace { name, why } => write!(f, "namespace {name:?}: {why}"),
            Error::QuotaExceeded { name, what, limit } => write!(
                f,
                "namespace {name:?} is full: the write would take it past its limit of {limit} {what}; \
                 delete keys, or raise the limit"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } | Error::Device(source) => Some(source),
            Error::NotAStore(e) => Some(e),
            Error::IndexFull(e) => Some(e),
            _ => None,
        }
    }
}

impl Error {
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corruption { .. })
    }
}
