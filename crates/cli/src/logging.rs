//! Logs on stderr and the commands' exit: errors are one line on stderr
//! and exit code 2; internal errors (panics) are one line too, never a
//! backtrace.

use std::process::ExitCode;

/// Whether the environment asks for JSON logs (`GRANARY_LOG_FORMAT=json`:
/// every command's; `granary serve`'s file and flag win over it).
pub fn env_json() -> bool {
    std::env::var("GRANARY_LOG_FORMAT").is_ok_and(|v| v == "json")
}

/// Logs on stderr: text (colored on a terminal) or one JSON object per
/// line. `GRANARY_LOG` sets the filter; the default is quiet: warnings, and
/// the progress of long work (recovery, verify, a new file's zero fill).
pub fn init(json: bool) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,granary_store=info,granary_memcache=warn,granary_native=warn,granary=info,granary_cli=info",
        )
    });
    let b = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    if json {
        b.json().init();
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Report an internal error (a panic) as one line naming the program.
pub fn one_line_panics(program: &'static str) {
    std::panic::set_hook(Box::new(move |info| {
        if is_closed_stdout(info.payload()) {
            return; // `| head` stopped reading: not an error to report
        }
        eprintln!("{program}: internal error: {info}; please report this");
    }));
}

/// Whether a panic is `print!`'s on a standard output whose reader has
/// gone (a closed pipe): the command stops there, its store closed as the
/// panic unwinds, and exits quietly ([`quiet_on_closed_stdout`]).
pub fn is_closed_stdout(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe")
}

/// The exit status of a command whose standard output was closed: what a
/// shell reports for a process SIGPIPE ended (128 + 13), so `set -o
/// pipefail` still sees that the command did not finish.
pub const CLOSED_STDOUT_EXIT: u8 = 141;

/// Run `f`; if it panicked only because its standard output was closed
/// (`granary verify ... | head`), exit quietly with [`CLOSED_STDOUT_EXIT`]
/// instead of reporting an internal error; any other panic goes on.
pub fn quiet_on_closed_stdout(f: impl FnOnce() -> ExitCode) -> ExitCode {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) if is_closed_stdout(&*p) => ExitCode::from(CLOSED_STDOUT_EXIT),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// The exit of a command: its code, or its error on one line and exit 2.
pub fn finish(program: &str, r: Result<ExitCode, String>) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("{program}: error: {msg}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod closed_stdout_tests {
    use super::*;

    /// print!'s panic on a closed pipe ends the command quietly with exit
    /// 141; any other panic still propagates.
    #[test]
    fn a_closed_stdout_ends_quietly_and_other_panics_go_on() {
        let code = quiet_on_closed_stdout(|| panic!("failed printing to stdout: Broken pipe (os error 32)"));
        assert_eq!(code, ExitCode::from(CLOSED_STDOUT_EXIT));
        let other = std::panic::catch_unwind(|| quiet_on_closed_stdout(|| panic!("index out of bounds")));
        assert!(other.is_err(), "another panic is not swallowed");
        assert!(!is_closed_stdout(&"failed printing to stdout: Permission denied"));
    }
}
