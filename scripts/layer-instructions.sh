#!/bin/sh
# Instructions per request the tower layers add to a bare axum router, redlimit's
# in-process layer next to tower_governor (keyed by a header, by the peer's address,
# by a bearer token, then by a path parameter), and the same for actix-web (the layer as
# middleware next to actix-governor, on a bare actix-web app), measured in one run:
# each row of examples/bench_layer.rs's count mode and of examples/bench_actix.rs runs
# under callgrind, which counts only the function making the REDLIMIT_BENCH_CALLS
# requests (after 1 000 requests not counted: start-up and first uses left out). Needs
# valgrind.
set -eu
calls=${REDLIMIT_BENCH_CALLS:-20000}
cargo build --release --example bench_layer --features axum --quiet
cargo build --release --example bench_actix --features actix --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# per_request EXAMPLE ROW
per_request() {
  REDLIMIT_BENCH_ONLY=count REDLIMIT_BENCH_ROW="$2" REDLIMIT_BENCH_CALLS="$calls" valgrind --tool=callgrind \
    --toggle-collect="$1::counted_calls*" --callgrind-out-file="$out/$2" \
    "${CARGO_TARGET_DIR:-target}/release/examples/$1" >"$out/$2.log" 2>&1 \
    || { cat "$out/$2.log" >&2; exit 1; }
  echo $(($(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$2") / calls))
}
echo "| row | instructions per request ($calls requests) | added to the bare router or app |"
echo "|---|---:|---:|"
# rows EXAMPLE BARE ROW...
rows() {
  example=$1 bare_row=$2
  shift 2
  bare=$(per_request "$example" "$bare_row")
  echo "| $bare_row | $bare | |"
  for row in "$@"; do
    n=$(per_request "$example" "$row")
    echo "| $row | $n | $((n - bare)) |"
  done
}
rows bench_layer bare redlimit-headers governor-headers redlimit-plain governor-plain
rows bench_layer bare-ip redlimit-ip governor-ip
rows bench_layer bare-bearer redlimit-bearer governor-bearer
rows bench_layer bare-path redlimit-path governor-path
rows bench_actix actix-bare actix-redlimit-headers actix-governor-headers actix-redlimit-plain actix-governor-plain
rows bench_actix actix-bare-ip actix-redlimit-ip actix-governor-ip
rows bench_actix actix-bare-path actix-redlimit-path actix-governor-path
