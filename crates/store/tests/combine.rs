//! PUTs of one key queued behind a write of it in flight are combined into
//! one record (`granary_store`'s `combine` module): the key ends with the
//! last one's value, on the device before any of them returns; each gets
//! a CAS value of its own; a claiming write that does not complete leaves
//! those it claimed to write themselves; a PUT dropped while it waits is
//! never written. The gate device holds writes in flight, so the queue
//! forms the same way on every run.

mod common;

use common::gate::{poll_once, Gate};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{Cond, CreateOptions, Entropy, ItemMeta, OpenOptions, PutOutcome, Store};
use std::future::Future;
use std::pin::Pin;
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
