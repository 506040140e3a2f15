"""A child process holding a store is killed (SIGKILL) while it writes:
every write it had acknowledged is found after the parent reopens the
store."""

import os
import signal
import subprocess
import sys
import textwrap

import granary

CHILD = textwrap.dedent(
    """
    import sys, granary
    path, seed = sys.argv[1], int(sys.argv[2])
    s = granary.Store.open(path)
    ns = s.namespace("n")
    i = 0
    while True:
        key = f"k{i}".encode()
        value = f"{seed}-{i}".encode() * (1 + i % 50)
        if i % 3 == 0:
            s.put(key, value)
        elif i % 3 == 1:
            ns.put(key, value)
        else:
            with s.batch() as b:
                b.put(key, value)
                b.put(key, value, namespace=ns)
        # Acknowledged: the call returned.
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
        i += 1
    """
)

ACKED_BEFORE_KILL = 3000


def value_of(seed, i):
    return f"{seed}-{i}".encode() * (1 + i % 50)


def test_acknowledged_writes_survive_sigkill(tmp_path, seed):
    path = tmp_path / "s.db"
    granary.Store.create(path, size=64 << 20).close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(seed)], stdout=subprocess.PIPE, text=True)
    acked = -1
    try:
        for line in child.stdout:
            acked = int(line)
            if acked + 1 >= ACKED_BEFORE_KILL:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(60)
    assert acked + 1 >= ACKED_BEFORE_KILL, f"the child stopped after {acked + 1} writes (rc {child.returncode})"
    with granary.Store.open(path) as s:
        assert not s.stats()["clean_shutdown"]
        ns = s.namespace("n", create=False)
        for i in range(acked + 1):
            key = f"k{i}".encode()
            v = value_of(seed, i)
            if i % 3 == 0:
                assert s.get(key) == v, i
            elif i % 3 == 1:
                assert ns.get(key) == v, i
            else:
                assert (s.get(key), ns.get(key)) == (v, v), i
        report = s.verify()
        assert report["clean"], report["errors"]
