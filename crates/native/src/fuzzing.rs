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

/// A client hello (its first 16 bytes) and then request frames in the
/// version it agrees on (or the one its first byte picks when it agrees on
/// none).
pub fn frames(data: &[u8]) {
    let (version, mut buf) = match data.get(..proto::CLIENT_HELLO_BYTES) {
        Some(h) => {
            let hello = ClientHello::decode(h.try_into().expect("16 bytes"));
            let agreed = hello.ok().and_then(|c| {
                let again = ClientHello::decode(&c.encode()).expect("an encoded hello decodes");
                assert_eq!(again, c);
                c.agree()
            });
            let version = agreed.unwrap_or(if data[0] & 1 == 1 { proto::VERSION } else { proto::VERSION_MIN });
            (version, &data[proto::CLIENT_HELLO_BYTES..])
        }
        None => return,
    };
    assert!((proto::VERSION_MIN..=proto::VERSION).contains(&version));
    // A small value limit reaches the limits' paths with short inputs.
    let value_max = if data[1] & 1 == 1 { 1 << 20 } else { 64 << 10 };
    let limits = Limits { frame_max: proto::frame_bytes_max(value_max), value_bytes_max: value_max };
    loop {
        let h = match parse::header(buf, &limits, version) {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => return,
        };
        assert!(h.len <= limits.frame_max);
        match parse::large_put(&h, buf, &limits) {
            LargePut::Incomplete => return,
            LargePut::Yes { key, value_at, value_len, ns, .. } => {
                assert!(value_at <= buf.len() && !key.is_empty() && ns.len() == h.ns_len as usize);
                assert_eq!(value_at + value_len, parse::frame_len(&h));
                // The value comes from the socket; the next frame follows it.
                let Some(rest) = buf.get(value_at + value_len..) else { return };
                buf = rest;
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
            }
            Ok(None) | Err(_) => return,
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
