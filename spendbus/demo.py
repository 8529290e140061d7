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
   totals = the exact sum priced independently; the exhausted secret is refused;
5. reconcile the ledger against the fake providers' own bill of those calls
   (demo_reconcile.py): every delta explained, no residual.
Exit status 0 only when every check passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from enforcer import Enforcer, EnforcerConfig
from ingest.gateway import Gateway, GatewayServer, parse_config
from ingest.publisher import PublisherConfig, UsagePublisher
from runtime.clickhouse_access import redact_dsn
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.money import format_usd
from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.records import UsageEvent
from schemas.usage import new_usage_event
from spendbus.demo_console import hold_console
from spendbus.demo_reconcile import reconcile_demo
from spendbus.demo_traffic import (
    CLIENTS,
    EXHAUSTED_SECRET,
    PRINCIPALS,
    Ledger,
    Proxy,
    RecordingSink,
    gateway_config,
    pick,
    upstream_credential,
)
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig, FakeUsage, build_request
from spendbus.settings import Settings
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from spendbus.stack.local import LocalStack, worker_process

console = Console()

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


@contextmanager
def live_view(renderable: RenderableType, on: Console) -> Iterator[Live]:
    """rich's Live, its last frame ended by a newline on any console: off a terminal (a log,
    CI) Live leaves the cursor after the frame's last border, and the next line glues on."""
    with Live(renderable, console=on, refresh_per_second=4) as live:
        yield live
    if not on.is_terminal:
        on.line()


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

    with live_view(view(), console) as live:
        for n in range(0, events, CLIENTS):
            # a few clients at once, as a gateway sees them (their holds overlap)
            batch = [pick(proxy.rng, PRINCIPALS) for _ in range(min(CLIENTS, events - n))]
            await asyncio.gather(*(proxy.request(principal) for principal in batch))
            if n % (CLIENTS * 4) == 0:
                rate = (n + len(batch)) / max(time.monotonic() - started, 1e-6)
                progress.update(task, completed=n + len(batch), rate=f"{rate:,.0f}")
                live.update(view())
        progress.update(task, completed=events)
        await proxy.publisher.flush()
        live.update(view())


async def _exhaust(proxy: Proxy, upstream_url: str, seconds: float = 30.0) -> None:
    """Spend the intern's key: it calls until the gateway refuses it, then calls the
    provider straight with the same key (a notebook) until its counter passes the limit;
    the provider's usage of those calls is imported as events."""
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
    intern = next(s for s in enforcer.usage(ctx) if s.budget_id == "intern-key")
    # what the gateway sent so far (the verdicts may still be catching up with it)
    left = (intern.plan.limit_nanos or 0) - ledger.per_principal[EXHAUSTED_SECRET]
    imported: list[UsageEvent] = []
    spent = 0
    while (not imported or spent <= left) and len(imported) < 20:
        # claude-sonnet-4-5 input costs 3,000 nanos a token: enough to pass what is left
        prompt_tokens = max(1_000, (left - spent) // 3_000 + 1_000)
        event = await _call_provider_directly(proxy, upstream_url, principal[2][0], prompt_tokens)
        await proxy.publisher.publish(event)
        imported.append(event)
        spent += proxy.prices.price_event(event).cost_nanos
    await proxy.publisher.flush()
    ledger.sent_unique += len(imported)
    ledger.expected_nanos += spent
    ledger.per_principal[EXHAUSTED_SECRET] += spent
    tokens = sum(
        e["input_tokens"] + e["cache_read_tokens"] + e["cache_write_tokens"] for e in imported
    )
    console.print(
        f"imported {tokens:,} prompt tokens of {len(imported)} call(s) the intern made straight "
        f"to the provider ({format_usd(spent)}; {format_usd(max(left, 0))} was left)"
    )


async def _call_provider_directly(
    proxy: Proxy, upstream_url: str, user: str, prompt_tokens: int
) -> UsageEvent:
    """One Messages call of the intern to the provider itself, around the gateway, and the
    event its answer's usage makes when imported (`spendbus ingest`'s way)."""
    model = "claude-sonnet-4-5-20250929"
    body = build_request(
        "anthropic-messages",
        model=model,
        usage=FakeUsage(prompt_tokens, 1),
        stream=False,
        rng=random.Random(prompt_tokens),
        prompt_chars=prompt_tokens * 4,
    )
    headers = {
        "x-api-key": upstream_credential(EXHAUSTED_SECRET[1]),
        "anthropic-version": "2023-06-01",
        "x-fake-output-tokens": "1",
    }
    async with proxy.http.post(upstream_url + "/v1/messages", json=body, headers=headers) as resp:
        answer = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"the provider refused the intern's call: {resp.status} {answer}")
    usage = answer["usage"]
    return new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model=answer.get("model", model),
        secret_id=EXHAUSTED_SECRET[1],
        org_id=EXHAUSTED_SECRET[0],
        gateway_id="usage-import",
        user_id=user,
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cache_read_tokens=usage.get("cache_read_input_tokens") or 0,
        cache_write_tokens=usage.get("cache_creation_input_tokens") or 0,
        cache_write_1h_tokens=(usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens")
        or 0,
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


def run_demo(
    settings: Settings,
    events: int = 3000,
    keep: bool = False,
    seed: int = 2026,
    hold_s: float | None = None,
) -> int:
    """The demo; its exit status. ``hold_s``: how long to serve the spend console over
    the stack once the checks pass (or until Ctrl-C; None: not at all)."""
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
        status = _check_and_report(worker, ledger)
        status = max(status, reconcile_demo(demo_settings, worker, ledger.billing, console))
        if status == 0 and hold_s is not None:
            hold_console(demo_settings, bootstrap, hold_s, _print_line)
        for line in console_login(demo_settings, bootstrap, keep):
            console.print(line, soft_wrap=True, highlight=False)
        return status
    finally:
        if not keep:
            with console.status("stopping the demo stack..."):
                worker.stop()
                stack.down()


def _print_line(line: str) -> None:
    console.print(line, soft_wrap=True, highlight=False)


def console_login(settings: Settings, bootstrap: str, keep: bool) -> list[str]:
    """How to open the spend console over the demo's stack: the address, the command
    that serves it, and a platform-admin login made for it (minted only when the stack
    stays up, ``--keep``: a login to a stopped stack would be no use)."""
    url = f"http://127.0.0.1:{settings.admin_port}/"
    if not keep:
        return [
            f"spend console: {url} (`spendbus admin serve`); the demo stack stops now: "
            "`spendbus demo --keep` leaves it running and prints a console login for it"
        ]
    from spendbus.commands.admin_api import token_book

    token, record = token_book(settings).mint("platform-admin", None)
    env = (
        f"SPENDBUS_HOME={settings.home} KAFKA_BOOTSTRAP={bootstrap} "
        f"SPENDBUS_WEB_PORT={settings.web_port}"
        + (f" SPENDBUS_TOPIC_PREFIX={settings.topic_prefix}" if settings.topic_prefix else "")
    )
    return [
        f"spend console: {env} spendbus admin serve   # then open {url}",
        f"console login (platform-admin token {record.token_id}, shown once): {token}",
        f"SPENDBUS_HOME={settings.home} spendbus down   # stops the demo stack",
    ]


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
        ledger.billing = upstream.billing  # the providers' own bill, reconciled at the end
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
                await _exhaust(proxy, upstream.url)
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
