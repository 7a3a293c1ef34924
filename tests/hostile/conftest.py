"""Fixtures of the hostile-roles tests: one throwaway cluster (tests/ports: "hostile") with the library
preloaded and its worker maintaining the database `hostile_worker` every second, stopped at the end."""
import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import pgtools  # noqa: E402
from edition_marks import pytest_collection_modifyitems, pytest_configure  # noqa: E402,F401 - native_only

PORT = pgtools.port("hostile")
WORKER_DB = "hostile_worker"

_server = pgtools.Cluster(PORT, [
    "shared_preload_libraries = 'idempotency'",
    f"idempotency.database = '{WORKER_DB}'",
    "idempotency.maintenance_interval = '1s'",
])


@pytest.fixture(scope="session")
def cluster():
    _server.init()
    try:
        _server.start()
        yield _server
    finally:
        _server.stop()
