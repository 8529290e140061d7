"""The reference gateway: an aiohttp proxy that wires the taps, a budget gate and a usage sink.

::

    from ingest.gateway import Gateway, load_config

    config = load_config("gateway.yaml")
    gateway = Gateway(config, gate=enforcer, sink=publisher,
                      credentials=config.credentials(os.environ))
    web.run_app(gateway.app(), host=config.listen.host, port=config.listen.port)

``gate`` is anything shaped like :class:`BudgetGate` (``enforcer.Enforcer`` is);
the ingest room never imports the enforcer. See README.md beside this file.
"""

from schemas.virtual_keys import key_digest, key_hmac, keyed_digest

from .config import (
    GatewayConfig,
    Principal,
    Upstream,
    VirtualKey,
    key_bits,
    load_config,
    parse_config,
    parse_key_entries,
    weak_key_problem,
)
from .gate import BudgetGate, GateDecision, UsageSink
from .identity import KeyStore, SessionTracker, presented_key
from .keys_topic import (
    KEYED_PREFIX,
    KeysNotReady,
    KeysTopicFollower,
    key_from_record,
    key_record,
    record_key,
)
from .proxy import Gateway
from .routes import REALTIME_API, Route, resolve
from .server import GatewayServer
from .upstream import upstream_headers

__all__ = [
    "KEYED_PREFIX",
    "REALTIME_API",
    "BudgetGate",
    "GateDecision",
    "Gateway",
    "GatewayConfig",
    "GatewayServer",
    "KeyStore",
    "KeysNotReady",
    "KeysTopicFollower",
    "Principal",
    "Route",
    "SessionTracker",
    "Upstream",
    "UsageSink",
    "VirtualKey",
    "key_bits",
    "key_digest",
    "key_from_record",
    "key_hmac",
    "key_record",
    "keyed_digest",
    "load_config",
    "parse_config",
    "parse_key_entries",
    "presented_key",
    "record_key",
    "resolve",
    "upstream_headers",
    "weak_key_problem",
]
