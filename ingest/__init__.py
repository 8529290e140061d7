"""spendbus ingest: what runs in or beside a proxy to get usage onto the ledger.

The taps read what a response costs as it streams (``ingest.taps``), the publisher
publishes UsageEvents durably (``ingest.publisher``), the reference gateway does both
per call (``ingest.gateway``); this package's own names are the entry points for
proxies in other languages (``serve_http_ingest``: ``POST /v1/usage``) and for files
(``ingest_file``), and the room's error tree. See README.md beside this file.

These names and the subpackages' ``__init__`` are the public surface; the CLI imports
nothing else of the room.
"""

from ingest.errors import (
    IngestError,
    PublisherClosed,
    PublishTimeout,
    SpoolError,
    SpoolFull,
    SpoolLocked,
)
from ingest.http import serve_http_ingest
from ingest.jsonl import InvalidLines, JsonlReport, LineError, ingest_file, validate_file

__all__ = [
    "IngestError",
    "InvalidLines",
    "JsonlReport",
    "LineError",
    "PublishTimeout",
    "PublisherClosed",
    "SpoolError",
    "SpoolFull",
    "SpoolLocked",
    "ingest_file",
    "serve_http_ingest",
    "validate_file",
]
