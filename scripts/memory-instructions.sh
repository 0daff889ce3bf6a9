#!/bin/sh
# Instructions per in-process decision, redlimit next to governor, measured in one run:
# each row of examples/bench_memory.rs runs under callgrind with REDLIMIT_BENCH_CALLS
# calls and again with twice as many; the difference over the number of calls leaves
# out start-up and set-up (making the 100 000 limiters of the `-keys` rows).
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
  for n in "$calls" $((2 * calls)); do
    REDLIMIT_BENCH_ROW="$row" REDLIMIT_BENCH_CALLS="$n" valgrind --tool=callgrind \
      --callgrind-out-file="$out/$row.$n" "${CARGO_TARGET_DIR:-target}/release/examples/bench_memory" \
      >"$out/$row.$n.log" 2>&1 || { cat "$out/$row.$n.log" >&2; exit 1; }
  done
  once=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row.$calls")
  twice=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row.$((2 * calls))")
  echo "| $row | $(((twice - once) / calls)) |"
done
