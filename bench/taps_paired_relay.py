"""The tap where a proxy runs it (bench_taps ``relay_aiohttp``): two identical aiohttp relays
side by side, one tapping and one not, the same paced streams through both at once, roles
swapped every round, their CPU read from outside (``PairedRelay``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from ingest.taps import open_tap

PAIR_TIMEOUT_S = 60.0
SPIN_CALIBRATION = 5_000_000
PHASES = 7  # start offsets of the upstream streams, in sevenths of the pace
SETTLE_S = 0.05


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process in ns, read from outside (``schedstat``): the
    relay spends nothing on being measured, and the clock is exact, not in 10 ms ticks."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as stat:
            total += int(stat.read().split()[0])
    return total


def _may_run_realtime() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except (PermissionError, AttributeError):
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def _cores(cpus: list[int], *, pin: bool, split: bool) -> tuple[list[int | None], set[int]]:
    """``(relay_cores, client_cores)``: a core for each relay (``split``) or one for both,
    the client on the others; nothing pinned on one core or without ``pin``."""
    if pin and split and len(cpus) > 1:
        return [cpus[-2], cpus[-1]], set(cpus[:-2]) or {cpus[0]}
    if pin and len(cpus) > 1:
        return [cpus[-1], cpus[-1]], set(cpus[:-1])
    return [None, None], set(cpus)


def _spread(values: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {
        "min": round(min(values), 4),
        "q1": round(quartiles[0], 4),
        "median": round(statistics.median(values), 4),
        "q3": round(quartiles[2], 4),
        "max": round(max(values), 4),
    }


class PairedRelay:
    """The tap where a proxy runs it: inside an aiohttp pass-through, measured in pairs.

    Two identical relays (forked processes: aiohttp server + ClientSession forwarding each
    response with ``iter_any``/``write``, feeding a tap per request path or not) run at
    the same time. The upstream (an aiohttp server in this process) answers the two
    relays' requests of one stream with one loop that writes each chunk to both, then
    sleeps (``pace``), so both relays get the same chunks at the same instants. Each round
    one relay taps and the other does not; the roles swap the next round. A round's ratio
    is CPU(tapping relay) / CPU(plain relay) over that round, both read from
    ``/proc/<pid>/task/*/schedstat`` (ns, from outside: the relays spend nothing on it);
    the figure is the median over swapped round pairs of the geometric mean of their two
    ratios, minus 1 (``tap_added_ratio``): whatever makes one relay cheaper than the other
    (its core, its process) cancels.

    Layout (``relay_cores``): ``split`` (default) puts each relay on a core of its own,
    the client with the first; ``same`` puts both relays on the last core, the client on
    the others. On one core the relays share its caches: the tapping relay's working set
    (the held chunks, the tap's code) evicts the plain relay's, part of the tap's cost is
    billed to the plain relay, and on a quiet machine the tap read *cheaper* than no tap
    (bench/records/comment_figures_2026-12-07.jsonl); split, each pays for its own misses, and the fixed difference between the two
    cores cancels in the pairs. The relays run SCHED_RR alike where allowed (the one woken
    first runs first, and other processes do not delay them: under normal scheduling the
    relay with less CPU so far ran first, and the other one batched more reads).

    ``chunks_per_read`` (per role: they must match, or one relay batched more than the
    other) and ``core_busy`` show the pacing held about one event per read without
    saturating a core. 127.0.0.1 only; bounded by count.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[int], tuple[dict[str, object], list[bytes], bytes]]],
        tokens: int,
        pace_s: float,
        round_chunks: int,
    ) -> None:
        self.responses: dict[str, tuple[dict[str, object], list[bytes]]] = {}
        for fmt, build in builders.items():
            request, events, _ = build(tokens)
            self.responses[fmt] = (request, events)
        self.request_bodies = {
            fmt: json.dumps(request).encode() for fmt, (request, _) in self.responses.items()
        }
        self.pace_s = pace_s
        self._pairs: dict[str, tuple[web.StreamResponse, asyncio.Future[None]]] = {}
        # responses one after another on each stream, so every format's round relays about
        # as many chunks (Gemini's 63-chunk responses would make short, noisy rounds)
        self.responses_per_stream = {
            fmt: max(1, round(round_chunks / len(events)))
            for fmt, (_, events) in self.responses.items()
        }

    # -- the upstream (this process) ----------------------------------------------------------------
    async def _upstream(self, request: web.Request) -> web.StreamResponse:
        """One stream of a pair: the two relays' requests for the same pair are answered by
        one loop that writes each chunk to both, then sleeps: both relays get every chunk
        at the same instant (the same reads), for half the upstream's timers and steps."""
        _, events = self.responses[request.match_info["fmt"]]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pair = request.match_info["pair"]
        waiting = self._pairs.pop(pair, None)
        if waiting is None:  # the first of the two: the second one streams to both
            done = asyncio.get_running_loop().create_future()
            self._pairs[pair] = (response, done)
            await asyncio.wait_for(done, PAIR_TIMEOUT_S)
            return response
        other, done = waiting
        # streams start at spread phases, as a proxy's streams do (not all in one burst);
        # which relay is written first alternates chunk by chunk
        order = itertools.cycle(((response, other), (other, response)))
        try:
            await asyncio.sleep(self.pace_s * (int(pair) % PHASES) / PHASES)
            for chunk in events:
                for target in next(order):
                    await target.write(chunk)
                await asyncio.sleep(self.pace_s)
            await response.write_eof()
            await other.write_eof()
        finally:
            done.set_result(None)
        return response

    # -- a relay (a process of its own) -------------------------------------------------------------
    def _serve_relay(
        self,
        upstream_url: str,
        core: int | None,
        realtime: bool,
        spin_us: float,
        ports: multiprocessing.SimpleQueue[int],
    ) -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})
        if realtime:  # both alike: the one woken first runs first, whatever its CPU so far
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        spin_loops = 0
        if spin_us:  # empty loop turns costing spin_us of CPU (user space only, no calls)
            started = time.process_time()
            for _ in range(SPIN_CALIBRATION):
                pass
            spin_loops = round(spin_us / 1e6 * SPIN_CALIBRATION / (time.process_time() - started))

        async def main() -> None:
            taps_reported = 0
            reads = 0
            session = aiohttp.ClientSession()

            async def relay(request: web.Request) -> web.StreamResponse:
                nonlocal taps_reported, reads
                fmt, mode = request.match_info["fmt"], request.match_info["mode"]
                tap = None
                if mode == "tap" and not spin_us:
                    # the request body as the proxy has it (bytes), read by the tap
                    tap = open_tap(fmt, self.request_bodies[fmt], streaming=True)
                spin = mode == "tap" and spin_us > 0
                count = 0
                pair = request.query["pair"]
                async with session.get(f"{upstream_url}/{fmt}/{pair}") as upstream:
                    response = web.StreamResponse(
                        headers={"Content-Type": upstream.headers["Content-Type"]}
                    )
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        count += 1
                        if tap is not None:
                            tap.feed(chunk)
                        elif spin:  # a known cost instead of a tap, to check the method
                            for _ in range(spin_loops):
                                pass
                        await response.write(chunk)
                    await response.write_eof()
                if tap is not None and tap.finish().usage_source == "reported":
                    taps_reported += 1
                reads += count
                return response

            async def stats(_: web.Request) -> web.Response:
                return web.json_response({"taps": taps_reported, "reads": reads})

            app = web.Application()
            app.router.add_get("/stats", stats)
            app.router.add_get("/{mode}/{fmt}", relay)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            ports.put(runner.addresses[0][1])
            await asyncio.Event().wait()  # until terminated

        asyncio.run(main())

    # -- the client (this process) ------------------------------------------------------------------
    async def measure(
        self,
        rounds: int,
        streams: int,
        *,
        pin: bool = True,
        split: bool = True,
        realtime: bool = True,
        null_check: bool = False,
        spin_us: float = 0.0,
    ) -> dict[str, Any]:
        cpus = sorted(os.sched_getaffinity(0))
        realtime = realtime and _may_run_realtime()
        relay_cores, client_cores = _cores(cpus, pin=pin, split=split)
        os.sched_setaffinity(0, client_cores)  # before forking: the relays set their own
        upstream = web.Application()
        upstream.router.add_get("/{fmt}/{pair}", self._upstream)
        runner = web.AppRunner(upstream, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        upstream_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        context = multiprocessing.get_context("fork")
        ports: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
        relays = [
            context.Process(
                target=self._serve_relay,
                args=(upstream_url, core, realtime, spin_us, ports),
                daemon=True,
            )
            for core in relay_cores
        ]
        for process in relays:
            process.start()
        loop = asyncio.get_running_loop()
        urls = [f"http://127.0.0.1:{await loop.run_in_executor(None, ports.get)}" for _ in relays]
        pids = [process.pid or 0 for process in relays]
        ratios: dict[str, list[float]] = {fmt: [] for fmt in self.responses}
        cpu_us: dict[str, dict[str, list[float]]] = {
            fmt: {"plain": [], "tap": []} for fmt in self.responses
        }
        busy: dict[str, list[float]] = {"relays": [], "client": []}
        reads = {fmt: {"plain": 0, "tap": 0} for fmt in self.responses}
        taps_asked = 0
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as client:

                async def relay_stats(url: str) -> dict[str, Any]:
                    async with client.get(f"{url}/stats") as r:
                        state: dict[str, Any] = await r.json()
                        return state

                serials = itertools.count()

                async def fetch(url: str, mode: str, fmt: str, pair: int) -> int:
                    async with client.get(f"{url}/{mode}/{fmt}", params={"pair": pair}) as r:
                        return len(await r.read())

                async def pair_stream(modes: tuple[str, str], fmt: str) -> list[int]:
                    """One stream through each relay, fed by the same upstream loop."""
                    sizes: list[int] = []
                    for _ in range(self.responses_per_stream[fmt]):
                        pair = next(serials)
                        sizes += await asyncio.gather(
                            *(
                                fetch(url, mode, fmt, pair)
                                for url, mode in zip(urls, modes, strict=True)
                            )
                        )
                    return sizes

                async def run(pairs: list[tuple[str, str]], fmt: str) -> None:
                    nonlocal taps_asked
                    expected = sum(map(len, self.responses[fmt][1]))
                    sizes = await asyncio.gather(*(pair_stream(modes, fmt) for modes in pairs))
                    assert all(n == expected for one in sizes for n in one), "relayed bytes differ"
                    if not spin_us:
                        taps_asked += sum(m.count("tap") for m in pairs) * len(sizes[0]) // 2

                # warm-up, not counted: imports, first taps, connections, both relays both ways
                for fmt in self.responses:
                    await run(
                        [(("tap", "plain"), ("plain", "tap"))[i % 2] for i in range(streams)], fmt
                    )
                reads_seen = [(await relay_stats(url))["reads"] for url in urls]
                for r in range(rounds):  # interleaved formats: a slow spell hits all of them
                    tapping = r % 2  # the roles swap every round
                    modes = (
                        ("plain", "plain")
                        if null_check
                        else (("tap", "plain"), ("plain", "tap"))[tapping]
                    )
                    for fmt in self.responses:
                        jobs = [modes] * streams
                        before = [_cpu_ns(pid) for pid in pids]
                        wall, client_cpu = time.perf_counter(), time.process_time()
                        await run(jobs, fmt)
                        # the client has the last bytes before a relay's handler returns:
                        # let both finish their taps and requests (an idle relay costs nothing)
                        await asyncio.sleep(SETTLE_S)
                        after = [_cpu_ns(pid) for pid in pids]
                        wall = time.perf_counter() - wall
                        client_cpu = time.process_time() - client_cpu
                        spent = [(b - a) / 1e9 for a, b in zip(before, after, strict=True)]
                        states = [await relay_stats(url) for url in urls]  # outside the window
                        reads_now = [state["reads"] for state in states]
                        reads[fmt]["tap"] += reads_now[tapping] - reads_seen[tapping]
                        reads[fmt]["plain"] += reads_now[1 - tapping] - reads_seen[1 - tapping]
                        reads_seen = reads_now
                        tap_s, plain_s = spent[tapping], spent[1 - tapping]
                        ratios[fmt].append(tap_s / plain_s)
                        responses = streams * self.responses_per_stream[fmt]
                        cpu_us[fmt]["tap"].append(tap_s / responses * 1e6)
                        cpu_us[fmt]["plain"].append(plain_s / responses * 1e6)
                        busy["relays"].append(sum(spent) / wall)
                        busy["client"].append(client_cpu / wall)
                end = [await relay_stats(url) for url in urls]
        finally:
            for process in relays:
                process.terminate()
            for process in relays:
                process.join(10)
            await runner.cleanup()
            os.sched_setaffinity(0, set(cpus))
        taps_reported = sum(state["taps"] for state in end)
        assert taps_reported == taps_asked, (taps_reported, taps_asked)  # every tap read usage
        responses_per_round = {fmt: streams * n for fmt, n in self.responses_per_stream.items()}
        out: dict[str, object] = {
            fmt: self._format_row(
                fmt,
                rounds,
                responses_per_round[fmt],
                ratios[fmt],
                cpu_us[fmt],
                reads[fmt],
                spin_us=spin_us,
            )
            for fmt in self.responses
        }
        return {
            "relay_cores": relay_cores,
            "client_cores": sorted(client_cores),
            "relay_policy": "SCHED_RR" if realtime else "SCHED_OTHER",
            "core_busy": {name: _spread(values) for name, values in busy.items()},
            "formats": out,
        }

    def _format_row(
        self,
        fmt: str,
        rounds: int,
        responses_per_round: int,
        ratios: list[float],
        cpu_us: dict[str, list[float]],
        reads: dict[str, int],
        *,
        spin_us: float,
    ) -> dict[str, object]:
        """One format's figures over every round (``responses_per_round``: per relay)."""
        events = len(self.responses[fmt][1])
        chunks = rounds * responses_per_round * events
        # two rounds with the roles swapped: their geometric mean cancels whatever
        # makes one relay (its core, its process) cheaper than the other
        swapped = zip(ratios[0::2], ratios[1::2], strict=False)
        pairs = [math.sqrt(a * b) for a, b in swapped]
        row: dict[str, object] = {
            "tap_added_ratio": round(statistics.median(pairs) - 1, 4),
            "pair_spread": _spread(pairs),
            # all rounds' CPU together: sum(tapping) / sum(plain) - 1
            "tap_added_ratio_pooled": round(sum(cpu_us["tap"]) / sum(cpu_us["plain"]) - 1, 4),
            "ratio_spread": _spread(ratios),
            "ratios": [round(x, 3) for x in ratios],
            "relay_us": round(statistics.median(cpu_us["plain"]), 1),
            "relay_tap_us": round(statistics.median(cpu_us["tap"]), 1),
            "chunks_per_read": {role: round(chunks / max(1, n), 3) for role, n in reads.items()},
            "events": events,
            "responses_per_stream": self.responses_per_stream[fmt],
        }
        if spin_us:
            plain_s = sum(cpu_us["plain"]) * responses_per_round / 1e6
            row["spin_expected_ratio"] = round(spin_us / 1e6 * reads["tap"] / plain_s, 4)
        return row
