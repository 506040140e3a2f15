//! One connection: its input and reply buffers, the request loop (read,
//! frame every whole command in the input, run each in order, send the
//! replies once no whole command is left: pipelining), and the commands
//! that act on the connection itself: QUIT, HELLO, AUTH, MULTI, EXEC,
//! DISCARD, WATCH, UNWATCH.
//!
//! Invariants:
//! - with a `requirepass` (or an ACL file whose `default` user needs a
//!   password or is off), a connection runs only the commands flagged
//!   `no_auth` (AUTH, HELLO, QUIT) until AUTH or HELLO ... AUTH succeeds;
//!   a user without permissions (`crate::acl`) runs only those, ever;
//! - commands run one at a time, in the order sent, and each reply is
//!   written in that order;
//! - between MULTI and EXEC a command is checked (known, arity) and queued;
//!   a refused one makes EXEC answer `EXECABORT`; EXEC runs the queue as
//!   one transaction (`keys::Overlay`), committed as one atomic batch, run
//!   again if a key it read changed, aborted (null reply) if a WATCHed key
//!   changed since WATCH;
//! - a protocol error is answered and the connection closed, after the
//!   replies of the commands before it;
//! - once the listener drains, what was read is run and answered, and
//!   nothing more is read.

use crate::exec::{self, arity_error, cstr, lookup, run_direct, unknown_command, Client, Cmd, Ctx, Cx, Fail};
use crate::keys::{Commit, Overlay, Txn};
use crate::limits::*;
use crate::parse::{parse_i64, Frame, Parser};
use crate::reply::Reply;
use granary_server::{Session, Stream};
use granary_store::BATCH_OPS_MAX;
use std::sync::atomic::Ordering::Relaxed;

/// Send `buf` whole, counted in `bytes_written`; false if the connection
/// is gone. Its allocation is kept up to four flushes' worth.
async fn send(ctx: &Ctx, stream: &Stream, buf: &mut Vec<u8>) -> bool {
    if buf.is_empty() {
        return true;
    }
    ctx.stats.bytes_written.fetch_add(buf.len() as u64, Relaxed);
    stream.send_vec(buf, 4 * OUT_FLUSH_BYTES).await
}

/// One connection's request loop, until the client closes, QUIT, a
/// protocol error, a failed send, the idle timeout or a drain.
pub(crate) async fn serve(session: &Session, ctx: &Ctx) {
    let id = ctx.stats.next_client_id.fetch_add(1, Relaxed) + 1;
    let mut client = Client::new(id);
    // As Redis: a connection is the `default` user, authenticated when
    // that user is `on` and `nopass`.
    let default = ctx.users.default_user();
    client.authenticated = default.needs_no_auth();
    client.permitted = default.permitted();
    let mut parser = Parser::default();
    // Buffers grow with what comes and go while the client is idle.
    let mut input: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let stream = session.stream();
    loop {
        let mut pos = 0;
        let mut close = false;
        while pos < input.len() {
            let buf = &input[pos..];
            parser.unauthenticated = !client.authenticated;
            match parser.next(buf, ctx.bulk_max()) {
                Frame::Incomplete => break,
                Frame::Empty(n) => pos += n,
                Frame::Error(msg) => {
                    ctx.stats.protocol_errors.fetch_add(1, Relaxed);
                    Reply { buf: &mut out, resp3: client.resp3 }
                        .error([&b"ERR Protocol error: "[..], &msg[..]].concat());
                    close = true;
                    break;
                }
                Frame::Multibulk { args, len } => {
                    let argv: Vec<&[u8]> = args.iter().map(|&(a, b)| &buf[a..b]).collect();
                    command(ctx, &mut client, &argv, &mut out).await;
                    pos += len;
                }
                Frame::Inline { args, len } => {
                    let argv: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
                    command(ctx, &mut client, &argv, &mut out).await;
                    pos += len;
                }
            }
            if client.quit {
                close = true;
                break;
            }
            if out.len() >= OUT_FLUSH_BYTES && !send(ctx, stream, &mut out).await {
                return;
            }
        }
        input.drain(..pos);
        if !send(ctx, stream, &mut out).await || close {
            return;
        }
        if out.capacity() > granary_server::OUTPUT_KEEP_BYTES {
            out = Vec::new();
        }
        if session.recv_into(&mut input).await.is_err() {
            return;
        }
    }
}

/// Run (or queue) one command and write its reply.
async fn command(ctx: &Ctx, client: &mut Client, args: &[&[u8]], out: &mut Vec<u8>) {
    let resp3 = client.resp3;
    let fail = |client: &mut Client, out: &mut Vec<u8>, msg: &[u8], abort: bool| {
        if abort {
            // EXEC aborts: the queue is let go now, not held until then.
            if let Some(m) = client.multi.as_mut() {
                *m = exec::Multi { refused: true, ..Default::default() };
            }
        }
        ctx.stats.errors.fetch_add(1, Relaxed);
        Reply { buf: out, resp3 }.error(msg);
    };
    let Some(spec) = lookup(args[0]) else {
        return fail(client, out, &unknown_command(args), true);
    };
    // A refusal of the command before it runs (`why`, without the `ERR`
    // prefix of an error Redis formats). Redis discards the transaction
    // (and the WATCHes) when it refuses EXEC itself, in MULTI or not, and
    // says why after EXECABORT.
    let refuse = |client: &mut Client, out: &mut Vec<u8>, why: &str, err_prefix: bool| {
        if spec.cmd == Cmd::Exec {
            client.multi = None;
            client.watched.clear();
            client.watch_dirty = false;
            let msg = format!("EXECABORT Transaction discarded because of: {why}");
            return fail(client, out, msg.as_bytes(), false);
        }
        let msg = if err_prefix { format!("ERR {why}") } else { why.to_string() };
        fail(client, out, msg.as_bytes(), true)
    };
    if !exec::arity_ok(spec.arity, args.len()) {
        return refuse(client, out, &arity_error(spec.name)[4..], true);
    }
    if let Err(e) = exec::check_subcommand(spec, args) {
        return fail(client, out, e.as_ref(), true);
    }
    // As Redis: after the command's existence and arity, before anything
    // else, only the commands flagged `no_auth` run unauthenticated.
    if !client.authenticated && !spec.flags.contains(&"no_auth") {
        return refuse(client, out, "NOAUTH Authentication required.", false);
    }
    // Then the user's permissions: all or none (crate::acl).
    if !client.permitted && !spec.flags.contains(&"no_auth") {
        let msg = format!("NOPERM this user has no permissions to run the '{}' command", exec::full_name(spec, args));
        return refuse(client, out, &msg, false);
    }
    let queue =
        client.multi.is_some() && !matches!(spec.cmd, Cmd::Exec | Cmd::Discard | Cmd::Multi | Cmd::Watch | Cmd::Quit);
    if queue {
        if matches!(spec.cmd, Cmd::Flushdb | Cmd::Flushall | Cmd::Hello | Cmd::Auth) {
            let msg = format!("ERR {} inside MULTI is not supported (docs/RESP.md)", spec.name.to_ascii_uppercase());
            return fail(client, out, msg.as_bytes(), true);
        }
        let m = client.multi.as_mut().expect("in MULTI");
        if m.refused {
            // EXEC will abort: answered as Redis does, and not kept.
            Reply { buf: out, resp3 }.simple("QUEUED");
            return;
        }
        if m.queue.len() >= MULTI_QUEUE_MAX {
            return fail(client, out, format!("ERR MULTI queues at most {MULTI_QUEUE_MAX} commands").as_bytes(), true);
        }
        let bytes = exec::queued_bytes(args);
        if m.bytes + bytes > MULTI_QUEUE_BYTES_MAX {
            let msg = format!(
                "ERR MULTI queues at most {MULTI_QUEUE_BYTES_MAX} bytes of commands ({} queued, this one {bytes})",
                m.bytes
            );
            return fail(client, out, msg.as_bytes(), true);
        }
        m.bytes += bytes;
        m.queue.push(args.iter().map(|a| a.to_vec()).collect());
        Reply { buf: out, resp3 }.simple("QUEUED");
        return;
    }
    let mut r = Reply { buf: out, resp3 };
    match spec.cmd {
        Cmd::Quit => {
            r.ok();
            client.quit = true;
        }
        Cmd::Hello => {
            if let Err(e) = hello(ctx, client, args, out) {
                fail(client, out, e.as_ref(), false);
            }
        }
        Cmd::Auth => match auth(ctx, client, args) {
            Ok(()) => r.ok(),
            Err(e) => fail(client, out, e.as_ref(), false),
        },
        Cmd::Multi => {
            if client.multi.is_some() {
                return fail(client, out, b"ERR MULTI calls can not be nested", false);
            }
            client.multi = Some(exec::Multi::default());
            r.ok();
        }
        Cmd::Discard => {
            if client.multi.take().is_none() {
                return fail(client, out, b"ERR DISCARD without MULTI", false);
            }
            client.watched.clear();
            client.watch_dirty = false;
            r.ok();
        }
        Cmd::Unwatch => {
            client.watched.clear();
            client.watch_dirty = false;
            r.ok();
        }
        Cmd::Watch => {
            if client.multi.is_some() {
                return fail(client, out, b"ERR WATCH inside MULTI is not allowed", false);
            }
            if client.watched.len() + args.len() - 1 > WATCH_KEYS_MAX {
                let msg = format!("ERR a connection may WATCH at most {WATCH_KEYS_MAX} keys");
                return fail(client, out, msg.as_bytes(), false);
            }
            let ns = match ctx.db(client.db).await {
                Ok(ns) => ns,
                Err(e) => return fail(client, out, format!("ERR {e}").as_bytes(), false),
            };
            for key in &args[1..] {
                if client.watched.iter().any(|(d, k, _)| *d == client.db && k == key) {
                    continue;
                }
                match ns.get_item_async(key).await {
                    Ok(item) => client.watched.push((client.db, key.to_vec(), Overlay::live_version(item.as_ref()))),
                    Err(e) => return fail(client, out, format!("ERR {e}").as_bytes(), false),
                }
            }
            Reply { buf: out, resp3 }.ok();
        }
        Cmd::Exec => exec_queue(ctx, client, out).await,
        _ => run_direct(ctx, client, spec, args, out).await,
    }
}

/// HELLO [protover [AUTH username password] [SETNAME clientname]].
fn hello(ctx: &Ctx, client: &mut Client, a: &[&[u8]], out: &mut Vec<u8>) -> Result<(), Fail> {
    let mut proto = if client.resp3 { 3 } else { 2 };
    if a.len() >= 2 {
        let v = parse_i64(a[1]).ok_or(Fail::from("ERR Protocol version is not an integer or out of range"))?;
        if !(2..=3).contains(&v) {
            return Err("NOPROTO unsupported protocol version".into());
        }
        proto = v;
    }
    // As Redis: each option acts as it is read, so a SETNAME before a
    // refused option stays.
    let mut j = 2;
    while j < a.len() {
        let more = a.len() - j - 1;
        if a[j].eq_ignore_ascii_case(b"auth") && more >= 2 {
            check_user(ctx, client, a[j + 1], a[j + 2])?;
            j += 3;
        } else if a[j].eq_ignore_ascii_case(b"setname") && more >= 1 {
            client.name = exec::client_name(a[j + 1])?;
            j += 2;
        } else {
            return Err([&b"ERR Syntax error in HELLO option '"[..], cstr(a[j]), b"'"].concat().into());
        }
    }
    if !client.authenticated {
        return Err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO \
                    AUTH <user> <pass> option can be used to authenticate the client and select the RESP \
                    protocol version at the same time"
            .into());
    }
    if proto == 3 && !client.resp3 {
        ctx.stats.resp3_connections.fetch_add(1, Relaxed);
    }
    client.resp3 = proto == 3;
    let mut r = Reply { buf: out, resp3: client.resp3 };
    r.map(7);
    for (k, v) in [("server", "redis"), ("version", "7.0.0")] {
        r.bulk(k.as_bytes());
        r.bulk(v.as_bytes());
    }
    r.bulk(b"proto");
    r.int(proto);
    r.bulk(b"id");
    r.int(client.id as i64);
    for (k, v) in [("mode", "standalone"), ("role", "master")] {
        r.bulk(k.as_bytes());
        r.bulk(v.as_bytes());
    }
    r.bulk(b"modules");
    r.array(0);
    Ok(())
}

/// Redis's reply to a wrong user or password.
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Authenticate `client` as `user` with `pass` (`Ctx::users`: the ACL
/// file's users, or `default` with `requirepass` as its password, or
/// `nopass` without: any password is accepted, as Redis does). A refusal
/// leaves the connection as it was (authenticated or not, as the user it
/// was), as Redis.
fn check_user(ctx: &Ctx, client: &mut Client, user: &[u8], pass: &[u8]) -> Result<(), Fail> {
    let Some(u) = ctx.users.check(user, pass) else {
        ctx.stats.auth_failures.fetch_add(1, Relaxed);
        tracing::debug!(client = client.id, "RESP authentication refused");
        return Err(WRONGPASS.into());
    };
    client.authenticated = true;
    client.user = u;
    client.permitted = ctx.users.user(u).permitted();
    Ok(())
}

/// AUTH [username] password.
fn auth(ctx: &Ctx, client: &mut Client, a: &[&[u8]]) -> Result<(), Fail> {
    match a.len() {
        // As Redis: the one-argument form needs a password on `default`.
        2 if ctx.users.default_user().nopass() => {
            Err("ERR AUTH <password> called without any password configured for \
                 the default user. Are you sure your configuration is correct?"
                .into())
        }
        2 => check_user(ctx, client, b"default", a[1]),
        3 => check_user(ctx, client, a[1], a[2]),
        _ => Err("ERR syntax error".into()),
    }
}

/// EXEC: the queued commands as one transaction.
async fn exec_queue(ctx: &Ctx, client: &mut Client, out: &mut Vec<u8>) {
    let resp3 = client.resp3;
    let Some(exec::Multi { queue, refused: bad, .. }) = client.multi.take() else {
        ctx.stats.errors.fetch_add(1, Relaxed);
        return Reply { buf: out, resp3 }.error("ERR EXEC without MULTI");
    };
    let watched = std::mem::take(&mut client.watched);
    let dirty = std::mem::take(&mut client.watch_dirty);
    if bad {
        ctx.stats.errors.fetch_add(1, Relaxed);
        return Reply { buf: out, resp3 }.error("EXECABORT Transaction discarded because of previous errors.");
    }
    if dirty {
        ctx.stats.txn_aborts.fetch_add(1, Relaxed);
        return Reply { buf: out, resp3 }.null_array();
    }
    let mark = out.len();
    // What the queued commands may change of the connection (SELECT,
    // CLIENT SETNAME/SETINFO; HELLO and AUTH cannot be queued): put back
    // whenever EXEC does not commit, as if nothing had run (Redis runs
    // nothing then).
    let before = (client.db, client.name.clone(), client.lib_name.clone(), client.lib_ver.clone());
    let restore = |client: &mut Client| {
        (client.db, client.name, client.lib_name, client.lib_ver) = before.clone();
    };
    let fail = |client: &mut Client, out: &mut Vec<u8>, msg: &str| {
        restore(client);
        out.truncate(mark);
        ctx.stats.errors.fetch_add(1, Relaxed);
        Reply { buf: out, resp3 }.error(msg);
    };
    for _ in 0..TXN_RETRIES_MAX {
        out.truncate(mark);
        let mut overlay = Overlay::default();
        for (db, key, cas) in &watched {
            match ctx.db(*db).await {
                Ok(ns) => overlay.watch(&ns, key, *cas),
                Err(e) => return fail(client, out, &format!("ERR {e}")),
            }
        }
        match overlay.watched_changed().await {
            Ok(false) => {}
            Ok(true) => {
                ctx.stats.txn_aborts.fetch_add(1, Relaxed);
                return Reply { buf: out, resp3 }.null_array();
            }
            Err(e) => return fail(client, out, &format!("ERR {e}")),
        }
        let ns = match ctx.db(client.db).await {
            Ok(ns) => ns,
            Err(e) => return fail(client, out, &format!("ERR {e}")),
        };
        {
            let mut cx = Cx {
                ctx,
                client: &mut *client,
                k: Txn { overlay: &mut overlay, ns },
                r: Reply { buf: &mut *out, resp3 },
            };
            cx.r.array(queue.len());
            for args in &queue {
                let argv: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
                let spec = lookup(argv[0]).expect("queued commands are known");
                if spec.cmd == Cmd::Unwatch {
                    cx.r.ok();
                    continue;
                }
                cx.run_replying(spec, &argv).await;
            }
        }
        if overlay.len() > BATCH_OPS_MAX {
            return fail(
                client,
                out,
                &format!("ERR EXEC touches {} keys; one transaction holds at most {BATCH_OPS_MAX}", overlay.len()),
            );
        }
        match overlay.commit(&ctx.store).await {
            Ok(Commit::Done) => {
                ctx.stats.txn_commits.fetch_add(1, Relaxed);
                return;
            }
            Ok(Commit::Aborted) => {
                ctx.stats.txn_aborts.fetch_add(1, Relaxed);
                restore(client);
                out.truncate(mark);
                return Reply { buf: out, resp3 }.null_array();
            }
            Ok(Commit::Retry) => {
                ctx.stats.txn_retries.fetch_add(1, Relaxed);
                restore(client);
            }
            Err(e) => return fail(client, out, &format!("ERR {e}")),
        }
    }
    fail(client, out, "ERR the keys this transaction read kept changing; try again")
}
