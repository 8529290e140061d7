"""The batch processor and the counter fold, without Faust: exactly-once, periods, alerts, DLQ."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.batch_output import BatchOutput
from aggregator.counting.fold import CounterState
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from schemas.budgets import applicable, budgets_from_yaml
from schemas.codec import ALERT, DEAD_LETTER, PRICED_USAGE, USAGE_EVENT, VERDICT
from schemas.ids import counter_key, decompose, ids_are_canonical
from schemas.periods import period_key
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.records import UsageEvent
from schemas.topics import parse_store_row, usage_raw_key
from schemas.usage import new_usage_event

PRICES = price_table_from_yaml(
    yaml.safe_load(
        """
version: "test-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
  - {match: gpt-4o, input_per_mtok: "2.50", output_per_mtok: "10.00"}
"""
    ),
    source="test",
)
BUDGETS = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: per-secret, scope: secret, window: month, limit_usd: "0.05", alert_at: [0.5, 1.0]}
- {id: org-day, scope: org, window: day, limit_tokens: 100000}
- {id: grant, scope: grant, window: total, limit_requests: 1000}
- {id: job, scope: session, window: total, limit_usd: "1"}
- {id: rolling, scope: org, window: "rolling:1h", limit_usd: "100"}
"""
    )
)
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def reference() -> Reference:
    ref = Reference()
    ref.prices = PriceBook([PRICES] if not isinstance(PRICES, list) else PRICES)
    ref.budgets = {b.budget_id: b for b in BUDGETS}
    return ref


def event(i: int = 0, **over: Any) -> UsageEvent:
    base: dict[str, Any] = dict(
        event_id=f"ev-{i}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-a",
        org_id="acme",
        gateway_id="gw",
        input_tokens=1000,
        output_tokens=100,
        occurred_at=T0 + timedelta(seconds=i),
    )
    base.update(over)
    return new_usage_event(**base)


def records(events: list[UsageEvent], partition: int = 0, start: int = 0) -> list[RawRecord]:
    return [
        RawRecord(partition, start + n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
        for n, e in enumerate(events)
    ]


class Store:
    """The two tables, as the agent keeps them: values written back after each batch."""

    def __init__(self) -> None:
        self.counters: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}

    def read_counter(self, partition: int, key: str) -> Any:
        return self.counters.get(key)

    def read_seen(self, partition: int, key: str) -> Any:
        return self.seen.get(key)

    def run(
        self, processor: BatchProcessor, batch: list[RawRecord], now: datetime = T0
    ) -> BatchOutput:
        out = processor.process(batch, self.read_counter, self.read_seen, now=now)
        for (_, key), value in out.counter_writes.items():
            self.counters[key] = value
        for (_, key), position in out.seen_writes.items():
            self.seen[key] = position
        return out

    def totals(self, budget_id: str, *scope: str) -> tuple[int, int, int]:
        state = CounterState.from_json(self.counters[counter_key(budget_id, scope)])
        t = state.periods[state.period]
        return t.nanos, t.tokens, t.requests


# 1000 input at $3/M = 3000 nanos... in nanos: 1000 * 3 * 1000 = 3_000_000; 100 out * 15 * 1000 = 1_500_000
COST = 4_500_000


def test_priced_events_carry_the_ids_as_counted_and_their_store_row_position() -> None:
    """usage.priced bodies are the usage_events rows as stored (schemas/topics.py,
    STORE_ROW_HEADER): ids canonical however they were sent, the header their position."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    sent = [
        event(0),
        event(
            1, org_id=" acme ", secret_id="sk-a ", user_id=" Alice@Example.COM ", groups=[" Eng "]
        ),
        event(2, project_id="   ", session_id=" job-1 "),
    ]
    out = store.run(processor, records(sent))
    priced = [PRICED_USAGE.decode(v) for _, _, v, _ in out.priced]
    assert [p["event"]["org_id"] for p in priced] == ["acme"] * 3
    assert priced[1]["event"]["secret_id"] == "sk-a"
    assert priced[1]["event"]["user_id"] == "alice@example.com"
    assert priced[1]["event"]["groups"] == ["Eng"]
    assert priced[2]["event"]["project_id"] is None
    assert priced[2]["event"]["session_id"] == "job-1"
    assert all(ids_are_canonical(p["event"]) for p in priced)
    # the rest of the event is as sent, and each record's header is its source position
    for p, e in zip(priced, sent, strict=True):
        assert p["event"]["event_id"] == e["event_id"] and p["event"]["input_tokens"] == 1000
    month = T0.year * 100 + T0.month
    headers = [parse_store_row(h) for _, _, _, h in out.priced]
    assert headers == [(p["source_partition"], p["source_offset"], month) for p in priced]
    # one counter for the ids however written: the three events count in the same one
    assert store.totals("per-secret", "acme", "sk-a")[2] == 3


def test_prices_counts_and_emits_priced_events_and_verdicts() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    out = store.run(processor, records([event(i) for i in range(3)]))
    assert out.stats.charged == 3 and out.stats.cost_nanos == 3 * COST
    assert store.totals("per-secret", "acme", "sk-a") == (3 * COST, 3 * 1100, 3)
    priced = [PRICED_USAGE.decode(v) for _, _, v, _ in out.priced]
    assert [p["source_offset"] for p in priced] == [0, 1, 2]
    assert {p["price_version"] for p in priced} == {"test-1"}
    verdict = VERDICT.decode(out.verdicts[counter_key("per-secret", ("acme", "sk-a"))])
    assert (
        verdict["spent_nanos"] == 3 * COST
        and verdict["seq"] == 3
        and verdict["period"] == "m:2026-11"
    )
    assert verdict["reset_at"] == datetime(2026, 12, 1, tzinfo=UTC)


def test_a_redelivered_batch_is_fenced_and_resends_verdicts() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    batch = records([event(i) for i in range(5)])
    store.run(processor, batch)
    processor.forget()  # the worker crashed: its cache is gone, the tables remain
    again = store.run(processor, batch)
    assert store.totals("per-secret", "acme", "sk-a") == (5 * COST, 5 * 1100, 5)
    assert again.stats.redelivered == 5 and again.stats.duplicates == 0
    # the verdict goes out again (same seq): the crash may have come before it left
    assert VERDICT.decode(again.verdicts[counter_key("per-secret", ("acme", "sk-a"))])["seq"] == 5


def test_a_crash_between_counter_writes_is_repaired_by_the_fences() -> None:
    """Only one of two counters was written before the crash: re-delivery completes the other."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    batch = records([event(0)])
    out = processor.process(batch, store.read_counter, store.read_seen, now=T0)
    first_key = sorted(k for _, k in out.counter_writes)[0]
    store.counters[first_key] = out.counter_writes[(0, first_key)]  # the rest was lost
    processor.forget()  # ...with the process and its cache
    store.run(processor, batch)
    assert store.totals("per-secret", "acme", "sk-a") == (COST, 1100, 1)
    assert store.totals("org-day", "acme") == (COST, 1100, 1)


def test_an_event_id_published_twice_is_charged_once() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    out = store.run(processor, records([event(1), event(1), event(2)]))
    later = store.run(processor, records([event(1)], start=10))
    assert out.stats.duplicates == 1 and later.stats.duplicates == 1
    assert store.totals("per-secret", "acme", "sk-a")[0] == 2 * COST
    assert len(out.priced) == 2 and not later.priced


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not avro at all", "bad_magic"),
        (b"\xc3\x01" + b"\x11" * 8 + b"x", "unknown_fingerprint"),
        (USAGE_EVENT.header + b"\x02\x41", "malformed"),
        (VERDICT.header + b"\x00", "wrong_schema"),
        (None, "null_value"),
    ],
)
def test_unreadable_records_become_dead_letters(value: bytes | None, reason: str) -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    batch = [RawRecord(0, 0, b"acme", value), *records([event(1)], start=1)]
    out = store.run(processor, batch)
    assert out.stats.dead_letters == 1 and out.stats.charged == 1
    letter = DEAD_LETTER.decode(out.dead_letters[0][1])
    assert letter["reason"] == reason and letter["value"] == value and letter["source_offset"] == 0


def test_negative_tokens_written_by_a_bad_producer_are_dead_lettered() -> None:
    """The codec cannot stop a foreign producer writing -5 into a long: validation does."""
    good = event(0)
    bad = {**good, "input_tokens": -5}
    from io import BytesIO

    from fastavro import schemaless_writer

    buf = BytesIO()
    buf.write(USAGE_EVENT.header)
    schemaless_writer(buf, USAGE_EVENT.parsed, bad)
    out = Store().run(
        BatchProcessor(reference(), source_topic="usage.raw"),
        [RawRecord(0, 0, b"acme", buf.getvalue())],
    )
    letter = DEAD_LETTER.decode(out.dead_letters[0][1])
    assert letter["reason"] == "invalid_field" and "input_tokens" in letter["detail"]


def test_alerts_fire_once_per_threshold_and_period() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    # limit $0.05 = 50_000_000 nanos; each event 4_500_000: 0.5 crossed at event 6, 1.0 at event 12
    outs = [store.run(processor, records([event(i)], start=i)) for i in range(15)]
    alerts = [ALERT.decode(v) for out in outs for _, v in out.alerts if b"per-secret" in _]
    thresholds = [a for a in alerts if a["kind"] == "threshold"]
    assert [(a["threshold"], a["state"]) for a in thresholds] == [
        (0.5, "alert"),
        (1.0, "exceeded"),
    ]
    # at $0.0045 a second the month's $0.05 runs out within the hour: one forecast alert,
    # from the first event on (schemas/forecast.py: a burn over one bucket at least)
    forecasts = [a for a in alerts if a["kind"] == "forecast"]
    assert [a["alert_id"] for a in forecasts] == [
        f"forecast|{counter_key('per-secret', ('acme', 'sk-a'))}|m:2026-11"
    ]
    exhausts_at = forecasts[0]["exhausts_at"]
    assert exhausts_at is not None and exhausts_at > forecasts[0]["as_of"] == T0
    assert (
        VERDICT.decode(outs[-1].verdicts[counter_key("per-secret", ("acme", "sk-a"))])["state"]
        == "exceeded"
    )


def refused(i: int, budget_id: str | None, **over: Any) -> UsageEvent:
    """A request an enforcer refused (nothing was sent upstream)."""
    return event(
        i,
        outcome="refused",
        decision="budget_exceeded" if budget_id else "throttled",
        decision_budget_id=budget_id,
        status_code=429,
        input_tokens=0,
        output_tokens=0,
        usage_source="none",
        **over,
    )


def test_a_refusal_sends_the_budgets_exhausted_alert_once_a_period() -> None:
    """Refusals keep spend under the limit (what does not fit what is left is refused), so
    spend alone never crosses 1.0: the first refusal for a budget is its ``exhausted``
    alert, once per counter and period; a refusal for another budget, or none, is not."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    key = counter_key("per-secret", ("acme", "sk-a"))
    # ten allowed events: $0.045 of $0.05 (0.5 crossed), then what the enforcer refused
    batches = [
        [event(i) for i in range(10)],
        [refused(10, None), refused(11, "org-day"), refused(12, "per-secret")],
        [refused(13, "per-secret")],
    ]
    outs, offset = [], 0
    for batch in batches:
        outs.append(store.run(processor, records(batch, start=offset)))
        offset += len(batch)
    alerts = [[ALERT.decode(v) for k, v in out.alerts if k == key.encode()] for out in outs]
    assert [a["kind"] for a in alerts[0]] == ["threshold", "forecast"]
    assert [a["kind"] for a in alerts[2]] == []
    (exhausted,) = alerts[1]
    assert exhausted["kind"] == "exhausted" and exhausted["threshold"] == 1.0
    assert exhausted["alert_id"] == f"{key}|m:2026-11|exhausted"
    assert exhausted["spent_nanos"] == 10 * COST and exhausted["limit_nanos"] == 50_000_000
    assert exhausted["state"] == "alert"  # under the limit: spend alone says nothing more
    # a re-delivery of the refusal (same offset) sends nothing again
    again = store.run(processor, records([refused(12, "per-secret")], start=12))
    assert not [v for k, v in again.alerts if k == key.encode()]
    # the next period's first refusal is that period's alert
    december = datetime(2026, 12, 1, 9, tzinfo=UTC)
    out = store.run(
        processor,
        records([refused(14, "per-secret", occurred_at=december)], start=14),
        december,
    )
    ((kind, period),) = [
        (a["kind"], a["period"])
        for a in (ALERT.decode(v) for k, v in out.alerts if k == key.encode())
    ]
    assert (kind, period) == ("exhausted", "m:2026-12")


def test_a_late_event_counts_in_its_own_period_and_never_touches_the_current_verdict() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    now = datetime(2026, 12, 1, 2, tzinfo=UTC)
    store.run(processor, records([event(0, occurred_at=datetime(2026, 12, 1, 1, tzinfo=UTC))]), now)
    out = store.run(
        processor,
        records([event(1, occurred_at=datetime(2026, 11, 30, 23, tzinfo=UTC))], start=1),
        now,
    )
    state = CounterState.from_json(store.counters[counter_key("per-secret", ("acme", "sk-a"))])
    assert state.period == "m:2026-12"
    assert state.periods["m:2026-11"].nanos == COST and state.periods["m:2026-12"].nanos == COST
    assert counter_key("per-secret", ("acme", "sk-a")) not in out.verdicts


def test_grant_fan_out_is_one_counter() -> None:
    """A wildcard grant fanned out into 14 permission rows spends one budget."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    batch = records([event(i, grant_id="g-1", permission_id=f"perm-{i}") for i in range(14)])
    store.run(processor, batch)
    grant_counters = [k for k in store.counters if decompose(k)[0] == "grant"]
    assert grant_counters == [counter_key("grant", ("acme", "g-1"))]
    assert store.totals("grant", "acme", "g-1")[2] == 14


def test_session_budgets_refuse_as_job_budget_exceeded() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    out = store.run(processor, records([event(0, session_id="job-7", user_id=" Bob@X.io ")]))
    verdict = VERDICT.decode(out.verdicts[counter_key("job", ("acme", "bob@x.io", "job-7"))])
    assert verdict["refusal"] == "job_budget_exceeded"


def test_refused_requests_count_only_when_the_budget_says_count_denied() -> None:
    ref = reference()
    counted = budgets_from_yaml(
        [
            {
                "id": "req",
                "scope": "org",
                "window": "total",
                "limit_requests": 5,
                "count_denied": True,
            }
        ]
    )
    ref.budgets["req"] = counted[0]
    store, processor = Store(), BatchProcessor(ref, source_topic="usage.raw")
    refused = event(
        0,
        input_tokens=0,
        output_tokens=0,
        outcome="refused",
        decision="budget_exceeded",
        status_code=402,
    )
    store.run(processor, records([refused]))
    assert store.totals("req", "acme")[2] == 1
    assert store.totals("org-day", "acme")[2] == 0


# --- the property: counters equal a brute-force recomputation -----------------------------

#: the worker's clock in the property: after every event it folds (none is from the future)
LATER = T0 + timedelta(days=41)
EVENTS = st.lists(
    st.tuples(
        st.integers(0, 30),  # event id (repeats = duplicate publishes)
        st.sampled_from(["acme", "globex"]),
        st.sampled_from(["sk-a", "sk-b"]),
        st.integers(0, 24 * 40),  # hours after T0: crosses days and a month, out of order
        st.integers(0, 50_000),
        st.integers(0, 5_000),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.integers(1, 7), st.data())
def test_counters_equal_a_brute_force_recomputation(
    raw: list[tuple[int, str, str, int, int, int]], batch_size: int, data: st.DataObject
) -> None:
    ref = reference()
    evs = [
        event(
            eid,
            org_id=org,
            secret_id=secret,
            occurred_at=T0 + timedelta(hours=hours),
            input_tokens=inp,
            output_tokens=out,
        )
        for eid, org, secret, hours, inp, out in raw
    ]
    # the same event id always carries the same payload (a duplicate publish)
    first: dict[str, UsageEvent] = {}
    evs = [first.setdefault(e["event_id"], e) for e in evs]
    batch = records(evs)
    store, processor = Store(), BatchProcessor(ref, source_topic="usage.raw")
    position = 0
    while position < len(batch):
        chunk = batch[position : position + batch_size]
        store.run(processor, chunk, LATER)
        if data.draw(st.booleans()):  # a crash: the chunk is delivered again
            if data.draw(st.booleans()):
                processor.forget()  # a process crash (a rebalance keeps the process)
            store.run(processor, chunk, LATER)
        position += batch_size
    # brute force: every distinct event once, into every (budget, counter, period)
    expected: dict[tuple[str, str], list[int]] = {}
    for e in first.values():
        cost = ref.prices.price_event(e).cost_nanos
        for budget, key, _ in applicable(BUDGETS, e):
            if budget.window.kind == "rolling":
                continue
            slot = expected.setdefault((key, period_key(budget.window, e["occurred_at"])), [0, 0])
            slot[0] += cost
            slot[1] += e["input_tokens"] + e["output_tokens"]
    for (key, period), (nanos, tokens) in expected.items():
        state = CounterState.from_json(store.counters[key])
        if period in state.periods:  # only the newest KEPT_PERIODS are kept
            assert (state.periods[period].nanos, state.periods[period].tokens) == (nanos, tokens)
        assert period <= state.period


def test_an_unpriced_model_is_charged_zero_and_alerted_once() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    first = store.run(processor, records([event(i, model="mystery-9") for i in range(3)]))
    later = store.run(processor, records([event(10, model="mystery-9")], start=10))
    alerts = [ALERT.decode(v) for out in (first, later) for _, v in out.alerts]
    unpriced = [a for a in alerts if a["kind"] == "unpriced_model"]
    assert [(a["alert_id"], a["model"]) for a in unpriced] == [("unpriced|mystery-9", "mystery-9")]
    assert first.stats.unpriced == 3 and first.stats.cost_nanos == 0
    assert first.unpriced_models == {"mystery-9"}


def test_a_record_keyed_by_anything_but_its_org_is_dead_lettered_uncounted() -> None:
    """The key decides the partition, and the partition holds the org's counters and
    dedupe: a record keyed otherwise is a dead letter (wrong_key), its bytes kept."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    sent = [event(0), event(1, org_id=" acme "), event(2)]
    keys = [b"sk-a", b"acme", None]  # by secret; canonical org of " acme "; none
    batch = [
        RawRecord(0, n, k, USAGE_EVENT.encode(e))
        for n, (k, e) in enumerate(zip(keys, sent, strict=True))
    ]
    out = store.run(processor, batch)
    letters = [DEAD_LETTER.decode(v) for _, v in out.dead_letters]
    assert [(x["reason"], x["source_offset"], x["key"]) for x in letters] == [
        ("wrong_key", 0, b"sk-a"),
        ("wrong_key", 2, None),
    ]
    assert letters[0]["value"] == USAGE_EVENT.encode(sent[0])
    assert out.stats.charged == 1 and store.totals("per-secret", "acme", "sk-a")[0] == COST
