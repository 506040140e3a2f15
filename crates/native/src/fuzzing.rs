//! Entry points for the fuzz targets (`crates/fuzz`, `fuzz/`): the hello
//! and the request frames decoded from untrusted bytes as a connection
//! decodes them, with the invariants they promise checked. Not part of the
//! crate's API.
//!
//! Invariants checked: no decoder panics; nothing is consumed beyond the
//! input; a frame is incomplete without its last byte; a decoded request
//! encodes to a frame that decodes to the same request.

use crate::parse::{self, LargePut, Limits};
use granary_proto::{self as proto, ClientHello, Header, Request};

/// A choice byte, a client hello (16 bytes, and the token it announces)
/// and then request frames in the version it agrees on. The choice byte is
/// not part of the input: its bit 0 picks the version when the hello
/// agrees on none (frames are parsed all the same, though a server closes
/// such a connection), its bit 1 a large value limit (1 MiB) instead of a
/// small one (64 KiB), which reaches the limits' paths with short inputs.
/// Returns the frames taken.
pub fn frames(data: &[u8]) -> usize {
    let Some((&choice, data)) = data.split_first() else { return 0 };
    let Some(h) = data.get(..proto::CLIENT_HELLO_BYTES) else { return 0 };
    let mut buf = &data[proto::CLIENT_HELLO_BYTES..];
    let hello = ClientHello::decode_with_token(h.try_into().expect("16 bytes"));
    let agreed = match hello {
        Ok((c, token_len)) => {
            let again = ClientHello::decode(&c.encode()).expect("an encoded hello decodes");
            assert_eq!(again, c);
            // The token follows the hello, as the server reads it.
            let Some(rest) = buf.get(token_len..) else { return 0 };
            buf = rest;
            c.agree()
        }
        Err(_) => None,
    };
    let version = agreed.unwrap_or(if choice & 1 == 1 { proto::VERSION } else { proto::VERSION_MIN });
    assert!((proto::VERSION_MIN..=proto::VERSION).contains(&version));
    let value_max = if choice & 2 == 2 { 1 << 20 } else { 64 << 10 };
    let limits = Limits { frame_max: proto::frame_bytes_max(value_max), value_bytes_max: value_max };
    let mut taken = 0;
    loop {
        let h = match parse::header(buf, &limits, version) {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => return taken,
        };
        assert!(h.len <= limits.frame_max);
        match parse::large_put(&h, buf, &limits) {
            LargePut::Incomplete => {
                // A zero-copy PUT is known once 16 KiB of its value are in,
                // more than a fuzzer's inputs hold: its frame is classified
                // again with its missing bytes as zeros (frames of up to
                // 128 KiB), so the checks below still run.
                let total = parse::frame_len(&h);
                if total > buf.len() && total <= 128 << 10 {
                    let mut whole = buf.to_vec();
                    whole.resize(total, 0);
                    if let LargePut::Yes { key, value_at, value_len, ns, .. } = parse::large_put(&h, &whole, &limits) {
                        assert!(value_at <= whole.len() && !key.is_empty() && ns.len() == h.ns_len as usize);
                        assert_eq!(value_at + value_len, total);
                        taken += 1;
                    }
                }
                return taken;
            }
            LargePut::Yes { key, value_at, value_len, ns, .. } => {
                assert!(value_at <= buf.len() && !key.is_empty() && ns.len() == h.ns_len as usize);
                assert_eq!(value_at + value_len, parse::frame_len(&h));
                // The value comes from the socket; the next frame follows it.
                let Some(rest) = buf.get(value_at + value_len..) else { return taken };
                buf = rest;
                taken += 1;
                continue;
            }
            LargePut::No => {}
        }
        let total = parse::frame_len(&h);
        match parse::request(&h, buf, version) {
            Ok(Some((ns, req, body))) => {
                assert_eq!(body.len() + proto::HEADER_BYTES, total);
                assert_eq!(parse::request(&h, &buf[..total - 1], version), Ok(None));
                round_trip(ns, &req, h.id, version, &limits);
                buf = &buf[total..];
                taken += 1;
            }
            Ok(None) | Err(_) => return taken,
        }
    }
}

/// `req` (decoded from a frame naming `ns`) encodes to a frame that
/// decodes to the same namespace and request.
fn round_trip(ns: &[u8], req: &Request<'_>, id: u64, version: u16, limits: &Limits) {
    let mut out = Vec::new();
    req.encode_in(ns, id, &mut out);
    let h = Header::decode(&out, limits.frame_max, version).expect("an encoded header decodes");
    assert_eq!(h.len as usize + proto::HEADER_BYTES, out.len());
    let (ns2, req2) = Request::decode(&h, &out[proto::HEADER_BYTES..]).expect("an encoded request decodes");
    assert_eq!((ns2, &req2), (ns, req));
    assert_eq!(req.check_version(version), Ok(()), "a decoded request is of its connection's version");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The choice byte is the input's first and is not part of the hello;
    /// a hello with a token is followed by its token, then the frames (the
    /// token's bytes were parsed as frames, and the large value limit was
    /// never picked by an input whose hello decoded).
    #[test]
    fn a_hello_with_a_token_then_frames() {
        let mut input = vec![2u8];
        input.extend_from_slice(&ClientHello::default().encode_with_token(5));
        input.extend_from_slice(b"s3cre");
        Request::Get(b"k").encode_in(b"", 1, &mut input);
        Request::Nop.encode_in(b"", 2, &mut input);
        assert_eq!(frames(&input), 2);
        let mut plain = vec![0u8];
        plain.extend_from_slice(&ClientHello::default().encode());
        Request::Get(b"k").encode_in(b"", 1, &mut plain);
        assert_eq!(frames(&plain), 1);
    }

    /// A zero-copy PUT whose value a short input does not hold is still
    /// classified and checked (with its missing bytes as zeros).
    #[test]
    fn a_large_put_cut_short_is_still_checked() {
        let mut input = vec![0u8];
        input.extend_from_slice(&ClientHello::default().encode());
        let value = vec![7u8; 20 << 10];
        Request::Put { key: b"k", value: &value, mode: proto::PutMode::Upsert }.encode_in(b"", 1, &mut input);
        input.truncate(input.len() - (19 << 10));
        assert_eq!(frames(&input), 1);
    }
}
