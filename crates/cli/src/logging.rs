//! Logs on stderr and the commands' exit: errors are one line on stderr
//! and exit code 2; internal errors (panics) are one line too, never a
//! backtrace.

use std::process::ExitCode;

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
        eprintln!("{program}: internal error: {info}; please report this");
    }));
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
