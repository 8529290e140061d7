"""bench_overshoot on a tiny configuration: the JSON it reports, and that its ground truth
(every served call priced as the aggregator prices it) is what the aggregator's verdict says
and what the fake provider served. No figure is checked against a threshold."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from bench.bench_overshoot import Options, draw_chart, run

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
    )
    result = run(opts, kafka_bootstrap, tmp_path)

    assert result["bench"] == "overshoot"
    assert (result["clients"], result["replicas"], result["cap_usd"]) == (6, 2, 0.15)
    assert isinstance(result["cpus"], int) and isinstance(result["load_avg_1m"], float)
    assert set(result["targets"]) == {
        "ours_overshoot_le_1pct",
        "ours_le_baseline_over_20",
        "ground_truth_equals_verdict",
    }
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
