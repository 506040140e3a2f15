"""Several threads on one store: every result checked."""

import fcntl
import random
import threading

import granary

THREADS = 8
OPS = 2000


def test_threads_put_and_get_concurrently(store, seed):
    ns = store.namespace("shared")
    for i in range(100):
        ns.put(f"s{i}", f"shared{i}")
    errors = []

    def work(t):
        rng = random.Random(seed + t)
        mine = {}
        try:
            for n in range(OPS):
                k = f"t{t}-{rng.randrange(300)}".encode()
                r = rng.random()
                if r < 0.45:
                    v = rng.randbytes(rng.randrange(1, 2000))
                    store.put(k, v)
                    mine[k] = v
                elif r < 0.55:
                    assert store.delete(k) == (k in mine)
                    mine.pop(k, None)
                elif r < 0.9:
                    assert store.get(k) == mine.get(k), (t, n, k)
                else:
                    i = rng.randrange(100)
                    assert ns.get(f"s{i}") == f"shared{i}".encode()
            for k, v in mine.items():
                assert store.get(k) == v
        except BaseException as e:  # reported by the main thread
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
        assert not th.is_alive(), "a worker thread is stuck"
    assert not errors, errors
    assert store.verify()["clean"]


def test_close_waits_for_other_threads_and_then_refuses(tmp_path):
    s = granary.Store.create(tmp_path / "s.db", size=32 << 20)
    stop = threading.Event()
    outcomes = []

    def writer():
        i = 0
        while not stop.is_set() and i < 1_000_000:
            try:
                s.put(f"k{i}", b"v" * 100)
            except granary.Closed:
                outcomes.append("closed")
                return
            i += 1
        outcomes.append("stopped")

    th = threading.Thread(target=writer)
    th.start()
    # The writer runs with the GIL released: this thread sees its puts.
    for _ in range(10_000_000):
        if s.stats()["puts"] >= 100 or not th.is_alive():
            break
    assert th.is_alive() and s.stats()["puts"] >= 100
    s.close()
    th.join(60)
    stop.set()
    assert outcomes == ["closed"]


def test_closed_and_a_second_close_mean_the_store_is_closed(tmp_path):
    """`closed` turns true, and a second close returns, only once the
    first close has ended: the store's file is unlocked by then."""
    path = tmp_path / "s.db"

    def unlocked():
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    s = granary.Store.create(path, size=64 << 20)
    for i in range(20_000):
        s.put(f"k{i}", b"v")
    assert not unlocked()
    closer = threading.Thread(target=s.close)
    closer.start()
    for _ in range(100_000_000):
        if s.closed:
            break
    assert s.closed and unlocked()
    closer.join(60)
    for _ in range(5):
        s = granary.Store.open(path)
        closer = threading.Thread(target=s.close)
        closer.start()
        s.close()
        assert unlocked()
        closer.join(60)
