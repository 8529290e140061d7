"""Reading JSON that is too large to parse whole, by structure, in pieces.

:class:`JsonPathScanner` follows the structure of a JSON document fed in
chunks split anywhere (strings with their escapes, objects, arrays) and keeps
only the values at the wanted paths (object keys; ``"*"`` for any element of an
array, so an object key that is literally ``"*"`` never matches), each at most ``capture_limit`` bytes (else ``LARGE``). A key is a key
only where the structure says so: text inside a string value can never be
taken for one. Where a path matches again in another element of an array, the
last value wins; where it matches again in the same elements (an object on the
way repeats a key), every value is kept (``repeats``; ``sparse`` gives them as
``repeats.Repeated`` objects, read every way: repeats.py), at most
``MAX_REPEATS`` in all (more fails the scan: memory stays bounded). Captured values keep their own repeated keys too.
``on_capture`` is told every captured value. Memory is the stack of open
containers (depth is capped) plus the values being captured.

Cost: bytes are skipped with compiled regexes, so the Python loop runs once per
structural character of the levels that matter (strings and levels off the
wanted paths are skipped whole). Scanning is lenient about what it skips (it
does not validate numbers or literals), strict about brackets and nesting.

:class:`JsonBody` reads a non-streamed body: it keeps up to ``limit`` bytes and
parses them with ``json.loads``; a larger body goes through the scanner.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from .base import CAPTURE_LIMIT, LARGE, Path
from .fastjson import loads
from .repeats import Repeated, loads_keeping_repeats

_ANY = re.compile(rb'[{}\[\]",:]')
_NEST = re.compile(rb'[{}\[\]"]')
_STR = re.compile(rb'["\\]')
_MAX_KEY = 1024
MAX_DEPTH = 256
#: values of repeated keys kept per document (an honest answer repeats none)
MAX_REPEATS = 16


class _Frame:
    __slots__ = ("expect_key", "index", "is_obj", "key", "path", "relevant")

    def __init__(self, is_obj: bool, path: Path | None, relevant: bool) -> None:
        self.is_obj = is_obj
        self.path = path
        self.relevant = relevant
        self.key: str | None = None
        self.expect_key = is_obj
        #: the element being read (arrays on a wanted path)
        self.index = 0


def _decode_key(raw: bytes) -> str | None:
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        key = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return key if isinstance(key, str) else None


class JsonPathScanner:
    """Captures the values at ``paths`` of a JSON object or array fed in chunks."""

    def __init__(
        self,
        paths: Iterable[Path],
        *,
        capture_limit: int = CAPTURE_LIMIT,
        max_depth: int = MAX_DEPTH,
        on_capture: Callable[[Path, Any], None] | None = None,
    ) -> None:
        self.paths = frozenset(paths)
        self.on_capture = on_capture
        #: the earlier values of a path matched again in the same array elements
        self.repeats: dict[Path, list[Any]] = {}
        #: the array elements each path was last matched in
        self._matched_in: dict[Path, tuple[int, ...]] = {}
        self._cap_in: tuple[int, ...] = ()
        self._repeated = 0
        self._prefixes = frozenset(p[:k] for p in self.paths for k in range(len(p)))
        self.capture_limit = capture_limit
        self.max_depth = max_depth
        self.values: dict[Path, Any] = {}
        self.error: str | None = None
        self.size = 0
        self.root_is_object: bool | None = None
        self._stack: list[_Frame] = []
        self._done = False
        self._in_str = False
        self._esc = False
        self._key: bytearray | None = None
        self._key_overflow = False
        self._cap: bytearray | None = None
        self._cap_path: Path = ()
        self._cap_depth = -1
        self._cap_from = 0

    # -- public --------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self.error is None and data:
            self._scan(data)

    def finish(self) -> str | None:
        """Ends the document; returns the reason it cannot be read, or None."""
        if self.error is None:
            if self.root_is_object is None:
                self.error = "empty JSON body"
            elif not self._done:
                self.error = "truncated JSON"
        return self.error

    def sparse(self) -> Any:
        """The captured values rebuilt into a (sparse) object or array: an
        array stands for all its elements with one element. A path matched more than
        once in the same elements holds a ``Repeated`` object at its last step."""
        root: Any = [] if self.root_is_object is False else {}
        for path, value in self.values.items():
            _put(root, path, value)
        if self.repeats:
            root = _with_repeats(root, (), self.repeats, self.values)
        return root

    # -- scanning ------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        self.error = reason
        self._cap = None

    def _scan(self, data: bytes) -> None:
        i, n = 0, len(data)
        stack = self._stack
        # where this chunk's part of the value being captured starts
        self._cap_from = 0
        while i < n:
            if self._in_str:
                i = self._in_string(data, i, n)
                continue
            if not stack:
                i = self._open_root(data, i, n)
                continue
            top = stack[-1]
            m = (_ANY if top.relevant else _NEST).search(data, i)
            if m is None:
                break
            j = m.start()
            i = j + 1
            self._on_mark(data, data[j], top, j)
            if self.error is not None:
                return
        if self._cap is not None:
            self._cap += data[self._cap_from : n]
            if len(self._cap) > self.capture_limit:
                self._store(LARGE)
                self._cap = None

    def _in_string(self, data: bytes, i: int, n: int) -> int:
        """Reads on inside a string (a key being kept, or any other); returns where the
        scan goes on (``n``: the string goes on past this chunk)."""
        if self._esc:
            self._esc = False
            self._key_add(data[i : i + 1])
            return i + 1
        m = _STR.search(data, i)
        if m is None:
            self._key_add(data[i:])
            return n
        j = m.start()
        if data[j] == 0x5C:  # backslash: the next byte is escaped
            self._key_add(data[i : j + 2])
            if j + 1 >= n:
                self._esc = True
            return j + 2
        self._key_add(data[i:j])
        self._in_str = False
        if self._key is not None:
            key = None if self._key_overflow else _decode_key(bytes(self._key))
            self._stack[-1].key = None if key == "*" else key  # "*" means array elements
            self._key = None
        return j + 1

    def _open_root(self, data: bytes, i: int, n: int) -> int:
        """Outside the document: its first bracket opens the root; returns where the scan
        goes on (``n``: nothing more here, or the body failed)."""
        rest = data[i:].lstrip()
        if not rest:
            return n
        if self._done:
            self._fail("trailing data after the JSON value")
            return n
        first = rest[0]
        if first not in (0x7B, 0x5B):
            self._fail("the body is not a JSON object or array")
            return n
        self.root_is_object = first == 0x7B
        self._stack.append(_Frame(self.root_is_object, (), () in self._prefixes))
        return n - len(rest) + 1

    def _on_mark(self, data: bytes, c: int, top: _Frame, j: int) -> None:
        """The structural byte ``c`` at ``j`` (a quote, a bracket, a comma or a colon)."""
        stack = self._stack
        if c == 0x22:  # "
            self._in_str = True
            if top.expect_key and top.relevant:
                self._key = bytearray()
                self._key_overflow = False
        elif c == 0x7B or c == 0x5B:  # { [
            path: Path | None = None
            if top.relevant:
                if not top.is_obj:
                    path = (*top.path, "*")  # type: ignore[misc]  # a relevant frame has a path
                elif top.key is not None:
                    path = (*top.path, top.key)  # type: ignore[misc]  # a relevant frame has a path
            if len(stack) >= self.max_depth:
                self._fail(f"JSON nested deeper than {self.max_depth} levels")
                return
            stack.append(_Frame(c == 0x7B, path, path is not None and path in self._prefixes))
        elif c == 0x7D or c == 0x5D:  # } ]
            if top.is_obj != (c == 0x7D):
                self._fail("malformed JSON: mismatched brackets")
                return
            if self._cap_depth == len(stack):
                self._end_capture(data, self._cap_from, j)
            stack.pop()
            if not stack:
                self._done = True
        elif c == 0x2C:  # ,
            if self._cap_depth == len(stack):
                self._end_capture(data, self._cap_from, j)
            if top.is_obj:
                top.expect_key = True
                top.key = None
            else:
                top.index += 1
        elif top.is_obj:  # :
            top.expect_key = False
            if top.key is not None and self._cap_depth < 0:
                wanted = (*top.path, top.key)  # type: ignore[misc]  # a key is kept only in a relevant frame, which has a path
                if wanted in self.paths:
                    self._cap = bytearray()
                    self._cap_path = wanted
                    self._cap_depth = len(stack)
                    self._cap_in = tuple(f.index for f in stack if not f.is_obj)
                    self._cap_from = j + 1

    def _key_add(self, piece: bytes) -> None:
        key = self._key
        if key is not None and not self._key_overflow:
            key += piece
            if len(key) > _MAX_KEY:
                self._key_overflow = True

    def _end_capture(self, data: bytes, start: int, end: int) -> None:
        cap = self._cap
        self._cap_depth = -1
        self._cap = None
        if cap is None:  # already over the limit, recorded as LARGE
            return
        cap += data[start:end]
        if len(cap) > self.capture_limit:
            self._store(LARGE)
            return
        value, problem = loads_keeping_repeats(cap)
        if problem is not None:
            self._fail(problem.removeprefix("unreadable: "))
            return
        self._store(value)

    def _store(self, value: Any) -> None:
        """The value captured at ``_cap_path``: it replaces one matched in other array
        elements, and is kept beside one matched in the same (a repeated key)."""
        path = self._cap_path
        where = self._cap_in
        if path in self.values and self._matched_in.get(path) == where:
            self._repeated += 1
            if self._repeated > MAX_REPEATS:  # never in an honest answer; memory bounded
                self._fail("an object repeats a key too many times")
                return
            self.repeats.setdefault(path, []).append(self.values[path])
        else:
            self.repeats.pop(path, None)
        self.values[path] = value
        self._matched_in[path] = where
        if self.on_capture is not None:
            self.on_capture(path, value)


def _put(root: Any, path: Path, value: Any) -> None:
    node = root
    last = len(path) - 1
    for k, step in enumerate(path):
        if step == "*":
            if not isinstance(node, list):
                return
            if not node:
                node.append([] if k < last and path[k + 1] == "*" else {})
            if k == last:
                node[0] = value
                return
            node = node[0]
        else:
            if not isinstance(node, dict):
                return
            if k == last:
                node[step] = value
                return
            node = node.setdefault(step, [] if path[k + 1] == "*" else {})


def _with_repeats(
    node: Any, path: Path, repeats: dict[Path, list[Any]], leaves: dict[Path, Any]
) -> Any:
    """The sparse tree with each object holding a repeated path's last step made a
    ``Repeated`` that keeps the earlier values (captured values are left as they are)."""
    if path in leaves:
        return node
    if isinstance(node, dict):
        items = [(key, _with_repeats(v, (*path, key), repeats, leaves)) for key, v in node.items()]
        here = {p[-1]: e for p, e in repeats.items() if p[:-1] == path and p[-1] in node}
        if not here:
            return dict(items)
        out = Repeated(items)
        out.earlier = {key: list(earlier) for key, earlier in here.items()}
        return out
    if isinstance(node, list):
        return [_with_repeats(v, (*path, "*"), repeats, leaves) for v in node]
    return node


class JsonBody:
    """A non-streamed JSON body: parsed whole up to ``limit`` bytes, else scanned
    (``on_capture``: the scanner's)."""

    def __init__(
        self,
        paths: Iterable[Path],
        *,
        limit: int,
        on_capture: Callable[[Path, Any], None] | None = None,
    ) -> None:
        self.paths = frozenset(paths)
        self.limit = limit
        self.size = 0
        self.on_capture = on_capture
        #: the body parsed whole, kept by ``close`` for a reading of its repeated keys
        #: (None when it was scanned: the scanner kept them)
        self.whole: bytes | None = None
        self._parts: list[bytes] = []
        self._scanner: JsonPathScanner | None = None

    @property
    def large(self) -> bool:
        return self._scanner is not None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self._scanner is not None:
            self._scanner.feed(data)
            return
        self._parts.append(data)
        if self.size > self.limit:
            self._scanner = JsonPathScanner(self.paths, on_capture=self.on_capture)
            for part in self._parts:
                self._scanner.feed(part)
            self._parts = []

    def close(self) -> tuple[Any, str | None]:
        """``(object, None)`` or ``(None, reason it cannot be read)``."""
        scanner = self._scanner
        if scanner is not None:
            error = scanner.finish()
            if error is not None:
                return None, f"unreadable: {error}"
            return scanner.sparse(), None
        body = b"".join(self._parts)
        self._parts = []
        if not body.strip():
            return None, "unreadable: empty JSON body"
        value, problem = loads(body)
        if problem is None and not isinstance(value, (dict, list)):
            return None, "unreadable: the body is not a JSON object or array"
        if problem is None:
            self.whole = body
        return value, problem
