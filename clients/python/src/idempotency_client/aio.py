"""The asyncio (psycopg.AsyncConnection) API: the same helpers as the package's top level, awaited.

    from idempotency_client import aio

    async with aio.idempotent_call(conn, key, scope="orders") as call: ...
    @aio.idempotent("orders")            # async def handler(conn, ...)
    async with aio.lease(conn, key, ttl=30) as l: ...   # heartbeats from an asyncio task
    await aio.retry(fn) / aio.run_transaction(conn, fn) / aio.process_batch(conn, items, handler, key=...)

The helpers are written once, in _async.py; the synchronous ones (_sync.py) are generated from it
(tools/gen_sync.py). Their docstrings use the synchronous spelling: read ``async with`` and ``await``.
"""
from ._async import (BatchItem, IdempotentCall, Lease, claim_batch, complete_batch, idempotent, idempotent_call,
                     lease, next_offset, offsets, process_batch, record_offset, retry, run_transaction)

__all__ = ["IdempotentCall", "idempotent_call", "idempotent", "Lease", "lease", "retry", "run_transaction",
           "BatchItem", "process_batch", "claim_batch", "complete_batch", "record_offset", "next_offset", "offsets"]
