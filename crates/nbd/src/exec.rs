//! One transmission request run against its export: checked as the
//! specification asks, split into block operations that run concurrently
//! (a READ's whole blocks as runs of at most [`RUN_BYTES_MAX`], a WRITE's
//! of at most [`WRITE_RUN_BYTES_MAX`], [`RUNS_PER_REQUEST`] at a time;
//! single blocks [`BLOCK_OPS_PER_REQUEST`] at a time), and answered with a
//! simple reply.
//!
//! Invariants:
//! - a request that fails its checks touches no data and is answered with
//!   the error the specification names (`NBD_EINVAL`; `NBD_ENOSPC` for a
//!   WRITE or WRITE_ZEROES past the end);
//! - a WRITE writes whole blocks directly (a run of them with one
//!   [`Export::write_blocks`]) and its partial edge blocks by
//!   read-modify-write under the block's lock ([`Export::update_block`]);
//!   WRITE_ZEROES trims whole blocks (they read as zeroes) and zeroes the
//!   edges the same way; TRIM trims only the whole blocks in its range (the
//!   specification lets a server round a trim inwards);
//! - the reply is built only after every block operation of the request
//!   has ended, so no reply claims a write the export has not
//!   acknowledged; with FUA the export's sync ran after them.

use crate::export::{parts, spans, Export, Geometry, Part, Span};
use crate::limits::{
    BLOCK_OPS_PER_REQUEST, MIN_BLOCK_BYTES, PAYLOAD_BYTES_MAX, RUNS_PER_REQUEST, RUN_BYTES_MAX, WRITE_RUN_BYTES_MAX,
};
use crate::proto::*;
use crate::NbdStats;
use granary_rt::sync::join2;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Poll;

/// The export a connection chose, and what the client agreed to.
pub(crate) struct Target<E> {
    pub export: Arc<E>,
    pub geometry: Geometry,
    /// The client asked for `NBD_INFO_BLOCK_SIZE` in its `NBD_OPT_GO`, so
    /// it promised to keep to the advertised minimum block size: requests
    /// not aligned to it are refused (`NBD_EINVAL`). Other clients get the
    /// protocol's default constraints (any alignment), served by
    /// read-modify-write.
    pub aligned: bool,
}

/// The command flags valid with each command (FUA is valid with all).
fn flags_allowed(kind: u16) -> u16 {
    match kind {
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        _ => CMD_FLAG_FUA,
    }
}

/// Why a request is refused before it runs: the error value of its reply.
pub(crate) fn check<E>(t: &Target<E>, r: &Request) -> Result<(), u32> {
    if r.flags & !flags_allowed(r.kind) != 0 {
        return Err(EINVAL);
    }
    match r.kind {
        CMD_FLUSH => {
            // Reserved: the specification says both must be zero.
            if r.offset != 0 || r.len != 0 {
                return Err(EINVAL);
            }
            return Ok(());
        }
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_CACHE | CMD_WRITE_ZEROES => {}
        _ => return Err(EINVAL),
    }
    if r.kind == CMD_READ && r.len > PAYLOAD_BYTES_MAX {
        return Err(EINVAL);
    }
    // A zero length is unspecified by the protocol; it is refused (as
    // nbdkit does), touching nothing, and the connection goes on.
    if r.len == 0 {
        return Err(EINVAL);
    }
    let inside = r.offset.checked_add(u64::from(r.len)).is_some_and(|end| end <= t.geometry.size_bytes);
    if !inside {
        return Err(if matches!(r.kind, CMD_WRITE | CMD_WRITE_ZEROES) { ENOSPC } else { EINVAL });
    }
    let m = u64::from(MIN_BLOCK_BYTES);
    if t.aligned && !(r.offset.is_multiple_of(m) && u64::from(r.len).is_multiple_of(m)) {
        return Err(EINVAL);
    }
    Ok(())
}

/// The NBD error value of a failed export operation.
pub(crate) fn error_value(e: &io::Error) -> u32 {
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES | libc::EROFS) => EPERM,
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => ENOSPC,
        Some(libc::EINVAL) => EINVAL,
        _ => EIO,
    }
}

/// Run `req` (`payload`: a WRITE's data) and return its reply: the header,
/// followed for a successful READ by the data.
pub(crate) async fn execute<E: Export>(
    t: &Target<E>,
    stats: &NbdStats,
    req: Request,
    payload: Option<Vec<u8>>,
) -> Vec<u8> {
    let counter = match req.kind {
        CMD_READ => Some(&stats.reads),
        CMD_WRITE => Some(&stats.writes),
        CMD_TRIM => Some(&stats.trims),
        CMD_WRITE_ZEROES => Some(&stats.write_zeroes),
        CMD_FLUSH => Some(&stats.flushes),
        CMD_CACHE => Some(&stats.caches),
        _ => None,
    };
    if let Some(c) = counter {
        c.fetch_add(1, Relaxed);
    }
    let error = match check(t, &req) {
        Err(e) => {
            tracing::debug!(
                command = command_name(req.kind),
                flags = req.flags,
                offset = req.offset,
                len = req.len,
                error = e,
                "NBD request refused"
            );
            e
        }
        Ok(()) => {
            let r = match req.kind {
                CMD_READ => return read(t, stats, req).await,
                CMD_WRITE => write(t, stats, &req, payload.as_deref().unwrap_or_default()).await,
                CMD_TRIM => trim(t, &req).await,
                CMD_WRITE_ZEROES => zero(t, stats, &req).await,
                CMD_FLUSH => sync(t, stats).await,
                _ => Ok(()), // CACHE: a hint with nothing to do (no cache).
            };
            let fua = req.flags & CMD_FLAG_FUA != 0 && matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
            let r = match r {
                Ok(()) if fua => sync(t, stats).await,
                r => r,
            };
            match r {
                Ok(()) => 0,
                Err(e) => {
                    tracing::warn!(command = command_name(req.kind), offset = req.offset, len = req.len, error = %e, "NBD request failed");
                    error_value(&e)
                }
            }
        }
    };
    if error != 0 {
        stats.errors.fetch_add(1, Relaxed);
    }
    reply_header(error, req.cookie).to_vec()
}

async fn sync<E: Export>(t: &Target<E>, stats: &NbdStats) -> io::Result<()> {
    stats.syncs.fetch_add(1, Relaxed);
    t.export.sync().await
}

/// A READ: its runs of whole blocks and its edge blocks read concurrently
/// into the reply after its header.
async fn read<E: Export>(t: &Target<E>, stats: &NbdStats, req: Request) -> Vec<u8> {
    let len = req.len as usize;
    let b = t.geometry.block_bytes;
    let mut reply = vec![0u8; REPLY_BYTES + len];
    reply[..REPLY_BYTES].copy_from_slice(&reply_header(0, req.cookie));
    let mut runs: Vec<(u64, &mut [u8])> = Vec::new();
    let mut edges: Vec<(Span, &mut [u8])> = Vec::new();
    let mut rest = &mut reply[REPLY_BYTES..];
    for p in parts(req.offset, len as u64, b, RUN_BYTES_MAX) {
        let (part, tail) = rest.split_at_mut(p.len(b));
        match p {
            Part::Run { first, .. } => runs.push((first, part)),
            Part::Edge(s) => edges.push((s, part)),
        }
        rest = tail;
    }
    let export = &*t.export;
    // The buffer is zeroes already: a block reading as absent, or the part
    // of a short value past its end, stays so.
    let runs = each_concurrent(runs.into_iter(), RUNS_PER_REQUEST, |(first, out)| export.read_blocks(first, out));
    let edges = each_concurrent(edges.into_iter(), BLOCK_OPS_PER_REQUEST, |(s, out)| async move {
        if let Some(v) = export.read_block(s.block).await? {
            // A value shorter than the block (an in-memory export may hold
            // one; a store's export holds whole blocks only) reads as
            // zeroes past its end, even from before the span's start.
            if let Some(held) = v.get(s.at..) {
                let have = held.len().min(s.len);
                out[..have].copy_from_slice(&held[..have]);
            }
        }
        Ok(())
    });
    let r = match join2(runs, edges).await {
        (Err(e), _) | (_, Err(e)) => Err(e),
        _ => Ok(()),
    };
    match r {
        Ok(()) => {
            stats.read_bytes.fetch_add(len as u64, Relaxed);
            reply
        }
        Err(e) => {
            tracing::warn!(offset = req.offset, len = req.len, error = %e, "NBD read failed");
            stats.errors.fetch_add(1, Relaxed);
            reply_header(error_value(&e), req.cookie).to_vec()
        }
    }
}

/// A WRITE: runs of whole blocks written, edge blocks read-modify-written.
async fn write<E: Export>(t: &Target<E>, stats: &NbdStats, req: &Request, data: &[u8]) -> io::Result<()> {
    let b = t.geometry.block_bytes;
    let export = &*t.export;
    each_concurrent(parts(req.offset, data.len() as u64, b, WRITE_RUN_BYTES_MAX), RUNS_PER_REQUEST, |p| async move {
        match p {
            Part::Run { first, count, from } => {
                export.write_blocks(first, &data[from..from + count * b as usize]).await
            }
            Part::Edge(s) => {
                stats.partial_blocks.fetch_add(1, Relaxed);
                export.update_block(s.block, s.at, &data[s.from..s.from + s.len]).await
            }
        }
    })
    .await?;
    stats.written_bytes.fetch_add(data.len() as u64, Relaxed);
    Ok(())
}

/// A TRIM: the whole blocks in the range trimmed; the edges are left (a
/// trim is a hint the server may round inwards).
async fn trim<E: Export>(t: &Target<E>, req: &Request) -> io::Result<()> {
    let b = t.geometry.block_bytes;
    let export = &*t.export;
    let whole = spans(req.offset, u64::from(req.len), b).filter(|s| s.whole(b));
    each_concurrent(whole, BLOCK_OPS_PER_REQUEST, |s| export.trim_block(s.block)).await
}

/// A WRITE_ZEROES: whole blocks trimmed (they read as zeroes), edge blocks
/// zeroed by read-modify-write. Served the same with `NBD_CMD_FLAG_NO_HOLE`
/// (a log-structured store allocates anew on every write, so keeping
/// zeroes written would reserve nothing) and with
/// `NBD_CMD_FLAG_FAST_ZERO` (a trim is faster than a write).
async fn zero<E: Export>(t: &Target<E>, stats: &NbdStats, req: &Request) -> io::Result<()> {
    let b = t.geometry.block_bytes;
    let export = &*t.export;
    let zeroes = vec![0u8; b as usize];
    let zeroes = &zeroes[..];
    each_concurrent(spans(req.offset, u64::from(req.len), b), BLOCK_OPS_PER_REQUEST, |s| async move {
        if s.whole(b) {
            export.trim_block(s.block).await
        } else {
            stats.partial_blocks.fetch_add(1, Relaxed);
            export.update_block(s.block, s.at, &zeroes[..s.len]).await
        }
    })
    .await
}

/// Operations [`each_concurrent`] ends in one poll at most before it
/// gives its executor back (waking itself): operations that never wait
/// (trims of blocks never written) must not hold the executor's other
/// tasks for a whole 4 GiB request.
const ENDED_PER_POLL_MAX: usize = 256;

/// Run `f` on every item, at most `limit` at once, all polled by the
/// calling task; the first error is returned once every started
/// operation has ended (no operation is abandoned half-way; none starts
/// after an error). Yields to the executor after
/// [`ENDED_PER_POLL_MAX`] operations end in one poll.
async fn each_concurrent<T, F, Fut>(mut items: impl Iterator<Item = T>, limit: usize, mut f: F) -> io::Result<()>
where
    F: FnMut(T) -> Fut,
    Fut: Future<Output = io::Result<()>>,
{
    let mut running: Vec<Pin<Box<Fut>>> = Vec::new();
    let mut error: Option<io::Error> = None;
    let mut exhausted = false;
    std::future::poll_fn(|cx| {
        let mut ended_here = 0;
        loop {
            while error.is_none() && !exhausted && running.len() < limit {
                match items.next() {
                    Some(item) => running.push(Box::pin(f(item))),
                    None => exhausted = true,
                }
            }
            let mut ended = false;
            let mut i = 0;
            while i < running.len() {
                match running[i].as_mut().poll(cx) {
                    Poll::Ready(r) => {
                        drop(running.swap_remove(i));
                        if let Err(e) = r {
                            error.get_or_insert(e);
                        }
                        ended = true;
                        ended_here += 1;
                    }
                    Poll::Pending => i += 1,
                }
            }
            if running.is_empty() && (exhausted || error.is_some()) {
                return Poll::Ready(error.take().map_or(Ok(()), Err));
            }
            if !ended {
                return Poll::Pending;
            }
            if ended_here >= ENDED_PER_POLL_MAX {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Wake, Waker};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// Operations that never wait still give the executor back every
    /// `ENDED_PER_POLL_MAX` of them (waking the task to go on), and every
    /// one runs exactly once.
    #[test]
    fn operations_that_never_wait_yield_to_the_executor() {
        let n = 10 * ENDED_PER_POLL_MAX + 7;
        let ran = AtomicUsize::new(0);
        let ran = &ran;
        let mut fut = Box::pin(each_concurrent(0..n, 32, |_| async move {
            ran.fetch_add(1, Relaxed);
            Ok(())
        }));
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut polls = 0;
        loop {
            polls += 1;
            let before = ran.load(Relaxed);
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(r) => break r.unwrap(),
                Poll::Pending => {
                    let ended = ran.load(Relaxed) - before;
                    assert!(ended <= ENDED_PER_POLL_MAX + 32, "poll {polls} ran {ended} operations");
                    assert_eq!(wakes.0.load(Relaxed), polls, "a yield wakes its task");
                }
            }
        }
        assert_eq!(ran.load(Relaxed), n);
        assert_eq!(polls, n.div_ceil(ENDED_PER_POLL_MAX));
    }
}
