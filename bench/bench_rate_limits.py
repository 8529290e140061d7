"""Rate-limit accuracy across gateway replicas that count themselves (issue 24).

Three reference gateways (``ingest.gateway``), each with its own ``enforcer.Enforcer``
(``membership: true``: they learn they are three from their consumer group, so each
takes a third of the rate) and its own publisher, in front of the fake provider. One
budget per phase, on its own org:

* ``requests``: ``rate: {requests_per_second: --rps}``;
* ``tokens``: ``rate: {tokens_per_second: --tps}`` (each request takes its worst case,
  input + max_tokens, and settle gives back what the call did not use).

Clients (their own process) send small Anthropic Messages requests round-robin over the
replicas as fast as the gateways answer (a refused client pauses ``--refusal-pause-ms``),
for ``--seconds``. Admission times are taken where admission happens (each replica's gate,
in this process); the tokens of each admitted call are its usage event's. Per whole
second from the first admission: the requests (or billed tokens) admitted, against the
limit and the tolerance the enforcer states (enforcer/README.md, "Rate limits"): R x
max(1, limit / R / 60) for requests; for tokens, in debt by at most one request's worst
case per replica, plus what settles between windows.

Prints one JSON object (bench/results/rate_limits.json). Uses KAFKA_BOOTSTRAP, else
starts a LocalKafka for the run.

    python bench/bench_rate_limits.py [--replicas 3] [--rps 60] [--tps 20000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.benchkit import apply_reference  # noqa: E402
from enforcer import Enforcer, EnforcerConfig  # noqa: E402
from enforcer.rates import BURST_FRACTION, MIN_REQUESTS_BURST  # noqa: E402
from ingest.gateway import Gateway, GatewayServer, parse_config  # noqa: E402
from ingest.publisher import PublisherConfig, UsagePublisher  # noqa: E402
from runtime.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from schemas.budgets import budgets_from_yaml  # noqa: E402
from schemas.records import UsageEvent  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from schemas.usage import billed_tokens  # noqa: E402
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.broker_jars import ensure_broker_jars  # noqa: E402
from spendbus.stack.kafka import LocalKafka  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECRET = "sk-rate"
MODEL = "claude-haiku-4-5"


@dataclass(frozen=True)
class Options:
    replicas: int = 3
    rps: int = 60
    tps: int = 20_000
    seconds: float = 8.0
    clients: int = 24
    max_tokens: int = 300
    refusal_pause_ms: float = 5.0
    latency_ms: float = 20.0
    max_replicas: int = 6
    membership_grace_s: float = 2.0


class AdmissionProbe:
    """The replica's enforcer as its gate, noting when each request is admitted."""

    def __init__(self, enforcer: Enforcer, admitted: list[float], refused: Counter[str]) -> None:
        self.enforcer = enforcer
        self.admitted = admitted
        self.refused = refused

    def context(self, **fields: Any) -> Any:
        return self.enforcer.context(**fields)

    def check(self, ctx: Any, *, reserve: bool = True) -> Any:
        decision = self.enforcer.check(ctx, reserve=reserve)
        if decision.allowed:
            self.admitted.append(time.monotonic())
        else:
            self.refused[decision.decision] += 1
        return decision

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool:
        return self.enforcer.settle(hold_id, event)

    def release(self, hold_id: int | None) -> bool:
        return self.enforcer.release(hold_id)

    def usage(self, ctx: Any) -> list[Any]:
        return list(self.enforcer.usage(ctx))

    @property
    def ready(self) -> bool:
        return self.enforcer.ready

    @property
    def stale(self) -> bool:
        return self.enforcer.stale


class TokenSink:
    """The replica's publisher, noting each allowed call's billed tokens and when."""

    def __init__(self, publisher: UsagePublisher, tokens: list[tuple[float, int]]) -> None:
        self.publisher = publisher
        self.tokens = tokens

    async def publish(self, event: UsageEvent) -> None:
        if event["outcome"] in ("allowed", "failed_open"):
            admitted_at = time.monotonic() - (event.get("latency_ms") or 0) / 1000
            self.tokens.append((admitted_at, billed_tokens(event)))
        await self.publisher.publish(event)


def budget_yaml(kind: str, run: str, opts: Options) -> dict[str, Any]:
    rate = (
        {"requests_per_second": opts.rps} if kind == "requests" else {"tokens_per_second": opts.tps}
    )
    return {
        "id": f"rate-{kind}-{run}",
        "scope": "org",
        "match": {"org_id": org(kind, run)},
        "rate": rate,
    }


def org(kind: str, run: str) -> str:
    return f"rate-{kind}-{run}"


def key(kind: str, run: str) -> str:
    return f"vk-rate-{kind}-{run}-0123456789"


async def run_phase(
    kind: str,
    opts: Options,
    bootstrap: str,
    topics: Topics,
    upstream: str,
    home: Path,
    run: str,
    security: KafkaSecurity,
) -> dict[str, Any]:
    admitted: list[float] = []
    tokens: list[tuple[float, int]] = []
    refused: Counter[str] = Counter()
    enforcers: list[Enforcer] = []
    publishers: list[UsagePublisher] = []
    servers: list[GatewayServer] = []
    try:
        for n in range(opts.replicas):
            publisher = UsagePublisher(
                PublisherConfig(
                    bootstrap=bootstrap,
                    kafka_security=security,
                    topic_prefix=topics.prefix,
                    spool_dir=home / kind / f"spool{n}",
                    client_id=f"rate-{kind}-r{n}",
                )
            )
            await publisher.start()
            publishers.append(publisher)
            enforcer = Enforcer(
                EnforcerConfig(
                    bootstrap=bootstrap,
                    kafka_security=security,
                    topic_prefix=topics.prefix,
                    gateway_id=f"rate-{kind}-r{n}",
                    client_id=f"rate-{kind}-enforcer-r{n}",
                    membership=True,
                    max_replicas=opts.max_replicas,
                    membership_grace_s=opts.membership_grace_s,
                )
            )
            await enforcer.start()
            enforcers.append(enforcer)
            config = parse_config(
                {
                    "gateway_id": f"rate-{kind}-r{n}",
                    "upstreams": {"anthropic": {"api": "anthropic", "base_url": upstream}},
                    "secrets": {SECRET: {"upstream": "anthropic", "api_key": "fake-credential"}},
                    "keys": [
                        {
                            "name": f"rate-{kind}",
                            "key": key(kind, run),
                            "principal": {"org_id": org(kind, run), "secret_id": SECRET},
                        }
                    ],
                },
                "bench_rate_limits",
            )
            gate = AdmissionProbe(enforcer, admitted, refused)
            gateway = Gateway(
                config, gate, TokenSink(publisher, tokens), credentials=config.credentials({})
            )
            server = GatewayServer(gateway)
            await server.start()
            servers.append(server)
        for enforcer in enforcers:
            await enforcer.wait_ready(60)
        deadline = time.monotonic() + 60
        while not all(e.checker.replicas == opts.replicas for e in enforcers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas never counted {opts.replicas}")
            await asyncio.sleep(0.1)
        load = await drive(opts, [s.url for s in servers], key(kind, run))
    finally:
        for server in servers:
            await server.stop()
        for publisher in publishers:
            with contextlib.suppress(Exception):
                await publisher.flush(30)
            await publisher.stop()
        for enforcer in enforcers:
            await enforcer.stop()
    limit = opts.rps if kind == "requests" else opts.tps
    if kind == "requests":
        windows = per_second([(t, 1) for t in admitted])
        stated = math.ceil(
            opts.replicas * max(MIN_REQUESTS_BURST, limit / opts.replicas * BURST_FRACTION)
        )
    else:
        windows = per_second(tokens)
        # a bucket holds 1/60 of a second's share or one worst case (input + max_tokens),
        # whichever is more, and may be in debt by one worst case; per replica
        worst = opts.max_tokens + math.ceil(len(request_body(opts)) / 3)  # the gateway's estimate
        share = limit / opts.replicas * BURST_FRACTION
        stated = math.ceil(opts.replicas * (max(share, worst) + worst))
    errors = [n - limit for n in windows]
    return {
        "limit_per_second": limit,
        "unit": kind,
        "replicas": opts.replicas,
        "windows": windows,
        "mean": round(statistics.mean(windows), 2) if windows else None,
        "min": min(windows) if windows else None,
        "max": max(windows) if windows else None,
        "mean_error_pct": round(statistics.mean(errors) / limit * 100, 2) if errors else None,
        "max_abs_error": max(abs(e) for e in errors) if errors else None,
        "stated_tolerance": stated,
        "windows_within_tolerance": sum(abs(e) <= stated for e in errors),
        "admitted": len(admitted),
        "refused": dict(refused),
        "client": load,
    }


def per_second(points: list[tuple[float, int]]) -> list[int]:
    """The amount admitted in each whole second from the first admission on."""
    if not points:
        return []
    start = min(t for t, _ in points)
    last = max(t for t, _ in points)
    buckets: Counter[int] = Counter()
    for t, amount in points:
        buckets[int(t - start)] += amount
    return [buckets[i] for i in range(int(last - start))]


async def drive(opts: Options, urls: list[str], api_key: str) -> dict[str, Any]:
    spec = json.dumps({"opts": asdict(opts), "urls": urls, "key": api_key})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        "clients",
        "--spec",
        spec,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the clients failed:\n{err.decode(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def request_body(opts: Options) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "max_tokens": opts.max_tokens,
            "messages": [{"role": "user", "content": "How many requests per second? " * 20}],
        }
    ).encode()


async def clients(opts: Options, urls: list[str], api_key: str) -> dict[str, Any]:
    body = request_body(opts)
    headers = {
        "x-api-key": api_key,
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    statuses: Counter[str] = Counter()
    turn = iter(range(10**12))
    stop_at = time.monotonic() + opts.seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            url = urls[next(turn) % len(urls)]
            async with session.post(url + "/v1/messages", data=body, headers=headers) as response:
                await response.read()
                statuses[str(response.status)] += 1
                if response.status == 429:
                    await asyncio.sleep(opts.refusal_pause_ms / 1000)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*[client(session) for _ in range(opts.clients)])
    return {"statuses": dict(statuses), "seconds": opts.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Options()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument(
        "--role", choices=("bench", "clients"), default="bench", help=argparse.SUPPRESS
    )
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "rate_limits.json")
    args = parser.parse_args()
    if args.role == "clients":
        spec = json.loads(args.spec)
        print(json.dumps(asyncio.run(clients(Options(**spec["opts"]), spec["urls"], spec["key"]))))
        return
    opts = Options(**{name: getattr(args, name) for name in asdict(defaults)})
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        security = load_settings().kafka_security if bootstrap else PLAINTEXT
        broker = None
        if not bootstrap:
            ensure_broker_jars()
            broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            result = asyncio.run(run(opts, bootstrap, home, security))
        finally:
            if broker is not None:
                broker.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


async def run(opts: Options, bootstrap: str, home: Path, security: KafkaSecurity) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    topics = Topics(f"benchrate{run_id}.")
    await ensure_topics(bootstrap, topics, 4, security=security)
    budgets = budgets_from_yaml([budget_yaml(k, run_id, opts) for k in ("requests", "tokens")])
    await apply_reference(bootstrap, topics, budgets, security=security)
    upstream = FakeUpstream(
        FakeUpstreamConfig(port=0, seed=5, latency_ms=opts.latency_ms, output_tokens=(50, 250))
    )
    await upstream.start()
    try:
        phases = {
            kind: await run_phase(
                kind, opts, bootstrap, topics, upstream.url, home, run_id, security
            )
            for kind in ("requests", "tokens")
        }
    finally:
        await upstream.stop()
    return {
        "bench": "rate_limits",
        "options": asdict(opts),
        **phases,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    main()
