#!/bin/sh
# Instructions per in-process decision, redlimit next to governor, measured in one run:
# each row of examples/bench_memory.rs runs under callgrind, which counts only the
# function making the REDLIMIT_BENCH_CALLS decisions (after the row's set-up, such as
# the 100 000 limiters of the `-keys` rows, and 1 000 decisions not counted).
#
#   scripts/memory-instructions.sh
#   REDLIMIT_BENCH_ROWS="window-hot governor-hot" scripts/memory-instructions.sh
#
# Needs valgrind.
set -eu
calls=${REDLIMIT_BENCH_CALLS:-200000}
rows=${REDLIMIT_BENCH_ROWS:-"window-hot bucket-hot governor-hot window-keys bucket-keys governor-keys window-refused governor-refused"}
cargo build --release --example bench_memory --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| row | instructions per decision ($calls decisions) |"
echo "|---|---:|"
for row in $rows; do
  REDLIMIT_BENCH_ROW="$row" REDLIMIT_BENCH_CALLS="$calls" valgrind --tool=callgrind --toggle-collect='bench_memory::counted*' \
    --callgrind-out-file="$out/$row" "${CARGO_TARGET_DIR:-target}/release/examples/bench_memory" \
    >"$out/$row.log" 2>&1 || { cat "$out/$row.log" >&2; exit 1; }
  echo "| $row | $(($(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row") / calls)) |"
done
