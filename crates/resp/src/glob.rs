//! Redis's glob patterns (MATCH, KEYS): `*` any bytes, `?` one byte,
//! `[abc]`, `[^abc]`, `[a-z]` a class, `\x` the byte x. A `[` without its
//! `]` matches up to the pattern's end, as in Redis.

/// Whether `s` matches `p`. Linear in `s` per star of `p` (one
/// backtracking point, the last star), so no pattern makes it explode.
pub(crate) fn matches(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            if p[pi] == b'*' {
                while pi < p.len() && p[pi] == b'*' {
                    pi += 1;
                }
                if pi == p.len() {
                    return true;
                }
                star = Some((pi, si));
                continue;
            }
            if let Some(next) = one(p, pi, s[si]) {
                pi = next;
                si += 1;
                continue;
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// Whether the pattern element at `p[pi]` (not a star) matches byte `c`:
/// the index after the element if it does.
fn one(p: &[u8], pi: usize, c: u8) -> Option<usize> {
    match p[pi] {
        b'?' => Some(pi + 1),
        b'[' => {
            let mut q = pi + 1;
            let neg = p.get(q) == Some(&b'^');
            if neg {
                q += 1;
            }
            let mut hit = false;
            loop {
                match &p[q..] {
                    [] => break,
                    [b']', ..] => {
                        q += 1;
                        break;
                    }
                    [b'\\', x, ..] => {
                        hit |= *x == c;
                        q += 2;
                    }
                    // As Redis: `a-]` is a range up to ']', which then does
                    // not close the class.
                    // Its ends and the byte compared as Redis on x86-64
                    // compares them: as C's `char`, signed there, so a
                    // range from ASCII to a byte of 0x80 or more is the
                    // bytes outside it (docs/RESP.md).
                    [a, b'-', z, ..] => {
                        let (a, z, c) = (*a as i8, *z as i8, c as i8);
                        let (lo, hi) = if a <= z { (a, z) } else { (z, a) };
                        hit |= (lo..=hi).contains(&c);
                        q += 3;
                    }
                    [x, ..] => {
                        hit |= *x == c;
                        q += 1;
                    }
                }
            }
            (hit != neg).then_some(q)
        }
        b'\\' if pi + 1 < p.len() => (p[pi + 1] == c).then_some(pi + 2),
        x => (x == c).then_some(pi + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns() {
        for (p, s, want) in [
            ("*", "", true),
            ("a*", "abc", true),
            ("*c", "abc", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("h[ae]llo", "hello", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h[b-a]llo", "hallo", true),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("user:*:name", "user:42:name", true),
            ("**a", "xa", true),
            ("abc", "abcd", false),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbc", false),
            ("a\\\\", "a\\", true),
            ("[a-]x", "]", true),
            ("[a-]x", "x", true),
            ("[a-]x", "b", false),
            ("x[a-]", "x_", true),
        ] {
            assert_eq!(matches(p.as_bytes(), s.as_bytes()), want, "{p} {s}");
        }
        // Ranges compare signed bytes, as Redis's C does: [a-\xc3] is
        // 0xc3..=0xff and 0x00..=b'a'.
        for (p, s, want) in [
            (&b"[a-\xc3]"[..], &b"b"[..], false),
            (b"[a-\xc3]", b"a", true),
            (b"[a-\xc3]", b"\0", true),
            (b"[a-\xc3]", b"\xc3", true),
            (b"[a-\xc3]", b"\xc2", false),
            (b"[a-\xc3]", b"\xff", true),
            (b"[\x80-\xff]", b"\x90", true),
            (b"[\x80-\xff]", b"a", false),
        ] {
            assert_eq!(matches(p, s), want, "{p:?} {s:?}");
        }
    }
}
