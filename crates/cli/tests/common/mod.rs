//! What the CLI's integration tests share: starting `granary` as a child
//! process, and a seeded generator. `start` spawns the child with stderr
//! piped, drains stderr on a thread (so the child never blocks on a full
//! pipe), and waits, bounded in time, for the line that says it is ready
//! (usually a "serving ..." line).
//!
//! Invariant: once `start` returns `Ok`, a thread owns the child's stderr
//! and reads it to its end; every line lands in `Started::all` and, after
//! the awaited one, in `Started::later`. On `Err` the child is reaped.

// Each test file includes this module; not all of them use every item.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for a server's ready line by default.
pub const START_LIMIT: Duration = Duration::from_secs(90);

/// A started child.
pub struct Started {
    pub child: Child,
    /// stderr up to and including the awaited line.
    pub log: String,
    /// stderr lines after the awaited one (without their newline), as they
    /// are read; disconnected once stderr closes.
    pub later: Receiver<String>,
    /// All of stderr read so far (the drain thread keeps appending).
    pub all: Arc<Mutex<String>>,
}

/// The lines left in `later` up to the end of stderr (the child has exited
/// or is about to), waiting at most `limit`.
pub fn rest(later: &Receiver<String>, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    let mut out = String::new();
    loop {
        match later.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                out.push_str(&line);
                out.push('\n');
            }
            Err(RecvTimeoutError::Disconnected) => return out,
            Err(RecvTimeoutError::Timeout) => panic!("stderr still open after {limit:?}:\n{out}"),
        }
    }
}

/// `granary` with `args` and log level info; the caller adds env, stdin.
pub fn granary(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_granary"));
    cmd.args(args).env("GRANARY_LOG", "info");
    cmd
}

/// Spawn `cmd` (stdout to null, stderr piped) and wait at most `limit` for
/// a stderr line for which `until` holds. `Err` says why not (exit status,
/// or killed at the limit) followed by the stderr read.
// The child goes back to the caller, which reaps it.
#[allow(clippy::zombie_processes)]
pub fn start(cmd: &mut Command, until: impl Fn(&str) -> bool, limit: Duration) -> Result<Started, String> {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    let all = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let all2 = all.clone();
    std::thread::spawn(move || {
        for line in err.lines() {
            let Ok(line) = line else { break };
            {
                let mut a = all2.lock().unwrap();
                a.push_str(&line);
                a.push('\n');
            }
            // Nobody may listen any more: keep draining regardless.
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + limit;
    let mut log = String::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                log.push_str(&line);
                log.push('\n');
                if until(&line) {
                    return Ok(Started { child, log, later: rx, all });
                }
            }
            Err(e) => {
                let why = match e {
                    // stderr closed: it exited; reap it.
                    RecvTimeoutError::Disconnected => match child.wait() {
                        Ok(st) => format!("exited early ({st})"),
                        Err(e) => format!("exited early ({e})"),
                    },
                    RecvTimeoutError::Timeout => {
                        let _ = child.kill();
                        let _ = child.wait();
                        format!("no ready line within {limit:?}: killed")
                    }
                };
                return Err(format!("{why}\n{}", all.lock().unwrap()));
            }
        }
    }
}

/// `start`, panicking with the log when the child does not get ready.
pub fn start_or_panic(cmd: &mut Command, until: impl Fn(&str) -> bool, limit: Duration) -> Started {
    let what = format!("{cmd:?}");
    start(cmd, until, limit).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// splitmix64: the tests' seeded generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Whether `tools` are on PATH and Debian's Python (`/usr/bin/python3`)
/// imports each `(module, package)`; a test skips (with the reason
/// printed) when not, and panics instead when GRANARY_REQUIRE_PEERS is set
/// (scripts/test.sh installs them all).
pub fn have_peers(tools: &[&str], python_modules: &[(&str, &str)]) -> bool {
    let on_path =
        |t: &str| std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()));
    let mut missing: Vec<String> = tools.iter().filter(|t| !on_path(t)).map(|t| t.to_string()).collect();
    for &(module, package) in python_modules {
        let ok = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            missing.push(package.into());
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(),
        "missing (scripts/test.sh installs them): {missing:?}"
    );
    eprintln!("skipped: missing {missing:?}");
    false
}

/// One command to the fault-injection control socket at `control`
/// (`GRANARY_FAULT_SOCKET`, docs/FAULTS.md), waiting at most `limit` for
/// the reply; panics unless it is "ok...".
pub fn fault_at(control: &std::path::Path, cmd: &str, limit: Duration) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(control).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    writeln!(s, "{cmd}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.starts_with("ok"), "fault {cmd:?}: {line}");
    line.trim_end().to_string()
}

/// Poll `cond` every few milliseconds until it holds or `limit` passes;
/// whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Stop a server this test started: SIGTERM (a clean stop), waited for up
/// to a minute, then SIGKILL. (By its PID with kill(2): the `kill` command
/// is not on every fresh machine, and a failed spawn left `wait` blocked.)
pub fn stop(child: &mut std::process::Child) {
    // SAFETY: kill(2) of this test's own child, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    if !wait_until(Duration::from_secs(60), || child.try_wait().is_ok_and(|s| s.is_some())) {
        let _ = child.kill();
        let _ = child.wait();
    }
}
