"""What only the synchronous form has: its sleep and its heartbeats (a thread).

The _sync.py generated from _async.py imports these names from here, where _async.py imports them from
_async_backend (tools/gen_sync.py).
"""
from __future__ import annotations

import threading
from time import sleep  # noqa: F401 (retry's backoff)
from typing import Callable

# Exceptions besides psycopg.Error that a heartbeat keeps (Lease.heartbeat_error, a warning) and goes on after:
# any Exception. A thread has no caller to raise to: one it does not catch would end the heartbeats with only
# the thread's excepthook to say so. (The asyncio task raises it when awaited: see _async_backend.)
HEARTBEAT_KEEPS = (Exception,)


class Heartbeats:
    """``beat()`` every ``interval`` seconds in a daemon thread named ``name``, until ``beat()`` returns False
    or ``stop()``."""

    def __init__(self, beat: Callable[[], bool], interval: float, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(beat, interval), name=name, daemon=True)
        self._thread.start()

    def _run(self, beat, interval):
        while not self._stop.wait(interval):
            if not beat():
                return

    def stop(self) -> None:
        """Tells the thread to stop and waits for its end (a beat under way finishes first)."""
        self._stop.set()
        self._thread.join()
