#!/usr/bin/env python3
"""Plot `granary-bench memcache --json FILE` outputs: throughput (ours and
memcaslap's) and GET latency per peer, one column per scenario.

usage: scripts/plot_memcache.py [OUT.png RESULT.json [RESULT.json ...]]   (needs matplotlib)
default: docs/results/bench-memcache.png docs/results/bench-memcache-fits.json docs/results/bench-memcache-4x.json
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    args = sys.argv[1:] or [
        "docs/results/bench-memcache.png",
        "docs/results/bench-memcache-fits.json",
        "docs/results/bench-memcache-4x.json",
    ]
    if len(args) < 2:
        sys.exit(__doc__)
    runs = [json.load(open(p)) for p in args[1:]]
    fig, axes = plt.subplots(2, len(runs), figsize=(5.5 * len(runs), 8), squeeze=False)
    for col, run in enumerate(runs):
        peers = run["peers"]
        names = [p["peer"] for p in peers]
        x = range(len(peers))
        ax = axes[0][col]
        ax.bar([i - 0.2 for i in x], [p["ops_per_sec"] / 1000 for p in peers], 0.4, label="granary-bench memcache")
        caslap = [(p.get("memcaslap_ops_per_sec") or 0) / 1000 for p in peers]
        if any(caslap):
            ax.bar([i + 0.2 for i in x], caslap, 0.4, label="memcaslap")
        ax.set_xticks(list(x), [f"{n}\nhit {100 * p['hit_ratio']:.0f}%" for n, p in zip(names, peers)])
        ax.set_ylabel("kops/s")
        mem = run["memory_mib"]
        data_mib = run["keys"] * run["value_bytes"] / 2**20
        ax.set_title(f"{run['keys']} x {run['value_bytes']} B ({data_mib:.0f} MiB), memcached -m {mem}")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        ax = axes[1][col]
        for j, (q, label) in enumerate([("p50", "GET p50"), ("p99", "GET p99"), ("p999", "GET p99.9")]):
            ax.bar([i + (j - 1) * 0.27 for i in x], [p["get_us"][q] for p in peers], 0.27, label=label)
        ax.set_xticks(list(x), names)
        ax.set_ylabel("latency (us)")
        ax.set_yscale("log")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{runs[0]['get_percent']}% GET, {runs[0]['conns']} connections, {runs[0]['secs']} s per peer")
    fig.tight_layout()
    fig.savefig(args[0], dpi=90)


if __name__ == "__main__":
    main()
