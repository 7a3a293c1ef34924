"""idempotency_client: exactly-once processing for message consumers, backed by the PostgreSQL extension
`idempotency` (idem_claim / idem_complete / idem_fail / idem_heartbeat, batches, offsets).

Synchronous API here (psycopg.Connection); the asyncio one in ``idempotency_client.aio``; the Kafka
consumer helper in ``idempotency_client.kafka`` (needs the ``kafka`` extra: confluent-kafka).
"""
from ._core import FailurePolicy
from ._sync import (BatchItem, IdempotentCall, Lease, claim_batch, complete_batch, idempotent, idempotent_call,
                    lease, next_offset, offsets, process_batch, record_offset, retry, run_transaction)
from .derive import MAX_DEPTH, DocumentTooDeep, canonical_json, fingerprint, idem_key
from .errors import (DEFAULT_ATTEMPTS, DEFAULT_RETRIES, RETRY_SQLSTATES, Failed, Fenced, IdempotencyError, InProgress, LeaseLost, Mismatch,
                     OutcomeError, TerminalError, is_transient)

__version__ = "0.2.0"

__all__ = [
    "IdempotentCall", "idempotent_call", "idempotent", "Lease", "lease", "retry", "run_transaction",
    "BatchItem", "process_batch", "claim_batch", "complete_batch", "record_offset", "next_offset", "offsets",
    "idem_key", "fingerprint", "canonical_json", "MAX_DEPTH", "DocumentTooDeep", "FailurePolicy",
    "IdempotencyError", "OutcomeError", "InProgress", "Failed", "Mismatch", "LeaseLost", "Fenced", "TerminalError",
    "RETRY_SQLSTATES", "DEFAULT_ATTEMPTS", "DEFAULT_RETRIES", "is_transient", "__version__",
]
