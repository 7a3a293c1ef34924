"""Fixtures of the clock layer: one cluster for the whole run, started under libfaketime with a clock the
tests set and step (tests/fakeclock.py: FileClock), on the port of tests/ports "clock"; the library
preloaded (the native extension's worker maintains the cases' database; under IDEM_EDITION=sql the library
is left out and the cases call idem_maintenance() themselves).
"""
import pytest

import fakeclock
import figures
import pgtools
from edition_marks import pytest_collection_modifyitems, pytest_configure  # noqa: F401 - the native_only mark

PORT = pgtools.port("clock")
CONF = [
    "shared_preload_libraries = 'idempotency'",
    "idempotency.database = 'clock_case'",
    "idempotency.maintenance_interval = '1s'",
    "synchronous_commit = off",
    "max_connections = 60",
    # The SQLSTATE of every logged error, so that the checks find 23514 and XX000 in any session's log.
    "log_line_prefix = '%m [%p] %e '",
    "checkpoint_timeout = '1d'",
]

class Server:
    def __init__(self):
        self.clock = fakeclock.FileClock(f"/tmp/idem-clock-{PORT}")
        self.cluster = pgtools.Cluster(PORT, CONF, server_env={**pgtools.caller_server_env()})


@pytest.fixture(scope="session")
def server():
    s = Server()
    s.clock.prepare()
    # IDEM_FAKECLOCK_STRICT: an allocation inside the timeout handler aborts the backend at once
    # (fakeclock_waits.c; test_signals.py).
    s.cluster.server_env.update({**s.clock.env(), "IDEM_FAKECLOCK_STRICT": "1"})
    s.cluster.init()
    try:
        s.cluster.start()
        missing = s.cluster.missing_server_env({"LD_PRELOAD": s.clock.env()["LD_PRELOAD"]})
        assert not missing, f"the server runs without libfaketime: {missing}"
        yield s
    finally:
        s.cluster.stop()
        if s.cluster.running():   # (a fast shutdown that did not finish must not leave the port taken)
            s.cluster.stop(mode="immediate")


report, pytest_terminal_summary = figures.plugin(
    "idempotency clock figures", lambda request: f"{request.node.name}[{pgtools.edition()}]")
