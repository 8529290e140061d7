"""The incremental SSE parser."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.taps.sse import SSEParser


class Sink:
    def __init__(self, events: list[tuple[bytes, bytes]]) -> None:
        self.events = events
        self.data = b""

    def feed(self, data: bytes) -> None:
        self.data += data

    def close(self, name: bytes, ended: bool) -> None:
        self.events.append((b"LARGE:" + name, self.data if ended else b"CUT:" + self.data))


def parse(chunks: list[bytes], *, limit: int = 1 << 20, complete: bool = True) -> list[Any]:
    events: list[Any] = []
    parser = SSEParser(lambda n, d: events.append((n, d)), lambda n: Sink(events), limit=limit)
    for chunk in chunks:
        parser.feed(chunk)
    parser.close(complete=complete)
    return events


def test_fields_comments_and_multiline_data() -> None:
    stream = (
        b": keep-alive comment\n\n"
        b'event: one\ndata: {"a":1}\n\n'
        b"id: 7\nretry: 1000\nevent:two\ndata:x\ndata: y\n\n"
        b"event: no-data\n\n"
        b"data\n\n"
        b"data:  two spaces\n\n"
    )
    assert parse([stream]) == [
        (b"one", b'{"a":1}'),
        (b"two", b"x\ny"),
        (b"", b""),
        (b"", b" two spaces"),
    ]


def test_line_endings_lf_crlf_cr_even_split() -> None:
    want = [(b"e", b"1"), (b"", b"2"), (b"", b"3")]
    stream = b"event: e\r\ndata: 1\r\n\r\ndata: 2\r\rdata: 3\n\n"
    assert parse([stream]) == want
    for i in range(len(stream) + 1):
        assert parse([stream[:i], stream[i:]]) == want, i


def test_bom_is_skipped() -> None:
    assert parse([b"\xef\xbb\xbfdata: 1\n\n"]) == [(b"", b"1")]


def test_unterminated_last_event_only_on_a_normal_end() -> None:
    assert parse([b"data: 1\n\ndata: 2"]) == [(b"", b"1"), (b"", b"2")]
    assert parse([b"data: 1\n\ndata: 2"], complete=False) == [(b"", b"1")]


def test_large_event_is_streamed_to_a_sink_and_parsing_resumes() -> None:
    big = b"x" * 5000
    stream = b"data: small\n\nevent: big\ndata: " + big + b"\ndata: tail\n\ndata: after\n\n"
    for step in (1, 7, 4096, len(stream)):
        chunks = [stream[i : i + step] for i in range(0, len(stream), step)]
        assert parse(chunks, limit=100) == [
            (b"", b"small"),
            (b"LARGE:big", big + b"\ntail"),
            (b"", b"after"),
        ], step


def test_large_event_cut_in_the_middle() -> None:
    events = parse([b"event: big\ndata: " + b"y" * 500], limit=100, complete=False)
    assert events == [(b"LARGE:big", b"CUT:" + b"y" * 500)]


@settings(max_examples=120, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from([b"", b"message_start", b"x"]),
            st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")),
        ),
        max_size=8,
    ),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    limit=st.sampled_from([8, 64, 1 << 20]),
)
def test_any_split_gives_the_same_events(
    events: list[tuple[bytes, bytes]], crlf: bool, cuts: list[int], limit: int
) -> None:
    nl = b"\r\n" if crlf else b"\n"
    stream = b"".join(
        (b"event: " + name + nl if name else b"") + b"data: " + data + nl + nl
        for name, data in events
    )
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    want = parse([stream], limit=limit)
    assert parse(chunks, limit=limit) == want
    if limit > 1000:
        assert want == [(name, data) for name, data in events]
