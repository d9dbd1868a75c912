#!/bin/sh
# Entrypoint of the postgres:16-alpine stand-in (see compose_images.sh): the part of the official
# image's docker-entrypoint.sh that docker-compose.yml relies on.
#   POSTGRES_PASSWORD  required (or POSTGRES_HOST_AUTH_METHOD=trust)
#   POSTGRES_USER      superuser made at initialisation (default postgres)
#   POSTGRES_DB        database made at initialisation (default: $POSTGRES_USER)
# On the first start (empty $PGDATA) it runs initdb and creates the database with a temporary
# server that listens on its Unix socket only; then it execs `postgres` listening on *:5432, so
# the server is PID 1 and gets the container's stop signal (SIGINT: fast shutdown).
set -eu
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA

if [ "${1:-postgres}" != postgres ]; then exec "$@"; fi

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD is not set (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
    exit 1
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" --auth-local=trust \
        --auth-host="$auth" --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all $auth" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -p 5432" start >/dev/null
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -q -U "$user" -d postgres -p 5432 \
            -c "CREATE DATABASE \"$db\" OWNER \"$user\""
    fi
    pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
    echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' -p 5432
