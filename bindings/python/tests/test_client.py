"""The native-protocol client against `granary serve` started here."""

import socket
import struct
import threading

import pytest

import granary
from conftest import Server, free_low_port


def test_client_key_calls(server):
    with granary.Client(server.address) as c:
        assert c.get(b"k") is None
        assert c.put(b"k", b"v") is True
        assert c.get(b"k") == b"v"
        assert c.put(b"k", b"w", mode="add") is False
        assert c.put(b"k2", b"w", mode="replace") is False
        assert c.get_many([b"k", b"k2"]) == [b"v", None]
        c["m"] = "x"
        assert c["m"] == b"x" and "m" in c
        del c["m"]
        with pytest.raises(granary.NotFound):
            c["m"]
        assert c.delete(b"k") is True
        assert c.delete(b"k") is False
        assert isinstance(c.stats(), dict)
        # A client cannot list keys: not iterable (not c[0], c[1], ...).
        with pytest.raises(TypeError, match="not iterable"):
            iter(c)
        with pytest.raises(TypeError, match="not iterable"):
            iter(c.namespace("it"))


def test_client_namespaces(server):
    c = granary.Client(server.address, timeout=10, connections=2)
    ns = c.namespace("cns")
    c.put(b"k", b"default")
    ns.put(b"k", b"in ns")
    assert (c.get(b"k"), ns.get(b"k")) == (b"default", b"in ns")
    assert "cns" in c.list_namespaces()
    ns.drop()
    assert "cns" not in c.list_namespaces()
    with pytest.raises(granary.NotFound):
        ns.get(b"k")


def test_client_batches(server):
    c = granary.Client(server.address)
    ns = c.namespace("bns")
    c.put(b"b-old", b"x")
    with c.batch() as b:
        b.put(b"b-a", b"1")
        b.put(b"b-a", b"2", namespace=ns)
        b.put(b"b-c", b"3", namespace="bns", mode="add")
        b.delete(b"b-old")
        assert len(b) == 4
    assert (c.get(b"b-a"), ns.get(b"b-a"), ns.get(b"b-c"), c.get(b"b-old")) == (b"1", b"2", b"3", None)
    with pytest.raises(RuntimeError):
        with c.batch() as b:
            b.put(b"b-d", b"4")
            raise RuntimeError("discarded")
    assert c.get(b"b-d") is None
    b = c.batch()
    b.put(b"b-e", b"5")
    b.put(b"b-a", b"9", mode="add")
    with pytest.raises(granary.ConditionFailed) as e:
        b.commit()
    assert e.value.op == 1
    assert (c.get(b"b-e"), c.get(b"b-a")) == (None, b"1")
    with pytest.raises(granary.InvalidArgument):
        with ns.batch() as b:
            b.put(b"twice", b"1")
            b.put(b"twice", b"2")
    assert ns.get(b"twice") is None
    # Another client's namespace (it may name other servers) is refused.
    other = granary.Client(server.address).namespace("bns")
    b = c.batch()
    with pytest.raises(granary.InvalidArgument, match="another client"):
        b.put(b"b-f", b"6", namespace=other)


def test_client_cas_writes(server):
    c = granary.Client(server.address)
    ns = c.namespace("casns")
    b = c.batch()
    b.put(b"cas-k", b"v1")
    b.put(b"cas-k", b"n1", namespace=ns)
    b.delete(b"cas-none")
    cas = b.commit()
    assert len(cas) == 3 and cas[0] != 0 and cas[1] != 0 and cas[0] != cas[1] and cas[2] == 0
    # The CAS value of the write: a CAS write over it goes ahead, once.
    assert c.put(b"cas-k", b"v2", cas=cas[0]) is True
    assert c.get(b"cas-k") == b"v2"
    assert c.put(b"cas-k", b"v3", cas=cas[0]) is False
    assert c.get(b"cas-k") == b"v2"
    # No value: refused too.
    assert c.put(b"cas-missing", b"x", cas=cas[0]) is False
    assert c.get(b"cas-missing") is None
    # In a namespace, with its own CAS values.
    assert ns.put(b"cas-k", b"n2", cas=cas[0]) is False
    assert ns.put(b"cas-k", b"n2", cas=cas[1]) is True
    assert ns.get(b"cas-k") == b"n2"
    # In a batch: a stale CAS value fails the whole batch.
    b = c.batch()
    b.put(b"cas-other", b"x")
    b.put(b"cas-k", b"v4", cas=cas[0])
    with pytest.raises(granary.ConditionFailed) as e:
        b.commit()
    assert e.value.op == 1
    assert (c.get(b"cas-other"), c.get(b"cas-k")) == (None, b"v2")
    # A chain of CAS writes, each over the CAS value the last one returned.
    with_cas = c.batch()
    with_cas.put(b"cas-chain", b"0")
    last = with_cas.commit()[0]
    for i in range(1, 5):
        b = c.batch()
        b.put(b"cas-chain", str(i).encode(), cas=last)
        (new,) = b.commit()
        assert new != last
        last = new
    assert c.get(b"cas-chain") == b"4"
    # cas= goes with mode "set" only, as Store.put's.
    with pytest.raises(granary.InvalidArgument):
        c.put(b"cas-k", b"x", mode="add", cas=1)
    with pytest.raises(granary.InvalidArgument):
        c.batch().put(b"cas-k", b"x", mode="replace", cas=1)
    with pytest.raises(OverflowError):
        c.put(b"cas-k", b"x", cas=-1)


def test_client_get_cas_and_delete_by_cas(server):
    """The same calls as Store's: get_cas, then a write or a delete only
    while the CAS value is current."""
    c = granary.Client(server.address)
    assert c.get_cas(b"gc-missing") is None
    c.put(b"gc-k", b"v1")
    value, cas = c.get_cas(b"gc-k")
    assert value == b"v1" and cas != 0
    assert c.get_cas(b"gc-k") == (b"v1", cas), "a read keeps the CAS value"
    # The CAS value GETS reads is the one a CAS write checks, and the one a
    # batch commit returns.
    assert c.put(b"gc-k", b"v2", cas=cas) is True
    value, cas2 = c.get_cas(b"gc-k")
    assert value == b"v2" and cas2 != cas
    b = c.batch()
    b.put(b"gc-k", b"v3", cas=cas2)
    (cas3,) = b.commit()
    assert c.get_cas(b"gc-k") == (b"v3", cas3)
    # Delete by CAS value: a stale one deletes nothing, the current one
    # deletes, and then there is nothing to delete.
    assert c.delete(b"gc-k", cas=cas2) is False
    assert c.get(b"gc-k") == b"v3"
    assert c.delete(b"gc-k", cas=cas3) is True
    assert c.get(b"gc-k") is None
    assert c.delete(b"gc-k", cas=cas3) is False
    # In a namespace, with its own keys.
    ns = c.namespace("gcns")
    ns.put(b"gc-k", b"n")
    assert c.get_cas(b"gc-k") is None
    value, ncas = ns.get_cas(b"gc-k")
    assert value == b"n"
    assert c.delete(b"gc-k", cas=ncas) is False
    assert ns.delete(b"gc-k", cas=ncas) is True
    assert ns.get(b"gc-k") is None
    # A large value (the server's zero-copy path) and its CAS value.
    big = bytes(range(256)) * 1000
    c.put(b"gc-big", big)
    value, bcas = c.get_cas(b"gc-big")
    assert value == big
    assert c.delete(b"gc-big", cas=bcas) is True
    # Bad arguments, as Store's.
    with pytest.raises(OverflowError):
        c.delete(b"gc-k", cas=-1)
    with pytest.raises(granary.InvalidArgument):
        c.get_cas(b"")
    with pytest.raises(TypeError):
        c.get_cas(5)


def test_client_batch_delete_by_cas(server):
    """A batch's delete(cas=) (a TXN's delete_cas): a stale CAS value, or a
    key holding no value, fails the whole batch with nothing applied; the
    value's CAS value deletes it, as the embedded Batch.delete(cas=) does."""
    c = granary.Client(server.address)
    ns = c.namespace("dcns")
    b = c.batch()
    b.put(b"dc-k", b"v")
    b.put(b"dc-k", b"n", namespace=ns)
    k_cas, n_cas = b.commit()
    # Stale: ConditionFailed at that operation; the put before it and the
    # delete after it are not applied.
    b = c.batch()
    b.put(b"dc-other", b"x")
    b.delete(b"dc-k", cas=k_cas + 1)
    b.delete(b"dc-k", namespace=ns, cas=n_cas)
    with pytest.raises(granary.ConditionFailed) as e:
        b.commit()
    assert e.value.op == 1
    assert (c.get(b"dc-other"), c.get(b"dc-k"), ns.get(b"dc-k")) == (None, b"v", b"n")
    # A key holding no value.
    b = c.batch()
    b.delete(b"dc-none", cas=k_cas)
    with pytest.raises(granary.ConditionFailed) as e:
        b.commit()
    assert e.value.op == 0
    # The right CAS values: applied together, 0 for each delete.
    with c.batch() as b:
        b.put(b"dc-other", b"x")
        b.delete(b"dc-k", cas=k_cas)
        b.delete(b"dc-k", namespace=ns, cas=n_cas)
    assert (c.get(b"dc-other"), c.get(b"dc-k"), ns.get(b"dc-k")) == (b"x", None, None)
    value, cas = c.get_cas(b"dc-other")
    b = ns.batch()
    b.delete(b"dc-other", namespace="default", cas=cas)
    assert b.commit() == [0]
    assert c.get(b"dc-other") is None
    # The same keyword as the embedded store's batch; a CAS value is a u64.
    with pytest.raises(OverflowError):
        c.batch().delete(b"dc-k", cas=-1)


def test_a_server_without_gets_is_refused_before_sending():
    """A server that speaks protocol version 2 (no GETS, no DELETE_CAS, no
    TXN delete_cas): get_cas, delete(cas=) and a batch with a delete(cas=)
    raise ProtocolError and send nothing; the next
    request on the connection is the GET sent after them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_low_port()))
    listener.listen(1)
    listener.settimeout(30)
    seen = []

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            hello = conn.recv(16, socket.MSG_WAITALL)
            seen.append(hello[:4])
            # magic, version 2, status OK, limits, reserved.
            conn.sendall(b"GRNY" + struct.pack("<HBBIIII", 2, 0, 0, 65536, 1 << 20, 16 << 20, 0))
            header = conn.recv(16, socket.MSG_WAITALL)
            length, op, _flags, _ns, _r, rid = struct.unpack("<IBBBBQ", header)
            conn.recv(length, socket.MSG_WAITALL)
            seen.append(op)
            # NOT_FOUND (status 1), empty body.
            conn.sendall(struct.pack("<IBBBBQ", 0, op, 1, 0, 0, rid))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        c = granary.Client("127.0.0.1:%d" % listener.getsockname()[1], timeout=30)
        with pytest.raises(granary.ProtocolError, match="needs version 3"):
            c.get_cas(b"k")
        with pytest.raises(granary.ProtocolError, match="needs version 3"):
            c.delete(b"k", cas=7)
        b = c.batch()
        b.put(b"a", b"v")
        b.delete(b"k", cas=7)
        with pytest.raises(granary.ProtocolError, match="delete_cas.*needs version 3"):
            b.commit()
        assert c.get(b"k") is None
        t.join(30)
        assert seen == [b"GRNY", 1], "the first frame after the hello is the GET (opcode 1)"
    finally:
        listener.close()


def test_sharded_client_get_cas_and_delete_by_cas(server, tmp_path):
    second = Server(tmp_path / "second.db")
    try:
        sharded = granary.ShardedClient([server.address, second.address])
        singles = [granary.Client(server.address), granary.Client(second.address)]
        ns = sharded.namespace("sgc")
        keys = [f"sgc-{i}".encode() for i in range(20)]
        assert {sharded.server_of(k) for k in keys} == {0, 1}
        for k in keys:
            sharded.put(k, b"1")
            ns.put(k, b"n")
            value, cas = sharded.get_cas(k)
            assert (value, cas) == singles[sharded.server_of(k)].get_cas(k)
            assert sharded.delete(k, cas=cas + 1) is False
            assert sharded.delete(k, cas=cas) is True
            _, ncas = ns.get_cas(k)
            assert ns.delete(k, cas=ncas) is True
            assert (sharded.get(k), ns.get(k)) == (None, None)
    finally:
        second.stop()


def test_sharded_client_cas_writes(server, tmp_path):
    second = Server(tmp_path / "second.db")
    try:
        sharded = granary.ShardedClient([server.address, second.address])
        keys = [f"scas-{i}".encode() for i in range(20)]
        owners = {sharded.server_of(k) for k in keys}
        assert owners == {0, 1}
        for k in keys:
            b = sharded.batch()
            b.put(k, b"1")
            (cas,) = b.commit()
            assert sharded.put(k, b"2", cas=cas) is True
            assert sharded.put(k, b"3", cas=cas) is False
            assert sharded.get(k) == b"2"
    finally:
        second.stop()


def test_client_errors(server):
    c = granary.Client(server.address)
    with pytest.raises(granary.InvalidArgument):
        c.put(b"", b"v")
    with pytest.raises(granary.InvalidArgument):
        c.put(b"k", b"x" * (2 << 20))
    with pytest.raises(TypeError):
        c.get(5)
    with pytest.raises(granary.ConnectionFailed):
        granary.Client(f"127.0.0.1:{free_low_port()}", timeout=5)
    with pytest.raises(ValueError):
        granary.Client(server.address, timeout=-1)
    # Settings past what a client holds are refused before connecting
    # (they panicked, or aborted the process allocating the pool).
    for bad in (dict(connections=2**62), dict(connections=0), dict(token=b"x" * 2000), dict(timeout=1e-12)):
        with pytest.raises(granary.InvalidArgument):
            granary.Client(server.address, **bad)
    # A timeout too long to hold is none, in effect.
    forever = granary.Client(server.address, timeout=1e20)
    forever.put(b"k", b"v")
    assert forever.get(b"k") == b"v"
    with pytest.raises(granary.InvalidArgument):
        granary.Client("no-port-here")
    with pytest.raises(granary.InvalidArgument):
        granary.ShardedClient([])
    with pytest.raises(TypeError):
        granary.ShardedClient("127.0.0.1:1")


def test_sharded_client_places_keys_by_ketama(server, tmp_path):
    second = Server(tmp_path / "second.db")
    try:
        addresses = [server.address, second.address]
        sharded = granary.ShardedClient(addresses)
        singles = [granary.Client(a) for a in addresses]
        keys = [f"sharded-{i}".encode() for i in range(200)]
        for k in keys:
            assert sharded.put(k, k + b"!")
        owners = [sharded.server_of(k) for k in keys]
        assert set(owners) == {0, 1}, "200 keys over two servers land on both"
        for k, o in zip(keys, owners):
            assert singles[o].get(k) == k + b"!"
            assert singles[1 - o].get(k) is None
        assert sharded.get_many(keys) == [k + b"!" for k in keys]
        on0 = [k for k, o in zip(keys, owners) if o == 0]
        on1 = [k for k, o in zip(keys, owners) if o == 1]
        with sharded.batch() as b:
            b.put(on0[0], b"batched")
            b.put(on0[1], b"batched")
        assert singles[0].get_many(on0[:2]) == [b"batched", b"batched"]
        with pytest.raises(granary.InvalidArgument):
            with sharded.batch() as b:
                b.put(on0[0], b"spans")
                b.put(on1[0], b"spans")
        assert (sharded.get(on0[0]), sharded.get(on1[0])) == (b"batched", on1[0] + b"!")
        assert all(sharded.delete(k) for k in keys)
    finally:
        second.stop()


def test_a_sharded_partial_get_many_keeps_the_servers_still_up(server, tmp_path):
    second = Server(tmp_path / "second.db")
    try:
        sharded = granary.ShardedClient([server.address, second.address], timeout=5.0)
        keys = [f"partial-{i}".encode() for i in range(40)]
        for k in keys[:-1]:
            assert sharded.put(k, k + b"!")
        owners = [sharded.server_of(k) for k in keys]
        assert set(owners) == {0, 1}
        values, failed = sharded.get_many_partial(keys)
        assert values == [k + b"!" for k in keys[:-1]] + [None]
        assert failed == {}
        ns = sharded.namespace("part")
        assert ns.put(keys[0], b"in part")
        lone = granary.Client(second.address, timeout=5.0)
        second.stop()
        values, failed = sharded.get_many_partial(keys)
        assert list(failed) == [1]
        assert isinstance(failed[1], granary.ConnectionFailed)
        for k, o, v in zip(keys, owners, values):
            if o == 1:
                assert v is failed[1]
            else:
                assert v == (None if k == keys[-1] else k + b"!")
        # get_many fails whole; a namespace of the client has the same call.
        with pytest.raises(granary.ConnectionFailed):
            sharded.get_many(keys)
        on0 = [k for k, o in zip(keys, owners) if o == 0]
        on1 = [k for k, o in zip(keys, owners) if o == 1]
        values, failed = ns.get_many_partial([keys[0], on0[1], on1[0]])
        assert list(failed) == [1]
        assert values[:2] == [b"in part" if owners[0] == 0 else failed[1], None]
        # One server's client: all of its keys, or its error for each.
        one = granary.Client(server.address)
        assert one.get_many_partial([on0[0], b"absent"]) == ([on0[0] + b"!", None], {})
        values, failed = lone.get_many_partial(on1[:2])
        assert list(failed) == [0] and values == [failed[0], failed[0]]
    finally:
        second.stop()
