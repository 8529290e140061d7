"""A temporary raise in the aggregator (issue 23): while it lasts, by the events' own
time, the counter's verdicts carry the raised limit and its state and threshold alerts
measure it; events after ``until`` measure the base limit again."""

from __future__ import annotations

from datetime import timedelta

from aggregator.counting.process import BatchProcessor
from schemas.codec import ALERT, BUDGET_RAISE, VERDICT
from schemas.ids import counter_key
from schemas.periods import to_micros
from schemas.raises import BudgetRaise
from tests.aggregator.test_process import COST, T0, Store, event, records, reference

KEY = counter_key("per-secret", ("acme", "sk-a"))
BASE = 50_000_000  # per-secret's limit_usd "0.05"; each event costs COST (4.5M)


def test_state_labels_and_alerts_follow_the_raise_until_it_ends() -> None:
    ref = reference()
    granted = BudgetRaise(
        raise_id="r-1",
        budget_id="per-secret",
        scope_values=("acme", "sk-a"),
        mode="by",
        raise_nanos=BASE,
        raise_tokens=None,
        raise_requests=None,
        starts_at_us=to_micros(T0),
        until_us=to_micros(T0 + timedelta(seconds=10)),
        reason="test",
    )
    ref.apply_raise(b"r-1", None)  # an unknown tombstone is nothing

    ref.apply_raise(b"r-1", BUDGET_RAISE.encode(granted.to_record()))
    store, processor = Store(), BatchProcessor(ref, source_topic="usage.raw")
    # event i occurs at T0 + i s: events 0-9 under the raise (limit 2 x BASE), then base
    outs = [store.run(processor, records([event(i)], start=i)) for i in range(13)]
    verdicts = [VERDICT.decode(out.verdicts[KEY]) for out in outs]
    assert {v["limit_nanos"] for v in verdicts[:10]} == {2 * BASE}
    assert [v["state"] for v in verdicts[:10]] == ["ok"] * 10  # 45M of 100M at most
    assert {v["limit_nanos"] for v in verdicts[10:]} == {BASE}
    assert [v["state"] for v in verdicts[10:]] == ["alert", "exceeded", "exceeded"]
    alerts = [
        ALERT.decode(v) for n, out in enumerate(outs) for k, v in out.alerts if b"per-secret" in k
    ]
    # the forecast measures the raised limit too: $0.1 at $0.0045 a second (the first
    # event's burn over one bucket) runs out in about two hours
    forecast = alerts.pop(0)
    assert (forecast["kind"], forecast["limit_nanos"]) == ("forecast", 2 * BASE)
    # without the raise 0.5 would fire at event 6; here at 10 (49.5M of 50M), 1.0 at 11
    assert [(a["threshold"], a["limit_nanos"], a["spent_nanos"]) for a in alerts] == [
        (0.5, BASE, 11 * COST),
        (1.0, BASE, 12 * COST),
    ]
    # another secret of the same budget was never raised
    other = store.run(processor, records([event(20, secret_id="sk-b")], start=20))
    assert (
        VERDICT.decode(other.verdicts[counter_key("per-secret", ("acme", "sk-b"))])["limit_nanos"]
        == BASE
    )
