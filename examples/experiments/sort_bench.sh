#!/bin/sh
# A performance script for the `script` benchmark: sorts KML_PARAM_LINES
# random numbers with GNU sort, one way or another, and prints one JSON
# performance indicator on standard output. kernmlops passes each of
# [benchmarks.script] parameters as KML_PARAM_<KEY> (and all of them as JSON
# in KML_PARAMETERS); anything on standard error is kept as benchmark.stderr.
set -eu

lines=${KML_PARAM_LINES:-100000}
variant=${KML_PARAM_VARIANT:-plain}
threads=${KML_PARAM_THREADS:-1}

input=$(mktemp)
trap 'rm -f "$input"' EXIT
# The same numbers every run: the input must not be what varies.
seq 1 "$lines" | awk 'BEGIN { srand(42) } { print int(rand() * 1000000000) }' >"$input"

start=$(date +%s%N)
case "$variant" in
plain) sort -n --parallel=1 "$input" >/dev/null ;;
parallel) sort -n --parallel="$threads" -S 64M "$input" >/dev/null ;;
*) echo "unknown variant $variant" >&2; exit 2 ;;
esac
end=$(date +%s%N)

ns=$((end - start))
echo "sorted $lines lines ($variant, $threads threads) in $ns ns" >&2
# @parameters says what defined the run; @result what it measured. No key
# may be in both.
cat <<JSON
{"name": "sort", "component": "coreutils",
 "@parameters": {"lines": $lines, "variant": "$variant", "threads": $threads},
 "@result": {"seconds": $(awk "BEGIN { print $ns / 1e9 }"),
             "lines_per_s": $(awk "BEGIN { printf \"%.0f\", $lines / ($ns / 1e9) }")}}
JSON
