#!/usr/bin/env python3
"""Plot `granary-bench device --json FILE` output: throughput and median
latency against queue depth, Granary's backends against fio.

usage: scripts/plot_device.py [RESULT.json OUT.png]   (needs matplotlib)
default: docs/results/bench-device-v.json docs/results/bench-device.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    args = sys.argv[1:] or ["docs/results/bench-device-v.json", "docs/results/bench-device.png"]
    if len(args) != 2:
        sys.exit(__doc__)
    data = json.load(open(args[0]))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    styles = {"granary-uring": "o-", "granary-uring-zc": "d-", "granary-sync": "s--", "fio": "k^-"}
    for col, op in enumerate(["get", "put"]):
        for system, style in styles.items():
            pts = sorted((p for p in data["points"] if p["system"] == system and p["op"] == op), key=lambda p: p["depth"])
            if not pts:
                continue
            qd = [p["depth"] for p in pts]
            axes[0][col].plot(qd, [p["ops_per_sec"] / 1000 for p in pts], style, label=system)
            axes[1][col].plot(qd, [p["p50_us"] for p in pts], style, label=system)
        name = "GET (fio: randread)" if op == "get" else "PUT (fio: randwrite)"
        axes[0][col].set_title(f"{name}, {data['value_bytes']} B values")
        axes[0][col].set_ylabel("kops/s")
        axes[1][col].set_ylabel("median latency (us)")
        axes[1][col].set_yscale("log")
        for row in range(2):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("queue depth")
            axes[row][col].grid(True, alpha=0.3)
            axes[row][col].legend()
    fig.suptitle(f"granary-bench device ({data.get('fio_version') or 'no fio'})")
    fig.tight_layout()
    fig.savefig(args[1], dpi=90)


if __name__ == "__main__":
    main()
