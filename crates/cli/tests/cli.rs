//! The `granary` binary against real files with O_DIRECT: data round-trips
//! across processes, exit codes, one-line errors, corruption detection.

use granary_store::io::testdev::LoopDevice;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_granary"));
    c.env_remove("GRANARY_LOG");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run granary")
}

/// Run `granary-bench` (the benchmarks' binary).
fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_granary-bench")).env_remove("GRANARY_LOG").args(args).output().unwrap()
}

/// Run a short `granary-bench <cmd>` on `data` (64 MiB, 2000 keys, 0.1 s a
/// point, queue depths `depths`, then `extra`) with its JSON report in
/// `json`, which must succeed: its output and the report.
fn short_bench(cmd: &str, data: &Path, depths: &str, extra: &[&str], json: &Path) -> (Output, serde_json::Value) {
    let mut args = vec![cmd, "--path", data.to_str().unwrap(), "--size", "64M", "--keys", "2000", "--secs", "0.1"];
    args.extend(["--depths", depths]);
    args.extend_from_slice(extra);
    args.extend(["--json", json.to_str().unwrap()]);
    let o = bench(&args);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    (o, v)
}

/// The point of system `sys`, operation `op` and queue depth `depth` in a
/// bench report's points.
fn point<'a>(points: &'a [serde_json::Value], sys: &str, op: &str, depth: u64) -> &'a serde_json::Value {
    points
        .iter()
        .find(|p| p["system"] == sys && p["op"] == op && p["depth"] == depth)
        .unwrap_or_else(|| panic!("no point for {sys} {op} qd{depth}"))
}

fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child =
        bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The command may refuse the input before it read all of it (a value
    // longer than the store holds): its stdin is then closed.
    match child.stdin.take().unwrap().write_all(input) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.unwrap(),
    }
    child.wait_with_output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory on the target filesystem (ext4 here), not tmpfs.
fn workdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The value `granary stat` prints for figure `name` (`name  value` lines).
fn stat_value(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(name).filter(|rest| rest.starts_with(' ')).map(|rest| rest.trim().to_string()))
        .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
}

fn db(dir: &Path) -> PathBuf {
    dir.join("store.db")
}

/// An error is one line on stderr (the last; log warnings may precede it),
/// never a panic or a backtrace.
fn assert_one_line_error(o: &Output, contains: &str) {
    let e = stderr(o);
    assert_eq!(code(o), 2, "stderr: {e}");
    let program = |l: &str| l.starts_with("granary: ") || l.starts_with("granary-bench: ");
    let errors: Vec<&str> = e.lines().filter(|l| program(l)).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {e}");
    let last = e.trim_end().lines().last().unwrap();
    assert!(last.starts_with("granary: error: ") || last.starts_with("granary-bench: error: "), "{e}");
    assert!(!e.contains('\x1b'), "no terminal escapes when stderr is not a terminal: {e}");
    assert!(e.contains(contains), "expected {contains:?} in {e}");
    assert!(!e.contains("panicked") && !e.contains("backtrace"), "{e}");
}

#[test]
fn round_trip_across_processes_with_direct_io() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "64M"])), 0);
    assert_eq!(code(&run(&["put", p, "greeting", "hello"])), 0);
    let binary: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    assert_eq!(code(&run_stdin(&["put", p, "blob", "-"], &binary)), 0);
    assert_eq!(code(&run_stdin(&["put", p, "empty"], b"")), 0);
    // A value on stdin is read up to the store's device size, not whole:
    // an endless one is refused.
    let zero = bin()
        .args(["put", p, "endless"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_one_line_error(&zero, "the store's device is no larger");
    assert_eq!(code(&run(&["get", p, "endless"])), 1);
    // Each command's usage names what it takes.
    assert_one_line_error(&run(&["get", p]), "expected PATH KEY (or --server HOST:PORT KEY)");
    assert_one_line_error(&run(&["del", p]), "expected PATH KEY (or");
    assert_one_line_error(&run(&["put", p]), "expected PATH KEY [VALUE] (or");

    let o = run(&["get", p, "greeting"]);
    assert_eq!((code(&o), &o.stdout[..]), (0, &b"hello"[..]));
    let o = run(&["get", p, "blob"]);
    assert_eq!(code(&o), 0);
    assert_eq!(o.stdout, binary);
    let o = run(&["get", p, "empty"]);
    assert_eq!((code(&o), o.stdout.len()), (0, 0), "an empty value is present");

    let o = run(&["get", p, "missing"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("key not found: missing"));

    assert_eq!(code(&run(&["del", p, "greeting"])), 0);
    assert_eq!(code(&run(&["del", p, "greeting"])), 1);
    assert_eq!(code(&run(&["get", p, "greeting"])), 1);
    assert_eq!(code(&run(&["put", p, "blob", "x", "--mode", "add"])), 1);
    assert_eq!(code(&run(&["put", p, "greeting", "x", "--mode", "replace"])), 1);
    assert_eq!(code(&run(&["put", p, "greeting", "again", "--flush"])), 0);
    assert_eq!(run(&["get", p, "greeting"]).stdout, b"again");

    let o = run(&["stat", p]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0);
    assert!(out.contains("direct IO"), "{out}");
    assert_eq!(stat_value(&out, "keys"), "3", "{out}");
    let o = run(&["stat", p, "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\"keys\":3") && out.contains("\"tombstones\":0"), "{out}");

    let o = run(&["verify", p]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
}

/// A RAID-0 stripe set named as a comma-separated list: create, put, get
/// (members in another order), stat, verify; a lost member is an error
/// naming it, and `create` does not overwrite the survivors.
#[test]
fn stripe_set_by_comma_separated_path() {
    let dir = workdir();
    let m: Vec<String> = (0..2).map(|i| dir.path().join(format!("m{i}.db")).display().to_string()).collect();
    let set = m.join(",");
    let o = run(&["create", &set, "--size", "64M", "--stripe-size", "64K"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("RAID-0 of 2 members, 64 KiB stripes"));
    let big: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    assert_eq!(code(&run_stdin(&["put", &set, "big", "-"], &big)), 0);
    assert_eq!(code(&run(&["put", &set, "small", "v"])), 0);
    let reversed = format!("{},{}", m[1], m[0]);
    assert_eq!(run(&["get", &reversed, "big"]).stdout, big);
    assert_eq!(run(&["get", &reversed, "small"]).stdout, b"v");
    let o = run(&["stat", &set]);
    assert_eq!(stat_value(&String::from_utf8_lossy(&o.stdout), "keys"), "2");
    assert_eq!(code(&run(&["verify", &set])), 0);
    std::fs::remove_file(&m[1]).unwrap();
    assert_one_line_error(&run(&["get", &set, "small"]), "cannot open");
    assert_one_line_error(&run(&["create", &set, "--size", "64M"]), "missing while others exist");
    assert_one_line_error(&run(&["create", &format!("{},{}", m[0], m[0]), "--size", "64M"]), "named twice");
}

#[test]
fn key_and_value_limits_give_clear_errors() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "1M"])), 0);
    let max_key = "k".repeat(65536);
    assert_eq!(code(&run(&["put", p, &max_key, "v"])), 0);
    assert_eq!(run(&["get", p, &max_key]).stdout, b"v");
    let long_key = "k".repeat(65537);
    assert_one_line_error(&run(&["put", p, &long_key, "v"]), "keys must be 1 to 65536 bytes");
    // Over what a segment holds: the store's refusal; over the whole
    // device: refused before it is read whole.
    assert_one_line_error(&run_stdin(&["put", p, "huge"], &vec![0u8; 2 << 20]), "values up to");
    assert_one_line_error(&run_stdin(&["put", p, "huge"], &vec![0u8; 9 << 20]), "the store's device is no larger");
    assert_one_line_error(&run(&["put", p, "", "v"]), "key of 0 bytes");
}

#[test]
fn bad_input_gives_one_line_errors() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_one_line_error(&run(&["get", p, "k"]), "cannot open");
    assert_one_line_error(&run(&["create", p]), "a size is needed to create a store in a file");
    assert_one_line_error(&run(&["create", p, "--size", "1M"]), "fewer than two segments");
    assert!(!Path::new(p).exists(), "a failed create leaves no file behind");
    std::fs::write(p, vec![0u8; 1 << 20]).unwrap();
    assert_one_line_error(&run(&["get", p, "k"]), "not a usable Granary store");
    assert_one_line_error(&run(&["create", p, "--size", "8M"]), "exists and is not a Granary store");
    let one = dir.path().join("one.db").display().to_string();
    assert_one_line_error(&run(&["create", &one, "--size", "8M", "--stripe-size", "64K"]), "for a stripe set");
    assert!(!Path::new(&one).exists());
}

/// Inspections (`get`, `stat`, `verify`, `ns list`, `ns stat`, `export
/// list`) open the store for
/// reading only under a shared lock: they run while another reader holds
/// the file's lock shared (they took it exclusively and failed as "in
/// use"), and a writer is still kept out (and keeps them out).
#[test]
fn inspections_share_the_lock_and_writers_do_not() {
    use std::os::fd::AsRawFd;
    let dir = workdir();
    let path = db(dir.path());
    let p = path.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M"])), 0);
    assert_eq!(code(&run(&["put", p, "k", "v"])), 0);
    let flock = |how: i32| {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: flock on a descriptor this function owns.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), how | libc::LOCK_NB) }, 0);
        f
    };
    let reader = flock(libc::LOCK_SH);
    let o = run(&["get", p, "k"]);
    assert_eq!((code(&o), o.stdout.as_slice()), (0, &b"v"[..]), "{}", stderr(&o));
    for args in
        [&["stat", p][..], &["verify", p], &["ns", "list", p], &["ns", "stat", p, "default"], &["export", "list", p]]
    {
        let o = run(args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
    }
    assert_one_line_error(&run(&["put", p, "k", "w"]), "in use by another process");
    // Unlocked, not only closed: a child another test forks meanwhile
    // holds a copy of the descriptor until its exec, and with it the lock.
    let unlock = |f: std::fs::File| {
        // SAFETY: flock on a descriptor this function owns.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
    };
    unlock(reader);
    let writer = flock(libc::LOCK_EX);
    assert_one_line_error(&run(&["get", p, "k"]), "in use by another process");
    unlock(writer);
    assert_eq!(run(&["get", p, "k"]).stdout, b"v");
}

/// Flip one byte of a value in a closed segment of the file: `get` of that
/// key reports corruption (not a wrong value), `verify` fails, others work.
#[test]
fn corruption_in_the_file_is_detected() {
    let dir = workdir();
    let path = db(dir.path());
    let p = path.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "64K"])), 0);
    let marker = b"VICTIM-VALUE-0123456789";
    assert_eq!(code(&run(&["put", p, "victim", std::str::from_utf8(marker).unwrap()])), 0);
    // Fill a few segments so the victim is no longer in the newest ones.
    let filler = vec![b'f'; 30_000];
    for i in 0..8 {
        assert_eq!(code(&run_stdin(&["put", p, &format!("filler-{i}")], &filler)), 0);
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(marker.len()).position(|w| w == marker).expect("value on disk");
    bytes[at + 3] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let o = run(&["get", p, "victim"]);
    assert_one_line_error(&o, "corruption");
    assert!(o.stdout.is_empty(), "no value may be printed");
    let o = run(&["verify", p]);
    assert_eq!(code(&o), 1);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAILED") && out.contains("checksum"), "{out}");
    let o = run(&["get", p, "filler-3"]);
    assert_eq!(code(&o), 0);
    assert_eq!(o.stdout, filler);
}

/// A rotten superblock copy A: `verify` says so (not a failure: the store
/// reads copy B) and writes nothing; the next command that opens the store
/// for writing (`put`) rewrites it, and `verify` no longer lists it.
#[test]
fn verify_lists_a_bad_superblock_copy_and_a_write_mends_it() {
    let dir = workdir();
    let path = db(dir.path());
    let p = path.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M"])), 0);
    assert_eq!(code(&run(&["put", p, "k", "v"])), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let good = bytes[..4096].to_vec();
    bytes[20] ^= 0xff;
    let damaged = bytes[..4096].to_vec();
    std::fs::write(&path, &bytes).unwrap();
    let o = run(&["verify", p]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("superblock copy at offset 0") && out.contains("checksum"), "{out}");
    assert!(out.contains("ok: no problems found"), "{out}");
    assert_eq!(std::fs::read(&path).unwrap()[..4096], damaged[..], "verify wrote the copy");
    assert_eq!(code(&run(&["put", p, "k2", "v2"])), 0);
    assert_eq!(std::fs::read(&path).unwrap()[..4096], good[..], "not mended");
    let o = run(&["verify", p]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("superblock"), "{}", String::from_utf8_lossy(&o.stdout));
}

/// A command whose standard output has no reader (`| head` that has
/// stopped) ends quietly with the status a shell gives a process SIGPIPE
/// ended (141), not an internal error: here `serve --print-config` into a
/// pipe whose read end is already closed.
#[test]
fn a_closed_stdout_ends_the_command_quietly_with_141() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bin().args(["serve", "--print-config"]).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    assert_eq!(o.status.code(), Some(141), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stderr.is_empty(), "nothing said: {}", String::from_utf8_lossy(&o.stderr));
    // `get` writes its value itself: the same.
    let dir = workdir();
    let p = dir.path().join("s.db");
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "64M"])), 0);
    assert_eq!(code(&run(&["put", p, "k", "value"])), 0);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bin().args(["get", p, "k"]).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    assert_eq!(o.status.code(), Some(141), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stderr.is_empty(), "nothing said: {}", String::from_utf8_lossy(&o.stderr));
    // `load --ack` stops at the first acknowledgement nobody reads, and
    // closes the store: the write made is there, the rest never made.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bin().args(["load", p, "--keys", "100", "--ack"]).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    assert_eq!(o.status.code(), Some(141), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stderr.is_empty(), "nothing said: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(code(&run(&["get", p, "key-000000000000"])), 0);
    assert_eq!(code(&run(&["get", p, "key-000000000099"])), 1, "the load went on past its reader");
}

/// On a block device (a loop device over a file here), `create` writes
/// only over a blank head: `--if-absent` makes the store on a blank device
/// and opens it again after; without it, a device holding a store, or
/// anything else (a filesystem's bytes), is refused, left as it was.
/// Needs root and a free loop device; else skipped, saying why.
#[test]
fn create_on_a_block_device_writes_only_over_a_blank_head() {
    let dir = workdir();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
    let dev = match LoopDevice::attach(&backing) {
        Ok(d) => d,
        Err(why) => return eprintln!("create_on_a_block_device_writes_only_over_a_blank_head: skipped: {why}"),
    };
    let d = dev.node();
    // Blank: --if-absent makes the store, then opens it.
    let o = run(&["create", d, "--if-absent"]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(code(&run(&["put", d, "k", "on the device"])), 0);
    assert_eq!(code(&run(&["create", d, "--if-absent"])), 0, "an existing store is accepted");
    assert_eq!(run(&["get", d, "k"]).stdout, b"on the device");
    // Without --if-absent: refused, the store left as it was.
    assert_one_line_error(&run(&["create", d]), "already holds a Granary store");
    assert_eq!(run(&["get", d, "k"]).stdout, b"on the device");
    // Something else in its head (as a filesystem leaves its superblock,
    // here at 64 KiB as btrfs does): refused, with or without --if-absent
    // (it is no store to open).
    let other = dir.path().join("fs.img");
    // Only where btrfs keeps its superblock, 64 KiB in.
    let mut img = vec![0u8; 70_000];
    img[65_600..65_611].copy_from_slice(b"not a store");
    std::fs::write(&other, &img).unwrap();
    std::fs::OpenOptions::new().write(true).open(&other).unwrap().set_len(64 << 20).unwrap();
    let other = LoopDevice::attach(&other).unwrap();
    let o2 = other.node();
    assert_one_line_error(&run(&["create", o2]), "holds data");
    assert_ne!(code(&run(&["create", o2, "--if-absent"])), 0);
    let mut head = vec![0u8; 70_000];
    std::io::Read::read_exact(&mut std::fs::File::open(o2).unwrap(), &mut head).unwrap();
    assert_eq!(&head[65_600..65_611], b"not a store", "not overwritten");
}

/// A stripe set of two block devices too small for a store: the creation
/// fails after the set's labels were written, and takes them back (the
/// heads are blank again), so a retry fails for the same reason. Before,
/// the labels stayed and the retry said the set held no usable store.
/// Needs root and two free loop devices; else skipped, saying why.
#[test]
fn a_failed_create_on_block_devices_leaves_their_heads_blank() {
    let dir = workdir();
    let mut members = Vec::new();
    for name in ["a.img", "b.img"] {
        let backing = dir.path().join(name);
        // Room for the labels and a set, not for two segments after the
        // superblocks' megabyte.
        std::fs::File::create(&backing).unwrap().set_len(1536 << 10).unwrap();
        match LoopDevice::attach(&backing) {
            Ok(d) => members.push(d),
            Err(why) => return eprintln!("a_failed_create_on_block_devices_leaves_their_heads_blank: skipped: {why}"),
        }
    }
    let set = format!("{},{}", members[0].node(), members[1].node());
    for attempt in 0..2 {
        let o = run(&["create", &set, "--if-absent"]);
        assert_one_line_error(&o, "fewer than two segments");
        for m in &members {
            let mut head = vec![0u8; 1 << 20];
            std::io::Read::read_exact(&mut std::fs::File::open(m.node()).unwrap(), &mut head).unwrap();
            assert!(head.iter().all(|&b| b == 0), "attempt {attempt}: {} keeps what the creation wrote", m.node());
        }
    }
}

/// The README's first command works on a fresh directory, and again.
#[test]
fn create_makes_parent_directories_and_if_absent_is_repeatable() {
    let dir = workdir();
    let p = dir.path().join("granary-data/store.db");
    let p = p.to_str().unwrap();
    for _ in 0..2 {
        assert_eq!(code(&run(&["create", p, "--size", "64M", "--if-absent"])), 0);
        assert_eq!(code(&run(&["put", p, "hello", "world"])), 0);
        assert_eq!(run(&["get", p, "hello"]).stdout, b"world");
    }
    // A creation killed in its zero fill (the file still starts with the
    // unfinished mark, as `FileDevice::create` leaves it until the store is
    // written) is started over by --if-absent, and said so.
    let killed = dir.path().join("killed.db");
    let mut head = granary_store::io::file::UNFINISHED_MAGIC.to_vec();
    head.resize(4096, 0);
    std::fs::write(&killed, &head).unwrap();
    std::fs::OpenOptions::new().write(true).open(&killed).unwrap().set_len(64 << 20).unwrap();
    let k = killed.to_str().unwrap();
    assert_eq!(code(&run(&["get", k, "hello"])), 2, "not a store yet");
    // Without a size it is removed, and not said to be created again.
    let sizeless = dir.path().join("sizeless.db");
    std::fs::copy(&killed, &sizeless).unwrap();
    let o = run(&["create", sizeless.to_str().unwrap(), "--if-absent"]);
    assert_one_line_error(&o, "a size is needed");
    assert!(stderr(&o).contains("removed") && !stderr(&o).contains("creating it again"), "{}", stderr(&o));
    // Without --if-absent, create says what is there and leaves it.
    assert_one_line_error(&run(&["create", k, "--size", "64M"]), "was interrupted");
    assert_eq!(std::fs::read(&killed).unwrap()[..8], granary_store::io::file::UNFINISHED_MAGIC);
    let o = run(&["create", k, "--size", "64M", "--if-absent"]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("interrupted"), "{o:?}");
    assert_eq!(code(&run(&["put", k, "hello", "again"])), 0);
    // Options of a server connection are refused on a local store.
    assert_one_line_error(&run(&["get", k, "hello", "--token-file", "/dev/null"]), "only with --server");
    assert_one_line_error(&run(&["get", k, "hello", "--timeout-ms", "10"]), "--timeout-ms: only with --server");
    assert_one_line_error(&run(&["put", k, "hello", "x", "--tls-ca", "/dev/null"]), "only with --server");
    assert_eq!(run(&["get", k, "hello"]).stdout, b"again");
    assert_one_line_error(&run(&["create", k, "--size", "64M"]), "already holds a Granary store");
    assert_eq!(run(&["get", k, "hello"]).stdout, b"again", "left as it is");
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 1 << 20]).unwrap();
    assert_one_line_error(&run(&["create", junk.to_str().unwrap(), "--size", "8M"]), "is not a Granary store");
    assert_eq!(std::fs::read(&junk).unwrap(), vec![7u8; 1 << 20], "not overwritten");
    assert_one_line_error(
        &run(&["create", dir.path().to_str().unwrap(), "--size", "8M"]),
        "is not a regular file or a block device",
    );
    assert_one_line_error(
        &run(&["create", junk.to_str().unwrap(), "--size", "8M", "--if-absent"]),
        "not a usable Granary store",
    );
    // A FIFO is refused, not opened (which waits for a writer), also by
    // --if-absent's look for an interrupted creation and by serve's.
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = fifo.to_str().unwrap();
    let serve = ["serve", "--data", f, "--size", "8M", "-p", "0", "--no-native", "--no-resp"];
    for args in [&["create", f, "--size", "8M"][..], &["create", f, "--size", "8M", "--if-absent"], &serve] {
        let mut child = bin().args(args).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{args:?} of a FIFO still runs after 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_one_line_error(&child.wait_with_output().unwrap(), "a regular file");
    }
}

#[test]
fn version_and_help() {
    let o = run(&["--version"]);
    assert_eq!(code(&o), 0);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("granary "));
    let o = run(&["--help"]);
    for cmd in ["create", "put", "get", "del", "batch", "stat", "verify", "ns", "export"] {
        assert!(String::from_utf8_lossy(&o.stdout).contains(cmd));
    }
}

/// `granary-bench txn` runs end to end on small files (without the RocksDB
/// peer, whose library CI may lack): every batch point committed, the
/// namespace drop wrote one record and read none, and the sweep let go of
/// every key. Timings are printed, never asserted.
#[test]
fn bench_txn_runs_batches_and_a_namespace_drop() {
    let dir = workdir();
    let data = dir.path().join("bench/txn.db");
    let json = dir.path().join("txn.json");
    let d = data.to_str().unwrap();
    let args = ["txn", "--path", d, "--size", "64M", "--keys", "2000", "--secs", "0.1", "--batches", "1,4"];
    let o = bench(&[&args[..], &["--no-rocksdb", "--json", json.to_str().unwrap()]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let points = v["batches"].as_array().unwrap();
    for mode in ["flush batch", "direct batch"] {
        for batch in [1, 4] {
            let p = points
                .iter()
                .find(|p| p["mode"] == mode && p["batch"] == batch)
                .unwrap_or_else(|| panic!("{mode} {batch}"));
            assert!(p["commits"].as_u64().unwrap() > 0, "{p}");
        }
    }
    assert_eq!((v["drop_io"]["writes"].as_u64(), v["drop_io"]["reads"].as_u64()), (Some(1), Some(0)), "{v}");
    let (after, before) = (v["live_bytes_after_sweep"].as_u64().unwrap(), v["live_bytes_before"].as_u64().unwrap());
    assert!(after < before / 10, "{v}");
}

/// `granary-bench device` runs end to end on a small file (without fio, which
/// CI may lack) and reports every point with no failed operation; its JSON
/// names every backend and depth. Timings are printed, never asserted.
#[test]
fn bench_device_runs_every_backend_and_depth() {
    let dir = workdir();
    let data = dir.path().join("bench/dev.db");
    let json = dir.path().join("out.json");
    let (_, v) = short_bench("device", &data, "1,4", &["--no-fio"], &json);
    let points = v["points"].as_array().unwrap();
    for sys in ["granary-sync", "granary-uring", "granary-uring-zc"] {
        for op in ["get", "put"] {
            for depth in [1, 4] {
                let p = point(points, sys, op, depth);
                assert!(p["ops"].as_u64().unwrap() > 0);
                assert!(p["p50_us"].as_f64().unwrap() > 0.0, "{sys} {op} qd{depth}: no latencies recorded");
                assert_eq!(p["errors"], 0, "{sys} {op} qd{depth}");
            }
        }
    }
    // The store's device IO during each Granary point: a PUT overwrites a
    // loaded key, blindly (no read of the current record), and writes a group.
    for sys in ["granary-sync", "granary-uring", "granary-uring-zc"] {
        let p = point(points, sys, "put", 4);
        let io = &p["device_io"];
        assert!(io["reads_per_s"].as_f64().unwrap() >= 0.0 && io["writes_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(io["blind_overwrites_per_s"].as_f64().unwrap() > 0.0, "no overwrite was blind: {p}");
        assert!(io["write_kib"].as_f64().unwrap() >= 4.0, "a group write holds at least one 4 KiB record: {p}");
    }
    let mem: Vec<&str> =
        points.iter().filter(|p| p["system"] == "granary-mem").map(|p| p["op"].as_str().unwrap()).collect();
    assert_eq!(mem, ["get", "get_buf", "put", "put_buf"]);
    assert!(
        points.iter().filter(|p| p["system"] == "granary-mem").all(|p| p["p50_us"].as_f64().unwrap() > 0.0),
        "the in-memory points' sampled latencies are recorded"
    );
    // The in-memory device's own reads: the reference of its GET points.
    let reads = points.iter().find(|p| p["system"] == "mem-read").expect("a mem-read point");
    assert!(reads["ops"].as_u64().unwrap() > 0 && reads["p50_us"].as_f64().unwrap() > 0.0);
    for p in points.iter().filter(|p| p["system"] == "granary-mem") {
        let ratio = &p["ratio_to_mem_read"];
        if p["op"].as_str().unwrap().starts_with("get") {
            assert!(ratio.as_f64().unwrap() > 0.0, "{p}");
        } else {
            assert!(ratio.is_null(), "{p}");
        }
    }
    // The in-memory device on one executor, a task per GET in flight.
    for op in ["get", "get_buf"] {
        for depth in [1, 4] {
            let p = point(points, "granary-mem-rt", op, depth);
            assert!(p["ops"].as_u64().unwrap() > 0 && p["p50_us"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["ratio_to_mem_read"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["ratio_to_fio"].is_null(), "an in-memory point has no fio ratio: {p}");
        }
    }
    assert!(points.iter().all(|p| p["errors"] == 0), "no errors on any backend");
    assert_eq!(v["registered_buffers"], true);
    assert!(!data.exists(), "the bench removes its data file");
    let bad = bench(&["device", "--depths", "0"]);
    assert_one_line_error(&bad, "queue depths");
}

#[test]
fn bench_recovery_reports_clean_restart_and_scan() {
    let dir = workdir();
    let data = dir.path().join("rec.db");
    let json = dir.path().join("rec.json");
    let o = bench(&[
        "recovery",
        "--path",
        data.to_str().unwrap(),
        "--keys",
        "20000",
        "--no-fio",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["keys"], 20000);
    assert!(v["clean_restart_secs"].as_f64().unwrap() > 0.0);
    assert!(v["scan_bytes"].as_u64().unwrap() >= 20000 * 512, "{v}");
    assert!(v["fio_seq_read_mb_per_s"].is_null());
}

#[test]
fn load_leaves_a_clean_checkpoint_that_stat_reports() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "64M"])), 0);
    // A value the store could not take is refused before any is made
    // (8 GB were allocated for each write).
    let o = run(&["load", p, "--keys", "3000", "--value-bytes", "8000000000"]);
    assert_one_line_error(&o, "this store takes values up to");
    let o = run(&["load", p, "--keys", "3000", "--value-bytes", "50", "--rounds", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // It says what it did: writes, keys x rounds, bytes, rate.
    assert!(stderr(&o).contains("loaded 6000 writes (3000 keys x 2 rounds, 293.0 KiB of values)"), "{}", stderr(&o));
    let o = run(&["stat", p, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["recovery"]["clean_shutdown"], true, "{v}");
    assert_eq!(v["recovery"]["segments_scanned"], 0);
    let o = run(&["get", p, "key-000000002999"]);
    assert_eq!(o.stdout, granary_store::loadgen::load_value(2999, 2, 50));
    // The same answer from a full log scan.
    let o = run(&["stat", p, "--json", "--no-checkpoint"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["recovery"]["checkpoint_id"], 0);
    assert!(v["recovery"]["segments_scanned"].as_u64().unwrap() > 0);
}

#[test]
fn version_names_the_git_commit() {
    let o = run(&["--version"]);
    assert_eq!(code(&o), 0);
    let v = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(v.starts_with(&format!("granary {} (git ", env!("CARGO_PKG_VERSION"))), "{v}");
}

#[test]
fn bench_native_compares_the_protocol_with_the_embedded_engine() {
    let dir = workdir();
    let data = dir.path().join("bench/native.db");
    let json = dir.path().join("native.json");
    let (o, v) = short_bench("native", &data, "1,8", &[], &json);
    assert!(String::from_utf8_lossy(&o.stdout).contains("ratio"));
    let points = v["points"].as_array().unwrap();
    for op in ["get", "put"] {
        for depth in [1, 8] {
            for sys in ["embedded", "native"] {
                let p = point(points, sys, op, depth);
                assert!(p["ops"].as_u64().unwrap() > 0, "{p}");
                assert_eq!(p["errors"], 0, "{p}");
            }
            let n = point(points, "native", op, depth);
            assert!(n["ratio_to_embedded"].as_f64().unwrap() > 0.0);
        }
    }
    assert!(!data.exists(), "the bench file is removed");
}

/// A load that fails part-way (the store fills up) says so in one line,
/// after what it wrote, and closes the store: every key acknowledged
/// before the failure reads back. (The close tries a checkpoint; a full
/// store has no free segment for one, so the next open replays the log.)
#[test]
fn a_load_that_runs_out_of_space_says_so_and_keeps_what_it_wrote() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "16M", "--segment-size", "1M"])), 0);
    let o = run(&["load", p, "--keys", "100K", "--value-bytes", "4000", "--checkpoint-ms", "0"]);
    assert_one_line_error(&o, "no space");
    let written: u64 = stderr(&o).split("after ").nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap();
    assert!(written > 100, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&run(&["stat", p, "--json"]).stdout).unwrap();
    assert_eq!(v["keys"], written, "{v}");
    let last = format!("key-{:012}", written - 1);
    assert_eq!(run(&["get", p, &last]).stdout, granary_store::loadgen::load_value(written - 1, 1, 4000));
}

/// `--server` against something that is not a Granary native-protocol
/// server (here a fake that answers every hello with memcached's "ERROR"
/// and keeps the connection open): the error says so at once, instead of
/// waiting for the request timeout (set to a minute here).
#[test]
fn server_that_is_not_granary_is_named_at_once() {
    let l = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; 16];
        let _ = std::io::Read::read(&mut s, &mut hello);
        s.write_all(b"ERROR\r\n").unwrap();
        // Hold the connection until the client closes it.
        let _ = std::io::Read::read(&mut s, &mut hello);
    });
    let o = run(&["get", "--server", &addr, "--timeout-ms", "60000", "k"]);
    assert_one_line_error(&o, "is not a Granary native-protocol server");
    assert!(stderr(&o).contains("ERROR"), "{}", stderr(&o));
    fake.join().unwrap();
}

/// The cells of the `granary ns list` row of namespace `name` (columns are
/// two or more spaces apart; a cell holds single spaces at most).
fn ns_row(out: &str, name: &str) -> Option<Vec<String>> {
    out.lines()
        .skip(1)
        .map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect::<Vec<_>>())
        .find(|cells| cells[0] == name)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `granary ns` create, list, stat, truncate and drop on one store, and
/// `put`/`get`/`del --ns`: one key in three namespaces holds three values;
/// a truncate empties a namespace and keeps its options; a drop makes its
/// keys unreachable (exit 2, the engine's message); errors are one line.
#[test]
fn namespaces_create_list_stat_truncate_drop() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "1M"])), 0);
    let o =
        run(&["ns", "create", p, "users", "--mode", "store", "--ttl", "60", "--max-bytes", "1M", "--max-keys", "100"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "created namespace users (id 1): mode store, ttl 60s, max_bytes 1.0 MiB (1048576), max_keys 100\n"
    );
    let o = run(&["ns", "create", p, "sessions"]);
    assert_eq!(stdout(&o), "created namespace sessions (id 2): mode cache, ttl none, max_bytes none, max_keys none\n");
    assert_one_line_error(&run(&["ns", "create", p, "users"]), "namespace \"users\" exists already");
    assert_one_line_error(&run(&["ns", "create", p, "default"]), "namespace \"default\" exists already");
    assert_one_line_error(&run(&["ns", "create", p, "a b"]), "a name holds only ASCII letters");
    assert_one_line_error(&run(&["ns", "create", p, "x", "--max-keys", "0"]), "a limit is at least 1");
    assert_one_line_error(&run(&["ns", "create", p, "x", "--mode", "lru"]), "expected cache or store");

    // One key, three namespaces, three values.
    assert_eq!(code(&run(&["put", p, "k", "in default"])), 0);
    assert_eq!(code(&run(&["put", "--ns", "users", p, "k", "in users"])), 0);
    assert_eq!(code(&run_stdin(&["put", p, "k", "--ns", "sessions"], b"in sessions")), 0);
    assert_eq!(code(&run(&["put", "--ns", "users", p, "k2", "x"])), 0);
    assert_eq!(run(&["get", p, "k"]).stdout, b"in default");
    assert_eq!(run(&["get", "--ns", "default", p, "k"]).stdout, b"in default");
    assert_eq!(run(&["get", "--ns", "users", p, "k"]).stdout, b"in users");
    assert_eq!(run(&["get", "--ns", "sessions", p, "k"]).stdout, b"in sessions");
    assert_eq!(code(&run(&["get", p, "k2"])), 1, "k2 is only in users");
    assert_eq!(code(&run(&["get", "--ns", "sessions", p, "k2"])), 1);
    assert_eq!(code(&run(&["put", "--ns", "users", p, "k2", "y", "--mode", "add"])), 1);
    assert_eq!(code(&run(&["del", "--ns", "sessions", p, "k2"])), 1);
    assert_eq!(code(&run(&["put", "--ns", "sessions", p, "k2", "z"])), 0);
    assert_eq!(code(&run(&["del", "--ns", "sessions", p, "k2"])), 0);
    assert_eq!(run(&["get", "--ns", "users", p, "k2"]).stdout, b"x", "a delete in one namespace leaves the others");

    let o = run(&["ns", "list", p]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["name", "id", "kind", "mode", "keys", "value_bytes", "ttl", "max_bytes", "max_keys"], "{out}");
    let names: Vec<String> = out.lines().skip(1).map(|l| l.split(' ').next().unwrap().to_string()).collect();
    assert_eq!(names, ["default", "sessions", "users"], "default first:\n{out}");
    let users = ns_row(&out, "users").unwrap();
    assert_eq!(users[..5], ["users", "1", "kv", "store", "2"], "{out}");
    assert_eq!(users[6..], ["60s", "1.0 MiB (1048576)", "100"], "{out}");
    assert_eq!(ns_row(&out, "sessions").unwrap()[1..5], ["2", "kv", "cache", "1"], "{out}");
    let default = ns_row(&out, "default").unwrap();
    assert_eq!((default[2].as_str(), default[4].as_str()), ("kv", "1"), "{out}");

    let o = run(&["ns", "stat", p, "users"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    for (name, want) in [
        ("name", "users"),
        ("id", "1"),
        ("options.kind", "kv"),
        ("options.size_bytes", "0"),
        ("options.mode", "store"),
        ("options.default_ttl_secs", "60"),
        ("options.max_bytes", "1048576"),
        ("options.max_keys", "100"),
        ("keys", "2"),
    ] {
        assert_eq!(stat_value(&out, name), want, "{name}:\n{out}");
    }
    let value_bytes: u64 = stat_value(&out, "value_bytes").parse().unwrap();
    assert!(value_bytes >= 10, "{out}");
    assert!(users[5].ends_with(&format!("({value_bytes})")), "list and stat agree: {users:?}\n{out}");
    for name in ["gets", "hits", "misses", "sets", "deletes", "evictions", "expirations"] {
        assert_eq!(stat_value(&out, name), "0", "counts since this open:\n{out}");
    }
    let o = run(&["ns", "stat", p, "sessions", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["name"].as_str(), v["id"].as_u64(), v["keys"].as_u64()), (Some("sessions"), Some(2), Some(1)), "{v}");
    assert_eq!(v["options"]["mode"], "cache", "{v}");
    assert_eq!((&v["options"]["max_bytes"], &v["options"]["max_keys"]), (&0.into(), &0.into()), "0: none: {v}");

    // Truncate: empty, same name and options, a new id.
    let o = run(&["ns", "truncate", p, "users"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).starts_with("truncated namespace users (id 1 -> 3): 2 keys, "), "{}", stdout(&o));
    assert_eq!(code(&run(&["get", "--ns", "users", p, "k"])), 1);
    assert_eq!(code(&run(&["get", "--ns", "users", p, "k2"])), 1);
    let out = stdout(&run(&["ns", "list", p]));
    assert_eq!(
        ns_row(&out, "users").unwrap(),
        ["users", "3", "kv", "store", "0", "0 B (0)", "60s", "1.0 MiB (1048576)", "100"]
    );
    assert_eq!(run(&["get", "--ns", "sessions", p, "k"]).stdout, b"in sessions", "other namespaces keep theirs");
    assert_eq!(run(&["get", p, "k"]).stdout, b"in default");
    assert_eq!(code(&run(&["put", "--ns", "users", p, "k", "again"])), 0);
    assert_eq!(run(&["get", "--ns", "users", p, "k"]).stdout, b"again");

    // Drop: its keys are gone, and so is the name.
    let o = run(&["ns", "drop", p, "sessions"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).starts_with("dropped namespace sessions (id 2): 1 keys, "), "{}", stdout(&o));
    let gone = "no namespace \"sessions\"";
    assert_one_line_error(&run(&["get", "--ns", "sessions", p, "k"]), gone);
    assert_one_line_error(&run(&["put", "--ns", "sessions", p, "k", "v"]), gone);
    assert_one_line_error(&run(&["del", "--ns", "sessions", p, "k"]), gone);
    assert_one_line_error(&run(&["ns", "stat", p, "sessions"]), gone);
    assert_one_line_error(&run(&["ns", "drop", p, "sessions"]), gone);
    assert_one_line_error(&run(&["ns", "truncate", p, "sessions"]), gone);
    assert_one_line_error(&run(&["ns", "drop", p, "default"]), "the default namespace cannot be dropped");
    // A write that failed still closed the store: the next open loads its clean checkpoint.
    let v: serde_json::Value = serde_json::from_slice(&run(&["stat", p, "--json"]).stdout).unwrap();
    assert_eq!(
        (&v["recovery"]["clean_shutdown"], &v["recovery"]["segments_scanned"]),
        (&true.into(), &0.into()),
        "{v}"
    );
    let out = stdout(&run(&["ns", "list", p]));
    assert!(ns_row(&out, "sessions").is_none(), "{out}");
    assert_eq!(run(&["get", p, "k"]).stdout, b"in default");
    assert_eq!(run(&["get", "--ns", "users", p, "k"]).stdout, b"again");
    // A new namespace of the dropped name is empty.
    assert_eq!(
        stdout(&run(&["ns", "create", p, "sessions"])),
        "created namespace sessions (id 4): mode cache, ttl none, max_bytes none, max_keys none\n"
    );
    assert_eq!(code(&run(&["get", "--ns", "sessions", p, "k"])), 1);
    assert_eq!(code(&run(&["verify", p])), 0);
}

/// `--max-keys 1`: a second new key is refused (exit 2, the engine's
/// quota message) and not written; an overwrite of the first is not a new
/// key.
#[test]
fn namespace_key_quota_refuses_a_second_key() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "1M"])), 0);
    assert_eq!(code(&run(&["ns", "create", p, "one", "--max-keys", "1"])), 0);
    assert_eq!(code(&run(&["put", "--ns", "one", p, "a", "1"])), 0);
    assert_one_line_error(
        &run(&["put", "--ns", "one", p, "b", "2"]),
        "namespace \"one\" is full: the write would take it past its limit of 1",
    );
    assert_eq!(code(&run(&["get", "--ns", "one", p, "b"])), 1, "nothing was written");
    assert_eq!(code(&run(&["put", "--ns", "one", p, "a", "3"])), 0, "an overwrite adds no key");
    assert_eq!(run(&["get", "--ns", "one", p, "a"]).stdout, b"3");
    assert_eq!(code(&run(&["put", p, "b", "2"])), 0, "the default namespace has no limit");
}

/// `granary export` create, list and drop: an export's geometry is printed
/// and listed (with `ns list`'s kind column and `ns stat`'s options too);
/// its blocks are keys of its namespace (a batch's put of block 0 here;
/// other keys and partial blocks are refused);
/// bad sizes and block sizes, a name taken, and a drop of a plain
/// namespace are one-line errors, exit 2, that create or drop nothing.
#[test]
fn exports_create_list_drop() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "1M"])), 0);
    let o = run(&["export", "create", p, "disk", "--size", "1G"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "created export disk (id 1): size 1.0 GiB (1073741824), block size 4096, 262144 blocks\n");
    let o = run(&["export", "create", p, "small", "--size", "64K", "--block-size", "512"]);
    assert_eq!(stdout(&o), "created export small (id 2): size 64.0 KiB (65536), block size 512, 128 blocks\n");
    assert_eq!(code(&run(&["ns", "create", p, "users"])), 0);

    for (args, why) in [
        (&["--size", "1G", "--block-size", "3000"][..], "block size 3000: an export's block size is a power of two"),
        (&["--size", "1G", "--block-size", "128K"], "a power of two from 512 to 65536"),
        (&["--size", "1G", "--block-size", "256"], "a power of two from 512 to 65536"),
        (&["--size", "6000"], "size 6000: an export's size is a positive multiple of its block size 4096"),
    ] {
        let mut a = vec!["export", "create", p, "bad"];
        a.extend_from_slice(args);
        assert_one_line_error(&run(&a), why);
    }
    // Sizes that do not parse are refused by the argument parser (exit 2).
    for (args, why) in [
        (&["--size", "1G", "--block-size", "8G"][..], "block size \"8G\" is out of range"),
        (&["--size", "0"], "size \"0\" is out of range"),
        (&["--size", "12Q"], "unknown size unit"),
    ] {
        let mut a = vec!["export", "create", p, "bad"];
        a.extend_from_slice(args);
        let o = run(&a);
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(stderr(&o).contains(why), "{}", stderr(&o));
    }
    assert_one_line_error(&run(&["export", "create", p, "disk", "--size", "1M"]), "namespace \"disk\" exists already");
    assert_one_line_error(
        &run(&["export", "create", p, "users", "--size", "1M"]),
        "namespace \"users\" exists already",
    );
    assert_one_line_error(&run(&["export", "create", p, "a b", "--size", "1M"]), "a name holds only ASCII letters");

    // Block 0 of disk, written as its namespace's key; a key that is no
    // block's, or a partial block, is refused (the block server would not
    // see it, or read a partial block).
    let line = format!("put disk {} {}\n", "\\x00".repeat(8), "x".repeat(4096));
    let o = run_stdin(&["batch", p], line.as_bytes());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_one_line_error(&run_stdin(&["put", "--ns", "disk", p, "blockkey"], &[7u8; 4096]), "an export takes only");
    let line = format!("put disk {} x\n", "\\x00".repeat(8));
    assert_one_line_error(&run_stdin(&["batch", p], line.as_bytes()), "whole 4096-byte blocks");
    let o = run(&["export", "list", p]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["name", "size", "block_size", "blocks_written", "bytes"], "{out}");
    assert_eq!(out.lines().count(), 3, "the two exports, not users:\n{out}");
    let disk = ns_row(&out, "disk").unwrap();
    assert_eq!(disk[..4], ["disk", "1.0 GiB (1073741824)", "4096", "1"], "{out}");
    assert!(disk[4].contains(" KiB ("), "a block's record: {out}");
    assert_eq!(ns_row(&out, "small").unwrap()[1..4], ["64.0 KiB (65536)", "512", "0"], "{out}");
    let out = stdout(&run(&["ns", "list", p]));
    assert_eq!(ns_row(&out, "disk").unwrap()[1..5], ["1", "block", "store", "1"], "{out}");
    assert_eq!(ns_row(&out, "users").unwrap()[2], "kv", "{out}");
    let out = stdout(&run(&["ns", "stat", p, "small"]));
    for (name, want) in
        [("options.kind", "block"), ("options.size_bytes", "65536"), ("options.block_bytes", "512"), ("keys", "0")]
    {
        assert_eq!(stat_value(&out, name), want, "{name}:\n{out}");
    }

    assert_one_line_error(
        &run(&["export", "drop", p, "users"]),
        "namespace \"users\" is not an export (its kind is kv); drop it with `granary ns drop`",
    );
    assert_one_line_error(&run(&["export", "drop", p, "nope"]), "no namespace \"nope\"");
    let o = run(&["export", "drop", p, "disk"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).starts_with("dropped export disk (id 1): 1 blocks written, "), "{}", stdout(&o));
    let out = stdout(&run(&["export", "list", p]));
    assert!(ns_row(&out, "disk").is_none(), "{out}");
    assert!(ns_row(&out, "small").is_some(), "{out}");
    assert_eq!(code(&run(&["get", "--ns", "users", p, "k"])), 1, "users is still there");
    assert_eq!(code(&run(&["verify", p])), 0);
}

/// `--ns` with `--server` is passed on to the server (here none is
/// listening on port 1, so the connection fails), no longer refused.
#[test]
fn ns_with_server_goes_to_the_server() {
    for args in [
        &["get", "--server", "127.0.0.1:1", "--ns", "users", "k"][..],
        &["put", "--server", "127.0.0.1:1", "--ns", "users", "k", "v"],
        &["del", "--ns", "users", "--server", "127.0.0.1:1", "k"],
        &["batch", "--server", "127.0.0.1:1"],
    ] {
        assert_one_line_error(&run_stdin(args, b""), "cannot connect");
    }
}

/// `granary batch PATH`: the operations of stdin, over two namespaces and
/// the default one, commit together (`committed N`, exit 0), with the CAS
/// values a later `cas` line takes; a failed condition prints which
/// operation failed and why, exit 1, and applies nothing; a malformed line
/// is an error naming it (exit 2), nothing applied; so are a key twice and
/// a namespace that does not exist. Each run leaves a clean store.
#[test]
fn batch_commits_atomically_on_a_local_store() {
    let dir = workdir();
    let p = db(dir.path());
    let p = p.to_str().unwrap();
    assert_eq!(code(&run(&["create", p, "--size", "8M", "--segment-size", "1M"])), 0);
    assert_eq!(code(&run(&["ns", "create", p, "users"])), 0);
    assert_eq!(code(&run(&["ns", "create", p, "carts"])), 0);
    assert_eq!(code(&run(&["put", p, "old", "x"])), 0);
    let get = |ns: &str, k: &str| {
        let o = run(&["get", "--ns", ns, p, k]);
        (code(&o) == 0).then_some(o.stdout)
    };

    let input = b"# users and carts, together\n\
        put users alice \"Alice Liddell\"\n\
        \n\
        put-absent carts alice \\x00\\xffcart\n\
        put default k\\x20sp \"\"\n\
        del default old\n";
    let o = run_stdin(&["batch", p, "--print-cas"], input);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "committed 4", "{out}");
    let cas: Vec<u64> = lines[1..].iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(cas.len(), 4, "{out}");
    assert!(cas[..3].iter().all(|&c| c > 0) && cas[3] == 0, "{out}");
    assert_eq!(get("users", "alice").unwrap(), b"Alice Liddell");
    assert_eq!(get("carts", "alice").unwrap(), b"\0\xffcart");
    assert_eq!(get("default", "k sp").unwrap(), b"");
    assert_eq!(get("default", "old"), None);

    // A cas with the CAS value printed commits; with it again, it fails.
    let line = format!("cas users alice {} Alice\nput default k2 v\n", cas[0]);
    let o = run_stdin(&["batch", p], line.as_bytes());
    assert_eq!((code(&o), stdout(&o).as_str()), (0, "committed 2\n"), "{}", stderr(&o));
    assert_eq!(get("users", "alice").unwrap(), b"Alice");
    let o = run_stdin(&["batch", p], format!("put default k3 v\ncas users alice {} stale\n", cas[0]).as_bytes());
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(stdout(&o), "condition failed: op 2 (cas users alice, line 2): exists with another CAS value\n");
    assert_eq!(get("default", "k3"), None, "nothing applied");

    // A failed condition: nothing applied, the operation named.
    let input = b"put users bob b\nput carts bob c\n# the third operation:\nput-absent users alice again\n";
    let o = run_stdin(&["batch", p], input);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(stdout(&o), "condition failed: op 3 (put-absent users alice, line 4): exists\n");
    let o = run_stdin(&["batch", p], b"put users bob b\nput-present carts nobody x\n");
    assert_eq!(code(&o), 1);
    assert_eq!(stdout(&o), "condition failed: op 2 (put-present carts nobody, line 2): not found\n");
    assert_eq!((get("users", "bob"), get("carts", "bob")), (None, None), "nothing applied");
    assert_eq!(get("users", "alice").unwrap(), b"Alice");

    // Errors, exit 2, nothing applied: a malformed line (named), a key
    // twice, a namespace that does not exist, an unknown operation.
    let o = run_stdin(&["batch", p], b"put users bob b\n\nput carts bob\n");
    assert_one_line_error(&o, "line 3: put takes NS KEY VALUE (3 fields), found 2");
    let o = run_stdin(&["batch", p], b"put users bob b\nput users bob \"c\n");
    assert_one_line_error(&o, "line 2: a quoted field is not closed");
    let o = run_stdin(&["batch", p], b"put users bob b\ndel users bob\n");
    assert_one_line_error(&o, "line 2: key bob of namespace users appears twice (line 1 too)");
    let o = run_stdin(&["batch", p], b"put users bob b\nput nope bob b\n");
    assert_one_line_error(&o, "line 2: no namespace \"nope\"");
    let o = run_stdin(&["batch", p], b"put users bob b\nincr users n 1\n");
    assert_one_line_error(&o, "line 2: unknown operation \"incr\"");
    assert_eq!(get("users", "bob"), None, "nothing applied");
    // Usage: PATH or --server; --flush is local.
    assert_one_line_error(&run_stdin(&["batch"], b""), "expected PATH (or --server HOST:PORT)");
    assert_one_line_error(&run_stdin(&["batch", p, "--server", "127.0.0.1:1"], b""), "not both");
    assert_one_line_error(&run_stdin(&["batch", "--server", "127.0.0.1:1", "--flush"], b""), "local store");
    // Nothing to do is a batch of none.
    let o = run_stdin(&["batch", p, "--flush"], b"# nothing\n");
    assert_eq!((code(&o), stdout(&o).as_str()), (0, "committed 0\n"));

    // Every run closed the store: the next open loads a clean checkpoint.
    let v: serde_json::Value = serde_json::from_slice(&run(&["stat", p, "--json"]).stdout).unwrap();
    assert_eq!(
        (&v["recovery"]["clean_shutdown"], &v["recovery"]["segments_scanned"]),
        (&true.into(), &0.into()),
        "{v}"
    );
    assert_eq!(code(&run(&["verify", p])), 0);
}

/// `granary rekey` on the committed store written before secret key hash
/// seeds: it reports the re-key, every key reads back, `verify` passes,
/// and a second run changes nothing; on a store created now it changes
/// nothing either.
#[test]
fn rekey_gives_an_old_store_a_secret_seed_once() {
    let dir = workdir();
    let p = dir.path().join("old.data");
    let text = include_str!("../../store/tests/fixtures/v1-store.hex");
    let size: usize = text.lines().find_map(|l| l.strip_prefix("# size ")).unwrap().parse().unwrap();
    let mut bytes = vec![0u8; size];
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (off, hex) = line.split_once(' ').unwrap();
        let off: usize = off.parse().unwrap();
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            bytes[off + i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap();
        }
    }
    std::fs::write(&p, &bytes).unwrap();
    let p = p.to_str().unwrap();
    let o = run(&["rekey", p]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0, "{out}{}", stderr(&o));
    assert!(out.contains("has a secret seed now") && out.contains("(41 keys)"), "{out}");
    assert_eq!(run(&["get", p, "plain"]).stdout, b"hello");
    assert_eq!(code(&run(&["verify", p])), 0);
    let o = run(&["rekey", p]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("already"), "{}", String::from_utf8_lossy(&o.stdout));
    let new = dir.path().join("new.data");
    let new = new.to_str().unwrap();
    assert_eq!(code(&run(&["create", new, "--size", "64M"])), 0);
    let o = run(&["rekey", new]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("already"), "{}", String::from_utf8_lossy(&o.stdout));
}
