"""Replay benchmark: rebuilding counters from usage.raw, with the progress display on.

On a fresh 4-partition usage.raw holding N pre-encoded UsageEvents (3 budgets),
measured side by side in one run:

1. the raw aiokafka consume rate of the topic (the floor every replay stands on);
2. the in-memory fold (`spendbus replay --dry-run`, `spendbus snapshot`) with the
   rich progress display rendering and without it (median of --repeats each,
   alternated);
3. a generation replay (`spendbus replay`): a real aggregator worker of a new
   generation started beside nothing else, from serving to caught up, watched
   through its consumer group's committed offsets, with the progress display on,
   then a second generation with it off, then a third with its ClickHouse sink on
   (an embedded store of its own; the sink in a process of its own,
   ``SPENDBUS_SINK_PROCESS=true``), until the sink stored every event, and a fourth with
   the sink in the worker's own process (as ``spendbus up`` runs it);
4. the live counting stage: a worker as ``spendbus up`` runs it (its sink in the worker's
   process, a store of its own), serving, gets the same number of events as a burst
   (bench/bench_burst.py's ``burst``): its counting rate is what issue 19's replay target
   is set against (a replay generation's time to a whole ClickHouse >= 0.8 of it), beside
   the stricter figure over the sink-off generation.

The display renders into a terminal-sized in-memory console (what it costs is
paid; stdout keeps only the JSON). Prints one JSON object. Uses KAFKA_BOOTSTRAP,
else starts a LocalKafka for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.benchkit`, also when run as a script

from aiokafka import AIOKafkaProducer  # noqa: E402
from rich.console import Console  # noqa: E402

from aggregator.replay.generations import group_progress  # noqa: E402
from aggregator.replay.run import StackPlace  # noqa: E402
from aggregator.replay.snapshots import fold_ledger, load_reference  # noqa: E402
from bench.bench_burst import burst, sink_placement  # noqa: E402
from bench.benchkit import apply_reference, events  # noqa: E402
from runtime.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from runtime.topic_reader import TopicReader  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from spendbus.commands.replay import Meter, generation_replay, progress_bar  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.broker_jars import ensure_broker_jars  # noqa: E402
from spendbus.stack.kafka import LocalKafka  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402


async def setup(
    bootstrap: str, topics: Topics, n: int, *, security: KafkaSecurity = PLAINTEXT
) -> None:
    await ensure_topics(bootstrap, topics, 4, security=security)
    await apply_reference(bootstrap, topics, security=security)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        **security.client_kwargs(),
    )
    await producer.start()
    try:
        futures = [await producer.send(topics.usage_raw, key=k, value=v) for k, v in events(n)]
        for f in futures:
            await f
    finally:
        await producer.stop()


async def raw_consume(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> float:
    read = 0
    async with TopicReader(
        bootstrap,
        topics.usage_raw,
        security=security,
        max_records=20_000,
        fetch_bytes=8 * 1024 * 1024,
    ) as reader:
        started = time.perf_counter()
        async for _, messages in reader:
            read += len(messages)
        return read / (time.perf_counter() - started)


def _screen() -> Console:
    """A terminal the display renders into (its cost is paid, stdout stays JSON)."""
    return Console(file=io.StringIO(), force_terminal=True, width=140)


def fold_rate(
    bootstrap: str, topics: Topics, display: bool, *, security: KafkaSecurity = PLAINTEXT
) -> float:
    async def run(progress: Any) -> tuple[int, float]:
        reference = await load_reference(bootstrap, topics, security=security)
        started = time.perf_counter()
        state = await fold_ledger(
            bootstrap, topics, reference, progress=progress, security=security
        )
        return state.stats.events, time.perf_counter() - started

    with progress_bar(disable=not display, on=_screen()) as bar:
        meter = Meter(bar, bar.add_task("folding", total=None, rate=0.0, lag=0))
        n, seconds = asyncio.run(run(meter if display else None))
    return n / seconds


def generation_rate(place: StackPlace, name: str, display: bool) -> dict[str, Any]:
    """A generation worker from process start to caught up. Its group's committed offsets
    are sampled from another thread from before the start, so the steady rate (10 % to
    90 % of the ledger committed) is measured even when the worker is fast. With a store
    (``place.dsn``) the run goes on until its sink stored every event, and
    ``to_clickhouse_events_per_s`` is the ledger over the time from serving to the last row
    stored: how fast a replay gives analysts a whole ClickHouse."""
    replay = generation_replay(place, name)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            progress = asyncio.run(
                group_progress(place.bootstrap, replay.topics, security=place.security)
            )
            samples.append((time.perf_counter(), progress.committed))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    stored_at = None
    try:
        replay.start()  # returns once the worker is serving
        serving_at = time.perf_counter()
        with progress_bar(disable=not display, on=_screen()) as bar:
            meter = Meter(bar, bar.add_task(name, total=None, rate=0.0, lag=0))
            reached = replay.wait_caught_up(meter if display else None, poll_seconds=0.25)
        counted_at = time.perf_counter()
        if place.dsn is not None:
            while True:
                stats = replay.worker.get("/stats")
                if stats["sink_rows"] + stats["sink_skipped"] >= reached.committed:
                    stored_at = time.perf_counter()
                    break
                time.sleep(0.05)
        wall = time.perf_counter() - started
    finally:
        done.set()
        sampler.join(30)
        replay.stop()
    total = reached.committed
    low = next(t for t, c in samples if c >= 0.1 * total)
    high = next((t for t, c in samples if c >= 0.9 * total), samples[-1][0])
    steady = (0.8 * total) / (high - low) if high > low else float("nan")
    out = {
        "events": total,
        "wall_seconds_with_startup": round(wall, 2),
        "events_per_s_with_startup": round(total / wall, 1),
        "steady_events_per_s": round(steady, 1),
        # serving to caught up: the counting stage's rate over the whole ledger (the steady
        # rate reads commits, a checkpoint apart: coarse when the ledger is folded quickly)
        "counted_events_per_s": round(total / max(counted_at - serving_at, 1e-9), 1),
    }
    if stored_at is not None:
        out["to_clickhouse_events_per_s"] = round(total / max(stored_at - serving_at, 1e-9), 1)
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each measure over the runs, plus every run's steady rate."""
    out: dict[str, Any] = {
        key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0] if key != "events"
    }
    out["events"] = runs[0]["events"]
    out["runs_steady_events_per_s"] = [r["steady_events_per_s"] for r in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="ledger of the in-memory fold")
    parser.add_argument(
        "--worker-events", type=int, default=200_000, help="ledger of the generation workers"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker-repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
        security = load_settings().kafka_security if bootstrap else PLAINTEXT
        if not bootstrap:
            ensure_broker_jars()
            broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            topics = Topics(f"benchreplay{uuid.uuid4().hex[:6]}.")
            asyncio.run(setup(bootstrap, topics, args.events, security=security))
            big = Topics(f"benchreplayw{uuid.uuid4().hex[:6]}.")
            asyncio.run(setup(bootstrap, big, args.worker_events, security=security))
            raw = [
                asyncio.run(raw_consume(bootstrap, topics, security=security))
                for _ in range(args.repeats)
            ]
            fold_on: list[float] = []
            fold_off: list[float] = []
            for _ in range(args.repeats):  # alternated, so drifting load hits both alike
                fold_on.append(fold_rate(bootstrap, topics, display=True, security=security))
                fold_off.append(fold_rate(bootstrap, topics, display=False, security=security))
            place = StackPlace(
                bootstrap=bootstrap, topics=big, dsn=None, home=home, security=security
            )
            # the same replay, its sink on: every generation gets a store of its own
            sinking = StackPlace(
                bootstrap=bootstrap,
                topics=big,
                dsn=f"chdb://{home / 'clickhouse'}",
                home=home,
                security=security,
            )
            # (place, progress display, the sink in a process of its own)
            kinds = {
                "off": (place, False, True),
                "on": (place, True, True),
                "sink": (sinking, False, True),
                "sinkw": (sinking, False, False),
            }
            worker_runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
            live: list[dict[str, Any]] = []
            for n in range(args.worker_repeats):  # alternated: off, on, sink, sinkw, live, off ..
                for kind, (where, display, sink_process) in kinds.items():
                    with sink_placement(sink_process):
                        worker_runs[kind].append(generation_rate(where, f"b{n}{kind}", display))
                live_home = home / f"live{n}"
                live_home.mkdir()
                live.append(
                    burst(
                        bootstrap,
                        args.worker_events,
                        live_home,
                        sink_process=False,
                        security=security,
                    )
                )
            live_rate = statistics.median(r["counting_events_per_s"] for r in live)
            on, off, sink, sink_in_worker = (
                _median_run(worker_runs[kind]) for kind in ("on", "off", "sink", "sinkw")
            )
            raw_median = statistics.median(raw)
            result = {
                "bench": "replay",
                "events": args.events,
                "worker_events": args.worker_events,
                "raw_consume_events_per_s": round(raw_median, 1),
                "fold_in_memory": {
                    "progress_on_events_per_s": round(statistics.median(fold_on), 1),
                    "progress_off_events_per_s": round(statistics.median(fold_off), 1),
                    "ratio_on_to_off": round(
                        statistics.median(fold_on) / statistics.median(fold_off), 3
                    ),
                    "ratio_on_to_raw": round(statistics.median(fold_on) / raw_median, 4),
                },
                "generation_worker": {
                    "progress_on": on,
                    "progress_off": off,
                    "ratio_on_to_off": round(
                        on["steady_events_per_s"] / off["steady_events_per_s"], 3
                    ),
                    "ratio_on_to_raw": round(on["steady_events_per_s"] / raw_median, 4),
                    "sink": False,
                },
                # the generation with its ClickHouse sink on (progress display off) beside
                # the counting stage alone (display off): issue 19's target is >= 0.8
                # the sink in a process of its own (SPENDBUS_SINK_PROCESS=true), then in the
                # generation worker's own process (as `spendbus up` runs it)
                **{
                    key: {
                        **runs,
                        "sink_process": key == "generation_worker_with_sink",
                        "counting_ratio_to_sink_off": round(
                            runs["steady_events_per_s"] / off["steady_events_per_s"], 3
                        ),
                        "to_clickhouse_ratio_to_sink_off": round(
                            runs["to_clickhouse_events_per_s"] / off["counted_events_per_s"], 3
                        ),
                        # issue 19's target: >= 0.8 of the live counting stage's rate
                        "to_clickhouse_ratio_to_live_counting": round(
                            runs["to_clickhouse_events_per_s"] / live_rate, 3
                        ),
                    }
                    for key, runs in (
                        ("generation_worker_with_sink", sink),
                        ("generation_worker_with_sink_in_worker", sink_in_worker),
                    )
                },
                # a serving worker as `spendbus up` runs it, the same events as a burst
                "live_counting": {
                    "counting_events_per_s": round(live_rate, 1),
                    "runs_counting_events_per_s": [r["counting_events_per_s"] for r in live],
                    "runs_clickhouse_over_counting": [r["clickhouse_over_counting"] for r in live],
                    "sink_process": False,
                },
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        finally:
            if broker is not None:
                broker.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
