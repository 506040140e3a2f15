//! The native-protocol client from Python: `Client` (one server),
//! `ShardedClient` (keys spread over servers by the Rust client's ketama
//! ring: libketama's, or a twemproxy pool's) and `ClientNamespace` (either
//! one's key calls in a namespace).
//!
//! All three hold the same two things, an [`Remote`] shared between the
//! handles made from one client and the namespace name (empty: the default
//! namespace), and have the same key calls as the embedded `Store`, each
//! made with the interpreter released; and `ClientBatch`, an atomic batch
//! sent as one transaction (TXN) when it commits. CAS writes (`put(...,
//! cas=)`, a batch's `put(..., cas=)`) go as a TXN's cas operation;
//! `get_cas` is a GETS, `delete(..., cas=)` a DELETE_CAS and a batch's
//! `delete(..., cas=)` a TXN's delete_cas operation, all three of protocol
//! version 3 (a server that speaks an older version has them refused by
//! the Rust client before anything is sent, raised as
//! `granary.ProtocolError`).

use crate::{keys_of, Data, Fail, Mode, Result};
use granary_client::ketama::Ketama;
use granary_client::{ClientConfig, NamespaceOptions, NamespaceStats, PartialMget, PutMode, TxnOp, TxnOutcome};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::sync::Arc;
use std::time::Duration;

/// A client of one server or of several.
enum Remote {
    One(granary_client::Client),
    Sharded(granary_client::ShardedClient),
}

/// The same call on either kind of client, in namespace `$ns`.
macro_rules! on {
    ($remote:expr, $ns:expr, |$c:ident| $call:expr) => {
        match $remote {
            Remote::One(c) => {
                let $c = c.ns($ns);
                $call
            }
            Remote::Sharded(c) => {
                let $c = c.ns($ns);
                $call
            }
        }
    };
}

impl Remote {
    fn ns_list(&self) -> granary_client::Result<Vec<NamespaceStats>> {
        match self {
            Remote::One(c) => c.ns_list(),
            Remote::Sharded(c) => c.ns_list(),
        }
    }

    fn ns_create(&self, name: &str) -> granary_client::Result<()> {
        match self {
            Remote::One(c) => c.ns_create(name, NamespaceOptions::default()),
            Remote::Sharded(c) => c.ns_create(name, NamespaceOptions::default()),
        }
    }

    fn txn(&self, ops: &[TxnOp]) -> granary_client::Result<TxnOutcome> {
        match self {
            Remote::One(c) => c.txn(ops),
            Remote::Sharded(c) => c.txn(ops),
        }
    }

    fn ns_drop(&self, name: &str) -> granary_client::Result<()> {
        match self {
            Remote::One(c) => c.ns_drop(name),
            Remote::Sharded(c) => c.ns_drop(name),
        }
    }
}

/// How a client proves itself and encrypts: the constructors' `token`
/// (for a server with `--native-token`) and `tls_ca`, `tls_cert`,
/// `tls_key`, `tls_name` (for a server with `--tls-cert`).
#[derive(Default)]
struct Secure {
    token: Option<Vec<u8>>,
    tls_ca: Option<std::path::PathBuf>,
    tls_cert: Option<std::path::PathBuf>,
    tls_key: Option<std::path::PathBuf>,
    tls_name: Option<String>,
}

/// Most connections a client keeps to each server (its pool is made up
/// front).
const CONNECTIONS_MAX: usize = 1024;

fn config(timeout: f64, connections: i64, secure: Secure) -> Result<ClientConfig> {
    // A timeout past what a Duration holds is none in effect (the client
    // takes Duration::MAX as a century); one under a nanosecond is zero.
    let timeout = match Duration::try_from_secs_f64(timeout) {
        Ok(d) if !d.is_zero() => d,
        Err(_) if timeout.is_infinite() || (timeout.is_finite() && timeout > 0.0) => Duration::MAX,
        _ => return Err(Fail::Invalid(format!("timeout must be a positive number of seconds, got {timeout}"))),
    };
    let connections = match usize::try_from(connections) {
        Ok(n) if (1..=CONNECTIONS_MAX).contains(&n) => n,
        _ => return Err(Fail::Invalid(format!("connections must be 1 to {CONNECTIONS_MAX}, got {connections}"))),
    };
    let mut cfg = ClientConfig { timeout, connections, ..ClientConfig::default() };
    if let Some(t) = secure.token {
        if !(1..=granary_client::HELLO_TOKEN_BYTES_MAX).contains(&t.len()) {
            let max = granary_client::HELLO_TOKEN_BYTES_MAX;
            return Err(Fail::Invalid(format!("a token is 1 to {max} bytes, not {}", t.len())));
        }
        cfg = cfg.with_token(t);
    }
    let id = match (secure.tls_cert, secure.tls_key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(Fail::Invalid("tls_cert and tls_key go together".into())),
    };
    match secure.tls_ca {
        Some(ca) => {
            let id = id.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
            let mut tls = granary_client::Tls::from_pem(&ca, id).map_err(|e| Fail::Invalid(e.to_string()))?;
            if let Some(n) = secure.tls_name {
                tls = tls.with_server_name(n);
            }
            cfg = cfg.with_tls(tls);
        }
        None if id.is_some() || secure.tls_name.is_some() => {
            return Err(Fail::Invalid("tls_cert, tls_key and tls_name need tls_ca".into()))
        }
        None => {}
    }
    Ok(cfg)
}

/// A client's construction failed: an address that does not resolve
/// (the client's `Io` error there) is a bad argument.
fn bad_address(address: &str, e: granary_client::Error) -> Fail {
    match e {
        granary_client::Error::Io(e) => Fail::Invalid(format!("address {address:?}: {e}")),
        e => Fail::Client(e),
    }
}

/// `put`'s mode as the protocol's.
fn put_mode(mode: Option<&str>) -> Result<PutMode> {
    Ok(match mode.map(Mode::parse).transpose()?.unwrap_or(Mode::Set) {
        Mode::Set => PutMode::Upsert,
        Mode::Add => PutMode::CreateOnly,
        Mode::Replace => PutMode::ReplaceOnly,
    })
}

/// What a put's `mode` and `cas` ask for.
enum PutCond {
    /// A PUT in this mode.
    Mode(PutMode),
    /// A CAS write over this CAS value (a TXN's cas operation).
    Cas(u64),
}

/// `put`'s `mode` and `cas`, as `Store.put` takes them (`cas` with mode
/// "set" only).
fn put_cond(mode: Option<&str>, cas: Option<u64>) -> Result<PutCond> {
    match (put_mode(mode)?, cas) {
        (PutMode::Upsert, Some(c)) => Ok(PutCond::Cas(c)),
        (_, Some(_)) => Err(Fail::Invalid("cas= is given with mode \"set\" only".into())),
        (m, None) => Ok(PutCond::Mode(m)),
    }
}

/// The key calls of the three classes (each has `remote` and `ns`), and
/// each class's own methods (`$extra`).
macro_rules! client_methods {
    ($ty:ty, { $($extra:tt)* }) => {
        impl $ty {
            fn run<R: Send>(
                &self,
                py: Python<'_>,
                f: impl FnOnce(&Remote, &str) -> granary_client::Result<R> + Send,
            ) -> Result<R> {
                py.detach(|| f(&self.remote, &self.ns).map_err(Fail::Client))
            }
        }

        #[pymethods]
        impl $ty {
            /// The value of `key` as `bytes`, or None if it holds none.
            fn get<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Option<Bound<'py, PyBytes>>> {
                let k: &[u8] = &key;
                let v = self.run(py, |r, ns| on!(r, ns, |c| c.get(k)))?;
                Ok(v.map(|v| PyBytes::new(py, &v)))
            }

            /// The value of `key` and its CAS value (which changes with
            /// every write of the key), or None if it holds none.
            fn get_cas<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Option<(Bound<'py, PyBytes>, u64)>> {
                let k: &[u8] = &key;
                let v = self.run(py, |r, ns| on!(r, ns, |c| c.get_cas(k)))?;
                Ok(v.map(|it| (PyBytes::new(py, &it.value), it.cas)))
            }

            /// The values of several keys, in order (None where a key holds
            /// none): one request per server involved.
            fn get_many<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
                let keys = keys_of(keys)?;
                let vs = self.run(py, |r, ns| {
                    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                    on!(r, ns, |c| c.mget(&refs))
                })?;
                PyList::new(py, vs.iter().map(|v| v.as_ref().map(|v| PyBytes::new(py, v))))
            }

            /// `get_many` that keeps the values of the servers that
            /// answered when others fail: `(values, failed)`, `values[i]`
            /// being the value of `keys[i]` (`bytes`), None if it holds
            /// none, or the error of its server if that failed (a
            /// `granary.Error` instance, not raised), and `failed` a dict of
            /// each failed server's index (`server_of`) and its error. One
            /// request per server involved.
            #[allow(clippy::type_complexity)] // the pair Python gets
            fn get_many_partial<'py>(
                &self,
                py: Python<'py>,
                keys: &Bound<'py, PyAny>,
            ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyDict>)> {
                let keys = keys_of(keys)?;
                let part = py.detach(|| {
                    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                    match &*self.remote {
                        Remote::Sharded(c) => c.ns(&self.ns).mget_partial(&refs),
                        // One server: all its keys or none.
                        Remote::One(c) => match c.ns(&self.ns).mget(&refs) {
                            Ok(vs) => PartialMget { values: vs.into_iter().map(Ok).collect(), failed: Vec::new() },
                            Err(e) => PartialMget { values: refs.iter().map(|_| Err(0)).collect(), failed: vec![(0, e)] },
                        },
                    }
                });
                let failed = PyDict::new(py);
                for (i, e) in part.failed {
                    failed.set_item(i, PyErr::from(Fail::Client(e)).into_value(py))?;
                }
                let mut values = Vec::with_capacity(part.values.len());
                for v in part.values {
                    values.push(match v {
                        Ok(Some(v)) => PyBytes::new(py, &v).into_any(),
                        Ok(None) => py.None().into_bound(py),
                        Err(i) => failed.get_item(i)?.unwrap_or_else(|| py.None().into_bound(py)),
                    });
                }
                Ok((PyList::new(py, values)?, failed))
            }

            /// Write `value` under `key`; `mode` and `cas` as for
            /// `Store.put` ("set", "add", "replace"; `cas`: only if the
            /// key's value still has this CAS value, as a batch's commit
            /// returned it). Returns whether it wrote.
            #[pyo3(signature = (key, value, *, mode = None, cas = None))]
            fn put(
                &self,
                py: Python<'_>,
                key: Data<'_>,
                value: Data<'_>,
                mode: Option<String>,
                cas: Option<u64>,
            ) -> PyResult<bool> {
                let (k, v): (&[u8], &[u8]) = (&key, &value);
                match put_cond(mode.as_deref(), cas)? {
                    PutCond::Mode(mode) => Ok(self.run(py, |r, ns| on!(r, ns, |c| c.put_with(k, v, mode)))?),
                    PutCond::Cas(cas) => {
                        // A TXN of one cas operation: the protocol's CAS write.
                        let out = self.run(py, |r, ns| r.txn(&[TxnOp::cas(ns, k, cas, v)]))?;
                        Ok(matches!(out, TxnOutcome::Committed { .. }))
                    }
                }
            }

            /// Delete `key`; returns whether it deleted a value. With `cas`,
            /// only if the key's value still has this CAS value (`get_cas`):
            /// False if it holds no value or another one.
            #[pyo3(signature = (key, *, cas = None))]
            fn delete(&self, py: Python<'_>, key: Data<'_>, cas: Option<u64>) -> PyResult<bool> {
                let k: &[u8] = &key;
                Ok(match cas {
                    None => self.run(py, |r, ns| on!(r, ns, |c| c.delete(k)))?,
                    Some(cas) => self.run(py, |r, ns| on!(r, ns, |c| c.delete_cas(k, cas)))?,
                })
            }

            fn __contains__(&self, py: Python<'_>, key: Data<'_>) -> PyResult<bool> {
                let k: &[u8] = &key;
                Ok(self.run(py, |r, ns| on!(r, ns, |c| c.get(k)))?.is_some())
            }

            fn __getitem__<'py>(&self, py: Python<'py>, key: Data<'_>) -> PyResult<Bound<'py, PyBytes>> {
                let k: &[u8] = &key;
                match self.run(py, |r, ns| on!(r, ns, |c| c.get(k)))? {
                    Some(v) => Ok(PyBytes::new(py, &v)),
                    None => Err(crate::raise(py, "NotFound", format!("no value for key {:?}", String::from_utf8_lossy(k)))),
                }
            }

            fn __setitem__(&self, py: Python<'_>, key: Data<'_>, value: Data<'_>) -> PyResult<()> {
                let (k, v): (&[u8], &[u8]) = (&key, &value);
                Ok(self.run(py, |r, ns| on!(r, ns, |c| c.put(k, v)))?)
            }

            fn __delitem__(&self, py: Python<'_>, key: Data<'_>) -> PyResult<()> {
                let k: &[u8] = &key;
                match self.run(py, |r, ns| on!(r, ns, |c| c.delete(k)))? {
                    true => Ok(()),
                    false => Err(crate::raise(py, "NotFound", format!("no value for key {:?}", String::from_utf8_lossy(k)))),
                }
            }

            /// Namespace `name` on the server(s), created first if it does
            /// not exist and `create` is true.
            #[pyo3(signature = (name, *, create = true))]
            fn namespace(&self, py: Python<'_>, name: String, create: bool) -> PyResult<ClientNamespace> {
                if create && name != granary_client::DEFAULT_NAMESPACE {
                    let made = self.run(py, |r, _| r.ns_create(&name));
                    match made {
                        Ok(()) => {}
                        Err(Fail::Client(granary_client::Error::Server {
                            status: granary_client::Status::NamespaceExists,
                            ..
                        })) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(ClientNamespace { remote: self.remote.clone(), ns: name })
            }

            /// The names of the namespaces ("default" first).
            fn list_namespaces(&self, py: Python<'_>) -> PyResult<Vec<String>> {
                Ok(self.run(py, |r, _| r.ns_list())?.into_iter().map(|n| n.name).collect())
            }

            /// Drop namespace `name` and every key in it.
            fn drop_namespace(&self, py: Python<'_>, name: String) -> PyResult<()> {
                Ok(self.run(py, |r, _| r.ns_drop(&name))?)
            }

            /// A new atomic batch, committed as one transaction on the
            /// server (with a `ShardedClient`, every key of it must be on
            /// one server). Used as `Store.batch`'s: committed at the end
            /// of a `with` block, discarded if the block raises.
            fn batch(&self) -> ClientBatch {
                ClientBatch { remote: self.remote.clone(), ns: self.ns.clone(), ops: Vec::new(), done: false }
            }

            fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
                slf
            }

            /// Nothing to close: connections close when the client is
            /// garbage collected.
            #[pyo3(signature = (*_args))]
            fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
                false
            }

            $($extra)*
        }
    };
}

/// A client of one Granary server over the native protocol
/// (`granary serve`'s `--native` port): `Client("host:port")`. It keeps a
/// pool of `connections` connections (made on first use and replaced when
/// they break); each request waits at most `timeout` seconds. Share it
/// between threads freely.
#[pyclass(module = "granary", frozen, mapping)]
pub struct Client {
    remote: Arc<Remote>,
    ns: String,
}

client_methods!(Client, {
    /// Connect to `address` ("host:port") now, so a bad address or a
    /// refused handshake is raised here.
    #[new]
    #[pyo3(signature = (address, *, timeout = 5.0, connections = 1, token = None, tls_ca = None, tls_cert = None, tls_key = None, tls_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: String,
        timeout: f64,
        connections: i64,
        token: Option<Data<'_>>,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_name: Option<String>,
    ) -> PyResult<Client> {
        let secure = Secure { token: token.map(|t| t.to_vec()), tls_ca, tls_cert, tls_key, tls_name };
        let cfg = config(timeout, connections, secure)?;
        let c = py
            .detach(|| granary_client::Client::connect(address.as_str(), cfg))
            .map_err(|e| bad_address(&address, e))?;
        Ok(Client { remote: Arc::new(Remote::One(c)), ns: String::new() })
    }

    /// The server's figures, as a dict of strings.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let all = self.run(py, |r, _| match r {
            Remote::One(c) => c.stats(),
            Remote::Sharded(_) => Ok(Vec::new()),
        })?;
        let d = PyDict::new(py);
        for (k, v) in all {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        match &*self.remote {
            Remote::One(c) => format!("<granary.Client {}>", c.addr()),
            Remote::Sharded(_) => "<granary.Client>".into(),
        }
    }
});

/// Clients of several servers, each key on the server the Rust client's
/// ketama ring gives it: `ShardedClient(["host:port", ...])` places keys as
/// libketama does, `ShardedClient(native, ring="twemproxy", pool=lines)`
/// as a nutcracker pool with those `servers:` lines does. Connections are
/// made on first use.
#[pyclass(module = "granary", frozen, mapping)]
pub struct ShardedClient {
    remote: Arc<Remote>,
    ns: String,
}

/// The ring `ShardedClient(..., ring=, pool=, hash_tag=)` asks for, for
/// `servers` servers: None for libketama's (the default).
fn ring_of(servers: usize, ring: &str, pool: Option<Vec<String>>, hash_tag: Option<String>) -> Result<Option<Ketama>> {
    match (ring, pool) {
        ("ketama", None) if hash_tag.is_none() => Ok(None),
        ("ketama", _) => Err(Fail::Invalid("pool= and hash_tag= are for ring=\"twemproxy\"".into())),
        ("twemproxy", None) => Err(Fail::Invalid(
            "ring=\"twemproxy\" needs pool=: the nutcracker pool's servers: lines, \"host:port:weight [name]\"".into(),
        )),
        ("twemproxy", Some(pool)) => {
            if pool.len() != servers {
                return Err(Fail::Invalid(format!(
                    "{servers} servers for a pool of {}: give each pool server's native address, in the pool's order",
                    pool.len()
                )));
            }
            let mut k = Ketama::twemproxy_lines(&pool).map_err(Fail::Invalid)?;
            if let Some(tag) = hash_tag {
                let t: [u8; 2] = tag
                    .as_bytes()
                    .try_into()
                    .map_err(|_| Fail::Invalid(format!("hash_tag {tag:?}: two ASCII characters, such as \"{{}}\"")))?;
                k = k.with_hash_tag(t);
            }
            Ok(Some(k))
        }
        (r, _) => Err(Fail::Invalid(format!("ring {r:?}: expected \"ketama\" or \"twemproxy\""))),
    }
}

client_methods!(ShardedClient, {
    /// `servers`: the native addresses ("host:port"). `ring`: "ketama"
    /// (libketama's placement over the addresses, the default) or
    /// "twemproxy" (a nutcracker pool's: `pool` is its `servers:` lines,
    /// "host:port:weight [name]", in order, `servers[i]` being the native
    /// address of the pool's server `i`; `hash_tag` its `hash_tag`).
    #[new]
    #[pyo3(signature = (servers, *, ring = "ketama", pool = None, hash_tag = None, timeout = 5.0, connections = 1, token = None, tls_ca = None, tls_cert = None, tls_key = None, tls_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        ring: &str,
        pool: Option<Vec<String>>,
        hash_tag: Option<String>,
        timeout: f64,
        connections: i64,
        token: Option<Data<'_>>,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_name: Option<String>,
    ) -> PyResult<ShardedClient> {
        let secure = Secure { token: token.map(|t| t.to_vec()), tls_ca, tls_cert, tls_key, tls_name };
        let cfg = config(timeout, connections, secure)?;
        if servers.is_empty() {
            return Err(Fail::Invalid("no servers given".into()).into());
        }
        let ring = ring_of(servers.len(), ring, pool, hash_tag)?;
        // Resolving the names may wait for DNS.
        let c = py
            .detach(|| match ring {
                None => granary_client::ShardedClient::new(&servers, cfg),
                Some(k) => granary_client::ShardedClient::with_ring(&servers, k, cfg),
            })
            .map_err(|e| bad_address(&servers.join(","), e))?;
        Ok(ShardedClient { remote: Arc::new(Remote::Sharded(c)), ns: String::new() })
    }

    /// The index (in the list given) of the server holding `key`.
    fn server_of(&self, key: Data<'_>) -> usize {
        match &*self.remote {
            Remote::Sharded(c) => c.server_of(&key),
            Remote::One(_) => 0,
        }
    }

    fn __repr__(&self) -> String {
        "<granary.ShardedClient>".into()
    }
});

/// A namespace on the server(s) of a `Client` or `ShardedClient`
/// (`client.namespace(name)`): the same key calls, on its keys.
#[pyclass(module = "granary", frozen, mapping)]
pub struct ClientNamespace {
    remote: Arc<Remote>,
    ns: String,
}

client_methods!(ClientNamespace, {
    /// Its name.
    #[getter]
    fn name(&self) -> &str {
        &self.ns
    }

    /// Drop it and every key in it.
    fn drop(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.run(py, |r, ns| r.ns_drop(ns))?)
    }

    fn __repr__(&self) -> String {
        format!("<granary.ClientNamespace {:?}>", self.ns)
    }
});

/// What a client batch's operation writes.
enum TxnKind {
    Put(PutMode, Vec<u8>),
    /// Only over this CAS value.
    Cas(u64, Vec<u8>),
    Delete,
    /// A delete only of a value of this CAS value.
    DeleteCas(u64),
}

/// An atomic batch on a client's server (`client.batch()`): puts and
/// deletes over keys of any namespaces, sent as one TXN when it commits,
/// applied all or none.
#[pyclass(module = "granary")]
pub struct ClientBatch {
    remote: Arc<Remote>,
    /// The namespace of operations that name none.
    ns: String,
    ops: Vec<(String, Vec<u8>, TxnKind)>,
    done: bool,
}

impl ClientBatch {
    fn target(&self, ns: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        match ns {
            None => Ok(self.ns.clone()),
            Some(n) => match n.cast::<ClientNamespace>() {
                // Another client's namespace may live on other servers.
                Ok(n) if !Arc::ptr_eq(&n.get().remote, &self.remote) => {
                    Err(Fail::Invalid("the namespace belongs to another client".into()).into())
                }
                Ok(n) => Ok(n.get().ns.clone()),
                Err(_) => Ok(n.extract()?),
            },
        }
    }

    fn push(&mut self, ns: String, key: &[u8], kind: TxnKind) -> Result<()> {
        if self.done {
            return Err(Fail::Invalid("the batch was committed or discarded already".into()));
        }
        self.ops.push((ns, key.to_vec(), kind));
        Ok(())
    }
}

#[pymethods]
impl ClientBatch {
    /// Add a put (`mode` and `cas` as for `put`; a condition that fails at
    /// the commit fails the whole batch with `granary.ConditionFailed`).
    #[pyo3(signature = (key, value, *, namespace = None, mode = None, cas = None))]
    fn put(
        &mut self,
        key: Data<'_>,
        value: Data<'_>,
        namespace: Option<&Bound<'_, PyAny>>,
        mode: Option<String>,
        cas: Option<u64>,
    ) -> PyResult<()> {
        let kind = match put_cond(mode.as_deref(), cas)? {
            PutCond::Mode(mode) => TxnKind::Put(mode, value.to_vec()),
            PutCond::Cas(cas) => TxnKind::Cas(cas, value.to_vec()),
        };
        let ns = self.target(namespace)?;
        Ok(self.push(ns, &key, kind)?)
    }

    /// Add a delete (nothing to do if the key holds no value). With `cas`,
    /// only if the key's value still has this CAS value (`get_cas`): else
    /// the whole batch fails with `granary.ConditionFailed` (a TXN's
    /// delete_cas operation, protocol version 3).
    #[pyo3(signature = (key, *, namespace = None, cas = None))]
    fn delete(&mut self, key: Data<'_>, namespace: Option<&Bound<'_, PyAny>>, cas: Option<u64>) -> PyResult<()> {
        let ns = self.target(namespace)?;
        let kind = match cas {
            None => TxnKind::Delete,
            Some(cas) => TxnKind::DeleteCas(cas),
        };
        Ok(self.push(ns, &key, kind)?)
    }

    fn __len__(&self) -> usize {
        self.ops.len()
    }

    /// Send the batch; every operation is applied, durably, or none. Returns
    /// each operation's new CAS value (0 for deletes).
    fn commit(&mut self, py: Python<'_>) -> PyResult<Vec<u64>> {
        if self.done {
            return Err(Fail::Invalid("the batch was committed or discarded already".into()).into());
        }
        self.done = true;
        let ops = std::mem::take(&mut self.ops);
        let outcome = py
            .detach(|| {
                let txn: Vec<TxnOp> = ops
                    .iter()
                    .map(|(ns, key, kind)| match kind {
                        TxnKind::Put(PutMode::Upsert, v) => TxnOp::put(ns, key, v),
                        TxnKind::Put(PutMode::CreateOnly, v) => TxnOp::put_absent(ns, key, v),
                        TxnKind::Put(PutMode::ReplaceOnly, v) => TxnOp::put_present(ns, key, v),
                        TxnKind::Cas(cas, v) => TxnOp::cas(ns, key, *cas, v),
                        TxnKind::Delete => TxnOp::delete(ns, key),
                        TxnKind::DeleteCas(cas) => TxnOp::delete_cas(ns, key, *cas),
                    })
                    .collect();
                self.remote.txn(&txn)
            })
            .map_err(Fail::Client)?;
        match outcome {
            TxnOutcome::Committed { cas } => Ok(cas),
            TxnOutcome::ConditionFailed { op, status } => {
                let detail = match status {
                    granary_client::Status::Exists => "found the key holding a value (or one of another CAS value)",
                    _ => "found the key holding no value",
                };
                Err(Fail::Condition { op, detail: detail.into() }.into())
            }
        }
    }

    /// Drop the operations collected; nothing is sent.
    fn discard(&mut self) {
        self.ops.clear();
        self.done = true;
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Commit if the block ended normally; discard if it raised.
    #[pyo3(signature = (exc_type, _exc, _tb))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        crate::exit_batch(exc_type.is_some(), self.done, self, |b| b.commit(py), Self::discard)
    }
}
