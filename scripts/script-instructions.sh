#!/bin/sh
# The instructions Redis spends inside EVALSHA per decision, for each row of
# examples/bench.rs section 6: each row runs alone against a redis-server of its own
# under callgrind, which counts only what runs inside the EVALSHA command (the script,
# the commands it calls, its reply). Unlike wall-clock times on a shared machine, the
# counts repeat from run to run.
#
# Then the instructions the calling process spends per decision (user space, all its
# threads): the row runs under callgrind against a plain redis-server, once with the
# given number of calls and once with twice as many; the difference over the number
# of calls leaves out the start-up (runtime, connection, loading the script). The
# benchmark runs a row on a current-thread runtime, so this count repeats from run to
# run too (examples/bench.rs, main).
#
#   REDLIMIT_REFERENCE_SCRIPT=path/to/try_acquire.lua scripts/script-instructions.sh
#
# Needs valgrind and a redis-server whose evalShaCommand symbol is visible (Debian's
# is). Without REDLIMIT_REFERENCE_SCRIPT the reference rows are left out;
# REDLIMIT_BENCH_ROWS="walk-deny-1 walk-deny-all" runs only the rows it names.
set -eu
calls=${REDLIMIT_BENCH_CALLS:-20000}
cargo build --release --example bench --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=${REDLIMIT_BENCH_ROWS:-"one-allow one-deny three-allow walk-deny-1 walk-deny-all"}
if [ -n "${REDLIMIT_REFERENCE_SCRIPT:-}" ] && [ -z "${REDLIMIT_BENCH_ROWS:-}" ]; then
  rows="reference-allow reference-deny $rows"
fi
echo "| row | in Redis, instructions per decision ($calls decisions) | in the caller, instructions per decision |"
echo "|---|---:|---:|"
free_port() {
  echo $((20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000))
}
wait_for() {
  tries=0
  until redis-cli -p "$1" ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -lt 200 ] || { echo "redis-server did not start: $2" >&2; exit 1; }
    sleep 0.1
  done
}
# $2 of the row's calls on the server at port $1, the benchmark run by what follows
# (nothing, or valgrind and its options).
run_row() {
  row_port=$1
  row_calls=$2
  shift 2
  REDLIMIT_BENCH_ONLY=count REDLIMIT_BENCH_ROW="$row" REDLIMIT_BENCH_CALLS="$row_calls" \
    REDLIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$row_port" "$@" "${CARGO_TARGET_DIR:-target}/release/examples/bench"
}
for row in $rows; do
  port=$(free_port)
  valgrind --tool=callgrind --toggle-collect=evalShaCommand --callgrind-out-file="$out/$row" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$out/$row.log" 2>&1 &
  server=$!
  wait_for "$port" "$out/$row.log"
  run_row "$port" "$calls"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  total=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row")

  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$out/$row.plain.log" 2>&1 &
  server=$!
  wait_for "$port" "$out/$row.plain.log"
  for n in "$calls" $((2 * calls)); do
    redis-cli -p "$port" flushall >/dev/null
    run_row "$port" "$n" valgrind --tool=callgrind --callgrind-out-file="$out/$row.caller.$n" \
      >"$out/$row.caller.$n.log" 2>&1 || { cat "$out/$row.caller.$n.log" >&2; exit 1; }
  done
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  once=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row.caller.$calls")
  twice=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row.caller.$((2 * calls))")
  echo "| $row | $((total / calls)) | $(((twice - once) / calls)) |"
done
