//! `granary put`, `get` and `del`: one key on a local store (PATH) or on a
//! running server (`--server HOST:PORT`, the native protocol), in the
//! default namespace or the one `--ns NAME` names (on a server through the
//! client's namespaces, protocol version 2).

use super::{open_store, with_store, DeviceArgs};
use granary_store::{PutMode, PutOutcome, DEFAULT_NAMESPACE};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where `get`, `put` and `del` go: a local store (PATH, the first
/// positional argument) or a server's native protocol port.
#[derive(clap::Args, Clone)]
pub struct TargetArgs {
    #[command(flatten)]
    conn: super::ConnArgs,
    /// The key's namespace (`granary ns list`; default: the default
    /// namespace), on a local store or on the server.
    #[arg(long, value_name = "NAME")]
    ns: Option<String>,
}

/// A resolved target.
enum Target {
    /// A local store and the namespace of the key.
    Local { dev: DeviceArgs, ns: String },
    /// A server and the namespace of the key ("": the default one).
    Remote { client: granary_client::Client, ns: String },
}

/// A client of the server at `server` (HOST:PORT, or HOST for the default
/// port), one connection, requests timing out after `--timeout-ms`, with
/// the token and TLS settings `conn` names.
pub(super) fn connect(server: &str, conn: &super::ConnArgs) -> Result<granary_client::Client, String> {
    let addr = server_addr(server);
    let mut cfg = granary_client::ClientConfig {
        timeout: std::time::Duration::from_millis(conn.timeout_ms.unwrap_or(5000).max(1)),
        connections: 1,
        ..Default::default()
    };
    if let Some(f) = &conn.token_file {
        let mut token = std::fs::read(f).map_err(|e| format!("--token-file {}: {e}", f.display()))?;
        while token.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            token.pop();
        }
        if token.is_empty() {
            return Err(format!("--token-file {}: the file is empty", f.display()));
        }
        cfg = cfg.with_token(token);
    }
    match (&conn.tls_ca, &conn.tls_name) {
        (Some(ca), name) => {
            let id = conn.tls_cert.as_deref().zip(conn.tls_key.as_deref());
            let mut tls = granary_client::Tls::from_pem(ca, id).map_err(|e| e.to_string())?;
            if let Some(n) = name {
                tls = tls.with_server_name(n.clone());
            }
            cfg = cfg.with_tls(tls);
        }
        (None, Some(_)) => return Err("--tls-name needs --tls-ca".into()),
        (None, None) if conn.tls_cert.is_some() => return Err("--tls-cert needs --tls-ca".into()),
        (None, None) => {}
    }
    granary_client::Client::connect(addr.as_str(), cfg).map_err(|e| format!("{addr}: {e}"))
}

impl TargetArgs {
    /// Split ARGS into the target and the rest: between `min` and `max`
    /// arguments after PATH (or after `--server`).
    fn resolve(self, mut args: Vec<OsString>, min: usize, max: usize) -> Result<(Target, Vec<OsString>), String> {
        // `put` takes a value after the key; `get` and `del` do not.
        let rest = if max > 1 { "KEY [VALUE]" } else { "KEY" };
        let usage = |form: &str| format!("expected {form}");
        match self.conn.server.clone() {
            Some(s) => {
                if args.len() < min || args.len() > max {
                    return Err(usage(&format!("{rest} after --server HOST:PORT")));
                }
                if self.conn.buffered || self.conn.no_checkpoint {
                    return Err("--buffered and --no-checkpoint apply to a local store, not --server".into());
                }
                let client = connect(&s, &self.conn)?;
                Ok((Target::Remote { client, ns: self.ns.unwrap_or_default() }, args))
            }
            None => {
                if args.len() < min + 1 || args.len() > max + 1 {
                    return Err(usage(&format!("PATH {rest} (or --server HOST:PORT {rest})")));
                }
                self.conn.remote_only_given()?;
                let path = PathBuf::from(args.remove(0));
                let dev = DeviceArgs { path, buffered: self.conn.buffered, no_checkpoint: self.conn.no_checkpoint };
                let ns = self.ns.unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
                Ok((Target::Local { dev, ns }, args))
            }
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Mode {
    Upsert,
    Add,
    Replace,
}

/// Store a value: from the argument, or from stdin when absent or "-".
/// `granary put PATH KEY [VALUE]`, or `granary put --server HOST:PORT KEY [VALUE]`.
#[derive(clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// [PATH] KEY [VALUE]: PATH only without --server.
    #[arg(value_name = "ARGS", required = true, num_args = 1..=3)]
    args: Vec<OsString>,
    /// upsert (default), add (only if absent) or replace (only if present).
    #[arg(long, value_enum, default_value = "upsert")]
    mode: Mode,
    /// fdatasync after the write (survives power loss on drives without PLP; local only).
    #[arg(long)]
    flush: bool,
}

/// Print a value to stdout; exit 1 if the key is absent.
/// `granary get PATH KEY`, or `granary get --server HOST:PORT KEY`.
#[derive(clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// [PATH] KEY: PATH only without --server.
    #[arg(value_name = "ARGS", required = true, num_args = 1..=2)]
    args: Vec<OsString>,
}

/// Delete a key; exit 1 if it was absent.
/// `granary del PATH KEY`, or `granary del --server HOST:PORT KEY`.
#[derive(clap::Args)]
pub struct DelArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// [PATH] KEY: PATH only without --server.
    #[arg(value_name = "ARGS", required = true, num_args = 1..=2)]
    args: Vec<OsString>,
    /// fdatasync after the write (local only).
    #[arg(long)]
    flush: bool,
}

fn local_only_flush(flush: bool, target: &Target) -> Result<(), String> {
    if flush && matches!(target, Target::Remote { .. }) {
        return Err("--flush applies to a local store; a server's durability is its own setting".into());
    }
    Ok(())
}

/// The size of the device at `path` (a stripe set's members summed), from
/// each member's end, without opening the store (no lock taken); None when
/// a member is missing or is neither a regular file nor a block device
/// (a FIFO's open would wait for a writer).
fn device_bytes(path: &std::path::Path) -> Option<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    let spec = granary_store::io::DeviceSpec::parse(path).ok()?;
    let member = |p: &std::path::Path| -> Option<u64> {
        let kind = std::fs::metadata(p).ok()?.file_type();
        if !kind.is_file() && !kind.is_block_device() {
            return None;
        }
        std::fs::File::open(p).ok()?.seek(SeekFrom::End(0)).ok()
    };
    spec.paths().into_iter().map(member).sum()
}

/// The value on stdin (`input`), at most `max` bytes (`why`: the limit's
/// reason, for the refusal).
fn read_value(input: impl Read, max: u64, why: &str) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    input
        .take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read the value from stdin: {e}"))?;
    if buf.len() as u64 > max {
        return Err(format!("the value on stdin is over {max} bytes: {why}"));
    }
    Ok(buf)
}

fn not_found(key: &OsString) -> ExitCode {
    eprintln!("granary: key not found: {}", key.to_string_lossy());
    ExitCode::from(1)
}

pub fn put(a: PutArgs) -> Result<ExitCode, String> {
    let (target, mut args) = a.target.resolve(a.args, 1, 2)?;
    local_only_flush(a.flush, &target)?;
    let key = args.remove(0);
    // A value on stdin is read before the store is opened (the command
    // before it in a pipeline may hold it still: `granary get db a |
    // granary put db b`), up to what the target could hold, and refused
    // past it rather than read whole (`</dev/zero` would grow until the
    // process is killed): a local store's device size (learned without
    // opening the store), a server's largest value (its hello); the store
    // refuses what is over its own limit for the key.
    let value = match args.pop().filter(|v| v != "-") {
        Some(v) => v.as_bytes().to_vec(),
        None => {
            let (max, why) = match &target {
                Target::Local { dev, .. } => match device_bytes(&dev.path) {
                    Some(n) => (n.min(granary_store::VALUE_BYTES_MAX), "the store's device is no larger".to_string()),
                    // Missing, or neither a file nor a block device: the
                    // open says which, before anything is read.
                    None => {
                        with_store(dev, false, |_| Ok(()))?;
                        (granary_store::VALUE_BYTES_MAX, "no store holds a longer value".to_string())
                    }
                },
                Target::Remote { client, .. } => {
                    let max = client.conn().map_err(|e| e.to_string())?.server_hello().value_bytes_max;
                    (max as u64, "the server takes values up to that".to_string())
                }
            };
            read_value(std::io::stdin(), max, &why)?
        }
    };
    let stored = match target {
        Target::Local { dev, ns } => {
            let pm = match a.mode {
                Mode::Upsert => PutMode::Upsert,
                Mode::Add => PutMode::CreateOnly,
                Mode::Replace => PutMode::ReplaceOnly,
            };
            let outcome = with_store(&dev, a.flush, |store| {
                store.namespace(&ns).and_then(|ns| ns.put_with(key.as_bytes(), &value, pm)).map_err(|e| e.to_string())
            })?;
            outcome == PutOutcome::Stored
        }
        Target::Remote { client, ns } => {
            let pm = match a.mode {
                Mode::Upsert => granary_client::PutMode::Upsert,
                Mode::Add => granary_client::PutMode::CreateOnly,
                Mode::Replace => granary_client::PutMode::ReplaceOnly,
            };
            client.ns(&ns).put_with(key.as_bytes(), &value, pm).map_err(|e| e.to_string())?
        }
    };
    match (stored, a.mode) {
        (true, _) => Ok(ExitCode::SUCCESS),
        (false, Mode::Add) => {
            eprintln!("granary: not stored: key exists (--mode add)");
            Ok(ExitCode::from(1))
        }
        (false, _) => {
            eprintln!("granary: not stored: key not found (--mode replace)");
            Ok(ExitCode::from(1))
        }
    }
}

pub fn get(a: GetArgs) -> Result<ExitCode, String> {
    let (target, args) = a.target.resolve(a.args, 1, 1)?;
    let key = &args[0];
    let v = match target {
        Target::Local { dev, ns } => {
            // The store outlives the handle: a handle on a closed store refuses calls.
            let store = open_store(&dev, false, true)?;
            store.namespace(&ns).and_then(|ns| ns.get(key.as_bytes())).map_err(|e| e.to_string())?
        }
        Target::Remote { client, ns } => client.ns(&ns).get(key.as_bytes()).map_err(|e| e.to_string())?,
    };
    match v {
        Some(v) => {
            let mut out = std::io::stdout().lock();
            match out.write_all(&v).and_then(|_| out.flush()) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                // Its reader stopped (`| head -c 100`): quietly, as any
                // command whose output is closed.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    Ok(ExitCode::from(granary_cli::logging::CLOSED_STDOUT_EXIT))
                }
                Err(e) => Err(format!("cannot write to stdout: {e}")),
            }
        }
        None => Ok(not_found(key)),
    }
}

pub fn del(a: DelArgs) -> Result<ExitCode, String> {
    let (target, args) = a.target.resolve(a.args, 1, 1)?;
    local_only_flush(a.flush, &target)?;
    let key = &args[0];
    let existed = match target {
        Target::Local { dev, ns } => with_store(&dev, a.flush, |store| {
            store.namespace(&ns).and_then(|ns| ns.delete(key.as_bytes())).map_err(|e| e.to_string())
        })?,
        Target::Remote { client, ns } => client.ns(&ns).delete(key.as_bytes()).map_err(|e| e.to_string())?,
    };
    Ok(if existed { ExitCode::SUCCESS } else { not_found(key) })
}

/// `--server`'s address with the native protocol's port where it names
/// none: `host`, `1.2.3.4`, `::1` and `[::1]` get it; `host:port`,
/// `1.2.3.4:port` and `[::1]:port` keep theirs.
fn server_addr(server: &str) -> String {
    let port = granary_proto::DEFAULT_PORT;
    if let Ok(ip) = server.parse::<std::net::IpAddr>() {
        return std::net::SocketAddr::new(ip, port).to_string();
    }
    match server.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        Some(inner) => format!("[{inner}]:{port}"),
        None if server.contains(':') => server.to_string(),
        None => format!("{server}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{read_value, server_addr};

    /// A value is read up to its limit and refused one byte past it, not
    /// read on (an endless input ends the read).
    #[test]
    fn a_value_is_read_up_to_its_limit() {
        assert_eq!(read_value(&b"abc"[..], 3, "why").unwrap(), b"abc");
        assert_eq!(read_value(&b""[..], 0, "why").unwrap(), b"");
        let e = read_value(&b"abcd"[..], 3, "the limit").unwrap_err();
        assert_eq!(e, "the value on stdin is over 3 bytes: the limit");
        assert!(read_value(std::io::repeat(7), 1 << 20, "why").is_err());
    }

    #[test]
    fn a_server_without_a_port_gets_the_native_one() {
        let p = granary_proto::DEFAULT_PORT;
        assert_eq!(server_addr("localhost"), format!("localhost:{p}"));
        assert_eq!(server_addr("10.0.0.1"), format!("10.0.0.1:{p}"));
        assert_eq!(server_addr("::1"), format!("[::1]:{p}"));
        assert_eq!(server_addr("[::1]"), format!("[::1]:{p}"));
        assert_eq!(server_addr("[::1]:7000"), "[::1]:7000");
        assert_eq!(server_addr("host:7000"), "host:7000");
        assert_eq!(server_addr("10.0.0.1:7000"), "10.0.0.1:7000");
    }
}
