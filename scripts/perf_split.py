#!/usr/bin/env python3
"""Split a `perf record -a -g` profile of one `granary-bench memcache`
phase into CPU microseconds per operation by where it went
(docs/BENCHMARKS.md, "CPU per request (memcache)"; run by
scripts/memcache-cpu-profile.sh).

    perf_split.py PERF.data granary|memcached OPS [TOP]
        the split and the top TOP symbols of each part; writes PERF.data.json
    perf_split.py --table LABEL=PERF.data.json ...
        a Markdown table of the splits side by side

Samples are attributed by process: the client is the `granary-bench`
process, the server the `granary` (or memcached) process, each the one
with the most samples (other work on a shared machine runs processes of
the same names); everything else is left out. A kernel sample goes to the
first part its call chain shows: device IO (block layer, virtio, file
reads and writes), then the network path (socket calls, TCP over loopback
and the wake-ups of the receiver it runs), then io_uring's own work, then
the scheduler. A user sample of the server goes by the crate of its symbol.
Samples are taken at 499 Hz per CPU: each stands for 1/499 s of a CPU."""
import collections, json, re, subprocess, sys

HZ = 499.0

DEV = re.compile(r"blk|nvme|virtio|vring|iowrite|ext4|iomap|^__io_read|^io_read|^io_write|^bio|submit_bio|dio")
NET = re.compile(r"sendto|sendmsg|recvfrom|recvmsg|^tcp_|^__tcp|^sock_|^__sock|^inet_|^ip_|^__ip_|loopback|"
                 r"net_rx_action|__netif|process_backlog|^__sys_(send|recv)|epoll")
SCHED = re.compile(r"schedule|finish_task_switch|wake_up|^ttwu|^enqueue|^dequeue|futex|^pick_next")


def kernel_part(frames):
    kf = [s for s, d in frames if d.startswith("[kernel")]
    if any(DEV.search(s) for s in kf):
        return "kernel: device IO"
    if any(NET.search(s) for s in kf):
        return "kernel: network path"
    if any(re.search(r"io_uring|^io_", s) for s in kf):
        return "kernel: io_uring enter/poll/sleep"
    if any(SCHED.search(s) for s in kf):
        return "kernel: context switches"
    return "kernel: other"


def granary_part(sym):
    if "granary_memcache" in sym and ("parse" in sym or "frame" in sym):
        return "user: parsing"
    if any(c in sym for c in ("granary_store", "granary_index", "granary_format", "granary_io")):
        return "user: engine"
    if "granary_rt" in sym or "io_uring" in sym:
        return "user: executor"
    if "clock_gettime" in sym or "Instant" in sym or "Timespec" in sym:
        # Almost all from the executor's spin (which reads the clock
        # every poll); the request path reads it twice per request.
        return "user: executor"
    if "granary_memcache" in sym or "granary_server" in sym:
        return "user: protocol execution"
    return "user: other"


def role(comm, server):
    if comm.startswith("granary-bench"):
        return "client"
    if server == "granary" and re.match(r"granary(-\d+)?$", comm):
        return "server"
    if server == "memcached" and (comm.startswith("memcached") or comm.startswith("mc-")):
        return "server"
    return "other"


def split(data, server, ops, top):
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,period,ip,sym,dso", "--no-demangle"],
                          capture_output=True, text=True).stdout
    head = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+(\d+)\s*$")
    samples, cur = [], None
    for line in text.split("\n"):
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
            continue
        m = head.match(line)
        if m and not line.startswith("\t"):
            cur = (m.group(1), int(m.group(2)), [])
            continue
        if cur is None:
            continue
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            m = re.match(r"(.*) \((.*)\)$", parts[1])
            sym, dso = (m.group(1), m.group(2)) if m else (parts[1], "?")
            cur[2].append((re.sub(r"\+0x[0-9a-f]+$", "", sym), dso))
    if cur:
        samples.append(cur)
    per_pid = collections.defaultdict(collections.Counter)
    for comm, pid, _ in samples:
        per_pid[role(comm, server)][pid] += 1
    main = {r: c.most_common(1)[0][0] for r, c in per_pid.items()}
    parts, tops = collections.Counter(), collections.defaultdict(collections.Counter)
    for comm, pid, frames in samples:
        r = role(comm, server)
        if r == "other" or pid != main[r]:
            continue
        frames = frames or [("?", "?")]
        sym, dso = frames[0]
        if dso.startswith("[kernel"):
            part = kernel_part(frames)
        elif r == "client":
            part = "user"
        else:
            part = granary_part(sym) if server == "granary" else "user: other"
        part = f"{r} {part}"
        parts[part] += 1
        tops[part][sym] += 1
    us = {p: n / HZ / ops * 1e6 for p, n in parts.items()}
    json.dump(us, open(data + ".json", "w"), indent=1)
    print(f"{'part':48s} {'us/op':>6s}")
    for p, v in sorted(us.items(), key=lambda x: -x[1]):
        print(f"{p:48s} {v:6.2f}")
    print(f"{'total':48s} {sum(us.values()):6.2f}")
    for p, _ in sorted(us.items(), key=lambda x: -x[1]):
        print(f"-- {p}")
        for s, n in tops[p].most_common(top):
            print(f"   {n / HZ / ops * 1e6:6.2f}  {s}")


ROWS = [
    ("Client: user space", ["client user"]),
    ("Client: kernel (network path, switches)", [f"client kernel: {k}" for k in
                                                 ("network path", "context switches", "other", "device IO",
                                                  "io_uring enter/poll/sleep")]),
    ("Server kernel: network path (send/recv over loopback, waking the client)", ["server kernel: network path"]),
    ("Server kernel: device IO (file reads and writes, block, virtio)", ["server kernel: device IO"]),
    ("Server kernel: io_uring enter, poll, sleep", ["server kernel: io_uring enter/poll/sleep"]),
    ("Server kernel: context switches", ["server kernel: context switches"]),
    ("Server kernel: other (syscall entry, faults, irq)", ["server kernel: other"]),
    ("Server: parsing", ["server user: parsing"]),
    ("Server: protocol execution (replies, stats)", ["server user: protocol execution"]),
    ("Server: engine (index, DRAM tier, store)", ["server user: engine"]),
    ("Server: executor (its spin and the spin's clock reads included)", ["server user: executor"]),
    ("Server: other user space (libc, allocator; all of memcached's)", ["server user: other"]),
]


def table(args):
    labels = [a.split("=", 1)[0] for a in args]
    ds = [json.load(open(a.split("=", 1)[1])) for a in args]
    print("| CPU µs per operation | " + " | ".join(labels) + " |")
    print("|---" + "|---:" * len(ds) + "|")
    for name, keys in ROWS:
        print(f"| {name} | " + " | ".join(f"{sum(d.get(k, 0) for k in keys):.1f}" for d in ds) + " |")
    print("| **total** | " + " | ".join(f"**{sum(d.values()):.1f}**" for d in ds) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2:])
    else:
        split(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 10)
