#!/bin/sh
# The server role of redis_roles.toml: Debian's redis-server in the
# foreground, on the address and port its role has (KML_ROLE_SERVER_HOST,
# KML_ROLE_SERVER_PORT, from the role's `ready` port). It runs until the
# run stops it, once the client role is done; it prints no result (the
# run's result is the client's). Protected mode is off so that a client
# on another node may connect: the server listens only on its role's
# address (127.0.0.1 with --executor local, its node's with --executor
# slurm), and keeps no data.
set -eu
exec redis-server --bind "$KML_ROLE_SERVER_HOST" --port "$KML_ROLE_SERVER_PORT" \
    --save '' --appendonly no --protected-mode no
