//! `granary load`: rounds of generated writes (the keys and values of
//! `granary_store::loadgen`), for drills and benchmarks.

use super::{mode, DeviceArgs};
use granary_cli::size;
use granary_store::loadgen::{load_key, load_value};
use granary_store::{Durability, OpenOptions, Store};
use std::io::Write;
use std::process::ExitCode;

/// Write generated keys: round r writes key-<i> (i = 0..KEYS, as
/// `key-000000000042`) with a value that names i and r (`42:r:42:r:...`),
/// so a read shows which write it came from. Prints what it wrote at the
/// end; with --ack, each acknowledged write is printed to stdout as
/// "<round> <i>" once it is on the device (a reader that goes away stops
/// the load: the store is closed and the exit status is 141, as for any
/// command whose output has no reader).
#[derive(clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Keys per round (e.g. 100K).
    #[arg(long, default_value = "100K", value_parser = size::count)]
    keys: u64,
    /// Value size in bytes (at least the value's tag, "<i>:<round>:"; at
    /// most the store's largest value).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Rounds: each overwrites every key with the round's value.
    #[arg(long, default_value_t = 1)]
    rounds: u64,
    /// Number of the first round.
    #[arg(long, default_value_t = 1)]
    first_round: u64,
    /// Print "<round> <i>" to stdout after each acknowledged write.
    #[arg(long)]
    ack: bool,
    /// fdatasync every write (survives power loss on drives without PLP).
    #[arg(long)]
    flush: bool,
    /// Background index checkpoint every this many milliseconds (0: only at the end).
    #[arg(long, default_value_t = 60_000)]
    checkpoint_ms: u64,
}

pub fn run(a: LoadArgs) -> Result<ExitCode, String> {
    let opts = OpenOptions {
        durability: if a.flush { Durability::Flush } else { Durability::Direct },
        use_checkpoint: !a.dev.no_checkpoint,
        checkpoint_interval: (a.checkpoint_ms > 0).then(|| std::time::Duration::from_millis(a.checkpoint_ms)),
        progress: granary_cli::progress::recovery(),
        ..OpenOptions::default()
    };
    let store = Store::open_path(&a.dev.path, mode(a.dev.buffered), &opts).map_err(|e| e.to_string())?;
    // Refused before a value is made (a typo could ask for gigabytes).
    let max = store.value_bytes_max(load_key(a.keys.saturating_sub(1)).len());
    if a.value_bytes as u64 > max {
        let _ = store.close();
        return Err(format!(
            "--value-bytes {}: this store takes values up to {} ({max} bytes)",
            a.value_bytes,
            size::human(max)
        ));
    }
    let started = std::time::Instant::now();
    let loaded = load(&store, &a);
    // A failed load still closes the store: what was acknowledged gets a
    // checkpoint, so the next open replays no log.
    let closed = store.close().map_err(|e| e.to_string());
    let done = loaded?;
    closed?;
    if done.2 {
        return Ok(ExitCode::from(granary_cli::logging::CLOSED_STDOUT_EXIT));
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = done.1;
    eprintln!(
        "granary: loaded {} writes ({} keys x {} rounds, {} of values) in {secs:.2} s: {:.0} writes/s, {}/s",
        done.0,
        a.keys,
        a.rounds,
        size::human(bytes),
        done.0 as f64 / secs.max(1e-9),
        size::human((bytes as f64 / secs.max(1e-9)) as u64)
    );
    Ok(ExitCode::SUCCESS)
}

/// The writes; returns (writes, value bytes, whether --ack's reader went
/// away, which ends them). Progress as a bar on a terminal, else a log
/// line every few seconds.
fn load(store: &Store, a: &LoadArgs) -> Result<(u64, u64, bool), String> {
    use std::io::IsTerminal;
    let total = a.keys.saturating_mul(a.rounds);
    let bar = (std::io::stderr().is_terminal() && !a.ack).then(|| indicatif::ProgressBar::new(total));
    let mut out = std::io::stdout().lock();
    let mut last_log = std::time::Instant::now();
    let (mut done, mut bytes) = (0u64, 0u64);
    for round in a.first_round..a.first_round.saturating_add(a.rounds) {
        for i in 0..a.keys {
            let (k, v) = (load_key(i), load_value(i, round, a.value_bytes));
            store.put(&k, &v).map_err(|e| format!("after {done} writes: {e}"))?;
            if a.ack {
                match writeln!(out, "{round} {i}").and_then(|()| out.flush()) {
                    Ok(()) => {}
                    // (No bar with --ack.)
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                        return Ok((done + 1, bytes + v.len() as u64, true));
                    }
                    Err(e) => return Err(format!("stdout: {e}")),
                }
            }
            done += 1;
            bytes += v.len() as u64;
            if let Some(b) = &bar {
                if done.is_multiple_of(1024) {
                    b.set_position(done);
                }
            } else if last_log.elapsed().as_secs() >= 5 {
                tracing::info!(done, total, "load in progress");
                last_log = std::time::Instant::now();
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok((done, bytes, false))
}
