"""What a refused request is answered: a status (always 4xx, or 503 when the broker did
not acknowledge) and a JSON body naming the problem and, when there is one, the field."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

_FIELD = re.compile(r"field '([^']+)'")


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    def response(self) -> web.Response:
        body: dict[str, Any] = {"error": self.message}
        if self.field is not None:
            body["field"] = self.field
        return web.json_response(body, status=self.status)


def invalid(messages: list[str], where: str = "") -> ApiError:
    """A 422 for validation messages (the first one answers; each names its field)."""
    first = messages[0]
    if where and first.startswith(where):
        first = first[len(where) :].lstrip(": ")
    found = _FIELD.search(first)
    return ApiError(422, first, found.group(1) if found else None)
