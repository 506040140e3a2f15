//! The process's file-descriptor limit (RLIMIT_NOFILE) against what the
//! server's connection limits need: `granary serve` raises its soft limit
//! at start-up to cover every listener's `conn_limit` connections (and
//! the over-limit connections it may be refusing),
//! [`FDS_PER_EXECUTOR`] for each executor thread and [`FDS_RESERVED`], up
//! to the hard limit, and refuses to start when the
//! hard limit is lower (a connection limit the process could not honour
//! would fail later, on accept, with EMFILE, while clients wait).
//!
//! Invariants: the soft limit is only ever raised, never lowered, and
//! never above the hard limit (which an unprivileged process cannot
//! raise).

use std::fmt;

/// Descriptors kept for everything but client connections and executors:
/// the listening sockets (two each: one accepts, one stops the accept
/// loop), the data files, the io_uring instances of the GC and checkpoint
/// threads, the metrics endpoint and its scrapes, stdio and logs.
pub const FDS_RESERVED: u64 = 256;

/// Descriptors each executor thread holds: its io_uring instance, the
/// eventfd that wakes it and its CPU pressure file.
pub const FDS_PER_EXECUTOR: u64 = 3;

/// Descriptors needed by `listeners` listeners of `conn_limit` connections
/// each (and the connections over the limit each may be refusing at once,
/// `granary_server::REFUSING_MAX`, and the one it closes at once) on
/// `executors` executor threads, the reserve included.
pub fn fds_needed(conn_limit: usize, listeners: usize, executors: usize) -> u64 {
    let per_listener = (conn_limit as u64).saturating_add(granary_server::REFUSING_MAX + 1);
    per_listener
        .saturating_mul(listeners as u64)
        .saturating_add(FDS_PER_EXECUTOR.saturating_mul(executors as u64))
        .saturating_add(FDS_RESERVED)
}

/// The soft and hard RLIMIT_NOFILE (`RLIM_INFINITY` as `u64::MAX`).
pub fn get() -> std::io::Result<(u64, u64)> {
    // SAFETY: getrlimit writes into `r`, a plain-data struct.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RLIMIT_NOFILE is a valid resource.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur as u64, r.rlim_max as u64))
}

/// Why the limit cannot cover what is needed.
#[derive(Debug)]
pub struct FdLimitError {
    pub needed: u64,
    pub soft: u64,
    pub hard: u64,
    /// The failed setrlimit, if the hard limit allowed it but the kernel
    /// refused (fs.nr_open lower than the hard limit).
    pub os: Option<std::io::Error>,
}

impl fmt::Display for FdLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} file descriptors are needed but the limit (RLIMIT_NOFILE) is {} (hard {})",
            self.needed, self.soft, self.hard
        )?;
        if let Some(e) = &self.os {
            write!(f, " and raising it failed: {e}")?;
        }
        write!(f, "; raise the hard limit (`ulimit -Hn`, systemd's LimitNOFILE=) or lower conn_limit")
    }
}

/// Raise the soft limit to at least `needed` (up to the hard limit): the
/// soft limit now, or why it cannot cover `needed`.
pub fn raise_to(needed: u64) -> Result<u64, FdLimitError> {
    let (soft, hard) = get().map_err(|e| FdLimitError { needed, soft: 0, hard: 0, os: Some(e) })?;
    if soft >= needed {
        return Ok(soft);
    }
    let refused = |os| FdLimitError { needed, soft, hard, os };
    if hard < needed {
        return Err(refused(None));
    }
    let r = libc::rlimit { rlim_cur: needed as libc::rlim_t, rlim_max: hard as libc::rlim_t };
    // SAFETY: setrlimit reads `r`, a valid rlimit, for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(refused(Some(std::io::Error::last_os_error())));
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_counts_every_listener_and_the_reserve() {
        let refusing = granary_server::REFUSING_MAX + 1;
        assert_eq!(fds_needed(1024, 3, 2), 3 * (1024 + refusing) + 2 * FDS_PER_EXECUTOR + FDS_RESERVED);
        assert_eq!(fds_needed(1024, 3, 128), 3 * (1024 + refusing) + 384 + FDS_RESERVED);
        assert_eq!(fds_needed(usize::MAX, 4, 1), u64::MAX);
    }

    #[test]
    fn raising_within_the_hard_limit_succeeds_and_beyond_it_fails_clearly() {
        let (soft, hard) = get().unwrap();
        // Within what is already allowed: nothing changes.
        assert_eq!(raise_to(soft.min(16)).unwrap(), soft);
        if hard != u64::MAX {
            let e = raise_to(hard + 1).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("{} file descriptors are needed", hard + 1)), "{msg}");
            assert!(msg.contains("lower conn_limit"), "{msg}");
            // The failure changed nothing.
            assert_eq!(get().unwrap().0, soft);
        }
        if soft < hard {
            assert_eq!(raise_to(soft + 1).unwrap(), soft + 1);
            assert_eq!(get().unwrap(), (soft + 1, hard));
        }
    }
}
