"""``spendbus prices update``: the maintained community maps fetched, where they agree.

Both maps are fetched from their published URLs (:data:`PUBLISHED`; ``--litellm-url`` /
``--genai-prices-url`` for a mirror or a local copy) and read exactly
(:mod:`.sources`). A model is taken only where the two agree: each map's ids are grouped
by their snapshot-free form (``claude-opus-4-5`` for ``claude-opus-4-5-20251101``, the
entry that prices them), a map whose ids of one model disagree says nothing of it, and
both must give the same input, output and cache-read prices and long-context tier (a
cache-write price only one gives is not taken); unit prices and service tiers are taken
where both give the same. The agreed prices then go through the import
(:func:`.update.import_prices`, new models added) into a new version of our file, in
force from an effective date: older events keep their prices.
"""

from __future__ import annotations

import tempfile
import urllib.request
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Final

from schemas.errors import ConfigError

from .generate import base_id
from .sources import SourceFile, SourcePrice, read_source

#: where the maintainers publish the maps
PUBLISHED: Final = {
    "litellm": "https://raw.githubusercontent.com/BerriAI/litellm/main/model_prices_and_context_window.json",
    "genai-prices": "https://raw.githubusercontent.com/pydantic/genai-prices/main/prices/data.json",
}
#: longest wait for one map
FETCH_TIMEOUT_S: Final = 60.0
#: the largest map accepted (LiteLLM's is a few MB)
MAX_MAP_BYTES: Final = 64 * 1024 * 1024


def fetch(url: str, folder: Path, name: str) -> Path:
    """``url`` saved as ``folder/name``; ConfigError names the URL on any failure."""
    if not url.startswith(("https://", "http://")):
        raise ConfigError(f"{url}: not an http(s) URL")
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            body = response.read(MAX_MAP_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{url}: cannot fetch: {exc}") from None
    if len(body) > MAX_MAP_BYTES:
        raise ConfigError(f"{url}: larger than {MAX_MAP_BYTES} bytes")
    path = folder / name
    path.write_bytes(body)
    return path


def _by_model(source: SourceFile) -> dict[str, SourcePrice]:
    """One price per snapshot-free model id; a model whose ids disagree is left out."""
    groups: dict[str, list[SourcePrice]] = defaultdict(list)
    for price in source.prices:
        groups[base_id(price.model)].append(price)
    out: dict[str, SourcePrice] = {}
    for model, prices in groups.items():
        if len({p.signature()[:6] for p in prices}) == 1:
            out[model] = prices[0]
    return out


def agreed(litellm: SourceFile, genai: SourceFile) -> tuple[SourceFile, list[str]]:
    """The prices both maps give alike, one per model, and the models they disagree on."""
    a, b = _by_model(litellm), _by_model(genai)
    out = SourceFile(name="maps", label=f"{litellm.label} + {genai.label}")
    disagree: list[str] = []
    for model in sorted(set(a) & set(b)):
        pa, pb = a[model], b[model]
        sa, sb = pa.signature(), pb.signature()
        # input, output, cache reads and the long-context tier alike; a cache write only
        # one map prices is not taken (ours, or the default, stays)
        writes = [x if x == y else None for x, y in zip(sa[3:5], sb[3:5], strict=True)]
        if (
            sa[:3] != sb[:3]
            or sa[5] != sb[5]
            or any(
                x is not None and y is not None and x != y
                for x, y in zip(sa[3:5], sb[3:5], strict=True)
            )
        ):
            disagree.append(model)
            continue
        out.prices.append(
            SourcePrice(
                model=model,
                input_per_mtok=pa.input_per_mtok,
                output_per_mtok=pa.output_per_mtok,
                cache_read_per_mtok=pa.cache_read_per_mtok,
                cache_write_per_mtok=writes[0],
                cache_write_1h_per_mtok=writes[1],
                long_context=pa.long_context,
                source=f"{pa.source} = {pb.source}",
                unit_prices=tuple(sorted(set(pa.unit_prices) & set(pb.unit_prices))),
                service_tiers=tuple(sorted(set(pa.service_tiers) & set(pb.service_tiers))),
            )
        )
    return out, disagree


def fetch_agreed(
    litellm_url: str, genai_url: str, on: date
) -> tuple[SourceFile, list[str], list[str]]:
    """Both maps fetched and read as on ``on``: (what they agree on, the models they
    disagree on, the ids each skipped and why)."""
    with tempfile.TemporaryDirectory(prefix="spendbus-prices-") as folder:
        litellm = read_source("litellm", fetch(litellm_url, Path(folder), "litellm.json"), on=on)
        genai = read_source(
            "genai-prices", fetch(genai_url, Path(folder), "genai-prices.json"), on=on
        )
    source, disagree = agreed(litellm, genai)
    return source, disagree, [*litellm.skipped, *genai.skipped]
