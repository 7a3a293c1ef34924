# Sourced by examples/stack and examples/<lang>/run: where the examples' cluster and broker live (the
# range "examples" of tests/ports: 54375, 54376). Override IDEM_PORT / KAFKA_BOOTSTRAP to point the
# examples at your own.
# (the caller's settings are kept aside: lib.sh fills in the project's other default port)
_idem_port="${IDEM_PORT:-}" _idem_sockdir="${IDEM_SOCKDIR:-}" _idem_pgdata="${IDEM_PGDATA:-}"
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/lib.sh"
export IDEM_PORT="${_idem_port:-$(port_of examples 0)}"
export IDEM_SOCKDIR="${_idem_sockdir:-/tmp/idem-sock-$IDEM_PORT}"
export IDEM_PGDATA="${_idem_pgdata:-/tmp/idem-data-$IDEM_PORT}"
export KAFKA_BOOTSTRAP="${KAFKA_BOOTSTRAP:-127.0.0.1:$(port_of examples 1)}"
unset _idem_port _idem_sockdir _idem_pgdata
EXAMPLES="$ROOT/examples"

# A fresh database named $1 with the extension, for one example.
fresh_db() {
  PGOPTIONS="-c client_min_messages=warning" "$ROOT/scripts/cluster" psql -q -v ON_ERROR_STOP=1 -d postgres \
    -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1" >/dev/null
  "$ROOT/scripts/cluster" psql -q -v ON_ERROR_STOP=1 -d "$1" -c "CREATE EXTENSION idempotency" -c "SELECT FROM idem_maintenance()" >/dev/null
}
