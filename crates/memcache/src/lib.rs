//! Granary's Memcache server: memcached's text protocol (and its meta
//! commands) and its binary protocol, on one port, over the Granary
//! engine, served on the thread-per-core io_uring runtime. Modules, each
//! depending only on those listed before it:
//!
//! - [`limits`]: every bound the server enforces, as named constants.
//! - `parse`: a request line to a request value or memcached's error for
//!   it; pure (no IO, no store).
//! - `binary`: the binary protocol's framing: a request header and body
//!   to a packet or memcached's answer to it; pure.
//! - `context`: what every connection shares: configuration, counters, the
//!   store.
//! - `stats`: the `stats` command's renderings.
//! - `exec` (with `exec::meta`): runs a parsed request against the store
//!   and writes its reply into a reply buffer; no socket.
//! - `conn`: one connection: its buffers and socket, and the request loop.
//! - [`server`]: the protocol on the shared listener lifecycle
//!   (`granary_server`): start, shutdown, configuration and counters.
//!
//! Cache semantics (flags, expiry, CAS values, flush_all, eviction) live in
//! the engine (`granary_store`); this crate translates the protocol to them.
//! docs/MEMCACHE.md describes every command and where Granary differs from
//! memcached.

pub mod limits;
pub mod server;

mod binary;
mod conn;
mod context;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
mod parse;
mod stats;

pub use server::{Server, ServerConfig, ServerStats, COMMANDS};
