//! The NBD server against real clients on in-memory exports: libnbd's
//! Python bindings (negotiation, advertised sizes and flags, IO patterns,
//! unaligned IO, trim, zeroes, flush, errors, requests in flight, two
//! handles), QEMU's `qemu-io` (pattern checks), `nbdcopy` (a 64 MiB file
//! in and out over several connections), `nbdinfo`, and fio (verified
//! random writes 32 deep). Each test is
//! skipped, with the reason printed, when its tool is missing, unless
//! GRANARY_REQUIRE_PEERS is set; each runs its tool with a time limit.

mod common;

use common::*;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const TOOL_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn libnbd_python_client() {
    let Some(py) = python_nbd() else { return };
    let f = Fixture::new();
    // The script's 64 writes in flight are the only requests on 8..9 MiB:
    // the first one waits until a second runs beside it, so a server that
    // ran them one at a time fails here however fast the machine is.
    f.disk.hold_until_together(8 << 20..9 << 20, 2, TOOL_LIMIT / 4);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/libnbd_client.py");
    let out = run_ok(Command::new(py).arg(script).arg(f.port().to_string()), TOOL_LIMIT);
    assert!(out.contains("libnbd checks passed"), "{out}");
    let st = f.server().stats();
    assert!(f.disk.hold_met(), "libnbd's requests in flight together ran one at a time");
    assert!(st.inflight_max.load(Relaxed) > 1);
    assert_eq!(st.protocol_errors.load(Relaxed), 0);
}

#[test]
fn qemu_io_patterns() {
    let Some(qemu_io) = peer("qemu-io") else { return };
    let f = Fixture::new();
    let uri = f.uri(DISK);
    let cmds = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        // Unaligned: QEMU keeps to the 512-byte minimum itself.
        "write -P 0xcd 1000 3000",
        "read -P 0xcd 1000 3000",
        "read -P 0xab 0 1000",
        "read -P 0xab 4000 1044",
        "write -f -P 0x11 2M 64k",
        "read -P 0x11 2M 64k",
        "write -z 65536 65536",
        "read -P 0 65536 65536",
        "read -P 0xab 131072 65536",
        "discard 262144 65536",
        "flush",
        "read -P 0 4M 1M",
    ];
    let mut cmd = Command::new(qemu_io);
    cmd.args(["-f", "raw", &uri]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    let out = run_ok(&mut cmd, TOOL_LIMIT);
    assert!(!out.contains("fail"), "qemu-io reported a failure:\n{out}");
    assert_eq!(out.matches("read ").count(), 8, "{out}");
    assert_eq!(f.disk.read_range(1000, 3000), vec![0xcd; 3000]);
    assert_eq!(f.disk.read_range(65536, 65536), vec![0; 65536]);
}

#[test]
fn nbdcopy_a_file_in_and_out() {
    let Some(nbdcopy) = peer("nbdcopy") else { return };
    let f = Fixture::new();
    f.exports.add("big", 64 << 20, 4096);
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("in.img"), dir.path().join("out.img"));
    let data = pattern(42, 64 << 20);
    std::fs::write(&src, &data).unwrap();
    let uri = f.uri("big");
    run_ok(Command::new(&nbdcopy).arg("--flush").arg(&src).arg(&uri), TOOL_LIMIT);
    run_ok(Command::new(&nbdcopy).arg(&uri).arg(&dst), TOOL_LIMIT);
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the copy out differs from the copy in");
    let st = f.server().stats();
    assert!(st.listener.total_connections.load(Relaxed) >= 2);
    assert!(st.syncs.load(Relaxed) >= 1, "nbdcopy --flush sent no FLUSH");
    assert_eq!(st.errors.load(Relaxed), 0);
}

#[test]
fn nbdinfo_lists_and_describes_exports() {
    let Some(nbdinfo) = peer("nbdinfo") else { return };
    let f = Fixture::new();
    let list = run_ok(Command::new(&nbdinfo).arg("--list").arg(format!("nbd://127.0.0.1:{}", f.port())), TOOL_LIMIT);
    for want in ["export=\"disk\"", "export=\"small\"", "export-size: 16777216", "export-size: 1048576"] {
        assert!(list.contains(want), "{want} missing from nbdinfo --list:\n{list}");
    }
    let json = run_ok(Command::new(&nbdinfo).arg("--json").arg(f.uri(DISK)), TOOL_LIMIT);
    let flat: String = json.split_whitespace().collect();
    for want in [
        "\"export-size\":16777216",
        "\"block_size_minimum\":512",
        "\"block_size_preferred\":4096",
        "\"block_size_maximum\":33554432",
        "\"can_multi_conn\":true",
        "\"can_flush\":true",
        "\"can_fua\":true",
        "\"can_trim\":true",
        "\"can_zero\":true",
        "\"can_fast_zero\":true",
        "\"is_read_only\":false",
    ] {
        assert!(flat.contains(want), "{want} missing from nbdinfo --json:\n{json}");
    }
}

#[test]
fn fio_random_writes_verified_at_iodepth_32() {
    let Some(fio) = peer("fio") else { return };
    let f = Fixture::new();
    // fio's first requests wait until 16 of them run at once.
    f.disk.hold_until_together(0..DISK_BYTES, 16, TOOL_LIMIT / 4);
    let out = run_ok(
        Command::new(fio).args([
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={}", f.uri(DISK)),
            "--rw=randwrite",
            // Sector-aligned sizes: most writes cover partial blocks.
            "--bsrange=512-64k",
            "--iodepth=32",
            "--size=8M",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify state file left in the working directory.
            "--verify_state_save=0",
        ]),
        TOOL_LIMIT,
    );
    assert!(out.contains("err= 0"), "{out}");
    let st = f.server().stats();
    assert!(f.disk.hold_met(), "fio's queue ran {} deep", st.inflight_max.load(Relaxed));
    assert!(st.inflight_max.load(Relaxed) >= 16);
    assert!(st.partial_blocks.load(Relaxed) > 0);
    assert_eq!(st.errors.load(Relaxed), 0);
}
