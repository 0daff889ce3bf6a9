#!/bin/sh
# The instructions Redis spends inside EVALSHA per decision, for each row of
# examples/bench.rs section 6: each row runs alone against a redis-server of its own
# under callgrind, which counts only what runs inside the EVALSHA command (the script,
# the commands it calls, its reply). Unlike wall-clock times on a shared machine, the
# counts repeat from run to run.
#
#   REDLIMIT_REFERENCE_SCRIPT=path/to/try_acquire.lua scripts/script-instructions.sh
#
# Needs valgrind and a redis-server whose evalShaCommand symbol is visible (Debian's
# is). Without REDLIMIT_REFERENCE_SCRIPT the reference rows are left out.
set -eu
calls=${REDLIMIT_BENCH_CALLS:-20000}
cargo build --release --example bench --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows="one-allow one-deny three-allow"
if [ -n "${REDLIMIT_REFERENCE_SCRIPT:-}" ]; then
  rows="reference-allow reference-deny $rows"
fi
echo "| row | instructions per decision ($calls decisions) |"
echo "|---|---:|"
for row in $rows; do
  port=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000))
  valgrind --tool=callgrind --toggle-collect=evalShaCommand --callgrind-out-file="$out/$row" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$out/$row.log" 2>&1 &
  server=$!
  tries=0
  until redis-cli -p "$port" ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -lt 200 ] || { echo "redis-server under valgrind did not start: $out/$row.log" >&2; exit 1; }
    sleep 0.1
  done
  REDLIMIT_BENCH_ONLY=count REDLIMIT_BENCH_ROW="$row" REDLIMIT_BENCH_CALLS="$calls" \
    REDLIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$port" target/release/examples/bench
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  total=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row")
  echo "| $row | $((total / calls)) |"
done
