//! Framing of requests: RESP multibulk commands (`*<n>\r\n$<len>\r\n...`)
//! and inline commands (one line of space-separated, optionally quoted
//! arguments, as `redis-cli` and telnet send them), with Redis's protocol
//! errors word for word.
//!
//! A [`Parser`] takes the input from the start of the next command and
//! says whether it holds a whole command. A multibulk command that arrives
//! in pieces is parsed once: the parser keeps the arguments it has framed
//! and resumes after them, so a large command costs its bytes once however
//! many reads bring it.
//!
//! Invariants: a command's arguments are ranges of the input, from the
//! command's first byte; a protocol error ends the connection (after its
//! reply), so the parser's state after one does not matter; nothing is
//! buffered past [`COMMAND_BYTES_MAX`] or [`INLINE_BYTES_MAX`].

use crate::limits::*;
use std::borrow::Cow;

/// What the front of the input holds.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    /// A whole multibulk command of `len` bytes; its arguments are these
    /// ranges of the input.
    Multibulk { args: Vec<(usize, usize)>, len: usize },
    /// A whole inline command of `len` bytes (its arguments unquoted).
    Inline { args: Vec<Vec<u8>>, len: usize },
    /// `len` bytes that hold no command (an empty line, `*0`, `*-1`): skip.
    Empty(usize),
    /// Not a whole command yet: read more.
    Incomplete,
    /// A protocol error: reply `-ERR Protocol error: <msg>` and close.
    /// Bytes: `expected '$', got '<byte>'` echoes the byte as it came.
    Error(Cow<'static, [u8]>),
}

/// A multibulk command being framed.
#[derive(Debug, Default)]
struct Multi {
    /// Arguments announced by the header.
    count: usize,
    args: Vec<(usize, usize)>,
    /// Where the next argument's header starts.
    pos: usize,
}

/// The framing state of one connection.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    multi: Option<Multi>,
    /// The connection has not authenticated and must: multibulks and bulks
    /// are held to [`UNAUTH_MULTIBULK_MAX`] and [`UNAUTH_BULK_MAX`].
    pub(crate) unauthenticated: bool,
}

/// The line that starts at `from`, without its "\r\n": (end of its text,
/// start of the next line), or None if no '\n' yet. Redis looks for "\r"
/// and takes the byte after as the "\n"; so do we. Redis looks as in a C
/// string (strchr): a NUL byte before the "\r" hides it, the line never
/// ends (until the input passes the header's limit).
fn line_at(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let i = buf[from..].iter().position(|&b| b == b'\r' || b == 0)? + from;
    (buf[i] == b'\r' && i + 1 < buf.len()).then_some((i, i + 2))
}

/// Redis's string2ll: an optional '-', digits, no leading zeros beyond a
/// lone "0", no '+', no spaces, within i64.
pub(crate) fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s[0] {
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits[0] == b'0' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        let d = (d - b'0') as i64;
        v = if neg { v.checked_mul(10)?.checked_sub(d)? } else { v.checked_mul(10)?.checked_add(d)? };
    }
    Some(v)
}

impl Parser {
    /// Frame the command at the front of `buf`; bulks longer than
    /// `bulk_max` (`proto-max-bulk-len`) are refused.
    pub(crate) fn next(&mut self, buf: &[u8], bulk_max: usize) -> Frame {
        if buf.is_empty() {
            return Frame::Incomplete;
        }
        if self.multi.is_none() && buf[0] != b'*' {
            return inline(buf);
        }
        let mut m = match self.multi.take() {
            Some(m) => m,
            None => {
                let Some((end, next)) = line_at(buf, 0) else {
                    return if buf.len() > INLINE_BYTES_MAX {
                        Frame::Error(b"too big mbulk count string"[..].into())
                    } else {
                        Frame::Incomplete
                    };
                };
                let n = match parse_i64(&buf[1..end]) {
                    Some(n) if n <= MULTIBULK_MAX as i64 => n,
                    _ => return Frame::Error(b"invalid multibulk length"[..].into()),
                };
                if n <= 0 {
                    return Frame::Empty(next);
                }
                if self.unauthenticated && n as usize > UNAUTH_MULTIBULK_MAX {
                    return Frame::Error(b"unauthenticated multibulk length"[..].into());
                }
                Multi { count: n as usize, args: Vec::with_capacity((n as usize).min(1024)), pos: next }
            }
        };
        while m.args.len() < m.count {
            if m.pos >= buf.len() {
                break;
            }
            let Some((end, next)) = line_at(buf, m.pos) else {
                if buf.len() - m.pos > INLINE_BYTES_MAX {
                    return Frame::Error(b"too big bulk count string"[..].into());
                }
                break;
            };
            // Checked once the line is whole, as Redis does.
            if buf[m.pos] != b'$' {
                return Frame::Error([&b"expected '$', got '"[..], &buf[m.pos..=m.pos], b"'"].concat().into());
            }
            let len = match parse_i64(&buf[m.pos + 1..end]) {
                Some(n) if n >= 0 && n as u64 <= bulk_max as u64 => n as usize,
                _ => return Frame::Error(b"invalid bulk length"[..].into()),
            };
            if self.unauthenticated && len > UNAUTH_BULK_MAX {
                return Frame::Error(b"unauthenticated bulk length"[..].into());
            }
            if next + len + 2 > COMMAND_BYTES_MAX {
                return Frame::Error(b"command too large"[..].into());
            }
            if buf.len() < next + len + 2 {
                break;
            }
            m.args.push((next, next + len));
            // Redis does not check the bulk's "\r\n": neither do we.
            m.pos = next + len + 2;
        }
        if m.args.len() == m.count {
            let len = m.pos;
            return Frame::Multibulk { args: m.args, len };
        }
        if m.pos > COMMAND_BYTES_MAX {
            return Frame::Error(b"command too large"[..].into());
        }
        self.multi = Some(m);
        Frame::Incomplete
    }

    /// Whether a multibulk command is partly framed (its bytes must stay
    /// at the front of the input).
    #[cfg(test)]
    pub(crate) fn in_command(&self) -> bool {
        self.multi.is_some()
    }
}

/// An inline command: the line up to '\n'. Redis looks for the '\n' as
/// in a C string (strchr): a NUL byte before it hides it, and the line
/// never ends (until it passes the inline limit).
fn inline(buf: &[u8]) -> Frame {
    let nl = buf.iter().position(|&b| b == b'\n' || b == 0).filter(|&i| buf[i] == b'\n');
    let Some(nl) = nl else {
        return if buf.len() > INLINE_BYTES_MAX {
            Frame::Error(b"too big inline request"[..].into())
        } else {
            Frame::Incomplete
        };
    };
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    match split_args(line) {
        None => Frame::Error(b"unbalanced quotes in request"[..].into()),
        Some(args) if args.is_empty() => Frame::Empty(nl + 1),
        Some(args) => Frame::Inline { args, len: nl + 1 },
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Redis's sdssplitargs: arguments separated by spaces; "double quotes"
/// with \n \r \t \b \a \\ \" and \xHH escapes, 'single quotes' with \'; a
/// closing quote must be followed by a space or the end. None when quotes
/// are unbalanced. As in Redis, blanks between arguments and after a
/// closing quote are C's `isspace` (with \v and \f), but only ' ', \t, \r
/// and \n end an unquoted argument. `line` holds no NUL (see [`inline`]).
pub(crate) fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    let sp = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c);
    let ends_word = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t');
    loop {
        while i < line.len() && sp(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut cur = Vec::new();
        let (mut inq, mut insq) = (false, false);
        loop {
            if inq {
                if i >= line.len() {
                    return None;
                }
                if line[i] == b'\\'
                    && i + 3 < line.len()
                    && line[i + 1] == b'x'
                    && hex(line[i + 2]).is_some()
                    && hex(line[i + 3]).is_some()
                {
                    cur.push(hex(line[i + 2]).unwrap() * 16 + hex(line[i + 3]).unwrap());
                    i += 3;
                } else if line[i] == b'\\' && i + 1 < line.len() {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        c => c,
                    });
                } else if line[i] == b'"' {
                    if i + 1 < line.len() && !sp(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    cur.push(line[i]);
                }
            } else if insq {
                if i >= line.len() {
                    return None;
                }
                if line[i] == b'\\' && i + 1 < line.len() && line[i + 1] == b'\'' {
                    i += 1;
                    cur.push(b'\'');
                } else if line[i] == b'\'' {
                    if i + 1 < line.len() && !sp(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    cur.push(line[i]);
                }
            } else {
                if i >= line.len() || ends_word(line[i]) {
                    break;
                }
                match line[i] {
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => cur.push(c),
                }
            }
            i += 1;
        }
        args.push(cur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(buf: &[u8], f: &Frame) -> Vec<Vec<u8>> {
        match f {
            Frame::Multibulk { args, .. } => args.iter().map(|&(a, b)| buf[a..b].to_vec()).collect(),
            Frame::Inline { args, .. } => args.clone(),
            other => panic!("not a command: {other:?}"),
        }
    }

    #[test]
    fn multibulk_whole_and_in_pieces() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        let f = Parser::default().next(cmd, 1 << 20);
        assert_eq!(args_of(cmd, &f), vec![b"SET".to_vec(), b"k".to_vec(), b"hello".to_vec()]);
        // Every split point: incomplete until the last byte, then whole.
        let mut p = Parser::default();
        for cut in 1..cmd.len() {
            assert_eq!(p.next(&cmd[..cut], 1 << 20), Frame::Incomplete, "cut at {cut}");
        }
        let f = p.next(cmd, 1 << 20);
        assert!(matches!(f, Frame::Multibulk { len, .. } if len == cmd.len()));
        assert!(!p.in_command());
    }

    #[test]
    fn protocol_errors_are_redis_words() {
        let e = |b: &[u8]| match Parser::default().next(b, 10) {
            Frame::Error(m) => String::from_utf8_lossy(&m).into_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!(e(b"*x\r\n"), "invalid multibulk length");
        assert_eq!(e(b"*2000000\r\n"), "invalid multibulk length");
        assert_eq!(e(b"*1\r\nfoo\r\n"), "expected '$', got 'f'");
        assert_eq!(Parser::default().next(b"*1\r\n\xe9\r\n", 10), Frame::Error(b"expected '$', got '\xe9'"[..].into()));
        assert_eq!(
            Parser::default().next(b"*1\r\nfoo", 10),
            Frame::Incomplete,
            "'$' is checked once the line is whole"
        );
        assert_eq!(e(b"*1\r\n$-1\r\n"), "invalid bulk length");
        assert_eq!(e(b"*1\r\n$11\r\n"), "invalid bulk length");
        assert_eq!(e(b"set \"a\r\n"), "unbalanced quotes in request");
        assert_eq!(e(&vec![b'a'; INLINE_BYTES_MAX + 1]), "too big inline request");
        // A NUL hides the line's end, as from Redis's strchr.
        assert_eq!(Parser::default().next(b"PI\0NG\r\n", 10), Frame::Incomplete);
        assert_eq!(Parser::default().next(b"*1\0\r\n", 10), Frame::Incomplete);
        let mut big = b"PI\0NG\r\n".to_vec();
        big.resize(INLINE_BYTES_MAX + 1, b'a');
        assert_eq!(e(&big), "too big inline request");
        assert_eq!(Parser::default().next(b"*0\r\n", 10), Frame::Empty(4));
        assert_eq!(Parser::default().next(b"*-1\r\n", 10), Frame::Empty(5));
        assert_eq!(Parser::default().next(b"\r\n", 10), Frame::Empty(2));
    }

    #[test]
    fn inline_quoting() {
        let b = b"set \"a b\" 'it\\'s' \"\\x41\\n\" plain\r\n";
        let f = Parser::default().next(b, 10);
        assert_eq!(
            args_of(b, &f),
            vec![b"set".to_vec(), b"a b".to_vec(), b"it's".to_vec(), b"A\n".to_vec(), b"plain".to_vec()]
        );
        assert_eq!(split_args(b"\"a\"b"), None, "a closing quote must end the argument");
        assert_eq!(split_args(b"  "), Some(vec![]));
        // \v and \f separate arguments but do not end an unquoted one.
        assert_eq!(split_args(b"\x0ba\x0cb \"c\"\x0b"), Some(vec![b"a\x0cb".to_vec(), b"c".to_vec()]));
    }

    #[test]
    fn integers_as_redis_reads_them() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [&b"01"[..], b"+1", b" 1", b"1 ", b"", b"-", b"-0", b"9223372036854775808", b"1.0"] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
