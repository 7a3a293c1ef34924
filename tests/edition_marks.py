"""The pytest mark `native_only(reason)`: a test of what only the native extension has (the background
worker, the shared-memory statistics, key locks, ...), skipped with that reason when the tests run against
the SQL edition (IDEM_EDITION=sql; tests/pgtools.py). A conftest takes the two hooks in:

    from edition_marks import pytest_configure, pytest_collection_modifyitems  # noqa: F401

and a test says @pytest.mark.native_only("the background worker") (or pgtools.native_only(...)).
"""
import pytest

import pgtools


def pytest_configure(config):
    config.addinivalue_line("markers", "native_only(reason): covers what only the native extension has; "
                                       "skipped under IDEM_EDITION=sql")


def pytest_collection_modifyitems(config, items):
    if not pgtools.sql_edition():
        return
    for item in items:
        mark = item.get_closest_marker("native_only")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "the native extension only")
            item.add_marker(pytest.mark.skip(reason=f"native only: {reason}"))
