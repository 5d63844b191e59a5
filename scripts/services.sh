#!/usr/bin/env bash
# Bring up the servers remit's tests use, on a Debian-like machine.
#
#   bash scripts/services.sh          # up: install (apt-get) and/or start what is missing
#   bash scripts/services.sh status   # report only; exit 1 if a service is down
#
# PostgreSQL: 127.0.0.1:5432, trust auth, superuser roles root and postgres, database test.
# Redis 7:    127.0.0.1:6379, started with --save "" --appendonly no (keeps nothing on disk).
#
# Chromium:   Debian's chromium, for the browser test of the `remit check` HTML report;
#             installed only when REMIT_REQUIRE_SERVICES=1 (CI), where that test must run.
#
# Idempotent: a service that already answers is left alone ("up already").
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=5432
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
WAIT_SECONDS=30

log() { printf '%s\n' "$*"; }
die() { printf 'services.sh: error: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------------------ privileges

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    fi
fi

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif [ "${#SUDO[@]}" -gt 0 ]; then
        "${SUDO[@]}" "$@"
    else
        die "need root for: $* (not root, and sudo is not installed)"
    fi
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 \
        || die "apt-get not found: install $* yourself (PostgreSQL 15+, Redis 7+), then rerun"
    if [ "$APT_UPDATED" -eq 0 ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q \
            || die "apt-get update failed"
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        || die "apt-get install $* failed"
}

# ------------------------------------------------------------------------------ probes

tcp_open() {  # host port
    (exec 2>/dev/null; exec 3<>"/dev/tcp/$1/$2")
}

pg_up() {
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
    else
        tcp_open "$PG_HOST" "$PG_PORT"
    fi
}

redis_up() {
    if command -v redis-cli >/dev/null 2>&1; then
        [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]
    else
        # No client: speak the protocol over bash's /dev/tcp.
        local reply
        reply=$(
            exec 2>/dev/null
            exec 3<>"/dev/tcp/$REDIS_HOST/$REDIS_PORT" || exit 1
            printf 'PING\r\n' >&3
            IFS= read -r -t 2 line <&3 || exit 1
            printf '%s' "$line"
        ) || return 1
        [ "${reply%$'\r'}" = "+PONG" ]
    fi
}

wait_for() {  # probe-function name
    local probe=$1 i
    for ((i = 0; i < WAIT_SECONDS * 4; i++)); do
        if "$probe"; then return 0; fi
        sleep 0.25
    done
    return 1
}

# ------------------------------------------------------------------------------ postgresql

pg_installed() {
    command -v pg_ctlcluster >/dev/null 2>&1 \
        && compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

pg_version() {  # newest installed server version
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1)
    [ -n "$d" ] || return 1
    basename "$(dirname "$(dirname "$d")")"
}

pg_cluster_version() {  # version of the (newest) existing "main" cluster, if any
    local v
    v=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1) || true
    if [ -n "$v" ] && [ -d "/etc/postgresql/$v/main" ]; then
        printf '%s\n' "$v"
    else
        return 1
    fi
}

pg_ensure_cluster() {  # prints the cluster version; creates "main" if there is none
    local v
    if v=$(pg_cluster_version); then
        printf '%s\n' "$v"
        return 0
    fi
    v=$(pg_version) || die "PostgreSQL server binaries not found under /usr/lib/postgresql"
    as_root pg_createcluster "$v" main --port "$PG_PORT" >&2 \
        || die "pg_createcluster $v main failed"
    printf '%s\n' "$v"
}

pg_trust_auth() {  # version: trust for the local socket and loopback TCP
    local hba="/etc/postgresql/$1/main/pg_hba.conf"
    as_root test -f "$hba" || die "$hba not found"
    as_root cp "$hba" "$hba.orig-remit" 2>/dev/null || true
    printf '%s\n' \
        '# Written by remit scripts/services.sh: trust on this machine only.' \
        '# TYPE  DATABASE  USER  ADDRESS       METHOD' \
        'local   all       all                 trust' \
        'host    all       all   127.0.0.1/32  trust' \
        'host    all       all   ::1/128       trust' \
        'local   replication all               trust' \
        'host    replication all 127.0.0.1/32  trust' \
        | as_root tee "$hba" >/dev/null
}

pg_start() {  # version
    as_root mkdir -p /var/run/postgresql
    as_root chown postgres:postgres /var/run/postgresql 2>/dev/null || true
    # "already running" is not an error here: readiness is decided by polling below.
    as_root pg_ctlcluster --skip-systemctl-redirect "$1" main start >&2 || true
}

pg_provision() {  # roles root and postgres (superusers), databases test and root
    local psql=(psql -X -q -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres)
    command -v psql >/dev/null 2>&1 || die "psql not found after installing PostgreSQL"
    "${psql[@]}" <<'SQL' || die "could not create the PostgreSQL roles"
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'root') THEN
    CREATE ROLE root WITH LOGIN SUPERUSER;
  END IF;
  ALTER ROLE postgres WITH LOGIN SUPERUSER;
  ALTER ROLE root WITH LOGIN SUPERUSER;
END
$$;
SQL
    local db
    for db in test root; do
        if [ "$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'")" != "1" ]; then
            "${psql[@]}" -c "CREATE DATABASE \"$db\"" || die "could not create database $db"
        fi
    done
}

postgres_up() {
    if pg_up; then
        log "postgresql: up already ($PG_HOST:$PG_PORT)"
        return 0
    fi
    local how=started fresh=0 v
    if ! pg_installed; then
        log "postgresql: not installed; installing with apt-get ..." >&2
        apt_install postgresql postgresql-client
        how="installed and started"
        fresh=1
    fi
    if ! pg_cluster_version >/dev/null; then
        fresh=1
    fi
    v=$(pg_ensure_cluster)
    if [ "$fresh" -eq 1 ]; then
        pg_trust_auth "$v"
        # The package may have started the cluster itself: reload so pg_hba applies.
        as_root pg_ctlcluster --skip-systemctl-redirect "$v" main reload >/dev/null 2>&1 || true
    fi
    pg_start "$v"
    wait_for pg_up || die "PostgreSQL $v did not accept connections on $PG_HOST:$PG_PORT within ${WAIT_SECONDS}s (see /var/log/postgresql/postgresql-$v-main.log)"
    if [ "$fresh" -eq 1 ]; then
        pg_provision
    fi
    log "postgresql: $how ($v, $PG_HOST:$PG_PORT)"
}

# ------------------------------------------------------------------------------ redis

redis_start() {
    as_root mkdir -p /var/lib/redis /var/log/redis
    as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
        --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 \
        || true
}

redis_up_cmd() {
    if redis_up; then
        log "redis: up already ($REDIS_HOST:$REDIS_PORT)"
        return 0
    fi
    local how=started
    if ! command -v redis-server >/dev/null 2>&1; then
        log "redis: not installed; installing with apt-get ..." >&2
        apt_install redis-server
        how="installed and started"
    fi
    local major
    major=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')
    if [ -n "$major" ] && [ "$major" -lt 7 ]; then
        log "redis: warning: redis-server $major.x found; remit needs Redis >= 7" >&2
    fi
    if redis_up; then
        # The package's own service came up (with its default config): match the
        # handbook's flags at runtime instead of starting a second server.
        redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" config set save "" >/dev/null 2>&1 || true
        redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" config set appendonly no >/dev/null 2>&1 || true
    else
        redis_start
    fi
    wait_for redis_up || die "Redis did not answer PING on $REDIS_HOST:$REDIS_PORT within ${WAIT_SECONDS}s (see /var/log/redis/ci.log)"
    log "redis: $how ($REDIS_HOST:$REDIS_PORT)"
}

# ------------------------------------------------------------------------------ chromium

chromium_up_cmd() {
    if command -v chromium >/dev/null 2>&1; then
        log "chromium: installed already ($(command -v chromium))"
    elif [ "${REMIT_REQUIRE_SERVICES:-}" = "1" ]; then
        log "chromium: not installed; installing with apt-get ..." >&2
        apt_install chromium
        log "chromium: installed ($(command -v chromium))"
    else
        log "chromium: not installed (the browser test will be skipped)"
    fi
}

# ------------------------------------------------------------------------------ main

status() {
    local rc=0
    if pg_up; then log "postgresql: up ($PG_HOST:$PG_PORT)"; else log "postgresql: down ($PG_HOST:$PG_PORT)"; rc=1; fi
    if redis_up; then log "redis: up ($REDIS_HOST:$REDIS_PORT)"; else log "redis: down ($REDIS_HOST:$REDIS_PORT)"; rc=1; fi
    return "$rc"
}

case "${1:-up}" in
    up) postgres_up; redis_up_cmd; chromium_up_cmd ;;
    status) status ;;
    -h|--help|help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) die "unknown subcommand '$1' (use: up, status)" ;;
esac
