//! `granary._granary`: the extension module under the `granary` Python
//! package (`granary/__init__.py` re-exports it).
//!
//! - [`store`]: the embedded engine (`Store`, `Namespace`, `Batch`).
//! - [`client`]: the native-protocol client (`Client`, `ShardedClient`).
//! - here: what both share: the arguments taken as bytes ([`Data`]) and the
//!   errors ([`Fail`]), raised as the classes of `granary/errors.py`.
//!
//! Invariants: every call into the engine or the client that may do IO or
//! wait runs with the interpreter released (`Python::detach`), so other
//! Python threads run meanwhile; nothing Python-owned is touched inside
//! (the closures take only `Send` data: byte slices of immutable `bytes`
//! objects, which the caller's frame keeps alive, and owned copies of
//! everything else). No panic crosses into Python as anything but PyO3's
//! `PanicException`.

mod client;
mod store;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyString, PyType};
use std::ops::Deref;

/// Bytes an argument stands for: a `bytes` object's own bytes (no copy),
/// or a copy of a `bytearray`, or a `str` encoded as UTF-8.
pub(crate) enum Data<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Deref for Data<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Data::Borrowed(b) => b,
            Data::Owned(v) => v,
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Data<'a> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBytes>() {
            // `bytes` is immutable: the slice stays valid while the object
            // lives, which the caller's frame guarantees.
            return Ok(Data::Borrowed(<&'a [u8]>::extract(obj)?));
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Data::Owned(s.to_cow()?.into_owned().into_bytes()));
        }
        if let Ok(b) = obj.cast::<PyByteArray>() {
            return Ok(Data::Owned(b.to_vec()));
        }
        let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        Err(PyTypeError::new_err(format!("expected bytes, bytearray or str, got {ty}")))
    }
}

/// A batch's `__exit__` (`Batch`, `ClientBatch`): commit if the `with`
/// block ended normally and the batch is still open (`done`: committed or
/// discarded in the block), discard if the block raised. Returns false: the
/// exception, if any, goes on.
pub(crate) fn exit_batch<B>(
    raised: bool,
    done: bool,
    batch: &mut B,
    commit: impl FnOnce(&mut B) -> PyResult<Vec<u64>>,
    discard: impl FnOnce(&mut B),
) -> PyResult<bool> {
    if raised {
        discard(batch);
    } else if !done {
        commit(batch)?;
    }
    Ok(false)
}

/// Copies of a sequence of keys (for the calls taking many).
pub(crate) fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    if keys.is_instance_of::<PyBytes>() || keys.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("expected a sequence of keys, got a single key"));
    }
    keys.try_iter()?.map(|k| Ok(k?.extract::<Data>()?.to_vec())).collect()
}

/// What went wrong, to be raised as one of `granary.errors`' classes once
/// the interpreter is held again (the classes are Python objects).
pub(crate) enum Fail {
    Store(granary_store::Error),
    Client(granary_client::Error),
    /// The store was closed.
    Closed,
    /// A bad argument, found here.
    Invalid(String),
    /// Memory the allocator refused (raised as `MemoryError`).
    NoMemory(String),
    /// A store used in a process forked from the one that opened it.
    Forked,
    /// Operation `op` of a batch failed its condition.
    Condition {
        op: usize,
        detail: String,
    },
}

impl From<granary_store::Error> for Fail {
    fn from(e: granary_store::Error) -> Fail {
        Fail::Store(e)
    }
}

impl From<granary_client::Error> for Fail {
    fn from(e: granary_client::Error) -> Fail {
        Fail::Client(e)
    }
}

pub(crate) type Result<T, E = Fail> = std::result::Result<T, E>;

/// The name of the class in `granary.errors` an engine error is raised as.
fn store_class(e: &granary_store::Error) -> &'static str {
    use granary_store::Error as E;
    match e {
        E::Io { .. } => "DeviceError",
        E::Device(io) => match io.kind() {
            std::io::ErrorKind::AlreadyExists => "Exists",
            _ => "DeviceError",
        },
        E::NotAStore(_) | E::Corruption { .. } => "Corrupt",
        E::InvalidOptions(_) | E::KeyLength { .. } | E::ReservedKey | E::ValueTooLarge { .. } => "InvalidArgument",
        E::BadNamespace { .. } | E::BadBatch(_) => "InvalidArgument",
        E::NoSpace { .. } | E::IndexFull(_) | E::QuotaExceeded { .. } => "NoSpace",
        E::Poisoned { .. } => "Poisoned",
        E::NoSuchNamespace { .. } => "NotFound",
        E::NamespaceExists { .. } => "Exists",
        E::Closed => "Closed",
        _ => "Error",
    }
}

/// The class a client error is raised as.
fn client_class(e: &granary_client::Error) -> &'static str {
    use granary_client::{Error as E, Status as S};
    match e {
        E::Connect(..) | E::Disconnected(_) => "ConnectionFailed",
        E::Timeout => "Timeout",
        E::TooLarge { .. } | E::CrossServerTxn { .. } => "InvalidArgument",
        E::Handshake(_) | E::Protocol(_) => "ProtocolError",
        E::Io(_) => "DeviceError",
        E::Server { status, .. } => match status {
            S::KeyInvalid | S::ValueTooLarge | S::BadNamespace | S::BadBatch => "InvalidArgument",
            S::NoSpace | S::QuotaExceeded => "NoSpace",
            S::ReadOnly => "Poisoned",
            S::IoError => "DeviceError",
            S::Corruption => "Corrupt",
            S::NoSuchNamespace => "NotFound",
            S::NamespaceExists => "Exists",
            _ => "ServerError",
        },
    }
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class `name` of `granary.errors`.
fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS.get_or_try_init(py, || py.import("granary.errors").map(Bound::unbind))?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// An error of class `name` with message `msg`.
pub(crate) fn raise(py: Python<'_>, name: &str, msg: String) -> PyErr {
    match error_class(py, name) {
        Ok(ty) => PyErr::from_type(ty, msg),
        Err(e) => e,
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        Python::attach(|py| match f {
            Fail::Store(e) => raise(py, store_class(&e), e.to_string()),
            Fail::Client(e) => raise(py, client_class(&e), e.to_string()),
            Fail::Closed => raise(py, "Closed", "the store was closed".into()),
            Fail::Invalid(m) => raise(py, "InvalidArgument", m),
            Fail::NoMemory(m) => pyo3::exceptions::PyMemoryError::new_err(m),
            Fail::Forked => raise(
                py,
                "Closed",
                "the store was opened by the process this one was forked from: a forked child cannot use it".into(),
            ),
            Fail::Condition { op, detail } => {
                let err = raise(py, "ConditionFailed", format!("batch operation {op} {detail}; nothing was applied"));
                if let Err(e) = err.value(py).setattr("op", op) {
                    return e;
                }
                err
            }
        })
    }
}

/// A put mode's name: `"set"` (insert or overwrite), `"add"` (only if
/// absent) or `"replace"` (only if present).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Set,
    Add,
    Replace,
}

impl Mode {
    pub(crate) fn parse(s: &str) -> Result<Mode> {
        match s {
            "set" => Ok(Mode::Set),
            "add" => Ok(Mode::Add),
            "replace" => Ok(Mode::Replace),
            _ => Err(Fail::Invalid(format!("mode {s:?}: expected \"set\", \"add\" or \"replace\""))),
        }
    }
}

#[pymodule]
fn _granary(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<store::Namespace>()?;
    m.add_class::<store::Batch>()?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::ClientNamespace>()?;
    m.add_class::<client::ShardedClient>()?;
    m.add_class::<client::ClientBatch>()?;
    m.add_function(wrap_pyfunction!(store::_rust_get_loop, m)?)?;
    Ok(())
}
