"""A pytest plugin for the test layers of scripts/test: after pytest's own closing line, one more line
in the layers' common form, "<layer>: N passed, N failed" (errors count as failures).

    python -m pytest -p layer_summary --layer NAME ...     (with tests/ on sys.path: python -m pytest puts
                                                            the rootdir's conftest dirs there; see callers)
"""


def pytest_addoption(parser):
    parser.addoption("--layer", default=None, help="the layer name of the closing summary line")


def pytest_unconfigure(config):
    name = config.getoption("--layer", default=None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not name or reporter is None:
        return
    stats = reporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    if passed + failed == 0:
        failed = 1  # nothing ran: a layer that tested nothing has not passed
    print(f"{name}: {passed} passed, {failed} failed", flush=True)
