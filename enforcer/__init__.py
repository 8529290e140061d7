"""spendbus enforcer: answers check(request) in microseconds from memory.

Reads budget.policies, pricing and budget.verdicts (compacted) from the
beginning, then follows them live; decides each request against every
applicable budget, holds in-flight estimates (reserve-and-settle), renders
refusals in spendbus's or the provider's own error format, and serves the
same over HTTP (``spendbus enforcer serve``). See README.md for its invariants.

This module is the only public surface; everything else is private.
"""

from enforcer.config import EnforcerConfig, load_config
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.errors import EnforcerError, InvalidContext, NotReady, TopicsMissing
from enforcer.policy import Policy, PolicyError
from enforcer.service import Enforcer
from enforcer.sidecar import Sidecar, create_app, serve

__all__ = [
    "Context",
    "CounterStatus",
    "Decision",
    "Enforcer",
    "EnforcerConfig",
    "EnforcerError",
    "InvalidContext",
    "NotReady",
    "Policy",
    "PolicyError",
    "Sidecar",
    "TopicsMissing",
    "create_app",
    "load_config",
    "serve",
]
