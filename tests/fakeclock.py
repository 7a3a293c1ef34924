"""A fake wall clock for test servers: libfaketime (Debian's `faketime` package) preloaded into postgres.

Two ways, both through the server's environment (pgtools.Cluster hands it to pg_ctl):

* `IDEM_FAKE_CLOCK`: a libfaketime offset (`+3600`: an hour ahead of the real clock) that every server a
  run starts gets, through `env_from_caller()`, which pgtools.Cluster.pg_ctl adds to each server's
  environment. The clock then runs at the real rate from real time plus the offset, the same in every
  server and across restarts. `python3 tests/fakeclock.py before-midnight 300` prints the offset that puts
  the clock 300 s before the next midnight UTC (scripts/test runs suites so: docs/testing.md).
* `FileClock`: a clock the test steps while the server runs. The offset (and a rate, `x8`) is read from a
  file at every read of the wall clock (fakeclock_waits.c copies it into libfaketime's FAKETIME, which
  FAKETIME_NO_CACHE makes it parse at every call); rewriting the file moves every process of the server at
  once (tests/clock).

In both, only the wall clock is fake: FAKETIME_DONT_FAKE_MONOTONIC keeps the monotonic clock real, and
FAKETIME_ONLY_CMDS=postgres leaves pg_ctl, which waits for the server by the clock, alone. A small library
of our own, fakeclock_waits.c (built here with the C compiler, once per content), is preloaded before
libfaketime: it sends the server's waits (epoll_wait, poll, select, sleeps) and stat calls straight to glibc,
because libfaketime reads the real clock for whatever runs during them, PostgreSQL's timer signal handler
included, and so lost every lock_timeout, deadlock_timeout and statement_timeout that fell due during a wait
while the fake clock was ahead. So waits last their real time: under a rate R the clock runs R times as fast
and a latch wait (the worker's maintenance_interval, pg_sleep) still takes its time in real seconds.
Standard library only.
"""
import datetime
import glob
import os
import pathlib
import sys

import cbuild

# Where Debian's libfaketime package puts the multi-threaded library (the one PostgreSQL, whose
# processes may start threads, needs).
LIB_GLOBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/*/faketime/libfaketimeMT.so.1")
PACKAGE = "faketime"


def library():
    """The path of libfaketimeMT.so.1, or None when the package is not installed."""
    for pattern in LIB_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


WAITS_SOURCE = pathlib.Path(__file__).resolve().parent / "fakeclock_waits.c"


def waits_library():
    """fakeclock_waits.c built into a shared library under /tmp (readable by the postgres user), once per
    content of the source; its path."""
    return cbuild.shared_library(WAITS_SOURCE, "/tmp/idem-fakeclock", "waits", ["-ldl"])


def base_env():
    lib = library()
    if lib is None:
        raise RuntimeError(f"libfaketime is not installed (apt-get install -y {PACKAGE}; scripts/install-deps test)")
    return {"LD_PRELOAD": f"{waits_library()} {lib}", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_ONLY_CMDS": "postgres", "NO_FAKE_STAT": "1"}


def env_from_caller():
    """The server environment IDEM_FAKE_CLOCK asks for: {} when it is unset or empty."""
    spec = os.environ.get("IDEM_FAKE_CLOCK") or ""
    if not spec:
        return {}
    if not spec.startswith(("+", "-")):
        raise RuntimeError(f"IDEM_FAKE_CLOCK={spec!r}: a libfaketime offset in seconds, such as +3600 or -120")
    return {**base_env(), "FAKETIME": spec}


def offset_before_midnight(seconds, now=None):
    """The libfaketime offset ('+N') that puts the clock `seconds` before the next midnight UTC (at least
    `seconds` ahead: just before midnight, the one after)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    midnight = datetime.datetime.combine(now.date() + datetime.timedelta(days=1), datetime.time(),
                                         tzinfo=datetime.timezone.utc)
    target = midnight - datetime.timedelta(seconds=seconds)
    if target < now:
        target += datetime.timedelta(days=1)
    return f"+{int((target - now).total_seconds())}"


class FileClock:
    """The clock of one server, moved by the test while it runs: libfaketime reads `+OFFSET xRATE` from a
    file at every call of the clock. Give `env()` to the server; then `start(at, rate)` puts its clock at
    `at` (a timezone-aware datetime) running `rate` times as fast as the real one, `step(seconds)` moves it
    by that much at once. `server_now` is a function that returns the server's clock_timestamp()."""

    def __init__(self, directory, server_now=None):
        self.dir = pathlib.Path(directory)
        self.path = self.dir / "faketime.rc"
        self.server_now = server_now
        self.offset = 0.0
        self.rate = 1.0

    def prepare(self):
        """The file (offset 0, rate 1: the real clock), in a directory the postgres user can read."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.offset, self.rate = 0.0, 1.0
        self._write()

    def env(self):
        # libfaketime takes FAKETIME from the environment at every call (FAKETIME_NO_CACHE), and
        # fakeclock_waits.c copies the file's line into it before each read of the wall clock: libfaketime's
        # own file reading (FAKETIME_TIMESTAMP_FILE) allocates, which PostgreSQL's SIGALRM handler must not.
        return {**base_env(), "FAKETIME": "+0", "IDEM_FAKECLOCK_FILE": str(self.path), "FAKETIME_NO_CACHE": "1"}

    def _write(self):
        # Written aside, then renamed: a process reading the file meanwhile sees the old or the new line.
        tmp = self.path.with_suffix(".new")
        tmp.write_text(f"{self.offset:+.6f} x{self.rate:g}\n")
        tmp.chmod(0o644)
        os.replace(tmp, self.path)

    def step(self, seconds):
        """Moves the server's clock by `seconds` (negative: back), at once, in every process."""
        self.offset += seconds
        self._write()

    def start(self, at, rate=1.0):
        """Puts the clock at `at`, running `rate` times as fast as the real one. A change of rate makes the
        clock jump for the moment it takes to read it back (libfaketime counts the rate from the server's
        start), so call it while no case runs."""
        self.rate = float(rate)
        self._write()
        self.step((at - self.server_now()).total_seconds())


def _cli(argv):
    if len(argv) == 2 and argv[0] == "before-midnight":
        print(offset_before_midnight(int(argv[1])))
        return 0
    if argv == ["library"]:
        lib = library()
        print(lib or "")
        return 0 if lib else 1
    print("usage: fakeclock.py before-midnight SECONDS | library", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
