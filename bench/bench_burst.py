"""End to end: a burst of usage events, counted and in ClickHouse, measured in one run.

1. **burst**: one aggregator worker with its embedded ClickHouse store (chdb, as
   ``spendbus up`` runs it), serving; ``--events`` (default 300k) pre-encoded UsageEvents
   are written to usage.raw in whole record batches, as fast as Kafka takes them. From
   the first write on, the worker's ``/stats`` is sampled: the time until the counting
   stage has folded every event and the time until the sink has stored every row
   (``sink_rows``), then ``/sql`` confirms it from the table itself (count and distinct
   source positions). ``clickhouse_over_counting`` is the second time over the first
   (issue 19's target: at most 1.25). With ``--sink both`` (the default) the burst runs
   twice, side by side: the worker's sink in a process of its own (``burst``,
   ``SPENDBUS_SINK_PROCESS=true``) and in the worker's own process (``burst_sink_in_worker``,
   as ``spendbus up`` runs it); ``--repeats`` alternates them that many times and
   shows the run of the median ratio of each, beside every run's ratio.
2. **latency** (``--rate``, default 2k events/s): the verdict latency of the same worker
   kind, with the sink off and with it storing every event (in its process, and in the
   worker's), side by side (bench/bench_pipeline.py's measurement).

Beside it, bench/bench_sink.py gives the sink alone and the engine's raw insert rate of
the same rows. Prints one JSON object. Uses KAFKA_BOOTSTRAP, else starts a LocalKafka.

    .venv/bin/python bench/bench_burst.py [--events 300000] [--rate 2000] [--seconds 10]
        [--only burst|latency] [--sink both|process|worker] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.benchkit`, also when run as a script

from bench.bench_pipeline import latency, produce, start_workers, stop_workers  # noqa: E402
from bench.benchkit import apply_reference, events  # noqa: E402
from runtime.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.broker_jars import ensure_broker_jars  # noqa: E402
from spendbus.stack.kafka import LocalKafka  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402

#: how often /stats is read while the burst is worked through
SAMPLE_SECONDS = 0.05
#: the setting that puts a worker's sink in a process of its own (spendbus/settings.py)
SINK_PROCESS_VARIABLE: Final = "SPENDBUS_SINK_PROCESS"


@contextlib.contextmanager
def sink_placement(in_process: bool) -> Iterator[None]:
    """Workers started inside run their sink in a process of its own, or in themselves
    (``SPENDBUS_SINK_PROCESS``, which a worker process inherits)."""
    before = os.environ.get(SINK_PROCESS_VARIABLE)
    os.environ[SINK_PROCESS_VARIABLE] = "true" if in_process else "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SINK_PROCESS_VARIABLE, None)
        else:
            os.environ[SINK_PROCESS_VARIABLE] = before


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def burst(
    bootstrap: str,
    n: int,
    home: Path,
    *,
    sink_process: bool = True,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    topics = Topics(f"burst{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, topics, 4, security=security))
    asyncio.run(apply_reference(bootstrap, topics, security=security))
    records = events(n)
    dsn = f"chdb://{home / 'clickhouse'}"
    with sink_placement(sink_process):
        (running,) = start_workers(
            bootstrap, topics, home, 1, security=security, clickhouse_dsn=dsn
        )
    try:
        started = time.monotonic()
        asyncio.run(produce(bootstrap, topics.usage_raw, records, security=security))
        published = time.monotonic() - started
        counted = stored = None
        samples = 0
        timeline: list[tuple[float, int, int]] = []
        while stored is None:
            stats = running.get("/stats")
            samples += 1
            now = time.monotonic() - started
            timeline.append((round(now, 2), stats.get("events", 0), stats.get("sink_rows", 0)))
            if counted is None and stats.get("events", 0) >= n:
                counted = now
            if stats.get("sink_rows", 0) + stats.get("sink_skipped", 0) >= n:
                stored = now
            time.sleep(SAMPLE_SECONDS)
        assert counted is not None
        table = running.post(
            "/sql",
            {"sql": "SELECT count(), uniqExact(source_partition, source_offset) FROM usage_events"},
        )["rows"][0]
        final = running.get("/stats")
        worker_pid = running.pid()
        sink_pid = (final.get("sink_process") or {}).get("pid")
        cpu = {
            "worker": cpu_seconds(worker_pid) if worker_pid else None,
            "sink_process": cpu_seconds(sink_pid) if sink_pid else None,
        }
    finally:
        stop_workers([running])
    if table != [n, n]:
        raise SystemExit(f"usage_events holds {table} (rows, distinct positions), not {n}")
    return {
        "sink_process": sink_process,
        "events": n,
        "publish_seconds": round(published, 3),
        "counted_seconds": round(counted, 3),
        "clickhouse_seconds": round(stored, 3),
        "clickhouse_over_counting": round(stored / counted, 3),
        "counting_events_per_s": round(n / counted),
        "end_to_end_rows_per_s": round(n / stored),
        "usage_events_rows": table[0],
        "sink_failures": final.get("sink_failures", 0),
        # CPU seconds since each process started (user + system): what the work cost,
        # whatever else the machine ran
        "cpu_seconds": cpu,
        # the sink stage's batches: how many, records in each and ms to store one (p50/p99/max)
        "sink_batches": final.get("sink_batches"),
        "sink_batch_records": final.get("sink_batch_records"),
        "sink_batch_ms": final.get("sink_batch_ms"),
        "samples": samples,
        # (seconds since the first write, events counted, rows stored), about once a second
        "timeline": timeline[:: max(1, int(1 / SAMPLE_SECONDS))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=("burst", "latency"))
    parser.add_argument(
        "--repeats", type=int, default=1, help="bursts per placement, alternated (median shown)"
    )
    parser.add_argument(
        "--sink",
        choices=("process", "worker", "both"),
        default="both",
        help="where the worker's sink runs: its own process, the worker's, or each in turn",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker: LocalKafka | None = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        security = load_settings().kafka_security if bootstrap else PLAINTEXT
        if not bootstrap:
            ensure_broker_jars()
            broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            result: dict[str, Any] = {"bench": "burst"}
            placements = {"process": (True,), "worker": (False,), "both": (True, False)}[args.sink]
            if args.only != "latency":
                runs: dict[bool, list[dict[str, Any]]] = {own: [] for own in placements}
                for n in range(args.repeats):  # alternated: the sink's own process, the worker's
                    for own in placements:
                        runs[own].append(
                            burst(
                                bootstrap,
                                args.events,
                                home / f"burst-{own}-{n}",
                                sink_process=own,
                                security=security,
                            )
                        )
                for own, done in runs.items():
                    key = "burst" if own else "burst_sink_in_worker"
                    # the run of the median ratio, and every run's ratio
                    ordered = sorted(done, key=lambda r: float(r["clickhouse_over_counting"]))
                    result[key] = ordered[len(ordered) // 2]
                    result[f"{key}_ratios"] = [r["clickhouse_over_counting"] for r in done]
            if args.only != "burst":
                kinds: dict[str, bool | None] = {
                    "sink_off": None,
                    "sink_on": True,
                    "sink_on_in_worker": False,
                }
                result["latency"] = {}
                for kind, in_process in kinds.items():
                    if in_process is not None and in_process not in placements:
                        continue
                    with sink_placement(in_process is not False):
                        result["latency"][kind] = latency(
                            bootstrap,
                            args.rate,
                            args.seconds,
                            home / f"latency-{kind}",
                            1,
                            security=security,
                            clickhouse_dsn=(
                                None
                                if in_process is None
                                else f"chdb://{home / f'latency-{kind}' / 'clickhouse'}"
                            ),
                        )
            result["cpus"] = os.cpu_count()
            result["load_avg_1m"] = round(os.getloadavg()[0], 2)
        finally:
            if broker is not None:
                broker.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
