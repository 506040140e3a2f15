//! Combining the writes of one key that queue for its stripe: one record
//! for all.
//!
//! A key's writes hold its stripe through their device write
//! ([`crate::write`]), so writes of one hot key (a counter, redis-benchmark's
//! one key, a session everyone updates) would run one device write at a
//! time. Instead, a write that finds its key's stripe taken lists itself
//! beside the stripe, and the next write of that key of the same kind to
//! take the stripe claims every such write of the key listed, carries them
//! all in one record, and answers them once that record is on the device
//! and indexed. Under light load nothing waits and nothing changes; under
//! load, the writes of one key per device write rise with the number
//! waiting.
//!
//! PUTs (unconditional, of a value slice) list a copy of their key and
//! value; the record holds the last one's value, metadata and CAS value.
//! The claimer's own PUT takes effect first, then the claimed ones in the
//! order they were listed, each replaced by the next at once. Each earlier
//! one reports a CAS value of its own (its explicit one, else a fresh
//! sequence number that no record carries, so a compare-and-swap on it
//! fails as on any replaced version).
//!
//! Read-modify-writes (`Core::update`) list their function with them (it
//! stays on its own future's frame; the entry holds a pointer to it): the
//! claimer calls each in turn, on its own thread and under the entry's
//! step lock, with the item as the changes before it left it, and applies
//! the change it returns in memory (`Core::chain`); the function's answer
//! goes back to its future's frame. So a chain of N costs the claimer N
//! calls, not N round trips to other tasks. A claimed one whose future is
//! dropped before its function runs is skipped (`Step::Abandoned`); one
//! whose change the claimer does not take (a touch or an invalidation, a
//! value refused or too large for a combined record) is answered `Alone`
//! and runs on its own, taking the stripe in turn. A function that panics
//! in the claimer's call is caught there: the claimer goes on with the
//! others, and the panic is resumed on the waiting future's own task, as
//! if its function had panicked there. A function may so run more than
//! once, and on another thread (hence `Send`). Since the claimer calls
//! into another future's frame, that future must not be leaked while what
//! its function borrows goes away (`wait_update`'s contract, which the
//! store's API passes on: `update_async` takes only `'static` functions,
//! `update_borrowing_async` is `unsafe`, and the blocking `update` cannot
//! leak its future).
//!
//! Order: the writes combined were all in progress together (none had
//! returned), so any order of them is linearizable, and a crash loses none
//! of them: none is answered before the record carrying its effect (or
//! the value that replaced it) is on the device.
//!
//! Invariants:
//! - An entry is in its shard's list only while nobody has taken it; it
//!   leaves once, under the shard's lock: taken back by its own writer
//!   (which won the stripe, or whose future was dropped) or claimed by
//!   another writer of its key.
//! - A claimed entry is answered at most once, and always unless
//!   abandoned: with its outcome after the record is indexed, `Alone`
//!   when its change was not taken, or `Retry` when the claiming write
//!   failed or its future was dropped; its writer then writes it itself,
//!   so an error it reports is its own.
//! - A claimed read-modify-write's function is called at most once per
//!   listing, by its claimer, under its step's lock and only while the step
//!   is `Waiting`; its future, dropped, marks the step `Abandoned` under
//!   that lock (waiting out a call in progress) before the function and
//!   its answer's slot leave its frame. So the pointer is never followed
//!   to a frame that is gone; a leaked frame stays allocated (it is
//!   pinned), and what the function borrows outlives it by the contract
//!   of `wait_update`.
//! - Keys and values are copied into the entry: a claimed entry outlives
//!   its writer's future (which may be dropped, as any write's may: the
//!   write may then still take effect, its outcome unknown).

use crate::access::Policy;
use crate::types::{Change, Item, ItemMeta};
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

/// Lists of waiting writes, by stripe modulo this: a list is locked only by
/// a contended PUT and by the stripe's holders, briefly.
const SHARDS: usize = 64;

/// A PUT waiting for its key's stripe.
pub(crate) struct Queued {
    stripe: usize,
    h: u64,
    pub key: Box<[u8]>,
    pub value: Box<[u8]>,
    /// What its version carries besides the value (`write::Version`).
    pub meta: ItemMeta,
    pub cas: Option<u64>,
    pub policy: Policy,
    answer: Mutex<Option<Answer>>,
    answered: event_listener::Event,
}

/// What a claimed PUT is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Its value was written (and replaced by the next one's, unless it
    /// was the last): this is its CAS value.
    Stored(u64),
    /// The write that claimed it did not complete: write it yourself.
    Retry,
}

/// How a waiting PUT ended.
pub(crate) enum Waited<'a> {
    /// It took the stripe itself, unclaimed.
    Stripe(async_lock::MutexGuard<'a, ()>),
    /// It was claimed and answered.
    Answered(Answer),
}

/// Where a waiting write is listed: its stripe, and its key (and hash).
trait Listed {
    fn place(&self) -> (usize, u64, &[u8]);
}

impl Listed for Queued {
    fn place(&self) -> (usize, u64, &[u8]) {
        (self.stripe, self.h, &self.key)
    }
}

impl Listed for QueuedUpdate {
    fn place(&self) -> (usize, u64, &[u8]) {
        (self.stripe, self.h, &self.key)
    }
}

/// Waiting writes of one kind, by stripe modulo [`SHARDS`].
struct Lists<T> {
    shards: Box<[Mutex<Vec<Arc<T>>>]>,
    /// Entries listed in all shards: a claim that finds none takes no
    /// lock (every write of a key claims; few find anything). One listed
    /// as a claim reads 0 is not claimed and takes the stripe in turn.
    listed: AtomicUsize,
}

impl<T: Listed> Lists<T> {
    fn new() -> Lists<T> {
        Lists { shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(), listed: AtomicUsize::new(0) }
    }

    fn shard(&self, stripe: usize) -> MutexGuard<'_, Vec<Arc<T>>> {
        // A panic while listing or claiming leaves the list whole.
        self.shards[stripe % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, q: Arc<T>) {
        let mut list = self.shard(q.place().0);
        list.push(q);
        // Under the shard's lock, as every change of the count.
        self.listed.fetch_add(1, Relaxed);
    }

    /// Take `q` out of its list; false when it was claimed.
    fn unlist(&self, q: &Arc<T>) -> bool {
        let mut list = self.shard(q.place().0);
        match list.iter().position(|e| Arc::ptr_eq(e, q)) {
            Some(i) => {
                list.remove(i);
                self.listed.fetch_sub(1, Relaxed);
                true
            }
            None => false,
        }
    }

    /// Take every entry listed for `key` (hash `h`) at `stripe`, in the
    /// order listed.
    fn claim(&self, stripe: usize, h: u64, key: &[u8]) -> Vec<Arc<T>> {
        let mut qs = Vec::new();
        if self.listed.load(Relaxed) == 0 {
            return qs;
        }
        let mut list = self.shard(stripe);
        if !list.is_empty() {
            list.retain(|q| {
                let mine = q.place() == (stripe, h, key);
                if mine {
                    qs.push(q.clone());
                }
                !mine
            });
        }
        self.listed.fetch_sub(qs.len(), Relaxed);
        qs
    }
}

impl<T: Listed> Lists<T> {
    /// Poll listed `q`'s stripe lock future while `*polling`: the stripe
    /// once taken with `q` still listed (unlisted now). Taken after a claim
    /// it is let go at once (the stripe's turn is the claimer's, which
    /// answers `q`), and `*polling` cleared.
    fn poll_turn<'a>(
        &self,
        q: &Arc<T>,
        lock: std::pin::Pin<&mut impl Future<Output = async_lock::MutexGuard<'a, ()>>>,
        polling: &mut bool,
        cx: &mut std::task::Context<'_>,
    ) -> Option<async_lock::MutexGuard<'a, ()>> {
        if !*polling {
            return None;
        }
        let Poll::Ready(g) = lock.poll(cx) else { return None };
        *polling = false;
        self.unlist(q).then_some(g)
    }
}

/// Listen on `event` (the first call, which returns Ready), or poll the
/// listener: Ready when the entry may have moved (read it again), Pending
/// while none came. Listening before reading again, a move in between is
/// seen on the next read.
fn poll_moved(
    listener: &mut Option<event_listener::EventListener>,
    event: &event_listener::Event,
    cx: &mut std::task::Context<'_>,
) -> Poll<()> {
    match listener.as_mut() {
        None => *listener = Some(event.listen()),
        Some(l) => {
            std::task::ready!(std::pin::Pin::new(l).poll(cx));
            *listener = None;
        }
    }
    Poll::Ready(())
}

/// The waiting writes of every stripe.
pub(crate) struct Combiner {
    puts: Lists<Queued>,
    updates: Lists<QueuedUpdate>,
    /// PUTs answered `Stored` by another's write.
    pub combined: AtomicU64,
    /// Read-modify-writes whose change another's write carried.
    pub combined_updates: AtomicU64,
}

impl Default for Combiner {
    fn default() -> Combiner {
        Combiner {
            puts: Lists::new(),
            updates: Lists::new(),
            combined: AtomicU64::new(0),
            combined_updates: AtomicU64::new(0),
        }
    }
}

impl Combiner {
    /// List a PUT of `key` (hash `h`, stripe `stripe`) and wait until it
    /// takes the stripe (`lock`, the stripe's lock future) or another
    /// writer claims and answers it.
    pub(crate) async fn wait<'a>(
        &self,
        lock: impl Future<Output = async_lock::MutexGuard<'a, ()>>,
        stripe: usize,
        h: u64,
        key: &[u8],
        value: &[u8],
        (meta, cas, policy): (ItemMeta, Option<u64>, Policy),
    ) -> Waited<'a> {
        let q = Arc::new(Queued {
            stripe,
            h,
            key: key.into(),
            value: value.into(),
            meta,
            cas,
            policy,
            answer: Mutex::new(None),
            answered: event_listener::Event::new(),
        });
        self.puts.push(q.clone());
        // Unlisted if this future is dropped while listed.
        struct Unlist<'c> {
            lists: &'c Lists<Queued>,
            q: Option<Arc<Queued>>,
        }
        impl Drop for Unlist<'_> {
            fn drop(&mut self) {
                if let Some(q) = self.q.take() {
                    self.lists.unlist(&q);
                }
            }
        }
        let mut listed = Unlist { lists: &self.puts, q: Some(q.clone()) };
        let mut lock = pin!(lock);
        // Its lock future is polled until taken.
        let mut polling = true;
        let mut listener: Option<event_listener::EventListener> = None;
        poll_fn(|cx| loop {
            if let Some(a) = *q.answer.lock().unwrap_or_else(|e| e.into_inner()) {
                listed.q = None;
                return Poll::Ready(Waited::Answered(a));
            }
            if let Some(g) = self.puts.poll_turn(&q, lock.as_mut(), &mut polling, cx) {
                listed.q = None;
                return Poll::Ready(Waited::Stripe(g));
            }
            if !polling {
                listed.q = None;
            }
            if poll_moved(&mut listener, &q.answered, cx).is_pending() {
                return Poll::Pending;
            }
        })
        .await
    }

    /// Claim the PUTs of `key` (hash `h`) waiting for stripe `stripe`, in
    /// the order they were listed; the caller holds the stripe and is
    /// about to write `key` unconditionally.
    pub(crate) fn claim(&self, stripe: usize, h: u64, key: &[u8]) -> Claimed<'_> {
        Claimed { combiner: self, qs: self.puts.claim(stripe, h, key), cas: Vec::new() }
    }
}

/// PUTs claimed by a writer: each told `Retry` if dropped unanswered.
pub(crate) struct Claimed<'a> {
    combiner: &'a Combiner,
    qs: Vec<Arc<Queued>>,
    /// The CAS values of all but the last ([`Claimed::reserve`]).
    cas: Vec<u64>,
}

impl Claimed<'_> {
    /// Nothing claimed.
    pub(crate) fn none(combiner: &Combiner) -> Claimed<'_> {
        Claimed { combiner, qs: Vec::new(), cas: Vec::new() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.qs.len()
    }

    /// The last PUT claimed: its value is the one written.
    pub(crate) fn last(&self) -> Option<&Queued> {
        self.qs.last().map(|q| &**q)
    }

    /// Key and value bytes of the PUTs claimed.
    pub(crate) fn bytes(&self) -> u64 {
        self.qs.iter().map(|q| (q.key.len() + q.value.len()) as u64).sum()
    }

    /// Give each claimed PUT but the last its CAS value, `of(cas)` (its
    /// explicit one, or a fresh sequence number); taken before the
    /// record's own sequence number, so below it and below every later
    /// one, after a crash too.
    pub(crate) fn reserve(&mut self, mut of: impl FnMut(Option<u64>) -> u64) {
        let early = self.qs.len().saturating_sub(1);
        self.cas = self.qs[..early].iter().map(|q| of(q.cas)).collect();
    }

    /// Answer them all: the record carrying the last one's value, with
    /// CAS value `last_cas`, is on the device and indexed.
    pub(crate) fn stored(mut self, last_cas: u64) {
        let n = self.qs.len();
        let cas = std::mem::take(&mut self.cas);
        for (i, q) in self.qs.drain(..).enumerate() {
            answer(&q, Answer::Stored(cas.get(i).copied().unwrap_or(last_cas)));
        }
        self.combiner.combined.fetch_add(n as u64, Relaxed);
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        for q in self.qs.drain(..) {
            answer(&q, Answer::Retry);
        }
    }
}

fn answer(q: &Queued, a: Answer) {
    *q.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
    q.answered.notify(usize::MAX);
}

/// A read-modify-write of one key waiting for its stripe, with a pointer
/// to its function (which stays on its future's frame).
pub(crate) struct QueuedUpdate {
    stripe: usize,
    h: u64,
    key: Box<[u8]>,
    step: Mutex<Step>,
    /// Its function, bound to the slot of its answer: called only under
    /// `step`'s lock while `step` is `Waiting` (module invariants).
    call: Call,
    /// What its function panicked with, in the claimer's call: resumed on
    /// its own task (`UpdateAnswer::Panicked`).
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Each move of `step`, for its waiting future.
    moved: event_listener::Event,
}

/// A waiting read-modify-write's function, its lifetime erased: valid while
/// its future's frame is, which `Leave` ensures outlasts every call.
struct Call(*mut (dyn FnMut(Option<&Item>) -> Change + Send + 'static));

// SAFETY: the function behind the pointer is `Send` (and so is the answer
// it stores: `wait_update` requires `R: Send`); it is called by one thread
// at a time, under the entry's step lock, and only while its frame lives
// (see `QueuedUpdate::call`).
unsafe impl Send for Call {}
// SAFETY: shared references to a `Call` only read the pointer; following it
// is serialized by the step lock, as above.
unsafe impl Sync for Call {}

enum Step {
    /// Listed; or claimed, its function not yet called.
    Waiting,
    /// Claimed, and its function called: its change is the claimer's.
    Decided,
    /// Its future was dropped before its function was called: skipped.
    Abandoned,
    Answered(UpdateAnswer),
}

/// What a claimed read-modify-write is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UpdateAnswer {
    /// Its change is on the device (carried by the record of the last
    /// value): the CAS value of the value it wrote, if it wrote one.
    Done(Option<u64>),
    /// Not written: its function runs again, on its own.
    Retry,
    /// Not applied: its function runs again, taking the stripe in turn
    /// without listing itself again (so it is not claimed and refused
    /// round after round): its change does not chain, the store refused
    /// its value, or its value would not fit a combined record
    /// (`Core::chain_fits`).
    Alone,
    /// Its function panicked in the claimer's call: the panic is resumed
    /// on its own task.
    Panicked,
}

/// How a waiting read-modify-write ended.
pub(crate) enum UpdateWaited<'a, R> {
    /// It took the stripe itself, unclaimed.
    Stripe(async_lock::MutexGuard<'a, ()>),
    /// Claimed: its function's answer, and the CAS value of what it wrote.
    Done(R, Option<u64>),
    Retry,
    /// Claimed and not applied: run on its own, not listed again.
    Alone,
}

impl QueuedUpdate {
    fn step(&self) -> MutexGuard<'_, Step> {
        self.step.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn answer(&self, a: UpdateAnswer) {
        *self.step() = Step::Answered(a);
        self.moved.notify(usize::MAX);
    }
}

impl Combiner {
    /// List a read-modify-write of `key` and wait until it takes the
    /// stripe (`lock`) or a claimer has called `f` on the item as the
    /// writes before it left it and answered.
    ///
    /// # Safety
    ///
    /// A claimer on another thread may call `f` while this future waits:
    /// the future must be run to completion or dropped before anything `f`
    /// borrows goes away, never leaked meanwhile.
    pub(crate) async unsafe fn wait_update<'a, R: Send>(
        &self,
        lock: impl Future<Output = async_lock::MutexGuard<'a, ()>>,
        stripe: usize,
        h: u64,
        key: &[u8],
        f: &mut (impl FnMut(Option<&Item>) -> (Change, R) + Send),
    ) -> UpdateWaited<'a, R> {
        // Declared before `leave`, so dropped after it (module invariants).
        let answer: Mutex<Option<R>> = Mutex::new(None);
        let mut call = |item: Option<&Item>| {
            let (change, r) = f(item);
            *answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            change
        };
        let call = {
            let p: *mut (dyn FnMut(Option<&Item>) -> Change + Send + '_) = &mut call;
            // SAFETY: only the lifetime is erased (the same fat pointer); it
            // is followed only while this frame lives: `leave` below,
            // dropped before `call` and `answer`, ends every call first.
            Call(unsafe {
                std::mem::transmute::<
                    *mut (dyn FnMut(Option<&Item>) -> Change + Send + '_),
                    *mut (dyn FnMut(Option<&Item>) -> Change + Send + 'static),
                >(p)
            })
        };
        let q = Arc::new(QueuedUpdate {
            stripe,
            h,
            key: key.into(),
            step: Mutex::new(Step::Waiting),
            call,
            panic: Mutex::new(None),
            moved: event_listener::Event::new(),
        });
        self.updates.push(q.clone());
        // Dropped while listed: unlisted; while claimed and its function
        // not called: abandoned, so its claimer never calls it (a call in
        // progress holds the step's lock: this waits it out).
        struct Leave<'c> {
            lists: &'c Lists<QueuedUpdate>,
            q: Arc<QueuedUpdate>,
            listed: bool,
            ended: bool,
        }
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if self.ended || (self.listed && self.lists.unlist(&self.q)) {
                    return;
                }
                let mut step = self.q.step();
                if matches!(*step, Step::Waiting) {
                    *step = Step::Abandoned;
                }
            }
        }
        let mut leave = Leave { lists: &self.updates, q: q.clone(), listed: true, ended: false };
        let mut lock = pin!(lock);
        let mut listener: Option<event_listener::EventListener> = None;
        poll_fn(|cx| loop {
            let answered = match *q.step() {
                Step::Answered(a) => Some(a),
                _ => None,
            };
            if let Some(a) = answered {
                // Answered: its claimer is done with it (no call after).
                leave.ended = true;
                return Poll::Ready(match a {
                    UpdateAnswer::Done(cas) => {
                        let r = answer.lock().unwrap_or_else(|e| e.into_inner()).take();
                        UpdateWaited::Done(r.expect("answered Done after its function ran"), cas)
                    }
                    UpdateAnswer::Retry => UpdateWaited::Retry,
                    UpdateAnswer::Alone => UpdateWaited::Alone,
                    UpdateAnswer::Panicked => {
                        let p = q.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
                        std::panic::resume_unwind(p.expect("a panic noted before its answer"))
                    }
                });
            }
            if let Some(g) = self.updates.poll_turn(&q, lock.as_mut(), &mut leave.listed, cx) {
                // Unlisted unclaimed: nobody calls it.
                leave.ended = true;
                return Poll::Ready(UpdateWaited::Stripe(g));
            }
            if poll_moved(&mut listener, &q.moved, cx).is_pending() {
                return Poll::Pending;
            }
        })
        .await
    }

    /// Claim the read-modify-writes of `key` waiting for stripe `stripe`,
    /// in the order listed; the caller holds the stripe.
    pub(crate) fn claim_updates(&self, stripe: usize, h: u64, key: &[u8]) -> ClaimedUpdates<'_> {
        let qs = self.updates.claim(stripe, h, key);
        let qs = qs.into_iter().map(|q| Claim { q, outcome: None, told: false }).collect();
        ClaimedUpdates { combiner: self, qs }
    }
}

/// Read-modify-writes claimed by a writer, each with its outcome once its
/// change is applied: each told `Retry` if dropped unanswered.
pub(crate) struct ClaimedUpdates<'a> {
    combiner: &'a Combiner,
    qs: Vec<Claim>,
}

/// One claimed read-modify-write.
struct Claim {
    q: Arc<QueuedUpdate>,
    /// Its outcome, noted once its change is applied or refused.
    outcome: Option<UpdateAnswer>,
    /// Already answered, or abandoned: nothing more to tell it.
    told: bool,
}

impl ClaimedUpdates<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.qs.len()
    }

    /// Call the `i`th claimed's function on `item`: its change, or None
    /// when its future was dropped first, or when the function panicked
    /// (answered at once: the panic is resumed on its own task).
    pub(crate) fn decide(&mut self, i: usize, item: Option<&Item>) -> Option<Change> {
        let Claim { q, told, .. } = &mut self.qs[i];
        let mut step = q.step();
        if !matches!(*step, Step::Waiting) {
            *told = true; // abandoned
            return None;
        }
        // SAFETY: the step is `Waiting` and its lock held, so the future
        // that made `call` has not been dropped (its `Leave` would have
        // marked it `Abandoned`, under this lock) nor answered, and
        // nothing else calls it: its frame, the function and the answer's
        // slot are alive (a leaked frame stays allocated, and what the
        // function borrows outlives it: `wait_update`'s contract), and
        // this is the only use (module invariants).
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*q.call.0)(item) }));
        match called {
            Ok(change) => {
                *step = Step::Decided;
                Some(change)
            }
            Err(payload) => {
                *q.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
                *step = Step::Answered(UpdateAnswer::Panicked);
                drop(step);
                q.moved.notify(usize::MAX);
                *told = true;
                None
            }
        }
    }

    /// Note the `i`th claimed's outcome, told once all are written.
    pub(crate) fn settle(&mut self, i: usize, a: UpdateAnswer) {
        self.qs[i].outcome = Some(a);
    }

    /// The record carrying their changes is on the device: tell each its
    /// outcome.
    pub(crate) fn written(mut self) {
        for c in self.qs.drain(..) {
            if let (Some(a), false) = (c.outcome, c.told) {
                if matches!(a, UpdateAnswer::Done(_)) {
                    self.combiner.combined_updates.fetch_add(1, Relaxed);
                }
                c.q.answer(a);
            }
        }
    }
}

impl Drop for ClaimedUpdates<'_> {
    /// Not written (the write failed, or this future was dropped): those
    /// not told yet run again, on their own if so noted.
    fn drop(&mut self) {
        for c in self.qs.drain(..).filter(|c| !c.told) {
            c.q.answer(match c.outcome {
                Some(UpdateAnswer::Alone) => UpdateAnswer::Alone,
                _ => UpdateAnswer::Retry,
            });
        }
    }
}
