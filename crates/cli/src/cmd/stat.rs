//! `granary stat`: geometry, space, GC, index and recovery figures of a
//! store, as text or JSON.

use super::{open_store, DeviceArgs};
use granary_cli::size;
use granary_store::Stats;
use std::process::ExitCode;

/// Print geometry, space, index and recovery figures.
#[derive(clap::Args)]
pub struct StatArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: StatArgs) -> Result<ExitCode, String> {
    let st = open_store(&a.dev, false, true)?.stats();
    if a.json {
        println!("{}", stats_json(&st));
    } else {
        print_stats(&st);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stats(st: &Stats) {
    println!("device            {}", st.device);
    println!("device size       {}", size::human(st.device_bytes));
    println!("grain             {} B", st.grain_bytes);
    println!(
        "segments          {} of {} ({} free, {} open, {} closed)",
        st.segments,
        size::human(st.segment_bytes),
        st.segments_free,
        st.segments_open,
        st.segments_closed
    );
    println!("keys              {}", st.keys);
    println!(
        "gc                {} segments reclaimed, {} records relocated, {} tombstones dropped (starts below {} free segments, stops at {})",
        st.gc.victims, st.gc.records_relocated, st.gc.tombstones_dropped, st.gc_watermarks.0, st.gc_watermarks.1
    );
    println!("tombstones        {}", st.tombstones);
    println!("live bytes        {}", size::human(st.live_bytes));
    println!("max value         {}", size::human(st.value_bytes_max));
    println!(
        "index             {} entries, {} tables, {} slots, {} of DRAM",
        st.index.entries,
        st.index.tables,
        st.index.slots,
        size::human(st.index.memory_bytes)
    );
    let r = &st.recovery;
    if r.checkpoint_id != 0 {
        println!(
            "recovery          checkpoint {} ({} entries, {} stale dropped, {} ms){}",
            r.checkpoint_id,
            r.checkpoint_entries,
            r.checkpoint_dropped,
            r.checkpoint_millis,
            if r.clean_shutdown { ", clean shutdown: no log replayed" } else { "" }
        );
    } else {
        println!("recovery          no valid checkpoint: the whole log was scanned");
    }
    println!(
        "log scan          {} segments, {} records, {} damaged, {} torn, {} read in {} ms ({:.0} MB/s, {} threads); open took {} ms",
        r.segments_scanned,
        r.records,
        r.damaged_records,
        r.torn_records,
        size::human(r.bytes_read),
        r.scan_millis,
        r.scan_mb_per_s(),
        r.threads,
        r.millis
    );
    println!("checkpoint        current {} on {} segments", st.checkpoints.current_id, st.segments_index);
}

fn stats_json(st: &Stats) -> serde_json::Value {
    let r = &st.recovery;
    serde_json::json!({
        "device": st.device,
        "device_bytes": st.device_bytes,
        "grain_bytes": st.grain_bytes,
        "segment_bytes": st.segment_bytes,
        "segments": st.segments,
        "segments_free": st.segments_free,
        "segments_open": st.segments_open,
        "segments_closed": st.segments_closed,
        "segments_index": st.segments_index,
        "keys": st.keys,
        "tombstones": st.tombstones,
        "live_bytes": st.live_bytes,
        "value_bytes_max": st.value_bytes_max,
        "index": {
            "entries": st.index.entries,
            "tables": st.index.tables,
            "slots": st.index.slots,
            "memory_bytes": st.index.memory_bytes,
            "grows": st.index.grows,
        },
        "recovery": {
            "segments_scanned": r.segments_scanned,
            "records": r.records,
            "damaged_records": r.damaged_records,
            "torn_records": r.torn_records,
            "skipped_grains": r.skipped_grains,
            "bytes_read": r.bytes_read,
            "millis": r.millis,
            "scan_millis": r.scan_millis,
            "scan_mb_per_s": r.scan_mb_per_s(),
            "threads": r.threads,
            "checkpoint_id": r.checkpoint_id,
            "checkpoint_session": r.checkpoint_session,
            "checkpoint_entries": r.checkpoint_entries,
            "checkpoint_dropped": r.checkpoint_dropped,
            "checkpoint_millis": r.checkpoint_millis,
            "clean_shutdown": r.clean_shutdown,
        },
        "checkpoints": {
            "current_id": st.checkpoints.current_id,
            "segments": st.segments_index,
            "written": st.checkpoints.written,
            "failed": st.checkpoints.failed,
        },
        "session": st.session,
    })
}
