//! `granary verify`: check every record and the index, offline.

use super::{open_store, DeviceArgs};
use std::process::ExitCode;

/// Check every record and the index; exit 1 if anything is wrong.
#[derive(clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    dev: DeviceArgs,
}

pub fn run(a: VerifyArgs) -> Result<ExitCode, String> {
    let store = open_store(&a.dev, false, true)?;
    let r = match granary_cli::progress::bar("verifying", false) {
        Some(p) => store.verify_with_progress(&p),
        None => store.verify(),
    }
    .map_err(|e| e.to_string())?;
    println!(
        "checked {} index entries ({} values, {} tombstones) and {} records in {} segments in {} ms",
        r.entries_checked, r.values, r.tombstones, r.records_scanned, r.segments_scanned, r.millis
    );
    if r.torn_records > 0 {
        println!(
            "{} records in the newest segments fail their checksums: taken for writes a crash tore (never acknowledged), ignored, and cleared by the next open for writing; had the store closed cleanly since its last crash, they are damage (`verify` without --no-checkpoint then reports them)",
            r.torn_records
        );
    }
    if r.summaries + r.summaries_unusable > 0 {
        println!(
            "{} segment summaries checked against their records, {} unusable (torn by a crash or damaged: GC reads those segments' records)",
            r.summaries, r.summaries_unusable
        );
    }
    for s in &r.superblock_copies_to_mend {
        println!("{s}: the store reads the other copy, and the next open for writing (`granary serve`) rewrites it");
    }
    if let Some(c) = &r.checkpoint_unusable {
        println!(
            "{c}: the newest checkpoint does not check out (on a zoned device a crash while it was written leaves one): opens read an older one or scan the log"
        );
    }
    for e in &r.errors {
        println!("error: {e}");
    }
    if r.is_clean() {
        println!("ok: no problems found");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("FAILED: {} problems found", r.error_count);
        Ok(ExitCode::from(1))
    }
}
