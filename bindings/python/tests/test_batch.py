"""Atomic batches: all or nothing."""

import pytest

import granary


def test_batch_commits_on_exit(store):
    ns = store.namespace("n")
    store.put(b"old", b"x")
    with store.batch() as b:
        b.put(b"a", b"1")
        b.put(b"b", b"2", namespace=ns)
        b.put(b"c", b"3", namespace="n")
        b.delete(b"old")
        assert len(b) == 4
        assert store.get(b"a") is None, "nothing is applied before the commit"
    assert store.get(b"a") == b"1"
    assert ns.get(b"b") == b"2" and ns.get(b"c") == b"3"
    assert store.get(b"old") is None


def test_exception_inside_with_discards_the_batch(store):
    store.put(b"a", b"before")
    with pytest.raises(RuntimeError):
        with store.batch() as b:
            b.put(b"a", b"after")
            b.put(b"new", b"1")
            b.delete(b"a")
            raise RuntimeError("boom")
    assert store.get(b"a") == b"before"
    assert store.get(b"new") is None


def test_failed_condition_applies_nothing(store):
    store.put(b"present", b"p")
    with pytest.raises(granary.ConditionFailed) as e:
        with store.batch() as b:
            b.put(b"x", b"1")
            b.put(b"present", b"2", mode="add")
    assert e.value.op == 1
    assert store.get(b"x") is None and store.get(b"present") == b"p"
    _, cas = store.get_cas(b"present")
    b = store.batch()
    b.put(b"present", b"3", cas=cas)
    b.check(b"absent", None)
    b.delete(b"x")
    cas_values = b.commit()
    assert len(cas_values) == 3 and cas_values[0] not in (0, cas)
    assert store.get(b"present") == b"3"
    with pytest.raises(granary.InvalidArgument):
        b.commit()
    with pytest.raises(granary.InvalidArgument):
        b.put(b"k", b"v")


def test_batch_limits(store):
    with pytest.raises(granary.InvalidArgument):
        with store.batch() as b:
            for i in range(1025):
                b.put(f"k{i}", b"v")
    assert store.get(b"k0") is None
    with pytest.raises(granary.InvalidArgument):
        with store.batch() as b:
            b.put(b"same", b"1")
            b.put(b"same", b"2")
    assert store.get(b"same") is None


def test_batch_survives_reopen(tmp_path):
    path = tmp_path / "s.db"
    with granary.Store.create(path, size=32 << 20) as s:
        with s.batch() as b:
            for i in range(100):
                b.put(f"k{i}", f"v{i}")
    with granary.Store.open(path) as s:
        assert s.get_many([f"k{i}" for i in range(100)]) == [f"v{i}".encode() for i in range(100)]


def test_namespace_of_another_store_is_refused(store, tmp_path):
    with granary.Store.memory(16 << 20) as other:
        ns = other.namespace("n")
        with pytest.raises(granary.InvalidArgument):
            store.batch().put(b"k", b"v", namespace=ns)
