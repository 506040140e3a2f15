//! `granary-bench nbd`: fio's NBD engine against `granary serve`'s block
//! export and fio on a file, on tiny sizes. Needs fio with its NBD engine
//! (scripts/test.sh installs fio); skipped, with the reason, without it,
//! unless GRANARY_REQUIRE_PEERS is set.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_granary-bench")).arg("nbd").env_remove("GRANARY_LOG").args(args).output().unwrap()
}

/// Whether fio is on PATH with its NBD engine (`ioengine=nbd`, libnbd).
fn fio_with_nbd() -> bool {
    Command::new("fio")
        .arg("--enghelp=nbd")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("uri"))
}

#[test]
fn bench_nbd_refuses_what_it_cannot_run() {
    let refused = |args: &[&str]| {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused(&["--peers", "granary,qemu-nbd"]).contains("unknown peer \"qemu-nbd\""));
    assert!(refused(&["--jobs", "randread-4k"]).contains("bad job \"randread-4k\""));
    assert!(refused(&["--jobs", "trim-4k-qd1"]).contains("RW is read, write, randread or randwrite"));
    assert!(refused(&["--size", "10M"]).contains("--size must be a multiple of 1 MiB"));
    assert!(refused(&["--secs", "0"]).contains("--secs"));
}

/// Every job against Granary's export and the file, 0.5 s each on a
/// 64 MiB data set: the JSON has every job of both peers with IOPS, the
/// preconditioning pass, and Granary's index figures (one entry, or an
/// unsettled link, per written block).
#[test]
fn bench_nbd_runs_every_job_against_granary_and_the_file() {
    if !fio_with_nbd() {
        assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "fio with its NBD engine is required");
        eprintln!("skipped: needs fio with its NBD engine (apt-get install fio)");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("r.json");
    let out = bench(&[
        "--size",
        "64M",
        "--secs",
        "0.5",
        "--peers",
        "granary,file",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let jobs: Vec<&str> = v["jobs"].as_array().unwrap().iter().map(|j| j.as_str().unwrap()).collect();
    assert_eq!(
        jobs,
        ["randread-4k-qd1", "randread-4k-qd32", "read-1m-qd8", "randwrite-4k-qd1", "randwrite-4k-qd32", "write-1m-qd8"]
    );
    let peers = v["peers"].as_array().unwrap();
    assert_eq!(peers.iter().map(|p| p["peer"].as_str().unwrap()).collect::<Vec<_>>(), ["granary", "file"]);
    for p in peers {
        assert!(p["error"].is_null(), "{p}");
        assert_eq!(p["precondition"]["bytes"].as_u64(), Some(64 << 20), "the whole data set written once: {p}");
        let got: Vec<&str> = p["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap()).collect();
        assert_eq!(got, jobs, "{}", p["peer"]);
        for j in p["jobs"].as_array().unwrap() {
            assert!(j["iops"].as_f64().unwrap() > 0.0, "{}: {j}", p["peer"]);
            assert!(j["mb_per_sec"].as_f64().unwrap() > 0.0, "{}: {j}", p["peer"]);
            let (p50, p999) = (j["lat_us"]["p50"].as_f64().unwrap(), j["lat_us"]["p999"].as_f64().unwrap());
            assert!(p50 > 0.0 && p999 >= p50, "{}: {j}", p["peer"]);
        }
    }
    // Sequential jobs are compared with the file; random ones with nbdkit,
    // which this run left out.
    let g = &peers[0];
    let read_1m = &g["jobs"][2];
    assert_eq!(read_1m["ratio_to"], "file");
    assert!(read_1m["ratio"].as_f64().unwrap() > 0.0, "{read_1m}");
    assert!(g["jobs"][1]["ratio"].is_null(), "no nbdkit in this run");
    // The server's CPU over each job was measured.
    assert!(g["jobs"][0]["server_cpu_secs"].as_f64().is_some(), "{g}");
    let d = &g["dram"];
    assert_eq!(d["blocks_written"], 16384);
    assert_eq!(d["index_entries_per_written_block"].as_f64(), Some(1.0), "{d}");
    assert!(d["index_entries_before"].as_f64().unwrap() < 16.0, "nothing per unwritten block: {d}");
    assert!(d["index_bytes_after"].as_f64().unwrap() > d["index_bytes_before"].as_f64().unwrap(), "{d}");
    assert!(d["rss_after_kib"].as_u64().unwrap() > 0, "{d}");
    assert!(peers[1]["dram"].is_null());
    // The targets this run can check: the 1 MiB jobs against the file, and
    // the index's entries (no nbdkit: no 4 KiB targets).
    let targets: Vec<&str> = v["targets"].as_array().unwrap().iter().map(|t| t["what"].as_str().unwrap()).collect();
    assert!(targets.iter().any(|t| t.starts_with("read-1m-qd8: granary / file")), "{targets:?}");
    assert!(targets.iter().all(|t| !t.contains("nbdkit")), "{targets:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("randwrite-4k-qd32") && table.contains("targets"), "{table}");
    // The data files are removed afterwards; fio's reports stay.
    assert!(!dir.path().join("nbd-granary.db").exists() && !dir.path().join("nbd-file.dat").exists());
    assert!(dir.path().join("nbd-granary-write-1m-qd8.json").is_file());
}
