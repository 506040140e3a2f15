//! Granary's Memcache server: memcached's text protocol (and its meta
//! commands) over the Granary engine, served on the thread-per-core
//! io_uring runtime. Module roles:
//!
//! - [`limits`]: every bound the server enforces, as named constants.
//! - `exec`: parsing one request from a connection's input and executing
//!   it against the store (text commands).
//! - `meta`: the meta commands (mg, ms, md, ma, mn, me).
//! - [`server`]: the listener, connections, configuration and counters.
//!
//! Cache semantics (flags, expiry, CAS values, flush_all, eviction) live in
//! the engine (`granary_store`); this crate translates the protocol to them.
//! docs/MEMCACHE.md describes every command and where Granary differs from
//! memcached.

pub mod limits;
pub mod server;

mod exec;
mod meta;

pub use server::{Server, ServerConfig, ServerStats, COMMANDS};
