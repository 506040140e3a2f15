"""Granary from Python.

- ``granary.Store``: a store embedded in this process (``Store.create``,
  ``Store.open``, ``Store.memory``), with namespaces
  (``store.namespace(name)``) and atomic batches (``with store.batch() as
  b: ...``).
- ``granary.Client`` / ``granary.ShardedClient``: the same key calls on
  ``granary serve``'s native protocol, on one server or spread over
  several by ketama, with atomic batches (``client.batch()``).
- ``granary.errors``: the exceptions, all subclasses of ``granary.Error``.

Keys and values are ``bytes`` (``str`` is taken too, encoded as UTF-8;
``bytearray`` is copied); values read are returned as ``bytes``. Every call
releases the GIL while the engine or the network works, so threads scale.
See docs/PYTHON.md.
"""

from granary._granary import Batch, Client, ClientBatch, ClientNamespace, Namespace, ShardedClient, Store
from granary import errors
from granary.errors import *  # noqa: F403 (every exception, as errors.__all__ names them)

__all__ = [
    "Store",
    "Namespace",
    "Batch",
    "Client",
    "ShardedClient",
    "ClientNamespace",
    "ClientBatch",
    *errors.__all__,
]
