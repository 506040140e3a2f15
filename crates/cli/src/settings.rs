//! Every setting of `granary serve`, declared once: its TOML key, its
//! flag as the docs show it, its default and meaning as the docs say them,
//! and how `--print-config` renders its value. The TOML output
//! (`--print-config`) and docs/CONFIG.md's table (`granary serve
//! --print-settings-table`) come from [`SETTINGS`];
//! tests fail when the flags (clap), the configuration file's keys (serde)
//! or the docs disagree with it.

use crate::serve::{Config, Io, LogFormat};

/// One setting.
pub struct Setting {
    /// The key in the TOML file (and in `--print-config`).
    pub key: &'static str,
    /// The flag(s), as docs/CONFIG.md shows them.
    pub flag: &'static str,
    /// The default, as docs/CONFIG.md says it.
    pub default: &'static str,
    /// What it does (docs/CONFIG.md's "meaning").
    pub meaning: &'static str,
    /// Its value in `--print-config`'s TOML; None: not set (a comment).
    pub value: fn(&Config) -> Option<String>,
}

/// A TOML string.
fn q(s: &str) -> String {
    format!("{s:?}")
}

/// Every setting, in the docs' order.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "data",
        flag: "`--data PATH`",
        default: "`granary-data/granary.db`",
        meaning: "store file or block device; a missing file is created (with its directory). A comma-separated list (`/dev/nvme0n1,/dev/nvme1n1`) is a RAID-0 stripe set: missing member files are created (`size` split evenly, 128 KiB stripes; `granary create --stripe-size` chooses another unit), and members may be listed in any order when reopened (a path containing a comma cannot be used)",
        value: |c| Some(q(&c.data.to_string_lossy())),
    },
    Setting {
        key: "size",
        flag: "`--size SIZE`",
        default: "a quarter of the free space where the file goes, at least 64 MiB, at most 1 GiB",
        meaning: "size of a new data file (`1G`, `64GiB`, or bytes), preallocated and written once with zeros at creation (direct IO, progress shown: a filesystem such as ext4 converts a never-written extent at its first direct write under an exclusive lock, which stalls the file's other IO; docs/BENCHMARKS-HISTORY.md, \"A new data file is written once at creation\"; SIGINT/SIGTERM during it removes the file; after a SIGKILL during it the next start removes the file and creates it again); ignored for an existing store",
        value: |c| Some(c.size.to_string()),
    },
    Setting {
        key: "segment_size",
        flag: "`--segment-size SIZE`",
        default: "1/64 of the device (1 MiB..1 GiB), and at least the next power of two above the largest item + 64 KiB",
        meaning: "segment size of a new store",
        value: |c| c.segment_size.map(|s| s.to_string()),
    },
    Setting {
        key: "listen",
        flag: "`-l`, `--listen ADDR`",
        default: "`127.0.0.1`",
        meaning: "address of every listener",
        value: |c| Some(q(&c.listen.to_string())),
    },
    Setting {
        key: "port",
        flag: "`-p`, `--port PORT`",
        default: "`11211`",
        meaning: "Memcache listener",
        value: |c| Some(c.port.to_string()),
    },
    Setting {
        key: "native",
        flag: "`--no-native` (sets false)",
        default: "`true`",
        meaning: "serve the native protocol",
        value: |c| Some(c.native.to_string()),
    },
    Setting {
        key: "native_port",
        flag: "`--native-port PORT`",
        default: "`43345`",
        meaning: "native protocol listener (docs/PROTOCOL.md)",
        value: |c| Some(c.native_port.to_string()),
    },
    Setting {
        key: "threads",
        flag: "`-t`, `--threads N`",
        default: "`0` (one per core)",
        meaning: "executor threads, shared by all listeners",
        value: |c| Some(c.threads.to_string()),
    },
    Setting {
        key: "conn_limit",
        flag: "`-c`, `--conn-limit N`",
        default: "`1024`",
        meaning: "simultaneous connections per listener; more are refused (`SERVER_ERROR too many open connections`, native `BUSY`)",
        value: |c| Some(c.conn_limit.to_string()),
    },
    Setting {
        key: "max_item_size",
        flag: "`-I`, `--max-item-size SIZE`",
        default: "`1m`",
        meaning: "largest value, both protocols (up to 1 GiB; the store's segments must hold it)",
        value: |c| Some(c.max_item_size.to_string()),
    },
    Setting {
        key: "idle_timeout",
        flag: "`--idle-timeout SECS`",
        default: "`0` (never)",
        meaning: "close a connection that sends nothing for this long (memcached's `idle_timeout`; counted as `idle_kicks`)",
        value: |c| Some(c.idle_timeout.to_string()),
    },
    Setting {
        key: "blind_overwrite_mem",
        flag: "`--blind-overwrite-mem SIZE`",
        default: "`64m`",
        meaning: "DRAM for blind overwrites: a set of a key whose index neighbourhood holds one candidate replaces it without first reading the old record (one device read saved per overwrite), keeping the displaced index entry and the key in DRAM (the key plus 160 bytes) until GC, a checkpoint or a reader settles it (docs/ARCHITECTURE.md, \"Blind overwrites\"); past this, overwrites read the old record first; `0` turns them off",
        value: |c| Some(c.blind_overwrite_mem.to_string()),
    },
    Setting {
        key: "io_spin_us",
        flag: "`--io-spin-us N`",
        default: "`200`",
        meaning: "microseconds an executor polls for completions before sleeping in the kernel while device IO it submitted is in flight (a completion is then due within a device latency; sleeping adds a wake-up to each IO); 0 sleeps at once, which spares CPU on a machine shared with other work; at most 1,000,000. With no device IO in flight it polls 20 µs. An executor spins for IO only while at least half of its recent idle periods with IO in flight ended within this time (docs/ARCHITECTURE.md, \"Choices measured\").",
        value: |c| Some(c.io_spin_us.to_string()),
    },
    Setting {
        key: "io_submit_early",
        flag: "`--no-io-submit-early` (sets false)",
        default: "`true`",
        meaning: "submit device IO in the middle of an executor's scheduling round instead of only once per round: right after the request that queued it while the executor has recently waited for work, in batches of at least 1/8 of the device IO in flight while it is busy. Lower device latency and more IOPS when the executor has CPU to spare, more system calls otherwise (docs/ARCHITECTURE.md, \"Choices measured\"; docs/BENCHMARKS-HISTORY.md, \"Submitting at once while the executor has time\" and \"Mid-round submission in `serve`\")",
        value: |c| Some(c.io_submit_early.to_string()),
    },
    Setting {
        key: "metrics",
        flag: "`--metrics ADDR`",
        default: "off (`\"\"`)",
        meaning: "serve Prometheus metrics at `http://ADDR/metrics`",
        value: |c| Some(q(&c.metrics.map(|m| m.to_string()).unwrap_or_default())),
    },
    Setting {
        key: "evict",
        flag: "`--no-evict` (sets false)",
        default: "`true`",
        meaning: "cache mode: evict the least recently used segment when space runs low; false = store mode (full store refuses writes)",
        value: |c| Some(c.evict.to_string()),
    },
    Setting {
        key: "flush",
        flag: "`--flush`",
        default: "`false`",
        meaning: "fdatasync every write before acknowledging it (drives without power-loss protection)",
        value: |c| Some(c.flush.to_string()),
    },
    Setting {
        key: "buffered",
        flag: "`--buffered`",
        default: "`false`",
        meaning: "page cache instead of O_DIRECT (filesystems without direct IO)",
        value: |c| Some(c.buffered.to_string()),
    },
    Setting {
        key: "io",
        flag: "`--io uring\\|sync`",
        default: "`uring`",
        meaning: "device IO of requests: through each executor's io_uring, or blocking pread/pwrite",
        value: |c| Some(q(if c.io == Io::Uring { "uring" } else { "sync" })),
    },
    Setting {
        key: "log_format",
        flag: "`--log-format text\\|json`",
        default: "`text`",
        meaning: "log lines as text, or one JSON object per line",
        value: |c| Some(q(if c.log_format == LogFormat::Json { "json" } else { "text" })),
    },
];

/// The configuration as TOML (what `--print-config` shows; it reads back
/// as the same configuration).
pub fn to_toml(c: &Config) -> String {
    let mut t = String::from("# granary serve: effective configuration (flags > --config file > defaults)\n");
    for s in SETTINGS {
        match (s.value)(c) {
            Some(v) => t += &format!("{} = {v}\n", s.key),
            None => t += &format!("# {}: chosen when the store is created\n", s.key),
        }
    }
    t
}

/// docs/CONFIG.md's settings table.
pub fn markdown_table() -> String {
    let mut t = String::from("| key | flag | default | meaning |\n|---|---|---|---|\n");
    for s in SETTINGS {
        t += &format!("| `{}` | {} | {} | {} |\n", s.key, s.flag, s.default, s.meaning);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{FileConfig, ServeArgs};
    use clap::{Args, FromArgMatches};

    fn repo_file(rel: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// The long flags (`--x`) and short ones (`-x`) a settings row names.
    fn named_flags(flag: &str) -> Vec<String> {
        flag.split(['`', ',', ' ', '(']).filter(|w| w.starts_with('-') && w.len() > 1).map(|w| w.to_string()).collect()
    }

    fn serve_command() -> clap::Command {
        ServeArgs::augment_args(clap::Command::new("serve"))
    }

    #[test]
    fn config_md_table_is_the_settings_table() {
        let doc = repo_file("docs/CONFIG.md");
        let table = markdown_table();
        assert!(
            doc.contains(&table),
            "docs/CONFIG.md's settings table disagrees with crates/cli/src/settings.rs \
             (`granary serve --print-settings-table` prints it); it must read:\n{table}"
        );
    }

    #[test]
    fn every_serve_flag_is_a_setting_and_every_setting_a_flag() {
        let cmd = serve_command();
        let mut clap_flags: Vec<String> = Vec::new();
        for a in cmd.get_arguments() {
            if let Some(l) = a.get_long() {
                clap_flags.push(format!("--{l}"));
            }
            if let Some(s) = a.get_short() {
                clap_flags.push(format!("-{s}"));
            }
        }
        let documented: Vec<String> = SETTINGS.iter().flat_map(|s| named_flags(s.flag)).collect();
        for f in &documented {
            assert!(clap_flags.contains(f), "settings.rs names {f}, which `granary serve` does not take");
        }
        // Flags that are not settings: the file itself, and printing it.
        let not_settings = ["--config", "--print-config", "--print-settings-table", "--help", "-h"];
        for f in &clap_flags {
            assert!(
                documented.contains(f) || not_settings.contains(&f.as_str()),
                "`granary serve {f}` is not in settings.rs (and so not in docs/CONFIG.md)"
            );
        }
    }

    #[test]
    fn the_file_takes_exactly_the_settings_keys() {
        // serde names the fields it expects when it meets an unknown one.
        let e = toml::from_str::<FileConfig>("not_a_setting = 1").unwrap_err().to_string();
        let expected = e.split("expected one of").nth(1).unwrap_or_else(|| panic!("{e}"));
        let mut file_keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let mut keys: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        file_keys.sort_unstable();
        keys.sort_unstable();
        assert_eq!(file_keys, keys);
    }

    #[test]
    fn print_config_reads_back_as_the_same_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("g.toml");
        let parse = |args: &[&str]| {
            let m = serve_command().get_matches_from(args);
            Config::resolve(&ServeArgs::from_arg_matches(&m).unwrap()).unwrap()
        };
        let c = parse(&["serve", "--size", "64M", "-p", "12000", "--no-native", "--metrics", "127.0.0.1:9000"]);
        let toml = c.to_toml();
        for s in SETTINGS {
            assert!(toml.contains(&format!("{} = ", s.key)) || toml.contains(&format!("# {}:", s.key)), "{toml}");
        }
        std::fs::write(&file, &toml).unwrap();
        let again = parse(&["serve", "--config", file.to_str().unwrap()]);
        assert_eq!(again.to_toml(), toml);
    }

    #[test]
    fn the_readme_serve_line_names_every_setting_flag() {
        let readme = repo_file("README.md");
        let line = readme.lines().find(|l| l.starts_with("granary serve ")).expect("README has a `granary serve` line");
        for s in SETTINGS {
            let flags = named_flags(s.flag);
            assert!(
                flags.iter().any(|f| line.contains(&format!("[{f} "))
                    || line.contains(&format!("[{f}]"))
                    || line.contains(&format!("| {f}"))),
                "README's `granary serve` line lacks {} ({})",
                s.key,
                s.flag
            );
        }
    }
}
