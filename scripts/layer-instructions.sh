#!/bin/sh
# Instructions per request the tower layers add to a bare axum router, redlimit's
# in-process layer next to tower_governor, measured in one run: each row of
# examples/bench_layer.rs's count mode runs under callgrind, which counts only the
# function making the REDLIMIT_BENCH_CALLS requests (after 1 000 requests not
# counted: start-up and first uses left out). Needs valgrind.
set -eu
calls=${REDLIMIT_BENCH_CALLS:-20000}
cargo build --release --example bench_layer --features axum --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
per_request() {
  REDLIMIT_BENCH_ONLY=count REDLIMIT_BENCH_ROW="$1" REDLIMIT_BENCH_CALLS="$calls" valgrind --tool=callgrind \
    --toggle-collect='bench_layer::counted_calls*' --callgrind-out-file="$out/$1" \
    "${CARGO_TARGET_DIR:-target}/release/examples/bench_layer" >"$out/$1.log" 2>&1 \
    || { cat "$out/$1.log" >&2; exit 1; }
  echo $(($(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$1") / calls))
}
bare=$(per_request bare)
echo "| row | instructions per request ($calls requests) | added to the bare router |"
echo "|---|---:|---:|"
echo "| bare | $bare | |"
for row in redlimit-headers governor-headers redlimit-plain governor-plain; do
  n=$(per_request "$row")
  echo "| $row | $n | $((n - bare)) |"
done
