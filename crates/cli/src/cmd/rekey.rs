//! `granary rekey`: give a store created before secret key hash seeds a
//! secret one, offline (`Store::rekey`; docs/SECURITY.md).

use super::{mode, open_options, DeviceArgs};
use granary_store::{Rekeyed, Store};
use std::process::ExitCode;

/// Give a store created before secret key hash seeds one of its own.
#[derive(clap::Args)]
pub struct RekeyArgs {
    #[command(flatten)]
    dev: DeviceArgs,
}

pub fn run(a: RekeyArgs) -> Result<ExitCode, String> {
    if a.dev.no_checkpoint {
        return Err("--no-checkpoint: a re-key always rebuilds the index by a log scan".into());
    }
    let opts = open_options(&a.dev, false, false);
    match Store::rekey_path(&a.dev.path, mode(a.dev.buffered), &opts).map_err(|e| e.to_string())? {
        Rekeyed::Already => println!(
            "the store's key hash has a secret seed already: nothing changed (beyond a superblock copy to mend, if any)"
        ),
        Rekeyed::Done { checkpoint_segments, keys } => println!(
            "the store's key hash has a secret seed now: {checkpoint_segments} checkpoint segments dropped, \
             the index rebuilt by a log scan ({keys} keys)"
        ),
    }
    Ok(ExitCode::SUCCESS)
}
