//! `granary export`: the exports of a local store (PATH), block devices
//! kept in it for a block server (NBD): create one of a size and block
//! size, list them, drop one. An export is a namespace of kind `block`
//! (`granary_store::NamespaceKind::Block`), so `granary ns list` and `ns
//! stat` show it too, and `ns truncate` empties it (every block reads as
//! zeros again).
//!
//! Errors (a bad size or block size, a name that exists or does not, a
//! namespace that is not an export) are one line, exit 2: the engine's
//! messages for what it refuses, this module's for `drop` of a plain
//! namespace, which it refuses rather than drop a key space by mistake.

use super::ns::{bytes, table};
use super::{open_store, with_store, DeviceArgs};
use granary_cli::size;
use granary_store::{NamespaceKind, NamespaceStats, BLOCK_BYTES_DEFAULT};
use std::process::ExitCode;

/// Create, list and drop the exports (block devices) of a store.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(subcommand)]
    cmd: ExportCmd,
}

#[derive(clap::Subcommand)]
enum ExportCmd {
    /// Create export NAME: a block device of SIZE bytes in blocks of
    /// --block-size, every block reading as zeros until written; prints its
    /// geometry.
    Create(CreateArgs),
    /// Print one line per export: name, size, block size, blocks written
    /// and the bytes of their records.
    List(ListArgs),
    /// Drop export NAME and its blocks, in O(1); GC frees their space
    /// later.
    Drop(NameArgs),
}

#[derive(clap::Args)]
struct CreateArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The new export's name: 1 to 64 ASCII letters, digits, '_', '-', '.'.
    name: String,
    /// Its size, e.g. 10G: a multiple of the block size, at most 2^63 bytes.
    #[arg(long, value_parser = size::parse, value_name = "SIZE")]
    size: u64,
    /// Bytes of a block: a power of two from 512 to 64K that one value of
    /// the store holds (one block is one value).
    #[arg(long, value_parser = block_size, default_value_t = BLOCK_BYTES_DEFAULT, value_name = "BYTES")]
    block_size: u32,
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    dev: DeviceArgs,
}

/// A store and an export's name.
#[derive(clap::Args)]
struct NameArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The export.
    name: String,
}

/// A block size: a size (`4096`, `4K`) that fits a u32; the engine says
/// which sizes it takes.
fn block_size(s: &str) -> Result<u32, String> {
    let b = size::parse(s)?;
    u32::try_from(b).map_err(|_| format!("block size {s:?} is out of range (at most 64K)"))
}

pub fn run(a: ExportArgs) -> Result<ExitCode, String> {
    match a.cmd {
        ExportCmd::Create(a) => create(a),
        ExportCmd::List(a) => list(a),
        ExportCmd::Drop(a) => drop_export(a),
    }
}

/// An export's size and block size; None for a plain namespace.
fn geometry(s: &NamespaceStats) -> Option<(u64, u32)> {
    match s.options.kind {
        NamespaceKind::Block { size_bytes, block_bytes } => Some((size_bytes, block_bytes)),
        NamespaceKind::Kv => None,
    }
}

fn create(a: CreateArgs) -> Result<ExitCode, String> {
    let st = with_store(&a.dev, false, |store| {
        store.create_export(&a.name, a.size, a.block_size).and_then(|ns| ns.stats()).map_err(|e| e.to_string())
    })?;
    let (size_bytes, block_bytes) = geometry(&st).expect("created as an export");
    println!(
        "created export {} (id {}): size {}, block size {block_bytes}, {} blocks",
        st.name,
        st.id,
        bytes(size_bytes),
        st.options.kind.blocks()
    );
    Ok(ExitCode::SUCCESS)
}

fn list(a: ListArgs) -> Result<ExitCode, String> {
    let store = open_store(&a.dev, false, true)?;
    let header = ["name", "size", "block_size", "blocks_written", "bytes"].map(String::from);
    let rows: Vec<[String; 5]> = store
        .exports()
        .iter()
        .filter_map(|s| {
            let (size_bytes, block_bytes) = geometry(s)?;
            Some([s.name.clone(), bytes(size_bytes), block_bytes.to_string(), s.keys.to_string(), bytes(s.value_bytes)])
        })
        .collect();
    print!("{}", table(&header, &rows));
    Ok(ExitCode::SUCCESS)
}

fn drop_export(a: NameArgs) -> Result<ExitCode, String> {
    let before = with_store(&a.dev, false, |store| {
        let before = store.namespace(&a.name).and_then(|ns| ns.stats()).map_err(|e| e.to_string())?;
        if geometry(&before).is_none() {
            return Err(format!(
                "namespace {:?} is not an export (its kind is {}); drop it with `granary ns drop`",
                a.name,
                before.options.kind.as_str()
            ));
        }
        store.drop_namespace(&a.name).map_err(|e| e.to_string())?;
        Ok(before)
    })?;
    println!(
        "dropped export {} (id {}): {} blocks written, {} of values gone; GC frees their space",
        before.name,
        before.id,
        before.keys,
        bytes(before.value_bytes)
    );
    Ok(ExitCode::SUCCESS)
}
