//! The users of the RESP listener: Redis's ACL file (`aclfile`, a subset
//! of its syntax, docs/SECURITY.md "Redis protocol: `--aclfile`"), or
//! `requirepass` as the `default` user's password, and the check of AUTH's
//! credentials.
//!
//! Invariants:
//! - permissions are all or nothing: a user has every key and every
//!   command (`~*` and `+@all`, or `allkeys` and `allcommands`), or no
//!   command at all (it can authenticate; every command but AUTH, HELLO and
//!   QUIT is refused with NOPERM). A file with any other permission rule
//!   (a key pattern, a command or category, a selector), or with only one
//!   of the two, is refused with an error naming its line: a user is never
//!   granted more than its line says;
//! - passwords are kept only as their SHA-256 digests (as Redis keeps
//!   them), compared without early exit;
//! - a user that is `off` never authenticates;
//! - `default` always exists: not named in the file, it is Redis's
//!   `user default on nopass ~* &* +@all`.

use granary_server::auth::secret_eq;
use sha2::{Digest, Sha256};
use std::path::Path;

/// One user.
#[derive(Clone)]
pub struct User {
    name: String,
    /// `on` (`off`: it never authenticates).
    enabled: bool,
    /// `nopass`: any password authenticates it.
    nopass: bool,
    /// SHA-256 digests of its passwords.
    passwords: Vec<[u8; 32]>,
    /// `~*` / `allkeys` and `+@all` / `allcommands`: both or neither once
    /// the file is read.
    all_keys: bool,
    all_commands: bool,
}

impl User {
    /// A user as Redis makes a new one: off, no password, no permission.
    fn new(name: &str) -> User {
        User {
            name: name.into(),
            enabled: false,
            nopass: false,
            passwords: vec![],
            all_keys: false,
            all_commands: false,
        }
    }

    /// Redis's default `default` user: `on nopass ~* &* +@all`.
    fn default_user() -> User {
        User { enabled: true, nopass: true, all_keys: true, all_commands: true, ..User::new("default") }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it runs every command on every key (else none but AUTH,
    /// HELLO and QUIT).
    pub fn permitted(&self) -> bool {
        self.all_keys && self.all_commands
    }

    /// `nopass`: any password authenticates it (when `on`).
    pub fn nopass(&self) -> bool {
        self.nopass
    }

    /// Whether a connection of this user starts authenticated (Redis: the
    /// user is `on` and `nopass`).
    pub fn needs_no_auth(&self) -> bool {
        self.enabled && self.nopass
    }

    /// Whether `pass` authenticates it.
    fn accepts(&self, pass: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let digest: [u8; 32] = Sha256::digest(pass).into();
        let mut ok = false;
        for p in &self.passwords {
            ok |= secret_eq(p, &digest);
        }
        ok
    }

    /// Apply one rule of its ACL line; Err: why it is refused.
    fn apply(&mut self, rule: &str) -> Result<(), String> {
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "~*" | "allkeys" => self.all_keys = true,
            "resetkeys" => self.all_keys = false,
            "+@all" | "allcommands" => self.all_commands = true,
            "-@all" | "nocommands" => self.all_commands = false,
            // Granary has no Pub/Sub: channel permissions grant nothing.
            "&*" | "allchannels" | "resetchannels" => {}
            // RESTORE's payload checks: Granary has no RESTORE.
            "sanitize-payload" | "skip-sanitize-payload" => {}
            "reset" => *self = User::new(&self.name),
            _ => return self.apply_password(rule),
        }
        Ok(())
    }

    /// `>password`, `<password`, `#digest`, `!digest`.
    fn apply_password(&mut self, rule: &str) -> Result<(), String> {
        let (op, arg) = rule.split_at(rule.chars().next().map_or(0, char::len_utf8));
        match op {
            ">" => {
                let d: [u8; 32] = Sha256::digest(arg.as_bytes()).into();
                self.add_password(d);
            }
            "<" => {
                let d: [u8; 32] = Sha256::digest(arg.as_bytes()).into();
                self.remove_password(&d, rule)?;
            }
            "#" => self.add_password(hex_digest(arg)?),
            "!" => self.remove_password(&hex_digest(arg)?, rule)?,
            _ => {
                // A word that is no rule's shape may be a password missing
                // its '>': errors go to logs, so it is not echoed. Shown:
                // key, channel and selector patterns, categories, and
                // commands this server knows.
                let command = |r: &str| {
                    r.strip_prefix(['+', '-'])
                        .map(|c| c.split('|').next().unwrap_or(""))
                        .is_some_and(|c| crate::exec::lookup(c.as_bytes()).is_some())
                };
                let what = if rule.starts_with(['~', '%', '&', '('])
                    || rule.starts_with("+@")
                    || rule.starts_with("-@")
                    || command(rule)
                {
                    format!("rule '{rule}'")
                } else {
                    let n = rule.chars().count();
                    format!("a rule of {n} characters (not shown: it may be a password missing its '>')")
                };
                return Err(format!(
                    "{what} is not supported: Granary grants a user every key and every command \
                     (`~* +@all`) or no command at all, nothing in between (docs/RESP.md)"
                ));
            }
        }
        Ok(())
    }

    fn add_password(&mut self, d: [u8; 32]) {
        self.nopass = false;
        if !self.passwords.contains(&d) {
            self.passwords.push(d);
        }
    }

    fn remove_password(&mut self, d: &[u8; 32], rule: &str) -> Result<(), String> {
        let before = self.passwords.len();
        self.passwords.retain(|p| p != d);
        if self.passwords.len() == before {
            // As Redis: removing a password the user does not have (the
            // rule holds a password or its digest: not echoed).
            let op = &rule[..rule.chars().next().map_or(0, char::len_utf8)];
            return Err(format!("a '{op}' rule removes a password the user does not have"));
        }
        Ok(())
    }
}

/// `#` / `!`'s argument: 64 lowercase hexadecimal digits (Redis's rule).
fn hex_digest(s: &str) -> Result<[u8; 32], String> {
    let ok = s.len() == 64 && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
    if !ok {
        return Err("a password hash must be 64 lowercase hexadecimal characters (SHA-256)".into());
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(d)
}

/// The listener's users.
#[derive(Clone)]
pub struct Acl {
    /// `default` first.
    users: Vec<User>,
}

impl std::fmt::Debug for Acl {
    // Names only: never a password's digest.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.users.iter().map(|u| &u.name)).finish()
    }
}

impl Acl {
    /// Only `default`, with `requirepass` as its password (None: `nopass`,
    /// as Redis without a password).
    pub fn with_requirepass(pass: Option<&[u8]>) -> Acl {
        let mut d = User::default_user();
        if let Some(p) = pass {
            d.nopass = false;
            d.passwords = vec![Sha256::digest(p).into()];
        }
        Acl { users: vec![d] }
    }

    /// Parse an ACL file: one `user <name> <rule>...` per line, separated
    /// by spaces or tabs; blank lines are skipped. Errors name the line
    /// (`line N: ...`).
    pub fn parse(text: &str) -> Result<Acl, String> {
        let mut users: Vec<User> = Vec::new();
        for (i, line) in text.split('\n').enumerate() {
            let at = |e: String| format!("line {}: {e}", i + 1);
            let words: Vec<&str> = line.split_ascii_whitespace().collect();
            if words.is_empty() {
                continue;
            }
            if words[0] != "user" || words.len() < 2 {
                return Err(at("should start with user keyword followed by the username".into()));
            }
            if let Some(i) = words.iter().position(|w| w.contains(['"', '\''])) {
                // The word may hold a password: named by its place only.
                return Err(at(format!("quoted arguments are not supported (word {})", i + 1)));
            }
            let name = words[1];
            if users.iter().any(|u| u.name == name) {
                return Err(at(format!("duplicate user '{name}' found")));
            }
            let mut u = User::new(name);
            for rule in &words[2..] {
                u.apply(rule).map_err(|e| at(format!("user '{name}': {e}")))?;
            }
            if u.all_keys != u.all_commands {
                return Err(at(format!(
                    "user '{name}' has {} without {}: Granary grants a user every key and every command \
                     (`~* +@all`) or no command at all, nothing in between (docs/RESP.md)",
                    if u.all_keys { "`~*`" } else { "`+@all`" },
                    if u.all_keys { "`+@all`" } else { "`~*`" },
                )));
            }
            users.push(u);
        }
        if let Some(d) = users.iter().position(|u| u.name == "default") {
            let d = users.remove(d);
            users.insert(0, d);
        } else {
            users.insert(0, User::default_user());
        }
        Ok(Acl { users })
    }

    /// Read and parse the file at `p` (errors name it: `PATH:LINE: ...`).
    pub fn read(p: &Path) -> Result<Acl, String> {
        let text = std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let text = String::from_utf8(text).map_err(|_| format!("{}: not UTF-8 text", p.display()))?;
        Acl::parse(&text).map_err(|e| format!("{}:{}", p.display(), e.strip_prefix("line ").unwrap_or(&e)))
    }

    /// The `default` user.
    pub fn default_user(&self) -> &User {
        &self.users[0]
    }

    /// The user `name` (its index) if `pass` authenticates it.
    pub fn check(&self, name: &[u8], pass: &[u8]) -> Option<usize> {
        self.users.iter().position(|u| u.name.as_bytes() == name).filter(|&i| self.users[i].accepts(pass))
    }

    /// The user at index `i` (0: `default`).
    pub fn user(&self, i: usize) -> &User {
        &self.users[i]
    }

    /// How many users it holds (`default` counted).
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Never true: `default` is always there.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_digests_are_redis_s() {
        // `ACL LIST` of redis-server 7.0 for `>wonderland`.
        let d = hex_digest("a71a7c7011f53a1bab3642ec2ce12593f05230ace8de1e3e7645f69efac1443d").unwrap();
        assert_eq!(<[u8; 32]>::from(Sha256::digest(b"wonderland")), d);
    }

    #[test]
    fn users_passwords_and_switches() {
        let acl = Acl::parse(
            "user alice on >wonderland ~* &* +@all\n\n\
             user bob on #9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 allkeys allcommands\r\n\
             user carol off >pw ~* +@all\n\
             \tuser  dave on nopass\n\
             user erin on >a >b <a ~* resetchannels +@all\n\
             user frank on >x nopass\n\
             user gina on nopass >y resetpass >z\n",
        )
        .unwrap();
        assert_eq!(acl.len(), 8);
        assert!(acl.default_user().needs_no_auth() && acl.default_user().permitted());
        assert!(acl.check(b"alice", b"wonderland").is_some_and(|i| acl.user(i).permitted()));
        assert!(acl.check(b"alice", b"Wonderland").is_none());
        assert!(acl.check(b"bob", b"test").is_some_and(|i| acl.user(i).permitted()), "#: the digest of 'test'");
        assert!(acl.check(b"carol", b"pw").is_none(), "off");
        let dave = acl.user(acl.check(b"dave", b"anything").unwrap());
        assert!(!dave.permitted(), "no permission rule: no command");
        assert!(acl.check(b"erin", b"b").is_some() && acl.check(b"erin", b"a").is_none());
        assert!(acl.check(b"frank", b"whatever").is_some(), "nopass after >x");
        assert!(acl.check(b"gina", b"z").is_some() && acl.check(b"gina", b"y").is_none());
        assert!(acl.check(b"nobody", b"x").is_none());
        assert!(!format!("{acl:?}").contains("wonderland"));
    }

    #[test]
    fn the_default_user_can_be_redefined() {
        let acl = Acl::parse("user alice on >a ~* +@all\nuser default off nopass ~* &* +@all\n").unwrap();
        assert_eq!(acl.default_user().name(), "default");
        assert!(!acl.default_user().needs_no_auth());
        assert!(acl.check(b"default", b"x").is_none());
        let acl = Acl::parse("user default on >pw ~* +@all\n").unwrap();
        assert!(!acl.default_user().needs_no_auth());
        assert!(acl.check(b"default", b"pw").is_some());
        let acl = Acl::with_requirepass(Some(b"pw"));
        assert!(acl.check(b"default", b"pw").is_some() && acl.check(b"default", b"p").is_none());
        assert!(Acl::with_requirepass(None).default_user().needs_no_auth());
    }

    #[test]
    fn every_other_rule_refuses_the_file_naming_its_line() {
        for (text, want) in [
            ("# a comment\n", "line 1: should start with user"),
            ("user alice on >a ~* +@all\nuser\n", "line 2: should start with user"),
            ("usr alice\n", "line 1: should start with user"),
            ("\nuser alice on >a ~foo* +@all\n", "line 2: user 'alice': rule '~foo*' is not supported"),
            ("user alice on >a ~* +get\n", "rule '+get' is not supported"),
            ("user alice on >a ~* +@all -@dangerous\n", "rule '-@dangerous' is not supported"),
            ("user alice on >a ~* +@read\n", "rule '+@read' is not supported"),
            ("user alice on >a %R~* +@all\n", "rule '%R~*' is not supported"),
            ("user alice on >a ~* +@all (~x* +get)\n", "rule '(~x*' is not supported"),
            ("user alice on >a &chan ~* +@all\n", "rule '&chan' is not supported"),
            ("user alice on >a ~*\n", "line 1: user 'alice' has `~*` without `+@all`"),
            ("user alice on >a +@all\n", "user 'alice' has `+@all` without `~*`"),
            ("user alice on >a ~* +@all\nuser alice on\n", "line 2: duplicate user 'alice'"),
            ("user alice on #ABC ~* +@all\n", "64 lowercase hexadecimal"),
            ("user alice on <nope ~* +@all\n", "removes a password the user does not have"),
            ("user alice on \">a b\" ~* +@all\n", "quoted arguments are not supported (word 4)"),
            ("user alice on s3cret ~* +@all\n", "a rule of 6 characters (not shown"),
        ] {
            let e = Acl::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // What may be a password is never echoed (errors reach logs).
        for (text, secret) in [
            ("user alice on s3cret ~* +@all\n", "s3cret"),
            ("user alice on +hunter2 ~* +@all\n", "hunter2"),
            ("user alice on -Secret ~* +@all\n", "Secret"),
            ("user alice on <nope ~* +@all\n", "nope"),
            ("user alice on \">s3cret x\" ~* +@all\n", "s3cret"),
        ] {
            let e = Acl::parse(text).unwrap_err();
            assert!(!e.contains(secret), "{text:?}: {e}");
        }
    }
}
