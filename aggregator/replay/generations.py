"""Generations: one build of everything the aggregator derives from the ledger.

A generation (docs/replay.md) has its own consumer group and table namespace
(``Topics.aggregator_app_id``), its own derived topics (``Topics(prefix,
generation)``) and its own ClickHouse store (:func:`generation_dsn`). This
module holds the aggregator's side of it:

* the control topic: :func:`read_switch` / :func:`publish_switch`;
* :func:`group_progress`: how far a generation's workers have read the ledger
  (their committed offsets against the ends), for the replay's progress bar;
* :class:`AlertRelay`: a replay generation stages its alerts and, once it is
  current and its predecessor retired, forwards into the shared alert topic
  only the alerts that topic does not already carry (exactly one alert per
  counter, period and threshold across replays);
* the comparisons a replay reports: :func:`compare_verdicts` (two
  generations, or a generation and an in-memory fold) and
  :func:`counters_from_rows` (the counters recomputed from ClickHouse rows).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from aggregator.counting.fold import CounterState, apply
from aggregator.replay.snapshots import FoldState
from runtime.clickhouse_access import ClickHouseAccess
from runtime.kafka import PLAINTEXT, KafkaSecurity, committed_offsets, topic_partitions
from runtime.topic_reader import TopicReader, read_latest_values
from schemas.budgets import Budget, applicable
from schemas.codec import ALERT, VERDICT
from schemas.errors import ConfigError, ContractError
from schemas.generations import GenerationSwitch
from schemas.topics import CONTROL_KEY, Topics, check_generation

log = logging.getLogger(__name__)


# --- names and stores ---------------------------------------------------------------------


def generation_dsn(dsn: str, generation: str) -> str:
    """The ClickHouse store of ``generation``: the embedded engine's path with a suffix
    (``chdb:///data/clickhouse-g2``), or on a server a database with a suffix
    (``http://host:8123/spendbus_g2``). The default generation keeps ``dsn``."""
    check_generation(generation)
    if not generation:
        return dsn
    parts = urlsplit(dsn)
    if parts.scheme == "chdb":  # chdb:///abs/path (urlunsplit would drop the empty host)
        return f"chdb://{parts.path.rstrip('/')}-{generation}"
    if parts.scheme in ("http", "https"):
        database = parts.path.strip("/") or "default"
        return urlunsplit(parts._replace(path=f"/{database}_{generation}"))
    raise ConfigError(f"CLICKHOUSE_DSN {parts.scheme}://...: cannot derive a generation's store")


def prepare_store(dsn: str, generation: str, access: ClickHouseAccess | None = None) -> str:
    """Create the generation's database on a server (the embedded engine makes its own path).

    ``access``: an https:// server's CA file, verification and password.
    """
    target = generation_dsn(dsn, generation)
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        from aggregator.sink import open_client

        client = open_client(urlunsplit(parts._replace(path="/default")), access=access)
        try:
            client.command(f"CREATE DATABASE IF NOT EXISTS `{parts.path.strip('/')}`")
        finally:
            client.close()
    return target


# --- the control topic ----------------------------------------------------------------------


async def read_switch(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> GenerationSwitch | None:
    """The control topic's live value; None when no switch was ever made (default generation)."""
    try:
        values = await read_latest_values(bootstrap, topics.generations, security=security)
    except ConfigError:  # a stack created before generations existed
        return None
    raw = values.get(CONTROL_KEY)
    return None if raw is None else GenerationSwitch.decode(raw)


async def current_generation(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> str:
    switch = await read_switch(bootstrap, topics, security=security)
    return "" if switch is None else switch.generation


async def publish_switch(
    bootstrap: str, topics: Topics, switch: GenerationSwitch, *, security: KafkaSecurity = PLAINTEXT
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **security.client_kwargs()
    )
    await producer.start()
    try:
        await (await producer.send(topics.generations, key=CONTROL_KEY, value=switch.encode()))
    finally:
        await producer.stop()


def switch_to(generation: str, previous: str, *, retired: bool) -> GenerationSwitch:
    return GenerationSwitch(generation, previous, retired, datetime.now(UTC))


# --- progress of a generation's workers -------------------------------------------------------


@dataclass(frozen=True)
class GroupProgress:
    #: ledger records the generation has committed (read and flushed), and the ledger's end
    committed: int
    end: int
    #: partition -> (committed offset, end offset)
    partitions: dict[int, tuple[int, int]]

    @property
    def lag(self) -> int:
        return self.end - self.committed

    def past(self, offsets: Mapping[int, int]) -> bool:
        """Every partition committed at or past ``offsets``."""
        return all(self.partitions.get(p, (0, 0))[0] >= o for p, o in offsets.items())


async def group_progress(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> GroupProgress:
    """Committed offsets of the generation's consumer group on usage.raw, against the ends."""
    partitions = await topic_partitions(bootstrap, topics.usage_raw, security=security)
    committed = await committed_offsets(bootstrap, topics.aggregator_app_id, security=security)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **security.client_kwargs()
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    per: dict[int, tuple[int, int]] = {}
    for tp in partitions:
        per[tp.partition] = (committed.get(tp, 0), ends[tp])
    return GroupProgress(
        committed=sum(c for c, _ in per.values()),
        end=sum(e for _, e in per.values()),
        partitions=per,
    )


async def group_members(
    bootstrap: str, group_id: str, *, security: KafkaSecurity = PLAINTEXT
) -> int:
    """How many consumers the group has now (0 for an empty or unknown group)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group_id])
    finally:
        await admin.close()
    members = 0
    for response in responses:
        for group in response.groups:
            # DescribeGroups v0+: (error_code, group_id, state, protocol_type, protocol, members, ...)
            members += len(group[5])
    return members


# --- alerts: exactly once across generations ----------------------------------------------------


class AlertRelay:
    """Forwards a replay generation's staged alerts into the shared alert topic.

    Why: a replay re-crosses every threshold history crossed, and those alerts
    were sent already. The relay waits until the control topic says its
    generation is current *and* the previous one retired (so no other writer of
    the shared topic is left), then reads the shared topic whole into a set of
    alert ids and forwards each staged alert whose id is not in it. It commits
    its own consumer offsets only after the forwarded alerts are acknowledged; a
    crash before that re-reads the shared topic at restart and so skips what it
    already forwarded.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        poll_seconds: float = 1.0,
        *,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        if not topics.generation:
            raise ConfigError("the default generation writes the shared alert topic itself")
        self.bootstrap = bootstrap
        self.security = security
        self.topics = topics
        self.poll_seconds = poll_seconds
        self.forwarded = 0
        self.suppressed = 0
        self.active = asyncio.Event()

    async def run(self) -> None:
        while True:
            switch = await read_switch(self.bootstrap, self.topics, security=self.security)
            if (
                switch is not None
                and switch.generation == self.topics.generation
                and switch.previous_retired
            ):
                break
            await asyncio.sleep(self.poll_seconds)
        sent = {
            ALERT.decode(v)["alert_id"]
            for v in (
                await topic_values(
                    self.bootstrap, self.topics.shared_alerts, security=self.security
                )
            )
            if v is not None
        }
        self.active.set()
        log.info(
            "alert relay active: %d alerts already in %s", len(sent), self.topics.shared_alerts
        )
        consumer = AIOKafkaConsumer(
            self.topics.budget_alerts,
            bootstrap_servers=self.bootstrap,
            group_id=f"{self.topics.aggregator_app_id}-alert-relay",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self.security.client_kwargs(),
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        await producer.start()
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=500, max_records=1000)
                futures = []
                for messages in batch.values():
                    for m in messages:
                        try:
                            alert_id = ALERT.decode(m.value)["alert_id"]
                        except ContractError:
                            continue
                        if alert_id in sent:
                            self.suppressed += 1
                            continue
                        sent.add(alert_id)
                        futures.append(
                            await producer.send(self.topics.shared_alerts, key=m.key, value=m.value)
                        )
                for future in futures:
                    await future
                self.forwarded += len(futures)
                if batch:
                    await consumer.commit()
        finally:
            await consumer.stop()
            await producer.stop()


async def topic_values(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> list[bytes | None]:
    """Every value of a (delete-policy) topic up to the end offsets seen at start."""
    out: list[bytes | None] = []
    async with TopicReader(bootstrap, topic, security=security) as reader:
        async for _, messages in reader:
            out.extend(m.value for m in messages)
    return out


async def alert_ids(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> list[str]:
    """The alert ids a topic carries, in order (repeats included: tests count them)."""
    return [
        ALERT.decode(v)["alert_id"]
        for v in await topic_values(bootstrap, topic, security=security)
        if v is not None
    ]


# --- comparisons --------------------------------------------------------------------------------

#: what is compared per counter: its newest period and the totals in it
CounterView = tuple[str, int, int, int]


@dataclass(frozen=True)
class Difference:
    counter_key: str
    field: str
    expected: Any
    found: Any


async def verdict_views(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, tuple[CounterView, int]]:
    """Each counter's live verdict as ((period, nanos, tokens, requests), seq)."""
    out: dict[str, tuple[CounterView, int]] = {}
    for key, value in (await read_latest_values(bootstrap, topic, security=security)).items():
        if value is None:
            out.pop(key.decode(), None)
            continue
        try:
            v = VERDICT.decode(value)
        except ContractError:
            continue
        view = (v["period"], v["spent_nanos"], v["spent_tokens"], v["spent_requests"])
        out[key.decode()] = (view, v["seq"])
    return out


def fold_views(state: FoldState) -> dict[str, tuple[CounterView, int]]:
    """Each folded counter as ((period, nanos, tokens, requests), seq)."""
    out = {}
    for key, (_, data) in state.counters.items():
        counter = CounterState.from_json(data)
        if counter.period:
            out[key] = (_view(counter), counter.seq)
    return out


def _view(state: CounterState) -> CounterView:
    t = state.periods[state.period]
    return (state.period, t.nanos, t.tokens, t.requests)


def compare_at_cut(
    expected: Mapping[str, tuple[CounterView, int]], found: Mapping[str, tuple[CounterView, int]]
) -> tuple[list[Difference], list[Difference]]:
    """(differences, pending): counters are compared where both sides are at the same
    ``seq`` (the same events applied: under live traffic one side may be ahead). A counter
    at different seqs, or present on one side only, is *pending*: read again later; pending
    for good, it is a difference."""
    differences: list[Difference] = []
    pending: list[Difference] = []
    for key in sorted(set(expected) | set(found)):
        mine, theirs = expected.get(key), found.get(key)
        if mine is None or theirs is None:
            pending.append(
                Difference(
                    key,
                    "counter",
                    "present" if mine else "missing",
                    "present" if theirs else "missing",
                )
            )
        elif mine[1] != theirs[1]:
            pending.append(Difference(key, "seq", mine[1], theirs[1]))
        else:
            differences.extend(compare_views({key: mine[0]}, {key: theirs[0]}))
    return differences, pending


def compare_views(
    expected: Mapping[str, CounterView], found: Mapping[str, CounterView]
) -> list[Difference]:
    """Every counter where ``found`` differs from ``expected`` (field by field)."""
    out: list[Difference] = []
    names = ("period", "spent_nanos", "spent_tokens", "spent_requests")
    for key in sorted(set(expected) | set(found)):
        mine, theirs = expected.get(key), found.get(key)
        if mine is None or theirs is None:
            out.append(
                Difference(
                    key,
                    "counter",
                    "present" if mine else "missing",
                    "present" if theirs else "missing",
                )
            )
            continue
        out.extend(
            Difference(key, name, a, b)
            for name, a, b in zip(names, mine, theirs, strict=True)
            if a != b
        )
    return out


def counters_from_rows(
    budgets: Iterable[Budget], rows: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[CounterView, int]]:
    """Recompute every counter from stored ClickHouse rows (``usage_events``, each with its
    stored ``cost_nanos``), in ledger order: what the analysts' table says the counters are."""
    ordered = sorted(rows, key=lambda r: (r["source_partition"], r["source_offset"]))
    states: dict[str, CounterState] = {}
    budget_list = sorted(budgets, key=lambda b: b.budget_id)
    for row in ordered:
        for budget, key, _ in applicable(budget_list, row):
            state = states.setdefault(key, CounterState())
            apply(
                state,
                budget,
                dict(row),
                row["cost_nanos"],
                row["source_partition"],
                row["source_offset"],
            )
    return {key: (_view(s), s.seq) for key, s in states.items() if s.period}


def install_alert_relay(
    app: Any, bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> AlertRelay:
    """Run an :class:`AlertRelay` as a task of a replay generation's Faust app."""
    relay = AlertRelay(bootstrap, topics, security=security)

    @app.task  # type: ignore[untyped-decorator]  # Faust's App.task is @no_type_check
    async def relay_alerts() -> None:
        await relay.run()

    return relay
