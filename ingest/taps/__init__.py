"""Structural usage taps: read what an LLM response costs as its bytes stream by.

::

    from ingest.taps import open_tap

    tap = open_tap("anthropic-messages", request_body, content_type=ct,
                   content_encoding=ce, status=status)
    for chunk in upstream:        # the bytes sent to the client, untouched
        tap.feed(chunk)           # never raises; memory bounded
    result = tap.finish()         # or finish(cut="client_disconnected")

See README.md beside this file for the invariants and what is read where.
"""

from __future__ import annotations

from .decode import ContentDecoder, ContentDecodingError, supported_encodings
from .estimate import EstimatorConfig
from .fastjson import json_loads
from .formats import FORMATS, open_tap
from .inspect import inspect_response
from .realtime import RealtimeTap, open_realtime_tap
from .request import RequestInfo, read_request
from .tap import Tap
from .usage import TapResult, Usage, UsageSource

__all__ = [
    "FORMATS",
    "ContentDecoder",
    "ContentDecodingError",
    "EstimatorConfig",
    "RealtimeTap",
    "RequestInfo",
    "Tap",
    "TapResult",
    "Usage",
    "UsageSource",
    "inspect_response",
    "json_loads",
    "open_realtime_tap",
    "open_tap",
    "read_request",
    "supported_encodings",
]
