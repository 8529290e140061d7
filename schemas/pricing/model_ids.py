"""Which model entry prices a model id: the forms of the id tried in turn, and the snapshot
forms an entry also prices.

*Forms.* Model ids are first matched exactly as the event carries them, so a price file can
price a decorated id on its own (e.g. Bedrock regional endpoints, dearer than global
ones). If nothing matches, the id is matched again after each of these steps, in
order, stopping at the first form that matches:

1. lower-cased, everything up to the last ``/`` removed (Gemini ``models/``,
   Vertex ``publishers/google/models/``, Bedrock ARNs ``...:foundation-model/``
   or ``...:inference-profile/``, router prefixes such as ``openai/``), and
   Vertex's ``@`` version separator read as ``-`` (``claude-sonnet-4@20250514``);
   an OpenAI fine-tuned id cut to its base (``ft:gpt-4o-mini-2024-07-18:acme::x`` to
   ``ft:gpt-4o-mini-2024-07-18``);
2. a Bedrock geography label removed (``us.``, ``eu.``, ``apac.``, ``global.`` ...);
3. a Bedrock vendor label removed (``anthropic.``, ``amazon.``, ``meta.`` ...).

So ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` is priced by an entry
``us.anthropic.claude-sonnet-4-5`` if there is one, else
``anthropic.claude-sonnet-4-5``, else ``claude-sonnet-4-5``.

*Snapshots, never another version.* An entry ``X`` prices a form that is ``X`` itself or
``X`` followed by a snapshot suffix (:data:`SNAPSHOT_SUFFIX`), each part optional but in
this order:

- ``-0``: Anthropic's alias of a major version (``claude-sonnet-4-0`` is Sonnet 4);
- ``-preview`` or ``-exp``, optionally with the preview's date (``-05-20``, ``-09-2025``);
- ``-latest`` (``claude-3-5-haiku-latest``, ``gpt-4o-audio-preview-latest``);
- a snapshot date or number: ``-2025-08-07`` (OpenAI), ``-20250929`` (Anthropic),
  ``-0613`` (OpenAI's older month-day snapshots), ``-001`` (Gemini's stable numbers);
- ``-preview`` after such a date (``gpt-4-1106-preview``);
- Bedrock's model version: ``-v1:0``, ``-v2``, ``-1:0`` (gpt-oss), ``-v1:0:200k``.

Anything else after ``X`` is another model: ``gpt-5`` does not price ``gpt-5.5`` (no
``-`` boundary) nor ``gpt-5-codex`` (``-codex`` is not a snapshot), ``claude-sonnet-4``
does not price ``claude-sonnet-4-6``. A model no entry prices is unpriced (and the
budget's unpriced policy decides) rather than charged as its neighbour.
"""

from __future__ import annotations

import re
from typing import Final

#: Bedrock cross-region inference profile prefixes (``us.anthropic.claude-...``)
BEDROCK_GEOGRAPHIES: Final = frozenset(
    {"us", "eu", "apac", "global", "us-gov", "jp", "au", "ca", "uk", "in", "sa"}
)
#: Bedrock model provider prefixes (``anthropic.claude-...``, ``amazon.nova-...``)
BEDROCK_VENDORS: Final = frozenset(
    {
        "anthropic",
        "amazon",
        "meta",
        "mistral",
        "cohere",
        "ai21",
        "deepseek",
        "openai",
        "qwen",
        "writer",
        "google",
        "moonshot",
        "minimax",
        "nvidia",
        "twelvelabs",
        "stability",
        "luma",
    }
)

#: what may follow an entry's ``match`` in an id of the same model (module docstring)
SNAPSHOT_SUFFIX: Final = re.compile(
    r"(?:-0)?"
    r"(?:-(?:preview|exp)(?:-[01]\d-(?:[0-3]\d|20\d\d))?)?"
    r"(?:-latest)?"
    r"(?:-(?:20\d\d-[01]\d-[0-3]\d|20\d{6}|(?:0[1-9]|1[0-2])[0-3]\d|0\d\d))?"
    r"(?:-preview)?"
    r"(?:-(?:v\d+(?::\d+)?|\d+:\d+)(?::\d+k)?)?"
)

#: the steps of :func:`model_id_forms`, as ``spendbus price --explain`` names them
AS_CARRIED: Final = "as carried"
NORMALISED: Final = "normalised"
GEOGRAPHY_REMOVED: Final = "geography label removed"
VENDOR_REMOVED: Final = "vendor label removed"


def is_snapshot_suffix(rest: str) -> bool:
    """Whether ``rest``, what follows an entry's match in an id, names a snapshot of the
    same model (or is empty)."""
    return not rest or SNAPSHOT_SUFFIX.fullmatch(rest) is not None


def model_id_forms(model: str) -> list[tuple[str, str]]:
    """The forms of ``model`` tried in turn, each with the step that made it."""
    out = [(AS_CARRIED, model)]
    form = model.strip().lower()
    form = form.rsplit("/", 1)[-1].replace("@", "-")
    if form.startswith("ft:"):  # ft:<base>:<org>:<suffix>:<id>: the base is priced
        form = ":".join(form.split(":", 2)[:2])
    if form != model:
        out.append((NORMALISED, form))
    for step, labels in (
        (GEOGRAPHY_REMOVED, BEDROCK_GEOGRAPHIES),
        (VENDOR_REMOVED, BEDROCK_VENDORS),
    ):
        head, dot, rest = form.partition(".")
        if dot and rest and head in labels:
            form = rest
            out.append((step, form))
    return out


def model_id_candidates(model: str) -> list[str]:
    """The forms of ``model`` tried in turn against the entries."""
    return [form for _, form in model_id_forms(model)]
