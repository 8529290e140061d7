"""The overshoot bench's phases, each on its own org and budget: ``ours`` / ``baseline`` /
``ours_unshared`` (a fixed set of gateway replicas, with the enforcer or the polling gate)
and ``scaling`` (replicas counting themselves while the fleet scales under the clients)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

from bench.overshoot_baseline import PollGate, SharedTotal
from bench.overshoot_clients import drive, write_urls
from bench.overshoot_ledger import (
    EstimateProbe,
    Ledger,
    RecordingSink,
    final_verdict,
    listen,
    upstream_stats,
)
from bench.overshoot_report import summarise
from bench.overshoot_setup import Env, Options, budget_for, gateway_config, org_for, virtual_key
from enforcer import Enforcer, EnforcerConfig
from ingest.gateway import Gateway, GatewayServer
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.ids import counter_key


async def run_phase(kind: str, opts: Options, env: Env) -> dict[str, Any]:
    """Start the replicas (``ours`` or ``baseline``), run the clients until every replica
    refuses, then measure what was spent."""
    budget = budget_for(kind, env.run_id, opts.cap_usd)
    key = counter_key(budget.budget_id, [org_for(kind, env.run_id)])
    await asyncio.to_thread(upstream_stats, env.upstream_url, "DELETE")
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
                listen(
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
    upstream = await asyncio.to_thread(upstream_stats, env.upstream_url, "GET")
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
    await asyncio.to_thread(upstream_stats, env.upstream_url, "DELETE")
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
        listen(first[0].enforcer, key, ledger, verdict_seen, verdict_lag_ms)
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
    upstream = await asyncio.to_thread(upstream_stats, env.upstream_url, "GET")
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
