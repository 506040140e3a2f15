//! The parser on its own: every valid form of every command, and every
//! malformed line memcached tells apart by its reply. The replies are
//! memcached 1.6's (tests/server.rs checks the same lines against a real
//! memcached where one is installed).

use super::*;
use crate::limits::LINE_BYTES_MAX;

fn parsed(line: &[u8]) -> Parsed<'_> {
    parse(line)
}

fn req(line: &str) -> Request<'_> {
    match parse(line.as_bytes()).request {
        Ok(r) => r,
        Err(e) => panic!("{line:?} refused: {e:?}"),
    }
}

fn err(line: &str) -> ParseError {
    err_b(line.as_bytes())
}

fn err_b(line: &[u8]) -> ParseError {
    match parse(line).request {
        Ok(r) => panic!("{:?} accepted: {r:?}", String::from_utf8_lossy(line)),
        Err(e) => e,
    }
}

fn noreply(line: &str) -> bool {
    parse(line.as_bytes()).noreply
}

fn key(n: usize) -> String {
    "k".repeat(n)
}

fn meta<'r, 'a>(r: &'r Request<'a>) -> &'r Meta<'a> {
    match r {
        Request::Mg { m, .. } | Request::Ms { m, .. } | Request::Md { m, .. } | Request::Ma { m, .. } => m,
        r => panic!("not a meta request: {r:?}"),
    }
}

fn letters(r: &Request<'_>) -> Vec<u8> {
    meta(r).flags.0.iter().map(|f| f.c).collect()
}

// ---- framing and data blocks ----

#[test]
fn frame_splits_lines_at_crlf_or_lf() {
    assert_eq!(frame(b"get a\r\nget b\r\n"), Frame::Line(b"get a", 7));
    assert_eq!(frame(b"get a\nrest"), Frame::Line(b"get a", 6));
    assert_eq!(frame(b"\r\n"), Frame::Line(b"", 2));
    // Only one "\r" is the line end's.
    assert_eq!(frame(b"x\r\r\n"), Frame::Line(b"x\r", 4));
    assert_eq!(frame(b""), Frame::Incomplete);
    assert_eq!(frame(b"get a\r"), Frame::Incomplete);
}

#[test]
fn frame_from_looks_only_past_what_was_scanned() {
    let buf = b"get a\r\nget b\r\n";
    assert_eq!(frame_from(buf, 3), Frame::Line(b"get a", 7));
    // Told the first line's end was scanned, it finds the next one: the
    // caller's promise is what makes the skip right.
    assert_eq!(frame_from(buf, 7), Frame::Line(b"get a\r\nget b", 14));
    assert_eq!(frame_from(b"get a", 5), Frame::Incomplete);
    assert_eq!(frame_from(b"get a\r\n", 99), Frame::Incomplete, "scanned past the end: nothing left to look at");
    let long = vec![b'g'; LINE_BYTES_MAX + 1];
    assert_eq!(frame_from(&long, LINE_BYTES_MAX), Frame::TooLong);
}

#[test]
fn a_line_without_an_end_past_the_limit_is_too_long() {
    let mut buf = vec![b'g'; LINE_BYTES_MAX];
    assert_eq!(frame(&buf), Frame::Incomplete, "up to the limit: wait for the end");
    buf.push(b'g');
    assert_eq!(frame(&buf), Frame::TooLong);
    // A line end within the limit (and its "\r\n") is found.
    let mut ok = vec![b'g'; LINE_BYTES_MAX];
    ok.extend_from_slice(b"\r\n");
    assert!(matches!(frame(&ok), Frame::Line(l, n) if l.len() == LINE_BYTES_MAX && n == LINE_BYTES_MAX + 2));
    // One byte further, the line end is not looked for.
    let mut far = vec![b'g'; LINE_BYTES_MAX + 2];
    far.push(b'\n');
    assert_eq!(frame(&far), Frame::TooLong);
    assert_eq!(ParseError::LineTooLong.reply(), "CLIENT_ERROR line too long");
}

#[test]
fn a_data_block_must_end_in_crlf() {
    assert_eq!(value(b"abc\r\n"), Ok(&b"abc"[..]));
    assert_eq!(value(b"\r\n"), Ok(&b""[..]));
    assert_eq!(value(b"abcd\r"), Err(ParseError::BadDataChunk), "one byte too many");
    assert_eq!(value(b"ab\n\r"), Err(ParseError::BadDataChunk));
    assert_eq!(value(b"abcde"), Err(ParseError::BadDataChunk));
    assert_eq!(ParseError::BadDataChunk.reply(), "CLIENT_ERROR bad data chunk");
}

// ---- valid forms ----

#[test]
fn get_and_gets_take_one_or_more_keys() {
    assert_eq!(req("get a"), Request::Get { keys: vec![b"a"], cas: false, touch: None, bad_key: false });
    assert_eq!(
        req("gets a  b\tc c"),
        Request::Get { keys: vec![b"a", b"b\tc", b"c"], cas: true, touch: None, bad_key: false }
    );
    // Control bytes and tabs are key bytes; only spaces separate tokens.
    assert_eq!(
        req("get \x10\x10ctl\tkey"),
        Request::Get { keys: vec![b"\x10\x10ctl\tkey"], cas: false, touch: None, bad_key: false }
    );
    // noreply is only a key to get.
    let p = parsed(b"get a noreply");
    assert!(!p.noreply);
    assert_eq!(p.request, Ok(Request::Get { keys: vec![b"a", b"noreply"], cas: false, touch: None, bad_key: false }));
    let full = key(250);
    assert!(matches!(req(&format!("get {full}")), Request::Get { keys, bad_key: false, .. } if keys[0].len() == 250));
}

#[test]
fn gat_and_gats_take_an_exptime_then_keys() {
    assert_eq!(
        req("gat 100 a b"),
        Request::Get { keys: vec![b"a", b"b"], cas: false, touch: Some(100), bad_key: false }
    );
    assert_eq!(req("gats -1 a"), Request::Get { keys: vec![b"a"], cas: true, touch: Some(-1), bad_key: false });
    // An exptime and no key: memcached answers an empty result.
    assert_eq!(req("gat 10"), Request::Get { keys: vec![], cas: false, touch: Some(10), bad_key: false });
}

#[test]
fn storage_commands_parse_flags_exptime_length_and_cas() {
    let set = |kind, key, flags, exptime, len, cas| Request::Store { kind, key, flags, exptime, len, cas };
    assert_eq!(req("set a 5 0 3"), set(Storage::Set, &b"a"[..], 5, 0, 3, 0));
    assert_eq!(req("add a 0 100 0"), set(Storage::Add, &b"a"[..], 0, 100, 0, 0));
    assert_eq!(req("replace a 0 -1 1"), set(Storage::Replace, &b"a"[..], 0, -1, 1, 0));
    assert_eq!(req("append a 0 0 2"), set(Storage::Append, &b"a"[..], 0, 0, 2, 0));
    assert_eq!(req("prepend a 9 0 2"), set(Storage::Prepend, &b"a"[..], 9, 0, 2, 0));
    assert_eq!(req("cas a 0 0 1 77"), set(Storage::Cas, &b"a"[..], 0, 0, 1, 77));
    // Flags: an unsigned long of which 32 bits are kept.
    assert_eq!(req("set f 4294967295 0 1"), set(Storage::Set, &b"f"[..], u32::MAX, 0, 1, 0));
    assert_eq!(req("set f 4294967297 0 1"), set(Storage::Set, &b"f"[..], 1, 0, 1, 0));
    // The largest data length memcached takes.
    assert_eq!(req("set a 0 0 2147483645"), set(Storage::Set, &b"a"[..], 0, 0, 2147483645, 0));
    assert_eq!(req("set a 0 0 2147483645").data_len(), Some(2147483645));
    assert_eq!(req("set a 0 0 7 noreply").data_len(), Some(7));
    assert_eq!(req("get a").data_len(), None);
}

#[test]
fn noreply_applies_to_the_commands_that_take_it() {
    for line in [
        "set a 0 0 1 noreply",
        "add a 0 0 1 noreply",
        "replace a 0 0 1 noreply",
        "append a 0 0 1 noreply",
        "prepend a 0 0 1 noreply",
        "cas a 0 0 1 5 noreply",
        "delete a noreply",
        "incr a 1 noreply",
        "decr a 1 noreply",
        "touch a 1 noreply",
        "flush_all noreply",
        "flush_all 0 noreply",
        "verbosity 1 noreply",
    ] {
        assert!(noreply(line), "{line}");
        assert!(parse(line.as_bytes()).request.is_ok(), "{line}");
    }
    // One extra token that is not noreply is ignored (and is no noreply).
    assert!(!noreply("set x 0 0 1 norepl"));
    assert_eq!(req("set x 0 0 1 norepl").data_len(), Some(1));
    assert!(!noreply("get noreply"));
    assert!(!noreply("mg k noreply") && !noreply("stats noreply") && !noreply("version noreply"));
    // A line refused still has its noreply: memcached suppresses the error.
    let p = parsed(b"set f abc 0 1 noreply");
    assert!(p.noreply);
    assert_eq!(p.request, Err(ParseError::BadFormat));
    assert!(noreply("incr k noreply"), "the delta is noreply: suppressed InvalidDelta");
    assert_eq!(err("incr k noreply"), ParseError::InvalidDelta);
}

#[test]
fn delete_takes_a_key_an_optional_zero_and_noreply() {
    for line in ["delete a", "delete a 0", "delete a noreply", "delete a 0 noreply"] {
        assert_eq!(req(line), Request::Delete { key: b"a" }, "{line}");
    }
    // The key `noreply`, answered (memcached looks for noreply past the key).
    assert_eq!(req("delete noreply"), Request::Delete { key: b"noreply" });
    assert!(!noreply("delete noreply"));
    // A hold time other than 0: the usage error, suppressed by noreply.
    assert_eq!(err("delete a 1 noreply"), ParseError::DeleteUsage);
    assert!(noreply("delete a 1 noreply"));
}

/// A line with the wrong number of tokens is answered `ERROR` even when it
/// ends with `noreply`: memcached counts the tokens before it looks for it
/// (memcached 1.6.18 answers each of these `ERROR`; `cas k 0 0 1 noreply`
/// has its count, and its bad CAS value's error is suppressed).
#[test]
fn a_wrong_token_count_is_answered_despite_noreply() {
    for line in [
        "incr noreply",
        "touch noreply",
        "set k 0 noreply",
        "set k 0 0 1 x noreply",
        "flush_all 1 2 noreply",
        "verbosity 1 2 noreply",
        "delete k 0 2 noreply",
    ] {
        assert_eq!(err(line), ParseError::Error, "{line}");
        assert!(!noreply(line), "{line}: the ERROR is suppressed");
    }
    assert_eq!(err("cas k 0 0 1 noreply"), ParseError::BadFormat);
    assert!(noreply("cas k 0 0 1 noreply"), "its count holds: the bad CAS value's error is suppressed");
}

#[test]
fn incr_decr_touch_take_a_key_and_a_number() {
    assert_eq!(req("incr n 5"), Request::Arith { key: b"n", incr: true, delta: 5 });
    assert_eq!(req("decr n 18446744073709551615 noreply"), Request::Arith { key: b"n", incr: false, delta: u64::MAX });
    assert_eq!(req("touch a 100"), Request::Touch { key: b"a", exptime: 100 });
    assert_eq!(req("touch a -1 noreply"), Request::Touch { key: b"a", exptime: -1 });
}

#[test]
fn flush_all_takes_an_optional_delay() {
    assert_eq!(req("flush_all"), Request::FlushAll { delay: 0 });
    assert_eq!(req("flush_all 10"), Request::FlushAll { delay: 10 });
    assert_eq!(req("flush_all noreply"), Request::FlushAll { delay: 0 });
    assert_eq!(req("flush_all 0 noreply"), Request::FlushAll { delay: 0 });
    // A token after the delay is ignored.
    assert_eq!(req("flush_all 5 6"), Request::FlushAll { delay: 5 });
}

#[test]
fn version_verbosity_stats_quit_mn() {
    assert_eq!(req("version"), Request::Version);
    assert_eq!(req("version extra"), Request::Version);
    assert_eq!(req("quit"), Request::Quit);
    assert_eq!(req("mn"), Request::Mn);
    for line in ["verbosity 1", "verbosity 1 noreply", "verbosity noreply", "verbosity 1 2"] {
        assert_eq!(req(line), Request::Verbosity, "{line}");
    }
    assert_eq!(req("stats"), Request::Stats(StatsKind::General));
    assert_eq!(req("stats settings"), Request::Stats(StatsKind::Settings));
    assert_eq!(req("stats items"), Request::Stats(StatsKind::Items));
    assert_eq!(req("stats latency"), Request::Stats(StatsKind::Latency));
    assert_eq!(req("stats slabs"), Request::Stats(StatsKind::Slabs));
    assert_eq!(req("stats reset"), Request::Stats(StatsKind::Reset));
}

#[test]
fn the_command_token_is_kept_for_latency() {
    assert_eq!(parsed(b"set a 0 0 1").cmd, Some(&b"set"[..]));
    assert_eq!(parsed(b"bogus").cmd, Some(&b"bogus"[..]));
    assert_eq!(parsed(b"").cmd, None);
    assert_eq!(parsed(b"   ").cmd, None);
}

#[test]
fn mg_keeps_the_flags_it_uses_in_order_with_their_numbers() {
    let r = req("mg k v f s k O9 T30 N10 R5 E99 h l t c q u");
    assert_eq!(letters(&r), b"vfskOTNREhltcqu");
    let Request::Mg { new_cas, recache, ttl, vivify, .. } = r else { panic!() };
    assert_eq!((new_cas, recache, ttl, vivify), (Some(99), Some(5), Some(30), Some(10)));
    // Known letters mg has no use for are checked, then dropped.
    let r = req("mg k MS D5 J5 I C0 F7 P L v");
    assert_eq!(letters(&r), b"v");
    assert_eq!(meta(&r).raw_key, b"k");
    let Request::Mg { new_cas, recache, ttl, vivify, .. } = req("mg k") else { panic!() };
    assert_eq!((new_cas, recache, ttl, vivify), (None, None, None, None));
    assert_eq!(meta(&req("mg k O1234567890123456789012345678901")).flags.tok(b'O').map(<[u8]>::len), Some(31));
    // 17 flags are allowed.
    let seventeen = "mg k s t c f l h k u v q O1 T5 N5 R5 P L I";
    assert_eq!(meta(&req(seventeen)).flags.0.len(), 14);
}

#[test]
fn base64_keys_are_decoded_and_echoed_as_sent() {
    let r = req("mg Zm9v b v k");
    let m = meta(&r);
    assert_eq!((m.raw_key, &m.key[..]), (&b"Zm9v"[..], &b"foo"[..]));
    let r = req("ms Zm9v 2 b");
    assert_eq!(&meta(&r).key[..], b"foo");
    let r = req("md Zm9v b");
    assert_eq!(&meta(&r).key[..], b"foo");
}

#[test]
fn ms_takes_a_length_flags_and_a_mode() {
    let r = req("ms mk 2 T0 F3 c C7 E8 I k O1 q");
    assert_eq!(letters(&r), b"TFcCEIkOq");
    let Request::Ms { len, mode, user_flags, ttl, cas, new_cas, .. } = r else { panic!() };
    assert_eq!((len, mode, user_flags, ttl, cas, new_cas), (2, Ok(MsMode::Set), 3, Some(0), Some(7), Some(8)));
    for (m, want) in [
        ("MS", Ok(MsMode::Set)),
        ("ME", Ok(MsMode::Add)),
        ("MA", Ok(MsMode::Append)),
        ("MP", Ok(MsMode::Prepend)),
        ("MR", Ok(MsMode::Replace)),
        // memcached 1.6.18 takes upper case only, and one letter.
        ("Ms", Err(ParseError::InvalidMsMode)),
        ("Me", Err(ParseError::InvalidMsMode)),
        ("Mr", Err(ParseError::InvalidMsMode)),
    ] {
        let line = format!("ms k 1 {m}");
        assert!(matches!(req(&line), Request::Ms { mode, .. } if mode == want), "{line}");
    }
    assert_eq!(err("ms k 1 M"), ParseError::MTokenLength);
    assert_eq!(err("ms k 1 MSet"), ParseError::MTokenLength);
    // F keeps 32 bits of an unsigned long.
    assert!(matches!(req("ms f 1 F4294967297"), Request::Ms { user_flags: 1, .. }));
    // Letters ms has no use for (v, s, t, N, h, l, u, P, L) are dropped.
    assert_eq!(letters(&req("ms k 2 v s t N0 h l u P L")), b"");
    assert!(matches!(req("ms k 0"), Request::Ms { len: 0, .. }));
    // The data length counts as a flag: 16 more are allowed.
    let sixteen = "ms k 1 c C1 F1 I k O1 q T1 MS v s t N0 h l u";
    assert!(parse(sixteen.as_bytes()).request.is_ok());
}

#[test]
fn an_unknown_ms_mode_is_refused_after_the_data() {
    let p = parsed(b"ms k 2 MX");
    assert!(matches!(p.request, Ok(Request::Ms { len: 2, mode: Err(ParseError::InvalidMsMode), .. })));
    assert_eq!(ParseError::InvalidMsMode.reply(), "CLIENT_ERROR invalid mode for ms M token");
}

#[test]
fn md_and_ma_parse_their_flags() {
    let Request::Md { cas, ttl, .. } = req("md k C5 T30 I q k O1") else { panic!() };
    assert_eq!((cas, ttl), (Some(5), Some(30)));
    assert_eq!(letters(&req("md k C5 T30 I q k O1 v f")), b"CTIqkO");
    let r = req("ma k N0 J5 D10 T30 C3 E4 q v t c k O1");
    let Request::Ma { incr, delta, initial, vivify, ttl, cas, new_cas, .. } = r else { panic!() };
    assert_eq!(
        (incr, delta, initial, vivify, ttl, cas, new_cas),
        (true, Some(10), Some(5), Some(0), Some(30), Some(3), Some(4))
    );
    for (m, want) in [("MI", true), ("M+", true), ("MD", false), ("M-", false)] {
        let line = format!("ma k {m}");
        assert!(matches!(req(&line), Request::Ma { incr, .. } if incr == want), "{line}");
    }
    // memcached 1.6.18 takes upper case only; a token of other than one
    // character is a flag error.
    for (m, want) in [
        ("Mi", ParseError::InvalidMaMode),
        ("Md", ParseError::InvalidMaMode),
        ("M", ParseError::InvalidOrDuplicateFlag),
        ("MIncr", ParseError::InvalidOrDuplicateFlag),
    ] {
        let line = format!("ma k {m}");
        assert_eq!(err(&line), want, "{line}");
    }
    let Request::Ma { delta, initial, .. } = req("ma k") else { panic!() };
    assert_eq!((delta, initial), (None, None));
    assert_eq!(req("me k"), Request::Me { key: b"k" });
    assert_eq!(req("me k extra tokens"), Request::Me { key: b"k" });
}

// ---- malformed lines ----

#[test]
fn every_error_reply_is_memcached_s() {
    let table = [
        (ParseError::Error, "ERROR"),
        (ParseError::BadFormat, "CLIENT_ERROR bad command line format"),
        (ParseError::DeleteUsage, "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"),
        (ParseError::InvalidDelta, "CLIENT_ERROR invalid numeric delta argument"),
        (ParseError::InvalidExptime, "CLIENT_ERROR invalid exptime argument"),
        (ParseError::LineTooLong, "CLIENT_ERROR line too long"),
        (ParseError::BadDataChunk, "CLIENT_ERROR bad data chunk"),
        (ParseError::InvalidFlag, "CLIENT_ERROR invalid flag"),
        (ParseError::DuplicateFlag, "CLIENT_ERROR duplicate flag"),
        (ParseError::BadToken, "CLIENT_ERROR bad token in command line format"),
        (ParseError::MTokenLength, "CLIENT_ERROR incorrect length for M token"),
        (ParseError::InvalidInitial, "CLIENT_ERROR invalid numeric initial value"),
        (ParseError::InvalidDeltaValue, "CLIENT_ERROR invalid numeric delta value"),
        (ParseError::FlagsAreTooLong, "CLIENT_ERROR options flags are too long"),
        (ParseError::FlagsTooLong, "CLIENT_ERROR options flags too long"),
        (ParseError::OpaqueTooLong, "CLIENT_ERROR opaque token too long"),
        (ParseError::InvalidOrDuplicateFlag, "CLIENT_ERROR invalid or duplicate flag"),
        (ParseError::DecodingKey, "CLIENT_ERROR error decoding key"),
        (ParseError::InvalidMsMode, "CLIENT_ERROR invalid mode for ms M token"),
        (ParseError::InvalidMaMode, "CLIENT_ERROR invalid mode for ma M token"),
    ];
    for (e, want) in table {
        assert_eq!(e.reply(), want);
    }
}

#[test]
fn empty_and_unknown_lines_are_errors() {
    for line in ["", " ", "   ", "bogus", "GET a", "Set a 0 0 1", "get\0 a", "mnx", "stat"] {
        assert_eq!(err(line), ParseError::Error, "{line:?}");
    }
    assert_eq!(err_b(b"\xff\xfe"), ParseError::Error);
}

#[test]
fn get_without_keys_or_with_a_bad_exptime() {
    assert_eq!(err("get"), ParseError::Error);
    assert_eq!(err("gets"), ParseError::Error);
    assert_eq!(err("gets   "), ParseError::Error);
    assert_eq!(err("gat"), ParseError::Error);
    assert_eq!(err("gats"), ParseError::Error);
    assert_eq!(err("gat abc n"), ParseError::InvalidExptime);
    assert_eq!(err("gats abc"), ParseError::InvalidExptime);
    assert_eq!(err("gat 1.5 a"), ParseError::InvalidExptime);
}

#[test]
fn a_key_over_250_bytes_is_a_bad_command_line() {
    let long = key(251);
    // get answers the keys before it, then the error.
    assert_eq!(
        req(&format!("get a {long} b")),
        Request::Get { keys: vec![b"a"], cas: false, touch: None, bad_key: true }
    );
    assert_eq!(req(&format!("gat 1 {long}")), Request::Get { keys: vec![], cas: false, touch: Some(1), bad_key: true });
    for line in [
        format!("set {long} 0 0 1"),
        format!("cas {long} 0 0 1 1"),
        format!("delete {long}"),
        format!("incr {long} 1"),
        format!("touch {long} 1"),
        format!("mg {long} v"),
        format!("md {long}"),
        format!("ma {long}"),
        format!("me {long}"),
        // With b the raw key's length counts too.
        format!("mg {} b", "A".repeat(252)),
    ] {
        assert_eq!(err(&line), ParseError::BadFormat, "{}", &line[..10]);
    }
    // ms refuses the key before it reads the data length, so its data line
    // is not skipped (memcached's order: it is read as a command next).
    let p = parse(format!("ms {long} 2").as_bytes()).skip;
    assert_eq!(p, 0, "ms leaves its data line");
}

#[test]
fn storage_lines_with_bad_counts_or_numbers() {
    // Too few or too many tokens: ERROR.
    for line in ["set", "set a", "set a 0 0", "set a 0 0 1 noreply x", "cas a 0 0 1", "cas a 0 0 1 1 noreply x"] {
        assert_eq!(err(line), ParseError::Error, "{line}");
    }
    // A number that does not parse, a negative or too large length.
    for line in [
        "set f abc 0 1",
        "set f -1 0 1",
        "set f 18446744073709551616 0 1",
        "set f 0 abc 1",
        "set f 0 0 abc",
        "set f 0 0 -1",
        "set f 0 0 2147483646",
        "set f 0 0 99999999999999999999",
        "set f 0 0 1.0",
        "cas a 0 0 1 abc",
        "cas a 0 0 1 -1",
    ] {
        let p = parse(line.as_bytes());
        assert_eq!(p.request, Err(ParseError::BadFormat), "{line}");
        assert_eq!(p.skip, 0, "{line}: nothing is skipped (memcached reads the data as a command)");
    }
}

#[test]
fn delete_lines_with_bad_arguments() {
    assert_eq!(err("delete"), ParseError::Error);
    assert_eq!(err("delete a 1"), ParseError::DeleteUsage);
    assert_eq!(err("delete a 0 0"), ParseError::DeleteUsage);
    assert_eq!(err("delete a x noreply"), ParseError::DeleteUsage);
    // A delete of more tokens than memcached takes: ERROR, not suppressed.
    let p = parsed(b"delete a 0 0 noreply");
    assert_eq!((p.noreply, p.request), (false, Err(ParseError::Error)));
}

#[test]
fn arithmetic_and_touch_lines_with_bad_arguments() {
    // A fourth token is ignored, as memcached does; a fifth is an error.
    for line in ["incr", "incr n", "incr n 1 x y", "touch", "touch a", "touch a 1 2 3"] {
        assert_eq!(err(line), ParseError::Error, "{line}");
    }
    for line in ["incr n -1", "incr n abc", "decr n 18446744073709551616", "incr n 1.5"] {
        assert_eq!(err(line), ParseError::InvalidDelta, "{line}");
    }
    for line in ["touch a abc", "touch a 1.5", "touch a 99999999999999999999"] {
        assert_eq!(err(line), ParseError::InvalidExptime, "{line}");
    }
}

#[test]
fn flush_all_verbosity_and_stats_with_bad_arguments() {
    assert_eq!(err("flush_all abc"), ParseError::InvalidExptime);
    assert_eq!(err("flush_all noreply x"), ParseError::InvalidExptime);
    assert_eq!(err("flush_all 1 2 3"), ParseError::Error);
    assert_eq!(err("verbosity"), ParseError::Error);
    assert_eq!(err("verbosity 1 2 3"), ParseError::Error);
    assert_eq!(err("verbosity foo"), ParseError::BadFormat);
    assert_eq!(err("verbosity -1"), ParseError::BadFormat);
    for line in ["stats foo", "stats settings x", "lru_crawler", "lru_crawler metadump 1 2"] {
        assert_eq!(err(line), ParseError::Error, "{line}");
    }
    assert_eq!(err("stats cachedump 1"), ParseError::BadCommandLine);
    assert_eq!(err("stats cachedump 1 -1"), ParseError::BadFormat);
    assert_eq!(err("stats cachedump 64 0"), ParseError::IllegalSlabId);
    assert_eq!(err("stats detail"), ParseError::DetailUsage);
    assert_eq!(err("lru_crawler metadump 0"), ParseError::BadClass);
}

#[test]
fn meta_commands_without_a_key() {
    for line in ["mg", "ms", "md", "ma"] {
        assert_eq!(err(line), ParseError::Error, "{line}");
    }
    assert_eq!(err("me"), ParseError::BadFormat);
}

#[test]
fn meta_flags_are_checked_as_memcached_checks_them() {
    assert_eq!(err("mg x zz"), ParseError::InvalidFlag);
    assert_eq!(err("mg x x"), ParseError::InvalidFlag, "x came after memcached 1.6.18");
    assert_eq!(err("mg x S"), ParseError::InvalidFlag);
    assert_eq!(err("mg x v v"), ParseError::DuplicateFlag);
    assert_eq!(err("mg k MS MS"), ParseError::DuplicateFlag);
    assert_eq!(err_b(b"mg x \xc3"), ParseError::DuplicateFlag, "a byte past ASCII");
    assert_eq!(err_b(b"mg x \x7f"), ParseError::DuplicateFlag);
    assert_eq!(err("mg a Tabc"), ParseError::BadToken);
    for f in ["Nx", "Rx", "Cx", "Ex", "T", "C-1", "E1.5"] {
        assert_eq!(err(&format!("mg k {f}")), ParseError::BadToken, "{f}");
    }
    assert_eq!(err("mg k Fx"), ParseError::BadFormat);
    assert_eq!(err("mg k MSS"), ParseError::MTokenLength);
    assert_eq!(err("mg k M"), ParseError::MTokenLength);
    assert_eq!(err("mg k Jx"), ParseError::InvalidInitial);
    assert_eq!(err("mg k Dx"), ParseError::InvalidDeltaValue);
    // The last bad token wins; an unknown or repeated letter ends the check.
    assert_eq!(err("mg k Tx Dx"), ParseError::InvalidDeltaValue);
    assert_eq!(err("mg k Dx Tx"), ParseError::BadToken);
    assert_eq!(err("mg k Tx zz"), ParseError::InvalidFlag);
    assert_eq!(err("mg k Tx v v"), ParseError::DuplicateFlag);
    // Every meta command checks every letter's token, used or not.
    assert_eq!(err("ms k 1 Jx"), ParseError::InvalidInitial);
    assert_eq!(err("ms k 1 M"), ParseError::MTokenLength);
    assert_eq!(err("ms a 2 Fabc"), ParseError::BadFormat);
    assert_eq!(err("ms a 2 Cabc"), ParseError::BadToken);
}

#[test]
fn md_and_ma_answer_every_flag_error_with_one_message() {
    for line in [
        "md k Z",
        "md k x",
        "md k C1 C1",
        "md a Cabc",
        "md k Dx",
        "ma k q q",
        "ma k M",
        "ma k Jx",
        "ma k zz",
        // A base64 key that does not decode too.
        "md k b",
        "ma k b",
        "ma ==== b",
    ] {
        assert_eq!(err(line), ParseError::InvalidOrDuplicateFlag, "{line}");
    }
    assert_eq!(err("ma a MX"), ParseError::InvalidMaMode);
}

#[test]
fn mg_and_ms_refuse_an_undecodable_base64_key() {
    assert_eq!(err("mg b64 b"), ParseError::DecodingKey);
    assert_eq!(err("mg Zm9v! b"), ParseError::DecodingKey);
    let p = parsed(b"ms b64 2 b");
    assert_eq!((p.request, p.skip), (Err(ParseError::DecodingKey), 4));
}

#[test]
fn too_many_flags_and_long_opaque_tokens() {
    let eighteen = "mg k s t c f l h k u v q O1 T5 N5 R5 P L I F1";
    assert_eq!(err(eighteen), ParseError::FlagsAreTooLong);
    assert_eq!(err(&eighteen.replacen("mg", "md", 1)), ParseError::FlagsTooLong);
    assert_eq!(err(&eighteen.replacen("mg", "ma", 1)), ParseError::FlagsTooLong);
    // ms counts its data length; a flag error comes before the count.
    let ms = "ms k 1 c C1 F1 I k O1 q T1 MS v s t N0 h l u P";
    assert_eq!(parsed(ms.as_bytes()).request, Err(ParseError::FlagsTooLong));
    assert_eq!(parsed(ms.as_bytes()).skip, 3);
    assert_eq!(err(&format!("{ms} v")), ParseError::DuplicateFlag);
    // The count comes before the flags' check for mg, md and ma.
    assert_eq!(err(&format!("{eighteen} zz")), ParseError::FlagsAreTooLong);
    let opaque = "O12345678901234567890123456789012";
    for cmd in ["mg k", "md k", "ma k", "ms k 1"] {
        assert_eq!(err(&format!("{cmd} {opaque}")), ParseError::OpaqueTooLong, "{cmd}");
    }
    // A flag error comes before the opaque check.
    assert_eq!(err(&format!("mg k {opaque} Tx")), ParseError::BadToken);
}

#[test]
fn ms_refused_after_its_length_skips_its_data() {
    // Before the length is read: nothing to skip.
    for line in ["ms k", "ms x abc", "ms k -1", "ms k 2147483646"] {
        let p = parse(line.as_bytes());
        assert_eq!((p.request, p.skip), (Err(ParseError::BadFormat), 0), "{line}");
    }
    for (line, e, skip) in [
        ("ms k 2 v v", ParseError::DuplicateFlag, 4),
        ("ms k 3 zz", ParseError::InvalidFlag, 5),
        ("ms k 0 Tx", ParseError::BadToken, 2),
        ("ms k 1 O12345678901234567890123456789012", ParseError::OpaqueTooLong, 3),
    ] {
        let p = parse(line.as_bytes());
        assert_eq!((p.request, p.skip), (Err(e), skip), "{line}");
    }
}

#[test]
fn base64_round_trips_and_rejects_garbage() {
    for s in [&b"a"[..], b"ab", b"abc", b"abcd", b"\x00\xff\x10 key"] {
        assert_eq!(b64_decode(&b64_encode(s)).as_deref(), Some(s));
    }
    assert_eq!(b64_encode(b"foo"), b"Zm9v");
    assert_eq!(b64_encode(b"fo"), b"Zm8=");
    assert_eq!(b64_decode(b"Zm9v!"), None);
    assert_eq!(b64_decode(b"Zm=v"), None);
    assert_eq!(b64_decode(b"Zg=="), Some(b"f".to_vec()));
    assert_eq!(b64_decode(b""), None);
}
