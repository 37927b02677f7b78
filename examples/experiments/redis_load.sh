#!/bin/sh
# The client role of redis_roles.toml: Debian's redis-benchmark against the
# server role's address (KML_ROLE_SERVER_HOST, KML_ROLE_SERVER_PORT), with
# KML_PARAM_CLIENTS connections, printing one JSON performance indicator:
# SET and GET requests per second and their mean latency.
set -eu
clients=${KML_PARAM_CLIENTS:-1}
requests=${KML_PARAM_REQUESTS:-20000}
csv=$(redis-benchmark -h "$KML_ROLE_SERVER_HOST" -p "$KML_ROLE_SERVER_PORT" \
    -c "$clients" -n "$requests" -t set,get --csv)
echo "$csv" >&2
field() { # test column
    echo "$csv" | awk -F'","' -v t="\"$1" -v c="$2" '$1 == t { gsub(/"/, "", $c); print $c }'
}
set_rps=$(field SET 2)
get_rps=$(field GET 2)
set_ms=$(field SET 3)
get_ms=$(field GET 3)
if [ -z "$set_rps" ] || [ -z "$get_rps" ]; then
    echo "redis-benchmark printed no SET/GET line" >&2
    exit 1
fi
cat <<JSON
{"name": "redis_load", "component": "redis-benchmark",
 "@parameters": {"clients": $clients, "requests": $requests},
 "@result": {"set_per_s": $set_rps, "get_per_s": $get_rps,
             "set_latency_ms": $set_ms, "get_latency_ms": $get_ms}}
JSON
