"""`make bench`: run every benchmark, write bench/results/<name>.json, show a summary table.

Each benchmark is its own script printing one JSON object (run them alone with
`python bench/bench_<name>.py --help`). None of them is a test: numbers on a
shared machine are read as medians and side-by-side ratios, never thresholds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BENCHES = {
    "taps": ["--repeats", "11"],
    "publisher": ["--events", "100000", "--runs", "3"],
    "sink": ["--runs", "3"],
    "burst": [],
    "insert_formats": [],
    "enforcer": [],
    "pipeline": ["--events", "50000", "--seconds", "10"],
    "fold": ["--rounds", "5"],
    "verdict_encode": [],
    "gateway": [],
    "replay": [],
    "overshoot": [],
    "cli": ["--rounds", "21"],
    "admin": [],
    "console": [],
    "budget_history": [],
}
#: (bench, dotted path in its JSON, label) shown in the summary
HEADLINES = [
    ("admin", "counters.p99_ms", "admin API counters read p99 ms"),
    ("admin", "spend_report.p99_ms", "admin API spend report p99 ms"),
    ("budget_history", "budget_history_of.p99_ms", "one budget's history p99 ms (with counts)"),
    ("pipeline", "throughput.aggregator_events_per_s", "aggregator events/s (1 worker)"),
    ("pipeline", "throughput.raw_consume_events_per_s", "raw aiokafka consume events/s"),
    ("pipeline", "throughput.ratio_to_raw", "aggregator / raw"),
    ("pipeline", "throughput.aggregator_events_per_cpu_s", "aggregator events per CPU-second"),
    ("pipeline", "throughput.ratio_to_raw_per_cpu_s", "aggregator / raw, per CPU-second"),
    ("pipeline", "latency.verdict_latency_ms.p99", "verdict latency p99 ms"),
    ("pipeline", "latency.kafka_floor_ms.p99", "Kafka produce->consume p99 ms"),
    ("fold", "median_cpu_us_per_event", "the fold alone, CPU µs an event"),
    (
        "verdict_encode",
        "counters.rolling_48_buckets.median_cpu_ns_per_encode",
        "a rolling verdict with 48 buckets, CPU ns an encode",
    ),
    ("publisher", "events_per_s.publish_prepared", "publisher events/s (prepared)"),
    ("publisher", "events_per_s.publish_many", "publisher events/s (from dicts)"),
    (
        "taps",
        "formats.anthropic-messages.stream.parsed.ratio_socket",
        "tap CPU / socket relay (Anthropic SSE)",
    ),
    *(
        (
            "taps",
            f"relay_aiohttp.formats.{fmt}.tap_added_ratio",
            f"tap added CPU in an aiohttp relay, paired ({fmt})",
        )
        for fmt in (
            "anthropic-messages",
            "openai-chat",
            "openai-responses",
            "gemini",
            "bedrock-converse",
        )
    ),
    ("sink", "rows_per_s_median", "ClickHouse sink rows/s"),
    ("sink", "ways.engine_raw.rows_per_s_median", "engine INSERT ... SELECT of the same rows/s"),
    ("burst", "burst.clickhouse_over_counting", "300k burst: in ClickHouse / counted (time)"),
    (
        "burst",
        "latency.sink_on.verdict_latency_ms.p99",
        "verdict latency p99 ms, sink storing every event",
    ),
    (
        "replay",
        "generation_worker_with_sink.to_clickhouse_ratio_to_sink_off",
        "replay to a whole ClickHouse / counting alone",
    ),
    (
        "replay",
        "generation_worker_with_sink_in_worker.to_clickhouse_ratio_to_live_counting",
        "replay to a whole ClickHouse / the live counting stage",
    ),
    ("insert_formats", "candidates.avro.vs_rows", "Avro bodies read by the engine / Python rows"),
    (
        "insert_formats",
        "candidates.engine_raw.rows_per_s_median",
        "engine INSERT ... SELECT rows/s",
    ),
    ("enforcer", "check.p99_us", "enforcer check() p99 µs"),
    ("enforcer", "sidecar.checks_per_s", "sidecar checks/s"),
    (
        "replay",
        "generation_worker.progress_on.steady_events_per_s",
        "replay events/s (generation worker, progress on)",
    ),
    ("overshoot", "ours.overshoot_pct", "overshoot % of cap (50 streams, 3 replicas)"),
    ("overshoot", "baseline.overshoot_pct", "baseline overshoot % (flush + poll every 5 s)"),
    ("overshoot", "ratio_ours_to_baseline_overshoot", "overshoot ours / baseline"),
    ("gateway", "gateway_vs_passthrough.cpu_per_mib_ratio", "gateway CPU/MiB / bare pass-through"),
    ("cli", "commands.help.ratio_to_bare", "`spendbus --help` wall time / bare python start"),
    ("cli", "commands.price.ratio_to_bare", "`spendbus price` wall time / bare python start"),
    (
        "gateway",
        "gateway_vs_passthrough.added_ttfb_p99_ms",
        "gateway added TTFB p99 ms (200 streams)",
    ),
    ("gateway", "gateway_vs_passthrough.added_cpu_us_per_request", "gateway added CPU µs/request"),
    (
        "gateway",
        "gateway_vs_passthrough.latency_resolution_ms",
        "A/A: two identical pass-throughs' TTFB p99 apart, ms",
    ),
]


def dig(data: object, path: str) -> object:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return "-"
        data = data[part]
    return data


def main() -> None:
    console = Console()
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name, args in BENCHES.items():
        script = Path(__file__).resolve().parent / f"bench_{name}.py"
        with console.status(f"bench {name}..."):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, str(script), *args], capture_output=True, text=True
            )
        if done.returncode != 0:
            console.print(f"[red]bench {name} failed[/red]\n{done.stderr[-2000:]}")
            continue
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        (out_dir / f"{name}.json").write_text(json.dumps(results[name], indent=2))
        console.print(
            f"bench {name}: {time.monotonic() - started:.0f}s -> bench/results/{name}.json"
        )
    table = Table("measure", "value", title="spendbus benchmarks (this machine, this run)")
    for name, path, label in HEADLINES:
        if name in results:
            table.add_row(label, str(dig(results[name], path)))
    console.print(table)


if __name__ == "__main__":
    main()
