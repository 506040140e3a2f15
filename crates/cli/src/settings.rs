//! Every setting of `granary serve` is declared once, in [`SETTINGS`]: its
//! TOML key, its flag, what values it takes ([`Kind`]), its `--help` line,
//! its default and meaning as the docs say them, how `--print-config`
//! renders it and how a value read for it is stored in [`Config`].
//! Everything else about settings is generated from that table:
//!
//! - the serve subcommand's setting flags: clap arguments built at run time
//!   ([`SettingFlags`]), with their `--help` lines and value checks;
//! - the keys the `--config` file takes ([`read_file`]); any other key is
//!   refused;
//! - `--print-config`'s TOML ([`to_toml`]);
//! - docs/CONFIG.md's settings table ([`markdown_table`], printed by
//!   `granary serve --print-settings-table`); a test fails when the file
//!   disagrees.
//!
//! A flag and the file read a value through the same [`Kind`], so they take
//! the same values and refuse the same ones, naming the key. A new setting
//! is one entry here, its field in [`Config`] and its default in
//! `Config::defaults`; then paste the printed table into docs/CONFIG.md.

use crate::serve::{Config, Io, LogFormat};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use granary_cli::size;
use granary_store::{Discard, GcPolicy, Watermark};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// One setting.
#[derive(Debug)]
pub struct Setting {
    /// The key in the TOML file (and in `--print-config`).
    pub key: &'static str,
    /// The long flag without its dashes: the key with `-` for `_` (and
    /// `no-` before it for a switch that sets false; a test checks).
    pub long: &'static str,
    /// The short flag (memcached's, where it has one).
    pub short: Option<char>,
    /// The values it takes, from a flag or the file.
    pub kind: Kind,
    /// Its `--help` line (the default is appended from `default`).
    pub help: &'static str,
    /// The default, as docs/CONFIG.md says it.
    pub default: &'static str,
    /// What it does (docs/CONFIG.md's "meaning").
    pub meaning: &'static str,
    /// Its value in `--print-config`'s TOML; None: not set (a comment).
    pub value: fn(&Config) -> Option<String>,
    /// Store a value read for it (of its kind's [`Value`] variant).
    pub apply: fn(&mut Config, Value),
}

/// The values a setting takes, and how a flag and the file give them.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// `true` or `false` in the file; the flag takes no value and sets it
    /// to `sets` (`--flush` sets true, `--no-evict` false).
    Switch { sets: bool },
    /// A whole number from `min` to `max` (an integer in the file); `name`
    /// stands for it in `--help` and the docs.
    Int { name: &'static str, min: u64, max: u64 },
    /// Bytes, from `min` to `max`: `64M`, `1GiB`, `4096` (`0` where `min`
    /// is 0); in the file a string like those or an integer.
    Size { min: u64, max: u64 },
    /// A path (a string in the file).
    Path,
    /// An IP address (a string in the file).
    Ip,
    /// A socket address, or `""` for none (a string in the file).
    Addr,
    /// A namespace name (a string in the file).
    Name,
    /// One of `choices` (a string in the file); `name` stands for it in
    /// `--help`.
    Choice { name: &'static str, choices: &'static [&'static str] },
    /// A password or token: any string without control characters, `""`
    /// for none (a string in the file).
    Secret,
}

/// A value read for a setting; which variant depends on its [`Kind`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// [`Kind::Switch`].
    Bool(bool),
    /// [`Kind::Int`] and [`Kind::Size`] (bytes).
    Int(u64),
    Path(PathBuf),
    Ip(IpAddr),
    Addr(Option<SocketAddr>),
    /// [`Kind::Name`].
    Text(String),
    /// One of a [`Kind::Choice`]'s choices.
    Choice(String),
}

// Each setting's `apply` takes the variant its kind reads: another one is a
// mistake in the table, which the tests' round trip of every setting finds.
impl Value {
    /// An integer, in the field's type (the kind's range fits it).
    fn int<T: TryFrom<u64>>(self) -> T {
        match self {
            Value::Int(n) => T::try_from(n).unwrap_or_else(|_| panic!("{n} does not fit the setting's field")),
            v => panic!("{v:?} is not an integer"),
        }
    }

    fn bool(self) -> bool {
        match self {
            Value::Bool(b) => b,
            v => panic!("{v:?} is not a switch"),
        }
    }

    fn path(self) -> PathBuf {
        match self {
            Value::Path(p) => p,
            v => panic!("{v:?} is not a path"),
        }
    }

    fn ip(self) -> IpAddr {
        match self {
            Value::Ip(ip) => ip,
            v => panic!("{v:?} is not an IP address"),
        }
    }

    fn addr(self) -> Option<SocketAddr> {
        match self {
            Value::Addr(a) => a,
            v => panic!("{v:?} is not an address"),
        }
    }

    fn text(self) -> String {
        match self {
            Value::Text(t) => t,
            v => panic!("{v:?} is not a name"),
        }
    }

    fn choice(self) -> String {
        match self {
            Value::Choice(c) => c,
            v => panic!("{v:?} is not a choice"),
        }
    }
}

impl Kind {
    /// The placeholder for its value in `--help` and the docs.
    fn value_name(&self) -> &'static str {
        match self {
            Kind::Int { name, .. } | Kind::Choice { name, .. } => name,
            Kind::Size { .. } => "SIZE",
            Kind::Path => "PATH",
            Kind::Ip | Kind::Addr => "ADDR",
            Kind::Name => "NAME",
            Kind::Secret => "SECRET",
            Kind::Switch { .. } => "",
        }
    }

    /// What the file must give, for the error when it gives another type.
    fn expects(&self) -> String {
        match self {
            Kind::Switch { .. } => "true or false".into(),
            Kind::Int { .. } => "an integer".into(),
            Kind::Size { .. } => "a size (an integer of bytes, or a string such as \"64M\")".into(),
            Kind::Path => "a path (a string)".into(),
            Kind::Ip => "an IP address (a string)".into(),
            Kind::Addr => "an address (a string such as \"127.0.0.1:9121\", or \"\" for none)".into(),
            Kind::Name => "a namespace name (a string)".into(),
            Kind::Secret => "a string (\"\" for none)".into(),
            Kind::Choice { choices, .. } => format!("one of {}", quoted(choices)),
        }
    }

    /// Read a value from text: a flag's, a string in the file (or a
    /// default as the docs give it).
    fn parse(&self, s: &str) -> Result<Value, String> {
        match *self {
            Kind::Switch { .. } => s.parse().map(Value::Bool).map_err(|_| format!("{s:?} is not true or false")),
            Kind::Int { min, max, .. } => {
                let n: u64 = s.parse().map_err(|_| format!("{s:?} is not a whole number"))?;
                in_range(n, min, max)
            }
            // size::parse refuses 0, which only a setting with `min` 0 takes.
            Kind::Size { min, max } => in_range(size::parse_or_zero(s)?, min, max),
            Kind::Path => Ok(Value::Path(PathBuf::from(s))),
            Kind::Ip => {
                s.parse().map(Value::Ip).map_err(|_| format!("{s:?} is not an IP address like 127.0.0.1 or ::1"))
            }
            Kind::Addr if s.is_empty() => Ok(Value::Addr(None)),
            Kind::Addr => s
                .parse()
                .map(|a| Value::Addr(Some(a)))
                .map_err(|_| format!("{s:?} is not an address like 127.0.0.1:9121")),
            Kind::Name => {
                granary_store::namespace::check_name(s).map(|()| Value::Text(s.into())).map_err(|e| e.to_string())
            }
            Kind::Secret if s.chars().any(|c| c.is_control()) => Err("cannot hold control characters".into()),
            Kind::Secret if s.len() > granary_proto::HELLO_TOKEN_BYTES_MAX => {
                Err(format!("longer than {} bytes", granary_proto::HELLO_TOKEN_BYTES_MAX))
            }
            Kind::Secret => Ok(Value::Text(s.into())),
            Kind::Choice { choices, .. } if choices.contains(&s) => Ok(Value::Choice(s.to_string())),
            Kind::Choice { choices, .. } => Err(format!("{s:?} is not one of {}", quoted(choices))),
        }
    }

    /// Read a value from the file.
    fn read_toml(&self, v: &toml::Value) -> Result<Value, String> {
        match (self, v) {
            (Kind::Switch { .. }, toml::Value::Boolean(b)) => Ok(Value::Bool(*b)),
            (Kind::Int { min, max, .. }, toml::Value::Integer(n)) => in_range(*n, *min, *max),
            (Kind::Size { min, max }, toml::Value::Integer(n)) => in_range(*n, *min, *max),
            (
                Kind::Size { .. }
                | Kind::Path
                | Kind::Ip
                | Kind::Addr
                | Kind::Name
                | Kind::Secret
                | Kind::Choice { .. },
                toml::Value::String(s),
            ) => self.parse(s),
            (_, toml::Value::Table(_) | toml::Value::Array(_)) | (Kind::Secret, _) => {
                // (A secret's value is never echoed: errors reach logs.)
                Err(format!("expected {}, found {}", self.expects(), v.type_str()))
            }
            _ => Err(format!("expected {}, found {} {v}", self.expects(), v.type_str())),
        }
    }
}

/// `n`, if it is from `min` to `max`.
fn in_range<N: TryInto<u64> + Copy + std::fmt::Display>(n: N, min: u64, max: u64) -> Result<Value, String> {
    match n.try_into() {
        Ok(v) if (min..=max).contains(&v) => Ok(Value::Int(v)),
        _ if max == u64::MAX => Err(format!("{n} is out of range (at least {min})")),
        _ => Err(format!("{n} is out of range ({min} to {max})")),
    }
}

/// `"a", "b"`.
fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
}

/// A TOML string (TOML's escapes: Rust's debug format writes `\u{ad}`,
/// which TOML refuses).
fn q(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Most executor threads `threads` takes (each holds a ring, an eventfd
/// and a pressure file, and its buffers: a number past any machine's cores
/// is a typo, refused before the store is opened).
pub const THREADS_MAX: usize = 4096;

/// Every setting, in the docs' order.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "data",
        long: "data",
        short: None,
        kind: Kind::Path,
        help: "Store file or block device, or a RAID-0 stripe set as a comma-separated list of members; missing files are created with --size in all",
        default: "`granary-data/granary.db`",
        meaning: "store file or block device; a missing file is created (with its directory). A comma-separated list (`/dev/nvme0n1,/dev/nvme1n1`) is a RAID-0 stripe set: missing member files are created (`size` split evenly, 128 KiB stripes; `granary create --stripe-size` chooses another unit), and members may be listed in any order when reopened (a path containing a comma cannot be used)",
        value: |c| Some(q(&c.data.to_string_lossy())),
        apply: |c, v| c.data = v.path(),
    },
    Setting {
        key: "size",
        long: "size",
        short: None,
        kind: Kind::Size { min: 1, max: u64::MAX },
        help: "Size of a new data file, e.g. 1G, 64G",
        default: "a quarter of the free space where the file goes, at least 64 MiB, at most 1 GiB",
        meaning: "size of a new data file (`1G`, `64GiB`, or bytes), preallocated and written once with zeros at creation (direct IO, progress shown: a filesystem such as ext4 converts a never-written extent at its first direct write under an exclusive lock, which stalls the file's other IO; docs/BENCHMARKS-HISTORY.md, \"A new data file is written once at creation\"; SIGINT/SIGTERM during it removes the file; after a SIGKILL during it the next start removes the file and creates it again); ignored for an existing store",
        value: |c| Some(c.size.to_string()),
        apply: |c, v| c.size = v.int(),
    },
    Setting {
        key: "segment_size",
        long: "segment-size",
        short: None,
        kind: Kind::Size { min: 1, max: u64::MAX },
        help: "Segment size of a new store",
        default: "1/64 of the device (1 MiB..1 GiB), and at least the next power of two above the largest item + 64 KiB",
        meaning: "segment size of a new store",
        value: |c| c.segment_size.map(|s| s.to_string()),
        apply: |c, v| c.segment_size = Some(v.int()),
    },
    Setting {
        key: "listen",
        long: "listen",
        short: Some('l'),
        kind: Kind::Ip,
        help: "Address to listen on (memcached's -l)",
        default: "`127.0.0.1`",
        meaning: "address of every listener",
        value: |c| Some(q(&c.listen.to_string())),
        apply: |c, v| c.listen = v.ip(),
    },
    Setting {
        key: "port",
        long: "port",
        short: Some('p'),
        kind: Kind::Int { name: "PORT", min: 0, max: u16::MAX as u64 },
        help: "Memcache TCP port (memcached's -p)",
        default: "`11211`",
        meaning: "Memcache listener",
        value: |c| Some(c.port.to_string()),
        apply: |c, v| c.port = v.int(),
    },
    Setting {
        key: "native",
        long: "no-native",
        short: None,
        kind: Kind::Switch { sets: false },
        help: "Do not serve the native protocol",
        default: "`true`",
        meaning: "serve the native protocol",
        value: |c| Some(c.native.to_string()),
        apply: |c, v| c.native = v.bool(),
    },
    Setting {
        key: "native_port",
        long: "native-port",
        short: None,
        kind: Kind::Int { name: "PORT", min: 0, max: u16::MAX as u64 },
        help: "Native protocol TCP port (docs/PROTOCOL.md), on the same address",
        default: "`43345`",
        meaning: "native protocol listener (docs/PROTOCOL.md)",
        value: |c| Some(c.native_port.to_string()),
        apply: |c, v| c.native_port = v.int(),
    },
    Setting {
        key: "resp",
        long: "no-resp",
        short: None,
        kind: Kind::Switch { sets: false },
        help: "Do not serve the Redis protocol",
        default: "`true`",
        meaning: "serve the Redis protocol (RESP)",
        value: |c| Some(c.resp.to_string()),
        apply: |c, v| c.resp = v.bool(),
    },
    Setting {
        key: "resp_port",
        long: "resp-port",
        short: None,
        kind: Kind::Int { name: "PORT", min: 0, max: u16::MAX as u64 },
        help: "Redis protocol (RESP) TCP port (docs/RESP.md), on the same address",
        default: "`6380`",
        meaning: "Redis protocol listener (docs/RESP.md)",
        value: |c| Some(c.resp_port.to_string()),
        apply: |c, v| c.resp_port = v.int(),
    },
    Setting {
        key: "nbd_port",
        long: "nbd-port",
        short: None,
        kind: Kind::Int { name: "PORT", min: 0, max: u16::MAX as u64 },
        help: "Serve the store's block exports over NBD on this TCP port, on the same address (10809 is NBD's IANA port; 0: off)",
        default: "`0` (off)",
        meaning: "NBD listener for block exports (docs/NBD.md); NBD's IANA port is 10809",
        value: |c| Some(c.nbd_port.to_string()),
        apply: |c, v| c.nbd_port = v.int(),
    },
    Setting {
        key: "requirepass",
        long: "requirepass",
        short: None,
        kind: Kind::Secret,
        help: "Password of the Redis protocol's `default` user: clients must AUTH first (Redis's requirepass; docs/SECURITY.md)",
        default: "none (`\"\"`)",
        meaning: "password of the Redis protocol listener's `default` user (Redis's `requirepass`): before `AUTH password`, `AUTH default password` or `HELLO 3 AUTH default password` every command but AUTH, HELLO and QUIT is answered `NOAUTH Authentication required.` (docs/SECURITY.md)",
        value: |c| Some(q(c.requirepass.as_deref().unwrap_or(""))),
        apply: |c, v| c.requirepass = Some(v.text()).filter(|t| !t.is_empty()),
    },
    Setting {
        key: "aclfile",
        long: "aclfile",
        short: None,
        kind: Kind::Path,
        help: "Users of the Redis protocol: Redis's ACL file (a subset: on/off, >password, #sha256, nopass; every key and command or none); not with --requirepass (docs/SECURITY.md)",
        default: "none (`\"\"`)",
        meaning: "the Redis protocol listener's users, from an ACL file in Redis's syntax (`user <name> on >password ~* &* +@all`; also `off`, `#<sha256 hex>`, `nopass`): clients `AUTH <user> <password>` or `HELLO 3 AUTH <user> <password>`; a user has every key and command (`~* +@all`) or none; any other permission rule, or an unreadable file, refuses the start naming the line; the `default` user, when the file does not name it, is `on nopass ~* +@all`; cannot be set with `requirepass` (docs/RESP.md, docs/SECURITY.md)",
        value: |c| Some(q(&c.aclfile.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())),
        apply: |c, v| c.aclfile = Some(v.path()).filter(|p| !p.as_os_str().is_empty()),
    },
    Setting {
        key: "auth_file",
        long: "auth-file",
        short: Some('Y'),
        kind: Kind::Path,
        help: "Memcache authentication: a file of user:password lines; clients authenticate with a set first, and the binary protocol is off (memcached's -Y; docs/SECURITY.md)",
        default: "none (`\"\"`)",
        meaning: "the Memcache listener requires authentication as memcached 1.6 with `-Y`: a file of `user:password` lines, read at start (an unreadable or empty file refuses the start); a connection's first command must be `set <any key> 0 0 <len>` with data `<user> <password>` (answered `STORED`), every other command before it is answered `CLIENT_ERROR unauthenticated`; the binary protocol is not served (docs/SECURITY.md)",
        value: |c| Some(q(&c.auth_file.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())),
        apply: |c, v| c.auth_file = Some(v.path()).filter(|p| !p.as_os_str().is_empty()),
    },
    Setting {
        key: "native_token",
        long: "native-token",
        short: None,
        kind: Kind::Secret,
        help: "Token the native protocol's hello must carry (granary-client's ClientConfig::token; docs/SECURITY.md)",
        default: "none (`\"\"`)",
        meaning: "the native protocol listener requires this token in every hello; a hello without it or with another is answered `UNAUTHORIZED` and closed (docs/PROTOCOL.md, \"Handshake\"; docs/SECURITY.md)",
        value: |c| Some(q(c.native_token.as_deref().unwrap_or(""))),
        apply: |c, v| c.native_token = Some(v.text()).filter(|t| !t.is_empty()),
    },
    Setting {
        key: "tls_cert",
        long: "tls-cert",
        short: None,
        kind: Kind::Path,
        help: "TLS: the server's certificate chain (PEM); with --tls-key, the memcache, RESP and native listeners speak only TLS (docs/SECURITY.md)",
        default: "none (`\"\"`)",
        meaning: "with `tls_key`, the memcache, RESP and native listeners speak only TLS (rustls: TLS 1.2 and 1.3), presenting this PEM certificate chain (the server's certificate first); NBD and the metrics endpoint stay plain; an unreadable or invalid file refuses the start (docs/SECURITY.md)",
        value: |c| Some(q(&c.tls_cert.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())),
        apply: |c, v| c.tls_cert = Some(v.path()).filter(|p| !p.as_os_str().is_empty()),
    },
    Setting {
        key: "tls_key",
        long: "tls-key",
        short: None,
        kind: Kind::Path,
        help: "TLS: the private key of --tls-cert (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC)",
        default: "none (`\"\"`)",
        meaning: "the private key of `tls_cert` (a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block); required with `tls_cert`, and it must match the certificate (docs/SECURITY.md)",
        value: |c| Some(q(&c.tls_key.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())),
        apply: |c, v| c.tls_key = Some(v.path()).filter(|p| !p.as_os_str().is_empty()),
    },
    Setting {
        key: "tls_ca",
        long: "tls-ca",
        short: None,
        kind: Kind::Path,
        help: "TLS: CA certificates (PEM); given, every TLS client must present a certificate they signed",
        default: "none (`\"\"`)",
        meaning: "client certificates are required and verified: a TLS client must present a certificate chaining to one of these PEM CA certificates, else its handshake fails and it is closed; needs `tls_cert` and `tls_key` (docs/SECURITY.md)",
        value: |c| Some(q(&c.tls_ca.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())),
        apply: |c, v| c.tls_ca = Some(v.path()).filter(|p| !p.as_os_str().is_empty()),
    },
    Setting {
        key: "threads",
        long: "threads",
        short: Some('t'),
        kind: Kind::Int { name: "N", min: 0, max: THREADS_MAX as u64 },
        help: "Executor threads (memcached's -t); 0 = one per core",
        default: "`0` (one per core)",
        meaning: "executor threads, shared by all listeners",
        value: |c| Some(c.threads.to_string()),
        apply: |c, v| c.threads = v.int(),
    },
    Setting {
        key: "conn_limit",
        long: "conn-limit",
        short: Some('c'),
        kind: Kind::Int { name: "N", min: 1, max: usize::MAX as u64 },
        help: "Maximum simultaneous connections per listener (memcached's -c)",
        default: "`1024`",
        meaning: "simultaneous connections per listener; more are refused (`SERVER_ERROR too many open connections`, native `BUSY`, RESP `ERR max number of clients reached`, NBD `NBD_REP_ERR_POLICY`)",
        value: |c| Some(c.conn_limit.to_string()),
        apply: |c, v| c.conn_limit = v.int(),
    },
    Setting {
        key: "max_item_size",
        long: "max-item-size",
        short: Some('I'),
        kind: Kind::Size { min: 1, max: granary_memcache::limits::ITEM_BYTES_LIMIT as u64 },
        help: "Largest item value (memcached's -I), e.g. 1m, 64m",
        default: "1 MiB, or less for a store whose segments hold less (a little under 1 MiB for 1 MiB segments)",
        meaning: "largest value, every protocol (the RESP listener's `proto-max-bulk-len`; up to 1 GiB; the store's segments must hold it: a value set here that they do not hold is refused at start)",
        // Not printed when not set: read back, it would be set (and then
        // refused where the default is lowered to fit the store).
        value: |c| c.max_item_size_set.then(|| c.max_item_size.to_string()),
        apply: |c, v| {
            c.max_item_size = v.int();
            c.max_item_size_set = true;
        },
    },
    Setting {
        key: "idle_timeout",
        long: "idle-timeout",
        short: None,
        // Ten years: past it a deadline would overflow the clock.
        kind: Kind::Int { name: "SECS", min: 0, max: 315_360_000 },
        help: "Close connections idle (nothing received) for this many seconds; 0 = never (memcached's idle_timeout)",
        default: "`0` (never)",
        meaning: "close a connection that sends nothing for this long (memcached's `idle_timeout`; counted as `idle_kicks`)",
        value: |c| Some(c.idle_timeout.to_string()),
        apply: |c, v| c.idle_timeout = v.int(),
    },
    Setting {
        key: "memcache_namespace",
        long: "memcache-namespace",
        short: None,
        kind: Kind::Name,
        help: "The namespace the Memcache listener serves (it must exist: granary ns create)",
        default: "`default`",
        meaning: "the store's namespace the Memcache listener serves: its keys, its counts in `stats` (`curr_items`, `bytes`, `evictions`), and its `flush_all`, which truncates it; it must exist (`granary ns create`), else `serve` refuses to start",
        value: |c| Some(q(&c.memcache_namespace)),
        apply: |c, v| c.memcache_namespace = v.text(),
    },
    Setting {
        key: "enable_shutdown",
        long: "enable-shutdown",
        short: Some('A'),
        kind: Kind::Switch { sets: true },
        help: "Let the Memcache `shutdown` command stop the server (memcached's -A)",
        default: "`false`",
        meaning: "the Memcache `shutdown` command stops the server as SIGTERM does (drain, checkpoint, exit 0); off: it answers `ERROR: shutdown not enabled` (memcached's `-A`)",
        value: |c| Some(c.enable_shutdown.to_string()),
        apply: |c, v| c.enable_shutdown = v.bool(),
    },
    Setting {
        key: "blind_overwrite_mem",
        long: "blind-overwrite-mem",
        short: None,
        kind: Kind::Size { min: 0, max: u64::MAX },
        help: "DRAM for blind overwrites (sets that replace a key's one index candidate without reading its old record), e.g. 64m; 0 = off, every overwrite reads first",
        default: "`64m`",
        meaning: "DRAM for blind overwrites: a set of a key whose index neighbourhood holds one candidate replaces it without first reading the old record (one device read saved per overwrite), keeping the displaced index entry and the key in DRAM (the key plus 160 bytes) until GC, a checkpoint or a reader settles it (docs/ARCHITECTURE.md, \"Blind overwrites\"); past this, overwrites read the old record first; `0` turns them off",
        value: |c| Some(c.blind_overwrite_mem.to_string()),
        apply: |c, v| c.blind_overwrite_mem = v.int(),
    },
    Setting {
        key: "memory_limit",
        long: "memory-limit",
        short: Some('m'),
        kind: Kind::Int { name: "MEGABYTES", min: 0, max: 1 << 30 },
        help: "MiB of DRAM for a tier of hot values in front of the device (memcached's -m); 0 = off",
        default: "`64`",
        meaning: "DRAM tier of hot values in front of the device, in MiB (memcached's `-m`): a GET it serves reads nothing from the device; values are admitted on GET misses and evicted by S3-FIFO, and a write replaces or drops the key's copy, so it never serves a value older than the device's; counted as key + value + 256 bytes per item; starts empty at every start; `0` turns it off (docs/ARCHITECTURE.md, \"DRAM tier\"; `stats`' `granary_dram_*`)",
        value: |c| Some(c.memory_limit.to_string()),
        apply: |c, v| c.memory_limit = v.int(),
    },
    Setting {
        key: "io_spin_us",
        long: "io-spin-us",
        short: None,
        kind: Kind::Int { name: "N", min: 0, max: 1_000_000 },
        help: "Microseconds an executor polls for completions before sleeping while device IO it submitted is in flight; 0 sleeps at once (shared machines), at most 1000000",
        default: "`200`",
        meaning: "microseconds an executor polls for completions before sleeping in the kernel while device IO it submitted is in flight (a completion is then due within a device latency; sleeping adds a wake-up to each IO); 0 sleeps at once, which spares CPU on a machine shared with other work; at most 1,000,000. With no device IO in flight it polls 20 µs. An executor spins for IO only while at least half of its recent idle periods with IO in flight ended within this time, and neither spin runs while other tasks wait for the CPUs (`/proc/pressure/cpu`) or after a spin was preempted (docs/ARCHITECTURE.md, \"Choices measured\").",
        value: |c| Some(c.io_spin_us.to_string()),
        apply: |c, v| c.io_spin_us = v.int(),
    },
    Setting {
        key: "io_submit_early",
        long: "no-io-submit-early",
        short: None,
        kind: Kind::Switch { sets: false },
        help: "Submit device IO only once per executor round, never in the middle of one (see docs/CONFIG.md, `io_submit_early`)",
        default: "`true`",
        meaning: "submit device IO in the middle of an executor's scheduling round instead of only once per round: right after the request that queued it while the executor has recently waited for work, in batches of at least 1/8 of the device IO in flight while it is busy. Lower device latency and more IOPS when the executor has CPU to spare, more system calls otherwise (docs/ARCHITECTURE.md, \"Choices measured\"; docs/BENCHMARKS-HISTORY.md, \"Submitting at once while the executor has time\" and \"Mid-round submission in `serve`\")",
        value: |c| Some(c.io_submit_early.to_string()),
        apply: |c, v| c.io_submit_early = v.bool(),
    },
    Setting {
        key: "metrics",
        long: "metrics",
        short: None,
        kind: Kind::Addr,
        help: "Serve Prometheus metrics over HTTP at this address (GET /metrics), e.g. 127.0.0.1:9121",
        default: "off (`\"\"`)",
        meaning: "serve Prometheus metrics at `http://ADDR/metrics` (plain HTTP; 16 connections at once, more are closed at once; a request head of at most 8 KiB within 10 s)",
        value: |c| Some(q(&c.metrics.map(|m| m.to_string()).unwrap_or_default())),
        apply: |c, v| c.metrics = v.addr(),
    },
    Setting {
        key: "evict",
        long: "no-evict",
        short: None,
        kind: Kind::Switch { sets: false },
        help: "Store mode: never evict; writes to a full store fail with \"SERVER_ERROR out of memory storing object\". Default: cache mode (the least recently used segment is evicted when space runs low)",
        default: "`true`",
        meaning: "cache mode: evict the least recently used segment when space runs low; false = store mode (full store refuses writes)",
        value: |c| Some(c.evict.to_string()),
        apply: |c, v| c.evict = v.bool(),
    },
    Setting {
        key: "gc_policy",
        long: "gc-policy",
        short: None,
        kind: Kind::Choice { name: "POLICY", choices: &["cost-benefit", "greedy"] },
        help: "GC's victim choice: cost-benefit (LFS's, age-weighted) or greedy (fewest live bytes)",
        default: "`cost-benefit`",
        meaning: "which segment GC reclaims: `cost-benefit` (LFS's `(1 - u) * age / (1 + u)`: old cold segments are collected fuller than young ones whose data is still dying) or `greedy` (the fewest live bytes; best for uniform overwrites) (docs/ARCHITECTURE.md, \"Victim policy and hot/cold separation\"; `stats`' `granary_gc_policy`)",
        value: |c| Some(q(c.gc_policy.name())),
        apply: |c, v| c.gc_policy = GcPolicy::parse(&v.choice()).expect("a choice of the table"),
    },
    Setting {
        key: "gc_hot_cold",
        long: "gc-hot-cold",
        short: None,
        kind: Kind::Switch { sets: true },
        help: "GC relocates records that outlived an average key's lifetime to a segment stream of their own (hot/cold separation)",
        default: "`false`",
        meaning: "hot/cold separation of GC's relocations: records older than the store has records go to a third segment stream, apart from younger survivors; it gained 1-2% under Zipfian overwrites and cost 3-5% under uniform ones (docs/BENCHMARKS.md, \"Garbage collection\"; `stats`' `granary_gc_hot_cold`)",
        value: |c| Some(c.gc_hot_cold.to_string()),
        apply: |c, v| c.gc_hot_cold = v.bool(),
    },
    Setting {
        key: "gc_sepbit",
        long: "gc-sepbit",
        short: None,
        kind: Kind::Switch { sets: true },
        help: "Place writes by expected lifetime (SepBIT): an overwrite of a young version goes to a short-lived stream, GC's survivors to streams by age",
        default: "`false`",
        meaning: "SepBIT placement: an overwrite of a version younger than recently reclaimed short-lived segments lived goes to a short-lived user stream, and GC splits its survivors by age into three more streams (implies hot/cold relocation; ignored in zoned mode); 0.85x greedy's write amplification under Zipfian overwrites at 80% live against cost-benefit+hot-cold's 0.91x, and 1.06x under uniform ones (docs/BENCHMARKS.md, \"Garbage collection\"; `stats`' `granary_gc_sepbit`). A store written with it needs a build that knows its segment streams",
        value: |c| Some(c.gc_sepbit.to_string()),
        apply: |c, v| c.gc_sepbit = v.bool(),
    },
    Setting {
        key: "segment_summaries",
        long: "no-segment-summaries",
        short: None,
        kind: Kind::Switch { sets: false },
        help: "Write no segment summaries (the keys of a full segment's records, at its end, which let GC skip reading records that blind overwrites of their own keys made dead); keeps a store that has none openable by builds older than summaries",
        default: "`true`",
        meaning: "write a summary of its records' keys at the end of each full segment (at most 1/64 of it), so GC settles blind overwrites' links without reading the records they displaced (docs/FORMAT.md, \"Segment summary\"; `stats`' `granary_gc_summary_victims`, /metrics' `granary_gc_summary_victims_total`); false writes none, and a store that never had one stays openable by builds older than summaries. Ignored in zoned mode",
        value: |c| Some(c.segment_summaries.to_string()),
        apply: |c, v| c.segment_summaries = v.bool(),
    },
    Setting {
        key: "gc_watermark",
        long: "gc-watermark",
        short: None,
        kind: Kind::Choice { name: "MODE", choices: &["fixed", "queue", "doubling", "compact"] },
        help: "GC's low watermark (free segments kept ahead of writers): fixed, queue (DIDACache's M/M/1 model of the write rate), doubling (DIDACache's feedback heuristic) or compact (fixed, and GC compacts garbage between bursts of writes)",
        default: "`fixed`",
        meaning: "how GC's low watermark (the free segments below which it starts) is set: `fixed` (segments/32, 4 to 64, and at least 2 above the segments writers leave GC: 5 with hot/cold, 7 with SepBIT), `queue` (DIDACache's M/M/1 model, `lambda / (mu - lambda)` from the measured fill and reclaim rates), `doubling` (doubled when a writer waits for GC, lowered by one when GC catches up) or `compact` (fixed, and between bursts of writes GC relocates the live data of segments at most 4/5 live, never evicting, until room for the largest recent burst is free: lower p99 SET latency in bursts at no cost in hit ratio, more relocation writes; `granary_gc_compacted_total`) (docs/ARCHITECTURE.md, \"Adaptive low watermark\"; `stats`' `granary_gc_watermark`, `granary_gc_low_watermark`)",
        value: |c| Some(q(c.gc_watermark.name())),
        apply: |c, v| c.gc_watermark = Watermark::parse(&v.choice()).expect("a choice of the table"),
    },
    Setting {
        key: "discard",
        long: "discard",
        short: None,
        kind: Kind::Choice { name: "WHEN", choices: &["auto", "on", "off"] },
        help: "Discard the segments GC frees (BLKDISCARD on a block device, a punched hole in a file): auto (block devices only), on or off",
        default: "`auto`",
        meaning: "tell the device which segments GC freed: BLKDISCARD on a block device (its own GC stops copying them), a punched hole in a file (on every member of a stripe set); `auto` discards on block devices only, because a direct write into a hole in a file costs an extent conversion; the first discard that fails turns them off with a warning (docs/ARCHITECTURE.md, \"Discard\"; `stats`' `granary_gc_discard`)",
        value: |c| Some(q(c.discard.name())),
        apply: |c, v| c.discard = Discard::parse(&v.choice()).expect("a choice of the table"),
    },
    Setting {
        key: "flush",
        long: "flush",
        short: None,
        kind: Kind::Switch { sets: true },
        help: "fdatasync every write (survives power loss on drives without PLP)",
        default: "`false`",
        meaning: "fdatasync every write before acknowledging it (drives without power-loss protection)",
        value: |c| Some(c.flush.to_string()),
        apply: |c, v| c.flush = v.bool(),
    },
    Setting {
        key: "buffered",
        long: "buffered",
        short: None,
        kind: Kind::Switch { sets: true },
        help: "Use the page cache instead of direct IO (filesystems without O_DIRECT)",
        default: "`false`",
        meaning: "page cache instead of O_DIRECT (filesystems without direct IO)",
        value: |c| Some(c.buffered.to_string()),
        apply: |c, v| c.buffered = v.bool(),
    },
    Setting {
        key: "io",
        long: "io",
        short: None,
        kind: Kind::Choice { name: "IO", choices: &["uring", "sync"] },
        help: "Device IO of requests: uring (through each executor's io_uring) or sync (pread/pwrite, blocking the executor thread)",
        default: "`uring`",
        meaning: "device IO of requests: through each executor's io_uring, or blocking pread/pwrite (the executors run on io_uring rings either way: Linux 6.0 or later)",
        value: |c| Some(q(if c.io == Io::Uring { "uring" } else { "sync" })),
        apply: |c, v| c.io = if v.choice() == "sync" { Io::Sync } else { Io::Uring },
    },
    Setting {
        key: "log_format",
        long: "log-format",
        short: None,
        kind: Kind::Choice { name: "FORMAT", choices: &["text", "json"] },
        help: "Log lines as text or JSON (one object per line)",
        default: "`text`",
        meaning: "log lines as text, or one JSON object per line",
        value: |c| Some(q(if c.log_format == LogFormat::Json { "json" } else { "text" })),
        apply: |c, v| c.log_format = if v.choice() == "json" { LogFormat::Json } else { LogFormat::Text },
    },
];

impl Setting {
    /// Its clap argument (id: the key).
    fn arg(&'static self) -> clap::Arg {
        let mut help = self.help.to_string();
        if !matches!(self.kind, Kind::Switch { .. }) {
            help += &format!(" [default: {}]", self.default.replace('`', ""));
        }
        let arg = clap::Arg::new(self.key).long(self.long).short(self.short).help(help);
        let (key, kind) = (self.key, self.kind);
        match kind {
            // `--flush` sets it; `--flush=false` sets it back (a file's
            // `flush = true` is undone from the command line).
            Kind::Switch { .. } => arg
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .value_name("BOOL")
                .value_parser(clap::builder::BoolValueParser::new()),
            // clap lists the choices in --help and in the error for another.
            Kind::Choice { name, choices } => {
                arg.value_name(name).value_parser(PossibleValuesParser::new(choices).map(Value::Choice))
            }
            // Paths are not necessarily UTF-8, and may be empty, as in the
            // file: `--aclfile ""` unsets a file's aclfile (clap's path
            // parser refuses an empty value).
            Kind::Path => arg
                .value_name(kind.value_name())
                .value_parser(clap::builder::OsStringValueParser::new().map(|s| Value::Path(PathBuf::from(s)))),
            _ => arg
                .value_name(kind.value_name())
                .value_parser(move |s: &str| kind.parse(s).map_err(|e| format!("{key}: {e}"))),
        }
    }

    /// Its value on the command line, if given there.
    fn given(&self, m: &clap::ArgMatches) -> Option<Value> {
        match self.kind {
            // `--no-native=false` is native = true.
            Kind::Switch { sets } => m.get_one::<bool>(self.key).map(|&given| Value::Bool(given == sets)),
            _ => m.get_one::<Value>(self.key).cloned(),
        }
    }

    /// docs/CONFIG.md's "flag" cell.
    fn flag_cell(&self) -> String {
        let short = self.short.map(|c| format!("`-{c}`, ")).unwrap_or_default();
        let long = match self.kind {
            Kind::Switch { sets: true } => format!("`--{}` (`--{0}=false` sets false)", self.long),
            Kind::Switch { sets: false } => format!("`--{}` (sets false; `--{0}=false` sets true)", self.long),
            Kind::Choice { choices, .. } => format!("`--{} {}`", self.long, choices.join("\\|")),
            k => format!("`--{} {}`", self.long, k.value_name()),
        };
        short + &long
    }
}

/// The settings given as flags on the command line, in [`SETTINGS`]' order:
/// the serve subcommand flattens this (`#[command(flatten)]`), which adds a
/// flag per setting.
pub struct SettingFlags(pub Vec<(&'static Setting, Value)>);

impl clap::Args for SettingFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        SETTINGS.iter().fold(cmd, |cmd, s| cmd.arg(s.arg()))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for SettingFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(SettingFlags(SETTINGS.iter().filter_map(|s| Some((s, s.given(m)?))).collect()))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        for (s, v) in Self::from_arg_matches(m)?.0 {
            self.0.retain(|(old, _)| old.key != s.key);
            self.0.push((s, v));
        }
        Ok(())
    }
}

/// Every setting a TOML text sets, in the text's order. A key that is not
/// a setting, or a value its setting does not take, is an error naming the
/// line and the key.
pub fn parse_toml(text: &str) -> Result<Vec<(&'static Setting, Value)>, String> {
    use toml::Spanned;
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let table: std::collections::BTreeMap<Spanned<String>, Spanned<toml::Value>> =
        toml::from_str(text).map_err(|e| {
            let at = e.span().map(|r| format!("line {}: ", line(r.start))).unwrap_or_default();
            format!("{at}{}", e.message().trim_end())
        })?;
    let mut entries: Vec<_> = table.into_iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    entries
        .into_iter()
        .map(|(k, v)| {
            let Some(s) = SETTINGS.iter().find(|s| s.key == k.get_ref()) else {
                let keys: Vec<String> = SETTINGS.iter().map(|s| format!("`{}`", s.key)).collect();
                return Err(format!(
                    "line {}: unknown key `{}`, expected one of {}",
                    line(k.span().start),
                    k.get_ref(),
                    keys.join(", ")
                ));
            };
            let value =
                s.kind.read_toml(v.get_ref()).map_err(|e| format!("line {}: {}: {e}", line(v.span().start), s.key))?;
            Ok((s, value))
        })
        .collect()
}

/// The settings the TOML file at `p` sets ([`parse_toml`]; errors name the file).
pub fn read_file(p: &Path) -> Result<Vec<(&'static Setting, Value)>, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    parse_toml(&text).map_err(|e| format!("{}: {e}", p.display()))
}

/// The configuration as TOML (what `--print-config` shows; it reads back
/// as the same configuration).
pub fn to_toml(c: &Config) -> String {
    let mut t = String::from("# granary serve: effective configuration (flags > --config file > defaults)\n");
    for s in SETTINGS {
        match (s.value)(c) {
            Some(v) => t += &format!("{} = {v}\n", s.key),
            // Not set, and decided later: what decides it, as the docs say.
            None => t += &format!("# {}: not set: {}\n", s.key, s.default.replace('`', "")),
        }
    }
    t
}

/// docs/CONFIG.md's settings table.
pub fn markdown_table() -> String {
    let mut t = String::from("| key | flag | default | meaning |\n|---|---|---|---|\n");
    for s in SETTINGS {
        t += &format!("| `{}` | {} | {} | {} |\n", s.key, s.flag_cell(), s.default, s.meaning);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::ServeArgs;
    use clap::{Args, FromArgMatches};

    fn repo_file(rel: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn serve_command() -> clap::Command {
        ServeArgs::augment_args(clap::Command::new("serve"))
    }

    /// `granary serve ARGS` as far as the configuration: the error clap or
    /// the file gives, as text.
    fn parse(args: &[&str]) -> Result<Config, String> {
        let m = serve_command().try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()));
        let a = ServeArgs::from_arg_matches(&m.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        Config::resolve(&a)
    }

    fn toml_of(args: &[&str]) -> String {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).to_toml()
    }

    /// Flags that set `s` to a value other than its default: with its long
    /// flag, and with its short one where it has one.
    fn flags_for(s: &Setting) -> Vec<Vec<String>> {
        let value = match s.kind {
            Kind::Switch { .. } => None,
            Kind::Int { min, .. } => Some((min + 7).to_string()),
            Kind::Size { .. } => Some("3M".to_string()),
            Kind::Path => Some("/tmp/granary-settings-test/x.db".to_string()),
            Kind::Ip => Some("10.1.2.3".to_string()),
            Kind::Addr => Some("127.0.0.1:9".to_string()),
            Kind::Name => Some("users".to_string()),
            // Characters TOML and Rust's debug format escape differently.
            Kind::Secret => Some("s3cret pass \u{ad}\"\\".to_string()),
            Kind::Choice { choices, .. } => Some(choices[choices.len() - 1].to_string()),
        };
        let names = std::iter::once(format!("--{}", s.long)).chain(s.short.map(|c| format!("-{c}")));
        names.map(|n| std::iter::once(n).chain(value.clone()).collect()).collect()
    }

    #[test]
    fn config_md_table_is_the_settings_table() {
        let doc = repo_file("docs/CONFIG.md");
        let table = markdown_table();
        assert!(
            doc.contains(&table),
            "docs/CONFIG.md's settings table disagrees with crates/cli/src/settings.rs \
             (`granary serve --print-settings-table` prints it); it must read:\n{table}"
        );
    }

    #[test]
    fn the_readme_serve_line_names_every_setting_flag() {
        let readme = repo_file("README.md");
        let line = readme.lines().find(|l| l.starts_with("granary serve ")).expect("README has a `granary serve` line");
        for s in SETTINGS {
            let flags = std::iter::once(format!("--{}", s.long)).chain(s.short.map(|c| format!("-{c}")));
            assert!(
                flags.into_iter().any(|f| line.contains(&format!("[{f} "))
                    || line.contains(&format!("[{f}]"))
                    || line.contains(&format!("| {f}"))),
                "README's `granary serve` line lacks {} ({})",
                s.key,
                s.flag_cell()
            );
        }
    }

    /// clap's own checks (no flag or short flag twice, among the settings and
    /// the other flags), and the naming rule: the long flag is the key.
    #[test]
    fn the_flags_are_well_formed() {
        serve_command().debug_assert();
        for s in SETTINGS {
            let dashed = s.key.replace('_', "-");
            let want = if matches!(s.kind, Kind::Switch { sets: false }) { format!("no-{dashed}") } else { dashed };
            assert_eq!(s.long, want, "{}'s flag", s.key);
        }
    }

    /// Each setting, given as a flag, changes its own line of
    /// `--print-config` and no other; that output, as the file, reads back
    /// as the same configuration; and the flag wins over a file setting
    /// every key.
    #[test]
    fn every_setting_round_trips_flag_config_print_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = toml_of(&["--size", "64M"]);
        let all_keys = dir.path().join("all.toml");
        std::fs::write(&all_keys, &base).unwrap();
        for s in SETTINGS {
            for flags in flags_for(s) {
                let mut args: Vec<&str> = flags.iter().map(|f| f.as_str()).collect();
                if s.key != "size" {
                    args.extend(["--size", "64M"]);
                }
                let printed = toml_of(&args);
                let own_line =
                    |l: &&str| l.starts_with(&format!("{} = ", s.key)) || l.starts_with(&format!("# {}:", s.key));
                let changed: Vec<&str> = printed.lines().filter(|l| !base.lines().any(|b| b == *l)).collect();
                assert!(!changed.is_empty() && changed.iter().all(own_line), "{flags:?} changed {changed:?}");
                let gone: Vec<&str> = base.lines().filter(|b| !printed.lines().any(|l| l == *b)).collect();
                assert!(gone.iter().all(own_line), "{flags:?} changed {gone:?}");

                let file = dir.path().join(format!("{}.toml", s.key));
                std::fs::write(&file, &printed).unwrap();
                assert_eq!(toml_of(&["--config", file.to_str().unwrap()]), printed, "{} from the file", s.key);
                let over_file = [&["--config", all_keys.to_str().unwrap()], &args[..]].concat();
                assert_eq!(toml_of(&over_file), printed, "{flags:?} over a file setting {}", s.key);
            }
        }
    }

    #[test]
    fn the_file_wins_over_defaults_and_flags_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("g.toml");
        std::fs::write(&file, "port = 1\nconn_limit = 3\nnative = true\nflush = false\nmetrics = \"127.0.0.1:9\"\n")
            .unwrap();
        let f = file.to_str().unwrap();
        let c = parse(&["--config", f, "-p", "4242", "--no-native", "--flush", "--size", "64M"]).unwrap();
        assert_eq!((c.port, c.conn_limit, c.native, c.flush), (4242, 3, false, true));
        assert_eq!(c.metrics, Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(c.native_port, granary_proto::DEFAULT_PORT, "a default neither gives");
        let c = parse(&["--config", f, "--metrics", "", "--size", "64M"]).unwrap();
        assert_eq!(c.metrics, None, "--metrics \"\" turns off the file's");
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_line() {
        for (text, line, key) in
            [("port = 1\nbogus = true\n", 2, "bogus"), ("port = 1\n[section]\na = 1\n", 2, "section")]
        {
            let e = parse_toml(text).unwrap_err();
            assert!(e.starts_with(&format!("line {line}: unknown key `{key}`, expected one of `data`, ")), "{e}");
            assert!(SETTINGS.iter().all(|s| e.contains(&format!("`{}`", s.key))), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "bogus = 1\n").unwrap();
        let e = parse(&["--config", file.to_str().unwrap()]).unwrap_err();
        assert_eq!(e.split(": line 1: ").next(), Some(file.to_str().unwrap()), "{e}");
    }

    #[test]
    fn a_bad_value_in_the_file_names_the_key_and_what_it_takes() {
        for (text, want) in [
            ("port = \"abc\"", "line 1: port: expected an integer, found string \"abc\""),
            ("\nflush = 1", "line 2: flush: expected true or false, found integer 1"),
            (
                "size = 1.5",
                "line 1: size: expected a size (an integer of bytes, or a string such as \"64M\"), found float 1.5",
            ),
            ("size = \"12Q\"", "line 1: size: unknown size unit \"q\" in \"12Q\" (use K, M, G or T)"),
            ("size = 0", "line 1: size: 0 is out of range (at least 1)"),
            ("port = 70000", "line 1: port: 70000 is out of range (0 to 65535)"),
            ("threads = -1", "line 1: threads: -1 is out of range (0 to 4096)"),
            ("threads = 1000000", "line 1: threads: 1000000 is out of range (0 to 4096)"),
            ("max_item_size = \"2G\"", "line 1: max_item_size: 2147483648 is out of range (1 to 1073741824)"),
            // A secret's value is never echoed.
            ("requirepass = 12345678", "line 1: requirepass: expected a string (\"\" for none), found integer"),
            ("conn_limit = 0", "line 1: conn_limit: 0 is out of range (at least 1)"),
            ("io_spin_us = 1000001", "line 1: io_spin_us: 1000001 is out of range (0 to 1000000)"),
            // Past ten years a connection's deadline would overflow the clock.
            ("idle_timeout = 315360001", "line 1: idle_timeout: 315360001 is out of range (0 to 315360000)"),
            ("io = \"fast\"", "line 1: io: \"fast\" is not one of \"uring\", \"sync\""),
            ("gc_policy = \"lru\"", "line 1: gc_policy: \"lru\" is not one of \"cost-benefit\", \"greedy\""),
            (
                "gc_watermark = \"adaptive\"",
                "line 1: gc_watermark: \"adaptive\" is not one of \"fixed\", \"queue\", \"doubling\", \"compact\"",
            ),
            ("discard = true", "line 1: discard: expected one of \"auto\", \"on\", \"off\", found boolean true"),
            ("gc_hot_cold = \"yes\"", "line 1: gc_hot_cold: expected true or false, found string \"yes\""),
            ("listen = \"1.2.3\"", "line 1: listen: \"1.2.3\" is not an IP address like 127.0.0.1 or ::1"),
            ("metrics = \"nope\"", "line 1: metrics: \"nope\" is not an address like 127.0.0.1:9121"),
            ("data = 5", "line 1: data: expected a path (a string), found integer 5"),
            ("evict = [true]", "line 1: evict: expected true or false, found array"),
        ] {
            assert_eq!(parse_toml(text).map(|_| ()), Err(want.to_string()), "{text}");
        }
    }

    #[test]
    fn a_bad_flag_value_is_refused_naming_the_key() {
        for (args, want) in [
            (&["-p", "abc"][..], "port: \"abc\" is not a whole number"),
            (&["--port", "70000"], "port: 70000 is out of range (0 to 65535)"),
            (&["--size", "12Q"], "size: unknown size unit"),
            (&["--size", "0"], "size: 0 is out of range (at least 1)"),
            (&["-c", "0"], "conn_limit: 0 is out of range (at least 1)"),
            (&["--io-spin-us", "1000001"], "io_spin_us: 1000001 is out of range"),
            (&["--metrics", "nope"], "metrics: \"nope\" is not an address"),
            (&["-l", "1.2.3"], "listen: \"1.2.3\" is not an IP address"),
            (&["--io", "fast"], "[possible values: uring, sync]"),
            (&["--gc-policy", "lru"], "[possible values: cost-benefit, greedy]"),
            (&["--gc-watermark", "adaptive"], "[possible values: fixed, queue, doubling, compact]"),
            (&["--discard", "yes"], "[possible values: auto, on, off]"),
            (&["--gc-hot-cold=yes"], "invalid value 'yes' for '--gc-hot-cold[=<BOOL>]'"),
            (&["--no-native=1"], "[possible values: true, false]"),
            (&["-p", "1", "-p", "2"], "cannot be used multiple times"),
        ] {
            let e = parse(args).map(|_| ()).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    /// A switch's flag sets it, and with `=false` sets it back: a file's
    /// switch is undone from the command line (and a flag that sets false,
    /// `--no-X`, sets true with `=false`).
    #[test]
    fn a_switch_flag_undoes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("on.toml");
        std::fs::write(&file, "flush = true\nnative = false\nevict = false\n").unwrap();
        let f = file.to_str().unwrap();
        let c = parse(&["--config", f]).unwrap();
        assert_eq!((c.flush, c.native, c.evict), (true, false, false));
        let c = parse(&["--config", f, "--flush=false", "--no-native=false", "--no-evict=false"]).unwrap();
        assert_eq!((c.flush, c.native, c.evict), (false, true, true));
        let c = parse(&["--flush", "--no-native", "--flush=true"]);
        assert!(c.unwrap_err().contains("cannot be used multiple times"));
        let c = parse(&["--flush", "--no-native", "--buffered=true"]).unwrap();
        assert_eq!((c.flush, c.native, c.buffered), (true, false, true));
    }

    /// A setting whose `0` means off takes it from a flag as from the file;
    /// the others refuse it.
    #[test]
    fn zero_blind_overwrite_mem_is_off_from_a_flag_too() {
        assert_eq!(parse(&["--blind-overwrite-mem", "0", "--size", "64M"]).unwrap().blind_overwrite_mem, 0);
        let file: Vec<_> =
            parse_toml("blind_overwrite_mem = 0").unwrap().into_iter().map(|(s, v)| (s.key, v)).collect();
        assert_eq!(file, [("blind_overwrite_mem", Value::Int(0))]);
        assert!(parse(&["-I", "0"]).is_err());
    }

    /// docs/CONFIG.md's defaults that are values (`1024`, `64m`, `true`)
    /// are what the settings start from.
    #[test]
    fn the_documented_defaults_are_the_defaults() {
        let defaults = Config::defaults();
        let mut checked = 0;
        for s in SETTINGS {
            let Some(doc) = s.default.strip_prefix('`').and_then(|d| d.split('`').next()) else { continue };
            let mut c = defaults.clone();
            (s.apply)(&mut c, s.kind.parse(doc).unwrap_or_else(|e| panic!("{}: {e}", s.key)));
            assert_eq!((s.value)(&c), (s.value)(&defaults), "docs/CONFIG.md gives {}'s default as {doc}", s.key);
            checked += 1;
        }
        // The others: size, segment_size and max_item_size (computed),
        // metrics, the three secrets, the auth and ACL files and the three
        // TLS files (none: `""`).
        assert!(checked >= SETTINGS.len() - 11, "only {checked} defaults checked");
    }
}
