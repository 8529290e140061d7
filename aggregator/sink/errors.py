"""Errors of the ClickHouse sink; callers branch on the class or on ``retriable``::

    SpendbusError                    (schemas.errors)
    └── AggregatorError              (aggregator/errors.py)
        └── SinkError                the ClickHouse sink failed
            ├── SinkUnavailable      retriable: ClickHouse cannot be reached or asked
            │   │                    to be retried; retry the SAME batch with backoff
            │   │                    and do not commit its Kafka offsets meanwhile
            │   └── DataPathInUse    retriable: the embedded engine's data path is
            │                        locked by another process (named by pid)
            ├── SinkRejected         not retriable: ClickHouse refused the statement
            │                        (missing table, type mismatch, bad DDL, closed
            │                        client, a wrong password, a server certificate
            │                        that does not verify); stop the worker, never
            │                        skip the batch
            └── QueryRefused         an analyst query the read-only guard refuses
                                     (aggregator/sink/guard.py); nothing ran

A failed batch must never be skipped: its events would be missing from
ClickHouse for good. A non-retriable error stops the worker loudly instead.
"""

from __future__ import annotations

from typing import Final

from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from aggregator.errors import AggregatorError

#: ClickHouse error codes that say "try again later", not "this statement is wrong"
RETRIABLE_CODES: Final = frozenset(
    {
        3,  # UNEXPECTED_END_OF_FILE (connection cut mid-stream)
        159,  # TIMEOUT_EXCEEDED
        164,  # READONLY
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        203,  # NO_FREE_CONNECTION
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        236,  # ABORTED
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        243,  # NOT_ENOUGH_SPACE (a full disk frees up; the batch waits)
        252,  # TOO_MANY_PARTS
        285,  # TOO_FEW_LIVE_REPLICAS
        319,  # UNKNOWN_STATUS_OF_INSERT
        394,  # QUERY_WAS_CANCELLED
        425,  # SYSTEM_ERROR
        999,  # KEEPER_EXCEPTION
    }
)


class SinkError(AggregatorError):
    """The ClickHouse sink could not do what it was asked."""


class SinkUnavailable(SinkError):
    """ClickHouse is unreachable or overloaded: retry the same batch with backoff."""

    retriable = True


class DataPathInUse(SinkUnavailable):
    """Another process holds the embedded engine's data path (``<path>/status``).

    chdb hosts one process per data path; the lock is released when that process
    dies (even by kill -9), so a successor retrying after a handover gets in.
    """

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(
            f"the chdb data path {path} is in use by another process ({holder}); "
            "one process per data path: stop it, or give this one another path"
        )
        self.path = path
        self.holder = holder


class SinkRejected(SinkError):
    """ClickHouse refused the statement; retrying the same thing cannot succeed."""

    retriable = False


class QueryRefused(SinkError):
    """The read-only guard refused an analyst query before it ran (or the engine's
    read-only mode did); ``reason`` names the class of refusal for scripts."""

    retriable = False

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


#: what the TLS layer says when the server's certificate does not verify
_CERTIFICATE_FAILURES: Final = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")


def translate(exc: BaseException, doing: str) -> SinkError:
    """The sink error for a clickhouse-connect/chdb exception raised while ``doing``."""
    if isinstance(exc, SinkError):
        return exc
    if any(marker in str(exc) for marker in _CERTIFICATE_FAILURES):
        # not retriable: the same CA gives the same answer until the settings change
        return SinkRejected(
            f"{doing}: the server's TLS certificate did not verify against "
            f"CLICKHOUSE_CA_FILE (or the system CAs when unset): {exc}"
        )
    if isinstance(exc, OperationalError):
        return SinkUnavailable(f"{doing}: ClickHouse unreachable: {exc}")
    code = getattr(exc, "code", None)
    if isinstance(exc, DatabaseError) and code in RETRIABLE_CODES:
        return SinkUnavailable(f"{doing}: ClickHouse asked to retry (code {code}): {exc}")
    return SinkRejected(f"{doing}: {type(exc).__name__}: {exc}")
