//! `granary`'s commands other than `serve`, one module each: what the
//! command takes (its clap arguments) and what it does.
//!
//! Exit codes, for every command: 0 success; 1 the key is absent (`get`,
//! `del`), a conditional put did not store, a `batch`'s condition failed
//! (nothing applied), or `verify` found problems; 2 an error, printed as
//! one line on stderr.

pub mod batch;
pub mod create;
pub mod export;
pub mod kv;
pub mod load;
pub mod ns;
pub mod rekey;
pub mod stat;
pub mod verify;

use granary_store::io::OpenMode;
use granary_store::{Durability, OpenOptions, Store};
use std::path::PathBuf;

/// A local store: the path and how to open it.
#[derive(clap::Args, Clone)]
pub struct DeviceArgs {
    /// Store file or block device.
    pub path: PathBuf,
    /// Use the page cache instead of direct IO (for filesystems without O_DIRECT).
    #[arg(long)]
    pub buffered: bool,
    /// Ignore index checkpoints on open: rebuild the index by scanning the whole log.
    #[arg(long)]
    pub no_checkpoint: bool,
}

/// Where a command that works on a local store or on a server goes: with
/// `--server`, that server's native protocol; else the local store, opened
/// as these flags say.
#[derive(clap::Args, Clone)]
pub struct ConnArgs {
    /// A server's native protocol address (HOST:PORT, IP:PORT or [IPv6]:PORT;
    /// the port defaults to 43345: HOST, IP, IPv6 or [IPv6] alone).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// Request timeout in milliseconds with --server [default: 5000].
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// With --server: a file holding the token of a server started with
    /// --native-token (its bytes, less a trailing newline; a file rather
    /// than an argument, which other users could read in the process list).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// With --server: speak TLS, trusting the CA certificates in FILE (PEM),
    /// for a server started with --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// With --tls-ca: present this client certificate (PEM; with
    /// --tls-key), for a server started with --tls-ca.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// With --tls-ca: the name the server's certificate must carry (default:
    /// the address connected to).
    #[arg(long, value_name = "NAME")]
    pub tls_name: Option<String>,
    /// Use the page cache instead of direct IO (local store only).
    #[arg(long)]
    pub buffered: bool,
    /// Ignore index checkpoints on open (local store only).
    #[arg(long)]
    pub no_checkpoint: bool,
}

impl ConnArgs {
    /// The options that only a server connection uses, when given without
    /// `--server` (they would be ignored): an error naming them.
    pub fn remote_only_given(&self) -> Result<(), String> {
        let given: Vec<&str> = [
            (self.timeout_ms.is_some(), "--timeout-ms"),
            (self.token_file.is_some(), "--token-file"),
            (self.tls_ca.is_some(), "--tls-ca"),
            (self.tls_cert.is_some(), "--tls-cert"),
            (self.tls_key.is_some(), "--tls-key"),
            (self.tls_name.is_some(), "--tls-name"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        match given.is_empty() {
            true => Ok(()),
            false => {
                Err(format!("{}: only with --server (a local store has no timeout, token or TLS)", given.join(", ")))
            }
        }
    }
}

/// Direct IO unless `--buffered`.
pub fn mode(buffered: bool) -> OpenMode {
    if buffered {
        OpenMode::Buffered
    } else {
        OpenMode::Direct
    }
}

/// Options to open a store for writing (`flush`: durability mode; GC runs
/// so a full store can make room) or, with `read_only`, for an inspection
/// that writes nothing: no GC, no checkpoints, and recovery mends nothing
/// (torn records and superblock copies stay as they are).
pub fn open_options(dev: &DeviceArgs, flush: bool, read_only: bool) -> OpenOptions {
    let mut opts = OpenOptions {
        durability: if flush { Durability::Flush } else { Durability::Direct },
        gc: !read_only,
        progress: granary_cli::progress::recovery(),
        use_checkpoint: !dev.no_checkpoint,
        ..OpenOptions::default()
    };
    if read_only {
        opts.checkpoint_interval = None;
        opts.checkpoint_on_close = false;
        // Inspections leave the device as it is: torn records stay (and
        // are ignored), so verify never erases what it should report, and
        // a lagging or damaged superblock copy is not rewritten.
        opts.clear_torn = false;
    }
    opts
}

/// Open the store at `dev` (see [`open_options`]); with `read_only`, the
/// device for reading only, under a shared lock (inspections run side by
/// side, and on a file they may not write).
pub fn open_store(dev: &DeviceArgs, flush: bool, read_only: bool) -> Result<Store, String> {
    let opts = open_options(dev, flush, read_only);
    let open = if read_only { Store::open_path_read_only } else { Store::open_path };
    open(&dev.path, mode(dev.buffered), &opts).map_err(|e| e.to_string())
}

/// Open the store at `dev` for writing, run `f` on it, and close it
/// whatever `f` returns, so the next open loads a clean checkpoint instead
/// of recovering; `f`'s error comes first.
pub fn with_store<T>(dev: &DeviceArgs, flush: bool, f: impl FnOnce(&Store) -> Result<T, String>) -> Result<T, String> {
    let store = open_store(dev, flush, false)?;
    let r = f(&store);
    let closed = store.close().map_err(|e| e.to_string());
    let v = r?;
    closed?;
    Ok(v)
}
