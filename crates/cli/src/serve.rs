//! `granary serve`: open (or create) a store and serve it over the
//! Memcache protocol until SIGTERM or SIGINT, then close it cleanly (an
//! index checkpoint, so the next start reads no log).

use crate::settings::{self, SettingFlags};
use granary_cli::{fdlimit, progress, signals, size};
use granary_memcache::{limits, Server, ServerConfig};
use granary_native::NativeConfig;
use granary_resp::RespConfig;
use granary_rt::net::BoundSocket;
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::io::{IoBackend, OpenMode};
use granary_store::{
    CreateOptions, Discard, Durability, GcPolicy, IfPresent, NewStore, OpenOptions, Provisioned, Site, Store, Watermark,
};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

/// `granary serve`'s flags: a flag per setting (from
/// [`crate::settings::SETTINGS`]), and the ones below, which are not
/// settings. Every setting can also come from the TOML file given with
/// `--config` (docs/CONFIG.md); a flag given on the command line wins over
/// the file, the file over the default.
#[derive(clap::Args)]
// Each flag's help on its own line: many are long.
#[command(next_line_help = true)]
pub struct ServeArgs {
    /// A TOML configuration file (docs/CONFIG.md); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration (flags, file and defaults merged)
    /// as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Print the settings table of docs/CONFIG.md (Markdown) and exit.
    #[arg(long, hide = true)]
    print_settings_table: bool,
    #[command(flatten)]
    settings: SettingFlags,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Io {
    Uring,
    Sync,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogFormat {
    Text,
    Json,
}

/// The effective configuration of `granary serve`.
#[derive(Debug, Clone)]
pub struct Config {
    pub data: PathBuf,
    pub size: u64,
    pub segment_size: Option<u64>,
    pub listen: IpAddr,
    pub port: u16,
    pub native: bool,
    pub native_port: u16,
    pub resp: bool,
    pub resp_port: u16,
    /// 0: no NBD listener.
    pub nbd_port: u16,
    /// The Redis protocol's `requirepass`.
    pub requirepass: Option<String>,
    /// The Redis protocol's ACL file (Redis's `aclfile`).
    pub aclfile: Option<PathBuf>,
    /// The Memcache listener's auth file (memcached's `-Y`).
    pub auth_file: Option<PathBuf>,
    /// The token the native protocol's hello must carry.
    pub native_token: Option<String>,
    /// TLS on the memcache, RESP and native listeners: the certificate
    /// chain and its key (both or neither), and the CA bundle client
    /// certificates must chain to (None: none is asked for).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub threads: usize,
    pub conn_limit: usize,
    pub max_item_size: u64,
    /// Whether `max_item_size` was set (a flag or the file): one left at
    /// its default shrinks to what an existing store's segments hold.
    pub max_item_size_set: bool,
    pub idle_timeout: u64,
    pub memcache_namespace: String,
    /// The Memcache `shutdown` command stops the server (memcached's `-A`).
    pub enable_shutdown: bool,
    pub blind_overwrite_mem: u64,
    /// MiB of the DRAM tier (memcached's `-m`); 0: off.
    pub memory_limit: u64,
    pub io_spin_us: u64,
    pub io_submit_early: bool,
    pub metrics: Option<SocketAddr>,
    pub evict: bool,
    pub gc_policy: GcPolicy,
    pub gc_hot_cold: bool,
    pub gc_sepbit: bool,
    pub segment_summaries: bool,
    pub gc_watermark: Watermark,
    pub discard: Discard,
    pub flush: bool,
    pub buffered: bool,
    pub io: Io,
    pub log_format: LogFormat,
    /// Whether to print the configuration and exit.
    pub print: bool,
    /// Whether to print docs/CONFIG.md's settings table and exit.
    pub print_settings_table: bool,
}

/// Default size of a new data file: a quarter of the free space of the
/// filesystem that will hold it, at most 1 GiB, at least 64 MiB.
pub const SIZE_DEFAULT_MAX: u64 = 1 << 30;

/// The largest memcache item by default (`-I`, memcached's 1 MiB).
pub const MAX_ITEM_SIZE_DEFAULT: u64 = 1 << 20;

/// The smallest segments that hold an item of `item` bytes with its key,
/// its header and the segment's header: the next power of two above it
/// and 64 KiB.
pub fn segment_bytes_for_item(item: u64) -> u64 {
    (item + 64 * 1024).next_power_of_two()
}
const SIZE_DEFAULT_MIN: u64 = 64 << 20;

fn free_bytes_near(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut dir = path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    loop {
        let probe = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir.clone() };
        if probe.exists() {
            let c = std::ffi::CString::new(probe.as_os_str().as_bytes()).ok()?;
            // SAFETY: statvfs writes into `st`, a zeroed plain-data struct;
            // `c` is a valid NUL-terminated path for the call.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
                return None;
            }
            return Some(st.f_bavail as u64 * st.f_frsize as u64);
        }
        if !dir.pop() {
            return None;
        }
    }
}

/// The default size of a new data file at `data`.
fn default_size(data: &std::path::Path) -> u64 {
    match free_bytes_near(data) {
        Some(free) => (free / 4).clamp(SIZE_DEFAULT_MIN, SIZE_DEFAULT_MAX),
        None => SIZE_DEFAULT_MAX,
    }
}

impl Config {
    /// Every setting's default (docs/CONFIG.md says them; a test checks),
    /// but `size`'s, which depends on where `data` ends up: [`Config::resolve`]
    /// sets it.
    pub(crate) fn defaults() -> Config {
        Config {
            data: PathBuf::from("granary-data/granary.db"),
            size: SIZE_DEFAULT_MAX,
            segment_size: None,
            listen: IpAddr::from([127, 0, 0, 1]),
            port: 11211,
            native: true,
            native_port: granary_proto::DEFAULT_PORT,
            resp: true,
            resp_port: granary_resp::limits::DEFAULT_PORT,
            nbd_port: 0,
            requirepass: None,
            aclfile: None,
            auth_file: None,
            native_token: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            threads: 0,
            conn_limit: limits::CONNECTIONS_DEFAULT,
            max_item_size: MAX_ITEM_SIZE_DEFAULT,
            max_item_size_set: false,
            idle_timeout: 0,
            memcache_namespace: granary_store::DEFAULT_NAMESPACE.into(),
            enable_shutdown: false,
            blind_overwrite_mem: granary_store::BLIND_OVERWRITE_BYTES_DEFAULT as u64,
            memory_limit: 64,
            io_spin_us: granary_rt::SPIN_IO_US_DEFAULT,
            io_submit_early: true,
            metrics: None,
            evict: true,
            gc_policy: GcPolicy::default(),
            gc_hot_cold: false,
            gc_sepbit: false,
            segment_summaries: true,
            gc_watermark: Watermark::default(),
            discard: Discard::default(),
            flush: false,
            buffered: false,
            io: Io::Uring,
            log_format: LogFormat::Text,
            print: false,
            print_settings_table: false,
        }
    }

    /// The defaults, then the file's settings (if any), then the flags':
    /// a flag wins over the file, the file over the default.
    pub fn resolve(a: &ServeArgs) -> Result<Config, String> {
        let file = match &a.config {
            Some(p) => settings::read_file(p)?,
            None => Vec::new(),
        };
        let given: Vec<_> = file.into_iter().chain(a.settings.0.iter().cloned()).collect();
        let mut c = Config::defaults();
        // The environment's log format (every command's) is a default
        // here: the file and the flag win over it.
        if granary_cli::logging::env_json() {
            c.log_format = LogFormat::Json;
        }
        for (s, v) in &given {
            (s.apply)(&mut c, v.clone());
        }
        if !given.iter().any(|(s, _)| s.key == "size") {
            c.size = default_size(&c.data);
        }
        c.print = a.print_config;
        c.print_settings_table = a.print_settings_table;
        if c.data.as_os_str().is_empty() {
            return Err("data: the store's path is empty".into());
        }
        c.check_ports()?;
        c.check_effects()?;
        Ok(c)
    }

    /// A setting for a listener that is off would do nothing: refused, so
    /// that a token or password meant to guard a listener, or a port meant
    /// for it, is never silently ignored. Judged by the values (a port
    /// other than its default, a token, password or file set), so that
    /// `--print-config`'s output, which names every key, reads back.
    fn check_effects(&self) -> Result<(), String> {
        // (key, whether set, the flag that unsets it: for a file shared by
        // servers some of which turn the listener off).
        let native_port = format!("--native-port {}", granary_proto::DEFAULT_PORT);
        let resp_port = format!("--resp-port {}", granary_resp::limits::DEFAULT_PORT);
        let native = [
            ("native_port", self.native_port != granary_proto::DEFAULT_PORT, native_port.as_str()),
            ("native_token", self.native_token.is_some(), "--native-token \"\""),
        ];
        let resp = [
            ("resp_port", self.resp_port != granary_resp::limits::DEFAULT_PORT, resp_port.as_str()),
            ("requirepass", self.requirepass.is_some(), "--requirepass \"\""),
            ("aclfile", self.aclfile.is_some(), "--aclfile \"\""),
        ];
        let off = [
            (self.native, "native = false, --no-native", "the native listener", &native[..]),
            (self.resp, "resp = false, --no-resp", "the RESP listener", &resp[..]),
        ];
        for (on, how, what, set) in off {
            if let Some((k, _, unset)) = set.iter().find(|s| !on && s.1) {
                return Err(format!(
                    "{k} has no effect with {what} off ({how}): leave one of them out (`{unset}` unsets a file's {k})"
                ));
            }
        }
        Ok(())
    }

    /// Two listeners on one port are refused here, before any store is
    /// opened or created: their sockets may both bind (they do not listen
    /// until the store is open), so the clash would show only after a
    /// zero fill or a recovery.
    fn check_ports(&self) -> Result<(), String> {
        let mut used: Vec<(&str, IpAddr, u16)> = vec![("the memcache port (-p)", self.listen, self.port)];
        if self.native {
            used.push(("--native-port", self.listen, self.native_port));
        }
        if self.resp {
            used.push(("--resp-port", self.listen, self.resp_port));
        }
        if self.nbd_port != 0 {
            used.push(("--nbd-port", self.listen, self.nbd_port));
        }
        if let Some(m) = self.metrics {
            used.push(("--metrics", m.ip(), m.port()));
        }
        for (i, &(a, ip_a, port)) in used.iter().enumerate() {
            for &(b, ip_b, other) in &used[i + 1..] {
                let overlap = ip_a == ip_b || ip_a.is_unspecified() || ip_b.is_unspecified();
                if port != 0 && port == other && overlap {
                    return Err(format!("{a} and {b} are both port {port}: give each listener a port of its own"));
                }
            }
        }
        Ok(())
    }

    /// The configuration as TOML (what --print-config shows; it reads back
    /// as the same configuration): rendered from [`crate::settings::SETTINGS`].
    pub fn to_toml(&self) -> String {
        settings::to_toml(self)
    }
}

/// `granary serve`: print the configuration (or the docs' settings
/// table), or serve until a stop signal.
pub fn main(c: Config) -> Result<std::process::ExitCode, String> {
    if c.print_settings_table {
        print!("{}", crate::settings::markdown_table());
    } else if c.print {
        print!("{}", c.to_toml());
    } else {
        run(c)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// While an existing store opens (recovery reads the log: minutes on a
/// large device), SIGTERM or SIGINT ends the process at once, exit 2: an
/// interrupted recovery is a crash, which the next start recovers from
/// (the store is safe to stop at any point). Dropping the guard (the store
/// is open) tells the watcher to end (within its 50 ms poll; not waited
/// for, so start-up is not delayed); a signal it takes after the open is
/// raised again for the server's own `sigwait`.
struct StopDuringOpen {
    opened: Arc<AtomicBool>,
}

fn stop_during_open(set: libc::sigset_t) -> StopDuringOpen {
    let opened = Arc::new(AtomicBool::new(false));
    let o = opened.clone();
    let _ = std::thread::Builder::new().name("granary-open-signals".into()).spawn(move || loop {
        let poll = libc::timespec { tv_sec: 0, tv_nsec: 50_000_000 };
        // SAFETY: `set` is an initialised signal set and `poll` a valid
        // timespec; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &poll) };
        if sig > 0 {
            if o.load(SeqCst) {
                // SAFETY: kill of this process with the signal it got.
                unsafe { libc::kill(libc::getpid(), sig) };
                return;
            }
            eprintln!(
                "granary: error: stopped by {} while opening the store (its recovery starts again at the \
                     next start)",
                signals::name(sig)
            );
            // SAFETY: _exit ends the process without running anything
            // more (as a crash would, mid-recovery).
            unsafe { libc::_exit(2) };
        }
        if o.load(SeqCst) {
            return;
        }
    });
    StopDuringOpen { opened }
}

impl Drop for StopDuringOpen {
    fn drop(&mut self) {
        self.opened.store(true, SeqCst);
    }
}

/// Every listener's address, bound before the store is opened or created
/// (an address in use fails the start before a data file is made), and
/// listened on only once the servers start (until then connections are
/// refused, so a client that connects finds a server ready to answer).
struct Listeners {
    memcache: BoundSocket,
    native: Option<BoundSocket>,
    resp: Option<BoundSocket>,
    nbd: Option<BoundSocket>,
    metrics: Option<BoundSocket>,
}

impl Listeners {
    fn bind(a: &Config) -> Result<Listeners, String> {
        let bind = |addr: SocketAddr| bind_retrying(addr).map_err(|e| e.to_string());
        Ok(Listeners {
            memcache: bind(SocketAddr::new(a.listen, a.port))?,
            native: a.native.then(|| bind(SocketAddr::new(a.listen, a.native_port))).transpose()?,
            resp: a.resp.then(|| bind(SocketAddr::new(a.listen, a.resp_port))).transpose()?,
            nbd: (a.nbd_port != 0).then(|| bind(SocketAddr::new(a.listen, a.nbd_port))).transpose()?,
            metrics: a.metrics.map(|m| bind(m).map_err(|e| format!("metrics: {e}"))).transpose()?,
        })
    }
}

/// How long a start waits for an address in use to be let go: a server
/// killed just before (a supervisor's restart after SIGKILL) can hold its
/// listening socket for a moment while its io_uring instance is torn down.
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Bind `addr`, retrying "address in use" for up to [`BIND_WAIT`].
fn bind_retrying(addr: SocketAddr) -> std::io::Result<BoundSocket> {
    let started = std::time::Instant::now();
    loop {
        match BoundSocket::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < BIND_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Open the store at `a.data`, or create it there.
fn open_or_create(a: &Config, signals: libc::sigset_t, opts: &OpenOptions) -> Result<Provisioned, String> {
    let mode = if a.buffered { OpenMode::Buffered } else { OpenMode::Direct };
    // With io_uring, requests' device IO goes through the executors' rings
    // (GC and checkpoints, on their own threads, through private rings).
    let backend = match a.io {
        Io::Uring => IoBackend::Uring,
        Io::Sync => IoBackend::Sync,
    };
    let at = |e: granary_store::Error| format!("{}: {e}", a.data.display());
    let site = fault_injection(Site::inspect(&a.data, IfPresent::Open).map_err(at)?)?;
    if site.removed_unfinished() {
        tracing::warn!(data = %a.data.display(),
            "an earlier creation was interrupted before the store was written (it held nothing): removed, creating it again");
    }
    if site.holds_store() {
        let _stop = stop_during_open(signals);
        return site.open(mode, backend, opts).map_err(at);
    }
    // Segments must hold the largest item (with its key, header and the
    // segment header).
    let need = segment_bytes_for_item(a.max_item_size);
    let seg = a.segment_size.unwrap_or_else(|| granary_store::options::default_segment_bytes(a.size).max(need));
    // Refused before the file is made and filled (which takes a while on a
    // large one) if the memcache listener's check after it would refuse
    // for certain: its most lenient form (the smallest grain, the default
    // namespace) still cannot hold an item of the largest size.
    let most = granary_store::options::value_bytes_max_for(seg, 512, granary_memcache::limits::KEY_BYTES_MAX);
    // (A default -I is fitted to the segments once the store is made.)
    if a.max_item_size > most && a.max_item_size_set {
        return Err(format!(
            "max item size {} exceeds what segments of {} hold ({most} bytes); give a --segment-size of at least {} \
             or a smaller -I (--max-item-size)",
            a.max_item_size,
            size::human(seg),
            size::human(need)
        ));
    }
    let fill = progress::zero_fill();
    let new = NewStore {
        size_bytes: a.size,
        stripe_bytes: granary_store::io::stripe::STRIPE_BYTES_DEFAULT,
        create: CreateOptions { segment_bytes: Some(seg), ..CreateOptions::default() },
        fill_progress: &fill,
    };
    let p = site.create(mode, backend, &new, opts).map_err(at)?;
    tracing::info!(data = %a.data.display(), size = %size::human(a.size), "store open: created");
    Ok(p)
}

/// For tests only: with [`granary_store::io::inject::CONTROL_VAR`] set to
/// a path, the device is wrapped in a fault-injecting one whose faults are
/// set through a Unix socket made at that path, and first by the commands
/// of [`granary_store::io::inject::INIT_VAR`] (docs/FAULTS.md).
fn fault_injection(site: Site) -> Result<Site, String> {
    use granary_store::io::inject::{self, Controls, InjectDevice};
    let Some(path) = std::env::var_os(inject::CONTROL_VAR) else { return Ok(site) };
    let path = PathBuf::from(path);
    let controls = Arc::new(Controls::new());
    if let Some(init) = std::env::var_os(inject::INIT_VAR) {
        controls
            .apply_all(&init.to_string_lossy())
            .map_err(|e| format!("fault injection: {}: {e}", inject::INIT_VAR))?;
    }
    inject::serve_control(&path, controls.clone())
        .map_err(|e| format!("fault injection: control socket {}: {e}", path.display()))?;
    tracing::warn!(control = %path.display(), "fault injection enabled (for tests only)");
    Ok(site.wrap_device(Box::new(move |dev| Arc::new(InjectDevice::with_controls(dev, controls)))))
}

/// The largest item an existing store's segments hold for every listener
/// (the memcache one's namespace and longest key, the strictest), when
/// less than the default and `-I` was not set: a store made with 1 MiB
/// segments (by the Python or C bindings, or on a small block device) is
/// served with the defaults, its largest item said once in the log.
fn fit_default_item_size(a: &mut Config, store: &Store) {
    if a.max_item_size_set {
        return;
    }
    let key = limits::KEY_BYTES_MAX;
    let holds = match store.namespace(&a.memcache_namespace) {
        Ok(ns) => ns.value_bytes_max(key),
        // The memcache listener refuses to start, saying why.
        Err(_) => return,
    };
    if holds < a.max_item_size {
        tracing::info!(
            max_item_size = holds,
            segment_bytes = store.stats().segment_bytes,
            "largest item: what this store's segments hold (less than the default 1 MiB; -I sets it)"
        );
        a.max_item_size = holds;
    }
}

fn run(mut a: Config) -> Result<(), String> {
    let signals = signals::block_stop_signals();
    // Every listener may hold conn_limit connections: the descriptors for
    // them, or a clear refusal now rather than EMFILE on accept later.
    let serving = 1 + usize::from(a.native) + usize::from(a.resp) + usize::from(a.nbd_port != 0);
    // `threads` 0 is one executor per core, as the runtime counts them.
    let executors = match a.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let fds = fdlimit::raise_to(fdlimit::fds_needed(a.conn_limit, serving, executors))
        .map_err(|e| format!("conn_limit = {} on {serving} listeners: {e}", a.conn_limit))?;
    tracing::debug!(fds, "file descriptor limit");
    let listeners = Listeners::bind(&a)?;
    // Read before the store is opened or created: a bad file fails the
    // start with nothing to undo.
    let users = match &a.auth_file {
        Some(p) => Some(Arc::new(granary_server::auth::UserFile::read(p).map_err(|e| format!("auth file: {e}"))?)),
        None => None,
    };
    if a.requirepass.is_some() && a.aclfile.is_some() {
        return Err("requirepass and aclfile cannot both be set: give the default user its password in the ACL file \
                    (`user default on >PASSWORD ~* +@all`)"
            .into());
    }
    let acl = match &a.aclfile {
        Some(p) => Some(Arc::new(granary_resp::acl::Acl::read(p).map_err(|e| format!("aclfile: {e}"))?)),
        None => None,
    };
    let tls = tls_config(&a)?;
    let opts = OpenOptions {
        durability: if a.flush { Durability::Flush } else { Durability::Direct },
        evict: a.evict,
        progress: progress::recovery(),
        // Meta flags h, l and the win token (W/Z): 4 bytes per index slot.
        track_access: true,
        blind_overwrite_bytes: Some(usize::try_from(a.blind_overwrite_mem).unwrap_or(usize::MAX)),
        dram_tier_bytes: a.memory_limit << 20,
        gc_policy: a.gc_policy,
        gc_hot_cold: a.gc_hot_cold,
        gc_sepbit: a.gc_sepbit,
        segment_summaries: a.segment_summaries,
        gc_watermark: a.gc_watermark,
        discard: a.discard,
        ..OpenOptions::default()
    };
    let p = open_or_create(&a, signals, &opts)?;
    let created = p.created;
    // What a failed start removes from here on (a new store's files).
    let undo = p.undo();
    fit_default_item_size(&mut a, &p.store);
    let store = Arc::new(p.store);
    let rec = store.stats().recovery;
    if !created {
        tracing::info!(data = %a.data.display(), keys = store.stats().keys, clean_shutdown = rec.clean_shutdown,
            segments_replayed = rec.segments_scanned, millis = rec.millis, "store open");
    }
    let served = match start(&a, store.clone(), listeners, users, acl, tls) {
        Ok(s) => s,
        Err(e) => {
            // A start that fails after the store was made leaves no file.
            drop(store);
            undo.discard();
            return Err(e);
        }
    };
    let sig = signals::wait(&signals);
    eprintln!(
        "granary: {}: draining connections, then a checkpoint (a second signal exits at once)",
        signals::name(sig)
    );
    // A second signal exits at once; the store is crash-safe, so the next
    // start recovers by replaying the log instead of loading a checkpoint.
    std::thread::spawn(move || {
        let sig = signals::wait(&signals);
        eprintln!("granary: {} again: exiting without a checkpoint", signals::name(sig));
        std::process::exit(130);
    });
    // Every listener drains at once.
    let Served { memcache, native, resp, nbd } = served;
    let cancelled = std::thread::scope(|s| {
        let n = native.map(|n| s.spawn(move || n.shutdown()));
        let r = resp.map(|r| s.spawn(move || r.shutdown()));
        let b = nbd.map(|b| s.spawn(move || b.shutdown()));
        let joined = |h: Option<std::thread::ScopedJoinHandle<'_, usize>>| h.map_or(0, |h| h.join().unwrap_or(0));
        memcache.shutdown() + joined(n) + joined(r) + joined(b)
    });
    if cancelled > 0 {
        tracing::warn!(cancelled, "connections closed by the drain timeout");
    }
    let store = sole_owner(store, STORE_RELEASE_WAIT).map_err(|_| {
        format!("the store is still in use {} s after the server stopped", STORE_RELEASE_WAIT.as_secs())
    })?;
    store.close().map_err(|e| format!("closing the store: {e}"))?;
    eprintln!("granary: stopped cleanly");
    Ok(())
}

/// How long a stop waits for work on threads of its own that still holds
/// the store once every listener has drained (RESP's DBSIZE settles the
/// links of blind overwrites on a thread, one device read per link)
/// before it gives up on a clean close.
const STORE_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The store, once nothing else holds it, waiting up to `wait`; handed
/// back still shared past that (no clean close: the next start replays
/// the log).
fn sole_owner(mut store: Arc<Store>, wait: std::time::Duration) -> Result<Store, Arc<Store>> {
    let deadline = std::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match Arc::try_unwrap(store) {
            Ok(s) => return Ok(s),
            Err(s) if std::time::Instant::now() < deadline => {
                if !said {
                    eprintln!("granary: waiting for work still using the store (settling links) before closing it");
                    said = true;
                }
                store = s;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(s) => return Err(s),
        }
    }
}

/// The TLS settings of the memcache, RESP and native listeners, read and
/// checked now (before the store is opened: a bad file fails the start
/// with nothing to undo); None without `tls_cert`.
fn tls_config(a: &Config) -> Result<Option<granary_server::tls::TlsConfig>, String> {
    let (cert, key) = match (&a.tls_cert, &a.tls_key) {
        (None, None) if a.tls_ca.is_some() => {
            return Err("tls_ca needs tls_cert and tls_key (the server's certificate and key)".into())
        }
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => return Err("tls_cert needs tls_key (the certificate's private key)".into()),
        (None, Some(_)) => return Err("tls_key needs tls_cert (the certificate chain)".into()),
    };
    let config = granary_server::tls::server_config(cert, key, a.tls_ca.as_deref())?;
    let clients = if a.tls_ca.is_some() { "client certificates required" } else { "no client certificates" };
    eprintln!("granary: TLS on the memcache, RESP and native listeners ({clients})");
    Ok(Some(config))
}

/// The running servers.
struct Served {
    memcache: Server,
    native: Option<granary_native::Server>,
    resp: Option<granary_resp::Server>,
    nbd: Option<granary_nbd::Server>,
}

/// Start every server on one runtime (one executor per core); prints one
/// line per listener once it is up, the native one last.
fn start(
    a: &Config,
    store: Arc<Store>,
    l: Listeners,
    users: Option<Arc<granary_server::auth::UserFile>>,
    acl: Option<Arc<granary_resp::acl::Acl>>,
    tls: Option<granary_server::tls::TlsConfig>,
) -> Result<Served, String> {
    let idle_timeout = (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout));
    let cfg = ServerConfig {
        listen: SocketAddr::new(a.listen, a.port),
        threads: a.threads,
        max_connections: a.conn_limit,
        item_bytes_max: usize::try_from(a.max_item_size).unwrap_or(usize::MAX),
        idle_timeout,
        namespace: a.memcache_namespace.clone(),
        shutdown: a.enable_shutdown.then_some(signals::request_stop as fn()),
        auth: users,
        tls: tls.clone(),
    };
    let rc = RuntimeConfig {
        spin_io: std::time::Duration::from_micros(a.io_spin_us),
        submit_early: a.io_submit_early,
        ..RuntimeConfig::with_threads(a.threads, "granary")
    };
    let rt = Arc::new(Runtime::new(rc).map_err(|e| format!("cannot start the runtime: {e}"))?);
    let listen = |b: BoundSocket| b.listen().map_err(|e| e.to_string());
    let server =
        Server::start_with_listener(store.clone(), cfg, rt.clone(), listen(l.memcache)?).map_err(|e| e.to_string())?;
    eprintln!("granary: serving {} over memcache on {}", a.data.display(), server.local_addr());
    let native = match l.native {
        None => None,
        Some(listener) => {
            let ncfg = NativeConfig {
                listen: SocketAddr::new(a.listen, a.native_port),
                threads: a.threads,
                max_connections: a.conn_limit,
                value_bytes_max: u32::try_from(a.max_item_size).unwrap_or(u32::MAX),
                idle_timeout,
                token: a.native_token.as_ref().map(|t| t.as_bytes().to_vec()),
                tls: tls.clone(),
            };
            let n = granary_native::Server::start_with_listener(store.clone(), ncfg, rt.clone(), listen(listener)?)
                .map_err(|e| e.to_string())?;
            Some(n)
        }
    };
    let resp = match l.resp {
        None => None,
        Some(listener) => {
            let rcfg = RespConfig {
                listen: SocketAddr::new(a.listen, a.resp_port),
                threads: a.threads,
                max_connections: a.conn_limit,
                value_bytes_max: u32::try_from(a.max_item_size).unwrap_or(u32::MAX),
                idle_timeout,
                databases: granary_resp::limits::DATABASES_DEFAULT,
                requirepass: a.requirepass.as_ref().map(|p| p.as_bytes().to_vec()),
                acl,
                tls: tls.clone(),
            };
            let r = granary_resp::Server::start_with_listener(store.clone(), rcfg, rt.clone(), listen(listener)?)
                .map_err(|e| format!("redis protocol: {e}"))?;
            eprintln!("granary: serving the Redis protocol on {}", r.local_addr());
            Some(r)
        }
    };
    let nbd = match l.nbd {
        None => None,
        Some(listener) => {
            let bcfg = granary_nbd::NbdConfig {
                listen: SocketAddr::new(a.listen, a.nbd_port),
                threads: a.threads,
                max_connections: a.conn_limit,
                // A mounted file system may send nothing for hours.
                idle_timeout: None,
            };
            let exports =
                Arc::new(granary_nbd::store_export::StoreExports::new(store.clone()).with_spawner(rt.spawner()));
            let b = granary_nbd::Server::start_with_listener(exports, bcfg, rt.clone(), listen(listener)?)
                .map_err(|e| format!("nbd: {e}"))?;
            // NBD has no authentication of its own (docs/SECURITY.md).
            granary_server::auth::warn_if_exposed("nbd", b.local_addr(), false);
            eprintln!("granary: serving block exports over NBD on {}", b.local_addr());
            Some(b)
        }
    };
    if let Some(listener) = l.metrics {
        let sources = crate::metrics::Sources {
            store,
            memcache: server.shared_stats(),
            native: native.as_ref().map(|n| n.shared_stats()),
            resp: resp.as_ref().map(|r| r.shared_stats()),
            nbd: nbd.as_ref().map(|b| b.shared_stats()),
            runtime: Some(rt.stats_reader()),
        };
        let m = crate::metrics::serve(listen(listener)?, sources, &rt).map_err(|e| format!("metrics: {e}"))?;
        eprintln!("granary: metrics on http://{m}/metrics");
    }
    // Last: once this line is out, every listener is up.
    if let Some(n) = &native {
        eprintln!("granary: serving the native protocol on {}", n.local_addr());
    }
    Ok(Served { memcache: server, native, resp, nbd })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A stop waits for work that still holds the store (a thread settling
    /// links), and gives up past its wait.
    #[test]
    fn a_stop_waits_for_other_holders_of_the_store() {
        let dev = Arc::new(granary_store::io::MemDevice::new(8 << 20));
        let store = Arc::new(Store::create(dev, &Default::default(), &Default::default()).unwrap());
        let held = store.clone();
        let (go, gone) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            gone.recv().unwrap();
            drop(held);
        });
        let Err(store) = sole_owner(store, Duration::from_millis(30)) else { panic!("taken while still held") };
        go.send(()).unwrap();
        let store = sole_owner(store, Duration::from_secs(60)).unwrap_or_else(|_| panic!("let go"));
        holder.join().unwrap();
        store.close().unwrap();
    }
}
