"""Server-sent events as the providers frame them: one ``data:`` line, named or not."""

from __future__ import annotations

from typing import Any

from .template import Template, dumps


def sse_event(name: str | None, obj: Any, *, crlf: bool = False) -> bytes:
    """One SSE event (``event:`` line when named, one ``data:`` line)."""
    data = obj if isinstance(obj, str) else dumps(obj, spaced=crlf)
    eol = "\r\n" if crlf else "\n"
    head = f"event: {name}{eol}" if name else ""
    return f"{head}data: {data}{eol}{eol}".encode()


def sse_template(name: str | None, obj: Any) -> Template:
    """:func:`sse_event` of ``obj`` with its :func:`~.template.slot`\\ s left to fill."""
    return Template(sse_event(name, obj).decode())
