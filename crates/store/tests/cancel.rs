//! Writes whose futures are dropped midway (a caller's timeout): the write
//! runs to its end anyway (its group written, its segment released after),
//! a batch commits or not as a whole, no member of a group is failed for
//! its leader's sake, and nothing leaks: a store holding a few keys takes
//! hundreds of dropped writes without running out of room.
//!
//! The device holds each async write while its gate is shut, as a slow
//! device would: the dropped futures are dropped with their IO in flight.
//! Runs on the backend `GRANARY_TEST_BACKEND` picks (the gate in front).
//! Not `granary_io::InjectDevice`'s hang, which holds reads and the
//! synchronous calls too: here reads go on while writes wait, and the gate
//! counts each poll of a held write and names the thread that completes
//! it, which tell where a dropped write went on.

mod common;

use common::gate::{poll_once, Gate};
use granary_rt::{timeout, Runtime, RuntimeConfig};
use granary_store::io::TestBackend;
use granary_store::{CreateOptions, Entropy, Error, OpenOptions, Store};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEGMENT: u64 = 64 << 10;

/// A 4 MiB store of 64 KiB segments (48 of them for records).
fn store(gate: &Arc<Gate>) -> Store {
    store_with(gate, opts())
}

fn store_with(gate: &Arc<Gate>, opts: OpenOptions) -> Store {
    let co = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(SEGMENT), index_table_homes: Some(256) };
    Store::create(gate.clone(), &co, &opts).unwrap()
}

fn opts() -> OpenOptions {
    OpenOptions { entropy: Entropy::seeded(5), ..Default::default() }
}

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap()
}

/// A store (opened with `opts`) on a gated device; `body` runs with both
/// on a one-executor runtime, then the store is closed (waiting for the
/// writes handed to that runtime) before the runtime goes. The device is
/// handed back.
fn on_a_runtime<Fut>(opts: OpenOptions, body: impl FnOnce(Arc<Store>, Arc<Gate>) -> Fut) -> Arc<Gate>
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let gate = Gate::new(4 << 20, SEGMENT);
    let s = Arc::new(store_with(&gate, opts));
    let rt = runtime();
    rt.block_on(body(s.clone(), gate.clone())).unwrap();
    Arc::into_inner(s).unwrap().close().unwrap();
    drop(rt);
    gate
}

/// Wait on this thread until `done` holds; fail, saying `what` did not
/// happen, after 20 s.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::yield_now();
    }
}

/// Yield to the executor until `key` holds `want`, for at most 20 s.
async fn until_holds(s: &Store, key: &[u8], want: &[u8]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if s.get_async(key).await.unwrap().as_deref() == Some(want) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        granary_rt::yield_now().await;
    }
}

fn value(round: u32) -> Vec<u8> {
    vec![round as u8; 4000]
}

/// 20 keys of 4 KB rewritten after each dropped write: each round fills
/// more than a segment, so a segment a dropped write kept would never be
/// reclaimed, and 48 such would leave no room.
async fn rewrite(s: &Store, round: u32) {
    for k in 0..20u32 {
        if let Err(e) = s.put_async(&k.to_le_bytes(), &value(round)).await {
            let st = s.stats();
            panic!("round {round}: {e} (free segments {}, GC victims {})", st.segments_free, st.gc.victims);
        }
    }
}

#[test]
fn a_dropped_write_still_ends_and_its_segment_is_reclaimed() {
    dropped_writes(opts());
}

/// The same without write coalescing (each write its own IO; the zoned
/// backend coalesces regardless).
#[test]
fn a_dropped_write_of_its_own_still_ends_and_its_segment_is_reclaimed() {
    dropped_writes(OpenOptions { coalesce_writes: false, ..opts() });
}

fn dropped_writes(opts: OpenOptions) {
    let gate = on_a_runtime(opts.clone(), |s, gate| async move {
        s.put_async(b"a", b"first").await.unwrap();
        // Rounds whose write reached the device before its future was
        // dropped: on a loaded machine the millisecond can pass while the
        // write still waits for the key (the previous round's dropped write
        // may not have let it go yet), and such a write is never made.
        let mut reached = 0;
        for round in 0..200u32 {
            gate.shut();
            let written = gate.completed_on.lock().unwrap().len();
            let polls = gate.held_polls.load(SeqCst);
            let r = timeout(Duration::from_millis(1), s.put_async(b"a", &round.to_le_bytes())).await;
            assert!(r.is_err(), "round {round}: the write was held by the gate");
            gate.open();
            if gate.held_polls.load(SeqCst) > polls {
                reached += 1;
                // The dropped write ends on its own (a task of the executor).
                let deadline = Instant::now() + Duration::from_secs(20);
                while gate.completed_on.lock().unwrap().len() == written {
                    assert!(Instant::now() < deadline, "round {round}: the dropped write never ended");
                    granary_rt::yield_now().await;
                }
            }
            rewrite(&s, round).await;
            // The dropped write was never applied to the running store.
            assert_eq!(s.get_async(b"a").await.unwrap().as_deref(), Some(&b"first"[..]), "round {round}");
        }
        assert!(reached >= 100, "only {reached} of 200 dropped writes reached the device");
        assert!(s.stats().gc.victims > 0);
    });
    let s = Store::open(gate, &opts).unwrap();
    // Recovery may find a dropped write's record: its outcome was unknown.
    assert!(s.get(b"a").unwrap().is_some());
    assert_eq!(s.get(&7u32.to_le_bytes()).unwrap().unwrap(), value(199));
}

/// A group's leader waits for the write ahead of it (held at the gate); a
/// second writer joins its group. One of the two futures is dropped.
fn leader_and_member(drop_leader: bool) {
    on_a_runtime(opts(), |s, gate| async move {
        for round in 0..120u32 {
            gate.shut();
            let v = round.to_le_bytes();
            let mut ahead = Box::pin(s.put_async(b"ahead", b"x"));
            poll_once(ahead.as_mut()).await;
            let mut leader = Box::pin(s.put_async(b"leader", &v));
            poll_once(leader.as_mut()).await;
            let mut member = Box::pin(s.put_async(b"member", &v));
            poll_once(member.as_mut()).await;
            let kept = if drop_leader {
                drop(leader);
                member
            } else {
                drop(member);
                leader
            };
            gate.open();
            ahead.await.unwrap();
            // Not failed for the dropped one's sake (which would poison
            // the store).
            kept.await.unwrap_or_else(|e| panic!("round {round}: {e}"));
            rewrite(&s, round).await;
        }
        let kept: &[u8] = if drop_leader { b"member" } else { b"leader" };
        assert_eq!(s.get_async(kept).await.unwrap().unwrap(), 119u32.to_le_bytes());
    });
}

#[test]
fn a_group_whose_leader_is_dropped_is_written_for_its_member() {
    leader_and_member(true);
}

#[test]
fn a_member_dropped_from_a_group_is_released_after_its_write() {
    leader_and_member(false);
}

#[test]
fn a_dropped_batch_commits_as_a_whole() {
    on_a_runtime(opts(), |s, gate| async move {
        let ns = s.namespace("default").unwrap();
        for round in 0..60u32 {
            let mut b = s.batch();
            b.put(&ns, b"x", &round.to_le_bytes()).put(&ns, b"y", &round.to_le_bytes());
            gate.shut();
            assert!(timeout(Duration::from_millis(1), b.commit_async()).await.is_err());
            gate.open();
            let want = round.to_le_bytes();
            assert!(until_holds(&s, b"x", &want).await, "round {round}: the dropped batch did not commit");
            assert_eq!(s.get_async(b"y").await.unwrap().unwrap(), want, "round {round}: half a batch");
            rewrite(&s, round).await;
        }
    });
}

/// Drop `change` held at the shut gate by a 1 ms timeout, then open the
/// gate and yield until its held write completed.
async fn drop_held<F: Future>(gate: &Gate, what: &str, change: F) {
    gate.completed_on.lock().unwrap().clear();
    gate.shut();
    assert!(timeout(Duration::from_millis(1), change).await.is_err(), "the {what} was held");
    gate.open();
    let deadline = Instant::now() + Duration::from_secs(20);
    while gate.completed_on.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the {what}'s held write never ended");
        granary_rt::yield_now().await;
    }
}

/// Yield until `done`, for at most 20 s (failing, saying `what` did not
/// happen).
async fn until<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(Instant::now() < deadline, "{what}");
        granary_rt::yield_now().await;
    }
}

/// A catalog change (drop, truncate, the default namespace's flush) whose
/// future is dropped with its record's write in flight runs to its end:
/// the running store applies what its record says (the record alone
/// would be taken by the next crash's recovery, emptying a namespace the
/// running store kept writing to).
#[test]
fn a_dropped_catalog_change_runs_to_its_end() {
    let gate = on_a_runtime(opts(), |s, gate| async move {
        let a = s.create_namespace_async("a", Default::default()).await.unwrap();
        let b = s.create_namespace_async("b", Default::default()).await.unwrap();
        a.put_async(b"k", b"v").await.unwrap();
        b.put_async(b"k", b"v").await.unwrap();
        s.put_async(b"k", b"v").await.unwrap();
        drop_held(&gate, "drop", s.drop_namespace_async("a")).await;
        let (s_, b_) = (&s, &b);
        until("the dropped drop was never applied", move || async move { s_.namespace("a").is_err() }).await;
        assert!(matches!(a.get_async(b"k").await, Err(Error::NoSuchNamespace { .. })));
        drop_held(&gate, "truncate", b.flush_all_async()).await;
        until(
            "the dropped truncate was never applied",
            move || async move { b_.get_async(b"k").await.unwrap().is_none() },
        )
        .await;
        drop_held(&gate, "flush", s.flush_all_async()).await;
        until(
            "the dropped flush was never applied",
            move || async move { s_.get_async(b"k").await.unwrap().is_none() },
        )
        .await;
        // Written after the changes: kept across the reopen.
        b.put_async(b"after", b"v").await.unwrap();
        s.put_async(b"after", b"v").await.unwrap();
    });
    let s = Store::open(gate, &opts()).unwrap();
    assert!(matches!(s.namespace("a"), Err(Error::NoSuchNamespace { .. })));
    let b = s.namespace("b").unwrap();
    assert_eq!((b.get(b"k").unwrap(), b.get(b"after").unwrap().as_deref()), (None, Some(&b"v"[..])));
    assert_eq!((s.get(b"k").unwrap(), s.get(b"after").unwrap().as_deref()), (None, Some(&b"v"[..])));
}

/// Off an executor (a `block_on` on a plain thread) a dropped write is
/// handed to a thread of its own, which runs it to its end: a thread opens
/// the gate once the dropped write is polled again there.
#[test]
fn off_an_executor_a_dropped_write_ends_on_a_thread_of_its_own() {
    let gate = Gate::new(4 << 20, SEGMENT);
    let s = store(&gate);
    let dropping = Arc::new(AtomicBool::new(false));
    for round in 0..20u32 {
        gate.shut();
        dropping.store(false, SeqCst);
        let polls = gate.held_polls.load(SeqCst);
        let opener = {
            let (gate, dropping) = (gate.clone(), dropping.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                while !dropping.load(SeqCst) || gate.held_polls.load(SeqCst) < polls + 2 {
                    if Instant::now() > deadline {
                        gate.open(); // let the test end, and fail
                        return false;
                    }
                    std::thread::yield_now();
                }
                gate.open();
                true
            })
        };
        let mut put = Box::pin(s.put_async(b"a", b"v"));
        granary_rt::block_on(poll_once(put.as_mut()));
        assert_eq!(gate.held_polls.load(SeqCst), polls + 1);
        dropping.store(true, SeqCst);
        drop(put);
        assert!(opener.join().unwrap(), "round {round}: the dropped write was not polled again");
        for k in 0..20u32 {
            s.put(&k.to_le_bytes(), &value(round)).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    assert!(!matches!(s.put(b"b", b"v"), Err(Error::Poisoned { .. })));
    s.close().unwrap();
}

/// Off an executor, a dropped batch waiting for a key's lock that another
/// write of the same `block_on` holds (its group held at the gate) is not
/// run in its drop, which would wait for that write forever: dropped first,
/// the batch waits on its own thread until the other write, dropped next,
/// lets the key go.
#[test]
fn off_an_executor_a_dropped_batch_never_waits_in_its_drop() {
    let gate = Gate::new(4 << 20, SEGMENT);
    // Leaked: the batch's future, borrowing it, goes to another thread.
    let s: &'static Store = Box::leak(Box::new(store(&gate)));
    let ns = s.namespace("default").unwrap();
    gate.shut();
    let mut put = Box::pin(s.put_async(b"x", b"put"));
    granary_rt::block_on(poll_once(put.as_mut()));
    let mut b = s.batch();
    b.put(&ns, b"x", b"batch").put(&ns, b"y", b"batch");
    let mut batch = Box::pin(b.commit_async());
    granary_rt::block_on(poll_once(batch.as_mut()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(batch);
        let _ = tx.send(());
    });
    assert!(rx.recv_timeout(Duration::from_secs(20)).is_ok(), "the batch's drop waited for the put");
    drop(put);
    gate.open();
    wait_for("the dropped batch did not commit", || s.get(b"y").unwrap().is_some());
    assert_eq!(s.get(b"x").unwrap().unwrap(), b"batch");
}

/// A runtime shutting down drops the writes handed to it: one dropped with
/// its IO in flight poisons the store (that IO may still land, so nothing
/// may reuse what it writes), with and without write coalescing.
#[test]
fn a_write_dropped_in_flight_by_its_runtime_shutting_down_poisons_the_store() {
    for coalesce_writes in [true, false] {
        let gate = Gate::new(4 << 20, SEGMENT);
        let s = Arc::new(store_with(&gate, OpenOptions { coalesce_writes, ..opts() }));
        s.put(b"before", b"v").unwrap();
        let rt = runtime();
        gate.shut();
        let polls = gate.held_polls.load(SeqCst);
        let s2 = s.clone();
        let put = rt.spawn_on(0, async move { s2.put_async(b"k", b"v").await.is_ok() });
        wait_for("the write never reached the device", || gate.held_polls.load(SeqCst) > polls);
        drop(rt);
        assert!(put.join().is_err(), "the write was dropped with its runtime");
        gate.open();
        let r = s.put(b"after", b"v");
        assert!(matches!(r, Err(Error::Poisoned { .. })), "coalesce_writes {coalesce_writes}: {r:?}");
        assert_eq!(s.get(b"before").unwrap().unwrap(), b"v");
    }
}

/// A write polled on an executor and dropped inside a `block_on` on that
/// executor's thread (where `granary_rt::on_runtime` is false) is handed
/// to that executor, whose ring holds its IO, not to another thread.
#[test]
fn a_write_dropped_in_a_block_on_on_its_executor_stays_on_its_ring() {
    let gate = on_a_runtime(opts(), |s, gate| async move {
        for round in 0..60u32 {
            gate.shut();
            let mut put = Box::pin(s.put_async(b"a", b"v"));
            poll_once(put.as_mut()).await;
            granary_rt::block_on(async move { drop(put) });
            gate.open();
            rewrite(&s, round).await;
        }
    });
    let on = gate.completed_on.lock().unwrap();
    let off: Vec<&String> = on.iter().filter(|t| !t.starts_with("granary-rt-")).collect();
    assert!(off.is_empty(), "{} of {} writes written off the executor, on {:?}", off.len(), on.len(), off[0]);
}

/// Zoned (whatever the environment picks): a group write a runtime
/// shutting down drops before its IO (it waited its turn behind a write in
/// flight on another thread) leaves its grains unwritten, a hole before
/// the zone's write pointer that every later write would meet: the store
/// is poisoned instead. (On a conventional device such a hole is a torn
/// record, which recovery steps over.)
#[test]
fn zoned_a_group_dropped_before_its_io_poisons_the_store() {
    let gate = Gate::on(TestBackend::Zoned, 4 << 20, SEGMENT);
    let s = Arc::new(store(&gate));
    gate.shut();
    let ahead = {
        let s = s.clone();
        std::thread::spawn(move || granary_rt::block_on(s.put_async(b"ahead", b"v")).is_ok())
    };
    wait_for("the write ahead never reached the device", || gate.held_polls.load(SeqCst) > 0);
    let rt = runtime();
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = s.clone();
    let queued = rt.spawn_on(0, async move {
        let mut put = Box::pin(s2.put_async(b"queued", b"v"));
        poll_once(put.as_mut()).await;
        tx.send(()).unwrap();
        put.await.is_ok()
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the second write waits its turn");
    drop(rt);
    assert!(queued.join().is_err(), "the queued write was dropped with its runtime");
    gate.open();
    assert!(ahead.join().unwrap(), "the write ahead ends as it would have");
    let r = s.put(b"after", b"v");
    assert!(matches!(r, Err(Error::Poisoned { .. })), "{r:?}");
}
