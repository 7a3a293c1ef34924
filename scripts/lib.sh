# Shared settings for the project's scripts. Sourced, never run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGRX_VERSION="0.18.1"
PG_BIN="/usr/lib/postgresql/15/bin"
PG_CONFIG="$PG_BIN/pg_config"
PGXS_DIR="/usr/lib/postgresql/15/lib/pgxs"
export IDEM_PORT="${IDEM_PORT:-54329}"
export IDEM_SOCKDIR="${IDEM_SOCKDIR:-/tmp/idem-sock-$IDEM_PORT}"
export IDEM_PGDATA="${IDEM_PGDATA:-/tmp/idem-data-$IDEM_PORT}"
export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '==> %s\n' "$*" >&2; }

# Run a command as the postgres OS user (initdb refuses root).
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres -H "$@"; fi; }
