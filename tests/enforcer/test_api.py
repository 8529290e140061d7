"""The enforcer's public surface is exactly its __init__'s __all__."""

from __future__ import annotations

import enforcer

EXPECTED = [
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


def test_all_is_the_public_surface() -> None:
    assert enforcer.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(enforcer, name) is not None


def test_errors_share_the_spendbus_root() -> None:
    from schemas.errors import SpendbusError

    for name in ("EnforcerError", "InvalidContext", "NotReady", "TopicsMissing"):
        assert issubclass(getattr(enforcer, name), SpendbusError)
    assert enforcer.NotReady.retriable and not enforcer.InvalidContext.retriable


def test_config_is_frozen_and_validated() -> None:
    import pytest
    from pydantic import ValidationError

    from schemas.errors import ConfigError

    config = enforcer.EnforcerConfig()
    assert config.fail_mode == "open" and config.grace_s == 900
    with pytest.raises(ValidationError):
        config.fail_mode = "closed"  # type: ignore[misc]  # frozen: the assignment must raise
    with pytest.raises(ConfigError, match="sidecar_token is required"):
        enforcer.load_config(sidecar_host="0.0.0.0")
    with pytest.raises(ConfigError, match="fail_mode"):
        enforcer.load_config(fail_mode="sideways")
    assert enforcer.load_config(sidecar_host="0.0.0.0", sidecar_token="s3cret").sidecar_token
