//! Keys spread over several servers by consistent hashing.

use crate::ketama::Ketama;
use crate::{as_batch, as_deleted, as_stored, as_value, as_values};
use crate::{BatchOp, BatchResult, Client, ClientConfig, Error, PutMode, Request, Result};
use std::net::{SocketAddr, ToSocketAddrs};

/// A client of several servers: each key lives on the server the ketama
/// ring ([`crate::ketama`]) names for it. Servers are named by the
/// "host:port" text they were given, so every client given the same list
/// (in any order) places keys alike, as other ketama clients do.
pub struct ShardedClient {
    ring: Ketama,
    servers: Vec<Client>,
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
            let addr: SocketAddr = s
                .as_ref()
                .to_socket_addrs()
                .map_err(Error::Io)?
                .next()
                .ok_or_else(|| Error::Io(std::io::Error::other(format!("{} resolves to nothing", s.as_ref()))))?;
            clients.push(Client::lazy(addr, cfg.clone()));
        }
        Ok(ShardedClient { ring: Ketama::new(servers), servers: clients })
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
        let groups = self.groups(keys.iter().copied());
        let mut pending = Vec::new();
        for (s, idx) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let ks: Vec<&[u8]> = idx.iter().map(|&i| keys[i]).collect();
            pending.push((idx, self.servers[s].send(&Request::MultiGet(ks))?));
        }
        let mut out = vec![None; keys.len()];
        for (idx, p) in pending {
            for (&i, v) in idx.iter().zip(as_values(p.wait()?, idx.len())?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// Several operations: one BATCH per server involved (in the given
    /// order within each server, so operations on one key stay in order).
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        let groups = self.groups(ops.iter().map(|o| o.key()));
        let mut pending = Vec::new();
        for (s, idx) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let part: Vec<BatchOp> = idx.iter().map(|&i| ops[i].clone()).collect();
            let p = self.servers[s].send(&Request::Batch(part.clone()))?;
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

    /// Single-key requests pipelined across servers: every request is sent
    /// before any response is awaited.
    pub fn put_many(&self, items: &[(&[u8], &[u8])]) -> Result<()> {
        let mut pending = Vec::with_capacity(items.len());
        for (k, v) in items {
            pending.push(self.client(k).send(&Request::Put { key: k, value: v, mode: PutMode::Upsert })?);
        }
        for p in pending {
            as_stored(p.wait()?)?;
        }
        Ok(())
    }

    /// GETs pipelined across servers, as [`ShardedClient::put_many`].
    pub fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut pending = Vec::with_capacity(keys.len());
        for k in keys {
            pending.push(self.client(k).send(&Request::Get(k))?);
        }
        pending.into_iter().map(|p| as_value(p.wait()?)).collect()
    }

    /// DELETEs pipelined across servers; whether each key was present.
    pub fn delete_many(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        let mut pending = Vec::with_capacity(keys.len());
        for k in keys {
            pending.push(self.client(k).send(&Request::Delete(k))?);
        }
        pending.into_iter().map(|p| as_deleted(p.wait()?)).collect()
    }
}
