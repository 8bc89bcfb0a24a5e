#!/usr/bin/env bash
# Start the private PostgreSQL the test suite runs the usage ledger against, or reuse it
# when it already answers. Debian's server binaries (the postgresql package, which
# scripts/setup.sh installs), its own data folder and socket, no TCP port, so it runs
# beside any PostgreSQL the machine has. The tests make a fresh database per test in it
# (tests/postgres.py). Nothing of a user's lives here.
#
#   data     /var/lib/quota-spawner-test-postgres   (owned by the postgres user)
#   socket   /run/quota-spawner-test/postgres/.s.PGSQL.5432
#   log      /var/log/quota-spawner-test-postgres.log
#   URL      written to /run/quota-spawner-test/postgres/url for the tests
#
#   scripts/test-postgres.sh          start it (idempotent) and wait for it
#   scripts/test-postgres.sh --url    print the SQLAlchemy URL
#   scripts/test-postgres.sh --stop   stop it
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOCKET_DIR=/run/quota-spawner-test/postgres
DATA=${TEST_POSTGRES_DATA:-/var/lib/quota-spawner-test-postgres}
LOG=${TEST_POSTGRES_LOG:-/var/log/quota-spawner-test-postgres.log}
OWNER=postgres  # the package's system user: the server refuses to run as root
URL="postgresql+psycopg://$OWNER@/postgres?host=$SOCKET_DIR"

SAY_TAG=test-postgres
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$ROOT/scripts/lib.sh"

if [ "${1:-}" = --url ]; then
    echo "$URL"
    exit 0
fi

bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] && [ -x "$bin/pg_ctl" ] ||
    die "no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)"
id "$OWNER" >/dev/null 2>&1 || die "no '$OWNER' user (it comes with Debian's postgresql package)"
as_owner() { runuser -u "$OWNER" -- "$@"; }

if [ "${1:-}" = --stop ]; then
    if [ -f "$DATA/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null && say "stopped"
    else
        say "not running"
    fi
    exit 0
fi

if as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1 &&
   as_owner "$bin/pg_isready" -q -h "$SOCKET_DIR"; then
    say "running ($SOCKET_DIR)"
else
    mkdir -p "$SOCKET_DIR" "$DATA"
    chown "$OWNER" "$SOCKET_DIR" "$DATA"
    chmod 700 "$DATA"
    touch "$LOG" && chown "$OWNER" "$LOG"
    if [ ! -f "$DATA/PG_VERSION" ]; then
        say "initdb $DATA"
        as_owner "$bin/initdb" -D "$DATA" -U "$OWNER" -A trust -E UTF8 --no-sync >>"$LOG" 2>&1 ||
            { tail -n 20 "$LOG" >&2; die "initdb failed (log: $LOG)"; }
    fi
    rm -f "$DATA/postmaster.pid"  # a stale one from a machine that went down
    say "starting ($SOCKET_DIR)"
    # durability is not what a test database needs: no fsync, no TCP
    as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start -o \
        "-k $SOCKET_DIR -c listen_addresses= -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        >/dev/null || { tail -n 20 "$LOG" >&2; die "PostgreSQL did not start (log: $LOG)"; }
fi
echo "$URL" >"$SOCKET_DIR/url"
