//! SIGTERM and SIGINT: blocked in every thread so that `granary serve`
//! receives them with `sigwait`, and long work (a new file's zero fill)
//! can poll for one and stop cleanly.

/// The name of a stop signal, for messages.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Block SIGTERM and SIGINT in this thread (and every thread started
/// after); returns the set, for [`wait`].
pub fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// SIGTERM or SIGINT when one is pending (blocked by
/// [`block_stop_signals`] and not yet received).
pub fn pending_stop_signal() -> Option<&'static str> {
    // SAFETY: sigpending fills the set it is given; sigismember reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        if libc::sigismember(&set, libc::SIGTERM) == 1 {
            Some("SIGTERM")
        } else if libc::sigismember(&set, libc::SIGINT) == 1 {
            Some("SIGINT")
        } else {
            None
        }
    }
}

/// Wait for a signal of `set` (blocked); returns its number.
pub fn wait(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set; sigwait writes `sig`.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// Ask this process to stop as SIGTERM asks it (the Memcache `shutdown`
/// command, with `--enable-shutdown`): the signal is blocked in every
/// thread, so it stays pending until the main thread's [`wait`] takes it
/// and runs the ordinary clean stop.
pub fn request_stop() {
    // Once: a second SIGTERM is the "stop now" signal (exit without the
    // clean stop), which a second `shutdown` must not send.
    static SENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SENT.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    // SAFETY: kill with this process's own id and a valid signal number
    // has no memory effects.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
}
