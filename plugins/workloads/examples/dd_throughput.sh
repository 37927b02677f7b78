#!/bin/sh
# A `script` benchmark for kernmlops: copies /dev/zero to /dev/null with dd
# and prints one performance indicator (JSON) on standard output.
#
# Parameters ([benchmarks.script.parameters], as environment variables):
#   block_size  dd's bs (default 1M)    -> KML_PARAM_BLOCK_SIZE
#   count       blocks to copy (256)    -> KML_PARAM_COUNT
#
#   [benchmarks.script]
#   command = ["plugins/workloads/examples/dd_throughput.sh"]
#   parameters = { block_size = "1M", count = 256 }
set -eu

bs=${KML_PARAM_BLOCK_SIZE:-1M}
count=${KML_PARAM_COUNT:-256}

# dd reports on standard error: "268435456 bytes (268 MB, 256 MiB) copied, 0.035 s, 7.7 GB/s".
report=$(LC_ALL=C dd if=/dev/zero of=/dev/null bs="$bs" count="$count" 2>&1)
echo "$report" >&2
summary=$(echo "$report" | grep ' copied, ')
bytes=$(echo "$summary" | cut -d' ' -f1)
seconds=$(echo "$summary" | sed 's/.* copied, \([0-9.e+-]*\) s,.*/\1/')

awk -v bytes="$bytes" -v s="$seconds" -v bs="$bs" -v count="$count" 'BEGIN {
    if (s <= 0) s = 1e-9
    printf "{\"name\": \"dd_throughput\", \"component\": \"coreutils\", "
    printf "\"@parameters\": {\"block_size\": \"%s\", \"count\": %.0f}, ", bs, count
    printf "\"@result\": {\"bytes\": %.0f, \"elapsed_s\": %.9f, \"bytes_per_s\": %.1f}}\n", bytes, s, bytes / s
}'
