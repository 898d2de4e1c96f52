#!/usr/bin/env bash
# CPU per job of BenchmarkJobsInFlight/redis: wall time per job from the benchmark, the
# process's CPU from /usr/bin/time (rig start-up included, the same for every binary), and
# the Redis server's from INFO cpu deltas. Interleave binaries built from two commits:
#
#   go test -c -o /tmp/before.test ./internal/bench   (at the older commit)
#   go test -c -o /tmp/after.test ./internal/bench
#   for i in 1 2 3 4; do for b in before after; do scripts/jobs-cpu.sh /tmp/$b.test 4000; done; done
#
# Usage: scripts/jobs-cpu.sh BENCH_BINARY [JOBS] (the Redis on 127.0.0.1:6379, as the benchmark)
set -euo pipefail
bin=$1
n=${2:-3000}
rcpu() { redis-cli info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }
r0=$(rcpu)
out=$({ /usr/bin/time -f "TIME %U %S" env GOGC=400 "$bin" -test.run XXX -test.bench 'BenchmarkJobsInFlight/redis' -test.benchtime "${n}x"; } 2>&1)
r1=$(rcpu)
ns=$(awk '/^Benchmark/ { print $3 }' <<<"$out")
cpu=$(awk '/^TIME/ { print $2 + $3 }' <<<"$out")
if [[ -z $ns || -z $cpu ]]; then
  echo "$out" >&2
  exit 1
fi
awk -v ns="$ns" -v cpu="$cpu" -v r0="$r0" -v r1="$r1" -v n="$n" -v bin="$bin" 'BEGIN {
  printf "%s: wall %.0f µs/job, process %.0f µs/job, redis %.0f µs/job\n", bin, ns / 1e3, cpu * 1e6 / n, (r1 - r0) * 1e6 / n }'
