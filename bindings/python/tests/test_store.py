"""The embedded store's key calls, its lifecycle and its figures."""

import pytest

import granary


def test_put_get_delete(store):
    assert store.get(b"k") is None
    assert store.put(b"k", b"v1") is True
    assert store.get(b"k") == b"v1"
    assert store.put(b"k", b"v2") is True
    assert store.get(b"k") == b"v2"
    assert store.delete(b"k") is True
    assert store.delete(b"k") is False
    assert store.get(b"k") is None


def test_values_are_bytes_and_str_and_bytearray_are_taken(store):
    store.put("key", "välue")
    assert store.get(b"key") == "välue".encode()
    store.put(bytearray(b"ba"), bytearray(b"\x00\xff"))
    v = store.get(b"ba")
    assert type(v) is bytes and v == b"\x00\xff"
    store.put(b"empty", b"")
    assert store.get(b"empty") == b""


def test_put_modes(store):
    assert store.put(b"k", b"a", mode="replace") is False
    assert store.get(b"k") is None
    assert store.put(b"k", b"a", mode="add") is True
    assert store.put(b"k", b"b", mode="add") is False
    assert store.get(b"k") == b"a"
    assert store.put(b"k", b"c", mode="replace") is True
    assert store.get(b"k") == b"c"
    assert store.put(b"k", b"d", mode="set") is True
    assert store.get(b"k") == b"d"


def test_cas(store):
    store.put(b"k", b"a")
    value, cas = store.get_cas(b"k")
    assert value == b"a"
    assert store.put(b"k", b"b", cas=cas) is True
    assert store.put(b"k", b"c", cas=cas) is False, "the CAS value changed with the write"
    assert store.get(b"k") == b"b"
    assert store.get_cas(b"missing") is None
    assert store.put(b"missing", b"x", cas=cas) is False
    # A delete by CAS value: refused for a stale one or no value.
    value, cas = store.get_cas(b"k")
    assert store.delete(b"k", cas=cas + 1) is False
    assert store.get(b"k") == b"b"
    assert store.delete(b"k", cas=cas) is True
    assert store.get(b"k") is None
    assert store.delete(b"k", cas=cas) is False
    ns = store.namespace("casdel")
    ns.put(b"k", b"n")
    _, ncas = ns.get_cas(b"k")
    assert ns.delete(b"k", cas=ncas) is True and ns.get(b"k") is None


def test_get_many_and_mapping(store):
    for i in range(10):
        store[f"k{i}"] = f"v{i}"
    got = store.get_many([f"k{i}".encode() for i in range(12)])
    assert got == [f"v{i}".encode() for i in range(10)] + [None, None]
    assert "k3" in store and b"k11" not in store
    assert store[b"k4"] == b"v4"
    del store[b"k4"]
    with pytest.raises(granary.NotFound):
        store[b"k4"]
    with pytest.raises(KeyError):
        del store[b"k4"]
    assert sorted(store.keys()) == sorted(f"k{i}".encode() for i in range(10) if i != 4)
    # Iterating gives the keys, as a dict's iteration does.
    assert sorted(store) == sorted(store.keys())
    assert sorted(list(iter(store))) == sorted(store.keys())


def test_close_and_reopen_keeps_everything(tmp_path):
    path = tmp_path / "sub" / "s.db"
    with granary.Store.create(path, size=64 << 20) as s:
        for i in range(500):
            s.put(f"key{i}", f"value{i}" * (i % 7))
        s.delete(b"key7")
    assert s.closed
    with pytest.raises(granary.Closed):
        s.get(b"key1")
    s.close()  # again: nothing to do
    with granary.Store.open(path) as s:
        assert s.stats()["clean_shutdown"]
        for i in range(500):
            expected = None if i == 7 else f"value{i}".encode() * (i % 7)
            assert s.get(f"key{i}") == expected
        report = s.verify()
        assert report["clean"], report["errors"]
        assert report["values"] == 499


def test_create_refuses_an_existing_path_and_open_a_missing_one(tmp_path):
    path = tmp_path / "s.db"
    granary.Store.create(path, size=16 << 20).close()
    with pytest.raises(granary.Exists):
        granary.Store.create(path, size=16 << 20)
    # A path that does not exist cannot be opened; a file that is not a
    # store fails the store's checks.
    with pytest.raises(granary.DeviceError):
        granary.Store.open(tmp_path / "missing.db")
    other = tmp_path / "other"
    other.write_bytes(b"not a store" * 1000)
    with pytest.raises(granary.Corrupt):
        granary.Store.open(other)


def test_memory_store_and_buffered_io(tmp_path):
    with granary.Store.memory(16 << 20) as m:
        m.put(b"a", b"b")
        assert m.get(b"a") == b"b"
        assert m.path == ":memory:"
    path = tmp_path / "b.db"
    with granary.Store.create(path, size=16 << 20, direct_io=False, durability="flush") as s:
        s.put(b"a", b"b")
        s.sync()
        s.checkpoint()
    with granary.Store.open(path, direct_io=False) as s:
        assert s.get(b"a") == b"b"


def test_stats(store):
    for i in range(20):
        store.put(f"k{i}", b"x" * 100)
    before = store.stats()
    store.get(b"k1")
    store.get(b"nope")
    st = store.stats()
    assert st["keys"] == 20
    assert st["puts"] == 20
    assert (st["gets"] - before["gets"], st["get_hits"] - before["get_hits"]) == (2, 1)
    assert st["device_bytes"] == 64 << 20
    assert st["value_bytes_max"] >= store.max_value_size()
    assert isinstance(st["write_amplification"], float)


def test_dropping_an_unclosed_store_closes_it(tmp_path):
    path = tmp_path / "s.db"
    s = granary.Store.create(path, size=16 << 20)
    s.put(b"a", b"1")
    del s
    with granary.Store.open(path) as s:
        assert s.get(b"a") == b"1"
        assert s.stats()["clean_shutdown"]


def test_a_forked_child_neither_uses_nor_closes_its_parents_store(tmp_path):
    import os
    import time

    path = tmp_path / "s.db"
    s = granary.Store.create(path, size=32 << 20)
    s.put(b"k", b"v")
    pid = os.fork()
    if pid == 0:
        # The child: every call is refused, and exiting (which finalizes
        # the store) neither waits for the parent's threads nor writes.
        code = 1
        try:
            s.get(b"k")
        except granary.Closed:
            code = 0 if s.closed and "closed" in repr(s) else 3
        except BaseException:
            code = 2
        del s
        import gc

        gc.collect()
        os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung finalizing its copy of the store")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert s.get(b"k") == b"v"
    s.put(b"k2", b"w")
    s.close()
    with granary.Store.open(path) as s:
        assert s.verify()["clean"]
        assert s.get(b"k2") == b"w"
