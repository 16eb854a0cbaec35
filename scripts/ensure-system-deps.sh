#!/bin/sh
# Install the system packages the test suite and the demo need, where we can:
#   - postgresql: the server binaries (initdb, pg_ctl) for the store's PostgreSQL tests
#     (tests/pg.py);
#   - chromium: /usr/bin/chromium for the browser tests of the spawn page (tests/hub/),
#     driven by Playwright's Python API (`playwright install` cannot download here);
#   - prometheus: its `promtool check metrics` lints the gateway's `metrics` answer
#     (tests/gateway/test_metrics_auth.py); the server itself is not started.
# Each package is checked on its own, and `apt-get update` runs once, only when something
# is missing. Idempotent and quiet: a no-op when everything is present. Only acts as root
# on Debian/Ubuntu (apt-get); elsewhere it says what is missing and exits 0, and the tests
# that need it skip.
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

have_chromium() {
    [ -x /usr/bin/chromium ]
}

have_promtool() {
    command -v promtool >/dev/null 2>&1
}

# `package:why` for each missing package, space-separated (names have no spaces).
missing=""
have_postgres || missing="$missing postgresql:the-PostgreSQL-tests"
have_chromium || missing="$missing chromium:the-browser-tests"
have_promtool || missing="$missing prometheus:the-metrics-lint"

if [ -z "$missing" ]; then
    exit 0
fi

packages=""
for entry in $missing; do
    packages="$packages ${entry%%:*}"
done

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    for entry in $missing; do
        why=$(echo "${entry#*:}" | tr '-' ' ')
        echo "ensure-system-deps: ${entry%%:*} not found; install it to run $why" \
             "(they skip without it)" >&2
    done
    exit 0
fi

echo "ensure-system-deps: installing$packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # word splitting of the package list is wanted
apt-get install -y -qq --no-install-recommends $packages >/dev/null

status=0
case "$packages" in *postgresql*)
    have_postgres || {
        echo "ensure-system-deps: postgresql installed but initdb/pg_ctl still not found" >&2
        status=1
    } ;;
esac
case "$packages" in *chromium*)
    have_chromium || {
        echo "ensure-system-deps: chromium installed but /usr/bin/chromium not found" >&2
        status=1
    } ;;
esac
case "$packages" in *prometheus*)
    have_promtool || {
        echo "ensure-system-deps: prometheus installed but promtool still not found" >&2
        status=1
    } ;;
esac
exit $status
