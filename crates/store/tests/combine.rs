//! Writes of one key queued behind a write of it in flight are combined
//! into one record (`granary_store`'s `combine` module). PUTs: the key ends
//! with the last one's value, on the device before any of them returns;
//! each gets a CAS value of its own; a claiming write that does not
//! complete leaves those it claimed to write themselves; a PUT dropped
//! while it waits is never written. Read-modify-writes: each sees the
//! value the one before it left; a touch, a dropped, an unpolled or a
//! panicking one, and a dropped claimer leave the others whole. A
//! touching read (memcache `mg ... T`) is never combined: it waits for the
//! key's lock and reads and touches under it. The gate device holds
//! writes in flight, so the queue forms the same way on every run.

mod common;

use common::gate::{poll_once, Gate};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{Change, Cond, CreateOptions, Entropy, ItemMeta, OpenOptions, PutOutcome, Store};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

const SEGMENT: u64 = 64 << 10;

fn opts() -> OpenOptions {
    OpenOptions { entropy: Entropy::seeded(9), ..Default::default() }
}

/// Run `body` on a one-executor runtime with a store on a gated device;
/// the store is closed and the device handed back.
fn on_a_runtime<Fut>(body: impl FnOnce(Arc<Store>, Arc<Gate>) -> Fut) -> Arc<Gate>
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let gate = Gate::new(4 << 20, SEGMENT);
    let co = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(SEGMENT), index_table_homes: Some(256) };
    let s = Arc::new(Store::create(gate.clone(), &co, &opts()).unwrap());
    let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
    rt.block_on(body(s.clone(), gate.clone())).unwrap();
    Arc::into_inner(s).unwrap().close().unwrap();
    drop(rt);
    gate
}

type Put<'a> = Pin<Box<dyn Future<Output = granary_store::Result<(PutOutcome, u64)>> + Send + 'a>>;

fn put<'a>(s: &'a Store, key: &'a [u8], value: &'a [u8]) -> Put<'a> {
    Box::pin(s.put_item_async(key, value, ItemMeta::default(), Cond::Always))
}

/// With the gate shut: `first`'s write of `key` is held in flight, then
/// `n` more PUTs of `key` (values `b0`, `b1`...) wait for it, each polled
/// once.
async fn queue_behind<'a>(s: &'a Store, key: &'a [u8], values: &'a [Vec<u8>]) -> (Put<'a>, Vec<Put<'a>>) {
    let mut first = put(s, key, b"first");
    poll_once(first.as_mut()).await;
    let mut queued = Vec::new();
    for v in values {
        let mut p = put(s, key, v);
        poll_once(p.as_mut()).await;
        queued.push(p);
    }
    (first, queued)
}

fn values(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("b{i}").into_bytes()).collect()
}

#[test]
fn puts_queued_for_one_key_share_one_record_holding_the_last_value() {
    let gate = on_a_runtime(|s, gate| async move {
        let vs = values(8);
        let before = s.stats();
        gate.shut();
        let (first, queued) = queue_behind(&s, b"hot", &vs).await;
        // Another key's write is not held up by the queue (it leads the
        // next group write, so it is awaited before the queued ones).
        let mut other = put(&s, b"other", b"x");
        poll_once(other.as_mut()).await;
        gate.open();
        assert_eq!(first.await.unwrap().0, PutOutcome::Stored);
        other.await.unwrap();
        let mut cas = Vec::new();
        for q in queued {
            let (outcome, c) = q.await.unwrap();
            assert_eq!(outcome, PutOutcome::Stored);
            cas.push(c);
        }
        let st = s.stats();
        // The first queued took the stripe and claimed the other seven.
        assert_eq!(st.combined_puts - before.combined_puts, 7);
        assert_eq!(st.puts - before.puts, 10);
        let item = s.get_item_async(b"hot").await.unwrap().unwrap();
        assert_eq!(item.value, vs[7]);
        // The last one's CAS value is the record's; each earlier one has
        // its own, below it (a CAS on it fails: it was replaced at once).
        assert_eq!(*cas.last().unwrap(), item.cas);
        let mut distinct = cas.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), cas.len(), "{cas:?}");
        assert!(cas[1..7].iter().all(|&c| c < item.cas), "{cas:?} against {}", item.cas);
        let r = s.put_item_async(b"hot", b"late", ItemMeta::default(), Cond::Cas(cas[3])).await.unwrap();
        assert_eq!(r.0, PutOutcome::Exists);
    });
    // On the device before they returned.
    let s = Store::open(gate, &opts()).unwrap();
    assert_eq!(s.get(b"hot").unwrap().unwrap(), b"b7");
}

#[test]
fn an_explicit_cas_value_is_kept_by_a_combined_put() {
    on_a_runtime(|s, gate| async move {
        gate.shut();
        let mut first = put(&s, b"k", b"first");
        poll_once(first.as_mut()).await;
        let mut a = Box::pin(s.put_item_with_cas_async(b"k", b"a", ItemMeta::default(), Cond::Always, 777));
        poll_once(a.as_mut()).await;
        let mut b = Box::pin(s.put_item_with_cas_async(b"k", b"b", ItemMeta::default(), Cond::Always, 888));
        poll_once(b.as_mut()).await;
        let mut c = put(&s, b"k", b"c");
        poll_once(c.as_mut()).await;
        gate.open();
        first.await.unwrap();
        assert_eq!(a.await.unwrap(), (PutOutcome::Stored, 777));
        assert_eq!(b.await.unwrap(), (PutOutcome::Stored, 888));
        let (_, c_cas) = c.await.unwrap();
        let item = s.get_item_async(b"k").await.unwrap().unwrap();
        assert_eq!((item.value.as_slice(), item.cas), (&b"c"[..], c_cas));
        assert_eq!(s.stats().combined_puts, 2);
    });
}

/// The first queued PUT takes the stripe, claims the second and writes
/// its value; that write is held at the gate when `drop_claimer` drops
/// the claimer's future or else the claimed one's.
fn claimer_and_claimed(drop_claimer: bool) {
    let gate = on_a_runtime(move |s, gate| async move {
        let vs = values(2);
        gate.shut();
        let (first, mut queued) = queue_behind(&s, b"hot", &vs).await;
        gate.open();
        first.await.unwrap();
        gate.shut();
        let claimed = queued.pop().unwrap();
        let mut claimer = queued.pop().unwrap();
        poll_once(claimer.as_mut()).await;
        if drop_claimer {
            drop(claimer);
            // The claimed one writes its value itself.
            let mut claimed = claimed;
            poll_once(claimed.as_mut()).await;
            gate.open();
            assert_eq!(claimed.await.unwrap().0, PutOutcome::Stored);
            assert_eq!(s.stats().combined_puts, 0);
        } else {
            drop(claimed);
            gate.open();
            assert_eq!(claimer.await.unwrap().0, PutOutcome::Stored);
            // Written for it all the same (its outcome was unknown).
            assert_eq!(s.stats().combined_puts, 1);
        }
        assert_eq!(s.get_async(b"hot").await.unwrap().unwrap(), b"b1");
        s.put_async(b"after", b"v").await.unwrap();
    });
    let s = Store::open(gate, &opts()).unwrap();
    assert_eq!(s.get(b"hot").unwrap().unwrap(), b"b1");
    assert_eq!(s.get(b"after").unwrap().unwrap(), b"v");
}

#[test]
fn puts_claimed_by_a_write_dropped_midway_write_themselves() {
    claimer_and_claimed(true);
}

#[test]
fn a_claimed_put_dropped_while_it_waits_is_still_written() {
    claimer_and_claimed(false);
}

#[test]
fn a_put_dropped_while_it_waits_unclaimed_is_never_written() {
    on_a_runtime(|s, gate| async move {
        let vs = values(1);
        gate.shut();
        let (first, queued) = queue_behind(&s, b"hot", &vs).await;
        drop(queued);
        gate.open();
        first.await.unwrap();
        // The next PUT of the key finds nobody to claim.
        s.put_async(b"hot", b"next").await.unwrap();
        assert_eq!(s.stats().combined_puts, 0);
        assert_eq!(s.get_async(b"hot").await.unwrap().unwrap(), b"next");
    });
}

/// Conditional writes are not combined: each decides on the value before
/// it.
#[test]
fn conditional_puts_wait_their_turn() {
    on_a_runtime(|s, gate| async move {
        gate.shut();
        let mut first = put(&s, b"k", b"first");
        poll_once(first.as_mut()).await;
        let mut add = Box::pin(s.put_item_async(b"k", b"added", ItemMeta::default(), Cond::Absent));
        poll_once(add.as_mut()).await;
        let mut plain = put(&s, b"k", b"plain");
        poll_once(plain.as_mut()).await;
        gate.open();
        first.await.unwrap();
        assert_eq!(add.await.unwrap().0, PutOutcome::Exists);
        plain.await.unwrap();
        assert_eq!(s.stats().combined_puts, 0);
        assert_eq!(s.get_async(b"k").await.unwrap().unwrap(), b"plain");
    });
}

type Update = Pin<Box<dyn Future<Output = granary_store::Result<(u64, Option<u64>)>> + Send>>;

/// An increment of the decimal counter at `key` (absent: 0), keeping its
/// metadata; answers the count it wrote.
fn incr(s: &Arc<Store>, key: &'static [u8]) -> Update {
    let s = s.clone();
    Box::pin(async move {
        s.update_async(key, |cur| {
            let n = cur.map_or(0, |it| std::str::from_utf8(&it.value).unwrap().parse::<u64>().unwrap()) + 1;
            let meta = cur.map_or(ItemMeta::default(), |it| it.meta);
            (Change::Put { value: n.to_string().into_bytes(), meta }, n)
        })
        .await
    })
}

/// Yield to the executor's other tasks a few times (one executor: each
/// runs as far as it can each time).
async fn let_others_run() {
    for _ in 0..8 {
        granary_rt::yield_now().await;
    }
}

/// Poll `f` (letting the executor's other tasks run between polls) until
/// a write of its is held at the shut gate; fails after 20 s.
async fn until_held<F: Future + ?Sized>(gate: &Gate, mut f: Pin<&mut F>) {
    let held = gate.held_polls.load(SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        poll_once(f.as_mut()).await;
        if gate.held_polls.load(SeqCst) > held {
            return;
        }
        let_others_run().await;
    }
    panic!("no write of it reached the gate in 20 s");
}

/// With the gate shut, an increment's write held in flight and `n` more
/// increments waiting behind it (each polled once, so listed in order).
async fn increments_behind(s: &Arc<Store>, gate: &Gate, n: usize) -> (Update, Vec<Update>) {
    let mut first = incr(s, b"n");
    // Past its read and its claim (none yet): its write is at the gate.
    until_held(gate, first.as_mut()).await;
    let mut queued = Vec::new();
    for _ in 0..n {
        let mut u = incr(s, b"n");
        poll_once(u.as_mut()).await;
        queued.push(u);
    }
    (first, queued)
}

#[test]
fn increments_queued_for_one_key_each_see_the_one_before_and_share_one_record() {
    let gate = on_a_runtime(|s, gate| async move {
        gate.shut();
        let (first, queued) = increments_behind(&s, &gate, 8).await;
        let tasks: Vec<_> = queued.into_iter().map(granary_rt::spawn).collect();
        gate.open();
        assert_eq!(first.await.unwrap().0, 1);
        let mut counts = Vec::new();
        for t in tasks {
            let (n, cas) = t.await.unwrap().unwrap();
            assert!(cas.is_some());
            counts.push(n);
        }
        // Each on the value the one before left, in the order they queued:
        // the first of them claimed the other seven and called each one's
        // function in turn.
        assert_eq!(counts, (2..=9).collect::<Vec<u64>>());
        assert_eq!(s.stats().combined_updates, 7);
        let item = s.get_item_async(b"n").await.unwrap().unwrap();
        assert_eq!(item.value, b"9");
        // The next one reads what the combined record holds.
        assert_eq!(incr(&s, b"n").await.unwrap().0, 10);
    });
    let s = Store::open(gate, &opts()).unwrap();
    assert_eq!(s.get(b"n").unwrap().unwrap(), b"10");
}

/// A touch (which keeps the access state of the record it replaces) is
/// not combined: it runs again on its own after the others.
#[test]
fn a_touch_queued_among_increments_runs_on_its_own() {
    on_a_runtime(|s, gate| async move {
        gate.shut();
        let (first, mut queued) = increments_behind(&s, &gate, 1).await;
        let s2 = s.clone();
        let mut touch: Update = Box::pin(async move {
            s2.update_async(b"n", |cur| match cur {
                Some(it) => {
                    let meta = ItemMeta { expires: 4_000_000_000, ..it.meta };
                    (Change::Touch { value: it.value.clone(), meta, cas: it.cas, fetch: false }, 0)
                }
                None => (Change::Keep, 0),
            })
            .await
        });
        poll_once(touch.as_mut()).await;
        queued.push(touch);
        let mut last = incr(&s, b"n");
        poll_once(last.as_mut()).await;
        queued.push(last);
        let tasks: Vec<_> = queued.into_iter().map(granary_rt::spawn).collect();
        gate.open();
        first.await.unwrap();
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(t.await.unwrap().unwrap().0);
        }
        assert_eq!(counts, [2, 0, 3]);
        assert_eq!(s.stats().combined_updates, 1);
        let item = s.get_item_async(b"n").await.unwrap().unwrap();
        assert_eq!((item.value.as_slice(), item.meta.expires), (&b"3"[..], 4_000_000_000));
    });
}

/// Three increments queued behind a held one: the first of them claims
/// the other two. `drop_second`: the second's future is dropped while it
/// is still listed, and is never applied; else it is kept and not polled,
/// and the claimer calls its function all the same (the function stays on
/// that future's frame), so its change is carried, and it is answered
/// when polled again.
fn second_of_three_unpolled(drop_second: bool) {
    on_a_runtime(move |s, gate| async move {
        gate.shut();
        let (first, mut queued) = increments_behind(&s, &gate, 3).await;
        let third = granary_rt::spawn(queued.pop().unwrap());
        let second = queued.pop().unwrap();
        let claimer = granary_rt::spawn(queued.pop().unwrap());
        let second = if drop_second {
            drop(second);
            None
        } else {
            Some(second)
        };
        gate.open();
        first.await.unwrap();
        assert_eq!(claimer.await.unwrap().unwrap().0, 2);
        let want: &[u8] = match second {
            Some(second) => {
                assert_eq!(third.await.unwrap().unwrap().0, 4);
                assert_eq!(second.await.unwrap().0, 3);
                assert_eq!(s.stats().combined_updates, 2);
                b"4"
            }
            None => {
                assert_eq!(third.await.unwrap().unwrap().0, 3);
                b"3"
            }
        };
        assert_eq!(s.get_async(b"n").await.unwrap().unwrap(), want);
    });
}

#[test]
fn a_queued_increment_dropped_before_it_is_claimed_is_never_applied() {
    second_of_three_unpolled(true);
}

#[test]
fn a_claimed_increment_not_polled_is_carried_all_the_same() {
    second_of_three_unpolled(false);
}

/// An increment claimed and then dropped, on another thread, before the
/// claimer calls its function (the claimer is held in the function of the
/// one before it): skipped, never applied; the one after it is carried.
#[test]
fn a_claimed_increment_dropped_before_its_function_runs_is_skipped() {
    let (running_tx, running_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let gate = on_a_runtime(move |s, gate| async move {
        gate.shut();
        let (first, mut queued) = increments_behind(&s, &gate, 1).await;
        let claimer = granary_rt::spawn(queued.pop().unwrap());
        // The second: an increment whose function says it runs, then waits
        // (on the claimer's thread) until the third has been dropped.
        let s2 = s.clone();
        let mut slow: Update = Box::pin(async move {
            s2.update_async(b"n", move |cur| {
                let _ = running_tx.send(());
                let _ = go_rx.lock().unwrap().recv_timeout(std::time::Duration::from_secs(20));
                let n = cur.map_or(0, |it| std::str::from_utf8(&it.value).unwrap().parse::<u64>().unwrap()) + 1;
                (Change::Put { value: n.to_string().into_bytes(), meta: ItemMeta::default() }, n)
            })
            .await
        });
        poll_once(slow.as_mut()).await;
        let mut dropped = incr(&s, b"n");
        poll_once(dropped.as_mut()).await;
        let mut last = incr(&s, b"n");
        poll_once(last.as_mut()).await;
        let dropper = std::thread::spawn(move || {
            running_rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the second's function never ran");
            drop(dropped);
            go_tx.send(()).unwrap();
        });
        let (slow, last) = (granary_rt::spawn(slow), granary_rt::spawn(last));
        gate.open();
        first.await.unwrap();
        assert_eq!(claimer.await.unwrap().unwrap().0, 2);
        assert_eq!(slow.await.unwrap().unwrap().0, 3);
        assert_eq!(last.await.unwrap().unwrap().0, 4);
        dropper.join().unwrap();
        assert_eq!(s.stats().combined_updates, 2);
        assert_eq!(s.get_async(b"n").await.unwrap().unwrap(), b"4");
    });
    let s = Store::open(gate, &opts()).unwrap();
    assert_eq!(s.get(b"n").unwrap().unwrap(), b"4");
}

/// A claimed increment whose function panics: the claimer catches it,
/// carries the ones after it, and resumes the panic on the panicking
/// update's own task (its function is not run again). The claimer's own
/// request is unharmed.
#[test]
fn a_claimed_function_that_panics_fails_its_own_task_only() {
    on_a_runtime(|s, gate| async move {
        gate.shut();
        let (first, mut queued) = increments_behind(&s, &gate, 1).await;
        let claimer = granary_rt::spawn(queued.pop().unwrap());
        let s2 = s.clone();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let mut panics: Update = Box::pin(async move {
            s2.update_async(b"n", move |_| -> (Change, u64) {
                counted.fetch_add(1, SeqCst);
                panic!("this function panics, as the test wants")
            })
            .await
        });
        poll_once(panics.as_mut()).await;
        let mut last = incr(&s, b"n");
        poll_once(last.as_mut()).await;
        let (panics, last) = (granary_rt::spawn(panics), granary_rt::spawn(last));
        gate.open();
        first.await.unwrap();
        assert_eq!(claimer.await.unwrap().unwrap().0, 2);
        assert_eq!(last.await.unwrap().unwrap().0, 3);
        match panics.await {
            Err(granary_rt::JoinError::Panicked(m)) => assert!(m.contains("as the test wants"), "{m}"),
            other => panic!("the panicking update's task: {:?}", other.map(|r| r.map(|(n, _)| n))),
        }
        assert_eq!(calls.load(SeqCst), 1, "its function ran once, in the claimer's call");
        assert_eq!(s.stats().combined_updates, 1);
        assert_eq!(s.get_async(b"n").await.unwrap().unwrap(), b"3");
    });
}

/// The claimer's future is dropped with the combined write in flight:
/// those it claimed run again on their own, on what the key holds.
#[test]
fn increments_claimed_by_a_write_dropped_midway_run_again() {
    let gate = on_a_runtime(|s, gate| async move {
        gate.shut();
        let (first, mut queued) = increments_behind(&s, &gate, 3).await;
        let others: Vec<_> = queued.drain(1..).map(granary_rt::spawn).collect();
        let mut claimer = queued.pop().unwrap();
        gate.open();
        first.await.unwrap();
        gate.shut();
        until_held(&gate, claimer.as_mut()).await;
        drop(claimer);
        gate.open();
        let mut counts = Vec::new();
        for t in others {
            counts.push(t.await.unwrap().unwrap().0);
        }
        // (Running again, the second may claim the third.)
        assert_eq!(counts, [2, 3]);
        assert!(s.stats().combined_updates <= 1);
        assert_eq!(s.get_async(b"n").await.unwrap().unwrap(), b"3");
    });
    // The dropped write's record (of an older sequence number) may be on
    // the device; the later ones win.
    let s = Store::open(gate, &opts()).unwrap();
    assert_eq!(s.get(b"n").unwrap().unwrap(), b"3");
}

/// memcache's `mg ... T` (`touch_item_access`) reads and touches under
/// the key's lock: started while a PUT of the key is in flight, it waits
/// for it and answers the new value with that value's own access state
/// (never read, its win token free), touched; a read and then a touch
/// would answer the old value's state (read once) with the new value.
#[test]
fn a_touching_read_waits_for_a_write_in_flight_and_answers_what_it_touched() {
    let gate = Gate::new(4 << 20, SEGMENT);
    let co = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(SEGMENT), index_table_homes: Some(256) };
    let s = Arc::new(Store::create(gate.clone(), &co, &OpenOptions { track_access: true, ..opts() }).unwrap());
    let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
    let s2 = s.clone();
    rt.block_on(async move {
        let s = s2;
        s.put_item_async(b"k", b"a", ItemMeta::default(), Cond::Always).await.unwrap();
        let read = s.get_item_access_async(b"k", true, |_| false).await.unwrap().unwrap();
        assert!(!read.prior.fetched);
        gate.shut();
        let mut b = put(&s, b"k", b"b");
        until_held(&gate, b.as_mut()).await;
        let s3 = s.clone();
        let mut touching: Pin<Box<dyn Future<Output = _> + Send>> =
            Box::pin(async move { s3.touch_item_access_async(b"k", true, |_| true, 4_000_000_000, None).await });
        // Far enough that a read that did not wait for the lock would be
        // done (device reads are not held).
        for _ in 0..8 {
            poll_once(touching.as_mut()).await;
            let_others_run().await;
        }
        let touching = granary_rt::spawn(touching);
        gate.open();
        b.await.unwrap();
        let ia = touching.await.unwrap().unwrap().unwrap();
        assert_eq!((ia.item.value.as_slice(), ia.item.meta.expires), (&b"b"[..], 4_000_000_000));
        assert!(!ia.prior.fetched, "the state of the value it answers, not of the one before");
        assert!(!ia.prior.win_sent && ia.won);
        // The touched version kept what the read marked: read, token sent.
        let after = s.get_item_access_async(b"k", false, |_| true).await.unwrap().unwrap();
        assert_eq!((after.item.value.as_slice(), after.item.meta.expires), (&b"b"[..], 4_000_000_000));
        assert!(after.prior.fetched && after.prior.win_sent && !after.won);
        assert_eq!(after.item.cas, ia.item.cas);
        // Absent: nothing written, nothing answered.
        assert!(s.touch_item_access_async(b"none", true, |_| true, 1, None).await.unwrap().is_none());
    })
    .unwrap();
    Arc::into_inner(s).unwrap().close().unwrap();
}
