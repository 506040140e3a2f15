"""ShardedClient(ring="twemproxy"): keys placed as a nutcracker pool
places them, checked against placements recorded from nutcracker 0.5.0
(the Rust client's tests in crates/client/src/ketama.rs hold the same
ones), and against two `granary serve` started here."""

import pytest

import granary
from conftest import Server


def ring(pool, hash_tag=None):
    """A twemproxy-placed client of `pool`; the native addresses are never
    connected to (server_of needs none)."""
    native = [f"127.0.0.1:{20000 + i}" for i in range(len(pool))]
    return granary.ShardedClient(native, ring="twemproxy", pool=pool, hash_tag=hash_tag)


def check(client, placed):
    """Each key on the pool's server numbered as recorded (from 1)."""
    wrong = [(k, n, client.server_of(k) + 1) for k, n in placed if client.server_of(k) + 1 != n]
    assert not wrong, f"(key, nutcracker's server, ours): {wrong}"


def test_matches_nutcracker_with_weights():
    c = ring(["127.0.0.2:11211:1", "127.0.0.3:11211:2", "127.0.0.4:11211:1"])
    check(c, [
        ("key-0", 1), ("key-1", 2), ("key-2", 2), ("key-3", 2), ("key-4", 1), ("key-5", 3),
        ("key-6", 1), ("key-7", 1), ("key-8", 3), ("key-9", 3), ("key-10", 2), ("key-11", 1),
        ("key-12", 2), ("key-13", 2), ("key-14", 3), ("key-15", 3), ("key-16", 2), ("key-17", 2),
        ("key-18", 2), ("key-19", 2), ("key-20", 2), ("key-21", 1), ("key-22", 1), ("key-23", 1),
        ("a", 2), ("user:1000", 2), ("granary", 1),
    ])


def test_matches_nutcracker_single_precision_point_counts():
    # 25 equal servers get 156 points each in nutcracker (single
    # precision), not libketama's 160: these keys tell the two apart.
    c = ring([f"127.0.0.{i}:11211:1" for i in range(2, 27)])
    placed = [
        ("key-0", 16), ("key-1", 25), ("key-2", 22), ("key-4", 1), ("key-120", 21),
        ("key-136", 15), ("key-143", 10), ("key-159", 5), ("key-274", 25), ("key-324", 20),
    ]
    check(c, placed)


def test_matches_nutcracker_with_names_and_a_hash_tag():
    pool = ["127.0.0.2:11211:3 alpha", "127.0.0.3:11211:1 beta", "127.0.0.4:11211:2 gamma", "127.0.0.5:11211:1"]
    c = ring(pool, hash_tag="{}")
    check(c, [
        ("user:{42}:name", 1), ("user:{42}:mail", 1), ("{}x", 1), ("x{", 1), ("a{b}c", 3), ("{abc}", 1),
        ("k-0", 4), ("k-1", 1), ("k-2", 1), ("k-3", 3), ("k-4", 2), ("k-5", 2), ("k-6", 3), ("k-7", 4),
        ("k-8", 2), ("k-9", 1), ("k-10", 3), ("k-11", 1), ("k-12", 1), ("k-13", 1), ("k-14", 3), ("k-15", 1),
    ])
    # Without the tag, keys sharing one are no longer bound together.
    untagged = ring(pool)
    assert {untagged.server_of(f"user:{{42}}:{f}") for f in range(200)} != {0}


def test_twemproxy_ring_arguments():
    pool = ["127.0.0.2:11211:1", "127.0.0.3:11211:1"]
    native = ["127.0.0.1:20000", "127.0.0.1:20001"]
    with pytest.raises(granary.InvalidArgument, match="needs pool"):
        granary.ShardedClient(native, ring="twemproxy")
    with pytest.raises(granary.InvalidArgument, match="servers for a pool"):
        granary.ShardedClient(native[:1], ring="twemproxy", pool=pool)
    with pytest.raises(granary.InvalidArgument, match="weight"):
        granary.ShardedClient(native, ring="twemproxy", pool=["127.0.0.2:11211", "127.0.0.3:11211:1"])
    with pytest.raises(granary.InvalidArgument, match="hash_tag"):
        granary.ShardedClient(native, ring="twemproxy", pool=pool, hash_tag="{")
    with pytest.raises(granary.InvalidArgument, match="twemproxy"):
        granary.ShardedClient(native, pool=pool)
    with pytest.raises(granary.InvalidArgument, match="ring"):
        granary.ShardedClient(native, ring="maglev")
    # One server holds every key.
    one = granary.ShardedClient(native[:1], ring="twemproxy", pool=pool[:1])
    assert {one.server_of(f"k{i}") for i in range(50)} == {0}


def test_twemproxy_placement_against_servers(server, tmp_path):
    second = Server(tmp_path / "second.db")
    try:
        native = [server.address, second.address]
        pool = ["127.0.0.2:11211:1 node1", "127.0.0.3:11211:3 node2"]
        c = granary.ShardedClient(native, ring="twemproxy", pool=pool)
        singles = [granary.Client(a) for a in native]
        keys = [f"tw-{i}".encode() for i in range(200)]
        for k in keys:
            assert c.put(k, k + b"!")
        owners = [c.server_of(k) for k in keys]
        assert set(owners) == {0, 1}
        # Weight 3 of 4 holds most.
        assert owners.count(1) > owners.count(0)
        for k, o in zip(keys, owners):
            assert singles[o].get(k) == k + b"!"
            assert singles[1 - o].get(k) is None
        assert c.get_many(keys) == [k + b"!" for k in keys]
        assert all(c.delete(k) for k in keys)
    finally:
        second.stop()
