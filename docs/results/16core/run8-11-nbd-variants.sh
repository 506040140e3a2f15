#!/usr/bin/env bash
# Runs on the 16-core device machine from the repository root: the 1 MiB
# NBD write with the build variants alternated (base: HEAD; spread: write
# runs spread over the executors; spread-N: and N key stripes), and each
# variant's per-thread CPU during its first job. Everything goes to $OUT.
set -u
T0=$(date +%s)
B=/tmp/b
mkdir -p $B && tar -xJf .dev16/nbd.tar.xz -C $B && tar -xJf .dev16/variants.tar.xz -C $B/bin || exit 1
export PATH=$B/bin:$PATH LD_LIBRARY_PATH=$B/lib
LOG=$OUT/log.txt
SIZE=${SIZE:-1G} SECS=${SECS:-5} ROUNDS=${ROUNDS:-2}
VARIANTS=${VARIANTS:-timed fix-16384 fix-spread-16384}
D=${D:-$PWD/nbd-data}
J=/tmp/json; mkdir -p $J
step() { echo "### +$(( $(date +%s) - T0 ))s: $1" | tee -a $LOG; }
printf '#!/bin/sh\n[ "$1" = serve ] && exec %s "$@" --io-spin-us 0\nexec %s "$@"\n' $B/bin/granary-spread-timed-16384 $B/bin/granary-spread-timed-16384 > $B/bin/granary-spin0 && chmod +x $B/bin/granary-spin0
step env
{ nproc; granary --version; command -v top; } >>$LOG 2>&1
for round in $(seq 1 $ROUNDS); do
  for v in $VARIANTS; do
    step nbd-$v-$round
    rm -f /tmp/instr.txt
    timeout 120 granary-bench nbd --granary $B/bin/granary-$v --size $SIZE --secs $SECS --peers granary,file --jobs write-1m-qd8 \
      --dir $D/$v --json $J/nbd-$v-$round.json > $D.out 2>&1 &
    BP=$!
    if [ $round = 1 ]; then
      for i in $(seq 1 200); do grep -q "granary: write-1m-qd8: $SECS s" $D.out 2>/dev/null && break; sleep 0.2; done
      sleep 1; P=$(pgrep -f "bin/granary-$v serve" | head -1)
      [ -n "$P" ] || P=$(pgrep -f "granary-fix-spread-16384 serve" | head -1)
      [ -n "$P" ] && { echo "threads of $v:"; top -H -b -n 2 -d 2 -p $P | awk '/^top/{n++} n==2' | head -24; } >> $OUT/threads.txt 2>&1
      M=$(tr '\0' ' ' < /proc/$P/cmdline | grep -o "metrics [0-9.:]*" | awk '{print $2}')
      { echo "### metrics $v"; python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://'+sys.argv[1]+'/metrics').read().decode())" $M | grep -E "summar|gc_victims|gc_sparse|gc_room|free_segments|gc_.*read" | grep -v "^#"; } >> $OUT/threads.txt 2>&1
    fi
    wait $BP; cat $D.out >> $LOG
    { echo "### $v $round"; cat /tmp/instr.txt; } >> $OUT/instr.txt 2>&1
    rm -rf $D/$v
  done
done
rm -rf $D $D.out
grep -E "^(### |granary +write|file +write|granary +precond|file +precond)" $LOG > $OUT/summary.txt
tar -cf $OUT/json.tar -C $J .
step done
