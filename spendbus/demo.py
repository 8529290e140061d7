"""`spendbus demo`: the whole pipeline on the embedded default, checked end to end.

1. start a Kafka broker and the topics (or use KAFKA_BOOTSTRAP with a fresh prefix),
   apply the shipped prices and the demo budgets, start an aggregator worker that
   owns a fresh embedded ClickHouse store;
2. traffic through the reference gateway (ingest/gateway, in this process) in
   front of the fake providers: clients call it with virtual keys; the enforcer
   checks each call; an allowed one is forwarded and its response (each
   provider's wire format) read by the usage tap as it streams, and the
   publisher sends the UsageEvent (a refused one a refusal event, without
   reaching the provider); a few events are published twice, as a retrying
   proxy would;
3. show spend per org and secret live, the exhausted secret's refusal, and
   analyst queries in ClickHouse;
4. check: events in ClickHouse = unique events sent; ClickHouse and verdict
   totals = the exact sum priced independently; the exhausted secret is refused.
Exit status 0 only when every check passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aggregator.clickhouse_access import redact_dsn
from enforcer import Enforcer, EnforcerConfig
from ingest.gateway import Gateway, GatewayServer, parse_config
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.kafka import PLAINTEXT, KafkaSecurity
from schemas.money import format_usd
from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.usage import new_usage_event
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig, FakeUsage, build_request
from spendbus.settings import Settings
from spendbus.stack.compacted import publish
from spendbus.stack.kafka import free_port
from spendbus.stack.local import LocalStack, worker_process

console = Console()

EXHAUSTED_SECRET = ("initech", "sk-initech-intern")
#: requests in flight at once through the gateway
CLIENTS = 8
#: (org, secret, users, weight)
PRINCIPALS = [
    ("acme", "sk-acme-prod", ["ana@acme.io", "raj@acme.io"], 5),
    ("acme", "sk-acme-batch", ["batch-runner"], 3),
    ("globex", "sk-globex-search", ["li@globex.com", "sam@globex.com"], 4),
    ("globex", "sk-globex-support", ["support-bot"], 2),
    ("initech", "sk-initech-prod", ["peter@initech.com"], 2),
    ("initech", "sk-initech-intern", ["intern@initech.com"], 2),
]
#: (api format, provider, model, weight)
MODELS = [
    ("anthropic-messages", "anthropic", "claude-sonnet-4-5-20250929", 5),
    ("anthropic-messages", "anthropic", "claude-haiku-4-5-20251001", 3),
    ("openai-chat", "openai", "gpt-4o-2024-11-20", 3),
    ("openai-chat", "openai", "gpt-4o-mini", 3),
    ("openai-responses", "openai", "gpt-5-2025-08-07", 2),
    ("openai-responses", "openai", "o4-mini", 1),
    ("gemini", "gemini", "gemini-2.5-flash", 3),
    ("gemini", "gemini", "gemini-2.5-pro", 1),
    ("bedrock-converse", "bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0", 2),
]
ANALYST_QUERIES = {
    "Spend by org today": """
        SELECT org_id, count() AS calls, sum(cost_nanos) / 1e9 AS usd,
               sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens) AS tokens
        FROM usage_events WHERE toDate(occurred_at) = today() GROUP BY org_id ORDER BY usd DESC""",
    "Top secrets this month": """
        SELECT org_id, secret_id, round(sum(cost_nanos) / 1e9, 4) AS usd, count() AS calls
        FROM usage_events WHERE toStartOfMonth(occurred_at) = toStartOfMonth(now())
        GROUP BY org_id, secret_id ORDER BY usd DESC LIMIT 5""",
    "Spend by provider and model": """
        SELECT provider, model, count() AS calls, round(sum(cost_nanos) / 1e9, 4) AS usd,
               sum(cache_read_tokens) AS cache_reads, countIf(usage_source = 'estimated') AS estimated
        FROM usage_events GROUP BY provider, model ORDER BY usd DESC""",
    "Refusals by decision": """
        SELECT decision, decision_budget_id, status_code, count() AS requests
        FROM usage_events WHERE outcome != 'allowed'
        GROUP BY decision, decision_budget_id, status_code ORDER BY requests DESC""",
}


@dataclass
class Ledger:
    """What the demo itself sent: the independent side of every check."""

    sent_unique: int = 0
    duplicates: int = 0
    refused: int = 0
    estimated: int = 0
    expected_nanos: int = 0
    per_principal: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    refused_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: the exhausted secret's answer at the end: (status, body, headers)
    final_refusal: tuple[int, dict[str, Any] | None, dict[str, str]] = (0, None, {})
    #: per (org, secret): the secret-monthly spend the enforcer's verdicts show at the end
    verdict_nanos: dict[tuple[str, str], int] = field(default_factory=dict)


def _pick(rng: random.Random, items: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return rng.choices(items, weights=[i[-1] for i in items])[0]


def _usage(rng: random.Random, fmt: str) -> FakeUsage:
    input_tokens = int(rng.lognormvariate(7.5, 1.0))  # median ~1.8k, long tail
    output_tokens = max(1, int(rng.lognormvariate(5.5, 0.9)))  # median ~250
    cache_read = cache_write = cache_write_1h = reasoning = 0
    if fmt in ("anthropic-messages", "bedrock-converse") and rng.random() < 0.4:
        cache_read = int(rng.lognormvariate(8.5, 0.8))
        if rng.random() < 0.3:
            cache_write = int(rng.lognormvariate(7.0, 0.8))
            if fmt == "anthropic-messages" and rng.random() < 0.3:
                cache_write_1h = cache_write // 2
    elif fmt in ("openai-chat", "openai-responses", "gemini") and rng.random() < 0.3:
        cache_read = int(rng.lognormvariate(7.5, 0.8))
    if fmt in ("openai-responses", "gemini") and rng.random() < 0.5:
        reasoning = int(rng.lognormvariate(6.0, 0.8))
        output_tokens += reasoning
    return FakeUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=cache_write_1h,
        reasoning_tokens=reasoning,
    )


def _spend_table(enforcer: Enforcer, ledger: Ledger) -> Table:
    table = Table(title="Spend per secret (from the verdicts the enforcer follows)", expand=False)
    for column in ("org", "secret", "spent this month", "limit", "state", "refused"):
        table.add_column(
            column,
            justify="right" if column in ("spent this month", "limit", "refused") else "left",
        )
    for org, secret, users, _ in PRINCIPALS:
        statuses = enforcer.usage(enforcer.context(org_id=org, secret_id=secret, user_id=users[0]))
        secret_budget = [s for s in statuses if s.budget_id in ("intern-key", "secret-monthly")]
        status = (
            min(secret_budget, key=lambda s: s.plan.limit_nanos or 0) if secret_budget else None
        )
        state = status.state if status else "-"
        colour = {"exceeded": "red", "alert": "yellow"}.get(state, "green")
        table.add_row(
            org,
            secret,
            format_usd(status.spent_nanos if status else 0),
            format_usd(status.plan.limit_nanos) if status and status.plan.limit_nanos else "-",
            f"[{colour}]{state}[/{colour}]",
            str(ledger.refused_by.get(secret, 0)),
        )
    return table


class RecordingSink:
    """The gateway's usage sink in the demo: the real publisher, and the demo's own
    ledger of every event the gateway published (the independent side of the checks)."""

    def __init__(self, publisher: UsagePublisher, ledger: Ledger, prices: PriceBook) -> None:
        self.publisher = publisher
        self.ledger = ledger
        self.prices = prices
        self.last: dict[str, Any] | None = None

    async def publish(self, event: dict[str, Any]) -> None:
        await self.publisher.publish(event)
        self.last = event
        ledger = self.ledger
        cost = self.prices.price_event(event).cost_nanos
        ledger.sent_unique += 1
        ledger.expected_nanos += cost
        ledger.per_principal[(event["org_id"], event["secret_id"])] += cost
        if event["outcome"] == "refused":
            ledger.refused += 1
            ledger.refused_by[event["secret_id"]] += 1
        ledger.estimated += event["usage_source"] == "estimated"


def _virtual_key(secret: str, user: str) -> str:
    return f"vk-demo-{secret}-{user.split('@')[0]}"


def gateway_config(upstream_url: str) -> dict[str, Any]:
    """The demo's gateway: every secret may call every API (all served by the fake
    providers), one virtual key per (secret, user); only agent jobs name a session."""
    apis = ("openai", "anthropic", "gemini", "bedrock")
    return {
        "gateway_id": "demo-gateway",
        # the answers' lengths and cuts the demo asks the fake providers for
        "forward_request_headers": ["x-fake-"],
        "upstreams": {api: {"api": api, "base_url": upstream_url} for api in apis},
        "secrets": {
            secret: {"upstream": list(apis), "api_key": "demo-upstream-credential"}
            for _, secret, _, _ in PRINCIPALS
        },
        "keys": [
            {
                "name": f"{secret}.{user.split('@')[0]}",
                "key": _virtual_key(secret, user),
                "principal": {
                    "org_id": org,
                    "secret_id": secret,
                    "user_id": user,
                    "tags": {"team": "search"} if secret == "sk-globex-search" else {},
                },
            }
            for org, secret, users, _ in PRINCIPALS
            for user in users
        ],
        "sessions": {"auto": False},
    }


def _route(fmt: str, model: str, stream: bool) -> str:
    if fmt == "anthropic-messages":
        return "/v1/messages"
    if fmt == "openai-chat":
        return "/v1/chat/completions"
    if fmt == "openai-responses":
        return "/v1/responses"
    if fmt == "gemini":
        return f"/v1beta/models/{model}:" + (
            "streamGenerateContent?alt=sse" if stream else "generateContent"
        )
    return f"/model/{model}/converse" + ("-stream" if stream else "")


def _auth(fmt: str, key: str) -> dict[str, str]:
    """Where each provider's SDK puts its key."""
    if fmt == "anthropic-messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if fmt == "gemini":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


@dataclass
class Proxy:
    """The demo's traffic: clients calling the reference gateway (in this process) with
    virtual keys, as provider SDKs would. The gateway checks each call with the enforcer,
    forwards it to the fake providers, reads the usage with the tap as it streams,
    publishes the UsageEvent (or the refusal) and settles the hold."""

    enforcer: Enforcer
    publisher: UsagePublisher
    prices: PriceBook
    rng: random.Random
    gateway: Gateway
    sink: RecordingSink
    http: aiohttp.ClientSession
    url: str

    @property
    def ledger(self) -> Ledger:
        return self.sink.ledger

    async def request(self, principal: tuple[Any, ...]) -> bool:
        """One call; True when the gateway let it through."""
        rng = self.rng
        _, secret, users, _ = principal
        fmt, _, model, _ = _pick(rng, MODELS)
        user = rng.choice(users)
        stream = rng.random() < 0.7
        # now and then the provider drops a stream before its usage: charged an estimate
        cut = rng.randrange(3, 12) if stream and rng.random() < 0.02 else None
        usage = _usage(rng, fmt)
        body = build_request(fmt, model=model, usage=usage, stream=stream, rng=rng)
        headers = _auth(fmt, _virtual_key(secret, user))
        headers["x-fake-output-tokens"] = str(usage.output_tokens)  # the answer's length
        if cut is not None:
            headers["x-fake-cut-after"] = str(cut)  # chunks before the connection drops
        if secret == "sk-acme-batch":  # agent jobs name their session
            headers["X-Spend-Session"] = f"job-{rng.randrange(40)}"
        async with self.http.post(
            self.url + _route(fmt, model, stream), json=body, headers=headers
        ) as resp:
            allowed = resp.status == 200
            with contextlib.suppress(aiohttp.ClientPayloadError):  # the cut reaches the client
                await resp.read()
        await self.gateway.drain()  # this call's event is published and its hold settled
        if rng.random() < 0.01 and self.sink.last is not None:
            # a retrying proxy re-publishes the same event id: charged once downstream
            await self.publisher.publish(self.sink.last)
            self.ledger.duplicates += 1
        return allowed


async def _workload(proxy: Proxy, events: int) -> None:
    progress = Progress(
        TextColumn("[bold]proxy traffic"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} req/s"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("requests", total=events, rate="-")
    started = time.monotonic()

    def view() -> Group:
        return Group(progress, _spend_table(proxy.enforcer, proxy.ledger))

    with Live(view(), console=console, refresh_per_second=4) as live:
        for n in range(0, events, CLIENTS):
            # a few clients at once, as a gateway sees them (their holds overlap)
            batch = [_pick(proxy.rng, PRINCIPALS) for _ in range(min(CLIENTS, events - n))]
            await asyncio.gather(*(proxy.request(principal) for principal in batch))
            if n % (CLIENTS * 4) == 0:
                rate = (n + len(batch)) / max(time.monotonic() - started, 1e-6)
                progress.update(task, completed=n + len(batch), rate=f"{rate:,.0f}")
                live.update(view())
        progress.update(task, completed=events)
        await proxy.publisher.flush()
        live.update(view())


async def _exhaust(proxy: Proxy, seconds: float = 30.0) -> None:
    """Spend the intern's key: it calls until the gateway refuses it, then a usage import
    adds the calls it made around the gateway, so its counter reaches the limit."""
    enforcer, ledger = proxy.enforcer, proxy.ledger
    principal = next(p for p in PRINCIPALS if (p[0], p[1]) == EXHAUSTED_SECRET)
    ctx = enforcer.context(
        org_id=EXHAUSTED_SECRET[0], secret_id=EXHAUSTED_SECRET[1], user_id=principal[2][0]
    )
    with console.status(f"{EXHAUSTED_SECRET[1]} keeps calling until the gateway refuses it..."):
        # reserve-and-settle: in-flight holds refuse it before its verdict can pass the limit
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and await proxy.request(principal):
            await asyncio.sleep(0)
    # The intern also called the provider directly with the same key (a notebook); the
    # provider's usage export is imported as events, as `spendbus ingest FILE.jsonl` does.
    intern = next(s for s in enforcer.usage(ctx) if s.budget_id == "intern-key")
    # what the gateway sent so far (the verdicts may still be catching up with it)
    left = (intern.plan.limit_nanos or 0) - ledger.per_principal[EXHAUSTED_SECRET]
    # claude-sonnet-4-5 input costs 3,000 nanos a token: enough tokens to pass what is left
    imported = new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5-20250929",
        secret_id=EXHAUSTED_SECRET[1],
        org_id=EXHAUSTED_SECRET[0],
        gateway_id="usage-import",
        user_id=principal[2][0],
        input_tokens=max(1, left // 3_000 + 1_000),
        output_tokens=0,
    )
    await proxy.publisher.publish(imported)
    await proxy.publisher.flush()
    cost = proxy.prices.price_event(imported).cost_nanos
    ledger.sent_unique += 1
    ledger.expected_nanos += cost
    ledger.per_principal[EXHAUSTED_SECRET] += cost
    console.print(
        f"imported {imported['input_tokens']:,} tokens the intern spent outside the gateway "
        f"({format_usd(cost)}; {format_usd(max(left, 0))} was left)"
    )


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what} (last seen: {last})")


def run_demo(settings: Settings, events: int = 3000, keep: bool = False, seed: int = 2026) -> int:
    # producing right after a topic is created retries until its leader is known: not news
    logging.getLogger("aiokafka.producer.sender").setLevel(logging.ERROR)
    home = (settings.home / "demo").resolve()
    if not keep and home.exists():
        shutil.rmtree(home)
    prefix = settings.topic_prefix or (
        f"demo-{uuid.uuid4().hex[:6]}." if settings.kafka_bootstrap else ""
    )
    demo_settings = settings.model_copy(
        update={
            "home": home,
            "topic_prefix": prefix,
            "web_port": free_port(),
            "clickhouse_dsn": settings.clickhouse_dsn,
        }
    )
    stack = LocalStack(demo_settings)
    worker = worker_process(demo_settings)
    console.rule("[bold]spendbus demo")
    try:
        with console.status(
            "starting Kafka and creating the topics (the first run fetches the broker)..."
        ):
            bootstrap = stack.up(with_worker=False)
        console.print(
            f"kafka [bold]{bootstrap}[/bold], "
            f"clickhouse [bold]{redact_dsn(demo_settings.dsn)}[/bold]"
        )
        tables = load_price_file(default_price_file())
        budgets_file = Path(str(resources.files("spendbus") / "demo_data" / "budgets.yaml"))
        import yaml

        budgets = budgets_from_yaml(
            yaml.safe_load(budgets_file.read_text()), source=str(budgets_file)
        )
        now = datetime.now(UTC)
        asyncio.run(
            publish(
                bootstrap,
                demo_settings.topics.pricing,
                [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
                security=settings.kafka_security,
            )
        )
        asyncio.run(
            publish(
                bootstrap,
                demo_settings.topics.budget_policies,
                [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
                security=settings.kafka_security,
            )
        )
        console.print(f"applied {len(tables)} price version(s) and {len(budgets)} budgets")
        with console.status("starting the aggregator worker (Faust)..."):
            worker.env["KAFKA_BOOTSTRAP"] = bootstrap
            worker.start()
        ledger = asyncio.run(
            _drive(
                worker,
                bootstrap,
                prefix,
                home,
                PriceBook(tables),
                events,
                seed,
                security=settings.kafka_security,
            )
        )
        return _check_and_report(worker, ledger)
    finally:
        if not keep:
            with console.status("stopping the demo stack..."):
                worker.stop()
                stack.down()


def _verdict_spend(enforcer: Enforcer) -> dict[tuple[str, str], int]:
    return {
        (org, secret): next(
            (
                s.spent_nanos
                for s in enforcer.usage(enforcer.context(org_id=org, secret_id=secret))
                if s.budget_id == "secret-monthly"
            ),
            0,
        )
        for org, secret, _, _ in PRINCIPALS
    }


async def _drive(
    worker: Any,
    bootstrap: str,
    prefix: str,
    home: Path,
    prices: PriceBook,
    events: int,
    seed: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> Ledger:
    config = EnforcerConfig(
        bootstrap=bootstrap, kafka_security=security, topic_prefix=prefix, gateway_id="demo-gateway"
    )
    publisher = UsagePublisher(
        PublisherConfig(
            bootstrap=bootstrap,
            kafka_security=security,
            topic_prefix=prefix,
            spool_dir=home / "spool",
        )
    )
    ledger = Ledger()
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        await publisher.start()
        upstream = FakeUpstream(FakeUpstreamConfig(port=0, seed=seed, cache_ratio=0.3))
        gw_config = parse_config(gateway_config(await upstream.start()), "<demo gateway>")
        sink = RecordingSink(publisher, ledger, prices)
        gateway = Gateway(gw_config, enforcer, sink, credentials=gw_config.credentials({}))
        server = GatewayServer(gateway)
        try:
            url = await server.start()
            console.print(f"gateway [bold]{url}[/bold] in front of the fake providers")
            async with aiohttp.ClientSession() as http:
                proxy = Proxy(
                    enforcer, publisher, prices, random.Random(seed), gateway, sink, http, url
                )
                await _workload(proxy, events)
                await _exhaust(proxy)
            await publisher.flush()
        finally:
            await server.stop()
            await upstream.stop()
            await publisher.stop()
        # every record read by the aggregator, then its last verdicts seen by the enforcer
        records = ledger.sent_unique + ledger.duplicates
        deadline = time.monotonic() + 120
        with console.status("waiting for the aggregator and the last verdicts..."):
            while time.monotonic() < deadline:
                stats = await asyncio.to_thread(worker.get, "/stats")
                if stats.get("events", 0) >= records and _verdict_spend(enforcer) == {
                    (org, secret): ledger.per_principal.get((org, secret), 0)
                    for org, secret, _, _ in PRINCIPALS
                }:
                    break
                await asyncio.sleep(0.25)
        ledger.verdict_nanos = _verdict_spend(enforcer)
        console.print(_spend_table(enforcer, ledger))
        refused = enforcer.peek(
            enforcer.context(
                org_id=EXHAUSTED_SECRET[0],
                secret_id=EXHAUSTED_SECRET[1],
                user_id="intern@initech.com",
                model="claude-sonnet-4-5",
            )
        )
        ledger.final_refusal = (refused.status, refused.body, dict(refused.headers))
    return ledger


def _check_and_report(worker: Any, ledger: Ledger) -> int:
    def ch_totals() -> tuple[bool, tuple[int, int]]:
        rows = worker.post("/sql", {"sql": "SELECT count(), sum(cost_nanos) FROM usage_events"})[
            "rows"
        ]
        count, nanos = int(rows[0][0]), int(rows[0][1] or 0)
        return count >= ledger.sent_unique, (count, nanos)

    with console.status("waiting for ClickHouse to hold every event..."):
        try:
            count, nanos = _wait_for(ch_totals, 120, "the ClickHouse sink")
        except TimeoutError as exc:
            console.print(f"[red]{exc}")
            count, nanos = ch_totals()[1]
    for title, query in ANALYST_QUERIES.items():
        result = worker.post("/sql", {"sql": query})
        table = Table(*result["columns"], title=title, title_justify="left")
        for row in result["rows"]:
            table.add_row(*(f"{v:,.4f}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)
    status, body, headers = ledger.final_refusal
    console.print(
        Panel(
            f"HTTP {status}  Retry-After: {headers.get('Retry-After', '-')}\n{json.dumps(body, indent=2)}",
            title=f"{EXHAUSTED_SECRET[1]} is refused",
            border_style="red",
        )
    )
    stats = worker.get("/stats")
    verdict_matches = all(
        ledger.verdict_nanos[p] == ledger.per_principal.get(p, 0) for p in ledger.verdict_nanos
    )
    checks = [
        (
            f"events in ClickHouse = unique events sent ({count} = {ledger.sent_unique})",
            count == ledger.sent_unique,
        ),
        (
            f"ClickHouse total = exact sum ({format_usd(nanos, 9)} = {format_usd(ledger.expected_nanos, 9)})",
            nanos == ledger.expected_nanos,
        ),
        ("verdict spend per secret = exact sum per secret", verdict_matches),
        (
            f"duplicate publishes charged once ({ledger.duplicates} sent, {stats.get('duplicates', 0)} skipped)",
            stats.get("duplicates", 0) == ledger.duplicates,
        ),
        (
            f"{EXHAUSTED_SECRET[1]} refused with 402 budget_exceeded",
            status == 402 and (body or {}).get("error") == "budget_exceeded",
        ),
        (
            f"nothing dead-lettered ({stats.get('dead_letters', 0)})",
            stats.get("dead_letters", 0) == 0,
        ),
    ]
    table = Table("check", "result", title="End-to-end checks", title_justify="left")
    for name, ok in checks:
        table.add_row(name, "[green]pass" if ok else "[red]FAIL")
    console.print(table)
    console.print(
        f"sent {ledger.sent_unique} events ({ledger.refused} refusals, {ledger.estimated} estimated, "
        f"{ledger.duplicates} duplicate publishes); charged {format_usd(ledger.expected_nanos)}"
    )
    return 0 if all(ok for _, ok in checks) else 1
