//! Real crashes: run `granary load --ack` on a real file with O_DIRECT,
//! kill it with SIGKILL at a random moment (in three cycles of four, a
//! moment after its first acknowledged write; in the fourth, any moment
//! from its start, recovery included), reopen the store and check
//! every write the process acknowledged (printed on stdout only after the
//! write returned), for dozens of cycles. Background checkpoints run every
//! few milliseconds, so kills land before, during and after them; every
//! other cycle the checker closes the store cleanly (a clean checkpoint),
//! the others drop it (the next process recovers from a crash again).
//!
//! `GRANARY_KILL_SEED=S` reruns one sequence of kill moments;
//! `GRANARY_KILL_CYCLES=N` sets the cycles (default 30).

use granary_store::io::{OpenMode, SimRng};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{OpenOptions, Store};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: u64 = 3000;
const VALUE_BYTES: usize = 700;

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("GRANARY_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    let cycles: u64 = std::env::var("GRANARY_KILL_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    eprintln!("kill test seed {seed} (rerun: GRANARY_KILL_SEED={seed} cargo test -p granary-cli --test kill)");
    let mut rng = SimRng::new(seed);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("store.db");
    let p = path.to_str().unwrap();
    // Small segments so checkpoints, segment turnover and GC all happen.
    let st = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["create", p, "--size", "64M", "--segment-size", "1M", "--grain", "4096"])
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    // The last acknowledged round of each key.
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut round = 1u64;
    for cycle in 0..cycles {
        let mut child = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["load", p, "--ack", "--checkpoint-ms", "20"])
            .args(["--keys", &KEYS.to_string(), "--value-bytes", &VALUE_BYTES.to_string()])
            .args(["--rounds", "1000", "--first-round", &round.to_string()])
            .env_remove("GRANARY_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_ack, got_first) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut it = line.split(' ').map(|x| x.parse::<u64>().unwrap());
                acks.push((it.next().unwrap(), it.next().unwrap()));
                if acks.len() == 1 {
                    let _ = first_ack.send(());
                }
            }
            acks
        });
        // The kill moment: in most cycles after the first acknowledged
        // write (however long the start took), so that there are writes to
        // check; in the others from the start, so that kills also land in
        // the open and the recovery.
        if rng.below(4) != 0 {
            assert!(
                got_first.recv_timeout(Duration::from_secs(120)).is_ok(),
                "seed {seed} cycle {cycle}: granary load acknowledged nothing within 120 s"
            );
        }
        let wait = Duration::from_millis(5 + rng.below(400));
        let started = Instant::now();
        while started.elapsed() < wait {
            assert!(child.try_wait().unwrap().is_none(), "cycle {cycle}: granary load exited early");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acks = reader.join().unwrap();
        // Acks come in write order: at most the write after the last ack was in flight.
        let in_flight = match acks.last() {
            Some(&(r, i)) if i + 1 < KEYS => Some((r, i + 1)),
            Some(&(r, _)) => Some((r + 1, 0)),
            None => Some((round, 0)),
        };
        for &(r, i) in &acks {
            acked.insert(i, r);
        }
        let opts = OpenOptions { checkpoint_interval: None, ..OpenOptions::default() };
        let store = Store::open_path(&path, OpenMode::Direct, &opts)
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: reopen after SIGKILL: {e}"));
        for i in 0..KEYS {
            let got = store.get(&load_key(i)).unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: key {i}: {e}"));
            let want = acked.get(&i).map(|&r| load_value(i, r, VALUE_BYTES));
            let flying = in_flight.filter(|&(_, fi)| fi == i).map(|(r, _)| load_value(i, r, VALUE_BYTES));
            assert!(
                got == want || (flying.is_some() && got == flying),
                "seed {seed} cycle {cycle}: key {i} holds {:?}, acknowledged round {:?}",
                got.map(|v| String::from_utf8_lossy(&v[..16]).into_owned()),
                acked.get(&i)
            );
            // Whatever the in-flight write left is now the key's state.
            if let Some(v) = &got {
                if flying.as_ref() == Some(v) {
                    acked.insert(i, in_flight.unwrap().0);
                }
            }
        }
        let report = store.verify().unwrap();
        assert!(report.is_clean(), "seed {seed} cycle {cycle}: {:?}", report.errors);
        if cycle.is_multiple_of(2) {
            store.close().unwrap();
        } else {
            drop(store);
        }
        round = acks.last().map_or(round, |&(r, _)| r) + 2;
    }
}
