"""What in a request refers to content the provider fetches or keeps (request.py).

Compiled with mypyc (pyproject.toml, ``taps``): it walks every container of the request,
once per response. ``isinstance(x, (dict, list))``, not ``dict | list``: mypyc compiles the
tuple to two type checks, the union is built and checked generically on every call.
"""

from __future__ import annotations

from typing import Any, Final

_ID_KEYS: Final = {
    "file_id": "file by id",
    "fileId": "file by id",
    "fileUri": "file by URL",
    "file_uri": "file by URL",
    "file_url": "file by URL",
    "s3Location": "object by S3 location",
}


def _is_remote_url(value: Any) -> bool:
    return isinstance(value, str) and value[:8].lower().startswith(("http://", "https://", "gs://"))


def references(obj: Any, budget: int) -> list[str]:
    """Content that the provider fetches or keeps: files/images by id or URL, found by
    walking the request's containers (at most ``budget`` of them: a larger request is
    assumed to name some, "request too large to inspect")."""
    found: dict[str, None] = {}
    stack: list[Any] = [obj]
    while stack:
        node = stack.pop()
        budget -= 1
        if budget < 0:
            found["request too large to inspect"] = None
            break
        if isinstance(node, list):
            for item in node:
                if isinstance(item, (dict, list)):
                    stack.append(item)
            continue
        items: dict[Any, Any] = node  # keys of a dict a proxy built may be anything
        for key, value in items.items():
            if isinstance(value, (dict, list)):
                stack.append(value)
            if key in _ID_KEYS and value:
                found[_ID_KEYS[key]] = None
            elif key == "image_url" and (
                _is_remote_url(value)
                or (isinstance(value, dict) and _is_remote_url(value.get("url")))
            ):
                found["image by URL"] = None
            elif (
                key == "source" and isinstance(value, dict) and value.get("type") in ("url", "file")
            ):
                found[f"content by {value['type']}"] = None
            elif key == "type" and value in ("item_reference", "container_upload"):
                found[str(value)] = None
    return list(found)
