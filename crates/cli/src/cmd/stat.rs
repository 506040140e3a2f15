//! `granary stat`: geometry, space, GC, index and recovery figures of a
//! store, as text (`name value` lines) or JSON, both rendered from the
//! store's one list of figures (`Stats::registry`).

use super::{open_store, DeviceArgs};
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
    let figures = open_store(&a.dev, false, true)?.stats().registry();
    if a.json {
        println!("{}", figures.render_json());
    } else {
        print!("{}", figures.render_text());
    }
    Ok(ExitCode::SUCCESS)
}
