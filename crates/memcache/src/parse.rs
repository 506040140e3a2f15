//! The request parser: one request line of memcached's text protocol (and
//! its meta commands) in, a [`Request`] or the [`ParseError`] memcached
//! answers it with out. Pure: no IO, no store, no configuration; what
//! depends on them (a value over the item size limit, a non-numeric
//! counter, a store failure) is the executor's.
//!
//! Invariants:
//! - every check that needs only the line is made here, in memcached's
//!   order, so the first error memcached reports is the one returned (a
//!   line with several faults gets memcached's reply, not another one);
//! - a [`Request`] holds only values that parsed: the executor never
//!   re-checks a token (meta flags' numeric tokens included, which are
//!   checked for every letter whether or not the command uses it);
//! - errors memcached reports only after a data block was read (an ms
//!   mode it does not know) are carried in the request, not returned, so
//!   the block is read and counted first.

use crate::limits::KEY_BYTES_MAX;
use std::borrow::Cow;

/// Where the next request line ends in a connection's input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// A line (without its "\n" or "\r\n") and the bytes it takes.
    Line(&'a [u8], usize),
    /// No line end yet: read more.
    Incomplete,
    /// No line end within [`crate::limits::LINE_BYTES_MAX`] bytes: the
    /// connection gets [`ParseError::LineTooLong`] and is closed.
    TooLong,
}

/// The next request line of `buf`.
pub(crate) fn frame(buf: &[u8]) -> Frame<'_> {
    frame_from(buf, 0)
}

/// [`frame`], knowing that `buf`'s first `scanned` bytes hold no line end
/// (they were looked at before, when less had come): only the rest is
/// looked at, so a line that arrives in pieces costs its length once.
pub(crate) fn frame_from(buf: &[u8], scanned: usize) -> Frame<'_> {
    use crate::limits::LINE_BYTES_MAX;
    let end = buf.len().min(LINE_BYTES_MAX + 2);
    let from = scanned.min(end);
    let Some(nl) = buf[from..end].iter().position(|&b| b == b'\n').map(|p| from + p) else {
        return if buf.len() > LINE_BYTES_MAX { Frame::TooLong } else { Frame::Incomplete };
    };
    let line = &buf[..nl];
    Frame::Line(line.strip_suffix(b"\r").unwrap_or(line), nl + 1)
}

/// The value of a data block: `block` (the value and its line end) less
/// the "\r\n" it must end with.
pub(crate) fn value(block: &[u8]) -> Result<&[u8], ParseError> {
    block.strip_suffix(b"\r\n").ok_or(ParseError::BadDataChunk)
}

/// Why a line is refused; [`ParseError::reply`] is memcached's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// An empty line, an unknown command, a wrong number of arguments.
    Error,
    /// A key over 250 bytes, a number that does not parse, a data length
    /// out of 0..=2^31-3, a missing `me` key, a meta `F` token.
    BadFormat,
    /// `delete` with arguments other than `[0] [noreply]`.
    DeleteUsage,
    /// incr/decr: a delta that is not an unsigned 64-bit number.
    InvalidDelta,
    /// gat, gats, touch, flush_all: an exptime that is not a number.
    InvalidExptime,
    /// No line end within [`crate::limits::LINE_BYTES_MAX`] bytes.
    LineTooLong,
    /// A data block not followed by "\r\n".
    BadDataChunk,
    /// A meta flag letter memcached does not know.
    InvalidFlag,
    /// A meta flag given twice (or a byte past ASCII).
    DuplicateFlag,
    /// A meta `N`, `T`, `R`, `C` or `E` token that does not parse.
    BadToken,
    /// A meta `M` token of other than one character.
    MTokenLength,
    /// A meta `J` token that does not parse.
    InvalidInitial,
    /// A meta `D` token that does not parse.
    InvalidDeltaValue,
    /// mg with more than [`FLAGS_MAX`] flags.
    FlagsAreTooLong,
    /// ms, md, ma with more than [`FLAGS_MAX`] flags (ms counts its data
    /// length).
    FlagsTooLong,
    /// An opaque token of [`OPAQUE_BYTES_MAX`] bytes or more, its `O`
    /// included.
    OpaqueTooLong,
    /// md and ma: every flag error, and a base64 key that does not decode.
    InvalidOrDuplicateFlag,
    /// mg and ms: a base64 key that does not decode.
    DecodingKey,
    /// ms: a mode other than S, E, A, P, R (reported after the data).
    InvalidMsMode,
    /// ma: a mode other than I, +, D, -.
    InvalidMaMode,
    /// `stats cachedump` with fewer than two arguments.
    BadCommandLine,
    /// `stats cachedump` of a class past memcached's last (63).
    IllegalSlabId,
    /// `stats detail` without on, off or dump.
    DetailUsage,
    /// `lru_crawler metadump` (or `crawl`) of a class that is not one.
    BadClass,
    /// `shutdown` when the server was not started with `-A`.
    ShutdownNotEnabled,
    /// `shutdown <mode>` with a mode other than `graceful`.
    ShutdownMode,
}

impl ParseError {
    /// memcached's reply, without its line end.
    pub(crate) fn reply(self) -> &'static str {
        match self {
            ParseError::Error => "ERROR",
            ParseError::BadFormat => "CLIENT_ERROR bad command line format",
            ParseError::DeleteUsage => "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
            ParseError::InvalidDelta => "CLIENT_ERROR invalid numeric delta argument",
            ParseError::InvalidExptime => "CLIENT_ERROR invalid exptime argument",
            ParseError::LineTooLong => "CLIENT_ERROR line too long",
            ParseError::BadDataChunk => "CLIENT_ERROR bad data chunk",
            ParseError::InvalidFlag => "CLIENT_ERROR invalid flag",
            ParseError::DuplicateFlag => "CLIENT_ERROR duplicate flag",
            ParseError::BadToken => "CLIENT_ERROR bad token in command line format",
            ParseError::MTokenLength => "CLIENT_ERROR incorrect length for M token",
            ParseError::InvalidInitial => "CLIENT_ERROR invalid numeric initial value",
            ParseError::InvalidDeltaValue => "CLIENT_ERROR invalid numeric delta value",
            ParseError::FlagsAreTooLong => "CLIENT_ERROR options flags are too long",
            ParseError::FlagsTooLong => "CLIENT_ERROR options flags too long",
            ParseError::OpaqueTooLong => "CLIENT_ERROR opaque token too long",
            ParseError::InvalidOrDuplicateFlag => "CLIENT_ERROR invalid or duplicate flag",
            ParseError::DecodingKey => "CLIENT_ERROR error decoding key",
            ParseError::InvalidMsMode => "CLIENT_ERROR invalid mode for ms M token",
            ParseError::InvalidMaMode => "CLIENT_ERROR invalid mode for ma M token",
            ParseError::BadCommandLine => "CLIENT_ERROR bad command line",
            ParseError::IllegalSlabId => "CLIENT_ERROR Illegal slab id",
            ParseError::DetailUsage => "CLIENT_ERROR usage: stats detail on|off|dump",
            ParseError::BadClass => "BADCLASS invalid class id",
            ParseError::ShutdownNotEnabled => "ERROR: shutdown not enabled",
            ParseError::ShutdownMode => "CLIENT_ERROR invalid shutdown mode",
        }
    }
}

/// One parsed line.
#[derive(Debug, PartialEq)]
pub(crate) struct Parsed<'a> {
    /// The command token (its latency slot); None for an empty line.
    pub cmd: Option<&'a [u8]>,
    /// The line ends in `noreply` on a command that takes it: as in
    /// memcached, every reply to it, errors included, is suppressed.
    pub noreply: bool,
    pub request: Result<Request<'a>, ParseError>,
    /// Bytes after the line that belong to it when it is refused: the data
    /// block of an ms whose flags or key are refused (memcached skips it).
    pub skip: usize,
}

/// A text storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// An ms mode (`M` flag; S when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsMode {
    /// S: set.
    Set,
    /// E: add.
    Add,
    /// R: replace.
    Replace,
    /// A: append.
    Append,
    /// P: prepend.
    Prepend,
}

/// What `stats` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatsKind {
    General,
    Settings,
    Items,
    Latency,
    Slabs,
    Reset,
    /// `stats cachedump <class> <limit>`: the keys of a class (Granary's
    /// one class is [`ITEM_CLASS`]); `limit` 0 = up to memcached's reply
    /// cap ([`CACHEDUMP_BYTES_MAX`](crate::limits::CACHEDUMP_BYTES_MAX)).
    CacheDump {
        class: u32,
        limit: u32,
    },
    /// `stats cachedump dram <limit>` (Granary's): the keys the DRAM tier
    /// holds, in the same format; `limit` 0 = up to the reply cap.
    CacheDumpDram {
        limit: u32,
    },
    /// `stats detail on|off`: `OK`, nothing recorded.
    DetailSet,
    /// `stats detail dump`: nothing recorded, so `END` alone.
    DetailDump,
}

/// The one item class Granary reports (`stats items`, `stats cachedump`,
/// `lru_crawler metadump`, `me`'s `cls`): it has no slab classes.
pub(crate) const ITEM_CLASS: u32 = 1;

/// memcached's highest slab class id (`MAX_NUMBER_OF_SLAB_CLASSES` - 1);
/// a class above it is refused.
pub(crate) const CLASS_ID_MAX: u32 = 63;

/// An `lru_crawler` subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crawler {
    /// `metadump <all|hash|classes>`: `all` is true when the classes
    /// include [`ITEM_CLASS`] (every key is listed), false for a list of
    /// valid classes without it (`END` alone).
    Metadump { all: bool },
    /// `crawl`, `sleep`, `tocrawl`, `enable`, `disable`: accepted, `OK`
    /// (Granary expires items as they are read; there is no crawler).
    Ok,
}

/// A meta flag: its letter and token (possibly empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag<'a> {
    pub c: u8,
    pub tok: &'a [u8],
}

/// The flags a meta command acts on or echoes, in the order given (return
/// flags are written in it). Their tokens parsed when checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Flags<'a>(pub Vec<Flag<'a>>);

impl<'a> Flags<'a> {
    pub(crate) fn has(&self, c: u8) -> bool {
        self.0.iter().any(|f| f.c == c)
    }

    pub(crate) fn tok(&self, c: u8) -> Option<&'a [u8]> {
        self.0.iter().find(|f| f.c == c).map(|f| f.tok)
    }

    /// The number flag `c` carries (checked by [`meta_flags`]), if given.
    fn num<T: std::str::FromStr>(&self, c: u8) -> Option<T> {
        self.tok(c).and_then(number)
    }
}

/// What every meta command with a key has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta<'a> {
    /// The key as sent (echoed by `k`).
    pub raw_key: &'a [u8],
    /// The key, base64-decoded with `b`.
    pub key: Cow<'a, [u8]>,
    pub flags: Flags<'a>,
}

/// A request, its tokens parsed and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    /// get, gets (`cas`), gat and gats (`touch`: the exptime).
    Get {
        keys: Vec<&'a [u8]>,
        cas: bool,
        touch: Option<i64>,
        /// A key over 250 bytes followed `keys`: as memcached, the keys
        /// before it are read (and touched), but the request answers only
        /// `CLIENT_ERROR bad command line format` (memcached 1.6 drops the
        /// `VALUE`s it had built).
        bad_key: bool,
    },
    /// set, add, replace, append, prepend, cas (`cas` is 0 but for cas);
    /// `len` bytes of data and "\r\n" follow the line.
    Store {
        kind: Storage,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        len: usize,
        cas: u64,
    },
    Delete {
        key: &'a [u8],
    },
    Arith {
        key: &'a [u8],
        incr: bool,
        delta: u64,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
    },
    FlushAll {
        delay: i64,
    },
    Version,
    Verbosity,
    Stats(StatsKind),
    LruCrawler(Crawler),
    /// `shutdown [<mode>]`: `mode_ok` when the mode is absent or
    /// `graceful`. Refused by the executor unless enabled (memcached
    /// checks that before the mode).
    Shutdown {
        mode_ok: bool,
    },
    Quit,
    Mn,
    Mg {
        m: Meta<'a>,
        /// E: the CAS value an item it touches or creates gets.
        new_cas: Option<u64>,
        /// R: win the token when fewer seconds than this are left.
        recache: Option<i64>,
        /// T: touch with this exptime.
        ttl: Option<i64>,
        /// N: create a missing item with this exptime.
        vivify: Option<i64>,
    },
    /// `len` bytes of data and "\r\n" follow the line.
    Ms {
        m: Meta<'a>,
        len: usize,
        /// Err: memcached refuses the mode once the data is read.
        mode: Result<MsMode, ParseError>,
        /// F, 32 bits kept of an unsigned long (as memcached).
        user_flags: u32,
        ttl: Option<i64>,
        cas: Option<u64>,
        new_cas: Option<u64>,
    },
    Md {
        m: Meta<'a>,
        cas: Option<u64>,
        ttl: Option<i64>,
    },
    Ma {
        m: Meta<'a>,
        incr: bool,
        delta: Option<u64>,
        initial: Option<u64>,
        vivify: Option<i64>,
        ttl: Option<i64>,
        cas: Option<u64>,
        new_cas: Option<u64>,
    },
    /// me: the key as sent (not decoded).
    Me {
        key: &'a [u8],
    },
}

impl Request<'_> {
    /// The length of the data block that follows the line, if any.
    pub(crate) fn data_len(&self) -> Option<usize> {
        match self {
            Request::Store { len, .. } | Request::Ms { len, .. } => Some(*len),
            _ => None,
        }
    }
}

/// Commands whose line may end in `noreply`.
const NOREPLY_CMDS: [&[u8]; 12] = [
    b"set",
    b"add",
    b"replace",
    b"append",
    b"prepend",
    b"cas",
    b"delete",
    b"incr",
    b"decr",
    b"touch",
    b"flush_all",
    b"verbosity",
];

/// Every flag letter memcached 1.6's meta commands know (its
/// `_meta_flag_preparse`), and `E`, which later memcached versions added.
const KNOWN_FLAGS: &[u8] = b"bcCDEfFhIJklLMNOPqRstTuv";

/// Most flags one meta command takes (memcached's `MFLAG_MAX_OPT_LENGTH`
/// of 20 tokens, less the command, the key and the terminal token; ms
/// counts its data length as a flag).
const FLAGS_MAX: usize = 17;

/// Longest opaque token, its `O` included (memcached's
/// `MFLAG_MAX_OPAQUE_LENGTH`).
const OPAQUE_BYTES_MAX: usize = 32;

/// Split a request line into tokens (runs of spaces separate them).
fn tokens(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b' ').filter(|t| !t.is_empty()).collect()
}

/// A number token, as Rust parses it (a leading `+` accepted).
fn number<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A key the text protocol accepts: 1..=250 bytes. As in memcached, any
/// other byte than the space (which separates tokens) and the line end may
/// occur: memcaslap's verifying mode, for one, sends control characters.
fn key_ok(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= KEY_BYTES_MAX
}

/// memcached's bound on a data length.
const DATA_LEN: std::ops::RangeInclusive<i64> = 0..=i32::MAX as i64 - 2;

/// A data length token within [`DATA_LEN`].
fn data_len(t: &[u8]) -> Option<usize> {
    number::<i64>(t).filter(|l| DATA_LEN.contains(l)).map(|l| l as usize)
}

/// Parse one request line (without its line end).
pub(crate) fn parse(line: &[u8]) -> Parsed<'_> {
    let t = tokens(line);
    let Some(&cmd) = t.first() else {
        return Parsed { cmd: None, noreply: false, request: Err(ParseError::Error), skip: 0 };
    };
    // A last token `noreply`, as memcached reads it: not the key of a bare
    // `delete noreply` (memcached looks for it only past the key there).
    let min_tokens = if cmd == b"delete" { 3 } else { 2 };
    let noreply = t.len() >= min_tokens && t.last() == Some(&&b"noreply"[..]) && NOREPLY_CMDS.contains(&cmd);
    let mut skip = 0;
    let request = match cmd {
        b"get" => get(&t[1..], false, None),
        b"gets" => get(&t[1..], true, None),
        b"gat" | b"gats" if t.len() > 1 => match number::<i64>(t[1]) {
            Some(exp) => get(&t[2..], cmd == b"gats", Some(exp)),
            None => Err(ParseError::InvalidExptime),
        },
        b"set" => storage(Storage::Set, &t),
        b"add" => storage(Storage::Add, &t),
        b"replace" => storage(Storage::Replace, &t),
        b"append" => storage(Storage::Append, &t),
        b"prepend" => storage(Storage::Prepend, &t),
        b"cas" => storage(Storage::Cas, &t),
        b"delete" => delete(&t, noreply),
        b"incr" | b"decr" => key_and_arg(&t).and_then(|(key, arg)| match number::<u64>(arg) {
            Some(delta) => Ok(Request::Arith { key, incr: cmd == b"incr", delta }),
            None => Err(ParseError::InvalidDelta),
        }),
        b"touch" => key_and_arg(&t).and_then(|(key, arg)| match number::<i64>(arg) {
            Some(exptime) => Ok(Request::Touch { key, exptime }),
            None => Err(ParseError::InvalidExptime),
        }),
        b"flush_all" => flush_all(&t),
        b"version" => Ok(Request::Version),
        b"verbosity" => verbosity(&t[1..]),
        b"stats" => stats(&t[1..]),
        b"lru_crawler" => lru_crawler(&t[1..]),
        b"shutdown" => Ok(Request::Shutdown { mode_ok: matches!(&t[1..], [] | [b"graceful"]) }),
        b"quit" => Ok(Request::Quit),
        b"mn" => Ok(Request::Mn),
        b"mg" | b"ms" | b"md" | b"ma" | b"me" => match t.get(1) {
            None if cmd == b"me" => Err(ParseError::BadFormat),
            None => Err(ParseError::Error),
            Some(&raw_key) => match cmd {
                b"mg" => mg(raw_key, &t[2..]),
                b"md" => md(raw_key, &t[2..]),
                b"ma" => ma(raw_key, &t[2..]),
                b"me" => meta_key(raw_key, false, ParseError::DecodingKey).map(|_| Request::Me { key: raw_key }),
                _ => ms(raw_key, &t[2..], &mut skip),
            },
        },
        // Unknown commands, and gat/gats without an argument.
        _ => Err(ParseError::Error),
    };
    // A wrong number of tokens is answered `ERROR` before memcached looks
    // for `noreply`: never suppressed.
    let noreply = noreply && request != Err(ParseError::Error);
    Parsed { cmd: Some(cmd), noreply, request, skip }
}

/// get, gets, gat, gats: the keys up to the first one memcached refuses.
fn get<'a>(keys: &[&'a [u8]], cas: bool, touch: Option<i64>) -> Result<Request<'a>, ParseError> {
    // A get without keys is an error; gat and gats with an exptime and no
    // key answer an empty result.
    if keys.is_empty() && touch.is_none() {
        return Err(ParseError::Error);
    }
    let ok = keys.iter().position(|k| !key_ok(k)).unwrap_or(keys.len());
    Ok(Request::Get { keys: keys[..ok].to_vec(), cas, touch, bad_key: ok < keys.len() })
}

/// `<cmd> <key> <flags> <exptime> <bytes> [<cas>] [noreply]`.
fn storage<'a>(kind: Storage, t: &[&'a [u8]]) -> Result<Request<'a>, ParseError> {
    let n_args = if kind == Storage::Cas { 6 } else { 5 };
    // memcached ignores one extra token that is not "noreply".
    if t.len() != n_args && t.len() != n_args + 1 {
        return Err(ParseError::Error);
    }
    let key = t[1];
    // memcached parses flags as an unsigned long and keeps 32 bits.
    let flags = number::<u64>(t[2]).map(|f| f as u32);
    let exptime = number::<i64>(t[3]);
    let bytes = number::<i64>(t[4]);
    let cas = if kind == Storage::Cas { number::<u64>(t[5]) } else { Some(0) };
    let (Some(flags), Some(exptime), Some(bytes), Some(cas)) = (flags, exptime, bytes, cas) else {
        return Err(ParseError::BadFormat);
    };
    if !key_ok(key) || !DATA_LEN.contains(&bytes) {
        return Err(ParseError::BadFormat);
    }
    Ok(Request::Store { kind, key, flags, exptime, len: bytes as usize, cas })
}

/// `delete <key> [0] [noreply]` (the 0 is memcached's legacy hold time).
fn delete<'a>(t: &[&'a [u8]], noreply: bool) -> Result<Request<'a>, ParseError> {
    if !(2..=4).contains(&t.len()) {
        return Err(ParseError::Error);
    }
    let args = &t[1..t.len() - noreply as usize];
    let ok = match args {
        [_] => true,
        [_, z] => *z == b"0",
        _ => false,
    };
    if !ok {
        return Err(ParseError::DeleteUsage);
    }
    if !key_ok(args[0]) {
        return Err(ParseError::BadFormat);
    }
    Ok(Request::Delete { key: args[0] })
}

/// The key and argument of `<cmd> <key> <arg> [noreply]` (incr, decr,
/// touch). As memcached, a fourth token is accepted whatever it is (it
/// means noreply only if it is `noreply`).
fn key_and_arg<'a>(t: &[&'a [u8]]) -> Result<(&'a [u8], &'a [u8]), ParseError> {
    if t.len() != 3 && t.len() != 4 {
        return Err(ParseError::Error);
    }
    if !key_ok(t[1]) {
        return Err(ParseError::BadFormat);
    }
    Ok((t[1], t[2]))
}

/// `flush_all [delay] [noreply]` (a token after the delay is ignored).
fn flush_all<'a>(t: &[&[u8]]) -> Result<Request<'a>, ParseError> {
    if t.len() > 3 {
        return Err(ParseError::Error);
    }
    let delay = match t.get(1) {
        None => 0,
        Some(&d) if d == b"noreply" && t.len() == 2 => 0,
        Some(d) => number::<i64>(d).ok_or(ParseError::InvalidExptime)?,
    };
    Ok(Request::FlushAll { delay })
}

/// `verbosity <level> [noreply]` (a second token is ignored).
fn verbosity<'a>(args: &[&[u8]]) -> Result<Request<'a>, ParseError> {
    if args.is_empty() || args.len() > 2 {
        return Err(ParseError::Error);
    }
    if args[0] != b"noreply" && number::<u64>(args[0]).is_none() {
        return Err(ParseError::BadFormat);
    }
    Ok(Request::Verbosity)
}

fn stats<'a>(args: &[&[u8]]) -> Result<Request<'a>, ParseError> {
    let kind = match args {
        [] => StatsKind::General,
        [b"settings"] => StatsKind::Settings,
        [b"items"] => StatsKind::Items,
        [b"latency"] => StatsKind::Latency,
        [b"slabs"] => StatsKind::Slabs,
        [b"reset"] => StatsKind::Reset,
        [b"cachedump"] | [b"cachedump", _] => return Err(ParseError::BadCommandLine),
        // Tokens after the limit are ignored, as memcached does.
        [b"cachedump", b"dram", limit, ..] => {
            let Some(limit) = number::<u32>(limit) else {
                return Err(ParseError::BadFormat);
            };
            StatsKind::CacheDumpDram { limit }
        }
        [b"cachedump", class, limit, ..] => {
            let (Some(class), Some(limit)) = (number::<u32>(class), number::<u32>(limit)) else {
                return Err(ParseError::BadFormat);
            };
            if class > CLASS_ID_MAX {
                return Err(ParseError::IllegalSlabId);
            }
            StatsKind::CacheDump { class, limit }
        }
        [b"detail", b"on" | b"off", ..] => StatsKind::DetailSet,
        [b"detail", b"dump", ..] => StatsKind::DetailDump,
        [b"detail", ..] => return Err(ParseError::DetailUsage),
        _ => return Err(ParseError::Error),
    };
    Ok(Request::Stats(kind))
}

/// `lru_crawler <subcommand> [<arg>]`, as memcached 1.6.18 answers it
/// (with its crawler enabled).
fn lru_crawler<'a>(args: &[&[u8]]) -> Result<Request<'a>, ParseError> {
    let crawler = match args {
        [b"metadump", classes] => Crawler::Metadump { all: classes_include_ours(classes)? },
        [b"crawl", classes] => classes_include_ours(classes).map(|_| Crawler::Ok)?,
        [b"sleep" | b"tocrawl", n] => match number::<u32>(n) {
            Some(_) => Crawler::Ok,
            None => return Err(ParseError::BadFormat),
        },
        [b"enable" | b"disable"] => Crawler::Ok,
        _ => return Err(ParseError::Error),
    };
    Ok(Request::LruCrawler(crawler))
}

/// A crawler class argument: `all`, `hash`, or a comma-separated list of
/// class ids in 1..=[`CLASS_ID_MAX`]; whether it takes [`ITEM_CLASS`].
fn classes_include_ours(arg: &[u8]) -> Result<bool, ParseError> {
    if arg == b"all" || arg == b"hash" {
        return Ok(true);
    }
    let mut ours = false;
    for c in arg.split(|&b| b == b',') {
        match number::<u32>(c) {
            Some(id) if (1..=CLASS_ID_MAX).contains(&id) => ours |= id == ITEM_CLASS,
            _ => return Err(ParseError::BadClass),
        }
    }
    Ok(ours)
}

/// Check a meta command's flags as memcached does for every meta command,
/// and keep those among `used`, the letters this command acts on or
/// echoes, in their order. Refused: a letter memcached does not know
/// (InvalidFlag), a letter given twice (DuplicateFlag, also for any byte
/// past ASCII, as memcached), or a numeric token that does not parse (the
/// error memcached gives for that letter; the last one wins, as in
/// memcached, but an invalid or repeated letter ends the check at once).
fn meta_flags<'a>(t: &[&'a [u8]], used: &[u8]) -> Result<Flags<'a>, ParseError> {
    let mut seen = [false; 128];
    let mut out: Vec<Flag<'a>> = Vec::with_capacity(t.len());
    let mut bad = None;
    for f in t {
        let (c, tok) = (f[0], &f[1..]);
        if c >= 127 || seen[c as usize] {
            return Err(ParseError::DuplicateFlag);
        }
        seen[c as usize] = true;
        let fails = match c {
            b'N' | b'T' | b'R' => number::<i64>(tok).is_none().then_some(ParseError::BadToken),
            b'C' | b'E' => number::<u64>(tok).is_none().then_some(ParseError::BadToken),
            b'F' => number::<u64>(tok).is_none().then_some(ParseError::BadFormat),
            b'M' => (tok.len() != 1).then_some(ParseError::MTokenLength),
            b'J' => number::<u64>(tok).is_none().then_some(ParseError::InvalidInitial),
            b'D' => number::<u64>(tok).is_none().then_some(ParseError::InvalidDeltaValue),
            c if KNOWN_FLAGS.contains(&c) => None,
            _ => return Err(ParseError::InvalidFlag),
        };
        bad = fails.or(bad);
        if used.contains(&c) {
            out.push(Flag { c, tok });
        }
    }
    match bad {
        Some(e) => Err(e),
        None => Ok(Flags(out)),
    }
}

/// Whether the opaque token (if any) is within [`OPAQUE_BYTES_MAX`].
fn opaque_ok(fl: &Flags<'_>) -> bool {
    !matches!(fl.tok(b'O'), Some(o) if o.len() >= OPAQUE_BYTES_MAX)
}

/// The key of a meta command, base64-decoded with `b`; a key that does
/// not decode is refused with `undecodable` (memcached decodes the key in
/// its flag check, so md and ma answer with their one error for flags, mg
/// and ms with `error decoding key`).
fn meta_key(raw: &[u8], b: bool, undecodable: ParseError) -> Result<Cow<'_, [u8]>, ParseError> {
    if raw.len() > KEY_BYTES_MAX || (!b && !key_ok(raw)) {
        return Err(ParseError::BadFormat);
    }
    if !b {
        return Ok(Cow::Borrowed(raw));
    }
    match b64_decode(raw) {
        Some(k) if !k.is_empty() => Ok(Cow::Owned(k)),
        _ => Err(undecodable),
    }
}

/// The flags and key of a meta command: the flag count, the flags, the
/// opaque token and the key checked in memcached's order. `too_many` and
/// `flag_error` are the command's errors for too many flags and for any
/// flag error (None: the flag's own).
fn meta<'a>(
    raw_key: &'a [u8],
    t: &[&'a [u8]],
    used: &[u8],
    too_many: ParseError,
    flag_error: Option<ParseError>,
) -> Result<Meta<'a>, ParseError> {
    if t.len() > FLAGS_MAX {
        return Err(too_many);
    }
    let flags = meta_flags(t, used).map_err(|e| flag_error.unwrap_or(e))?;
    if !opaque_ok(&flags) {
        return Err(ParseError::OpaqueTooLong);
    }
    let key = meta_key(raw_key, flags.has(b'b'), flag_error.unwrap_or(ParseError::DecodingKey))?;
    Ok(Meta { raw_key, key, flags })
}

fn mg<'a>(raw_key: &'a [u8], t: &[&'a [u8]]) -> Result<Request<'a>, ParseError> {
    let m = meta(raw_key, t, b"bcEfhklOqstuvNRT", ParseError::FlagsAreTooLong, None)?;
    let (new_cas, recache, ttl, vivify) = (m.flags.num(b'E'), m.flags.num(b'R'), m.flags.num(b'T'), m.flags.num(b'N'));
    Ok(Request::Mg { m, new_cas, recache, ttl, vivify })
}

/// `ms <key> <datalen> <flags>*`: once the data length is read, a refused
/// line has its data block skipped (`skip`).
fn ms<'a>(raw_key: &'a [u8], t: &[&'a [u8]], skip: &mut usize) -> Result<Request<'a>, ParseError> {
    // A key token over the limit is refused before the data length is
    // read, so its data line is not skipped (memcached's order: the line
    // after is then read as a command).
    if raw_key.len() > KEY_BYTES_MAX {
        return Err(ParseError::BadFormat);
    }
    let len = t.first().and_then(|x| data_len(x)).ok_or(ParseError::BadFormat)?;
    // (memcached checks the count after the flags, and then leaves the
    // data line to be read as a command; it is skipped here, as after the
    // other errors.)
    let checked = match meta_flags(&t[1..], b"bcCEFIkOqTM") {
        Ok(_) if t.len() > FLAGS_MAX => Err(ParseError::FlagsTooLong),
        Ok(fl) if !opaque_ok(&fl) => Err(ParseError::OpaqueTooLong),
        Ok(flags) => {
            meta_key(raw_key, flags.has(b'b'), ParseError::DecodingKey).map(|key| Meta { raw_key, key, flags })
        }
        Err(e) => Err(e),
    };
    let m = match checked {
        Ok(m) => m,
        Err(e) => {
            *skip = len + 2;
            return Err(e);
        }
    };
    // One upper-case letter, as memcached 1.6.18 takes it (an M token of
    // another length is refused with the flags).
    let mode = match m.flags.tok(b'M') {
        None | Some(b"S") => Ok(MsMode::Set),
        Some(b"E") => Ok(MsMode::Add),
        Some(b"R") => Ok(MsMode::Replace),
        Some(b"A") => Ok(MsMode::Append),
        Some(b"P") => Ok(MsMode::Prepend),
        Some(_) => Err(ParseError::InvalidMsMode),
    };
    // memcached parses flags as an unsigned long and keeps 32 bits (as the
    // text commands do).
    let user_flags = m.flags.num::<u64>(b'F').unwrap_or(0) as u32;
    let (ttl, cas, new_cas) = (m.flags.num(b'T'), m.flags.num(b'C'), m.flags.num(b'E'));
    Ok(Request::Ms { m, len, mode, user_flags, ttl, cas, new_cas })
}

fn md<'a>(raw_key: &'a [u8], t: &[&'a [u8]]) -> Result<Request<'a>, ParseError> {
    // memcached's md and ma have one error for every flag error.
    let m = meta(raw_key, t, b"bCIkOqT", ParseError::FlagsTooLong, Some(ParseError::InvalidOrDuplicateFlag))?;
    let (cas, ttl) = (m.flags.num(b'C'), m.flags.num(b'T'));
    Ok(Request::Md { m, cas, ttl })
}

fn ma<'a>(raw_key: &'a [u8], t: &[&'a [u8]]) -> Result<Request<'a>, ParseError> {
    let m = meta(raw_key, t, b"bcCENJDTMqOtvk", ParseError::FlagsTooLong, Some(ParseError::InvalidOrDuplicateFlag))?;
    // One upper-case letter or sign, as memcached 1.6.18 takes it (an M
    // token of another length is refused with the flags).
    let incr = match m.flags.tok(b'M') {
        None | Some(b"I" | b"+") => true,
        Some(b"D" | b"-") => false,
        Some(_) => return Err(ParseError::InvalidMaMode),
    };
    let f = &m.flags;
    let (delta, initial, vivify, ttl) = (f.num(b'D'), f.num(b'J'), f.num(b'N'), f.num(b'T'));
    let (cas, new_cas) = (f.num(b'C'), f.num(b'E'));
    Ok(Request::Ma { m, incr, delta, initial, vivify, ttl, cas, new_cas })
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

#[cfg(test)]
pub(crate) fn b64_encode(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out
}

/// Standard base64 with padding; None for anything else.
pub(crate) fn b64_decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (ci, c) in s.chunks(4).enumerate() {
        let last = ci == s.len() / 4 - 1;
        let pad = c.iter().rev().take_while(|&&x| x == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &x in &c[..4 - pad] {
            n = n << 6 | B64.iter().position(|&y| y == x)? as u32;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
