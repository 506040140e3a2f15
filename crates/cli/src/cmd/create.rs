//! `granary create`: a new store in a file (preallocated and zero-filled),
//! on a block device, or on a RAID-0 stripe set.

use super::{mode, open_options, DeviceArgs};
use granary_cli::size;
use granary_store::io::IoBackend;
use granary_store::{CreateOptions, IfPresent, NewStore, OpenOptions, Site};
use std::process::ExitCode;

/// Create a store in a new file (preallocated), on a block device, or on a
/// RAID-0 stripe set (PATH a comma-separated list of files or devices).
#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Size of a new file, e.g. 1G, 512MiB (ignored for block devices).
    #[arg(long, value_parser = size::parse)]
    size: Option<u64>,
    /// Segment size, a power of two (default: 1/64 of the device, 1 MiB..1
    /// GiB; for a new file at least 2 MiB, so that `granary serve` takes
    /// its default 1 MiB items).
    #[arg(long, value_parser = size::parse)]
    segment_size: Option<u64>,
    /// Grain size in bytes: 512 or 4096 (default: the device's block size).
    #[arg(long)]
    grain: Option<u32>,
    /// Stripe unit of a stripe set, a power of two of at least 4 KiB
    /// (default: 128 KiB).
    #[arg(long, value_parser = size::parse)]
    stripe_size: Option<u64>,
    /// Succeed without changes if PATH already holds a Granary store.
    #[arg(long)]
    if_absent: bool,
}

pub fn run(a: CreateArgs) -> Result<ExitCode, String> {
    let stripe_bytes = match a.stripe_size {
        None => granary_store::io::stripe::STRIPE_BYTES_DEFAULT,
        Some(s) => u32::try_from(s).map_err(|_| format!("--stripe-size {s} is too large"))?,
    };
    if a.stripe_size.is_some() && !a.dev.path.as_os_str().as_encoded_bytes().contains(&b',') {
        return Err(format!(
            "--stripe-size is for a stripe set (PATH a comma-separated list); {} is one device",
            a.dev.path.display()
        ));
    }
    let if_present = if a.if_absent { IfPresent::Open } else { IfPresent::Refuse };
    let site = Site::inspect(&a.dev.path, if_present).map_err(|e| e.to_string())?;
    if site.removed_unfinished() {
        // (Creating it again needs a size: without one, the creation below
        // refuses, and says so.)
        let again = if a.size.is_some() { ", creating it again" } else { "" };
        eprintln!(
            "{}: an earlier creation was interrupted before the store was written (it held nothing): removed{again}",
            a.dev.path.display()
        );
    }
    let p = if site.holds_store() {
        // Opening stays interruptible, as in any command.
        site.open(mode(a.dev.buffered), IoBackend::Sync, &open_options(&a.dev, false, true))
    } else {
        // Ctrl-C during the zero fill stops it and removes the file.
        granary_cli::signals::block_stop_signals();
        let fill = granary_cli::progress::zero_fill();
        // A new file's segments hold `granary serve`'s largest item by
        // default, as the segments serve makes do (smaller ones made the
        // store refuse its default -I).
        let files = granary_store::io::DeviceSpec::parse(&a.dev.path).is_ok_and(|spec| {
            use std::os::unix::fs::FileTypeExt;
            spec.paths().iter().all(|p| !std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        });
        let segment_bytes = a.segment_size.or(a.size.filter(|_| files).map(|s| {
            granary_store::options::default_segment_bytes(s)
                .max(crate::serve::segment_bytes_for_item(crate::serve::MAX_ITEM_SIZE_DEFAULT))
        }));
        let new = NewStore {
            size_bytes: a.size.unwrap_or(0),
            stripe_bytes,
            create: CreateOptions { grain_bytes: a.grain, segment_bytes, index_table_homes: None },
            fill_progress: &fill,
        };
        site.create(mode(a.dev.buffered), IoBackend::Sync, &new, &OpenOptions::default())
    }
    .map_err(|e| e.to_string())?;
    if !p.created {
        println!("{} already holds a store; left as it is", a.dev.path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let st = p.store.stats();
    println!(
        "created {}: {} segments of {}, {}-byte grains, values up to {}",
        st.device,
        st.segments,
        size::human(st.segment_bytes),
        st.grain_bytes,
        size::human(st.value_bytes_max)
    );
    p.store.close().map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}
