//! The NBD server against raw sockets over loopback, on in-memory exports:
//! the handshake and every option (malformed and oversized ones too),
//! every command with its flags, the errors for out-of-range, unaligned,
//! zero-length and unknown requests, malformed requests that close the
//! connection without touching data, concurrency and out-of-order replies,
//! NBD_CMD_DISC, the connection limit, and several connections on one
//! export.

mod common;

use common::*;
use granary_nbd::limits::{INFLIGHT_MAX, PAYLOAD_BYTES_MAX, RUNS_PER_REQUEST, RUN_BYTES_MAX};
use granary_nbd::proto::*;
use granary_nbd::NbdConfig;
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

#[test]
fn unknown_client_flags_close_the_connection() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE | 1 << 7);
    assert!(r.closed());
    assert_eq!(f.server().stats().protocol_errors.load(Relaxed), 1);
}

#[test]
fn list_names_every_export_and_refuses_data() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.option(OPT_LIST, &[]);
    let replies = r.option_replies(OPT_LIST);
    assert_eq!(replies.last().unwrap().0, REP_ACK);
    let names: Vec<String> = replies[..replies.len() - 1]
        .iter()
        .map(|(kind, d)| {
            assert_eq!(*kind, REP_SERVER);
            let n = be32(d) as usize;
            String::from_utf8(d[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, vec!["disk".to_string(), "small".to_string()]);
    // The rest of a REP_SERVER is the description, for a human.
    assert_eq!(&replies[0].1[8..], b"in-memory export");

    r.option(OPT_LIST, b"x");
    assert_eq!(r.option_reply(OPT_LIST).0, REP_ERR_INVALID);
    // Still negotiating.
    r.option(OPT_LIST, &[]);
    assert_eq!(r.option_replies(OPT_LIST).len(), 3);
}

#[test]
fn info_answers_what_was_asked_and_go_enters_transmission() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_INFO, &info_request(DISK, &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION, 77, INFO_EXPORT]));
    let replies = r.option_replies(OPT_INFO);
    assert_eq!(replies.last().unwrap(), &(REP_ACK, vec![]));
    let infos: Vec<&Vec<u8>> = replies[..replies.len() - 1]
        .iter()
        .map(|(k, d)| {
            assert_eq!(*k, REP_INFO);
            d
        })
        .collect();
    // Each once: EXPORT, BLOCK_SIZE, NAME, DESCRIPTION; 77 is ignored.
    assert_eq!(infos.len(), 4);
    let export = infos.iter().find(|d| u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT).unwrap();
    assert_eq!(export.len(), 12);
    assert_eq!(be64(&export[2..10]), DISK_BYTES);
    let flags = u16::from_be_bytes([export[10], export[11]]);
    assert_eq!(flags, TRANSMISSION_FLAGS);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x}");
    }
    assert_eq!(flags & (FLAG_READ_ONLY | FLAG_SEND_DF | FLAG_SEND_CACHE | FLAG_ROTATIONAL), 0);
    let bs = infos.iter().find(|d| u16::from_be_bytes([d[0], d[1]]) == INFO_BLOCK_SIZE).unwrap();
    assert_eq!(bs.len(), 14);
    assert_eq!((be32(&bs[2..]), be32(&bs[6..]), be32(&bs[10..])), (512, BLOCK, 32 << 20));
    let name = infos.iter().find(|d| u16::from_be_bytes([d[0], d[1]]) == INFO_NAME).unwrap();
    assert_eq!(&name[2..], DISK.as_bytes());

    // Without requests: only the export's info.
    r.option(OPT_INFO, &info_request("small", &[]));
    let replies = r.option_replies(OPT_INFO);
    assert_eq!(replies.len(), 2);
    assert_eq!(be64(&replies[0].1[2..10]), 1 << 20);

    // Unknown export; malformed requests.
    r.option(OPT_INFO, &info_request("nope", &[]));
    let (kind, msg) = r.option_reply(OPT_INFO);
    assert_eq!(kind, REP_ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&msg).contains("nope"));
    let mut bad = info_request(DISK, &[INFO_BLOCK_SIZE]);
    bad.truncate(bad.len() - 1);
    r.option(OPT_GO, &bad);
    assert_eq!(r.option_reply(OPT_GO).0, REP_ERR_INVALID);
    let mut bad = info_request(DISK, &[]);
    bad[..4].copy_from_slice(&1000u32.to_be_bytes());
    r.option(OPT_GO, &bad);
    assert_eq!(r.option_reply(OPT_GO).0, REP_ERR_INVALID);
    r.option(OPT_GO, &[0, 0]);
    assert_eq!(r.option_reply(OPT_GO).0, REP_ERR_INVALID);

    // GO: transmission at once (no zeroes after the ACK).
    r.option(OPT_GO, &info_request(DISK, &[]));
    assert_eq!(r.option_replies(OPT_GO).last().unwrap().0, REP_ACK);
    assert_eq!(r.write(0, &[1u8; 4096]), 0);
    assert_eq!(r.read_at(0, 4096), vec![1u8; 4096]);
    assert_eq!(f.server().stats().handshakes.load(Relaxed), 1);
}

#[test]
fn unsupported_options_are_refused_and_negotiation_goes_on() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    for opt in [
        OPT_STRUCTURED_REPLY,
        OPT_STARTTLS,
        OPT_LIST_META_CONTEXT,
        OPT_SET_META_CONTEXT,
        OPT_EXTENDED_HEADERS,
        OPT_PEEK_EXPORT,
        12345,
    ] {
        r.option(opt, &[]);
        assert_eq!(r.option_reply(opt).0, REP_ERR_UNSUP, "option {opt}");
    }
    // With data, too.
    r.option(OPT_SET_META_CONTEXT, &info_request(DISK, &[1, 2, 3]));
    assert_eq!(r.option_reply(OPT_SET_META_CONTEXT).0, REP_ERR_UNSUP);
    r.option(OPT_GO, &info_request(DISK, &[]));
    assert_eq!(r.option_replies(OPT_GO).last().unwrap().0, REP_ACK);
    assert_eq!(r.write(4096, &[2u8; 512]), 0);
}

#[test]
fn oversized_options_are_dropped_or_close_the_connection() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    // Larger than the server holds: read, dropped, TOO_BIG; then on.
    r.option(OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(r.option_reply(OPT_INFO).0, REP_ERR_TOO_BIG);
    r.option(OPT_LIST, &[]);
    assert_eq!(r.option_replies(OPT_LIST).last().unwrap().0, REP_ACK);
    // Absurd: closed without reading it (nothing allocated for it).
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_INFO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    r.send(&b);
    assert!(r.closed());

    // A bad option magic closes too.
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.send(&[0u8; 16]);
    assert!(r.closed());
    assert_eq!(f.server().stats().protocol_errors.load(Relaxed), 2);

    // An oversized EXPORT_NAME cannot be answered with an error: closed
    // (maybe before the client has sent all of it).
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.option_may_close(OPT_EXPORT_NAME, &vec![b'a'; 20_000]);
    assert!(r.closed());
}

#[test]
fn abort_is_acknowledged_then_closed() {
    let f = Fixture::new();
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.option(OPT_ABORT, b"ignored");
    assert_eq!(r.option_reply(OPT_ABORT), (REP_ACK, vec![]));
    assert!(r.closed());
}

#[test]
fn export_name_gets_the_old_reply() {
    let f = Fixture::new();
    // With NO_ZEROES: size and flags only.
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_EXPORT_NAME, DISK.as_bytes());
    let b = r.read(10);
    assert_eq!(be64(&b), DISK_BYTES);
    assert_eq!(u16::from_be_bytes([b[8], b[9]]), TRANSMISSION_FLAGS);
    assert_eq!(r.write(0, &[3u8; 4096]), 0);

    // Without: 124 zeroes follow. A client without FIXED_NEWSTYLE too.
    let mut r = f.raw(0);
    r.option(OPT_EXPORT_NAME, b"small");
    let b = r.read(10 + 124);
    assert_eq!(be64(&b), 1 << 20);
    assert!(b[10..].iter().all(|&x| x == 0));
    assert_eq!(r.read_at(0, 512), vec![0u8; 512]);

    // An unknown export ends the session (no error reply exists).
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.option(OPT_EXPORT_NAME, b"nope");
    assert!(r.closed());
}

#[test]
fn an_export_with_a_block_size_the_server_cannot_serve_is_refused() {
    let f = Fixture::new();
    f.exports.add("odd", 1 << 20, 1000);
    f.exports.add("tiny", 1 << 20, 256);
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    for name in ["odd", "tiny"] {
        r.option(OPT_GO, &info_request(name, &[]));
        let (kind, msg) = r.option_reply(OPT_GO);
        assert_eq!(kind, REP_ERR_POLICY, "{}", String::from_utf8_lossy(&msg));
    }
}

#[test]
fn reads_and_writes_round_trip_with_fua_and_flush() {
    let f = Fixture::new();
    let mut r = f.go(DISK, true);
    let data = pattern(1, 256 * 1024);
    assert_eq!(r.write(1 << 20, &data), 0);
    assert_eq!(r.read_at(1 << 20, data.len() as u32), data);
    assert_eq!(f.disk.read_range(1 << 20, data.len()), data);
    // Blocks never written read as zeroes.
    assert_eq!(r.read_at(0, 8192), vec![0u8; 8192]);

    let syncs = f.disk.syncs();
    assert_eq!(r.call(CMD_FLAG_FUA, CMD_WRITE, 0, 4096, &[9u8; 4096]).0, 0);
    assert_eq!(f.disk.syncs(), syncs + 1, "a FUA write syncs before its reply");
    assert_eq!(r.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    assert_eq!(f.disk.syncs(), syncs + 2);
    // FUA on a read is accepted and needs no sync.
    assert_eq!(r.call(CMD_FLAG_FUA, CMD_READ, 0, 4096, &[]).1, vec![9u8; 4096]);
    assert_eq!(f.disk.syncs(), syncs + 2);
    // CACHE: a hint, accepted.
    assert_eq!(r.call(0, CMD_CACHE, 0, 4096, &[]).0, 0);

    let st = f.server().stats();
    assert_eq!(st.writes.load(Relaxed), 2);
    assert_eq!(st.flushes.load(Relaxed), 1);
    assert_eq!(st.written_bytes.load(Relaxed), data.len() as u64 + 4096);
    assert_eq!(st.errors.load(Relaxed), 0);
}

/// A WRITE's data that reaches the server in many small pieces, the next
/// request's header sent right behind its last piece: every byte lands in
/// its place (the data past what the first receive held goes straight
/// into the payload), and the request after it is read from the right
/// byte on.
#[test]
fn a_write_sent_in_small_pieces_lands_whole_and_the_next_request_follows() {
    let f = Fixture::new();
    let mut r = f.go(DISK, true);
    let first = pattern(3, 384 * 1024 + 512);
    let second = pattern(4, 8192);
    let mut stream =
        Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_WRITE, cookie: 1, offset: 0, len: first.len() as u32 }
            .encode()
            .to_vec();
    stream.extend_from_slice(&first);
    stream.extend_from_slice(
        &Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_WRITE, cookie: 2, offset: 1 << 20, len: 8192 }.encode(),
    );
    stream.extend_from_slice(&second);
    // Pieces of an odd size, so no piece ends on a block or a header.
    for piece in stream.chunks(1_001) {
        r.send(piece);
    }
    let mut cookies: Vec<(u32, u64)> = vec![r.reply(), r.reply()];
    cookies.sort_by_key(|c| c.1);
    assert_eq!(cookies, vec![(0, 1), (0, 2)]);
    assert_eq!(r.read_at(0, first.len() as u32), first);
    assert_eq!(r.read_at(1 << 20, 8192), second);
    assert_eq!(f.disk.read_range(0, first.len()), first);
}

#[test]
fn unaligned_writes_read_modify_write_their_edge_blocks() {
    let f = Fixture::new();
    // Sector-aligned but not block-aligned (a client that asked for the
    // block sizes keeps to 512).
    let mut r = f.go(DISK, true);
    let base = pattern(2, 16384);
    assert_eq!(r.write(0, &base), 0);
    let patch = pattern(3, 4096 + 1024);
    assert_eq!(r.write(512, &patch), 0);
    let mut want = base.clone();
    want[512..512 + patch.len()].copy_from_slice(&patch);
    assert_eq!(r.read_at(0, 16384), want);
    assert_eq!(f.server().stats().partial_blocks.load(Relaxed), 2);

    // Any byte alignment for a client that did not agree to the minimum
    // (EXPORT_NAME: the protocol's default constraints).
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_EXPORT_NAME, DISK.as_bytes());
    r.read(10);
    let odd = pattern(4, 10_001);
    assert_eq!(r.write(4095, &odd), 0);
    want[4095..4095 + odd.len()].copy_from_slice(&odd);
    assert_eq!(r.read_at(0, 16384), want[..16384]);
    assert_eq!(r.read_at(4095, odd.len() as u32), odd);
    assert_eq!(f.disk.read_range(0, want.len()), want);
    // Single bytes across a block boundary.
    assert_eq!(r.write(8191, &[0xaa, 0xbb]), 0);
    assert_eq!(r.read_at(8190, 4), vec![want[8190], 0xaa, 0xbb, want[8193]]);
}

/// A block value shorter than the block (another client of a store's
/// export may write one) reads as zeroes past its end: a span past its
/// end, a span over its end, whole blocks, single bytes.
#[test]
fn a_block_shorter_than_the_block_size_reads_as_zeroes_past_its_end() {
    let f = Fixture::new();
    f.disk.put_raw_block(1, &[7, 8, 9]);
    let mut r = f.go(DISK, true);
    assert_eq!(r.read_at(4096 + 512, 512), vec![0; 512], "a span past the value's end");
    let mut want = vec![0u8; 512];
    want[..3].copy_from_slice(&[7, 8, 9]);
    assert_eq!(r.read_at(4096, 512), want, "a span over its end");
    let mut whole = vec![0u8; 8192];
    whole[4096..4099].copy_from_slice(&[7, 8, 9]);
    assert_eq!(r.read_at(0, 8192), whole, "whole blocks");
    // Any byte alignment without the agreed minimum (EXPORT_NAME).
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_EXPORT_NAME, DISK.as_bytes());
    r.read(10);
    assert_eq!(r.read_at(4097, 1), vec![8], "one byte");
    assert_eq!(r.read_at(4100, 1), vec![0], "the byte after its end");
}

/// A request whose task panics (a server bug the executor contains) ends
/// its connection, so its client sees the end of the stream instead of
/// waiting for a reply forever; the server serves the next connection.
#[test]
fn a_request_that_dies_without_its_reply_ends_its_connection() {
    let f = Fixture::new();
    f.disk.panic_on_reading(3);
    let mut r = f.go(DISK, true);
    assert_eq!(r.write(0, &[1u8; 4096]), 0);
    r.request(0, CMD_READ, 9, 3 * 4096, 4096, &[]);
    assert!(r.closed(), "the connection ends");
    let mut r = f.go(DISK, true);
    assert_eq!(r.read_at(0, 4096), vec![1u8; 4096], "the next connection is served");
}

#[test]
fn concurrent_partial_writes_of_one_block_all_land() {
    let f = Fixture::new();
    f.disk.set_delay(Some(Duration::from_millis(5)));
    let mut r = f.go(DISK, true);
    // Eight 512-byte sectors of block 3, in flight together.
    let mut want = vec![0u8; 4096];
    for i in 0..8u64 {
        let d = vec![i as u8 + 1; 512];
        want[i as usize * 512..(i as usize + 1) * 512].copy_from_slice(&d);
        r.request(0, CMD_WRITE, i, 3 * 4096 + i * 512, 512, &d);
    }
    let cookies: HashSet<u64> = (0..8).map(|_| r.reply()).map(|(e, c)| (assert_eq!(e, 0), c).1).collect();
    assert_eq!(cookies.len(), 8);
    assert_eq!(r.read_at(3 * 4096, 4096), want);
}

#[test]
fn trim_and_write_zeroes_read_back_as_zeroes() {
    let f = Fixture::new();
    let mut r = f.go(DISK, true);
    let data = pattern(5, 64 * 1024);
    assert_eq!(r.write(0, &data), 0);
    assert_eq!(f.disk.blocks_stored(), 16);

    // TRIM frees the whole blocks of its range; the edges it may keep
    // (this server keeps them).
    assert_eq!(r.call(0, CMD_TRIM, 2048, 3 * 4096, &[]).0, 0);
    assert_eq!(f.disk.blocks_stored(), 14);
    let mut want = data.clone();
    want[4096..12288].fill(0);
    assert_eq!(r.read_at(0, 64 * 1024), want);

    // WRITE_ZEROES zeroes exactly its range (edges by read-modify-write),
    // with each flag it takes.
    for (flags, off, len) in [
        (0, 20 * 1024 + 512, 8 * 1024),
        (CMD_FLAG_NO_HOLE, 40 * 1024, 4096),
        (CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA, 50 * 1024 + 1024, 1024),
    ] {
        assert_eq!(r.call(flags, CMD_WRITE_ZEROES, off, len, &[]).0, 0, "flags {flags:#x}");
        want[off as usize..(off + u64::from(len)) as usize].fill(0);
        assert_eq!(r.read_at(0, 64 * 1024), want, "flags {flags:#x}");
    }
    // Large zeroing beyond the maximum payload is fine (no payload).
    assert_eq!(r.call(0, CMD_WRITE_ZEROES, 0, DISK_BYTES as u32, &[]).0, 0);
    assert_eq!(f.disk.blocks_stored(), 0);
    let st = f.server().stats();
    assert_eq!((st.trims.load(Relaxed), st.write_zeroes.load(Relaxed)), (1, 4));
}

#[test]
fn invalid_requests_get_the_specified_errors_and_the_connection_goes_on() {
    let f = Fixture::new();
    let mut r = f.go(DISK, true);
    let end = DISK_BYTES;
    let cases: &[(u16, u16, u64, u32, u32)] = &[
        // Past the end: EINVAL, or ENOSPC for the writes.
        (0, CMD_READ, end - 4096, 8192, EINVAL),
        (0, CMD_READ, end, 512, EINVAL),
        (0, CMD_READ, u64::MAX - 511, 1024, EINVAL),
        (0, CMD_TRIM, end, 4096, EINVAL),
        (0, CMD_CACHE, end, 4096, EINVAL),
        (0, CMD_WRITE_ZEROES, end - 512, 1024, ENOSPC),
        // Zero lengths.
        (0, CMD_READ, 0, 0, EINVAL),
        (0, CMD_TRIM, 0, 0, EINVAL),
        (0, CMD_WRITE_ZEROES, 0, 0, EINVAL),
        // Not aligned to the advertised minimum (this client asked).
        (0, CMD_READ, 100, 512, EINVAL),
        (0, CMD_READ, 0, 100, EINVAL),
        // Too large a READ for a simple reply.
        (0, CMD_READ, 0, PAYLOAD_BYTES_MAX + 512, EINVAL),
        // Flags a command does not take, unknown flags.
        (CMD_FLAG_DF, CMD_READ, 0, 512, EINVAL),
        (CMD_FLAG_NO_HOLE, CMD_TRIM, 0, 512, EINVAL),
        (CMD_FLAG_FAST_ZERO, CMD_CACHE, 0, 512, EINVAL),
        (1 << 9, CMD_FLUSH, 0, 0, EINVAL),
        // FLUSH's offset and length are reserved (zero).
        (0, CMD_FLUSH, 512, 0, EINVAL),
        // BLOCK_STATUS (no metadata context was set) and unknown commands.
        (0, CMD_BLOCK_STATUS, 0, 512, EINVAL),
        (0, 8, 0, 512, EINVAL),
        (0, 0x4242, 0, 512, EINVAL),
    ];
    for &(flags, kind, offset, len, want) in cases {
        assert_eq!(
            r.call(flags, kind, offset, len, &[]).0,
            want,
            "{} flags {flags:#x} {offset}+{len}",
            command_name(kind)
        );
    }
    // A WRITE refused after its data was read: the data is consumed, the
    // next request is read correctly, nothing was written.
    assert_eq!(r.write(end - 512, &[7u8; 1024]), ENOSPC);
    assert_eq!(r.write(3, &[7u8; 512]), EINVAL);
    assert_eq!(r.call(CMD_FLAG_NO_HOLE, CMD_WRITE, 0, 512, &[7u8; 512]).0, EINVAL);
    assert_eq!(r.call(0, CMD_WRITE, 0, 0, &[]).0, EINVAL);
    assert_eq!(f.disk.blocks_stored(), 0);
    assert_eq!(r.read_at(end - 512, 512), vec![0u8; 512]);
    assert_eq!(f.server().stats().errors.load(Relaxed), cases.len() as u64 + 4);
    assert_eq!(f.server().stats().protocol_errors.load(Relaxed), 0);
}

#[test]
fn malformed_requests_close_the_connection_without_touching_data() {
    let f = Fixture::new();
    let mut r = f.go(DISK, false);
    assert_eq!(r.write(0, &[1u8; 4096]), 0);
    // A bad magic, even with a plausible WRITE after it.
    let mut b =
        Request { magic: 0x1256_0953, flags: 0, kind: CMD_WRITE, cookie: 1, offset: 0, len: 4096 }.encode().to_vec();
    b.extend_from_slice(&[2u8; 4096]);
    r.send(&b);
    assert!(r.closed());

    // A WRITE larger than the maximum payload: closed before its data.
    let mut r = f.go(DISK, false);
    r.request(0, CMD_WRITE, 1, 0, PAYLOAD_BYTES_MAX + 1, &[3u8; 4096]);
    assert!(r.closed());
    assert_eq!(f.disk.read_range(0, 4096), vec![1u8; 4096]);
    assert_eq!(f.server().stats().protocol_errors.load(Relaxed), 2);
    assert_eq!(f.server().stats().writes.load(Relaxed), 1);
}

#[test]
fn requests_run_concurrently_and_replies_come_as_they_complete() {
    let f = Fixture::new();
    let limit = Duration::from_secs(30);
    let mut r = f.go(DISK, true);
    // 32 one-block reads at once (fio's iodepth=32) all run together: each
    // waits until the 32 run at once.
    f.disk.hold_until_together(0..32 * 4096, 32, limit);
    for c in 0..32u64 {
        r.request(0, CMD_READ, c, c * 4096, 4096, &[]);
    }
    let mut seen = HashSet::new();
    for _ in 0..32 {
        let (e, c) = r.reply();
        assert_eq!(e, 0);
        r.read(4096);
        assert!(seen.insert(c));
    }
    assert!(f.disk.hold_met(), "32 reads in flight did not run together");
    assert!(f.server().stats().inflight_max.load(Relaxed) >= 32);

    // A request of more runs than run at once (each run is one export
    // operation): RUNS_PER_REQUEST of them run together.
    let long = (RUNS_PER_REQUEST + 1) * RUN_BYTES_MAX;
    f.disk.hold_until_together(0..long as u64, RUNS_PER_REQUEST as u64, limit);
    assert_eq!(r.call(0, CMD_WRITE, 0, long as u32, &vec![5u8; long]).0, 0);
    assert!(f.disk.hold_met(), "the runs of one write did not run together");
    assert_eq!(f.disk.read_range(0, long), vec![5u8; long]);

    // Out of order: a long read sent first, its last run paused, and a
    // short one after; the short one is answered first.
    f.disk.pause(RUNS_PER_REQUEST as u64 * RUN_BYTES_MAX as u64..long as u64);
    r.request(0, CMD_READ, 100, 0, long as u32, &[]);
    r.request(0, CMD_READ, 101, 0, 4096, &[]);
    assert_eq!(r.reply(), (0, 101));
    assert_eq!(r.read(4096), vec![5u8; 4096]);
    f.disk.resume();
    assert_eq!(r.reply(), (0, 100));
    assert_eq!(r.read(long), vec![5u8; long]);

    // A request of several runs reads them together too.
    let runs = RUNS_PER_REQUEST * RUN_BYTES_MAX;
    assert_eq!(r.call(0, CMD_WRITE, 0, runs as u32, &vec![6u8; runs]).0, 0);
    assert_eq!(f.disk.read_range(0, runs), vec![6u8; runs]);
    f.disk.hold_until_together(0..runs as u64, RUNS_PER_REQUEST as u64, limit);
    r.request(0, CMD_READ, 102, 0, runs as u32, &[]);
    assert_eq!(r.reply(), (0, 102));
    assert_eq!(r.read(runs), vec![6u8; runs]);
    assert!(f.disk.hold_met(), "the runs of one read did not run together");
}

#[test]
fn a_connection_admits_at_most_its_inflight_limit() {
    let f = Fixture::new();
    // The first requests wait until the limit's worth run at once.
    f.disk.hold_until_together(0..4096, INFLIGHT_MAX as u64, Duration::from_secs(30));
    let mut r = f.go(DISK, true);
    let n = INFLIGHT_MAX * 3;
    let mut b = Vec::new();
    for c in 0..n as u64 {
        b.extend_from_slice(
            &Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_TRIM, cookie: c, offset: 0, len: 4096 }.encode(),
        );
    }
    r.send(&b);
    let cookies: HashSet<u64> = (0..n).map(|_| r.reply()).map(|(e, c)| (assert_eq!(e, 0), c).1).collect();
    assert_eq!(cookies.len(), n);
    assert!(f.disk.hold_met(), "the connection never ran {INFLIGHT_MAX} requests at once");
    assert_eq!(f.server().stats().inflight_max.load(Relaxed), INFLIGHT_MAX as u64);
}

#[test]
fn disc_answers_outstanding_requests_then_closes() {
    let f = Fixture::new();
    f.disk.set_delay(Some(Duration::from_millis(50)));
    let mut r = f.go(DISK, true);
    let mut b = Vec::new();
    let data = pattern(6, 8192);
    b.extend_from_slice(
        &Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_WRITE, cookie: 1, offset: 0, len: 8192 }.encode(),
    );
    b.extend_from_slice(&data);
    b.extend_from_slice(
        &Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_FLUSH, cookie: 2, offset: 0, len: 0 }.encode(),
    );
    b.extend_from_slice(
        &Request { magic: REQUEST_MAGIC, flags: 0, kind: CMD_DISC, cookie: 3, offset: 0, len: 0 }.encode(),
    );
    r.send(&b);
    let mut got: Vec<u64> = (0..2).map(|_| r.reply()).map(|(e, c)| (assert_eq!(e, 0), c).1).collect();
    got.sort();
    assert_eq!(got, vec![1, 2]);
    assert!(r.closed());
    assert_eq!(f.disk.read_range(0, 8192), data);
}

#[test]
fn several_connections_see_each_others_writes() {
    let f = Fixture::new();
    let mut a = f.go(DISK, true);
    let mut b = f.go(DISK, true);
    let data = pattern(7, 12288);
    assert_eq!(a.write(8192, &data), 0);
    assert_eq!(b.read_at(8192, data.len() as u32), data);
    assert_eq!(b.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    assert_eq!(b.call(0, CMD_TRIM, 8192, 4096, &[]).0, 0);
    assert_eq!(a.read_at(8192, 4096), vec![0u8; 4096]);
}

#[test]
fn a_connection_over_the_limit_has_its_options_refused() {
    let f = Fixture::with(NbdConfig { threads: 1, max_connections: 1, ..NbdConfig::default() });
    let _first = f.go(DISK, true);
    let mut r = f.raw(FLAG_C_FIXED_NEWSTYLE);
    r.option(OPT_GO, &info_request(DISK, &[]));
    let (kind, msg) = r.option_reply(OPT_GO);
    assert_eq!(kind, REP_ERR_POLICY);
    assert_eq!(msg, b"too many connections");
    r.option(OPT_ABORT, &[]);
    assert_eq!(r.option_reply(OPT_ABORT).0, REP_ACK);
    assert!(r.closed());
    assert_eq!(f.server().stats().listener.rejected_connections.load(Relaxed), 1);
}

#[test]
fn shutdown_drains_connections() {
    let mut f = Fixture::new();
    let mut r = f.go(DISK, true);
    assert_eq!(r.write(0, &[1u8; 4096]), 0);
    let left = f.server.take().unwrap().shutdown();
    assert_eq!(left, 0);
    assert!(r.closed());
}

#[test]
fn the_registry_reports_the_counters() {
    let f = Fixture::new();
    let mut r = f.go(DISK, true);
    assert_eq!(r.write(0, &[1u8; 4096]), 0);
    r.read_at(0, 4096);
    let reg = f.server().stats().registry();
    let get = |n: &str| reg.get(n).map(|v| format!("{v:?}")).unwrap_or_else(|| panic!("{n} missing"));
    for n in ["curr_connections", "handshakes", "cmd_read", "cmd_write", "read_bytes", "written_bytes", "errors"] {
        get(n);
    }
    let mut text = String::new();
    reg.render_prometheus(&mut text);
    assert!(text.contains("granary_nbd_requests_total{command=\"write\"} 1"), "{text}");
}
