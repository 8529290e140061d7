"""The replication rule (runtime/replication.py): follows the cluster, overridable, never
fewer replicas than the cluster allows without the explicit override."""

from __future__ import annotations

import pytest

from runtime.replication import ReplicationPolicy, replication_problems
from schemas.errors import ConfigError
from spendbus.settings import load_settings


@pytest.mark.parametrize(("brokers", "rf", "min_isr"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)])
def test_follows_the_cluster(brokers: int, rf: int, min_isr: int) -> None:
    plan = ReplicationPolicy().plan(brokers)
    assert (plan.replication_factor, plan.min_insync_replicas) == (rf, min_isr)
    assert plan.topic_config == {"min.insync.replicas": str(min_isr)}
    assert not plan.under_replicated


def test_settings_raise_it_within_the_cluster() -> None:
    plan = ReplicationPolicy(replication_factor=5, min_insync_replicas=3).plan(6)
    assert (plan.replication_factor, plan.min_insync_replicas) == (5, 3)
    assert ReplicationPolicy(replication_factor=4).plan(5).min_insync_replicas == 3


def test_fewer_replicas_than_the_cluster_allows_needs_the_explicit_override() -> None:
    with pytest.raises(ConfigError, match="SPENDBUS_ALLOW_UNDER_REPLICATION") as refused:
        ReplicationPolicy(replication_factor=1).plan(3)
    assert "SPENDBUS_REPLICATION_FACTOR=1" in str(refused.value)
    plan = ReplicationPolicy(replication_factor=1, allow_under_replication=True).plan(3)
    assert (plan.replication_factor, plan.min_insync_replicas, plan.under_replicated) == (
        1,
        1,
        True,
    )


def test_impossible_settings_are_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="SPENDBUS_REPLICATION_FACTOR=4 but the cluster lists 3"):
        ReplicationPolicy(replication_factor=4).plan(3)
    with pytest.raises(ConfigError, match="SPENDBUS_MIN_INSYNC_REPLICAS=4"):
        ReplicationPolicy(min_insync_replicas=4).plan(3)


def test_settings_read_the_environment() -> None:
    settings = load_settings(
        {
            "SPENDBUS_REPLICATION_FACTOR": "2",
            "SPENDBUS_MIN_INSYNC_REPLICAS": "2",
            "SPENDBUS_ALLOW_UNDER_REPLICATION": "true",
        }
    )
    assert settings.replication == ReplicationPolicy(
        replication_factor=2, min_insync_replicas=2, allow_under_replication=True
    )
    assert load_settings({}).replication == ReplicationPolicy()
    with pytest.raises(ConfigError, match="replication_factor"):
        load_settings({"SPENDBUS_REPLICATION_FACTOR": "0"})


def test_problems_name_what_is_below_the_plan() -> None:
    plan = ReplicationPolicy().plan(3)
    problems = replication_problems({"a": 3, "b": 1, "c": 3}, {"a": 2, "b": None, "c": 1}, plan)
    assert [(p.topic, str(p)) for p in problems] == [
        ("b", "b: 1 replica(s), the cluster allows 3; min.insync.replicas=1, wanted 2"),
        ("c", "c: min.insync.replicas=1, wanted 2"),
    ]
