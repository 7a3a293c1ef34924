"""What only the asyncio form has: its sleep and its heartbeats (an asyncio task).

_async.py imports these names from here; in the _sync.py generated from it they come from _sync_backend, which
has the same names for threads (tools/gen_sync.py: the import of _async_backend becomes one of _sync_backend).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

sleep = asyncio.sleep

# Exceptions besides psycopg.Error that a heartbeat keeps (Lease.heartbeat_error, a warning) and goes on after:
# none here. Another exception ends the task, and ``await`` of the task when the heartbeats stop (complete, fail,
# the end of the block) raises it to the lease's holder. (A thread has no such caller: see _sync_backend.)
HEARTBEAT_KEEPS = ()


class Heartbeats:
    """``await beat()`` every ``interval`` seconds in an asyncio task, until ``beat()`` returns False or
    ``await stop()``. ``name`` names the thread in _sync_backend; the task stays unnamed, as it always was."""

    def __init__(self, beat: Callable[[], Awaitable[bool]], interval: float, name: str):
        self._task = asyncio.ensure_future(self._run(beat, interval))

    @staticmethod
    async def _run(beat, interval):
        while True:
            await asyncio.sleep(interval)
            if not await beat():
                return

    async def stop(self) -> None:
        """Cancels the task and waits for its end (raising what ended it, other than the cancellation)."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
