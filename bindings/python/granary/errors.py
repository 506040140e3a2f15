"""Granary's exceptions.

Every error the extension raises is a :class:`granary.Error`; the
subclasses say what kind of failure it was, and most also derive from the
built-in exception a Python programmer would catch for it (``ValueError``
for bad arguments, ``KeyError`` for missing namespaces, ``OSError`` for
device failures, ``ConnectionError`` and ``TimeoutError`` for the client).
The message is the engine's (or the server's), which says what happened and
what to do.
"""


class Error(Exception):
    """Base class of every Granary error."""


class InvalidArgument(Error, ValueError):
    """A bad key, value, size or option: the key is empty or too long, the
    value larger than the store holds, a namespace name or a batch the
    engine does not take. Nothing was written."""


class NotFound(Error, KeyError):
    """A namespace that does not exist (or was dropped), or
    ``store[key]`` of a key that holds no value."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class Exists(Error):
    """A namespace of this name exists already, or a path already holds a
    store (or something else) where one was to be created."""


class NoSpace(Error):
    """The store (or a namespace's quota, or the index) is full: delete or
    overwrite data, or use a larger device. Nothing was written."""


class Corrupt(Error):
    """Data read back from the device failed its checks, or the file does
    not hold a store this build can read."""


class DeviceError(Error, OSError):
    """The device (file or block device) failed an operation, or could not
    be opened (a path that does not exist) or created."""


class Poisoned(DeviceError):
    """An earlier write or flush failed: the store refuses writes until it
    is reopened (reads still work)."""


class Closed(Error, ValueError):
    """The store (or the store of a namespace or batch) was closed."""


class ConditionFailed(Error):
    """A batch operation's condition did not hold (a ``mode="add"`` of a
    present key, a ``mode="replace"`` of an absent one, a CAS value that
    changed): nothing of the batch was applied. ``op`` is the index of the
    operation that failed."""

    op: int = -1


class ConnectionFailed(Error, ConnectionError):
    """The client could not connect, or the connection broke (the request
    may or may not have been executed)."""


class Timeout(Error, TimeoutError):
    """The server did not answer within the client's timeout."""


class ServerError(Error):
    """The server answered with an error this module has no better class
    for."""


class ProtocolError(Error):
    """The server's answer could not be understood, or the request needs a
    protocol version the server does not speak."""


__all__ = [
    "Error",
    "InvalidArgument",
    "NotFound",
    "Exists",
    "NoSpace",
    "Corrupt",
    "DeviceError",
    "Poisoned",
    "Closed",
    "ConditionFailed",
    "ConnectionFailed",
    "Timeout",
    "ServerError",
    "ProtocolError",
]
