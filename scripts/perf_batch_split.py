#!/usr/bin/env python3
"""Where an atomic batch's CPU goes: the samples of `perf script` (from
`perf record --call-graph dwarf` over `granary-bench txn`) whose stack
holds `commit_batch`, split into the device write (a `pwrite64` or
`fdatasync` frame) and the commit path, the commit path by stage.

  perf record -o txn.data --call-graph dwarf -F 2000 \\
      ./target/release/granary-bench txn --keys 10K --batches 16 --secs 3 --no-rocksdb
  perf script -i txn.data > txn.txt
  python3 scripts/perf_batch_split.py txn.txt --direct --freq 2000 --commits N

The bench runs Flush mode, then Direct mode; --direct keeps only the
samples after the last batch commit in `fdatasync` (the end of Flush
mode), and
--skip-secs drops those of the first seconds instead. With --commits (Direct batches committed: the
bench's "direct batch" commits/s times --secs) and --freq (perf's -F),
CPU per batch is printed in microseconds too. Single puts' samples (a
`Core::put` stack without `commit_batch`) are reported the same way, with
--put-commits. --symbol NAME adds the share of the commit path's samples
with a frame naming NAME. Samples after the last batch (the bench's namespace part)
are left out. Standard library only.
"""

import argparse
import collections
import re

STAGES = [
    ("publish: links' table", ("start_blind", "finish_blind")),
    ("publish: index", ("replace_with", "insert_with")),
    ("publish: other", ("publish_batch", "publish_counted", "publish_blind")),
    ("encode (checksums, copies, padding)", ("encode_in_place", "RecordHeader::encode", "members_crc")),
    ("links check", ("blind_ok_all",)),
    ("index lookups", ("Index::lookup", "Index::prefetch")),
    ("stripe locks", ("stripe_at", "MutexGuard")),
]


def samples(path):
    """(time, frames) per sample, frames innermost first, symbols only."""
    out, cur, t = [], [], None
    for line in open(path, errors="replace"):
        s = line.rstrip("\n")
        if not s.strip():
            if cur:
                out.append((t, cur))
            cur, t = [], None
            continue
        if t is None and not s.startswith(("\t", " ")):
            m = re.match(r"\s*\S+\s+\d+\s+([\d.]+):", s)
            t = float(m.group(1)) if m else 0.0
            continue
        f = s.strip().split(" ", 1)
        sym = f[1] if len(f) > 1 else f[0]
        sym = re.sub(r" \(.*\)$", "", sym)
        cur.append(re.sub(r"\+0x[0-9a-f]+$", "", sym))
    if cur:
        out.append((t, cur))
    return out


def in_write(frames):
    return any("pwrite" in f or "fdatasync" in f for f in frames)


def report(name, got, freq, commits):
    n = len(got)
    if not n:
        print(f"{name}: no samples")
        return
    w = sum(1 for f in got if in_write(f))
    per = (lambda k: f" = {k / freq / commits * 1e6:.1f} us a commit") if freq and commits else (lambda k: "")
    print(f"{name}: {n} samples{per(n)}")
    print(f"  device write (pwrite64/fdatasync and below): {100 * w / n:.1f}%{per(w)}")
    print(f"  outside it: {100 * (n - w) / n:.1f}%{per(n - w)}")
    rest = [f for f in got if not in_write(f)]
    if not rest or name != "batch":
        return
    stage = collections.Counter()
    for f in rest:
        for label, keys in STAGES:
            if any(k in x for x in f for k in keys):
                stage[label] += 1
                break
        else:
            stage["other"] += 1
    for label, k in stage.most_common():
        print(f"    {label:<38} {100 * k / len(rest):5.1f}% of the commit path{per(k)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="perf script output")
    ap.add_argument("--skip-secs", type=float, default=0.0)
    ap.add_argument("--direct", action="store_true", help="only the samples after Flush mode's last batch")
    ap.add_argument("--freq", type=float)
    ap.add_argument("--commits", type=float, help="batches committed in the window")
    ap.add_argument("--put-commits", type=float, help="single puts in the window")
    ap.add_argument("--symbol", action="append", default=[], help="also the share of the commit path under it")
    a = ap.parse_args()
    all_samples = samples(a.script)
    t0 = all_samples[0][0] if all_samples else 0.0
    start = t0 + a.skip_secs
    if a.direct:
        flushed = [t for t, f in all_samples if any("fdatasync" in x for x in f) and any("commit_batch" in x for x in f)]
        start = max(flushed, default=t0)
    # Up to the last batch: the namespace part of the bench comes after.
    end = max([t for t, f in all_samples if any("commit_batch" in x for x in f)], default=start)
    window = [f for t, f in all_samples if start < t <= end]
    batch = [f for f in window if any("commit_batch" in x for x in f)]
    put = [f for f in window if not any("commit_batch" in x for x in f) and any("Core>::put" in x for x in f)]
    report("batch", batch, a.freq, a.commits)
    path = [f for f in batch if not in_write(f)]
    for name in a.symbol:
        k = sum(1 for f in path if any(name in x for x in f))
        print(f"    under {name}: {100 * k / max(len(path), 1):.1f}% of the commit path")
    report("put", put, a.freq, a.put_commits)


if __name__ == "__main__":
    main()
