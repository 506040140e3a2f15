//! Progress of long work: a bar on a terminal, log lines otherwise.

use crate::signals::pending_stop_signal;
use granary_store::ProgressHook;

/// A progress bar labelled `label` when stderr is a terminal, drawn once
/// the work has taken half a second; units are bytes or plain steps.
pub fn bar(label: &'static str, bytes: bool) -> Option<ProgressHook> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let started = std::time::Instant::now();
    let bar: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);
    Some(ProgressHook(std::sync::Arc::new(move |done, total| {
        let mut b = bar.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() && started.elapsed().as_millis() >= 500 && done < total {
            let pb = indicatif::ProgressBar::new(total);
            let template = if bytes {
                format!("{label} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}")
            } else {
                format!("{label} {{bar:40}} {{pos}}/{{len}} eta {{eta}}")
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
                pb.set_style(style);
            }
            *b = Some(pb);
        }
        if let Some(pb) = b.as_ref() {
            pb.set_position(done);
            if done >= total {
                pb.finish_and_clear();
            }
        }
    })))
}

/// Recovery's log scan: a bar when stderr is a terminal (the store logs
/// its progress otherwise).
pub fn recovery() -> Option<ProgressHook> {
    bar("recovering", true)
}

/// A zero fill of this many bytes or more says so when it starts.
pub const ZERO_FILL_LOGGED_BYTES: u64 = 1 << 30;

/// Progress of a new file's zero fill (`DeviceSpec::create_with_progress`):
/// a bar on a terminal, else a log line at the start of a large fill (or
/// once a small one has taken a second), every few seconds after, and at
/// the end. A pending SIGTERM or SIGINT (blocked by the caller with
/// [`crate::signals::block_stop_signals`]) stops the fill with an error;
/// the creation then removes the file, so an interrupted start leaves
/// nothing behind.
pub fn zero_fill() -> impl Fn(u64, u64) -> std::io::Result<()> {
    let bar = bar("writing zeros", true);
    let started = std::time::Instant::now();
    let logged = std::cell::Cell::new(0u64);
    move |done, total| {
        if let Some(sig) = pending_stop_signal() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                format!(
                    "creation stopped by {sig} while writing zeros over the new file ({} of {} MiB); \
                     the file is removed",
                    done >> 20,
                    total >> 20
                ),
            ));
        }
        if let Some(b) = &bar {
            (b.0)(done, total);
            return Ok(());
        }
        // Quiet when quick: a first line at the start of a fill of 1 GiB
        // or more (seconds of writing) or once a smaller one has taken a
        // second, then every 5 s, and the end of a fill that was reported.
        let secs = started.elapsed().as_secs();
        let first = logged.get() == 0 && ((done == 0 && total >= ZERO_FILL_LOGGED_BYTES) || secs >= 1);
        if first || (logged.get() > 0 && (done >= total || secs >= logged.get() + 5)) {
            logged.set(secs.max(1));
            tracing::info!(done, total, secs, "writing zeros over the new data file (once, so that no write waits for ext4 to convert a preallocated extent)");
        }
        Ok(())
    }
}
