"""Large values at and past the store's limit, and bad arguments."""

import random

import pytest

import granary


def test_largest_value_and_one_byte_more(tmp_path, seed):
    rng = random.Random(seed)
    with granary.Store.create(tmp_path / "s.db", size=64 << 20, segment_size=4 << 20) as s:
        key = b"big"
        top = s.max_value_size(len(key))
        assert 3 << 20 < top < 4 << 20
        value = rng.randbytes(top)
        assert s.put(key, value)
        assert s.get(key) == value
        with pytest.raises(granary.InvalidArgument) as e:
            s.put(b"big2", rng.randbytes(s.max_value_size(4) + 1))
        assert "value of" in str(e.value)
        assert s.get(b"big2") is None
        with pytest.raises(granary.InvalidArgument):
            with s.batch() as b:
                b.put(b"a", value)
                b.put(b"b", value)
    with granary.Store.open(tmp_path / "s.db") as s:
        assert s.get(b"big") == value


def test_full_store_raises_nospace(tmp_path):
    with granary.Store.create(tmp_path / "s.db", size=16 << 20) as s:
        with pytest.raises(granary.NoSpace):
            for i in range(100_000):
                s.put(f"k{i}", b"x" * 4000)
        s.delete(b"k0")


def test_wrong_types(store):
    for bad in (1, None, 1.5, [b"a"], object()):
        with pytest.raises(TypeError):
            store.get(bad)
        with pytest.raises(TypeError):
            store.put(b"k", bad)
    with pytest.raises(TypeError):
        store.get_many(b"abc")
    with pytest.raises(TypeError):
        store.get_many(5)
    with pytest.raises(TypeError):
        store.put(b"k", b"v", mode=5)
    with pytest.raises(TypeError):
        store.put(b"k", b"v", b"positional mode")
    with pytest.raises(TypeError):
        store.batch().put(b"k", b"v", namespace=5)


def test_bad_values(store, tmp_path):
    with pytest.raises(ValueError):
        store.put(b"", b"v")
    with pytest.raises(granary.InvalidArgument):
        store.put(b"k" * 70000, b"v")
    with pytest.raises(granary.InvalidArgument):
        store.put(b"\0granary.mine", b"v")
    with pytest.raises(ValueError):
        store.put(b"k", b"v", mode="upsert")
    with pytest.raises(ValueError):
        store.put(b"k", b"v", mode="add", cas=5)
    with pytest.raises(OverflowError):
        store.put(b"k", b"v", cas=-1)
    with pytest.raises(ValueError):
        granary.Store.create(tmp_path / "a.db", size=-1)
    with pytest.raises(ValueError):
        granary.Store.create(tmp_path / "a.db", size=0)
    with pytest.raises(TypeError):
        granary.Store.create(tmp_path / "a.db", size="1G")
    with pytest.raises(ValueError):
        granary.Store.create(tmp_path / "a.db", size=16 << 20, durability="sometimes")
    with pytest.raises(ValueError):
        granary.Store.create(tmp_path / "a.db", size=16 << 20, segment_size=-4096)
    with pytest.raises(granary.InvalidArgument):
        granary.Store.create(tmp_path / "a.db", size=16 << 20, segment_size=3 << 20)
    assert not (tmp_path / "a.db").exists(), "a failed creation leaves no file"
    with pytest.raises(ValueError):
        granary.Store.memory(-5)
    # Sizes the device cannot take: an error, not a panic or an abort.
    with pytest.raises(granary.InvalidArgument, match="multiple of 512"):
        granary.Store.memory(10**8)
    with pytest.raises(MemoryError):
        granary.Store.memory(1 << 62)
    with granary.Store.memory(16 << 20) as s:
        assert s.max_value_size(2**64 - 1) == 0, "a key no record holds leaves no room"
    assert isinstance(granary.InvalidArgument("x"), ValueError)
