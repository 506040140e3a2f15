//! `granary serve`: open (or create) a store and serve it over the
//! Memcache protocol until SIGTERM or SIGINT, then close it cleanly (an
//! index checkpoint, so the next start reads no log).

use crate::size;
use granary_memcache::{limits, Server, ServerConfig};
use granary_native::NativeConfig;
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::io::{FileDevice, IoBackend, OpenMode};
use granary_store::{CreateOptions, Durability, OpenOptions, Store};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Store file or block device; a missing file is created with --size.
    #[arg(long, default_value = "granary-data/granary.db")]
    data: PathBuf,
    /// Size of a new data file (e.g. 1G, 64G).
    #[arg(long, default_value = "1G", value_parser = size::parse)]
    size: u64,
    /// Segment size of a new store (default: 1/64 of the device, 1 MiB..1 GiB;
    /// the largest item must fit in one segment).
    #[arg(long, value_parser = size::parse)]
    segment_size: Option<u64>,
    /// Memcache TCP port (memcached's -p).
    #[arg(short = 'p', long, default_value_t = 11211)]
    port: u16,
    /// Native protocol TCP port (docs/PROTOCOL.md), on the same address.
    #[arg(long, default_value_t = granary_proto::DEFAULT_PORT)]
    native_port: u16,
    /// Do not serve the native protocol.
    #[arg(long)]
    no_native: bool,
    /// Address to listen on (memcached's -l).
    #[arg(short = 'l', long, default_value = "127.0.0.1")]
    listen: IpAddr,
    /// Executor threads (memcached's -t); 0 = one per core.
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Maximum simultaneous connections (memcached's -c).
    #[arg(short = 'c', long = "conn-limit", default_value_t = limits::CONNECTIONS_DEFAULT)]
    conn_limit: usize,
    /// Largest item value (memcached's -I), e.g. 1m, 64m.
    #[arg(short = 'I', long = "max-item-size", default_value = "1m", value_parser = size::parse)]
    max_item_size: u64,
    /// Store mode: never evict; writes to a full store fail with
    /// "SERVER_ERROR out of memory storing object". Default: cache mode
    /// (the least recently used segment is evicted when space runs low).
    #[arg(long)]
    no_evict: bool,
    /// fdatasync every write (survives power loss on drives without PLP).
    #[arg(long)]
    flush: bool,
    /// Use the page cache instead of direct IO (filesystems without O_DIRECT).
    #[arg(long)]
    buffered: bool,
    /// Device IO of requests: uring (through each executor's io_uring, the
    /// default) or sync (pread/pwrite, blocking the executor thread).
    #[arg(long, value_enum, default_value = "uring")]
    io: Io,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Io {
    Uring,
    Sync,
}

/// Block SIGTERM and SIGINT in this thread (and every thread started after)
/// so `wait_for_signal` receives them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set; sigwait writes `sig`.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

pub fn run(a: ServeArgs, progress: Option<granary_store::ProgressHook>) -> Result<(), String> {
    let signals = block_signals();
    let mode = if a.buffered { OpenMode::Buffered } else { OpenMode::Direct };
    let opts = OpenOptions {
        durability: if a.flush { Durability::Flush } else { Durability::Direct },
        evict: !a.no_evict,
        progress,
        ..OpenOptions::default()
    };
    // With io_uring, requests' device IO goes through the executors' rings
    // (GC and checkpoints, on their own threads, use pread/pwrite).
    let backend = match a.io {
        Io::Uring => IoBackend::Uring,
        Io::Sync => IoBackend::Sync,
    };
    let store = if a.data.exists() {
        FileDevice::open(&a.data, mode)
            .map_err(granary_store::Error::Device)
            .and_then(|d| Store::open(Arc::new(d.with_backend(backend)), &opts))
    } else {
        if let Some(dir) = a.data.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        // Segments must hold the largest item (with its key, header and the
        // segment header): at least the next power of two above it.
        let need = (a.max_item_size + 64 * 1024).next_power_of_two();
        let seg = a.segment_size.unwrap_or_else(|| granary_store::options::default_segment_bytes(a.size).max(need));
        let c = CreateOptions { segment_bytes: Some(seg), ..CreateOptions::default() };
        FileDevice::create(&a.data, a.size, mode).map_err(granary_store::Error::Device).and_then(|d| {
            Store::create(Arc::new(d.with_backend(backend)), &c, &opts).inspect_err(|_| {
                let _ = std::fs::remove_file(&a.data);
            })
        })
    }
    .map_err(|e| format!("{}: {e}", a.data.display()))?;
    let store = Arc::new(store);
    let rec = store.stats().recovery;
    tracing::info!(data = %a.data.display(), keys = store.stats().keys, clean = rec.clean_shutdown,
        millis = rec.millis, "store open");
    let cfg = ServerConfig {
        listen: SocketAddr::new(a.listen, a.port),
        threads: a.threads,
        max_connections: a.conn_limit,
        item_bytes_max: usize::try_from(a.max_item_size).unwrap_or(usize::MAX),
    };
    // One runtime (one executor per core) serves both listeners.
    let rc = RuntimeConfig {
        threads: if a.threads == 0 { RuntimeConfig::default().threads } else { a.threads },
        name: "granary".into(),
        ..RuntimeConfig::default()
    };
    let rt = Arc::new(Runtime::new(rc).map_err(|e| format!("cannot start the runtime: {e}"))?);
    let server = Server::start_on(store.clone(), cfg, rt.clone()).map_err(|e| e.to_string())?;
    eprintln!("granary: serving {} over memcache on {}", a.data.display(), server.local_addr());
    let native = if a.no_native {
        None
    } else {
        let ncfg = NativeConfig {
            listen: SocketAddr::new(a.listen, a.native_port),
            threads: a.threads,
            max_connections: a.conn_limit,
            value_bytes_max: u32::try_from(a.max_item_size).unwrap_or(u32::MAX),
        };
        let n = granary_native::Server::start_on(store.clone(), ncfg, rt.clone()).map_err(|e| e.to_string())?;
        eprintln!("granary: serving the native protocol on {}", n.local_addr());
        Some(n)
    };
    drop(rt);
    let sig = wait_for_signal(&signals);
    eprintln!("granary: signal {sig}: draining connections, then a checkpoint (a second signal exits at once)");
    // A second signal exits at once; the store is crash-safe, so the next
    // start recovers by replaying the log instead of loading a checkpoint.
    let second = signals;
    std::thread::spawn(move || {
        let sig = wait_for_signal(&second);
        eprintln!("granary: signal {sig} again: exiting without a checkpoint");
        std::process::exit(130);
    });
    // Both listeners drain at once.
    let cancelled = std::thread::scope(|s| {
        let n = native.map(|n| s.spawn(move || n.shutdown()));
        server.shutdown() + n.map(|h| h.join().unwrap_or(0)).unwrap_or(0)
    });
    tracing::info!(cancelled, "connections drained");
    let store = Arc::try_unwrap(store).map_err(|_| "the store is still in use after the server stopped".to_string())?;
    store.close().map_err(|e| format!("closing the store: {e}"))?;
    eprintln!("granary: stopped cleanly");
    Ok(())
}
