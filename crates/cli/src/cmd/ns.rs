//! `granary ns`: the namespaces of a local store (PATH): create one with
//! its options, list them (with their kind: exports, made by `granary
//! export`, are namespaces too), print one's figures, drop one, empty one. Their
//! keys are read and written by `get`, `put` and `del --ns NAME` (`kv.rs`);
//! what a namespace is and does is the engine's (`granary_store::namespace`,
//! docs/ARCHITECTURE.md "Namespaces").
//!
//! Errors (a name that exists or does not, a bad name or option, the
//! default namespace dropped) are the engine's messages, on one line, exit
//! 2.

use super::{open_store, with_store, DeviceArgs};
use granary_cli::size;
use granary_rt::metrics::{Kind, Registry, Value};
use granary_store::{NamespaceKind, NamespaceMode, NamespaceOptions, NamespaceStats, Store};
use std::process::ExitCode;

/// Create, list, inspect, drop and empty the namespaces of a store.
#[derive(clap::Args)]
pub struct NsArgs {
    #[command(subcommand)]
    cmd: NsCmd,
}

#[derive(clap::Subcommand)]
enum NsCmd {
    /// Create namespace NAME with its options (fixed for its life); prints
    /// its name, id and options.
    Create(CreateArgs),
    /// Print one line per namespace, the default one first: name, id, kind
    /// (kv, or block: an export, see `granary export`), mode, keys, value
    /// bytes, default TTL and limits.
    List(ListArgs),
    /// Print a namespace's options and figures as name value lines (JSON
    /// with --json; an option of 0 is none): keys and value_bytes are what
    /// it holds; gets, sets and the other counts start when the store is
    /// opened, so they read 0 here.
    Stat(StatArgs),
    /// Drop namespace NAME and its keys, in O(1); GC frees their space later.
    /// The default namespace cannot be dropped.
    Drop(NameArgs),
    /// Empty namespace NAME, in O(1), keeping it and its options (it gets a
    /// new id); the default namespace is emptied as by memcache flush_all.
    Truncate(NameArgs),
}

/// A store and a namespace name.
#[derive(clap::Args)]
struct NameArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The namespace.
    name: String,
}

#[derive(clap::Args)]
struct CreateArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The new namespace's name: 1 to 64 ASCII letters, digits, '_', '-', '.'.
    name: String,
    /// cache: its values may be evicted when the store is full (a store
    /// served in cache mode); store: never evicted, writes fail instead.
    #[arg(long, default_value = "cache", value_name = "cache|store")]
    mode: String,
    /// Seconds a value written without an expiry time lives (0: for ever).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    ttl: u32,
    /// Most bytes of values (whole records) it holds, e.g. 64M; a write past
    /// it fails.
    #[arg(long, value_parser = limit_size, value_name = "SIZE")]
    max_bytes: Option<u64>,
    /// Most values it holds, e.g. 100K; a write of a new key past it fails.
    #[arg(long, value_parser = limit_count, value_name = "N")]
    max_keys: Option<u64>,
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    dev: DeviceArgs,
}

#[derive(clap::Args)]
struct StatArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The namespace.
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// A limit in bytes; "0" passes, for the engine to refuse with its message.
fn limit_size(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        size::parse(s)
    }
}

/// A limit in values; "0" passes, for the engine to refuse with its message.
fn limit_count(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        size::count(s)
    }
}

pub fn run(a: NsArgs) -> Result<ExitCode, String> {
    match a.cmd {
        NsCmd::Create(a) => create(a),
        NsCmd::List(a) => list(a),
        NsCmd::Stat(a) => stat(a),
        NsCmd::Drop(a) => drop_ns(a),
        NsCmd::Truncate(a) => truncate(a),
    }
}

/// Namespace `name`'s options and figures in `store` now.
fn stats_of(store: &Store, name: &str) -> Result<NamespaceStats, String> {
    store.namespace(name).and_then(|ns| ns.stats()).map_err(|e| e.to_string())
}

fn create(a: CreateArgs) -> Result<ExitCode, String> {
    let mode: NamespaceMode = a.mode.parse()?;
    let options = NamespaceOptions {
        mode,
        default_ttl_secs: a.ttl,
        max_bytes: a.max_bytes,
        max_keys: a.max_keys,
        kind: NamespaceKind::Kv,
    };
    let st = with_store(&a.dev, false, |store| {
        store.create_namespace(&a.name, options).and_then(|ns| ns.stats()).map_err(|e| e.to_string())
    })?;
    println!("created namespace {} (id {}): {}", st.name, st.id, describe(&st.options));
    Ok(ExitCode::SUCCESS)
}

/// `mode cache, ttl none, max_bytes 1.0 MiB (1048576), max_keys none`.
fn describe(o: &NamespaceOptions) -> String {
    format!(
        "mode {}, ttl {}, max_bytes {}, max_keys {}",
        o.mode.as_str(),
        ttl(o.default_ttl_secs),
        o.max_bytes.map_or("none".into(), bytes),
        o.max_keys.map_or("none".into(), |n| n.to_string())
    )
}

/// A default TTL: `none` or `60s`.
fn ttl(secs: u32) -> String {
    if secs == 0 {
        "none".into()
    } else {
        format!("{secs}s")
    }
}

/// Bytes, human and exact: `1.0 MiB (1048576)`.
pub(super) fn bytes(b: u64) -> String {
    format!("{} ({b})", size::human(b))
}

fn list(a: ListArgs) -> Result<ExitCode, String> {
    let store = open_store(&a.dev, false, true)?;
    let header =
        ["name", "id", "kind", "mode", "keys", "value_bytes", "ttl", "max_bytes", "max_keys"].map(String::from);
    let rows: Vec<[String; 9]> = store
        .namespaces()
        .iter()
        .map(|s| {
            let o = &s.options;
            [
                s.name.clone(),
                s.id.to_string(),
                o.kind.as_str().into(),
                o.mode.as_str().into(),
                s.keys.to_string(),
                bytes(s.value_bytes),
                ttl(o.default_ttl_secs),
                o.max_bytes.map_or("none".into(), bytes),
                o.max_keys.map_or("none".into(), |n| n.to_string()),
            ]
        })
        .collect();
    print!("{}", table(&header, &rows));
    Ok(ExitCode::SUCCESS)
}

/// Columns left-aligned, two spaces apart, no trailing blanks.
pub(super) fn table<const N: usize>(header: &[String; N], rows: &[[String; N]]) -> String {
    let mut width = [0usize; N];
    for r in std::iter::once(header).chain(rows) {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(header).chain(rows) {
        let line: Vec<String> = r.iter().zip(width).map(|(cell, w)| format!("{cell:w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Every field of a namespace's [`NamespaceStats`], as `granary stat`
/// prints a store's: options under `options.` (a limit or TTL of 0: none;
/// an export's size and block size, 0 for a plain namespace).
fn registry(s: &NamespaceStats) -> Registry {
    let o = &s.options;
    let (size_bytes, block_bytes) = match o.kind {
        NamespaceKind::Block { size_bytes, block_bytes } => (size_bytes, block_bytes),
        NamespaceKind::Kv => (0, 0),
    };
    let mut r = Registry::new();
    r.info("name", "The namespace's name.", s.name.as_str())
        .info("id", "Its current id (a truncate gives it a new one).", u64::from(s.id))
        .info("options.kind", "kv (a key space) or block (an export: a block device).", o.kind.as_str())
        .info("options.size_bytes", "An export's size in bytes (0: not an export).", size_bytes)
        .info("options.block_bytes", "An export's block size in bytes (0: not an export).", u64::from(block_bytes))
        .info("options.mode", "cache (its values may be evicted) or store.", o.mode.as_str())
        .info("options.default_ttl_secs", "Seconds a value written with no expiry lives (0: for ever).", {
            u64::from(o.default_ttl_secs)
        })
        .info("options.max_bytes", "Most bytes of values it holds (0: no limit).", o.max_bytes.unwrap_or(0))
        .info("options.max_keys", "Most values it holds (0: no limit).", o.max_keys.unwrap_or(0));
    let figures: [(&str, &'static str, Kind, u64); 9] = [
        ("keys", "Values it holds.", Kind::Gauge, s.keys),
        ("value_bytes", "Bytes of its values' records.", Kind::Gauge, s.value_bytes),
        ("gets", "GETs since the store was opened.", Kind::Counter, s.gets),
        ("hits", "GETs that found a value.", Kind::Counter, s.hits),
        ("misses", "GETs that found none.", Kind::Counter, s.misses),
        ("sets", "Writes that stored.", Kind::Counter, s.sets),
        ("deletes", "Deletes that removed a value.", Kind::Counter, s.deletes),
        ("evictions", "Values GC evicted.", Kind::Counter, s.evictions),
        ("expirations", "Values GC found expired.", Kind::Counter, s.expirations),
    ];
    for (name, help, kind, v) in figures {
        r.add(name, help, kind, Value::U64(v));
    }
    r
}

fn stat(a: StatArgs) -> Result<ExitCode, String> {
    let store = open_store(&a.dev, false, true)?;
    let figures = registry(&stats_of(&store, &a.name)?);
    if a.json {
        println!("{}", figures.render_json());
    } else {
        print!("{}", figures.render_text());
    }
    Ok(ExitCode::SUCCESS)
}

fn drop_ns(a: NameArgs) -> Result<ExitCode, String> {
    let before = with_store(&a.dev, false, |store| {
        let before = stats_of(store, &a.name)?;
        store.drop_namespace(&a.name).map_err(|e| e.to_string())?;
        Ok(before)
    })?;
    println!(
        "dropped namespace {} (id {}): {} keys, {} of values gone; GC frees their space",
        before.name,
        before.id,
        before.keys,
        bytes(before.value_bytes)
    );
    Ok(ExitCode::SUCCESS)
}

fn truncate(a: NameArgs) -> Result<ExitCode, String> {
    let (before, after) = with_store(&a.dev, false, |store| {
        let before = stats_of(store, &a.name)?;
        store.truncate(&a.name).map_err(|e| e.to_string())?;
        Ok((before, stats_of(store, &a.name)?))
    })?;
    let id =
        if after.id == before.id { format!("id {}", before.id) } else { format!("id {} -> {}", before.id, after.id) };
    println!(
        "truncated namespace {} ({id}): {} keys, {} of values gone; its options are kept",
        before.name,
        before.keys,
        bytes(before.value_bytes)
    );
    Ok(ExitCode::SUCCESS)
}
