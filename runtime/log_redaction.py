"""Every log line of a process rendered redacted: never a credential in a log.

:func:`redact` replaces what a text shows of a credential (credential headers, bearer and
basic credentials, ``key=`` query values, virtual keys) with ``[redacted]``;
:func:`install_log_redaction` renders every log record once, as it is made, through it.
The command line installs it before any command runs, so this module imports the standard
library only; ``runtime/http_log.py`` applies :func:`redact` to what the servers log.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable
from typing import Any, Final

_REDACTED: Final = "[redacted]"
#: headers whose value is a credential (as a header line, a dict item, a repr)
_CREDENTIAL_HEADERS: Final = (
    r"(?:proxy-)?authorization|x-api-key|api-key|x-goog-api-key|cookie|set-cookie"
)
_PATTERNS: Final = (
    # "Authorization: Bearer x", "'x-api-key': 'x'", "authorization=x"
    re.compile(rf"(?i)((?:{_CREDENTIAL_HEADERS})\b['\"]?\s*[:=]\s*['\"]?)([^\r\n'\",;}}\\]*)"),
    # a bearer or basic credential anywhere
    re.compile(r"(?i)(\b(?:bearer|basic)\s+['\"]?)([^\s'\",;\\]+)"),
    # a key in a query string (Gemini's ?key=)
    re.compile(r"(?i)([?&](?:key|api_key|token|access_token)=)([^&\s'\"\\]+)"),
    # a spendbus virtual key
    re.compile(r"()\bsb-[A-Za-z0-9_-]{16,}"),
)


def redact(text: str) -> str:
    """``text`` with every credential it shows replaced by ``[redacted]``."""
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + _REDACTED, text)
    return text


class _RedactingFactory:
    """A log record factory rendering each record once, redacted (message and traceback)."""

    def __init__(self, inner: Callable[..., logging.LogRecord]) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            rendered = record.getMessage()
        except Exception:  # a bad format: leave it to the handler's own error path
            return record
        # args () not None: formatters that re-wrap args (mode's) expect a tuple
        record.msg, record.args = redact(rendered), ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip())
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return record


def install_log_redaction() -> None:
    """Redact every log record this process makes from now on (idempotent)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingFactory):
        logging.setLogRecordFactory(_RedactingFactory(factory))


__all__ = ["install_log_redaction", "redact"]
