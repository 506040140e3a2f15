//! Progress of a benchmark's long phases (loading keys): a bar on a
//! terminal (indicatif), and a log line (`tracing`, info) every
//! [`LOG_EVERY`] otherwise. Updated from any thread; drawing is
//! rate-limited by indicatif, logging by the interval.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Interval of the log lines when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    label: String,
    total: u64,
    done: AtomicU64,
    bar: Option<ProgressBar>,
    started: Instant,
    last_log: Mutex<Instant>,
    enabled: bool,
}

impl Progress {
    /// Progress of `total` units (`label` names them, e.g. "loading keys");
    /// shows nothing when not `enabled` (tests).
    pub fn new(label: &str, total: u64, enabled: bool) -> Progress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let pb = ProgressBar::new(total);
            if let Ok(style) =
                ProgressStyle::with_template(&format!("{label} {{bar:40}} {{pos}}/{{len}} {{per_sec}} eta {{eta}}"))
            {
                pb.set_style(style);
            }
            pb
        });
        let now = Instant::now();
        Progress {
            label: label.to_string(),
            total,
            done: AtomicU64::new(0),
            bar,
            started: now,
            last_log: Mutex::new(now),
            enabled,
        }
    }

    /// `n` more units are done.
    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Relaxed) + n;
        if let Some(b) = &self.bar {
            b.set_position(done);
            return;
        }
        if !self.enabled {
            return;
        }
        let mut last = self.last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            let rate = done as f64 / self.started.elapsed().as_secs_f64();
            tracing::info!(done, total = self.total, per_sec = rate as u64, "{}", self.label);
        }
    }

    pub fn done(&self) -> u64 {
        self.done.load(Relaxed)
    }

    /// The phase ended: the bar is cleared, a last line logged.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if self.enabled {
            let secs = self.started.elapsed().as_secs_f64();
            tracing::info!(done = self.done(), total = self.total, secs, "{}: done", self.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads() {
        let p = Progress::new("test", 4000, false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| p.inc(1)));
            }
        });
        assert_eq!(p.done(), 4000);
        p.finish();
    }
}
