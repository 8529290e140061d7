"""A webhook receiver on 127.0.0.1 (aiohttp, in a thread of its own), alerts on the real
broker, and `spendbus notify run` as a process: what the notify tests share."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from notify.deliveries import Delivery, DeliveryState
from notify.payload import verify_signature
from notify.service import read_topic
from schemas.budgets import budget_from_yaml
from schemas.codec import ALERT, BUDGET_POLICY
from schemas.ids import compose
from schemas.topics import Topics
from spendbus.stack.compacted import publish


@dataclass
class Received:
    path: str
    idempotency_key: str | None
    signature: str | None
    body: bytes
    status: int

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """Answers each POST by the plan of its path: ``fail_first[path]`` answers with
    ``fail_status`` before the first success, ``failing`` paths fail until cleared,
    ``fail_after[path]`` successes turn the path into a failing one (decided under the
    lock as each request arrives, so a fast sender cannot slip past it)."""

    fail_first: dict[str, int] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    fail_after: dict[str, int] = field(default_factory=dict)
    fail_status: int = 503
    status_for: dict[str, int] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str, token: str = "tok-secret-123") -> str:
        return f"http://127.0.0.1:{self.port}{path}?token={token}"

    async def _handle(self, request: web.Request) -> web.Response:
        data = await request.read()
        path = request.path
        with self._lock:
            if path in self.status_for:
                status = self.status_for[path]
            elif path in self.failing:
                status = self.fail_status
            elif self.fail_first.get(path, 0) > 0:
                self.fail_first[path] -= 1
                status = self.fail_status
            else:
                status = 200
            if status == 200 and path in self.fail_after:
                self.fail_after[path] -= 1
                if self.fail_after[path] <= 0:
                    del self.fail_after[path]
                    self.failing.add(path)
            self.received.append(
                Received(
                    path,
                    request.headers.get("Idempotency-Key"),
                    request.headers.get("X-Spendbus-Signature"),
                    data,
                    status,
                )
            )
        return web.Response(status=status, text="ok" if status == 200 else "no")

    def accepted(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path and r.status == 200]

    def attempts(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def until(
        self, what: Callable[[], bool], timeout: float = 90.0, log: Path | None = None
    ) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
                raise AssertionError(f"timed out; received {len(self.received)}\n{tail}")
            time.sleep(0.05)


def start_receiver(receiver: Receiver) -> Iterator[Receiver]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", receiver._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        receiver.port = runner.addresses[0][1]
        runner_box.append(runner)
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()))
    thread.daemon = True
    thread.start()
    ready.wait(10)
    try:
        yield receiver
    finally:
        asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def threshold_alert(
    budget_id: str, org: str, threshold: float = 0.8, period: str = "2026-12"
) -> dict[str, Any]:
    key = compose([budget_id, org])
    return {
        "alert_id": f"{key}|{period}|{threshold}",
        "kind": "threshold",
        "counter_key": key,
        "budget_id": budget_id,
        "period": period,
        "threshold": threshold,
        "state": "exceeded" if threshold >= 1.0 else "alert",
        "spent_nanos": int(400 * threshold * 1e9),
        "spent_tokens": 1000,
        "spent_requests": 10,
        "limit_nanos": 400_000_000_000,
        "limit_tokens": None,
        "limit_requests": None,
        "model": None,
        "as_of": datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
    }


def unpriced(model: str) -> dict[str, Any]:
    return {
        **threshold_alert("", "", 0.0),
        "alert_id": f"unpriced|{model}",
        "kind": "unpriced_model",
        "counter_key": "",
        "budget_id": "",
        "period": "",
        "state": "ok",
        "limit_nanos": None,
        "model": model,
    }


def publish_alerts(bootstrap: str, topics: Topics, alerts: list[dict[str, Any]]) -> None:
    asyncio.run(
        publish(
            bootstrap,
            topics.shared_alerts,
            [(a["counter_key"].encode() or b"unpriced", ALERT.encode(a)) for a in alerts],
        )
    )


def publish_budgets(bootstrap: str, topics: Topics, items: list[dict[str, Any]]) -> None:
    budgets = [budget_from_yaml(item) for item in items]
    now = datetime.now(UTC)
    asyncio.run(
        publish(
            bootstrap,
            topics.budget_policies,
            [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
        )
    )


def deliveries(bootstrap: str, topics: Topics) -> list[Delivery]:
    state = DeliveryState()
    for key, value in asyncio.run(read_topic(bootstrap, topics.notify_deliveries)):
        if key is not None:
            state.add(key, value)
    return list(state.finished.values())


@dataclass
class NotifierProcess:
    bootstrap: str
    topics: Topics
    log: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> NotifierProcess:
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": self.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": self.topics.prefix,
            **self.env,
        }
        if "CLICKHOUSE_DSN" not in self.env:  # the delivery log only when a test asks
            env.pop("CLICKHOUSE_DSN", None)
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spendbus", "notify", "run", *self.args],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(30)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        return self.process.returncode


def verify(received: Received, secret: str) -> bool:
    return received.signature is not None and verify_signature(
        secret, received.body, received.signature
    )
