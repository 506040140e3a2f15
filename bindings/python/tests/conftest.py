"""Fixtures of the Python binding's tests: stores in temporary folders,
and `granary serve` started for the client tests."""

import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import granary

REPO = Path(__file__).resolve().parents[3]

# Ports given to servers the tests start: below the kernel's ephemeral range,
# as granary_rt::net::LOW_PORTS.
LOW_PORTS = range(20000, 32768)


def free_low_port() -> int:
    """A port of LOW_PORTS free on 127.0.0.1 a moment ago."""
    span = len(LOW_PORTS)
    start = (os.getpid() * 7919 + random.randrange(span)) % span
    for i in range(512):
        port = LOW_PORTS[(start + i * 13) % span]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32768")


@pytest.fixture
def store(tmp_path):
    s = granary.Store.create(tmp_path / "s.db", size=64 << 20)
    yield s
    s.close()


def granary_binary() -> Path:
    """The `granary` binary: $GRANARY_BIN, or target/debug/granary (under
    $CARGO_TARGET_DIR if set)."""
    if os.environ.get("GRANARY_BIN"):
        return Path(os.environ["GRANARY_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "granary"


class Server:
    """`granary serve` on 127.0.0.1, native protocol only; stopped by PID."""

    def __init__(self, data: Path, wait_s: float = 60.0, extra: tuple = ()):
        exe = granary_binary()
        if not exe.exists():
            msg = f"{exe} is missing: build it with `cargo build -p granary-cli` (or set GRANARY_BIN)"
            if os.environ.get("GRANARY_REQUIRE_PEERS"):
                pytest.fail(msg)
            pytest.skip(msg)
        self.port = free_low_port()
        memcache_port = free_low_port()
        args = [str(exe), "serve", "--data", str(data), "--size", "64M", "-l", "127.0.0.1",
                "-p", str(memcache_port), "--native-port", str(self.port), "--no-resp", "-t", "1", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "GRANARY_LOG": "info"})
        self.log: list[str] = []
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                if "serving the native protocol" in line:
                    ready.set()
            ready.set()  # exited: the wait below sees it

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(wait_s) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("granary serve did not start:\n" + "".join(self.log))
        self.address = f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve") / "g.db")
    yield s
    s.stop()


@pytest.fixture
def seed():
    """A seed for randomized tests, printed so a failure can be replayed
    (GRANARY_TEST_SEED)."""
    s = int(os.environ.get("GRANARY_TEST_SEED", time.time_ns() % (1 << 32)))
    print(f"seed: {s} (GRANARY_TEST_SEED={s} replays it)")
    return s
