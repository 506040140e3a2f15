//! The `granary` command line: create, put, get, del, batch (atomic), stat,
//! verify, load, ns (namespaces) and export (block devices) on a store in a
//! file or block device;
//! get, put, del and batch also on a server (`--server HOST:PORT`, the
//! native protocol); serve.
//! One module per command (`cmd/`, `serve.rs`); the benchmarks are a
//! separate binary, `granary-bench`.
//!
//! Exit codes: 0 success; 1 the key is absent (`get`, `del`), `put --mode`
//! did not store, a `batch`'s condition failed, or `verify` found problems;
//! 2 an error (bad arguments, IO, corruption), printed as one line on
//! stderr.

mod cmd;
mod metrics;
mod serve;
mod settings;

use clap::{Parser, Subcommand};
use granary_cli::logging;
use std::process::ExitCode;

/// `granary --version`: the crate version and the git commit built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("GRANARY_GIT_HASH"), ")");

#[derive(Parser)]
#[command(name = "granary", version = VERSION, about = "Granary: a key-value store and cache for NVMe SSDs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a store in a new file (preallocated), on a block device, or on a
    /// RAID-0 stripe set (PATH a comma-separated list of files or devices).
    Create(cmd::create::CreateArgs),
    /// Store a value: from the argument, or from stdin when absent or "-".
    /// `granary put PATH KEY [VALUE]`, or `granary put --server HOST:PORT KEY [VALUE]`;
    /// `--ns NAME` for a namespace's key.
    Put(cmd::kv::PutArgs),
    /// Print a value to stdout; exit 1 if the key is absent.
    /// `granary get PATH KEY`, or `granary get --server HOST:PORT KEY`;
    /// `--ns NAME` for a namespace's key.
    Get(cmd::kv::GetArgs),
    /// Delete a key; exit 1 if it was absent.
    /// `granary del PATH KEY`, or `granary del --server HOST:PORT KEY`;
    /// `--ns NAME` for a namespace's key.
    Del(cmd::kv::DelArgs),
    /// Commit operations read from stdin atomically, all or none, one a
    /// line: `put NS KEY VALUE`, `put-absent NS KEY VALUE`, `put-present NS
    /// KEY VALUE`, `cas NS KEY CAS VALUE`, `del NS KEY` (NS `default` for
    /// the default namespace; fields may be "quoted"; \xNN, \\, \", \n,
    /// \t, \r escapes; # comments). Prints `committed N`; exit 1 if a
    /// condition failed (nothing applied). `granary batch PATH`, or
    /// `granary batch --server HOST:PORT`.
    Batch(cmd::batch::BatchArgs),
    /// Print geometry, space, index and recovery figures.
    Stat(cmd::stat::StatArgs),
    /// Check every record and the index; exit 1 if anything is wrong.
    Verify(cmd::verify::VerifyArgs),
    /// Give a store created before secret key hash seeds a secret one of
    /// its own, offline (its checkpoints are dropped and its index rebuilt
    /// by a log scan); a store that has one is left as it is.
    Rekey(cmd::rekey::RekeyArgs),
    /// Write generated keys key-<i> (12 digits, e.g. key-000000000042) with
    /// values naming i and the round, for drills and benchmarks; prints what
    /// it wrote. With --ack, each acknowledged write is printed to stdout as
    /// "<round> <i>" once it is on the device.
    Load(cmd::load::LoadArgs),
    /// Namespaces of a store: `ns create|list|stat|drop|truncate PATH ...`.
    /// Their keys are read and written by get, put and del with --ns NAME.
    Ns(cmd::ns::NsArgs),
    /// Exports of a store, block devices for a block server (NBD):
    /// `export create|list|drop PATH ...`. An export is a namespace of kind
    /// block: `ns list` shows it, `ns truncate` zeroes it.
    Export(cmd::export::ExportArgs),
    /// Serve a store until SIGTERM/SIGINT over the Memcache protocol (text,
    /// meta and binary), the native protocol and the Redis protocol (RESP;
    /// --no-native and --no-resp turn those two off), and over NBD with
    /// --nbd-port; a missing data file is created.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    logging::one_line_panics("granary");
    logging::quiet_on_closed_stdout(run)
}

/// The command line's command, run.
fn run() -> ExitCode {
    let cli = Cli::parse();
    let json_logs = logging::env_json();
    let r = match cli.cmd {
        // `serve` may ask for JSON logs (flag or configuration file), so
        // logging starts once its configuration is read.
        Cmd::Serve(a) => match serve::Config::resolve(&a) {
            Ok(c) => {
                logging::init(c.log_format == serve::LogFormat::Json);
                serve::main(c)
            }
            Err(msg) => Err(msg),
        },
        cmd => {
            logging::init(json_logs);
            run_local(cmd)
        }
    };
    logging::finish("granary", r)
}

/// Every command but `serve`.
fn run_local(cmd: Cmd) -> Result<ExitCode, String> {
    match cmd {
        Cmd::Create(a) => cmd::create::run(a),
        Cmd::Put(a) => cmd::kv::put(a),
        Cmd::Get(a) => cmd::kv::get(a),
        Cmd::Del(a) => cmd::kv::del(a),
        Cmd::Batch(a) => cmd::batch::run(a),
        Cmd::Stat(a) => cmd::stat::run(a),
        Cmd::Verify(a) => cmd::verify::run(a),
        Cmd::Rekey(a) => cmd::rekey::run(a),
        Cmd::Load(a) => cmd::load::run(a),
        Cmd::Ns(a) => cmd::ns::run(a),
        Cmd::Export(a) => cmd::export::run(a),
        Cmd::Serve(_) => unreachable!("matched above"),
    }
}
