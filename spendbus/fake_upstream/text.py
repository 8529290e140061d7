"""Generated text and ids: plausible prose (a few decoys that look like usage or
framing), its cut into stream deltas, and the random ids providers stamp on answers."""

from __future__ import annotations

import random

_VOCABULARY = (
    "the a of to and in is for on that with as by at from this be are it or an "
    "budget partition ledger token cache stream request latency counter broker "
    "offset replica event schema price model usage window verdict retention key "
    "consumer producer topic record batch commit rollup query analyst spend org "
    "limit threshold alert estimate provider response gateway proxy header "
    "every each one two three first last more less only also then when while "
    "should would could must may can will keep read write send count charge "
    "clause contract report quarter summary policy invoice customer region "
    "café naïve déjà-vu résumé Zürich — €12 °C 日本 ✓"
)
_WORDS = tuple(_VOCABULARY.split())

#: Text that looks like usage or framing: a tap reads structure, so it changes nothing.
_DECOYS = (
    '{"usage": {"input_tokens": 1, "output_tokens": 1}}',
    '"usageMetadata": {"promptTokenCount": 1}',
    "data: [DONE]",
    "event: message_stop",
    '{"prompt_tokens": 1, "completion_tokens": 1}',
)


def make_text(rng: random.Random, chars: int) -> str:
    """``chars`` characters of plausible prose: sentences of common words, a few
    non-ASCII, now and then a phrase that looks like usage or SSE framing."""
    if chars <= 0:
        return ""
    parts: list[str] = []
    size = 0
    while size < chars:
        words = rng.choices(_WORDS, k=rng.randint(6, 18))
        if rng.random() < 0.05:
            words[rng.randrange(len(words))] = rng.choice(_DECOYS)
        sentence = " ".join(words)
        piece = sentence[:1].upper() + sentence[1:] + rng.choice(".....?!:")
        piece += "\n\n" if rng.random() < 0.15 else " "
        parts.append(piece)
        size += len(piece)
    return "".join(parts)[:chars]


def split_text(text: str, rng: random.Random, lo: int, hi: int) -> list[str]:
    """``text`` cut in pieces of ``lo``..``hi`` characters (at least one piece)."""
    if not text:
        return []
    pieces = []
    i = 0
    while i < len(text):
        n = rng.randint(lo, hi)
        pieces.append(text[i : i + n])
        i += n
    return pieces


_BASE62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def random_id(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(_BASE62, k=n))


def random_hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choices("0123456789abcdef", k=n))


def random_uuid(rng: random.Random) -> str:
    h = random_hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"
