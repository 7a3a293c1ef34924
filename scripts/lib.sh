# Shared settings for the project's scripts. Sourced, never run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGRX_VERSION="0.18.1"

# Where PostgreSQL is, as its pg_config says (tests/pgtools.py finds it the same way): PG_CONFIG overrides,
# else the pg_config on PATH, else Debian's PostgreSQL 15 one. Before PostgreSQL is installed
# (scripts/install-deps) the directories are Debian's, where it will be.
PG_CONFIG="${PG_CONFIG:-$(command -v pg_config || echo /usr/lib/postgresql/15/bin/pg_config)}"
if PG_BIN="$("$PG_CONFIG" --bindir 2>/dev/null)"; then
  # The real pg_config beside the server, not a wrapper such as Debian's /usr/bin/pg_config.
  [ -x "$PG_BIN/pg_config" ] && PG_CONFIG="$PG_BIN/pg_config"
  PG_PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
  PG_SHAREDIR="$("$PG_CONFIG" --sharedir)"
  PGXS_DIR="$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")")"   # .../lib/pgxs
else
  PG_BIN="/usr/lib/postgresql/15/bin"
  PG_PKGLIBDIR="/usr/lib/postgresql/15/lib"
  PG_SHAREDIR="/usr/share/postgresql/15"
  PGXS_DIR="/usr/lib/postgresql/15/lib/pgxs"
fi

# port_of NAME [I]: the I-th port (default the first) of NAME's range in tests/ports, the one list of
# the ports every script, test, benchmark and example uses. port_range NAME: "FIRST LAST".
port_range() {
  awk -v n="$1" '$1 == n { print $2, $3; found = 1 } END { exit !found }' "$ROOT/tests/ports" \
    || { echo "no port range '$1' in tests/ports" >&2; return 1; }
}
port_of() {
  local first last
  read -r first last < <(port_range "$1") || return 1
  [ $((first + ${2:-0})) -le "$last" ] || { echo "port $1 ${2:-0}: beyond $first-$last (tests/ports)" >&2; return 1; }
  echo $((first + ${2:-0}))
}

export IDEM_PORT="${IDEM_PORT:-$(port_of default)}"
export IDEM_SOCKDIR="${IDEM_SOCKDIR:-/tmp/idem-sock-$IDEM_PORT}"
export IDEM_PGDATA="${IDEM_PGDATA:-/tmp/idem-data-$IDEM_PORT}"
export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '==> %s\n' "$*" >&2; }

# The PostgreSQL major versions the extension builds for (scripts/build, scripts/package).
SUPPORTED_MAJORS=(15 16 17 18)
# pg_major PG_CONFIG: the major version of the PostgreSQL that pg_config belongs to.
pg_major() { "$1" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/'; }
# cargo_features MAJOR: the cargo flags that build for MAJOR (15 is the crate's default feature); fails
# for a major the extension does not support.
cargo_features() {
  case "$1" in
    15) ;;
    16|17|18) echo "--no-default-features --features pg$1" ;;
    *) echo "PostgreSQL $1 is not supported (${SUPPORTED_MAJORS[*]})" >&2; return 2 ;;
  esac
}
# crate_version: the version in Cargo.toml, which is the extension's version (default_version).
crate_version() { sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1; }

# fetch_commit SHA: succeeds when this clone has the commit SHA, fetched from origin when it did not (a shallow
# CI clone); the builds of released versions (tests/upgrade/build-old, tests/sqledition) start from it.
fetch_commit() {
  git -C "$ROOT" cat-file -e "$1^{commit}" 2>/dev/null && return 0
  log "fetching commit $1"
  git -C "$ROOT" fetch --quiet origin "$1" 2>/dev/null \
    || git -C "$ROOT" fetch --quiet --unshallow origin 2>/dev/null \
    || git -C "$ROOT" fetch --quiet origin 2>/dev/null || true
  git -C "$ROOT" cat-file -e "$1^{commit}" 2>/dev/null
}

# What the build and the demo need from Debian (scripts/install-deps demo), what the tests need on top
# (scripts/install-deps test; scripts/test checks them), and what only the benchmarks need.
DEMO_DEB_PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang pkg-config sudo python3-venv)
TEST_DEB_PACKAGES=("${DEMO_DEB_PACKAGES[@]}" postgresql-15-partman)
# PGXN's validator of META.json (tests/package), from crates.io (scripts/install-deps test).
PGXN_META_VERSION="0.7.0"
BENCH_DEB_PACKAGES=(redis-server)
# libfaketime, for the clock layer (tests/clock) and the midnight runs of scripts/test: installed with the test
# packages, but not a prerequisite of scripts/test (without it the clock layers say they did not run, which is a
# failure under CI=true).
CLOCK_DEB_PACKAGES=(faketime)
# What tests/monitoring/run needs (scripts/install-monitoring-deps installs them with their services stopped
# and disabled): promtool, and the two exporters monitoring/ has configurations for.
MONITORING_DEB_PACKAGES=(prometheus prometheus-postgres-exporter prometheus-sql-exporter)
# missing_debs PKG...: the packages of the list that are not installed, one per line.
missing_debs() { local p; for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done; }

# require_venv [MODULE...]: succeeds when the project's .venv imports psycopg and the modules given;
# otherwise says what is missing and the command that installs it, and fails (status 2).
require_venv() {
  local mods; mods="$(printf ', %s' psycopg "$@")"; mods="${mods:2}"
  if [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c "import $mods" 2>/dev/null; then
    return 0
  fi
  echo "missing: the project's Python venv $ROOT/.venv with $mods" >&2
  if [ -x "$ROOT/.venv/bin/python" ]; then
    echo "  install with: $ROOT/.venv/bin/pip install -r $ROOT/tests/requirements.txt   (or scripts/install-deps demo)" >&2
  else
    echo "  install with: scripts/install-deps demo" >&2
  fi
  return 2
}

# Run a command as the postgres OS user (initdb refuses root).
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres -H "$@"; fi; }

# For the benches that compare builds of the extension on the same clusters (IDEM_WEEK_LIBS, IDEM_INSTR_LIBS):
# put_library SO puts SO in place of the library installed in PG_CONFIG's tree (readable by the server; renamed
# into place, so that a server starting meanwhile loads one whole file); library_label I SO is how the I-th (from
# 0) of such a list is named in their output: "installed" for the build in place, else lib1, lib2, ...
put_library() {
  install -m 0755 "$1" "$PG_PKGLIBDIR/idempotency.so.swap" && mv "$PG_PKGLIBDIR/idempotency.so.swap" "$PG_PKGLIBDIR/idempotency.so"
}
library_label() { if [ "$2" = installed ]; then echo installed; else echo "lib$(($1 + 1))"; fi; }

# The Citus source tests/citus builds from: CITUS_SOURCE, else ../shared/citus beside the repository (a
# directory with Citus' tarball and its `build` script). Empty when neither is there.
citus_source() {
  local dir
  for dir in "${CITUS_SOURCE:-}" "$ROOT/../shared/citus"; do
    [ -n "$dir" ] && [ -x "$dir/build" ] && { (cd "$dir" && pwd); return 0; }
  done
  return 0
}
