//! Entry points for the fuzz targets (`crates/fuzz`, `fuzz/`): the request
//! decoders run over untrusted bytes as a connection runs them, with the
//! invariants they promise checked. Not part of the crate's API.
//!
//! Invariants checked: no decoder panics; a frame never claims more bytes
//! than the input holds; a whole request is incomplete without its last
//! byte; a refused line skips no more than the input holds; a line end
//! looked for past a prefix known to hold none is the one found from the
//! start.

use crate::binary;
use crate::limits::{ITEM_BYTES_DEFAULT, LINE_BYTES_MAX};
use crate::parse::{self, Frame};

/// Text and meta requests: frame lines, parse each, and take its data
/// block (if any) as the connection does.
pub fn text(data: &[u8]) {
    let mut buf = data;
    while !buf.is_empty() {
        // A line looked at in pieces is the line looked at once
        // (`frame_from`, told a prefix holds no line end).
        let window = buf.len().min(LINE_BYTES_MAX + 2);
        let nl_free = buf[..window].iter().position(|&b| b == b'\n').unwrap_or(window);
        for scanned in [nl_free / 2, nl_free] {
            assert_eq!(parse::frame_from(buf, scanned), parse::frame(buf));
        }
        let (line, used) = match parse::frame(buf) {
            Frame::Line(line, used) => (line, used),
            Frame::Incomplete => {
                assert!(buf.len() <= LINE_BYTES_MAX);
                return;
            }
            Frame::TooLong => {
                assert!(buf.len() > LINE_BYTES_MAX);
                return;
            }
        };
        assert!(used <= buf.len() && line.len() < used);
        buf = &buf[used..];
        let p = parse::parse(line);
        if p.request.is_err() {
            assert!(p.skip == 0 || p.cmd == Some(&b"ms"[..]));
        }
        let block = match &p.request {
            Ok(r) => r.data_len(),
            Err(_) if p.skip > 0 => Some(p.skip.saturating_sub(2)),
            Err(_) => None,
        };
        if let Some(len) = block {
            // The data block and its "\r\n".
            let Some(need) = len.checked_add(2) else { return };
            if buf.len() < need {
                return;
            }
            let _ = parse::value(&buf[..need]);
            buf = &buf[need..];
        }
    }
}

/// Standard base64 as meta commands decode keys (the `b` flag): what
/// decodes has the length its padding says.
pub fn base64(data: &[u8]) {
    if let Some(v) = parse::b64_decode(data) {
        let pad = data.iter().rev().take_while(|&&x| x == b'=').count();
        assert_eq!(v.len(), data.len() / 4 * 3 - pad);
    }
}

/// Binary requests: frame packets one after another (values of at most
/// `item_bytes_max`) as the connection does. The first byte is a choice,
/// not part of the input: an odd one picks a small item limit (64 bytes),
/// which reaches the "value too large" path, and the packets after it,
/// with short inputs. Returns the requests framed and the packets skipped.
pub fn binary(data: &[u8]) -> (usize, usize) {
    let Some((&choice, mut buf)) = data.split_first() else { return (0, 0) };
    let item_max = if choice & 1 == 1 { 64 } else { ITEM_BYTES_DEFAULT };
    let (mut requests, mut skips) = (0, 0);
    loop {
        match binary::frame(buf, item_max) {
            binary::Frame::Request(p, total) => {
                assert!(total <= buf.len() && total >= binary::HEADER_BYTES);
                assert_eq!(p.extras.len() + p.key.len() + p.value.len() + binary::HEADER_BYTES, total);
                assert_eq!(binary::frame(&buf[..total - 1], item_max), binary::Frame::Incomplete);
                buf = &buf[total..];
                requests += 1;
            }
            binary::Frame::Skip { consumed, skip, key, .. } => {
                assert!(consumed <= buf.len() && key.len() <= consumed);
                let rest = &buf[consumed..];
                buf = &rest[skip.min(rest.len())..];
                skips += 1;
            }
            binary::Frame::Incomplete | binary::Frame::Close { .. } => return (requests, skips),
        }
    }
}

/// A binary request packet (header, extras, key, value; opaque and CAS
/// zero), for seeds and tests.
pub fn binary_request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = vec![0x80, opcode];
    b.extend_from_slice(&(key.len() as u16).to_be_bytes());
    b.push(extras.len() as u8);
    b.extend_from_slice(&[0, 0, 0]);
    b.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    b.extend_from_slice(&[0; 12]);
    [b, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    use binary_request as request;

    /// The choice byte picks the small item limit: a SET of 100 bytes is
    /// skipped as too large and the GET after it is framed (the limit was
    /// picked by the packet's first byte, 0x80, even: never).
    #[test]
    fn the_small_limit_skips_a_large_value_and_frames_what_follows() {
        let set = request(0x01, &[0, 0, 0, 1, 0, 0, 0, 0], b"k", &[7; 100]);
        let get = request(0x00, &[], b"k", &[]);
        assert_eq!(binary(&[&[1u8][..], &set, &get].concat()), (1, 1));
        assert_eq!(binary(&[&[0u8][..], &set, &get].concat()), (2, 0));
    }
}
