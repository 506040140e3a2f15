//! `granary batch`: operations read from stdin, one a line, committed
//! atomically, all or none: on a local store (PATH, the engine's
//! `Store::batch`) or on a server (`--server HOST:PORT`, the native
//! protocol's TXN, docs/PROTOCOL.md).
//!
//! The input, one operation a line:
//!
//! ```text
//! put NS KEY VALUE            insert or overwrite
//! put-absent NS KEY VALUE     only if KEY holds no value
//! put-present NS KEY VALUE    only if KEY holds a value
//! cas NS KEY CAS VALUE        only if KEY holds a value whose CAS value is CAS
//! del NS KEY                  delete (no condition)
//! ```
//!
//! NS names the key's namespace (`default`: the default one). Fields are
//! separated by spaces or tabs. A field may be double-quoted (`"a b"`, `""`
//! for an empty value); in any field `\\`, `\"`, `\n`, `\t`, `\r` and
//! `\xNN` (two hex digits) stand for one byte, and a bare field holds no
//! `"`. Empty lines and lines whose first non-blank character is `#` are
//! skipped (a `#` elsewhere is part of its field); a line may end in CRLF.
//! CAS is a decimal number (the CAS values `--print-cas` prints).
//!
//! Outcome: `committed N` on stdout, exit 0 (with `--print-cas`, then each
//! operation's new CAS value, one a line, 0 for a delete); or a failed
//! condition on stdout, `condition failed: op 3 (put-absent users k, line
//! 5): exists`, exit 1, nothing applied; or an error on one line of stderr,
//! exit 2, nothing applied: a malformed line (named by its number), more
//! operations than one batch holds, a key twice, a namespace that does not
//! exist, a quota, no space.

use super::kv::connect;
use super::{with_store, DeviceArgs};
use granary_client::{TxnOp, TxnOutcome};
use granary_store::{BatchOp, BatchOutcome, ItemMeta, PutOutcome, BATCH_OPS_MAX};
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

/// Commit the operations read from stdin atomically. `granary batch PATH`,
/// or `granary batch --server HOST:PORT`.
#[derive(clap::Args)]
pub struct BatchArgs {
    /// The store (file or block device); none with --server.
    #[arg(value_name = "PATH")]
    path: Option<PathBuf>,
    #[command(flatten)]
    conn: super::ConnArgs,
    /// fdatasync the batch's write (local only; a server's durability is its own).
    #[arg(long)]
    flush: bool,
    /// After `committed N`, print each operation's new CAS value, one a
    /// line (0 for a delete): what a later `cas` line takes.
    #[arg(long)]
    print_cas: bool,
}

/// What an input line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    PutAbsent,
    PutPresent,
    Cas,
    Del,
}

impl Kind {
    fn parse(word: &[u8]) -> Option<Kind> {
        Some(match word {
            b"put" => Kind::Put,
            b"put-absent" => Kind::PutAbsent,
            b"put-present" => Kind::PutPresent,
            b"cas" => Kind::Cas,
            b"del" => Kind::Del,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::PutAbsent => "put-absent",
            Kind::PutPresent => "put-present",
            Kind::Cas => "cas",
            Kind::Del => "del",
        }
    }
    /// The fields after the operation's name.
    fn form(self) -> &'static str {
        match self {
            Kind::Put | Kind::PutAbsent | Kind::PutPresent => "NS KEY VALUE",
            Kind::Cas => "NS KEY CAS VALUE",
            Kind::Del => "NS KEY",
        }
    }
}

/// One operation, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Op {
    /// Its line number (from 1).
    line: usize,
    kind: Kind,
    ns: String,
    key: Vec<u8>,
    cas: u64,
    value: Vec<u8>,
}

impl Op {
    /// `put-absent users k`, for messages (the key written as the input
    /// would write it).
    fn describe(&self) -> String {
        format!("{} {} {}", self.kind.name(), self.ns, escape(&self.key))
    }

    fn store_op(&self) -> BatchOp {
        let (value, meta) = (self.value.clone(), ItemMeta::default());
        match self.kind {
            Kind::Put => BatchOp::Put { value, meta },
            Kind::PutAbsent => BatchOp::PutAbsent { value, meta },
            Kind::PutPresent => BatchOp::PutPresent { value, meta },
            Kind::Cas => BatchOp::Cas { cas: self.cas, value, meta },
            Kind::Del => BatchOp::Delete,
        }
    }

    fn txn_op(&self) -> TxnOp<'_> {
        let (ns, key, v) = (self.ns.as_str(), &self.key[..], &self.value[..]);
        match self.kind {
            Kind::Put => TxnOp::put(ns, key, v),
            Kind::PutAbsent => TxnOp::put_absent(ns, key, v),
            Kind::PutPresent => TxnOp::put_present(ns, key, v),
            Kind::Cas => TxnOp::cas(ns, key, self.cas, v),
            Kind::Del => TxnOp::delete(ns, key),
        }
    }
}

/// Bytes as a field of the input: printable ASCII as is, others (and
/// space, `"` and `\`) escaped.
fn escape(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            0x21..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s
}

/// The fields of one line (see the module's grammar).
fn fields(line: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let blank = |c: u8| c == b' ' || c == b'\t';
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        if blank(line[i]) {
            i += 1;
            continue;
        }
        let quoted = line[i] == b'"';
        if quoted {
            i += 1;
        }
        let mut f = Vec::new();
        let mut closed = false;
        while i < line.len() {
            let c = line[i];
            i += 1;
            match c {
                b'"' if quoted => {
                    closed = true;
                    break;
                }
                b'"' => return Err("a '\"' inside a field: quote the whole field, or write \\\"".into()),
                b'\\' => {
                    let Some(&e) = line.get(i) else { return Err("a '\\' ends the line".into()) };
                    i += 1;
                    f.push(match e {
                        b'\\' | b'"' => e,
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        b'x' => {
                            let hex = line.get(i..i + 2).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
                            let byte = hex.and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
                            let Some(byte) = byte else { return Err("\\x takes two hex digits".into()) };
                            i += 2;
                            byte
                        }
                        _ => return Err(format!("unknown escape \\{}", escape(&[e]))),
                    });
                }
                c if blank(c) && !quoted => break,
                c => f.push(c),
            }
        }
        if quoted {
            if !closed {
                return Err("a quoted field is not closed".into());
            }
            if line.get(i).is_some_and(|&c| !blank(c)) {
                return Err("a closing '\"' must end its field".into());
            }
        }
        out.push(f);
    }
    Ok(out)
}

/// The operation of line `line` (its text `text`), or None for an empty or
/// comment line.
fn parse_line(line: usize, text: &[u8]) -> Result<Option<Op>, String> {
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    let first = text.iter().position(|&c| c != b' ' && c != b'\t');
    match first {
        None => return Ok(None),
        Some(at) if text[at] == b'#' => return Ok(None),
        Some(_) => {}
    }
    let at = |why: String| format!("line {line}: {why}");
    let f = fields(text).map_err(at)?;
    let kind = Kind::parse(&f[0]).ok_or_else(|| {
        at(format!("unknown operation \"{}\" (put, put-absent, put-present, cas, del)", escape(&f[0])))
    })?;
    let want = match kind {
        Kind::Del => 2,
        Kind::Cas => 4,
        _ => 3,
    };
    if f.len() - 1 != want {
        return Err(at(format!("{} takes {} ({want} fields), found {}", kind.name(), kind.form(), f.len() - 1)));
    }
    let ns = String::from_utf8(f[1].clone()).map_err(|_| at("a namespace name is ASCII".into()))?;
    let cas = match kind {
        Kind::Cas => std::str::from_utf8(&f[3])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| at(format!("CAS \"{}\" is not a decimal number", escape(&f[3]))))?,
        _ => 0,
    };
    let value = match kind {
        Kind::Del => Vec::new(),
        _ => f[want].clone(),
    };
    Ok(Some(Op { line, kind, ns, key: f[2].clone(), cas, value }))
}

/// Every operation of `input`; the first malformed line is an error.
fn parse(input: &[u8]) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    // A final newline ends the last line; it does not start another.
    let input = input.strip_suffix(b"\n").unwrap_or(input);
    if input.is_empty() {
        return Ok(ops);
    }
    for (i, text) in input.split(|&c| c == b'\n').enumerate() {
        if let Some(op) = parse_line(i + 1, text)? {
            ops.push(op);
        }
    }
    if ops.len() > BATCH_OPS_MAX {
        return Err(format!("{} operations: a batch holds at most {BATCH_OPS_MAX}; nothing applied", ops.len()));
    }
    // The engine refuses a key twice too; here the lines are named.
    let mut seen: HashMap<(&str, &[u8]), usize> = HashMap::new();
    for o in &ops {
        if let Some(first) = seen.insert((&o.ns, &o.key), o.line) {
            return Err(format!(
                "line {}: key {} of namespace {} appears twice (line {first} too): a batch writes a key once",
                o.line,
                escape(&o.key),
                o.ns
            ));
        }
    }
    Ok(ops)
}

/// What a commit did, on either target.
enum Outcome {
    Committed(Vec<u64>),
    /// The operation (its index) whose condition failed; whether its key
    /// exists (false: not found).
    Failed {
        op: usize,
        exists: bool,
    },
}

pub fn run(a: BatchArgs) -> Result<ExitCode, String> {
    let local = match (&a.path, &a.conn.server) {
        (Some(_), Some(_)) => return Err("give PATH or --server HOST:PORT, not both".into()),
        (None, None) => return Err("expected PATH (or --server HOST:PORT)".into()),
        (Some(_), None) => true,
        (None, Some(_)) => false,
    };
    if !local && (a.conn.buffered || a.conn.no_checkpoint || a.flush) {
        return Err("--buffered, --no-checkpoint and --flush apply to a local store, not --server".into());
    }
    if local {
        a.conn.remote_only_given()?;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).map_err(|e| format!("cannot read the operations from stdin: {e}"))?;
    let ops = parse(&input)?;
    let outcome = match (a.path, a.conn.server.clone()) {
        (Some(path), _) => {
            let dev = DeviceArgs { path, buffered: a.conn.buffered, no_checkpoint: a.conn.no_checkpoint };
            commit_local(&dev, a.flush, &ops)?
        }
        (None, Some(server)) => commit_remote(&server, &a.conn, &ops)?,
        (None, None) => unreachable!("checked above"),
    };
    match outcome {
        Outcome::Committed(cas) => {
            let mut out = format!("committed {}\n", ops.len());
            if a.print_cas {
                for c in cas {
                    out.push_str(&format!("{c}\n"));
                }
            }
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Failed { op, exists } => {
            let o = &ops[op];
            let why = match (exists, o.kind) {
                (true, Kind::Cas) => "exists with another CAS value",
                (true, _) => "exists",
                (false, _) => "not found",
            };
            println!("condition failed: op {} ({}, line {}): {why}", op + 1, o.describe(), o.line);
            Ok(ExitCode::from(1))
        }
    }
}

/// Commit on a local store, opened for writing and closed whatever happens.
fn commit_local(dev: &DeviceArgs, flush: bool, ops: &[Op]) -> Result<Outcome, String> {
    with_store(dev, flush, |store| {
        let mut handles = HashMap::new();
        for o in ops {
            if !handles.contains_key(o.ns.as_str()) {
                let h = store.namespace(&o.ns).map_err(|e| format!("line {}: {e}", o.line))?;
                handles.insert(o.ns.as_str(), h);
            }
        }
        let mut b = store.batch();
        for o in ops {
            b.op(&handles[o.ns.as_str()], &o.key, o.store_op());
        }
        match b.commit().map_err(|e| e.to_string())? {
            BatchOutcome::Committed { cas } => Ok(Outcome::Committed(cas)),
            BatchOutcome::ConditionFailed { op, outcome } => {
                Ok(Outcome::Failed { op, exists: outcome != PutOutcome::NotFound })
            }
        }
    })
}

/// Commit as one TXN on a server.
fn commit_remote(server: &str, conn: &super::ConnArgs, ops: &[Op]) -> Result<Outcome, String> {
    let client = connect(server, conn)?;
    let txn: Vec<TxnOp> = ops.iter().map(Op::txn_op).collect();
    // An error the server blames on one operation names its line.
    let named = |e: granary_client::Error| {
        if let granary_client::Error::Server { status, message } = &e {
            let op = message.strip_prefix("operation ").and_then(|m| m.split_once(": "));
            if let Some(o) = op.and_then(|(n, m)| Some((ops.get(n.parse::<usize>().ok()?)?, m))) {
                return format!("line {}: server error {status}: {}", o.0.line, o.1);
            }
        }
        e.to_string()
    };
    match client.txn(&txn).map_err(named)? {
        TxnOutcome::Committed { cas } => Ok(Outcome::Committed(cas)),
        TxnOutcome::ConditionFailed { op, status } => {
            Ok(Outcome::Failed { op, exists: status != granary_client::Status::NotFound })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(line: &str) -> Result<Vec<Vec<u8>>, String> {
        fields(line.as_bytes())
    }

    #[test]
    fn fields_split_quote_and_escape() {
        assert_eq!(f("put  users\tk v").unwrap(), [&b"put"[..], b"users", b"k", b"v"]);
        assert_eq!(f(r#"put ns "a b" """#).unwrap(), [&b"put"[..], b"ns", b"a b", b""]);
        assert_eq!(f(r"a\x20b c\\d \x00\xff \n\t\r \#x").unwrap_err(), "unknown escape \\#");
        assert_eq!(
            f(r"a\x20b c\\d \x00\xff \n\t\r x#y").unwrap(),
            [&b"a b"[..], b"c\\d", b"\0\xff", b"\n\t\r", b"x#y"]
        );
        assert_eq!(f(r#""say \"hi\"""#).unwrap(), [&b"say \"hi\""[..]]);
        assert!(f(r#"a"b"#).unwrap_err().contains("inside a field"));
        assert!(f(r#""open"#).unwrap_err().contains("not closed"));
        assert!(f(r#""a"b"#).unwrap_err().contains("must end its field"));
        assert!(f(r"a\").unwrap_err().contains("ends the line"));
        assert!(f(r"\x4").unwrap_err().contains("two hex digits"));
        assert!(f(r"\xzz").unwrap_err().contains("two hex digits"));
        assert!(f(r"\x+f").unwrap_err().contains("two hex digits"));
        assert_eq!(f("").unwrap(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn lines_parse_into_operations() {
        let ops = parse(
            b"# a comment\n\nput users k v\r\n  # indented comment\ndel default k\ncas users k2 42 \"new value\"\n\
              put-absent a k2 \"\"\nput-present a k3 x\n",
        )
        .unwrap();
        let kinds: Vec<(usize, Kind)> = ops.iter().map(|o| (o.line, o.kind)).collect();
        assert_eq!(
            kinds,
            [(3, Kind::Put), (5, Kind::Del), (6, Kind::Cas), (7, Kind::PutAbsent), (8, Kind::PutPresent)]
        );
        assert_eq!(ops[0].value, b"v", "CRLF");
        assert_eq!((ops[2].cas, &ops[2].value[..]), (42, &b"new value"[..]));
        assert_eq!(ops[3].value, b"");
        assert_eq!(ops[1].describe(), "del default k");
        let err = |input: &str| parse(input.as_bytes()).unwrap_err();
        assert_eq!(err("put a k v\nput a k\n"), "line 2: put takes NS KEY VALUE (3 fields), found 2");
        assert_eq!(err("del a k v"), "line 1: del takes NS KEY (2 fields), found 3");
        assert!(err("\n\nget a k").starts_with("line 3: unknown operation \"get\""));
        assert!(err("cas a k -1 v").starts_with("line 1: CAS \"-1\" is not a decimal number"));
        assert!(err("put a \"k v").starts_with("line 1: a quoted field is not closed"));
        assert!(err("put \\xff k v").starts_with("line 1: a namespace name is ASCII"));
        let many: String = (0..=BATCH_OPS_MAX).map(|i| format!("put default k{i} v\n")).collect();
        assert!(err(&many).contains("1025 operations: a batch holds at most 1024"));
        assert_eq!(
            err("put a k 1\nput b k 2\ndel a k"),
            "line 3: key k of namespace a appears twice (line 1 too): a batch writes a key once"
        );
        assert!(parse(b"").unwrap().is_empty());
        assert!(parse(b"\n# nothing\n").unwrap().is_empty());
    }

    #[test]
    fn keys_are_escaped_as_the_input_writes_them() {
        assert_eq!(escape(b"a b\"\\\x00~"), "a\\x20b\\\"\\\\\\x00~");
        let line = format!("put ns {} v", escape(b"a b\"\\\x00\xff"));
        assert_eq!(fields(line.as_bytes()).unwrap()[2], b"a b\"\\\x00\xff");
    }
}
