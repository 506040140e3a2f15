"""Granary from Python against the key-value stores Python users reach for.

``python -m granary.bench [--dir DIR] [--count N] [--value-size B]``

Each store gets the same work, in one run, with its files in the same
folder (so on the same disk): ``N`` puts of random ``B``-byte values (1 KiB
by default) under random keys, one write per call as an application makes
them, then ``N`` gets of those keys in another random order. Stores:

- granary, durability "direct" (O_DIRECT; a put is acknowledged once its
  write completes: it survives a crash of the process);
- granary, durability "flush" (an fdatasync before the acknowledgement, as
  sqlite's synchronous=FULL: it survives power loss too);
- sqlite3 in WAL mode with synchronous=FULL, one transaction per put;
- dbm.gnu (no sync per write: gdbm has no cheaper durable mode), when the
  interpreter has it (Debian: python3-gdbm);
- lmdb (PyPI ``lmdb``, one transaction per put, synced), when installed.

Then the GET latency of one 1 KiB value on Granary's in-memory device, from
Python and through the Rust API in the same process
(``granary._granary._rust_get_loop``), and their difference.

Prints a summary on stderr and the results as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import granary
from granary._granary import _rust_get_loop

Work = Tuple[List[bytes], List[bytes], List[bytes]]


def make_work(count: int, value_size: int, seed: int) -> Work:
    rng = random.Random(seed)
    keys = [b"key:%016x" % rng.getrandbits(64) for _ in range(count)]
    values = [rng.randbytes(value_size) for _ in range(count)]
    order = keys[:]
    rng.shuffle(order)
    return keys, values, order


def timed(f: Callable[[], None], ops: int) -> Dict[str, float]:
    t = time.perf_counter()
    f()
    s = time.perf_counter() - t
    return {"ops_per_s": ops / s, "mean_us": s / ops * 1e6}


def run(name: str, put: Callable[[bytes, bytes], None], get: Callable[[bytes], Optional[bytes]], work: Work) -> Dict:
    keys, values, order = work

    def puts() -> None:
        for k, v in zip(keys, values):
            put(k, v)

    def gets() -> None:
        for k in order:
            if get(k) is None:
                raise AssertionError(f"{name}: a key written is missing")

    return {"put": timed(puts, len(keys)), "get": timed(gets, len(order))}


def run_threaded_puts(name: str, put: Callable[[bytes, bytes], None], work: Work, threads: int) -> Dict:
    """The puts of `work` shared by `threads` threads (each a slice of
    them); their rate."""
    keys, values, _ = work
    errors: List[BaseException] = []

    def part(i: int) -> None:
        try:
            for k, v in zip(keys[i::threads], values[i::threads]):
                put(k, v)
        except BaseException as e:
            errors.append(e)

    def puts() -> None:
        ts = [threading.Thread(target=part, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise RuntimeError(f"{name}: {errors[0]!r}")

    return {"put": timed(puts, len(keys)), "threads": threads}


def bench_granary(folder: str, work: Work, durability: str, threads: int = 1) -> Dict:
    count = len(work[0])
    value = len(work[1][0])
    size = max(256 << 20, count * (value + 512) * 3)
    path = os.path.join(folder, f"granary-{durability}.db")
    with granary.Store.create(path, size=size, durability=durability) as s:
        if threads > 1:
            r = run_threaded_puts(f"granary ({durability})", s.put, work, threads)
        else:
            r = run(f"granary ({durability})", s.put, s.get, work)
        st = s.stats()
        r["device_writes"], r["device_flushes"] = st["device_writes"], st["device_flushes"]
    os.remove(path)
    return r


def sqlite_connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")  # autocommit: a transaction per statement
    db.execute("PRAGMA synchronous=FULL")
    return db


def bench_sqlite(folder: str, work: Work, threads: int = 1) -> Dict:
    path = os.path.join(folder, "sqlite.db")
    db = sqlite_connect(path)
    db.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")

    def get(k: bytes) -> Optional[bytes]:
        row = db.execute("SELECT v FROM kv WHERE k = ?", (k,)).fetchone()
        return row[0] if row else None

    if threads > 1:
        # A connection per thread (a connection is not for concurrent use).
        local = threading.local()

        def put(k: bytes, v: bytes) -> None:
            if not hasattr(local, "db"):
                local.db = sqlite_connect(path)
            local.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, v))

        r = run_threaded_puts("sqlite3", put, work, threads)
    else:

        def put(k: bytes, v: bytes) -> None:
            db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, v))

        r = run("sqlite3", put, get, work)
    db.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return r


def bench_gdbm(folder: str, work: Work) -> Dict:
    import dbm.gnu

    path = os.path.join(folder, "gdbm.db")
    db = dbm.gnu.open(path, "n")
    r = run("dbm.gnu", db.__setitem__, db.get, work)
    db.close()
    os.remove(path)
    return r


def bench_lmdb(folder: str, work: Work) -> Dict:
    import lmdb

    path = os.path.join(folder, "lmdb")
    count, value = len(work[0]), len(work[1][0])
    env = lmdb.open(path, map_size=max(1 << 30, count * (value + 512) * 4), sync=True)

    def put(k: bytes, v: bytes) -> None:
        with env.begin(write=True) as txn:
            txn.put(k, v)

    def get(k: bytes) -> Optional[bytes]:
        with env.begin() as txn:
            return txn.get(k)

    r = run("lmdb", put, get, work)
    env.close()
    shutil.rmtree(path)
    return r


def get_latency(value_size: int, iterations: int, rounds: int) -> Dict:
    """Python `Store.get` against the Rust API's `Store::get`, one key on
    the in-memory device; the best of `rounds` rounds of each."""
    with granary.Store.memory(64 << 20) as s:
        key = b"key:latency"
        s.put(key, random.Random(1).randbytes(value_size))
        get = s.get
        rng = range(iterations)
        py, empty, rust = [], [], []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            for _ in rng:
                get(key)
            py.append((time.perf_counter_ns() - t) / iterations)
            t = time.perf_counter_ns()
            for _ in rng:
                pass
            empty.append((time.perf_counter_ns() - t) / iterations)
            rust.append(_rust_get_loop(s, key, iterations))
    py_ns, loop_ns, rust_ns = min(py), min(empty), min(rust)
    return {
        "python_get_ns": py_ns,
        "python_loop_overhead_ns": loop_ns,
        "rust_get_ns": rust_ns,
        "difference_ns": py_ns - rust_ns,
        "target_difference_ns": 2000,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m granary.bench", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dir", help="folder for the stores' files (default: a new one in the current folder)")
    ap.add_argument("--count", type=int, default=20000, help="puts, and gets, per store (default 20000)")
    ap.add_argument("--value-size", type=int, default=1024, help="bytes per value (default 1024)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=8, help="writer threads of the threaded put runs (default 8)")
    ap.add_argument("--latency-iterations", type=int, default=200000)
    a = ap.parse_args(argv)
    if a.count <= 0 or a.value_size <= 0:
        ap.error("--count and --value-size must be positive")
    folder = tempfile.mkdtemp(prefix="granary-bench-", dir=a.dir or ".")
    work = make_work(a.count, a.value_size, a.seed)
    results: Dict[str, Dict] = {}
    skipped: Dict[str, str] = {}
    say = lambda *m: print(*m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        benches: List[Tuple[str, Callable[[], Dict]]] = [
            ("granary (direct)", lambda: bench_granary(folder, work, "direct")),
            ("granary (flush)", lambda: bench_granary(folder, work, "flush")),
            ("sqlite3 (WAL, synchronous=FULL)", lambda: bench_sqlite(folder, work)),
            ("dbm.gnu (no sync)", lambda: bench_gdbm(folder, work)),
            ("lmdb (sync)", lambda: bench_lmdb(folder, work)),
            (f"granary (flush), {a.threads} threads", lambda: bench_granary(folder, work, "flush", a.threads)),
            (f"sqlite3 (WAL, FULL), {a.threads} threads", lambda: bench_sqlite(folder, work, a.threads)),
        ]
        for name, f in benches:
            what = "puts" if "threads" in name else "puts and gets"
            say(f"{name}: {a.count} {what} of {a.value_size} B ...")
            try:
                results[name] = f()
            except ImportError as e:
                skipped[name] = f"not available: {e}"
                say(f"  skipped ({skipped[name]})")
        say("GET latency on the in-memory device, Python against Rust ...")
        latency = get_latency(a.value_size, a.latency_iterations, 5)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = {
        "count": a.count,
        "value_size": a.value_size,
        "folder": os.path.abspath(a.dir or "."),
        "python": sys.version.split()[0],
        "results": results,
        "skipped": skipped,
        "get_latency": latency,
    }
    say("")
    say(f"{'store':34} {'puts/s':>10} {'gets/s':>10} {'put us':>9} {'get us':>9}")
    for name, r in results.items():
        p, g = r["put"], r.get("get")
        gets = f"{g['ops_per_s']:10.0f}" if g else f"{'-':>10}"
        get_us = f"{g['mean_us']:9.2f}" if g else f"{'-':>9}"
        say(f"{name:34} {p['ops_per_s']:10.0f} {gets} {p['mean_us']:9.2f} {get_us}")
    for name, why in skipped.items():
        say(f"{name:34} {why}")
    sq = results.get("sqlite3 (WAL, synchronous=FULL)")
    sq_t = results.get(f"sqlite3 (WAL, FULL), {a.threads} threads")
    pairs = [("granary (direct)", sq), ("granary (flush)", sq), (f"granary (flush), {a.threads} threads", sq_t)]
    for gname, base in pairs:
        if base and gname in results:
            ratio = results[gname]["put"]["ops_per_s"] / base["put"]["ops_per_s"]
            say(f"{gname}: {ratio:.1f}x sqlite3's puts/s (target: at least 3x)")
    lat = latency
    say(
        f"GET of {a.value_size} B in memory: Python {lat['python_get_ns']:.0f} ns "
        f"(of which the loop {lat['python_loop_overhead_ns']:.0f} ns), Rust {lat['rust_get_ns']:.0f} ns: "
        f"{lat['difference_ns']:.0f} ns apart (target: within 2000 ns)"
    )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
