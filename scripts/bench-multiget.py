#!/usr/bin/env python3
"""Multi-key GETs against a memcache server: throughput and latency.

Loads KEYS keys of 1000-byte values (`set ... noreply`, then `version` to
know they landed), then for SECS seconds each of CONNS connections sends
`get` of PER random keys and waits for its whole reply (closed loop),
checking every key was found. Prints one summary line and, with --json, a
JSON object. With --pipeline, each of the PER keys is a `get` of its own,
the PER requests sent in one write (as a proxy or a pipelining client
sends them). Run it against two servers (or two builds, one after the
other on the same data) to compare them; docs/BENCHMARKS.md, "Multi-key
reads", has the commands used there.

  scripts/bench-multiget.py --port 21421 --load --keys 100000
  scripts/bench-multiget.py --port 21421 --keys 100000 --per 16 --conns 4 --secs 5
"""
import argparse
import json
import random
import socket
import sys
import threading
import time


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def load(port, keys):
    s = connect(port)
    value = b"v" * 1000
    buf = bytearray()
    for i in range(keys):
        buf += b"set key:%d 0 0 %d noreply\r\n%s\r\n" % (i, len(value), value)
        if len(buf) > 60000:
            s.sendall(buf)
            buf.clear()
    s.sendall(bytes(buf) + b"version\r\n")
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("connection closed during the load")
        reply += chunk
    if not reply.startswith(b"VERSION"):
        sys.exit(f"load failed: {reply[:200]!r}")


def run(port, keys, per, conns, secs, pipeline):
    lat, errors, lock = [], [], threading.Lock()
    stop = time.monotonic() + secs

    def client(seed):
        rng, s, mine = random.Random(seed), connect(port), []
        try:
            while time.monotonic() < stop:
                ks = [f"key:{rng.randrange(keys)}" for _ in range(per)]
                if pipeline:
                    req, ends = "".join(f"get {k}\r\n" for k in ks), per
                else:
                    req, ends = "get " + " ".join(ks) + "\r\n", 1
                t = time.perf_counter()
                s.sendall(req.encode())
                reply = b""
                while not (reply.endswith(b"END\r\n") and reply.count(b"END\r\n") == ends):
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        raise RuntimeError("connection closed")
                    reply += chunk
                mine.append(time.perf_counter() - t)
                if reply.count(b"VALUE ") != per:
                    raise RuntimeError(f"{per} keys asked, reply {reply[:200]!r}")
        except Exception as e:  # reported after the run
            with lock:
                errors.append(str(e))
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"errors: {errors[:3]}")
    lat.sort()
    n = len(lat)
    return {
        "pipeline": pipeline,
        "per": per,
        "conns": conns,
        "secs": secs,
        "multi_gets_per_sec": n / secs,
        "keys_per_sec": n * per / secs,
        "p50_us": lat[n // 2] * 1e6,
        "p99_us": lat[min(n - 1, int(n * 0.99))] * 1e6,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--keys", type=int, default=100000)
    p.add_argument("--load", action="store_true", help="load the keys and exit")
    p.add_argument("--per", type=int, default=16, help="keys per get")
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--secs", type=float, default=5)
    p.add_argument("--pipeline", action="store_true", help="one get per key, pipelined in one write")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.load:
        load(a.port, a.keys)
        print(f"loaded {a.keys} keys")
        return
    r = run(a.port, a.keys, a.per, a.conns, a.secs, a.pipeline)
    what = f"{r['per']} pipelined gets" if a.pipeline else f"get of {r['per']} keys"
    print(
        f"{what}, {r['conns']} connections: {r['multi_gets_per_sec']:.0f} multi-gets/s "
        f"({r['keys_per_sec']:.0f} keys/s), p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us"
    )
    if a.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
