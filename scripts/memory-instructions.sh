#!/bin/sh
# Instructions per in-process decision, redlimit next to governor, measured in one run:
# each row of examples/bench_memory.rs runs under callgrind, which counts only the
# function making the REDLIMIT_BENCH_CALLS decisions (after the row's set-up, such as
# the 100 000 limiters of the `-keys` rows, and 1 000 decisions not counted), and how
# many times those calls allocated.
#
#   scripts/memory-instructions.sh
#   REDLIMIT_BENCH_ROWS="window-hot governor-hot" scripts/memory-instructions.sh
#
# Needs valgrind and python3 (which reads the allocations from callgrind's output).
set -eu
calls=${REDLIMIT_BENCH_CALLS:-200000}
rows=${REDLIMIT_BENCH_ROWS:-"window-hot bucket-hot governor-hot window-keys bucket-keys governor-keys window-refused governor-refused floor-hot floor-keys"}
cargo build --release --example bench_memory --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The calls to malloc, calloc and realloc callgrind recorded in the measured calls.
allocations() {
  python3 - "$1" <<'PY'
import re, sys
names, current, total = {}, None, 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3).strip()
        if m.group(1) == "cfn":
            current = m.group(2)
        continue
    if line.startswith("calls=") and names.get(current) in ("malloc", "calloc", "realloc"):
        total += int(line.split("=")[1].split()[0])
print(total)
PY
}
echo "| row | instructions per decision ($calls decisions) | allocations in all |"
echo "|---|---:|---:|"
for row in $rows; do
  REDLIMIT_BENCH_ROW="$row" REDLIMIT_BENCH_CALLS="$calls" valgrind --tool=callgrind --toggle-collect='bench_memory::counted*' \
    --callgrind-out-file="$out/$row" "${CARGO_TARGET_DIR:-target}/release/examples/bench_memory" \
    >"$out/$row.log" 2>&1 || { cat "$out/$row.log" >&2; exit 1; }
  echo "| $row | $(($(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$row") / calls)) | $(allocations "$out/$row") |"
done
