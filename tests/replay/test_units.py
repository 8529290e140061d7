"""Generation names, the control record, snapshot records and comparisons (no broker)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from aggregator.config import AggregatorConfig
from aggregator.counting.batch_output import BatchStats
from aggregator.replay.generations import Difference, compare_views, generation_dsn
from aggregator.replay.snapshots import CHUNK, FoldState, snapshot_from_records, snapshot_records
from schemas.codec import GENERATION_SWITCH
from schemas.errors import ConfigError, DecodeError
from schemas.generations import GenerationSwitch
from schemas.topics import Topics


def test_the_default_generation_keeps_every_name() -> None:
    t = Topics("p.")
    assert (t.usage_raw, t.usage_priced, t.budget_verdicts, t.budget_alerts) == (
        "p.usage.raw",
        "p.usage.priced",
        "p.budget.verdicts",
        "p.budget.alerts",
    )
    assert t.aggregator_app_id == "p.spendbus-aggregator"
    assert t.budget_alerts == t.shared_alerts


def test_a_generation_derives_only_what_the_aggregator_derives() -> None:
    base, g2 = Topics("p."), Topics("p.", "g2")
    shared = ("usage_raw", "usage_dlq", "budget_policies", "pricing", "shared_alerts")
    for name in (*shared, "generations", "counter_snapshots"):
        assert getattr(g2, name) == getattr(base, name), name
    assert g2.usage_priced == "p.usage.priced.g2"
    assert g2.budget_verdicts == "p.budget.verdicts.g2"
    assert g2.budget_alerts == "p.budget.alerts.g2"  # staging, relayed once current
    assert g2.aggregator_app_id == "p.spendbus-aggregator-g2"
    assert AggregatorConfig(bootstrap="x", topic_prefix="p.", generation="g2").topics == g2
    # every derived topic of g2 is among the specs that `ensure_topics` creates for it
    names = {s.name for s in g2.specs()}
    assert {g2.usage_priced, g2.budget_verdicts, g2.budget_alerts, g2.generations} <= names


@pytest.mark.parametrize("bad", ["G2", "2g", "g-2", "g.2", "a" * 17, " g2"])
def test_a_bad_generation_name_is_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ConfigError, match="lower-case letters and digits"):
        Topics("p.", bad)
    with pytest.raises(ValueError, match="lower-case letters and digits"):
        AggregatorConfig(bootstrap="x", generation=bad)


def test_each_generation_has_its_own_clickhouse_store() -> None:
    assert generation_dsn("chdb:///data/ch", "") == "chdb:///data/ch"
    assert generation_dsn("chdb:///data/ch", "g2") == "chdb:///data/ch-g2"
    assert generation_dsn("http://u:p@h:8123/spend", "g3") == "http://u:p@h:8123/spend_g3"
    assert generation_dsn("https://h:8443", "g3") == "https://h:8443/default_g3"


def test_the_control_record_round_trips_and_rejects_foreign_bytes() -> None:
    switch = GenerationSwitch("g2", "", True, datetime(2026, 11, 30, tzinfo=UTC))
    assert GenerationSwitch.decode(switch.encode()) == switch
    assert switch.encode()[:2] == b"\xc3\x01"
    with pytest.raises(DecodeError, match="missing C3 01"):
        GenerationSwitch.decode(b"{'generation': 'g2'}")
    with pytest.raises(DecodeError):
        GENERATION_SWITCH.decode(switch.encode()[:-3])


def _state(n_counters: int) -> FoldState:
    state = FoldState(fences={0: 10, 1: 0, 2: 7}, stats=BatchStats(events=17, charged=15))
    for i in range(n_counters):
        state.counters[f"c{i:05d}"] = (i % 3 and 2, {"p": "m:2026-11", "s": i, "f": {}, "t": {}})
        state.seen[f"e{i:05d}"] = (i % 3 and 2, f"0:{i}")
    state.orgs = {"acme": [3, 300]}
    return state


def test_a_snapshot_reads_back_equal_and_an_incomplete_one_is_never_used() -> None:
    state = _state(2 * CHUNK + 5)  # several chunks per partition
    older = snapshot_records("s1", _state(3))
    newer = snapshot_records("s2", state)
    values: dict[bytes, bytes | None] = dict(older + newer)
    found = snapshot_from_records(values)
    assert found is not None and found[0] == "s2"
    assert found[1].canonical() == state.canonical()
    assert found[1].seen == state.seen and found[1].fences == state.fences
    assert found[1].orgs == state.orgs and found[1].stats == state.stats
    # a chunk of s2 lost (compacted away, or s2's writer died): the older complete one is used
    del values[b"s2|2|c|1"]
    found = snapshot_from_records(values)
    assert found is not None and found[0] == "s1"
    # no manifest: nothing
    assert snapshot_from_records({k: v for k, v in values.items() if b"manifest" not in k}) is None


def test_comparisons_name_each_field_and_missing_counters() -> None:
    a = {"k1": ("m:2026-11", 10, 5, 1), "k2": ("m:2026-11", 1, 1, 1)}
    b = {"k1": ("m:2026-11", 12, 5, 1), "k3": ("m:2026-11", 1, 1, 1)}
    assert compare_views(a, b) == [
        Difference("k1", "spent_nanos", 10, 12),
        Difference("k2", "counter", "present", "missing"),
        Difference("k3", "counter", "missing", "present"),
    ]
    assert compare_views(a, dict(a)) == []


def test_a_moving_verdict_is_compared_with_the_fold_at_its_own_seq() -> None:
    from aggregator.replay.checks import compare_with_history

    history = {
        "k1": {4: ("m:2026-11", 40, 4, 4), 5: ("m:2026-11", 50, 5, 5)},
        "k2": {7: ("m:2026-11", 70, 7, 7)},
    }
    # k1's verdict lags the fold by one event: compared at seq 4, equal
    assert (
        compare_with_history(
            history, {"k1": (("m:2026-11", 40, 4, 4), 4), "k2": (history["k2"][7], 7)}
        )
        == []
    )
    # a verdict the fold has not reached is in flight; a wrong value at a known seq is not
    assert compare_with_history(
        history, {"k1": (("m:2026-11", 41, 4, 4), 4), "k2": (("m:2026-11", 80, 8, 8), 8)}
    ) == [
        Difference("k1", "spent_nanos", 40, 41),
        Difference("k2", "seq", 7, 8),
    ]
    assert compare_with_history(history, {}) == [
        Difference("k1", "counter", "present", "missing"),
        Difference("k2", "counter", "present", "missing"),
    ]


def test_a_previous_verdict_behind_the_cut_is_not_waited_for_once_its_group_passed_it() -> None:
    """Issue 35: a generation that counted otherwise (a budget applied mid-period) keeps a
    verdict at a seq the fold passed before the cut; waiting for it took the whole settle
    time (a minute for 24 events). Ahead of the fold, or with its group still behind the
    cut, it may be in flight."""
    from aggregator.replay.checks import in_flight

    behind = Difference("b|liarco|d:2026-12-07", "seq", 24, 3)  # expected: the fold's
    ahead = Difference("b|acme|d:2026-12-07", "seq", 10, 12)
    missing = Difference("b|new|d:2026-12-07", "counter", "present", "missing")
    assert in_flight([], [behind, ahead, missing], previous_done=True) == [ahead]
    assert in_flight([], [behind, ahead, missing], previous_done=False) == [behind, ahead]
    assert in_flight([behind], [], previous_done=True) == [behind]  # the new one: in flight


def test_the_summary_says_whether_a_difference_from_the_serving_generation_matters() -> None:
    from rich.console import Console

    from aggregator.replay.report import ReplayReport
    from spendbus.commands import replay as command

    report = ReplayReport("g2", "", records=24, charged=24, counters=3, seconds=4.2)
    report.vs_clickhouse = []
    report.vs_previous = [Difference("b|liarco|d:2026-12-07", "spent_nanos", 0, 330_000_000)]
    console = Console(record=True, width=200)
    command._show(report, as_json=False, out=console)
    text = " ".join(console.export_text().split())
    assert "rebuilt in 4.2s" in text and "events/s" not in text
    assert "vs generation (default): 1 (1 counter) differ" in text
    assert "not an error" in text and "--cutover makes the enforcers use" in text
