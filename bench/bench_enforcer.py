"""Benchmark of the enforcer: prints one JSON object.

1. check() in-process with 100k live counters: p50/p99/p99.9 µs per call.
   ``p*_us``: over 45k contexts prebuilt up front and cycled (each check starts
   with its context out of the CPU caches, the harsher case); ``fresh_ctx``: the
   context built (untimed) right before its check, as a proxy does per request;
   ``with_context_build``: building it timed too. Each allowed request's hold is
   released after the timed call, so holds stay steady. The garbage collector runs
   as an embedding proxy leaves it (nothing frozen): its collections and pauses inside
   the timed loop are reported (``gc_during_timed_checks``).
2. The sidecar over loopback, run as ``spendbus enforcer serve`` runs it (uvloop
   when installed, no access log): one server process pinned to one core (the
   affinity ``taskset -c 0`` sets), one client process (raw keep-alive HTTP/1.1
   on N connections) on the other. Rounds alternate between /v1/check and an
   aiohttp no-op handler in the same server (the floor: same client, same
   requests); medians of checks/s, of checks per server CPU-second, and their
   ratio to the floor. Bounded by count and time; 127.0.0.1 only. The server's clock
   moves with wall time and a sweep expires holds after ``SIDECAR_HOLD_S`` (as the
   follower's sweep does after ``hold_timeout``): holds stay steady, about what a
   proxy whose upstream calls take that long keeps in flight; checks/s counts only
   /v1/check answers. Each round reports the server's GC collections and pauses and
   the most holds outstanding; ``--handler-cpu`` adds the thread CPU spent inside
   each handler per request (a timing middleware on every route), to split the
   server's CPU per request into the handler's work and what aiohttp does around it.

No Kafka: the state is fed in memory the way the follower feeds it (the
follower's own cost is the 10k-counter restart test).

    .venv/bin/python bench/bench_enforcer.py [--checks 200000] [--seconds 5] [--connections 32]
        [--only check|sidecar] [--handler-cpu] [--baseline CHECKOUT --rounds 6 --seconds 1.5]

``--baseline``: this tree's sidecar and another checkout's, served at once on the same
pinned core, rounds alternating: the fairest comparison this shared VM allows. Both
run this file's harness over their own code; for the check section, run this file
with ``SPENDBUS_BENCH_ROOT=<checkout>`` to measure another checkout's check().

3. ``--work check|context|handler --work-ops N``: N untimed operations, for instruction
   counts under ``valgrind --tool=cachegrind --cache-sim=no`` (run with 0 and N, take the
   difference / N): figures that do not move with this shared VM's load.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# SPENDBUS_BENCH_ROOT: whose enforcer/ and schemas/ to load (--baseline runs this harness
# over another checkout's code, so both servers are measured the same way)
sys.path.insert(0, os.environ.get("SPENDBUS_BENCH_ROOT") or str(Path(__file__).parent.parent))

from pydantic import SecretStr

from enforcer import Context, Enforcer, EnforcerConfig
from schemas.budgets import Budget
from schemas.ids import counter_key
from schemas.periods import parse_window, period_end, period_key
from schemas.pricing import ModelPrice, PriceTable

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
USD = 1_000_000_000
ORGS, USERS_PER_ORG, SESSIONS_PER_USER = 1000, 45, 1
TOKEN = "bench-token"
#: the sidecar server's hold timeout: an unsettled hold lives about as long as a proxy's
#: upstream call would, then the sweep drops it (as the follower's sweep does), so holds
#: stay steady (~ rate x this) instead of piling up for the whole run
SIDECAR_HOLD_S = 2.0
#: how often the sidecar server sweeps expired holds (enforcer.follower.SWEEP_INTERVAL_S)
SWEEP_S = 1.0
#: --work handler: holds kept in flight (older ones released)
WORK_HOLDS = 1000


def _budget(
    budget_id: str, scope: str, window: str, action: str = "enforce", **limits: Any
) -> Budget:
    return Budget(
        budget_id=budget_id,
        scope=scope,
        window=parse_window(window),
        action=action,
        alert_at=(0.8,),
        **limits,
    )


BUDGETS = [
    _budget("org-monthly", "org", "month", limit_nanos=1000 * USD),
    _budget("user-daily", "user", "day", limit_nanos=20 * USD, limit_tokens=5_000_000),
    _budget("job-ceiling", "session", "total", limit_nanos=5 * USD),
    _budget("team-warn", "group", "week", action="warn", limit_nanos=200 * USD),
    _budget("hourly-rpm", "secret", "rolling:1h", limit_requests=100_000),
]


def _verdict(b: Budget, values: tuple[str, ...], spent: int, seq: int) -> dict[str, Any]:
    return {
        "counter_key": counter_key(b.budget_id, values),
        "budget_id": b.budget_id,
        "scope": b.scope,
        "scope_values": list(values),
        "period": period_key(b.window, NOW),
        "state": "ok",
        "spent_nanos": spent,
        "spent_tokens": spent // 20_000,  # ~$20 per million tokens
        "spent_requests": seq,
        "limit_nanos": b.limit_nanos,
        "limit_tokens": b.limit_tokens,
        "limit_requests": b.limit_requests,
        "action": b.action,
        "refusal": b.refusal,
        "reset_at": period_end(b.window, NOW),
        "as_of": NOW,
        "seq": seq,
        "emitted_at": NOW + timedelta(milliseconds=30),
    }


def loaded(
    counters: int = 100_000, *, moving_clock: bool = False, hold_timeout_s: float = 600.0
) -> tuple[Enforcer, list[Context]]:
    """An enforcer holding ``counters`` live verdicts, and contexts that hit them.

    The clock reads NOW (12:00 UTC, so no period rolls over during a run); with
    ``moving_clock`` it starts at NOW and advances with wall time (holds can expire)."""
    rng = random.Random(7)
    clock_t = NOW.timestamp()
    clock = (lambda: clock_t) if not moving_clock else _moving_clock(clock_t)
    config = EnforcerConfig(sidecar_token=SecretStr(TOKEN), hold_timeout_s=hold_timeout_s)
    e = Enforcer(config, clock=clock)
    for b in BUDGETS:
        e.state.apply_policy(b.budget_id, b.to_record(NOW))
    prices = PriceTable(
        version="v1",
        effective_from=NOW - timedelta(days=300),
        models=(ModelPrice.of("claude-sonnet-4", "3", "15"), ModelPrice.of("gpt-4o", "2.5", "10")),
    )
    e.state.apply_price("v1", prices.to_record())
    by = {b.budget_id: b for b in BUDGETS}
    contexts: list[Context] = []
    n = 0
    for o in range(ORGS):
        org = f"org-{o}"
        e.state.apply_verdict(*_pair(by["org-monthly"], (org,), rng.randrange(900 * USD), 1))
        n += 1
        for g in range(3):
            e.state.apply_verdict(
                *_pair(by["team-warn"], (org, f"team-{g}"), rng.randrange(250 * USD), 1)
            )
            n += 1
        for u in range(USERS_PER_ORG):
            user = f"user-{o}-{u}@example.com"
            secret = f"sk-{o}-{u}"
            session = f"run-{o}-{u}"
            # one user in ten has spent their day: those checks are refusals
            spent = 20 * USD if u % 10 == 0 else rng.randrange(15 * USD)
            for b, values, s in (
                (by["user-daily"], (org, user), spent),
                (by["job-ceiling"], (org, user, session), rng.randrange(4 * USD)),
            ):
                e.state.apply_verdict(*_pair(b, values, s, 1))
                n += 1
            contexts.append(
                Context(
                    org_id=org,
                    secret_id=secret,
                    user_id=user,
                    session_id=session,
                    groups=(f"team-{u % 3}",),
                    provider="anthropic",
                    api="messages",
                    model="claude-sonnet-4-5",
                    input_tokens=2000,
                    max_output_tokens=1024,
                )
            )
            if n >= counters:
                break
        if n >= counters:
            break
    while n < counters:  # top up with secrets' rolling counters
        e.state.apply_verdict(*_pair(by["hourly-rpm"], (f"org-{n % ORGS}", f"sk-x{n}"), 0, 1))
        n += 1
    e.state.ready = True
    e.state.fresh_at_us = int(clock_t * 1_000_000)
    rng.shuffle(contexts)
    return e, contexts


def _moving_clock(start: float) -> Callable[[], float]:
    offset = start - time.time()
    wall = time.time
    return lambda: wall() + offset


class GcPauses:
    """Garbage collections and their pauses while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pauses_ns: list[int] = []
        self._started = 0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.pauses_ns.append(time.perf_counter_ns() - self._started)
            self.collections[info["generation"]] += 1

    def summary(self, operations: int) -> dict[str, Any]:
        pauses = self.pauses_ns
        return {
            "collections_gen012": list(self.collections),
            "pause_total_ms": round(sum(pauses) / 1e6, 2),
            "pause_max_ms": round(max(pauses, default=0) / 1e6, 3),
            "pause_ns_per_op": round(sum(pauses) / operations, 1) if operations else None,
        }


def _pair(b: Budget, values: tuple[str, ...], spent: int, seq: int) -> tuple[str, dict[str, Any]]:
    record = _verdict(b, values, spent, seq)
    return record["counter_key"], record


def _pct(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def bench_check(checks: int) -> dict[str, Any]:
    e, contexts = loaded()
    live = len(e.state.verdicts)
    # the collector stays as an embedding proxy leaves it (on, nothing frozen): the pauses
    # it takes inside the timed calls are counted below, not hidden
    gc.collect()
    check, release = e.check, e.holds.release
    perf = time.perf_counter_ns
    for c in contexts[:2000]:  # warm the index, period and price caches
        d = check(c)
        if d.hold_id is not None:
            release(d.hold_id)
    samples: list[int] = []
    cpu_samples: list[int] = []
    refused = 0
    m = len(contexts)
    cpu = time.thread_time_ns
    pauses = GcPauses()
    pauses.__enter__()
    for i in range(checks):
        c = contexts[i % m]
        c0 = cpu()
        t0 = perf()
        d = check(c)
        t1 = perf()
        c1 = cpu()
        samples.append(t1 - t0)
        cpu_samples.append(c1 - c0)
        if d.hold_id is not None:
            release(d.hold_id)
        elif not d.allowed:
            refused += 1
    pauses.__exit__()
    samples.sort()
    us = [s / 1000 for s in samples]
    # context construction + check, as an in-process proxy pays it
    fields = [
        {
            k: getattr(c, k)
            for k in (
                "org_id",
                "secret_id",
                "user_id",
                "session_id",
                "groups",
                "provider",
                "api",
                "model",
                "input_tokens",
                "max_output_tokens",
            )
        }
        for c in contexts[:20000]
    ]
    with_ctx: list[int] = []
    for f in fields:
        t0 = perf()
        d = check(Context(**f))
        with_ctx.append(perf() - t0)
        if d.hold_id is not None:
            release(d.hold_id)
    with_ctx.sort()
    fresh: list[int] = []
    for i in range(checks // 2):
        c = Context(**fields[i % len(fields)])
        t0 = perf()
        d = check(c)
        fresh.append(perf() - t0)
        if d.hold_id is not None:
            release(d.hold_id)
    fresh.sort()
    # memory blocks one check leaves alive while its decision and hold live (rows, tuples,
    # the Decision, the hold): what the collector and the allocator see per request
    kept = []
    blocks = sys.getallocatedblocks()
    for c in contexts[:1000]:
        kept.append(check(c))
    blocks_per_check = (sys.getallocatedblocks() - blocks) / 1000
    for d in kept:
        if d.hold_id is not None:
            release(d.hold_id)
    return {
        "live_counters": live,
        "budgets": len(BUDGETS),
        "checks": checks,
        "refused_fraction": round(refused / checks, 3),
        "p50_us": round(_pct(us, 0.50), 2),
        "p99_us": round(_pct(us, 0.99), 2),
        "p999_us": round(_pct(us, 0.999), 2),
        "mean_us": round(statistics.fmean(us), 2),
        # CPU time of the calling thread: the same calls without the time the OS spent
        # running other processes (this box is shared); includes ~0.3 µs of clock overhead
        "cpu_p50_us": round(_pct(sorted(cpu_samples), 0.50) / 1000, 2),
        "cpu_p99_us": round(_pct(sorted(cpu_samples), 0.99) / 1000, 2),
        "fresh_ctx_p50_us": round(_pct(fresh, 0.50) / 1000, 2),
        "fresh_ctx_p99_us": round(_pct(fresh, 0.99) / 1000, 2),
        "fresh_ctx_p999_us": round(_pct(fresh, 0.999) / 1000, 2),
        "with_context_build_p50_us": round(_pct(with_ctx, 0.50) / 1000, 2),
        "with_context_build_p99_us": round(_pct(with_ctx, 0.99) / 1000, 2),
        "blocks_alive_per_decision": round(blocks_per_check, 1),
        "gc_during_timed_checks": pauses.summary(checks),
    }


# --- the sidecar ------------------------------------------------------------------------------
def _server(port_queue: Any, cpu: int | None, loop: str, handler_cpu: bool = False) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from aiohttp import web

    from enforcer import sidecar

    e, _ = loaded(moving_clock=True, hold_timeout_s=SIDECAR_HOLD_S)
    gc.collect()
    gc.freeze()  # as `spendbus enforcer serve` does once its state is loaded
    pauses = GcPauses()
    pauses.__enter__()
    holds_seen = [0]

    #: path -> [thread CPU ns inside the handler, requests] (--handler-cpu only)
    in_handlers: dict[str, list[int]] = {"/v1/check": [0, 0], "/noop": [0, 0]}

    def count_handler_cpu(path: str, spent_ns: int) -> None:
        spent = in_handlers.get(path)
        if spent is not None:
            spent[0] += spent_ns
            spent[1] += 1

    noop_body = json.dumps({"allowed": True, "decision": "allowed"}).encode()

    async def noop(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.Response(body=noop_body, content_type="application/json")

    async def stats(request: web.BaseRequest) -> web.Response:
        """The bench's own view of the server (not a sidecar route): collections, pauses,
        the most holds outstanding since the last read."""
        out = pauses.summary(0) | {
            "holds_max": holds_seen[0],
            "holds": len(e.holds),
            "in_handlers": in_handlers,
        }
        holds_seen[0] = len(e.holds)
        return web.Response(body=json.dumps(out).encode(), content_type="application/json")

    # the bench's own routes (the floor: aiohttp alone, same client, same body size; and
    # the stats) beside the sidecar's, served the way this tree's `serve` serves them:
    # its low-level handler when it has one (create_handler), else its application
    low_level = getattr(sidecar, "create_handler", None)
    if low_level is not None:
        served = low_level(e)

        def dispatch(request: web.BaseRequest) -> Any:
            path = request.path
            if path == "/noop":
                return noop(request)
            if path == "/bench/stats":
                return stats(request)
            return served(request)

        handle = dispatch
        if handler_cpu:  # one more coroutine around every route: the split, at a small cost
            thread_ns = time.thread_time_ns

            async def timed(request: web.BaseRequest) -> web.StreamResponse:
                started = thread_ns()
                response: web.StreamResponse = await dispatch(request)
                count_handler_cpu(request.path, thread_ns() - started)
                return response

            handle = timed
    else:
        app = sidecar.create_app(e)
        if handler_cpu:  # one middleware hop on every route: the split, at a small cost
            thread_ns = time.thread_time_ns

            @web.middleware
            async def timed_app(request: web.Request, handler: Any) -> web.StreamResponse:
                started = thread_ns()
                response: web.StreamResponse = await handler(request)
                count_handler_cpu(request.path, thread_ns() - started)
                return response

            app.middlewares.append(timed_app)
        app.router.add_post("/noop", noop)
        app.router.add_get("/bench/stats", stats)

    async def sweep() -> None:
        """What the follower's loop does besides reading: expire holds, confirm freshness."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now_us = int(e.clock() * 1_000_000)
            holds_seen[0] = max(holds_seen[0], len(e.holds))
            e.holds.expire(now_us)
            e.state.fresh_at_us = now_us

    async def main() -> None:
        sweeper = asyncio.create_task(sweep())  # runs until the process ends
        runner: web.BaseRunner
        if low_level is not None:
            loop = asyncio.get_running_loop()

            def request_factory(  # as sidecar.create_server
                message: Any, payload: Any, protocol: Any, writer: Any, task: Any
            ) -> web.BaseRequest:
                return web.BaseRequest(
                    message, payload, protocol, writer, task, loop, client_max_size=sidecar.MAX_BODY
                )

            server = web.Server(handle, request_factory=request_factory, access_log=None)
            runner = web.ServerRunner(server)
        else:
            runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()
        sweeper.cancel()

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def _bodies(n: int = 2000, path: str = "/v1/check") -> list[bytes]:
    _, contexts = loaded(counters=20_000)
    out = []
    for c in contexts[:n]:
        body = json.dumps(c.to_json()).encode()
        out.append(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    return out


async def _client(
    port: int, seconds: float, max_requests: int, connections: int, path: str = "/v1/check"
) -> dict[str, Any]:
    requests = _bodies(path=path)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = offset
        try:
            while done < max_requests and time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                writer.write(requests[i % len(requests)])
                i += connections
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                done += 1
                if done % 997 == 0:  # sample the answers: they are decisions
                    decision = json.loads(body)["decision"]
                    statuses[decision] = statuses.get(decision, 0) + 1
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode())
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": done,
        "seconds": round(elapsed, 2),
        "checks_per_s": round(done / elapsed),
        "connections": connections,
        "client_p50_ms": round(_pct(latencies, 0.50) * 1000, 2),
        "client_p99_ms": round(_pct(latencies, 0.99) * 1000, 2),
        "sampled_decisions": statuses,
    }


def _cpu_seconds(pid: int | None) -> float:
    """user + system CPU seconds of a process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(
    port: int, seconds: float, max_requests: int, connections: int, path: str, pid: int
) -> dict[str, Any]:
    stats_before = _server_stats(port)
    cpu_before = _cpu_seconds(pid)
    result = asyncio.run(_client(port, seconds, max_requests, connections, path))
    cpu_used = _cpu_seconds(pid) - cpu_before
    stats = _server_stats(port)
    result["per_server_cpu_s"] = round(result["requests"] / cpu_used) if cpu_used else 0
    # the server's garbage collections during the round, and the holds it carried
    result["gc_collections"] = [
        a - b
        for a, b in zip(
            stats["collections_gen012"], stats_before["collections_gen012"], strict=True
        )
    ]
    result["gc_pause_ms"] = round(stats["pause_total_ms"] - stats_before["pause_total_ms"], 2)
    result["holds_max"] = stats["holds_max"]
    spent, calls = (
        a - b
        for a, b in zip(stats["in_handlers"][path], stats_before["in_handlers"][path], strict=True)
    )
    # thread CPU inside the handler per request (--handler-cpu), beside the server's total
    result["handler_cpu_us"] = round(spent / calls / 1000, 1) if calls else None
    result["server_cpu_us"] = (
        round(cpu_used / result["requests"] * 1e6, 1) if result["requests"] else None
    )
    return result


def _server_stats(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=10) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
    return stats


def bench_sidecar(
    seconds: float,
    max_requests: int,
    connections: int,
    rounds: int,
    loop: str,
    handler_cpu: bool = False,
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0] if len(cpus) > 1 else None
    server = ctx.Process(target=_server, args=(ports, server_cpu, loop, handler_cpu), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=120)
        pid = server.pid
        assert pid is not None
        if len(cpus) > 1:
            os.sched_setaffinity(0, set(cpus[1:]))
        asyncio.run(_client(port, 1.0, 2000, connections))  # warm-up
        asyncio.run(_client(port, 1.0, 2000, connections, "/noop"))
        checks: list[dict[str, Any]] = []
        floors: list[dict[str, Any]] = []
        for _ in range(rounds):  # alternate, so both see the same machine
            floors.append(_round(port, seconds, max_requests, connections, "/noop", pid))
            checks.append(_round(port, seconds, max_requests, connections, "/v1/check", pid))
        per_s = statistics.median(r["checks_per_s"] for r in checks)
        per_cpu = statistics.median(r["per_server_cpu_s"] for r in checks)
        floor_s = statistics.median(r["checks_per_s"] for r in floors)
        floor_cpu = statistics.median(r["per_server_cpu_s"] for r in floors)
        sampled: dict[str, int] = {}
        for r in checks:
            for k, v in r["sampled_decisions"].items():
                sampled[k] = sampled.get(k, 0) + v
        return {
            "event_loop": loop,
            "server_cpu_pinned": server_cpu is not None,
            "connections": connections,
            "rounds": rounds,
            "seconds_per_round": seconds,
            "requests": sum(r["requests"] for r in checks),
            "checks_per_s": round(per_s),
            "checks_per_server_cpu_s": round(per_cpu),
            "client_p50_ms": statistics.median(r["client_p50_ms"] for r in checks),
            "client_p99_ms": statistics.median(r["client_p99_ms"] for r in checks),
            "sampled_decisions": sampled,
            "aiohttp_noop_floor": {
                "checks_per_s": round(floor_s),
                "per_server_cpu_s": round(floor_cpu),
            },
            # what share of aiohttp-alone's rate the sidecar reaches, in the same run
            "ratio_to_floor": round(per_s / floor_s, 3) if floor_s else None,
            "cpu_ratio_to_floor": round(per_cpu / floor_cpu, 3) if floor_cpu else None,
            "rounds_checks_per_s": [r["checks_per_s"] for r in checks],
            "rounds_floor_per_s": [r["checks_per_s"] for r in floors],
            "hold_timeout_s": SIDECAR_HOLD_S,
            "rounds_holds_max": [r["holds_max"] for r in checks],
            "rounds_gc_collections": [r["gc_collections"] for r in checks],
            "rounds_gc_pause_ms": [r["gc_pause_ms"] for r in checks],
            "rounds_floor_gc_pause_ms": [r["gc_pause_ms"] for r in floors],
            # per request: the server's CPU, and (--handler-cpu) the part inside the handler
            "server_cpu_us": statistics.median(r["server_cpu_us"] for r in checks),
            "floor_server_cpu_us": statistics.median(r["server_cpu_us"] for r in floors),
            "handler_cpu_us": _median_or_none([r["handler_cpu_us"] for r in checks]),
            "floor_handler_cpu_us": _median_or_none([r["handler_cpu_us"] for r in floors]),
        }
    finally:
        server.terminate()
        server.join(10)
        os.sched_setaffinity(0, set(cpus))


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def bench_side_by_side(
    baseline: str, rounds: int, seconds: float, connections: int
) -> dict[str, Any]:
    """This tree's sidecar and ``baseline``'s (another checkout, e.g. ``git worktree``)
    served at once, both pinned to the first CPU, client rounds alternating between
    them (and their no-op floors): medians per server CPU-second and their ratio.
    Both run this file's server harness (state, hold sweep, stats) over their own
    ``enforcer/`` and ``schemas/`` (SPENDBUS_BENCH_ROOT)."""
    import subprocess

    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0] if len(cpus) > 1 else None
    trees = {"baseline": str(Path(baseline).resolve()), "this": str(ROOT)}
    procs: dict[str, tuple[subprocess.Popen[str], int]] = {}
    try:
        for name, root in trees.items():
            code = (
                f"import sys; sys.path[:0] = [{str(ROOT / 'bench')!r}]\n"
                "import bench_enforcer as b\n"
                "class Port:\n    def put(self, port): print(port, flush=True)\n"
                f"b._server(Port(), {server_cpu!r}, {_default_loop()!r})\n"
            )
            env = os.environ | {"SPENDBUS_BENCH_ROOT": root}
            proc = subprocess.Popen(
                [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root, env=env
            )
            assert proc.stdout is not None
            procs[name] = (proc, int(proc.stdout.readline()))
        if len(cpus) > 1:
            os.sched_setaffinity(0, set(cpus[1:]))
        for _, port in procs.values():  # warm-up
            asyncio.run(_client(port, 1.0, 3000, connections))
            asyncio.run(_client(port, 0.5, 3000, connections, "/noop"))
        per: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {"/v1/check": [], "/noop": []} for name in procs
        }
        for r in range(rounds):  # alternate which goes first
            for name in sorted(procs, reverse=r % 2 == 1):
                proc, port = procs[name]
                for path in ("/v1/check", "/noop"):
                    per[name][path].append(
                        _round(port, seconds, 10**9, connections, path, proc.pid)
                    )
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(10)
        os.sched_setaffinity(0, set(cpus))
    out: dict[str, Any] = {"rounds": rounds, "seconds_per_round": seconds, "baseline": baseline}
    for name, paths in per.items():
        checks, floors = paths["/v1/check"], paths["/noop"]
        out[name] = {
            "checks_per_s": round(statistics.median(r["checks_per_s"] for r in checks)),
            "checks_per_server_cpu_s": round(
                statistics.median(r["per_server_cpu_s"] for r in checks)
            ),
            "noop_per_server_cpu_s": round(
                statistics.median(r["per_server_cpu_s"] for r in floors)
            ),
            "rounds_per_server_cpu_s": [r["per_server_cpu_s"] for r in checks],
            "rounds_holds_max": [r["holds_max"] for r in checks],
            "rounds_gc_pause_ms": [r["gc_pause_ms"] for r in checks],
        }
    base = out["baseline"]["checks_per_server_cpu_s"]
    out["this_over_baseline_cpu"] = round(out["this"]["checks_per_server_cpu_s"] / base, 3)
    return out


def calibrate() -> float:
    """ns per iteration of an empty Python loop: how fast this machine is right now
    (~10-20 ns on an idle modern core); scale the figures above by it."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(1_000_000):
            pass
        best = min(best, (time.perf_counter_ns() - t0) / 1_000_000)
    return round(best, 1)


def work(what: str, ops: int) -> dict[str, Any]:
    """``ops`` untimed operations on a 3k-counter state, to count instructions with
    ``valgrind --tool=cachegrind --cache-sim=no``: run it with ``ops`` 0 and N; the
    difference in ``I refs`` / N is the work per operation, whatever else runs on the
    machine (this VM is shared: wall-clock figures move with its load, these do not).

    check: check + release; context: Context.from_mapping of a JSON-decoded body;
    handler: the sidecar's /v1/check work without aiohttp (decode, context, check, the
    answer bytes), the last WORK_HOLDS holds kept in flight (older ones released: steady,
    as the sidecar bench's expiry keeps them; the collector's work is in the count).
    """
    import msgspec

    from enforcer.sidecar_json import decision_json

    e, contexts = loaded(counters=3000)
    bodies = [json.dumps(c.to_json()).encode() for c in contexts]
    decode = msgspec.json.Decoder().decode
    fields = [decode(b) for b in bodies]
    m = len(contexts)
    in_flight: collections.deque[int] = collections.deque()
    for i in range(ops):
        if what == "check":
            d = e.check(contexts[i % m])
            if d.hold_id is not None:
                e.release(d.hold_id)
        elif what == "context":
            Context.from_mapping(fields[i % m])
        else:
            d = e.check(Context.from_mapping(decode(bodies[i % m])))
            decision_json(d)
            if d.hold_id is not None:
                in_flight.append(d.hold_id)
                if len(in_flight) > WORK_HOLDS:
                    e.release(in_flight.popleft())
    return {"work": what, "ops": ops}


def _default_loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checks", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per round")
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default=_default_loop(),
        help="the sidecar's event loop (default: what spendbus enforcer serve uses)",
    )
    parser.add_argument(
        "--only", choices=("check", "sidecar"), help="run one section (faster iteration)"
    )
    parser.add_argument(
        "--work",
        choices=("check", "context", "handler"),
        help="only run --work-ops untimed operations (for cachegrind; see work())",
    )
    parser.add_argument("--work-ops", type=int, default=5000)
    parser.add_argument(
        "--handler-cpu",
        action="store_true",
        help="sidecar: also time the thread CPU inside each handler (adds a middleware hop)",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="serve this tree's sidecar and CHECKOUT's side by side, alternating rounds",
    )
    args = parser.parse_args()
    if args.work:
        print(json.dumps(work(args.work, args.work_ops)))
        return
    if args.baseline:
        side = bench_side_by_side(args.baseline, args.rounds, args.seconds, args.connections)
        side["load_avg_1m"] = round(os.getloadavg()[0], 2)
        side["cpus"] = os.cpu_count()
        print(json.dumps(side))
        return
    before = calibrate()
    out: dict[str, Any] = {}
    if args.only in (None, "check"):
        out["check"] = bench_check(args.checks)
    if args.only in (None, "sidecar"):
        out["sidecar"] = bench_sidecar(
            args.seconds,
            args.max_requests,
            args.connections,
            args.rounds,
            args.loop,
            args.handler_cpu,
        )
    out |= {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "empty_loop_ns": {"before": before, "after": calibrate()},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
