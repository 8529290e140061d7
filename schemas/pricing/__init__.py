"""Versioned prices: what an event costs, computed identically by every stage.

The aggregator charges events with :meth:`PriceBook.price_event`; the enforcer
estimates a request before forwarding it with :meth:`PriceBook.worst_case_nanos`.
Both read the same ``pricing`` topic (compacted, key = version, value = the
``PriceTable`` Avro record), so both charge the same amount for the same usage.

One concern a module:

- ``model_price``: a model's prices (``ModelPrice``, ``LongContextTier``), their bounds
  and defaults, each service tier's prices (a multiplier, class rates), and what one
  call costs at them;
- ``exact_cost``: the integer rates and the exact cost, rounded once;
- ``model_ids``: the forms of a model id tried in turn (Bedrock profiles and vendors) and
  the snapshot suffixes an entry also prices (never another version);
- ``table``: one version (``PriceTable``), its lookup and its explanation of a match;
- ``price_file``: the strict YAML price files and the shipped one;
- ``book``: the price book (``PriceBook``): which version is in force, pricing events.
"""

from schemas.pricing.book import MAX_CACHED_MODELS, NO_VERSION, Price, PriceBook
from schemas.pricing.model_ids import (
    BEDROCK_GEOGRAPHIES,
    BEDROCK_VENDORS,
    SNAPSHOT_SUFFIX,
    is_snapshot_suffix,
    model_id_candidates,
    model_id_forms,
)
from schemas.pricing.model_price import (
    DEFAULT_CACHE_READ_RATIO,
    DEFAULT_CACHE_WRITE_1H_RATIO,
    DEFAULT_CACHE_WRITE_RATIO,
    FALLBACK_MATCH,
    LONG_CONTEXT_RATE_PREFIX,
    MAX_PRICE_PER_MTOK,
    MAX_PRICE_PLACES,
    MAX_SOURCE_CHARS,
    MAX_TIER_MULTIPLIER,
    MAX_UNIT_PRICE,
    TIER_RATE_FIELDS,
    TOKEN_PRICE_FIELDS,
    LongContextTier,
    ModelPrice,
    exact_decimal,
)
from schemas.pricing.price_file import default_price_file, load_price_file, price_table_from_yaml
from schemas.pricing.table import PriceTable

__all__ = [
    "BEDROCK_GEOGRAPHIES",
    "BEDROCK_VENDORS",
    "DEFAULT_CACHE_READ_RATIO",
    "DEFAULT_CACHE_WRITE_1H_RATIO",
    "DEFAULT_CACHE_WRITE_RATIO",
    "FALLBACK_MATCH",
    "LONG_CONTEXT_RATE_PREFIX",
    "MAX_CACHED_MODELS",
    "MAX_PRICE_PER_MTOK",
    "MAX_PRICE_PLACES",
    "MAX_SOURCE_CHARS",
    "MAX_TIER_MULTIPLIER",
    "MAX_UNIT_PRICE",
    "NO_VERSION",
    "SNAPSHOT_SUFFIX",
    "TIER_RATE_FIELDS",
    "TOKEN_PRICE_FIELDS",
    "LongContextTier",
    "ModelPrice",
    "Price",
    "PriceBook",
    "PriceTable",
    "default_price_file",
    "exact_decimal",
    "is_snapshot_suffix",
    "load_price_file",
    "model_id_candidates",
    "model_id_forms",
    "price_table_from_yaml",
]
