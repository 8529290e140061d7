"""Overshoot: how far past one USD budget 50 concurrent streaming clients get, through
3 gateway replicas, with spendbus's reserve-and-settle enforcer beside a polling baseline.

Issue 8. One run, three phases on the same broker, aggregator worker and fake
provider, one after the other, each on its own org and budget (same cap):

* ``ours``: every replica is the reference gateway (``ingest.gateway``) with its
  own ``enforcer.Enforcer`` following budget.verdicts and its own publisher; an
  allowed request holds its worst-case estimate until its usage event settles it.
  Each enforcer is told how many replicas share the budget
  (``EnforcerConfig.replicas`` = ``--replicas``), so each commits at most 1/N of
  what the verdict leaves.
* ``baseline``: the same gateways and workload, the gate replaced by
  ``bench/overshoot_baseline.PollGate``: local spend flushed to a shared total
  every 5 s, ``cached total < cap`` checked, nothing held (the design docs/design.md's
  "Why it is built this way" criticises).

Clients (their own process, as real clients are; this one runs the gateways)
stream Anthropic Messages (``claude-sonnet-4-5``, ``max_tokens`` 1024, prompts of
1k-6k tokens drawn per request from a seed, the same in every phase) through the
replicas round-robin. A refused client retries after ``--refusal-pause-ms``
(ignoring Retry-After: the hard case). A phase ends when every replica has refused
``--stop-after-refusals`` requests in a row with no stream open and none allowed
for ``--quiet-s`` (an in-flight refusal lifts once holds settle), or after
``--max-seconds``. The fake provider (its own process) answers after
``--latency-ms`` and paces the stream's chunks ``--chunk-latency-ms`` apart.

Ground truth = the exact sum of the cost of every call the provider served: each
published usage event priced with the shipped price book as the aggregator does
(``PriceBook.price_event``). It is cross-checked with the aggregator's final
verdict for the budget's counter (read from budget.verdicts once the worker has
caught up) and with the provider's own token totals (``/stats``). Spend over time
is sampled every 100 ms; the chart (``bench/results/overshoot.png``) shows it
beside the cap and what the gates believed (the verdict's spend for ours, the
shared total for the baseline).

A scaling phase (``scaling``, issue 24): the enforcers count themselves (``membership``)
while the fleet scales ``--scaling`` (2,6,3) replicas, each change when the true spend
reaches the next ``--scale-at`` fraction of the cap (0.3, 0.6); the clients follow the live
replicas' list. It reports each step (when every live replica used the new count) and the
share of the headroom the counts left unused, 1 - sum(1/R_i) over the live replicas.
``--phases`` picks the phases to run.

A comparison phase (``comparisons.ours_unshared``, ``--no-unshared-comparison``
to skip) runs ours with ``replicas`` left at 1: holds are per process, so each of
the N replicas can fill the same headroom (what the enforcer did before the option).

Prints one JSON object and writes bench/results/overshoot.json. Uses
KAFKA_BOOTSTRAP, else starts a LocalKafka for the run.

    python bench/bench_overshoot.py [--clients 50] [--replicas 3] [--cap-usd 4]

This script runs the stack and the phases in order; the pieces: ``overshoot_setup``
(options, budgets, keys, the fake provider), ``overshoot_phases`` (each phase's
replicas), ``overshoot_clients`` (the clients' process), ``overshoot_ledger`` (the ground
truth as it happens), ``overshoot_report`` (the figures, the chart, the JSON) and
``overshoot_baseline`` (the polling gate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.benchkit import apply_reference  # noqa: E402
from bench.benchkit import worker as aggregator_worker  # noqa: E402
from bench.overshoot_phases import run_phase, run_scaling_phase  # noqa: E402
from bench.overshoot_report import draw_chart, result_of  # noqa: E402
from bench.overshoot_setup import RESULTS, Env, Options, budget_for, start_upstream  # noqa: E402
from runtime.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from schemas.pricing import PriceBook, default_price_file, load_price_file  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.broker_jars import ensure_broker_jars  # noqa: E402
from spendbus.stack.kafka import LocalKafka  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402

console = Console(stderr=True)


def run(
    opts: Options, bootstrap: str, home: Path, *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, Any]:
    """Both phases on ``bootstrap``; the result (without writing anything)."""
    run_id = uuid.uuid4().hex[:8]
    topics = Topics(f"benchovs{run_id}.")
    prices = PriceBook(load_price_file(default_price_file()))
    kinds: list[str] = [k for k in ("ours", "baseline") if k in opts.phases]
    if opts.unshared_comparison and "ours_unshared" in opts.phases:
        kinds.append("ours_unshared")
    if "scaling" in opts.phases:
        kinds.append("scaling")
    budgets = [budget_for(kind, run_id, opts.cap_usd) for kind in kinds]
    with console.status("topics, prices, budgets, aggregator worker, fake upstream..."):
        asyncio.run(ensure_topics(bootstrap, topics, 4, security=security))
        asyncio.run(apply_reference(bootstrap, topics, budgets, security=security))
        worker = aggregator_worker(bootstrap, topics, home / "worker")
        worker.start(timeout=180)
    upstream: subprocess.Popen[bytes] | None = None
    try:
        upstream, url = start_upstream(opts, home / "upstream")
        env = Env(bootstrap, topics, url, prices, home, run_id, security)
        phases: dict[str, Any] = {}
        for kind in kinds:
            with console.status(
                f"phase {kind}: {opts.clients} clients, {opts.replicas} replicas..."
            ):
                phase = (
                    run_scaling_phase(opts, env)
                    if kind == "scaling"
                    else run_phase(kind, opts, env)
                )
                phases[kind] = asyncio.run(phase)
            console.print(
                f"{kind}: spend ${phases[kind]['spend_usd']:.4f} of ${opts.cap_usd} "
                f"({phases[kind]['overshoot_pct']:+.2f}%), {phases[kind]['calls']} calls, "
                f"stopped by {phases[kind]['stopped_by']} at {phases[kind]['stopped_at_s']} s"
            )
    finally:
        if upstream is not None:
            upstream.terminate()
            try:
                upstream.wait(10)
            except subprocess.TimeoutExpired:
                upstream.kill()
        worker.stop()
    return result_of(opts, phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Options()
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--cap-usd", type=Decimal, default=defaults.cap_usd)
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    parser.add_argument("--stop-after-refusals", type=int, default=defaults.stop_after_refusals)
    parser.add_argument("--quiet-s", type=float, default=defaults.quiet_s)
    parser.add_argument("--refusal-pause-ms", type=float, default=defaults.refusal_pause_ms)
    parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms)
    parser.add_argument("--chunk-latency-ms", type=float, default=defaults.chunk_latency_ms)
    parser.add_argument("--flush-interval-s", type=float, default=defaults.flush_interval_s)
    parser.add_argument(
        "--unshared-comparison",
        action=argparse.BooleanOptionalAction,
        default=defaults.unshared_comparison,
        help="also run ours with replicas=1 (per-process holds, the enforcer before the option)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(defaults.phases),
        help="comma-separated phases to run: ours, baseline, ours_unshared, scaling",
    )
    parser.add_argument(
        "--scaling",
        default=",".join(str(n) for n in defaults.scaling),
        help="scaling phase: the live replica counts in order (2,6,3)",
    )
    parser.add_argument(
        "--scale-at",
        default=",".join(str(f) for f in defaults.scale_at),
        help="scaling phase: the spend fractions of the cap each change happens at",
    )
    parser.add_argument("--max-replicas", type=int, default=defaults.max_replicas)
    parser.add_argument("--membership-grace-s", type=float, default=defaults.membership_grace_s)
    parser.add_argument("--chart", type=Path, default=RESULTS / "overshoot.png")
    parser.add_argument("--out", type=Path, default=RESULTS / "overshoot.json")
    args = parser.parse_args()
    opts = Options(
        clients=args.clients,
        replicas=args.replicas,
        cap_usd=args.cap_usd,
        max_seconds=args.max_seconds,
        stop_after_refusals=args.stop_after_refusals,
        refusal_pause_ms=args.refusal_pause_ms,
        quiet_s=args.quiet_s,
        latency_ms=args.latency_ms,
        chunk_latency_ms=args.chunk_latency_ms,
        flush_interval_s=args.flush_interval_s,
        unshared_comparison=args.unshared_comparison,
        phases=tuple(p.strip() for p in args.phases.split(",") if p.strip()),
        scaling=tuple(int(n) for n in args.scaling.split(",")),
        scale_at=tuple(float(f) for f in args.scale_at.split(",")),
        max_replicas=args.max_replicas,
        membership_grace_s=args.membership_grace_s,
    )
    unknown = set(opts.phases) - {"ours", "baseline", "ours_unshared", "scaling"}
    if unknown or len(opts.scale_at) != len(opts.scaling) - 1:
        parser.error(f"unknown phases {sorted(unknown)} or one --scale-at per change needed")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
        security = load_settings().kafka_security if bootstrap else PLAINTEXT
        if not bootstrap:
            ensure_broker_jars()
            with console.status("starting a local Kafka broker..."):
                broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            result = run(opts, bootstrap, home, security=security)
        finally:
            if broker is not None:
                broker.stop()
    result["chart"] = (
        str(args.chart.resolve().relative_to(ROOT))
        if args.chart.resolve().is_relative_to(ROOT)
        else str(args.chart)
    )
    draw_chart(result, args.chart)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
