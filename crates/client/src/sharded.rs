//! Keys spread over several servers by consistent hashing; namespaces
//! managed on every server at once.

use crate::ketama::Ketama;
use crate::Connection;
use crate::{as_batch, as_deleted, as_done, as_ns_list, as_ns_stats, as_stored, as_value, as_values};
use crate::{
    BatchOp, BatchResult, Client, ClientConfig, Error, Item, NamespaceOptions, NamespaceStats, Pending, PutMode,
    Request, Response, Result, TxnOp, TxnOutcome, DEFAULT_NAMESPACE,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A client of several servers: each key lives on the server the ketama
/// ring ([`crate::ketama`]) names for it. With [`ShardedClient::new`]
/// servers are named by the "host:port" text they were given, so every
/// client given the same list places keys alike, as other libketama
/// clients do (in any order too, but for the rare key on a ring point two
/// servers share: it goes to the one listed first).
/// [`ShardedClient::twemproxy`] places keys as a nutcracker pool does (its `servers:` lines, in order), so the client and
/// the proxy address one set of nodes: a key written through the proxy is
/// read here from the node that holds it, and the reverse.
///
/// Namespaces: a key's server does not depend on its namespace (the ring
/// hashes the key alone, as before), so [`ShardedClient::ns`] routes as the
/// plain calls do. A namespace exists on every server: `ns_create`,
/// `ns_drop` and `ns_truncate` are sent to every server (all before any is
/// waited for) and succeed if every server did; otherwise they return the
/// first server's error in list order, and the servers that did it keep
/// it (retrying `ns_create` then meets `NAMESPACE_EXISTS` on those).
/// `ns_stats` and `ns_list` ask every server and add their figures up.
///
/// Transactions: a TXN is atomic on one server, and there are no
/// distributed transactions. [`ShardedClient::txn`] sends a TXN whose keys
/// all map to one server there, and refuses one whose keys span servers
/// ([`Error::CrossServerTxn`], nothing sent). As the ring hashes the key
/// alone, a key is on the same server in every namespace: a TXN over one
/// key in several namespaces always goes to one server.
pub struct ShardedClient {
    ring: Ketama,
    servers: Vec<Client>,
    /// The servers' names as given (for messages).
    names: Vec<String>,
}

impl ShardedClient {
    /// Clients of `servers` ("host:port" each); connections are made on
    /// first use.
    pub fn new<S: AsRef<str>>(servers: &[S], cfg: ClientConfig) -> Result<ShardedClient> {
        if servers.is_empty() {
            return Err(Error::Io(std::io::Error::other("no servers given")));
        }
        let mut clients = Vec::with_capacity(servers.len());
        for s in servers {
            // Connected on first use, to each address the name resolves to
            // in turn (as Client::connect).
            let c = Client::resolve(s.as_ref(), cfg.clone()).map_err(|e| match e {
                Error::Io(e) => Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", s.as_ref()))),
                e => e,
            })?;
            clients.push(c);
        }
        let names = servers.iter().map(|s| s.as_ref().to_string()).collect();
        Ok(ShardedClient { ring: Ketama::new(servers), servers: clients, names })
    }

    /// Clients of `servers` (native "host:port" each) placed by `ring`: a
    /// key goes to `servers[ring.server_of(key)]`, so the lists must be in
    /// the same order and of the same length.
    pub fn with_ring<S: AsRef<str>>(servers: &[S], ring: Ketama, cfg: ClientConfig) -> Result<ShardedClient> {
        if ring.servers() != servers.len() {
            return Err(Error::Io(std::io::Error::other(format!(
                "{} servers for a ring of {}",
                servers.len(),
                ring.servers()
            ))));
        }
        let mut sharded = ShardedClient::new(servers, cfg)?;
        sharded.ring = ring;
        Ok(sharded)
    }

    /// Clients placing keys as a nutcracker pool (`distribution: ketama`,
    /// `hash: md5`) whose `servers:` list is `pool` ("host:port:weight
    /// \[name\]" each, [`crate::ketama::TwemproxyServer::parse`]): key calls
    /// for the pool's server `i` go to the native address `native[i]` (the
    /// same node's native listener). The pool's `hash_tag`, if it has one,
    /// goes to [`Ketama::with_hash_tag`] and [`ShardedClient::with_ring`].
    pub fn twemproxy<S: AsRef<str>, T: AsRef<str>>(
        native: &[S],
        pool: &[T],
        cfg: ClientConfig,
    ) -> Result<ShardedClient> {
        let ring = Ketama::twemproxy_lines(pool).map_err(|e| Error::Io(std::io::Error::other(e)))?;
        ShardedClient::with_ring(native, ring, cfg)
    }

    /// The server owning `key` (its index in the list given to `new`).
    pub fn server_of(&self, key: &[u8]) -> usize {
        self.ring.server_of(key).unwrap_or(0)
    }

    /// The client of server `i`.
    pub fn server(&self, i: usize) -> &Client {
        &self.servers[i]
    }

    fn client(&self, key: &[u8]) -> &Client {
        &self.servers[self.server_of(key)]
    }

    /// The key calls in namespace `name`, each routed to its key's server.
    pub fn ns<'a>(&'a self, name: &'a str) -> ShardedNamespace<'a> {
        ShardedNamespace { sharded: self, name }
    }

    fn default_ns(&self) -> ShardedNamespace<'_> {
        ShardedNamespace { sharded: self, name: "" }
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.default_ns().get(key)
    }
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.default_ns().put(key, value)
    }
    pub fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        self.default_ns().put_with(key, value, mode)
    }
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.default_ns().delete(key)
    }
    pub async fn get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.default_ns().get_async(key).await
    }
    pub async fn put_async(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.default_ns().put_async(key, value).await
    }
    pub async fn delete_async(&self, key: &[u8]) -> Result<bool> {
        self.default_ns().delete_async(key).await
    }
    /// [`Client::get_cas`] on the key's server.
    pub fn get_cas(&self, key: &[u8]) -> Result<Option<Item>> {
        self.default_ns().get_cas(key)
    }
    /// [`Client::delete_cas`] on the key's server.
    pub fn delete_cas(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.default_ns().delete_cas(key, cas)
    }
    pub async fn get_cas_async(&self, key: &[u8]) -> Result<Option<Item>> {
        self.default_ns().get_cas_async(key).await
    }
    pub async fn delete_cas_async(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.default_ns().delete_cas_async(key, cas).await
    }

    /// Positions of `keys` grouped by server.
    fn groups<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Vec<Vec<usize>> {
        let mut g = vec![Vec::new(); self.servers.len()];
        for (i, k) in keys.enumerate() {
            g[self.server_of(k)].push(i);
        }
        g
    }

    /// Values of several keys, in order: one MGET per server involved, all
    /// sent before any is waited for.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.default_ns().mget(keys)
    }

    /// [`ShardedClient::mget`] that keeps what the servers up gave when
    /// others fail: each key's value, or the index of its server that
    /// failed (down, timed out, refusing), and each failed server's
    /// error. `mget` fails whole at the first failure.
    pub fn mget_partial(&self, keys: &[&[u8]]) -> PartialMget {
        self.default_ns().mget_partial(keys)
    }

    /// Several operations: one BATCH per server involved (in the given
    /// order within each server, so operations on one key stay in order).
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        self.default_ns().batch(ops)
    }

    /// Single-key requests pipelined across servers: every request is sent
    /// before any response is awaited.
    pub fn put_many(&self, items: &[(&[u8], &[u8])]) -> Result<()> {
        self.default_ns().put_many(items)
    }

    /// GETs pipelined across servers, as [`ShardedClient::put_many`].
    pub fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.default_ns().get_many(keys)
    }

    /// DELETEs pipelined across servers; whether each key was present.
    pub fn delete_many(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.default_ns().delete_many(keys)
    }

    /// The one server owning every key of `ops` (server 0 for none), or
    /// [`Error::CrossServerTxn`].
    fn txn_server(&self, ops: &[TxnOp]) -> Result<usize> {
        let mut per = vec![0usize; self.servers.len()];
        for o in ops {
            per[self.server_of(o.key)] += 1;
        }
        let involved: Vec<usize> = (0..per.len()).filter(|&i| per[i] > 0).collect();
        match involved[..] {
            [] => Ok(0),
            [s] => Ok(s),
            _ => Err(Error::CrossServerTxn {
                servers: involved.iter().map(|&i| (self.names[i].clone(), per[i])).collect(),
            }),
        }
    }

    /// An atomic TXN ([`Client::txn`]) on the server owning all its keys;
    /// [`Error::CrossServerTxn`] if they map to several (no distributed
    /// transactions: nothing is sent).
    pub fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome> {
        self.servers[self.txn_server(ops)?].txn(ops)
    }

    /// [`ShardedClient::txn`], awaited.
    pub async fn txn_async(&self, ops: &[TxnOp<'_>]) -> Result<TxnOutcome> {
        self.servers[self.txn_server(ops)?].txn_async(ops).await
    }

    /// `req` naming namespace `name`, sent to every server before any
    /// answer is waited for: each server's response, in list order.
    fn broadcast(&self, name: &str, req: &Request) -> Vec<Result<Response>> {
        let sent: Vec<Result<Pending>> = self.servers.iter().map(|c| c.send_in(name.as_bytes(), req)).collect();
        sent.into_iter().map(|p| p.and_then(Pending::wait)).collect()
    }

    /// Every server's answer to a namespace change: Ok if all did it, else
    /// the first error, preferring one that is not "exists" or "no such
    /// namespace" (a caller may take those for done: a server that failed
    /// must not hide behind another that had the change already).
    fn changed(&self, name: &str, req: &Request) -> Result<()> {
        let benign = |e: &Error| {
            matches!(e, Error::Server { status: crate::Status::NamespaceExists | crate::Status::NoSuchNamespace, .. })
        };
        let mut first: Option<Error> = None;
        for r in self.broadcast(name, req) {
            if let Err(e) = r.and_then(|r| as_done(r, req.op())) {
                if first.as_ref().is_none_or(|f| benign(f) && !benign(&e)) {
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Create namespace `name` on every server.
    pub fn ns_create(&self, name: &str, options: NamespaceOptions) -> Result<()> {
        self.changed(name, &Request::NsCreate(options))
    }
    /// Create export `name` on every server ([`crate::Client::create_export`]).
    pub fn create_export(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Result<()> {
        self.ns_create(name, NamespaceOptions::export(size_bytes, block_bytes))
    }
    /// Drop namespace `name` on every server.
    pub fn ns_drop(&self, name: &str) -> Result<()> {
        self.changed(name, &Request::NsDrop)
    }
    /// Empty namespace `name` on every server.
    pub fn ns_truncate(&self, name: &str) -> Result<()> {
        self.changed(name, &Request::NsTruncate)
    }

    /// Namespace `name`'s figures summed over every server (its options
    /// and id are the first server's); an error if a server has no such
    /// namespace.
    pub fn ns_stats(&self, name: &str) -> Result<NamespaceStats> {
        let mut total: Option<NamespaceStats> = None;
        for r in self.broadcast(name, &Request::NsStats) {
            let s = as_ns_stats(r?)?;
            match &mut total {
                Some(t) => add(t, &s),
                None => total = Some(s),
            }
        }
        Ok(total.expect("at least one server"))
    }

    /// Every namespace of any server, with its figures summed over the
    /// servers that have it (its options and id: the first such server's),
    /// the default one first, then by name.
    pub fn ns_list(&self) -> Result<Vec<NamespaceStats>> {
        let sent: Vec<Result<Pending>> = self.servers.iter().map(|c| c.send(&Request::NsList)).collect();
        let mut all: BTreeMap<(bool, String), NamespaceStats> = BTreeMap::new();
        for p in sent {
            for s in as_ns_list(p?.wait()?)? {
                match all.entry((s.name != DEFAULT_NAMESPACE, s.name.clone())) {
                    std::collections::btree_map::Entry::Occupied(mut e) => add(e.get_mut(), &s),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(s);
                    }
                }
            }
        }
        Ok(all.into_values().collect())
    }
}

/// What [`ShardedClient::mget_partial`] read.
#[derive(Debug)]
pub struct PartialMget {
    /// In the order of the keys: `Ok` with the value (None: absent), or
    /// `Err(i)` when the key's server, `i` in the list, failed.
    pub values: Vec<std::result::Result<Option<Vec<u8>>, usize>>,
    /// Each server that failed (its index in the list), with its error, in
    /// list order.
    pub failed: Vec<(usize, Error)>,
}

/// Add `s`'s figures to `t`'s.
fn add(t: &mut NamespaceStats, s: &NamespaceStats) {
    for (a, b) in [
        (&mut t.keys, s.keys),
        (&mut t.value_bytes, s.value_bytes),
        (&mut t.gets, s.gets),
        (&mut t.hits, s.hits),
        (&mut t.misses, s.misses),
        (&mut t.sets, s.sets),
        (&mut t.deletes, s.deletes),
        (&mut t.evictions, s.evictions),
        (&mut t.expirations, s.expirations),
    ] {
        *a = a.saturating_add(b);
    }
}

/// The key calls of a [`ShardedClient`] in one namespace
/// ([`ShardedClient::ns`]), routed as the plain calls are.
#[derive(Clone, Copy)]
pub struct ShardedNamespace<'a> {
    sharded: &'a ShardedClient,
    name: &'a str,
}

impl<'a> ShardedNamespace<'a> {
    pub fn name(&self) -> &'a str {
        self.name
    }

    fn client(&self, key: &[u8]) -> crate::Namespace<'a> {
        self.sharded.client(key).ns(self.name)
    }

    /// `req` in this namespace, on server `s`.
    fn send(&self, s: usize, req: &Request) -> Result<Pending> {
        self.sharded.servers[s].send_in(self.name.as_bytes(), req)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.client(key).get(key)
    }
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.client(key).put(key, value)
    }
    pub fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        self.client(key).put_with(key, value, mode)
    }
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.client(key).delete(key)
    }
    pub async fn get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.client(key).get_async(key).await
    }
    pub async fn put_async(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.client(key).put_async(key, value).await
    }
    pub async fn delete_async(&self, key: &[u8]) -> Result<bool> {
        self.client(key).delete_async(key).await
    }
    pub fn get_cas(&self, key: &[u8]) -> Result<Option<Item>> {
        self.client(key).get_cas(key)
    }
    pub fn delete_cas(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.client(key).delete_cas(key, cas)
    }
    pub async fn get_cas_async(&self, key: &[u8]) -> Result<Option<Item>> {
        self.client(key).get_cas_async(key).await
    }
    pub async fn delete_cas_async(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.client(key).delete_cas_async(key, cas).await
    }

    /// [`ShardedClient::mget`] in this namespace.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let groups = self.sharded.groups(keys.iter().copied());
        let mut pending = Vec::new();
        for (s, idx) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let ks: Vec<&[u8]> = idx.iter().map(|&i| keys[i]).collect();
            pending.push((idx, self.send(s, &Request::MultiGet(ks))?));
        }
        let mut out = vec![None; keys.len()];
        for (idx, p) in pending {
            for (&i, v) in idx.iter().zip(as_values(p.wait()?, idx.len())?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// [`ShardedClient::mget_partial`] in this namespace.
    pub fn mget_partial(&self, keys: &[&[u8]]) -> PartialMget {
        let groups = self.sharded.groups(keys.iter().copied());
        let mut failed = Vec::new();
        let mut pending = Vec::new();
        for (s, idx) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let ks: Vec<&[u8]> = idx.iter().map(|&i| keys[i]).collect();
            match self.send(s, &Request::MultiGet(ks)) {
                Ok(p) => pending.push((s, idx, p)),
                Err(e) => failed.push((s, e)),
            }
        }
        let mut values: Vec<std::result::Result<Option<Vec<u8>>, usize>> = (0..keys.len()).map(|_| Ok(None)).collect();
        for (s, idx, p) in pending {
            match p.wait().and_then(|r| as_values(r, idx.len())) {
                Ok(vs) => {
                    for (&i, v) in idx.iter().zip(vs) {
                        values[i] = Ok(v);
                    }
                }
                Err(e) => failed.push((s, e)),
            }
        }
        failed.sort_by_key(|(s, _)| *s);
        for (s, _) in &failed {
            for &i in &groups[*s] {
                values[i] = Err(*s);
            }
        }
        PartialMget { values, failed }
    }

    /// [`ShardedClient::batch`] in this namespace.
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        let groups = self.sharded.groups(ops.iter().map(|o| o.key()));
        let mut pending = Vec::new();
        for (s, idx) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let part: Vec<BatchOp> = idx.iter().map(|&i| ops[i].clone()).collect();
            let p = self.send(s, &Request::Batch(part.clone()))?;
            pending.push((idx, part, p));
        }
        let mut out: Vec<Option<BatchResult>> = (0..ops.len()).map(|_| None).collect();
        for (idx, part, p) in pending {
            for (&i, r) in idx.iter().zip(as_batch(p.wait()?, &part)?) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().map(|r| r.expect("every position has a result")).collect())
    }

    /// One request per key, in order, each to its key's server, and every
    /// request of one server on one of its connections: the server runs
    /// a connection's requests in the order sent, so two writes of a key
    /// take effect as given (on two connections of a pool they could run
    /// in either order).
    fn send_each<'r>(&self, reqs: impl Iterator<Item = (&'r [u8], Request<'r>)>) -> Result<Vec<Pending>> {
        let mut conns: Vec<Option<Arc<Connection>>> = vec![None; self.sharded.servers.len()];
        let mut pending = Vec::new();
        for (key, req) in reqs {
            let s = self.sharded.server_of(key);
            let conn = match &conns[s] {
                Some(c) => c.clone(),
                None => conns[s].insert(self.sharded.servers[s].conn()?).clone(),
            };
            pending.push(conn.send_in(self.name.as_bytes(), &req)?);
        }
        Ok(pending)
    }

    /// [`ShardedClient::put_many`] in this namespace.
    pub fn put_many(&self, items: &[(&[u8], &[u8])]) -> Result<()> {
        let reqs = items.iter().map(|&(key, value)| (key, Request::Put { key, value, mode: PutMode::Upsert }));
        for p in self.send_each(reqs)? {
            as_stored(p.wait()?)?;
        }
        Ok(())
    }

    /// [`ShardedClient::get_many`] in this namespace.
    pub fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let pending = self.send_each(keys.iter().map(|&k| (k, Request::Get(k))))?;
        pending.into_iter().map(|p| as_value(p.wait()?)).collect()
    }

    /// [`ShardedClient::delete_many`] in this namespace.
    pub fn delete_many(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        let pending = self.send_each(keys.iter().map(|&k| (k, Request::Delete(k))))?;
        pending.into_iter().map(|p| as_deleted(p.wait()?)).collect()
    }

    /// This namespace's figures over every server ([`ShardedClient::ns_stats`]).
    pub fn stats(&self) -> Result<NamespaceStats> {
        self.sharded.ns_stats(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twemproxy_placement_maps_pool_servers_to_native_addresses() {
        let pool = ["127.0.0.2:11211:1 node1", "127.0.0.3:11211:2 node2", "127.0.0.4:11211:1 node3"];
        let native = ["127.0.0.2:43345", "127.0.0.3:43345", "127.0.0.4:43345"];
        let c = ShardedClient::twemproxy(&native, &pool, ClientConfig::default()).unwrap();
        let ring = Ketama::twemproxy_lines(&pool).unwrap();
        let mut seen = [0usize; 3];
        for i in 0..3000 {
            let k = format!("k{i}");
            let s = c.server_of(k.as_bytes());
            assert_eq!(Some(s), ring.server_of(k.as_bytes()));
            seen[s] += 1;
        }
        // Weight 2 holds about half.
        assert!(seen[1] > seen[0] && seen[1] > seen[2], "{seen:?}");
        assert!(ShardedClient::twemproxy(&native[..2], &pool, ClientConfig::default()).is_err());
        assert!(ShardedClient::twemproxy(&native, &["127.0.0.2:11211"], ClientConfig::default()).is_err());
    }
}
