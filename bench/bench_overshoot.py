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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402
from rich.console import Console  # noqa: E402

from bench.benchkit import apply_reference, pct  # noqa: E402
from bench.benchkit import worker as aggregator_worker  # noqa: E402
from bench.overshoot_baseline import PollGate, SharedTotal  # noqa: E402
from enforcer import Enforcer, EnforcerConfig  # noqa: E402
from ingest.gateway import Gateway, GatewayServer, parse_config  # noqa: E402
from ingest.publisher import PublisherConfig, UsagePublisher  # noqa: E402
from schemas.budgets import Budget, budgets_from_yaml  # noqa: E402
from schemas.codec import VERDICT  # noqa: E402
from schemas.ids import counter_key, decompose  # noqa: E402
from schemas.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from schemas.pricing import PriceBook, default_price_file, load_price_file  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from schemas.usage import TOKEN_FIELDS  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.kafka import LocalKafka, ensure_broker_jars, free_port  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402

NANOS = 1_000_000_000
MODEL = "claude-sonnet-4-5"
#: prompt text is cut from this (the fake provider bills about 4 characters per token)
PROSE = (
    "Summarise the retention policy of usage.raw for the finance team, list the budgets "
    "that crossed their alert thresholds last week and explain each refusal. "
)
SECRET = "sk-overshoot"
RESULTS = ROOT / "bench" / "results"
console = Console(stderr=True)


@dataclass(frozen=True)
class Options:
    clients: int = 50
    replicas: int = 3
    cap_usd: Decimal = Decimal("4")
    max_seconds: float = 45.0
    stop_after_refusals: int = 10
    refusal_pause_ms: float = 100.0
    #: refusals stop the run only after this long without an allowed request or open stream
    quiet_s: float = 3.0
    latency_ms: float = 250.0
    chunk_latency_ms: float = 6.0
    max_tokens: int = 1024
    #: prompt size range (tokens) drawn per request: calls cost from ~1 to ~3 cents
    prompt_tokens: tuple[int, int] = (1_000, 6_000)
    flush_interval_s: float = 5.0
    sample_ms: float = 100.0
    seed: int = 7
    #: also run ``ours_unshared``: every enforcer with replicas=1 (per-process holds only)
    unshared_comparison: bool = True
    #: the phases to run (``ours`` and ``baseline`` always side by side when both are named)
    phases: tuple[str, ...] = ("ours", "baseline", "ours_unshared", "scaling")
    #: ``scaling``: the live replica counts, in order, each change when the true spend
    #: reaches the next fraction of the cap (the enforcers count themselves: membership)
    scaling: tuple[int, ...] = (2, 6, 3)
    scale_at: tuple[float, ...] = (0.3, 0.6)
    #: ``scaling``: the enforcers' max_replicas and membership grace
    max_replicas: int = 8
    membership_grace_s: float = 5.0

    @property
    def cap_nanos(self) -> int:
        return int(self.cap_usd * NANOS)


# -- what happened, as it happened ---------------------------------------------------------------
@dataclass
class Ledger:
    """Every served call's cost as its usage event is published (the ground truth)."""

    prices: PriceBook
    started: float = field(default_factory=time.monotonic)
    nanos: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    #: per served call: (seconds since start it was admitted, ... it ended, cost nanos)
    calls: list[tuple[float, float, int]] = field(default_factory=list)
    #: cumulative spend after each call, and when (for "when was the cap crossed")
    cumulative: list[tuple[float, int]] = field(default_factory=list)
    refusal_events: int = 0
    estimated: int = 0

    def record(self, event: Mapping[str, Any]) -> None:
        if event["outcome"] not in ("allowed", "failed_open"):
            self.refusal_events += 1
            return
        now = time.monotonic() - self.started
        cost = self.prices.price_event(event).cost_nanos
        self.nanos += cost
        for name in TOKEN_FIELDS:
            self.tokens[name] += event[name]
        if event["usage_source"] != "reported":
            self.estimated += 1
        latency = (event.get("latency_ms") or 0) / 1000
        self.calls.append((max(0.0, now - latency), now, cost))
        self.cumulative.append((now, self.nanos))


class RecordingSink:
    """The replica's publisher, plus the ledger entry of each event (``UsageSink``)."""

    def __init__(self, publisher: UsagePublisher, ledger: Ledger) -> None:
        self.publisher = publisher
        self.ledger = ledger

    async def publish(self, event: dict[str, Any]) -> None:
        self.ledger.record(event)
        await self.publisher.publish(event)


class EstimateProbe:
    """The enforcer as the gateway's gate, noting each hold's estimate beside the actual cost."""

    def __init__(self, enforcer: Enforcer, prices: PriceBook) -> None:
        self.enforcer = enforcer
        self.prices = prices
        self.pairs: list[tuple[int, int]] = []
        self.decisions: dict[str, int] = {}

    def context(self, **fields: Any) -> Any:
        return self.enforcer.context(**fields)

    def check(self, ctx: Any, *, reserve: bool = True) -> Any:
        decision = self.enforcer.check(ctx, reserve=reserve)
        self.decisions[decision.decision] = self.decisions.get(decision.decision, 0) + 1
        return decision

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool:
        hold = self.enforcer.holds.get(hold_id) if hold_id is not None else None
        if hold is not None and hold.occurred_us is None:
            self.pairs.append((hold.nanos, self.prices.price_event(event).cost_nanos))
        return self.enforcer.settle(hold_id, event)

    def release(self, hold_id: int | None) -> bool:
        return self.enforcer.release(hold_id)


@dataclass
class Env:
    bootstrap: str
    topics: Topics
    upstream_url: str
    prices: PriceBook
    home: Path
    run_id: str
    security: KafkaSecurity = PLAINTEXT


def budget_for(kind: str, run_id: str, cap_usd: Decimal) -> Budget:
    [budget] = budgets_from_yaml(
        [
            {
                "id": f"cap-{kind}-{run_id}",
                "scope": "org",
                "match": {"org_id": org_for(kind, run_id)},
                "window": "total",
                "limit_usd": str(cap_usd),
                "action": "enforce",
            }
        ]
    )
    return budget


def org_for(kind: str, run_id: str) -> str:
    return f"ovs-{kind}-{run_id}"


def virtual_key(kind: str, run_id: str) -> str:
    return f"vk-overshoot-{kind}-{run_id}-0123456789"


def gateway_config(env: Env, kind: str, replica: int) -> Any:
    return parse_config(
        {
            "gateway_id": f"ovs-{kind}-r{replica}",
            "upstreams": {"anthropic": {"api": "anthropic", "base_url": env.upstream_url}},
            "secrets": {SECRET: {"upstream": "anthropic", "api_key": "fake-provider-credential"}},
            "keys": [
                {
                    "name": f"overshoot-{kind}",
                    "key": virtual_key(kind, env.run_id),
                    "principal": {
                        "org_id": org_for(kind, env.run_id),
                        "secret_id": SECRET,
                        "user_id": "bench@example.com",
                    },
                }
            ],
        },
        "bench_overshoot",
    )


# -- one phase ------------------------------------------------------------------------------------
async def run_phase(kind: str, opts: Options, env: Env) -> dict[str, Any]:
    """Start the replicas (``ours`` or ``baseline``), run the clients until every replica
    refuses, then measure what was spent."""
    budget = budget_for(kind, env.run_id, opts.cap_usd)
    key = counter_key(budget.budget_id, [org_for(kind, env.run_id)])
    await asyncio.to_thread(_upstream_stats, env.upstream_url, "DELETE")
    ledger = Ledger(env.prices)
    publishers: list[UsagePublisher] = []
    enforcers: list[Enforcer] = []
    probes: list[EstimateProbe] = []
    polls: list[PollGate] = []
    shared = SharedTotal()
    servers: list[GatewayServer] = []
    verdict_seen: list[tuple[float, int]] = []  # (t, spent) as replica 0's enforcer saw them
    verdict_lag_ms: list[float] = []
    try:
        for replica in range(opts.replicas):
            publisher = UsagePublisher(
                PublisherConfig(
                    bootstrap=env.bootstrap,
                    kafka_security=env.security,
                    topic_prefix=env.topics.prefix,
                    spool_dir=env.home / kind / f"spool{replica}",
                    client_id=f"ovs-{kind}-r{replica}",
                )
            )
            await publisher.start()
            publishers.append(publisher)
            gate: Any
            if kind.startswith("ours"):
                enforcer = Enforcer(
                    EnforcerConfig(
                        bootstrap=env.bootstrap,
                        kafka_security=env.security,
                        topic_prefix=env.topics.prefix,
                        gateway_id=f"ovs-{kind}-r{replica}",
                        client_id=f"ovs-enforcer-r{replica}",
                        # ours: every replica knows the budget is shared by opts.replicas
                        replicas=opts.replicas if kind == "ours" else 1,
                    )
                )
                await enforcer.start()
                await enforcer.wait_ready(60)
                enforcers.append(enforcer)
                _listen(
                    enforcer, key, ledger, verdict_seen if replica == 0 else None, verdict_lag_ms
                )
                gate = EstimateProbe(enforcer, env.prices)
                probes.append(gate)
            else:
                gate = PollGate(
                    shared,
                    env.prices,
                    budget.budget_id,
                    opts.cap_nanos,
                    flush_interval_s=opts.flush_interval_s,
                    first_flush_s=opts.flush_interval_s * (replica + 1) / opts.replicas,
                )
                polls.append(gate)
            config = gateway_config(env, kind, replica)
            gateway = Gateway(
                config, gate, RecordingSink(publisher, ledger), credentials=config.credentials({})
            )
            server = GatewayServer(gateway)
            await server.start()
            servers.append(server)
        for poll in polls:
            await poll.start()
        ledger.started = time.monotonic()
        load = await drive(
            opts,
            [s.url for s in servers],
            virtual_key(kind, env.run_id),
            ledger,
            lambda: (
                verdict_seen[-1][1] if verdict_seen else shared.nanos,
                sum(e.holds.held_nanos for e in enforcers) + sum(p.local_nanos for p in polls),
            ),
        )
    finally:
        for server in servers:
            await server.stop()  # finishes the accounting of responses in flight
        for poll in polls:
            await poll.stop()
        for publisher in publishers:
            with contextlib.suppress(Exception):
                await publisher.flush(30)
            await publisher.stop()
        for enforcer in enforcers:
            await enforcer.stop()
    verdict = await final_verdict(
        env.bootstrap, env.topics, key, ledger.nanos, timeout=30, security=env.security
    )
    upstream = await asyncio.to_thread(_upstream_stats, env.upstream_url, "GET")
    enforcer_replicas = {"ours": opts.replicas, "ours_unshared": 1}.get(kind)
    return summarise(
        kind,
        opts,
        ledger,
        load,
        verdict,
        upstream,
        probes,
        polls,
        verdict_lag_ms,
        enforcer_replicas,
    )


@dataclass
class Replica:
    """One gateway replica of the scaling phase: its publisher, enforcer (membership) and
    server."""

    number: int
    publisher: UsagePublisher
    enforcer: Enforcer
    probe: EstimateProbe
    server: GatewayServer


async def start_replica(kind: str, number: int, opts: Options, env: Env, ledger: Ledger) -> Replica:
    publisher = UsagePublisher(
        PublisherConfig(
            bootstrap=env.bootstrap,
            kafka_security=env.security,
            topic_prefix=env.topics.prefix,
            spool_dir=env.home / kind / f"spool{number}",
            client_id=f"ovs-{kind}-r{number}",
        )
    )
    await publisher.start()
    enforcer = Enforcer(
        EnforcerConfig(
            bootstrap=env.bootstrap,
            kafka_security=env.security,
            topic_prefix=env.topics.prefix,
            gateway_id=f"ovs-{kind}-r{number}",
            client_id=f"ovs-{kind}-enforcer-r{number}",
            # the replicas count themselves: no replicas setting
            membership=True,
            max_replicas=opts.max_replicas,
            membership_grace_s=opts.membership_grace_s,
        )
    )
    await enforcer.start()
    await enforcer.wait_ready(60)
    probe = EstimateProbe(enforcer, env.prices)
    config = gateway_config(env, kind, number)
    gateway = Gateway(
        config, probe, RecordingSink(publisher, ledger), credentials=config.credentials({})
    )
    server = GatewayServer(gateway)
    await server.start()
    return Replica(number, publisher, enforcer, probe, server)


async def stop_replica(replica: Replica) -> None:
    """A pod scaled down: no new requests reach it (the caller took it out of the live
    list), the responses in flight finish and are published, then its enforcer leaves."""
    await replica.server.stop()
    with contextlib.suppress(Exception):
        await replica.publisher.flush(30)
    await replica.publisher.stop()
    await replica.enforcer.stop()


async def run_scaling_phase(opts: Options, env: Env) -> dict[str, Any]:
    """``scaling``: the replicas count themselves (membership) while the fleet scales
    ``opts.scaling`` (2 -> 6 -> 3) under the clients, each change when the true spend
    reaches the next ``opts.scale_at`` fraction of the cap."""
    kind = "scaling"
    budget = budget_for(kind, env.run_id, opts.cap_usd)
    key = counter_key(budget.budget_id, [org_for(kind, env.run_id)])
    await asyncio.to_thread(_upstream_stats, env.upstream_url, "DELETE")
    ledger = Ledger(env.prices)
    live: list[Replica] = []
    ever: list[Replica] = []
    urls_file = env.home / kind / "urls.json"
    urls_file.parent.mkdir(parents=True, exist_ok=True)
    verdict_seen: list[tuple[float, int]] = []
    verdict_lag_ms: list[float] = []
    #: per sample: (t, live replicas, [count each live enforcer's share uses], [group count])
    shares: list[tuple[float, int, list[int], list[int | None]]] = []
    #: each scaling step: when, from, to, and when every live replica used the new count
    steps: list[dict[str, Any]] = []
    numbers = iter(range(1000))
    started = [time.monotonic()]

    async def scale_to(target: int) -> None:
        t = time.monotonic() - ledger.started
        step: dict[str, Any] = {"at_s": round(t, 2), "from": len(live), "to": target}
        steps.append(step)
        if target > len(live):
            new = await asyncio.gather(
                *[
                    start_replica(kind, next(numbers), opts, env, ledger)
                    for _ in range(target - len(live))
                ]
            )
            live.extend(new)
            ever.extend(new)
            write_urls(urls_file, [r.server.url for r in live])
        else:
            leaving = live[target:]
            del live[target:]
            write_urls(urls_file, [r.server.url for r in live])
            await asyncio.sleep(0.3)  # the clients' next requests go to the others
            await asyncio.gather(*[stop_replica(r) for r in leaving])
        step["done_s"] = round(time.monotonic() - ledger.started, 2)

    pending = list(zip(opts.scale_at, opts.scaling[1:], strict=True))
    scaling_tasks: list[asyncio.Task[None]] = []

    def on_sample(t: float) -> None:
        if shares and t < shares[-1][0]:  # the clients started: drive restarts the clock
            shares.clear()
        effective = [r.enforcer.checker.replicas for r in live]
        counted = [r.enforcer.membership.count if r.enforcer.membership else None for r in live]
        shares.append((t, len(live), effective, counted))
        for step in steps:
            if len(counted) != step["to"]:
                continue  # the fleet is still changing
            # when every live replica was told the new count by the group, and when every
            # one used it (after the grace periods)
            if "group_count_everywhere_s" not in step and all(c == step["to"] for c in counted):
                step["group_count_everywhere_s"] = round(t - step["at_s"], 2)
            if "count_used_everywhere_s" not in step and all(e == step["to"] for e in effective):
                step["count_used_everywhere_s"] = round(t - step["at_s"], 2)
        if (
            pending
            and ledger.nanos >= pending[0][0] * opts.cap_nanos
            and (not scaling_tasks or scaling_tasks[-1].done())
        ):
            _, target = pending.pop(0)
            scaling_tasks.append(asyncio.create_task(scale_to(target)))

    try:
        first = await asyncio.gather(
            *[start_replica(kind, next(numbers), opts, env, ledger) for _ in range(opts.scaling[0])]
        )
        live.extend(first)
        ever.extend(first)
        _listen(first[0].enforcer, key, ledger, verdict_seen, verdict_lag_ms)
        write_urls(urls_file, [r.server.url for r in live])
        # steady state before the clients: every replica knows the count, graces over
        await asyncio.sleep(opts.membership_grace_s + 0.5)
        started[0] = time.monotonic()
        load = await drive(
            opts,
            [r.server.url for r in live],
            virtual_key(kind, env.run_id),
            ledger,
            lambda: (
                verdict_seen[-1][1] if verdict_seen else 0,
                sum(r.enforcer.holds.held_nanos for r in live),
            ),
            urls_file=urls_file,
            on_sample=on_sample,
        )
        for task in scaling_tasks:
            await task
    finally:
        for task in scaling_tasks:
            if not task.done():
                task.cancel()
        for replica in live:
            await stop_replica(replica)
    verdict = await final_verdict(
        env.bootstrap, env.topics, key, ledger.nanos, timeout=30, security=env.security
    )
    upstream = await asyncio.to_thread(_upstream_stats, env.upstream_url, "GET")
    out = summarise(
        "ours_scaling",
        opts,
        ledger,
        load,
        verdict,
        upstream,
        [r.probe for r in ever],
        [],
        verdict_lag_ms,
        None,
    )
    out["enforcer_replicas"] = "membership"
    out["scaling_plan"] = {
        "replicas": list(opts.scaling),
        "at_spend_fraction": list(opts.scale_at),
        "max_replicas": opts.max_replicas,
        "membership_grace_s": opts.membership_grace_s,
    }
    out["scaling_steps"] = steps
    out["scaling_steps_not_reached"] = [{"at_spend_fraction": f, "to": n} for f, n in pending]
    out["headroom_unused_because_of_the_count"] = unused_by_count(shares)
    out["shares_timeline_columns"] = ["seconds", "live", "count_used_each", "group_count_each"]
    out["shares_timeline"] = [[round(t, 2), n, e, c] for t, n, e, c in shares]
    return out


def unused_by_count(shares: list[tuple[float, int, list[int], list[int | None]]]) -> dict[str, Any]:
    """The share of the headroom no replica may commit because of the counts in use: each
    of the live replicas may hold 1/R_i of it, so 1 - sum(1/R_i) of it stays unused
    (0 when every replica uses the live count; negative would be over-admission)."""
    if not shares:
        return {}
    rows = [(t, 1 - sum(1 / r for r in used)) for t, _, used, _ in shares if used]
    over = [u for _, u in rows if u < -1e-9]
    weighted = 0.0
    for (t0, u0), (t1, _) in itertools.pairwise(rows):
        weighted += max(u0, 0.0) * (t1 - t0)
    span = rows[-1][0] - rows[0][0] if len(rows) > 1 else 0.0
    return {
        "max_share": round(max(u for _, u in rows), 4),
        "time_weighted_share": round(weighted / span, 4) if span else None,
        "at_the_end_share": round(rows[-1][1], 4),
        "samples_over_admitting": len(over),
        "most_over_admitted_share": round(-min(over), 4) if over else 0.0,
    }


def _listen(
    enforcer: Enforcer,
    key: str,
    ledger: Ledger,
    seen: list[tuple[float, int]] | None,
    lag_ms: list[float],
) -> None:
    """Note when this enforcer receives the budget's verdicts, and how old their news is."""
    cid = tuple(decompose(key))

    def on_verdict(counter: tuple[str, ...], period: str, as_of_us: int, seq: int) -> None:
        if counter != cid:
            return
        lag_ms.append((time.time() - as_of_us / 1e6) * 1000)
        if seen is not None:
            spent = enforcer.state.verdicts[counter].spent_nanos
            seen.append((time.monotonic() - ledger.started, spent))

    enforcer.state.on_verdict(on_verdict)


async def drive(
    opts: Options,
    urls: list[str],
    key: str,
    ledger: Ledger,
    gate_view: Any,
    *,
    urls_file: Path | None = None,
    on_sample: Any = None,
) -> dict[str, Any]:
    """Run the clients (:func:`clients`, in their own process, as real clients would be:
    this one runs the gateways and enforcers) and sample spend every ``sample_ms``
    (``on_sample(t)`` after each sample: the scaling phase scales from there)."""
    #: (t, true spend, what the gates saw spent, held (ours) or not yet flushed (baseline))
    samples: list[tuple[float, int, int, int]] = []
    loop_lag_ms: list[float] = []

    async def sampler() -> None:
        while True:
            t = time.monotonic() - ledger.started
            view, held = gate_view()
            samples.append((t, ledger.nanos, view, held))
            if on_sample is not None:
                on_sample(t)
            asked = opts.sample_ms / 1000
            before = time.monotonic()
            await asyncio.sleep(asked)
            # how late this process's event loop wakes up (it runs the gateways and enforcers)
            loop_lag_ms.append((time.monotonic() - before - asked) * 1000)

    sampling = asyncio.create_task(sampler())
    spec = {
        "opts": {**opts.__dict__, "cap_usd": str(opts.cap_usd)},
        "urls": urls,
        "key": key,
        "urls_file": None if urls_file is None else str(urls_file),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        "clients",
        "--spec",
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdout is not None and process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())
    # the clients' first line says they start: the phase's clock starts there too
    first = await process.stdout.readline()
    if first.strip():
        ledger.started = time.monotonic()
        samples.clear()
    out = await process.stdout.read()
    await process.wait()
    err = await errors
    await asyncio.sleep(0.3)  # the last usage events are published after the client's last byte
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    if process.returncode != 0:
        raise RuntimeError(f"the clients' process failed:\n{err.decode(errors='replace')[-3000:]}")
    load: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return {**load, "samples": samples, "loop_lag_ms": loop_lag_ms}


class LiveUrls:
    """The replicas' URLs, re-read from a file the bench rewrites as it scales (as a
    client behind a load balancer only reaches the pods that are live)."""

    def __init__(self, urls: list[str], path: str | None) -> None:
        self.path = Path(path) if path else None
        self.urls = urls
        self._mtime = -1.0

    def current(self) -> list[str]:
        if self.path is not None:
            mtime = self.path.stat().st_mtime
            if mtime != self._mtime:
                self._mtime = mtime
                self.urls = json.loads(self.path.read_text())
        return self.urls


def write_urls(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(urls))
    tmp.replace(path)  # atomic: a client never reads half a list


async def clients(
    opts: Options, urls: list[str], key: str, urls_file: str | None = None
) -> dict[str, Any]:
    """``opts.clients`` streaming clients, round-robin over ``urls`` (or the live list in
    ``urls_file``), until every live replica refused ``stop_after_refusals`` in a row or
    ``max_seconds`` passed."""
    live = LiveUrls(urls, urls_file)

    def body(rng: random.Random) -> bytes:
        chars = rng.randint(*opts.prompt_tokens) * 4
        prompt = (PROSE * (chars // len(PROSE) + 1))[:chars]
        return json.dumps(
            {
                "model": MODEL,
                "max_tokens": opts.max_tokens,
                "stream": True,
                "messages": [{"role": "user", "content": prompt}],
            }
        ).encode()

    headers = {
        "x-api-key": key,
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    stop = asyncio.Event()
    in_row: dict[str, int] = {}
    turn = iter(range(10**12))
    counts = {"calls": 0, "refusals": 0, "errors": 0}
    statuses: dict[str, int] = {}
    streaming = 0
    last_allowed = time.monotonic()

    def spent() -> bool:
        """Every replica refuses, and goes on refusing with nothing left to settle: an
        in-flight refusal lifts once holds settle and the verdict catches up, so refusals
        only count once no stream is open and none was allowed for ``quiet_s``."""
        return (
            min(in_row.get(url, 0) for url in live.current()) >= opts.stop_after_refusals
            and streaming == 0
            and time.monotonic() - last_allowed >= opts.quiet_s
        )

    async def client(session: aiohttp.ClientSession, number: int) -> None:
        nonlocal streaming, last_allowed
        rng = random.Random(opts.seed * 1_000_003 + number)  # the same workload in every phase
        while not stop.is_set():
            targets = live.current()
            replica = targets[next(turn) % len(targets)]
            try:
                response = await session.post(
                    replica + "/v1/messages", data=body(rng), headers=headers
                )
            except aiohttp.ClientConnectionError:  # a replica scaled down under us
                counts["errors"] += 1
                await asyncio.sleep(opts.refusal_pause_ms / 1000)
                continue
            async with response:
                statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
                if response.status == 200:
                    streaming += 1
                    last_allowed = time.monotonic()
                    in_row[replica] = 0
                    try:
                        async for _ in response.content.iter_any():
                            pass
                    except aiohttp.ClientError:  # cut by a replica scaling down
                        counts["errors"] += 1
                        continue
                    finally:
                        streaming -= 1
                    counts["calls"] += 1
                    continue
                await response.read()
                if response.status in (402, 429):
                    counts["refusals"] += 1
                    in_row[replica] = in_row.get(replica, 0) + 1
                    if spent():
                        stop.set()
                else:
                    counts["errors"] += 1
            await asyncio.sleep(opts.refusal_pause_ms / 1000)

    print(json.dumps({"started": True}), flush=True)
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session, n)) for n in range(opts.clients)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.max_seconds)
        stopped_by = "refusals" if stop.is_set() else "time"
        stopped_at = time.monotonic() - started
        stop.set()
        await asyncio.gather(*tasks)
    return {
        **counts,
        "statuses": statuses,
        "stopped_by": stopped_by,
        "stopped_at_s": round(stopped_at, 2),
    }


async def final_verdict(
    bootstrap: str,
    topics: Topics,
    key: str,
    expect: int,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any] | None:
    """The counter's newest verdict once it reaches ``expect`` (the worker caught up), else
    the newest seen within ``timeout``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **security.client_kwargs()
    )
    await consumer.start()
    newest: dict[str, Any] | None = None
    try:
        # the consumer's own cluster view only knows assigned topics: ask for all
        cluster = await consumer._client.fetch_all_metadata()
        partitions = [
            TopicPartition(topics.budget_verdicts, p)
            for p in sorted(cluster.partitions_for_topic(topics.budget_verdicts) or ())
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        wanted = key.encode()
        while time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                for message in messages:
                    if message.key != wanted or message.value is None:
                        continue
                    verdict = VERDICT.decode(message.value)
                    if newest is None or verdict["seq"] > newest["seq"]:
                        newest = verdict
            if newest is not None and newest["spent_nanos"] >= expect:
                break
    finally:
        await consumer.stop()
    return newest


def _upstream_stats(url: str, method: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/stats", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
    return json.loads(text) if text.strip() else {}


# -- figures --------------------------------------------------------------------------------------
def summarise(
    kind: str,
    opts: Options,
    ledger: Ledger,
    load: dict[str, Any],
    verdict: dict[str, Any] | None,
    upstream: dict[str, Any],
    probes: list[EstimateProbe],
    polls: list[PollGate],
    verdict_lag_ms: list[float],
    enforcer_replicas: int | None = None,
) -> dict[str, Any]:
    cap = opts.cap_nanos
    spend = ledger.nanos
    crossed = next((t for t, total in ledger.cumulative if total >= cap), None)
    # what the gates knew just before the true spend reached the cap
    before = [row for row in load["samples"] if crossed is None or row[0] <= crossed]
    _, _, view_at_cap, held_at_cap = before[-1] if before else (0, 0, 0, 0)
    if crossed is None:
        in_flight_at_cap = admitted_after_cap = []
    else:
        in_flight_at_cap = [c for c in ledger.calls if c[0] < crossed <= c[1]]
        admitted_after_cap = [c for c in ledger.calls if c[0] >= crossed]
    served_tokens = {name: ledger.tokens[name] for name in TOKEN_FIELDS}
    upstream_tokens = upstream.get("usage", {})
    costs = [c[2] for c in ledger.calls]
    out: dict[str, Any] = {
        "spend_usd": spend / NANOS,
        "overshoot_usd": (spend - cap) / NANOS,
        "overshoot_pct": round((spend - cap) / cap * 100, 3),
        "calls": load["calls"],
        "refusals": load["refusals"],
        "errors": load["errors"],
        "statuses": load["statuses"],
        "stopped_by": load["stopped_by"],
        "stopped_at_s": load["stopped_at_s"],
        "seconds_to_cap": None if crossed is None else round(crossed, 2),
        "cost_per_call_usd_median": statistics.median(costs) / NANOS if costs else None,
        "spend_rate_usd_per_s": (
            round(spend / NANOS / ledger.cumulative[-1][0], 4) if ledger.cumulative else None
        ),
        "where_the_overshoot_comes_from": {
            # calls already streaming when the true spend reached the cap, and their cost
            "in_flight_at_cap_calls": len(in_flight_at_cap),
            "in_flight_at_cap_cost_usd": sum(c[2] for c in in_flight_at_cap) / NANOS,
            # calls a gate let through after that moment (what a gate could have refused)
            "admitted_after_cap_calls": len(admitted_after_cap),
            "admitted_after_cap_cost_usd": sum(c[2] for c in admitted_after_cap) / NANOS,
            # the last sample before the cap was reached: the spend the gates saw, and what
            # they held (ours, all replicas) or had not flushed yet (baseline)
            "gate_view_before_cap_usd": view_at_cap / NANOS,
            "held_or_unflushed_before_cap_usd": held_at_cap / NANOS,
        },
        "ground_truth": {
            "verdict_spend_usd": None if verdict is None else verdict["spent_nanos"] / NANOS,
            "verdict_state": None if verdict is None else verdict["state"],
            "verdict_equals_ground_truth": verdict is not None and verdict["spent_nanos"] == spend,
            "upstream_requests": upstream.get("requests"),
            "upstream_tokens_equal_metered": all(
                upstream_tokens.get(name) == served_tokens[name] for name in TOKEN_FIELDS
            ),
            "estimated_events": ledger.estimated,
        },
        "event_loop_lag_ms": {
            "p50": round(pct(load["loop_lag_ms"], 0.5), 1),
            "p99": round(pct(load["loop_lag_ms"], 0.99), 1),
        },
        "timeline_columns": [
            "seconds",
            "true_spend_usd",
            "gate_view_usd",
            "held_usd" if kind.startswith("ours") else "unflushed_usd",
            "in_flight",
        ],
        "timeline": [
            [
                round(t, 2),
                total / NANOS,
                view / NANOS,
                held / NANOS,
                sum(1 for start, end, _ in ledger.calls if start <= t < end),
            ]
            for t, total, view, held in load["samples"]
        ],
    }
    if kind.startswith("ours"):
        ratios = [est / actual for est, actual in (p for g in probes for p in g.pairs) if actual]
        decisions: dict[str, int] = {}
        for probe in probes:
            for name, n in probe.decisions.items():
                decisions[name] = decisions.get(name, 0) + n
        out["enforcer_replicas"] = enforcer_replicas
        out["decisions"] = decisions
        out["hold_estimate_to_actual_cost"] = {
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "min": round(min(ratios), 3) if ratios else None,
        }
        out["verdict_lag_ms"] = {
            "p50": round(pct(verdict_lag_ms, 0.5), 1) if verdict_lag_ms else None,
            "p99": round(pct(verdict_lag_ms, 0.99), 1) if verdict_lag_ms else None,
            "verdicts": len(verdict_lag_ms),
        }
    else:
        out["flush_interval_s"] = opts.flush_interval_s
        out["flushes"] = polls[0].shared.flushes if polls else 0
    return out


def draw_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = result["cap_usd"]
    panels = []
    if result.get("ours"):
        panels.append(("ours", f"spendbus: reserve-and-settle, replicas={result['replicas']}"))
    if result.get("baseline"):
        every = result["baseline"]["flush_interval_s"]
        panels.append(("baseline", f"baseline: flush + poll every {every:g} s"))
    if "ours_unshared" in result.get("comparisons", {}):
        panels.append(("ours_unshared", "spendbus, replicas=1: per-process holds only"))
    if result.get("scaling"):
        plan = "→".join(str(n) for n in result["scaling"]["scaling_plan"]["replicas"])
        panels.append(("scaling", f"spendbus, membership: replicas {plan}"))
    if not panels:
        return
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 4.5), sharey=True, squeeze=False
    )
    for ax, (kind, title) in zip(axes[0], panels, strict=True):
        phase = result[kind] if kind in result else result["comparisons"][kind]
        t = [row[0] for row in phase["timeline"]]
        ax.plot(t, [row[1] for row in phase["timeline"]], label="true spend (served calls)", lw=2)
        view = "verdict spend (enforcer)" if kind != "baseline" else "shared total (cached)"
        ax.plot(t, [row[2] for row in phase["timeline"]], label=view, lw=1, ls="--")
        if kind != "baseline":
            ax.plot(
                t,
                [row[2] + row[3] for row in phase["timeline"]],
                label="verdict + holds of all replicas",
                lw=1,
                ls=":",
            )
        ax.axhline(cap, color="red", lw=1, label=f"cap ${cap:g}")
        ax.set_title(
            f"{title}\nspend ${phase['spend_usd']:.3f}, overshoot {phase['overshoot_pct']:+.2f}%",
            fontsize=10,
        )
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0][0].set_ylabel("USD")
    fig.suptitle(
        f"{result['clients']} streaming clients, {result['replicas']} gateway replicas, one ${cap:g} budget",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the stack --------------------------------------------------------------------------------------
def start_upstream(opts: Options, run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The fake providers in their own process (the gateways' process keeps its CPU)."""
    port = free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "fake-upstream.log").open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spendbus",
            "fake-upstream",
            "--port",
            str(port),
            "--latency-ms",
            str(opts.latency_ms),
            "--chunk-latency-ms",
            str(opts.chunk_latency_ms),
            "--seed",
            str(opts.seed),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the fake upstream exited with {process.returncode}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
            return process, url
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the fake upstream did not answer in 60 s")


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


def result_of(opts: Options, phases: dict[str, Any]) -> dict[str, Any]:
    """The bench's JSON from the phases run (any of them may be left out)."""
    ours = phases["ours"]["overshoot_pct"] if "ours" in phases else None
    base = phases["baseline"]["overshoot_pct"] if "baseline" in phases else None
    ratio = max(ours, 0.0) / base if ours is not None and base is not None and base > 0 else None
    unshared = phases.get("ours_unshared")
    scaling = phases.get("scaling")
    return {
        "bench": "overshoot",
        "clients": opts.clients,
        "replicas": opts.replicas,
        "cap_usd": float(opts.cap_usd),
        "workload": {
            "api": "anthropic-messages (streamed)",
            "model": MODEL,
            "max_tokens": opts.max_tokens,
            "prompt_tokens": list(opts.prompt_tokens),
            "upstream_latency_ms": opts.latency_ms,
            "upstream_chunk_latency_ms": opts.chunk_latency_ms,
            "refusal_pause_ms": opts.refusal_pause_ms,
            "stop_after_refusals_per_replica": opts.stop_after_refusals,
            "stop_quiet_s": opts.quiet_s,
        },
        "ours": phases.get("ours"),
        "baseline": phases.get("baseline"),
        # the replicas count themselves while the fleet scales (membership)
        "scaling": scaling,
        # the enforcer without the replicas option (each replica may fill the whole headroom)
        "comparisons": {k: v for k, v in phases.items() if k == "ours_unshared"},
        "ratio_ours_to_baseline_overshoot": None if ratio is None else round(ratio, 4),
        "ratio_ours_unshared_to_baseline_overshoot": (
            round(max(unshared["overshoot_pct"], 0.0) / base, 4)
            if unshared is not None and base is not None and base > 0
            else None
        ),
        "targets": {
            "ours_overshoot_le_1pct": None if ours is None else ours <= 1.0,
            "ours_le_baseline_over_20": None if ratio is None else ratio <= 1 / 20,
            "scaling_overshoot_le_1pct": (
                None if scaling is None else scaling["overshoot_pct"] <= 1.0
            ),
            "ground_truth_equals_verdict": all(
                phase["ground_truth"]["verdict_equals_ground_truth"] for phase in phases.values()
            ),
        },
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


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
    parser.add_argument(
        "--role", choices=("bench", "clients"), default="bench", help=argparse.SUPPRESS
    )
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--chart", type=Path, default=RESULTS / "overshoot.png")
    parser.add_argument("--out", type=Path, default=RESULTS / "overshoot.json")
    args = parser.parse_args()
    if args.role == "clients":  # the clients' process of one phase (see drive)
        spec = json.loads(args.spec)
        fields = spec["opts"]
        fields["cap_usd"] = Decimal(fields["cap_usd"])
        for name in ("prompt_tokens", "phases", "scaling", "scale_at"):
            fields[name] = tuple(fields[name])
        load = clients(Options(**fields), spec["urls"], spec["key"], spec.get("urls_file"))
        print(json.dumps(asyncio.run(load)))
        return
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
