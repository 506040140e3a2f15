//! Executors: one thread per core with its tasks, timers and io_uring.
//!
//! Tasks live in their executor's slab and are polled only on its thread.
//! A task's waker carries the executor's shared part and the task's slab
//! key; waking on the owning thread pushes the key on the local ready queue,
//! waking from elsewhere pushes it on the executor's remote queue and, if
//! the executor is asleep in `io_uring_enter`, writes its eventfd (whose
//! read is always pending in the ring). A `queued` flag per task makes
//! repeated wakes before the next poll cost nothing.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use crate::op::{self, OpSlot};
use crate::pressure::CpuPressure;
use crate::slab::{Key, Slab};
use crate::time::Timers;

/// Default [`RuntimeConfig::spin_io`] in microseconds (measured in
/// BENCHMARKS.md, "Device").
pub const SPIN_IO_US_DEFAULT: u64 = 200;

/// Adaptive IO spin: the executor keeps the share of its recent idle
/// periods with file IO in flight that ended (work arrived) within
/// [`RuntimeConfig::spin_io`], as an average over about this many periods,
/// and spins for IO only while at least half of them did. On a device
/// slower than the spin (a congested or throttled disk), each spin would
/// only burn the CPU that other threads need, then sleep anyway.
pub const SPIN_IO_WINDOW: u32 = 16;

/// Whether spinning for file IO pays: an exponentially weighted share of
/// idle periods that ended within the spin budget. Starts at "pays" (the
/// runtime's default assumes a device faster than the spin).
#[derive(Debug, Clone, Copy)]
pub struct SpinPolicy {
    /// Share of recent periods that ended within the budget, in 1/2^16.
    hits: u32,
    budget: Duration,
}

impl SpinPolicy {
    const ONE: u32 = 1 << 16;

    pub fn new(budget: Duration) -> SpinPolicy {
        SpinPolicy { hits: Self::ONE, budget }
    }

    /// How long an idle period with IO in flight spins when it does.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Spin for IO in the next idle period?
    pub fn spin(&self) -> bool {
        !self.budget.is_zero() && self.hits >= Self::ONE / 2
    }

    /// An idle period with file IO in flight ended (work arrived) after
    /// `gap`, whether it was spent spinning, sleeping, or both.
    pub fn record(&mut self, gap: Duration) {
        let hit = if gap <= self.budget { Self::ONE } else { 0 };
        self.hits = self.hits - self.hits / SPIN_IO_WINDOW + hit / SPIN_IO_WINDOW;
    }

    /// The spin lost its core to another thread ([`SPIN_PREEMPTED_GAP`]):
    /// other threads want the CPU it burns (on a machine whose clients
    /// share the executors' cores, the very threads whose requests it
    /// waits for). It stops until about [`SPIN_IO_WINDOW`] / 2 + 3
    /// periods in a row end within the budget again, so under contention
    /// the executor spins in about one idle period in twelve; on a core of
    /// its own it is never preempted and spins as before.
    pub fn preempted(&mut self) {
        self.hits = 0;
    }
}

/// A spin whose consecutive polls are this far apart was preempted (a poll
/// of the rings and queues takes well under a microsecond; an interrupt's
/// handling, tens): see [`SpinPolicy::preempted`].
pub const SPIN_PREEMPTED_GAP: Duration = Duration::from_micros(50);

/// Mid-round submission while the executor is busy: the file reads and
/// writes its tasks queue go to the kernel as soon as they are at least
/// this fraction (1/N) of the file IOs already there, instead of at the
/// end of the round. See [`Executor::run_ready`].
pub const SUBMIT_EARLY_DIVISOR: u64 = 8;

/// Rounds (that run tasks) after the executor last waited for work (spun or slept) in which
/// each task's file IO goes to the kernel right after the task's poll; from
/// the next one on (the executor is busy), [`SUBMIT_EARLY_DIVISOR`] batches
/// it. See [`Executor::run_ready`].
pub const SUBMIT_AT_ONCE_ROUNDS: u32 = 2;

/// How the runtime is set up. `Default` gives one executor per available
/// core, pinned, coop task-run rings of 1024 entries, 20 µs of spinning.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Executor threads (at least 1).
    pub threads: usize,
    /// Pin executor `i` to CPU `i % cpus`.
    pub pin: bool,
    /// Submission queue entries per ring (completion queue is twice that).
    pub ring_entries: u32,
    /// How long an executor with nothing ready polls its completion and
    /// cross-core queues before blocking in the kernel. Zero blocks at once.
    /// Adaptive, as `spin_io`: it spins while at least half of its recent
    /// idle periods ended within this time and no recent spin was
    /// preempted ([`SpinPolicy::preempted`]). Neither spin runs while
    /// other tasks wait for the machine's CPUs (`crate::pressure`).
    pub spin: Duration,
    /// How long it polls instead when file IO it submitted is in flight:
    /// a completion is then due within a device latency, and sleeping in
    /// the kernel only to be woken for it adds a wake-up to every IO.
    /// Bounded, so an executor waiting on a stalled device still sleeps.
    pub spin_io: Duration,
    /// IORING_SETUP_DEFER_TASKRUN: completions are processed only when the
    /// executor enters the kernel (fewer interrupts, no busy polling of
    /// completions that the kernel has not posted). Otherwise
    /// COOP_TASKRUN|TASKRUN_FLAG, which posts completions at the next
    /// kernel transition and lets spinning see them.
    pub defer_taskrun: bool,
    /// Submit file IO mid-round (see `Executor::run_ready`): right after
    /// the task that queued it while the executor has time to spare, in
    /// batches of 1/8 of the IO in flight while it is busy. Helps when the
    /// device waits on the executor (`bench device` GETs at moderate queue
    /// depths, against one submission a round, and at high depths on a
    /// virtual disk, against batches alone; docs/BENCHMARKS-HISTORY.md); costs
    /// system calls, which a CPU-bound server may prefer to save (`granary
    /// serve --no-io-submit-early`).
    pub submit_early: bool,
    /// Thread name prefix.
    pub name: String,
    /// Size of the process-wide registered-buffer arena (`arena.rs`),
    /// created by the first runtime that asks; 0 asks for none. Each
    /// executor registers the arena with its ring as fixed buffer 0.
    pub registered_buffer_bytes: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            pin: true,
            ring_entries: 1024,
            spin: Duration::from_micros(20),
            spin_io: Duration::from_micros(SPIN_IO_US_DEFAULT),
            defer_taskrun: false,
            submit_early: true,
            name: "granary-rt".into(),
            registered_buffer_bytes: crate::arena::ARENA_BYTES_DEFAULT,
        }
    }
}

impl RuntimeConfig {
    /// The defaults with `threads` executors (0: one per core, as servers'
    /// `-t 0` means) named `name`.
    pub fn with_threads(threads: usize, name: &str) -> RuntimeConfig {
        let d = RuntimeConfig::default();
        RuntimeConfig { threads: if threads == 0 { d.threads } else { threads }, name: name.into(), ..d }
    }
}

/// Counters of one executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeStats {
    pub polls: u64,
    pub spawned: u64,
    pub remote_wakes: u64,
    pub sqes: u64,
    pub cqes: u64,
    /// io_uring_enter calls (submissions and waits).
    pub enters: u64,
    /// Times the executor blocked in the kernel with nothing to do.
    pub sleeps: u64,
    /// Eventfd writes that woke a sleeping executor.
    pub notifies: u64,
    /// Reads and writes submitted as READ_FIXED/WRITE_FIXED (buffers in the
    /// registered arena).
    pub fixed_ops: u64,
    /// Whether this executor's ring registered the arena.
    pub fixed_registered: bool,
    /// File reads and writes in flight now, whose futures still wait; while
    /// there are some the executor spins [`RuntimeConfig::spin_io`].
    pub file_ios_in_flight: u64,
    /// Idle periods with file IO in flight in which the executor slept
    /// at once, because recent ones mostly outlasted the spin
    /// ([`SPIN_IO_WINDOW`]).
    pub io_spins_skipped: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    polls: AtomicU64,
    spawned: AtomicU64,
    remote_wakes: AtomicU64,
    pub(crate) sqes: AtomicU64,
    cqes: AtomicU64,
    pub(crate) enters: AtomicU64,
    sleeps: AtomicU64,
    notifies: AtomicU64,
    pub(crate) fixed_ops: AtomicU64,
    fixed_registered: AtomicBool,
    /// File reads and writes in flight (a gauge; see [`FileIo`]).
    file_ios: AtomicU64,
    io_spins_skipped: AtomicU64,
}

type SendTask = Pin<Box<dyn Future<Output = ()> + Send>>;
type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

#[derive(Default)]
struct Remote {
    wakes: Vec<Key>,
    spawns: Vec<SendTask>,
    /// The executor stopped (its teardown began): a task spawned now is
    /// dropped unpolled at once, its JoinHandle answering `Cancelled`.
    closed: bool,
}

/// The part of an executor other threads may touch.
pub(crate) struct Shared {
    id: usize,
    remote: Mutex<Remote>,
    remote_pending: AtomicUsize,
    sleeping: AtomicBool,
    stop: AtomicBool,
    efd: OwnedFd,
    pub(crate) counters: Counters,
}

impl Shared {
    fn push_remote(&self, f: impl FnOnce(&mut Remote)) {
        {
            let mut r = self.remote.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut r);
        }
        self.remote_pending.fetch_add(1, Relaxed);
        // Pairs with the fence in `Executor::sleep`: either the executor sees
        // remote_pending, or we see it sleeping and write the eventfd.
        fence(SeqCst);
        if self.sleeping.load(Relaxed) {
            self.notify();
        }
    }

    fn notify(&self) {
        self.counters.notifies.fetch_add(1, Relaxed);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        let _ = unsafe { libc::write(self.efd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }
}

struct TaskWaker {
    shared: Arc<Shared>,
    key: Key,
    queued: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, AcqRel) {
            return;
        }
        let local = CTX
            .try_with(|c| match &*c.borrow() {
                Some(ex) if Arc::ptr_eq(&ex.shared, &self.shared) => {
                    ex.ready.borrow_mut().push_back(self.key);
                    true
                }
                _ => false,
            })
            .unwrap_or(false);
        if !local {
            self.shared.counters.remote_wakes.fetch_add(1, Relaxed);
            let key = self.key;
            self.shared.push_remote(|r| r.wakes.push(key));
        }
    }
}

struct Task {
    fut: Option<LocalTask>,
    waker: Option<Arc<TaskWaker>>,
}

/// The next [`Executor::serial`].
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The executor of the current thread (thread-local, single-threaded).
pub(crate) struct Executor {
    /// Unique among every executor this process made: tells an operation
    /// whether it is on the executor whose ring it was submitted to.
    pub(crate) serial: u64,
    pub(crate) shared: Arc<Shared>,
    tasks: RefCell<Slab<Task>>,
    ready: RefCell<VecDeque<Key>>,
    pub(crate) ring: RefCell<IoUring>,
    pub(crate) ops: RefCell<Slab<OpSlot>>,
    pub(crate) timers: RefCell<Timers>,
    efd_buf: Box<Cell<u64>>,
    efd_armed: Cell<bool>,
    /// The arena is registered with this ring as fixed buffer 0.
    pub(crate) fixed: Cell<bool>,
    /// File IOs started since the last submission (their SQEs are queued).
    file_queued: Cell<u64>,
    /// [`RuntimeConfig::submit_early`].
    submit_early: bool,
    /// Rounds that ran tasks since the executor last waited for work
    /// (saturating).
    rounds_since_idle: Cell<u32>,
    /// Whether to spin while file IO is in flight ([`SPIN_IO_WINDOW`]).
    io_spin: Cell<SpinPolicy>,
    /// Whether the idle spin (no file IO in flight) pays: the same rule
    /// as `io_spin`, with [`RuntimeConfig::spin`] as the budget.
    idle_spin: Cell<SpinPolicy>,
    /// No spin while other tasks wait for the machine's CPUs.
    pressure: RefCell<CpuPressure>,
    /// The teardown began: a task spawned now (by a task being dropped)
    /// is dropped at once, while the ring can still cancel its IO.
    closing: Cell<bool>,
}

/// Counts one file read or write in flight on this executor while alive
/// (dropped with its future, completed or cancelled, on whatever thread).
pub(crate) struct FileIo(Option<Arc<Shared>>);

impl FileIo {
    pub(crate) fn start() -> FileIo {
        FileIo(with_executor(|ex| {
            ex.shared.counters.file_ios.fetch_add(1, Relaxed);
            ex.file_queued.set(ex.file_queued.get() + 1);
            ex.shared.clone()
        }))
    }
}

impl Drop for FileIo {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.counters.file_ios.fetch_sub(1, Relaxed);
        }
    }
}

thread_local! {
    static CTX: RefCell<Option<Rc<Executor>>> = const { RefCell::new(None) };
    pub(crate) static BLOCK_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Run `f` with this thread's executor, if it is a runtime thread.
pub(crate) fn with_executor<R>(f: impl FnOnce(&Rc<Executor>) -> R) -> Option<R> {
    let ex = CTX.try_with(|c| c.borrow().clone()).ok().flatten()?;
    Some(f(&ex))
}

/// True on an executor thread outside [`crate::block_on`]: ring operations
/// may be submitted and awaited.
pub fn on_runtime() -> bool {
    BLOCK_DEPTH.with(|d| d.get() == 0) && CTX.try_with(|c| c.borrow().is_some()).unwrap_or(false)
}

/// The index of the executor running the current thread.
pub fn current_core() -> Option<usize> {
    with_executor(|ex| ex.shared.id)
}

/// Spawn a task on the current executor. Panics outside a runtime thread.
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let (task, handle) = wrap(fut);
    with_executor(|ex| ex.spawn_local(Box::pin(task))).expect("granary_rt::spawn outside a runtime thread");
    handle
}

/// Let other ready tasks run before continuing.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Why a task produced no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The task panicked; the message is the panic payload if it was text.
    Panicked(String),
    /// The runtime shut down before the task finished.
    Cancelled,
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Panicked(m) => write!(f, "task panicked: {m}"),
            JoinError::Cancelled => write!(f, "task cancelled by runtime shutdown"),
        }
    }
}

impl std::error::Error for JoinError {}

struct JoinState<T> {
    result: Option<Result<T, JoinError>>,
    waker: Option<Waker>,
}

struct JoinShared<T> {
    state: Mutex<JoinState<T>>,
    cond: Condvar,
}

impl<T> JoinShared<T> {
    fn complete(&self, r: Result<T, JoinError>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.result.is_none() {
            s.result = Some(r);
        }
        let w = s.waker.take();
        drop(s);
        self.cond.notify_all();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// The output of a spawned task: await it, or [`JoinHandle::join`] it from
/// a thread outside the runtime. Dropping it detaches the task.
pub struct JoinHandle<T> {
    shared: Arc<JoinShared<T>>,
}

impl<T> JoinHandle<T> {
    /// Block the calling thread until the task ends. Do not call it on an
    /// executor thread (it would block the executor).
    pub fn join(self) -> Result<T, JoinError> {
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = s.result.take() {
                return r;
            }
            s = self.shared.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// True once the task has ended.
    pub fn is_finished(&self) -> bool {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).result.is_some()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Marks the join state cancelled if the task is dropped unfinished.
struct CompleteOnDrop<T>(Arc<JoinShared<T>>);

impl<T> Drop for CompleteOnDrop<T> {
    fn drop(&mut self) {
        self.0.complete(Err(JoinError::Cancelled));
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    match p.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_else(|| "non-text panic".into()),
    }
}

/// Wrap a future into a task body that reports to a join handle and turns
/// a panic into [`JoinError::Panicked`] instead of unwinding the executor.
fn wrap<F: Future + 'static>(fut: F) -> (impl Future<Output = ()>, JoinHandle<F::Output>) {
    let shared =
        Arc::new(JoinShared { state: Mutex::new(JoinState { result: None, waker: None }), cond: Condvar::new() });
    let guard = CompleteOnDrop(shared.clone());
    let mut fut = Box::pin(fut);
    let task = async move {
        let r = std::future::poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(JoinError::Panicked(panic_message(p)))),
        })
        .await;
        guard.0.complete(r);
    };
    (task, JoinHandle { shared })
}

/// user_data of the eventfd read (slab keys never reach it: generation
/// u32::MAX with index u32::MAX).
const EFD_USER_DATA: u64 = u64::MAX;
/// user_data of cancel requests, whose completions are ignored.
pub(crate) const CANCEL_USER_DATA: u64 = u64::MAX - 1;

/// Most enters [`Executor::submit_all`] makes while SQEs stay queued (each
/// after reaping what completed): a kernel that keeps refusing that long
/// is not making room.
const SUBMIT_ALL_TRIES: usize = 1000;

impl Executor {
    /// Register the arena with this ring as fixed buffer 0; on failure (a
    /// memlock limit, an old kernel) warn once per process and go on with
    /// unfixed operations.
    fn register_arena(&self, arena: Option<&'static crate::arena::Arena>) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let Some(a) = arena else { return };
        let iov = [a.iovec()];
        // SAFETY: the arena's mapping is never unmapped, so the iovec stays
        // valid for the ring's whole life.
        match unsafe { self.ring.borrow().submitter().register_buffers(&iov) } {
            Ok(()) => {
                self.fixed.set(true);
                self.shared.counters.fixed_registered.store(true, Relaxed);
            }
            Err(e) => {
                if !WARNED.swap(true, Relaxed) {
                    tracing::warn!(bytes = a.bytes(), error = %e,
                        "cannot register the buffer arena with io_uring (RLIMIT_MEMLOCK?); using unfixed IO");
                }
            }
        }
    }

    fn spawn_local(&self, fut: LocalTask) {
        if self.closing.get() {
            drop(fut); // its JoinHandle answers `Cancelled`
            return;
        }
        self.shared.counters.spawned.fetch_add(1, Relaxed);
        let key = self.tasks.borrow_mut().insert(Task { fut: Some(fut), waker: None });
        let waker = Arc::new(TaskWaker { shared: self.shared.clone(), key, queued: AtomicBool::new(true) });
        self.tasks.borrow_mut().get_mut(key).expect("just inserted").waker = Some(waker);
        self.ready.borrow_mut().push_back(key);
    }

    fn poll_task(&self, key: Key) {
        let (fut, waker) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(t) = tasks.get_mut(key) else { return };
            (t.fut.take(), t.waker.clone().expect("waker set at spawn"))
        };
        let Some(mut fut) = fut else { return };
        waker.queued.store(false, Release);
        self.shared.counters.polls.fetch_add(1, Relaxed);
        let w = Waker::from(waker);
        let mut cx = Context::from_waker(&w);
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(()) => {
                self.tasks.borrow_mut().remove(key);
            }
            Poll::Pending => {
                if let Some(t) = self.tasks.borrow_mut().get_mut(key) {
                    t.fut = Some(fut);
                }
            }
        }
    }

    fn drain_remote(&self) {
        if self.shared.remote_pending.load(Acquire) == 0 {
            return;
        }
        self.shared.remote_pending.store(0, Relaxed);
        let r = std::mem::take(&mut *self.shared.remote.lock().unwrap_or_else(|e| e.into_inner()));
        self.ready.borrow_mut().extend(r.wakes);
        for t in r.spawns {
            self.spawn_local(t);
        }
    }

    /// Poll the tasks ready at the start of the round.
    ///
    /// Submissions are batched per round, with one exception (unless
    /// [`RuntimeConfig::submit_early`] is off): file IO goes to the kernel
    /// in the middle of the round,
    /// - right after the task that queued it, in the first
    ///   [`SUBMIT_AT_ONCE_ROUNDS`] rounds after the executor last waited
    ///   for work: it has time to spare, and the device waits on it. At low
    ///   depth a read then goes out as soon as its task queued it instead
    ///   of after every other ready task has run (a round of 32 GETs would
    ///   otherwise hold the first one's read back by the CPU time of the
    ///   other 31, while the device sits idle). At high depth on a virtual
    ///   disk whose queue is kicked once per enter, batches of reads make
    ///   fewer 4 KiB GETs a second than one submission per read, as fio
    ///   submits (docs/BENCHMARKS-HISTORY.md), while the executor has time to spare;
    /// - once it is at least 1/[`SUBMIT_EARLY_DIVISOR`] of the file IO
    ///   already in the kernel, in later rounds: the executor has not
    ///   waited for a while, so its CPU is the bound, and system calls are
    ///   what it would go to (where the disk keeps the executor busy, a
    ///   submission per read loses throughput at high depth).
    ///
    /// Network operations ride along with the next submission.
    fn run_ready(&self) -> io::Result<()> {
        let at_once = self.rounds_since_idle.get() < SUBMIT_AT_ONCE_ROUNDS;
        let n = self.ready.borrow().len();
        if n > 0 {
            // Only rounds that run tasks count (a wait for a timer ends
            // with an empty round before the timer's task is woken).
            self.rounds_since_idle.set(self.rounds_since_idle.get().saturating_add(1));
        }
        for _ in 0..n {
            let Some(key) = self.ready.borrow_mut().pop_front() else { break };
            self.poll_task(key);
            let queued = self.file_queued.get();
            if queued > 0 && self.submit_early {
                let in_kernel = self.shared.counters.file_ios.load(Relaxed).saturating_sub(queued);
                if at_once || queued * SUBMIT_EARLY_DIVISOR >= in_kernel {
                    self.submit()?;
                }
            }
        }
        Ok(())
    }

    /// Submit the queued SQEs (one enter), if any or if task work is
    /// pending; no reaping.
    pub(crate) fn submit(&self) -> io::Result<()> {
        self.file_queued.set(0);
        let mut ring = self.ring.borrow_mut();
        let pending = ring.submission().len();
        if pending > 0 || ring.submission().taskrun() || ring.submission().cq_overflow() {
            self.shared.counters.enters.fetch_add(1, Relaxed);
            match ring.submit() {
                Ok(_) => {}
                Err(e) if op::retryable(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Submit every queued SQE before returning, however many enters it
    /// takes: while the kernel refuses them (EBUSY or EAGAIN: some kernels
    /// refuse submissions while completions overflow the completion queue
    /// and its backlog cannot be flushed) or takes only some, reap completions to make room and enter again. For a
    /// dropped operation, whose SQE must reach the kernel before its
    /// caller can close the descriptor it names. Gives up, with an error,
    /// after [`SUBMIT_ALL_TRIES`] enters that left SQEs queued.
    pub(crate) fn submit_all(&self) -> io::Result<()> {
        self.file_queued.set(0);
        for _ in 0..SUBMIT_ALL_TRIES {
            let left = {
                let mut ring = self.ring.borrow_mut();
                if ring.submission().is_empty() {
                    return Ok(());
                }
                self.shared.counters.enters.fetch_add(1, Relaxed);
                match ring.submit() {
                    Ok(_) => {}
                    Err(e) if op::retryable(&e) => {}
                    Err(e) => return Err(e),
                }
                let left = ring.submission().len();
                left
            };
            if left == 0 {
                return Ok(());
            }
            self.reap();
        }
        Err(io::Error::other(format!("io_uring left SQEs queued after {SUBMIT_ALL_TRIES} submissions")))
    }

    fn arm_eventfd(&self) {
        if self.efd_armed.get() {
            return;
        }
        let sqe = opcode::Read::new(types::Fd(self.shared.efd.as_raw_fd()), self.efd_buf.as_ptr() as *mut u8, 8)
            .build()
            .user_data(EFD_USER_DATA);
        // SAFETY: efd_buf is a heap cell owned by the executor, which outlives
        // every operation in its ring (teardown waits for this read).
        unsafe { op::push_sqe(self, &sqe) };
        self.efd_armed.set(true);
    }

    /// Submit queued SQEs (one enter, if any or if task work is pending)
    /// and process the completion queue.
    fn submit_and_reap(&self) -> io::Result<usize> {
        self.submit()?;
        Ok(self.reap())
    }

    /// Process every completion in the queue; no system call.
    pub(crate) fn reap(&self) -> usize {
        let mut done = Vec::new();
        {
            let mut ring = self.ring.borrow_mut();
            for cqe in ring.completion() {
                done.push((cqe.user_data(), cqe.result()));
            }
        }
        let n = done.len();
        self.shared.counters.cqes.fetch_add(n as u64, Relaxed);
        for (ud, res) in done {
            match ud {
                EFD_USER_DATA => self.efd_armed.set(false),
                CANCEL_USER_DATA => {}
                ud => op::complete(self, Key::from_u64(ud), res),
            }
        }
        n
    }

    fn has_work(&self) -> bool {
        !self.ready.borrow().is_empty() || self.shared.remote_pending.load(Acquire) != 0
    }

    /// Block in the kernel until a completion, the next timer, or a wake-up.
    fn sleep(&self) -> io::Result<()> {
        self.arm_eventfd();
        self.shared.sleeping.store(true, Relaxed);
        fence(SeqCst);
        if self.shared.remote_pending.load(Relaxed) != 0 || self.shared.stop.load(Relaxed) {
            self.shared.sleeping.store(false, Relaxed);
            return Ok(());
        }
        self.shared.counters.sleeps.fetch_add(1, Relaxed);
        self.shared.counters.enters.fetch_add(1, Relaxed);
        let next = self.timers.borrow().next_deadline();
        let r = {
            let ring = self.ring.borrow();
            match next {
                Some(at) => {
                    let d = at.saturating_duration_since(Instant::now());
                    let ts = types::Timespec::new().sec(d.as_secs()).nsec(d.subsec_nanos());
                    let args = types::SubmitArgs::new().timespec(&ts);
                    ring.submitter().submit_with_args(1, &args)
                }
                None => ring.submitter().submit_and_wait(1),
            }
        };
        self.shared.sleeping.store(false, Relaxed);
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ETIME) || op::retryable(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn run(&self) -> io::Result<()> {
        self.arm_eventfd();
        loop {
            self.drain_remote();
            self.run_ready()?;
            let due = self.timers.borrow_mut().take_due(Instant::now());
            due.into_iter().for_each(Waker::wake);
            self.submit_and_reap()?;
            if self.shared.stop.load(Acquire) {
                return Ok(());
            }
            if self.has_work() || self.timers.borrow().due(Instant::now()) {
                continue;
            }
            let io = self.shared.counters.file_ios.load(Relaxed) > 0;
            // The policy of this idle period's spin: for IO in flight, or
            // for the next request (`RuntimeConfig::spin` as its budget).
            let policy_cell = if io { &self.io_spin } else { &self.idle_spin };
            let policy = policy_cell.get();
            let idle_from = Instant::now();
            let contended = self.pressure.borrow_mut().contended(idle_from);
            let spin = match (io, policy.spin() && !contended) {
                (_, true) => policy.budget(),
                (true, false) => {
                    self.shared.counters.io_spins_skipped.fetch_add(1, Relaxed);
                    Duration::ZERO
                }
                (false, false) => Duration::ZERO,
            };
            // The executor waits for work: the next rounds submit file IO
            // at once (see `run_ready`).
            self.rounds_since_idle.set(0);
            let record = |preempted: bool| {
                let mut p = policy_cell.get();
                if preempted {
                    p.preempted();
                } else {
                    p.record(idle_from.elapsed());
                }
                policy_cell.set(p);
            };
            let mut preempted = false;
            if !spin.is_zero() {
                let until = idle_from + spin;
                let mut last = idle_from;
                loop {
                    if self.ring.borrow_mut().submission().taskrun() {
                        self.submit_and_reap()?;
                    } else {
                        self.reap();
                    }
                    let now = Instant::now();
                    if now.saturating_duration_since(last) >= SPIN_PREEMPTED_GAP {
                        preempted = true;
                    }
                    last = now;
                    if preempted || self.has_work() || self.timers.borrow().due(now) || now >= until {
                        break;
                    }
                    std::hint::spin_loop();
                }
                if self.has_work() {
                    record(preempted);
                    continue;
                }
            }
            self.sleep()?;
            self.reap();
            record(preempted);
        }
    }

    /// Drop every task (their operations become orphans), cancel what is in
    /// flight, and wait until the kernel has returned every buffer.
    fn teardown(&self) {
        self.closing.set(true);
        let tasks = self.tasks.borrow_mut().drain();
        drop(tasks);
        // Tasks sent here and not yet taken, and from now on none: each
        // dropped unpolled (its JoinHandle answers `Cancelled`).
        let spawned = {
            let mut r = self.shared.remote.lock().unwrap_or_else(|e| e.into_inner());
            r.closed = true;
            std::mem::take(&mut r.spawns)
        };
        drop(spawned);
        self.ready.borrow_mut().clear();
        self.timers.borrow_mut().clear();
        let cancel = opcode::AsyncCancel::new(EFD_USER_DATA).build().user_data(CANCEL_USER_DATA);
        if self.efd_armed.get() {
            // SAFETY: a cancel SQE carries no buffer.
            unsafe { op::push_sqe(self, &cancel) };
        }
        op::cancel_all(self);
        // Completed operations whose futures live elsewhere (sent to
        // another thread, which leaks their buffers) are never polled
        // again: they hold nothing of the kernel's.
        op::forget_done(self);
        let deadline = Instant::now() + Duration::from_secs(30);
        while (self.ops.borrow().len() > 0 || self.efd_armed.get()) && Instant::now() < deadline {
            // Bounded, so that an operation that never completes (a read
            // of a stuck device cannot be cancelled) ends at the deadline.
            let ts = types::Timespec::new().nsec(100_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let r = self.ring.borrow().submitter().submit_with_args(1, &args);
            if let Err(e) = r {
                if !(e.raw_os_error() == Some(libc::ETIME) || op::retryable(&e)) {
                    break;
                }
            }
            self.reap();
            op::forget_done(self);
            if self.efd_armed.get() {
                // Make the eventfd read complete if the cancel did not.
                self.shared.notify();
            }
        }
        let left = self.ops.borrow().len();
        if left > 0 {
            // Their buffers must outlive the kernel's use: leak them.
            tracing::error!(left, "io_uring operations still in flight at shutdown; leaking their buffers");
            std::mem::forget(self.ops.borrow_mut().drain());
        }
    }
}

impl Drop for Executor {
    /// Dropped without its teardown (the thread unwound from a panic
    /// outside a task, or in a task's drop), the ring closes before the
    /// operations' buffers would be freed, while the kernel may still
    /// write into them: they are leaked instead, as the teardown leaks
    /// what it could not cancel.
    fn drop(&mut self) {
        let left = self.ops.get_mut().len();
        if left > 0 {
            tracing::error!(left, "executor dropped with io_uring operations in flight; leaking their buffers");
            std::mem::forget(self.ops.get_mut().drain());
        }
        if self.efd_armed.get() {
            std::mem::forget(std::mem::replace(&mut self.efd_buf, Box::new(Cell::new(0))));
        }
    }
}

fn build_ring(cfg: &RuntimeConfig) -> io::Result<IoUring> {
    let mut b = IoUring::builder();
    b.setup_cqsize(cfg.ring_entries * 2).setup_single_issuer().setup_taskrun_flag();
    if cfg.defer_taskrun {
        b.setup_defer_taskrun();
    } else {
        b.setup_coop_taskrun();
    }
    b.build(cfg.ring_entries)
}

/// The CPUs this thread may run on (its affinity, which a cpuset or
/// `taskset` narrows: not always 0..n), in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes within
    // it; CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pin this thread to the `id`-th of the CPUs it may run on (modulo
/// their number).
fn pin_to(id: usize) {
    let allowed = allowed_cpus();
    let cpu = match allowed.len() {
        0 => id % std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        n => allowed[id % n],
    };
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; the call
    // only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(cpu, error = %io::Error::last_os_error(), "could not pin executor thread");
        }
    }
}

/// A set of executor threads. Dropping it stops them: unfinished tasks are
/// dropped (their join handles report [`JoinError::Cancelled`]) after their
/// in-flight operations have completed or been cancelled.
pub struct Runtime {
    /// The executors' shared halves: [`Runtime::spawn_on`] spawns through
    /// it, and [`Runtime::spawner`] hands out clones.
    spawner: Spawner,
    threads: Vec<std::thread::JoinHandle<()>>,
    next: AtomicUsize,
}

impl Runtime {
    /// Start `cfg.threads` executors; fails if a ring cannot be set up.
    pub fn new(cfg: RuntimeConfig) -> io::Result<Runtime> {
        let n = cfg.threads.max(1);
        let arena =
            if cfg.registered_buffer_bytes > 0 { crate::arena::init(cfg.registered_buffer_bytes) } else { None };
        // Built as the executors start: a failure midway (an eventfd, a
        // thread) drops it, which stops and joins those already running.
        let mut rt = Runtime {
            spawner: Spawner { shared: Vec::with_capacity(n) },
            threads: Vec::with_capacity(n),
            next: AtomicUsize::new(0),
        };
        let mut ready = Vec::with_capacity(n);
        for id in 0..n {
            // SAFETY: eventfd returns a new descriptor or -1, checked below.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let s = Arc::new(Shared {
                id,
                remote: Mutex::new(Remote::default()),
                remote_pending: AtomicUsize::new(0),
                sleeping: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                // SAFETY: fd is a fresh descriptor we own.
                efd: unsafe { OwnedFd::from_raw_fd(fd) },
                counters: Counters::default(),
            });
            rt.spawner.shared.push(s.clone());
            let cfg = cfg.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            ready.push(rx);
            let t = std::thread::Builder::new().name(format!("{}-{id}", cfg.name)).spawn(move || {
                if cfg.pin {
                    pin_to(id);
                }
                let ring = match build_ring(&cfg) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let ex = Rc::new(Executor {
                    serial: NEXT_SERIAL.fetch_add(1, Relaxed),
                    shared: s,
                    tasks: RefCell::new(Slab::new()),
                    ready: RefCell::new(VecDeque::new()),
                    ring: RefCell::new(ring),
                    ops: RefCell::new(Slab::new()),
                    timers: RefCell::new(Timers::default()),
                    efd_buf: Box::new(Cell::new(0)),
                    efd_armed: Cell::new(false),
                    fixed: Cell::new(false),
                    file_queued: Cell::new(0),
                    rounds_since_idle: Cell::new(0),
                    submit_early: cfg.submit_early,
                    // An idle period with IO in flight spins at least as
                    // long as one without.
                    io_spin: Cell::new(SpinPolicy::new(cfg.spin_io.max(cfg.spin))),
                    idle_spin: Cell::new(SpinPolicy::new(cfg.spin)),
                    pressure: RefCell::new(CpuPressure::open()),
                    closing: Cell::new(false),
                });
                ex.register_arena(arena);
                CTX.with(|c| *c.borrow_mut() = Some(ex.clone()));
                let _ = tx.send(Ok(()));
                // A panic that escapes the executor (past a task's own
                // catch, as a task's `Drop` panicking in teardown) must
                // still close it to spawns, or each later spawn on this
                // core would wait for ever in a queue no one runs.
                let _closes = CloseOnUnwind(&ex.shared);
                if let Err(e) = ex.run() {
                    tracing::error!(core = id, error = %e, "executor stopped on an io_uring error");
                }
                ex.teardown();
                CTX.with(|c| *c.borrow_mut() = None);
            })?;
            rt.threads.push(t);
        }
        for rx in ready {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(io::Error::new(e.kind(), format!("io_uring setup failed: {e}"))),
                Err(_) => return Err(io::Error::other("executor thread died during start-up")),
            }
        }
        Ok(rt)
    }

    /// Number of executors.
    pub fn cores(&self) -> usize {
        self.spawner.cores()
    }

    /// Spawn a task on executor `core` (modulo the executor count).
    pub fn spawn_on<F>(&self, core: usize, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawner.spawn_on(core, fut)
    }

    /// A handle that spawns on this runtime's executors without keeping
    /// the runtime alive (a task may hold it: no reference cycle; a task
    /// spawned after the runtime stopped is dropped unpolled).
    pub fn spawner(&self) -> Spawner {
        self.spawner.clone()
    }

    /// Spawn a task on the executors in turn.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let core = self.next.fetch_add(1, Relaxed);
        self.spawn_on(core, fut)
    }

    /// Run `fut` on executor 0 and wait for it from this (non-runtime) thread.
    pub fn block_on<F>(&self, fut: F) -> Result<F::Output, JoinError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_on(0, fut).join()
    }

    /// Counters per executor.
    pub fn stats(&self) -> Vec<RuntimeStats> {
        self.stats_reader().stats()
    }

    /// A handle that reads [`Runtime::stats`] without keeping the runtime
    /// alive (a task of the runtime may hold it: no reference cycle).
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader(self.spawner.shared.clone())
    }
}

/// Spawns tasks on given executors ([`Runtime::spawner`]).
#[derive(Clone)]
pub struct Spawner {
    shared: Vec<Arc<Shared>>,
}

impl Spawner {
    /// Number of executors.
    pub fn cores(&self) -> usize {
        self.shared.len()
    }

    /// Spawn a task on executor `core` (modulo the executor count), as
    /// [`Runtime::spawn_on`] does: hand it to that executor through its
    /// remote queue.
    pub fn spawn_on<F>(&self, core: usize, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (task, handle) = wrap(fut);
        let task: SendTask = Box::pin(task);
        let shared = &self.shared[core % self.shared.len()];
        let mut refused = None;
        shared.push_remote(|r| {
            if r.closed {
                refused = Some(task);
            } else {
                r.spawns.push(task);
            }
        });
        // Dropped outside the lock (a task's drop may spawn).
        drop(refused);
        handle
    }
}

/// Reads the runtime's counters ([`Runtime::stats_reader`]).
#[derive(Clone)]
pub struct StatsReader(Vec<Arc<Shared>>);

impl StatsReader {
    /// Counters per executor.
    pub fn stats(&self) -> Vec<RuntimeStats> {
        self.0
            .iter()
            .map(|s| {
                let c = &s.counters;
                RuntimeStats {
                    polls: c.polls.load(Relaxed),
                    spawned: c.spawned.load(Relaxed),
                    remote_wakes: c.remote_wakes.load(Relaxed),
                    sqes: c.sqes.load(Relaxed),
                    cqes: c.cqes.load(Relaxed),
                    enters: c.enters.load(Relaxed),
                    sleeps: c.sleeps.load(Relaxed),
                    notifies: c.notifies.load(Relaxed),
                    fixed_ops: c.fixed_ops.load(Relaxed),
                    fixed_registered: c.fixed_registered.load(Relaxed),
                    file_ios_in_flight: c.file_ios.load(Relaxed),
                    io_spins_skipped: c.io_spins_skipped.load(Relaxed),
                }
            })
            .collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for s in &self.spawner.shared {
            s.stop.store(true, Release);
            s.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Closes an executor to spawns if its thread unwinds
/// (`Remote::closed`): what was queued and every later spawn are dropped
/// unpolled, their handles answering `Cancelled`.
struct CloseOnUnwind<'a>(&'a Shared);

impl Drop for CloseOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let spawned = {
                let mut r = self.0.remote.lock().unwrap_or_else(|e| e.into_inner());
                r.closed = true;
                std::mem::take(&mut r.spawns)
            };
            drop(spawned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(200);

    /// Executor `id` pins to the `id`-th CPU its thread may run on, not to
    /// CPU `id`: in a thread narrowed to the last allowed CPU, executor 0
    /// stays there (it pinned to CPU 0 before, outside the narrowed set).
    #[test]
    fn executors_pin_to_the_cpus_their_thread_may_use() {
        let all = allowed_cpus();
        let Some(&last) = all.last().filter(|_| all.len() > 1) else { return };
        let pinned = std::thread::spawn(move || {
            // SAFETY: as in `pin_to`.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(last, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
            }
            pin_to(0);
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![last]);
    }

    /// A fast device keeps the spin on; one slower than the spin turns it
    /// off within about a window of periods, and it comes back once the
    /// device is fast again, though the executor slept meanwhile.
    #[test]
    fn io_spin_follows_the_share_of_short_idle_periods() {
        let mut p = SpinPolicy::new(BUDGET);
        assert!(p.spin(), "starts spinning");
        for _ in 0..1000 {
            p.record(Duration::from_micros(40));
        }
        assert!(p.spin());
        let mut slow = 0;
        while p.spin() {
            p.record(Duration::from_millis(2));
            slow += 1;
            assert!(slow <= SPIN_IO_WINDOW, "a slow device stops the spin within a window");
        }
        assert!(slow >= SPIN_IO_WINDOW / 2 - 1, "one slow period does not stop it: {slow}");
        let mut fast = 0;
        while !p.spin() {
            p.record(Duration::from_micros(40));
            fast += 1;
            assert!(fast <= SPIN_IO_WINDOW, "a fast device brings the spin back");
        }
    }

    /// A preempted spin stops the spin at once; it comes back only after a
    /// run of periods within the budget, so under contention the executor
    /// spins in a small share of its idle periods.
    #[test]
    fn a_preempted_spin_stops_spinning_for_a_run_of_periods() {
        let mut p = SpinPolicy::new(BUDGET);
        p.preempted();
        assert!(!p.spin(), "preempted: no spin");
        let mut fast = 0;
        while !p.spin() {
            p.record(Duration::from_micros(40));
            fast += 1;
            assert!(fast <= SPIN_IO_WINDOW, "periods within the budget bring the spin back");
        }
        assert!(fast >= SPIN_IO_WINDOW / 2, "not at the next short period: {fast}");
    }

    /// Mixed periods: the spin stays on while at least half end within it.
    #[test]
    fn io_spin_needs_half_of_the_periods_short() {
        let mut p = SpinPolicy::new(BUDGET);
        for i in 0..4000 {
            p.record(if i % 3 == 0 { Duration::from_millis(1) } else { BUDGET });
        }
        assert!(p.spin(), "two in three within the budget (the budget itself counts)");
        for i in 0..4000 {
            p.record(if i % 3 == 0 { Duration::from_micros(10) } else { BUDGET + Duration::from_nanos(1) });
        }
        assert!(!p.spin(), "one in three within the budget");
        assert!(!SpinPolicy::new(Duration::ZERO).spin(), "no budget, no spin");
    }
}
