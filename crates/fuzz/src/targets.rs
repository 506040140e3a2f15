//! The fuzz targets: one function of untrusted bytes per decoder family.
//! The protocol targets call each server crate's hidden `fuzzing` module,
//! which runs the crate's private decoders as its connections do; the
//! format targets call `granary_format` and `granary_store` directly.
//!
//! On-device structures carry a CRC32C, which random bytes almost never
//! match: the format targets take their first byte as a choice, and with
//! its low bit set they write the right checksum into the input before
//! decoding, so the fields behind the checksum are fuzzed too.

use granary_format::checkpoint::{Item, Manifest, ITEM_BYTES, MANIFEST_FIXED_BYTES};
use granary_format::checksum::{crc32c, crc32c_append};
use granary_format::limits::{RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES, SUPERBLOCK_BYTES};
use granary_format::{batch, record, summary, RecordHeader, SegmentHeader, Superblock};
use granary_proto::{self as proto, Response, ServerHello, Status, TxnOutcome};

/// memcached's text protocol and its meta commands (one connection's input),
/// and the base64 keys of the meta commands' `b` flag.
pub fn memcache_text(data: &[u8]) {
    granary_memcache::fuzzing::text(data);
    for token in data.split(|&b| b == b' ' || b == b'\n') {
        granary_memcache::fuzzing::base64(token);
    }
}

/// memcached's binary protocol (one connection's input).
pub fn memcache_binary(data: &[u8]) {
    let _ = granary_memcache::fuzzing::binary(data);
}

/// The native protocol's client hello and request frames.
pub fn native_frames(data: &[u8]) {
    let _ = granary_native::fuzzing::frames(data);
}

/// What the native client reads from a server: the server hello, a
/// response header, and the response bodies it decodes (MGET/BATCH
/// entries, STATS, NS_STATS, NS_LIST, TXN outcomes). The first byte picks
/// the body's decoder; a GETS reply's is tried on every input.
pub fn native_replies(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else { return };
    if let Some(b) = body.get(..proto::SERVER_HELLO_BYTES) {
        if let Ok(h) = ServerHello::decode(b.try_into().expect("24 bytes")) {
            assert_eq!(ServerHello::decode(&h.encode()), Ok(h));
        }
    }
    if let Ok((h, status)) = Response::decode_header(body, proto::FRAME_BYTES_FLOOR) {
        let mut out = Vec::new();
        proto::encode_response_header(&mut out, h.op, status, h.id, h.len as usize);
        assert_eq!(Response::decode_header(&out, proto::FRAME_BYTES_FLOOR), Ok((h, status)));
    }
    if let Ok((info, value)) = proto::ItemInfo::decode_reply(body) {
        let mut out = Vec::new();
        info.encode(&mut out);
        out.extend_from_slice(value);
        assert_eq!(out, body);
    }
    match pick % 5 {
        0 => {
            if let Ok(entries) = proto::decode_entries(body) {
                let mut out = Vec::new();
                proto::encode_count(&mut out, entries.len());
                for e in &entries {
                    proto::encode_entry(&mut out, e.status, &e.bytes);
                }
                assert_eq!(out, body);
            }
        }
        1 => {
            if let Ok(pairs) = proto::decode_stats(body) {
                let mut out = Vec::new();
                proto::encode_stats(&mut out, &pairs);
                assert_eq!(out, body);
            }
        }
        2 => {
            if let Ok(s) = proto::decode_namespace_stats(body) {
                let mut out = Vec::new();
                proto::encode_namespace_stats(&mut out, &s);
                assert_eq!(proto::decode_namespace_stats(&out).as_ref(), Ok(&s));
            }
        }
        3 => {
            if let Ok(list) = proto::decode_namespace_list(body) {
                let mut out = Vec::new();
                proto::encode_namespace_list(&mut out, &list);
                assert_eq!(proto::decode_namespace_list(&out).as_ref(), Ok(&list));
            }
        }
        _ => {
            let statuses = [Status::Ok, Status::Exists, Status::NotFound, Status::BadFrame];
            let status = statuses[(pick as usize / 5) % statuses.len()];
            if let Ok(o) = TxnOutcome::decode(status, body) {
                let mut out = Vec::new();
                assert_eq!(o.encode(&mut out), status);
                assert_eq!(out, body);
            }
        }
    }
}

/// RESP: multibulk and inline commands (one connection's input, framed
/// whole and in pieces), and inline quoting.
pub fn resp(data: &[u8]) {
    granary_resp::fuzzing::frames(data);
    if let Some(line) = data.split(|&b| b == b'\n').next() {
        granary_resp::fuzzing::inline(line);
    }
}

/// NBD's fixed newstyle handshake: client flags, then options.
pub fn nbd_handshake(data: &[u8]) {
    granary_nbd::fuzzing::handshake(data);
}

/// NBD transmission requests (a WRITE's payload after its header).
pub fn nbd_requests(data: &[u8]) {
    granary_nbd::fuzzing::requests(data);
}

/// Split a format target's input: whether to fix its checksum, the bytes.
fn choice(data: &[u8]) -> Option<(bool, Vec<u8>)> {
    let (&first, rest) = data.split_first()?;
    Some((first & 1 == 1, rest.to_vec()))
}

/// Write the CRC32C of `b[..at]` at `at` (little-endian), if `b` holds it.
fn fix_crc(b: &mut [u8], at: usize) {
    if b.len() >= at + 4 {
        let crc = crc32c(&b[..at]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A record as the store reads it from a segment: header, checksums, key,
/// value and CAS value; one that verifies encodes back to the same bytes.
/// The first byte's low bit fixes both checksums (seed 0) first.
pub fn record(data: &[u8]) {
    let Some((fix, mut b)) = choice(data) else { return };
    let seed = 0;
    let Ok(h) = RecordHeader::decode(&b) else { return };
    assert!(h.record_bytes() >= RECORD_HEADER_BYTES as u64);
    let _ = h.grains(4096);
    let whole = b.len() as u64 >= h.record_bytes();
    if fix && whole {
        let stamp = h.seg_stamp;
        record::restamp(seed, &h, &mut b, stamp, h.damaged_copy);
        // Restamping clears the batch flag; decode what it wrote.
        if RecordHeader::decode(&b).is_err() {
            return;
        }
    }
    let Ok(h) = RecordHeader::decode(&b) else { return };
    if record::verify_header_crc(seed, &h, &b).is_ok() {
        let key = record::key_of(&h, &b);
        assert_eq!(key.len(), h.key_len as usize);
    }
    if b.len() >= record::cas_bytes_needed(&h) {
        let _ = record::cas_of(&h, &b);
    }
    if record::verify_crc(seed, &h, &b).is_err() {
        return;
    }
    let (key, value) = (record::key_of(&h, &b), record::value_of(&h, &b));
    assert_eq!(value.len() as u64, h.user_value_len());
    let start = RECORD_HEADER_BYTES + h.key_len as usize;
    let stored = &b[start..start + h.value_len as usize];
    let mut out = vec![0u8; h.record_bytes() as usize];
    h.encode(seed, key, stored, &mut out);
    let again = RecordHeader::decode(&out).expect("an encoded record decodes");
    assert_eq!(again, h);
    record::verify_crc(seed, &again, &out).expect("an encoded record verifies");
}

/// A segment header; one that decodes encodes to the same bytes.
pub fn segment_header(data: &[u8]) {
    let Some((fix, mut b)) = choice(data) else { return };
    if fix {
        fix_crc(&mut b, SEGMENT_HEADER_BYTES - 4);
    }
    if let Ok(h) = SegmentHeader::decode(&b) {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        h.encode(&mut out);
        assert_eq!(&out[..], &b[..SEGMENT_HEADER_BYTES]);
    }
}

/// A segment summary's region (whole 512-byte grains) as GC and the log
/// scan read it: its last grain's trailing block ([`summary::trailer`],
/// for a segment of 64 times the region's grains), then the whole region
/// ([`summary::decode`]). The first byte's low bit writes both blocks'
/// and the entries' checksums (seed 0) first. Entries that decode encode
/// to a region that decodes to the same entries.
pub fn summary(data: &[u8]) {
    let _ = summary_entries(data);
}

/// [`summary`]'s work; the entries decoded, if the region decoded.
pub fn summary_entries(data: &[u8]) -> Option<usize> {
    const GRAIN: usize = 512;
    let (fix, mut b) = choice(data)?;
    let grains = b.len() / GRAIN;
    if grains == 0 {
        return None;
    }
    b.truncate(grains * GRAIN);
    let block = summary::SUMMARY_BLOCK_BYTES;
    if fix && b.len() >= 2 * block {
        // The entries' checksum (at 28) over what the block says they take,
        // then the block's own (at 36), copied to the region's end.
        let entries = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")) as usize;
        if let Some(body) = b.get(block..block + entries) {
            let crc = crc32c_append(0, body);
            b[28..32].copy_from_slice(&crc.to_le_bytes());
        }
        let crc = crc32c_append(0, &b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        let head = b[..block].to_vec();
        let len = b.len();
        b[len - block..].copy_from_slice(&head);
    }
    let _ = summary::Block::decode(0, &b);
    let segment_grains = 64 * grains as u64;
    let stamp = b.get(8..12).map_or(0, |s| u32::from_le_bytes(s.try_into().expect("4 bytes")));
    let trailer = summary::trailer(0, stamp, segment_grains, &b[b.len() - GRAIN..]).ok()?;
    // GC reads the region the trailer names, which ends the segment.
    let region = &b[b.len().checked_sub(trailer.region_grains as usize * GRAIN)?..];
    let entries = summary::decode(0, &trailer, region).ok()?;
    assert_eq!(entries.len(), trailer.count as usize);
    let again = summary::encode(0, trailer.stamp, trailer.records_end, &entries, GRAIN as u32);
    let t = summary::trailer(
        0,
        trailer.stamp,
        segment_grains.max(64 * (again.len() / GRAIN) as u64),
        &again[again.len() - GRAIN..],
    )
    .expect("an encoded summary's trailer decodes");
    assert_eq!(summary::decode(0, &t, &again).expect("an encoded summary decodes"), entries);
    Some(entries.len())
}

/// A superblock copy; one that decodes encodes to the same bytes and has
/// a geometry whose segments lie on the device.
pub fn superblock(data: &[u8]) {
    let Some((fix, mut b)) = choice(data) else { return };
    if fix {
        fix_crc(&mut b, SUPERBLOCK_BYTES - 4);
    }
    if let Ok(sb) = Superblock::decode(&b) {
        let mut out = [0u8; SUPERBLOCK_BYTES];
        sb.encode(&mut out);
        assert_eq!(&out[..], &b[..SUPERBLOCK_BYTES]);
        let last = (sb.segment_count - 1) as u32;
        assert!(sb.segment_offset(last) + sb.segment_bytes <= sb.device_bytes);
        assert!(sb.segment_grains() >= 4);
    }
}

/// A stripe set member's label as an open reads it; the first byte's low
/// bit writes its checksum first. What decodes encodes to the same bytes.
pub fn stripe_label(data: &[u8]) {
    let Some((fix, mut b)) = choice(data) else { return };
    if fix {
        fix_crc(&mut b, STRIPE_LABEL_CRC_AT);
    }
    granary_store::io::stripe::fuzz_label(&b);
}

/// Where a stripe label's checksum lies (over the bytes before it).
const STRIPE_LABEL_CRC_AT: usize = 40;

/// A checkpoint manifest, the body items after it, and a batch's commit
/// record; what decodes encodes to the same bytes.
pub fn checkpoint(data: &[u8]) {
    let Some((fix, mut b)) = choice(data) else { return };
    if fix && b.len() >= MANIFEST_FIXED_BYTES {
        // The manifest's checksum covers its fixed part less the checksum,
        // then its lists, up to the length it states.
        let len = u32::from_le_bytes(b[84..88].try_into().expect("4 bytes")) as usize;
        if (MANIFEST_FIXED_BYTES..=b.len()).contains(&len) {
            let crc = crc32c_append(crc32c(&b[..124]), &b[MANIFEST_FIXED_BYTES..len]);
            b[124..128].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if let Ok(m) = Manifest::decode(&b) {
        let mut out = vec![0u8; m.encoded_bytes()];
        m.encode(&mut out);
        assert_eq!(&out[..], &b[..out.len()]);
        for chunk in b[out.len()..].chunks_exact(ITEM_BYTES) {
            let item = Item::decode(chunk);
            let mut again = [0u8; ITEM_BYTES];
            item.encode(&mut again);
            assert_eq!(&again[..], chunk);
        }
    }
    for c in [&b[..], &b[..b.len().min(batch::COMMIT_BYTES)]] {
        if let Ok(commit) = batch::Commit::decode(c) {
            assert_eq!(&commit.encode()[..], c);
        }
    }
}

/// The namespace catalog (first byte even) or the clean-close totals.
pub fn catalog(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else { return };
    if first & 1 == 0 {
        granary_store::fuzzing::catalog(rest);
    } else {
        granary_store::fuzzing::totals(rest);
    }
}

/// The configuration file, parsed as `granary serve --config` parses it
/// (crates/cli/src/settings.rs, `parse_toml`): a table of keys with their
/// spans, each span's line found by slicing the text before it. The
/// settings' value checks run in `granary serve`'s own tests and in
/// crates/cli/tests/config_corpus.rs, which feeds this target's corpus to
/// the binary.
pub fn config_toml(data: &[u8]) {
    use std::collections::BTreeMap;
    use toml::Spanned;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    match toml::from_str::<BTreeMap<Spanned<String>, Spanned<toml::Value>>>(text) {
        Ok(table) => {
            for (k, v) in &table {
                let _ = (line(k.span().start), line(v.span().start));
            }
        }
        Err(e) => {
            if let Some(r) = e.span() {
                let _ = line(r.start);
            }
            let _ = e.message();
        }
    }
}
