//! Entry points for the fuzz targets (`crates/fuzz`, `fuzz/`): the
//! handshake's options and the transmission requests decoded from
//! untrusted bytes as a connection decodes them, with the invariants they
//! promise checked. Not part of the crate's API.
//!
//! Invariants checked: no panic; option data is held only up to
//! [`OPTION_BYTES_MAX`]; every option reply the handshake builds is well
//! formed; a request that passes its checks lies inside the export and
//! splits into block spans that cover it exactly once.

use crate::exec::{check, Target};
use crate::export::{spans, Geometry};
use crate::handshake::{info_replies, open, parse_info};
use crate::limits::*;
use crate::mem::{MemExport, MemExports};
use crate::proto::*;
use std::sync::Arc;

/// The exports the targets negotiate with: a usable one, the default
/// (empty) name, and one whose geometry the server refuses.
fn exports() -> MemExports {
    let x = MemExports::new();
    x.add("disk", 1 << 20, 4096);
    x.add("", 64 << 10, 512);
    x.add("odd", 1 << 20, 1000);
    x
}

/// Option replies, one after another, exactly filling `out`.
fn check_replies(mut out: &[u8], option: u32) {
    while !out.is_empty() {
        assert!(out.len() >= 20);
        assert_eq!(be64(&out[..8]), OPTION_REPLY_MAGIC);
        assert_eq!(be32(&out[8..12]), option);
        let len = be32(&out[16..20]) as usize;
        assert!(out.len() >= 20 + len);
        out = &out[20 + len..];
    }
}

/// The client's flags, then options as the server reads them; `NBD_OPT_INFO`
/// and `NBD_OPT_GO` are answered against [`exports`].
pub fn handshake(data: &[u8]) {
    let Some(flags) = data.get(..CLIENT_FLAGS_BYTES) else { return };
    if be32(flags) & !CLIENT_FLAGS_KNOWN != 0 {
        return;
    }
    let exports = exports();
    let mut buf = &data[CLIENT_FLAGS_BYTES..];
    for _ in 0..HANDSHAKE_OPTIONS_MAX {
        let Some(h) = buf.get(..OPTION_HEADER_BYTES) else { return };
        let h = OptionHeader::decode(h.try_into().expect("16 bytes"));
        buf = &buf[OPTION_HEADER_BYTES..];
        if h.magic != IHAVEOPT || h.len > OPTION_DISCARD_BYTES_MAX {
            return;
        }
        let len = (h.len as usize).min(buf.len());
        let (data, rest) = buf.split_at(len);
        buf = rest;
        if h.len > OPTION_BYTES_MAX || !matches!(h.option, OPT_INFO | OPT_GO) {
            continue;
        }
        let mut out = Vec::new();
        match parse_info(data) {
            None => continue,
            Some((name, asked)) => {
                assert!(name.len() + 2 * asked.len() + 6 == data.len());
                match open(&exports, name) {
                    Err((reply, why)) => option_reply(&mut out, h.option, reply, why.as_bytes()),
                    Ok((export, g, name)) => info_replies(&mut out, h.option, &*export, &g, &name, &asked),
                }
            }
        }
        check_replies(&out, h.option);
    }
}

/// Transmission requests as the read loop takes them (a WRITE's payload
/// follows its header), each checked against an export whose size and
/// alignment the first byte picks.
pub fn requests(data: &[u8]) {
    let Some((&first, mut buf)) = data.split_first() else { return };
    let size_bytes = [0, 4096, 1 << 20, u64::MAX - 4095][(first & 3) as usize];
    let block_bytes = if first & 4 == 0 { 512 } else { 4096 };
    let export = Arc::new(MemExport::new(size_bytes, block_bytes));
    let geometry = Geometry { size_bytes, block_bytes };
    let target = Target { export, geometry, aligned: first & 8 != 0 };
    while buf.len() >= REQUEST_BYTES {
        let raw = &buf[..REQUEST_BYTES];
        let req = Request::decode(raw);
        assert_eq!(&req.encode()[..], raw);
        buf = &buf[REQUEST_BYTES..];
        if req.magic != REQUEST_MAGIC || req.kind == CMD_DISC {
            return;
        }
        if req.kind == CMD_WRITE {
            if req.len > PAYLOAD_BYTES_MAX {
                return;
            }
            buf = &buf[(req.len as usize).min(buf.len())..];
        }
        if check(&target, &req).is_err() || req.kind == CMD_FLUSH {
            continue;
        }
        let end = req.offset.checked_add(u64::from(req.len)).expect("a checked request lies inside the export");
        assert!(req.len > 0 && end <= size_bytes);
        let mut covered = 0usize;
        for s in spans(req.offset, u64::from(req.len), block_bytes) {
            assert_eq!(s.from, covered);
            assert!(s.len > 0 && s.at + s.len <= block_bytes as usize);
            assert_eq!(s.block * u64::from(block_bytes) + s.at as u64, req.offset + s.from as u64);
            covered += s.len;
        }
        assert_eq!(covered, req.len as usize);
    }
}
