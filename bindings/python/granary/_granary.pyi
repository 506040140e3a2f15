"""Type stubs of granary._granary, the Rust extension (re-exported by
``granary``)."""

import os
from typing import Dict, Iterable, Iterator, List, Literal, Optional, Tuple, Union, final

from typing_extensions import Self

from granary.errors import Error as _Error

_Bytes = Union[bytes, bytearray, str]
"""A key or value argument: ``bytes`` (not copied), ``bytearray`` (copied)
or ``str`` (encoded as UTF-8)."""

__all__ = ["Store", "Namespace", "Batch", "Client", "ShardedClient", "ClientNamespace", "ClientBatch", "_rust_get_loop"]

_Mode = Literal["set", "add", "replace"]
_StrPath = Union[str, "os.PathLike[str]"]

class _KeyCalls:
    def get(self, key: _Bytes) -> Optional[bytes]:
        """The value of ``key``, or None if it holds none."""
    def get_cas(self, key: _Bytes) -> Optional[Tuple[bytes, int]]:
        """The value of ``key`` and its CAS value, or None."""
    def get_many(self, keys: Iterable[_Bytes]) -> List[Optional[bytes]]:
        """The values of several keys, in order (None where a key holds none)."""
    def put(self, key: _Bytes, value: _Bytes, *, mode: Optional[_Mode] = None, cas: Optional[int] = None) -> bool:
        """Write ``value`` under ``key``; returns whether it wrote. ``mode``:
        "set" (default), "add" (only if absent), "replace" (only if
        present); ``cas``: only if the value still has this CAS value."""
    def delete(self, key: _Bytes, *, cas: Optional[int] = None) -> bool:
        """Delete ``key``; returns whether it deleted a value. ``cas``: only
        if the value still has this CAS value (``get_cas``)."""
    def keys(self) -> List[bytes]:
        """Every key, in no particular order."""
    def __iter__(self) -> Iterator[bytes]:
        """The keys, as ``keys()`` lists them."""
    def max_value_size(self, key_len: int = 16) -> int:
        """The largest value a key of ``key_len`` bytes may hold."""
    def __contains__(self, key: _Bytes, /) -> bool: ...
    def __getitem__(self, key: _Bytes, /) -> bytes: ...
    def __setitem__(self, key: _Bytes, value: _Bytes, /) -> None: ...
    def __delitem__(self, key: _Bytes, /) -> None: ...

@final
class Store(_KeyCalls):
    """A Granary store open in this process (a context manager)."""

    @classmethod
    def create(
        cls,
        path: _StrPath,
        size: int,
        *,
        durability: Optional[Literal["direct", "flush"]] = None,
        direct_io: bool = True,
        segment_size: Optional[int] = None,
    ) -> "Store":
        """Create a store in a new file of ``size`` bytes."""
    @classmethod
    def open(
        cls,
        path: _StrPath,
        *,
        durability: Optional[Literal["direct", "flush"]] = None,
        direct_io: bool = True,
    ) -> "Store":
        """Open the store at ``path``, recovering it if needed."""
    @classmethod
    def memory(cls, size: int, *, segment_size: Optional[int] = None) -> "Store":
        """A store in memory, gone when closed and its namespaces are."""
    def close(self) -> None:
        """Close cleanly (a checkpoint, a flush); later calls raise Closed."""
    @property
    def closed(self) -> bool: ...
    @property
    def path(self) -> str: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, _exc: object, _tb: object) -> bool: ...
    def namespace(self, name: str, *, create: bool = True) -> "Namespace":
        """A handle on namespace ``name`` (created first unless ``create=False``)."""
    def list_namespaces(self) -> List[str]:
        """The namespaces' names, "default" first."""
    def drop_namespace(self, name: str) -> None:
        """Drop namespace ``name`` and its keys."""
    def batch(self) -> "Batch":
        """A new atomic batch (a context manager that commits on exit)."""
    def sync(self) -> None:
        """Make every acknowledged write durable against power loss."""
    def checkpoint(self) -> None:
        """Write an index checkpoint now."""
    def stats(self) -> Dict[str, Union[int, float, str, bool]]:
        """The store's figures."""
    def verify(self) -> Dict[str, Union[int, bool, List[str]]]:
        """Check every index entry and segment; "clean" says the outcome."""

@final
class Namespace(_KeyCalls):
    """A namespace of a store: the same key calls, on its own keys."""

    @property
    def name(self) -> str: ...
    def stats(self) -> Dict[str, Union[int, str, None]]:
        """Its figures."""
    def drop(self) -> None:
        """Drop it and its keys."""
    def truncate(self) -> None:
        """Delete every key in it, keeping it."""

@final
class Batch:
    """Operations committed all or nothing (``Store.batch``)."""

    def put(
        self,
        key: _Bytes,
        value: _Bytes,
        *,
        namespace: Union["Namespace", str, None] = None,
        mode: Optional[_Mode] = None,
        cas: Optional[int] = None,
    ) -> None: ...
    def delete(self, key: _Bytes, *, namespace: Union["Namespace", str, None] = None, cas: Optional[int] = None) -> None: ...
    def check(self, key: _Bytes, cas: Optional[int], *, namespace: Union["Namespace", str, None] = None) -> None: ...
    def commit(self) -> List[int]:
        """Apply all or nothing; each operation's new CAS value."""
    def discard(self) -> None: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, _exc: object, _tb: object) -> bool: ...

class _ClientCalls:
    def get(self, key: _Bytes) -> Optional[bytes]: ...
    def get_cas(self, key: _Bytes) -> Optional[Tuple[bytes, int]]:
        """The value of ``key`` and its CAS value, or None (a GETS: protocol
        version 3)."""
    def get_many(self, keys: Iterable[_Bytes]) -> List[Optional[bytes]]: ...
    def get_many_partial(
        self, keys: Iterable[_Bytes]
    ) -> Tuple[List[Union[bytes, None, _Error]], Dict[int, _Error]]:
        """``get_many`` keeping the answers of the servers that answered:
        ``(values, failed)``; a key whose server failed has that server's
        error (not raised) in ``values``, and ``failed`` maps each failed
        server's index (``server_of``) to its error."""
    def put(self, key: _Bytes, value: _Bytes, *, mode: Optional[_Mode] = None, cas: Optional[int] = None) -> bool:
        """Write ``value`` under ``key``; returns whether it wrote. ``mode``
        as for ``Store.put``; ``cas`` (mode "set" only): only if the value
        still has this CAS value (one a batch commit returned), sent as a
        one-operation transaction."""
    def delete(self, key: _Bytes, *, cas: Optional[int] = None) -> bool:
        """Delete ``key``; returns whether it deleted a value. ``cas``: only
        if the value still has this CAS value (``get_cas``; a DELETE_CAS:
        protocol version 3)."""
    def __contains__(self, key: _Bytes, /) -> bool: ...
    def __getitem__(self, key: _Bytes, /) -> bytes: ...
    def __setitem__(self, key: _Bytes, value: _Bytes, /) -> None: ...
    def __delitem__(self, key: _Bytes, /) -> None: ...
    def namespace(self, name: str, *, create: bool = True) -> "ClientNamespace": ...
    def list_namespaces(self) -> List[str]: ...
    def drop_namespace(self, name: str) -> None: ...
    def batch(self) -> "ClientBatch":
        """A new atomic batch, sent as one transaction when it commits."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class Client(_ClientCalls):
    """A client of one server's native protocol."""

    def __new__(
        cls,
        address: str,
        *,
        timeout: float = 5.0,
        connections: int = 1,
        token: Optional[_Bytes] = None,
        tls_ca: Optional[_StrPath] = None,
        tls_cert: Optional[_StrPath] = None,
        tls_key: Optional[_StrPath] = None,
        tls_name: Optional[str] = None,
    ) -> "Client": ...
    def stats(self) -> Dict[str, str]: ...

@final
class ShardedClient(_ClientCalls):
    """Clients of several servers, keys placed by ketama."""

    def __new__(
        cls,
        servers: List[str],
        *,
        ring: Literal["ketama", "twemproxy"] = "ketama",
        pool: Optional[List[str]] = None,
        hash_tag: Optional[str] = None,
        timeout: float = 5.0,
        connections: int = 1,
        token: Optional[_Bytes] = None,
        tls_ca: Optional[_StrPath] = None,
        tls_cert: Optional[_StrPath] = None,
        tls_key: Optional[_StrPath] = None,
        tls_name: Optional[str] = None,
    ) -> "ShardedClient":
        """``servers``: native addresses ("host:port"). ``ring="ketama"``:
        libketama's placement over them. ``ring="twemproxy"``: a nutcracker
        pool's (``distribution: ketama``, ``hash: md5``), ``pool`` being its
        ``servers:`` lines ("host:port:weight [name]") in order and
        ``servers[i]`` the native address of the pool's server ``i``;
        ``hash_tag`` the pool's ``hash_tag`` (two characters)."""
    def server_of(self, key: _Bytes) -> int: ...

@final
class ClientNamespace(_ClientCalls):
    """A namespace on a client's server(s)."""

    @property
    def name(self) -> str: ...
    def drop(self) -> None: ...

@final
class ClientBatch:
    """An atomic batch on a client's server (``client.batch()``)."""

    def put(
        self,
        key: _Bytes,
        value: _Bytes,
        *,
        namespace: Union["ClientNamespace", str, None] = None,
        mode: Optional[_Mode] = None,
        cas: Optional[int] = None,
    ) -> None: ...
    def delete(
        self, key: _Bytes, *, namespace: Union["ClientNamespace", str, None] = None, cas: Optional[int] = None
    ) -> None:
        """Add a delete; ``cas``: only if the value still has this CAS value
        (else the whole batch fails with ``ConditionFailed``)."""
    def commit(self) -> List[int]:
        """Apply all or nothing; each operation's new CAS value."""
    def discard(self) -> None: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, _exc: object, _tb: object) -> bool: ...

def _rust_get_loop(store: Store, key: _Bytes, n: int) -> float:
    """Nanoseconds per GET through the Rust API (for granary.bench)."""
