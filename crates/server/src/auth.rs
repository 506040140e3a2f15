//! Credentials the protocol servers check (docs/SECURITY.md): a set of
//! user/secret pairs read from memcached's auth file format
//! (`user:password` lines, as `memcached -Y`), one secret (RESP's
//! `requirepass`, the native protocol's token), the comparison every
//! listener uses, and the warning for a listener exposed without any.
//!
//! Invariants:
//! - secrets are compared in time that depends only on their lengths
//!   ([`secret_eq`]), never short-circuited on the first differing byte;
//! - a file that cannot be read, or holds no valid line, refuses the
//!   server's start (a typo must not leave a listener open to everyone).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;

/// Whether `a` and `b` are equal, comparing every byte of the longer
/// (no early exit: the time says nothing about where they differ).
pub fn secret_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Users and their passwords: memcached's auth file (`-Y`).
#[derive(Clone, Default)]
pub struct UserFile {
    users: Vec<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for UserFile {
    // Never the passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserFile").field("users", &self.users.len()).finish()
    }
}

impl UserFile {
    /// Parse memcached's format: one `user:password` per line (split at
    /// the first `:`); blank lines are skipped; a trailing `\r` is
    /// dropped. A line without `:` or with an empty user or password is
    /// an error naming its line.
    pub fn parse(text: &[u8]) -> Result<UserFile, String> {
        let mut users = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(format!("line {}: expected user:password", i + 1));
            };
            let (user, pass) = (&line[..colon], &line[colon + 1..]);
            if user.is_empty() || pass.is_empty() {
                return Err(format!("line {}: empty user or password", i + 1));
            }
            if user.iter().chain(pass).any(|&b| b <= b' ') {
                return Err(format!("line {}: user and password cannot hold spaces or control characters", i + 1));
            }
            users.push((user.to_vec(), pass.to_vec()));
        }
        if users.is_empty() {
            return Err("no user:password line".into());
        }
        Ok(UserFile { users })
    }

    /// Read and parse the file at `p` (errors name it).
    pub fn read(p: &Path) -> Result<UserFile, String> {
        let text = std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        UserFile::parse(&text).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// Whether `user` is listed with `pass`. Every entry is compared, so
    /// the time does not say which user exists.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> bool {
        let mut ok = false;
        for (u, p) in &self.users {
            // `&` not `&&`: both comparisons run for every entry.
            ok |= secret_eq(u, user) & secret_eq(p, pass);
        }
        ok
    }

    /// How many users it lists.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Never true for a parsed file.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// Whether `addr` is reachable only from this machine.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Log a warning, once per protocol in this process, when `addr` is not
/// a loopback address and the listener requires no authentication.
pub fn warn_if_exposed(protocol: &'static str, addr: SocketAddr, authenticated: bool) {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    if authenticated || is_loopback(&addr) {
        return;
    }
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.contains(&protocol) {
        return;
    }
    warned.push(protocol);
    tracing::warn!(
        protocol,
        %addr,
        "listening on a non-loopback address without authentication: anyone who can reach it can read and \
         write every key (docs/SECURITY.md)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_eq_compares_whole_values() {
        assert!(secret_eq(b"abc", b"abc"));
        assert!(secret_eq(b"", b""));
        assert!(!secret_eq(b"abc", b"abd"));
        assert!(!secret_eq(b"abc", b"abcd"));
        assert!(!secret_eq(b"abc\0", b"abc"));
        assert!(!secret_eq(b"", b"a"));
    }

    #[test]
    fn the_auth_file_reads_memcached_lines() {
        let f = UserFile::parse(b"alice:pw1\r\n\nbob:p:w\n").unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.check(b"alice", b"pw1"));
        assert!(f.check(b"bob", b"p:w"), "split at the first colon");
        assert!(!f.check(b"alice", b"pw"));
        assert!(!f.check(b"bob", b"pw1"));
        assert!(!f.check(b"carol", b"pw1"));
        assert!(!format!("{f:?}").contains("pw1"), "Debug shows no password");
    }

    #[test]
    fn a_bad_auth_file_is_refused_naming_the_line() {
        assert_eq!(UserFile::parse(b"alice:pw\nbob\n").unwrap_err(), "line 2: expected user:password");
        assert_eq!(UserFile::parse(b":pw\n").unwrap_err(), "line 1: empty user or password");
        assert_eq!(UserFile::parse(b"a:\n").unwrap_err(), "line 1: empty user or password");
        assert!(UserFile::parse(b"a:p w\n").is_err());
        assert_eq!(UserFile::parse(b"\n\n").unwrap_err(), "no user:password line");
    }

    #[test]
    fn loopback_is_recognised() {
        assert!(is_loopback(&"127.0.0.1:1".parse().unwrap()));
        assert!(is_loopback(&"127.0.0.9:1".parse().unwrap()));
        assert!(is_loopback(&"[::1]:1".parse().unwrap()));
        assert!(!is_loopback(&"0.0.0.0:1".parse().unwrap()));
        assert!(!is_loopback(&"10.0.0.1:1".parse().unwrap()));
    }
}
