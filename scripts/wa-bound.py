#!/usr/bin/env python3
"""The lowest write amplification a log-structured store can reach under
Zipfian overwrites if it knew every key's write rate: a fluid model.

Keys are split into classes by rank (equal steps of log rank); each class
lives in segments of its own and gets a share of the device's free space;
within a class writes are uniform, so greedy GC's write amplification is
LFS's: with u the class's utilisation, victims hold a live share a where
(a - 1) / ln a = u, and WA = 1 / (1 - a). The free space is split among
the classes to minimise the total, sum over classes of (share of writes x
WA), by handing it out in small steps to whichever class gains the most
(the total is convex in each share).

  python3 scripts/wa-bound.py                  # 25,635 keys, Zipf 0.99, 80% live
  python3 scripts/wa-bound.py --keys 100000 --theta 0.99 --util 0.8 --calibrate 2.27

--calibrate W first finds the utilisation at which one class (no
separation) gives W, the write amplification `granary-bench churn`
measured for greedy under uniform writes in the same setting (the
utilisation found is lower than the run's --util; its deletes and reserve
may account for that, not measured), and models that utilisation instead. Standard library only.
"""

import argparse
import itertools
import math


def live_share_of_victims(u):
    """a in (0, 1) with (a - 1) / ln a = u, by bisection."""
    lo, hi = 1e-12, 1 - 1e-12
    for _ in range(100):
        mid = (lo + hi) / 2
        if (mid - 1) / math.log(mid) < u:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def greedy_wa(u):
    return 1 / (1 - live_share_of_victims(u)) if u > 0 else 1.0


def bound(weights, util, classes, steps=4000):
    n = len(weights)
    cum = list(itertools.accumulate(weights))
    edges = sorted({0, n, *(round(n ** (i / classes)) for i in range(1, classes))})
    w, d = [], []
    for a, b in zip(edges, edges[1:]):
        w.append(cum[b - 1] - (cum[a - 1] if a else 0.0))
        d.append((b - a) / n * util)
    free = [(1 - util) * 1e-4] * len(w)
    step = ((1 - util) - sum(free)) / steps

    def cost(i, s):
        return w[i] * greedy_wa(d[i] / (d[i] + s))

    for _ in range(steps):
        best = max(range(len(w)), key=lambda i: cost(i, free[i]) - cost(i, free[i] + step))
        free[best] += step
    return sum(cost(i, free[i]) for i in range(len(w))), len(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=25_635)
    ap.add_argument("--theta", type=float, default=0.99)
    ap.add_argument("--util", type=float, default=0.8)
    ap.add_argument("--calibrate", type=float, help="greedy's measured WA under uniform writes")
    ap.add_argument("--classes", default="1,2,4,8,32")
    a = ap.parse_args()
    util = a.util
    if a.calibrate:
        lo, hi = 0.05, 0.99
        for _ in range(60):
            mid = (lo + hi) / 2
            if greedy_wa(mid) < a.calibrate:
                lo = mid
            else:
                hi = mid
        util = (lo + hi) / 2
        print(f"effective utilisation for greedy WA {a.calibrate}: {util:.3f}")
    p = [1 / k**a.theta for k in range(1, a.keys + 1)]
    total = sum(p)
    p = [x / total for x in p]
    one = greedy_wa(util)
    print(f"{a.keys} keys, Zipf {a.theta}, utilisation {util:.3f}: one class (greedy, uniform) WA {one:.3f}")
    for c in (int(x) for x in a.classes.split(",")):
        wa, k = bound(p, util, c)
        print(f"  {k:>3} classes by write rate: WA {wa:.3f} = {wa / one:.2f}x of one class")


if __name__ == "__main__":
    main()
