"""Namespaces: separate key spaces of one store."""

import pytest

import granary


def test_namespaces_hold_their_own_keys(store):
    a = store.namespace("a")
    b = store.namespace("b")
    store.put(b"k", b"default")
    a.put(b"k", b"in a")
    b.put(b"k", b"in b", mode="add")
    assert (store.get(b"k"), a.get(b"k"), b.get(b"k")) == (b"default", b"in a", b"in b")
    assert a.get_many([b"k", b"x"]) == [b"in a", None]
    assert a.delete(b"k") and a.get(b"k") is None
    assert b.get(b"k") == b"in b"
    assert store.list_namespaces() == ["default", "a", "b"]
    assert a.name == "a"
    assert b.stats()["keys"] == 1
    assert sorted(b.keys()) == [b"k"]
    assert list(b) == [b"k"]
    assert store.namespace("default").get(b"k") == b"default"


def test_namespace_without_create(store):
    with pytest.raises(granary.NotFound):
        store.namespace("nope", create=False)
    store.namespace("yes")
    assert store.namespace("yes", create=False).name == "yes"


def test_drop_and_truncate(store):
    ns = store.namespace("gone")
    for i in range(50):
        ns.put(f"k{i}", b"v")
    ns.drop()
    assert store.list_namespaces() == ["default"]
    with pytest.raises(granary.NotFound):
        ns.get(b"k1")
    again = store.namespace("gone")
    assert again.get(b"k1") is None, "a namespace created again under a dropped one's name is empty"
    again.put(b"k1", b"new")
    store.drop_namespace("gone")
    with pytest.raises(granary.NotFound):
        store.drop_namespace("gone")
    t = store.namespace("t")
    t.put(b"a", b"1")
    t.truncate()
    assert t.get(b"a") is None
    assert "t" in store.list_namespaces()


def test_a_handle_never_reaches_a_namespace_made_again_under_its_name(store):
    old = store.namespace("n")
    old.put(b"k", b"old")
    old.drop()
    new = store.namespace("n")
    new.put(b"k", b"new")
    for call in (lambda: old.get(b"k"), old.drop, old.truncate, old.stats):
        with pytest.raises(granary.NotFound):
            call()
    with pytest.raises(granary.NotFound):
        with store.batch() as b:
            b.put(b"k2", b"v", namespace=old)
    # By name, a batch reaches the namespace of that name now.
    with store.batch() as b:
        b.put(b"k2", b"v", namespace="n")
    assert new.get(b"k") == b"new", "the new namespace is left alone"
    assert new.get(b"k2") == b"v"
    assert new.stats()["keys"] == 2


def test_bad_namespace_name(store):
    with pytest.raises(granary.InvalidArgument):
        store.namespace("no spaces allowed " * 10)


def test_namespaces_survive_reopen_and_handles_do_not_hold_the_store(tmp_path):
    path = tmp_path / "s.db"
    with granary.Store.create(path, size=32 << 20) as s:
        ns = s.namespace("x")
        ns.put(b"k", b"v")
    with pytest.raises(granary.Closed):
        ns.get(b"k")
    # The handle still lives: the store's files are released all the same.
    with granary.Store.open(path) as s:
        assert s.namespace("x", create=False).get(b"k") == b"v"
