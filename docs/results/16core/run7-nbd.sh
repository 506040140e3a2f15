#!/usr/bin/env bash
# Runs on the 16-core device machine from the repository root: fio's NBD
# engine against Granary's export with and without segment summaries
# (alternated), and the whole NBD job list once. Everything goes to $OUT.
set -u
T0=$(date +%s)
B=/tmp/b
mkdir -p $B && tar -xJf .dev16/nbd.tar.xz -C $B || exit 1
export PATH=$B/bin:$PATH LD_LIBRARY_PATH=$B/lib
LOG=$OUT/log.txt
SIZE=${SIZE:-1G} SECS=${SECS:-5}
D=${D:-$PWD/nbd-data}
step() { echo "### +$(( $(date +%s) - T0 ))s: $1" | tee -a $LOG; }
step env
{ nproc; uname -r; grep PRETTY /etc/os-release; df -h $PWD; free -g; fio --version; granary --version; fio --enghelp=nbd | head -2; } >>$LOG 2>&1
printf '#!/bin/sh\n[ "$1" = serve ] && exec %s "$@" --no-segment-summaries\nexec %s "$@"\n' $B/bin/granary $B/bin/granary > $B/bin/nosum && chmod +x $B/bin/nosum
for round in 1 2; do
  for v in sum nosum; do
    if [ $v = sum ]; then G=$B/bin/granary; else G=$B/bin/nosum; fi
    step nbd-$v-$round
    timeout 120 granary-bench nbd --granary $G --size $SIZE --secs $SECS --peers granary,file --jobs write-1m-qd8 \
      --dir $D/$v --json $OUT/nbd-$v-$round.json >>$LOG 2>&1
    rm -rf $D/$v
  done
done
step nbd-all
timeout 200 granary-bench nbd --granary $B/bin/granary --size $SIZE --secs $SECS --peers granary,file \
  --dir $D/all --json $OUT/nbd-all.json >>$LOG 2>&1
rm -rf $D
step done
