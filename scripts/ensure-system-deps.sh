#!/bin/sh
# Install the system packages the test suite needs, where we can: PostgreSQL's server
# binaries (initdb, pg_ctl) for the store's PostgreSQL tests (tests/pg.py).
# Idempotent and quiet; a no-op when they are present. Only acts as root on Debian/Ubuntu
# (apt-get); elsewhere it says what is missing and exits 0, and those tests skip.
set -eu

have_postgres() {
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        return 0
    fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            return 0
        fi
    done
    return 1
}

if have_postgres; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-system-deps: PostgreSQL (initdb, pg_ctl) not found; install postgresql" \
         "to run the PostgreSQL tests (they skip without it)" >&2
    exit 0
fi

echo "ensure-system-deps: installing postgresql (for the PostgreSQL tests)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
have_postgres || {
    echo "ensure-system-deps: postgresql installed but initdb/pg_ctl still not found" >&2
    exit 1
}
