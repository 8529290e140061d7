"""Which model entry prices a model id: the forms of the id tried in turn.

Model ids are first matched exactly as the event carries them, so a price file can
price a decorated id on its own (e.g. Bedrock regional endpoints, dearer than global
ones). If nothing matches, the id is matched again after each of these steps, in
order, stopping at the first form that matches:

1. lower-cased, everything up to the last ``/`` removed (Gemini ``models/``,
   Vertex ``publishers/google/models/``, Bedrock ARNs ``...:foundation-model/``
   or ``...:inference-profile/``, router prefixes such as ``openai/``), and
   Vertex's ``@`` version separator read as ``-`` (``claude-sonnet-4@20250514``);
2. a Bedrock geography label removed (``us.``, ``eu.``, ``apac.``, ``global.`` ...);
3. a Bedrock vendor label removed (``anthropic.``, ``amazon.``, ``meta.`` ...).

So ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` is priced by an entry
``us.anthropic.claude-sonnet-4-5`` if there is one, else
``anthropic.claude-sonnet-4-5``, else ``claude-sonnet-4-5``.
"""

from __future__ import annotations

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


def model_id_candidates(model: str) -> list[str]:
    """The forms of ``model`` tried in turn against the prefixes."""
    out = [model]
    form = model.strip().lower()
    form = form.rsplit("/", 1)[-1].replace("@", "-")
    if form not in out:
        out.append(form)
    for labels in (BEDROCK_GEOGRAPHIES, BEDROCK_VENDORS):
        head, dot, rest = form.partition(".")
        if dot and rest and head in labels:
            form = rest
            out.append(form)
    return out
