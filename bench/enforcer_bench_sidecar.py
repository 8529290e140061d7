"""The enforcer bench's sidecar section: the server process (``spendbus enforcer serve``'s
server over the bench state, beside an aiohttp no-op floor), the raw keep-alive client,
the rounds and their figures, and --baseline's side-by-side of two checkouts."""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from enforcer_bench_state import ROOT, TOKEN, GcPauses, loaded, pct

#: the sidecar server's hold timeout: an unsettled hold lives about as long as a proxy's
#: upstream call would, then the sweep drops it (as the follower's sweep does), so holds
#: stay steady (~ rate x this) instead of piling up for the whole run
SIDECAR_HOLD_S = 2.0
#: how often the sidecar server sweeps expired holds (enforcer.follower.SWEEP_INTERVAL_S)
SWEEP_S = 1.0


def sidecar_server(port_queue: Any, cpu: int | None, loop: str, handler_cpu: bool = False) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from aiohttp import web

    from enforcer import sidecar, sidecar_json

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
                    message,
                    payload,
                    protocol,
                    writer,
                    task,
                    loop,
                    client_max_size=sidecar_json.MAX_BODY,
                )

            server = web.Server(handle, request_factory=request_factory, access_log=None)
            runner = web.ServerRunner(server)
        else:
            runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]  # a started site has its server
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
        "client_p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "client_p99_ms": round(pct(latencies, 0.99) * 1000, 2),
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
    server = ctx.Process(
        target=sidecar_server, args=(ports, server_cpu, loop, handler_cpu), daemon=True
    )
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
                "import enforcer_bench_sidecar as b\n"
                "class Port:\n    def put(self, port): print(port, flush=True)\n"
                f"b.sidecar_server(Port(), {server_cpu!r}, {default_loop()!r})\n"
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


def default_loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
