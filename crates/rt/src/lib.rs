//! Granary's thread-per-core task runtime (uDepot's TRT, on io_uring).
//!
//! A [`Runtime`] runs one executor thread per core, pinned by default. Each
//! executor owns cooperative tasks (futures; they never migrate), a timer
//! list, and one io_uring instance that serves both storage (read/write on
//! files and block devices) and network (accept/recv/send/connect) IO.
//!
//! The scheduler round (see `executor.rs`): drain cross-core messages, poll
//! the ready tasks, fire due timers, submit every SQE the round produced
//! with one `io_uring_enter`, and reap the completion queue (a memory read,
//! no system call, when it holds entries). With nothing ready it spins a
//! short while (`RuntimeConfig::spin`; `RuntimeConfig::spin_io` while file
//! reads or writes it submitted are in flight) on the completion queue and
//! the cross-core queue, then blocks in `io_uring_enter` until a completion, the
//! next timer, or a cross-core wake-up (an eventfd read kept armed in the
//! ring). It never spins at 100 % when idle.
//!
//! Buffer safety (`op.rs`): an operation owns its buffer until the kernel
//! reports completion. Dropping an operation's future before then moves the
//! buffer into the executor's table of orphaned operations, asks the kernel
//! to cancel, and frees the buffer only when the completion arrives.
//!
//! Registered buffers (`arena.rs`): a process-wide arena of aligned memory
//! that every ring registers as fixed buffer 0; reads and writes into it go
//! out as READ_FIXED/WRITE_FIXED, sparing the kernel the page pinning of
//! each IO. `granary-io`'s `AlignedBuf` takes its memory from the arena.
//!
//! Outside a runtime thread (or inside [`block_on`] on one), code cannot
//! submit to an executor's ring; [`on_runtime`] tells IO backends so, and
//! they use a thread's private ring instead (`sync_ring`: submit one
//! operation, wait for it) or synchronous system calls.

pub mod arena;
mod blocking;
mod executor;
pub mod latency;
pub mod metrics;
pub mod net;
mod op;
mod pressure;
mod slab;
pub mod sync;
pub mod sync_ring;
mod time;
pub mod window;

pub use blocking::block_on;
pub use executor::{
    current_core, on_runtime, spawn, yield_now, JoinError, JoinHandle, Runtime, RuntimeConfig, RuntimeStats, Spawner,
    SpinPolicy, StatsReader, SPIN_IO_US_DEFAULT, SPIN_IO_WINDOW, SPIN_PREEMPTED_GAP, SUBMIT_AT_ONCE_ROUNDS,
    SUBMIT_EARLY_DIVISOR,
};
pub use op::{fdatasync, read_at, write_at, IoBuf};
pub use pressure::{CONTENDED_STALL_PCT, PRESSURE_PERIOD};
pub use time::{sleep, sleep_until, timeout, Elapsed};
pub use window::Window;
