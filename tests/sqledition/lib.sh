# What tests/sqledition/run-* share. Sourced after scripts/lib.sh, with LAYER set (the name of the closing
# line "<LAYER>: N passed, N failed"), and PORT_INDEX (which port of the range "sqledition" of tests/ports).
#
# Environment of every runner: IDEM_EDITION_SRC (the source, default sql/edition; tests/sqledition/fixture is a
# tiny stand-in), IDEM_KEEP=1 to leave the cluster running and its files in place at the end.
set +e
HERE="$ROOT/tests/sqledition"
export IDEM_PORT; IDEM_PORT="$(port_of sqledition "$PORT_INDEX")" || exit 2
export IDEM_SOCKDIR="/tmp/idem-sock-$IDEM_PORT" IDEM_PGDATA="/tmp/idem-data-$IDEM_PORT"
WORK="$(mktemp -d "/tmp/idem-sqledition-$LAYER.XXXXXX")"
chmod a+rx "$WORK"
passed=0; failed=0; finished=0; cluster_up=0

# ---- results

ok() { passed=$((passed + 1)); printf 'ok     %s\n' "$1"; }
not_ok() { failed=$((failed + 1)); printf 'FAILED %s\n' "$1"; [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/       /'; }
# check NAME COMMAND...: passes when COMMAND succeeds; its output is shown when it fails.
check() {
  local name="$1" out; shift
  if out="$("$@" 2>&1)"; then ok "$name"; else not_ok "$name" "$out"; return 1; fi
}
# expect NAME WANTED COMMAND...: passes when COMMAND succeeds and prints WANTED (trailing newlines aside).
expect() {
  local name="$1" want="$2" out; shift 2
  if out="$("$@" 2>&1)" && [ "$out" = "$want" ]; then ok "$name"
  else not_ok "$name" "wanted: $want"$'\n'"got:    $out"; return 1; fi
}
# fails NAME PATTERN COMMAND...: passes when COMMAND fails with output matching the (grep -E) PATTERN.
fails() {
  local name="$1" pattern="$2" out; shift 2
  if out="$("$@" 2>&1)"; then not_ok "$name" "succeeded, wanted an error matching: $pattern"$'\n'"$out"; return 1; fi
  if grep -qE -- "$pattern" <<<"$out"; then ok "$name"; else not_ok "$name" "wanted an error matching: $pattern"$'\n'"got: $out"; return 1; fi
}
# abort MESSAGE: a step the rest depends on failed: count it, stop (the EXIT trap closes the layer).
abort() { not_ok "$1" "${2:-}"; log "$LAYER: stopped: $1"; exit 1; }

finish() {
  [ "$finished" = 1 ] && return
  finished=1
  if [ "$cluster_up" = 1 ] && [ "${IDEM_KEEP:-0}" != 1 ]; then
    cluster stop >/dev/null 2>&1
    rm -rf "$IDEM_PGDATA" "$IDEM_SOCKDIR"
  fi
  if [ "${IDEM_KEEP:-0}" = 1 ]; then log "kept: $WORK, cluster $IDEM_PGDATA on $IDEM_SOCKDIR port $IDEM_PORT"; else rm -rf "$WORK"; fi
  [ "$passed" -gt 0 ] || [ "$failed" -gt 0 ] || failed=1
  echo "$LAYER: $passed passed, $failed failed"
}
on_exit() { local rc=$?; finish; [ "$failed" -eq 0 ] && exit "$rc"; exit 1; }
trap on_exit EXIT
trap 'not_ok interrupted; exit 130' INT TERM

# ---- the cluster (scripts/cluster's, from the PostgreSQL PG_CONFIG names, on the port above)

cluster() { PG_CONFIG="$PG_CONFIG" "$ROOT/scripts/cluster" "$@"; }
# start_cluster CONF_LINE...: a fresh cluster (initdb), started with those postgresql.conf lines.
start_cluster() {
  cluster_up=1
  cluster start "$@" >"$WORK/cluster.log" 2>&1 || abort "the cluster starts" "$(tail -20 "$WORK/cluster.log")"
}
restart_cluster() {
  as_postgres "$PG_BIN/pg_ctl" -D "$IDEM_PGDATA" -l "$IDEM_PGDATA/server.log" -w restart >>"$WORK/cluster.log" 2>&1 \
    || abort "the cluster restarts" "$(tail -20 "$IDEM_PGDATA/server.log")"
}

# sql USER DB SQL...: runs each SQL (-c) as USER in DB, unaligned, tuples only; stops at the first error.
sql() {
  local user="$1" db="$2" a=(); shift 2
  for s in "$@"; do a+=(-c "$s"); done
  "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$IDEM_SOCKDIR" -p "$IDEM_PORT" -U "$user" -d "$db" "${a[@]}"
}
# run_file USER DB FILE: psql -f FILE as USER in DB, as the docs tell users to run the install files.
run_file() {
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "$IDEM_SOCKDIR" -p "$IDEM_PORT" -U "$1" -d "$2" -f "$3" 2>&1
}

# ---- the install files

# generate DIR [UPGRADE_DIR]: scripts/sql-edition into DIR, with the upgrade scripts of UPGRADE_DIR too.
generate() {
  IDEM_EDITION_UPGRADES="${2:-}" "$ROOT/scripts/sql-edition" "$1" >"$WORK/generate.log" 2>&1 \
    || abort "scripts/sql-edition writes the install files" "$(cat "$WORK/generate.log")"
  chmod -R a+rX "$1"
}
# edition_version: the version of the sources (the files generated without extra upgrade scripts).
edition_version() { sed -n "s/^  target_version constant text := '\(.*\)';$/\1/p" "$1/idempotency.sql"; }
# synthetic_upgrade VERSION DIR: DIR holds the fixture upgrade from VERSION to VERSION.1 (upgrade-fixture.sql).
synthetic_upgrade() {
  mkdir -p "$2"
  cp "$HERE/upgrade-fixture.sql" "$2/idempotency--$1--$1.1.sql"
}

# The source: IDEM_EDITION_SRC, else sql/edition; without a manifest there is nothing to test.
SRC_DIR="${IDEM_EDITION_SRC:-$ROOT/sql/edition}"
[ -f "$SRC_DIR/manifest" ] || abort "the edition's source has a manifest" \
  "no $SRC_DIR/manifest (IDEM_EDITION_SRC=tests/sqledition/fixture tests the machinery with the fixture edition)"
export IDEM_EDITION_SRC="$SRC_DIR"
log "$LAYER: the edition from ${SRC_DIR#"$ROOT"/}, cluster on port $IDEM_PORT"
