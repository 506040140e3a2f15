//! An NBD server over in-memory exports, for trying clients by hand:
//!
//! ```sh
//! cargo run --release -p granary-nbd --example mem_server -- 127.0.0.1:10809 disk:1G:4096 small:64M
//! nbdinfo --list nbd://127.0.0.1:10809
//! ```
//!
//! Each export is `NAME:SIZE[:BLOCK]` (SIZE with an optional K, M or G
//! suffix; BLOCK 4096 by default). It serves until killed; the data is
//! lost with it.

use granary_nbd::{MemExports, NbdConfig, Server};
use std::sync::Arc;

fn bytes(s: &str) -> u64 {
    let (n, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("bad size {s:?}"));
    n << match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        _ => panic!("bad size unit in {s:?}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:10809".into()).parse().expect("listen address");
    let exports = Arc::new(MemExports::new());
    for spec in args {
        let parts: Vec<&str> = spec.split(':').collect();
        let block = parts.get(2).map_or(4096, |b| bytes(b) as u32);
        exports.add(parts[0], bytes(parts.get(1).expect("NAME:SIZE[:BLOCK]")), block);
    }
    let server = Server::start(exports, NbdConfig { listen, ..NbdConfig::default() }).expect("start");
    eprintln!("serving NBD on {}", server.local_addr());
    loop {
        std::thread::park();
    }
}
