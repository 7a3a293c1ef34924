# Sourced by examples/stack and examples/<lang>/run: where the examples' cluster and broker live.
# Override IDEM_PORT / KAFKA_BOOTSTRAP to point the examples at your own.
# (set before lib.sh, whose defaults are the project's other port)
export IDEM_PORT="${IDEM_PORT:-54375}"
export IDEM_SOCKDIR="${IDEM_SOCKDIR:-/tmp/idem-sock-$IDEM_PORT}"
export IDEM_PGDATA="${IDEM_PGDATA:-/tmp/idem-data-$IDEM_PORT}"
export KAFKA_BOOTSTRAP="${KAFKA_BOOTSTRAP:-127.0.0.1:54376}"
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/lib.sh"
EXAMPLES="$ROOT/examples"

# A fresh database named $1 with the extension, for one example.
fresh_db() {
  PGOPTIONS="-c client_min_messages=warning" "$ROOT/scripts/cluster" psql -q -v ON_ERROR_STOP=1 -d postgres \
    -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1" >/dev/null
  "$ROOT/scripts/cluster" psql -q -v ON_ERROR_STOP=1 -d "$1" -c "CREATE EXTENSION idempotency" -c "SELECT FROM idem_maintenance()" >/dev/null
}
