"""Gemini API (``generateContent`` / ``streamGenerateContent``).

Streamed (``?alt=sse``): SSE of ``data:`` chunks (lines end with CRLF), each a
``GenerateContentResponse``. Every chunk may carry a cumulative
``usageMetadata``: the last chunk's is authoritative. It is final once a
candidate has a ``finishReason`` or the stream ends normally, not right after an
error chunk (Gemini sends no terminal event). Chunks have no event type, so each is parsed: ``modelVersion``,
``error``, ``usageMetadata``, ``candidates[].finishReason`` and, for the
estimate, the text of ``candidates[].content.parts[]`` (``thought`` parts are
reasoning). With ``delta_text="payload_bytes"`` only the last few chunks are
parsed, at the end.

Not streamed: one ``GenerateContentResponse`` object; a streamed call without
``alt=sse`` returns a JSON array of them, read the same way (each element's usage a
report).

Every ``usageMetadata`` is a usage report: the call is charged the field-wise
maximum of all of them (``Handler.report``), so a lower or zero report later in
the stream, or a ``usageMetadata`` (or a count in it) given twice in one chunk,
lowers nothing. Its billed units (modality details) are the last report's.

``promptTokenCount`` includes ``cachedContentTokenCount`` (subtracted for
``input_tokens``); ``toolUsePromptTokenCount`` (results of server tools fed back
to the model) is billed as input and added to it; ``thoughtsTokenCount`` is
NOT inside ``candidatesTokenCount``, bills as output, and is added to it.
There are no cache writes (explicit caches bill storage separately).
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from .base import (
    Handler,
    Path,
    RecentPayloads,
    describe_error,
    may_repeat,
    read_shape,
    read_shaped_run,
    shape_decoder,
    text_len,
)
from .estimate import EstimatorConfig
from .fastjson import loads
from .request import RequestInfo
from .shapes import ABSENT, GeminiChunk, GeminiChunkTail, GeminiUsageChunk
from .usage import InvalidUsage, Usage, sub, tok, usage_max

_PATHS = frozenset({("usageMetadata",), ("modelVersion",), ("error",), ("candidates",)})
_BODY_PATHS = frozenset(
    {("usageMetadata",), ("modelVersion",), ("error",), ("candidates", "*", "groundingMetadata")}
    | {("*", "usageMetadata"), ("*", "modelVersion"), ("*", "error")}
    | {("*", "candidates", "*", "groundingMetadata")}
)


_astuple: Final = msgspec.structs.astuple
_read_chunk = shape_decoder(GeminiChunk)
_read_usage_chunk = shape_decoder(GeminiUsageChunk)
#: bytes only: the payload already fit ``GeminiChunk`` (valid JSON and UTF-8)
_read_tail = msgspec.json.Decoder(GeminiChunkTail).decode
_NULL: Final = b"null"
#: the keys a chunk (or a body) carrying usage gives at most once
REPEAT_KEYS: Final = (
    b'"usageMetadata"',
    b'"promptTokenCount"',
    b'"cachedContentTokenCount"',
    b'"candidatesTokenCount"',
    b'"thoughtsTokenCount"',
    b'"toolUsePromptTokenCount"',
    b'"promptTokensDetails"',
    b'"candidatesTokensDetails"',
    b'"cacheTokensDetails"',
)
#: what every count key of ``usageMetadata`` ends with (``GeminiUsage``'s fields)
_COUNT_KEY_END: Final = b'TokenCount"'
#: no backslash in a run: no escaped key (one byte: found by memchr)
_ESCAPE: Final = b"\\"
#: ``shapes.ABSENT`` and ``usage.MAX_TOKENS`` as constants the compiled loop inlines
_ABSENT: Final = -1
_MAX_COUNT: Final = 10_000_000_000


def usage_from(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        raise InvalidUsage("usageMetadata is not an object")
    prompt = tok(raw, "promptTokenCount")
    cached = tok(raw, "cachedContentTokenCount")
    thoughts = tok(raw, "thoughtsTokenCount")
    return Usage(
        input_tokens=sub(prompt, cached, "promptTokenCount", "cachedContentTokenCount")
        + tok(raw, "toolUsePromptTokenCount"),
        cache_read_tokens=cached,
        output_tokens=tok(raw, "candidatesTokenCount") + thoughts,
        reasoning_tokens=thoughts,
    )


#: Gemini's token modalities billed at their own rates -> the unit suffix
_MODALITIES: Final = {"AUDIO": "audio_tokens", "IMAGE": "image_tokens"}
#: distinct queries counted per candidate: a bound no grounded answer reaches
MAX_QUERIES_PER_CANDIDATE: Final = 1000


def _by_modality(raw: dict[str, Any], field: str) -> dict[str, int]:
    """The audio and image token counts of one ``*TokensDetails`` list, by unit suffix."""
    counts: dict[str, int] = {}
    details = raw.get(field)
    if isinstance(details, list):
        for detail in details:
            modality = detail.get("modality") if isinstance(detail, dict) else None
            suffix = _MODALITIES.get(modality) if isinstance(modality, str) else None
            if suffix is not None:
                try:
                    counts[suffix] = counts.get(suffix, 0) + tok(detail, "tokenCount")
                except InvalidUsage:
                    continue  # inside the totals already: not charged apart
    return counts


def gemini_modality_units(raw: Any) -> dict[str, int]:
    """Audio and image tokens by modality (``promptTokensDetails`` less
    ``cacheTokensDetails``, whose tokens are charged as cache reads, and
    ``candidatesTokensDetails``: ``[{modality, tokenCount}]``, inside the totals) as
    billed units; a count that is not one is left out (it is in the totals already)."""
    if not isinstance(raw, dict):
        return {}
    cached = _by_modality(raw, "cacheTokensDetails")
    units = {
        f"input_{suffix}": max(0, n - cached.get(suffix, 0))
        for suffix, n in _by_modality(raw, "promptTokensDetails").items()
    }
    for suffix, n in _by_modality(raw, "candidatesTokensDetails").items():
        units[f"output_{suffix}"] = n
    return units


def search_queries(metadata: Any) -> list[str]:
    """``webSearchQueries`` of a candidate's ``groundingMetadata`` (strings only)."""
    queries = metadata.get("webSearchQueries") if isinstance(metadata, dict) else None
    if not isinstance(queries, list):
        return []
    return [query for query in queries if isinstance(query, str)]


def _as_raw(usage: Any) -> dict[str, int]:
    """A ``GeminiUsage`` as the JSON object it was read from (its counts)."""
    raw: dict[str, int] = {}
    for name in (
        "promptTokenCount",
        "cachedContentTokenCount",
        "candidatesTokenCount",
        "thoughtsTokenCount",
        "toolUsePromptTokenCount",
    ):
        value = getattr(usage, name)
        if value != ABSENT:
            raw[name] = value
    return raw


class GeminiHandler(Handler):
    fmt = "gemini"
    body_paths = _BODY_PATHS
    repeat_keys = REPEAT_KEYS

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)
        self._usage: Any = None
        self._finished = False
        self._body = False
        self._recent = RecentPayloads()
        #: a candidate was grounded (one grounded prompt); the distinct search queries
        #: of each candidate (by its index), as every chunk that carries metadata says
        self._grounded = False
        self._queries: dict[int, set[str]] = {}

    def usage_from(self, raw: Any) -> Usage:
        return usage_from(raw)

    # -- streamed ------------------------------------------------------------
    def on_event(self, name: bytes, data: bytes) -> None:
        if self.parse_deltas:
            chunk = read_shape(_read_chunk, data)
            if chunk is not None:
                self._shaped_chunks([chunk], [data])
                return
            self._general(data)
            return
        self.delta_events += 1
        self.text_chars += len(data)
        chunk = read_shape(_read_usage_chunk, data)
        if chunk is not None:
            self._usage_chunks([chunk], [data])
        else:
            self._general(data, count=False)
        self._recent.push(data)

    def on_events(self, events: list[tuple[bytes, bytes]]) -> None:
        self.on_datas([data for _, data in events])

    def on_datas(self, datas: list[bytes]) -> None:
        if self.parse_deltas:
            read_shaped_run(_read_chunk, datas, self._shaped_chunks, self._other_chunk)
            return
        # payload_bytes: the text by its bytes, the usage of every chunk all the same
        self.delta_events += len(datas)
        self.text_chars += sum(map(len, datas))
        read_shaped_run(_read_usage_chunk, datas, self._usage_chunks, self._other_usage_chunk)
        for data in datas:
            self._recent.push(data)

    def _other_chunk(self, data: bytes) -> None:
        self._general(data)

    def _other_usage_chunk(self, data: bytes) -> None:
        self._general(data, count=False)

    def _general(self, data: bytes, count: bool = True) -> None:
        """A chunk read whole (every reading of its repeated keys: each a report)."""
        first = count
        for obj in self.parse_each(data, REPEAT_KEYS):
            if isinstance(obj, dict):
                self._chunk(obj, count=first)
            first = False

    def _fold(self, chunks: list[Any], payloads: list[bytes]) -> bool:
        """Each shaped chunk's usage as a report (``Handler.report``), folded in one
        compiled loop: what reading each chunk's usage whole would charge. False (and
        nothing read) when the chunks' bytes give a usage key their shapes do not hold:
        msgspec keeps the last of a repeated key, so a chunk giving a count (or its
        ``usageMetadata``) twice has more count keys (``...TokenCount"``) in its bytes
        than in its shape, and one written with an escape is not in its bytes as such
        (``may_repeat``). Such chunks are read whole, where repeats are read every way
        (``Handler.parse_each``)."""
        top_in = top_cache = top_out = top_reasoning = -1
        keys = 0
        invalid: list[Any] = []
        for chunk in chunks:
            usage = chunk.usageMetadata
            if usage is None:
                continue
            # native ints from here (mypyc): no boxed compares, no min()/max() calls; one
            # tuple of the fields costs less than six attribute lookups on a Struct
            counts: tuple[int, int, int, int, int, int] = _astuple(usage)
            prompt, cached, candidates, thoughts, tool, total = counts
            if total != _ABSENT:
                keys += 1
            if prompt == _ABSENT:
                prompt = 0
            else:
                keys += 1
            if cached == _ABSENT:
                cached = 0
            else:
                keys += 1
            if candidates == _ABSENT:
                candidates = 0
            else:
                keys += 1
            if thoughts == _ABSENT:
                thoughts = 0
            else:
                keys += 1
            if tool == _ABSENT:
                tool = 0
            else:
                keys += 1
            if (
                prompt < 0
                or cached < 0
                or candidates < 0
                or thoughts < 0
                or tool < 0
                or prompt > _MAX_COUNT
                or cached > prompt
                or candidates > _MAX_COUNT
                or thoughts > _MAX_COUNT
                or tool > _MAX_COUNT
            ):
                invalid.append(usage)  # read whole below, for its problem
                continue
            if prompt - cached + tool > top_in:
                top_in = prompt - cached + tool
            if cached > top_cache:
                top_cache = cached
            if candidates + thoughts > top_out:
                top_out = candidates + thoughts
            if thoughts > top_reasoning:
                top_reasoning = thoughts
        joined = payloads[0] if len(payloads) == 1 else b"".join(payloads)
        if joined.count(_COUNT_KEY_END) != keys:
            return False
        if _ESCAPE in joined and may_repeat(joined, ()):
            return False
        for usage in invalid:
            self.report(_as_raw(usage))
        if top_in >= 0:
            folded = Usage(top_in, top_cache, 0, 0, top_out, top_reasoning)
            seen = self.reported
            self.reported = folded if seen is None else usage_max(seen, folded)
        return True

    def _usage_chunks(self, chunks: list[Any], payloads: list[bytes]) -> None:
        """payload_bytes: the usage of chunks that fit ``GeminiUsageChunk``."""
        if not self._fold(chunks, payloads):
            for data in payloads:
                self._general(data, count=False)

    def _shaped_chunks(self, chunks: list[Any], payloads: list[bytes]) -> None:
        """``_chunk`` of each chunk (a ``GeminiChunk``) in turn: the counts add up, the
        usage reports fold into their maximum; the model and the last usage (for its
        units) are what the last chunk that carries them says."""
        if not self._fold(chunks, payloads):
            for data in payloads:
                self._general(data)
            return
        events = 0
        text = 0
        reasoning = 0
        finished = False
        # Typed locals: mypyc checks the type once and then reads lists and strings
        # natively; the shapes guarantee the types.
        for chunk in chunks:
            candidates: list[Any] | None = chunk.candidates
            if not candidates:
                continue
            events += 1
            for candidate in candidates:
                finish_reason: str | None = candidate.finishReason
                if finish_reason:
                    finished = True
                grounding = candidate.groundingMetadata
                if grounding is not None:
                    self._grounding(candidate.index, loads(bytes(grounding))[0])
                content = candidate.content
                if content is None:
                    continue
                parts: list[Any] | None = content.parts
                if parts is None:
                    continue
                for part in parts:
                    part_text: str | None = part.text
                    if part_text is not None:
                        chars = len(part_text)
                        text += chars
                        if part.thought is True:
                            reasoning += chars
        self.delta_events += events
        self.text_chars += text
        self.reasoning_chars += reasoning
        if finished:
            self._finished = True
        # From the last chunk back, until both are found (every chunk usually carries both)
        model_found = usage_found = False
        i = len(payloads) - 1
        while i >= 0 and not (model_found and usage_found):
            tail = _read_tail(payloads[i])
            version = tail.modelVersion
            if not model_found and isinstance(version, str) and version:
                self.set_model(version)
                model_found = True
            raw = tail.usageMetadata
            if not usage_found and raw and bytes(raw) != _NULL:
                self._usage = bytes(raw)  # the last usage, for its units
                usage_found = True
            i -= 1

    def _chunk(self, obj: dict[str, Any], *, count: bool = True, report: bool = True) -> None:
        self.set_model(obj.get("modelVersion"))
        if obj.get("error"):
            self.error(describe_error(obj))
        candidates = obj.get("candidates")
        if isinstance(candidates, list) and candidates:
            if count:
                self.delta_events += 1
            for candidate in candidates:
                if not isinstance(candidate, dict):
                    continue
                if candidate.get("finishReason"):
                    self._finished = True
                if candidate.get("groundingMetadata") is not None:
                    self._grounding(candidate.get("index"), candidate["groundingMetadata"])
                content = candidate.get("content")
                parts = content.get("parts") if isinstance(content, dict) else None
                if count and isinstance(parts, list):
                    self._parts(parts)
        usage = obj.get("usageMetadata")
        if usage is not None:
            self._usage = usage
            if report:
                self.report(usage)

    def _grounding(self, index: Any, metadata: Any) -> None:
        """A candidate's ``groundingMetadata``: the prompt was grounded, and its queries
        (distinct per candidate, so metadata repeated by later chunks counts once)."""
        self._grounded = True
        queries = self._queries.setdefault(index if type(index) is int else 0, set())
        for query in search_queries(metadata):
            if len(queries) < MAX_QUERIES_PER_CANDIDATE:
                queries.add(query)

    def _grounding_units(self) -> dict[str, int]:
        if not self._grounded:
            return {}
        return {
            "grounded_prompt": 1,
            "grounding_query": sum(len(queries) for queries in self._queries.values()),
        }

    def _parts(self, parts: list[Any]) -> None:
        for part in parts:
            if not isinstance(part, dict):
                continue
            chars = text_len(part.get("text"))
            if part.get("thought") is True:
                self.reasoning_chars += chars
            call = part.get("functionCall")
            if isinstance(call, dict):
                chars += text_len(call.get("name")) + len(
                    json.dumps(call.get("args"), separators=(",", ":"))
                )
            code = part.get("executableCode")
            if isinstance(code, dict):
                chars += text_len(code.get("code"))
            self.text_chars += chars

    def large_event_paths(self, name: bytes) -> frozenset[Path]:
        return _PATHS

    def on_large_event(
        self, name: bytes, obj: dict[str, Any], size: int, ended: bool, count: bool = True
    ) -> None:
        if count:
            self.delta_events += 1
            self.text_chars += size  # bytes bound the text from above
        if ended:
            self._chunk(obj, count=False)

    # -- not streamed --------------------------------------------------------
    def on_captured(self, path: Path, value: Any) -> None:
        """A body too large to parse whole that is an array (a stream without
        ``alt=sse``): each element's usage is a report (the sparse body keeps the last)."""
        if path == ("*", "usageMetadata") and value is not None:
            for reading in self.readings_of(value, value):
                self.report(reading)

    def on_body(self, obj: Any, size: int) -> None:
        self._body = True
        chunks = obj if isinstance(obj, list) else [obj]
        for chunk in chunks:
            if isinstance(chunk, dict):
                self._chunk(chunk, count=False)
            else:
                self.problem("unreadable: the body is not a JSON object")
                return

    # -- end -----------------------------------------------------------------
    def final_usage(self, cut: str | None) -> Usage | None:
        # payload_bytes: the last chunks for the model, the end and errors (their usage
        # was read as they came)
        for data in self._recent.drain():
            obj, _ = loads(data)
            if isinstance(obj, dict):
                self._chunk(obj, count=False, report=False)
        self.count_units(self._grounding_units())
        usage = self.reported
        if usage is None:
            return None
        last = self._usage
        if isinstance(last, bytes):  # a shaped chunk's, kept raw
            last = loads(last)[0]
        self.count_units(gemini_modality_units(last))  # the last report's units
        if self._body:
            return usage
        self.partial = usage
        # No terminal event: a normal end finalises the usage, unless the stream
        # ended on an error chunk (then the usage is only partial).
        ended = cut is None and self.upstream_error is None
        return usage if self._finished or ended else None

    def incomplete_reason(self) -> str:
        if self._body:
            return "no_usage: the body carries no usageMetadata"
        return "no_usage: the stream carried no usageMetadata"
