"""The figures a pytest layer prints: a `report` fixture, report(text) printing one line of a test's figures,
and a terminal summary that repeats them all in one section before pytest's closing line. A conftest takes
both in:

    report, pytest_terminal_summary = figures.plugin("idempotency multi-session figures")
"""
import pytest


def plugin(title, label=lambda request: request.node.name):
    """(the report fixture, the pytest_terminal_summary hook) of one layer; `label(request)` starts each line."""
    lines = []

    @pytest.fixture
    def report(request):
        def _report(text):
            line = f"{label(request)}: {text}"
            print(line)
            lines.append(line)

        return _report

    def pytest_terminal_summary(terminalreporter):
        # Printed before pytest's own closing line, which stays the last line of the output.
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)

    return report, pytest_terminal_summary
