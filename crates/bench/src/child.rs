//! A server process that a benchmark starts and owns ([`ChildServer`]),
//! and what the benchmarks read of a process: the end of its log
//! ([`tail`]), its resident memory ([`vm_rss_kib`]) and CPU time
//! ([`cpu_secs`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A server a benchmark runs against: a started process, killed (by its
/// PID) and reaped on drop, then its data (files and folders) removed; or
/// one already running (no child, nothing removed).
///
/// A type that holds one beside state that must outlive the process (a
/// memory cgroup, removable only once it is empty) declares this field
/// first: fields drop in declaration order.
pub(crate) struct ChildServer {
    /// The peer's name, in errors.
    pub name: String,
    pub child: Option<Child>,
    /// Files and folders removed after it stops.
    pub data: Vec<PathBuf>,
    /// Where its output goes; its end is added to errors.
    pub log: Option<PathBuf>,
}

impl ChildServer {
    pub(crate) fn new(name: &str, child: Option<Child>, data: Vec<PathBuf>, log: Option<PathBuf>) -> ChildServer {
        ChildServer { name: name.into(), child, data, log }
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its VmRSS, KiB.
    pub(crate) fn rss_kib(&self) -> Option<u64> {
        vm_rss_kib(self.pid()?)
    }

    /// `e`, with the end of the server's log.
    pub(crate) fn failed(&self, e: String) -> String {
        let Some(log) = &self.log else { return e };
        format!("{e}\n{}'s log {} ends:\n{}", self.name, log.display(), tail(log, 15))
    }

    /// An error if the server has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), String> {
        if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
            return Err(self.failed(format!("{} exited: {st}", self.name)));
        }
        Ok(())
    }

    /// Wait until `ready` (asked every 50 ms) says the server is, or the
    /// server exits, or `timeout` passes: then the error `NAME did not
    /// {what} within {timeout}`, with the end of its log.
    pub(crate) fn wait_ready(
        &mut self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(self.failed(format!("{} did not {what} within {timeout:?}", self.name)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.data {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Start `cmd` (the server `name`), its stdout and stderr to a new file
/// `log`.
pub(crate) fn spawn_logged(name: &str, cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdout(out).stderr(err).spawn().map_err(|e| format!("starting {name}: {e}"))
}

/// The last `n` lines of a file.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// VmRSS of process `pid`, KiB.
pub(crate) fn vm_rss_kib(pid: u32) -> Option<u64> {
    parse_status_kib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmRSS")
}

/// A `Name:   1234 kB` field of a `/proc/PID/status` text, in KiB.
pub(crate) fn parse_status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// User plus system CPU seconds of process `pid` (all threads), from
/// `/proc/PID/stat`.
pub(crate) fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    parse_cpu_ticks(&stat).map(|t| t as f64 / hz.max(1) as f64)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command
/// name (field 2, in parentheses) may hold spaces and parentheses: fields
/// are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11); // fields 3..=13
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The `granary` to start as a peer (`given`, else the one beside this
/// executable), checked to serve what the benchmark needs: `flag` in its
/// `serve --help`; `lacks` says what is missing and what to do.
pub(crate) fn granary_serving(given: Option<&Path>, flag: &str, lacks: &str) -> Result<PathBuf, String> {
    let g = match given {
        Some(p) => p.to_path_buf(),
        None => crate::memcache::granary_exe()?,
    };
    let help = Command::new(&g)
        .args(["serve", "--help"])
        .output()
        .map_err(|e| format!("cannot run {} serve --help: {e}", g.display()))?;
    if !String::from_utf8_lossy(&help.stdout).contains(flag) {
        return Err(format!("{} serve has {lacks} (no {flag} flag)", g.display()));
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        // A command name with spaces and parentheses, then fields 3..=15.
        let line = "4242 (a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(line), Some(1234 + 567));
        let stat = "4242 (granary (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1 2"), None, "a short line is refused");
        let own = cpu_secs(std::process::id()).expect("this process's own stat");
        assert!(own >= 0.0);
    }

    #[test]
    fn status_fields() {
        let status = "Name:\tredis-server\nVmHWM:\t  9000 kB\nVmRSS:\t  8123 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(8123));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(9000));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
        assert!(vm_rss_kib(std::process::id()).is_some_and(|k| k > 0));
    }

    #[test]
    fn a_server_is_killed_and_its_data_removed_on_drop() {
        let dir = std::env::temp_dir().join(format!("granary-bench-child-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let file = dir.join("data.db");
        std::fs::write(&file, b"x").unwrap();
        let log = dir.join("sleep.log");
        let child = spawn_logged("sleep", Command::new("sleep").arg("30"), &log).unwrap();
        let mut s = ChildServer::new("sleep", Some(child), vec![file.clone(), dir.join("sub")], Some(log));
        assert!(s.check_alive().is_ok());
        assert!(s.rss_kib().is_some());
        let e = s.wait_ready(Duration::ZERO, "answer", || false).unwrap_err();
        assert!(e.starts_with("sleep did not answer within 0ns\nsleep's log "), "{e}");
        let pid = s.pid().unwrap();
        drop(s);
        assert!(!file.exists() && !dir.join("sub").exists());
        assert!(vm_rss_kib(pid).is_none(), "killed and reaped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
