"""A cutover under live traffic: the enforcer follows the switch and never sees a counter go
backwards within a period (real broker, real workers, the enforcer library)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.replay.generations import fold_views, group_progress, read_switch
from aggregator.replay.snapshots import fold_ledger, ledger_ends, load_reference
from enforcer import Enforcer, EnforcerConfig
from tests.pipeline_kit import Pipeline
from tests.replay.kit import make_events, publish_events, replay_beside

pytestmark = pytest.mark.integration


class EnforcerThread(threading.Thread):
    """An enforcer on its own event loop, recording every verdict it applies."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__(daemon=True)
        self.config = EnforcerConfig(
            bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix, client_id="cutover"
        )
        self.ready = threading.Event()
        self.stop_requested = threading.Event()
        #: (counter id, period, seq, nanos, tokens, requests) as the state held it after each apply
        self.observed: list[tuple[Any, ...]] = []
        self.result: dict[str, Any] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by the test
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        enforcer = Enforcer(self.config)
        state = enforcer.state

        def watch(cid: Any, period: str, as_of_us: int, seq: int) -> None:
            v = state.verdicts[cid]
            self.observed.append(
                (cid, v.period, v.seq, v.spent_nanos, v.spent_tokens, v.spent_requests)
            )

        state.on_verdict(watch)
        async with enforcer:
            await enforcer.wait_ready(120)
            self.ready.set()
            while not self.stop_requested.is_set():
                await asyncio.sleep(0.05)
            self.result = {
                "generation": enforcer.follower.generation,
                "switches": enforcer.follower.switches,
                "verdicts": {
                    v.counter_key: (
                        (v.period, v.spent_nanos, v.spent_tokens, v.spent_requests),
                        v.seq,
                    )
                    for v in state.verdicts.values()
                },
            }


class Traffic(threading.Thread):
    """A proxy publishing a few events every 100 ms until stopped."""

    def __init__(self, pipeline: Pipeline, start: int) -> None:
        super().__init__(daemon=True)
        self.pipeline, self.next = pipeline, start
        self.stop_requested = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_requested.is_set():
                publish_events(self.pipeline, make_events(10, seed=77, start=self.next))
                self.next += 10
                time.sleep(0.1)
        except BaseException as exc:
            self.error = exc


def test_a_cutover_under_live_traffic_never_shows_a_counter_going_backwards(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    publish_events(pipeline, make_events(500, seed=77))
    enforcer = EnforcerThread(pipeline)
    enforcer.start()
    assert enforcer.ready.wait(180) and enforcer.error is None, enforcer.error
    traffic = Traffic(pipeline, start=500)
    traffic.start()
    run = replay_beside(pipeline, tmp_path, "g2")
    try:
        run.start()
        run.wait_caught_up()
        report = run.report(settle_seconds=30)
        assert report.consistent, (report.vs_ledger[:5], (report.vs_clickhouse or [])[:5])
        switch_index = len(enforcer.observed)
        run.cutover(pipeline.worker)  # under traffic
        time.sleep(3)
    finally:
        traffic.stop_requested.set()
        traffic.join(30)
        run.stop()
    assert traffic.error is None, traffic.error
    assert traffic.next > 520, "the traffic did not run during the replay"

    # g2 (now in the serving slot) catches up with everything published; the enforcer with it
    g2 = pipeline.topics.of_generation("g2")
    ends = asyncio.run(ledger_ends(pipeline.bootstrap, pipeline.topics))
    deadline = time.monotonic() + 120
    while not asyncio.run(group_progress(pipeline.bootstrap, g2)).past(ends):
        assert time.monotonic() < deadline, pipeline.worker.log_tail()
        time.sleep(0.5)
    time.sleep(3)
    enforcer.stop_requested.set()
    enforcer.join(30)
    assert enforcer.error is None, enforcer.error
    assert enforcer.result["generation"] == "g2" and enforcer.result["switches"] == 1

    # never backwards within a period, before, across and after the swap
    last: dict[Any, tuple[Any, ...]] = {}
    for cid, period, seq, nanos, tokens, requests in enforcer.observed:
        held = last.get(cid)
        if held is not None and held[0] == period:
            assert (seq, nanos, tokens, requests) >= held[1:], (cid, held, (seq, nanos))
            assert nanos >= held[2] and tokens >= held[3] and requests >= held[4]
        last[cid] = (period, seq, nanos, tokens, requests)
    assert len(enforcer.observed) > switch_index, "no verdict applied after the switch"

    # and it ends where the ledger says
    async def fold() -> Any:
        reference = await load_reference(pipeline.bootstrap, pipeline.topics)
        return await fold_ledger(pipeline.bootstrap, pipeline.topics, reference)

    assert enforcer.result["verdicts"] == fold_views(asyncio.run(fold()))


def test_without_a_local_worker_the_cutover_waits_for_the_old_generation_to_stop(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    publish_events(pipeline, make_events(100, seed=5))
    run = replay_beside(pipeline, tmp_path, "g2")
    run.start()
    errors: list[BaseException] = []
    finished = threading.Event()

    def cut_over() -> None:
        try:
            run.cutover(None, timeout=120)  # the old workers run "elsewhere"
        except BaseException as exc:
            errors.append(exc)
        finally:
            finished.set()

    try:
        run.wait_caught_up()
        worker = threading.Thread(target=cut_over, daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while (switch := asyncio.run(read_switch(pipeline.bootstrap, pipeline.topics))) is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert switch.generation == "g2" and not switch.previous_retired
        time.sleep(3)  # the old generation still runs: not retired
        assert not finished.is_set()
        switch = asyncio.run(read_switch(pipeline.bootstrap, pipeline.topics))
        assert switch is not None and not switch.previous_retired
        pipeline.worker.stop()
        assert finished.wait(60) and not errors, errors
        switch = asyncio.run(read_switch(pipeline.bootstrap, pipeline.topics))
        assert switch is not None and switch.previous_retired
        assert run.worker.pid() is not None  # the new generation keeps running
    finally:
        run.stop()
