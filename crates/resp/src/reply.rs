//! Reply encoding, RESP2 or RESP3 (chosen per connection by HELLO): the
//! writer appends to the connection's reply buffer, and types RESP2 lacks
//! (null, map, set) are written as Redis writes them to a
//! RESP2 client.

use std::io::Write;

/// A reply buffer and the protocol version it is written in.
pub(crate) struct Reply<'a> {
    pub(crate) buf: &'a mut Vec<u8>,
    pub(crate) resp3: bool,
}

impl Reply<'_> {
    pub(crate) fn ok(&mut self) {
        self.buf.extend_from_slice(b"+OK\r\n");
    }

    pub(crate) fn simple(&mut self, s: &str) {
        self.buf.push(b'+');
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// An error; `msg` starts with its code (`ERR`, `WRONGTYPE`,
    /// `EXECABORT`...). Newlines in it are replaced by spaces, as Redis
    /// does, so a reply is always one line.
    pub(crate) fn error(&mut self, msg: impl AsRef<[u8]>) {
        self.buf.push(b'-');
        self.buf.extend(msg.as_ref().iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
        self.buf.extend_from_slice(b"\r\n");
    }

    pub(crate) fn int(&mut self, v: i64) {
        let _ = write!(self.buf, ":{v}\r\n");
    }

    pub(crate) fn bulk(&mut self, v: &[u8]) {
        let _ = write!(self.buf, "${}\r\n", v.len());
        self.buf.extend_from_slice(v);
        self.buf.extend_from_slice(b"\r\n");
    }

    /// Text for a human (INFO, CLIENT INFO): a bulk string, RESP3's
    /// verbatim string (`=`, format `txt`).
    pub(crate) fn verbatim(&mut self, v: &[u8]) {
        if !self.resp3 {
            return self.bulk(v);
        }
        let _ = write!(self.buf, "={}\r\ntxt:", v.len() + 4);
        self.buf.extend_from_slice(v);
        self.buf.extend_from_slice(b"\r\n");
    }

    /// A bulk string or, for None, the null.
    pub(crate) fn bulk_or_null(&mut self, v: Option<&[u8]>) {
        match v {
            Some(v) => self.bulk(v),
            None => self.null(),
        }
    }

    /// The null bulk string (`$-1`; RESP3 `_`).
    pub(crate) fn null(&mut self) {
        self.buf.extend_from_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    /// The null array (`*-1`; RESP3 `_`): EXEC aborted by WATCH.
    pub(crate) fn null_array(&mut self) {
        self.buf.extend_from_slice(if self.resp3 { b"_\r\n" } else { b"*-1\r\n" });
    }

    pub(crate) fn array(&mut self, n: usize) {
        let _ = write!(self.buf, "*{n}\r\n");
    }

    /// A map of `n` pairs (RESP2: an array of 2n).
    pub(crate) fn map(&mut self, n: usize) {
        if self.resp3 {
            let _ = write!(self.buf, "%{n}\r\n");
        } else {
            self.array(2 * n);
        }
    }

    /// A set of `n` elements (RESP2: an array).
    pub(crate) fn set(&mut self, n: usize) {
        if self.resp3 {
            let _ = write!(self.buf, "~{n}\r\n");
        } else {
            self.array(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp2_and_resp3_shapes() {
        let mut b = Vec::new();
        let mut r = Reply { buf: &mut b, resp3: false };
        r.null();
        r.map(1);
        r.error("ERR a\r\nb");
        assert_eq!(b, b"$-1\r\n*2\r\n-ERR a  b\r\n");
        let mut b = Vec::new();
        let mut r = Reply { buf: &mut b, resp3: true };
        r.null();
        r.map(1);
        assert_eq!(b, b"_\r\n%1\r\n");
    }
}
