//! The fixed newstyle negotiation, from the greeting to the export the
//! client chose: `NBD_OPT_GO` and `NBD_OPT_INFO` (with `NBD_INFO_EXPORT`
//! always, and `NBD_INFO_NAME`, `NBD_INFO_DESCRIPTION` and
//! `NBD_INFO_BLOCK_SIZE` when asked for), `NBD_OPT_LIST`, `NBD_OPT_ABORT`,
//! `NBD_OPT_EXPORT_NAME` (the old reply), and `NBD_REP_ERR_UNSUP` for every
//! other option (structured replies, TLS, metadata contexts, extended
//! headers), after which the next option is read as usual.
//!
//! Invariants:
//! - the server never reads past the message it expects (each read asks
//!   for exactly the bytes left of it), so nothing the client sends after
//!   choosing an export is lost to the handshake;
//! - option data is held only up to [`OPTION_BYTES_MAX`]; larger data up
//!   to [`OPTION_DISCARD_BYTES_MAX`] is read in chunks and dropped (answered
//!   `NBD_REP_ERR_TOO_BIG`), and anything larger closes the connection: no
//!   buffer is sized by the client beyond these;
//! - the connection is closed (a hard disconnect) only where the
//!   specification allows it: unknown client flags, a bad option magic, an
//!   `NBD_OPT_EXPORT_NAME` that cannot be served (it has no error reply),
//!   an `NBD_OPT_ABORT` (after its ACK), and a client the server deems
//!   abusive (oversized data, [`HANDSHAKE_OPTIONS_MAX`] options, a stall of
//!   [`HANDSHAKE_TIMEOUT`]).

use crate::exec::Target;
use crate::export::{Export, Exports, Geometry};
use crate::limits::*;
use crate::proto::*;
use crate::NbdStats;
use granary_server::{Session, Stream};
use std::io::ErrorKind;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// Why the handshake ended without an export.
#[derive(Debug)]
pub(crate) enum End {
    /// The client closed, the socket failed, or it aborted.
    Closed,
    /// The client broke the protocol, or gave up on it: closed.
    Protocol(&'static str),
}

/// One option as received.
enum Opt {
    /// Its data, at most [`OPTION_BYTES_MAX`].
    Data(u32, Vec<u8>),
    /// Its data was larger and was dropped.
    TooBig(u32),
}

/// Exactly `n` bytes from `stream`, within `deadline`; the bytes are
/// counted as received.
async fn read_exact(stream: &Stream, stats: &NbdStats, n: usize, deadline: Instant) -> Result<Vec<u8>, End> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let (r, b) = match granary_rt::timeout(left, stream.recv(vec![0u8; n - got.len()])).await {
            Ok(x) => x,
            Err(_) => return Err(End::Protocol("handshake timed out")),
        };
        match r {
            Ok(0) => return Err(End::Closed),
            // A receive interrupted before it took anything is tried again.
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "NBD handshake: receive failed; closing");
                return Err(End::Closed);
            }
            Ok(k) => {
                stats.listener.bytes_read.fetch_add(k as u64, Relaxed);
                got.extend_from_slice(&b[..k]);
            }
        }
    }
    Ok(got)
}

async fn send(stream: &Stream, stats: &NbdStats, bytes: Vec<u8>) -> Result<(), End> {
    let n = bytes.len();
    match stream.send_all(bytes).await.0 {
        Ok(()) => {
            stats.bytes_sent.fetch_add(n as u64, Relaxed);
            Ok(())
        }
        Err(e) => {
            tracing::debug!(error = %e, "NBD handshake: send failed; closing");
            Err(End::Closed)
        }
    }
}

/// Send the greeting and read the client's flags: whether it asked for no
/// zeroes after an `NBD_OPT_EXPORT_NAME` reply.
async fn greet(stream: &Stream, stats: &NbdStats, deadline: Instant) -> Result<bool, End> {
    send(stream, stats, greeting().to_vec()).await?;
    let flags = be32(&read_exact(stream, stats, CLIENT_FLAGS_BYTES, deadline).await?);
    // Unknown flags close the connection, as the specification demands. A
    // client without FIXED_NEWSTYLE is still answered in fixed newstyle
    // (which the specification allows); it only sends EXPORT_NAME anyway.
    if flags & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(End::Protocol("unknown client flags"));
    }
    Ok(flags & FLAG_C_NO_ZEROES != 0)
}

/// The next option, its data read (or dropped when too big).
async fn read_option(stream: &Stream, stats: &NbdStats, deadline: Instant) -> Result<Opt, End> {
    let h = read_exact(stream, stats, OPTION_HEADER_BYTES, deadline).await?;
    let h = OptionHeader::decode(h[..].try_into().expect("header"));
    if h.magic != IHAVEOPT {
        return Err(End::Protocol("bad option magic"));
    }
    if h.len <= OPTION_BYTES_MAX {
        return Ok(Opt::Data(h.option, read_exact(stream, stats, h.len as usize, deadline).await?));
    }
    if h.len > OPTION_DISCARD_BYTES_MAX {
        return Err(End::Protocol("option data too large"));
    }
    let mut left = h.len as usize;
    while left > 0 {
        let n = left.min(OPTION_BYTES_MAX as usize);
        read_exact(stream, stats, n, deadline).await?;
        left -= n;
    }
    Ok(Opt::TooBig(h.option))
}

/// An `NBD_OPT_INFO` or `NBD_OPT_GO` request: the name and the information
/// asked for; None if malformed.
pub(crate) fn parse_info(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = be32(data.get(..4)?) as usize;
    let rest = &data[4..];
    let name = rest.get(..name_len)?;
    let rest = &rest[name_len..];
    let n = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let list = &rest[2..];
    if list.len() != 2 * n {
        return None;
    }
    Some((name, list.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect()))
}

/// An export found by name: the export, its geometry, its name.
type Opened<E> = (Arc<E>, Geometry, String);

/// The export `name` and its geometry, or the option error to answer
/// (reply type, message).
pub(crate) fn open<X: Exports>(exports: &X, name: &[u8]) -> Result<Opened<X::Export>, (u32, String)> {
    let shown = String::from_utf8_lossy(name);
    let unknown = || (REP_ERR_UNKNOWN, format!("no export named {shown:?}"));
    let name = std::str::from_utf8(name).map_err(|_| unknown())?;
    if name.len() > EXPORT_NAME_BYTES_MAX {
        return Err((REP_ERR_INVALID, format!("export name longer than {EXPORT_NAME_BYTES_MAX} bytes")));
    }
    let export = exports.open(name).ok_or_else(unknown)?;
    let geometry = Geometry::of(&*export);
    match geometry {
        Ok(g) => Ok((export, g, name.to_string())),
        Err(why) => {
            tracing::warn!(export = name, %why, "NBD export refused");
            Err((REP_ERR_POLICY, format!("export {name:?} cannot be served: {why}")))
        }
    }
}

/// The replies to a successful `NBD_OPT_INFO` or `NBD_OPT_GO`: the
/// export's info, the information asked for, the ACK.
pub(crate) fn info_replies<E: Export>(out: &mut Vec<u8>, option: u32, e: &E, g: &Geometry, name: &str, asked: &[u16]) {
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&g.size_bytes.to_be_bytes());
    export.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
    option_reply(out, option, REP_INFO, &export);
    let mut sent = vec![INFO_EXPORT];
    for &kind in asked {
        if sent.contains(&kind) {
            continue;
        }
        let mut data = kind.to_be_bytes().to_vec();
        match kind {
            INFO_NAME => data.extend_from_slice(name.as_bytes()),
            INFO_DESCRIPTION => {
                let d = e.description();
                if d.is_empty() {
                    continue;
                }
                data.extend_from_slice(d.as_bytes());
            }
            INFO_BLOCK_SIZE => {
                data.extend_from_slice(&MIN_BLOCK_BYTES.to_be_bytes());
                data.extend_from_slice(&g.block_bytes.to_be_bytes());
                data.extend_from_slice(&PAYLOAD_BYTES_MAX.to_be_bytes());
            }
            // Information the server does not know is ignored.
            _ => continue,
        }
        sent.push(kind);
        option_reply(out, option, REP_INFO, &data);
    }
    option_reply(out, option, REP_ACK, &[]);
}

/// Negotiate until the client chooses an export (`Ok`), or the handshake
/// ends without one.
pub(crate) async fn negotiate<X: Exports>(
    session: &Session,
    exports: &X,
    stats: &NbdStats,
) -> Result<Target<X::Export>, End> {
    let stream = &**session.stream();
    let deadline = || Instant::now() + HANDSHAKE_TIMEOUT;
    let no_zeroes = greet(stream, stats, deadline()).await?;
    for _ in 0..HANDSHAKE_OPTIONS_MAX {
        let (option, data) = match read_option(stream, stats, deadline()).await? {
            Opt::Data(o, d) => (o, d),
            // EXPORT_NAME has no error reply: the session ends.
            Opt::TooBig(OPT_EXPORT_NAME) => return Err(End::Protocol("export name too large")),
            // An ABORT's data is ignored, however large.
            Opt::TooBig(OPT_ABORT) => (OPT_ABORT, Vec::new()),
            Opt::TooBig(o) => {
                let mut out = Vec::new();
                option_reply(&mut out, o, REP_ERR_TOO_BIG, b"option data too large");
                send(stream, stats, out).await?;
                continue;
            }
        };
        let mut out = Vec::new();
        if session.stopping() && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return Err(End::Closed);
            }
            option_reply(&mut out, option, REP_ERR_SHUTDOWN, b"server shutting down");
            send(stream, stats, out).await?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                let (export, g, _) = match open(exports, &data) {
                    Ok(x) => x,
                    Err((_, why)) => {
                        tracing::info!(%why, "NBD connection closed at NBD_OPT_EXPORT_NAME");
                        return Err(End::Closed);
                    }
                };
                out.extend_from_slice(&g.size_bytes.to_be_bytes());
                out.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                if !no_zeroes {
                    out.resize(out.len() + EXPORT_NAME_ZEROES, 0);
                }
                send(stream, stats, out).await?;
                return Ok(Target { export, geometry: g, aligned: false });
            }
            OPT_ABORT => {
                // Data with it is ignored, as the specification asks.
                option_reply(&mut out, option, REP_ACK, &[]);
                let _ = send(stream, stats, out).await;
                return Err(End::Closed);
            }
            OPT_LIST if !data.is_empty() => {
                option_reply(&mut out, option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data");
            }
            OPT_LIST => {
                for e in exports.list() {
                    let mut d = (e.name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    option_reply(&mut out, option, REP_SERVER, &d);
                }
                option_reply(&mut out, option, REP_ACK, &[]);
            }
            OPT_INFO | OPT_GO => {
                let Some((name, asked)) = parse_info(&data) else {
                    option_reply(&mut out, option, REP_ERR_INVALID, b"malformed NBD_OPT_INFO or NBD_OPT_GO");
                    send(stream, stats, out).await?;
                    continue;
                };
                match open(exports, name) {
                    Err((reply, why)) => option_reply(&mut out, option, reply, why.as_bytes()),
                    Ok((export, g, name)) => {
                        info_replies(&mut out, option, &*export, &g, &name, &asked);
                        if option == OPT_GO {
                            send(stream, stats, out).await?;
                            let aligned = asked.contains(&INFO_BLOCK_SIZE);
                            return Ok(Target { export, geometry: g, aligned });
                        }
                    }
                }
            }
            _ => {
                let why = format!("option {option} is not supported");
                option_reply(&mut out, option, REP_ERR_UNSUP, why.as_bytes());
            }
        }
        send(stream, stats, out).await?;
    }
    Err(End::Protocol("too many options"))
}

/// Tell a connection over the limit why it is refused: each option it
/// sends is answered `NBD_REP_ERR_POLICY` (an ABORT with its ACK; an
/// EXPORT_NAME, which has no error reply, by closing), for at most
/// [`REFUSED_OPTIONS_MAX`] options and [`REFUSED_TIMEOUT`].
pub(crate) async fn refuse(stream: &Stream, stats: &NbdStats) {
    let deadline = Instant::now() + REFUSED_TIMEOUT;
    let run = async {
        greet(stream, stats, deadline).await?;
        for _ in 0..REFUSED_OPTIONS_MAX {
            let option = match read_option(stream, stats, deadline).await? {
                Opt::Data(o, _) | Opt::TooBig(o) => o,
            };
            let mut out = Vec::new();
            match option {
                OPT_EXPORT_NAME => return Ok(()),
                OPT_ABORT => {
                    option_reply(&mut out, option, REP_ACK, &[]);
                    send(stream, stats, out).await?;
                    return Ok(());
                }
                _ => option_reply(&mut out, option, REP_ERR_POLICY, b"too many connections"),
            }
            send(stream, stats, out).await?;
        }
        Ok::<(), End>(())
    };
    let _ = run.await;
}
