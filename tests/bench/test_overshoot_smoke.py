"""bench_overshoot on a tiny configuration: the JSON it reports, and that its ground truth
(every served call priced as the aggregator prices it) is what the aggregator's verdict says
and what the fake provider served. No figure is checked against a threshold."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from bench.bench_overshoot import run
from bench.overshoot_report import draw_chart
from bench.overshoot_setup import Options

pytestmark = pytest.mark.integration


def test_a_tiny_run_reports_both_phases_and_its_ground_truth_matches(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    opts = Options(
        clients=6,
        replicas=2,
        cap_usd=Decimal("0.15"),
        max_seconds=30,
        stop_after_refusals=4,
        quiet_s=1.0,
        latency_ms=20,
        chunk_latency_ms=0.5,
        flush_interval_s=0.5,
        prompt_tokens=(500, 1_500),
        unshared_comparison=False,
        phases=("ours", "baseline"),
    )
    result = run(opts, kafka_bootstrap, tmp_path)

    assert result["bench"] == "overshoot"
    assert (result["clients"], result["replicas"], result["cap_usd"]) == (6, 2, 0.15)
    assert isinstance(result["cpus"], int) and isinstance(result["load_avg_1m"], float)
    assert set(result["targets"]) == {
        "ours_overshoot_le_1pct",
        "ours_le_baseline_over_20",
        "scaling_overshoot_le_1pct",
        "ground_truth_equals_verdict",
    }
    assert result["scaling"] is None and result["targets"]["scaling_overshoot_le_1pct"] is None
    for kind in ("ours", "baseline"):
        phase = result[kind]
        truth = phase["ground_truth"]
        assert phase["calls"] > 0
        # every call the provider served was metered, and priced as the aggregator prices it
        assert truth["upstream_requests"] == phase["calls"]
        assert truth["upstream_tokens_equal_metered"], kind
        assert truth["verdict_equals_ground_truth"], (kind, truth, phase["spend_usd"])
        assert truth["verdict_spend_usd"] == phase["spend_usd"]
        expected_pct = (phase["spend_usd"] - 0.15) / 0.15 * 100
        assert abs(phase["overshoot_pct"] - expected_pct) < 1e-3
        assert phase["stopped_by"] in ("refusals", "time")
        assert phase["timeline"] and len(phase["timeline"][0]) == len(phase["timeline_columns"])
        spends = [row[1] for row in phase["timeline"]]
        assert spends == sorted(spends)  # cumulative
    assert result["targets"]["ground_truth_equals_verdict"]
    assert result["ours"]["decisions"].get("allowed") == result["ours"]["calls"]
    assert result["ours"]["enforcer_replicas"] == 2  # ours tells each enforcer the replicas

    chart = tmp_path / "overshoot.png"
    draw_chart(result, chart)
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_a_tiny_scaling_run_reports_its_steps_and_the_unused_headroom(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The scaling phase on its own: 1 -> 3 -> 2 replicas counting themselves, the steps
    it took, the share of headroom the counts left unused, the ground truth."""
    opts = Options(
        clients=6,
        cap_usd=Decimal("0.3"),
        max_seconds=40,
        stop_after_refusals=4,
        quiet_s=1.0,
        latency_ms=20,
        chunk_latency_ms=0.5,
        prompt_tokens=(500, 1_500),
        phases=("scaling",),
        scaling=(1, 3, 2),
        scale_at=(0.2, 0.5),
        max_replicas=4,
        membership_grace_s=1.0,
    )
    result = run(opts, kafka_bootstrap, tmp_path)
    phase = result["scaling"]
    assert result["ours"] is None and result["baseline"] is None
    assert phase["enforcer_replicas"] == "membership" and phase["calls"] > 0
    truth = phase["ground_truth"]
    assert truth["verdict_equals_ground_truth"], truth
    assert truth["upstream_requests"] == phase["calls"] and truth["upstream_tokens_equal_metered"]
    steps = phase["scaling_steps"]
    for step in steps:  # told by the group first, used once the grace is over
        if "count_used_everywhere_s" in step:
            assert 0 <= step["group_count_everywhere_s"] <= step["count_used_everywhere_s"]
    reached = [(s["from"], s["to"]) for s in steps]
    assert reached == [(1, 3), (3, 2)][: len(reached)]
    assert len(reached) + len(phase["scaling_steps_not_reached"]) == 2
    unused = phase["headroom_unused_because_of_the_count"]
    assert 0 <= unused["time_weighted_share"] <= unused["max_share"] < 1
    columns = phase["shares_timeline_columns"]
    assert phase["shares_timeline"] and len(phase["shares_timeline"][0]) == len(columns)
    for _t, live, used, counted in phase["shares_timeline"]:
        assert len(used) == len(counted) == live
    chart = tmp_path / "overshoot.png"
    draw_chart(result, chart)
    assert chart.read_bytes().startswith(b"\x89PNG")
